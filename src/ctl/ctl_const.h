/*
 * ctl_const.h: every constant of the `auto` controller, in one table (docs/AUTO.md: the rules
 * they parameterize and the measurements behind them). Units:
 *   ptok   one sequence's plain token time, the controller's one time unit (ctl_cost.c)
 *   x      a ratio (a speed-up, a share of time, a factor on an estimate)
 *   /step  a factor applied once per engine step (decays and fades)
 *   steps  engine steps;  obs  observations (the weight of a prior);  n  a count
 */
#ifndef ST_CTL_CONST_H
#define ST_CTL_CONST_H

#include "spectree.h"

// clang-format off
/* name                       value          unit   what */
/* -- calibration of acceptance (ctl_rank.c) -- */
#define CTL_CLASSES           16            /* n     drafter confidence classes */
#define CTL_DEPTHS            8             /* n     depths calibrated per class */
#define CTL_BINS              5             /* n     drafter score bins (CTL_BIN_*) */
#define CTL_NB                (CTL_CLASSES * CTL_DEPTHS * CTL_BINS) /* n  buckets */
#define CTL_BIN_1             0.8f          /* x     score bin bounds, highest first */
#define CTL_BIN_2             0.5f
#define CTL_BIN_3             0.25f
#define CTL_BIN_4             0.1f
#define CTL_RING              20            /* n     pending shadows per sequence */
#define CTL_PRIOR_SCALE       0.6           /* x     a bucket's prior: this share of the score */
#define CTL_PRIOR_WEIGHT      2.0           /* obs   ... worth this many observations */
#define CTL_QD                ST_SPEC_MAX_S /* n     depth x sibling-rank acceptance cells */
#define CTL_QK                ST_SPEC_MAX_K
#define CTL_Q_PRIOR_DEPTH1    0.5           /* x     prior of (depth 1, rank 0) */
#define CTL_Q_PRIOR_RANK      0.15          /* x     rank r's prior: this share of rank r-1's */
#define CTL_Q_PRIOR_WEIGHT    2.0           /* obs   a cell's prior worth this many */

/* -- costs (ctl_cost.c) -- */
#define CTL_OUTLIER           1.5           /* x     an observation counts at most this times
                                             *       its estimate (a preempted step) */
#define CTL_AVG_FIRST         6             /* n     the mean of the first few, then ... */
#define CTL_AVG_RATE          0.15          /* x     ... a moving average at this rate */
#define CTL_COST_MIN_OF       3             /* n     a cost: the least of the first few */
#define CTL_PRIOR_SLOPE       0.6           /* ptok  prior verify cost per extra tree token */
#define CTL_SLOPE_MIN         0.25          /* ptok  extrapolated slope, at least ... */
#define CTL_SLOPE_MAX         1.5           /* ptok  ... and at most */
#define CTL_FLOOR_N           3             /* n     measurements of a size that bound larger */
#define CTL_SPEED_RATE        0.1           /* x     how far a verify moves the machine speed */
#define CTL_LEVEL_SLOPE       0.1           /* x     per node, an unmeasured level pass's cost */
#define CTL_PROBE_ROWS        16            /* n     catch-up rows that measure a row's cost */
#define CTL_PROP_FIRST        8             /* n     proposals' share: a mean of the first ... */
#define CTL_PROP_RATE         0.1           /* x     ... then a moving average */

/* -- decisions (ctl_decide.c) -- */
#define CTL_OFF_WEIGHT_RATIO  0.5           /* x     a draft model over this share of the
                                             *       target's bytes is never drafted */
#define CTL_PLAIN_EVERY       64            /* steps a plain step at least this often (t1) */
#define CTL_T1_FIRST          2             /* n     plain steps before a model drafter drafts */
#define CTL_FIRST             4             /* n     a model drafter's first proposals ... */
#define CTL_FIRST_S           4             /* n     ... chains of at most this depth */
#define CTL_PROP_SHARE        0.01          /* x     proposals that do not pay: time share */
#define CTL_IDLE_AFTER        2             /* n     plain choices in a row: proposals thinned */
#define CTL_PROP_SKIP_MAX     16            /* steps ... at least one proposal in this many */
#define CTL_TREE_MIN_GAIN     1.03          /* x     a measured tree must promise this */
#define CTL_PROBE_NEAR        0.7           /* x     an unmeasured size within this is probed */
#define CTL_REPROBE_NEAR      0.85          /* x     a size next to the best within this ... */
#define CTL_REPROBE_EVERY     16            /* steps ... is probed one step in this many */
#define CTL_VPROBE_BUDGET     0.01          /* x     probes lose at most this share of time */
#define CTL_VPROBE_ALLOW      8.0           /* ptok  ... plus this */
#define CTL_BUDGET_FADE       0.998         /* /step the budget's time and loss fade */
#define CTL_PROBE_EVERY       32            /* steps a drafter that does not pay probes at most
                                             *       this often ... */
#define CTL_PROBE_MIN_GAIN    0.8           /* x     ... when predicted within this of plain */
#define CTL_PROBE_BUDGET      0.01          /* x     ... costing at most this share of time */
#define CTL_GATE_BUCKETS      8             /* n     batch ranges 2, 3-4, ..., 33-64 */
#define CTL_GATE_DECAY        0.9           /* /step drafted steps' sums decay */
#define CTL_GATE_FADE         0.99          /* /step their weight fades without drafting */
#define CTL_GATE_MIN          3             /* n     drafted steps before the gate judges */
#define CTL_GATE_REJUDGE      0.5           /* obs   weight below which drafting is a probe */
#define CTL_GATE_FORGET       0.15          /* obs   ... and below which it is forgotten */
#define CTL_GATE_PLAIN_MIN    0.3           /* obs   plain steps' weight: below, one first */
#define CTL_OUTLOOK_STEPS     256           /* steps drafting, for the outlook, after a shape
                                             *       last paid */

/* -- the pool planner (ctl_plan.c) -- */
#define CTL_REPLAN            4             /* steps a plan is kept ... */
#define CTL_REPLAN_IDLE       4             /* x     ... this many times longer if it is plain */
#define CTL_EXPLORE_EVERY     8             /* n     one plan in this many tries a neighbour */
#define CTL_EXPLORE_NEAR      0.85          /* x     ... that comes within this of the best */
#define CTL_PLAN_MIN_GAIN     1.02          /* x     a plan must promise this to draft */
#define CTL_PLAN_MARGIN       0.02          /* x     a dearer pool must promise this more */
#define CTL_RZ_DECAY          0.9           /* /step a pool's realized sums decay */
#define CTL_RZ_PRIOR          2.0           /* obs   its prediction worth this many steps */
#define CTL_RZ_FADE           0.97          /* /step its weight fades since its last update */
#define CTL_RZ_MIN_W          3.0           /* obs   steps before its outliers are capped */
#define CTL_RHO_DECAY         0.97          /* /step realized-over-predicted sums decay */
#define CTL_RHO_PRIOR         4.0           /* obs   prior 1 worth this many tokens */
#define CTL_RHO_DEPTH_PRIOR   8.0           /* obs   a depth's prior (all depths') worth */
#define CTL_RHO_MIN           0.5           /* x     realized over predicted, at least ... */
#define CTL_RHO_MAX           1.5           /* x     ... and at most */

// clang-format on

/* Prior verify cost of T tree tokens (ptok). */
#define CTL_PRIOR_RATIO(T) (1.0 + CTL_PRIOR_SLOPE * (double)((T)-1))

#endif /* ST_CTL_CONST_H */
