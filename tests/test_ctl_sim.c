/*
 * test_ctl_sim.c: `auto` against fixed shapes for a model drafter (EAGLE, STANDALONE), on
 * simulated generations that are deterministic (the bar: auto within 5% of the best fixed
 * (K, S, N), and at most 3% below plain decoding with a drafter that is always wrong).
 *
 * The simulation runs the controller as the engine does (st_ctl_want_draft, st_ctl_draft_cost,
 * st_ctl_rank, st_ctl_choose, st_ctl_observe, st_ctl_step_end) against a synthetic text and
 * drafter: at position p the token the target emits is the drafter's rank-r candidate there
 * with probability acc[r] (drawn once per position, so every policy meets the same text), a
 * draft's tree is EAGLE-2's (K best nodes per level expanded; the drafter's child scores fixed
 * per rank), and times follow a cost model in plain-token units: a verify of n tokens costs
 * ratio(n), a proposal a catch-up (a fixed part and a part per row since the last proposal) and
 * S-1 level passes. A fixed shape drafts and verifies its N-1 best nodes every step. Speed-up:
 * tokens per unit of time over plain decoding's one. Two sequences in one batch, one drafter
 * always right and one always wrong: per-sequence trees keep the right one's big and verify the
 * wrong one's root only, beating every uniform tree.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "ctl/ctl.h"
#include "draft/drafter.h"
#include "spectree.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { GEN = 3000, MAXM = 600, HIST = GEN + 64 };

typedef struct sim_case {
    const char *name;
    double acc[4];       /* the emitted token is the drafter's rank-r candidate (else none) */
    double child[4];     /* the drafter's probability of its rank-r child */
    double ratio_at[17]; /* verify cost of n = 2..16 tokens (plain tokens) */
    double slope;        /* ... and per token past 16 */
    double catch_fixed, catch_row, level; /* proposal costs */
    double noise;                         /* each time times a factor in [1 - noise, 1 + noise] */
    double burst;  /* ... and times (1 + burst) in 40 of every 100 steps (other jobs) */
    double unseen; /* time of a drafted step outside drafting and the verify (sampling, the
                    * tree's bookkeeping, cold caches): in its time, not in any measured cost */
    uint64_t seed; /* another text, other noise and bursts at other steps (0: the cases' own) */
    /* a bimodal machine: from one stretch of `stretch` plain-token times to the next, every time
     * is `bimodal` times longer or not (one or the other at random: 58 and 41 tok/s is 1.41);
     * 0: one speed */
    double bimodal, stretch;
    /* one preempted plain step: the second step's forward takes `spike` times as long (0: none;
     * the first plain steps, before the costs settle, are the ones that set the yardstick) */
    double spike;
} sim_case;

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double unit(uint64_t key) { return (double)(mix(key) >> 11) / 9007199254740992.0; }

/* The rank of the drafter's candidate the target emits at position p (4: none of them). */
static int true_rank(const sim_case *sc, int64_t p) {
    double u = unit((uint64_t)p * 2654435761u + 17 + sc->seed * 1000003u), cum = 0.0;
    for (int r = 0; r < 4; r++)
        if (u < (cum += sc->acc[r]))
            return r;
    return 4;
}
/* The token of the rank-r candidate at any position (4: a token no candidate has). */
static int32_t tok_at(int r) { return r >= 4 ? 3 : 10 + r; }

static double ratio(const sim_case *sc, int64_t n) {
    return n <= 16 ? sc->ratio_at[n] : sc->ratio_at[16] + sc->slope * (double)(n - 16);
}

static double noisy(const sim_case *sc, double t, int64_t key) {
    const int64_t step = key % 1000000;
    return t *
           (1.0 + sc->noise * (2.0 * unit((uint64_t)key * 7919u + 5 + sc->seed * 999983u) - 1.0)) *
           ((step + (int64_t)sc->seed * 37) % 100 >= 60 ? 1.0 + sc->burst : 1.0);
}

/* The machine's slowdown at simulated time `now` (a bimodal machine's stretches). */
static double machine(const sim_case *sc, double now) {
    if (sc->bimodal <= 0.0)
        return 1.0;
    const uint64_t k = (uint64_t)(now / sc->stretch);
    return unit(k * 40503u + 977 + sc->seed * 7777u) < 0.5 ? sc->bimodal : 1.0;
}

/* An EAGLE-2 pool (K, S): candidates' tokens depend only on their rank (tok_at). */
static void propose(const sim_case *sc, int64_t K, int64_t S, float *scores, int32_t *tokens,
                    int64_t *lp) {
    const int64_t M = st_tree_n_candidates(K, S), lpw = st_tree_level_parents_width(K, S);
    float node[16];
    int64_t pick[16];
    for (int64_t i = 0; i < M; i++)
        scores[i] = -INFINITY, tokens[i] = 0;
    lp[0] = -1;
    for (int64_t k = 0; k < K; k++) {
        scores[k] = (float)sc->child[k];
        tokens[k] = tok_at((int)k);
        node[k] = scores[k];
        lp[1 + k] = k;
    }
    for (int64_t i = 1, l = K + 1; i < S; i++, l += K) {
        const int64_t base = st_tree_level_base(K, i);
        for (int64_t p = 0; p < K; p++)
            for (int64_t c = 0; c < K; c++) {
                scores[base + p * K + c] =
                    node[p] == -INFINITY ? -INFINITY : node[p] * (float)sc->child[c];
                tokens[base + p * K + c] = tok_at((int)c);
            }
        st_draft_expand_level(scores, K, i, lp + l, lpw - l, pick);
        for (int64_t k = 0; k < K; k++)
            node[k] = pick[k] >= 0 ? scores[base + pick[k]] : -INFINITY;
    }
}

/* Accepted drafts of the first n-1 ranked nodes: the path whose ranks are the text's. */
static int64_t accepted(const sim_case *sc, const st_ctl *c, int32_t a, int64_t K,
                        const int64_t *lp, int64_t n0, int32_t n) {
    int64_t cur = -1, d = 0; /* the accepted node (candidate index; -1 the root) */
    for (;;) {
        const int r = true_rank(sc, n0 + d);
        int64_t next = -2;
        for (int32_t j = 0; j < n - 1 && next == -2; j++) {
            const int64_t cand = st_ctl_ranked(c, a, j);
            if (cand < 0)
                break;
            const int64_t lvl = cand < K ? 0 : st_tree_candidate_level(K, cand);
            if (lvl != d)
                continue;
            const int64_t q = cand - st_tree_level_base(K, lvl);
            const int64_t parent = lvl == 0 ? -1 : lp[1 + (lvl - 1) * K + q / K];
            if (parent == cur && q % K == r)
                next = cand;
        }
        if (next == -2)
            return d;
        cur = next;
        d++;
    }
}

/* Tokens per unit of time: auto (K = 0), plain decoding (K = -1) or the fixed shape (K, S, N). */
static double simulate(const sim_case *sc, int64_t fK, int64_t fS, int32_t fN, int64_t *steps,
                       int64_t *spec_steps) {
    st_ctl *c;
    const int autotune = fK == 0, plain = fK < 0;
    if (plain)
        fK = fS = 1, fN = 2;
    assert_int_equal(st_ctl_create(1, autotune ? ST_CTL_AUTO_K : fK, autotune ? ST_CTL_AUTO_S : fS,
                                   autotune ? ST_CTL_AUTO_N : fN, 1, 0.1, &c),
                     ST_OK);
    if (autotune)
        st_ctl_auto_shape(c, 1, 1);
    int32_t *hist = calloc(HIST, sizeof *hist);
    float *scores = malloc(MAXM * sizeof *scores);
    int32_t *tokens = malloc(MAXM * sizeof *tokens);
    int64_t *lp = malloc(MAXM * sizeof *lp);
    int64_t n_hist = 1, last_draft = 0, step = 0;
    double time = 0.0;
    *spec_steps = 0;
    hist[0] = 1;
    while (n_hist < GEN) {
        int64_t K = fK, S = fS;
        const int drafted = autotune ? st_ctl_want_draft(c, 1, &K, &S) : !plain;
        int32_t n = 1;
        int64_t emitted = 1;
        double t_draft = 0.0, t_fwd;
        const double slow = machine(sc, time);
        if (drafted) {
            const int64_t rows = n_hist - last_draft;
            const double t_catch =
                             slow * noisy(sc, sc->catch_fixed + sc->catch_row * (double)rows, step),
                         t_lvl =
                             slow *
                             noisy(sc, (double)(S - 1) * sc->level * (1.0 + 0.1 * (double)(K - 1)),
                                   step + 1000000);
            t_draft = t_catch + t_lvl;
            st_ctl_draft_cost(c, K, S, t_catch * 1e-3, rows, t_lvl * 1e-3);
            last_draft = n_hist;
            propose(sc, K, S, scores, tokens, lp);
            st_ctl_rank(c, 0, 0, K, S, scores, tokens, lp, n_hist, 0);
            double g;
            const int64_t M = st_tree_n_candidates(K, S);
            n = autotune ? st_ctl_choose(c, 1, M, &g) : (fN < M + 1 ? fN : (int32_t)(M + 1));
            if (n > 1)
                emitted = accepted(sc, c, 0, K, lp, n_hist, n) + 1;
        }
        /* the first step after the prompt runs cold */
        const double t_unseen = drafted ? slow * sc->unseen : 0.0;
        t_fwd =
            slow * noisy(sc, n > 1 ? ratio(sc, n) : 1.0, step + 2000000) * (step == 0 ? 1.5 : 1.0);
        if (step == 1 && sc->spike > 0.0)
            t_fwd *= sc->spike;
        for (int64_t i = 0; i < emitted && n_hist < HIST; i++, n_hist++)
            hist[n_hist] = tok_at(true_rank(sc, n_hist));
        if (autotune)
            st_ctl_observe(c, 0, hist, n_hist, 0);
        st_ctl_step_end(c, drafted, n, 1, emitted, (t_draft + t_fwd + t_unseen) * 1e-3,
                        t_fwd * 1e-3);
        time += t_draft + t_fwd + t_unseen;
        *spec_steps += n > 1;
        step++;
    }
    *steps = step;
    st_ctl_free(c);
    free(lp);
    free(tokens);
    free(scores);
    free(hist);
    return (double)n_hist / time;
}

static const int64_t shapes[][3] = {{1, 1, 2},  {1, 2, 3},  {1, 3, 4},  {1, 4, 5},  {1, 5, 6},
                                    {1, 6, 7},  {1, 8, 9},  {2, 2, 4},  {2, 3, 6},  {2, 4, 8},
                                    {2, 6, 12}, {4, 4, 12}, {4, 4, 16}, {3, 5, 12}, {2, 8, 16}};

/* auto's speed-up over the best fixed shape's and over plain decoding's */
static double spec_share; /* run_case's auto run: the share of its steps that verified a tree */

static void run_case(const sim_case *sc, double *vs_best, double *vs_plain) {
    int64_t steps, spec;
    double best = 0.0;
    int bi = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const double v =
            simulate(sc, shapes[i][0], shapes[i][1], (int32_t)shapes[i][2], &steps, &spec);
        if (v > best)
            best = v, bi = (int)i;
    }
    /* (plain decoding runs at 1 token a unit, but on a bimodal machine: simulated there) */
    const double plain = sc->bimodal > 0.0 ? simulate(sc, -1, 0, 0, &steps, &spec) : 1.0;
    const double a = simulate(sc, 0, 0, 0, &steps, &spec);
    *vs_best = a / best;
    *vs_plain = a / plain;
    spec_share = (double)spec / (double)steps;
    print_message("%-34s best fixed %lld/%lld/%lld %.3fx, auto %.3fx (%.1f%% of it, %.3fx plain; "
                  "%lld of %lld steps speculative)\n",
                  sc->name, (long long)shapes[bi][0], (long long)shapes[bi][1],
                  (long long)shapes[bi][2], best, a, 100.0 * a / best, a / plain, (long long)spec,
                  (long long)steps);
}

/* A bandwidth-bound target (stories260K inflated to 768 x 12, Q8_0, one thread: verify costs
 * as `spectree-bench verify` measured them) and a Q8_0 head: cheap levels. */
static const sim_case bandwidth = {.name = "bandwidth-bound, good head",
                                   .acc = {0.75, 0.08, 0.03, 0.01},
                                   .child = {0.7, 0.12, 0.05, 0.03},
                                   .ratio_at = {0, 1.0, 1.0, 1.05, 1.10, 1.2, 1.3, 1.45, 1.62, 1.64,
                                                1.65, 1.66, 1.67, 1.68, 1.69, 1.70, 1.72},
                                   .slope = 0.1,
                                   .catch_fixed = 0.04,
                                   .catch_row = 0.01,
                                   .level = 0.025};

static void test_auto_vs_fixed(void **state) {
    (void)state;
    double vb, vp;
    sim_case sc = bandwidth;
    run_case(&sc, &vb, &vp);
    assert_true(vb >= 0.95);
    sc.name = "bandwidth-bound, good head, noisy";
    sc.noise = 0.3;
    run_case(&sc, &vb, &vp);
    assert_true(vb >= 0.95);
    sc.name = "bandwidth-bound, good head, bursts";
    sc.burst = 1.0;
    run_case(&sc, &vb, &vp);
    assert_true(vb >= 0.95);
    /* costs the model does not see (a fifth of a token per drafted step) make every prediction
     * optimistic; the pools never drafted must not look better than those measured */
    sc = bandwidth;
    sc.name = "bandwidth-bound, good head, unseen";
    sc.unseen = 0.2;
    sc.noise = 0.3;
    run_case(&sc, &vb, &vp);
    assert_true(vb >= 0.95);
    /* a weaker head with dearer levels (an F32 head beside a Q8_0 target) */
    sc = bandwidth;
    sc.name = "bandwidth-bound, weaker dear head";
    sc.acc[0] = 0.6;
    sc.level = 0.08;
    sc.catch_fixed = 0.1;
    run_case(&sc, &vb, &vp);
    assert_true(vb >= 0.95);
    /* a compute-bound target (stories260K: a verify of n tokens costs much more than one) and a
     * head whose pass costs a third of a token: no shape pays, auto decodes plainly */
    sc = bandwidth;
    sc.name = "compute-bound, dear head";
    for (int n = 2; n <= 16; n++)
        sc.ratio_at[n] = 1.0 + 0.45 * (n - 1);
    sc.slope = 0.45;
    sc.level = 0.33;
    sc.catch_fixed = 0.33;
    sc.catch_row = 0.2;
    run_case(&sc, &vb, &vp);
    assert_true(vp >= 0.97);
}

/* A bimodal machine (other jobs come and go on shared cores): every time is 58/41 times longer
 * in some stretches of 150 (or 600) plain-token times than in others, at random. Costs measured in
 * one speed and read in the other must not lock auto onto a wrong shape: within 5% of the best
 * fixed shape with a good head, on 8 texts, and at most 3% below plain with a drafter that is
 * always wrong, or where no shape pays. */
static void test_bimodal(void **state) {
    (void)state;
    double vb, vp, sum = 0.0;
    sim_case sc = bandwidth;
    sc.bimodal = 58.0 / 41.0;
    sc.stretch = 150.0;
    sc.name = "good head, bimodal machine (seeds)";
    for (uint64_t seed = 0; seed < 8; seed++) {
        sc.seed = seed;
        sc.stretch = seed % 2 ? 600.0 : 150.0;
        run_case(&sc, &vb, &vp);
        assert_true(vb >= 0.90);
        sum += vb;
    }
    print_message("%s: auto at %.1f%% of the best fixed on average\n", sc.name, 12.5 * sum);
    assert_true(sum / 8.0 >= 0.95);
    sc.seed = 0;
    sc.stretch = 150.0;
    sc.name = "good head, bimodal machine, noisy";
    sc.noise = 0.3;
    run_case(&sc, &vb, &vp);
    assert_true(vb >= 0.95);
    sc.name = "random head, bimodal machine, noisy";
    memset(sc.acc, 0, sizeof sc.acc);
    sc.child[0] = 0.3;
    run_case(&sc, &vb, &vp);
    assert_true(vp >= 0.97);
    sc = bandwidth;
    sc.bimodal = 58.0 / 41.0;
    sc.stretch = 150.0;
    sc.name = "compute-bound, bimodal machine";
    for (int n = 2; n <= 16; n++)
        sc.ratio_at[n] = 1.0 + 0.45 * (n - 1);
    sc.slope = 0.45;
    sc.level = 0.33;
    sc.catch_fixed = 0.33;
    sc.catch_row = 0.2;
    run_case(&sc, &vb, &vp);
    assert_true(vp >= 0.97);
}

/* The same cases with a good head over 8 seeds (other texts, noise, burst phases): one seed's
 * trajectory can sit on a knife's edge (a parameter that does not matter moves a case by
 * several points), so auto must reach 95% of the best fixed shape on average over the seeds,
 * and 85% on each. (The controller of d8eef9d averaged 81.9% on the bursts case over them,
 * 45% at worst.) */
static void test_auto_vs_fixed_seeds(void **state) {
    (void)state;
    for (int k = 0; k < 4; k++) {
        double sum = 0.0, vb, vp;
        sim_case sc = bandwidth;
        sc.name = k == 0   ? "good head (seeds)"
                  : k == 1 ? "good head, noisy (seeds)"
                  : k == 2 ? "good head, bursts (seeds)"
                           : "good head, unseen (seeds)";
        sc.noise = k ? 0.3 : 0.0;
        sc.burst = k == 2 ? 1.0 : 0.0;
        sc.unseen = k == 3 ? 0.2 : 0.0;
        for (uint64_t seed = 0; seed < 8; seed++) {
            sc.seed = seed;
            run_case(&sc, &vb, &vp);
            assert_true(vb >= 0.85);
            sum += vb;
        }
        print_message("%s: auto at %.1f%% of the best fixed on average\n", sc.name, 12.5 * sum);
        assert_true(sum / 8.0 >= 0.95);
    }
}

/* An always-wrong drafter (a random head): at most 3% below plain decoding, on either kind of
 * target. */
static void test_wrong_head(void **state) {
    (void)state;
    double vb, vp;
    sim_case sc = bandwidth;
    sc.name = "bandwidth-bound, random head";
    memset(sc.acc, 0, sizeof sc.acc);
    sc.child[0] = 0.3; /* a random head is unsure */
    /* the same with noise, and with a plain step preempted before the costs settled (a CI run
     * beside other tests: 6 times as long), which must not make plain decoding look slow for
     * the rest of the run; then on a compute-bound target, where a wrong tree costs more */
    for (int i = 0; i < 5; i++) {
        sc.noise = i == 1 ? 0.3 : 0.0;
        sc.spike = i == 2 || i == 4 ? 6.0 : 0.0;
        if (i == 3) {
            sc.name = "compute-bound, random head";
            for (int n = 2; n <= 16; n++)
                sc.ratio_at[n] = 1.0 + 0.45 * (n - 1);
            sc.level = sc.catch_fixed = 0.2;
            sc.catch_row = 0.2;
        } else if (i)
            sc.name = i == 1   ? "bandwidth-bound, random head, noisy"
                      : i == 2 ? "bandwidth-bound, random head, preempted"
                               : "compute-bound, random head, preempted";
        run_case(&sc, &vb, &vp);
        assert_true(vp >= 0.97);
        assert_true(spec_share <= 0.05); /* (probes, and trees before the costs settle) */
    }
}

/* Two sequences in one batch, one whose drafter is always right and one always wrong, the same
 * pool (chains of 8) and the same scores: tokens per unit of time with per-sequence trees
 * (fK = 0: st_ctl_choose_each) or one uniform tree of fN nodes for both (fN = 1: plain); a
 * verify of T tokens costs 1 + 0.1 (T - 1) plain tokens (a bandwidth-bound target), proposing a
 * catch-up and 7 level passes per sequence. *big: the good sequence's mean tree over the second
 * half, *small: the share of those steps in which the bad one verified its root only. */
enum { PAIR_STEPS = 1500 };
static double simulate_pair(int32_t fN, double *big, double *small) {
    const int64_t K = 1, S = 8;
    const int autotune = fN == 0;
    const sim_case good = {.acc = {1.0}, .child = {0.7}}, bad = {.acc = {0.0}, .child = {0.7}};
    const sim_case *sc[2] = {&good, &bad};
    st_ctl *c;
    assert_int_equal(st_ctl_create(2, K, S, autotune ? 9 : (fN > 1 ? fN : 2), 1, 0.1, &c), ST_OK);
    int32_t *hist[2] = {calloc(HIST * 8, sizeof(int32_t)), calloc(HIST * 8, sizeof(int32_t))};
    float *scores = malloc(MAXM * sizeof *scores);
    int32_t *tokens = malloc(MAXM * sizeof *tokens);
    int64_t *lp = malloc(MAXM * sizeof *lp), n_hist[2] = {1, 1}, last[2] = {0, 0};
    double time = 0.0, tok = 0.0, sum_big = 0.0, n_small = 0.0;
    hist[0][0] = hist[1][0] = 1;
    for (int64_t step = 0; step < PAIR_STEPS; step++) {
        int64_t k = K, s = S;
        const int drafted = autotune ? st_ctl_want_draft(c, 2, &k, &s) : fN > 1;
        int32_t n[2] = {1, 1};
        int64_t emitted = 0, T = 2;
        double t_draft = 0.0;
        if (drafted) {
            for (int32_t a = 0; a < 2; a++) {
                const int64_t rows = n_hist[a] - last[a];
                const double t_catch = 0.04 + 0.01 * (double)rows, t_lvl = 0.025 * (double)(s - 1);
                t_draft += t_catch + t_lvl;
                st_ctl_draft_cost(c, k, s, t_catch * 1e-3, rows, t_lvl * 1e-3);
                last[a] = n_hist[a];
                propose(sc[a], k, s, scores, tokens, lp);
                st_ctl_rank(c, a, a, k, s, scores, tokens, lp, n_hist[a], 0);
            }
            const int32_t cap[2] = {0, 0};
            const int64_t n_real[2] = {st_tree_n_candidates(k, s), st_tree_n_candidates(k, s)};
            double g;
            if (autotune)
                T = st_ctl_choose_each(c, 2, cap, n_real, n, &g);
            else
                n[0] = n[1] = fN, T = 2 * fN;
        }
        for (int32_t a = 0; a < 2; a++) {
            /* (a chain: the always-right sequence accepts all n - 1 drafts, the other none) */
            const int64_t e = n[a] > 1 ? accepted(sc[a], c, a, k, lp, n_hist[a], n[a]) + 1 : 1;
            for (int64_t i = 0; i < e; i++, n_hist[a]++)
                hist[a][n_hist[a]] = tok_at(true_rank(sc[a], n_hist[a]));
            emitted += e;
            if (autotune)
                st_ctl_observe(c, a, hist[a], n_hist[a], 0);
        }
        const double t_fwd = 1.0 + 0.1 * (double)(T - 1);
        if (autotune)
            st_ctl_step_end_ragged(c, drafted, T, 2, emitted, (t_draft + t_fwd) * 1e-3,
                                   t_fwd * 1e-3);
        time += t_draft + t_fwd, tok += (double)emitted;
        if (step >= PAIR_STEPS / 2)
            sum_big += n[0], n_small += n[1] == 1;
    }
    *big = sum_big / (PAIR_STEPS / 2), *small = n_small / (PAIR_STEPS / 2);
    st_ctl_free(c);
    free(lp), free(tokens), free(scores), free(hist[0]), free(hist[1]);
    return tok / time;
}

static void test_pair_per_sequence(void **state) {
    (void)state;
    double big, small, best = 0.0;
    int32_t bn = 1;
    for (int32_t fN = 1; fN <= 9; fN++) { /* plain, then uniform chains of 2..9 nodes */
        const double v = simulate_pair(fN, &big, &small);
        if (v > best)
            best = v, bn = fN;
    }
    const double v = simulate_pair(0, &big, &small);
    print_message("right + wrong drafter in one batch: per-sequence trees %.3f tok/unit, best "
                  "uniform (N %d) %.3f (%.2fx); the right one's mean tree %.2f, the wrong one's "
                  "root only in %.1f%% of steps\n",
                  v, bn, best, v / best, big, 100.0 * small);
    assert_true(v > 1.1 * best);
    assert_true(big >= 7.0);
    assert_true(small >= 0.95);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_vs_fixed),     cmocka_unit_test(test_auto_vs_fixed_seeds),
        cmocka_unit_test(test_wrong_head),        cmocka_unit_test(test_bimodal),
        cmocka_unit_test(test_pair_per_sequence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
