/*
 * ctl_plan.c: the pool planner of the `auto` controller (docs/AUTO.md): the expected accepted
 * tokens of each draft pool (K, S) from the depth x rank acceptance table, the costs of drafting
 * and verifying it, and the choice of the pool with the best expected speed-up.
 */
#include "ctl/ctl_internal.h"

#include <math.h>
#include <string.h>

/* The depth x rank acceptance table q[(d-1) * CTL_QK + r] for d <= S, r < K, with priors. */
static void q_table(const st_ctl *c, int64_t K, int64_t S, double *q) {
    for (int64_t d = 0; d < S; d++)
        for (int64_t r = 0; r < K; r++) {
            const double prior = r > 0   ? CTL_Q_PRIOR_RANK * q[d * CTL_QK + r - 1]
                                 : d > 0 ? q[(d - 1) * CTL_QK]
                                         : CTL_Q_PRIOR_DEPTH1;
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

/* The best (K, S, N) for na sequences by predicted speed-up (into pk, ps, pn, pgain).
 * Every CTL_EXPLORE_EVERY-th planned draft, a shape one step deeper or wider than the best is
 * drafted instead when its prediction comes within 15% (its costs and deeper or wider cells
 * are measured only by drafting it). */
/* Realized over predicted tokens of the planned pools of depth S, in [0.5, 1.5]: shrunk
 * towards that of all planned pools (1 before any) by the evidence of depth S. Errors grow
 * with depth (an acceptance too high at one level is too high at every level below it), so a
 * deeper pool's shortfall says little about a shallower one. A depth never drafted takes the
 * factor of all (a pool not measured must not look better than those measured). */
static double rho(const st_ctl *c, int64_t S) {
    const double g = (c->rho_tok[0] + CTL_RHO_PRIOR) / (c->rho_pred[0] + CTL_RHO_PRIOR),
                 r = (c->rho_tok[S] + CTL_RHO_DEPTH_PRIOR * g) /
                     (c->rho_pred[S] + CTL_RHO_DEPTH_PRIOR);
    return r < CTL_RHO_MIN ? CTL_RHO_MIN : r > CTL_RHO_MAX ? CTL_RHO_MAX : r;
}

void st_ctl_plan(st_ctl *c, int32_t na) {
    double q[CTL_QD * CTL_QK], E[ST_SPEC_MAX_S * (ST_SPEC_MAX_N + 1)], ratio[ST_SPEC_MAX_N + 1];
    q_table(c, c->K, c->S, q);
    /* a verify step's time in plain-token times, from its cost at this batch size; the plain
     * step it is weighed against takes na * f */
    const double f = st_ctl_batch_f(c, na);
    int meas;
    for (int32_t n = 2; n <= c->N; n++)
        ratio[n] = st_ctl_verify_cost(c, na, n, &meas) * (double)na * f;
    const int64_t k_lo = c->k_auto ? 1 : c->K, s_lo = c->s_auto ? 1 : c->S;
    const int32_t nmax = c->N;
    double best = -1.0, alt = -1.0, bdraft = 0.0;
    int64_t bk = c->K, bs = c->S, ak = 0, as = 0;
    int32_t bn = 2, an = 2;
    const int try_alt = ++c->planned % CTL_EXPLORE_EVERY == 0;
    for (int64_t K = k_lo; K <= c->K; K++) {
        tree_expect_levels(q, CTL_QK, K, c->S, nmax, E);
        const double lc = st_ctl_level_cost(c, K);
        for (int64_t S = s_lo; S <= c->S; S++) {
            /* pass 1: the shapes one level deeper or one candidate wider than the best */
            const int64_t M = st_tree_n_candidates(K, S);
            const int32_t nm = (int32_t)(M + 1 < nmax ? M + 1 : nmax);
            const double *e = E + (S - 1) * (nmax + 1);
            const double draft =
                (double)na * (c->c_catch + (double)(S - 1) * lc) * st_ctl_batch_f(c, 1);
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
    c->ol.known = 1;
    c->ol.speedup = best, c->ol.tree_n = bn, c->ol.level_cost = st_ctl_level_cost(c, bk);
    c->ol.verify_cost = ratio[bn] / ((double)na * f);
    tree_expect_levels(q, CTL_QK, bk, bs, nmax, E);
    c->ol.accept = E[(bs - 1) * (nmax + 1) + bn];
    if (best >= CTL_PLAN_MIN_GAIN)
        c->ol_pay = c->step;
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
        const double draft = (double)na * (c->c_catch + (double)(S - 1) * st_ctl_level_cost(c, K)) *
                             st_ctl_batch_f(c, 1);
        for (int32_t n = 2; n <= nm; n++) {
            const double g = (double)na * f * (1.0 + e[n]) / (draft + ratio[n]);
            if (g > c->pred[K][S] || n == 2)
                c->pred[K][S] = g;
            if (g * rho(c, S) > alt)
                alt = g * rho(c, S), ak = K, as = S, an = n;
        }
    }
    if (alt > CTL_EXPLORE_NEAR * best) {
        c->pk = ak, c->ps = as, c->pn = an;
        c->plan_step -= CTL_REPLAN - 1; /* for one step only */
    }
}

void st_ctl_last_plan(const st_ctl *c, int64_t *K, int64_t *S, int32_t *N, double *gain) {
    *K = c->pk, *S = c->ps, *N = c->pn, *gain = c->pgain;
}
