/*
 * ctl.c: the `auto` controller (ctl.h). Predictions from measured costs and acceptance
 * calibrated from shadows, evidence from realized steps per batch bucket and shape, one value
 * rule and one exploration budget over both: docs/AUTO.md.
 */
#include "ctl/ctl.h"
#include "ctl/ctl_const.h"

#include "spectree.h"

#include <math.h>
#include <string.h>

/* Realized steps (tokens, time) and their prediction: decayed sums; w steps; fade since at. */
typedef struct rec {
    double tok, t, ptok, pt, w, fade, at;
} rec;

/* A prediction of one step: tokens emitted, time and its proposing's part (ptok), tree size. */
typedef struct pred {
    double tok, t, d, n;
} pred;

/* A ranked node: candidate, bucket, depth, parent (-1 the root, -2 none), token, sibling rank,
 * its bucket's acceptance when ranked */
typedef struct rnode {
    int32_t cand, bucket, depth, par, tok, rank;
    float p;
} rnode;

typedef struct shadow { /* n0: history when proposed (depth d predicts hist[n0 + d - 1]) */
    int64_t n0, cnt, maxd, used;
} shadow;

struct st_ctl {
    int32_t bs, N;
    int64_t K, S, Mmax, Tmax;
    int autotune, model_drafter, off, k_auto, s_auto, draft_seen;
    /* this step: pool, predictions of the drafted step and its tree, exploring, a start-up */
    int64_t step, last_draft, dk, ds, last_plain[CTL_BUCKETS];
    pred pd, pt, pb[CTL_BUCKETS]; /* pb: a drafter without a model's last drafted step */
    int pd_set, pt_set, explore, startup;
    /* costs: a plain token (s) over all steps and per batch size, the machine's speed since;
     * per sequence: proposing (s), a catch-up, a caught-up row, a level pass of K (ptok) */
    double t1, tb[ST_GEN_MAX_BATCH + 1], speed, cp[CTL_BUCKETS];
    int64_t t1_n, tb_n[ST_GEN_MAX_BATCH + 1], cp_n[CTL_BUCKETS];
    double c_catch, c_row, c_level[ST_SPEC_MAX_K + 1];
    int64_t c_catch_n, c_row_n, c_level_n[ST_SPEC_MAX_K + 1];
    /* evidence per bucket: plain steps, drafted steps, tree steps, drafted steps per pool */
    rec rp[CTL_BUCKETS], rall[CTL_BUCKETS], rtree[CTL_BUCKETS];
    rec rd[CTL_BUCKETS][ST_SPEC_MAX_K + 1][ST_SPEC_MAX_S + 1];
    double t_total, spent, pgain; /* the budget: recent time, exploring's loss (ptok) */
    double q_seen[ST_SPEC_MAX_S][ST_SPEC_MAX_K], q_acc[ST_SPEC_MAX_S][ST_SPEC_MAX_K];
    int64_t pk, ps, pn, ol_pay; /* the last plan; the last step whose best shape paid */
    st_spec_outlook ol;
    void *mem; /* the one allocation of the arrays below */
    double seen[CTL_NB], acc[CTL_NB];
    rnode *rn;                   /* (bs, N-1) this step's ranking */
    double *E;                   /* (bs, N+1) expected accepted nodes among the first m-1 */
    int32_t *avail;              /* (bs) ranked nodes */
    int64_t *seq_from, *seq_len; /* (bs) history at the last proposal, and now (0: done) */
    double *own;                 /* (bs, 2) a sequence's accepted and predicted nodes (decayed) */
    int32_t *map;                /* (Mmax) candidate -> ranked index, -1 */
    int64_t *fin;                /* (Mmax) finite candidates */
    shadow *sh;                  /* (bs, CTL_RING) */
    rnode *shn;                  /* (bs, CTL_RING, N-1) */
    double *tv;                  /* (Tmax + 1) a verify of T tree tokens (ptok) */
    int32_t *tv_n;               /* (Tmax + 1) its measurements (-1: its cold first step) */
};

void st_ctl_free(st_ctl *c) {
    if (c)
        st_free_aligned(c->mem);
    st_free(c);
}

#define TAKE(f, n) (c->f = st_plan_take(p, (size_t)(n), sizeof *c->f))
static void ctl_layout(st_ctl *c, st_plan *p) {
    const int64_t R = (int64_t)c->bs * (c->N - 1), T1 = c->Tmax + 1;
    TAKE(rn, R), TAKE(E, c->bs * (c->N + 1)), TAKE(avail, c->bs), TAKE(seq_from, c->bs);
    TAKE(seq_len, c->bs), TAKE(own, 2 * c->bs), TAKE(map, c->Mmax), TAKE(fin, c->Mmax),
        TAKE(sh, c->bs * CTL_RING);
    TAKE(shn, R * CTL_RING), TAKE(tv, T1), TAKE(tv_n, T1);
}
#undef TAKE

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
    c->bs = bs, c->N = N, c->K = K, c->S = S, c->autotune = autotune, c->speed = 1.0;
    c->model_drafter = draft_weight_ratio > 0.0, c->pk = c->dk = K, c->ps = c->ds = S;
    /* a draft model over half the target's bytes cannot pay: `auto` never drafts with it */
    c->off = autotune && draft_weight_ratio > CTL_OFF_RATIO, c->ol_pay = -CTL_OUTLOOK_STEPS;
    c->ol.weight_ratio = draft_weight_ratio, c->ol.weight_off = c->ol.known = c->off;
    c->Mmax = st_tree_n_candidates(K, S), c->Tmax = (int64_t)bs * N;
    st_plan pl = {0};
    ctl_layout(c, &pl);
    if (!(c->mem = st_plan_alloc(&pl)))
        return st_ctl_free(c), st_fail(ST_ERR_NOMEM, "controller: out of memory");
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

void st_ctl_outlook(const st_ctl *c, st_spec_outlook *out) {
    *out = c && c->autotune ? c->ol : (st_spec_outlook){0};
    out->drafting = out->known && !c->off && c->step - c->ol_pay < CTL_OUTLOOK_STEPS;
}

void st_ctl_last_plan(const st_ctl *c, int64_t *K, int64_t *S, int32_t *N, double *gain) {
    *K = c->pk, *S = c->ps, *N = (int32_t)c->pn, *gain = c->pgain;
}

/* A moving average, a time counting at most CTL_OUTLIER times the mean (a preempted step). */
static void track(double *v, int64_t n, double x) {
    x = n && x > CTL_OUTLIER * *v ? CTL_OUTLIER * *v : x;
    *v = n ? *v + (n < CTL_AVG_FIRST ? 1.0 / (double)(n + 1) : CTL_AVG_RATE) * (x - *v) : x;
}

/* A cost: the least of its first few (a cold or preempted step only adds), then track's. */
static void track_cost(double *v, int64_t *n, double x) {
    if (*n == 0 || (*n < CTL_MIN_OF && x < *v))
        *v = x;
    else if (*n >= CTL_MIN_OF)
        track(v, *n, x);
    ++*n;
}

/* The unit, one sequence's plain token now (well-measured verify sizes follow the machine). */
static double unit(const st_ctl *c) { return (c->tb_n[1] > 0 ? c->tb[1] : c->t1) * c->speed; }

double st_ctl_t1(const st_ctl *c) { return c->t1; }

/* A verify of T tree tokens (ptok): measured, else interpolated; never below a smaller one. */
static double verify_est(const st_ctl *c, int64_t T, int *measured) {
    int64_t lo = 1, hi = 0;
    double vlo = 1.0;
    for (int64_t t = 2; t < T && t <= c->Tmax; t++)
        if (c->tv_n[t] > 0 && c->tv[t] >= vlo)
            lo = t, vlo = c->tv[t];
    if (T <= c->Tmax && c->tv_n[T] > 0)
        return *measured = 1, c->tv[T] > vlo ? c->tv[T] : vlo;
    *measured = 0;
    for (int64_t t = T + 1; t <= c->Tmax && !hi; t++)
        hi = c->tv_n[t] > 0 && c->tv[t] >= vlo ? t : 0;
    if (hi)
        return vlo + (c->tv[hi] - vlo) * (double)(T - lo) / (double)(hi - lo);
    return vlo + (lo > 1 ? (vlo - 1.0) / (double)(lo - 1) : CTL_PRIOR_SLOPE) * (double)(T - lo);
}

/* A level pass of K nodes (ptok): measured, else from the nearest measured pool. */
static double level_cost(const st_ctl *c, int64_t K) {
    for (int64_t d = 0; d < ST_SPEC_MAX_K; d++)
        for (int64_t k = K - d; k <= K + d; k += d ? 2 * d : 1)
            if (k >= 1 && k <= ST_SPEC_MAX_K && c->c_level_n[k] > 0)
                return k <= K ? c->c_level[k] * (1.0 + CTL_LEVEL_SLOPE * (double)(K - k))
                              : c->c_level[k] / (1.0 + CTL_LEVEL_SLOPE * (double)(k - K));
    return c->c_catch;
}

void st_ctl_time_plain_batch(st_ctl *c, int32_t na, double seconds) {
    if (na < 1 || na > ST_GEN_MAX_BATCH || !(seconds > 0.0))
        return;
    if (na == 1 || !c->tb_n[1]) /* the unit's base is measured anew */
        *(c->tb_n[1] ? &c->tb[1] : &c->t1) *= c->speed, c->speed = 1.0;
    track_cost(&c->t1, &c->t1_n, seconds / (double)na);
    track_cost(&c->tb[na], &c->tb_n[na], seconds / (double)na);
}

void st_ctl_time_plain(st_ctl *c, double per_token) { st_ctl_time_plain_batch(c, 1, per_token); }

void st_ctl_time_verify(st_ctl *c, int64_t T, double seconds) {
    const double u = unit(c);
    if (T < 2 || T > c->Tmax || !(seconds > 0.0) || !(u > 0.0))
        return;
    if (c->tv_n[T] == 0 && (c->tv_n[T] = -1)) /* (its first step runs cold) */
        return;
    c->tv_n[T] = c->tv_n[T] < 0 ? 0 : c->tv_n[T];
    double r = seconds / u;
    if (c->tv_n[T] == 0) { /* a first measurement: at most CTL_OUTLIER times its estimate */
        const double e = verify_est(c, T, &(int){0});
        r = r > CTL_OUTLIER * e ? CTL_OUTLIER * e : r;
    }
    if (c->tv_n[T] >= CTL_MIN_OF) {
        const double o = r / c->tv[T];
        c->speed *= 1.0 + CTL_SPEED_RATE * ((o > CTL_OUTLIER ? CTL_OUTLIER : o) - 1.0);
        r = seconds / unit(c);
    }
    track(&c->tv[T], c->tv_n[T], r);
    c->tv_n[T] += c->tv_n[T] < INT32_MAX;
}

void st_ctl_draft_cost(st_ctl *c, int64_t K, int64_t S, double catch_s, int64_t rows,
                       double levels_s) {
    const double u = unit(c);
    if (!c->autotune || !(catch_s > 0.0) || K < 1 || K > ST_SPEC_MAX_K || !(u > 0.0))
        return;
    if (rows >= CTL_ROWS)
        track_cost(&c->c_row, &c->c_row_n, catch_s / u / (double)rows);
    if (!c->draft_seen && (c->draft_seen = 1)) /* the first proposal runs cold */
        return;
    if (rows < CTL_ROWS) /* (a long catch-up measures a row, not a drafting step's catch-up) */
        track_cost(&c->c_catch, &c->c_catch_n, catch_s / u);
    if (S > 1 && levels_s > 0.0)
        track_cost(&c->c_level[K], &c->c_level_n[K], levels_s / u / (double)(S - 1));
}

/* The batch bucket of na sequences: one, 2, 3-4, 5-8, ... */
static int bucket(int32_t na) {
    const int b = na <= 1 ? 0 : 32 - __builtin_clz((unsigned)(na - 1));
    return b < CTL_BUCKETS - 1 ? b : CTL_BUCKETS - 1;
}

static double rec_k(const st_ctl *c, const rec *r) {
    return r->w > 0.0 ? pow(r->fade, (double)c->step - r->at) : 0.0;
}

/* (a step counts at most CTL_OUTLIER times its prediction or the record's time a token) */
static void rec_add(const st_ctl *c, rec *r, double fade, double tok, double t, double ptok,
                    double pt) {
    const double k = CTL_DECAY * rec_k(c, r),
                 m = r->w >= CTL_MIN_OF && r->tok > 0.0 ? fmax(pt, tok * r->t / r->tok) : t;
    r->tok = k * r->tok + tok, r->t = k * r->t + fmin(t, CTL_OUTLIER * m), r->fade = fade;
    r->ptok = k * r->ptok + ptok, r->pt = k * r->pt + pt;
    r->w = k * r->w + 1.0, r->at = (double)c->step;
}

/* Realized over predicted tokens, predicted over realized time, shrunk towards the parent's
 * (to) by a prior of m times CTL_PRIOR_TOK and CTL_PRIOR_TIME: what fades returns to it. */
static const double ONE[2] = {1.0, 1.0};
static void rec_ratio(const st_ctl *c, const rec *r, const double *to, double m, double *out) {
    const double k = rec_k(c, r);
    out[0] = (k * r->tok + m * CTL_PRIOR_TOK * to[0]) / (k * r->ptok + m * CTL_PRIOR_TOK);
    out[1] = (k * r->pt + m * CTL_PRIOR_TIME * to[1]) / (k * r->t + m * CTL_PRIOR_TIME);
}

/* Plain decoding's rate at na (tokens per ptok): its records, else its cost. */
static double plain_rate(const st_ctl *c, int32_t na) {
    const rec *r = &c->rp[bucket(na)];
    const double u = unit(c);
    return r->w > 0.0 && r->t > 0.0                             ? r->tok / r->t
           : na >= 1 && na <= c->bs && c->tb_n[na] > 0 && u > 0 ? u / c->tb[na]
                                                                : 1.0;
}

void st_ctl_step_end(st_ctl *c, int drafted, int32_t n, int32_t na, int64_t emitted, double t_step,
                     double t_fwd) {
    st_ctl_step_end_ragged(c, drafted, n > 1 ? (int64_t)n * na : na, na, emitted, t_step, t_fwd);
}

void st_ctl_step_end_ragged(st_ctl *c, int drafted, int64_t T, int32_t na, int64_t emitted,
                            double t_step, double t_fwd) {
    const int b = bucket(na), tree = T > na;
    if (c->autotune && na >= 1 && na <= ST_GEN_MAX_BATCH && t_step > 0.0 && t_fwd >= 0.0) {
        const double tok = (double)emitted;
        if (!tree && emitted > 0)
            st_ctl_time_plain_batch(c, na, t_fwd), c->last_plain[b] = c->step;
        const double u = unit(c);
        if (u > 0.0) {
            const double t = t_step / u, pre = t_step > t_fwd ? (t_step - t_fwd) / u : 0.0;
            c->t_total = CTL_HORIZON * c->t_total + t, c->spent *= CTL_HORIZON;
            /* exploring lost its time beyond plain's for its tokens (ended plain: proposing) */
            if (c->explore && drafted)
                c->spent += fmax(0.0, tree ? t - tok / plain_rate(c, na) : pre);
            /* (proposals that ended plain were predicted as such, as the prediction weighs) */
            const pred p =
                tree ? c->pd : (pred){(double)na, c->pd.d + (double)na / plain_rate(c, na), 0.0, 1};
            if (drafted && c->pd_set)
                rec_add(c, &c->rall[b], CTL_FADE, tok, t, p.tok, p.t),
                    rec_add(c, &c->rd[b][c->dk][c->ds], CTL_POOL_FADE, tok, t, p.tok, p.t);
            if (tree && c->pt_set)
                rec_add(c, &c->rtree[b], CTL_FADE, tok, t, c->pt.tok, c->pt.t);
            /* (plain steps are recorded once their cost, the least of the first few, is set,
             * each at most CTL_OUTLIER times it: a plain step preempted early must not make
             * plain decoding look slow while trees are chosen, which take no plain steps) */
            if (!tree && emitted > 0 && t_fwd > 0.0 && c->tb_n[na] > CTL_MIN_OF)
                rec_add(c, &c->rp[b], CTL_FADE, tok,
                        fmin(t_fwd, CTL_OUTLIER * (double)na * c->tb[na]) / u, 0.0, 0.0);
        }
        if (tree)
            st_ctl_time_verify(c, T, t_fwd);
        if (drafted) /* (proposing: per sequence, in seconds) */
            track(&c->cp[b], c->cp_n[b]++, t_step > t_fwd ? (t_step - t_fwd) / (double)na : 0.0),
                c->last_draft = c->step;
    }
    c->pd_set = c->pt_set = c->explore = c->startup = 0, c->step++;
}

void st_ctl_rank(st_ctl *c, int32_t a, int32_t b, int64_t K, int64_t S, const float *scores,
                 const int32_t *tokens, const int64_t *level_parents, int64_t n_hist,
                 int32_t conf) {
    if (!c->autotune)
        return;
    const int32_t n1 = c->N - 1;
    rnode *rn = c->rn + (size_t)a * (size_t)n1;
    const int64_t M = st_tree_n_candidates(K, S) < c->Mmax ? st_tree_n_candidates(K, S) : c->Mmax;
    int64_t nf = 0;
    for (int64_t i = 0; i < M; i++)
        if (isfinite(scores[i]))
            c->fin[nf++] = i;
    conf = conf < 0 || conf >= CTL_CLASSES ? 0 : conf;
    double *E = c->E + (size_t)a * (size_t)(c->N + 1);
    const double *ow = c->own + 2 * (b >= 0 && b < c->bs ? b : 0),
                 mine =
                     b >= 0 && b < c->bs ? (ow[0] + CTL_OWN_PRIOR) / (ow[1] + CTL_OWN_PRIOR) : 1.0;
    static const float bins[CTL_BINS - 1] = CTL_BIN_AT;
    E[0] = E[1] = 0.0;
    int32_t cnt = 0, maxd = 0;
    /* a partial selection sort: the first n1 in st_tree_organize's order (st_ranks_before) */
    for (; cnt < n1 && cnt < nf; cnt++) {
        int64_t bi = cnt;
        for (int64_t i = cnt + 1; i < nf; i++)
            if (st_ranks_before(scores[c->fin[i]], c->fin[i], scores[c->fin[bi]], c->fin[bi]))
                bi = i;
        const int64_t cand = c->fin[bi];
        c->fin[bi] = c->fin[cnt], c->fin[cnt] = cand;
        rnode *r = &rn[cnt];
        r->cand = (int32_t)cand, r->tok = tokens[cand];
        if (cand < K) {
            r->depth = 1, r->par = -1, r->rank = (int32_t)cand;
        } else {
            const int64_t lvl = st_tree_candidate_level(K, cand),
                          q = cand - st_tree_level_base(K, lvl),
                          pc = level_parents[1 + (lvl - 1) * K + q / K];
            r->depth = (int32_t)lvl + 1, r->rank = (int32_t)(q % K);
            r->par = pc >= 0 && pc < c->Mmax && c->map[pc] >= 0 ? c->map[pc] : -2;
        }
        c->map[cand] = cnt, maxd = r->depth > maxd ? r->depth : maxd;
        const float s0 = scores[cand], sc = s0 > 1.0f ? 1.0f : s0 > 0.0f ? s0 : 0.0f;
        int32_t bin = 0, dd = r->depth > CTL_DEPTHS ? CTL_DEPTHS : r->depth;
        for (int32_t i = 0; i < CTL_BINS - 1; i++) /* (s0 is finite) */
            bin += s0 < bins[i];
        r->bucket = (conf * CTL_DEPTHS + dd - 1) * CTL_BINS + bin;
        const double p = (c->acc[r->bucket] + CTL_PRIOR_WEIGHT * (CTL_PRIOR_SCALE * (double)sc)) /
                         (c->seen[r->bucket] + CTL_PRIOR_WEIGHT);
        r->p = (float)(r->par == -2 ? 0.0 : p); /* (the bucket's; the sequence's own scales it) */
        E[cnt + 2] = E[cnt + 1] + (r->par == -2 ? 0.0 : fmin(1.0, p * mine));
    }
    for (int32_t j = 0; j < cnt; j++)
        c->map[rn[j].cand] = -1;
    for (int32_t m = cnt + 2; m <= c->N; m++)
        E[m] = E[cnt + 1];
    c->avail[a] = cnt;
    if (b < 0 || b >= c->bs || (c->seq_from[b] = n_hist, cnt == 0))
        return;
    /* the proposal as a shadow of sequence b: a free record, else the oldest */
    shadow *ring = c->sh + (size_t)b * CTL_RING;
    int32_t w = 0;
    for (int32_t i = 1; i < CTL_RING && ring[w].used; i++)
        w = !ring[i].used || ring[i].n0 < ring[w].n0 ? i : w;
    ring[w] = (shadow){n_hist, cnt, maxd, 1};
    memcpy(c->shn + ((size_t)b * CTL_RING + (size_t)w) * (size_t)n1, rn, (size_t)cnt * sizeof *rn);
}

void st_ctl_skip(st_ctl *c, int32_t a, int32_t b, int64_t n_hist) {
    if (c->autotune && a >= 0 && a < c->bs && b >= 0 && b < c->bs)
        c->avail[a] = 0, c->seq_from[b] = n_hist; /* (its drafter has nothing to catch up) */
}

int64_t st_ctl_ranked(const st_ctl *c, int32_t a, int32_t j) {
    if (a < 0 || a >= c->bs || j < 0 || j >= c->avail[a])
        return -1;
    return c->rn[(size_t)a * (size_t)(c->N - 1) + (size_t)j].cand;
}

int32_t st_ctl_depth(const st_ctl *c, int32_t a, int32_t n) {
    int32_t d = 0;
    const rnode *rn = c->rn + (size_t)a * (size_t)(c->N - 1);
    for (int32_t j = 0; j < n - 1 && j < c->avail[a]; j++)
        d = rn[j].depth > d ? rn[j].depth : d;
    return d;
}

void st_ctl_observe(st_ctl *c, int32_t b, const int32_t *hist, int64_t n_hist, int done) {
    if (!c->autotune || b < 0 || b >= c->bs)
        return;
    c->seq_len[b] = done ? 0 : n_hist, c->seq_from[b] = done ? 0 : c->seq_from[b];
    double *ow = c->own + 2 * b;
    if (done) /* a new request starts from the buckets' view */
        ow[0] = ow[1] = 0.0;
    shadow *ring = c->sh + (size_t)b * CTL_RING;
    for (int32_t w = 0; w < CTL_RING; w++) {
        shadow *r = &ring[w];
        if (!r->used || (!done && n_hist < r->n0 + r->maxd))
            continue;
        r->used = 0;
        const rnode *sn = c->shn + ((size_t)b * CTL_RING + (size_t)w) * (size_t)(c->N - 1);
        uint8_t ok[ST_SPEC_MAX_N];
        for (int32_t j = 0; !done && j < r->cnt && j < ST_SPEC_MAX_N; j++) {
            const int32_t p = sn[j].par, d = sn[j].depth, rk = sn[j].rank;
            const int reach = p == -1 || (p >= 0 && p < j && ok[p]);
            ok[j] = (uint8_t)(reach && hist[r->n0 + d - 1] == sn[j].tok);
            c->seen[sn[j].bucket] += 1.0, c->acc[sn[j].bucket] += ok[j];
            ow[0] = CTL_OWN_DECAY * ow[0] + ok[j], ow[1] = CTL_OWN_DECAY * ow[1] + sn[j].p;
            if (reach && d >= 1 && d <= ST_SPEC_MAX_S && rk >= 0 && rk < ST_SPEC_MAX_K)
                c->q_seen[d - 1][rk] += 1.0, c->q_acc[d - 1][rk] += ok[j];
        }
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

/* EAGLE-2's tree under the model: level 1 holds the root's K children, each next level the K
 * children of each of the K most likely nodes of the level before; the tree keeps the n-1 most
 * likely nodes. */
void st_ctl_tree_expect(const double *q, int32_t qk, int64_t K, int64_t S, int32_t nmax,
                        double *E) {
    double top[ST_SPEC_MAX_N], lvl[ST_SPEC_MAX_K], nxt[ST_SPEC_MAX_K];
    int32_t nt = 0, nl = 0;
    const int32_t cap = nmax - 1 < ST_SPEC_MAX_N ? nmax - 1 : ST_SPEC_MAX_N;
    for (int64_t d = 0; d < S; d++) {
        int32_t nn = 0;
        for (int32_t p = 0; p < (d ? nl : 1); p++)
            for (int64_t r = 0; r < K; r++) {
                const double v = (d ? lvl[p] : 1.0) * q[d * qk + r];
                top_insert(top, &nt, cap, v);
                top_insert(nxt, &nn, (int32_t)K, v);
            }
        memcpy(lvl, nxt, (size_t)nn * sizeof *lvl);
        nl = nn;
    }
    E[0] = 0.0;
    for (int32_t n = 1; n <= nmax; n++)
        E[n] = E[n - 1] + (n >= 2 && n - 2 < nt ? top[n - 2] : 0.0);
}

/* Pool (K, S) for na sequences: its best tree's prediction (drafting: a catch-up and S-1
 * level passes per sequence; the verify); *acc its expected accepted drafts. */
static pred plan_pool(const st_ctl *c, int32_t na, int64_t K, int64_t S, const double *e,
                      double *acc) {
    const int64_t M = st_tree_n_candidates(K, S);
    const int32_t nm = (int32_t)(M + 1 < c->N ? M + 1 : c->N);
    const double draft = (double)na * (c->c_catch + (double)(S - 1) * level_cost(c, K));
    pred best = {0.0, 1.0, draft, 2};
    for (int32_t n = 2; n <= nm; n++) {
        const pred p = {(double)na * (1.0 + e[n]),
                        draft + verify_est(c, (int64_t)na * n, &(int){0}), draft, n};
        if (p.tok / p.t > best.tok / best.t)
            best = p, *acc = e[n];
    }
    return best;
}

int st_ctl_want_draft(st_ctl *c, int32_t na, int64_t *K, int64_t *S) {
    *K = c->dk = c->K, *S = c->ds = c->S;
    c->pd_set = c->pt_set = c->explore = c->startup = 0;
    if (!c->autotune || c->off || na < 1 || na > c->bs)
        return !c->autotune;
    const int b = bucket(na);
    if (c->t1_n == 0) /* a drafter without a model's proposals calibrate until t1 is known */
        return !c->model_drafter;
    /* the yardstick: a plain step of this batch, measured and recent */
    if (c->tb_n[na] == 0 || c->step - c->last_plain[b] >= CTL_PLAIN_EVERY ||
        (c->model_drafter && c->t1_n < CTL_T1_FIRST)) /* (the first plain step runs cold) */
        return 0;
    if (c->model_drafter && c->c_catch_n < CTL_FIRST - 1) { /* chains measure the costs */
        *K = c->dk = c->k_auto ? 1 : c->K, c->startup = 1;
        return *S = c->ds = c->s_auto && c->S > CTL_FIRST_S ? CTL_FIRST_S : c->S, 1;
    }
    const double vp = plain_rate(c, na), cp = c->cp_n[b] ? c->cp[b] / unit(c) : 0.0;
    double rb[2], rh[2], q[ST_SPEC_MAX_S * ST_SPEC_MAX_K], E[ST_SPEC_MAX_N + 1];
    rec_ratio(c, &c->rall[b], ONE, 1.0, rb);
    /* the acceptance table (d, r): calibrated cells, unseen ones from the cell above/beside */
    for (int64_t d = 0; c->model_drafter && d < c->S; d++)
        for (int64_t r = 0; r < c->K; r++) {
            const double prior = r > 0   ? CTL_Q_PRIOR_RANK * q[d * ST_SPEC_MAX_K + r - 1]
                                 : d > 0 ? q[(d - 1) * ST_SPEC_MAX_K]
                                         : CTL_Q_PRIOR_DEPTH1;
            q[d * ST_SPEC_MAX_K + r] =
                (c->q_acc[d][r] + CTL_PRIOR_WEIGHT * prior) / (c->q_seen[d][r] + CTL_PRIOR_WEIGHT);
        }
    /* the greedy pool gv (the last plan's kept within the margin), the most optimistic other */
    int64_t gk = c->K, gs = c->S, xk = 0, xs = 0;
    double gv = -1.0, gm = 1.0, gx = 0.0, xu = -1.0, xv = 0.0, gacc = 0.0;
    pred gp = {0}, xp = {0};
    for (int64_t k = c->k_auto ? 1 : c->K; k <= c->K; k++)
        for (int64_t s = c->s_auto ? 1 : c->S; s <= c->S; s++) {
            double acc = 0.0;
            pred p = c->pb[b];
            const rec *r = &c->rd[b][k][s];
            if (c->model_drafter)
                st_ctl_tree_expect(q, ST_SPEC_MAX_K, k, s, c->N, E),
                    p = plan_pool(c, na, k, s, E, &acc);
            else if (!(p.t > 0.0)) /* no tree sized yet: plain, with its proposals */
                p = (pred){(double)na, (double)na / vp + (double)na * cp, (double)na * cp, 1};
            rec_ratio(c, r, rb, CTL_POOL_PRIOR, rh);
            const double v = p.tok / p.t * (c->model_drafter ? rh[0] * rh[1] : rb[0] * rb[1]),
                         x = v * (1.0 + CTL_Z / sqrt(r->w * rec_k(c, r) + CTL_POOL_PRIOR * CTL_W0)),
                         m = k == c->pk && s == c->ps ? 1.0 + CTL_MARGIN : 1.0;
            if (v * m > gv * gm) {
                if (gv > 0.0 && gx > xu) /* the greedy one so far becomes another */
                    xu = gx, xv = gv, xk = gk, xs = gs, xp = gp;
                gv = v, gm = m, gx = x, gk = k, gs = s, gp = p, gacc = acc;
            } else if (x > xu) {
                xu = x, xv = v, xk = k, xs = s, xp = p;
            }
        }
    /* whether to draft at all: what drafted steps realized here, the greedy value their prior */
    const rec *ra = &c->rall[b];
    const double k = rec_k(c, ra),
                 vb = (k * ra->tok + CTL_PRIOR_TIME * gv) / (k * ra->t + CTL_PRIOR_TIME);
    const int greedy = vb >= vp * (1.0 + CTL_MARGIN);
    if (c->model_drafter) { /* the plan, and the outlook: its pool, drafting's value here */
        c->pk = gk, c->ps = gs, c->pn = (int64_t)gp.n, c->pgain = gv / vp;
        c->ol.known = 1, c->ol.speedup = vb / vp;
        c->ol.tree_n = (int32_t)gp.n, c->ol.accept = gacc, c->ol.level_cost = level_cost(c, gk);
        c->ol.verify_cost = verify_est(c, na * (int64_t)gp.n, &(int){0}) / (double)na;
        c->ol_pay = greedy ? c->step : c->ol_pay;
    }
    /* a model drafter first catches each running sequence up on its tokens since its last
     * proposal (a row: as the first catch-up of CTL_ROWS measured, else a catch-up's / ROWS) */
    int64_t rows = 0;
    for (int32_t i = 0; c->model_drafter && i < c->bs; i++)
        rows += c->seq_len[i] > c->seq_from[i] ? c->seq_len[i] - c->seq_from[i] : 0;
    const double rows_t = (double)rows * (c->c_row_n ? c->c_row : c->c_catch / CTL_ROWS);
    const int wait = c->model_drafter && !c->c_row_n && c->step - c->last_draft > 1 &&
                     c->step - c->last_draft < CTL_ROWS;
    /* exploring: another pool while drafting, else drafting at all (by the bucket's evidence) */
    if (!greedy)
        xu = vb * (1.0 + CTL_Z / sqrt(ra->w * k + CTL_W0)), xv = vb, xk = gk, xs = gs, xp = gp;
    const double bar = greedy ? gv : vp, loss = (xv < bar ? xp.t * (1.0 - xv / bar) : 0.0) + rows_t;
    if (xk && xu > bar && !wait && c->spent + loss <= CTL_BUDGET * c->t_total + CTL_ALLOW)
        gk = xk, gs = xs, gp = xp, c->explore = 1;
    else if (!greedy) { /* (a tree of a drafter without a model: at the value that decided) */
        if (!c->model_drafter && c->ol.tree_n > 1)
            c->ol.speedup = vb / vp, c->ol.verify_cost = (1.0 + c->ol.accept) / c->ol.speedup;
        return 0;
    }
    gp.t += rows_t, gp.d += rows_t;
    *K = c->dk = gk, *S = c->ds = gs;
    c->pd = gp, c->pd_set = 1;
    return 1;
}

/* The plain step's prediction for na sequences and the ratio of realized to predicted tree
 * steps (rt); *vp plain decoding's rate. */
static pred plain_pred(const st_ctl *c, int32_t na, double *vp, double *rt) {
    const int b = bucket(na);
    const double cp = c->cp_n[b] ? c->cp[b] / unit(c) : 0.0;
    *vp = plain_rate(c, na), rt[0] = rt[1] = 1.0;
    if (!c->model_drafter) /* (a model drafter's pool was judged before drafting) */
        rec_ratio(c, &c->rtree[b], ONE, 1.0, rt);
    return (pred){(double)na, (double)na / *vp + (double)na * cp, (double)na * cp, 1};
}

/* The chosen tree (best, its gain bg over plain; pl the plain step's): kept when it pays or
 * explores; returns whether it is a tree. */
static int choose_end(st_ctl *c, int32_t na, pred best, pred pl, double bg, double *exp_gain) {
    const int tree = best.n > 1 && (c->explore || bg >= 1.0 + CTL_MARGIN);
    c->pt = best, c->pt_set = tree;
    if (!c->model_drafter)
        c->pd = c->pb[bucket(na)] = tree ? best : pl, c->pd_set = 1;
    if (tree && !c->explore && bg >= 1.0 + CTL_MARGIN) /* (an explored tree did not pay) */
        c->ol_pay = c->step, *exp_gain = bg;
    return tree;
}

int32_t st_ctl_choose(st_ctl *c, int32_t na, int64_t n_real_max, double *exp_gain) {
    *exp_gain = 1.0;
    if (!c->autotune) /* a fixed shape verifies what was drafted, up to N */
        return (int32_t)(n_real_max + 1 < c->N ? n_real_max + 1 : c->N);
    if (c->t1_n == 0 || na < 1 || na > c->bs)
        return 1;
    int mmax = 1, meas;
    for (int32_t a = 0; a < na; a++)
        mmax = c->avail[a] + 1 > mmax ? c->avail[a] + 1 : mmax;
    mmax = mmax > c->N ? c->N : mmax;
    /* a start-up chain is verified whole until that size is measured (its first runs cold) */
    if (c->startup && mmax > 1 && (verify_est(c, (int64_t)na * mmax, &meas), !meas))
        return mmax;
    if (c->tb_n[na] == 0) /* the yardstick first */
        return 1;
    double vp, rt[2], bg = 0.0;
    const pred plain = plain_pred(c, na, &vp, rt);
    pred best = plain;
    for (int32_t m = 2; m <= mmax; m++) {
        double tok = 0.0;
        for (int32_t a = 0; a < na; a++)
            tok += 1.0 + c->E[(size_t)a * (size_t)(c->N + 1) + m];
        const double t = verify_est(c, (int64_t)na * m, &meas) + plain.d,
                     g = tok / t * (rt[0] * rt[1]) / vp;
        if (g > bg) {
            bg = g, best = (pred){tok, t, plain.d, m};
            c->ol.known = 1, c->ol.speedup = g, c->ol.tree_n = m;
            c->ol.verify_cost = t * vp / (rt[1] * (double)na);
            c->ol.accept = tok * rt[0] / (double)na - 1.0;
        }
    }
    return choose_end(c, na, best, plain, bg, exp_gain) ? (int32_t)best.n : 1;
}

/* Grows n[0..na) by one node, to the sequence whose next ranked node adds the most expected
 * tokens (hi: each one's most); returns what it adds, or -1 when no sequence can grow. */
static double grow(const st_ctl *c, int32_t na, const int32_t *hi, int32_t *n) {
    int32_t w = -1;
    double dw = -1.0;
    for (int32_t a = 0; a < na; a++) {
        const double *E = c->E + (size_t)a * (size_t)(c->N + 1);
        if (n[a] < hi[a] && E[n[a] + 1] - E[n[a]] > dw)
            w = a, dw = E[n[a] + 1] - E[n[a]];
    }
    n[w >= 0 ? w : 0] += w >= 0;
    return dw;
}

int64_t st_ctl_choose_each(st_ctl *c, int32_t na, const int32_t *cap, const int64_t *n_real,
                           int32_t *n, double *exp_gain) {
    *exp_gain = 1.0;
    int32_t hi[ST_GEN_MAX_BATCH];
    int64_t T = 0, Thi = 0;
    for (int32_t a = 0; a < na && a < ST_GEN_MAX_BATCH; a++) {
        hi[a] = cap[a] > 0 && cap[a] < c->N ? cap[a] : c->N;
        const int64_t m = c->autotune ? c->avail[a] + 1 : n_real[a] + 1;
        hi[a] = m < hi[a] ? (int32_t)m : hi[a];
        n[a] = c->autotune ? 1 : hi[a]; /* a fixed shape verifies what was drafted */
        T += n[a], Thi += hi[a];
    }
    if (!c->autotune || c->t1_n == 0 || na < 1 || na > c->bs)
        return T;
    int meas;
    /* a start-up chain is verified whole until that size is measured (its first runs cold) */
    if (c->startup && Thi > na && (verify_est(c, Thi, &meas), !meas))
        return memcpy(n, hi, (size_t)na * sizeof *n), Thi;
    if (c->tb_n[na] == 0) /* the yardstick first */
        return na;
    /* the value rule over the trees of each total T: each node to the sequence it helps most */
    double vp, rt[2], bg = 0.0;
    const pred plain = plain_pred(c, na, &vp, rt);
    pred best = plain;
    double tok = (double)na, d;
    for (int64_t t = na + 1; t <= Thi && (d = grow(c, na, hi, n)) >= 0.0; t++) {
        const double tt = verify_est(c, t, &meas) + plain.d,
                     g = (tok += d) / tt * rt[0] * rt[1] / vp;
        if (g > bg)
            bg = g, best = (pred){tok, tt, plain.d, (double)t};
    }
    const int tree = choose_end(c, na, best, plain, bg, exp_gain);
    if (best.n > na) /* (the outlook, per sequence: the best tree, verified or not) */
        c->ol.known = 1, c->ol.speedup = bg, c->ol.tree_n = (int32_t)(best.n / na + 0.5),
        c->ol.verify_cost = best.t * vp / (rt[1] * (double)na),
        c->ol.accept = best.tok * rt[0] / (double)na - 1.0;
    for (int32_t a = 0; a < na; a++) /* the best T's trees, grown again */
        n[a] = 1;
    for (int64_t t = na; tree && t < (int64_t)best.n; t++)
        grow(c, na, hi, n);
    return tree ? (int64_t)best.n : na;
}
