/*
 * decode.c: `spectree-bench decode -m MODEL [--json]`: plain decode speed, one token per
 * forward pass with its logits, over 128 tokens (median of runs after a warm-up), and the
 * weight bandwidth it implies (bytes of weights per token x tokens/s) next to the machine's
 * copy bandwidth measured in the same run with the same threads, since on a CPU decode is bound
 * by memory bandwidth (DESIGN.md cost model). Also prints the thread pool's dispatch cost:
 * a token runs about five parallel regions per layer.
 */
#include "bench.h"

/* The thread pool is internal; the benchmark times its dispatch and uses it to copy. */
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DECODE_TOKENS = 128, COPY_REPS = 5, DISPATCH_CALLS = 20000 };

static const char *usage =
    "usage: spectree-bench decode -m MODEL [--json] [--threads N] [--reps R] [--tokens T]\n"
    "                             [--mmap | --no-mmap] [--mlock]\n"
    "  decode tokens/s over T tokens (default 128) after a one-token prompt, median of R runs\n"
    "  (default 3) after a warm-up; GB/s = weight bytes per token x tokens/s, against the\n"
    "  copy bandwidth (bytes read + written per second, 256 MB buffers, same threads)\n"
    "  measured in the same run; and the thread pool's dispatch cost per parallel "
    "region\n" ST_BENCH_LOAD_USAGE;

typedef struct copy_job {
    char *dst;
    const char *src;
    size_t bytes;
} copy_job;

static void copy_task(void *ctx, int ith, int nth) {
    const copy_job *j = ctx;
    int64_t b, e;
    st_split((int64_t)(j->bytes / 64), ith, nth, &b, &e);
    memcpy(j->dst + b * 64, j->src + b * 64, (size_t)(e - b) * 64);
}

static void empty_task(void *ctx, int ith, int nth) {
    (void)ctx;
    (void)ith;
    (void)nth;
}

/* Copy bandwidth in GB/s (read + write bytes), median of COPY_REPS; 0 if out of memory. */
static double copy_gbps(st_pool *pool) {
    const size_t bytes = (size_t)256 << 20;
    char *a = malloc(bytes), *b = malloc(bytes);
    double gbps = 0.0;
    if (a && b) {
        memset(a, 1, bytes);
        memset(b, 2, bytes);
        copy_job j = {b, a, bytes};
        st_pool_run(pool, copy_task, &j); /* warm-up */
        double t[COPY_REPS];
        for (int r = 0; r < COPY_REPS; r++) {
            double t0 = st_time_seconds();
            st_pool_run(pool, copy_task, &j);
            t[r] = st_time_seconds() - t0;
        }
        gbps = 2.0 * (double)bytes / st_bench_median(t, COPY_REPS) / 1e9;
    }
    free(a);
    free(b);
    return gbps;
}

/* Microseconds per st_pool_run of an empty task (the barrier alone), median of 5. */
static double dispatch_us(st_pool *pool) {
    double t[5];
    for (int r = 0; r < 5; r++) {
        double t0 = st_time_seconds();
        for (int i = 0; i < DISPATCH_CALLS; i++)
            st_pool_run(pool, empty_task, NULL);
        t[r] = (st_time_seconds() - t0) / DISPATCH_CALLS * 1e6;
    }
    return st_bench_median(t, 5);
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

int st_bench_decode_run(st_session *s, float *logits, int32_t n_vocab, int32_t n, double *sec) {
    int32_t tok = 1 < n_vocab ? 1 : 0;
    if (st_session_seq_reset(s, 0) || st_session_eval(s, 0, &tok, 1, logits, 1))
        return 1;
    double t0 = st_time_seconds();
    for (int32_t i = 0; i < n; i++) {
        tok = argmax(logits, n_vocab);
        if (st_session_eval(s, 0, &tok, 1, logits, 1))
            return 1;
    }
    *sec = st_time_seconds() - t0;
    return 0;
}

static int tokens_opt(void *ctx, int argc, char **argv) {
    if (strcmp(argv[0], "--tokens") || argc < 2)
        return 0;
    int v = atoi(argv[1]);
    if (v < 1 || v > 100000) {
        fprintf(stderr, "decode: --tokens must be in 1..100000\n");
        return -1;
    }
    *(int *)ctx = v;
    return 2;
}

int st_bench_decode_main(int argc, char **argv) {
    st_bench_opts o = {.reps = 3};
    int n_tok = DECODE_TOKENS;
    int rc = st_bench_parse("decode", usage, argc, argv, &o, tokens_opt, &n_tok);
    if (rc >= 0)
        return rc;
    st_model *m;
    st_session *s;
    if (st_bench_open("decode", &o, n_tok + 2, &m, &s))
        return 1;
    const st_model_hparams *hp = st_model_get_hparams(m);
    const int threads = st_session_get_params(s)->n_threads;
    float *logits = malloc((size_t)hp->n_vocab * sizeof(float));
    double *t = malloc((size_t)o.reps * sizeof(double));
    st_pool *pool = NULL;
    rc = 1;
    if (!logits || !t || st_pool_create(threads, &pool) != ST_OK) {
        fprintf(stderr, "decode: out of memory\n");
        goto done;
    }
    const double copy0 = copy_gbps(pool);
    double warm;
    if (st_bench_decode_run(s, logits, hp->n_vocab, n_tok < 16 ? n_tok : 16, &warm))
        goto fail;
    for (int r = 0; r < o.reps; r++)
        if (st_bench_decode_run(s, logits, hp->n_vocab, n_tok, &t[r]))
            goto fail;
    const double copy1 = copy_gbps(pool);
    /* the dispatch cost on every core, even when this model's session uses one thread */
    const int disp_threads = st_n_cores();
    st_pool *dpool = NULL;
    double disp = 0.0;
    if (st_pool_create(disp_threads, &dpool) == ST_OK)
        disp = dispatch_us(dpool);
    st_pool_free(dpool);
    const double sec = st_bench_median(t, o.reps);
    const double tok_s = n_tok / sec;
    const double wbytes = (double)st_model_weight_bytes(m);
    const double gbps = wbytes * tok_s / 1e9;
    const double copy = 0.5 * (copy0 + copy1);
    const char *kern = st_kernels_name();
    const st_load_info *li = st_model_get_load_info(m);
    char ld[160];
    if (o.json)
        printf("{\"bench\":\"decode\",\"model\":\"%s\",\"wtype\":\"%s\",\"n_embd\":%d,"
               "\"n_layer\":%d,\"threads\":%d,\"kernels\":\"%s\",\"tokens\":%d,\"reps\":%d,"
               "\"tok_s\":%.2f,\"ms_per_tok\":%.4f,\"weight_mb\":%.2f,\"gbps\":%.3f,"
               "\"copy_gbps\":%.3f,\"frac_copy\":%.4f,\"dispatch_us\":%.3f,"
               "\"dispatch_threads\":%d,\"load_mode\":\"%s\",\"load_s\":%.3f,"
               "\"load_cpu_s\":%.3f,\"huge_mb\":%.1f}\n",
               o.model, st_bench_wtype(m), hp->n_embd, hp->n_layer, threads, kern, n_tok, o.reps,
               tok_s, 1e3 * sec / n_tok, wbytes / 1e6, gbps, copy, copy > 0 ? gbps / copy : 0.0,
               disp, disp_threads, st_load_mode_name(li->mode), li->seconds, li->cpu_seconds,
               (double)li->huge_bytes / 1e6);
    else
        printf("decode %s (%s, %d threads, kernels %s): %.2f tokens/s (%.3f ms/token, median "
               "of %d runs of %d tokens)\n"
               "  weights %.1f MB/token -> %.2f GB/s; copy bandwidth %.2f GB/s (%.2f / %.2f before "
               "/ after): %.0f%%\n"
               "  pool dispatch %.3f us per parallel region (%d threads)\n"
               "  weights loaded: %s\n",
               o.model, st_bench_wtype(m), threads, kern, tok_s, 1e3 * sec / n_tok, o.reps, n_tok,
               wbytes / 1e6, gbps, copy, copy0, copy1, copy > 0 ? 100.0 * gbps / copy : 0.0, disp,
               disp_threads, st_bench_load_desc(m, ld, sizeof ld));
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "decode: %s\n", st_last_error());
done:
    st_pool_free(pool);
    free(t);
    free(logits);
    st_session_free(s);
    st_model_free(m);
    return rc;
}
