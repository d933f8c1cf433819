/*
 * ctl_rank.c: the `auto` controller's ranking of each step's candidates (in st_tree_organize's
 * order) and the calibration of node acceptance from their shadows, scored against the tokens
 * each sequence then emits, verified or not (see ctl.h).
 */
#include "ctl/ctl_internal.h"

#include <math.h>

/* st_tree_organize's order (st_ranks_before). */
static int ranks_before(const float *score, int64_t a, int64_t b) {
    return st_ranks_before(score[a], a, score[b], b);
}

static int32_t score_bin(float s) {
    return s >= CTL_BIN_1 ? 0 : s >= CTL_BIN_2 ? 1 : s >= CTL_BIN_3 ? 2 : s >= CTL_BIN_4 ? 3 : 4;
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
        c->sh_rank[o + j] = c->rank[s + j];
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
        int32_t d, parent, rank;
        if (cand < K) {
            d = 1;
            parent = -1;
            rank = (int32_t)cand;
        } else {
            const int64_t lvl = st_tree_candidate_level(K, cand);
            const int64_t q = cand - st_tree_level_base(K, lvl);
            const int64_t pc = level_parents[1 + (lvl - 1) * K + q / K];
            d = (int32_t)lvl + 1;
            parent = pc >= 0 && pc < c->Mmax && c->map[pc] >= 0 ? c->map[pc] : -2;
            rank = (int32_t)(q % K);
        }
        c->map[cand] = cnt;
        const int32_t bk = (conf * CTL_DEPTHS + (d > CTL_DEPTHS ? CTL_DEPTHS : d) - 1) * CTL_BINS +
                           score_bin(scores[cand]);
        c->order[s0 + cnt] = cand;
        c->bucket[s0 + cnt] = bk;
        c->depth[s0 + cnt] = d;
        c->par[s0 + cnt] = parent;
        c->tok[s0 + cnt] = tokens[cand];
        c->rank[s0 + cnt] = rank;
        E[cnt + 2] = E[cnt + 1] + (parent == -2 ? 0.0 : bucket_p(c, bk, scores[cand]));
    }
    for (int32_t j = 0; j < cnt; j++)
        c->map[c->order[s0 + j]] = -1;
    for (int32_t m = cnt + 2; m <= c->N; m++)
        E[m] = E[cnt + 1];
    c->avail[a] = cnt;
    if (b >= 0 && b < c->bs)
        c->seq_from[b] = n_hist;
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

void st_ctl_observe(st_ctl *c, int32_t b, const int32_t *hist, int64_t n_hist, int done) {
    if (!c->autotune || b < 0 || b >= c->bs)
        return;
    const int32_t n1 = c->N - 1;
    c->seq_len[b] = done ? 0 : n_hist;
    if (done)
        c->seq_from[b] = 0;
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
            const int32_t d = c->sh_depth[o + j], rk = c->sh_rank[o + j];
            ok[j] = (uint8_t)(reach && hist[r->n0 + d - 1] == c->sh_tok[o + j]);
            c->seen[c->sh_bucket[o + j]] += 1.0;
            c->acc[c->sh_bucket[o + j]] += ok[j];
            if (reach && d >= 1 && d <= CTL_QD && rk >= 0 && rk < CTL_QK) {
                c->q_seen[d - 1][rk] += 1.0;
                c->q_acc[d - 1][rk] += ok[j];
            }
        }
        r->used = 0;
    }
}
