/*
 * ctl_internal.h: the `auto` controller's state and constants, shared by its two halves:
 * ctl.c (the drafting policy, the plan, the choice of the tree size, the timing) and
 * ctl_rank.c (the ranking of each step's candidates and the calibration from their shadows).
 */
#ifndef ST_CTL_INTERNAL_H
#define ST_CTL_INTERNAL_H

#include "ctl/ctl.h"

#include "spectree.h"

enum {
    CTL_CLASSES = 16,
    CTL_DEPTHS = 8,
    CTL_BINS = 5,
    CTL_NB = CTL_CLASSES * CTL_DEPTHS * CTL_BINS,
    CTL_RING = 20, /* pending shadows per sequence (a proposal is scored after S more tokens) */
    CTL_PLAIN_EVERY = 64,   /* under auto, a plain step at least this often keeps t1 fresh */
    CTL_PROBE_EVERY = 32,   /* a model drafter that does not pay probes at most this often */
    CTL_PROBE_ROWS = 16,    /* rows of the catch-up that measures a row's cost */
    CTL_FIRST = 4,          /* a model drafter's first proposals, whatever the plan */
    CTL_EXPLORE_EVERY = 8,  /* one plan in this many tries a shape next to the best */
    CTL_REPLAN = 4,         /* steps a plan is kept */
    CTL_QD = ST_SPEC_MAX_S, /* depth x sibling-rank acceptance cells */
    CTL_QK = ST_SPEC_MAX_K,
    CTL_PROP_SKIP_MAX = 16, /* proposals that do not pay: at least one step in this many */
    CTL_FLOOR_N = 3,        /* measurements of a verify size that bound the larger ones */
};

/* Proposals that keep not paying may cost this share of the steps' time. */
#define CTL_PROP_SHARE 0.01

/* Prior of a bucket: a fraction of the drafter's own score, worth this many observations. */
#define CTL_PRIOR_SCALE 0.6
#define CTL_PRIOR_WEIGHT 2.0
/* Prior of an unseen depth/rank cell: the cell above (d-1, same rank 0) for rank 0 (0.5 at
 * depth 1), this fraction of the cell beside it (rank r-1) for others; worth this many
 * observations. An unmeasured level pass of K nodes costs that of k < K nodes times
 * (1 + CTL_LEVEL_SLOPE * (K - k)). A plan must promise this much to draft. */
#define CTL_Q_PRIOR_RANK 0.15
#define CTL_Q_PRIOR_WEIGHT 2.0
#define CTL_LEVEL_SLOPE 0.1
#define CTL_PLAN_MIN_GAIN 1.02
#define CTL_PLAN_MARGIN 0.02 /* what a dearer pool must promise more than a cheaper one */
#define CTL_PROBE_BUDGET 0.01
#define CTL_PROBE_MIN_GAIN 0.8 /* probes are for drafters predicted near paying */
/* A pool's predicted speed-up is blended with its realized one (decayed by this per step of
 * that pool), the prediction worth CTL_RZ_PRIOR steps. */
#define CTL_RZ_DECAY 0.9
#define CTL_RZ_PRIOR 2.0
/* ... and its weight fades by this per step since its last update (old measurements, made
 * when the machine was busier or the text different, give way to the prediction) */
#define CTL_RZ_FADE 0.97
/* The realized-over-predicted ratio of all planned pools: its sums decay by this every step
 * (drafted or not: a ratio that stopped all drafting fades, and the plan tries again), and a
 * prior of 1 is worth this many tokens; that of the pools of one depth has the ratio of all as
 * its prior, worth this many predicted tokens. */
#define CTL_RHO_DECAY 0.97
#define CTL_RHO_PRIOR 4.0
#define CTL_RHO_DEPTH_PRIOR 8.0
/* Prior verify cost of T tokens in plain-token times (a measured size's estimate is its
 * measurements' average blended with this, worth one measurement). */
#define CTL_PRIOR_SLOPE 0.6
#define CTL_SPEED_RATE 0.1 /* see t1_now */
/* A tree must promise this speed-up over a plain step, its verify cost at this batch size
 * measured (CTL_TREE_MIN_GAIN). A size not measured yet at a batch size, or one next to the best
 * that comes within CTL_REPROBE_NEAR of it (one step in CTL_REPROBE_EVERY), is verified as a
 * probe; probes may lose, beyond what plain steps would take for the tokens they emit, at most
 * CTL_VPROBE_BUDGET of all steps' time plus CTL_VPROBE_ALLOW plain-token times. */
#define CTL_TREE_MIN_GAIN 1.03
#define CTL_PROBE_NEAR 0.7
#define CTL_REPROBE_NEAR 0.85
#define CTL_REPROBE_EVERY 16
#define CTL_VPROBE_BUDGET 0.01
#define CTL_VPROBE_ALLOW 8.0
#define CTL_BUDGET_FADE 0.998 /* per step, of the time and the probes' loss the budget weighs */
#define CTL_PRIOR_RATIO(T) (1.0 + CTL_PRIOR_SLOPE * (double)((T)-1))
/* Drafting at a batch size is judged by what it realized there: decayed sums (by this per
 * drafted step of that size, each step's time a token counting at most 1.5 times their
 * mean) of the tokens
 * and seconds of its drafted steps, against those of its recent plain steps. Their weight
 * fades by CTL_GATE_FADE per step since the last drafted step of that size. Before
 * CTL_GATE_MIN drafted steps, or once their weight is below CTL_GATE_REJUDGE (about 135 steps
 * after a probe), drafting there is a probe, whose loss counts against the probes' budget
 * (CTL_VPROBE_BUDGET); below CTL_GATE_FORGET the evidence is forgotten (drafting is judged
 * anew). */
#define CTL_GATE_DECAY 0.9
#define CTL_GATE_FADE 0.99
#define CTL_GATE_MIN 3
#define CTL_GATE_REJUDGE 0.5
#define CTL_GATE_FORGET 0.15
#define CTL_GATE_PLAIN_MIN 0.3 /* plain steps' weight below which one is run first */
#define CTL_GATE_BUCKETS 8     /* 2, 3-4, 5-8, ..., 33-64 sequences (gate_bucket) */

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
     * wrong by their ratio: measured at 1 and read at 8, 3.5x too cheap on a 768-wide target) */
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
     * once (after 1500 steps of one and two sequences, a server's first round at 4 spent 13%
     * of its time on probes) */
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
};

#endif /* ST_CTL_INTERNAL_H */
