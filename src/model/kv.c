/*
 * kv.c: the session's speculative entry points. st_session_verify lays out every tree node's key
 * list from the verify-mask owner's mask, read as the session's backend says its attention reads
 * it (the prefix, unmasked or through FULL_MASK rows, then the node's ancestors), and runs one
 * forward pass over all the trees of a batch; st_session_commit has the backend move the
 * accepted nodes' KV rows into place; st_session_decode_batch runs one plain step of several
 * sequences in one pass.
 */
#include "model/backend.h"
#include "tree/tree.h"

#include <string.h>

/* seqs[i] names a sequence of the session that seqs[0 .. i) does not. */
static st_status check_seq(const st_session *s, const char *fn, const int32_t *seqs, int64_t i) {
    if (seqs[i] < 0 || seqs[i] >= s->p.n_seq)
        return st_fail(ST_ERR_INVALID, "%s: sequence %d out of range", fn, seqs[i]);
    for (int64_t j = 0; j < i; j++)
        if (seqs[j] == seqs[i])
            return st_fail(ST_ERR_INVALID, "%s: sequence %d appears twice", fn, seqs[i]);
    return ST_OK;
}

/* What a backend must read to use a mask of this layout. */
static st_attn_reads layout_reads(st_mask_layout layout) {
    return layout == ST_MASK_NONE   ? ST_READS_NOTHING
           : layout == ST_MASK_FULL ? ST_READS_FULL_ROWS
                                    : ST_READS_TREE_BLOCK;
}

static const char *reads_name(st_attn_reads r) {
    return r == ST_READS_NOTHING     ? "nothing"
           : r == ST_READS_FULL_ROWS ? "full rows"
                                     : "the tree block";
}

/* Both verify entry points: nb NULL is a uniform step of n nodes per request. */
static st_status verify(st_session *s, const st_verify_mask *vm, int64_t bs, int64_t n,
                        const int64_t *nb, const int32_t *seqs, const st_tree *tree,
                        float *logits) {
    if (!s || !vm || !seqs || !tree || !tree->tokens || !tree->positions)
        return st_fail(ST_ERR_INVALID, "verify: NULL argument");
    int64_t mbs = 0, mn = 0, topk = 0;
    st_attn_backend attn = ST_ATTN_CASCADE;
    const st_tree_mask *mask = st_verify_mask_view(vm, &mbs, &mn, &attn, &topk);
    const int64_t *vnb = st_verify_mask_nodes(vm);
    int same = mask && mbs == bs && (nb || mn == n);
    for (int64_t b = 0; same && b < bs; b++)
        same = vnb[b] == (nb ? nb[b] : n);
    if (!same)
        return st_fail(ST_ERR_INVALID,
                       "verify: the mask was prepared for %lld requests x %lld nodes, not this "
                       "step's %lld (call st_verify_mask_prepare and st_tree_build for this step)",
                       (long long)mbs, (long long)mn, (long long)bs);
    /* the backend's attention reads the mask as it declares, in the layout laid out for that */
    const st_attn_reads reads = s->be->attn_reads(attn, topk);
    if (reads != layout_reads(mask->layout))
        return st_fail(ST_ERR_INVALID,
                       "verify: the mask is laid out for %s attention at topk %lld as %s, but "
                       "backend %s reads %s there",
                       st_attn_backend_name(attn), (long long)topk,
                       reads_name(layout_reads(mask->layout)), s->be->name, reads_name(reads));
    /* Token count, each request's committed length, and the mask's extent. */
    int64_t T = 0;
    size_t need = 0;
    for (int64_t b = 0; b < bs; b++) {
        st_status sq = check_seq(s, "verify", seqs, b);
        if (sq)
            return sq;
        const int64_t L = s->seq_len[seqs[b]], nr = nb ? nb[b] : n;
        if (L + nr > s->p.n_ctx)
            return st_fail(ST_ERR_RANGE, "verify: context full (%lld + %lld nodes > %d)",
                           (long long)L, (long long)nr, s->p.n_ctx);
        size_t bytes = 0;
        if ((sq = st_tree_mask_bytes(mask->layout, 1, nr, L, &bytes)))
            return sq;
        need += bytes, T += nr;
    }
    if (bs < 1 || T > s->p.n_batch)
        return st_fail(ST_ERR_INVALID, "verify: %lld requests, %lld nodes exceed the batch of %d",
                       (long long)bs, (long long)T, s->p.n_batch);
    if (mask->bytes < need)
        return st_fail(ST_ERR_RANGE, "verify: mask buffer of %zu bytes, %zu needed", mask->bytes,
                       need);
    int32_t *off = s->b_extra_off;
    off[0] = 0;
    size_t base = 0; /* request b's block: its own single-request mask (TREE_SPEC §2.5) */
    int64_t i = 0;
    for (int64_t b = 0; b < bs; b++) {
        const int32_t L = s->seq_len[seqs[b]];
        const int64_t nr = nb ? nb[b] : n;
        const st_tree_mask blk = {mask->layout, mask->fill_prefix,
                                  mask->data ? (char *)mask->data + base : NULL, 0};
        for (int64_t t = 0; t < nr; t++, i++) {
            s->b_seq[i] = seqs[b];
            s->b_row[i] = L + (int32_t)t;
            const uint8_t *row_tree = NULL; /* FULL_MASK: the tree part of the row */
            s->b_pmask[i] = NULL;
            if (reads == ST_READS_FULL_ROWS) {
                const uint8_t *row = (const uint8_t *)blk.data + t * (L + nr);
                s->b_pmask[i] = row;
                row_tree = row + L;
            }
            int32_t k = off[i];
            if (reads == ST_READS_NOTHING) {
                s->b_prefix[i] = L + (int32_t)t + 1; /* a chain: causal over prefix + nodes */
            } else {
                s->b_prefix[i] = L;
                for (int64_t j = 0; j < nr; j++)
                    if (st_tree_mask_cell(&blk, 0, nr, t, j, row_tree))
                        s->b_extra[k++] = L + (int32_t)j;
            }
            off[i + 1] = k;
        }
        size_t bytes = 0;
        st_tree_mask_bytes(mask->layout, 1, nr, L, &bytes);
        base += bytes;
    }
    for (i = 0; i < T; i++) {
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
                .prefix_mask = reads == ST_READS_FULL_ROWS ? s->b_pmask : NULL,
                .extra_off = off,
                .extra_rows = s->b_extra,
                .logits_from = 0,
                .logits = logits,
                .defer_logits = logits == NULL};
    return st_forward(s, &f);
}

st_status st_session_verify(st_session *s, const st_verify_mask *vm, int64_t bs, int64_t n,
                            const int32_t *seqs, const st_tree *tree, float *logits) {
    return verify(s, vm, bs, n, NULL, seqs, tree, logits);
}

st_status st_session_verify_ragged(st_session *s, const st_verify_mask *vm, int64_t bs,
                                   const int64_t *n, const int32_t *seqs, const st_tree *tree,
                                   float *logits) {
    if (!n)
        return st_fail(ST_ERR_INVALID, "verify: NULL node counts");
    return verify(s, vm, bs, 0, n, seqs, tree, logits);
}

st_status st_session_commit(st_session *s, int32_t seq, int64_t n, const int64_t *accept_nodes,
                            int64_t n_accept) {
    if (!s || !accept_nodes)
        return st_fail(ST_ERR_INVALID, "commit: NULL argument");
    if (seq < 0 || seq >= s->p.n_seq)
        return st_fail(ST_ERR_INVALID, "commit: sequence %d out of range", seq);
    int64_t L = s->seq_len[seq];
    if (L + n > s->p.n_ctx)
        return st_fail(ST_ERR_RANGE, "commit: %lld + %lld rows exceed the context", (long long)L,
                       (long long)n);
    st_status st = s->be->kv_move(s, seq, L, n, accept_nodes, n_accept);
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
