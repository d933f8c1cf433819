/*
 * ctl.c: the `auto` controller (see ctl.h): the drafting policy and plan, a measured verify-cost
 * curve, and a per-step choice of the tree size. The ranking of candidates and the calibration
 * of their acceptance from shadow proposals are in ctl_rank.c.
 */
#include "ctl/ctl_internal.h"

#include "spectree.h"

#include <math.h>
#include <string.h>

void st_ctl_free(st_ctl *c) {
    if (!c)
        return;
    st_free_aligned(c->mem);
    st_free(c);
}

/* The arrays of c in one planned block (st_plan: a sizing pass, then a carving pass). */
static void ctl_layout(st_ctl *c, st_plan *p) {
    const size_t R = (size_t)c->bs * (size_t)(c->N - 1), SR = R * CTL_RING, M = (size_t)c->Mmax,
                 T1 = (size_t)c->Tmax + 1;
    c->order = st_plan_take(p, R, sizeof *c->order);
    c->bucket = st_plan_take(p, R, sizeof *c->bucket);
    c->depth = st_plan_take(p, R, sizeof *c->depth);
    c->par = st_plan_take(p, R, sizeof *c->par);
    c->tok = st_plan_take(p, R, sizeof *c->tok);
    c->rank = st_plan_take(p, R, sizeof *c->rank);
    c->E = st_plan_take(p, (size_t)c->bs * (size_t)(c->N + 1), sizeof *c->E);
    c->avail = st_plan_take(p, (size_t)c->bs, sizeof *c->avail);
    c->seq_from = st_plan_take(p, (size_t)c->bs, sizeof *c->seq_from);
    c->seq_len = st_plan_take(p, (size_t)c->bs, sizeof *c->seq_len);
    c->map = st_plan_take(p, M, sizeof *c->map);
    c->fin = st_plan_take(p, M, sizeof *c->fin);
    c->sh = st_plan_take(p, (size_t)c->bs * CTL_RING, sizeof *c->sh);
    c->sh_par = st_plan_take(p, SR, sizeof *c->sh_par);
    c->sh_tok = st_plan_take(p, SR, sizeof *c->sh_tok);
    c->sh_bucket = st_plan_take(p, SR, sizeof *c->sh_bucket);
    c->sh_depth = st_plan_take(p, SR, sizeof *c->sh_depth);
    c->sh_rank = st_plan_take(p, SR, sizeof *c->sh_rank);
    c->tv = st_plan_take(p, T1, sizeof *c->tv);
    c->tv_n = st_plan_take(p, T1, sizeof *c->tv_n);
    c->tv_seen = st_plan_take(p, T1, sizeof *c->tv_seen);
    const size_t B = ((size_t)c->bs + 1) * ((size_t)c->N + 1);
    c->cvb = st_plan_take(p, B, sizeof *c->cvb);
    c->cvb_n = st_plan_take(p, B, sizeof *c->cvb_n);
}

st_status st_ctl_create(int32_t bs, int64_t K, int64_t S, int32_t N, int autotune,
                        double draft_weight_ratio, st_ctl **out) {
    *out = NULL;
    if (bs < 1 || N < 2 || N > ST_SPEC_MAX_N || K < 1 || K > ST_SPEC_MAX_K || S < 1 ||
        S > ST_SPEC_MAX_S)
        return st_fail(ST_ERR_INVALID, "controller: bad shape (bs %d, K %lld, S %lld, N %d)", bs,
                       (long long)K, (long long)S, N);
    st_ctl *c = st_calloc(1, sizeof *c);
    if (!c)
        return st_fail(ST_ERR_NOMEM, "controller: out of memory");
    c->bs = bs;
    c->N = N;
    c->K = K;
    c->S = S;
    c->autotune = autotune;
    c->model_drafter = draft_weight_ratio > 0.0;
    c->pk = K, c->ps = S;
    c->speed = 1.0;
    /* A draft model reading more than half the target's weight bytes per token cannot pay for
     * its drafts (its tokens cost more than half a target token; the self-draft costs one):
     * `auto` does not draft with it at all. Fixed shapes still do as told. */
    if (autotune && draft_weight_ratio > 0.5)
        c->off = 1;
    c->Mmax = st_tree_n_candidates(K, S);
    c->Tmax = (int64_t)bs * N;
    st_plan pl = {0};
    ctl_layout(c, &pl);
    if (!(c->mem = st_plan_alloc(&pl))) {
        st_ctl_free(c);
        return st_fail(ST_ERR_NOMEM, "controller: out of memory");
    }
    ctl_layout(c, &pl);
    for (int64_t i = 0; i < c->Mmax; i++)
        c->map[i] = -1;
    *out = c;
    return ST_OK;
}

void st_ctl_auto_shape(st_ctl *c, int k_auto, int s_auto) {
    c->k_auto = c->autotune && c->model_drafter && k_auto;
    c->s_auto = c->autotune && c->model_drafter && s_auto;
}

static void plan(st_ctl *c, int32_t na);
static double level_cost(const st_ctl *c, int64_t K);
static double t1_now(const st_ctl *c);
static double batch_f(const st_ctl *c, int32_t na);

static int want_draft(st_ctl *c, int32_t na, int64_t *K, int64_t *S);
static double conv1(const st_ctl *c);

/* Whether the probes may lose more: at most CTL_VPROBE_BUDGET of all the time so far, and of
 * the recent time, plus CTL_VPROBE_ALLOW plain-token times. */
static int budget_ok(const st_ctl *c) {
    return c->vprobe_loss <= CTL_VPROBE_BUDGET * c->t_total + CTL_VPROBE_ALLOW &&
           c->loss_recent <= CTL_VPROBE_BUDGET * c->t_recent + CTL_VPROBE_ALLOW;
}

/* Drafting at na sequences, by what it realized there against plain steps there. One
 * sequence is left to the plan and its pools' realized speed-ups (GATE_OPEN). */
enum { GATE_OPEN, GATE_CLOSED, GATE_UNKNOWN, GATE_STALE };

/* The evidence of drafting is shared by batch sizes 2, 3-4, 5-8, ..., 33-64 (a server's batch
 * moves between nearby sizes all the time: judged per size, each of 25..32 sequences was probed
 * anew, and trees ran on 14% of the steps at concurrency 32); its steps are in plain-token times
 * of their own batch size. */
static int gate_bucket(int32_t na) {
    int b = 1;
    while ((1 << b) < na)
        b++;
    return b;
}

static int gate(const st_ctl *c, int32_t na) {
    if (na < 2 || na > ST_GEN_MAX_BATCH || na > c->bs)
        return GATE_OPEN;
    /* the yardstick first: plain steps of this batch size measured lately (a plain time from
     * long ago, a cold first step or another load, made drafting that lost look paying) */
    const double wp = c->gp_w[na] * pow(CTL_GATE_FADE, (double)(c->step - c->gp_step[na]));
    if (c->t1b_n[na] == 0 || wp < CTL_GATE_PLAIN_MIN || !(c->gp_tok[na] > 0.0))
        return GATE_STALE;
    const int b = gate_bucket(na);
    const double w = c->gz_w[b] * pow(CTL_GATE_FADE, (double)(c->step - c->gz_step[b]));
    if (c->gz_n[b] < CTL_GATE_MIN || w < CTL_GATE_REJUDGE || !(c->gz_tok[b] > 0.0))
        return GATE_UNKNOWN;
    return c->gz_s[b] < c->gz_tok[b] ? GATE_OPEN : GATE_CLOSED; /* (in plain-token times) */
}

/* Adds a step of `tok` tokens in t seconds to decayed sums (each step's time a token counting at
 * most 1.5 times their mean once CTL_GATE_MIN steps are in: a preempted step; per token, since
 * the steps judged together emit from one token a sequence to a tree's worth). */
static void gate_add(double *stok, double *ss, double *sw, int64_t *sstep, int64_t step, double tok,
                     double t) {
    const double cap = *stok > 0.0 ? 1.5 * tok * *ss / *stok : 0.0,
                 x = *sw >= CTL_GATE_MIN && cap > 0.0 && t > cap ? cap : t,
                 k = CTL_GATE_DECAY * pow(CTL_GATE_FADE, (double)(step - 1 - *sstep));
    *stok = k * *stok + tok;
    *ss = k * *ss + x;
    *sw = k * *sw + 1.0;
    *sstep = step;
}

int st_ctl_want_draft(st_ctl *c, int32_t na, int64_t *K, int64_t *S) {
    c->gprobe = 0;
    if (!want_draft(c, na, K, S))
        return 0;
    if (!c->autotune || c->probing)
        return 1;
    /* a drafter without a model proposes where its trees may be verified: not where they were
     * judged to lose, and where they are not judged yet as a probe (on stories260K at 8
     * sequences, proposing and ranking cost 28% of a plain step: 1127 proposals that ended
     * plain cost 2.4% of the time) */
    if (!c->model_drafter) {
        const int gt = gate(c, na);
        if (gt == GATE_UNKNOWN) { /* proposals that may become a probe: within the budget */
            c->gprobe = 1;
            return budget_ok(c);
        }
        return gt == GATE_OPEN; /* (stale: a plain step measures the yardstick first) */
    }
    /* A batch size decodes plainly before its plain step is measured: the yardstick of its
     * trees (st_ctl_choose), and of what drafting realizes there. */
    if (na >= 1 && na <= c->bs && na <= ST_GEN_MAX_BATCH && c->t1b_n[na] == 0 && c->t1_n > 0)
        return 0;
    const int gt = gate(c, na);
    /* Where drafting lost at this batch size, plain steps; where it is not known, a probe within
     * the probes' budget. Drafting is per sequence, so at a larger batch its cost does not
     * shrink per token as a forward's does: on a 768-wide Q8_0 target an EAGLE head that paid
     * 1.3x for one sequence drafted every other step at 8 and verified a quarter of them, and
     * the server lost 12%. */
    if (gt == GATE_UNKNOWN) {
        c->gprobe = 1;
        return budget_ok(c);
    }
    return gt == GATE_OPEN;
}

static int want_draft(st_ctl *c, int32_t na, int64_t *K, int64_t *S) {
    *K = c->K;
    *S = c->S;
    c->first1_now = 0;
    if (!c->autotune)
        return 1;
    /* a plain step every CTL_PLAIN_EVERY keeps t1 fresh */
    if (c->off || c->step - c->last_plain >= CTL_PLAIN_EVERY)
        return 0;
    /* Proposals that keep ending in a plain step at this batch size are sampled, one step in
     * k, k chosen so that they cost about CTL_PROP_SHARE of the steps' time (k = 1 where
     * proposing is cheap beside the forward: a large model); the proposals still calibrate the
     * acceptance, and a speculative choice drafts every step again. Not a model drafter: its
     * plan already weighs what drafting costs against what the pool pays on average, steps that
     * end plain included (on a 768-wide Q8_0 target, two plain choices in a row stopped a
     * paying 1/2/3 for 16 steps at a time: 3 of 62 steps drafted). */
    if (!c->model_drafter && na >= 1 && na <= ST_GEN_MAX_BATCH && c->idle[na] >= 2) {
        double k = ceil(c->prop_frac / CTL_PROP_SHARE);
        k = k < 1.0 ? 1.0 : k > CTL_PROP_SKIP_MAX ? CTL_PROP_SKIP_MAX : k;
        if ((double)(c->step - c->last_draft + 1) < k)
            return 0;
    }
    if (!c->model_drafter)
        return 1;
    /* a model drafter only drafts once t1 is known (its drafts cost time before they can be
     * judged), from two plain steps: the first after the prompt runs cold (fresh KV rows and
     * buffers: on a 768-wide target it measured 1.3x the later ones) and every cost is a ratio
     * to t1 (the smallest of the first measurements). Its first CTL_FIRST proposals (chains of
     * at most 4, in a row) measure what drafting costs and start the calibration. */
    if (c->t1_n < 2)
        return 0;
    c->probing = 0;
    /* (the first, cold proposal is not measured) A batch's first steps of one sequence start
     * the same way: the verify costs of one sequence are measured only from them (see conv1),
     * and a server warmed up by a batch has none. Left to probes, 2-4 sizes measured twice each
     * took most of the first 1,000 steps at concurrency 1 (T with EAGLE, traced). Not before
     * one sequence's plain step is timed: nothing could be measured. */
    c->first1_now = c->c_catch_n >= CTL_FIRST - 1 && na == 1 && c->bs > 1 &&
                    c->first1 < CTL_FIRST - 1 && conv1(c) > 0.0;
    c->first1 += c->first1_now;
    if (c->c_catch_n < CTL_FIRST - 1 || c->first1_now) {
        c->dk = *K = c->k_auto ? 1 : c->K;
        c->ds = *S = c->s_auto && c->S > 4 ? 4 : c->S;
        c->probing = 1;
        return 1;
    }
    /* the plan is renewed every CTL_REPLAN steps (its inputs move slowly), every 4 times as
     * many while no shape pays (only t1 moves then) */
    if (c->pn == 0 ||
        c->step - c->plan_step >= (c->pgain >= CTL_PLAN_MIN_GAIN ? 1 : 4) * CTL_REPLAN) {
        c->plan_step = c->step;
        plan(c, na);
    }
    *K = c->dk = c->pk, *S = c->ds = c->ps;
    if (c->pgain >= CTL_PLAN_MIN_GAIN)
        return 1;
    /* No shape pays. A probe now and then keeps the calibration following the text, within a
     * budget: all probes together cost at most CTL_PROBE_BUDGET of the plain decoding time so
     * far. A probe first catches each sequence's drafter up on every token since its last
     * proposal (a new request's: its whole text), so on one long text a drafter whose rows
     * cost more than the budget's share of a token (a head as wide as a small target) is not
     * probed again; a server's requests end, and their catch-ups with them. (Counted as every
     * step since the last draft, a 768-wide head whose row cost 1.8% of a plain token was never
     * probed again after a warm-up at 4 sequences planned it at 0.99x: 1.00x at concurrency 1
     * in 2 of 8 serving runs, 1.3x in the others.) The first probe, CTL_PROBE_ROWS steps after
     * the last draft, measures what a caught-up row costs. A drafter predicted far from paying
     * (below CTL_PROBE_MIN_GAIN) is not probed. */
    const int64_t since = c->step - c->last_draft;
    if (c->pgain < CTL_PROBE_MIN_GAIN || since < (c->c_row_n ? CTL_PROBE_EVERY : CTL_PROBE_ROWS))
        return 0;
    int64_t rows = 0;
    for (int32_t b = 0; b < c->bs; b++)
        rows += c->seq_len[b] > c->seq_from[b] ? c->seq_len[b] - c->seq_from[b] : 0;
    const double cost =
        ((double)rows * c->c_row +
         (double)(na > 1 ? na : 1) * (c->c_catch + (double)(c->ps - 1) * level_cost(c, c->pk))) *
        batch_f(c, 1);
    if (c->c_row_n && c->probe_spent + cost > CTL_PROBE_BUDGET * (double)c->step)
        return 0;
    c->probing = 1;
    return 1;
}

/* The depth x rank acceptance table q[(d-1) * CTL_QK + r] for d <= S, r < K, with priors. */
static void q_table(const st_ctl *c, int64_t K, int64_t S, double *q) {
    for (int64_t d = 0; d < S; d++)
        for (int64_t r = 0; r < K; r++) {
            const double prior = r > 0   ? CTL_Q_PRIOR_RANK * q[d * CTL_QK + r - 1]
                                 : d > 0 ? q[(d - 1) * CTL_QK]
                                         : 0.5;
            q[d * CTL_QK + r] = (c->q_acc[d][r] + CTL_Q_PRIOR_WEIGHT * prior) /
                                (c->q_seen[d][r] + CTL_Q_PRIOR_WEIGHT);
        }
}

/* Inserts v into the descending list top[0..*n) of at most cap values. */
static void top_insert(double *top, int32_t *n, int32_t cap, double v) {
    if (cap < 1 || (*n == cap && v <= top[cap - 1]))
        return;
    int32_t i = *n < cap ? (*n)++ : cap - 1;
    for (; i > 0 && top[i - 1] < v; i--)
        top[i] = top[i - 1];
    top[i] = v;
}

/* st_ctl_tree_expect for every S in 1..S at once (the levels of a deeper pool extend a
 * shallower one's): row s-1 of E ((S, nmax + 1)) is pool (K, s)'s. */
static void tree_expect_levels(const double *q, int32_t qk, int64_t K, int64_t S, int32_t nmax,
                               double *E) {
    /* EAGLE-2's tree under the model: level 1 holds the root's K children; each next level the
     * K children of each of the K most likely nodes of the level before; the tree keeps the
     * n-1 most likely nodes of all levels (each node's ancestors are more likely than it) */
    double top[ST_SPEC_MAX_N], lvl[ST_SPEC_MAX_K], nxt[ST_SPEC_MAX_K];
    int32_t nt = 0, nl = 0;
    const int32_t cap = nmax - 1 < ST_SPEC_MAX_N ? nmax - 1 : ST_SPEC_MAX_N;
    for (int64_t d = 0; d < S; d++) {
        if (d == 0) {
            for (int64_t r = 0; r < K; r++) {
                top_insert(top, &nt, cap, q[r]);
                top_insert(lvl, &nl, (int32_t)K, q[r]);
            }
        } else {
            int32_t nn = 0;
            for (int32_t p = 0; p < nl; p++)
                for (int64_t r = 0; r < K; r++) {
                    const double v = lvl[p] * q[d * qk + r];
                    top_insert(top, &nt, cap, v);
                    top_insert(nxt, &nn, (int32_t)K, v);
                }
            memcpy(lvl, nxt, (size_t)nn * sizeof *lvl);
            nl = nn;
        }
        double *e = E + d * (nmax + 1);
        e[0] = 0.0;
        for (int32_t n = 1; n <= nmax; n++)
            e[n] = e[n - 1] + (n >= 2 && n - 2 < nt ? top[n - 2] : 0.0);
    }
}

void st_ctl_tree_expect(const double *q, int32_t qk, int64_t K, int64_t S, int32_t nmax,
                        double *E) {
    double all[ST_SPEC_MAX_S * (ST_SPEC_MAX_N + 1)];
    tree_expect_levels(q, qk, K, S, nmax, all);
    memcpy(E, all + (S - 1) * (nmax + 1), (size_t)(nmax + 1) * sizeof *E);
}

static double est_ratio(const st_ctl *c, int64_t T);
static double batch_f(const st_ctl *c, int32_t na);
static double conv1_est(const st_ctl *c);
static double verify_cost(const st_ctl *c, int32_t na, int32_t m, int *measured);

/* Seconds of a level pass of K nodes: measured, else from the nearest measured smaller (or
 * larger) pool, else a catch-up's. */
static double level_cost(const st_ctl *c, int64_t K) {
    if (c->c_level_n[K] > 0)
        return c->c_level[K];
    for (int64_t k = K - 1; k >= 1; k--)
        if (c->c_level_n[k] > 0)
            return c->c_level[k] * (1.0 + CTL_LEVEL_SLOPE * (double)(K - k));
    for (int64_t k = K + 1; k <= ST_SPEC_MAX_K; k++)
        if (c->c_level_n[k] > 0)
            return c->c_level[k] / (1.0 + CTL_LEVEL_SLOPE * (double)(k - K));
    return c->c_catch;
}

/* The best (K, S, N) for na sequences by predicted speed-up (into pk, ps, pn, pgain).
 * Every CTL_EXPLORE_EVERY-th planned draft, a shape one step deeper or wider than the best is
 * drafted instead when its prediction comes within 15% (its costs and deeper or wider cells
 * are measured only by drafting it). */
/* Realized over predicted tokens of the planned pools of depth S, in [0.5, 1.5]: shrunk
 * towards that of all planned pools (1 before any) by the evidence of depth S. Errors grow
 * with depth (an acceptance too high at one level is too high at every level below it), so a
 * deeper pool's shortfall says little about a shallower one: on a 768-wide Q8_0 target, 1/4/5
 * and 1/3/4 falling short took the factor of all to 0.78-0.84 and stopped `auto` from drafting
 * 1/2/3, predicted 1.24x and measured 1.205x when drafted. A depth never drafted takes the
 * factor of all (a pool not measured must not look better than those measured). */
static double rho(const st_ctl *c, int64_t S) {
    const double g = (c->rho_tok[0] + CTL_RHO_PRIOR) / (c->rho_pred[0] + CTL_RHO_PRIOR),
                 r = (c->rho_tok[S] + CTL_RHO_DEPTH_PRIOR * g) /
                     (c->rho_pred[S] + CTL_RHO_DEPTH_PRIOR);
    return r < 0.5 ? 0.5 : r > 1.5 ? 1.5 : r;
}

static void plan(st_ctl *c, int32_t na) {
    double q[CTL_QD * CTL_QK], E[ST_SPEC_MAX_S * (ST_SPEC_MAX_N + 1)], ratio[ST_SPEC_MAX_N + 1];
    q_table(c, c->K, c->S, q);
    /* a verify step's time in plain-token times, from its cost at this batch size; the plain
     * step it is weighed against takes na * f */
    const double f = batch_f(c, na);
    int meas;
    for (int32_t n = 2; n <= c->N; n++)
        ratio[n] = verify_cost(c, na, n, &meas) * (double)na * f;
    const int64_t k_lo = c->k_auto ? 1 : c->K, s_lo = c->s_auto ? 1 : c->S;
    const int32_t nmax = c->N;
    double best = -1.0, alt = -1.0, bdraft = 0.0;
    int64_t bk = c->K, bs = c->S, ak = 0, as = 0;
    int32_t bn = 2, an = 2;
    const int try_alt = ++c->planned % CTL_EXPLORE_EVERY == 0;
    for (int64_t K = k_lo; K <= c->K; K++) {
        tree_expect_levels(q, CTL_QK, K, c->S, nmax, E);
        const double lc = level_cost(c, K);
        for (int64_t S = s_lo; S <= c->S; S++) {
            /* pass 1: the shapes one level deeper or one candidate wider than the best */
            const int64_t M = st_tree_n_candidates(K, S);
            const int32_t nm = (int32_t)(M + 1 < nmax ? M + 1 : nmax);
            const double *e = E + (S - 1) * (nmax + 1);
            const double draft = (double)na * (c->c_catch + (double)(S - 1) * lc) * batch_f(c, 1);
            double gm = -1.0;
            int32_t nb = 2;
            for (int32_t n = 2; n <= nm; n++) {
                const double g = (double)na * f * (1.0 + e[n]) / (draft + ratio[n]);
                if (g > gm)
                    gm = g, nb = n;
            }
            c->pred[K][S] = gm;
            gm *= rho(c, S);
            /* the pool's realized speed-up, where it was drafted, corrects the prediction */
            const double w =
                c->rz_w[K][S] > 0.0
                    ? c->rz_w[K][S] * pow(CTL_RZ_FADE, (double)(c->step - c->rz_step[K][S]))
                    : 0.0;
            if (w > 0.0 && c->rz_cost[K][S] > 0.0)
                gm = (c->rz_tok[K][S] / c->rz_cost[K][S] * w + gm * CTL_RZ_PRIOR) /
                     (w + CTL_RZ_PRIOR);
            /* a dearer pool must be clearly better: near-ties (a wider pool whose siblings are
             * seldom right) are decided by noise, and a dearer pool's noise costs more */
            if (gm > (draft > bdraft ? 1.0 + CTL_PLAN_MARGIN : 1.0) * best)
                best = gm, bk = K, bs = S, bn = nb, bdraft = draft;
        }
    }
    c->pgain = best; /* whether to draft follows the best shape */
    c->pk = bk, c->ps = bs, c->pn = bn;
    if (!try_alt || best < CTL_PLAN_MIN_GAIN)
        return;
    for (int w = 0; w < 2; w++) { /* one level deeper, one candidate wider */
        const int64_t K = bk + w, S = bs + 1 - w;
        if (K > c->K || S > c->S || (w && !c->k_auto) || (!w && !c->s_auto))
            continue;
        tree_expect_levels(q, CTL_QK, K, S, nmax, E);
        const int64_t M = st_tree_n_candidates(K, S);
        const int32_t nm = (int32_t)(M + 1 < nmax ? M + 1 : nmax);
        const double *e = E + (S - 1) * (nmax + 1);
        const double draft =
            (double)na * (c->c_catch + (double)(S - 1) * level_cost(c, K)) * batch_f(c, 1);
        for (int32_t n = 2; n <= nm; n++) {
            const double g = (double)na * f * (1.0 + e[n]) / (draft + ratio[n]);
            if (g > c->pred[K][S] || n == 2)
                c->pred[K][S] = g;
            if (g * rho(c, S) > alt)
                alt = g * rho(c, S), ak = K, as = S, an = n;
        }
    }
    if (alt > 0.85 * best) {
        c->pk = ak, c->ps = as, c->pn = an;
        c->plan_step -= CTL_REPLAN - 1; /* for one step only */
    }
}

void st_ctl_last_plan(const st_ctl *c, int64_t *K, int64_t *S, int32_t *N, double *gain) {
    *K = c->pk, *S = c->ps, *N = c->pn, *gain = c->pgain;
}

/* A measured size's estimate: its measurements' average. (It was blended with the prior of
 * 0.6 per token, worth one measurement; on a target whose verify costs 0.05 per token that kept
 * the sizes measured once or twice, the first proposals' among them, far dearer than they are,
 * and a size the planner thinks dear is not drafted, so not measured again: the plan stuck on
 * the smallest trees. Overestimates correct themselves: a size drafted is measured.) */
static double meas_ratio(const st_ctl *c, int64_t T) { return c->tv[T]; }

/* Estimated cost of a verify step over T tree tokens, in plain-token times (a ratio to t1: both
 * grow with the context, their ratio much less). Measured sizes give meas_ratio; others are
 * interpolated between the measured sizes around them (1.0 at T = 1) and extrapolated past the
 * largest with the slope up to it (0.6 per token before any measurement). Every estimate is
 * at least that of every smaller size measured CTL_FLOOR_N times: a verify of more tokens costs
 * no less, and an unmeasured size must not look cheaper than a measured smaller one (an
 * interpolation of raw measurements beside blended ones did that, and the planner chased the
 * unmeasured sizes); a size measured once or twice (a slow step, seldom repeated) does not
 * raise the larger ones. */
static double est_ratio(const st_ctl *c, int64_t T) {
    int64_t lo = 1, hi = 0;
    double vlo = 1.0, floor = 1.0; /* the nearest measured size below T; the most a size below
                                    * measured CTL_FLOOR_N times costs */
    for (int64_t t = 2; t < T && t <= c->Tmax; t++)
        if (c->tv_n[t] > 0) {
            const double v = meas_ratio(c, t);
            lo = t;
            vlo = v;
            floor = c->tv_n[t] >= CTL_FLOOR_N && v > floor ? v : floor;
        }
    vlo = vlo > floor ? vlo : floor;
    double e;
    if (T <= c->Tmax && c->tv_n[T] > 0) {
        e = meas_ratio(c, T);
    } else {
        for (int64_t t = T + 1; t <= c->Tmax && hi == 0; t++)
            if (c->tv_n[t] > 0)
                hi = t;
        if (hi) {
            e = vlo + (meas_ratio(c, hi) - vlo) * (double)(T - lo) / (double)(hi - lo);
        } else {
            double slope = CTL_PRIOR_SLOPE;
            if (lo > 1) {
                slope = (vlo - 1.0) / (double)(lo - 1);
                slope = slope < 0.25 ? 0.25 : slope > 1.5 ? 1.5 : slope;
            }
            e = vlo + slope * (double)(T - lo);
        }
    }
    return e > floor ? e : floor;
}

/* Plain decoding's time per token at batch size na over t1 (1 where not measured). */
static double batch_f(const st_ctl *c, int32_t na) {
    return na >= 1 && na <= c->bs && c->t1b_n[na] > 0 && c->t1 > 0.0 ? c->t1b[na] / c->t1 : 1.0;
}

/* The time of a verify step of na sequences with m nodes each over that of a plain step of na
 * sequences: for one sequence, the verify-cost curve by tokens (est_ratio: a measured size its
 * measurements, others interpolated, none below a smaller size measured often enough); for a
 * batch, measured at that batch size (*measured = 1), else estimated from the verify-cost
 * curve over all steps (by total tokens, in t1 times), which does not see what a batch does to
 * it. */
static double verify_cost(const st_ctl *c, int32_t na, int32_t m, int *measured) {
    if (na == 1) { /* one sequence: the curve by tokens is its own, with its estimates' rules */
        *measured = m >= 2 && m <= c->Tmax && c->tv_n[m] > 0;
        return est_ratio(c, m) * conv1_est(c) / batch_f(c, 1);
    }
    const size_t i = (size_t)na * (size_t)(c->N + 1) + (size_t)m;
    *measured = na >= 1 && na <= c->bs && m >= 2 && m <= c->N && c->cvb_n[i] > 0;
    if (*measured)
        return c->cvb[i];
    return est_ratio(c, (int64_t)na * m) * conv1_est(c) / ((double)na * batch_f(c, na));
}

int32_t st_ctl_choose(st_ctl *c, int32_t na, int64_t n_real_max, double *exp_gain) {
    *exp_gain = 1.0;
    c->vprobe = 0;
    if (!c->autotune) /* a fixed shape verifies what was drafted, up to N */
        return (int32_t)(n_real_max + 1 < c->N ? n_real_max + 1 : c->N);
    if (c->t1_n == 0)
        return 1; /* measure plain decoding first */
    int32_t mmax = 1;
    for (int32_t a = 0; a < na; a++)
        mmax = c->avail[a] + 1 > mmax ? c->avail[a] + 1 : mmax;
    if (mmax > c->N)
        mmax = c->N;
    /* a model drafter's first proposals are verified whole until that size is measured (its
     * first verify runs cold and is not): they measure the verify cost the plan needs (its prior
     * is pessimistic, and a size never verified is never measured). Once measured, they are
     * verified as their drafts look: an always-wrong head must not pay for more whole trees. */
    if (c->model_drafter && (c->c_catch_n < CTL_FIRST - 1 || c->first1_now) && mmax > 1 &&
        c->tv_n[(int64_t)na * mmax] == 0) {
        c->vprobe = 1;
        return mmax;
    }
    /* the yardstick: a plain step at this batch size, measured first */
    if (na < 1 || na > c->bs || c->t1b_n[na] == 0)
        return 1;
    /* A step with trees is weighed against a plain step of the same batch: its verify forward
     * (its cost measured at this batch size) and its proposals (drafting and ranking, measured
     * per sequence) against the tokens it is expected to emit. The larger the batch, the
     * cheaper a plain step's tokens and the dearer a verify step (verification stops being
     * free): the trees must deliver more. */
    const double f = batch_f(c, na), cp = c->prop_rn ? c->prop_r * batch_f(c, 1) / f : 0.0;
    int32_t best = 1;
    double bg = CTL_TREE_MIN_GAIN;
    double g[ST_SPEC_MAX_N + 1];
    int meas[ST_SPEC_MAX_N + 1];
    for (int32_t m = 2; m <= mmax; m++) {
        double tok = 0.0;
        for (int32_t a = 0; a < na; a++)
            tok += 1.0 + c->E[(size_t)a * (size_t)(c->N + 1) + m];
        g[m] = tok / ((double)na * (verify_cost(c, na, m, &meas[m]) + cp));
        if (meas[m] && g[m] > bg) {
            bg = g[m];
            best = m;
        }
    }
    /* Probes, within the budget: the most promising size not yet measured at this batch size
     * if its estimate comes near paying, else now and then (one step in CTL_REPROBE_EVERY of
     * those where it applies) a measured size next to the best if it comes close (one slow
     * measurement, a cold cache or a preempted step, must not rule a size out for good). */
    int32_t alt = 0;
    double ag = 0.0;
    int fresh = 0;
    for (int32_t m = 2; m <= mmax; m++) {
        if (m == best)
            continue;
        const int near = !meas[m] ? g[m] > CTL_PROBE_NEAR * bg
                                  : (m == best + 1 || m == best - 1 || best == 1) &&
                                        g[m] > CTL_REPROBE_NEAR * bg;
        const int un = !meas[m]; /* unmeasured sizes first */
        if (near && (un > fresh || (un == fresh && g[m] > ag))) {
            ag = g[m];
            alt = m;
            fresh = un;
        }
    }
    if (alt && budget_ok(c) && (fresh || ++c->explore % CTL_REPROBE_EVERY == 0)) {
        c->vprobe = 1;
        return alt;
    }
    /* A drafter without a model is judged by what its drafted steps realized: where they
     * realized less than plain steps at this batch size (on stories260K at 16 sequences, trees
     * of 16 x 2-3 tokens took 5-8% more forward time for what they emitted), plain steps, but
     * for the probes. */
    if (best > 1 && !c->model_drafter) {
        const int gt = gate(c, na);
        if (gt == GATE_CLOSED || gt == GATE_STALE)
            best = 1;
        else if (gt == GATE_UNKNOWN && !budget_ok(c)) /* not judged yet: a probe */
            best = 1;
    }
    if (best > 1)
        *exp_gain = bg;
    return best;
}

/* Times are tracked by a moving average in which an observation counts at most 1.5 times the
 * current estimate (a step preempted on a shared machine must not rule a tree size out). The
 * same average for plain and verify steps keeps their ratio unbiased. */
static void track(double *v, int64_t n, double x) {
    if (n == 0) {
        *v = x;
        return;
    }
    if (x > 1.5 * *v)
        x = 1.5 * *v;
    /* the mean of the first few, then a moving average */
    *v += (n < 6 ? 1.0 / (double)(n + 1) : 0.15) * (x - *v);
}

/* A cost (a plain token, a catch-up, a level pass): the smallest of the first few
 * measurements (a cold first step or a preempted one only adds time), then track's average. */
static void track_cost(double *v, int64_t n, double x) {
    if (n == 0 || (n < 3 && x < *v))
        *v = x;
    else if (n >= 3)
        track(v, n, x);
}

/* A plain token's time now. Plain steps are rare while drafting (one in CTL_PLAIN_EVERY), and
 * a machine whose speed changes in between (other jobs on shared cores, cold caches after the
 * prompt, a longer context) changes every step's time alike: costs measured against t1 alone
 * then follow the machine, not the tree (on a 768-wide Q8_0 target under other jobs' load, a
 * verify of 3 tokens read 2.05 plain tokens, 1.4-1.5 where plain steps are measured beside
 * it), and `auto` stopped drafting. So the verify steps of sizes measured CTL_FLOOR_N
 * times also track the machine's speed, each moving it by CTL_SPEED_RATE of how far its time is
 * from its estimate (at most 1.5 times: a preempted step); a plain step sets t1 anew. */
static double t1_now(const st_ctl *c) { return c->t1 * c->speed; }

/* One sequence's plain token now (t1 is that of the batches that ran last), the unit of the
 * per-sequence draft costs; batch_f(c, 1) converts them to t1 times. */
static double seq_unit(const st_ctl *c) { return t1_now(c) * batch_f(c, 1); }

/* One sequence's plain token over t1, for a controller of a batch (1 without one: every plain
 * step is then one sequence's, as in `spectree generate`; -1 while one sequence's plain step was
 * never timed). t1 averages the plain steps of whatever batches ran, so the verify-cost curve by
 * tokens and the planned pools' realized speed-ups are kept in one sequence's plain-token times
 * (t1b[1]): in t1's, a server's curve mixed units. On the 768-wide target with EAGLE, a verify of
 * 2 tokens of the one request left at the end of a round at concurrency 4, timed while t1 was
 * still near the 4-sequence step's (0.77 ms a token, against 1.8 ms for one sequence), read 2.2
 * plain tokens, and a fresh server did not draft at all at concurrency 1 after it (1.16 is its
 * cost). */
static double conv1(const st_ctl *c) {
    if (c->bs <= 1)
        return 1.0;
    return c->t1b_n[1] > 0 && c->t1 > 0.0 ? batch_f(c, 1) : -1.0;
}

/* conv1 for estimates: 1 where it is not known yet. Measurements wait until it is: a server
 * whose first steps were a batch's has no plain step of one sequence to convert with, and a
 * verify of one sequence timed against the batch's t1 then read 2.85 plain tokens for 2. */
static double conv1_est(const st_ctl *c) {
    const double v = conv1(c);
    return v > 0.0 ? v : 1.0;
}

void st_ctl_time_plain(st_ctl *c, double per_token) { st_ctl_time_plain_batch(c, 1, per_token); }

/* The verify-cost curve by total tokens T (in t1 times, any batch); cold: the first step of
 * that size, not measured. */
static void time_verify_tokens(st_ctl *c, int64_t T, double seconds, int *cold) {
    *cold = 1;
    if (T < 2 || T > c->Tmax || !(seconds > 0.0) || c->t1_n == 0)
        return;
    /* the first step of a size is not measured: it runs cold (fresh logits rows and buffers
     * touched for the first time measured 2-3x a warm step) */
    if (!c->tv_seen[T]) {
        c->tv_seen[T] = 1;
        return;
    }
    *cold = 0;
    const double u = conv1(c);
    if (u <= 0.0) /* (the batch's cost is measured: time_verify_batch) */
        return;
    double r = seconds / (t1_now(c) * u);
    if (c->tv_n[T] >= CTL_FLOOR_N) {
        const double o = r / c->tv[T];
        c->speed *= 1.0 + CTL_SPEED_RATE * ((o > 1.5 ? 1.5 : o) - 1.0);
        r = seconds / (t1_now(c) * u);
    }
    if (c->tv_n[T] == 0) { /* a first measurement counts at most 1.5 times the estimate */
        const double e = est_ratio(c, T);
        r = r > 1.5 * e ? 1.5 * e : r;
    }
    track(&c->tv[T], c->tv_n[T], r);
    if (c->tv_n[T] < 1000000)
        c->tv_n[T]++;
}

/* A verify step of na sequences with m nodes each that took `seconds`: the curve by total
 * tokens, and its cost over a plain step at this batch size (where that is measured). */
static void time_verify_batch(st_ctl *c, int32_t na, int32_t m, double seconds) {
    int cold;
    time_verify_tokens(c, (int64_t)na * m, seconds, &cold);
    if (cold || na < 1 || na > c->bs || m < 2 || m > c->N || c->t1b_n[na] == 0)
        return;
    const size_t i = (size_t)na * (size_t)(c->N + 1) + (size_t)m;
    track(&c->cvb[i], c->cvb_n[i], seconds / ((double)na * c->t1b[na]));
    if (c->cvb_n[i] < 1000000)
        c->cvb_n[i]++;
}

void st_ctl_time_verify(st_ctl *c, int64_t T, double seconds) {
    if (T >= 2 && T <= c->N)
        time_verify_batch(c, 1, (int32_t)T, seconds);
    else {
        int cold;
        time_verify_tokens(c, T, seconds, &cold);
    }
}

void st_ctl_time_plain_batch(st_ctl *c, int32_t na, double seconds) {
    if (na < 1 || !(seconds > 0.0))
        return;
    c->t1 = t1_now(c);
    c->speed = 1.0;
    track_cost(&c->t1, c->t1_n, seconds / (double)na);
    c->t1_n++;
    if (na <= ST_GEN_MAX_BATCH) {
        track_cost(&c->t1b[na], c->t1b_n[na], seconds / (double)na);
        c->t1b_n[na]++;
    }
}

double st_ctl_t1(const st_ctl *c) { return c->t1; }

void st_ctl_draft_cost(st_ctl *c, int64_t K, int64_t S, double catch_s, int64_t rows,
                       double levels_s) {
    if (!c->autotune || !(catch_s > 0.0) || K < 1 || K > ST_SPEC_MAX_K || !(c->t1 > 0.0))
        return;
    if (c->probing)
        c->probe_spent += (catch_s + (levels_s > 0.0 ? levels_s : 0.0)) / t1_now(c);
    catch_s /= seq_unit(c); /* in one sequence's plain-token times from here on */
    levels_s /= seq_unit(c);
    if (rows >= CTL_PROBE_ROWS) {
        track_cost(&c->c_row, c->c_row_n, catch_s / (double)rows);
        c->c_row_n++;
    }
    /* the first proposal runs cold (the head's weights and buffers touched for the first time,
     * the whole prompt caught up): not measured; the next one (same shape) is */
    if (!c->draft_seen) {
        c->draft_seen = 1;
        return;
    }
    /* A long catch-up (a sequence's first proposal, over its prompt; a probe after plain steps)
     * measures a row's cost above, not a drafting step's catch-up. (In a server's warm-up on a
     * 768-wide target with EAGLE, catch-ups of 30-68 rows, 1.2 plain tokens each, were
     * averaged into a step's catch-up of 0.2.) */
    if (rows < CTL_PROBE_ROWS)
        track_cost(&c->c_catch, c->c_catch_n++, catch_s);
    if (S > 1 && levels_s > 0.0) {
        track_cost(&c->c_level[K], c->c_level_n[K], levels_s / (double)(S - 1));
        c->c_level_n[K]++;
    }
}

void st_ctl_step_end(st_ctl *c, int drafted, int32_t n, int32_t na, int64_t emitted, double t_step,
                     double t_fwd) {
    c->step++;
    if (!c->autotune)
        return;
    for (int64_t s = 0; s <= ST_SPEC_MAX_S; s++) {
        c->rho_tok[s] *= CTL_RHO_DECAY;
        c->rho_pred[s] *= CTL_RHO_DECAY;
    }
    /* a probe's loss: its time beyond what plain steps would take for the tokens it emitted */
    const int vp = c->vprobe && n > 1;
    if (c->t1 > 0.0 && t_step > 0.0) {
        c->t_total += t_step / t1_now(c);
        c->t_recent = CTL_BUDGET_FADE * c->t_recent + t_step / t1_now(c);
        c->loss_recent *= CTL_BUDGET_FADE;
        if (c->vprobe && n > 1) {
            const double loss = t_step / t1_now(c) - (double)emitted * batch_f(c, na);
            c->vprobe_loss += loss > 0.0 ? loss : 0.0;
            c->loss_recent += loss > 0.0 ? loss : 0.0;
        }
    }
    c->vprobe = 0;
    /* What drafting realized at this batch size (a gate probe's loss against the budget): its
     * drafted steps, those that ended plain included, whose proposals cost time too. (NGRAM
     * judged by its trees alone on stories260K at 8 sequences, where its trees about broke even
     * and a proposal cost 4% of a step: 1906 of 19,000 steps proposed, 245 trees; judged by all
     * its drafted steps: 204 and 34.) */
    if (drafted && (!c->model_drafter || !c->probing) && na >= 2 && na <= ST_GEN_MAX_BATCH &&
        na <= c->bs && t_step > 0.0 && c->t1 > 0.0 && c->t1b_n[na] > 0) {
        const int b = gate_bucket(na);
        const double tp = c->gp_tok[na] > 0.0 ? c->gp_s[na] / c->gp_tok[na] : c->t1b[na];
        if (c->gz_w[b] * pow(CTL_GATE_FADE, (double)(c->step - 1 - c->gz_step[b])) <
            CTL_GATE_FORGET)
            c->gz_n[b] = 0;
        gate_add(&c->gz_tok[b], &c->gz_s[b], &c->gz_w[b], &c->gz_step[b], c->step, (double)emitted,
                 t_step / tp);
        c->gz_n[b] += c->gz_n[b] < INT32_MAX;
    }
    /* a gate probe's loss (its proposals' too, whether they became a tree or not) */
    if (drafted && c->gprobe && !vp && na >= 2 && na <= ST_GEN_MAX_BATCH && na <= c->bs &&
        t_step > 0.0 && c->t1 > 0.0) { /* (a verify probe's loss is counted above) */
        const double tp = c->gp_tok[na] > 0.0 ? c->gp_s[na] / c->gp_tok[na] : c->t1b[na],
                     loss = (t_step - (double)emitted * tp) / t1_now(c);
        c->vprobe_loss += loss > 0.0 ? loss : 0.0;
        c->loss_recent += loss > 0.0 ? loss : 0.0;
    }
    c->gprobe = 0;
    if (n == 1 && emitted > 0 && na >= 2 && na <= ST_GEN_MAX_BATCH && na <= c->bs && t_fwd > 0.0)
        gate_add(&c->gp_tok[na], &c->gp_s[na], &c->gp_w[na], &c->gp_step[na], c->step,
                 (double)emitted, t_fwd);
    if (drafted && na >= 1 && c->t1 > 0.0 && t_step > t_fwd && t_fwd >= 0.0) {
        const double x = (t_step - t_fwd) / (double)na / seq_unit(c);
        track(&c->prop_r, c->prop_rn, x);
        c->prop_rn++;
    }
    if (drafted) {
        c->last_draft = c->step;
        if (na >= 1 && na <= ST_GEN_MAX_BATCH)
            c->idle[na] = n > 1 ? 0 : c->idle[na] + (c->idle[na] < INT32_MAX);
        if (t_step > 0.0) {
            double f = (t_step - t_fwd) / t_step;
            f = f < 0.0 ? 0.0 : f > 1.0 ? 1.0 : f;
            c->prop_frac +=
                (c->prop_n < 8 ? 1.0 / (double)(c->prop_n + 1) : 0.1) * (f - c->prop_frac);
            c->prop_n++;
        }
    }
    /* a planned shape's realized speed-up: tokens per plain-token time of its steps (decayed
     * sums; a step counts at most 1.5 times the shape's mean step), for one sequence (a batch's
     * drafting is judged by the gate, against plain steps of its size: a batch of 4 whose trees
     * lost took this factor to its floor, and one request after it did not draft for 200 steps) */
    if (drafted && c->model_drafter && !c->probing && na == 1 && c->t1 > 0.0 && t_step > 0.0 &&
        conv1(c) > 0.0) {
        const int64_t K = c->dk, S = c->ds;
        double x = t_step / (t1_now(c) * conv1(c));
        const double mean = c->rz_w[K][S] > 0.0 ? c->rz_cost[K][S] / c->rz_w[K][S] : 0.0;
        if (c->rz_w[K][S] >= 3.0 && x > 1.5 * mean)
            x = 1.5 * mean;
        c->rz_tok[K][S] = CTL_RZ_DECAY * c->rz_tok[K][S] + (double)emitted;
        c->rz_cost[K][S] = CTL_RZ_DECAY * c->rz_cost[K][S] + x;
        c->rz_w[K][S] = CTL_RZ_DECAY * c->rz_w[K][S] + 1.0;
        c->rz_step[K][S] = c->step;
        if (c->pred[K][S] > 0.0) {
            c->rho_tok[0] += (double)emitted;
            c->rho_pred[0] += c->pred[K][S] * x;
            c->rho_tok[S] += (double)emitted;
            c->rho_pred[S] += c->pred[K][S] * x;
        }
    }
    if (n == 1) {
        if (emitted > 0)
            st_ctl_time_plain_batch(c, na, t_fwd);
        c->last_plain = c->step;
    } else {
        time_verify_batch(c, na, n, t_fwd);
    }
}
