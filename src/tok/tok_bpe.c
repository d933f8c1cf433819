/*
 * tok_bpe.c: byte-level BPE (GPT-2, Llama 3, Qwen2, DeepSeek). Text is split by the
 * pre-tokenizer (tok_pre.c); each part starts as one symbol per byte, written in GPT-2's byte
 * alphabet, and the adjacent pair with the lowest merge rank is merged (ties: leftmost) until no
 * ranked pair is left. Merges are keyed on (left id, right id) in a hash table built at load, so
 * a merge step is one lookup and no string is built.
 */
#include "io/gguf_internal.h"
#include "tok/tok.h"

#include <inttypes.h>
#include <string.h>

/* Bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand for themselves; the other 68, in increasing
 * order, for U+0100.. U+0143. */
static int printable(uint32_t b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t st_tok_byte_cp(uint8_t b) {
    if (printable(b))
        return b;
    if (b <= 0x20)
        return 0x100 + b;
    if (b <= 0xA0)
        return 0x100 + 33 + (b - 0x7Fu);
    return 0x100 + 33 + 34; /* 0xAD */
}

int st_tok_cp_byte(uint32_t cp) {
    if (cp <= 0xFF)
        return printable(cp) ? (int)cp : -1;
    if (cp < 0x100 + 33)
        return (int)(cp - 0x100);
    if (cp < 0x100 + 33 + 34)
        return (int)(cp - 0x100 - 33 + 0x7F);
    return cp == 0x100 + 33 + 34 ? 0xAD : -1;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t pair_hash(int32_t l, int32_t r) {
    return mix64(((uint64_t)(uint32_t)l << 32) | (uint32_t)r);
}

const st_tok_merge *st_tok_merge_find(const st_tokenizer *t, int32_t l, int32_t r) {
    for (uint64_t h = pair_hash(l, r) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        const st_tok_merge *m = &t->merges[h];
        if (m->left < 0)
            return NULL;
        if (m->left == l && m->right == r)
            return m;
    }
}

st_status st_tok_merges_mask(const st_gguf *g, int64_t kv, const char *name, uint64_t *mask) {
    if (st_gguf_kv_type(g, kv) != ST_GGUF_ARRAY || st_gguf_arr_type(g, kv) != ST_GGUF_STRING)
        return st_fail(ST_ERR_FORMAT, "%s: tokenizer.ggml.merges must be an array of strings",
                       name);
    int64_t n = st_gguf_arr_len(g, kv);
    if (n > INT32_MAX / 2)
        return st_fail(ST_ERR_FORMAT,
                       "%s: tokenizer.ggml.merges has too many entries (%" PRId64 ")", name, n);
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2)
        cap *= 2;
    *mask = cap - 1;
    return ST_OK;
}

st_status st_tok_load_merges(st_tokenizer *t, const st_gguf *g, int64_t kv, const char *name) {
    int64_t n = st_gguf_arr_len(g, kv);
    for (uint64_t i = 0; i <= t->merge_mask; i++)
        t->merges[i].left = -1;

    char *buf = NULL; /* the concatenation of the two pieces */
    size_t buf_cap = 0;
    st_status s = ST_OK;
    for (int64_t i = 0; i < n && s == ST_OK; i++) {
        st_gguf_str m;
        s = st_gguf_arr_str(g, kv, i, &m);
        if (s)
            break;
        /* the separator is the first space after the first byte, as llama.cpp splits */
        const char *sp = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
        if (!sp) {
            s = st_fail(ST_ERR_FORMAT,
                        "%s: tokenizer.ggml.merges[%" PRId64 "] (\"%.*s\") is not two pieces "
                        "separated by a space",
                        name, i, (int)(m.len > 64 ? 64 : m.len), m.ptr);
            break;
        }
        size_t nl = (size_t)(sp - m.ptr), nr = m.len - nl - 1;
        int32_t l = st_tok_find(t, m.ptr, nl), r = st_tok_find(t, sp + 1, nr);
        if (l < 0 || r < 0)
            continue; /* names a piece not in the vocabulary: can never apply */
        if (nl + nr > buf_cap) {
            char *nb = st_realloc(buf, nl + nr);
            if (!nb) {
                s = st_fail(ST_ERR_NOMEM, "%s: out of memory reading merges", name);
                break;
            }
            buf = nb;
            buf_cap = nl + nr;
        }
        memcpy(buf, m.ptr, nl);
        memcpy(buf + nl, sp + 1, nr);
        int32_t res = st_tok_find(t, buf, nl + nr);
        if (res < 0)
            continue;
        uint64_t h = pair_hash(l, r) & t->merge_mask;
        while (t->merges[h].left >= 0 && !(t->merges[h].left == l && t->merges[h].right == r))
            h = (h + 1) & t->merge_mask;
        if (t->merges[h].left < 0) /* a repeated pair keeps its first (lowest) rank */
            t->merges[h] = (st_tok_merge){l, r, (int32_t)i, res};
    }
    st_free(buf);
    return s;
}

/* One symbol of the word being merged: a token id and its neighbours. */
typedef struct bsym {
    int32_t id; /* -1: a byte whose alphabet character is not a piece */
    int32_t prev, next;
    int32_t alive;
} bsym;

typedef struct bpe_scratch {
    bsym *sym;         /* (max word bytes) */
    st_tok_pair *heap; /* (3 * max word bytes) */
    char *alph;        /* (2 * max word bytes) the word in the byte alphabet */
} bpe_scratch;

static void add_pair(const st_tokenizer *t, bsym *sym, st_tok_pair *heap, int64_t *nh, int32_t l,
                     int32_t r) {
    if (l < 0 || r < 0 || sym[l].id < 0 || sym[r].id < 0)
        return;
    const st_tok_merge *m = st_tok_merge_find(t, sym[l].id, sym[r].id);
    if (m)
        st_tok_heap_push(heap, nh,
                         (st_tok_pair){(double)m->rank, l, r, sym[l].id, sym[r].id, m->result});
}

static void bpe_word(const st_tokenizer *t, const uint8_t *w, int32_t n, bpe_scratch *sc,
                     st_tok_out *o) {
    if (t->ignore_merges) {
        size_t k = 0;
        for (int32_t i = 0; i < n; i++) {
            uint32_t cp = st_tok_byte_cp(w[i]);
            if (cp < 0x80) {
                sc->alph[k++] = (char)cp;
            } else {
                sc->alph[k++] = (char)(0xC0 | (cp >> 6));
                sc->alph[k++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        int32_t id = st_tok_find(t, sc->alph, k);
        if (id >= 0) {
            st_tok_emit(o, id);
            return;
        }
    }
    bsym *sym = sc->sym;
    for (int32_t i = 0; i < n; i++)
        sym[i] = (bsym){t->byte_tok[w[i]], i - 1, i + 1 < n ? i + 1 : -1, 1};
    int64_t nh = 0;
    for (int32_t i = 1; i < n; i++)
        add_pair(t, sym, sc->heap, &nh, i - 1, i);
    while (nh > 0) {
        st_tok_pair p = st_tok_heap_pop(sc->heap, &nh);
        bsym *l = &sym[p.left], *r = &sym[p.right];
        if (!l->alive || !r->alive || l->id != p.a || r->id != p.b)
            continue; /* outdated: one side has merged since */
        l->id = p.res;
        r->alive = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = p.left;
        add_pair(t, sym, sc->heap, &nh, l->prev, p.left);
        add_pair(t, sym, sc->heap, &nh, p.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        if (sym[i].id >= 0)
            st_tok_emit(o, sym[i].id);
        else if (t->unk >= 0)
            st_tok_emit(o, t->unk);
    }
}

st_status st_tok_bpe(const st_tokenizer *t, const char *text, size_t len, st_tok_out *o) {
    if (len == 0)
        return ST_OK;
    /* one block: cps u32, offs u32 (len+1), ends i64, scratch i64, sym, heap, alph, cls u8 */
    size_t n = len;
    size_t per = 4 + 4 + 8 + 8 + sizeof(bsym) + 3 * sizeof(st_tok_pair) + 2 + 1, total;
    if (!st_mul_size(n + 1, per, &total))
        return st_fail(ST_ERR_NOMEM, "tokenize: text of %zu bytes is too long", len);
    char *blk = st_malloc(total);
    if (!blk)
        return st_fail(ST_ERR_NOMEM, "tokenize: out of memory for a text of %zu bytes", len);
    int64_t *ends = (int64_t *)blk; /* (n) */
    int64_t *scratch = ends + n;    /* (n) */
    bpe_scratch sc;
    sc.heap = (st_tok_pair *)(scratch + n);   /* (3n) */
    sc.sym = (bsym *)(sc.heap + 3 * n);       /* (n) */
    uint32_t *cps = (uint32_t *)(sc.sym + n); /* (n) */
    uint32_t *offs = cps + n;                 /* (n+1) byte offset per cp */
    uint8_t *cls = (uint8_t *)(offs + n + 1); /* (n) */
    sc.alph = (char *)(cls + n);              /* (2n) */

    const uint8_t *u = (const uint8_t *)text;
    int64_t n_cp = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int l = st_utf8_decode(u + i, len - i, &cp);
        cps[n_cp] = cp;
        cls[n_cp] = (uint8_t)st_uni_class(cp);
        offs[n_cp++] = (uint32_t)i;
        i += (size_t)l;
    }
    offs[n_cp] = (uint32_t)len;

    int64_t k = st_pre_split(t->pre, cps, cls, n_cp, ends, scratch);
    int64_t start = 0;
    for (int64_t j = 0; j < k; j++) {
        uint32_t b0 = offs[start], b1 = offs[ends[j]];
        bpe_word(t, u + b0, (int32_t)(b1 - b0), &sc, o);
        start = ends[j];
    }
    st_free(blk);
    return ST_OK;
}
