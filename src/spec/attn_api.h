/*
 * attn_api.h: public API fragment (to be pasted into include/spectree.h after the tree part):
 * target-verify attention backends, the verify-mask owner, the verify forward and the commit.
 */
#ifndef ST_ATTN_API_H
#define ST_ATTN_API_H

#include "../spec/tree_api.h"

/* Target-verify attention backends (DESIGN.md "Attention backends"). */
typedef enum st_attn_backend {
    ST_ATTN_CASCADE = 0, /* prefix without a mask, then the tree block; a chain: causal, no mask */
    ST_ATTN_DENSE = 1,   /* full rows: prefix columns and tree block (FlashInfer's shape) */
} st_attn_backend;

/* What a backend reads in target-verify (the generalisation of SGLang's
 * target_verify_reads_custom_mask()). */
typedef enum st_attn_reads {
    ST_READS_NOTHING = 0,    /* chains (topk 1) with causal attention */
    ST_READS_TREE_BLOCK = 1, /* only the N x N tree block */
    ST_READS_FULL_ROWS = 2,  /* whole rows with the prefix columns: needs the prefix fill */
} st_attn_reads;

/* What backend b reads when verifying trees of branching factor topk (topk 1 = a chain). */
st_attn_reads st_attn_backend_reads(st_attn_backend b, int64_t topk);
const char *st_attn_backend_name(st_attn_backend b);
/* "cascade" or "dense"; ST_ERR_INVALID otherwise. */
st_status st_attn_backend_parse(const char *name, st_attn_backend *out);

/* The verify-mask owner: one buffer, sized once for the largest batch, tree and context, reused
 * every step. For `dense` it holds FULL_MASK rows (filled prefix); for `cascade` the bit-packed
 * tree block (bytes when N > 64); for cascade chains nothing is written at all. */
typedef struct st_verify_mask st_verify_mask;

/* max_ctx_sum: the largest sum of committed lengths of a batch (only dense uses it). */
st_status st_verify_mask_create(st_attn_backend backend, int64_t max_bs, int64_t max_n,
                                int64_t max_ctx_sum, st_verify_mask **out);
void st_verify_mask_free(st_verify_mask *vm);
/* Bytes of the buffer allocated at creation. */
size_t st_verify_mask_capacity(const st_verify_mask *vm);
/* Fills *out (layout, fill_prefix, buffer) for one step's st_tree_build from what the backend
 * reads for this topk. ST_ERR_RANGE when the step exceeds the sizes given at creation. */
st_status st_verify_mask_prepare(st_verify_mask *vm, int64_t topk, int64_t bs, int64_t n,
                                 int64_t seq_lens_sum, st_tree_mask *out);

/* Target-verify forward: scores the bs trees of n nodes (tree->tokens at tree->positions) of
 * sequences seqs[0..bs) in one forward pass. Node i of request b attends to the committed
 * prefix [0, L_b) of its sequence and to the tree nodes its mask row marks; its K/V are written
 * to row L_b + i. The sequence lengths do not change (st_session_commit does that). logits:
 * (bs*n, n_vocab). Each node's logits are bitwise those of decoding its path one token at a
 * time. Requires bs*n <= n_batch and L_b + n <= n_ctx; a backend given a layout it does not
 * read is ST_ERR_INVALID. */
st_status st_session_verify(st_session *s, st_attn_backend backend, int64_t bs, int64_t n,
                            const int32_t *seqs, const st_tree *tree, const st_tree_mask *mask,
                            float *logits);

/* Commits one request after verification: the accepted nodes (root first, node-in-request
 * indices, increasing; accept_index[b][i] - b*n) move from rows [L, L+n) to [L, L+n_accept) in
 * every layer's K and V, the rest is released, and the sequence length grows by n_accept. */
st_status st_session_commit(st_session *s, int32_t seq, int64_t n, const int64_t *accept_nodes,
                            int64_t n_accept);

#endif /* ST_ATTN_API_H */
