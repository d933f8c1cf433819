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

enum { NG_HASH_BITS = 12, NG_WALK = 2048 };

typedef struct ngram {
    st_drafter base;
    /* index of min_match-grams: head[h] is the latest end e (hist[e-min_match, e) hashes to h,
     * hist[e] follows it), prev[e] the one before with the same hash; -1 ends a chain */
    int32_t *head;            /* (1 << NG_HASH_BITS) */
    int32_t *prev;            /* (cap), a region committed as the history grows (st_lazy_alloc) */
    int64_t cap;              /* longest history indexed */
    int64_t indexed;          /* ends e < indexed are in the index */
    int32_t *walk_e, *walk_m; /* (NG_WALK) occurrences visited and their match lengths */
    int32_t min_match, max_match, breadth;
    int64_t max_k, max_s;
    trie_node *nodes; /* (1 + breadth*max_s) */
    int32_t n_nodes;
    int32_t *level; /* (max_k) trie nodes expanded at the current level */
    int32_t *next;  /* (max_k) */
    int32_t *cand;  /* (max_k*max_k) trie node of each candidate of a level, or -1 */
    int64_t *pick;  /* (max_k) expanded candidates of a level */
    void *mem;      /* the one allocation all the arrays above live in */
} ngram;

static uint32_t gram_hash(const int32_t *p, int32_t m) {
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i < m; i++)
        h = (h ^ (uint32_t)p[i]) * 16777619u;
    return h >> (32 - NG_HASH_BITS);
}

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

/* A history that is not the one indexed so far resets the index at the next proposal. */
static void ngram_reset(st_drafter *d) { ((ngram *)d)->indexed = INT64_MAX; }

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
    const int32_t mm = g->min_match;
    if (n_hist > g->cap || n_hist < g->indexed) { /* not the history indexed so far */
        memset(g->head, 0xff, sizeof(int32_t) << NG_HASH_BITS);
        g->indexed = mm;
    }
    for (int64_t e = g->indexed; e <= n_hist - 1 && e < g->cap; e++) {
        uint32_t h = gram_hash(hist + e - mm, mm);
        g->prev[e] = g->head[h];
        g->head[h] = (int32_t)e;
    }
    if (n_hist - 1 >= g->indexed)
        g->indexed = n_hist;
    /* walk the occurrences of the last min_match tokens, most recent first, measuring how many
     * tokens (up to max_match) each one shares with the end of the text */
    int32_t nw = 0, best_len = 0;
    if (n_hist > mm) {
        const int32_t *suf = hist + n_hist - mm;
        for (int32_t e = g->head[gram_hash(suf, mm)]; e >= 0 && nw < NG_WALK; e = g->prev[e]) {
            if (memcmp(hist + e - mm, suf, (size_t)mm * sizeof *hist) != 0)
                continue; /* hash collision */
            int32_t ml = mm;
            while (ml < g->max_match && e - ml - 1 >= 0 && n_hist - ml - 1 >= 0 &&
                   hist[e - ml - 1] == hist[n_hist - ml - 1])
                ml++;
            g->walk_e[nw] = e;
            g->walk_m[nw++] = ml;
            best_len = ml > best_len ? ml : best_len;
        }
    }
    /* the most recent `breadth` occurrences of the longest match length found */
    for (int32_t w = 0; w < nw && found < g->breadth; w++) {
        if (g->walk_m[w] < best_len)
            continue;
        int64_t e = g->walk_e[w];
        found++;
        int32_t node = 0;
        g->nodes[0].count++;
        for (int64_t t = 0; t < S && e + t < n_hist; t++) {
            node = trie_child(g, node, hist[e + t]);
            g->nodes[node].count++;
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
        const int64_t base = st_tree_level_base(K, i);
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
        st_draft_expand_level(scores, K, i, level_parents + lp, lpw - lp, g->pick);
        for (int64_t k = 0; k < K; k++)
            g->next[k] = g->pick[k] >= 0 ? g->cand[g->pick[k]] : -1;
        memcpy(g->level, g->next, (size_t)K * sizeof *g->level);
        lp += K;
    }
    /* confidence class: the match length (1, 2, 3, 4-5, 6-7, 8+) and whether several
     * occurrences were merged */
    const int32_t ml_class = best_len <= 3   ? (best_len > 0 ? best_len - 1 : 0)
                             : best_len <= 5 ? 3
                             : best_len <= 7 ? 4
                                             : 5;
    d->conf = ml_class + (found > 1 ? 6 : 0);
    *n_real = real;
    d->ms += (st_time_now() - t0) * 1e3;
    return ST_OK;
}

static void ngram_free(st_drafter *d) {
    ngram *g = (ngram *)d;
    if (!g)
        return;
    st_lazy_free(g->prev, (size_t)g->cap * sizeof *g->prev);
    st_free_aligned(g->mem);
    st_free(g);
}

/* The arrays of g in one planned block (st_plan: a sizing pass, then a carving pass). */
static void ngram_layout(ngram *g, st_plan *p) {
    const size_t K = (size_t)g->max_k;
    g->nodes = st_plan_take(p, (size_t)(1 + (int64_t)g->breadth * g->max_s), sizeof *g->nodes);
    g->level = st_plan_take(p, K, sizeof *g->level);
    g->next = st_plan_take(p, K, sizeof *g->next);
    g->cand = st_plan_take(p, K * K, sizeof *g->cand);
    g->pick = st_plan_take(p, K, sizeof *g->pick);
    g->head = st_plan_take(p, (size_t)1 << NG_HASH_BITS, sizeof *g->head);
    g->walk_e = st_plan_take(p, NG_WALK, sizeof *g->walk_e);
    g->walk_m = st_plan_take(p, NG_WALK, sizeof *g->walk_m);
}

st_status st_drafter_ngram_create(int32_t min_match, int32_t max_match, int32_t breadth,
                                  int64_t max_k, int64_t max_s, int64_t max_hist, bool populate,
                                  st_drafter **out) {
    *out = NULL;
    if (min_match < 1 || max_match < min_match || max_match > ST_NGRAM_MAX_MATCH || breadth < 1 ||
        breadth > ST_NGRAM_MAX_BREADTH || max_k < 1 || max_k > ST_SPEC_MAX_K || max_s < 1 ||
        max_s > ST_SPEC_MAX_S)
        return st_fail(ST_ERR_INVALID,
                       "ngram drafter: need 1 <= min_match (%d) <= max_match (%d) <= %d, "
                       "1 <= breadth (%d) <= %d, K in 1..%d, S in 1..%d",
                       min_match, max_match, ST_NGRAM_MAX_MATCH, breadth, ST_NGRAM_MAX_BREADTH,
                       ST_SPEC_MAX_K, ST_SPEC_MAX_S);
    ngram *g = st_calloc(1, sizeof *g);
    if (!g)
        return st_fail(ST_ERR_NOMEM, "ngram drafter: out of memory");
    g->base.propose = ngram_propose;
    g->base.reset = ngram_reset;
    g->base.free = ngram_free;
    g->min_match = min_match;
    g->max_match = max_match;
    g->breadth = breadth;
    g->max_k = max_k;
    g->max_s = max_s;
    g->cap = max_hist > 0 ? max_hist : 1;
    g->indexed = INT64_MAX; /* forces a reset on first use */
    st_plan pl = {0};
    ngram_layout(g, &pl);
    if (!(g->mem = st_plan_alloc(&pl))) {
        ngram_free(&g->base);
        return st_fail(ST_ERR_NOMEM, "ngram drafter: out of memory");
    }
    ngram_layout(g, &pl);
    if (!(g->prev = st_lazy_alloc((size_t)g->cap * sizeof *g->prev, populate))) {
        ngram_free(&g->base);
        return st_fail(ST_ERR_NOMEM, "ngram drafter: out of memory for a history of %lld",
                       (long long)g->cap);
    }
    *out = &g->base;
    return ST_OK;
}
