/*
 * ngram.c: the n-gram drafter (prompt lookup decoding, SGLang's NGRAM): finds earlier
 * occurrences of the longest suffix of the text (max_match down to min_match tokens), takes
 * the S tokens that followed each of up to `breadth` most recent occurrences, merges them into
 * a trie and scores each node by the fraction of occurrences that pass through it. The trie is
 * then written as EAGLE-2-style draft results: K children per expanded node, the K best nodes
 * of each level expanded.
 */
#include "draft/drafter.h"

#include <math.h>
#include <string.h>

typedef struct trie_node {
    int32_t token;
    int32_t count;
    int32_t child;   /* first child or -1 */
    int32_t sibling; /* next sibling or -1 */
} trie_node;

typedef struct ngram {
    st_drafter base;
    int32_t min_match, max_match, breadth;
    int64_t max_k, max_s;
    trie_node *nodes; /* (1 + breadth*max_s) */
    int32_t n_nodes;
    int32_t *level; /* (max_k) trie nodes expanded at the current level */
    int32_t *next;  /* (max_k) */
    int32_t *cand;  /* (max_k*max_k) trie node of each candidate of a level, or -1 */
} ngram;

static int32_t trie_child(ngram *g, int32_t parent, int32_t token) {
    for (int32_t c = g->nodes[parent].child; c >= 0; c = g->nodes[c].sibling)
        if (g->nodes[c].token == token)
            return c;
    int32_t c = g->n_nodes++;
    g->nodes[c] = (trie_node){token, 0, -1, g->nodes[parent].child};
    g->nodes[parent].child = c;
    return c;
}

/* The k-th best child of a trie node (by count, then lower token), or -1. O(children * k). */
static int32_t kth_child(const ngram *g, int32_t parent, int64_t k) {
    int32_t prev = -1;
    for (int64_t r = 0; r <= k; r++) {
        int32_t best = -1;
        for (int32_t c = g->nodes[parent].child; c >= 0; c = g->nodes[c].sibling) {
            const trie_node *n = &g->nodes[c];
            /* strictly after prev in the order */
            if (prev >= 0) {
                const trie_node *p = &g->nodes[prev];
                if (n->count > p->count || (n->count == p->count && n->token <= p->token))
                    continue;
            }
            if (best < 0 || n->count > g->nodes[best].count ||
                (n->count == g->nodes[best].count && n->token < g->nodes[best].token))
                best = c;
        }
        if (best < 0)
            return -1;
        prev = best;
    }
    return prev;
}

static st_status ngram_propose(st_drafter *d, const int32_t *hist, int64_t n_hist, int64_t K,
                               int64_t S, float *scores, int32_t *tokens, int64_t *level_parents,
                               int64_t *n_real) {
    ngram *g = (ngram *)d;
    double t0 = st_time_now();
    if (K > g->max_k || S > g->max_s)
        return st_fail(ST_ERR_INVALID, "ngram drafter: K %lld / S %lld above its limits",
                       (long long)K, (long long)S);
    g->n_nodes = 1;
    g->nodes[0] = (trie_node){-1, 0, -1, -1};
    int32_t found = 0;
    for (int32_t m = g->max_match; m >= g->min_match && found == 0; m--) {
        if (n_hist <= m)
            continue;
        const int32_t *suf = hist + n_hist - m;
        /* occurrences ending at j (exclusive end e = j + 1 <= n_hist - 1), most recent first */
        for (int64_t e = n_hist - 1; e >= m && found < g->breadth; e--) {
            if (memcmp(hist + e - m, suf, (size_t)m * sizeof *hist) != 0)
                continue;
            found++;
            int32_t node = 0;
            g->nodes[0].count++;
            for (int64_t s = 0; s < S && e + s < n_hist; s++) {
                node = trie_child(g, node, hist[e + s]);
                g->nodes[node].count++;
            }
        }
    }
    int64_t M = st_tree_n_candidates(K, S);
    for (int64_t i = 0; i < M; i++) {
        scores[i] = -INFINITY;
        tokens[i] = 0;
    }
    int64_t real = 0;
    float total = g->nodes[0].count > 0 ? (float)g->nodes[0].count : 1.0f;
    /* level 0: the K best children of the root */
    level_parents[0] = -1;
    int32_t nlev = 0;
    for (int64_t c = 0; c < K; c++) {
        level_parents[1 + c] = c;
        int32_t t = found ? kth_child(g, 0, c) : -1;
        g->level[c] = t;
        if (t >= 0) {
            scores[c] = (float)g->nodes[t].count / total;
            tokens[c] = g->nodes[t].token;
            real++;
            nlev++;
        }
    }
    int64_t lp = K + 1, lpw = st_tree_level_parents_width(K, S);
    for (int64_t i = 1; i < S; i++) {
        int64_t base = K + (i - 1) * K * K;
        for (int64_t p = 0; p < K; p++)
            for (int64_t c = 0; c < K; c++) {
                int32_t t = g->level[p] >= 0 ? kth_child(g, g->level[p], c) : -1;
                g->cand[p * K + c] = t;
                if (t >= 0) {
                    scores[base + p * K + c] = (float)g->nodes[t].count / total;
                    tokens[base + p * K + c] = g->nodes[t].token;
                    real++;
                }
            }
        /* expand the K best candidates of this level (ties: lower index) */
        for (int64_t k = 0; k < K; k++) {
            int64_t best = -1;
            for (int64_t q = 0; q < K * K; q++) {
                if (g->cand[q] < 0)
                    continue;
                if (best < 0 || scores[base + q] > scores[base + best])
                    best = q;
            }
            g->next[k] = best >= 0 ? g->cand[best] : -1;
            if (lp + k < lpw)
                level_parents[lp + k] = best >= 0 ? base + best : base; /* unused slot */
            if (best >= 0)
                g->cand[best] = -1;
        }
        memcpy(g->level, g->next, (size_t)K * sizeof *g->level);
        lp += K;
    }
    *n_real = real;
    d->ms += (st_time_now() - t0) * 1e3;
    return ST_OK;
}

static void ngram_free(st_drafter *d) {
    ngram *g = (ngram *)d;
    if (!g)
        return;
    st_free(g->nodes);
    st_free(g->level);
    st_free(g->next);
    st_free(g->cand);
    st_free(g);
}

st_status st_drafter_ngram_create(int32_t min_match, int32_t max_match, int32_t breadth,
                                  int64_t max_k, int64_t max_s, st_drafter **out) {
    *out = NULL;
    if (min_match < 1 || max_match < min_match || max_match > 64 || breadth < 1 || breadth > 4096 ||
        max_k < 1 || max_k > 64 || max_s < 1 || max_s > 64)
        return st_fail(ST_ERR_INVALID,
                       "ngram drafter: need 1 <= min_match (%d) <= max_match (%d) <= 64, "
                       "1 <= breadth (%d) <= 4096, K and S in 1..64",
                       min_match, max_match, breadth);
    ngram *g = st_calloc(1, sizeof *g);
    if (!g)
        return st_fail(ST_ERR_NOMEM, "ngram drafter: out of memory");
    g->base.propose = ngram_propose;
    g->base.free = ngram_free;
    g->min_match = min_match;
    g->max_match = max_match;
    g->breadth = breadth;
    g->max_k = max_k;
    g->max_s = max_s;
    g->nodes = st_malloc((size_t)(1 + (int64_t)breadth * max_s) * sizeof *g->nodes);
    g->level = st_malloc((size_t)max_k * sizeof *g->level);
    g->next = st_malloc((size_t)max_k * sizeof *g->next);
    g->cand = st_malloc((size_t)(max_k * max_k) * sizeof *g->cand);
    if (!g->nodes || !g->level || !g->next || !g->cand) {
        ngram_free(&g->base);
        return st_fail(ST_ERR_NOMEM, "ngram drafter: out of memory");
    }
    *out = &g->base;
    return ST_OK;
}
