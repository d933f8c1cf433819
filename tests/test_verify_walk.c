/*
 * test_verify_walk.c: the engine's one walk over a verified tree (st_verify_tree_walk, target
 * tokens computed on demand) against SGLang's verify_tree_greedy (st_verify_tree_greedy, every
 * node's target token given up front), on random trees built by st_tree_organize and
 * st_tree_build: the same accepted path, bonus token and predicts, and the walk asks for the
 * target's token of the nodes on that path only, each once, in path order.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "spectree.h"

static uint64_t rng = 12345;
static uint32_t rnd(void) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng >> 33);
}

enum { MAX_BS = 4, MAX_K = 4, MAX_S = 5, MAX_N = 24, MAX_M = 4 + 4 * 4 * 4, V = 6 };

/* A target whose token after node x is tp[x]; it logs the nodes asked for. */
typedef struct oracle {
    const int32_t *tp;
    int64_t asked[MAX_BS * MAX_N];
    int n_asked;
    int fail_at; /* return an error on this call (-1: never) */
} oracle;

static st_status oracle_target(void *user, int64_t x, int32_t *token) {
    oracle *o = user;
    if (o->n_asked == o->fail_at)
        return ST_ERR_RANGE;
    o->asked[o->n_asked++] = x;
    *token = o->tp[x];
    return ST_OK;
}

static void test_walk_equals_greedy(void **state) {
    (void)state;
    int checked_paths = 0, deep = 0;
    for (int trial = 0; trial < 3000; trial++) {
        const int64_t bs = 1 + rnd() % MAX_BS, K = 1 + rnd() % MAX_K, S = 1 + rnd() % MAX_S;
        const int64_t M = st_tree_n_candidates(K, S), LPW = st_tree_level_parents_width(K, S),
                      PW = st_tree_parent_width(K, S);
        int64_t n = 2 + rnd() % (M < MAX_N - 1 ? M : MAX_N - 1);
        if (n > M + 1)
            n = M + 1;
        float scores[MAX_BS * MAX_M];
        int32_t tokens[MAX_BS * MAX_M], roots[MAX_BS], drafts[MAX_BS * MAX_N];
        int64_t level_parents[MAX_BS * (MAX_K + 1 + MAX_S * MAX_K)], sel[MAX_BS * MAX_N];
        int64_t parent_list[MAX_BS * (MAX_S * MAX_K + 1) + 1], seq_lens[MAX_BS];
        for (int64_t b = 0; b < bs; b++) {
            /* tokens from a small alphabet, so that siblings repeat tokens and paths match */
            for (int64_t g = 0; g < M; g++) {
                scores[b * M + g] = (float)(rnd() % 1000) / 1000.0f;
                tokens[b * M + g] = (int32_t)(rnd() % V);
            }
            int64_t *lp = level_parents + b * LPW;
            lp[0] = -1;
            for (int64_t c = 0; c < K; c++)
                lp[1 + c] = c;
            for (int64_t i = 1; i < S; i++) /* K distinct expanded candidates of level i */
                for (int64_t k = 0; k < K; k++)
                    lp[1 + K + (i - 1) * K + k] = st_tree_level_base(K, i) + k * K + rnd() % K;
            roots[b] = (int32_t)(rnd() % V);
            seq_lens[b] = rnd() % 100;
        }
        const st_tree_shape shape = {bs, K, S, n};
        assert_int_equal(
            st_tree_organize(&shape, scores, tokens, level_parents, sel, drafts, parent_list),
            ST_OK);
        int32_t tt[MAX_BS * MAX_N], pos[MAX_BS * MAX_N], tp[MAX_BS * MAX_N];
        int64_t ri[MAX_BS * MAX_N], nt[MAX_BS * MAX_N], ns[MAX_BS * MAX_N];
        const st_tree_input in = {roots, PW ? parent_list : NULL, sel, drafts, seq_lens};
        const st_tree tree = {tt, pos, ri, nt, ns};
        const st_tree_mask mask = {.layout = ST_MASK_NONE};
        assert_int_equal(st_tree_build(&shape, &in, &tree, &mask), ST_OK);
        for (int64_t x = 0; x < bs * n; x++)
            tp[x] = (int32_t)(rnd() % V);
        int32_t pg[MAX_BS * MAX_N], pw[MAX_BS * MAX_N];
        int64_t ag[MAX_BS * (MAX_S + 1)], aw[MAX_BS * (MAX_S + 1)], kg[MAX_BS], kw[MAX_BS];
        assert_int_equal(st_verify_tree_greedy(bs, n, S, &tree, tp, pg, ag, kg), ST_OK);
        oracle o = {.tp = tp, .fail_at = -1};
        assert_int_equal(st_verify_tree_walk(bs, n, S, &tree, oracle_target, &o, pw, aw, kw),
                         ST_OK);
        assert_memory_equal(kg, kw, (size_t)bs * sizeof kg[0]);
        assert_memory_equal(ag, aw, (size_t)(bs * (S + 1)) * sizeof ag[0]);
        assert_memory_equal(pg, pw, (size_t)(bs * n) * sizeof pg[0]);
        /* the nodes asked for: exactly each request's accepted path, in order */
        int q = 0;
        for (int64_t b = 0; b < bs; b++) {
            for (int64_t i = 0; i <= kg[b]; i++)
                assert_int_equal(o.asked[q++], ag[b * (S + 1) + i]);
            checked_paths++;
            deep += kg[b] >= 2;
        }
        assert_int_equal(q, o.n_asked);
        /* an error from the target is returned as is */
        if (o.n_asked > 1) {
            oracle f = {.tp = tp, .fail_at = (int)(rnd() % (uint32_t)o.n_asked)};
            assert_int_equal(st_verify_tree_walk(bs, n, S, &tree, oracle_target, &f, pw, aw, kw),
                             ST_ERR_RANGE);
        }
    }
    /* the random trees did exercise long accepted paths */
    assert_true(checked_paths > 3000);
    assert_true(deep > 100);
}

static void test_walk_bad_args(void **state) {
    (void)state;
    int32_t tt[2] = {1, 2}, pos[2] = {0, 1}, p[2];
    int64_t ri[2] = {0, 1}, nt[2] = {1, -1}, ns[2] = {-1, -1}, acc[2], k;
    const st_tree tree = {tt, pos, ri, nt, ns};
    oracle o = {.tp = tt, .fail_at = -1};
    assert_int_equal(st_verify_tree_walk(1, 2, 1, &tree, NULL, &o, p, acc, &k), ST_ERR_INVALID);
    assert_int_equal(st_verify_tree_walk(0, 2, 1, &tree, oracle_target, &o, p, acc, &k),
                     ST_ERR_INVALID);
    ri[1] = 7;
    assert_int_equal(st_verify_tree_walk(1, 2, 1, &tree, oracle_target, &o, p, acc, &k),
                     ST_ERR_RANGE);
    assert_int_equal(o.n_asked, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_walk_equals_greedy),
        cmocka_unit_test(test_walk_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
