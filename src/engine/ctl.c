/*
 * ctl.c: the `auto` controller (see ctl.h): calibrated node acceptance from shadow proposals,
 * a measured verify-cost curve, and a per-step choice of the tree size.
 */
#include "engine/ctl.h"

#include "spectree.h"

#include <math.h>
#include <string.h>

enum {
    CTL_CLASSES = 16,
    CTL_DEPTHS = 8,
    CTL_BINS = 5,
    CTL_NB = CTL_CLASSES * CTL_DEPTHS * CTL_BINS,
    CTL_RING = 20, /* pending shadows per sequence (a proposal is scored after S more tokens) */
    CTL_PLAIN_EVERY = 64,   /* under auto, a plain step at least this often keeps t1 fresh */
    CTL_PROP_SKIP_MAX = 16, /* proposals that do not pay: at least one step in this many */
};

/* Proposals that keep not paying may cost this share of the steps' time. */
#define CTL_PROP_SHARE 0.02
/* Prior of a bucket: a fraction of the drafter's own score, worth this many observations. */
#define CTL_PRIOR_SCALE 0.6
#define CTL_PRIOR_WEIGHT 2.0
/* Prior verify cost of T tokens in plain-token times (a measured size's estimate is its
 * measurements' average blended with this, worth one measurement). */
#define CTL_PRIOR_SLOPE 0.6
#define CTL_PRIOR_RATIO(T) (1.0 + CTL_PRIOR_SLOPE * (double)((T)-1))

typedef struct shadow {
    int64_t n0; /* history length when proposed: a depth-d node predicts hist[n0 + d - 1] */
    int32_t cnt, maxd, used;
} shadow;

struct st_ctl {
    int32_t bs, N;
    int64_t K, Mmax;
    int autotune; /* 0: a fixed shape, verified as drafted (no ranking, timing or back-off) */
    /* drafting policy of a drafter that costs time before the choice (a draft model) */
    int model_drafter;
    int64_t step, last_plain; /* steps so far; the last plain step */
    /* drafting that does not pay: per batch size, drafted steps in a row whose choice was
     * plain; the last drafted step; the share of a drafted step's time spent before the choice
     * (proposing and ranking; a moving average) */
    int32_t idle[ST_GEN_MAX_BATCH + 1];
    int64_t last_draft, prop_n;
    double prop_frac;
    int64_t off_until, backoff;       /* no drafting before step off_until; next pause */
    int32_t failed_probes, win_steps; /* losing windows in a row; drafted steps this window */
    double win_benefit;               /* seconds gained by this window's drafted steps */
    void *mem;                        /* the one allocation of the arrays below */
    double seen[CTL_NB], acc[CTL_NB];
    /* this step's ranking, per active slot: candidate of each ranked node, its bucket, depth,
     * parent (ranked index, -1 the root, -2 none), estimated path acceptance; E[m]: expected
     * accepted nodes among the first m-1; avail: ranked nodes */
    int64_t *order;  /* (bs, N-1) */
    int32_t *bucket; /* (bs, N-1) */
    int32_t *depth;  /* (bs, N-1) */
    int32_t *par;    /* (bs, N-1) */
    int32_t *tok;    /* (bs, N-1) */
    double *E;       /* (bs, N+1) */
    int32_t *avail;  /* (bs) */
    int32_t *map;    /* (Mmax) candidate -> ranked index, -1 */
    int64_t *fin;    /* (Mmax) finite candidates */
    /* shadows: (bs, CTL_RING) records with (N-1) nodes each */
    shadow *sh;
    int32_t *sh_par, *sh_tok, *sh_bucket, *sh_depth;
    /* timing: t1 over every plain step; t1b[na] over those of na sequences (a batch's plain
     * step costs less per token than one sequence's: the weights are read once for all) */
    double t1;
    int64_t t1_n;
    double t1b[ST_GEN_MAX_BATCH + 1];
    int64_t t1b_n[ST_GEN_MAX_BATCH + 1];
    int64_t explore;  /* near-paying steps seen (exploration counter) */
    double *tv;       /* (Tmax + 1) */
    int32_t *tv_n;    /* (Tmax + 1) */
    uint8_t *tv_seen; /* (Tmax + 1) a first, unmeasured step of that size was made */
    int64_t Tmax;
};

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
    c->E = st_plan_take(p, (size_t)c->bs * (size_t)(c->N + 1), sizeof *c->E);
    c->avail = st_plan_take(p, (size_t)c->bs, sizeof *c->avail);
    c->map = st_plan_take(p, M, sizeof *c->map);
    c->fin = st_plan_take(p, M, sizeof *c->fin);
    c->sh = st_plan_take(p, (size_t)c->bs * CTL_RING, sizeof *c->sh);
    c->sh_par = st_plan_take(p, SR, sizeof *c->sh_par);
    c->sh_tok = st_plan_take(p, SR, sizeof *c->sh_tok);
    c->sh_bucket = st_plan_take(p, SR, sizeof *c->sh_bucket);
    c->sh_depth = st_plan_take(p, SR, sizeof *c->sh_depth);
    c->tv = st_plan_take(p, T1, sizeof *c->tv);
    c->tv_n = st_plan_take(p, T1, sizeof *c->tv_n);
    c->tv_seen = st_plan_take(p, T1, sizeof *c->tv_seen);
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
    c->autotune = autotune;
    c->model_drafter = draft_weight_ratio > 0.0;
    c->backoff = 16;
    /* A draft model reading more than half the target's weight bytes per token cannot pay for
     * its drafts (its tokens cost more than half a target token; the self-draft costs one):
     * `auto` does not draft with it at all. Fixed shapes still do as told. */
    if (autotune && draft_weight_ratio > 0.5)
        c->off_until = INT64_MAX;
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

int st_ctl_want_draft(const st_ctl *c, int32_t na) {
    if (!c->autotune)
        return 1;
    /* Proposals that keep ending in a plain step at this batch size are sampled, one step in
     * k, k chosen so that they cost about CTL_PROP_SHARE of the steps' time (k = 1 where
     * proposing is cheap beside the forward: a large model); the proposals still calibrate the
     * acceptance, and a speculative choice drafts every step again. */
    if (na >= 1 && na <= ST_GEN_MAX_BATCH && c->idle[na] >= 2) {
        double k = ceil(c->prop_frac / CTL_PROP_SHARE);
        k = k < 1.0 ? 1.0 : k > CTL_PROP_SKIP_MAX ? CTL_PROP_SKIP_MAX : k;
        if ((double)(c->step - c->last_draft) < k)
            return 0;
    }
    /* a plain step every CTL_PLAIN_EVERY keeps t1 fresh; a model drafter only drafts
     * once that time is known (its drafts cost time before they can be judged) */
    return c->step >= c->off_until && c->step - c->last_plain < CTL_PLAIN_EVERY &&
           !(c->model_drafter && c->t1 <= 0.0);
}

/* st_tree_organize's order (st_ranks_before). */
static int ranks_before(const float *score, int64_t a, int64_t b) {
    return st_ranks_before(score[a], a, score[b], b);
}

static int32_t score_bin(float s) {
    return s >= 0.8f ? 0 : s >= 0.5f ? 1 : s >= 0.25f ? 2 : s >= 0.1f ? 3 : 4;
}

static double bucket_p(const st_ctl *c, int32_t b, float score) {
    double prior = CTL_PRIOR_SCALE * (score > 1.0f ? 1.0 : score > 0.0f ? (double)score : 0.0);
    return (c->acc[b] + CTL_PRIOR_WEIGHT * prior) / (c->seen[b] + CTL_PRIOR_WEIGHT);
}

/* Records the ranking of slot a as a shadow of sequence b. */
static void add_shadow(st_ctl *c, int32_t a, int32_t b, int64_t n_hist) {
    const int32_t n1 = c->N - 1, cnt = c->avail[a];
    if (cnt == 0)
        return;
    shadow *ring = c->sh + (size_t)b * CTL_RING;
    int32_t w = -1;
    for (int32_t i = 0; i < CTL_RING && w < 0; i++)
        if (!ring[i].used)
            w = i;
    if (w < 0) { /* full: replace the oldest, unscored */
        w = 0;
        for (int32_t i = 1; i < CTL_RING; i++)
            if (ring[i].n0 < ring[w].n0)
                w = i;
    }
    shadow *r = &ring[w];
    r->n0 = n_hist;
    r->cnt = cnt;
    r->used = 1;
    r->maxd = 0;
    const size_t o = ((size_t)b * CTL_RING + (size_t)w) * (size_t)n1, s = (size_t)a * (size_t)n1;
    for (int32_t j = 0; j < cnt; j++) {
        c->sh_par[o + j] = c->par[s + j];
        c->sh_tok[o + j] = c->tok[s + j];
        c->sh_bucket[o + j] = c->bucket[s + j];
        c->sh_depth[o + j] = c->depth[s + j];
        r->maxd = c->depth[s + j] > r->maxd ? c->depth[s + j] : r->maxd;
    }
}

void st_ctl_rank(st_ctl *c, int32_t a, int32_t b, int64_t K, int64_t S, const float *scores,
                 const int32_t *tokens, const int64_t *level_parents, int64_t n_hist,
                 int32_t conf) {
    if (!c->autotune)
        return;
    const int32_t n1 = c->N - 1;
    const size_t s0 = (size_t)a * (size_t)n1;
    int64_t M = st_tree_n_candidates(K, S);
    if (M > c->Mmax)
        M = c->Mmax;
    int64_t nf = 0;
    for (int64_t i = 0; i < M; i++)
        if (isfinite(scores[i]))
            c->fin[nf++] = i;
    if (conf < 0 || conf >= CTL_CLASSES)
        conf = 0;
    int32_t cnt = 0;
    double *E = c->E + (size_t)a * (size_t)(c->N + 1);
    E[0] = E[1] = 0.0;
    /* partial selection sort of the finite candidates: the first n1 in organize's order */
    for (; cnt < n1 && cnt < nf; cnt++) {
        int64_t bi = cnt;
        for (int64_t i = cnt + 1; i < nf; i++)
            if (ranks_before(scores, c->fin[i], c->fin[bi]))
                bi = i;
        int64_t cand = c->fin[bi];
        c->fin[bi] = c->fin[cnt];
        c->fin[cnt] = cand;
        int32_t d, parent;
        if (cand < K) {
            d = 1;
            parent = -1;
        } else {
            const int64_t lvl = st_tree_candidate_level(K, cand);
            const int64_t q = cand - st_tree_level_base(K, lvl);
            const int64_t pc = level_parents[1 + (lvl - 1) * K + q / K];
            d = (int32_t)lvl + 1;
            parent = pc >= 0 && pc < c->Mmax && c->map[pc] >= 0 ? c->map[pc] : -2;
        }
        c->map[cand] = cnt;
        const int32_t bk = (conf * CTL_DEPTHS + (d > CTL_DEPTHS ? CTL_DEPTHS : d) - 1) * CTL_BINS +
                           score_bin(scores[cand]);
        c->order[s0 + cnt] = cand;
        c->bucket[s0 + cnt] = bk;
        c->depth[s0 + cnt] = d;
        c->par[s0 + cnt] = parent;
        c->tok[s0 + cnt] = tokens[cand];
        E[cnt + 2] = E[cnt + 1] + (parent == -2 ? 0.0 : bucket_p(c, bk, scores[cand]));
    }
    for (int32_t j = 0; j < cnt; j++)
        c->map[c->order[s0 + j]] = -1;
    for (int32_t m = cnt + 2; m <= c->N; m++)
        E[m] = E[cnt + 1];
    c->avail[a] = cnt;
    add_shadow(c, a, b, n_hist);
}

int64_t st_ctl_ranked(const st_ctl *c, int32_t a, int32_t j) {
    if (a < 0 || a >= c->bs || j < 0 || j >= c->avail[a])
        return -1;
    return c->order[(size_t)a * (size_t)(c->N - 1) + (size_t)j];
}

int32_t st_ctl_depth(const st_ctl *c, int32_t a, int32_t n) {
    int32_t d = 0;
    const size_t s0 = (size_t)a * (size_t)(c->N - 1);
    for (int32_t j = 0; j < n - 1 && j < c->avail[a]; j++)
        d = c->depth[s0 + j] > d ? c->depth[s0 + j] : d;
    return d;
}

/* Estimated cost of a verify step over T tree tokens, in plain-token times (a ratio to t1: both
 * grow with the context, their ratio much less), interpolated between measured sizes and
 * extrapolated with the measured slope (0.6 per token before any measurement). */
static double est_ratio(const st_ctl *c, int64_t T) {
    if (T <= c->Tmax && c->tv_n[T] > 0) /* a few measurements are blended with the prior */
        return ((double)c->tv_n[T] * c->tv[T] + CTL_PRIOR_RATIO(T)) / (double)(c->tv_n[T] + 1);
    int64_t lo = 1, hi = 0;
    for (int64_t t = T - 1; t >= 2 && lo == 1; t--)
        if (t <= c->Tmax && c->tv_n[t] > 0)
            lo = t;
    for (int64_t t = T + 1; t <= c->Tmax && hi == 0; t++)
        if (c->tv_n[t] > 0)
            hi = t;
    const double vlo = lo == 1 ? 1.0 : c->tv[lo];
    if (hi)
        return vlo + (c->tv[hi] - vlo) * (double)(T - lo) / (double)(hi - lo);
    double slope = CTL_PRIOR_SLOPE;
    if (lo > 1) {
        slope = (vlo - 1.0) / (double)(lo - 1);
        slope = slope < 0.25 ? 0.25 : slope > 1.5 ? 1.5 : slope;
    }
    return vlo + slope * (double)(T - lo);
}

int32_t st_ctl_choose(st_ctl *c, int32_t na, int64_t n_real_max, double *exp_gain) {
    *exp_gain = 1.0;
    if (!c->autotune) /* a fixed shape verifies what was drafted, up to N */
        return (int32_t)(n_real_max + 1 < c->N ? n_real_max + 1 : c->N);
    if (c->t1_n == 0)
        return 1; /* measure plain decoding first */
    int32_t mmax = 1;
    for (int32_t a = 0; a < na; a++)
        mmax = c->avail[a] + 1 > mmax ? c->avail[a] + 1 : mmax;
    if (mmax > c->N)
        mmax = c->N;
    int32_t best = 1;
    double bg = 1.03; /* a speculative step must promise a clear gain */
    double g[ST_SPEC_MAX_N + 1];
    /* plain decoding's time per token at this batch size, over t1 (the scale of the verify
     * curve): the larger the batch, the cheaper its plain tokens and the more a tree must
     * deliver. Unmeasured at this size: t1's. */
    const double f =
        na >= 1 && na <= ST_GEN_MAX_BATCH && c->t1b_n[na] > 0 ? c->t1b[na] / c->t1 : 1.0;
    for (int32_t m = 2; m <= mmax; m++) {
        double tok = 0.0;
        for (int32_t a = 0; a < na; a++)
            tok += 1.0 + c->E[(size_t)a * (size_t)(c->N + 1) + m];
        g[m] = tok * f / est_ratio(c, (int64_t)na * m);
        if (g[m] > bg) {
            bg = g[m];
            best = m;
        }
    }
    /* Exploration: now and then (one step in 16 of those where it applies) the size next to
     * the best, if its estimate comes close, is verified instead, so that one slow measurement
     * (a cold cache, a preempted step) cannot rule a size out for good. */
    int32_t alt = 0;
    double ag = 0.0;
    for (int32_t m = 2; m <= mmax; m++)
        if (m != best && (m == best + 1 || m == best - 1 || best == 1) && g[m] > ag) {
            ag = g[m];
            alt = m;
        }
    const double near = alt && c->tv_n[(int64_t)na * alt] < 3 ? 0.7 : 0.85;
    if (alt && ag > near * bg && ++c->explore % 16 == 0) {
        best = alt;
        bg = ag;
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

void st_ctl_time_plain(st_ctl *c, double per_token) {
    if (!(per_token > 0.0))
        return;
    track(&c->t1, c->t1_n, per_token);
    c->t1_n++;
}

void st_ctl_time_verify(st_ctl *c, int64_t T, double seconds) {
    if (T < 2 || T > c->Tmax || !(seconds > 0.0) || c->t1_n == 0)
        return;
    /* the first step of a size is not measured: it runs cold (fresh logits rows and buffers
     * touched for the first time measured 2-3x a warm step) */
    if (!c->tv_seen[T]) {
        c->tv_seen[T] = 1;
        return;
    }
    double r = seconds / c->t1;
    if (c->tv_n[T] == 0) { /* a first measurement counts at most 1.5 times the estimate */
        const double e = est_ratio(c, T);
        r = r > 1.5 * e ? 1.5 * e : r;
    }
    track(&c->tv[T], c->tv_n[T], r);
    if (c->tv_n[T] < 1000000)
        c->tv_n[T]++;
}

void st_ctl_time_plain_batch(st_ctl *c, int32_t na, double seconds) {
    if (na < 1 || !(seconds > 0.0))
        return;
    st_ctl_time_plain(c, seconds / (double)na);
    if (na <= ST_GEN_MAX_BATCH) {
        track(&c->t1b[na], c->t1b_n[na], seconds / (double)na);
        c->t1b_n[na]++;
    }
}

double st_ctl_t1(const st_ctl *c) { return c->t1; }

void st_ctl_observe(st_ctl *c, int32_t b, const int32_t *hist, int64_t n_hist, int done) {
    if (!c->autotune || b < 0 || b >= c->bs)
        return;
    const int32_t n1 = c->N - 1;
    shadow *ring = c->sh + (size_t)b * CTL_RING;
    for (int32_t w = 0; w < CTL_RING; w++) {
        shadow *r = &ring[w];
        if (!r->used)
            continue;
        if (done) {
            r->used = 0;
            continue;
        }
        if (n_hist < r->n0 + r->maxd)
            continue;
        const size_t o = ((size_t)b * CTL_RING + (size_t)w) * (size_t)n1;
        uint8_t ok[ST_SPEC_MAX_N];
        for (int32_t j = 0; j < r->cnt && j < ST_SPEC_MAX_N; j++) {
            const int32_t p = c->sh_par[o + j];
            const int reach = p == -1 || (p >= 0 && p < j && ok[p]);
            ok[j] = (uint8_t)(reach && hist[r->n0 + c->sh_depth[o + j] - 1] == c->sh_tok[o + j]);
            c->seen[c->sh_bucket[o + j]] += 1.0;
            c->acc[c->sh_bucket[o + j]] += ok[j];
        }
        r->used = 0;
    }
}

void st_ctl_step_end(st_ctl *c, int drafted, int32_t n, int32_t na, int64_t emitted, double t_step,
                     double t_fwd, double draft_s_per_token) {
    c->step++;
    if (!c->autotune)
        return;
    if (drafted) {
        c->last_draft = c->step - 1;
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
    if (n == 1) {
        if (emitted > 0)
            st_ctl_time_plain_batch(c, na, t_fwd);
        c->last_plain = c->step;
    } else {
        st_ctl_time_verify(c, (int64_t)na * n, t_fwd);
    }
    if (!drafted || !c->model_drafter)
        return;
    /* A model drafter is judged by its realized gain over windows of 4 drafted steps: the
     * plain time of the tokens a drafted step emitted minus the step's time. A losing window
     * pauses drafting for a back-off that doubles with each failure (16 .. 512 steps; 4096
     * after three in a row, since every probe first catches up on the tokens since the last);
     * drafts that cost more than half a target token each can never pay: off for good. Each
     * probe's proposals still calibrate the acceptance as shadows. */
    c->win_benefit += (double)emitted * c->t1 - t_step;
    const int hopeless = draft_s_per_token > 0.5 * c->t1;
    ++c->win_steps;
    if (!hopeless && c->win_steps < 4 && c->win_benefit >= -0.5 * c->t1)
        return;
    if (c->win_benefit >= 0.0 && !hopeless) {
        c->backoff = 16;
        c->failed_probes = 0;
    } else {
        c->off_until = hopeless ? INT64_MAX : c->step + c->backoff;
        c->backoff = c->backoff * 2 < 512 ? c->backoff * 2 : 512;
        if (++c->failed_probes >= 3 && c->off_until != INT64_MAX)
            c->off_until = c->step + 4096;
    }
    c->win_benefit = 0.0;
    c->win_steps = 0;
}
