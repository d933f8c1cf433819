/*
 * ctl_cost.c: the `auto` controller's costs in its one time unit, a plain token (docs/AUTO.md):
 * plain steps per batch size, the verify-cost curve by tree tokens and by batch, the draft
 * costs per sequence, and the moving averages that keep them.
 */
#include "ctl/ctl_internal.h"

#include <math.h>

static double conv1_est(const st_ctl *c);

/* Seconds of a level pass of K nodes: measured, else from the nearest measured smaller (or
 * larger) pool, else a catch-up's. */
double st_ctl_level_cost(const st_ctl *c, int64_t K) {
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
                slope = slope < CTL_SLOPE_MIN   ? CTL_SLOPE_MIN
                        : slope > CTL_SLOPE_MAX ? CTL_SLOPE_MAX
                                                : slope;
            }
            e = vlo + slope * (double)(T - lo);
        }
    }
    return e > floor ? e : floor;
}

/* Plain decoding's time per token at batch size na over t1 (1 where not measured). */
double st_ctl_batch_f(const st_ctl *c, int32_t na) {
    return na >= 1 && na <= c->bs && c->t1b_n[na] > 0 && c->t1 > 0.0 ? c->t1b[na] / c->t1 : 1.0;
}

/* The time of a verify step of na sequences with m nodes each over that of a plain step of na
 * sequences: for one sequence, the verify-cost curve by tokens (est_ratio: a measured size its
 * measurements, others interpolated, none below a smaller size measured often enough); for a
 * batch, measured at that batch size (*measured = 1), else estimated from the verify-cost
 * curve over all steps (by total tokens, in t1 times), which does not see what a batch does to
 * it. */
double st_ctl_verify_cost(const st_ctl *c, int32_t na, int32_t m, int *measured) {
    if (na == 1) { /* one sequence: the curve by tokens is its own, with its estimates' rules */
        *measured = m >= 2 && m <= c->Tmax && c->tv_n[m] > 0;
        return est_ratio(c, m) * conv1_est(c) / st_ctl_batch_f(c, 1);
    }
    const size_t i = (size_t)na * (size_t)(c->N + 1) + (size_t)m;
    *measured = na >= 1 && na <= c->bs && m >= 2 && m <= c->N && c->cvb_n[i] > 0;
    if (*measured)
        return c->cvb[i];
    return est_ratio(c, (int64_t)na * m) * conv1_est(c) / ((double)na * st_ctl_batch_f(c, na));
}

/* Times are tracked by a moving average in which an observation counts at most 1.5 times the
 * current estimate (a step preempted on a shared machine must not rule a tree size out). The
 * same average for plain and verify steps keeps their ratio unbiased. */
void st_ctl_track(double *v, int64_t n, double x) {
    if (n == 0) {
        *v = x;
        return;
    }
    if (x > CTL_OUTLIER * *v)
        x = CTL_OUTLIER * *v;
    /* the mean of the first few, then a moving average */
    *v += (n < CTL_AVG_FIRST ? 1.0 / (double)(n + 1) : CTL_AVG_RATE) * (x - *v);
}

/* A cost (a plain token, a catch-up, a level pass): the smallest of the first few
 * measurements (a cold first step or a preempted one only adds time), then track's average. */
static void track_cost(double *v, int64_t n, double x) {
    if (n == 0 || (n < CTL_COST_MIN_OF && x < *v))
        *v = x;
    else if (n >= CTL_COST_MIN_OF)
        st_ctl_track(v, n, x);
}

/* A plain token's time now. Plain steps are rare while drafting (one in CTL_PLAIN_EVERY), and
 * a machine whose speed changes in between (other jobs on shared cores, cold caches after the
 * prompt, a longer context) changes every step's time alike: costs measured against t1 alone
 * then follow the machine, not the tree (docs/AUTO.md, "the time unit"). So the verify steps of
 * sizes measured CTL_FLOOR_N times also track the machine's speed, each moving it by CTL_SPEED_RATE
 * of how far its time is from its estimate (at most 1.5 times: a preempted step); a plain step sets
 * t1 anew. */
double st_ctl_t1_now(const st_ctl *c) { return c->t1 * c->speed; }

/* One sequence's plain token now (t1 is that of the batches that ran last), the unit of the
 * per-sequence draft costs; st_ctl_batch_f(c, 1) converts them to t1 times. */
double st_ctl_seq_unit(const st_ctl *c) { return st_ctl_t1_now(c) * st_ctl_batch_f(c, 1); }

/* One sequence's plain token over t1, for a controller of a batch (1 without one: every plain
 * step is then one sequence's, as in `spectree generate`; -1 while one sequence's plain step was
 * never timed). t1 averages the plain steps of whatever batches ran, so the verify-cost curve by
 * tokens and the planned pools' realized speed-ups are kept in one sequence's plain-token times
 * (t1b[1]): in t1's, a server's curve would mix units (docs/AUTO.md, "the time unit"). */
double st_ctl_conv1(const st_ctl *c) {
    if (c->bs <= 1)
        return 1.0;
    return c->t1b_n[1] > 0 && c->t1 > 0.0 ? st_ctl_batch_f(c, 1) : -1.0;
}

/* conv1 for estimates: 1 where it is not known yet. Measurements wait until it is: a server
 * whose first steps were a batch's has no plain step of one sequence to convert with. */
static double conv1_est(const st_ctl *c) {
    const double v = st_ctl_conv1(c);
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
     * touched for the first time) */
    if (!c->tv_seen[T]) {
        c->tv_seen[T] = 1;
        return;
    }
    *cold = 0;
    const double u = st_ctl_conv1(c);
    if (u <= 0.0) /* (the batch's cost is measured: time_verify_batch) */
        return;
    double r = seconds / (st_ctl_t1_now(c) * u);
    if (c->tv_n[T] >= CTL_FLOOR_N) {
        const double o = r / c->tv[T];
        c->speed *= 1.0 + CTL_SPEED_RATE * ((o > CTL_OUTLIER ? CTL_OUTLIER : o) - 1.0);
        r = seconds / (st_ctl_t1_now(c) * u);
    }
    if (c->tv_n[T] == 0) { /* a first measurement counts at most CTL_OUTLIER times the estimate */
        const double e = est_ratio(c, T);
        r = r > CTL_OUTLIER * e ? CTL_OUTLIER * e : r;
    }
    st_ctl_track(&c->tv[T], c->tv_n[T], r);
    if (c->tv_n[T] < 1000000)
        c->tv_n[T]++;
}

/* A verify step of na sequences with m nodes each that took `seconds`: the curve by total
 * tokens, and its cost over a plain step at this batch size (where that is measured). */
void st_ctl_time_verify_batch(st_ctl *c, int32_t na, int32_t m, double seconds) {
    int cold;
    time_verify_tokens(c, (int64_t)na * m, seconds, &cold);
    if (cold || na < 1 || na > c->bs || m < 2 || m > c->N || c->t1b_n[na] == 0)
        return;
    const size_t i = (size_t)na * (size_t)(c->N + 1) + (size_t)m;
    st_ctl_track(&c->cvb[i], c->cvb_n[i], seconds / ((double)na * c->t1b[na]));
    if (c->cvb_n[i] < 1000000)
        c->cvb_n[i]++;
}

void st_ctl_time_verify(st_ctl *c, int64_t T, double seconds) {
    if (T >= 2 && T <= c->N)
        st_ctl_time_verify_batch(c, 1, (int32_t)T, seconds);
    else {
        int cold;
        time_verify_tokens(c, T, seconds, &cold);
    }
}

void st_ctl_time_plain_batch(st_ctl *c, int32_t na, double seconds) {
    if (na < 1 || !(seconds > 0.0))
        return;
    c->t1 = st_ctl_t1_now(c);
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
        c->probe_spent += (catch_s + (levels_s > 0.0 ? levels_s : 0.0)) / st_ctl_t1_now(c);
    catch_s /= st_ctl_seq_unit(c); /* in one sequence's plain-token times from here on */
    levels_s /= st_ctl_seq_unit(c);
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
     * measures a row's cost above, not a drafting step's catch-up. */
    if (rows < CTL_PROBE_ROWS)
        track_cost(&c->c_catch, c->c_catch_n++, catch_s);
    if (S > 1 && levels_s > 0.0) {
        track_cost(&c->c_level[K], c->c_level_n[K], levels_s / (double)(S - 1));
        c->c_level_n[K]++;
    }
}
