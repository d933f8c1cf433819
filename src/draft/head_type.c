/*
 * head_type.c: an EAGLE head's own matrices in another weight type (st_eagle_head_set_type).
 * Published heads are F32/F16/BF16; beside a quantized target a head in F32 streams as many
 * bytes per level pass as a fifth of the target (stories260K's head widened to 768 next to its
 * Q8_0 target: 18 MB against 84 MB), so drafting in the target's kind of type makes every head
 * pass cheaper. Drafting arithmetic changes (the head drafts other tokens now and then); the
 * target's verification does not, so the output stays plain decoding's.
 */
#include "draft/drafter.h"
#include "io/gguf_write.h"
#include "kernels/kernels.h"

#include <stdio.h>

/* The matrices a head owns, in a fixed order: fc, its layer's seven, an EAGLE-3 head's own
 * lm_head (an EAGLE-1/2 head borrows the target's output layer). */
static int head_mats(st_model *m, st_wt **w) {
    int n = 0;
    w[n++] = &m->fc;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        st_layer *L = &m->layers[l];
        st_wt *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++)
            w[n++] = lw[i];
    }
    if (m->eagle3)
        w[n++] = &m->output;
    return n;
}

int st_eagle_head_auto_type(const st_model *target) {
    const uint32_t t = target ? target->hp.wtype : ST_DTYPE_F32;
    /* Beside an F32 target (a small model: compute-bound, where the packed F32 kernel is as
     * fast) as stored; beside any other Q8_0, even an F16 target: the head is read once per level
     * pass, and on stories260K widened to 768 x 12 in F16 a Q8_0 head drafted as well as the F16
     * one for two thirds of its time. Not below Q8_0: a head's errors compound per level. */
    return t == ST_DTYPE_F32 ? -1 : ST_DTYPE_Q8_0;
}

/* Bytes per element, for "never wider than stored" (quantized types below 2). */
static double elem_bytes(uint32_t t) {
    return t == ST_DTYPE_F32 ? 4.0 : t == ST_DTYPE_F16 || t == ST_DTYPE_BF16 ? 2.0 : 1.0;
}

/* The type matrix w gets for the requested one: Q8_0 needs rows of whole blocks of 32 (F16
 * otherwise, as `spectree convert` does); `auto` (narrow) never widens a matrix. */
static uint32_t type_for(const st_wt *w, uint32_t want, int narrow) {
    uint32_t t = want;
    if (t == ST_DTYPE_Q8_0 && w->n_in % ST_QK != 0)
        t = ST_DTYPE_F16;
    if (narrow && elem_bytes(t) > elem_bytes(w->type))
        t = w->type;
    return t;
}

/* Packed copies of a small head's F32 matrices, as small models get (model.h's
 * ST_PACK_MAX_BYTES; results are bitwise the same packed or not). */
static void pack_small(st_wt **w, int n) {
    if (!st_env_get().pack || !st_kernels_get()->matmul_f32_packed)
        return;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (w[i]->type == ST_DTYPE_F32)
            total += st_pack_f32_floats(w[i]->n_out, w[i]->n_in) * sizeof(float);
    if (total > ST_PACK_MAX_BYTES)
        return;
    for (int i = 0; i < n; i++) {
        if (w[i]->type != ST_DTYPE_F32 || w[i]->packed)
            continue;
        w[i]->packed =
            st_malloc_aligned(st_pack_f32_floats(w[i]->n_out, w[i]->n_in) * sizeof(float), 64);
        if (!w[i]->packed)
            return; /* the rest stay row-major (same results) */
        st_pack_f32(w[i]->packed, w[i]->data, w[i]->row_bytes, w[i]->n_out, w[i]->n_in);
    }
}

st_status st_eagle_head_set_type(st_model *head, int type) {
    if (!head || !head->fc.data)
        return st_fail(ST_ERR_INVALID, "draft type: not an EAGLE head");
    if (head->owned_conv)
        return st_fail(ST_ERR_INVALID, "draft type: the head's weight type was already set");
    const int narrow = type < 0;
    if (narrow)
        type = st_eagle_head_auto_type(head->target);
    if (type >= 0 && type != ST_DTYPE_F32 && type != ST_DTYPE_F16 && type != ST_DTYPE_BF16 &&
        type != ST_DTYPE_Q8_0)
        return st_fail(ST_ERR_INVALID, "draft type: %s is not one of f32, f16, bf16, q8_0",
                       st_dtype_name((uint32_t)type));
    st_wt *w[2 + 7 * 4];
    if (head->hp.n_layer > 4)
        return st_fail(ST_ERR_INVALID, "draft type: a head of %d layers", head->hp.n_layer);
    const int n = head_mats(head, w);
    if (type < 0) { /* as stored */
        pack_small(w, n);
        return ST_OK;
    }
    /* the converted matrices in one new block; the old bytes stay in `owned` (freed with it) */
    size_t bytes = 0, row_max = 0;
    uint32_t to[2 + 7 * 4];
    for (int i = 0; i < n; i++) {
        to[i] = type_for(w[i], (uint32_t)type, narrow);
        if (to[i] != w[i]->type)
            bytes += (st_row_bytes(to[i], w[i]->n_in) * (size_t)w[i]->n_out + 63) & ~(size_t)63;
        row_max = (size_t)w[i]->n_in > row_max ? (size_t)w[i]->n_in : row_max;
    }
    if (bytes == 0) {
        pack_small(w, n);
        return ST_OK;
    }
    char *blk = st_malloc_aligned(bytes, 64);
    float *row = st_malloc(row_max * sizeof(float));
    if (!blk || !row) {
        st_free_aligned(blk);
        st_free(row);
        return st_fail(ST_ERR_NOMEM, "draft type: out of memory for the head's %s copy",
                       st_dtype_name((uint32_t)type));
    }
    size_t off = 0;
    st_status st = ST_OK;
    for (int i = 0; i < n && !st; i++) {
        if (to[i] == w[i]->type)
            continue;
        const size_t rb = st_row_bytes(to[i], w[i]->n_in);
        for (int64_t r = 0; r < w[i]->n_out && !st; r++) {
            st_dequant_row(w[i]->type, (const char *)w[i]->data + (size_t)r * w[i]->row_bytes, row,
                           w[i]->n_in);
            st = st_quantize_row(to[i], row, w[i]->n_in, blk + off + (size_t)r * rb);
        }
        off += (rb * (size_t)w[i]->n_out + 63) & ~(size_t)63;
    }
    st_free(row);
    if (st) { /* a weight that is not finite: the head is left as it was */
        char why[256];
        snprintf(why, sizeof why, "%s", st_last_error());
        st_free_aligned(blk);
        return st_fail(ST_ERR_FORMAT, "draft type: the head's weights cannot become %s (%s)",
                       st_dtype_name((uint32_t)type), why);
    }
    off = 0;
    int conv[2 + 7 * 4] = {0};
    for (int i = 0; i < n; i++) {
        if (to[i] == w[i]->type)
            continue;
        conv[i] = 1;
        st_free_aligned(w[i]->packed);
        w[i]->packed = NULL;
        w[i]->data = blk + off;
        w[i]->type = to[i];
        w[i]->row_bytes = st_row_bytes(to[i], w[i]->n_in);
        off += (w[i]->row_bytes * (size_t)w[i]->n_out + 63) & ~(size_t)63;
    }
    st_free_aligned(head->owned_conv);
    head->owned_conv = blk;
    head->hp.wtype = head->layers[0].wq.type;
    pack_small(w, n);
    /* converted Q8_0 matrices (ours) packed in place for the kernel table (kernels.h; bitwise
     * the same results), except one whose rows are also read as an embedding */
    const int pack = st_env_get().pack && st_kernels_get()->matmul_q8_0_packed;
    for (int i = 0; i < n && pack; i++) {
        st_wt *x = w[i];
        if (conv[i] && x->type == ST_DTYPE_Q8_0 && !x->q8p && x->n_out >= ST_PACK_ROWS &&
            x->data != head->tok_embd.data &&
            !st_pack_q8_0((void *)x->data, x->data, x->row_bytes, x->n_out, x->n_in))
            x->q8p = x->data;
    }
    return ST_OK;
}
