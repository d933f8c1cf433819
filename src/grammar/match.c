/*
 * match.c: runs a grammar over bytes as a set of parse stacks (a pushdown automaton kept
 * nondeterministic, as llama.cpp's grammar sampler does). A stack holds the return positions
 * of the rules entered, its top an element that must consume the next byte; a rule reference
 * in tail position is not kept (so repetitions do not grow stacks). The mask of a state walks
 * the vocabulary as a byte trie, advancing the state one byte per trie edge, and is cached by
 * state; it depends only on the state, so a tree node masked after its own path gets the mask
 * plain decoding gets there.
 */
#include "grammar/grammar.h"
#include "tok/tok.h"

#include <math.h>
#include <string.h>

#define MAX_DEPTH 1024   /* entries of one stack; deeper stacks are dropped (nesting that deep) */
#define MAX_STACKS 1024  /* stacks of one state; more are dropped (a grammar that ambiguous) */
#define CACHE_N 64       /* cached masks per matcher */
#define MAX_EXPAND 65536 /* expansion steps per advanced byte (2^n ways through n empty rules) */

void st_gstate_free(st_gstate *st) {
    if (!st)
        return;
    st_free(st->buf);
    memset(st, 0, sizeof *st);
}

static void clear(st_gstate *st) { st->n = 0, st->n_stacks = 0; }

static int reserve(st_gstate *st, int64_t extra) {
    if (st->n + extra <= st->cap)
        return 0;
    int64_t c = st->cap ? st->cap : 64;
    while (c < st->n + extra)
        c *= 2;
    int32_t *b = st_realloc(st->buf, (size_t)c * sizeof *b);
    if (!b)
        return -1;
    st->buf = b, st->cap = c;
    return 0;
}

st_status st_gstate_copy(st_gstate *dst, const st_gstate *src) {
    clear(dst);
    if (reserve(dst, src->n))
        return st_fail(ST_ERR_NOMEM, "grammar: out of memory");
    if (src->n)
        memcpy(dst->buf, src->buf, (size_t)src->n * sizeof *src->buf);
    dst->n = src->n, dst->n_stacks = src->n_stacks;
    return ST_OK;
}

/* Adds stack w[0..d) unless already present; -1 out of memory. */
static int add_stack(st_gstate *out, const int32_t *w, int32_t d) {
    for (int64_t i = 0; i < out->n; i += 1 + out->buf[i])
        if (out->buf[i] == d && !memcmp(out->buf + i + 1, w, (size_t)d * sizeof *w))
            return 0;
    if (out->n_stacks >= MAX_STACKS)
        return 0;
    if (reserve(out, d + 1))
        return -1;
    out->buf[out->n++] = d;
    if (d)
        memcpy(out->buf + out->n, w, (size_t)d * sizeof *w);
    out->n += d;
    out->n_stacks++;
    return 0;
}

/* Adds every stack stack w[0..d) becomes once its top is a byte set (or it is empty). w has
 * room for MAX_DEPTH + 1 entries and is restored before returning. Terminates because the
 * grammar has no left recursion; *budget bounds the steps (deterministically). */
static int expand(const st_grammar *g, st_gstate *out, int32_t *w, int32_t d, int64_t *budget) {
    if (--*budget < 0)
        return 0; /* a grammar that ambiguous: the rest of the ways are dropped */
    if (d == 0)
        return add_stack(out, w, 0);
    const int32_t p = w[d - 1];
    const st_gel e = g->el[p];
    if (e.kind == ST_GEL_END)
        return expand(g, out, w, d - 1, budget);
    if (e.kind == ST_GEL_SET)
        return add_stack(out, w, d);
    const int32_t saved = w[d - 1];
    int32_t nd = d;
    if (g->el[p + 1].kind == ST_GEL_END)
        nd = d - 1; /* tail position: nothing to return to here */
    else
        w[d - 1] = p + 1;
    int rc = 0;
    if (nd < MAX_DEPTH)
        for (int32_t a = g->alt_off[e.arg]; a < g->alt_off[e.arg + 1] && !rc; a++) {
            w[nd] = g->alts[a];
            rc = expand(g, out, w, nd + 1, budget);
        }
    w[d - 1] = saved;
    return rc;
}

st_status st_gstate_start(const st_grammar *g, st_gstate *out) {
    clear(out);
    int32_t *w = st_malloc((MAX_DEPTH + 1) * sizeof *w);
    int rc = !w;
    int64_t budget = MAX_EXPAND;
    for (int32_t a = g->alt_off[g->root]; a < g->alt_off[g->root + 1] && !rc; a++) {
        w[0] = g->alts[a];
        rc = expand(g, out, w, 1, &budget);
    }
    st_free(w);
    return rc ? st_fail(ST_ERR_NOMEM, "grammar: out of memory") : ST_OK;
}

/* st_gstate_advance with a caller's working stack (MAX_DEPTH + 1 entries). */
static int advance_w(const st_grammar *g, const st_gstate *st, uint8_t c, st_gstate *out,
                     int32_t *w) {
    clear(out);
    int64_t budget = MAX_EXPAND;
    for (int64_t i = 0; i < st->n; i += 1 + st->buf[i]) {
        const int32_t d = st->buf[i];
        if (d == 0)
            continue;
        const int32_t p = st->buf[i + d];
        if (!st_gset_has(&g->sets[g->el[p].arg], c))
            continue;
        memcpy(w, st->buf + i + 1, (size_t)d * sizeof *w);
        w[d - 1] = p + 1;
        if (expand(g, out, w, d, &budget))
            return -1;
    }
    return 0;
}

st_status st_gstate_advance(const st_grammar *g, const st_gstate *st, uint8_t c, st_gstate *out) {
    int32_t *w = st_malloc((MAX_DEPTH + 1) * sizeof *w);
    if (!w || advance_w(g, st, c, out, w)) {
        st_free(w);
        return st_fail(ST_ERR_NOMEM, "grammar: out of memory");
    }
    st_free(w);
    return ST_OK;
}

int st_gstate_accepting(const st_gstate *st) {
    for (int64_t i = 0; i < st->n; i += 1 + st->buf[i])
        if (st->buf[i] == 0)
            return 1;
    return 0;
}

st_status st_grammar_match(const st_grammar *g, const char *s, size_t n, int *result) {
    if (!g || !result || (!s && n))
        return st_fail(ST_ERR_INVALID, "st_grammar_match: bad argument");
    st_gstate a = {0}, b = {0};
    st_status rc = st_gstate_start(g, &a);
    for (size_t i = 0; i < n && rc == ST_OK && a.n_stacks; i++) {
        rc = st_gstate_advance(g, &a, (uint8_t)s[i], &b);
        st_gstate t = a;
        a = b, b = t;
    }
    *result = a.n_stacks == 0 ? -1 : st_gstate_accepting(&a) ? 1 : 0;
    st_gstate_free(&a);
    st_gstate_free(&b);
    return rc;
}

/* ---------------------------------------------------------------- the matcher */

typedef struct mask_entry {
    uint64_t hash;
    int32_t *key; /* the state's buffer */
    int64_t n_key;
    uint32_t *bits; /* (n_tok) allowed tokens */
    int accept, any;
} mask_entry;

struct st_gmatcher {
    const st_grammar *g;
    const st_tokenizer *t;
    int32_t n_tok;
    st_gstate cur;  /* after the committed tokens */
    st_gstate a, b; /* along a path */
    int32_t *w;     /* (MAX_DEPTH + 1) working stack */
    /* the vocabulary as a trie of byte edges: node 0 is the root */
    int32_t n_nodes;
    int32_t *child, *sibling, *tok_head; /* (n_nodes) */
    uint8_t *byte;                       /* (n_nodes) the edge into the node */
    int32_t *tok_next;                   /* (n_tok) tokens ending at the same node */
    st_gstate *lvl;                      /* (max_dec + 1) the states of a trie walk */
    int32_t n_lvl;
    mask_entry cache[CACHE_N];
    int32_t next_slot;
    int64_t words;
};

void st_gmatcher_free(st_gmatcher *m) {
    if (!m)
        return;
    st_gstate_free(&m->cur);
    st_gstate_free(&m->a);
    st_gstate_free(&m->b);
    st_free(m->w);
    st_free(m->child);
    st_free(m->sibling);
    st_free(m->tok_head);
    st_free(m->byte);
    st_free(m->tok_next);
    for (int32_t i = 0; m->lvl && i < m->n_lvl; i++)
        st_gstate_free(&m->lvl[i]);
    st_free(m->lvl);
    for (int i = 0; i < CACHE_N; i++) {
        st_free(m->cache[i].key);
        st_free(m->cache[i].bits);
    }
    st_free(m);
}

static const uint8_t *tok_bytes(const st_tokenizer *t, int32_t id, size_t *n) {
    *n = t->dec_off[id + 1] - t->dec_off[id];
    return (const uint8_t *)t->dec + t->dec_off[id];
}

st_status st_gmatcher_create(const st_grammar *g, const st_tokenizer *t, int32_t n_tok,
                             st_gmatcher **out) {
    if (!g || !t || !out || n_tok < 1 || n_tok > t->n_vocab)
        return st_fail(ST_ERR_INVALID, "st_gmatcher_create: bad argument");
    *out = NULL;
    st_gmatcher *m = st_calloc(1, sizeof *m);
    if (!m)
        return st_fail(ST_ERR_NOMEM, "grammar: out of memory");
    m->g = g, m->t = t, m->n_tok = n_tok;
    m->words = (n_tok + 31) / 32;
    int64_t cap = 1;
    for (int32_t i = 0; i < n_tok; i++)
        cap += (int64_t)(t->dec_off[i + 1] - t->dec_off[i]);
    if (cap > INT32_MAX)
        goto nomem;
    m->w = st_malloc((MAX_DEPTH + 1) * sizeof *m->w);
    m->child = st_malloc((size_t)cap * sizeof *m->child);
    m->sibling = st_malloc((size_t)cap * sizeof *m->sibling);
    m->tok_head = st_malloc((size_t)cap * sizeof *m->tok_head);
    m->byte = st_malloc((size_t)cap);
    m->tok_next = st_malloc((size_t)n_tok * sizeof *m->tok_next);
    m->n_lvl = (int32_t)t->max_dec + 2;
    m->lvl = st_calloc((size_t)m->n_lvl, sizeof *m->lvl);
    if (!m->w || !m->child || !m->sibling || !m->tok_head || !m->byte || !m->tok_next || !m->lvl)
        goto nomem;
    m->n_nodes = 1;
    m->child[0] = m->sibling[0] = m->tok_head[0] = -1;
    m->byte[0] = 0;
    for (int32_t id = 0; id < n_tok; id++) {
        size_t n;
        const uint8_t *s = tok_bytes(t, id, &n);
        m->tok_next[id] = -1;
        if (n == 0 || t->eog[id])
            continue; /* no bytes: never allowed; end of generation: decided by the state */
        int32_t u = 0;
        for (size_t i = 0; i < n; i++) {
            int32_t c = m->child[u];
            while (c >= 0 && m->byte[c] != s[i])
                c = m->sibling[c];
            if (c < 0) {
                c = m->n_nodes++;
                m->child[c] = m->tok_head[c] = -1;
                m->byte[c] = s[i];
                m->sibling[c] = m->child[u];
                m->child[u] = c;
            }
            u = c;
        }
        m->tok_next[id] = m->tok_head[u];
        m->tok_head[u] = id;
    }
    st_status rc = st_gstate_start(g, &m->cur);
    if (rc) {
        st_gmatcher_free(m);
        return rc;
    }
    *out = m;
    return ST_OK;
nomem:
    st_gmatcher_free(m);
    return st_fail(ST_ERR_NOMEM, "grammar: out of memory");
}

/* out = st after token tok: its bytes, or for an end-of-generation token the end of the
 * sentence (only the empty stack, if st could end). */
static int advance_token(st_gmatcher *m, const st_gstate *st, int32_t tok, st_gstate *out) {
    clear(out);
    if (tok < 0 || tok >= m->n_tok)
        return 0;
    if (m->t->eog[tok])
        return st_gstate_accepting(st) ? add_stack(out, m->w, 0) : 0;
    size_t n;
    const uint8_t *s = tok_bytes(m->t, tok, &n);
    if (n == 0)
        return 0;
    st_gstate *x = &m->lvl[0], *y = &m->lvl[1];
    const st_gstate *from = st;
    for (size_t i = 0; i < n; i++) {
        st_gstate *to = i + 1 == n ? out : (i % 2 ? x : y);
        if (advance_w(m->g, from, s[i], to, m->w))
            return -1;
        if (to->n_stacks == 0) {
            clear(out);
            return 0;
        }
        from = to;
    }
    return 0;
}

st_status st_gmatcher_accept(st_gmatcher *m, int32_t tok) {
    if (tok >= 0 && tok < m->n_tok && m->t->eog[tok])
        return ST_OK;
    if (advance_token(m, &m->cur, tok, &m->a))
        return st_fail(ST_ERR_NOMEM, "grammar: out of memory");
    st_gstate t = m->cur;
    m->cur = m->a, m->a = t;
    return ST_OK;
}

/* The state after the committed tokens and path[0..n): m->cur itself or one of m->a, m->b. */
static const st_gstate *along(st_gmatcher *m, const int32_t *path, int64_t n, st_status *rc) {
    const st_gstate *st = &m->cur;
    *rc = ST_OK;
    for (int64_t i = 0; i < n; i++) {
        st_gstate *to = st == &m->a ? &m->b : &m->a;
        if (advance_token(m, st, path[i], to)) {
            *rc = st_fail(ST_ERR_NOMEM, "grammar: out of memory");
            return st;
        }
        st = to;
        if (st->n_stacks == 0)
            break;
    }
    return st;
}

int st_gmatcher_path_ok(st_gmatcher *m, const int32_t *path, int64_t n_path) {
    st_status rc;
    const st_gstate *st = along(m, path, n_path, &rc);
    return rc == ST_OK && st->n_stacks > 0;
}

/* Marks in bits every token whose bytes continue the trie walk from node u in state st. */
static int walk(st_gmatcher *m, int32_t u, int32_t depth, const st_gstate *st, uint32_t *bits,
                int *any) {
    /* the bytes some stack can consume next */
    st_gset next;
    memset(&next, 0, sizeof next);
    for (int64_t i = 0; i < st->n; i += 1 + st->buf[i])
        if (st->buf[i] > 0) {
            const st_gset *s = &m->g->sets[m->g->el[st->buf[i + st->buf[i]]].arg];
            for (int k = 0; k < 8; k++)
                next.bits[k] |= s->bits[k];
        }
    st_gset *probe = &next;
    for (int32_t c = m->child[u]; c >= 0; c = m->sibling[c]) {
        if (!st_gset_has(probe, m->byte[c]))
            continue;
        st_gstate *to = &m->lvl[depth + 1];
        if (advance_w(m->g, st, m->byte[c], to, m->w))
            return -1;
        if (to->n_stacks == 0)
            continue;
        for (int32_t id = m->tok_head[c]; id >= 0; id = m->tok_next[id]) {
            bits[id >> 5] |= 1u << (id & 31);
            *any = 1;
        }
        if (m->child[c] >= 0 && walk(m, c, depth + 1, to, bits, any))
            return -1;
    }
    return 0;
}

static uint64_t hash_state(const st_gstate *st) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < st->n; i++)
        h = (h ^ (uint32_t)st->buf[i]) * 1099511628211ull;
    return h;
}

/* The cached mask of st, computed on a miss; NULL out of memory. */
static const mask_entry *mask_of(st_gmatcher *m, const st_gstate *st) {
    const uint64_t h = hash_state(st);
    for (int i = 0; i < CACHE_N; i++) {
        const mask_entry *e = &m->cache[i];
        if (e->bits && e->hash == h && e->n_key == st->n &&
            !memcmp(e->key, st->buf, (size_t)st->n * sizeof *st->buf))
            return e;
    }
    mask_entry *e = &m->cache[m->next_slot];
    m->next_slot = (m->next_slot + 1) % CACHE_N;
    if (!e->bits && !(e->bits = st_malloc((size_t)m->words * sizeof *e->bits)))
        return NULL;
    int32_t *key = st_realloc(e->key, (size_t)(st->n + 1) * sizeof *key);
    if (!key)
        return NULL;
    e->key = key;
    if (st->n)
        memcpy(e->key, st->buf, (size_t)st->n * sizeof *st->buf);
    e->n_key = st->n, e->hash = h;
    memset(e->bits, 0, (size_t)m->words * sizeof *e->bits);
    e->any = 0;
    e->accept = st_gstate_accepting(st);
    if (st->n_stacks > 0 && walk(m, 0, 0, st, e->bits, &e->any)) {
        e->n_key = -1;
        return NULL;
    }
    return e;
}

st_status st_gmatcher_mask(st_gmatcher *m, const int32_t *path, int64_t n_path, float *logits) {
    st_status rc;
    const st_gstate *st = along(m, path, n_path, &rc);
    if (rc)
        return rc;
    const mask_entry *e = mask_of(m, st);
    if (!e)
        return st_fail(ST_ERR_NOMEM, "grammar: out of memory");
    /* end of generation where the grammar can end; also where nothing else can follow (a
     * vocabulary without the bytes the grammar needs), so the request stops instead of looping */
    const int end_ok = e->accept || !e->any;
    for (int32_t i = 0; i < m->n_tok; i++)
        if (!((e->bits[i >> 5] >> (i & 31)) & 1) && !(end_ok && m->t->eog[i]))
            logits[i] = -INFINITY;
    return ST_OK;
}
