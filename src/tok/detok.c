/*
 * detok.c: streaming detokenizer. Each token's bytes (decoded once at load, tokenizer.c) pass
 * through an incremental UTF-8 validator that holds back an incomplete character until a later
 * token completes it and replaces ill-formed input by U+FFFD, one per maximal ill-formed subpart
 * (Unicode 15, section 3.9, "U+FFFD substitution of maximal subparts"). So every chunk a caller
 * prints is valid UTF-8 on its own, even when byte-fallback tokens split a character.
 */
#include "tok/tok.h"

#include <inttypes.h>
#include <string.h>

/* Bytes written so far; writes past cap are counted but dropped. */
typedef struct wbuf {
    char *p;
    size_t cap, n;
} wbuf;

static void put(wbuf *w, const void *s, size_t n) {
    if (w->n + n <= w->cap)
        memcpy(w->p + w->n, s, n);
    w->n += n;
}

static void put_fffd(wbuf *w) { put(w, "\xEF\xBF\xBD", 3); }

/* Total length of a sequence starting with lead byte b, 0 if b cannot start one. */
static uint32_t seq_len(uint8_t b) {
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF)
        return 3;
    if (b >= 0xF0 && b <= 0xF4)
        return 4;
    return 0;
}

/* Whether b may follow the held bytes (the second byte has lead-specific bounds). */
static int cont_ok(const st_detok *d, uint8_t b) {
    if (b < 0x80 || b > 0xBF)
        return 0;
    if (d->n_pend == 1) {
        uint8_t lead = d->pend[0];
        if ((lead == 0xE0 && b < 0xA0) || (lead == 0xED && b > 0x9F) ||
            (lead == 0xF0 && b < 0x90) || (lead == 0xF4 && b > 0x8F))
            return 0;
    }
    return 1;
}

static void feed(st_detok *d, uint8_t b, wbuf *w) {
    if (d->n_pend > 0) {
        if (cont_ok(d, b)) {
            d->pend[d->n_pend++] = b;
            if (d->n_pend == seq_len(d->pend[0])) {
                put(w, d->pend, d->n_pend);
                d->n_pend = 0;
            }
            return;
        }
        put_fffd(w); /* the held bytes were a maximal subpart; b starts afresh */
        d->n_pend = 0;
    }
    if (b < 0x80) {
        put(w, &b, 1);
    } else if (seq_len(b)) {
        d->pend[0] = b;
        d->n_pend = 1;
    } else {
        put_fffd(w);
    }
}

void st_detok_init(st_detok *d, const st_tokenizer *t) {
    if (!d)
        return;
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->prev = -1;
}

static int strips_after(const st_tokenizer *t, int32_t id) {
    return t->kind == ST_TOK_SPM && t->add_space_prefix && id == t->bos;
}

st_status st_detok_set_prev(st_detok *d, int32_t id) {
    if (!d || !d->tok)
        return st_fail(ST_ERR_INVALID, "st_detok_set_prev: state not initialized with a tokenizer");
    if (id < 0 || id >= d->tok->n_vocab)
        return st_fail(ST_ERR_INVALID, "st_detok_set_prev: token id %" PRId32 " out of range", id);
    d->prev = id;
    d->strip_space = strips_after(d->tok, id);
    return ST_OK;
}

size_t st_detok_max_bytes(const st_tokenizer *t) {
    /* every byte (piece or held) can become at most one 3-byte U+FFFD */
    return t ? 3 * (t->max_dec + 4) : 0;
}

st_status st_detok_push(st_detok *d, int32_t id, char *out, size_t cap, size_t *n_out) {
    if (!d || !d->tok || !n_out || (!out && cap > 0))
        return st_fail(ST_ERR_INVALID, "st_detok_push: bad argument");
    *n_out = 0;
    const st_tokenizer *t = d->tok;
    if (id < 0 || id >= t->n_vocab)
        return st_fail(ST_ERR_INVALID, "st_detok_push: token id %" PRId32 " out of range (%d)", id,
                       t->n_vocab);
    st_detok nd = *d; /* committed only if the output fits */
    wbuf w = {out, cap, 0};
    const char *s = t->dec + t->dec_off[id];
    size_t n = t->dec_off[id + 1] - t->dec_off[id];
    if (n > 0) {
        if (nd.strip_space && s[0] == ' ') {
            s++;
            n--;
        }
        nd.strip_space = 0;
    }
    for (size_t i = 0; i < n; i++)
        feed(&nd, (uint8_t)s[i], &w);
    nd.prev = id;
    if (strips_after(t, id))
        nd.strip_space = 1;
    *n_out = w.n;
    if (w.n > cap)
        return st_fail(ST_ERR_RANGE, "st_detok_push: needs %zu bytes, buffer has %zu", w.n, cap);
    *d = nd;
    return ST_OK;
}

st_status st_detok_flush(st_detok *d, char *out, size_t cap, size_t *n_out) {
    if (!d || !n_out || (!out && cap > 0))
        return st_fail(ST_ERR_INVALID, "st_detok_flush: bad argument");
    *n_out = d->n_pend > 0 ? 3 : 0;
    if (*n_out > cap)
        return st_fail(ST_ERR_RANGE, "st_detok_flush: needs %zu bytes, buffer has %zu", *n_out,
                       cap);
    if (d->n_pend > 0)
        memcpy(out, "\xEF\xBF\xBD", 3);
    d->n_pend = 0;
    return ST_OK;
}
