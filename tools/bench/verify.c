/*
 * verify.c: `spectree-bench verify -m MODEL [--json]`: the verify-cost curve that decides
 * whether speculation pays (DESIGN.md cost model): the time of one target forward over N tokens
 * (a chain at positions L .. L+N-1 with the logits of all N, st_session_verify with causal
 * attention) after a committed context of L = 512 tokens, for N = 1, 2, 4, ..., 64, and
 * ratio = ms(N) / ms(1). The sizes are interleaved in rounds so that a burst of other work on
 * the machine slows all of them alike, each timed pass after untimed ones of the same size;
 * each size reports its median. Beside each, the pass's roofline (peak.c, measured in the same
 * run on the session's threads): the memory floor, the bytes it must read (the weights, and
 * the K/V rows of every layer once) over the bandwidth of a read-only stream over a buffer of
 * that size (capped at peak's: memory; a model that fits in the caches gets theirs); the
 * compute floor,
 * its multiply-adds (n_in x n_out x N per matrix, the logits of all N included, and the
 * attention's scores and value sums over the visible context) over the peak rate of the loop
 * that each matrix's kernel runs on (peak.c's table); and max(floors) / the measured time.
 */
#include "bench.h"
#include "peak.h"

/* Read-only queries of the library's choices: whether the tables pack Q8_0 / Q4_0 / K-quant
 * matrices (ST_PACK) and run Q8_0 on AMX; the roofline's table needs both. */
#include "core/core.h"
#include "kernels/kernels.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { VERIFY_MAX_N = ST_SPEC_MAX_N, VERIFY_NS = 7 };
#define VERIFY_WARM_S 0.03

static const char *usage =
    "usage: spectree-bench verify -m MODEL [--json] [--threads N] [--reps R] [--ctx L]\n"
    "                             [--prefill P] [--peak-seconds S] [--mmap | --no-mmap]\n"
    "                             [--mlock]\n"
    "  one forward pass over N = 1, 2, 4, 8, 16, 32, 64 tokens (logits for all) after a\n"
    "  committed context of L tokens (default 512): ms per pass, median of R rounds (default\n"
    "  5), each timed pass after untimed ones of the same size (at least two and 30 ms), and\n"
    "  ratio = ms(N) / ms(1); beside it the roofline of the pass, measured first on the same\n"
    "  threads (as `spectree-bench peak`, each rate the median of 3 timings of at least S s,\n"
    "  default 0.05): the memory floor (weights + K/V rows read, over the read-only bandwidth\n"
    "  of a buffer that size, at most peak's), the compute floor (multiply-adds over the peak\n"
    "  rate of the instruction each matrix's kernel uses) and max(floors) / ms\n"
    "  --prefill P: then a prompt of P tokens (1..65536) from position 0, the logits of its last\n"
    "  token only (st_session_eval, in the session's batches), against the same "
    "roofline\n" ST_BENCH_LOAD_USAGE;

typedef struct verify_opts {
    int ctx;
    int prefill; /* 0: none */
    double peak_s;
} verify_opts;

static int extra_opt(void *ctx, int argc, char **argv) {
    verify_opts *v = ctx;
    if (argc < 2)
        return 0;
    if (!strcmp(argv[0], "--ctx")) {
        int x = atoi(argv[1]);
        if (x < 1 || x > 1000000) {
            fprintf(stderr, "verify: --ctx must be in 1..1000000\n");
            return -1;
        }
        v->ctx = x;
        return 2;
    }
    if (!strcmp(argv[0], "--prefill")) {
        char *end;
        long x = strtol(argv[1], &end, 10);
        if (*end || x < 1 || x > 65536) {
            fprintf(stderr, "verify: --prefill must be in 1..65536\n");
            return -1;
        }
        v->prefill = (int)x;
        return 2;
    }
    if (!strcmp(argv[0], "--peak-seconds")) {
        char *end;
        double x = strtod(argv[1], &end);
        if (*end || !(x >= 0.001 && x <= 60.0)) {
            fprintf(stderr, "verify: --peak-seconds must be in 0.001..60\n");
            return -1;
        }
        v->peak_s = x;
        return 2;
    }
    return 0;
}

/* The matrices of a pass: multiply-adds per token and the loop each runs on. */
enum { ROOF_MAX_MATS = 7 * 1024 + 1 };
typedef struct roof_mat {
    int type;
    int packed;
    double macs; /* n_in x n_out */
} roof_mat;

typedef struct roofline {
    const char *table;
    int amx;
    int n_mats;
    roof_mat mats[ROOF_MAX_MATS];
    int out;             /* the output layer's index in mats (-1: none) */
    double attn_per_key; /* multiply-adds per visible key and token: scores and value sums */
    double weight_bytes, kv_bytes_per_pos;
    st_peak_rates rates;
} roofline;

static void roof_add(roofline *r, const st_gguf *g, const char *name, int packable) {
    const st_gguf_tensor *t = st_gguf_tensor_find(g, name);
    if (!t || r->n_mats >= ROOF_MAX_MATS)
        return;
    roof_mat *m = &r->mats[r->n_mats++];
    m->type = (int)t->type;
    m->macs = (double)t->ne[0] * (double)t->ne[1];
    /* llama.c's pack_quant: Q8_0 and Q4_0 matrices of 16 rows or more, Q4_K/Q5_K/Q6_K of 8 or
     * more (the AVX-512 and AVX2 tables), not a tied output layer */
    const int q8 = t->type == ST_DTYPE_Q8_0 || t->type == ST_DTYPE_Q4_0;
    const int kq = st_kq_packable(t->type);
    m->packed = packable && st_env_get().pack &&
                ((q8 && t->ne[1] >= ST_PACK_ROWS &&
                  (!strcmp(r->table, "avx512") || !strcmp(r->table, "avx2"))) ||
                 (kq && t->ne[1] >= ST_KQP_ROWS &&
                  (!strcmp(r->table, "avx512") || !strcmp(r->table, "avx2"))));
}

/* The matrices, sizes and K/V bytes of m's passes in session s. */
static void roof_init(roofline *r, const st_model *m, const st_session *s) {
    const st_model_hparams *hp = st_model_get_hparams(m);
    const st_gguf *g = st_model_gguf(m);
    r->table = st_kernels_name();
    r->amx = !strcmp(r->table, "avx512") && st_amx_ready();
    static const char *const names[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                        "ffn_gate", "ffn_up", "ffn_down"};
    char name[96];
    for (int l = 0; l < hp->n_layer; l++)
        for (int i = 0; i < 7; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, names[i]);
            roof_add(r, g, name, 1);
        }
    const int before = r->n_mats;
    if (hp->tied_output)
        roof_add(r, g, "token_embd.weight", 0);
    else
        roof_add(r, g, "output.weight", 1);
    r->out = r->n_mats > before ? r->n_mats - 1 : -1;
    r->attn_per_key = 2.0 * hp->n_layer * hp->n_head * hp->head_dim;
    const st_session_params *sp = st_session_get_params(s);
    const double ek = sp->type_k == ST_DTYPE_F16 ? 2 : 4, ev = sp->type_v == ST_DTYPE_F16 ? 2 : 4;
    r->kv_bytes_per_pos = (double)hp->n_layer * hp->n_head_kv * hp->head_dim * (ek + ev);
    r->weight_bytes = (double)st_model_weight_bytes(m);
}

/* Floors in seconds of a pass over n tokens after ctx, the logits of the last n_logits; *macs
 * its multiply-adds, *bytes what it reads. A part whose loop is unknown or unmeasured adds
 * nothing to the compute floor. */
static void roof_floors(const roofline *r, int n, int n_logits, int ctx, double *macs,
                        double *bytes, double *mem_s, double *comp_s) {
    *macs = 0.0;
    *comp_s = 0.0;
    for (int i = 0; i < r->n_mats; i++) {
        const roof_mat *m = &r->mats[i];
        const int rows = i == r->out ? n_logits : n;
        const int loop = st_peak_kernel_loop(r->table, m->type, rows, m->packed, r->amx);
        const double k = m->macs * rows;
        *macs += k;
        if (loop >= 0 && r->rates.op_s[loop] > 0)
            *comp_s += k / r->rates.op_s[loop];
    }
    /* token i sees ctx + i + 1 keys */
    const double keys = (double)n * ctx + 0.5 * (double)n * (n + 1);
    const double ka = r->attn_per_key * keys;
    const int loop = st_peak_kernel_loop(r->table, PEAK_TYPE_ATTN, n, 0, r->amx);
    *macs += ka;
    if (loop >= 0 && r->rates.op_s[loop] > 0)
        *comp_s += ka / r->rates.op_s[loop];
    *bytes = r->weight_bytes + r->kv_bytes_per_pos * (ctx + n);
    *mem_s = r->rates.read_bps > 0 ? *bytes / r->rates.read_bps : 0.0;
}

/* Measures the loops the passes of sizes ns[0 .. k) run on, and the streams over a buffer the
 * size of what the largest pass reads (capped at st_peak_stream_bytes(): memory), so that a
 * model that fits in the caches is held to their bandwidth. */
static int roof_measure(roofline *r, const int *ns, int k, int ctx, int threads, double seconds) {
    int want[PEAK_N_LOOPS] = {0};
    for (int j = 0; j < k; j++) {
        for (int i = 0; i < r->n_mats; i++) {
            const int loop =
                st_peak_kernel_loop(r->table, r->mats[i].type, ns[j], r->mats[i].packed, r->amx);
            if (loop >= 0)
                want[loop] = 1;
        }
        const int loop = st_peak_kernel_loop(r->table, PEAK_TYPE_ATTN, ns[j], 0, r->amx);
        if (loop >= 0)
            want[loop] = 1;
    }
    const double pass = r->weight_bytes + r->kv_bytes_per_pos * (ctx + ns[k - 1]);
    const size_t cap = st_peak_stream_bytes();
    const size_t bytes = pass < (double)cap ? (size_t)pass : cap;
    return st_peak_measure(1, &threads, seconds, 3, want, bytes, &r->rates);
}

int st_bench_verify_main(int argc, char **argv) {
    st_bench_opts o = {.reps = 5};
    verify_opts vo = {.ctx = 512, .peak_s = 0.05};
    int rc = st_bench_parse("verify", usage, argc, argv, &o, extra_opt, &vo);
    if (rc >= 0)
        return rc;
    const int ctx = vo.ctx;
    st_model *m;
    st_session *s;
    st_verify_mask *vm = NULL;
    const int P = vo.prefill;
    if (st_bench_open("verify", &o, ctx + VERIFY_MAX_N > P ? ctx + VERIFY_MAX_N : P, &m, &s))
        return 1;
    const st_model_hparams *hp = st_model_get_hparams(m);
    const int threads = st_session_get_params(s)->n_threads;
    const int ns[VERIFY_NS + 1] = {1, 2, 4, 8, 16, 32, 64, P};
    const int plen = ctx > P ? ctx : P;
    int32_t *prompt = malloc((size_t)plen * sizeof(int32_t));
    int32_t tokens[VERIFY_MAX_N], positions[VERIFY_MAX_N];
    float *logits = malloc((size_t)VERIFY_MAX_N * (size_t)hp->n_vocab * sizeof(float));
    double *t = malloc((size_t)(VERIFY_NS + 1) * (size_t)o.reps * sizeof(double));
    roofline *roof = calloc(1, sizeof *roof);
    rc = 1;
    if (!prompt || !logits || !t || !roof) {
        fprintf(stderr, "verify: out of memory\n");
        goto done;
    }
    roof_init(roof, m, s);
    if (roof_measure(roof, ns, P ? VERIFY_NS + 1 : VERIFY_NS, ctx, threads, vo.peak_s)) {
        fprintf(stderr, "verify: out of memory for the roofline's stream buffer\n");
        goto done;
    }
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < plen; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        prompt[i] = (int32_t)((x >> 33) % (uint64_t)hp->n_vocab);
    }
    for (int i = 0; i < VERIFY_MAX_N; i++) {
        tokens[i] = prompt[(i * 7) % ctx];
        positions[i] = ctx + i;
    }
    if (st_session_eval(s, 0, prompt, ctx, NULL, 0))
        goto fail;
    const int32_t seq = 0;
    st_tree tree = {.tokens = tokens, .positions = positions};
    st_tree_mask mask;
    if (st_verify_mask_create(ST_ATTN_CASCADE, 1, VERIFY_MAX_N, ctx, &vm))
        goto fail;
    /* Each timed pass follows untimed passes of the same size, at least two and at least
     * VERIFY_WARM_S of them: on the 1.1B models a pass right after one of another size measured
     * up to 2-3x slower (caches and prefetchers still tuned to the other size), and on the 84 MB
     * widened model the first 5-8 single-token passes after a 64-token one took 1.5-2.5x the
     * steady time (one untimed pass was not enough); a steady verify loop sees neither. */
    for (int r = 0; r < o.reps; r++)
        for (int k = 0; k < VERIFY_NS; k++) {
            const double warm0 = st_time_seconds();
            for (int pass = 0;; pass++) {
                const bool timed = pass >= 2 && st_time_seconds() - warm0 >= VERIFY_WARM_S;
                double t0 = st_time_seconds();
                /* a chain (topk 1): cascade attention is causal and reads no mask */
                if (st_verify_mask_prepare(vm, 1, 1, ns[k], ctx, &mask) ||
                    st_session_verify(s, vm, 1, ns[k], &seq, &tree, logits))
                    goto fail;
                if (timed) {
                    t[k * o.reps + r] = st_time_seconds() - t0;
                    break;
                }
            }
        }
    double ms[VERIFY_NS];
    for (int k = 0; k < VERIFY_NS; k++)
        ms[k] = 1e3 * st_bench_median(t + k * o.reps, o.reps);
    /* the prompt from position 0, after one untimed run */
    double pms = 0.0;
    if (P) {
        double *tp = t + VERIFY_NS * o.reps;
        for (int r = -1; r < o.reps; r++) {
            if (st_session_seq_reset(s, seq))
                goto fail;
            const double t0 = st_time_seconds();
            if (st_session_eval(s, seq, prompt, P, logits, 1))
                goto fail;
            if (r >= 0)
                tp[r] = st_time_seconds() - t0;
        }
        pms = 1e3 * st_bench_median(tp, o.reps);
    }
    const char *lmode = st_load_mode_name(st_model_get_load_info(m)->mode);
    char ld[160];
    if (!o.json) {
        printf("verify %s (%s, %d threads): one forward over N tokens at context %d, median of "
               "%d rounds; weights loaded: %s\n",
               o.model, st_bench_wtype(m), threads, ctx, o.reps,
               st_bench_load_desc(m, ld, sizeof ld));
        printf("  roofline on %d threads, measured first (kernel table %s): read %.2f GB/s over "
               "%.1f MB (copy %.2f GB/s of bytes read)",
               roof->rates.threads, roof->table, roof->rates.read_bps / 1e9,
               (double)roof->rates.stream_bytes / 1e6, roof->rates.copy_read_bps / 1e9);
        for (int id = 0; id < PEAK_N_LOOPS; id++)
            if (roof->rates.op_s[id] > 0)
                printf("; %s %.1f G MAC/s", st_peak_loops[id].name, roof->rates.op_s[id] / 1e9);
        printf("\n  floors: memory = (weights %.1f MB + K/V rows) / read; compute = "
               "multiply-adds / the peak of each matrix's instruction\n",
               roof->weight_bytes / 1e6);
    }
    for (int k = 0; k < VERIFY_NS; k++) {
        double macs, bytes, mem_s, comp_s;
        roof_floors(roof, ns[k], ns[k], ctx, &macs, &bytes, &mem_s, &comp_s);
        const double floor_s = mem_s > comp_s ? mem_s : comp_s;
        const double frac = floor_s / (1e-3 * ms[k]);
        const char *bound = mem_s >= comp_s ? "memory" : "compute";
        if (o.json)
            printf("{\"bench\":\"verify\",\"model\":\"%s\",\"wtype\":\"%s\",\"threads\":%d,"
                   "\"ctx\":%d,\"n\":%d,\"ms\":%.4f,\"ratio\":%.4f,\"load_mode\":\"%s\","
                   "\"kernels\":\"%s\",\"macs_g\":%.6f,\"read_mb\":%.3f,\"read_gbps\":%.3f,"
                   "\"peak_gmac_s\":%.3f,\"floor_mem_ms\":%.6f,\"floor_compute_ms\":%.6f,"
                   "\"bound\":\"%s\",\"frac_floor\":%.4f}\n",
                   o.model, st_bench_wtype(m), threads, ctx, ns[k], ms[k], ms[k] / ms[0], lmode,
                   roof->table, macs / 1e9, bytes / 1e6, roof->rates.read_bps / 1e9,
                   comp_s > 0 ? macs / comp_s / 1e9 : 0.0, 1e3 * mem_s, 1e3 * comp_s, bound, frac);
        else
            printf("  N=%-3d %10.3f ms   ratio %6.2f   %8.3f ms/token   floors: memory %8.3f ms, "
                   "compute %8.3f ms (%7.3f G MAC)   %5.1f%% of the %s floor\n",
                   ns[k], ms[k], ms[k] / ms[0], ms[k] / ns[k], 1e3 * mem_s, 1e3 * comp_s,
                   macs / 1e9, 100.0 * frac, bound);
    }
    if (P) {
        double macs, bytes, mem_s, comp_s;
        roof_floors(roof, P, 1, 0, &macs, &bytes, &mem_s, &comp_s);
        const double floor_s = mem_s > comp_s ? mem_s : comp_s;
        const char *bound = mem_s >= comp_s ? "memory" : "compute";
        if (o.json)
            printf("{\"bench\":\"prefill\",\"model\":\"%s\",\"wtype\":\"%s\",\"threads\":%d,"
                   "\"n\":%d,\"ms\":%.4f,\"tok_s\":%.3f,\"kernels\":\"%s\",\"macs_g\":%.6f,"
                   "\"floor_mem_ms\":%.6f,\"floor_compute_ms\":%.6f,\"bound\":\"%s\","
                   "\"frac_floor\":%.4f}\n",
                   o.model, st_bench_wtype(m), threads, P, pms, 1e3 * P / pms, roof->table,
                   macs / 1e9, 1e3 * mem_s, 1e3 * comp_s, bound, floor_s / (1e-3 * pms));
        else
            printf("  prefill of %d tokens from position 0: %.1f ms, %.1f tokens/s   floors: "
                   "memory %.3f ms, compute %.3f ms (%.3f G MAC)   %.1f%% of the %s floor\n",
                   P, pms, 1e3 * P / pms, 1e3 * mem_s, 1e3 * comp_s, macs / 1e9,
                   100.0 * floor_s / (1e-3 * pms), bound);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "verify: %s\n", st_last_error());
done:
    free(roof);
    st_verify_mask_free(vm);
    free(t);
    free(logits);
    free(prompt);
    st_session_free(s);
    st_model_free(m);
    return rc;
}
