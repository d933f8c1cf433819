/*
 * ctl_decide.c: the `auto` controller's decisions (docs/AUTO.md): whether to draft this step
 * (st_ctl_want_draft: the plan, the probes' budget, and for a batch the evidence of what
 * drafting realized at that batch size) and how many tree tokens to verify (st_ctl_choose).
 */
#include "ctl/ctl_internal.h"

#include <math.h>

static int want_draft(st_ctl *c, int32_t na, int64_t *K, int64_t *S);

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
 * moves between nearby sizes all the time); its steps are in plain-token times of their own
 * batch size. */
int st_ctl_gate_bucket(int32_t na) {
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
    const int b = st_ctl_gate_bucket(na);
    const double w = c->gz_w[b] * pow(CTL_GATE_FADE, (double)(c->step - c->gz_step[b]));
    if (c->gz_n[b] < CTL_GATE_MIN || w < CTL_GATE_REJUDGE || !(c->gz_tok[b] > 0.0))
        return GATE_UNKNOWN;
    return c->gz_s[b] < c->gz_tok[b] ? GATE_OPEN : GATE_CLOSED; /* (in plain-token times) */
}

/* Adds a step of `tok` tokens in t seconds to decayed sums (each step's time a token counting at
 * most 1.5 times their mean once CTL_GATE_MIN steps are in: a preempted step; per token, since
 * the steps judged together emit from one token a sequence to a tree's worth). */
void st_ctl_gate_add(double *stok, double *ss, double *sw, int64_t *sstep, int64_t step, double tok,
                     double t) {
    const double cap = *stok > 0.0 ? CTL_OUTLIER * tok * *ss / *stok : 0.0,
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
     * judged to lose, and where they are not judged yet as a probe */
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
     * shrink per token as a forward's does. */
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
     * end plain included. */
    if (!c->model_drafter && na >= 1 && na <= ST_GEN_MAX_BATCH && c->idle[na] >= CTL_IDLE_AFTER) {
        double k = ceil(c->prop_frac / CTL_PROP_SHARE);
        k = k < 1.0 ? 1.0 : k > CTL_PROP_SKIP_MAX ? CTL_PROP_SKIP_MAX : k;
        if ((double)(c->step - c->last_draft + 1) < k)
            return 0;
    }
    if (!c->model_drafter)
        return 1;
    /* a model drafter only drafts once t1 is known (its drafts cost time before they can be
     * judged), from two plain steps: the first after the prompt runs cold (fresh KV rows and
     * buffers) and every cost is a ratio
     * to t1 (the smallest of the first measurements). Its first CTL_FIRST proposals (chains of
     * at most 4, in a row) measure what drafting costs and start the calibration. */
    if (c->t1_n < CTL_T1_FIRST)
        return 0;
    c->probing = 0;
    /* (the first, cold proposal is not measured) A batch's first steps of one sequence start
     * the same way: the verify costs of one sequence are measured only from them (see conv1),
     * and a server warmed up by a batch has none (left to probes, measuring them takes most of a
     * thousand steps). Not before
     * one sequence's plain step is timed: nothing could be measured. */
    c->first1_now = c->c_catch_n >= CTL_FIRST - 1 && na == 1 && c->bs > 1 &&
                    c->first1 < CTL_FIRST - 1 && st_ctl_conv1(c) > 0.0;
    c->first1 += c->first1_now;
    if (c->c_catch_n < CTL_FIRST - 1 || c->first1_now) {
        c->dk = *K = c->k_auto ? 1 : c->K;
        c->ds = *S = c->s_auto && c->S > CTL_FIRST_S ? CTL_FIRST_S : c->S;
        c->probing = 1;
        return 1;
    }
    /* the plan is renewed every CTL_REPLAN steps (its inputs move slowly), every 4 times as
     * many while no shape pays (only t1 moves then) */
    if (c->pn == 0 || c->step - c->plan_step >=
                          (c->pgain >= CTL_PLAN_MIN_GAIN ? 1 : CTL_REPLAN_IDLE) * CTL_REPLAN) {
        c->plan_step = c->step;
        st_ctl_plan(c, na);
    }
    *K = c->dk = c->pk, *S = c->ds = c->ps;
    if (c->pgain >= CTL_PLAN_MIN_GAIN)
        return 1;
    /* No shape pays. A probe now and then keeps the calibration following the text, within a
     * budget: all probes together cost at most CTL_PROBE_BUDGET of the plain decoding time so
     * far. A probe first catches each sequence's drafter up on every token since its last
     * proposal (a new request's: its whole text), so on one long text a drafter whose rows
     * cost more than the budget's share of a token (a head as wide as a small target) is not
     * probed again; a server's requests end, and their catch-ups with them. The first probe,
     * CTL_PROBE_ROWS steps after the last draft, measures what a caught-up row costs. A drafter
     * predicted far from paying (below CTL_PROBE_MIN_GAIN) is not probed. */
    const int64_t since = c->step - c->last_draft;
    if (c->pgain < CTL_PROBE_MIN_GAIN || since < (c->c_row_n ? CTL_PROBE_EVERY : CTL_PROBE_ROWS))
        return 0;
    int64_t rows = 0;
    for (int32_t b = 0; b < c->bs; b++)
        rows += c->seq_len[b] > c->seq_from[b] ? c->seq_len[b] - c->seq_from[b] : 0;
    const double cost = ((double)rows * c->c_row +
                         (double)(na > 1 ? na : 1) *
                             (c->c_catch + (double)(c->ps - 1) * st_ctl_level_cost(c, c->pk))) *
                        st_ctl_batch_f(c, 1);
    if (c->c_row_n && c->probe_spent + cost > CTL_PROBE_BUDGET * (double)c->step)
        return 0;
    c->probing = 1;
    return 1;
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
    const double f = st_ctl_batch_f(c, na),
                 cp = c->prop_rn ? c->prop_r * st_ctl_batch_f(c, 1) / f : 0.0;
    int32_t best = 1;
    double bg = CTL_TREE_MIN_GAIN;
    double g[ST_SPEC_MAX_N + 1];
    int meas[ST_SPEC_MAX_N + 1], ol_meas = 0;
    for (int32_t m = 2; m <= mmax; m++) {
        double tok = 0.0;
        for (int32_t a = 0; a < na; a++)
            tok += 1.0 + c->E[(size_t)a * (size_t)(c->N + 1) + m];
        const double cv = st_ctl_verify_cost(c, na, m, &meas[m]);
        g[m] = tok / ((double)na * (cv + cp));
        /* the outlook: the best measured size, as the choice below (else the best estimate) */
        if (m == 2 || (meas[m] && !ol_meas) || (meas[m] == ol_meas && g[m] > c->ol.speedup)) {
            c->ol.known = 1;
            c->ol.speedup = g[m], c->ol.tree_n = m, c->ol.verify_cost = cv + cp;
            c->ol.accept = tok / (double)na - 1.0;
            ol_meas = meas[m];
        }
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
     * realized less than plain steps at this batch size, plain steps, but for the probes. */
    if (best > 1 && !c->model_drafter) {
        const int gt = gate(c, na);
        if (gt == GATE_CLOSED || gt == GATE_STALE)
            best = 1;
        else if (gt == GATE_UNKNOWN && !budget_ok(c)) /* not judged yet: a probe */
            best = 1;
    }
    if (best > 1) {
        *exp_gain = bg;
        c->ol_pay = c->step;
    }
    return best;
}
