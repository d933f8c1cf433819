/*
 * tok_spm.c: SentencePiece BPE with byte fallback, as llama.cpp's SPM tokenizer does it (which
 * matches Hugging Face on Llama-2-style vocabularies): spaces become "▁", one "▁" is prepended,
 * the text starts as one symbol per UTF-8 character, and the adjacent pair whose concatenation
 * is a piece with the highest score merges first (ties: leftmost). A symbol that is not a piece
 * at the end is written as the <0xHH> pieces of its bytes.
 *
 * A vocabulary with merges (a Hugging Face tokenizer.json BPE with byte fallback, converted by
 * hf_gguf.c) merges as Hugging Face's BPE model does instead: the adjacent pair of pieces with
 * the lowest merge rank first (ties: leftmost), and a symbol that is not a piece becomes its
 * <0xHH> pieces when all exist, else the unknown token, consecutive unknowns fused into one.
 */
#include "tok/tok.h"

#include <stdio.h>
#include <string.h>

/* A symbol: bytes [start, start + n) of the escaped text; n == 0 once merged away. */
typedef struct ssym {
    uint32_t start, n;
    int32_t prev, next;
} ssym;

static void try_pair(const st_tokenizer *t, const char *buf, const ssym *sym, st_tok_pair *heap,
                     int64_t *nh, int32_t l, int32_t r) {
    if (l < 0 || r < 0)
        return;
    uint32_t size = sym[l].n + sym[r].n; /* the two are contiguous in buf */
    if (t->merges) {
        int32_t a = st_tok_find(t, buf + sym[l].start, sym[l].n),
                b = st_tok_find(t, buf + sym[r].start, sym[r].n);
        const st_tok_merge *m = a >= 0 && b >= 0 ? st_tok_merge_find(t, a, b) : NULL;
        if (m)
            st_tok_heap_push(heap, nh,
                             (st_tok_pair){(double)m->rank, l, r, (int32_t)sym[l].n,
                                           (int32_t)sym[r].n, m->result});
        return;
    }
    int32_t id = st_tok_find(t, buf + sym[l].start, size);
    if (id >= 0)
        st_tok_heap_push(
            heap, nh,
            (st_tok_pair){-(double)t->score[id], l, r, (int32_t)sym[l].n, (int32_t)sym[r].n, id});
}

st_status st_tok_spm(const st_tokenizer *t, const char *text, size_t len, int prefix,
                     st_tok_out *o) {
    static const char sp[3] = {'\xE2', '\x96', '\x81'}; /* U+2581 */
    /* escaped text: up to 3 bytes per input byte, plus the prefix */
    size_t n_buf = 3 * len + 3, n_sym = len + 1, total;
    if (!st_mul_size(n_sym, sizeof(ssym) + 3 * sizeof(st_tok_pair), &total) ||
        !st_add_size(total, n_buf, &total))
        return st_fail(ST_ERR_NOMEM, "tokenize: text of %zu bytes is too long", len);
    char *blk = st_malloc(total);
    if (!blk)
        return st_fail(ST_ERR_NOMEM, "tokenize: out of memory for a text of %zu bytes", len);
    st_tok_pair *heap = (st_tok_pair *)blk; /* (3 n_sym) */
    ssym *sym = (ssym *)(heap + 3 * n_sym); /* (n_sym) */
    char *buf = (char *)(sym + n_sym);      /* (n_buf) */

    size_t nb = 0;
    if (prefix) {
        memcpy(buf, sp, 3);
        nb = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + nb, sp, 3);
            nb += 3;
        } else {
            buf[nb++] = text[i];
        }
    }

    int32_t ns = 0;
    for (size_t i = 0; i < nb;) {
        uint32_t cp;
        int l = st_utf8_decode((const uint8_t *)buf + i, nb - i, &cp);
        sym[ns] = (ssym){(uint32_t)i, (uint32_t)l, ns - 1, -1};
        if (ns > 0)
            sym[ns - 1].next = ns;
        ns++;
        i += (size_t)l;
    }

    int64_t nh = 0;
    for (int32_t i = 1; i < ns; i++)
        try_pair(t, buf, sym, heap, &nh, i - 1, i);
    while (nh > 0) {
        st_tok_pair p = st_tok_heap_pop(heap, &nh);
        ssym *l = &sym[p.left], *r = &sym[p.right];
        if (l->n != (uint32_t)p.a || r->n != (uint32_t)p.b)
            continue; /* outdated: one side has merged since (symbols only grow or die) */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = p.left;
        try_pair(t, buf, sym, heap, &nh, l->prev, p.left);
        try_pair(t, buf, sym, heap, &nh, p.left, l->next);
    }

    int prev_unk = 0;
    for (int32_t i = ns > 0 ? 0 : -1; i >= 0; i = sym[i].next) {
        int32_t id = st_tok_find(t, buf + sym[i].start, sym[i].n);
        if (id >= 0) {
            st_tok_emit(o, id);
            prev_unk = 0;
            continue;
        }
        if (t->merges) {
            int32_t bt[4];
            uint32_t j = 0;
            for (; j < sym[i].n && j < 4; j++) {
                char hex[8];
                snprintf(hex, sizeof hex, "<0x%02X>", (uint8_t)buf[sym[i].start + j]);
                if ((bt[j] = st_tok_find(t, hex, 6)) < 0)
                    break;
            }
            if (j == sym[i].n) {
                for (j = 0; j < sym[i].n; j++)
                    st_tok_emit(o, bt[j]);
                prev_unk = 0;
            } else if (t->unk >= 0 && !prev_unk) {
                st_tok_emit(o, t->unk);
                prev_unk = 1;
            }
            continue;
        }
        for (uint32_t j = 0; j < sym[i].n; j++) {
            int32_t b = t->byte_tok[(uint8_t)buf[sym[i].start + j]];
            if (b >= 0)
                st_tok_emit(o, b);
        }
    }
    st_free(blk);
    return ST_OK;
}
