/*
 * ctl.c: the `auto` controller's life (see ctl.h and docs/AUTO.md): its one planned block, and
 * what each step teaches it (st_ctl_step_end: the step's time into the cost curves, its tokens
 * into the drafting evidence). The decisions are ctl_decide.c's, the costs and their time unit
 * ctl_cost.c's, the pool planner ctl_plan.c's, the ranking ctl_rank.c's.
 */
#include "ctl/ctl_internal.h"

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
    if (autotune && draft_weight_ratio > CTL_OFF_WEIGHT_RATIO)
        c->off = 1;
    c->ol.weight_ratio = draft_weight_ratio;
    c->ol.weight_off = c->off;
    c->ol.known = c->off;
    c->ol_pay = -CTL_OUTLOOK_STEPS;
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

void st_ctl_outlook(const st_ctl *c, st_spec_outlook *out) {
    memset(out, 0, sizeof *out);
    if (!c || !c->autotune)
        return;
    *out = c->ol;
    out->drafting = c->ol.known && !c->off && c->step - c->ol_pay < CTL_OUTLOOK_STEPS;
}

void st_ctl_auto_shape(st_ctl *c, int k_auto, int s_auto) {
    c->k_auto = c->autotune && c->model_drafter && k_auto;
    c->s_auto = c->autotune && c->model_drafter && s_auto;
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
        c->t_total += t_step / st_ctl_t1_now(c);
        c->t_recent = CTL_BUDGET_FADE * c->t_recent + t_step / st_ctl_t1_now(c);
        c->loss_recent *= CTL_BUDGET_FADE;
        if (c->vprobe && n > 1) {
            const double loss = t_step / st_ctl_t1_now(c) - (double)emitted * st_ctl_batch_f(c, na);
            c->vprobe_loss += loss > 0.0 ? loss : 0.0;
            c->loss_recent += loss > 0.0 ? loss : 0.0;
        }
    }
    c->vprobe = 0;
    /* What drafting realized at this batch size (a gate probe's loss against the budget): its
     * drafted steps, those that ended plain included, whose proposals cost time too (docs/AUTO.md,
     * "drafting in a batch"). */
    if (drafted && (!c->model_drafter || !c->probing) && na >= 2 && na <= ST_GEN_MAX_BATCH &&
        na <= c->bs && t_step > 0.0 && c->t1 > 0.0 && c->t1b_n[na] > 0) {
        const int b = st_ctl_gate_bucket(na);
        const double tp = c->gp_tok[na] > 0.0 ? c->gp_s[na] / c->gp_tok[na] : c->t1b[na];
        if (c->gz_w[b] * pow(CTL_GATE_FADE, (double)(c->step - 1 - c->gz_step[b])) <
            CTL_GATE_FORGET)
            c->gz_n[b] = 0;
        st_ctl_gate_add(&c->gz_tok[b], &c->gz_s[b], &c->gz_w[b], &c->gz_step[b], c->step,
                        (double)emitted, t_step / tp);
        c->gz_n[b] += c->gz_n[b] < INT32_MAX;
    }
    /* a gate probe's loss (its proposals' too, whether they became a tree or not) */
    if (drafted && c->gprobe && !vp && na >= 2 && na <= ST_GEN_MAX_BATCH && na <= c->bs &&
        t_step > 0.0 && c->t1 > 0.0) { /* (a verify probe's loss is counted above) */
        const double tp = c->gp_tok[na] > 0.0 ? c->gp_s[na] / c->gp_tok[na] : c->t1b[na],
                     loss = (t_step - (double)emitted * tp) / st_ctl_t1_now(c);
        c->vprobe_loss += loss > 0.0 ? loss : 0.0;
        c->loss_recent += loss > 0.0 ? loss : 0.0;
    }
    c->gprobe = 0;
    if (n == 1 && emitted > 0 && na >= 2 && na <= ST_GEN_MAX_BATCH && na <= c->bs && t_fwd > 0.0)
        st_ctl_gate_add(&c->gp_tok[na], &c->gp_s[na], &c->gp_w[na], &c->gp_step[na], c->step,
                        (double)emitted, t_fwd);
    if (drafted && na >= 1 && c->t1 > 0.0 && t_step > t_fwd && t_fwd >= 0.0) {
        const double x = (t_step - t_fwd) / (double)na / st_ctl_seq_unit(c);
        st_ctl_track(&c->prop_r, c->prop_rn, x);
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
                (c->prop_n < CTL_PROP_FIRST ? 1.0 / (double)(c->prop_n + 1) : CTL_PROP_RATE) *
                (f - c->prop_frac);
            c->prop_n++;
        }
    }
    /* a planned shape's realized speed-up: tokens per plain-token time of its steps (decayed
     * sums; a step counts at most 1.5 times the shape's mean step), for one sequence (a batch's
     * drafting is judged by the gate, against plain steps of its size) */
    if (drafted && c->model_drafter && !c->probing && na == 1 && c->t1 > 0.0 && t_step > 0.0 &&
        st_ctl_conv1(c) > 0.0) {
        const int64_t K = c->dk, S = c->ds;
        double x = t_step / (st_ctl_t1_now(c) * st_ctl_conv1(c));
        const double mean = c->rz_w[K][S] > 0.0 ? c->rz_cost[K][S] / c->rz_w[K][S] : 0.0;
        if (c->rz_w[K][S] >= CTL_RZ_MIN_W && x > CTL_OUTLIER * mean)
            x = CTL_OUTLIER * mean;
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
        st_ctl_time_verify_batch(c, na, n, t_fwd);
    }
}
