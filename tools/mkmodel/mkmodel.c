/*
 * mkmodel.c: `spectree-mkmodel`, writes a Llama GGUF of any shape and weight type with random
 * weights and a tokenizer copied from another GGUF, for tests and benchmarks without downloads.
 * Each tensor is drawn from its own stream seeded by (seed, tensor name), so a model written
 * with --keep-layers N has blocks bitwise equal to the first N of the full model (a draft
 * model). Tensors are generated and streamed to the file one row at a time (a temporary file
 * beside OUT, renamed over it when whole).
 * With --inflate SRC it widens a real model instead: SRC's weights sit in the top-left corner of
 * larger matrices, laid out so the result computes what SRC computes (see inflate_specs), which
 * gives a bandwidth-bound benchmark target whose greedy text is known.
 */
#include "spectree.h"

#include "io/gguf_write.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
    "  --type T           matrix type: f32, f16, bf16, q8_0, q4_0, the K-quants q2_k, q3_k,\n"
    "                     q4_k, q5_k, q6_k (every matrix of that type), or llama.cpp's K-quant\n"
    "                     mixes q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m (its\n"
    "                     per-tensor choice: e.g. q4_k_m has output, and attn_v and ffn_down\n"
    "                     in some layers, in q6_k) (default f32); q8_0 and q4_0 need D and F\n"
    "                     multiples of 32, the K-quants multiples of 256. Norms are always f32\n"
    "  --seed S           weight seed (default 1)\n"
    "  --keep-layers N    write only blocks 0..N-1 of the model (a draft model; default L)\n"
    "  --ctx N            llama.context_length (default 2048)\n"
    "  --scale X          matrix weights have std X/sqrt(fan_in) (default 1)\n"
    "  -h, --help         this help\n"
    "\n"
    "usage: spectree-mkmodel OUT.gguf --inflate SRC.gguf --dim D --ff F --layers L [--type T]\n"
    "                        [--fill zero|random] [--seed S]\n"
    "\n"
    "Writes SRC.gguf widened to D, F and L: SRC's weights in the top-left corner of each matrix,\n"
    "head size and query-per-KV-head ratio kept (D/head_size heads), norm weights times\n"
    "sqrt(d/D) and the RMSNorm epsilon times d/D (d = SRC's width), layers past SRC's with zero\n"
    "attn_output and ffn_down, token_embd, attn_output and ffn_down zero outside SRC's block.\n"
    "It streams like a D-wide, L-layer model and computes what SRC computes (in f32 up to\n"
    "rounding: the same greedy text).\n"
    "SRC's tokenizer and metadata are kept, but for the shape keys.\n"
    "\n"
    "  --inflate SRC      the Llama GGUF to widen\n"
    "  --dim D            embedding length: a multiple of SRC's head size, at least SRC's, with\n"
    "                     a head count that keeps SRC's query heads per KV head (required)\n"
    "  --ff F             feed-forward length, at least SRC's (required)\n"
    "  --layers L         blocks, at least SRC's (required)\n"
    "  --type T           as above (default f32; q8_0 and q4_0 need D and F multiples of 32,\n"
    "                     the K-quants multiples of 256)\n"
    "  --fill random      weights that cannot change the output (rows of extra heads and FFN\n"
    "                     units, columns that only meet zero activations, extra layers but\n"
    "                     their output projections) are random, with the RMS of SRC's values\n"
    "                     in that tensor (default)\n"
    "  --fill zero        they are zero\n"
    "  --seed S           seed of the random fill (default 1)\n";

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
    const char *out, *vocab, *inflate;
    long dim, ff, layers, heads, kv_heads, keep, ctx;
    uint32_t type;  /* the matrix type; for a K-quant mix its base type */
    uint32_t ftype; /* a K-quant mix (ST_FTYPE_Q4_K_M ...) or 0 */
    uint64_t seed;
    double scale;
    int fill_random;
    const char *random_only; /* the first flag given that only random models take */
} plan;

/* One tensor to write. Rows [0, src_out) of an inflated tensor start with the src_in values of
 * the same row of `src` times `scale`; every other value is base + amp * uniform(-1, 1), drawn
 * from the tensor's own stream (amp = 0: the constant base). */
typedef struct tensor_spec {
    char name[64];
    int64_t n_in, n_out; /* ne = [n_in, n_out]; n_out = 1 for a norm vector */
    int is_norm;
    const st_gguf_tensor *src;
    int64_t src_in, src_out;
    float scale, base, amp;
} tensor_spec;

/* The nine tensors of a block, in file order. */
static const char *const blk_names[9] = {
    "attn_norm.weight", "attn_q.weight",   "attn_k.weight", "attn_v.weight",  "attn_output.weight",
    "ffn_norm.weight",  "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};

/* The shape of block tensor k for width E, feed-forward F and KV width KV: ne = [n_in, n_out]. */
static void blk_shape(int k, int64_t E, int64_t F, int64_t KV, int64_t *n_in, int64_t *n_out) {
    const int64_t in[9] = {E, E, E, E, E, E, E, E, F};
    const int64_t out[9] = {1, E, KV, KV, E, 1, F, F, E};
    *n_in = in[k];
    *n_out = out[k];
}

static tensor_spec *add_spec(tensor_spec *t, const char *name, int64_t n_in, int64_t n_out,
                             int is_norm) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_in = n_in;
    t->n_out = n_out;
    t->is_norm = is_norm;
    t->scale = 1.0f;
    return t;
}

/* Random weights: uniform(-a, a) has std a/sqrt(3), so a = sqrt(3) scale / sqrt(fan_in);
 * norm weights 1 + 0.1 uniform. */
static void set_random(const plan *p, tensor_spec *t) {
    t->base = t->is_norm ? 1.0f : 0.0f;
    t->amp = t->is_norm ? 0.1f : (float)(sqrt(3.0) * p->scale / sqrt((double)t->n_in));
}

/* The tensor list of a random model in file order; returns the count (3 + 9 per block). */
static int make_specs(const plan *p, int64_t n_vocab, tensor_spec *t) {
    const int64_t E = p->dim, F = p->ff, hd = p->dim / p->heads, KV = p->kv_heads * hd;
    int n = 0;
    set_random(p, add_spec(&t[n++], "token_embd.weight", E, n_vocab, 0));
    for (long l = 0; l < p->keep; l++)
        for (int k = 0; k < 9; k++) {
            char nm[64];
            int64_t n_in, n_out;
            snprintf(nm, sizeof nm, "blk.%ld.%s", l, blk_names[k]);
            blk_shape(k, E, F, KV, &n_in, &n_out);
            set_random(p, add_spec(&t[n++], nm, n_in, n_out, k == 0 || k == 5));
        }
    set_random(p, add_spec(&t[n++], "output_norm.weight", E, 1, 1));
    set_random(p, add_spec(&t[n++], "output.weight", E, n_vocab, 0));
    return n;
}

/* general.file_type: llama.cpp's llama_ftype; a single K-quant type gets the mix of that type
 * closest to it (q4_k: Q4_K_S). */
static uint32_t file_type(const plan *p) {
    if (p->ftype)
        return p->ftype;
    switch (p->type) {
    case ST_DTYPE_Q2_K:
        return ST_FTYPE_Q2_K;
    case ST_DTYPE_Q3_K:
        return ST_FTYPE_Q3_K_S;
    case ST_DTYPE_Q4_K:
        return ST_FTYPE_Q4_K_S;
    case ST_DTYPE_Q5_K:
        return ST_FTYPE_Q5_K_S;
    case ST_DTYPE_Q6_K:
        return ST_FTYPE_Q6_K;
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

/* The --type as given: a mix's name or the matrix type's. */
static const char *type_name(const plan *p) {
    return p->ftype ? st_kquant_ftype_name(p->ftype) : st_dtype_name(p->type);
}

/* The type of tensor t in a file of n_layer blocks, n_gqa query heads per KV head and an output
 * matrix of its own or not (tied). */
static uint32_t tensor_type(const plan *p, const tensor_spec *t, int64_t n_layer, int64_t n_gqa,
                            int tied) {
    if (t->is_norm)
        return ST_DTYPE_F32;
    if (p->ftype)
        return st_kquant_tensor_type(p->ftype, t->name, t->n_in, n_layer, n_gqa, tied);
    return p->type;
}

static int is_kquant(uint32_t type) { return type >= ST_DTYPE_Q2_K && type <= ST_DTYPE_Q6_K; }

static int is_quantized(uint32_t type) {
    return type == ST_DTYPE_Q8_0 || type == ST_DTYPE_Q4_0 || is_kquant(type);
}

static void die_st(st_status s) {
    fprintf(stderr, "spectree-mkmodel: %s (%s)\n", st_last_error(), st_status_str(s));
    exit(1);
}

/* die_st once the file is begun: freeing the writer removes the temporary file. */
static void die_writing(st_gguf_writer *w, st_status s) {
    fprintf(stderr, "spectree-mkmodel: %s (%s)\n", st_last_error(), st_status_str(s));
    st_gguf_writer_free(w);
    exit(1);
}

static void parse_args(int argc, char **argv, plan *p) {
    enum { O_VOCAB = 1000, O_DIM, O_FF, O_LAYERS, O_HEADS, O_KV, O_TYPE, O_SEED, O_KEEP, O_CTX };
    enum { O_SCALE = 1100, O_INFLATE, O_FILL };
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
                                       {"inflate", required_argument, 0, O_INFLATE},
                                       {"fill", required_argument, 0, O_FILL},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    const long big = 1L << 24;
    *p = (plan){.type = ST_DTYPE_F32, .seed = 1, .ctx = 2048, .scale = 1.0, .fill_random = 1};
    const char *fill = NULL;
    int c, li = -1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", lo, &li)) != -1) {
        if (c == O_VOCAB || c == O_HEADS || c == O_KV || c == O_KEEP || c == O_CTX || c == O_SCALE)
            if (!p->random_only)
                p->random_only = lo[li].name;
        li = -1;
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
            } types[] = {{"f32", ST_DTYPE_F32},   {"f16", ST_DTYPE_F16},   {"bf16", ST_DTYPE_BF16},
                         {"q8_0", ST_DTYPE_Q8_0}, {"q4_0", ST_DTYPE_Q4_0}, {"q2_k", ST_DTYPE_Q2_K},
                         {"q3_k", ST_DTYPE_Q3_K}, {"q4_k", ST_DTYPE_Q4_K}, {"q5_k", ST_DTYPE_Q5_K},
                         {"q6_k", ST_DTYPE_Q6_K}};
            size_t i = 0;
            while (i < sizeof types / sizeof types[0] && strcmp(types[i].name, optarg) != 0)
                i++;
            p->ftype = 0;
            if (i < sizeof types / sizeof types[0]) {
                p->type = types[i].type;
            } else if ((p->ftype = st_kquant_ftype_from_name(optarg)) != 0) {
                /* a mix: its base type is the one its ordinary matrices get */
                p->type = st_kquant_tensor_type(p->ftype, "blk.0.attn_q.weight", 256, 1, 1, 0);
            } else {
                usage_error("--type must be f32, f16, bf16, q8_0, q4_0, q2_k, q3_k, q4_k, q5_k, "
                            "q6_k, q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s or q5_k_m, got "
                            "'%s'",
                            optarg);
            }
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
        case O_INFLATE:
            p->inflate = optarg;
            break;
        case O_FILL:
            if (strcmp(optarg, "zero") != 0 && strcmp(optarg, "random") != 0)
                usage_error("--fill must be zero or random, got '%s'", optarg);
            fill = optarg;
            p->fill_random = optarg[0] == 'r';
            break;
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
    if ((p->type == ST_DTYPE_Q8_0 || p->type == ST_DTYPE_Q4_0) &&
        (p->dim % 32 != 0 || p->ff % 32 != 0))
        usage_error("--type %s needs --dim %ld and --ff %ld to be multiples of 32",
                    st_dtype_name(p->type), p->dim, p->ff);
    if (is_kquant(p->type) && (p->dim % 256 != 0 || p->ff % 256 != 0))
        usage_error("--type %s needs --dim %ld and --ff %ld to be multiples of 256", type_name(p),
                    p->dim, p->ff);
    if (p->inflate) {
        if (p->random_only)
            usage_error("--%s does not go with --inflate", p->random_only);
        if (!p->dim || !p->ff || !p->layers)
            usage_error("--inflate needs --dim, --ff and --layers");
        return;
    }
    if (fill)
        usage_error("--fill only goes with --inflate");
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
    if (p->keep > p->layers)
        usage_error("--keep-layers %ld is more than --layers %ld", p->keep, p->layers);
}

/* RMS of a tensor's values (the scale of the random fill of its inflated copy). */
static double tensor_rms(const st_gguf_tensor *t, const char *path) {
    const int64_t n_in = t->ne[0], n_rows = t->ne[1] * t->ne[2] * t->ne[3];
    size_t row_bytes;
    float *row = malloc((size_t)n_in * sizeof(float));
    st_status s = st_gguf_tensor_bytes(t->type, 1, &n_in, &row_bytes);
    if (!row) {
        fprintf(stderr, "spectree-mkmodel: out of memory\n");
        exit(1);
    }
    double sum = 0.0;
    for (int64_t r = 0; r < n_rows && !s; r++) {
        s = st_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * row_bytes, n_in, row);
        for (int64_t k = 0; k < n_in && !s; k++)
            sum += (double)row[k] * row[k];
    }
    free(row);
    if (s) {
        fprintf(stderr, "spectree-mkmodel: %s: tensor '%s': %s\n", path, t->name, st_last_error());
        exit(1);
    }
    return sqrt(sum / (double)(n_in * n_rows));
}

/* The inflated tensor t gets rows [0, src->ne[1]) of src in its top-left corner, times `scale`
 * (a norm vector: sqrt(d/D)); with `random`, the rest is uniform with the RMS of src's values
 * (times scale), otherwise zero. */
static void inflate_from(tensor_spec *t, const st_gguf_tensor *src, const char *path, int real,
                         int random, float scale) {
    t->scale = scale;
    if (real) {
        t->src = src;
        t->src_in = src->ne[0];
        t->src_out = src->ne[1];
    }
    if (random)
        t->amp = (float)(sqrt(3.0) * tensor_rms(src, path) * scale);
}

/* The tensors of SRC widened to p's shape, in file order; returns the count. Why the output
 * equals SRC's: the residual stream's dims [d, D) start at zero (token_embd is zero there) and
 * stay zero, because every row of attn_output and ffn_down that writes them is zero. RMSNorm
 * over D dims of which D - d are zero divides by sqrt(d/D) times SRC's norm when the epsilon is
 * scaled by d/D, and the norm weights' factor sqrt(d/D) cancels it: real dims see SRC's values,
 * extra dims stay zero. So every column of a matrix past SRC's input width only ever meets a
 * zero and may hold anything. Extra query heads only read extra KV heads (the query-per-KV ratio
 * is kept and real heads come first), and extra heads and extra FFN units only reach the stream
 * through attn_output and ffn_down columns, which are zero. Extra layers have zero attn_output
 * and ffn_down, so they add nothing. */
static int inflate_specs(const plan *p, const st_gguf *g, const st_model_hparams *hp,
                         tensor_spec *t) {
    const int64_t E = p->dim, F = p->ff, hd = hp->head_dim;
    const int64_t KV = p->dim / hd / (hp->n_head / hp->n_head_kv) * hd;
    const float ns = (float)sqrt((double)hp->n_embd / (double)p->dim);
    const int rnd = p->fill_random;
    const char *path = p->inflate;
    int n = 0;
    const st_gguf_tensor *src = st_gguf_tensor_find(g, "token_embd.weight");
    inflate_from(add_spec(&t[n++], src->name, E, hp->n_vocab, 0), src, path, 1, 0, 1.0f);
    for (long l = 0; l < p->layers; l++)
        for (int k = 0; k < 9; k++) {
            char nm[64];
            int64_t n_in, n_out;
            blk_shape(k, E, F, KV, &n_in, &n_out);
            /* an extra layer's random values copy the RMS of a real one's */
            snprintf(nm, sizeof nm, "blk.%ld.%s", l % hp->n_layer, blk_names[k]);
            src = st_gguf_tensor_find(g, nm);
            snprintf(nm, sizeof nm, "blk.%ld.%s", l, blk_names[k]);
            const int is_norm = k == 0 || k == 5, is_proj = k == 4 || k == 8;
            inflate_from(add_spec(&t[n++], nm, n_in, n_out, is_norm), src, path, l < hp->n_layer,
                         rnd && !is_proj, is_norm ? ns : 1.0f);
        }
    src = st_gguf_tensor_find(g, "output_norm.weight");
    inflate_from(add_spec(&t[n++], src->name, E, 1, 1), src, path, 1, rnd, ns);
    if (!hp->tied_output) {
        src = st_gguf_tensor_find(g, "output.weight");
        inflate_from(add_spec(&t[n++], src->name, E, hp->n_vocab, 0), src, path, 1, rnd, 1.0f);
    }
    return n;
}

/* SRC's KVs in SRC's order, the shape and type keys with the inflated values (those SRC lacks
 * appended). */
static st_status inflate_metadata(st_gguf_writer *w, const st_gguf *g, const plan *p,
                                  const st_model_hparams *hp) {
    const long n_head = p->dim / hp->head_dim;
    const int quant = is_quantized(p->type);
    struct {
        const char *key;
        uint32_t v;
        int done;
    } u[] = {
        {"llama.embedding_length", (uint32_t)p->dim, 0},
        {"llama.feed_forward_length", (uint32_t)p->ff, 0},
        {"llama.block_count", (uint32_t)p->layers, 0},
        {"llama.attention.head_count", (uint32_t)n_head, 0},
        {"llama.attention.head_count_kv", (uint32_t)(n_head / (hp->n_head / hp->n_head_kv)), 0},
        {"general.file_type", file_type(p), 0},
        {"general.quantization_version", 2, !quant}};
    const int n_u = (int)(sizeof u / sizeof u[0]);
    const char *eps_key = "llama.attention.layer_norm_rms_epsilon";
    const float eps = (float)((double)hp->rms_eps * hp->n_embd / (double)p->dim);
    st_status s = ST_OK;
    for (int64_t i = 0; i < st_gguf_n_kv(g) && !s; i++) {
        const char *key = st_gguf_key(g, i);
        int j = 0;
        while (j < n_u && strcmp(u[j].key, key) != 0)
            j++;
        if (j < n_u && !u[j].done) {
            s = st_gguf_writer_add_u32(w, key, u[j].v);
            u[j].done = 1;
        } else if (strcmp(key, eps_key) == 0) {
            s = st_gguf_writer_add_f32(w, key, eps);
        } else {
            s = st_gguf_writer_copy_kv(w, g, key);
        }
    }
    for (int j = 0; j < n_u && !s; j++)
        if (!u[j].done)
            s = st_gguf_writer_add_u32(w, u[j].key, u[j].v);
    return s;
}

/* Opens SRC for --inflate, checks the flags against it and writes the metadata; *hp gets SRC's
 * hyper-parameters. */
static st_gguf *inflate_open(const plan *p, st_gguf_writer *w, st_model_hparams *hp) {
    st_model *m;
    st_load_params lp = st_load_default_params();
    lp.mode = ST_LOAD_MMAP;                              /* the checks only: no copy */
    st_status s = st_model_load_ex(p->inflate, &lp, &m); /* every shape and type check on SRC */
    if (s)
        die_st(s);
    *hp = *st_model_get_hparams(m);
    st_model_free(m);
    const char *src = p->inflate;
    if ((int64_t)hp->n_head * hp->head_dim != hp->n_embd) {
        fprintf(stderr,
                "spectree-mkmodel: %s: %d heads of %d differ from the embedding length %d; "
                "--inflate needs them equal\n",
                src, hp->n_head, hp->head_dim, hp->n_embd);
        exit(1);
    }
    const long hd = hp->head_dim, ratio = hp->n_head / hp->n_head_kv;
    if (p->dim < hp->n_embd)
        usage_error("--dim %ld is less than %s's embedding length %d", p->dim, src, hp->n_embd);
    if (p->dim % hd != 0)
        usage_error("--dim %ld is not a multiple of %s's head size %ld", p->dim, src, hd);
    if ((p->dim / hd) % ratio != 0 || p->dim / hd > 4096)
        usage_error("--dim %ld gives %ld heads of %ld: not a multiple of %s's %ld query heads per "
                    "KV head, or more than 4096",
                    p->dim, p->dim / hd, hd, src, ratio);
    if (p->ff < hp->n_ff)
        usage_error("--ff %ld is less than %s's feed-forward length %d", p->ff, src, hp->n_ff);
    if (p->layers < hp->n_layer)
        usage_error("--layers %ld is less than %s's %d blocks", p->layers, src, hp->n_layer);
    struct stat so, ss;
    if (stat(p->out, &so) == 0 && stat(src, &ss) == 0 && so.st_dev == ss.st_dev &&
        so.st_ino == ss.st_ino)
        usage_error("OUT %s is the --inflate source", p->out);
    st_gguf *g;
    if ((s = st_gguf_open(src, &g)) || (s = inflate_metadata(w, g, p, hp)))
        die_st(s);
    return g;
}

/* Fills row r of tensor t. */
static st_status fill_row(const tensor_spec *t, int64_t r, uint64_t *state, float *row) {
    int64_t k = 0;
    if (t->src && r < t->src_out) {
        size_t row_bytes;
        st_status s = st_gguf_tensor_bytes(t->src->type, 1, &t->src_in, &row_bytes);
        if (!s)
            s = st_dequantize_row(t->src->type,
                                  (const uint8_t *)t->src->data + (size_t)r * row_bytes, t->src_in,
                                  row);
        if (s)
            return s;
        if (t->scale != 1.0f)
            for (; k < t->src_in; k++)
                row[k] *= t->scale;
        k = t->src_in;
    }
    for (; k < t->n_in; k++)
        row[k] = t->amp != 0.0f ? t->base + t->amp * uniform(state) : t->base;
    return ST_OK;
}

int main(int argc, char **argv) {
    plan p;
    parse_args(argc, argv, &p);

    st_gguf_writer *w;
    st_status s = st_gguf_writer_create(&w);
    if (s)
        die_st(s);
    st_gguf *src = NULL;
    st_model_hparams hp = {0};
    int64_t n_vocab, n_gqa;
    int n_t, tied = 0;
    if (p.inflate) {
        src = inflate_open(&p, w, &hp);
        n_vocab = hp.n_vocab;
        n_t = 2 + 9 * (int)p.layers + !hp.tied_output;
        p.keep = p.layers;
        p.heads = p.dim / hp.head_dim;
        p.kv_heads = p.heads / (hp.n_head / hp.n_head_kv);
        tied = hp.tied_output;
    } else {
        struct stat so, sv;
        if (stat(p.out, &so) == 0 && stat(p.vocab, &sv) == 0 && so.st_dev == sv.st_dev &&
            so.st_ino == sv.st_ino)
            usage_error("OUT %s is the --vocab file", p.out);
        st_gguf *vocab;
        if ((s = st_gguf_open(p.vocab, &vocab)))
            die_st(s);
        int64_t ti = st_gguf_find(vocab, "tokenizer.ggml.tokens");
        n_vocab = st_gguf_arr_len(vocab, ti);
        if (ti < 0 || st_gguf_arr_type(vocab, ti) != ST_GGUF_STRING || n_vocab < 1 ||
            n_vocab > (1 << 24)) {
            fprintf(stderr, "spectree-mkmodel: %s: no usable tokenizer.ggml.tokens array\n",
                    p.vocab);
            return 1;
        }
        const uint32_t hd = (uint32_t)(p.dim / p.heads);
        const int quant = is_quantized(p.type);
        if ((s = st_gguf_writer_add_str(w, "general.architecture", "llama")) ||
            (s = st_gguf_writer_add_str(w, "general.name", "spectree-mkmodel random")) ||
            (s = st_gguf_writer_add_u32(w, "general.file_type", file_type(&p))) ||
            (quant && (s = st_gguf_writer_add_u32(w, "general.quantization_version", 2))) ||
            (s = st_gguf_writer_add_u32(w, "llama.context_length", (uint32_t)p.ctx)) ||
            (s = st_gguf_writer_add_u32(w, "llama.embedding_length", (uint32_t)p.dim)) ||
            (s = st_gguf_writer_add_u32(w, "llama.block_count", (uint32_t)p.keep)) ||
            (s = st_gguf_writer_add_u32(w, "llama.feed_forward_length", (uint32_t)p.ff)) ||
            (s = st_gguf_writer_add_u32(w, "llama.attention.head_count", (uint32_t)p.heads)) ||
            (s = st_gguf_writer_add_u32(w, "llama.attention.head_count_kv",
                                        (uint32_t)p.kv_heads)) ||
            (s = st_gguf_writer_add_u32(w, "llama.rope.dimension_count", hd)) ||
            (s = st_gguf_writer_add_f32(w, "llama.rope.freq_base", 10000.0f)) ||
            (s = st_gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f)) ||
            (s = st_gguf_writer_copy_tokenizer(w, vocab, NULL, 0)))
            die_st(s);
        st_gguf_free(vocab);
        n_t = 3 + 9 * (int)p.keep;
    }

    tensor_spec *specs = calloc((size_t)n_t, sizeof *specs);
    if (!specs) {
        fprintf(stderr, "spectree-mkmodel: out of memory\n");
        return 1;
    }
    if (p.inflate)
        inflate_specs(&p, src, &hp, specs);
    else
        make_specs(&p, n_vocab, specs);
    n_gqa = p.heads / p.kv_heads;
    int64_t max_in = 0;
    for (int i = 0; i < n_t; i++) {
        int64_t ne[2] = {specs[i].n_in, specs[i].n_out};
        uint32_t type = tensor_type(&p, &specs[i], p.keep, n_gqa, tied);
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
        uint32_t type = tensor_type(&p, t, p.keep, n_gqa, tied);
        uint64_t state = tensor_seed(p.seed, t->name);
        size_t row_bytes;
        if ((s = st_gguf_tensor_bytes(type, 1, &t->n_in, &row_bytes)))
            die_writing(w, s);
        for (int64_t r = 0; r < t->n_out; r++) {
            if ((s = fill_row(t, r, &state, row))) {
                fprintf(stderr, "spectree-mkmodel: %s: tensor '%s': %s\n", p.inflate, t->name,
                        st_last_error());
                st_gguf_writer_free(w);
                return 1;
            }
            if ((s = st_quantize_row(type, row, t->n_in, qrow)) ||
                (s = st_gguf_writer_stream(w, qrow, row_bytes)))
                die_writing(w, s);
            done += row_bytes;
        }
        if (verbose && (done >= next_report || i == n_t - 1)) {
            fprintf(stderr, "spectree-mkmodel: %s: tensor %d/%d, %.1f of %.1f MB (%.1f s)\n", p.out,
                    i + 1, n_t, (double)done / 1e6, (double)total / 1e6, st_time_seconds() - t0);
            next_report = done + total / 20;
        }
    }
    if ((s = st_gguf_writer_end_file(w)))
        die_writing(w, s);
    char what[1100];
    if (p.inflate)
        snprintf(what, sizeof what, "%s widened to %ld layers", p.inflate, p.layers);
    else
        snprintf(what, sizeof what, "%ld of %ld layers", p.keep, p.layers);
    fprintf(stderr,
            "spectree-mkmodel: wrote %s: %s, dim %ld, ff %ld, heads %ld/%ld, vocab %" PRId64
            ", %s, %zu bytes\n",
            p.out, what, p.dim, p.ff, p.heads, p.kv_heads, n_vocab, type_name(&p), total);
    free(row);
    free(qrow);
    free(specs);
    st_gguf_writer_free(w);
    st_gguf_free(src);
    return 0;
}
