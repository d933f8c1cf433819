/*
 * attn.c: target-verify attention backends, the verify-mask owner, the verify forward pass and
 * the KV commit. A backend declares what it reads in target-verify (the generalisation of
 * SGLang's target_verify_reads_custom_mask(), PR #32886): `dense` reads whole FULL_MASK rows,
 * prefix columns included, so the prefix must be filled; `cascade` attends to the committed
 * prefix without a mask and reads only the N x N tree block (bit-packed), and for a K = 1 chain
 * uses causal attention and no mask at all. The mask owner picks the layout from that answer,
 * sizes its buffer once and fills only what is read (DESIGN.md invariant 2).
 */
#include "model/model.h"
#include "spec/spec.h"

#include <string.h>

const char *st_attn_backend_name(st_attn_backend b) {
    return b == ST_ATTN_DENSE ? "dense" : b == ST_ATTN_CASCADE ? "cascade" : "?";
}

st_status st_attn_backend_parse(const char *name, st_attn_backend *out) {
    if (name && strcmp(name, "cascade") == 0)
        *out = ST_ATTN_CASCADE;
    else if (name && strcmp(name, "dense") == 0)
        *out = ST_ATTN_DENSE;
    else
        return st_fail(ST_ERR_INVALID, "unknown attention backend '%s' (cascade, dense)",
                       name ? name : "(null)");
    return ST_OK;
}

st_attn_reads st_attn_backend_reads(st_attn_backend b, int64_t topk) {
    if (b == ST_ATTN_DENSE)
        return ST_READS_FULL_ROWS;
    return topk == 1 ? ST_READS_NOTHING : ST_READS_TREE_BLOCK;
}

struct st_verify_mask {
    st_attn_backend backend;
    int64_t max_bs, max_n, max_ctx_sum;
    void *buf;
    size_t cap;
};

st_status st_verify_mask_create(st_attn_backend backend, int64_t max_bs, int64_t max_n,
                                int64_t max_ctx_sum, st_verify_mask **out) {
    if (!out)
        return st_fail(ST_ERR_INVALID, "verify mask: out is NULL");
    *out = NULL;
    if (backend != ST_ATTN_CASCADE && backend != ST_ATTN_DENSE)
        return st_fail(ST_ERR_INVALID, "verify mask: unknown backend %d", (int)backend);
    if (max_bs < 1 || max_n < 1 || max_n > ST_TREE_MAX_N || max_ctx_sum < 0)
        return st_fail(ST_ERR_INVALID, "verify mask: bad sizes (bs %lld, n %lld, context %lld)",
                       (long long)max_bs, (long long)max_n, (long long)max_ctx_sum);
    size_t need = 0;
    st_status s;
    if (backend == ST_ATTN_DENSE)
        s = st_tree_mask_bytes(ST_MASK_FULL, max_bs, max_n, max_ctx_sum, &need);
    else if (max_n <= ST_TREE_MAX_N_BITS)
        s = st_tree_mask_bytes(ST_MASK_BITS, max_bs, max_n, 0, &need);
    else
        s = st_tree_mask_bytes(ST_MASK_QLEN, max_bs, max_n, 0, &need);
    if (s)
        return s;
    st_verify_mask *vm = st_calloc(1, sizeof *vm);
    if (!vm)
        return st_fail(ST_ERR_NOMEM, "verify mask: out of memory");
    vm->backend = backend;
    vm->max_bs = max_bs;
    vm->max_n = max_n;
    vm->max_ctx_sum = max_ctx_sum;
    vm->cap = need;
    vm->buf = st_malloc_aligned(need ? need : 64, 64);
    if (!vm->buf) {
        st_free(vm);
        return st_fail(ST_ERR_NOMEM, "verify mask: cannot allocate %zu bytes", need);
    }
    *out = vm;
    return ST_OK;
}

void st_verify_mask_free(st_verify_mask *vm) {
    if (!vm)
        return;
    st_free_aligned(vm->buf);
    st_free(vm);
}

size_t st_verify_mask_capacity(const st_verify_mask *vm) { return vm ? vm->cap : 0; }

st_status st_verify_mask_prepare(st_verify_mask *vm, int64_t topk, int64_t bs, int64_t n,
                                 int64_t seq_lens_sum, st_tree_mask *out) {
    if (!vm || !out)
        return st_fail(ST_ERR_INVALID, "verify mask: NULL argument");
    if (bs < 1 || bs > vm->max_bs || n < 1 || n > vm->max_n || seq_lens_sum < 0 ||
        seq_lens_sum > vm->max_ctx_sum || topk < 1)
        return st_fail(ST_ERR_RANGE,
                       "verify mask: step (bs %lld, n %lld, context %lld) exceeds the sizes it "
                       "was made for (%lld, %lld, %lld)",
                       (long long)bs, (long long)n, (long long)seq_lens_sum, (long long)vm->max_bs,
                       (long long)vm->max_n, (long long)vm->max_ctx_sum);
    memset(out, 0, sizeof *out);
    switch (st_attn_backend_reads(vm->backend, topk)) {
    case ST_READS_NOTHING:
        out->layout = ST_MASK_NONE;
        break;
    case ST_READS_TREE_BLOCK:
        out->layout = n <= ST_TREE_MAX_N_BITS ? ST_MASK_BITS : ST_MASK_QLEN;
        break;
    case ST_READS_FULL_ROWS:
        out->layout = ST_MASK_FULL;
        out->fill_prefix = 1;
        break;
    }
    out->data = vm->buf;
    out->bytes = vm->cap;
    return ST_OK;
}

/* Whether tree cell (t, j) of request b is set, for the tree-block layouts. */
static int tree_cell(const st_tree_mask *mk, int64_t b, int64_t n, int64_t t, int64_t j,
                     const uint8_t *full_row_tree) {
    const uint8_t *m = mk->data;
    switch (mk->layout) {
    case ST_MASK_FULL:
        return full_row_tree[j] != 0;
    case ST_MASK_QLEN:
        return m[(b * n + t) * n + j] != 0;
    case ST_MASK_BITS: {
        size_t w = st_tree_mask_word_bytes(n);
        return (m[(size_t)(b * n + t) * w + (size_t)(j >> 3)] >> (j & 7)) & 1;
    }
    default:
        return j <= t;
    }
}

/* seqs[i] names a sequence of the session that seqs[0 .. i) does not. */
static st_status check_seq(const st_session *s, const char *fn, const int32_t *seqs, int64_t i) {
    if (seqs[i] < 0 || seqs[i] >= s->p.n_seq)
        return st_fail(ST_ERR_INVALID, "%s: sequence %d out of range", fn, seqs[i]);
    for (int64_t j = 0; j < i; j++)
        if (seqs[j] == seqs[i])
            return st_fail(ST_ERR_INVALID, "%s: sequence %d appears twice", fn, seqs[i]);
    return ST_OK;
}

st_status st_session_verify(st_session *s, st_attn_backend backend, int64_t bs, int64_t n,
                            const int32_t *seqs, const st_tree *tree, const st_tree_mask *mask,
                            float *logits) {
    if (!s || !seqs || !tree || !mask || !tree->tokens || !tree->positions)
        return st_fail(ST_ERR_INVALID, "verify: NULL argument");
    if (bs < 1 || n < 1 || bs * n > s->p.n_batch)
        return st_fail(ST_ERR_INVALID, "verify: %lld requests x %lld nodes exceed the batch of %d",
                       (long long)bs, (long long)n, s->p.n_batch);
    st_attn_reads reads = st_attn_backend_reads(backend, 2);
    if (backend == ST_ATTN_CASCADE) {
        if (mask->layout == ST_MASK_FULL)
            return st_fail(ST_ERR_INVALID, "verify: cascade reads a tree block, not FULL_MASK");
    } else if (backend == ST_ATTN_DENSE) {
        if (mask->layout != ST_MASK_FULL)
            return st_fail(ST_ERR_INVALID, "verify: dense reads FULL_MASK rows");
    } else {
        return st_fail(ST_ERR_INVALID, "verify: unknown backend %d", (int)backend);
    }
    (void)reads;
    if (mask->layout != ST_MASK_NONE && !mask->data)
        return st_fail(ST_ERR_INVALID, "verify: mask buffer is NULL");
    if (mask->layout == ST_MASK_BITS && n > ST_TREE_MAX_N_BITS)
        return st_fail(ST_ERR_INVALID, "verify: %lld nodes do not fit a bit-packed mask",
                       (long long)n);
    /* Mask extent check, and each request's committed length and FULL_MASK base. */
    int64_t sum = 0;
    for (int64_t b = 0; b < bs; b++) {
        st_status sq = check_seq(s, "verify", seqs, b);
        if (sq)
            return sq;
        int64_t L = s->seq_len[seqs[b]];
        if (L + n > s->p.n_ctx)
            return st_fail(ST_ERR_RANGE, "verify: context full (%lld + %lld nodes > %d)",
                           (long long)L, (long long)n, s->p.n_ctx);
        sum += L;
    }
    size_t need = 0;
    st_status st = st_tree_mask_bytes(mask->layout, bs, n, sum, &need);
    if (st)
        return st;
    if (mask->bytes < need)
        return st_fail(ST_ERR_RANGE, "verify: mask buffer of %zu bytes, %zu needed", mask->bytes,
                       need);
    int32_t *off = s->b_extra_off;
    off[0] = 0;
    int64_t base = 0; /* FULL_MASK: start of request b */
    for (int64_t b = 0; b < bs; b++) {
        int32_t L = s->seq_len[seqs[b]];
        for (int64_t t = 0; t < n; t++) {
            int64_t i = b * n + t;
            s->b_seq[i] = seqs[b];
            s->b_row[i] = L + (int32_t)t;
            const uint8_t *row_tree = NULL;
            s->b_pmask[i] = NULL;
            if (mask->layout == ST_MASK_FULL) {
                const uint8_t *row = (const uint8_t *)mask->data + base + t * (L + n);
                s->b_pmask[i] = row;
                row_tree = row + L;
            }
            int32_t k = off[i];
            if (mask->layout == ST_MASK_NONE) {
                s->b_prefix[i] = L + (int32_t)t + 1; /* a chain: causal over prefix + nodes */
            } else {
                s->b_prefix[i] = L;
                for (int64_t j = 0; j < n; j++)
                    if (tree_cell(mask, b, n, t, j, row_tree))
                        s->b_extra[k++] = L + (int32_t)j;
            }
            off[i + 1] = k;
        }
        base += n * (L + n);
    }
    int64_t T = bs * n;
    for (int64_t i = 0; i < T; i++) {
        int32_t p = tree->positions[i];
        if (p < 0 || p >= s->p.n_ctx)
            return st_fail(ST_ERR_RANGE, "verify: node %lld position %d outside the context",
                           (long long)i, p);
    }
    st_fwd f = {.n = (int32_t)T,
                .tokens = tree->tokens,
                .pos = tree->positions,
                .seq = s->b_seq,
                .kv_row = s->b_row,
                .n_prefix = s->b_prefix,
                .prefix_mask = mask->layout == ST_MASK_FULL ? s->b_pmask : NULL,
                .extra_off = off,
                .extra_rows = s->b_extra,
                .logits_from = 0,
                .logits = logits,
                .defer_logits = logits == NULL};
    return st_forward(s, &f);
}

st_status st_session_commit(st_session *s, int32_t seq, int64_t n, const int64_t *accept_nodes,
                            int64_t n_accept) {
    if (!s || !accept_nodes)
        return st_fail(ST_ERR_INVALID, "commit: NULL argument");
    if (seq < 0 || seq >= s->p.n_seq)
        return st_fail(ST_ERR_INVALID, "commit: sequence %d out of range", seq);
    const st_model_hparams *hp = &s->m->hp;
    int64_t L = s->seq_len[seq];
    if (L + n > s->p.n_ctx)
        return st_fail(ST_ERR_RANGE, "commit: %lld + %lld rows exceed the context", (long long)L,
                       (long long)n);
    size_t row = (size_t)hp->n_head_kv * (size_t)hp->head_dim * sizeof(float);
    size_t stride = (size_t)s->kv_layer_stride * sizeof(float);
    size_t bytes = (size_t)(hp->n_layer - 1) * stride + (size_t)(L + n) * row;
    st_status st = st_tree_commit_rows(st_kv_k(s, seq, 0), bytes, row, hp->n_layer, stride, L, n,
                                       accept_nodes, n_accept);
    if (st)
        return st;
    st = st_tree_commit_rows(st_kv_v(s, seq, 0), bytes, row, hp->n_layer, stride, L, n,
                             accept_nodes, n_accept);
    if (st)
        return st;
    s->seq_len[seq] = (int32_t)(L + n_accept);
    return ST_OK;
}

st_status st_session_decode_batch(st_session *s, int32_t n, const int32_t *seqs,
                                  const int32_t *tokens, float *logits) {
    if (!s || !seqs || !tokens || !logits)
        return st_fail(ST_ERR_INVALID, "decode batch: NULL argument");
    if (n < 1 || n > s->p.n_batch)
        return st_fail(ST_ERR_INVALID, "decode batch: %d sequences (must be 1..%d)", n,
                       s->p.n_batch);
    for (int32_t i = 0; i < n; i++) {
        st_status sq = check_seq(s, "decode batch", seqs, i);
        if (sq)
            return sq;
        const int32_t L = s->seq_len[seqs[i]];
        if (L + 1 > s->p.n_ctx)
            return st_fail(ST_ERR_RANGE, "decode batch: sequence %d: context full (%d)", seqs[i],
                           L);
        s->b_seq[i] = seqs[i];
        s->b_pos[i] = L;
        s->b_row[i] = L;
        s->b_prefix[i] = L + 1;
    }
    st_fwd f = {.n = n,
                .tokens = tokens,
                .pos = s->b_pos,
                .seq = s->b_seq,
                .kv_row = s->b_row,
                .n_prefix = s->b_prefix,
                .logits_from = 0,
                .logits = logits};
    st_status st = st_forward(s, &f);
    if (st)
        return st;
    for (int32_t i = 0; i < n; i++)
        s->seq_len[seqs[i]]++;
    return ST_OK;
}
