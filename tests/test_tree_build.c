/*
 * test_tree_build.c: building the draft tree (src/tree/tree.c) against the golden vectors of
 * docs/TREE_SPEC.md §6.1-6.2 (SGLang's own test data) and random trees' invariants; the
 * organize order; mask sizes and layouts; malformed and rejected input leaving outputs untouched.
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
#include "tree_util.h"

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_build),     cmocka_unit_test(test_golden_small),
        cmocka_unit_test(test_golden_malformed), cmocka_unit_test(test_random_invariants),
        cmocka_unit_test(test_organize_order),   cmocka_unit_test(test_mask_sizes),
        cmocka_unit_test(test_bits_widths),      cmocka_unit_test(test_large_and_tiny),
        cmocka_unit_test(test_build_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
