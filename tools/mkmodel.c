/*
 * mkmodel.c: `spectree-mkmodel`, writes a Llama GGUF of any shape and weight type with random
 * weights and a tokenizer copied from another GGUF, for tests and benchmarks without downloads.
 * Each tensor is drawn from its own stream seeded by (seed, tensor name), so a model written
 * with --keep-layers N has blocks bitwise equal to the first N of the full model (a draft
 * model). Tensors are generated and streamed to the file one row at a time.
 */
#include "spectree.h"

#include "../src/io/gguf_write.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *help =
    "usage: spectree-mkmodel OUT.gguf --vocab VOCAB.gguf --dim D --ff F --layers L --heads H\n"
    "                        [--kv-heads KV] [--type T] [options]\n"
    "\n"
    "Writes a Llama GGUF with random weights of the given shape, and the tokenizer of VOCAB.gguf\n"
    "(a model or a vocabulary-only file; n_vocab = its token count).\n"
    "\n"
    "  --vocab PATH       GGUF to copy the tokenizer.* keys from (required)\n"
    "  --dim D            embedding length (required)\n"
    "  --ff F             feed-forward length (required)\n"
    "  --layers L         blocks of the full model (required)\n"
    "  --heads H          query heads; D must be a multiple of H and D/H even (required)\n"
    "  --kv-heads KV      key/value heads; H must be a multiple of KV (default H)\n"
    "  --type T           matrix type: f32, f16, bf16, q8_0, q4_0 (default f32); q8_0 and q4_0\n"
    "                     need D and F multiples of 32. Norm weights are always f32\n"
    "  --seed S           weight seed (default 1)\n"
    "  --keep-layers N    write only blocks 0..N-1 of the model (a draft model; default L)\n"
    "  --ctx N            llama.context_length (default 2048)\n"
    "  --scale X          matrix weights have std X/sqrt(fan_in) (default 1)\n"
    "  -h, --help         this help\n";

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2), noreturn))
#endif
static void
usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "spectree-mkmodel: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see --help)\n");
    va_end(ap);
    exit(2);
}

static long parse_long(const char *flag, const char *v, long lo, long hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "spectree-mkmodel: %s expects an integer in [%ld, %ld], got '%s'\n", flag,
                lo, hi, v);
        exit(2);
    }
    return x;
}

/* SplitMix64: the per-tensor stream and the seed mixer. */
static uint64_t splitmix(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The stream of one tensor: a function of the seed and the name only. */
static uint64_t tensor_seed(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
    uint64_t st = seed ^ h;
    return splitmix(&st);
}

/* Uniform in [-1, 1) with 24 bits. */
static float uniform(uint64_t *state) {
    return (float)(splitmix(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

typedef struct plan {
    const char *out, *vocab;
    long dim, ff, layers, heads, kv_heads, keep, ctx;
    uint32_t type;
    uint64_t seed;
    double scale;
} plan;

typedef struct tensor_spec {
    char name[64];
    int64_t n_in, n_out; /* ne = [n_in, n_out]; n_out = 1 for a norm vector */
    int is_norm;
} tensor_spec;

static int add_spec(tensor_spec *t, int n, const char *name, int64_t n_in, int64_t n_out,
                    int is_norm) {
    snprintf(t[n].name, sizeof t[n].name, "%s", name);
    t[n].n_in = n_in;
    t[n].n_out = n_out;
    t[n].is_norm = is_norm;
    return n + 1;
}

/* The tensor list in file order; returns the count (3 + 9 per block). */
static int make_specs(const plan *p, int64_t n_vocab, tensor_spec *t) {
    const int64_t E = p->dim, F = p->ff, hd = p->dim / p->heads, KV = p->kv_heads * hd;
    int n = add_spec(t, 0, "token_embd.weight", E, n_vocab, 0);
    for (long l = 0; l < p->keep; l++) {
        char nm[64];
#define BLK(s) (snprintf(nm, sizeof nm, "blk.%ld." s, l), nm)
        n = add_spec(t, n, BLK("attn_norm.weight"), E, 1, 1);
        n = add_spec(t, n, BLK("attn_q.weight"), E, E, 0);
        n = add_spec(t, n, BLK("attn_k.weight"), E, KV, 0);
        n = add_spec(t, n, BLK("attn_v.weight"), E, KV, 0);
        n = add_spec(t, n, BLK("attn_output.weight"), E, E, 0);
        n = add_spec(t, n, BLK("ffn_norm.weight"), E, 1, 1);
        n = add_spec(t, n, BLK("ffn_gate.weight"), E, F, 0);
        n = add_spec(t, n, BLK("ffn_up.weight"), E, F, 0);
        n = add_spec(t, n, BLK("ffn_down.weight"), F, E, 0);
#undef BLK
    }
    n = add_spec(t, n, "output_norm.weight", E, 1, 1);
    return add_spec(t, n, "output.weight", E, n_vocab, 0);
}

static uint32_t file_type(uint32_t t) {
    switch (t) {
    case ST_DTYPE_F16:
        return 1;
    case ST_DTYPE_Q4_0:
        return 2;
    case ST_DTYPE_Q8_0:
        return 7;
    case ST_DTYPE_BF16:
        return 32;
    default:
        return 0;
    }
}

static void die_st(st_status s) {
    fprintf(stderr, "spectree-mkmodel: %s (%s)\n", st_last_error(), st_status_str(s));
    exit(1);
}

static void parse_args(int argc, char **argv, plan *p) {
    enum { O_VOCAB = 1000, O_DIM, O_FF, O_LAYERS, O_HEADS, O_KV, O_TYPE, O_SEED, O_KEEP, O_CTX };
    enum { O_SCALE = 1100 };
    static const struct option lo[] = {{"vocab", required_argument, 0, O_VOCAB},
                                       {"dim", required_argument, 0, O_DIM},
                                       {"ff", required_argument, 0, O_FF},
                                       {"layers", required_argument, 0, O_LAYERS},
                                       {"heads", required_argument, 0, O_HEADS},
                                       {"kv-heads", required_argument, 0, O_KV},
                                       {"type", required_argument, 0, O_TYPE},
                                       {"seed", required_argument, 0, O_SEED},
                                       {"keep-layers", required_argument, 0, O_KEEP},
                                       {"ctx", required_argument, 0, O_CTX},
                                       {"scale", required_argument, 0, O_SCALE},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    const long big = 1L << 24;
    *p = (plan){.type = ST_DTYPE_F32, .seed = 1, .ctx = 2048, .scale = 1.0};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
        switch (c) {
        case O_VOCAB:
            p->vocab = optarg;
            break;
        case O_DIM:
            p->dim = parse_long("--dim", optarg, 1, big);
            break;
        case O_FF:
            p->ff = parse_long("--ff", optarg, 1, big);
            break;
        case O_LAYERS:
            p->layers = parse_long("--layers", optarg, 1, 4096);
            break;
        case O_HEADS:
            p->heads = parse_long("--heads", optarg, 1, 4096);
            break;
        case O_KV:
            p->kv_heads = parse_long("--kv-heads", optarg, 1, 4096);
            break;
        case O_KEEP:
            p->keep = parse_long("--keep-layers", optarg, 1, 4096);
            break;
        case O_CTX:
            p->ctx = parse_long("--ctx", optarg, 1, big);
            break;
        case O_TYPE: {
            static const struct {
                const char *name;
                uint32_t type;
            } types[] = {{"f32", ST_DTYPE_F32},
                         {"f16", ST_DTYPE_F16},
                         {"bf16", ST_DTYPE_BF16},
                         {"q8_0", ST_DTYPE_Q8_0},
                         {"q4_0", ST_DTYPE_Q4_0}};
            size_t i = 0;
            while (i < sizeof types / sizeof types[0] && strcmp(types[i].name, optarg) != 0)
                i++;
            if (i == sizeof types / sizeof types[0])
                usage_error("--type must be f32, f16, bf16, q8_0 or q4_0, got '%s'", optarg);
            p->type = types[i].type;
            break;
        }
        case O_SEED: {
            char *end;
            errno = 0;
            unsigned long long x = strtoull(optarg, &end, 0);
            if (errno || end == optarg || *end || optarg[0] == '-')
                usage_error("--seed expects a non-negative integer, got '%s'", optarg);
            p->seed = (uint64_t)x;
            break;
        }
        case O_SCALE: {
            char *end;
            errno = 0;
            double x = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(x > 0.0 && x < 1e6))
                usage_error("--scale expects a number in (0, 1e6), got '%s'", optarg);
            p->scale = x;
            break;
        }
        case 'h':
            fputs(help, stdout);
            exit(0);
        case ':':
            usage_error("%s needs a value", argv[optind - 1]);
        default:
            usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        usage_error("missing OUT.gguf");
    if (optind < argc - 1)
        usage_error("unexpected argument '%s'", argv[optind + 1]);
    p->out = argv[optind];
    if (!p->vocab || !p->dim || !p->ff || !p->layers || !p->heads)
        usage_error("--vocab, --dim, --ff, --layers and --heads are required");
    if (!p->kv_heads)
        p->kv_heads = p->heads;
    if (!p->keep)
        p->keep = p->layers;
    if (p->dim % p->heads != 0 || (p->dim / p->heads) % 2 != 0)
        usage_error("--dim %ld must be a multiple of --heads %ld with an even head size", p->dim,
                    p->heads);
    if (p->heads % p->kv_heads != 0)
        usage_error("--heads %ld must be a multiple of --kv-heads %ld", p->heads, p->kv_heads);
    if ((p->type == ST_DTYPE_Q8_0 || p->type == ST_DTYPE_Q4_0) &&
        (p->dim % 32 != 0 || p->ff % 32 != 0))
        usage_error("--type %s needs --dim %ld and --ff %ld to be multiples of 32",
                    st_dtype_name(p->type), p->dim, p->ff);
    if (p->keep > p->layers)
        usage_error("--keep-layers %ld is more than --layers %ld", p->keep, p->layers);
}

int main(int argc, char **argv) {
    plan p;
    parse_args(argc, argv, &p);

    st_gguf *vocab;
    st_status s = st_gguf_open(p.vocab, &vocab);
    if (s)
        die_st(s);
    int64_t ti = st_gguf_find(vocab, "tokenizer.ggml.tokens");
    int64_t n_vocab = st_gguf_arr_len(vocab, ti);
    if (ti < 0 || st_gguf_arr_type(vocab, ti) != ST_GGUF_STRING || n_vocab < 1 ||
        n_vocab > (1 << 24)) {
        fprintf(stderr, "spectree-mkmodel: %s: no usable tokenizer.ggml.tokens array\n", p.vocab);
        return 1;
    }

    st_gguf_writer *w;
    if ((s = st_gguf_writer_create(&w)))
        die_st(s);
    const uint32_t hd = (uint32_t)(p.dim / p.heads);
    const int quant = p.type == ST_DTYPE_Q8_0 || p.type == ST_DTYPE_Q4_0;
    if ((s = st_gguf_writer_add_str(w, "general.architecture", "llama")) ||
        (s = st_gguf_writer_add_str(w, "general.name", "spectree-mkmodel random")) ||
        (s = st_gguf_writer_add_u32(w, "general.file_type", file_type(p.type))) ||
        (quant && (s = st_gguf_writer_add_u32(w, "general.quantization_version", 2))) ||
        (s = st_gguf_writer_add_u32(w, "llama.context_length", (uint32_t)p.ctx)) ||
        (s = st_gguf_writer_add_u32(w, "llama.embedding_length", (uint32_t)p.dim)) ||
        (s = st_gguf_writer_add_u32(w, "llama.block_count", (uint32_t)p.keep)) ||
        (s = st_gguf_writer_add_u32(w, "llama.feed_forward_length", (uint32_t)p.ff)) ||
        (s = st_gguf_writer_add_u32(w, "llama.attention.head_count", (uint32_t)p.heads)) ||
        (s = st_gguf_writer_add_u32(w, "llama.attention.head_count_kv", (uint32_t)p.kv_heads)) ||
        (s = st_gguf_writer_add_u32(w, "llama.rope.dimension_count", hd)) ||
        (s = st_gguf_writer_add_f32(w, "llama.rope.freq_base", 10000.0f)) ||
        (s = st_gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f)) ||
        (s = st_gguf_writer_copy_tokenizer(w, vocab, NULL, 0)))
        die_st(s);
    st_gguf_free(vocab);

    int n_t = 3 + 9 * (int)p.keep;
    tensor_spec *specs = calloc((size_t)n_t, sizeof *specs);
    if (!specs) {
        fprintf(stderr, "spectree-mkmodel: out of memory\n");
        return 1;
    }
    make_specs(&p, n_vocab, specs);
    int64_t max_in = 0;
    for (int i = 0; i < n_t; i++) {
        int64_t ne[2] = {specs[i].n_in, specs[i].n_out};
        uint32_t type = specs[i].is_norm ? ST_DTYPE_F32 : p.type;
        if ((s = st_gguf_writer_add_tensor(w, specs[i].name, type, specs[i].is_norm ? 1 : 2, ne,
                                           NULL, 0, ST_GGUF_REF)))
            die_st(s);
        if (specs[i].n_in > max_in)
            max_in = specs[i].n_in;
    }
    const size_t total = st_gguf_writer_file_size(w);
    float *row = malloc((size_t)max_in * sizeof(float));
    void *qrow = malloc((size_t)max_in * sizeof(float));
    if (!row || !qrow) {
        fprintf(stderr, "spectree-mkmodel: out of memory\n");
        return 1;
    }
    if ((s = st_gguf_writer_begin_file(w, p.out)))
        die_st(s);

    const double t0 = st_time_seconds();
    const int verbose = total > (64u << 20);
    size_t done = 0, next_report = 0;
    for (int i = 0; i < n_t; i++) {
        const tensor_spec *t = &specs[i];
        uint32_t type = t->is_norm ? ST_DTYPE_F32 : p.type;
        uint64_t state = tensor_seed(p.seed, t->name);
        /* uniform(-a, a) has std a/sqrt(3) */
        const float a = (float)(sqrt(3.0) * p.scale / sqrt((double)t->n_in));
        size_t row_bytes;
        if ((s = st_gguf_tensor_bytes(type, 1, &t->n_in, &row_bytes)))
            die_st(s);
        for (int64_t r = 0; r < t->n_out; r++) {
            for (int64_t k = 0; k < t->n_in; k++)
                row[k] = t->is_norm ? 1.0f + 0.1f * uniform(&state) : a * uniform(&state);
            if ((s = st_quantize_row(type, row, t->n_in, qrow)) ||
                (s = st_gguf_writer_stream(w, qrow, row_bytes)))
                die_st(s);
            done += row_bytes;
        }
        if (verbose && (done >= next_report || i == n_t - 1)) {
            fprintf(stderr, "spectree-mkmodel: %s: tensor %d/%d, %.1f of %.1f MB (%.1f s)\n", p.out,
                    i + 1, n_t, (double)done / 1e6, (double)total / 1e6, st_time_seconds() - t0);
            next_report = done + total / 20;
        }
    }
    if ((s = st_gguf_writer_end_file(w)))
        die_st(s);
    fprintf(stderr,
            "spectree-mkmodel: wrote %s: %ld of %ld layers, dim %ld, ff %ld, heads %ld/%ld, "
            "vocab %" PRId64 ", %s, %zu bytes\n",
            p.out, p.keep, p.layers, p.dim, p.ff, p.heads, p.kv_heads, n_vocab,
            st_dtype_name(p.type), total);
    free(row);
    free(qrow);
    free(specs);
    st_gguf_writer_free(w);
    return 0;
}
