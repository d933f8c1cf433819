/* ctl_const.h: every constant of `auto`, one table (docs/AUTO.md). Units: ptok one sequence's
 * plain-token time (the one unit); x a ratio; /step a factor per step; steps; n a count; tok. */
#ifndef ST_CTL_CONST_H
#define ST_CTL_CONST_H

// clang-format off
/* name                     value    unit   what */
/* -- acceptance, calibrated from shadows -- */
#define CTL_CLASSES         16      /* n     drafter confidence classes */
#define CTL_DEPTHS          8       /* n     depths calibrated per class */
#define CTL_BINS            5       /* n     drafter score bins, bounded by: */
#define CTL_BIN_AT          {0.8f, 0.5f, 0.25f, 0.1f} /* x */
#define CTL_NB              (CTL_CLASSES * CTL_DEPTHS * CTL_BINS) /* n buckets */
#define CTL_RING            20      /* n     pending shadows per sequence */
#define CTL_PRIOR_SCALE     0.6     /* x     a bucket's prior: this share of the score, */
#define CTL_PRIOR_WEIGHT    2.0     /* n     ... worth this many nodes (a cell's too) */
#define CTL_Q_PRIOR_DEPTH1  0.5     /* x     cell (depth 1, rank 0); deeper: the one above */
#define CTL_Q_PRIOR_RANK    0.15    /* x     cell of rank r: this share of rank r-1's */
#define CTL_OWN_DECAY       0.98    /* /node a sequence's own accepted/predicted nodes, ... */
#define CTL_OWN_PRIOR       4.0     /* n     ... shrunk to the buckets' (1) by this many */
/* -- measured costs, the prediction's inputs -- */
#define CTL_OUTLIER         1.5     /* x     a time counts at most this times its mean */
#define CTL_AVG_FIRST       6       /* n     times: the mean of the first few, then ... */
#define CTL_AVG_RATE        0.15    /* x     ... a moving average at this rate */
#define CTL_MIN_OF          3       /* n     a cost: the least of its first few */
#define CTL_PRIOR_SLOPE     0.6     /* ptok  a verify per tree token, before any measured */
#define CTL_LEVEL_SLOPE     0.1     /* x     an unmeasured level pass, per node more */
#define CTL_SPEED_RATE      0.1     /* x     how far a verify moves the unit */
#define CTL_ROWS            16      /* n     a catch-up this long measures a row */
/* -- evidence: realized steps per batch bucket (1, 2, 3-4, ..., 33-64) and shape -- */
#define CTL_BUCKETS         7       /* n     batch buckets */
#define CTL_DECAY           0.9     /* x     a record's sums, per step added */
#define CTL_FADE            0.995   /* /step ... and per step since the last */
#define CTL_POOL_FADE       0.97    /* /step ... a pool's (its luck must not last) */
#define CTL_PRIOR_TOK       8.0     /* tok   the prediction's tokens worth this many */
#define CTL_PRIOR_TIME      2.0     /* ptok  ... and its time this much */
#define CTL_POOL_PRIOR      4.0     /* x     a pool's prior (its bucket's): this much more */
#define CTL_PLAIN_EVERY     64      /* steps a plain step at least this often (yardstick) */
/* -- the value rule and the one exploration budget -- */
#define CTL_MARGIN          0.02    /* x     a tree or a new pool must beat by this */
#define CTL_Z               0.13    /* x     optimism: value * (1 + Z / sqrt(w + W0)) ... */
#define CTL_W0              0.25    /* n     ... for w steps of evidence */
#define CTL_BUDGET          0.01    /* x     exploring loses at most this share of time, */
#define CTL_ALLOW           0.25    /* ptok  ... plus this; ... */
#define CTL_HORIZON         0.998   /* /step ... time and loss fade (not a stash) */
#define CTL_FIRST           4       /* n     a model drafter's first proposals: chains ... */
#define CTL_FIRST_S         4       /* n     ... this deep (they measure its costs) */
#define CTL_T1_FIRST        2       /* n     plain steps before a model drafter drafts */
#define CTL_OFF_RATIO       0.5     /* x     a draft model over this share of the target's
                                     *       weight bytes is never drafted */
#define CTL_OUTLOOK_STEPS   256     /* steps "drafting" this long after a shape paid */
// clang-format on

#endif /* ST_CTL_CONST_H */
