/*
 * backend.h: the backend seam. The forward pass (forward.c), the verify forward and the KV
 * commit (kv.c) and the session's context-sized buffers (session.c) reach memory and arithmetic
 * only through this table of operations; backend_cpu.c implements it with the kernel table and
 * the thread pool. Another backend (a GPU's) implements the same operations over its own memory
 * and must give the same results bit for bit (DESIGN.md invariant 1).
 */
#ifndef ST_BACKEND_H
#define ST_BACKEND_H

#include "model/model.h"

/* Every operation reads and writes the session's buffers (its scratch and KV cache, which the
 * backend's memory holds) unless its comment names caller memory. Row-major throughout: row i
 * of a buffer with leading dimension ld starts at element i*ld. */
struct st_backend {
    const char *name;

    /* buffers */
    /* The session's context-sized region (KV cache and attention scratch, sized by session.c),
     * zeroed, or NULL when it cannot be had; freed with buf_free and the same size. populate: a
     * hint that the region is small and wanted whole soon (st_lazy_alloc's). */
    void *(*buf_alloc)(size_t bytes, bool populate);
    void (*buf_free)(void *buf, size_t bytes);

    /* copy rows */
    /* y[i*ldy + j] = element j of row ids[i] of w as float (dequantized), for i < n,
     * j < n_embd of the session's model: the embedding lookup. */
    void (*get_rows)(st_session *s, const st_wt *w, const int32_t *ids, int64_t n, float *y,
                     int64_t ldy);
    /* y[i*ldy + j] = x[i*ldx + j] for i < rows, j < n. Either side may be caller memory (the
     * features an EAGLE head reads, the final-normed states a caller asks for). */
    void (*copy_rows)(st_session *s, float *y, int64_t ldy, const float *x, int64_t ldx,
                      int64_t rows, int64_t n);
    /* y[i*n + j] += x[i*ldx + j] for i < rows, j < n (ldx 0: x is one row, a bias). */
    void (*add_rows)(st_session *s, float *y, const float *x, int64_t ldx, int64_t rows, int64_t n);
    /* The K and V rows of layer `layer` of the f->n tokens (s->kt, s->vt: (n, n_head_kv*head_dim))
     * stored in the cache at row f->kv_row[i] of sequence f->seq[i], in the cache's type. */
    void (*kv_store)(st_session *s, const st_fwd *f, int32_t layer);
    /* The commit's row moves: in every layer's K and V of sequence seq, the accepted nodes
     * accept_nodes[0 .. n_accept) of the n written at rows [pos, pos + n) move to rows
     * [pos, pos + n_accept) (st_tree_commit_rows' contract and errors). */
    st_status (*kv_move)(st_session *s, int32_t seq, int64_t pos, int64_t n,
                         const int64_t *accept_nodes, int64_t n_accept);

    /* The prefix cache's copies: the K and V rows of positions [pos, pos + n) of sequence seq,
     * every layer's, to caller memory buf (save) or from it into the cache (!save), laid out
     * layer by layer, each layer's n K rows then its n V rows, in the cache's types. */
    void (*kv_copy)(st_session *s, int32_t seq, int32_t pos, int32_t n, void *buf, bool save);

    /* matmul over a weight type */
    /* y_i = W_i x (y_i: (M, w[i]->n_out)) for n_mat (1..3) matrices of any weight types with the
     * same input x (M, w[0]->n_in), each output element in the canonical order of its weight
     * type (kernels.h) whatever M; y_i may be caller memory (logits). */
    void (*matmul)(st_session *s, int n_mat, const st_wt *const *w, float *const *y, const float *x,
                   int64_t M);

    /* norm, rope, activation */
    /* y[i*ldy ..] = RMSNorm of x[i*ldx ..] (n floats) with weight w and epsilon eps, for
     * i < rows; a plain copy when w is NULL. y may be x (ldy = ldx). */
    void (*norm)(st_session *s, float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                 int64_t rows, int64_t n, float eps);
    /* The RoPE angles of the n tokens at positions pos (n <= n_batch), for the rope calls of
     * this forward pass. */
    void (*rope_angles)(st_session *s, const int32_t *pos, int64_t n);
    /* Rotates the n rows of v (n_heads*head_dim floats each; row i is token i of the last
     * rope_angles) in GGUF's adjacent-pair layout, in place. */
    void (*rope)(st_session *s, float *v, int32_t n_heads, int64_t n);
    /* SwiGLU: g[i] = silu(g[i]) * u[i] for i < n. */
    void (*swiglu)(st_session *s, float *g, const float *u, int64_t n);

    /* attention over (prefix, tree block, mask owner) */
    /* What this backend's target-verify attention of shape attn reads for trees of branching
     * factor topk. The verify-mask owner lays out a step by st_attn_backend_reads; a session
     * verifies only a mask laid out for what its backend answers here. */
    st_attn_reads (*attn_reads)(st_attn_backend attn, int64_t topk);
    /* Attention of layer `layer` for the f->n tokens, each over its key list (st_fwd: prefix
     * rows, optionally masked per row, then its tree rows): reads s->q and the KV cache, writes
     * s->att (n, n_head*head_dim). s->q may be changed. */
    void (*attn)(st_session *s, const st_fwd *f, int32_t layer);
};

/* The CPU backend (backend_cpu.c): the kernel table chosen at start, on the session's pool. */
const st_backend *st_backend_cpu(void);

/* st_session_create on backend be (which must outlive the session): its buffers come from be,
 * and every forward, verify and commit of the session goes through it. */
st_status st_session_create_backend(const st_model *m, const st_session_params *p,
                                    const st_backend *be, st_session **out);

/* Attention of layer `layer` as the CPU backend computes it (attn.c). */
void st_attn_layer(st_session *s, const st_fwd *f, int32_t layer);

#endif /* ST_BACKEND_H */
