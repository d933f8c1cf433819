/*
 * test_sampling.c: the sampler and the tree samplers' distributions.
 * - st_sample: greedy ties, top-k = 1 is greedy, a pure function of (logits, params, pos),
 *   filters, bad parameters, and its empirical distribution (chi-square).
 * - SGLang's target-only tree sampler (TREE_SPEC §3.2, thresholds 1) draws from the target
 *   distribution: over many seeds, the first emitted token's frequencies pass a chi-square test
 *   against q, whatever the drafted children; so does the position-coupled sampler.
 * - st_sample_penalize: a hand-computed example of every penalty and bias together, in their
 *   order; logit_bias -100 bans a token (greedy and sampled); ignore_eos and min_tokens ban the
 *   end-of-generation ids; the counting scratch is left zero; bad values name their field.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "spectree.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Chi-square statistic of counts against probabilities p over n categories. */
static double chi2(const int64_t *counts, const double *p, int n, int64_t total) {
    double x = 0;
    for (int i = 0; i < n; i++) {
        double e = p[i] * (double)total;
        if (e > 0)
            x += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
    }
    return x;
}

/* Upper 0.1% quantile of chi-square with df degrees of freedom (Wilson-Hilferty). */
static double chi2_crit(int df) {
    double z = 3.09; /* 99.9% one-sided */
    double a = 2.0 / (9.0 * df);
    double t = 1.0 - a + z * sqrt(a);
    return df * t * t * t;
}

/* Greedy in the engine is st_sample at temp 0, which is st_argmax: one rule (higher first, ties
 * by lower index, NaN never wins unless all are NaN). Checked against a scalar oracle of that
 * rule on vectors with NaN at index 0 (where the engine's old pick and st_sample disagreed),
 * NaN elsewhere, infinities, ties, and lengths around the 8-lane loop. */
static int32_t oracle_argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++) {
        const int bn = isnan(x[b]), in = isnan(x[i]);
        if ((bn && !in) || (!bn && !in && x[i] > x[b]))
            b = i;
    }
    return b;
}

static void test_greedy_nan(void **state) {
    (void)state;
    st_sampler_params greedy = st_sampler_default_params();
    greedy.temp = 0.0f;
    void *scratch = malloc(st_sample_scratch_size(4099));
    float x[4099];
    uint32_t r = 99;
    for (int trial = 0; trial < 4000; trial++) {
        const int32_t lens[] = {1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 4099};
        const int32_t n = lens[trial % 12];
        for (int32_t i = 0; i < n; i++) {
            r = r * 1103515245u + 12345u;
            const uint32_t kind = (r >> 8) % 16;
            x[i] = kind == 0   ? NAN
                   : kind == 1 ? -INFINITY
                   : kind == 2 ? INFINITY * (trial % 7 == 0)
                               : (float)((r >> 16) % 9) - 4.0f; /* many ties */
        }
        if (trial % 3 == 0)
            x[0] = NAN;
        if (trial % 50 == 0)
            for (int32_t i = 0; i < n; i++)
                x[i] = NAN;
        const int32_t want = oracle_argmax(x, n);
        int32_t got = -1;
        assert_int_equal(st_argmax(x, n), want);
        assert_int_equal(st_sample(x, n, &greedy, trial, scratch, &got), ST_OK);
        assert_int_equal(got, want);
    }
    /* NaN at index 0 and a real maximum later: the maximum wins, in both */
    float y[20];
    for (int i = 0; i < 20; i++)
        y[i] = (float)i * 0.1f;
    y[0] = NAN;
    int32_t got = -1;
    assert_int_equal(st_argmax(y, 20), 19);
    assert_int_equal(st_sample(y, 20, &greedy, 0, scratch, &got), ST_OK);
    assert_int_equal(got, 19);
    free(scratch);
}

static void test_sample_basics(void **state) {
    (void)state;
    float lg[6] = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f, 2.9f};
    char scratch[4096];
    assert_true(st_sample_scratch_size(6) <= sizeof scratch);
    st_sampler_params g = {.temp = 0.0f};
    int32_t t;
    assert_int_equal(st_sample(lg, 6, &g, 0, scratch, &t), ST_OK);
    assert_int_equal(t, 1); /* tie: lower id */
    st_sampler_params k1 = {.temp = 1.0f, .top_k = 1, .top_p = 1.0f, .seed = 5};
    for (int pos = 0; pos < 50; pos++) {
        assert_int_equal(st_sample(lg, 6, &k1, pos, scratch, &t), ST_OK);
        assert_int_equal(t, 1);
    }
    /* pure function of (seed, pos) */
    st_sampler_params sp = {.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 99};
    for (int pos = 0; pos < 100; pos++) {
        int32_t a, b;
        assert_int_equal(st_sample(lg, 6, &sp, pos, scratch, &a), ST_OK);
        assert_int_equal(st_sample(lg, 6, &sp, pos, scratch, &b), ST_OK);
        assert_int_equal(a, b);
    }
    /* min-p keeps only tokens within a factor of the best */
    st_sampler_params mp = {.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.5f, .seed = 1};
    for (int pos = 0; pos < 200; pos++) {
        assert_int_equal(st_sample(lg, 6, &mp, pos, scratch, &t), ST_OK);
        assert_true(t == 1 || t == 2 || t == 5);
    }
    st_sampler_params bad = {.temp = -1.0f, .top_p = 1.0f};
    assert_int_equal(st_sample(lg, 6, &bad, 0, scratch, &t), ST_ERR_INVALID);
    bad = (st_sampler_params){.temp = 1.0f, .top_p = 0.0f};
    assert_int_equal(st_sample(lg, 6, &bad, 0, scratch, &t), ST_ERR_INVALID);
    assert_int_equal(st_sample(lg, 0, &sp, 0, scratch, &t), ST_ERR_INVALID);
}

static void test_sample_distribution(void **state) {
    (void)state;
    enum { V = 8, DRAWS = 40000 };
    float lg[V];
    double p[V], z = 0;
    for (int i = 0; i < V; i++) {
        lg[i] = 0.3f * (float)i - 0.05f * (float)(i * i);
        p[i] = exp((double)lg[i] / 0.7);
        z += p[i];
    }
    for (int i = 0; i < V; i++)
        p[i] /= z;
    char scratch[4096];
    st_sampler_params sp = {.temp = 0.7f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 7};
    int64_t counts[V] = {0};
    for (int64_t pos = 0; pos < DRAWS; pos++) {
        int32_t t;
        assert_int_equal(st_sample(lg, V, &sp, pos, scratch, &t), ST_OK);
        counts[t]++;
    }
    double x = chi2(counts, p, V, DRAWS);
    print_message("st_sample chi2 = %.2f (df %d, critical %.2f)\n", x, V - 1, chi2_crit(V - 1));
    assert_true(x < chi2_crit(V - 1));
}

/* One tree: root with K children (tokens `kids`), each child with one child; target
 * distribution q at every node. Returns the first emitted token of target-only sampling. */
static int32_t tree_first_token(int K, const int32_t *kids, const float *q, int V, float coin,
                                float coin_next, float coin_final) {
    enum { NMAX = 16 };
    int64_t n = 1 + 2 * K;
    int32_t tokens[NMAX], positions[NMAX];
    int64_t ri[NMAX], nt[NMAX], ns[NMAX];
    /* node 1..K: root children; node K+i: child of node i */
    tokens[0] = 0;
    for (int i = 0; i < K; i++) {
        tokens[1 + i] = kids[i];
        tokens[1 + K + i] = kids[(i + 1) % K];
    }
    for (int64_t i = 0; i < n; i++) {
        ri[i] = i;
        nt[i] = -1;
        ns[i] = -1;
        positions[i] = i == 0 ? 0 : (i <= K ? 1 : 2);
    }
    nt[0] = 1;
    for (int i = 1; i <= K; i++) {
        ns[i] = i < K ? i + 1 : -1;
        nt[i] = K + i;
    }
    st_tree tree = {tokens, positions, ri, nt, ns};
    float probs[NMAX * 8], coins[NMAX];
    for (int64_t i = 0; i < n; i++) {
        memcpy(probs + i * V, q, (size_t)V * sizeof(float));
        coins[i] = coin_next;
    }
    coins[0] = coin;
    int32_t pred[NMAX];
    int64_t acc[3], k;
    assert_int_equal(st_verify_tree_target_only(1, n, 2, V, &tree, probs, coins, &coin_final, 1.0f,
                                                1.0f, pred, acc, &k),
                     ST_OK);
    return k >= 1 ? tokens[acc[1]] : pred[acc[0]];
}

static void test_target_only_distribution(void **state) {
    (void)state;
    enum { V = 6, DRAWS = 60000 };
    const float q[V] = {0.05f, 0.3f, 0.1f, 0.25f, 0.2f, 0.1f};
    double p[V];
    for (int i = 0; i < V; i++)
        p[i] = q[i];
    const int32_t kid_sets[3][3] = {{1, 3, 4}, {0, 5, 2}, {3, 1, 0}};
    const int Ks[3] = {3, 2, 3};
    for (int set = 0; set < 3; set++) {
        int64_t counts[V] = {0};
        for (int64_t d = 0; d < DRAWS; d++) {
            float c0 = st_sample_uniform(1000 + (uint64_t)set, 3 * d);
            float c1 = st_sample_uniform(1000 + (uint64_t)set, 3 * d + 1);
            float cf = st_sample_uniform(1000 + (uint64_t)set, 3 * d + 2);
            counts[tree_first_token(Ks[set], kid_sets[set], q, V, c0, c1, cf)]++;
        }
        double x = chi2(counts, p, V, DRAWS);
        print_message("target-only tree sampler, children set %d: chi2 = %.2f (critical %.2f)\n",
                      set, x, chi2_crit(V - 1));
        assert_true(x < chi2_crit(V - 1));
    }
}

/* The position-coupled sampler: greedy verify against the target's own samples emits exactly
 * the sample at every position, so its distribution is the sampler's. */
static void test_coupled_equals_plain(void **state) {
    (void)state;
    enum { V = 6 };
    const float lg[V] = {0.1f, 1.2f, -0.3f, 0.9f, 0.5f, 0.0f};
    char scratch[4096];
    st_sampler_params sp = {.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 3};
    for (int64_t pos = 1; pos < 2000; pos++) {
        int32_t plain;
        assert_int_equal(st_sample(lg, V, &sp, pos, scratch, &plain), ST_OK);
        /* a root with children 0..3 at position pos-1: the emitted token is the sample */
        int32_t tokens[5] = {9, 0, 1, 2, 3}, positions[5] = {0, 1, 1, 1, 1};
        int64_t ri[5] = {0, 1, 2, 3, 4}, nt[5] = {1, -1, -1, -1, -1}, ns[5] = {-1, 2, 3, 4, -1};
        st_tree tree = {tokens, positions, ri, nt, ns};
        int32_t tp[5], pred[5];
        for (int i = 0; i < 5; i++)
            assert_int_equal(st_sample(lg, V, &sp, pos + (i > 0), scratch, &tp[i]), ST_OK);
        int64_t acc[2], k;
        assert_int_equal(st_verify_tree_greedy(1, 5, 1, &tree, tp, pred, acc, &k), ST_OK);
        int32_t first = k ? tokens[acc[1]] : pred[acc[0]];
        assert_int_equal(first, plain);
    }
}

/* V = 6, prompt [0, 1], generated [2, 2, 3] committed and [1] on the path. Bias: token 4 +1,
 * token 5 -100. Repetition 2 over the last 3 tokens [2, 3, 1]: 2.0 / 2, 0.5 / 2, -1.0 * 2.
 * Presence 0.5, frequency 0.25 over the generated counts {2: 2, 3: 1, 1: 1}: token 2 - 1.0,
 * tokens 3 and 1 - 0.75. Token 0 is only in the prompt, outside the window: unchanged. */
static void test_penalize_by_hand(void **state) {
    (void)state;
    enum { V = 6 };
    const float lg0[V] = {1.0f, -1.0f, 2.0f, 0.5f, -0.5f, 3.0f};
    const float want[V] = {1.0f, -2.75f, 0.0f, -0.5f, 0.5f, -97.0f};
    const int32_t toks[5] = {0, 1, 2, 2, 3}, path[1] = {1};
    const st_logit_bias bias[2] = {{4, 1.0f}, {5, -100.0f}};
    st_sampler_params p = {.temp = 0.0f,
                           .presence_penalty = 0.5f,
                           .frequency_penalty = 0.25f,
                           .repeat_penalty = 2.0f,
                           .repeat_last_n = 3,
                           .logit_bias = bias,
                           .n_logit_bias = 2};
    assert_int_equal(st_sampler_check(&p, V), ST_OK);
    assert_true(st_sampler_penalized(&p));
    const st_sample_history h = {toks, 5, 2, path, 1};
    int32_t counts[V] = {0}, zero[V] = {0};
    float lg[V];
    memcpy(lg, lg0, sizeof lg);
    assert_int_equal(st_sample_penalize(lg, V, &p, &h, NULL, 0, counts), ST_OK);
    for (int i = 0; i < V; i++)
        if (lg[i] != want[i])
            fail_msg("token %d: %g, want %g", i, (double)lg[i], (double)want[i]);
    assert_memory_equal(counts, zero, sizeof counts);
    char scratch[4096];
    int32_t tok;
    assert_int_equal(st_sample(lg0, V, &p, 6, scratch, &tok), ST_OK);
    assert_int_equal(tok, 5); /* unpenalized greedy */
    assert_int_equal(st_sample(lg, V, &p, 6, scratch, &tok), ST_OK);
    assert_int_equal(tok, 0); /* greedy takes the argmax of the penalized logits */

    /* the whole context as the window (-1) also reaches token 0 of the prompt: 1.0 / 2 */
    p.repeat_last_n = -1;
    memcpy(lg, lg0, sizeof lg);
    assert_int_equal(st_sample_penalize(lg, V, &p, &h, NULL, 0, counts), ST_OK);
    assert_true(lg[0] == 0.5f && lg[1] == -2.75f);
    /* repeat_last_n 0 is the default window of 64: here the whole history too */
    p.repeat_last_n = 0;
    memcpy(lg, lg0, sizeof lg);
    assert_int_equal(st_sample_penalize(lg, V, &p, &h, NULL, 0, counts), ST_OK);
    assert_true(lg[0] == 0.5f);
    assert_memory_equal(counts, zero, sizeof counts);

    /* min_tokens: 4 tokens generated along the path, so 5 bans EOS (token 3) and 4 does not */
    const int32_t eos = 3;
    st_sampler_params m = {.temp = 0.0f, .min_tokens = 5};
    memcpy(lg, lg0, sizeof lg);
    assert_int_equal(st_sample_penalize(lg, V, &m, &h, &eos, 1, counts), ST_OK);
    assert_true(isinf(lg[3]) && lg[3] < 0);
    for (int i = 0; i < V; i++)
        if (i != 3)
            assert_true(lg[i] == lg0[i]);
    m.min_tokens = 4;
    memcpy(lg, lg0, sizeof lg);
    assert_int_equal(st_sample_penalize(lg, V, &m, &h, &eos, 1, counts), ST_OK);
    assert_true(lg[3] == lg0[3]);
    /* ignore_eos bans it whatever was generated */
    m = (st_sampler_params){.temp = 0.0f, .ignore_eos = 1};
    memcpy(lg, lg0, sizeof lg);
    assert_int_equal(st_sample_penalize(lg, V, &m, &h, &eos, 1, counts), ST_OK);
    assert_true(isinf(lg[3]) && lg[3] < 0);
    /* nothing on: nothing penalized */
    m = (st_sampler_params){.temp = 0.7f, .repeat_penalty = 1.0f};
    assert_false(st_sampler_penalized(&m));
}

/* logit_bias -100 on the most likely token: never chosen, greedy or over 2000 sampled
 * positions; an EOS banned by ignore_eos never either, even when it is the most likely. */
static void test_bias_bans(void **state) {
    (void)state;
    enum { V = 8 };
    const float lg0[V] = {0.2f, 1.0f, 4.0f, 0.5f, 0.9f, -0.1f, 0.3f, 1.5f};
    const st_logit_bias ban = {2, -100.0f};
    const int32_t eos = 7, toks[1] = {1};
    const st_sample_history h = {toks, 1, 1, NULL, 0};
    int32_t counts[V] = {0};
    char scratch[4096];
    int seen2 = 0;
    for (int64_t pos = 1; pos <= 2000; pos++) {
        st_sampler_params p = {.temp = pos == 1 ? 0.0f : 1.0f, .top_p = 1.0f, .seed = 11};
        float lg[V];
        int32_t tok;
        memcpy(lg, lg0, sizeof lg);
        assert_int_equal(st_sample(lg, V, &p, pos, scratch, &tok), ST_OK);
        seen2 += tok == 2;
        p.logit_bias = &ban;
        p.n_logit_bias = 1;
        p.ignore_eos = 1;
        assert_int_equal(st_sample_penalize(lg, V, &p, &h, &eos, 1, counts), ST_OK);
        assert_int_equal(st_sample(lg, V, &p, pos, scratch, &tok), ST_OK);
        assert_true(tok != 2 && tok != 7);
        if (pos == 1)
            assert_int_equal(tok, 1); /* greedy: the next best after 2 and 7 */
    }
    assert_true(seen2 > 1000); /* without the bias, token 2 is the usual draw */
}

static void test_penalty_params(void **state) {
    (void)state;
    const st_logit_bias out_of_vocab = {6, 1.0f}, too_big = {1, 101.0f};
    struct {
        st_sampler_params p;
        const char *field;
    } bad[] = {
        {{.presence_penalty = 2.5f}, "presence_penalty"},
        {{.frequency_penalty = -3.0f}, "frequency_penalty"},
        {{.frequency_penalty = NAN}, "frequency_penalty"},
        {{.repeat_penalty = -1.0f}, "repeat_penalty"},
        {{.repeat_penalty = 11.0f}, "repeat_penalty"},
        {{.repeat_last_n = -2}, "repeat_last_n"},
        {{.min_tokens = -1}, "min_tokens"},
        {{.logit_bias = &out_of_vocab, .n_logit_bias = 1}, "logit_bias"},
        {{.logit_bias = &too_big, .n_logit_bias = 1}, "logit_bias"},
        {{.logit_bias = NULL, .n_logit_bias = 1}, "logit_bias"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(st_sampler_check(&bad[i].p, 6), ST_ERR_INVALID);
        if (!strstr(st_last_error(), bad[i].field))
            fail_msg("case %zu: '%s' does not name %s", i, st_last_error(), bad[i].field);
    }
    const st_logit_bias ok = {5, -100.0f};
    st_sampler_params good = {.presence_penalty = -2.0f,
                              .frequency_penalty = 2.0f,
                              .repeat_penalty = 1.1f,
                              .repeat_last_n = -1,
                              .logit_bias = &ok,
                              .n_logit_bias = 1,
                              .min_tokens = 3};
    assert_int_equal(st_sampler_check(&good, 6), ST_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_nan),
        cmocka_unit_test(test_sample_basics),
        cmocka_unit_test(test_sample_distribution),
        cmocka_unit_test(test_target_only_distribution),
        cmocka_unit_test(test_coupled_equals_plain),
        cmocka_unit_test(test_penalize_by_hand),
        cmocka_unit_test(test_bias_bans),
        cmocka_unit_test(test_penalty_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
