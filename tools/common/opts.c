/*
 * opts.c: the flags `spectree generate` and `spectree serve` share (common.h, cli_common):
 * sampling, threads, the KV cache types, how the weights are loaded and every speculation flag,
 * with one option table, one parser, one help text and one loader, so the two commands accept
 * the same flags with the same ranges and messages.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    O_TEMP = CLI_OPT_BASE,
    O_TOPK,
    O_TOPP,
    O_MINP,
    O_NOBOS,
    O_CTK,
    O_CTV,
    O_GGML,
    O_MMAP,
    O_NO_MMAP,
    O_MLOCK,
    O_ALGO,
    O_DRAFT,
    O_DRAFT_TYPE,
    O_STEPS,
    O_EAGLE_TOPK,
    O_NDRAFT,
    O_BACKEND,
    O_NG_MIN,
    O_NG_MAX,
    O_NG_BREADTH,
    O_DRAFT_COUPLED,
    O_MODEL_DRAFT,
    O_DRAFT_MAX,
    O_DRAFT_MIN,
    O_THREADS_BATCH,
    /* GPU-only flags of llama.cpp and SGLang: accepted, with one warning (cli_common_check) */
    O_GPU_LAYERS,
    O_GPU_LAYERS_DRAFT,
    O_FLASH_ATTN,
    O_SPLIT_MODE,
    O_MAIN_GPU,
    O_TENSOR_SPLIT,
    O_MEM_FRACTION,
    O_TP_SIZE,
    O_DP_SIZE,
    O_CUDA_GRAPH_BS,
    O_NO_CUDA_GRAPH
};

static const struct option common_lo[] = {
    {"temp", required_argument, 0, O_TEMP},
    {"top-k", required_argument, 0, O_TOPK},
    {"top-p", required_argument, 0, O_TOPP},
    {"min-p", required_argument, 0, O_MINP},
    {"threads", required_argument, 0, 't'},
    {"no-bos", no_argument, 0, O_NOBOS},
    {"cache-type-k", required_argument, 0, O_CTK},
    {"cache-type-v", required_argument, 0, O_CTV},
    {"match-ggml", no_argument, 0, O_GGML},
    {"mmap", no_argument, 0, O_MMAP},
    {"no-mmap", no_argument, 0, O_NO_MMAP},
    {"mlock", no_argument, 0, O_MLOCK},
    {"speculative-algorithm", required_argument, 0, O_ALGO},
    {"speculative-draft-model-path", required_argument, 0, O_DRAFT},
    {"speculative-draft-type", required_argument, 0, O_DRAFT_TYPE},
    {"speculative-num-steps", required_argument, 0, O_STEPS},
    {"speculative-eagle-topk", required_argument, 0, O_EAGLE_TOPK},
    {"speculative-num-draft-tokens", required_argument, 0, O_NDRAFT},
    {"attention-backend", required_argument, 0, O_BACKEND},
    {"ngram-min-match", required_argument, 0, O_NG_MIN},
    {"ngram-max-match", required_argument, 0, O_NG_MAX},
    {"speculative-ngram-min-match-window-size", required_argument, 0, O_NG_MIN},
    {"speculative-ngram-max-match-window-size", required_argument, 0, O_NG_MAX},
    {"ngram-breadth", required_argument, 0, O_NG_BREADTH},
    {"draft-coupled", required_argument, 0, O_DRAFT_COUPLED},
    {"model-draft", required_argument, 0, O_MODEL_DRAFT},
    {"draft-max", required_argument, 0, O_DRAFT_MAX},
    {"draft", required_argument, 0, O_DRAFT_MAX},
    {"draft-n", required_argument, 0, O_DRAFT_MAX},
    {"draft-min", required_argument, 0, O_DRAFT_MIN},
    {"threads-batch", required_argument, 0, O_THREADS_BATCH},
    {"n-gpu-layers", required_argument, 0, O_GPU_LAYERS},
    {"gpu-layers", required_argument, 0, O_GPU_LAYERS},
    {"n-gpu-layers-draft", required_argument, 0, O_GPU_LAYERS_DRAFT},
    {"gpu-layers-draft", required_argument, 0, O_GPU_LAYERS_DRAFT},
    {"flash-attn", optional_argument, 0, O_FLASH_ATTN},
    {"split-mode", required_argument, 0, O_SPLIT_MODE},
    {"main-gpu", required_argument, 0, O_MAIN_GPU},
    {"tensor-split", required_argument, 0, O_TENSOR_SPLIT},
    {"mem-fraction-static", required_argument, 0, O_MEM_FRACTION},
    {"tp-size", required_argument, 0, O_TP_SIZE},
    {"tp", required_argument, 0, O_TP_SIZE},
    {"dp-size", required_argument, 0, O_DP_SIZE},
    {"dp", required_argument, 0, O_DP_SIZE},
    {"cuda-graph-max-bs", required_argument, 0, O_CUDA_GRAPH_BS},
    {"disable-cuda-graph", no_argument, 0, O_NO_CUDA_GRAPH},
    {0, 0, 0, 0}};

/* llama.cpp's single-dash names of several letters, and the long names they stand for. */
static const struct {
    const char *dash, *name;
} dash_names[] = {{"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"},
                  {"-ngl", "--n-gpu-layers"}, {"-ngld", "--n-gpu-layers-draft"},
                  {"-fa", "--flash-attn"},    {"-sm", "--split-mode"},
                  {"-mg", "--main-gpu"},      {"-ts", "--tensor-split"},
                  {"-md", "--model-draft"},   {"-np", "--parallel"},
                  {"-tb", "--threads-batch"}, {"-sys", "--system-prompt"}};

/* The GPU-only flags (O_GPU_LAYERS on, in order) as the warning names them; then SGLang's
 * GPU attention backends, which --attention-backend accepts for the default. */
static const char *const gpu_flags[] = {
    "--n-gpu-layers", "--n-gpu-layers-draft", "--flash-attn",          "--split-mode",
    "--main-gpu",     "--tensor-split",       "--mem-fraction-static", "--tp-size",
    "--dp-size",      "--cuda-graph-max-bs",  "--disable-cuda-graph",  "--attention-backend"};
enum { N_GPU_FLAGS = O_NO_CUDA_GRAPH - O_GPU_LAYERS + 1 };
_Static_assert(sizeof gpu_flags / sizeof gpu_flags[0] == N_GPU_FLAGS + 1, "a name per flag");
static const char *const sglang_backends[] = {
    "flashinfer",  "triton",     "fa3",        "fa4",   "torch_native",   "flashmla",
    "cutlass_mla", "trtllm_mha", "trtllm_mla", "aiter", "flex_attention", "wave"};

/* The values --flash-attn takes as the next argument (llama.cpp's on|off|auto, and booleans). */
static const char *const flash_attn_values[] = {"on", "off", "auto", "1", "0", "true", "false"};

const char cli_common_help[] =
    "  -t, --threads N      threads (default: all cores; 1 for models under 16 MB)\n"
    "      --mmap           keep the weights in the read-only file mapping\n"
    "      --no-mmap        copy the weights into anonymous memory in 2 MB huge pages\n"
    "                       (default: copy files of 256 MB and more when the memory is there)\n"
    "      --mlock          lock the weights in RAM (needs ulimit -l)\n"
    "  -ctk, --cache-type-k {f32,f16}   KV cache type of the keys (default f32); f16 halves\n"
    "                       its memory and rounds the queries to f16 for the scores, as\n"
    "                       llama.cpp's default f16 cache does\n"
    "  -ctv, --cache-type-v {f32,f16}   same for the values (the probabilities are rounded)\n"
    "      --match-ggml     compute as llama.cpp's CPU backend does (its sums' order, exp,\n"
    "                       K-quant dot products; with -ctk f16 -ctv f16 its greedy texts);\n"
    "                       slower\n"
    "      --no-bos         do not prepend BOS to the prompt\n"
    "\n"
    "speculative decoding (SGLang's flag names; output is identical to plain decoding):\n"
    "      --speculative-algorithm {NONE,STANDALONE,NGRAM,EAGLE,EAGLE3}   drafter (default "
    "NONE)\n"
    "      --speculative-draft-model-path PATH   STANDALONE: a draft model (same vocabulary);\n"
    "                       EAGLE / EAGLE3: an EAGLE-1/2 / EAGLE-3 head directory\n"
    "                       (config.json, safetensors)\n"
    "      --speculative-draft-type {auto,f32,f16,bf16,q8_0}   EAGLE / EAGLE3: the head's\n"
    "                       matrices in this type (default auto: as stored beside an f32\n"
    "                       target, q8_0 beside any other)\n"
    "      --speculative-num-steps S|auto        draft depth, <= 16 (default auto)\n"
    "      --speculative-eagle-topk K|auto       branching per node, <= 10 (default auto; K=1: "
    "chain)\n"
    "      --speculative-num-draft-tokens N|auto verified tree nodes incl. the root (<= 64)\n"
    "                       auto: each step verifies as many of the best drafted nodes as\n"
    "                       maximizes the expected tokens/s (measured costs, calibrated\n"
    "                       acceptance), or none\n"
    "      --attention-backend {cascade,dense}   target-verify attention (default cascade)\n"
    "      --ngram-min-match N, --ngram-max-match N, --ngram-breadth N   NGRAM lookup (1, 8, 8);\n"
    "                       SGLang's --speculative-ngram-{min,max}-match-window-size work too\n"
    "      --draft-coupled {auto,on,off}   each draft node's first candidate is what the\n"
    "                       target's sampler (this seed, that position) would pick from the\n"
    "                       draft's logits: auto (default) for STANDALONE draft models, on for\n"
    "                       the EAGLE heads too, off for none (the draft's top-K). The output\n"
    "                       is the same; acceptance when sampling is not\n"
    "\n"
    "llama.cpp's names:\n"
    "  -md, --model-draft PATH   a draft model: STANDALONE unless --speculative-algorithm says\n"
    "                       otherwise (then PATH is its --speculative-draft-model-path)\n"
    "      --draft-max N    drafted tokens per step, <= 63 (--speculative-num-draft-tokens N+1);\n"
    "                       also --draft, --draft-n\n"
    "      --draft-min N    checked and ignored: a step verifies a tree only when it pays\n"
    "  -tb, --threads-batch N   ignored: prompts use the -t threads\n"
    "  -ctk, -ctv           as above\n"
    "\n"
    "GPU-only flags, accepted and ignored with one warning (this build runs on the CPU):\n"
    "  -ngl, --n-gpu-layers, --gpu-layers N|auto|all; -ngld, --n-gpu-layers-draft N;\n"
    "  -fa, --flash-attn [on|off|auto]; -sm, --split-mode {none,layer,row}; -mg, --main-gpu N;\n"
    "  -ts, --tensor-split A,B,...; SGLang's --mem-fraction-static F, --tp-size/--tp N,\n"
    "  --dp-size/--dp N, --cuda-graph-max-bs N, --disable-cuda-graph, and --attention-backend\n"
    "  with a GPU library's name (flashinfer, triton, fa3, ...: the default, cascade, is used)\n";

void cli_common_init(cli_common *o) {
    memset(o, 0, sizeof *o);
    o->sp = st_sampler_default_params();
    o->spec = st_spec_default_params();
    o->type_k = o->type_v = ST_DTYPE_F32;
    o->load = ST_LOAD_AUTO;
    o->draft_type = -1;
}

struct option *cli_common_options(const struct option *own) {
    size_t n_own = 0, n_common = sizeof common_lo / sizeof common_lo[0];
    while (own[n_own].name)
        n_own++;
    struct option *lo = malloc((n_own + n_common) * sizeof *lo);
    if (!lo) {
        fprintf(stderr, "spectree: out of memory\n");
        exit(1);
    }
    memcpy(lo, own, n_own * sizeof *lo);
    memcpy(lo + n_own, common_lo, sizeof common_lo);
    return lo;
}

/* The entry of lo named name[0..len): exact, or the one it abbreviates (as getopt_long
 * takes it); NULL when none or ambiguous. */
static const struct option *find_long(const struct option *lo, const char *name, size_t len) {
    const struct option *hit = NULL;
    int n_hits = 0;
    for (; lo->name; lo++) {
        if (strncmp(lo->name, name, len) != 0)
            continue;
        if (!lo->name[len])
            return lo;
        if (!hit || hit->val != lo->val || hit->has_arg != lo->has_arg)
            n_hits++;
        hit = lo;
    }
    return n_hits == 1 ? hit : NULL;
}

static int is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

int cli_common_argv(const char *cmd, int argc, char **argv, const char *shortopts,
                    const struct option *lo) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--"))
            break;
        if (a[0] != '-' || !a[1])
            continue; /* an operand */
        if (a[1] != '-') {
            size_t d = 0;
            while (d < sizeof dash_names / sizeof dash_names[0] && strcmp(a, dash_names[d].dash))
                d++;
            if (d < sizeof dash_names / sizeof dash_names[0]) { /* -ngl: --n-gpu-layers */
                const struct option *o = lo;
                while (o->name && strcmp(o->name, dash_names[d].name + 2) != 0)
                    o++;
                if (!o->name) /* -np in `generate`: named as typed */
                    cli_die_unknown(cmd, a);
                a = argv[i] = (char *)dash_names[d].name;
            } else {
                const char *so = strchr(shortopts, a[1]);
                if (a[1] == ':' || !so)
                    cli_die_unknown(cmd, a); /* -xyz, named as typed */
                if (so[1] != ':') {
                    if (a[2]) /* -hx: a group of flags; none of ours is meant that way */
                        cli_die_unknown(cmd, a);
                    continue;
                }
                if (a[2] && is_letter(a[2])) /* -cnv is no -c with the value "nv" */
                    cli_die_unknown(cmd, a);
                if (!a[2])
                    i++; /* the value: -p -x is the prompt "-x" */
                continue;
            }
        }
        const char *eq = strchr(a + 2, '=');
        const struct option *o = find_long(lo, a + 2, eq ? (size_t)(eq - a - 2) : strlen(a + 2));
        if (!o || eq)
            continue; /* getopt_long names an unknown option; a value after '=' is in place */
        if (o->has_arg == required_argument) {
            i++;
        } else if (o->has_arg == optional_argument && i + 1 < argc) {
            /* --flash-attn on: the value as a separate word, which getopt_long would take
             * for an operand; dropped (the flag does nothing here either way) */
            for (size_t v = 0; v < sizeof flash_attn_values / sizeof flash_attn_values[0]; v++)
                if (!strcmp(argv[i + 1], flash_attn_values[v])) {
                    memmove(argv + i + 1, argv + i + 2, (size_t)(argc - i - 2) * sizeof *argv);
                    argv[--argc] = NULL;
                    break;
                }
        }
    }
    return argc;
}

int cli_common_parse(const char *cmd, int c, const char *arg, cli_common *o) {
    long v;
    switch (c) {
    case O_TEMP:
        o->sp.temp = cli_parse_float(cmd, "--temp", arg, 0, 1e6);
        o->sp_given |= CLI_GIVEN_TEMP;
        return 1;
    case O_TOPK:
        cli_parse_int(cmd, "--top-k", arg, 0, 1 << 30, &v);
        o->sp.top_k = (int32_t)v;
        o->sp_given |= CLI_GIVEN_TOPK;
        return 1;
    case O_TOPP:
        o->sp.top_p = cli_parse_float(cmd, "--top-p", arg, 1e-9, 1);
        o->sp_given |= CLI_GIVEN_TOPP;
        return 1;
    case O_MINP:
        o->sp.min_p = cli_parse_float(cmd, "--min-p", arg, 0, 1);
        o->sp_given |= CLI_GIVEN_MINP;
        return 1;
    case 't':
        cli_parse_int(cmd, "-t", arg, 1, 1024, &o->threads);
        return 1;
    case O_NOBOS:
        o->no_bos = 1;
        return 1;
    case O_CTK:
    case O_CTV: {
        const int f16 = strcmp(arg, "f16") == 0;
        if (!f16 && strcmp(arg, "f32") != 0) {
            fprintf(stderr, "spectree %s: %s must be f32 or f16, got '%s'\n", cmd,
                    c == O_CTK ? "--cache-type-k" : "--cache-type-v", arg);
            exit(2);
        }
        *(c == O_CTK ? &o->type_k : &o->type_v) = f16 ? ST_DTYPE_F16 : ST_DTYPE_F32;
        return 1;
    }
    case O_GGML:
        o->match_ggml = 1;
        return 1;
    case O_MMAP:
        o->load = ST_LOAD_MMAP;
        return 1;
    case O_NO_MMAP:
        o->load = ST_LOAD_COPY;
        return 1;
    case O_MLOCK:
        o->mlock = 1;
        return 1;
    case O_ALGO:
        if (st_spec_algo_parse(arg, &o->spec.algo) != ST_OK) {
            fprintf(stderr, "spectree %s: %s\n", cmd, st_last_error());
            exit(2);
        }
        return 1;
    case O_DRAFT:
        o->draft_path = arg;
        return 1;
    case O_DRAFT_TYPE:
        o->draft_type = cli_parse_draft_type(cmd, arg);
        break;
    case O_STEPS:
        o->spec.num_steps = cli_parse_auto(cmd, "--speculative-num-steps", arg, 1, ST_SPEC_MAX_S);
        break;
    case O_EAGLE_TOPK:
        o->spec.topk = cli_parse_auto(cmd, "--speculative-eagle-topk", arg, 1, ST_SPEC_MAX_K);
        break;
    case O_NDRAFT:
        o->spec.num_draft_tokens =
            cli_parse_auto(cmd, "--speculative-num-draft-tokens", arg, 2, ST_SPEC_MAX_N);
        break;
    case O_BACKEND:
        for (size_t i = 0; i < sizeof sglang_backends / sizeof sglang_backends[0]; i++)
            if (!strcmp(arg, sglang_backends[i])) { /* a GPU kernel library: the default here */
                o->gpu_given |= 1u << N_GPU_FLAGS;
                return 1;
            }
        if (st_attn_backend_parse(arg, &o->spec.backend) != ST_OK) {
            fprintf(stderr, "spectree %s: %s\n", cmd, st_last_error());
            exit(2);
        }
        break;
    case O_MODEL_DRAFT:
        o->draft_path = arg;
        o->model_draft = 1;
        return 1;
    case O_DRAFT_MAX: /* llama.cpp's drafted tokens; N counts the root too */
        cli_parse_int(cmd, "--draft-max", arg, 1, ST_SPEC_MAX_N - 1, &v);
        o->spec.num_draft_tokens = (int32_t)v + 1;
        break;
    case O_DRAFT_MIN:
        cli_parse_int(cmd, "--draft-min", arg, 0, ST_SPEC_MAX_N - 1, &v);
        o->draft_min = (int)v;
        o->draft_min_given = 1;
        break;
    case O_THREADS_BATCH:
        cli_parse_int(cmd, "--threads-batch", arg, 1, 1024, &v);
        o->threads_batch = 1;
        return 1;
    case O_GPU_LAYERS:
    case O_GPU_LAYERS_DRAFT:
        if (strcmp(arg, "auto") != 0 && strcmp(arg, "all") != 0)
            cli_parse_int(cmd, gpu_flags[c - O_GPU_LAYERS], arg, -1, 1 << 20, &v);
        o->gpu_given |= 1u << (c - O_GPU_LAYERS);
        return 1;
    case O_FLASH_ATTN: {
        size_t i = 0, n = sizeof flash_attn_values / sizeof flash_attn_values[0];
        while (arg && i < n && strcmp(arg, flash_attn_values[i]) != 0)
            i++;
        if (arg && i == n) {
            fprintf(stderr, "spectree %s: --flash-attn takes on, off or auto, got '%s'\n", cmd,
                    arg);
            exit(2);
        }
        o->gpu_given |= 1u << (c - O_GPU_LAYERS);
        return 1;
    }
    case O_SPLIT_MODE:
        if (strcmp(arg, "none") != 0 && strcmp(arg, "layer") != 0 && strcmp(arg, "row") != 0) {
            fprintf(stderr, "spectree %s: --split-mode takes none, layer or row, got '%s'\n", cmd,
                    arg);
            exit(2);
        }
        o->gpu_given |= 1u << (c - O_GPU_LAYERS);
        return 1;
    case O_MAIN_GPU:
        cli_parse_int(cmd, "--main-gpu", arg, -1, 1024, &v);
        o->gpu_given |= 1u << (c - O_GPU_LAYERS);
        return 1;
    case O_TENSOR_SPLIT:
        if (!arg[0] || arg[strspn(arg, "0123456789.,/")]) {
            fprintf(stderr, "spectree %s: --tensor-split takes proportions like 3,1, got '%s'\n",
                    cmd, arg);
            exit(2);
        }
        o->gpu_given |= 1u << (c - O_GPU_LAYERS);
        return 1;
    case O_MEM_FRACTION:
        cli_parse_float(cmd, "--mem-fraction-static", arg, 1e-6, 1);
        o->gpu_given |= 1u << (c - O_GPU_LAYERS);
        return 1;
    case O_TP_SIZE:
    case O_DP_SIZE:
    case O_CUDA_GRAPH_BS:
        cli_parse_int(cmd, gpu_flags[c - O_GPU_LAYERS], arg, 1, 1 << 20, &v);
        o->gpu_given |= 1u << (c - O_GPU_LAYERS);
        return 1;
    case O_NO_CUDA_GRAPH:
        o->gpu_given |= 1u << (c - O_GPU_LAYERS);
        return 1;
    case O_NG_MIN:
        cli_parse_int(cmd, "--ngram-min-match", arg, 1, ST_NGRAM_MAX_MATCH, &v);
        o->spec.ngram_min_match = (int32_t)v;
        break;
    case O_NG_MAX:
        cli_parse_int(cmd, "--ngram-max-match", arg, 1, ST_NGRAM_MAX_MATCH, &v);
        o->spec.ngram_max_match = (int32_t)v;
        break;
    case O_NG_BREADTH:
        cli_parse_int(cmd, "--ngram-breadth", arg, 1, ST_NGRAM_MAX_BREADTH, &v);
        o->spec.ngram_breadth = (int32_t)v;
        break;
    case O_DRAFT_COUPLED:
        if (strcmp(arg, "auto") != 0 && strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0) {
            fprintf(stderr, "spectree %s: --draft-coupled takes auto, on or off, got '%s'\n", cmd,
                    arg);
            exit(2);
        }
        o->spec.draft_coupling = !strcmp(arg, "on") ? 1 : !strcmp(arg, "off") ? -1 : 0;
        break;
    default:
        return 0;
    }
    o->spec_flags = 1; /* the speculative flags other than the algorithm and the path */
    return 1;
}

static int is_eagle(const cli_common *o) {
    return o->spec.algo == ST_SPEC_EAGLE || o->spec.algo == ST_SPEC_EAGLE3;
}

void cli_common_check(const char *cmd, cli_common *o) {
    if (o->model_draft && o->spec.algo == ST_SPEC_NONE) /* llama.cpp's -md: a draft model */
        o->spec.algo = ST_SPEC_STANDALONE;
    if (o->gpu_given) {
        fprintf(stderr, "spectree: warning: this build runs on the CPU;");
        for (int i = 0, first = 1; i <= N_GPU_FLAGS; i++)
            if (o->gpu_given & (1u << i)) {
                fprintf(stderr, "%s %s", first ? "" : ",", gpu_flags[i]);
                first = 0;
            }
        fprintf(stderr, " ignored\n");
    }
    if (o->threads_batch)
        fprintf(stderr, "spectree: warning: --threads-batch ignored: prompts are processed with "
                        "the --threads threads\n");
    if (o->draft_min_given && o->spec.num_draft_tokens > 0 &&
        o->draft_min > o->spec.num_draft_tokens - 1)
        cli_die_usage(cmd, "--draft-min is above --draft-max");
    if (o->draft_min_given && o->spec.algo != ST_SPEC_NONE)
        fprintf(stderr, "spectree: warning: --draft-min ignored: each step verifies a tree only "
                        "when its expected gain pays for it\n");
    const int eagle = is_eagle(o), model_drafter = o->spec.algo == ST_SPEC_STANDALONE || eagle;
    if (model_drafter && !o->draft_path)
        cli_die_usage(cmd, "STANDALONE, EAGLE and EAGLE3 need --speculative-draft-model-path");
    if (!model_drafter && o->draft_path)
        cli_die_usage(cmd, o->model_draft ? "--model-draft is a draft model: it goes with "
                                            "--speculative-algorithm STANDALONE, EAGLE or EAGLE3"
                                          : "--speculative-draft-model-path needs "
                                            "--speculative-algorithm STANDALONE, EAGLE or EAGLE3");
    if (o->spec.algo == ST_SPEC_NONE && o->spec_flags)
        fprintf(stderr, "spectree: warning: speculative flags have no effect with "
                        "--speculative-algorithm NONE\n");
    if (o->draft_type != -1 && o->spec.algo != ST_SPEC_NONE && !eagle)
        fprintf(stderr, "spectree: warning: --speculative-draft-type has no effect without an "
                        "EAGLE or EAGLE3 head\n");
    if (o->spec.topk == 1 && o->spec.num_draft_tokens > 0 && o->spec.num_steps > 0 &&
        o->spec.num_draft_tokens != o->spec.num_steps + 1)
        fprintf(stderr,
                "spectree: warning: --speculative-eagle-topk 1 drafts a chain: N = S + 1 = %d "
                "(--speculative-num-draft-tokens %d ignored, as SGLang does)\n",
                o->spec.num_steps + 1, o->spec.num_draft_tokens);
}

/* Load progress of files over 1 GB on stderr: bytes and seconds, on one line. */
static void load_progress(void *user, size_t done, size_t total, double seconds) {
    (void)user;
    if (total < ((size_t)1 << 30))
        return;
    fprintf(stderr, "\rloading: %.0f / %.0f MB (%.1f s)%s", (double)done / 1e6, (double)total / 1e6,
            seconds, done == total ? "\n" : "");
}

int cli_common_paths_ok(const cli_common *o, const char *model) {
    return cli_model_path_ok(model, 0) &&
           (!o->draft_path || cli_model_path_ok(o->draft_path, is_eagle(o)));
}

int cli_common_load(const char *cmd, cli_common *o, const char *model, st_model **m,
                    st_model **dm) {
    *m = *dm = NULL;
    st_load_params lp = st_load_default_params();
    lp.mode = o->load;
    lp.mlock = o->mlock;
    lp.progress = load_progress;
    const char *head = NULL; /* a model path that is an EAGLE head: named as such */
    int bad = 0;
    if (st_model_load_ex(model, &lp, m) != ST_OK) {
        bad = 1;
        head = cli_is_eagle_head(model) ? model : NULL;
    } else if (o->draft_path && o->spec.algo == ST_SPEC_STANDALONE) {
        if (st_model_load_ex(o->draft_path, &lp, dm) != ST_OK) {
            bad = 1;
            head = cli_is_eagle_head(o->draft_path) ? o->draft_path : NULL;
        }
    } else if (o->draft_path && is_eagle(o)) {
        bad = st_eagle_head_load(o->draft_path, *m, dm) != ST_OK ||
              st_eagle_head_set_type(*dm, o->draft_type) != ST_OK;
    }
    if (bad) {
        if (head)
            fprintf(stderr,
                    "spectree %s: %s is an EAGLE head, not a model: give it with "
                    "--speculative-algorithm EAGLE (or EAGLE3) --speculative-draft-model-path %s "
                    "beside its target model ('spectree info -m %s' says which kind)\n",
                    cmd, head, head, head);
        else
            fprintf(stderr, "spectree %s: %s\n", cmd, st_last_error());
        st_model_free(*dm);
        st_model_free(*m);
        *m = *dm = NULL;
        return -1;
    }
    o->spec.draft_model = *dm;
    return 0;
}

void cli_common_apply(const cli_common *o, st_gen_params *gp) {
    gp->spec = o->spec;
    gp->n_threads = (int32_t)o->threads;
    gp->type_k = o->type_k;
    gp->type_v = o->type_v;
    gp->match_ggml = o->match_ggml;
}

void cli_outlook_line(const st_spec_outlook *ol, st_spec_algo algo, char *buf, size_t cap) {
    const char *name = st_spec_algo_name(algo), *state = ol->drafting ? "drafting" : "not drafting";
    if (ol->weight_off) {
        snprintf(buf, cap,
                 "%s: %s, the draft model reads %.2f of the target's weight bytes per token: "
                 "speculation cannot pay here (auto drafts only with a model below half)",
                 name, state, ol->weight_ratio);
        return;
    }
    char level[64] = "";
    if (ol->level_cost > 0.0)
        snprintf(level, sizeof level, "a draft level costs %.2f plain tokens and ", ol->level_cost);
    snprintf(buf, cap,
             "%s: %s, %sthe best tree (%d tokens) accepts %.2f drafts for a verify of %.2f plain "
             "tokens: speculation %s %.2fx here",
             name, state, level, ol->tree_n, ol->accept, ol->verify_cost,
             ol->drafting ? "expected" : "would be", ol->speedup);
}
