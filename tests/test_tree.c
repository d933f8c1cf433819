/*
 * test_tree.c: the tree speculative core (src/spec/tree.c, verify.c, commit.c) against every
 * golden vector of shared/spec/TREE_SPEC.md §6 (SGLang's own test data), against thousands of
 * random and malformed trees run through the Python oracle tree_ref.py
 * (tests/gen_tree_fixtures.py), and for its contracts: rejected bad input, no allocation, untouched
 * prefix cells, KV commit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "spectree.h"
#include "testutil.h"

/* ------------------------------------------------------------------------------ helpers */

/* Output arrays of one tree batch (bs*n entries each), malloc'd by the test. */
typedef struct bufs {
    int64_t bs, n;
    st_tree tree;
} bufs;

static bufs bufs_new(int64_t bs, int64_t n) {
    bufs b = {bs, n, {0}};
    size_t cnt = (size_t)(bs * n);
    b.tree.tokens = malloc(cnt * sizeof(int32_t));
    b.tree.positions = malloc(cnt * sizeof(int32_t));
    b.tree.retrieve_index = malloc(cnt * sizeof(int64_t));
    b.tree.next_token = malloc(cnt * sizeof(int64_t));
    b.tree.next_sibling = malloc(cnt * sizeof(int64_t));
    assert_non_null(b.tree.tokens);
    assert_non_null(b.tree.positions);
    assert_non_null(b.tree.retrieve_index);
    assert_non_null(b.tree.next_token);
    assert_non_null(b.tree.next_sibling);
    return b;
}

static void bufs_free(bufs *b) {
    free(b->tree.tokens);
    free(b->tree.positions);
    free(b->tree.retrieve_index);
    free(b->tree.next_token);
    free(b->tree.next_sibling);
}

static void check_i64(const char *what, int ctx, const int64_t *got, const int64_t *want,
                      int64_t cnt) {
    for (int64_t i = 0; i < cnt; i++)
        if (got[i] != want[i])
            fail_msg("case %d: %s[%lld] = %lld, want %lld", ctx, what, (long long)i,
                     (long long)got[i], (long long)want[i]);
}

static void check_i32(const char *what, int ctx, const int32_t *got, const int64_t *want,
                      int64_t cnt) {
    for (int64_t i = 0; i < cnt; i++)
        if (got[i] != want[i])
            fail_msg("case %d: %s[%lld] = %d, want %lld", ctx, what, (long long)i, (int)got[i],
                     (long long)want[i]);
}

static void check_status(st_status got, st_status want, const char *needle) {
    if (got != want)
        fail_msg("status %d, want %d (%s)", (int)got, (int)want, st_last_error());
    if (want != ST_OK && needle && !strstr(st_last_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\"", st_last_error(), needle);
}

/* Tree cell (b, t, j) of a mask in any layout (N <= 64 for BITS). */
static int mask_cell(const uint8_t *mask, st_mask_layout layout, const int64_t *seq_lens, int64_t n,
                     int64_t b, int64_t t, int64_t j) {
    switch (layout) {
    case ST_MASK_FULL: {
        size_t base = 0;
        for (int64_t i = 0; i < b; i++)
            base += (size_t)(n * (seq_lens[i] + n));
        return mask[base + (size_t)(t * (seq_lens[b] + n) + seq_lens[b] + j)];
    }
    case ST_MASK_QLEN:
        return mask[(b * n + t) * n + j];
    case ST_MASK_BITS: {
        size_t w = st_tree_mask_word_bytes(n);
        return (mask[(size_t)(b * n + t) * w + (size_t)j / 8] >> (j % 8)) & 1;
    }
    case ST_MASK_NONE:
        break;
    }
    fail_msg("no mask");
    return -1;
}

/* xorshift64* for test data. */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dULL;
}

static int64_t rng_below(uint64_t *s, int64_t n) { return (int64_t)(rng_next(s) % (uint64_t)n); }

/* A drafter in the shape of SGLang's select_top_k_tokens (TREE_SPEC §1.2): scores (bs, M),
 * tokens (bs, M), level parents (bs, level_parents_width). */
static void simulate_draft(uint64_t *rng, int64_t bs, int64_t k, int64_t s, int64_t vocab,
                           float *scores, int32_t *tokens, int64_t *lparents) {
    const int64_t m = st_tree_n_candidates(k, s);
    const int64_t lw = st_tree_level_parents_width(k, s);
    float prev[ST_TREE_MAX_TOPK], expand[64 * 64];
    int64_t order[64 * 64];
    assert_true(k <= 64);
    for (int64_t b = 0; b < bs; b++) {
        float *sc = scores + b * m;
        int32_t *tk = tokens + b * m;
        int64_t *lp = lparents + b * lw;
        for (int64_t c = 0; c < k; c++)
            prev[c] = (float)(rng_below(rng, 8) + 1) / 8.0f;
        for (int64_t c = 1; c < k; c++) /* descending, as fast_topk returns them */
            for (int64_t j = c; j > 0 && prev[j - 1] < prev[j]; j--) {
                float t = prev[j];
                prev[j] = prev[j - 1];
                prev[j - 1] = t;
            }
        for (int64_t c = 0; c < k; c++) {
            sc[c] = prev[c];
            tk[c] = (int32_t)rng_below(rng, vocab);
        }
        lp[0] = -1;
        for (int64_t c = 0; c < k; c++)
            lp[1 + c] = c;
        for (int64_t i = 1; i < s; i++) {
            int64_t base = k + (i - 1) * k * k;
            for (int64_t g = 0; g < k * k; g++) {
                expand[g] = prev[g / k] * (float)(rng_below(rng, 8) + 1) / 8.0f;
                sc[base + g] = expand[g];
                tk[base + g] = (int32_t)rng_below(rng, vocab);
                order[g] = g;
            }
            for (int64_t a = 1; a < k * k; a++) /* stable sort by descending score */
                for (int64_t j = a; j > 0 && expand[order[j - 1]] < expand[order[j]]; j--) {
                    int64_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
            for (int64_t c = 0; c < k; c++) {
                prev[c] = expand[order[c]];
                lp[(k + 1) + (i - 1) * k + c] = base + order[c];
            }
        }
    }
}

/* --------------------------------------------------------------------- golden §6.1 */

static const float g_scores[2][52] = {
    {7.1127e-01f, 2.8292e-01f, 2.2995e-03f, 1.7357e-03f,
     /* level 1 */
     6.9142e-01f, 1.2863e-02f, 1.6873e-03f, 1.1871e-03f, 2.4787e-01f, 1.8818e-02f, 1.4204e-02f,
     9.2235e-04f, 2.2971e-03f, 1.6700e-06f, 1.8737e-07f, 8.3146e-08f, 1.2771e-03f, 2.4374e-04f,
     1.7832e-04f, 1.1947e-05f,
     /* level 2 */
     6.6438e-01f, 2.6997e-02f, 2.4236e-05f, 4.0821e-06f, 2.4402e-01f, 2.8409e-03f, 5.0935e-04f,
     2.9022e-04f, 1.6178e-02f, 2.0567e-03f, 4.5892e-04f, 3.0034e-05f, 1.3023e-02f, 5.0497e-04f,
     3.6371e-04f, 8.7750e-05f,
     /* level 3 */
     6.6420e-01f, 1.0525e-04f, 6.5864e-05f, 1.2253e-06f, 1.3019e-01f, 1.0461e-01f, 5.2083e-03f,
     1.6777e-03f, 2.0103e-02f, 6.7335e-03f, 1.2625e-04f, 1.0364e-05f, 1.5142e-02f, 7.0819e-04f,
     9.6595e-05f, 8.7951e-05f},
    {9.7476e-01f, 2.2219e-02f, 6.5031e-04f, 1.3212e-04f,
     /* level 1 */
     8.4832e-02f, 6.6068e-02f, 5.8304e-02f, 5.7851e-02f, 2.3616e-03f, 1.1243e-03f, 5.4368e-04f,
     2.7768e-04f, 2.5286e-04f, 1.5578e-04f, 2.8817e-05f, 1.2888e-05f, 1.2834e-04f, 2.5417e-06f,
     1.1279e-06f, 1.6088e-08f,
     /* level 2 */
     2.3263e-02f, 2.0054e-02f, 9.3990e-03f, 2.7783e-03f, 6.4156e-02f, 5.5506e-04f, 1.0429e-04f,
     9.7211e-05f, 4.9950e-02f, 5.0630e-03f, 9.0068e-04f, 3.3656e-04f, 7.5817e-03f, 8.5731e-04f,
     6.9972e-04f, 6.0793e-04f,
     /* level 3 */
     5.8608e-02f, 1.8840e-03f, 7.8535e-04f, 4.4400e-04f, 1.2185e-02f, 2.0684e-03f, 1.7418e-03f,
     1.4327e-03f, 6.2455e-03f, 6.1487e-03f, 2.6862e-03f, 1.8034e-03f, 1.8590e-03f, 1.6151e-03f,
     1.2481e-03f, 3.6038e-04f},
};

static const int32_t g_tokens[2][52] = {
    {29896, 29906, 29900, 29945, 29889, 29974, 29945, 29900, 29974, 29922, 29930, 29958, 29889,
     29974, 29930, 29945, 29974, 29922, 29930, 29958, 29946, 29945, 29953, 29906, 29896, 29945,
     29900, 29906, 29896, 29945, 29906, 29953, 29896, 29945, 29906, 29946, 29946, 29974, 29945,
     29930, 29889, 29922, 29974, 29930, 29974, 29946, 29930, 29922, 29889, 29974, 29945, 29922},
    {13,    2,     29871, 28956, 22550, 4136,  16492, 8439,  29871, 2,     3001,  13,    2,
     13,    29906, 29946, 2,     13,    29871, 259,   29871, 2,     29901, 29889, 29871, 2,
     395,   259,   29901, 29871, 2,     29889, 3001,  1234,  7146,  2186,  29941, 29906, 2,
     29946, 29871, 450,   319,   14990, 29946, 29941, 2,     29906, 29871, 2,     3001,  13},
};

static const int64_t g_lparents[2][17] = {
    {-1, 0, 1, 2, 3, 4, 8, 9, 10, 20, 24, 21, 28, 36, 40, 41, 44},
    {-1, 0, 1, 2, 3, 4, 5, 6, 7, 24, 28, 20, 21, 36, 40, 44, 45},
};

static void test_golden_build(void **state) {
    (void)state;
    const st_tree_shape shape = {2, 4, 4, 8};
    assert_int_equal(st_tree_n_candidates(4, 4), 52);
    assert_int_equal(st_tree_parent_width(4, 4), 13);
    assert_int_equal(st_tree_level_parents_width(4, 4), 17);
    int64_t sel[2 * 7], plist[2 * 13];
    int32_t drafts[2 * 7];
    check_status(st_tree_organize(&shape, &g_scores[0][0], &g_tokens[0][0], &g_lparents[0][0], sel,
                                  drafts, plist),
                 ST_OK, NULL);
    const int64_t want_sel[] = {0, 1, 4, 8, 20, 24, 36, 0, 4, 5, 6, 7, 24, 36};
    const int64_t want_plist[] = {-1, 0, 1, 2, 3, 4, 8, 9, 10, 20, 24, 21, 28,
                                  -1, 0, 1, 2, 3, 4, 5, 6, 7,  24, 28, 20, 21};
    const int64_t want_drafts[] = {29896, 29906, 29889, 29974, 29946, 29896, 29946,
                                   13,    22550, 4136,  16492, 8439,  29871, 29941};
    check_i64("top_scores_index", 0, sel, want_sel, 14);
    check_i64("parent_list", 0, plist, want_plist, 26);
    check_i32("draft_tokens", 0, drafts, want_drafts, 14);

    const int32_t roots[] = {29974, 13};
    const int64_t seq_lens[] = {5, 10};
    const st_tree_input in = {roots, plist, sel, drafts, seq_lens};
    const int64_t want_pos[] = {5, 6, 6, 7, 7, 8, 8, 9, 10, 11, 12, 12, 12, 12, 13, 14};
    const int64_t want_ri[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const int64_t want_nt[] = {1, 3, 4, 5, 6, 7, -1, -1, 1, 2, -1, 6, -1, -1, 7, -1};
    const int64_t want_ns[] = {-1, 2, -1, -1, -1, -1, -1, -1, -1, -1, 3, 4, 5, -1, -1, -1};
    const int64_t want_tok[] = {29974, 29896, 29906, 29889, 29974, 29946, 29896, 29946,
                                13,    13,    22550, 4136,  16492, 8439,  29871, 29941};
    const char *want_rows[2][8] = {{"10000000", "11000000", "10100000", "11010000", "10101000",
                                    "11010100", "10101010", "11010101"},
                                   {"10000000", "11000000", "11100000", "11010000", "11001000",
                                    "11000100", "11010010", "11010011"}};
    const uint8_t want_bits[16] = {1, 3, 5, 11, 21, 43, 85, 171, 1, 3, 7, 11, 19, 35, 75, 203};

    size_t full_bytes;
    check_status(st_tree_mask_bytes(ST_MASK_FULL, 2, 8, 15, &full_bytes), ST_OK, NULL);
    assert_int_equal(full_bytes, 248);
    uint8_t mask[248];
    const st_mask_layout layouts[] = {ST_MASK_FULL, ST_MASK_FULL, ST_MASK_QLEN, ST_MASK_BITS,
                                      ST_MASK_NONE};
    for (int li = 0; li < 5; li++) {
        bufs o = bufs_new(2, 8);
        memset(mask, 0xAB, sizeof mask);
        st_tree_mask mk = {layouts[li], li == 0, layouts[li] == ST_MASK_NONE ? NULL : mask,
                           sizeof mask};
        check_status(st_tree_build(&shape, &in, &o.tree, &mk), ST_OK, NULL);
        check_i32("positions", li, o.tree.positions, want_pos, 16);
        check_i32("tokens", li, o.tree.tokens, want_tok, 16);
        check_i64("retrieve_index", li, o.tree.retrieve_index, want_ri, 16);
        check_i64("next_token", li, o.tree.next_token, want_nt, 16);
        check_i64("next_sibling", li, o.tree.next_sibling, want_ns, 16);
        if (layouts[li] != ST_MASK_NONE)
            for (int b = 0; b < 2; b++)
                for (int t = 0; t < 8; t++)
                    for (int j = 0; j < 8; j++)
                        assert_int_equal(mask_cell(mask, layouts[li], seq_lens, 8, b, t, j),
                                         want_rows[b][t][j] - '0');
        if (layouts[li] == ST_MASK_BITS)
            assert_memory_equal(mask, want_bits, 16);
        if (layouts[li] == ST_MASK_FULL) { /* prefix: 1 with fill, untouched without */
            size_t at = 0;
            for (int b = 0; b < 2; b++)
                for (int t = 0; t < 8; t++, at += (size_t)(seq_lens[b] + 8))
                    for (int64_t c = 0; c < seq_lens[b]; c++)
                        assert_int_equal(mask[at + (size_t)c], li == 0 ? 1 : 0xAB);
            assert_int_equal(at, 248);
        }
        if (layouts[li] == ST_MASK_NONE)
            for (size_t i = 0; i < sizeof mask; i++)
                assert_int_equal(mask[i], 0xAB);
        bufs_free(&o);
    }
}

/* --------------------------------------------------------------------- golden §6.2 */

/* Builds one small tree in QLEN and checks lists, positions and the mask rows. */
static void build_small(int64_t bs, int64_t k, int64_t s, int64_t n, const int64_t *plist,
                        const int64_t *sel, const int64_t *seq_lens, const int64_t *want_pos,
                        const int64_t *want_nt, const int64_t *want_ns, const char *const *rows) {
    const st_tree_shape shape = {bs, k, s, n};
    int32_t roots[8] = {0}, drafts[64] = {0};
    uint8_t mask[8 * 64];
    bufs o = bufs_new(bs, n);
    const st_tree_input in = {roots, plist, sel, drafts, seq_lens};
    st_tree_mask mk = {ST_MASK_QLEN, 0, mask, sizeof mask};
    check_status(st_tree_build(&shape, &in, &o.tree, &mk), ST_OK, NULL);
    check_i32("positions", 0, o.tree.positions, want_pos, bs * n);
    check_i64("next_token", 0, o.tree.next_token, want_nt, bs * n);
    check_i64("next_sibling", 0, o.tree.next_sibling, want_ns, bs * n);
    for (int64_t b = 0; b < bs; b++)
        for (int64_t i = 0; i < n; i++)
            assert_int_equal(o.tree.retrieve_index[b * n + i], b * n + i);
    for (int64_t b = 0; b < bs; b++)
        for (int64_t t = 0; t < n; t++)
            for (int64_t j = 0; j < n; j++)
                assert_int_equal(mask[(b * n + t) * n + j], rows[t][j] - '0');
    bufs_free(&o);
}

static void test_golden_small(void **state) {
    (void)state;
    { /* topk=2 hand case */
        const int64_t plist[] = {-1, 0, 1}, sel[] = {0, 1, 2}, L[] = {5};
        const int64_t pos[] = {5, 6, 6, 7}, nt[] = {1, 3, -1, -1}, ns[] = {-1, 2, -1, -1};
        const char *rows[] = {"1000", "1100", "1010", "1101"};
        build_small(1, 2, 2, 4, plist, sel, L, pos, nt, ns, rows);
    }
    { /* chain (MTP): K=1, S=3, N=4; both the spec's parent_list and the XPU port's */
        const int64_t sel[] = {0, 1, 2, 0, 1, 2}, L[] = {7, 12};
        const int64_t pos[] = {7, 8, 9, 10, 12, 13, 14, 15};
        const int64_t nt[] = {1, 2, 3, -1, 1, 2, 3, -1};
        const int64_t ns[] = {-1, -1, -1, -1, -1, -1, -1, -1};
        const char *rows[] = {"1000", "1100", "1110", "1111"};
        const int64_t plist_spec[] = {-1, 0, 1, -1, 0, 1};
        const int64_t plist_xpu[] = {0, 0, 1, 0, 0, 1};
        build_small(2, 1, 3, 4, plist_spec, sel, L, pos, nt, ns, rows);
        build_small(2, 1, 3, 4, plist_xpu, sel, L, pos, nt, ns, rows);
    }
    { /* S = 1: parent_list is empty (NULL), N = 2 */
        const int64_t sel[] = {0, 1}, L[] = {3, 0};
        const int64_t pos[] = {3, 4, 0, 1}, nt[] = {1, -1, 1, -1}, ns[] = {-1, -1, -1, -1};
        const char *rows[] = {"10", "11"};
        assert_int_equal(st_tree_parent_width(2, 1), 0);
        build_small(2, 2, 1, 2, NULL, sel, L, pos, nt, ns, rows);
    }
}

/* Random-tree invariants of §6.2 on a valid tree in every layout: diagonal set, nothing above
 * it, 1 <= depth <= S, depth == popcount(row) - 1. */
static void test_random_invariants(void **state) {
    (void)state;
    uint64_t rng = 0x1234567u;
    for (int it = 0; it < 300; it++) {
        const int64_t bs = 1 + rng_below(&rng, 4), k = 1 + rng_below(&rng, 6);
        const int64_t s = 1 + rng_below(&rng, 6);
        const int64_t m = st_tree_n_candidates(k, s);
        const int64_t n = 1 + rng_below(&rng, m + 1 < 64 ? m + 1 : 64);
        const st_tree_shape shape = {bs, k, s, n};
        const int64_t lw = st_tree_level_parents_width(k, s), pw = st_tree_parent_width(k, s);
        float *scores = malloc((size_t)(bs * m) * sizeof *scores);
        int32_t *tokens = malloc((size_t)(bs * m) * sizeof *tokens);
        int64_t *lp = malloc((size_t)(bs * lw) * sizeof *lp);
        int64_t *sel = malloc((size_t)(bs * n) * sizeof *sel);
        int32_t *drafts = malloc((size_t)(bs * n) * sizeof *drafts);
        int64_t *plist = malloc((size_t)(bs * (pw + 1)) * sizeof *plist);
        int64_t L[4];
        int32_t roots[4] = {0};
        for (int64_t b = 0; b < bs; b++)
            L[b] = rng_below(&rng, 50);
        simulate_draft(&rng, bs, k, s, 1000, scores, tokens, lp);
        check_status(st_tree_organize(&shape, scores, tokens, lp, sel, drafts, plist), ST_OK, NULL);
        size_t qb;
        check_status(st_tree_mask_bytes(ST_MASK_QLEN, bs, n, 0, &qb), ST_OK, NULL);
        uint8_t *mask = malloc(qb);
        bufs o = bufs_new(bs, n);
        const st_tree_input in = {roots, plist, sel, drafts, L};
        st_tree_mask mk = {ST_MASK_QLEN, 0, mask, qb};
        check_status(st_tree_build(&shape, &in, &o.tree, &mk), ST_OK, NULL);
        for (int64_t b = 0; b < bs; b++)
            for (int64_t t = 0; t < n; t++) {
                int64_t pop = 0, depth = o.tree.positions[b * n + t] - L[b];
                for (int64_t j = 0; j < n; j++) {
                    int c = mask[(b * n + t) * n + j];
                    pop += c;
                    if (j > t)
                        assert_int_equal(c, 0);
                }
                assert_int_equal(mask[(b * n + t) * n + t], 1);
                assert_int_equal(depth, pop - 1);
                if (t == 0)
                    assert_int_equal(depth, 0);
                else
                    assert_true(depth >= 1 && depth <= s);
            }
        bufs_free(&o);
        free(mask);
        free(scores);
        free(tokens);
        free(lp);
        free(sel);
        free(drafts);
        free(plist);
    }
}

/* ------------------------------------------------------------- golden §6.2 malformed */

typedef struct malformed_case {
    const char *name;
    int64_t sel[2][3];
    int64_t plist[2][5];
    int64_t pos[8], nt[8], ns[8];
    uint8_t bits[8];
} malformed_case;

/* Expected values: the hardened semantics (TREE_SPEC §2.4) as tree_ref.build_tree derives them;
 * SEQ_LENS = [7, 11], K = 2, S = 3, N = 4, BS = 2. */
static const malformed_case g_malformed[] = {
    {"valid_chain",
     {{4, 2, 0}, {2, 4, 0}},
     {{0, 0, 2, 0, 0}, {0, 4, 0, 0, 0}},
     {7, 10, 9, 8, 11, 14, 13, 12},
     {3, -1, 1, 2, 3, -1, 1, 2},
     {-1, -1, -1, -1, -1, -1, -1, -1},
     {1, 15, 13, 9, 1, 15, 13, 9}},
    {"missing_direct_parent",
     {{4, 2, 0}, {2, 4, 0}},
     {{0, 99, 2, 0, 0}, {0, 99, 0, 0, 0}},
     {7, 9, 8, 8, 11, 12, 13, 12},
     {3, -1, 1, -1, 3, -1, -1, 2},
     {-1, -1, -1, -1, -1, -1, -1, -1},
     {1, 7, 5, 9, 1, 3, 13, 9}},
    {"missing_ancestor",
     {{4, 2, 0}, {2, 4, 0}},
     {{0, 99, 99, 99, 99}, {0, 99, 99, 99, 99}},
     {7, 8, 8, 8, 11, 12, 12, 12},
     {3, -1, -1, -1, 3, -1, -1, -1},
     {-1, -1, -1, -1, -1, -1, -1, -1},
     {1, 3, 5, 9, 1, 3, 5, 9}},
    {"cyclic_ancestor",
     {{4, 2, 0}, {2, 4, 0}},
     {{0, 2, 2, 0, 0}, {0, 4, 4, 0, 0}},
     {7, 10, 10, 8, 11, 14, 14, 12},
     {3, -1, 1, -1, 3, -1, 1, -1},
     {-1, 2, -1, -1, -1, 2, -1, -1},
     {1, 7, 5, 9, 1, 7, 5, 9}},
    {"max_valid_depth",
     {{4, 2, 0}, {2, 4, 0}},
     {{0, 0, 4, 2, 0}, {0, 0, 2, 4, 0}},
     {7, 10, 9, 8, 11, 13, 14, 12},
     {3, 1, -1, 2, 3, 2, -1, 1},
     {-1, -1, -1, -1, -1, -1, -1, -1},
     {1, 3, 13, 9, 1, 11, 15, 9}},
    {"cross_row",
     {{4, 2, 0}, {6, 4, 0}},
     {{0, 6, 4, 0, 0}, {0, 0, 6, 4, 0}},
     {7, 10, 8, 8, 11, 14, 14, 12},
     {3, 1, -1, -1, 3, 2, 1, -1},
     {-1, -1, -1, -1, -1, -1, -1, -1},
     {1, 3, 5, 9, 1, 7, 7, 9}},
};

static void test_golden_malformed(void **state) {
    (void)state;
    const st_tree_shape shape = {2, 2, 3, 4};
    const int64_t L[] = {7, 11};
    const int32_t roots[] = {5, 6}, drafts[6] = {1, 2, 3, 4, 5, 6};
    const st_mask_layout layouts[] = {ST_MASK_FULL, ST_MASK_QLEN, ST_MASK_BITS, ST_MASK_NONE};
    uint8_t mask[4 * 18 + 32];
    for (size_t c = 0; c < sizeof g_malformed / sizeof *g_malformed; c++) {
        const malformed_case *mc = &g_malformed[c];
        const st_tree_input in = {roots, &mc->plist[0][0], &mc->sel[0][0], drafts, L};
        for (int li = 0; li < 4; li++) {
            bufs o = bufs_new(2, 4);
            memset(mask, 0xAB, sizeof mask);
            st_tree_mask mk = {layouts[li], 1, mask, sizeof mask};
            check_status(st_tree_build(&shape, &in, &o.tree, &mk), ST_OK, NULL);
            check_i32(mc->name, li, o.tree.positions, mc->pos, 8);
            check_i64(mc->name, li, o.tree.next_token, mc->nt, 8);
            check_i64(mc->name, li, o.tree.next_sibling, mc->ns, 8);
            if (layouts[li] != ST_MASK_NONE)
                for (int b = 0; b < 2; b++)
                    for (int t = 0; t < 4; t++)
                        for (int j = 0; j < 4; j++)
                            if (mask_cell(mask, layouts[li], L, 4, b, t, j) !=
                                ((mc->bits[b * 4 + t] >> j) & 1))
                                fail_msg("%s layout %d: cell (%d,%d,%d)", mc->name,
                                         (int)layouts[li], b, t, j);
            bufs_free(&o);
        }
    }
}

/* --------------------------------------------------------------------- golden §6.3 */

static const int32_t v_cand[12] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12};
static int64_t v_ri[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
static int64_t v_nt[12] = {1, 2, -1, 4, 5, -1, 4, 2, 3, -1, 5, -1};
static int64_t v_ns[12] = {-1, 3, -1, -1, -1, -1, -1, -1, -1, -1, 1, -1};

static st_tree golden_verify_tree(void) {
    st_tree t = {(int32_t *)v_cand, NULL, v_ri, v_nt, v_ns};
    return t;
}

/* target_logits of §6.3 as (2, 6, 20). */
static void golden_logits(float logits[2][6][20]) {
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 6; j++)
            for (int v = 0; v < 20; v++)
                logits[b][j][v] = 1.0f;
    logits[0][0][3] = logits[0][3][4] = logits[0][4][5] = 10.0f;
    logits[1][0][11] = logits[1][4][12] = 10.0f;
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 6; j++) {
            float mx = logits[b][j][0];
            for (int v = 1; v < 20; v++)
                mx = logits[b][j][v] > mx ? logits[b][j][v] : mx;
            if (mx < 10.0f)
                logits[b][j][18] = 10.0f;
        }
}

static void test_golden_verify_greedy(void **state) {
    (void)state;
    float logits[2][6][20];
    golden_logits(logits);
    int32_t target[12];
    for (int x = 0; x < 12; x++) {
        int best = 0;
        for (int v = 1; v < 20; v++)
            if (logits[x / 6][x % 6][v] > logits[x / 6][x % 6][best])
                best = v;
        target[x] = best;
    }
    st_tree t = golden_verify_tree();
    int32_t predicts[12];
    int64_t acc[8], num[2];
    check_status(st_verify_tree_greedy(2, 6, 3, &t, target, predicts, acc, num), ST_OK, NULL);
    const int64_t want_p[] = {3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18};
    const int64_t want_a[] = {0, 3, 4, 5, 6, 10, 11, -1};
    const int64_t want_n[] = {3, 2};
    check_i32("predicts", 0, predicts, want_p, 12);
    check_i64("accept_index", 0, acc, want_a, 8);
    check_i64("accept_token_num", 0, num, want_n, 2);
}

static void test_golden_target_only(void **state) {
    (void)state;
    float logits[2][6][20], probs[2][6][20];
    golden_logits(logits);
    for (int b = 0; b < 2; b++) /* softmax(logits / 0.01): one-hot in float */
        for (int j = 0; j < 6; j++) {
            double mx = -INFINITY, sum = 0.0, e[20];
            for (int v = 0; v < 20; v++)
                mx = fmax(mx, logits[b][j][v] / 0.01);
            for (int v = 0; v < 20; v++)
                sum += e[v] = exp(logits[b][j][v] / 0.01 - mx);
            for (int v = 0; v < 20; v++)
                probs[b][j][v] = (float)(e[v] / sum);
        }
    st_tree t = golden_verify_tree();
    const struct {
        float ts, ta;
        int64_t p[12], a[8], n[2];
    } want[] = {
        {1, 1, {3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18}, {0, 3, 4, 5, 6, 10, 11, -1}, {3, 2}},
        {0,
         0,
         {1, 2, 18, -1, -1, -1, 11, -1, -1, -1, 12, 18},
         {0, 1, 2, -1, 6, 10, 11, -1},
         {2, 2}},
    };
    for (uint64_t trial = 0; trial < 200; trial++) {
        float coins[12], cf[2];
        for (int i = 0; i < 12; i++)
            coins[i] = st_rng_uniform(trial, (uint64_t)i);
        cf[0] = st_rng_uniform(trial, 100);
        cf[1] = st_rng_uniform(trial, 101);
        for (int w = 0; w < 2; w++) {
            int32_t predicts[12];
            int64_t acc[8], num[2];
            check_status(st_verify_tree_target_only(2, 6, 3, 20, &t, &probs[0][0][0], coins, cf,
                                                    want[w].ts, want[w].ta, predicts, acc, num),
                         ST_OK, NULL);
            check_i32("predicts", (int)trial, predicts, want[w].p, 12);
            check_i64("accept_index", (int)trial, acc, want[w].a, 8);
            check_i64("accept_token_num", (int)trial, num, want[w].n, 2);
        }
    }
}

/* ------------------------------------------------------- random trees vs tree_ref.py */

typedef struct cursor {
    const char *p;
    int case_id;
} cursor;

static const char *next_word(cursor *c, char *buf, size_t cap) {
    while (*c->p == ' ' || *c->p == '\n')
        c->p++;
    size_t len = strcspn(c->p, " \n");
    if (len == 0 || len >= cap)
        fail_msg("fixture: bad token near case %d", c->case_id);
    memcpy(buf, c->p, len);
    buf[len] = 0;
    c->p += len;
    return buf;
}

static long long next_ll(cursor *c) {
    char buf[64], *end;
    next_word(c, buf, sizeof buf);
    long long v = strtoll(buf, &end, 10);
    if (*end)
        fail_msg("fixture: \"%s\" is not an integer (case %d)", buf, c->case_id);
    return v;
}

/* "name count values..." with count == want (want < 0: any); returns a malloc'd int64 array. */
static int64_t *read_arr(cursor *c, const char *name, int64_t want, int64_t *count) {
    char buf[64];
    if (strcmp(next_word(c, buf, sizeof buf), name) != 0)
        fail_msg("fixture: got \"%s\", want \"%s\" (case %d)", buf, name, c->case_id);
    int64_t cnt = next_ll(c);
    if (want >= 0 && cnt != want)
        fail_msg("fixture: %s has %lld values, want %lld (case %d)", name, (long long)cnt,
                 (long long)want, c->case_id);
    int64_t *v = malloc((size_t)(cnt > 0 ? cnt : 1) * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < cnt; i++) {
        next_word(c, buf, sizeof buf);
        char *end;
        if (strcmp(name, "bits") == 0)
            v[i] = (int64_t)strtoull(buf, &end, 10);
        else if (strcmp(name, "scores") == 0 || strcmp(name, "th") == 0) {
            double d = strtod(buf, &end); /* stored as the bits of the exact float */
            float f = (float)d;
            if ((double)f != d)
                fail_msg("fixture: %s value %s is not exact in float32", name, buf);
            int32_t u;
            memcpy(&u, &f, sizeof u);
            v[i] = u;
        } else
            v[i] = strtoll(buf, &end, 10);
        if (*end)
            fail_msg("fixture: bad %s value \"%s\" (case %d)", name, buf, c->case_id);
    }
    if (count)
        *count = cnt;
    return v;
}

static float as_float(int64_t bits) {
    int32_t u = (int32_t)bits;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int32_t *to_i32(const int64_t *v, int64_t cnt) {
    int32_t *o = malloc((size_t)(cnt > 0 ? cnt : 1) * sizeof *o);
    assert_non_null(o);
    for (int64_t i = 0; i < cnt; i++)
        o[i] = (int32_t)v[i];
    return o;
}

/* Expands run-length pairs (value, count) into bytes; checks the total. */
static uint8_t *unrle(const int64_t *pairs, int64_t n_pairs, size_t total, int cid) {
    uint8_t *o = malloc(total > 0 ? total : 1);
    size_t at = 0;
    assert_non_null(o);
    assert_true(n_pairs % 2 == 0);
    for (int64_t i = 0; i < n_pairs; i += 2) {
        if (at + (size_t)pairs[i + 1] > total)
            fail_msg("case %d: full mask runs exceed %zu cells", cid, total);
        memset(o + at, (int)pairs[i], (size_t)pairs[i + 1]);
        at += (size_t)pairs[i + 1];
    }
    if (at != total)
        fail_msg("case %d: oracle full mask has %zu cells, st_tree_mask_bytes says %zu", cid, at,
                 total);
    return o;
}

/* SGLang's legacy target-only kernel written literally, with a real zeroed draft_probs
 * (bs, N, V) that rejected children mark: the reference for st_verify_tree_target_only's
 * scratch-free equivalent. Sibling lists must be acyclic. */
static void literal_target_only(int64_t bs, int64_t n, int64_t steps, int64_t vocab,
                                const st_tree *t, const float *probs, const float *coins,
                                const float *cfinal, float ts, float ta, int32_t *predicts,
                                int64_t *acc, int64_t *num) {
    float *dp = calloc((size_t)(bs * n * vocab), sizeof *dp);
    assert_non_null(dp);
    const double th_acc = ta > 1e-9 ? (double)ta : 1e-9;
    for (int64_t x = 0; x < bs * n; x++)
        predicts[x] = -1;
    for (int64_t b = 0; b < bs; b++) {
        const int64_t *ri = t->retrieve_index + b * n, *nt = t->next_token + b * n;
        const int64_t *ns = t->next_sibling + b * n;
        const int32_t *cand = t->tokens + b * n;
        int64_t *a = acc + b * (steps + 1);
        for (int64_t i = 0; i <= steps; i++)
            a[i] = -1;
        double prob_acc = 0.0;
        int64_t row = 0, last = ri[0], k = 0, cur = 0;
        float coin = coins[b * n];
        a[0] = last;
        for (int64_t j = 1; j <= steps; j++) {
            cur = nt[cur];
            while (cur != -1) {
                int32_t tok = cand[cur];
                float q = probs[(b * n + row) * vocab + tok];
                prob_acc += q;
                if ((double)coin <= prob_acc / th_acc || q >= ts) {
                    prob_acc = 0.0;
                    row = cur;
                    coin = coins[b * n + cur];
                    predicts[last] = tok;
                    a[++k] = ri[cur];
                    last = ri[cur];
                    break;
                }
                dp[(b * n + row) * vocab + tok] = q;
                cur = ns[cur];
            }
            if (cur == -1)
                break;
        }
        num[b] = k;
        const float *q = probs + (b * n + row) * vocab, *p = dp + (b * n + row) * vocab;
        double total = 0.0, c = 0.0;
        for (int64_t v = 0; v < vocab; v++) {
            float r = q[v] - (k != steps ? p[v] : 0.0f);
            total += r > 0.0f ? r : 0.0f;
        }
        double u = (double)cfinal[b] * total;
        int64_t sampled = -1, last_valid = -1;
        for (int64_t v = 0; v < vocab; v++) {
            float r = q[v] - (k != steps ? p[v] : 0.0f);
            r = r > 0.0f ? r : 0.0f;
            if (r > 0.0f)
                last_valid = v;
            c += r;
            if (sampled < 0 && c > u)
                sampled = v;
        }
        if (sampled < 0)
            sampled = last_valid >= 0 ? last_valid : vocab - 1;
        predicts[last] = (int32_t)sampled;
    }
    free(dp);
}

/* Arrays of one fixture case, freed together. */
typedef struct fx {
    void *p[48];
    int n;
} fx;

static void *fx_keep(fx *f, void *p) {
    assert_true(f->n < 48);
    f->p[f->n++] = p;
    return p;
}

static void fx_free(fx *f) {
    for (int i = 0; i < f->n; i++)
        free(f->p[i]);
}

static int64_t g_fixture_cases, g_fixture_malformed;

static void run_fixture_case(cursor *c) {
    char kind[32], buf[64];
    if (strcmp(next_word(c, buf, sizeof buf), "case") != 0)
        fail_msg("fixture: expected a case after case %d", c->case_id);
    const int cid = (int)next_ll(c);
    c->case_id = cid;
    next_word(c, kind, sizeof kind);
    const int64_t bs = next_ll(c), k = next_ll(c), s = next_ll(c), n = next_ll(c);
    const int64_t vocab = next_ll(c);
    const int malformed = strcmp(kind, "malformed") == 0;
    const st_tree_shape shape = {bs, k, s, n};
    const int64_t m = st_tree_n_candidates(k, s), pw = st_tree_parent_width(k, s);
    const int64_t lw = st_tree_level_parents_width(k, s), rows = bs * n;
    fx f = {{0}, 0};
#define R(name, cnt) ((int64_t *)fx_keep(&f, read_arr(c, name, cnt, NULL)))
#define R32(v, cnt) ((int32_t *)fx_keep(&f, to_i32(v, cnt)))
    g_fixture_cases++;
    g_fixture_malformed += malformed;

    int64_t *L = R("L", bs);
    int32_t *roots = R32(R("root", bs), bs);
    int64_t *scores = NULL, *tokens = NULL, *lpar = NULL;
    if (!malformed) {
        scores = R("scores", bs * m);
        tokens = R("tokens", bs * m);
        lpar = R("lparents", bs * lw);
    }
    int64_t *sel = R("sel", bs * (n - 1));
    int32_t *drafts = R32(R("drafts", bs * (n - 1)), bs * (n - 1));
    int64_t *plist = R("plist", bs * pw);
    int64_t *pos = R("pos", rows), *ri = R("ri", rows), *rnt = R("rnt", rows);
    int64_t *rns = R("rns", rows), *bits = R("bits", rows);
    int64_t n_on, n_off;
    int64_t *fullon = fx_keep(&f, read_arr(c, "fullon", -1, &n_on));
    int64_t *fulloff = fx_keep(&f, read_arr(c, "fulloff", -1, &n_off));
    int32_t *tp = R32(R("tp", rows), rows);
    int64_t *gpred = R("gpred", rows), *gacc = R("gacc", bs * (s + 1)), *gnum = R("gnum", bs);
    int64_t *probs_c = R("probs", rows * vocab), *coins_c = R("coins", rows);
    int64_t *cfinal_c = R("cfinal", bs), *th = R("th", 2);
    int64_t *spred = R("spred", rows), *sacc = R("sacc", bs * (s + 1)), *snum = R("snum", bs);

    if (!malformed) { /* organize against tree_ref.organize */
        float *sc = fx_keep(&f, malloc((size_t)(bs * m) * sizeof *sc));
        int32_t *tk = R32(tokens, bs * m);
        int64_t *osel = fx_keep(&f, malloc((size_t)rows * sizeof *osel));
        int32_t *odr = fx_keep(&f, malloc((size_t)rows * sizeof *odr));
        int64_t *opl = fx_keep(&f, malloc((size_t)(bs * pw + 1) * sizeof *opl));
        for (int64_t i = 0; i < bs * m; i++)
            sc[i] = as_float(scores[i]);
        check_status(st_tree_organize(&shape, sc, tk, lpar, osel, odr, opl), ST_OK, NULL);
        check_i64("top_scores_index", cid, osel, sel, bs * (n - 1));
        for (int64_t i = 0; i < bs * (n - 1); i++)
            assert_int_equal(odr[i], drafts[i]);
        check_i64("parent_list", cid, opl, plist, bs * pw);
    }

    int64_t sum_l = 0;
    for (int64_t b = 0; b < bs; b++)
        sum_l += L[b];
    size_t full_bytes, qlen_bytes, bits_bytes;
    check_status(st_tree_mask_bytes(ST_MASK_FULL, bs, n, sum_l, &full_bytes), ST_OK, NULL);
    check_status(st_tree_mask_bytes(ST_MASK_QLEN, bs, n, sum_l, &qlen_bytes), ST_OK, NULL);
    check_status(st_tree_mask_bytes(ST_MASK_BITS, bs, n, sum_l, &bits_bytes), ST_OK, NULL);
    uint8_t *want_on = fx_keep(&f, unrle(fullon, n_on, full_bytes, cid));
    uint8_t *want_off = fx_keep(&f, unrle(fulloff, n_off, full_bytes, cid));
    uint8_t *mask = fx_keep(&f, malloc(full_bytes));
    const size_t w = st_tree_mask_word_bytes(n);
    bufs o = bufs_new(bs, n);
    const st_tree_input in = {roots, plist, sel, drafts, L};
    /* FULL fill (0xAB pre-fill), FULL no fill (0 pre-fill and 0xAB pre-fill), QLEN, BITS, NONE */
    const struct {
        st_mask_layout layout;
        int fill, prefill;
    } cfg[] = {{ST_MASK_FULL, 1, 0xAB}, {ST_MASK_FULL, 0, 0},    {ST_MASK_FULL, 0, 0xAB},
               {ST_MASK_QLEN, 0, 0xAB}, {ST_MASK_BITS, 0, 0xAB}, {ST_MASK_NONE, 0, 0xAB}};
    for (int ci = 0; ci < 6; ci++) {
        memset(mask, cfg[ci].prefill, full_bytes);
        memset(o.tree.positions, 0xAB, (size_t)rows * sizeof(int32_t));
        memset(o.tree.next_token, 0xAB, (size_t)rows * sizeof(int64_t));
        memset(o.tree.next_sibling, 0xAB, (size_t)rows * sizeof(int64_t));
        st_tree_mask mk = {cfg[ci].layout, cfg[ci].fill, mask,
                           cfg[ci].layout == ST_MASK_FULL   ? full_bytes
                           : cfg[ci].layout == ST_MASK_QLEN ? qlen_bytes
                           : cfg[ci].layout == ST_MASK_BITS ? bits_bytes
                                                            : 0};
        check_status(st_tree_build(&shape, &in, &o.tree, &mk), ST_OK, NULL);
        check_i32("positions", cid, o.tree.positions, pos, rows);
        check_i64("retrieve_index", cid, o.tree.retrieve_index, ri, rows);
        check_i64("next_token", cid, o.tree.next_token, rnt, rows);
        check_i64("next_sibling", cid, o.tree.next_sibling, rns, rows);
        for (int64_t b = 0; b < bs; b++) {
            assert_int_equal(o.tree.tokens[b * n], roots[b]);
            for (int64_t i = 1; i < n; i++)
                assert_int_equal(o.tree.tokens[b * n + i], drafts[b * (n - 1) + i - 1]);
        }
        if (cfg[ci].layout == ST_MASK_FULL && cfg[ci].fill) {
            if (memcmp(mask, want_on, full_bytes) != 0)
                fail_msg("case %d: FULL mask with fill differs from full_mask_flat", cid);
        } else if (cfg[ci].layout == ST_MASK_FULL && cfg[ci].prefill == 0) {
            if (memcmp(mask, want_off, full_bytes) != 0)
                fail_msg("case %d: FULL mask without fill differs from full_mask_flat", cid);
        } else if (cfg[ci].layout == ST_MASK_FULL) { /* prefix cells untouched */
            size_t at = 0;
            for (int64_t b = 0; b < bs; b++)
                for (int64_t t = 0; t < n; t++) {
                    for (int64_t col = 0; col < L[b] + n; col++, at++)
                        if (mask[at] != (col < L[b] ? 0xAB : want_off[at]))
                            fail_msg("case %d: FULL no-fill cell (%lld,%lld,%lld) = %d", cid,
                                     (long long)b, (long long)t, (long long)col, mask[at]);
                }
        } else if (cfg[ci].layout == ST_MASK_QLEN) {
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < n; j++)
                    if (mask[r * n + j] != (((uint64_t)bits[r] >> j) & 1))
                        fail_msg("case %d: QLEN cell (%lld,%lld)", cid, (long long)r, (long long)j);
            for (size_t i = qlen_bytes; i < full_bytes; i++)
                assert_int_equal(mask[i], 0xAB);
        } else if (cfg[ci].layout == ST_MASK_BITS) {
            for (int64_t r = 0; r < rows; r++) {
                uint64_t word = 0;
                for (size_t i = 0; i < w; i++)
                    word |= (uint64_t)mask[(size_t)r * w + i] << (8 * i);
                if (word != (uint64_t)bits[r])
                    fail_msg("case %d: BITS row %lld = %llx, want %llx", cid, (long long)r,
                             (unsigned long long)word, (unsigned long long)bits[r]);
            }
            for (size_t i = bits_bytes; i < full_bytes; i++)
                assert_int_equal(mask[i], 0xAB);
        } else {
            for (size_t i = 0; i < full_bytes; i++)
                assert_int_equal(mask[i], 0xAB);
        }
    }

    /* greedy verify against tree_ref.verify_greedy */
    int32_t *pred = fx_keep(&f, malloc((size_t)rows * sizeof *pred));
    int64_t *acc = fx_keep(&f, malloc((size_t)(bs * (s + 1)) * sizeof *acc));
    int64_t *num = fx_keep(&f, malloc((size_t)bs * sizeof *num));
    check_status(st_verify_tree_greedy(bs, n, s, &o.tree, tp, pred, acc, num), ST_OK, NULL);
    check_i32("greedy predicts", cid, pred, gpred, rows);
    check_i64("greedy accept_index", cid, acc, gacc, bs * (s + 1));
    check_i64("greedy accept_token_num", cid, num, gnum, bs);

    /* target-only sampling against tree_ref's tree_sample and the literal C form */
    float *probs = fx_keep(&f, malloc((size_t)(rows * vocab) * sizeof *probs));
    float *coins = fx_keep(&f, malloc((size_t)rows * sizeof *coins));
    float cfinal[8];
    for (int64_t i = 0; i < rows * vocab; i++)
        probs[i] = (float)probs_c[i] / 1024.0f;
    for (int64_t i = 0; i < rows; i++)
        coins[i] = (float)coins_c[i] / 4096.0f;
    for (int64_t b = 0; b < bs; b++)
        cfinal[b] = (float)cfinal_c[b] / 4096.0f;
    const float ts = as_float(th[0]), ta = as_float(th[1]);
    check_status(st_verify_tree_target_only(bs, n, s, vocab, &o.tree, probs, coins, cfinal, ts, ta,
                                            pred, acc, num),
                 ST_OK, NULL);
    check_i32("sample predicts", cid, pred, spred, rows);
    check_i64("sample accept_index", cid, acc, sacc, bs * (s + 1));
    check_i64("sample accept_token_num", cid, num, snum, bs);
    literal_target_only(bs, n, s, vocab, &o.tree, probs, coins, cfinal, ts, ta, pred, acc, num);
    check_i32("literal predicts", cid, pred, spred, rows);
    check_i64("literal accept_index", cid, acc, sacc, bs * (s + 1));

    bufs_free(&o);
    fx_free(&f);
#undef R
#undef R32
}

static void test_oracle_fixtures(void **state) {
    (void)state;
    char path[4096], cmd[16384];
    snprintf(path, sizeof path, "%s/tree_fixtures.txt", ST_BUILD_DIR);
    remove(path);
    snprintf(cmd, sizeof cmd, "\"%s\" \"%s/tests/gen_tree_fixtures.py\" \"%s\" \"%s\" 1 3000",
             ST_PYTHON3, ST_SOURCE_DIR, ST_SHARED_DIR, path);
    int rc = system(cmd);
    if (rc != 0)
        fail_msg("the fixture generator failed (status %d); python3 and "
                 "shared/spec/tree_ref.py are required: %s",
                 rc, cmd);
    char *text = tu_read_file(path, NULL);
    if (!text)
        fail_msg("cannot read %s", path);
    cursor c = {text, -1};
    char buf[64];
    if (strcmp(next_word(&c, buf, sizeof buf), "fixtures") != 0)
        fail_msg("%s: not a fixture file", path);
    const long long count = next_ll(&c);
    g_fixture_cases = g_fixture_malformed = 0;
    for (long long i = 0; i < count; i++)
        run_fixture_case(&c);
    print_message("[          ] %lld random trees matched tree_ref.py (%lld malformed)\n",
                  (long long)g_fixture_cases, (long long)g_fixture_malformed);
    assert_true(g_fixture_cases >= 1000);
    assert_true(g_fixture_malformed >= 300);
    free(text);
}

/* ------------------------------------------------ target-only: scratch-free == literal */

/* Random lists with acyclic sibling chains but arbitrary next_token (cycles through parents,
 * revisited rows), random distributions: the scratch-free sampler must match the literal one. */
static void test_target_only_equals_literal(void **state) {
    (void)state;
    uint64_t rng = 0xfeedbeefu;
    enum { BS = 3, NMAX = 12, VMAX = 9 };
    for (int it = 0; it < 4000; it++) {
        const int64_t n = 1 + rng_below(&rng, NMAX), vocab = 1 + rng_below(&rng, VMAX);
        const int64_t steps = rng_below(&rng, 7);
        int32_t cand[BS * NMAX];
        int64_t ri[BS * NMAX], nt[BS * NMAX], ns[BS * NMAX];
        float probs[BS * NMAX * VMAX], coins[BS * NMAX], cf[BS];
        for (int64_t x = 0; x < BS * n; x++) {
            int64_t i = x % n;
            cand[x] = (int32_t)rng_below(&rng, vocab);
            ri[x] = x;
            nt[x] = rng_below(&rng, 3) == 0 ? -1 : rng_below(&rng, n);
            ns[x] = i + 1 < n && rng_below(&rng, 2) ? i + 1 + rng_below(&rng, n - i - 1) : -1;
            coins[x] = (float)rng_below(&rng, 65) / 64.0f;
        }
        for (int64_t i = 0; i < BS * n * vocab; i++)
            probs[i] = rng_below(&rng, 4) == 0 ? 0.0f : (float)rng_below(&rng, 9) / 16.0f;
        for (int b = 0; b < BS; b++)
            cf[b] = (float)rng_below(&rng, 64) / 64.0f;
        const float th[][2] = {{1, 1}, {0, 0}, {0.5f, 0.25f}, {1, 0.5f}};
        const int ti = (int)rng_below(&rng, 4);
        st_tree t = {cand, NULL, ri, nt, ns};
        int32_t p1[BS * NMAX], p2[BS * NMAX];
        int64_t a1[BS * 8], a2[BS * 8], n1[BS], n2[BS];
        check_status(st_verify_tree_target_only(BS, n, steps, vocab, &t, probs, coins, cf,
                                                th[ti][0], th[ti][1], p1, a1, n1),
                     ST_OK, NULL);
        literal_target_only(BS, n, steps, vocab, &t, probs, coins, cf, th[ti][0], th[ti][1], p2, a2,
                            n2);
        assert_memory_equal(p1, p2, (size_t)(BS * n) * sizeof *p1);
        assert_memory_equal(a1, a2, (size_t)(BS * (steps + 1)) * sizeof *a1);
        assert_memory_equal(n1, n2, sizeof n1);
    }
}

/* ------------------------------------------------------------------------ organize */

/* Reference order for the organize tests: insertion sort by the documented total order. */
static int ref_before(const float *s, int64_t a, int64_t b) {
    int an = isnan(s[a]), bn = isnan(s[b]);
    if (an || bn)
        return an == bn ? a < b : bn;
    if (s[a] != s[b])
        return s[a] > s[b];
    return a < b;
}

static void test_organize_order(void **state) {
    (void)state;
    { /* NaN ranks last, ties by lower index, -0.0 == 0.0, -inf above NaN */
        const st_tree_shape shape = {1, 2, 2, 5};
        const float sc[6] = {NAN, 0.5f, 0.5f, -INFINITY, -0.0f, 0.0f};
        const int32_t tk[6] = {10, 11, 12, 13, 14, 15};
        int64_t sel[4];
        int32_t dr[4];
        check_status(st_tree_organize(&shape, sc, tk, NULL, sel, dr, NULL), ST_OK, NULL);
        const int64_t want[] = {1, 2, 4, 5};
        const int64_t want_dr[] = {11, 12, 14, 15};
        check_i64("sel", 0, sel, want, 4);
        check_i32("drafts", 0, dr, want_dr, 4);
    }
    { /* all NaN: the lowest indices */
        const st_tree_shape shape = {1, 2, 2, 4};
        const float sc[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
        const int32_t tk[6] = {0};
        int64_t sel[3];
        int32_t dr[3];
        check_status(st_tree_organize(&shape, sc, tk, NULL, sel, dr, NULL), ST_OK, NULL);
        const int64_t want[] = {0, 1, 2};
        check_i64("sel", 1, sel, want, 3);
    }
    { /* N - 1 > M is rejected; level_parents without parent_list is rejected; N = 1 is fine */
        st_tree_shape shape = {1, 2, 2, 8};
        const float sc[6] = {0};
        const int32_t tk[6] = {0};
        const int64_t lp[7] = {-1, 0, 1, 2, 3, 4, 5};
        int64_t sel[8], pl[8];
        int32_t dr[8];
        check_status(st_tree_organize(&shape, sc, tk, NULL, sel, dr, NULL), ST_ERR_INVALID,
                     "candidates");
        shape.n = 3;
        check_status(st_tree_organize(&shape, sc, tk, lp, sel, dr, NULL), ST_ERR_INVALID,
                     "level_parents");
        check_status(st_tree_organize(&shape, sc, tk, lp, sel, dr, pl), ST_OK, NULL);
        const int64_t want_pl[] = {-1, 0, 1};
        check_i64("parent_list", 2, pl, want_pl, 3);
        shape.n = 1;
        check_status(st_tree_organize(&shape, sc, tk, NULL, NULL, NULL, NULL), ST_OK, NULL);
        check_status(st_tree_organize(NULL, sc, tk, NULL, sel, dr, NULL), ST_ERR_INVALID, NULL);
        shape.n = 3;
        check_status(st_tree_organize(&shape, NULL, tk, NULL, sel, dr, NULL), ST_ERR_INVALID,
                     "NULL");
    }
    /* random scores from a tiny alphabet with NaN, inf and signed zeros */
    uint64_t rng = 42;
    const float alphabet[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 0.25f, 0.5f, 1.0f, -1.0f};
    for (int it = 0; it < 2000; it++) {
        const int64_t bs = 1 + rng_below(&rng, 3), k = 1 + rng_below(&rng, 5);
        const int64_t s = 1 + rng_below(&rng, 4), m = st_tree_n_candidates(k, s);
        const int64_t n = 1 + rng_below(&rng, m + 1 < 64 ? m + 1 : 64);
        const st_tree_shape shape = {bs, k, s, n};
        float sc[3 * 128];
        int32_t tk[3 * 128], dr[3 * 128];
        int64_t sel[3 * 128], order[128];
        assert_true(m <= 128);
        for (int64_t i = 0; i < bs * m; i++) {
            sc[i] = alphabet[rng_below(&rng, 9)];
            tk[i] = (int32_t)i;
        }
        check_status(st_tree_organize(&shape, sc, tk, NULL, sel, dr, NULL), ST_OK, NULL);
        for (int64_t b = 0; b < bs; b++) {
            const float *row = sc + b * m;
            for (int64_t g = 0; g < m; g++) {
                int64_t j = g;
                for (; j > 0 && ref_before(row, g, order[j - 1]); j--)
                    order[j] = order[j - 1];
                order[j] = g;
            }
            /* keep the best n-1, ascending */
            for (int64_t a = 1; a < n - 1; a++)
                for (int64_t j = a; j > 0 && order[j - 1] > order[j]; j--) {
                    int64_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
            check_i64("organize", it, sel + b * (n - 1), order, n - 1);
            for (int64_t j = 0; j < n - 1; j++)
                assert_int_equal(dr[b * (n - 1) + j], b * m + order[j]);
        }
    }
}

/* ------------------------------------------------------------------ sizes and layouts */

static void test_mask_sizes(void **state) {
    (void)state;
    const int64_t nn[] = {0, 1, 8, 9, 16, 17, 32, 33, 64, 65};
    const size_t ww[] = {0, 1, 1, 2, 2, 4, 4, 8, 8, 0};
    for (int i = 0; i < 10; i++)
        assert_int_equal(st_tree_mask_word_bytes(nn[i]), ww[i]);
    size_t bytes;
    check_status(st_tree_mask_bytes(ST_MASK_FULL, 32, 64, 32 * 131072, &bytes), ST_OK, NULL);
    assert_true(bytes == (size_t)64 * 32 * 131072 + (size_t)32 * 64 * 64);
    check_status(st_tree_mask_bytes(ST_MASK_QLEN, 3, 10, 999, &bytes), ST_OK, NULL);
    assert_int_equal(bytes, 300);
    check_status(st_tree_mask_bytes(ST_MASK_BITS, 3, 10, 999, &bytes), ST_OK, NULL);
    assert_int_equal(bytes, 60);
    check_status(st_tree_mask_bytes(ST_MASK_BITS, 2, 64, 0, &bytes), ST_OK, NULL);
    assert_int_equal(bytes, 1024);
    check_status(st_tree_mask_bytes(ST_MASK_NONE, 3, 1000, 5, &bytes), ST_OK, NULL);
    assert_int_equal(bytes, 0);
    check_status(st_tree_mask_bytes(ST_MASK_BITS, 1, 65, 0, &bytes), ST_ERR_INVALID, "65");
    check_status(st_tree_mask_bytes(ST_MASK_QLEN, 1, 1025, 0, &bytes), ST_ERR_INVALID, "1025");
    check_status(st_tree_mask_bytes(ST_MASK_QLEN, 0, 8, 0, &bytes), ST_ERR_INVALID, "bs");
    check_status(st_tree_mask_bytes(ST_MASK_FULL, 1, 8, -1, &bytes), ST_ERR_INVALID, "negative");
    check_status(st_tree_mask_bytes(ST_MASK_FULL, 1, 1024, INT64_MAX / 2, &bytes), ST_ERR_RANGE,
                 "overflow");
    check_status(st_tree_mask_bytes((st_mask_layout)9, 1, 8, 0, &bytes), ST_ERR_INVALID, "layout");
    check_status(st_tree_mask_bytes(ST_MASK_QLEN, 1, 8, 0, NULL), ST_ERR_INVALID, NULL);
    assert_int_equal(st_tree_n_candidates(0, 3), -1);
    assert_int_equal(st_tree_n_candidates(2, 0), -1);
    assert_int_equal(st_tree_n_candidates(1, 1), 1);
    assert_int_equal(st_tree_parent_width(1, 3), 3);
    assert_int_equal(st_tree_level_parents_width(4, 1), 5);
}

/* A valid random batch built in QLEN and BITS: every bit equals its byte cell, bits above N are
 * zero, for N on both sides of each word width. */
static void test_bits_widths(void **state) {
    (void)state;
    const int64_t ns[] = {1, 2, 8, 9, 16, 17, 32, 33, 63, 64};
    uint64_t rng = 99;
    for (int ni = 0; ni < 10; ni++)
        for (int rep = 0; rep < 20; rep++) {
            const int64_t n = ns[ni], bs = 1 + rng_below(&rng, 4), k = 8, s = 3;
            const int64_t m = st_tree_n_candidates(k, s), lw = st_tree_level_parents_width(k, s);
            const st_tree_shape shape = {bs, k, s, n};
            float *sc = malloc((size_t)(bs * m) * sizeof *sc);
            int32_t *tk = malloc((size_t)(bs * m) * sizeof *tk), dr[4 * 64], roots[4] = {0};
            int64_t *lp = malloc((size_t)(bs * lw) * sizeof *lp), sel[4 * 64], pl[4 * 20];
            int64_t L[4] = {0, 1, 2, 3};
            simulate_draft(&rng, bs, k, s, 50, sc, tk, lp);
            check_status(st_tree_organize(&shape, sc, tk, lp, sel, dr, pl), ST_OK, NULL);
            const st_tree_input in = {roots, pl, sel, dr, L};
            uint8_t q[4 * 64 * 64], bitsm[4 * 64 * 8];
            bufs o = bufs_new(bs, n);
            st_tree_mask mq = {ST_MASK_QLEN, 0, q, sizeof q};
            st_tree_mask mb = {ST_MASK_BITS, 0, bitsm, sizeof bitsm};
            memset(bitsm, 0xFF, sizeof bitsm);
            check_status(st_tree_build(&shape, &in, &o.tree, &mq), ST_OK, NULL);
            check_status(st_tree_build(&shape, &in, &o.tree, &mb), ST_OK, NULL);
            const size_t w = st_tree_mask_word_bytes(n);
            for (int64_t r = 0; r < bs * n; r++)
                for (int64_t j = 0; j < (int64_t)w * 8; j++) {
                    int bit = (bitsm[(size_t)r * w + (size_t)j / 8] >> (j % 8)) & 1;
                    assert_int_equal(bit, j < n ? q[r * n + j] : 0);
                }
            bufs_free(&o);
            free(sc);
            free(tk);
            free(lp);
        }
}

/* N = 1024 (the largest tree): a chain K = 1, S = 1023 in FULL and QLEN; and N = 1. */
static void test_large_and_tiny(void **state) {
    (void)state;
    const int64_t n = 1024, s = 1023;
    const st_tree_shape shape = {1, 1, s, n};
    int64_t *sel = malloc((size_t)n * sizeof *sel), *pl = malloc((size_t)n * sizeof *pl);
    int32_t *dr = calloc((size_t)n, sizeof *dr), root = 7;
    for (int64_t i = 0; i < n - 1; i++)
        sel[i] = i;
    pl[0] = -1;
    for (int64_t i = 1; i < n; i++)
        pl[i] = i - 1;
    assert_int_equal(st_tree_parent_width(1, s), 1023);
    const int64_t L = 3;
    size_t fb;
    check_status(st_tree_mask_bytes(ST_MASK_FULL, 1, n, L, &fb), ST_OK, NULL);
    uint8_t *mask = malloc(fb);
    bufs o = bufs_new(1, n);
    const st_tree_input in = {&root, pl, sel, dr, &L};
    st_tree_mask mk = {ST_MASK_FULL, 1, mask, fb};
    check_status(st_tree_build(&shape, &in, &o.tree, &mk), ST_OK, NULL);
    for (int64_t t = 0; t < n; t++) {
        assert_int_equal(o.tree.positions[t], L + t);
        assert_int_equal(o.tree.next_token[t], t + 1 < n ? t + 1 : -1);
        const uint8_t *row = mask + (size_t)(t * (L + n));
        for (int64_t c = 0; c < L + n; c++)
            assert_int_equal(row[c], c < L || c - L <= t);
    }
    mk.layout = ST_MASK_QLEN;
    check_status(st_tree_build(&shape, &in, &o.tree, &mk), ST_OK, NULL);
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < n; j++)
            assert_int_equal(mask[t * n + j], j <= t);
    mk.layout = ST_MASK_BITS;
    check_status(st_tree_build(&shape, &in, &o.tree, &mk), ST_ERR_INVALID, "64");
    bufs_free(&o);

    /* N = 1: only the root */
    const st_tree_shape one = {2, 4, 2, 1};
    const int32_t roots[2] = {3, 4};
    const int64_t lens[2] = {0, 9};
    const st_tree_input in1 = {roots, NULL, NULL, NULL, lens};
    bufs o1 = bufs_new(2, 1);
    st_tree_mask mb = {ST_MASK_BITS, 0, mask, 2};
    check_status(st_tree_build(&one, &in1, &o1.tree, &mb), ST_OK, NULL);
    assert_int_equal(mask[0], 1);
    assert_int_equal(mask[1], 1);
    assert_int_equal(o1.tree.positions[1], 9);
    assert_int_equal(o1.tree.tokens[1], 4);
    int32_t target[2] = {5, 6}, pred[2];
    int64_t acc[6], num[2];
    check_status(st_verify_tree_greedy(2, 1, 2, &o1.tree, target, pred, acc, num), ST_OK, NULL);
    const int64_t want_acc[] = {0, -1, -1, 1, -1, -1}, want_pred[] = {5, 6}, zero[] = {0, 0};
    check_i64("accept_index", 0, acc, want_acc, 6);
    check_i32("predicts", 0, pred, want_pred, 2);
    check_i64("accept_token_num", 0, num, zero, 2);
    bufs_free(&o1);
    free(mask);
    free(sel);
    free(pl);
    free(dr);
}

/* ------------------------------------------------------------------- bad input */

static void test_build_rejects(void **state) {
    (void)state;
    const int64_t plist[] = {-1, 0, 1}, sel[] = {0, 1, 2}, L[] = {5};
    const int32_t roots[] = {1}, drafts[] = {2, 3, 4};
    const st_tree_input good = {roots, plist, sel, drafts, L};
    uint8_t mask[64];
    bufs o = bufs_new(1, 4);
    st_tree_shape shape = {1, 2, 2, 4};
    st_tree_mask mk = {ST_MASK_QLEN, 0, mask, sizeof mask};
    check_status(st_tree_build(&shape, &good, &o.tree, &mk), ST_OK, NULL);

    /* Every rejection leaves every output untouched. */
#define REJECT(call, status, needle)                                                               \
    do {                                                                                           \
        memset(mask, 0x5A, sizeof mask);                                                           \
        memset(o.tree.tokens, 0x5A, 4 * sizeof(int32_t));                                          \
        memset(o.tree.positions, 0x5A, 4 * sizeof(int32_t));                                       \
        memset(o.tree.retrieve_index, 0x5A, 4 * sizeof(int64_t));                                  \
        memset(o.tree.next_token, 0x5A, 4 * sizeof(int64_t));                                      \
        memset(o.tree.next_sibling, 0x5A, 4 * sizeof(int64_t));                                    \
        check_status(call, status, needle);                                                        \
        for (size_t i_ = 0; i_ < sizeof mask; i_++)                                                \
            assert_int_equal(mask[i_], 0x5A);                                                      \
        for (int i_ = 0; i_ < 4; i_++) {                                                           \
            assert_int_equal((uint32_t)o.tree.positions[i_], 0x5A5A5A5Au);                         \
            assert_int_equal((uint32_t)o.tree.tokens[i_], 0x5A5A5A5Au);                            \
            assert_true((uint64_t)o.tree.next_token[i_] == 0x5A5A5A5A5A5A5A5Aull);                 \
            assert_true((uint64_t)o.tree.next_sibling[i_] == 0x5A5A5A5A5A5A5A5Aull);               \
            assert_true((uint64_t)o.tree.retrieve_index[i_] == 0x5A5A5A5A5A5A5A5Aull);             \
        }                                                                                          \
    } while (0)

    REJECT(st_tree_build(NULL, &good, &o.tree, &mk), ST_ERR_INVALID, "shape");
    REJECT(st_tree_build(&shape, NULL, &o.tree, &mk), ST_ERR_INVALID, "NULL");
    REJECT(st_tree_build(&shape, &good, NULL, &mk), ST_ERR_INVALID, "NULL");
    REJECT(st_tree_build(&shape, &good, &o.tree, NULL), ST_ERR_INVALID, "NULL");
    const st_tree_shape bad_shapes[] = {{0, 2, 2, 4},    {1, 0, 2, 4},    {1, 1025, 2, 4},
                                        {1, 2, 0, 4},    {1, 2, 1025, 4}, {1, 2, 2, 0},
                                        {1, 2, 2, 1025}, {-3, 2, 2, 4}};
    const char *needles[] = {"bs", "topk", "topk", "depth", "depth", "n =", "n =", "bs"};
    for (int i = 0; i < 8; i++)
        REJECT(st_tree_build(&bad_shapes[i], &good, &o.tree, &mk), ST_ERR_INVALID, needles[i]);

    /* top_scores_index outside [0, M): M = 2 + 4 = 6 */
    const int64_t sel_big[] = {0, 1, 6}, sel_neg[] = {-1, 1, 2};
    st_tree_input bad = good;
    bad.top_scores_index = sel_big;
    REJECT(st_tree_build(&shape, &bad, &o.tree, &mk), ST_ERR_RANGE, "top_scores_index[0][2] = 6");
    bad.top_scores_index = sel_neg;
    REJECT(st_tree_build(&shape, &bad, &o.tree, &mk), ST_ERR_RANGE, "top_scores_index[0][0]");
    /* seq_lens out of range */
    const int64_t l_neg[] = {-1}, l_big[] = {INT32_MAX - 1};
    bad = good;
    bad.seq_lens = l_neg;
    REJECT(st_tree_build(&shape, &bad, &o.tree, &mk), ST_ERR_RANGE, "seq_lens[0]");
    bad.seq_lens = l_big;
    REJECT(st_tree_build(&shape, &bad, &o.tree, &mk), ST_ERR_RANGE, "int32");
    /* NULL inputs and outputs */
    const st_tree_input nulls[] = {{NULL, plist, sel, drafts, L},
                                   {roots, NULL, sel, drafts, L},
                                   {roots, plist, NULL, drafts, L},
                                   {roots, plist, sel, NULL, L},
                                   {roots, plist, sel, drafts, NULL}};
    for (int i = 0; i < 5; i++)
        REJECT(st_tree_build(&shape, &nulls[i], &o.tree, &mk), ST_ERR_INVALID, "NULL");
    st_tree no_pos = o.tree;
    no_pos.positions = NULL;
    REJECT(st_tree_build(&shape, &good, &no_pos, &mk), ST_ERR_INVALID, "NULL");
    /* mask problems */
    st_tree_mask small = {ST_MASK_QLEN, 0, mask, 15};
    REJECT(st_tree_build(&shape, &good, &o.tree, &small), ST_ERR_RANGE, "needs 16");
    st_tree_mask full_small = {ST_MASK_FULL, 1, mask, 4 * 9 - 1};
    REJECT(st_tree_build(&shape, &good, &o.tree, &full_small), ST_ERR_RANGE, "needs 36");
    st_tree_mask no_data = {ST_MASK_BITS, 0, NULL, 64};
    REJECT(st_tree_build(&shape, &good, &o.tree, &no_data), ST_ERR_INVALID, "NULL");
    st_tree_mask bad_layout = {(st_mask_layout)-2, 0, mask, 64};
    REJECT(st_tree_build(&shape, &good, &o.tree, &bad_layout), ST_ERR_INVALID, "layout");
    st_tree_mask none = {ST_MASK_NONE, 0, NULL, 0};
    check_status(st_tree_build(&shape, &good, &o.tree, &none), ST_OK, NULL);
    /* S = 1 needs no parent_list; garbage parent values never index anything */
    const st_tree_shape s1 = {1, 3, 1, 4};
    const st_tree_input in_s1 = {roots, NULL, sel, drafts, L};
    check_status(st_tree_build(&s1, &in_s1, &o.tree, &mk), ST_OK, NULL);
    const int64_t garbage[] = {INT64_MIN, INT64_MAX, -5};
    const st_tree_input in_g = {roots, garbage, (const int64_t[]){2, 3, 5}, drafts, L};
    check_status(st_tree_build(&shape, &in_g, &o.tree, &mk), ST_OK, NULL);
    bufs_free(&o);
#undef REJECT
}

static void test_verify_rejects(void **state) {
    (void)state;
    int32_t cand[4] = {0, 1, 2, 3}, target[4] = {1, 2, 3, 0}, pred[4];
    int64_t ri[4] = {0, 1, 2, 3}, nt[4] = {1, -1, -1, -1}, ns[4] = {-1, 2, 3, -1};
    int64_t acc[8], num[1];
    float probs[4 * 4] = {0}, coins[4] = {0.5f, 0.5f, 0.5f, 0.5f}, cf[1] = {0.5f};
    st_tree t = {cand, NULL, ri, nt, ns};
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_OK, NULL);
    check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, coins, cf, 1, 1, pred, acc, num),
                 ST_OK, NULL);
    check_status(st_verify_tree_greedy(0, 4, 3, &t, target, pred, acc, num), ST_ERR_INVALID, "bs");
    check_status(st_verify_tree_greedy(1, 0, 3, &t, target, pred, acc, num), ST_ERR_INVALID, "n =");
    check_status(st_verify_tree_greedy(1, 4, -1, &t, target, pred, acc, num), ST_ERR_INVALID,
                 "steps");
    check_status(st_verify_tree_greedy(1, 4, 3, NULL, target, pred, acc, num), ST_ERR_INVALID,
                 "NULL");
    check_status(st_verify_tree_greedy(1, 4, 3, &t, NULL, pred, acc, num), ST_ERR_INVALID, "NULL");
    nt[2] = 4;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_ERR_RANGE,
                 "next_token[0][2] = 4");
    nt[2] = -2;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_ERR_RANGE,
                 "next_token[0][2]");
    nt[2] = -1;
    ns[0] = 7;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_ERR_RANGE,
                 "next_sibling[0][0]");
    ns[0] = -1;
    ri[3] = 4;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_ERR_RANGE,
                 "retrieve_index[0][3]");
    ri[3] = 3;
    ns[3] = 1; /* siblings 1 -> 2 -> 3 -> 1: a cycle, found when no child matches */
    target[0] = 9;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_ERR_INVALID,
                 "cycle");
    check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, coins, cf, 1, 1, pred, acc, num),
                 ST_ERR_INVALID, "cycle");
    ns[3] = -1;
    nt[0] = 0; /* the root as its own child: a self loop in next_token is bounded by steps */
    ns[0] = 0;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_ERR_INVALID,
                 "cycle");
    ns[0] = -1;
    target[0] = 0;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_OK, NULL);
    assert_int_equal(num[0], 3);
    nt[0] = 1;
    cand[2] = 4; /* outside a vocabulary of 4 */
    check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, coins, cf, 1, 1, pred, acc, num),
                 ST_ERR_RANGE, "vocabulary");
    cand[2] = -1;
    check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, coins, cf, 1, 1, pred, acc, num),
                 ST_ERR_RANGE, "vocabulary");
    cand[2] = 2;
    const float bad_th[][2] = {{-0.1f, 1}, {1, 1.5f}, {NAN, 1}, {1, NAN}};
    for (int i = 0; i < 4; i++)
        check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, coins, cf, bad_th[i][0],
                                                bad_th[i][1], pred, acc, num),
                     ST_ERR_INVALID, "threshold");
    check_status(st_verify_tree_target_only(1, 4, 3, 0, &t, probs, coins, cf, 1, 1, pred, acc, num),
                 ST_ERR_INVALID, "n_vocab");
    check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, NULL, cf, 1, 1, pred, acc, num),
                 ST_ERR_INVALID, "coins");
    /* A distribution with no positive mass falls back to V-1; NaN counts as zero. */
    probs[0] = NAN;
    coins[0] = 2.0f; /* reject everything */
    check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, coins, cf, 1, 1, pred, acc, num),
                 ST_OK, NULL);
    assert_int_equal(num[0], 0);
    assert_int_equal(pred[0], 3);
}

/* ------------------------------------------------------------------------- commit */

static uint8_t kv_pattern(int64_t plane, int64_t row, size_t byte) {
    return (uint8_t)(plane * 131 + row * 17 + (int64_t)byte * 7 + 1);
}

static void test_commit(void **state) {
    (void)state;
    const int64_t planes = 3, n = 8, pos = 5;
    const size_t row = 12, stride = (size_t)(pos + n) * row + 7, kv_bytes = 2 * stride + 13 * row;
    uint8_t *kv = malloc(kv_bytes), *orig = malloc(kv_bytes);
    assert_true(kv_bytes == (size_t)(planes - 1) * stride + (size_t)(pos + n) * row);
    for (size_t i = 0; i < kv_bytes; i++) {
        size_t p = i / stride, r = (i % stride) / row;
        orig[i] = (i % stride) >= (size_t)(pos + n) * row
                      ? 0xEE
                      : kv_pattern((int64_t)p, (int64_t)r, (i % stride) % row);
    }
    uint64_t rng = 5;
    for (int it = 0; it < 500; it++) {
        /* a random strictly increasing accepted set starting at the root */
        int64_t acc[8] = {0}, na = 1;
        for (int64_t i = 1; i < n; i++)
            if (rng_below(&rng, 2))
                acc[na++] = i;
        memcpy(kv, orig, kv_bytes);
        check_status(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, n, acc, na), ST_OK,
                     NULL);
        for (size_t i = 0; i < kv_bytes; i++) {
            size_t p = i / stride, off = i % stride, r = off / row;
            uint8_t want = orig[i];
            if (off < (size_t)(pos + n) * row && (int64_t)r >= pos && (int64_t)r < pos + na)
                want = kv_pattern((int64_t)p, pos + acc[(int64_t)r - pos], off % row);
            if (kv[i] != want)
                fail_msg("iteration %d: byte %zu (plane %zu row %zu) = %d, want %d", it, i, p, r,
                         kv[i], want);
        }
    }
    /* rejections leave the cache untouched */
    const int64_t ok[] = {0, 2, 5};
    const int64_t not_root[] = {1, 2}, not_inc[] = {0, 3, 3}, too_big[] = {0, 8};
    memcpy(kv, orig, kv_bytes);
#define REJECT(call, status, needle)                                                               \
    do {                                                                                           \
        check_status(call, status, needle);                                                        \
        assert_memory_equal(kv, orig, kv_bytes);                                                   \
    } while (0)
    REJECT(st_tree_commit_rows(NULL, kv_bytes, row, planes, stride, pos, n, ok, 3), ST_ERR_INVALID,
           "NULL");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, n, NULL, 3), ST_ERR_INVALID,
           "NULL");
    REJECT(st_tree_commit_rows(kv, kv_bytes, 0, planes, stride, pos, n, ok, 3), ST_ERR_INVALID,
           "row_bytes");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, 0, stride, pos, n, ok, 3), ST_ERR_INVALID,
           "n_planes");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, 0, ok, 3), ST_ERR_INVALID,
           "n =");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, 1025, ok, 3), ST_ERR_INVALID,
           "n =");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, -1, n, ok, 3), ST_ERR_RANGE,
           "pos");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, n, ok, 0), ST_ERR_RANGE,
           "n_accept");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, 2, ok, 3), ST_ERR_RANGE,
           "n_accept");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, n, not_root, 2),
           ST_ERR_INVALID, "root");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, n, not_inc, 3),
           ST_ERR_INVALID, "increasing");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, n, too_big, 2), ST_ERR_RANGE,
           "accept_nodes[1] = 8");
    REJECT(st_tree_commit_rows(kv, kv_bytes - 1, row, planes, stride, pos, n, ok, 3), ST_ERR_RANGE,
           "bytes");
    REJECT(
        st_tree_commit_rows(kv, kv_bytes, row, planes, (size_t)(pos + n) * row - 1, pos, n, ok, 3),
        ST_ERR_RANGE, "plane_stride");
    REJECT(st_tree_commit_rows(kv, kv_bytes, SIZE_MAX / 2, planes, stride, pos, n, ok, 3),
           ST_ERR_RANGE, "overflow");
#undef REJECT
    /* one plane: the stride does not matter */
    check_status(st_tree_commit_rows(kv, (size_t)(pos + n) * row, row, 1, 0, pos, n, ok, 3), ST_OK,
                 NULL);
    free(kv);
    free(orig);
}

/* ---------------------------------------------------------------- no allocation */

static void test_no_allocation(void **state) {
    (void)state;
    uint64_t rng = 77;
    const int64_t bs = 4, k = 4, s = 5, n = 16, vocab = 64;
    const int64_t m = st_tree_n_candidates(k, s), lw = st_tree_level_parents_width(k, s);
    const int64_t pw = st_tree_parent_width(k, s);
    const st_tree_shape shape = {bs, k, s, n};
    float *sc = malloc((size_t)(bs * m) * sizeof *sc);
    int32_t *tk = malloc((size_t)(bs * m) * sizeof *tk), dr[4 * 16], roots[4] = {1, 2, 3, 4};
    int64_t *lp = malloc((size_t)(bs * lw) * sizeof *lp), sel[4 * 16];
    int64_t *pl = malloc((size_t)(bs * pw) * sizeof *pl), L[4] = {100, 0, 7, 3000};
    simulate_draft(&rng, bs, k, s, vocab, sc, tk, lp);
    size_t fb;
    check_status(st_tree_mask_bytes(ST_MASK_FULL, bs, n, 3107, &fb), ST_OK, NULL);
    uint8_t *mask = malloc(fb), *kv = malloc(2 * 64 * (size_t)(3000 + n));
    float *probs = malloc((size_t)(bs * n * vocab) * sizeof *probs), coins[64], cf[4];
    for (int64_t i = 0; i < bs * n * vocab; i++)
        probs[i] = (float)rng_below(&rng, 5) / 32.0f;
    for (int i = 0; i < 64; i++)
        coins[i] = (float)rng_below(&rng, 100) / 100.0f;
    for (int i = 0; i < 4; i++)
        cf[i] = 0.3f;
    int32_t target[64], pred[64];
    int64_t acc[4 * 6], num[4], nodes[6];
    bufs o = bufs_new(bs, n);
    const st_tree_input in = {roots, pl, sel, dr, L};
    const st_mask_layout layouts[] = {ST_MASK_FULL, ST_MASK_QLEN, ST_MASK_BITS, ST_MASK_NONE};
    const int64_t before = st_alloc_count();
    for (int it = 0; it < 200; it++) {
        assert_int_equal(st_tree_organize(&shape, sc, tk, lp, sel, dr, pl), ST_OK);
        st_tree_mask mk = {layouts[it % 4], it % 8 < 4, mask, fb};
        assert_int_equal(st_tree_build(&shape, &in, &o.tree, &mk), ST_OK);
        for (int64_t x = 0; x < bs * n; x++) /* agree with the first child when there is one */
            target[x] = o.tree.next_token[x] >= 0
                            ? o.tree.tokens[(x / n) * n + o.tree.next_token[x]]
                            : (int32_t)rng_below(&rng, vocab);
        assert_int_equal(st_verify_tree_greedy(bs, n, s, &o.tree, target, pred, acc, num), ST_OK);
        for (int64_t b = 0; b < bs; b++) {
            for (int64_t i = 0; i <= num[b]; i++)
                nodes[i] = acc[b * (s + 1) + i] - b * n;
            assert_int_equal(st_tree_commit_rows(kv, 2 * 64 * (size_t)(3000 + n), 64, 2,
                                                 64 * (size_t)(3000 + n), L[b], n, nodes,
                                                 num[b] + 1),
                             ST_OK);
        }
        assert_int_equal(st_verify_tree_target_only(bs, n, s, vocab, &o.tree, probs, coins, cf, 1,
                                                    1, pred, acc, num),
                         ST_OK);
    }
    assert_int_equal(st_alloc_count(), before);
    bufs_free(&o);
    free(sc);
    free(tk);
    free(lp);
    free(pl);
    free(mask);
    free(kv);
    free(probs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_build),
        cmocka_unit_test(test_golden_small),
        cmocka_unit_test(test_golden_malformed),
        cmocka_unit_test(test_golden_verify_greedy),
        cmocka_unit_test(test_golden_target_only),
        cmocka_unit_test(test_random_invariants),
        cmocka_unit_test(test_oracle_fixtures),
        cmocka_unit_test(test_target_only_equals_literal),
        cmocka_unit_test(test_organize_order),
        cmocka_unit_test(test_mask_sizes),
        cmocka_unit_test(test_bits_widths),
        cmocka_unit_test(test_large_and_tiny),
        cmocka_unit_test(test_build_rejects),
        cmocka_unit_test(test_verify_rejects),
        cmocka_unit_test(test_commit),
        cmocka_unit_test(test_no_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
