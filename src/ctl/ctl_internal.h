/*
 * ctl_internal.h: the `auto` controller's state and the functions its files share: ctl.c (its
 * life and what each step teaches it), ctl_decide.c (whether to draft, the tree size),
 * ctl_cost.c (the costs in one time unit), ctl_plan.c (the pool planner), ctl_rank.c (the
 * ranking of each step's candidates and the calibration from their shadows). Its constants are
 * ctl_const.h's.
 */
#ifndef ST_CTL_INTERNAL_H
#define ST_CTL_INTERNAL_H

#include "ctl/ctl.h"
#include "ctl/ctl_const.h"

#include "spectree.h"

typedef struct shadow {
    int64_t n0; /* history length when proposed: a depth-d node predicts hist[n0 + d - 1] */
    int32_t cnt, maxd, used;
} shadow;

struct st_ctl {
    int32_t bs, N;
    int64_t K, S, Mmax;
    int autotune; /* 0: a fixed shape, verified as drafted (no ranking, timing or planning) */
    /* drafting policy of a drafter that costs time before the choice (a draft model) */
    int model_drafter;
    int off;                     /* never draft (a draft model too dear to pay) */
    int k_auto, s_auto;          /* the planner chooses K / S (a model drafter under auto) */
    int64_t step, last_plain;    /* steps so far; the last plain step */
    int64_t last_draft, planned; /* the last drafted step; plans made so far */
    /* drafting that does not pay: per batch size, drafted steps in a row whose choice was
     * plain; the share of a drafted step's time spent before the choice (proposing and
     * ranking; a moving average) */
    int32_t idle[ST_GEN_MAX_BATCH + 1];
    int64_t prop_n;
    double prop_frac;
    int64_t plan_step; /* when the last plan was made */
    int probing;       /* the proposal under way is a probe */
    int64_t dk, ds;    /* the pool drafted this step */
    /* realized speed-up of each planned pool: decayed sums of emitted tokens, of the steps'
     * times in plain-token times, and of the steps */
    double rz_tok[ST_SPEC_MAX_K + 1][ST_SPEC_MAX_S + 1];
    double rz_cost[ST_SPEC_MAX_K + 1][ST_SPEC_MAX_S + 1];
    double rz_w[ST_SPEC_MAX_K + 1][ST_SPEC_MAX_S + 1];
    int64_t rz_step[ST_SPEC_MAX_K + 1][ST_SPEC_MAX_S + 1]; /* the step of its last update */
    /* the model's prediction for each pool at the last plan, and how the planned pools'
     * realized tokens compare with it: decayed sums of tokens emitted and of tokens predicted
     * for the same time (costs the model does not see make every prediction optimistic alike,
     * which must not favour the pools never drafted over those measured) */
    double pred[ST_SPEC_MAX_K + 1][ST_SPEC_MAX_S + 1];
    double rho_tok[ST_SPEC_MAX_S + 1], rho_pred[ST_SPEC_MAX_S + 1]; /* [0] all, [S] depth S */
    double probe_spent; /* what the probes have cost so far, in plain-token times */
    /* draft costs per sequence in one sequence's plain-token times (seq_unit: drafting is per
     * sequence, so unlike a forward's its time does not shrink per token with the batch; a
     * ratio to t1, the plain token of whatever batch ran last, read at another batch size is
     * wrong by their ratio) */
    double c_row; /* a caught-up row (catch-ups of >= 16 rows) */
    int64_t c_row_n;
    int64_t pk, ps; /* the last plan: pool, tree size, predicted speed-up */
    int32_t pn;
    double pgain;
    double q_seen[CTL_QD][CTL_QK]; /* depth x sibling rank: nodes whose parent was accepted */
    double q_acc[CTL_QD][CTL_QK];  /* ... and those accepted among them */
    int draft_seen;                /* a first (unmeasured) proposal was made */
    double c_catch;                /* a catch-up (moving average) */
    int64_t c_catch_n;
    double c_level[ST_SPEC_MAX_K + 1]; /* a level pass of K nodes */
    int64_t c_level_n[ST_SPEC_MAX_K + 1];
    void *mem; /* the one allocation of the arrays below */
    double seen[CTL_NB], acc[CTL_NB];
    /* this step's ranking, per active slot: candidate of each ranked node, its bucket, depth,
     * parent (ranked index, -1 the root, -2 none), estimated path acceptance; E[m]: expected
     * accepted nodes among the first m-1; avail: ranked nodes */
    int64_t *order;  /* (bs, N-1) */
    int32_t *bucket; /* (bs, N-1) */
    int32_t *depth;  /* (bs, N-1) */
    int32_t *par;    /* (bs, N-1) */
    int32_t *tok;    /* (bs, N-1) */
    int32_t *rank;   /* (bs, N-1) the node's rank among its parent's children */
    double *E;       /* (bs, N+1) */
    int32_t *avail;  /* (bs) */
    /* per slot: its history's length at its last proposal and now (0 and 0 once it is done: a
     * new request's first proposal catches up on its whole text) */
    int64_t *seq_from, *seq_len; /* (bs) */
    int32_t *map;                /* (Mmax) candidate -> ranked index, -1 */
    int64_t *fin;                /* (Mmax) finite candidates */
    /* shadows: (bs, CTL_RING) records with (N-1) nodes each */
    shadow *sh;
    int32_t *sh_par, *sh_tok, *sh_bucket, *sh_depth, *sh_rank;
    /* timing: t1 over every plain step; t1b[na] over those of na sequences (a batch's plain
     * step costs less per token than one sequence's: the weights are read once for all) */
    double t1;
    int64_t t1_n;
    double speed;       /* the time of a step now over its time when t1 was measured (see t1_now) */
    int32_t first1;     /* a batch's model drafter: start-up proposals of one sequence (conv1) */
    int32_t first1_now; /* this step's proposal is one of them */
    double t1b[ST_GEN_MAX_BATCH + 1];
    int64_t t1b_n[ST_GEN_MAX_BATCH + 1];
    int64_t explore; /* near-paying steps seen (exploration counter) */
    /* per batch size: cvb[na * (N+1) + m], the time of a verify step of na sequences with m
     * nodes each over that of a plain step of na sequences, measured at that batch size
     * (cvb_n: measurements) */
    double *cvb;
    int32_t *cvb_n;
    /* proposing and ranking, per sequence, in seq_unit times (a moving average) */
    double prop_r;
    int64_t prop_rn;
    /* verify probes: all steps' time and the probes' loss, in plain-token times; whether the
     * tree chosen this step is a probe */
    double t_total, vprobe_loss;
    /* ... and both faded (CTL_BUDGET_FADE): the budget holds for the recent time too, so that
     * it is never a stash that a long paying stretch builds up and a new batch size spends at
     * once */
    double t_recent, loss_recent;
    int vprobe;
    /* per batch size: realized drafting (see CTL_GATE_DECAY); whether this step's drafting
     * is a probe of the gate */
    double gz_tok[CTL_GATE_BUCKETS], gz_s[CTL_GATE_BUCKETS], gz_w[CTL_GATE_BUCKETS];
    int64_t gz_step[CTL_GATE_BUCKETS];
    int32_t gz_n[CTL_GATE_BUCKETS]; /* drafted steps since the evidence was forgotten */
    /* ... and the plain steps it is weighed against, kept the same way */
    double gp_tok[ST_GEN_MAX_BATCH + 1], gp_s[ST_GEN_MAX_BATCH + 1], gp_w[ST_GEN_MAX_BATCH + 1];
    int64_t gp_step[ST_GEN_MAX_BATCH + 1];
    int gprobe;
    double *tv;       /* (Tmax + 1) */
    int32_t *tv_n;    /* (Tmax + 1) */
    uint8_t *tv_seen; /* (Tmax + 1) a first, unmeasured step of that size was made */
    int64_t Tmax;
    st_spec_outlook ol; /* the latest estimates of the best shape (st_ctl_outlook) */
    int64_t ol_pay;     /* the last step whose best shape paid */
};

/* ctl_decide.c: the gate's batch range of na sequences (2, 3-4, 5-8, ...). */
int st_ctl_gate_bucket(int32_t na);
/* ctl_decide.c: a step of tok tokens in t seconds into the gate's decayed sums. */
void st_ctl_gate_add(double *stok, double *ss, double *sw, int64_t *sstep, int64_t step, double tok,
                     double t);
/* ctl_plan.c: plans the pool (c->pk, c->ps, c->pn) for na sequences. */
void st_ctl_plan(st_ctl *c, int32_t na);
/* ctl_cost.c: seconds of a level pass of K nodes (measured or estimated). */
double st_ctl_level_cost(const st_ctl *c, int64_t K);
/* ctl_cost.c: a plain step of na sequences per token over t1 (1 when unknown). */
double st_ctl_batch_f(const st_ctl *c, int32_t na);
/* ctl_cost.c: a verify of na trees of m nodes over a plain step of na sequences;
 * *measured: at that batch size. */
double st_ctl_verify_cost(const st_ctl *c, int32_t na, int32_t m, int *measured);
/* ctl_cost.c: the moving average of times, outliers capped (CTL_OUTLIER). */
void st_ctl_track(double *v, int64_t n, double x);
/* ctl_cost.c: a plain token's time now (t1 times the machine's speed). */
double st_ctl_t1_now(const st_ctl *c);
/* ctl_cost.c: one sequence's plain token now, the unit of per-sequence draft costs. */
double st_ctl_seq_unit(const st_ctl *c);
/* ctl_cost.c: one sequence's plain token over t1 (-1 while never timed). */
double st_ctl_conv1(const st_ctl *c);
/* ctl_cost.c: a verify step of na trees of m nodes took seconds. */
void st_ctl_time_verify_batch(st_ctl *c, int32_t na, int32_t m, double seconds);

#endif /* ST_CTL_INTERNAL_H */
