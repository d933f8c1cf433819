/*
 * verify.c: `spectree-bench verify -m MODEL [--json]`: the verify-cost curve that decides
 * whether speculation pays (DESIGN.md cost model): the time of one target forward over N tokens
 * (a chain at positions L .. L+N-1 with the logits of all N, st_session_verify with causal
 * attention) after a committed context of L = 512 tokens, for N = 1, 2, 4, ..., 64, and
 * ratio = ms(N) / ms(1). The sizes are interleaved in rounds so that a burst of other work on
 * the machine slows all of them alike, each timed pass after untimed ones of the same size;
 * each size reports its median.
 */
#include "bench.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { VERIFY_MAX_N = ST_SPEC_MAX_N, VERIFY_NS = 7 };
#define VERIFY_WARM_S 0.03

static const char *usage =
    "usage: spectree-bench verify -m MODEL [--json] [--threads N] [--reps R] [--ctx L]\n"
    "                             [--mmap | --no-mmap] [--mlock]\n"
    "  one forward pass over N = 1, 2, 4, 8, 16, 32, 64 tokens (logits for all) after a\n"
    "  committed context of L tokens (default 512): ms per pass, median of R rounds (default\n"
    "  5), each timed pass after untimed ones of the same size (at least two and 30 ms), and\n"
    "  ratio = ms(N) / ms(1)\n" ST_BENCH_LOAD_USAGE;

static int ctx_opt(void *ctx, int argc, char **argv) {
    if (strcmp(argv[0], "--ctx") || argc < 2)
        return 0;
    int v = atoi(argv[1]);
    if (v < 1 || v > 1000000) {
        fprintf(stderr, "verify: --ctx must be in 1..1000000\n");
        return -1;
    }
    *(int *)ctx = v;
    return 2;
}

int st_bench_verify_main(int argc, char **argv) {
    st_bench_opts o = {.reps = 5};
    int ctx = 512;
    int rc = st_bench_parse("verify", usage, argc, argv, &o, ctx_opt, &ctx);
    if (rc >= 0)
        return rc;
    st_model *m;
    st_session *s;
    st_verify_mask *vm = NULL;
    if (st_bench_open("verify", &o, ctx + VERIFY_MAX_N, &m, &s))
        return 1;
    const st_model_hparams *hp = st_model_get_hparams(m);
    const int threads = st_session_get_params(s)->n_threads;
    const int ns[VERIFY_NS] = {1, 2, 4, 8, 16, 32, 64};
    int32_t *prompt = malloc((size_t)ctx * sizeof(int32_t));
    int32_t tokens[VERIFY_MAX_N], positions[VERIFY_MAX_N];
    float *logits = malloc((size_t)VERIFY_MAX_N * (size_t)hp->n_vocab * sizeof(float));
    double *t = malloc((size_t)VERIFY_NS * (size_t)o.reps * sizeof(double));
    rc = 1;
    if (!prompt || !logits || !t) {
        fprintf(stderr, "verify: out of memory\n");
        goto done;
    }
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < ctx; i++) {
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
    const char *lmode = st_load_mode_name(st_model_get_load_info(m)->mode);
    char ld[160];
    if (!o.json)
        printf("verify %s (%s, %d threads): one forward over N tokens at context %d, median of "
               "%d rounds; weights loaded: %s\n",
               o.model, st_bench_wtype(m), threads, ctx, o.reps,
               st_bench_load_desc(m, ld, sizeof ld));
    for (int k = 0; k < VERIFY_NS; k++) {
        if (o.json)
            printf("{\"bench\":\"verify\",\"model\":\"%s\",\"wtype\":\"%s\",\"threads\":%d,"
                   "\"ctx\":%d,\"n\":%d,\"ms\":%.4f,\"ratio\":%.4f,\"load_mode\":\"%s\"}\n",
                   o.model, st_bench_wtype(m), threads, ctx, ns[k], ms[k], ms[k] / ms[0], lmode);
        else
            printf("  N=%-3d %10.3f ms   ratio %6.2f   %8.3f ms/token\n", ns[k], ms[k],
                   ms[k] / ms[0], ms[k] / ns[k]);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "verify: %s\n", st_last_error());
done:
    st_verify_mask_free(vm);
    free(t);
    free(logits);
    free(prompt);
    st_session_free(s);
    st_model_free(m);
    return rc;
}
