/*
 * test_ctl.c: the `auto` controller (src/engine/ctl.c). Its ranking selects exactly the nodes
 * st_tree_organize selects; its acceptance calibration learns from shadow proposals scored
 * against the emitted history; and its choice follows the expected speed-up: plain decoding
 * when drafts are wrong or verification is as dear as decoding token by token, large trees
 * when drafts are right and verification is cheap.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/ctl.h"
#include "spectree.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* Random EAGLE-2 style draft results for (K, S): scores that decrease along paths, some
 * candidates missing (-inf), ties. */
static void random_draft(int64_t K, int64_t S, float *scores, int32_t *tokens,
                         int64_t *level_parents) {
    const int64_t M = st_tree_n_candidates(K, S);
    for (int64_t c = 0; c < K; c++) {
        scores[c] = (rnd() % 4 == 0) ? -INFINITY : (float)(rnd() % 8 + 1) / 8.0f;
        tokens[c] = (int32_t)(rnd() % 50);
    }
    level_parents[0] = -1;
    for (int64_t c = 0; c < K; c++)
        level_parents[1 + c] = c;
    for (int64_t i = 1; i < S; i++) {
        const int64_t base = K + (i - 1) * K * K;
        for (int64_t q = 0; q < K * K; q++) {
            const int64_t parent = level_parents[1 + (i - 1) * K + q / K];
            const float ps = scores[parent];
            scores[base + q] =
                (isfinite(ps) && rnd() % 3) ? ps * (float)(rnd() % 4 + 1) / 4.0f : -INFINITY;
            tokens[base + q] = (int32_t)(rnd() % 50);
        }
        if (i + 1 < S) /* expand K of this level's candidates (any, possibly missing ones) */
            for (int64_t k = 0; k < K; k++)
                level_parents[1 + i * K + k] = base + (int64_t)(rnd() % (uint32_t)(K * K));
    }
    (void)M;
}

/* The controller ranks the same node set st_tree_organize selects. */
static void test_rank_matches_organize(void **state) {
    (void)state;
    for (int iter = 0; iter < 400; iter++) {
        const int64_t K = 1 + rnd() % 4, S = 1 + rnd() % 5;
        const int64_t M = st_tree_n_candidates(K, S);
        const int32_t N = (int32_t)(2 + rnd() % (uint32_t)(M < 30 ? M : 30));
        float *scores = malloc((size_t)M * sizeof *scores);
        int32_t *tokens = malloc((size_t)M * sizeof *tokens);
        int64_t *lp = calloc((size_t)st_tree_level_parents_width(K, S) + 1, sizeof *lp);
        random_draft(K, S, scores, tokens, lp);
        int64_t nf = 0;
        for (int64_t i = 0; i < M; i++)
            nf += isfinite(scores[i]);
        st_ctl *c;
        assert_int_equal(st_ctl_create(1, K, S, N, 1, 0.0, &c), ST_OK);
        st_ctl_rank(c, 0, 0, K, S, scores, tokens, lp, 10, 0);
        /* for every tree size n, organize selects n-1 candidates (by score, ties by lower
         * index): the finite ones first, and the deepest of them is as deep as the deepest of
         * the controller's first n-1 */
        int64_t *sel = malloc((size_t)N * sizeof *sel);
        int32_t *dt = malloc((size_t)N * sizeof *dt);
        int64_t *pl = malloc((size_t)(st_tree_parent_width(K, S) + 1) * sizeof *pl);
        for (int32_t n = 2; n <= N; n++) {
            st_tree_shape shape = {1, K, S, n};
            assert_int_equal(st_tree_organize(&shape, scores, tokens, lp, sel, dt, pl), ST_OK);
            const int64_t want = nf < n - 1 ? nf : n - 1;
            int32_t dmax = 0, nfin = 0;
            for (int64_t j = 0; j < n - 1; j++) {
                const int64_t cnd = sel[j];
                if (!isfinite(scores[cnd]))
                    continue;
                nfin++;
                int found = 0; /* organize's node is among the controller's first n-1 */
                for (int32_t r = 0; r < n - 1; r++)
                    found |= st_ctl_ranked(c, 0, r) == cnd;
                assert_true(found);
                const int32_t d = cnd < K ? 1 : (int32_t)(2 + (cnd - K) / (K * K));
                dmax = d > dmax ? d : dmax;
            }
            assert_int_equal(nfin, want);
            assert_int_equal(st_ctl_depth(c, 0, n), dmax);
        }
        st_ctl_free(c);
        free(scores), free(tokens), free(lp), free(sel), free(dt), free(pl);
    }
}

/* One chain of S drafted tokens per step, correct or not, scored against a history. */
static void feed_chain(st_ctl *c, int64_t S, int32_t *hist, int64_t *n_hist, int correct) {
    float scores[16];
    int32_t tokens[16];
    int64_t lp[32];
    lp[0] = -1;
    lp[1] = 0;
    for (int64_t i = 0; i < S; i++) {
        scores[i] = 1.0f; /* a confident drafter: every node scores 1 */
        tokens[i] = (int32_t)(100 + (*n_hist + i) % 7);
        if (i + 1 < S)
            lp[2 + i] = i + 1; /* level i+2's parent: the node of level i+1 (candidate i+1) */
    }
    st_ctl_rank(c, 0, 0, 1, S, scores, tokens, lp, *n_hist, 1);
    /* the sequence then emits S tokens: the drafted ones, or others */
    for (int64_t i = 0; i < S; i++) {
        hist[*n_hist] = correct ? tokens[i] : 7;
        ++*n_hist;
        st_ctl_observe(c, 0, hist, *n_hist, 0);
    }
}

static void test_choice(void **state) {
    (void)state;
    const int64_t S = 6;
    const int32_t N = 7;
    int32_t *hist = calloc(4096, sizeof *hist);
    double g;
    for (int correct = 0; correct < 2; correct++)
        for (int cheap = 0; cheap < 2; cheap++) {
            st_ctl *c;
            assert_int_equal(st_ctl_create(1, 1, S, N, 1, 0.0, &c), ST_OK);
            int64_t n_hist = 1;
            /* no plain timing yet: always plain first */
            feed_chain(c, S, hist, &n_hist, correct);
            assert_int_equal(st_ctl_choose(c, 1, 0, &g), 1);
            st_ctl_time_plain(c, 1e-3);
            for (int32_t T = 2; T <= N; T++) /* verify cost: 0.2 or 1.0 plain tokens per token */
                for (int r = 0; r < 30; r++) /* (the prior's weight fades with measurements) */
                    st_ctl_time_verify(c, T, 1e-3 * (1.0 + (cheap ? 0.2 : 1.0) * (T - 1)));
            for (int step = 0; step < 60; step++)
                feed_chain(c, S, hist, &n_hist, correct);
            feed_chain(c, S, hist, &n_hist, correct); /* ranks a fresh proposal */
            const int32_t n = st_ctl_choose(c, 1, 0, &g);
            if (correct && cheap) {
                assert_int_equal(n, N); /* every node pays */
                assert_true(g > 2.5);
            } else {
                /* wrong drafts never pay; right ones do not when a verified token costs as
                 * much as a decoded one (expected gain <= 1) */
                assert_int_equal(n, 1);
                assert_true(g == 1.0);
            }
            st_ctl_free(c);
        }
    free(hist);
}

/* Calibration is per confidence class: a class whose drafts fail is not verified, while
 * another class's drafts still are. */
static void test_classes(void **state) {
    (void)state;
    st_ctl *c;
    const int64_t S = 2;
    assert_int_equal(st_ctl_create(1, 1, S, 3, 1, 0.0, &c), ST_OK);
    st_ctl_time_plain(c, 1e-3);
    for (int32_t T = 2; T <= 3; T++)
        for (int r = 0; r < 4; r++)
            st_ctl_time_verify(c, T, 1e-3 * (1.0 + 0.3 * (T - 1)));
    int32_t hist[1024];
    int64_t n_hist = 1;
    float scores[2] = {1.0f, 1.0f};
    int32_t tokens[2] = {5, 6};
    int64_t lp[3] = {-1, 0, 0};
    for (int step = 0; step < 100; step++) {
        const int cls = step % 2; /* class 0 drafts right, class 1 wrong */
        st_ctl_rank(c, 0, 0, 1, S, scores, tokens, lp, n_hist, cls);
        hist[n_hist++] = cls ? 9 : 5;
        st_ctl_observe(c, 0, hist, n_hist, 0);
        hist[n_hist++] = cls ? 9 : 6;
        st_ctl_observe(c, 0, hist, n_hist, 0);
    }
    double g;
    st_ctl_rank(c, 0, 0, 1, S, scores, tokens, lp, n_hist, 0);
    assert_int_equal(st_ctl_choose(c, 1, 0, &g), 3);
    st_ctl_rank(c, 0, 0, 1, S, scores, tokens, lp, n_hist, 1);
    assert_int_equal(st_ctl_choose(c, 1, 0, &g), 1);
    st_ctl_observe(c, 0, hist, n_hist, 1); /* a finished sequence drops its shadows */
    st_ctl_free(c);
}

/* The choice weighs a tree against plain decoding at the batch's own size: on a machine where a
 * forward pass costs the same up to 4 tokens and grows linearly beyond (compute-bound), right
 * drafts pay for one sequence, but for four the plain step's tokens are already 4x cheaper and
 * the trees would cost more than they return: plain. */
static void test_batch_backoff(void **state) {
    (void)state;
    st_ctl *c;
    const int64_t S = 2;
    assert_int_equal(st_ctl_create(4, 1, S, 3, 1, 0.0, &c), ST_OK);
    st_ctl_time_plain_batch(c, 1, 1e-3);
    st_ctl_time_plain_batch(c, 4, 1e-3);
    for (int32_t T = 2; T <= 12; T++)
        for (int r = 0; r < 30; r++)
            st_ctl_time_verify(c, T, 1e-3 * (T > 4 ? T / 4.0 : 1.0));
    int32_t hist[1024];
    int64_t n_hist = 1;
    float scores[2] = {1.0f, 1.0f};
    int32_t tokens[2] = {5, 6};
    int64_t lp[3] = {-1, 0, 0};
    for (int step = 0; step < 100; step++) { /* the drafts are right */
        st_ctl_rank(c, 0, 0, 1, S, scores, tokens, lp, n_hist, 0);
        hist[n_hist++] = 5;
        st_ctl_observe(c, 0, hist, n_hist, 0);
        hist[n_hist++] = 6;
        st_ctl_observe(c, 0, hist, n_hist, 0);
    }
    double g;
    st_ctl_rank(c, 0, 0, 1, S, scores, tokens, lp, n_hist, 0);
    assert_int_equal(st_ctl_choose(c, 1, 0, &g), 3);
    assert_true(g > 2.0);
    for (int32_t a = 0; a < 4; a++)
        st_ctl_rank(c, a, a, 1, S, scores, tokens, lp, n_hist, 0);
    assert_int_equal(st_ctl_choose(c, 4, 0, &g), 1);
    /* the same curve without a plain measurement at 4 (and only the prior's acceptance): the
     * batch is priced at t1 and the trees look worth it, as the controller judged before it
     * measured per batch size */
    st_ctl *c2;
    assert_int_equal(st_ctl_create(4, 1, S, 3, 1, 0.0, &c2), ST_OK);
    st_ctl_time_plain_batch(c2, 1, 1e-3);
    st_ctl_time_plain(c2, 0.25e-3);
    for (int32_t T = 2; T <= 12; T++)
        for (int r = 0; r < 30; r++)
            st_ctl_time_verify(c2, T, 1e-3 * (T > 4 ? T / 4.0 : 1.0));
    for (int32_t a = 0; a < 4; a++)
        st_ctl_rank(c2, a, a, 1, S, scores, tokens, lp, n_hist, 0);
    assert_true(st_ctl_choose(c2, 4, 0, &g) > 1);
    st_ctl_free(c2);
    st_ctl_free(c);
}

/* Proposals that keep ending in plain steps are sampled: when proposing costs 20% of a step,
 * one step in 10 drafts at that batch size (about 2% of the time), every step at another batch
 * size, and every step again once a tree is chosen; when proposing costs nothing next to the
 * forward, every step drafts. */
static void test_proposal_sampling(void **state) {
    (void)state;
    for (int cheap = 0; cheap < 2; cheap++) {
        st_ctl *c;
        assert_int_equal(st_ctl_create(4, 2, 3, 6, 1, 0.0, &c), ST_OK);
        const double t_fwd = cheap ? 1.0 : 0.8;
        int drafted = 0;
        for (int s = 0; s < 200; s++) {
            const int d = st_ctl_want_draft(c, 4);
            drafted += d;
            st_ctl_step_end(c, d, 1, 4, 4, 1.0, d ? t_fwd : 1.0, 0.0);
        }
        if (cheap) {
            assert_int_equal(drafted, 200);
        } else {
            assert_true(drafted >= 20 && drafted <= 24);
            assert_true(st_ctl_want_draft(c, 3)); /* another batch size: not judged yet */
            while (!st_ctl_want_draft(c, 4))
                st_ctl_step_end(c, 0, 1, 4, 4, 1.0, 1.0, 0.0);
            st_ctl_step_end(c, 1, 3, 4, 8, 1.0, 0.8, 0.0); /* a tree was chosen */
            assert_true(st_ctl_want_draft(c, 4));
        }
        st_ctl_free(c);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_matches_organize),
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_batch_backoff),
        cmocka_unit_test(test_proposal_sampling),
        cmocka_unit_test(test_classes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
