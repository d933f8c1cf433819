/*
 * tree.c: `spectree-bench tree [--json] [--reps R]`: per-step overhead of tree speculative
 * decoding outside the model (verify-mask build, greedy verification, KV row commit) against
 * context length, for each mask layout. It shows what SGLang PR #32886 fixed: a FULL mask whose
 * prefix is filled every step costs O(N * sum L), every other layout stays flat (DESIGN.md
 * invariant 3). Per case: the median over repetitions after a warm-up, best of three rounds over
 * the grid; one line (or JSON object) per case.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "bench.h"

#include "spectree.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    BENCH_N_LAYER = 8,     /* KV planes = 2*n_layer (K and V) */
    BENCH_ROW_BYTES = 512, /* one position of one plane: n_head_kv*head_dim = 256 f16 */
    BENCH_ROUNDS = 3
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dULL;
}

static float uniform(uint64_t *s) { return (float)(xorshift(s) >> 40) / 16777216.0f; }

/* An EAGLE-2 style drafter (TREE_SPEC §1.2): each node's K child probabilities are a random
 * softmax sorted descending; level i keeps the K best of the K*K cumulative scores. */
static void simulate_draft(uint64_t *rng, int64_t bs, int64_t k, int64_t s, float *scores,
                           int32_t *tokens, int64_t *lparents) {
    const int64_t m = st_tree_n_candidates(k, s), lw = st_tree_level_parents_width(k, s);
    float prev[64], child[64], expand[64 * 64];
    int64_t order[64 * 64];
    for (int64_t b = 0; b < bs; b++) {
        float *sc = scores + b * m;
        int32_t *tk = tokens + b * m;
        int64_t *lp = lparents + b * lw;
        for (int64_t i = 0; i < s; i++) {
            const int64_t groups = i == 0 ? 1 : k, base = i == 0 ? 0 : k + (i - 1) * k * k;
            for (int64_t p = 0; p < groups; p++) {
                float sum = 0.0f;
                for (int64_t c = 0; c < k; c++)
                    sum += child[c] = expf(4.0f * uniform(rng));
                for (int64_t c = 0; c < k; c++) /* descending, as fast_topk returns them */
                    for (int64_t j = c; j > 0 && child[j - 1] < child[j]; j--) {
                        float t = child[j];
                        child[j] = child[j - 1];
                        child[j - 1] = t;
                    }
                for (int64_t c = 0; c < k; c++) {
                    expand[p * k + c] = (i == 0 ? 1.0f : prev[p]) * child[c] / sum;
                    sc[base + p * k + c] = expand[p * k + c];
                    tk[base + p * k + c] = (int32_t)(xorshift(rng) % 32000);
                }
            }
            const int64_t cnt = groups * k;
            for (int64_t g = 0; g < cnt; g++) {
                int64_t j = g;
                for (; j > 0 && expand[order[j - 1]] < expand[g]; j--)
                    order[j] = order[j - 1];
                order[j] = g;
            }
            if (i == 0) {
                lp[0] = -1;
                for (int64_t c = 0; c < k; c++)
                    lp[1 + c] = c;
            } else {
                for (int64_t c = 0; c < k; c++)
                    lp[(k + 1) + (i - 1) * k + c] = base + order[c];
            }
            for (int64_t c = 0; c < k; c++)
                prev[c] = expand[order[c]];
        }
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Buffers of one (bs, n, ctx) configuration, allocated once and reused by every mode. */
typedef struct bench_cfg {
    int64_t bs, topk, depth, n, ctx;
    int32_t *roots, *drafts, *target, *predicts;
    int64_t *seq_lens, *sel, *plist, *accept, *n_accept;
    st_tree tree;
    uint8_t *mask; /* sized for ST_MASK_FULL, the largest layout */
    size_t mask_bytes;
    uint8_t *kv; /* per request: 2*n_layer planes of rows [L, L+N) */
    size_t kv_req_bytes;
} bench_cfg;

static void cfg_free(bench_cfg *c) {
    free(c->roots);
    free(c->drafts);
    free(c->target);
    free(c->predicts);
    free(c->seq_lens);
    free(c->sel);
    free(c->plist);
    free(c->accept);
    free(c->n_accept);
    free(c->tree.tokens);
    free(c->tree.positions);
    free(c->tree.retrieve_index);
    free(c->tree.next_token);
    free(c->tree.next_sibling);
    free(c->mask);
    free(c->kv);
}

/* Returns 0, or -1 when out of memory, or the st_status of a failing call. */
static int cfg_init(bench_cfg *c, int64_t bs, int64_t n, int64_t ctx, uint64_t *rng) {
    memset(c, 0, sizeof *c);
    c->bs = bs;
    c->n = n;
    c->ctx = ctx;
    /* SGLang's (steps, topk, N) choices: (5,4,8) for Llama, (3,4,16) in the EAGLE examples; a
     * wider K=8, S=6 tree for N=64. */
    c->topk = n <= 8 ? 4 : n <= 16 ? 4 : 8;
    c->depth = n <= 8 ? 5 : n <= 16 ? 3 : 6;
    const int64_t m = st_tree_n_candidates(c->topk, c->depth);
    const int64_t lw = st_tree_level_parents_width(c->topk, c->depth);
    const int64_t pw = st_tree_parent_width(c->topk, c->depth), rows = bs * n;
    if (st_tree_mask_bytes(ST_MASK_FULL, bs, n, bs * ctx, &c->mask_bytes) != ST_OK)
        return ST_ERR_RANGE;
    c->kv_req_bytes = (size_t)(2 * BENCH_N_LAYER) * (size_t)n * BENCH_ROW_BYTES;
    float *scores = malloc((size_t)(bs * m) * sizeof *scores);
    int32_t *tokens = malloc((size_t)(bs * m) * sizeof *tokens);
    int64_t *lp = malloc((size_t)(bs * lw) * sizeof *lp);
    c->roots = malloc((size_t)bs * sizeof *c->roots);
    c->drafts = malloc((size_t)rows * sizeof *c->drafts);
    c->target = malloc((size_t)rows * sizeof *c->target);
    c->predicts = malloc((size_t)rows * sizeof *c->predicts);
    c->seq_lens = malloc((size_t)bs * sizeof *c->seq_lens);
    c->sel = malloc((size_t)rows * sizeof *c->sel);
    c->plist = malloc((size_t)(bs * pw) * sizeof *c->plist);
    c->accept = malloc((size_t)(bs * (c->depth + 1)) * sizeof *c->accept);
    c->n_accept = malloc((size_t)bs * sizeof *c->n_accept);
    c->tree.tokens = malloc((size_t)rows * sizeof(int32_t));
    c->tree.positions = malloc((size_t)rows * sizeof(int32_t));
    c->tree.retrieve_index = malloc((size_t)rows * sizeof(int64_t));
    c->tree.next_token = malloc((size_t)rows * sizeof(int64_t));
    c->tree.next_sibling = malloc((size_t)rows * sizeof(int64_t));
    c->mask = malloc(c->mask_bytes);
    c->kv = malloc(c->kv_req_bytes * (size_t)bs);
    int rc = 0;
    if (!scores || !tokens || !lp || !c->roots || !c->drafts || !c->target || !c->predicts ||
        !c->seq_lens || !c->sel || !c->plist || !c->accept || !c->n_accept || !c->tree.tokens ||
        !c->tree.positions || !c->tree.retrieve_index || !c->tree.next_token ||
        !c->tree.next_sibling || !c->mask || !c->kv) {
        rc = -1;
        goto done;
    }
    memset(c->kv, 0x3C, c->kv_req_bytes * (size_t)bs);
    simulate_draft(rng, bs, c->topk, c->depth, scores, tokens, lp);
    const st_tree_shape shape = {bs, c->topk, c->depth, n};
    rc = st_tree_organize(&shape, scores, tokens, lp, c->sel, c->drafts, c->plist);
    if (rc != ST_OK)
        goto done;
    for (int64_t b = 0; b < bs; b++) {
        c->roots[b] = (int32_t)(xorshift(rng) % 32000);
        c->seq_lens[b] = ctx;
    }
    /* One QLEN build to get the lists, then a target that follows the first child 80% of the
     * time: a few accepted tokens per step, as in practice. */
    st_tree_mask mk = {ST_MASK_QLEN, 0, c->mask, c->mask_bytes};
    const st_tree_input in = {c->roots, c->plist, c->sel, c->drafts, c->seq_lens};
    rc = st_tree_build(&shape, &in, &c->tree, &mk);
    if (rc != ST_OK)
        goto done;
    for (int64_t x = 0; x < rows; x++) {
        int64_t child = c->tree.next_token[x];
        c->target[x] = child >= 0 && uniform(rng) < 0.8f ? c->tree.tokens[(x / n) * n + child]
                                                         : (int32_t)(xorshift(rng) % 32000);
    }
done:
    free(scores);
    free(tokens);
    free(lp);
    return rc;
}

/* One speculative step's overhead: build (mask in `layout`), greedy verify, commit. */
static st_status step(bench_cfg *c, st_mask_layout layout, int fill) {
    const st_tree_shape shape = {c->bs, c->topk, c->depth, c->n};
    const st_tree_input in = {c->roots, c->plist, c->sel, c->drafts, c->seq_lens};
    st_tree_mask mk = {layout, fill, c->mask, c->mask_bytes};
    st_status s = st_tree_build(&shape, &in, &c->tree, &mk);
    if (s != ST_OK)
        return s;
    s = st_verify_tree_greedy(c->bs, c->n, c->depth, &c->tree, c->target, c->predicts, c->accept,
                              c->n_accept);
    if (s != ST_OK)
        return s;
    const int64_t width = c->depth + 1;
    for (int64_t b = 0; b < c->bs; b++) {
        int64_t nodes[ST_TREE_MAX_DEPTH + 1];
        for (int64_t i = 0; i <= c->n_accept[b]; i++)
            nodes[i] = c->accept[b * width + i] - b * c->n;
        /* The window holds rows [L, L+N) of each plane, so pos is 0 relative to it: commit
         * touches no other row, and a full 131072-row cache per request would not fit. */
        s = st_tree_commit_rows(c->kv + (size_t)b * c->kv_req_bytes, c->kv_req_bytes,
                                BENCH_ROW_BYTES, 2 * BENCH_N_LAYER, (size_t)c->n * BENCH_ROW_BYTES,
                                0, c->n, nodes, c->n_accept[b] + 1);
        if (s != ST_OK)
            return s;
    }
    return ST_OK;
}

/* Median microseconds per step: warm-up, calibrate inner iterations to ~2 ms per repetition,
 * then up to max_reps repetitions within a ~0.3 s budget (at least 3). */
static st_status time_case(bench_cfg *c, st_mask_layout layout, int fill, int max_reps,
                           double *us) {
    st_status s;
    for (int i = 0; i < 2; i++)
        if ((s = step(c, layout, fill)) != ST_OK)
            return s;
    double t0 = now_s();
    if ((s = step(c, layout, fill)) != ST_OK)
        return s;
    const double one = fmax(now_s() - t0, 1e-7);
    const int inner = one >= 2e-3 ? 1 : (int)(2e-3 / one) + 1;
    int reps = (int)(0.3 / (one * inner));
    reps = reps < 3 ? 3 : reps > max_reps ? max_reps : reps;
    double times[1000];
    for (int r = 0; r < reps; r++) {
        t0 = now_s();
        for (int i = 0; i < inner; i++)
            if ((s = step(c, layout, fill)) != ST_OK)
                return s;
        times[r] = (now_s() - t0) / inner;
    }
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    *us = 1e6 * (reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]));
    return ST_OK;
}

static const char *usage =
    "usage: spectree-bench tree [--json] [--reps R]\n"
    "  per-step time of verify-mask build + greedy verify + KV commit\n"
    "  for bs in {1,8,32}, N in {8,16,64}, ctx in {1024..131072} and each mask\n"
    "  layout; R (default 21) caps the repetitions of one case\n";

int st_bench_tree_main(int argc, char **argv) {
    int json = 0, max_reps = 21;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            max_reps = atoi(argv[++i]);
            if (max_reps < 1 || max_reps > 1000) {
                fprintf(stderr, "tree: --reps must be in 1..1000\n%s", usage);
                return 2;
            }
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "tree: unknown option %s\n%s", argv[i], usage);
            return 2;
        } /* anything else: the program or subcommand name */
    }
    const int64_t bss[] = {1, 8, 32}, ns[] = {8, 16, 64};
    const int64_t ctxs[] = {1024, 8192, 32768, 131072};
    const struct {
        const char *name, *label;
        st_mask_layout layout;
        int fill;
    } modes[] = {{"full", "full+fill", ST_MASK_FULL, 1},
                 {"full", "full", ST_MASK_FULL, 0},
                 {"qlen", "qlen", ST_MASK_QLEN, 0},
                 {"bits", "bits", ST_MASK_BITS, 0}};
    double table[3][3][4][4]; /* bs, n, mode, ctx */
    /* Rounds over the whole grid, keeping each case's fastest median: a burst of other work on
     * the machine slows a stretch of consecutive cases, rarely the same case in every round. */
    for (int round = 0; round < BENCH_ROUNDS; round++)
        for (int bi = 0; bi < 3; bi++)
            for (int ni = 0; ni < 3; ni++)
                for (int ci = 0; ci < 4; ci++) {
                    /* The same tree and target at every context length of a (bs, n) pair. */
                    uint64_t rng = 0x5eedULL + (uint64_t)(bi * 3 + ni) * 0x9e3779b97f4a7c15ULL;
                    bench_cfg c;
                    int rc = cfg_init(&c, bss[bi], ns[ni], ctxs[ci], &rng);
                    if (rc != 0) {
                        fprintf(stderr, "tree: bs=%lld n=%lld ctx=%lld: %s\n", (long long)bss[bi],
                                (long long)ns[ni], (long long)ctxs[ci],
                                rc < 0 ? "out of memory" : st_last_error());
                        cfg_free(&c);
                        return 1;
                    }
                    /* The no-fill layouts first, on a buffer no prefix fill has touched yet. */
                    for (int mi = 3; mi >= 0; mi--) {
                        double us;
                        st_status s =
                            time_case(&c, modes[mi].layout, modes[mi].fill, max_reps, &us);
                        if (s != ST_OK) {
                            fprintf(stderr, "tree: %s\n", st_last_error());
                            cfg_free(&c);
                            return 1;
                        }
                        double *t = &table[bi][ni][mi][ci];
                        *t = round == 0 || us < *t ? us : *t;
                    }
                    cfg_free(&c);
                }
    if (!json)
        printf("tree step overhead (build + verify + commit; KV %d planes x %d B rows), "
               "us/step: best of %d rounds of medians\n",
               2 * BENCH_N_LAYER, BENCH_ROW_BYTES, BENCH_ROUNDS);
    for (int bi = 0; bi < 3; bi++)
        for (int ni = 0; ni < 3; ni++)
            for (int ci = 0; ci < 4; ci++)
                for (int mi = 0; mi < 4; mi++) {
                    const double us = table[bi][ni][mi][ci];
                    if (json)
                        printf("{\"mode\":\"%s\",\"fill_prefix\":%s,\"bs\":%lld,\"n\":%lld,"
                               "\"ctx\":%lld,\"us\":%.3f}\n",
                               modes[mi].name, modes[mi].fill ? "true" : "false",
                               (long long)bss[bi], (long long)ns[ni], (long long)ctxs[ci], us);
                    else
                        printf("tree %-9s bs=%-2lld n=%-2lld ctx=%-6lld %12.2f us/step\n",
                               modes[mi].label, (long long)bss[bi], (long long)ns[ni],
                               (long long)ctxs[ci], us);
                }
    if (!json) {
        printf("\nsummary: us/step by context length (ratio = 131072 / 1024)\n");
        printf("%-9s %-3s %-3s %10s %10s %10s %10s %8s\n", "layout", "bs", "n", "1024", "8192",
               "32768", "131072", "ratio");
        for (int mi = 0; mi < 4; mi++)
            for (int bi = 0; bi < 3; bi++)
                for (int ni = 0; ni < 3; ni++) {
                    const double *t = table[bi][ni][mi];
                    printf("%-9s %-3lld %-3lld %10.2f %10.2f %10.2f %10.2f %8.2f\n",
                           modes[mi].label, (long long)bss[bi], (long long)ns[ni], t[0], t[1], t[2],
                           t[3], t[3] / t[0]);
                }
    }
    return 0;
}
