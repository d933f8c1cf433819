/*
 * model.h: the Llama model as plain structs of pointers into the mapped GGUF (llama2.c style),
 * the session (KV cache, scratch, thread pool) and the batched forward pass with an explicit
 * attention description, shared by plain decoding and tree verification. Files: llama.c
 * (loading), session.c (session, prompt evaluation), forward.c (the pass), kv.c (verify forward,
 * KV commit, batched decode), which compute through the backend seam (backend.h), and the CPU
 * backend: backend_cpu.c, attn.c (attention).
 */
#ifndef ST_MODEL_H
#define ST_MODEL_H

#include "core/core.h"
#include "kernels/kernels.h"

/* A weight matrix: n_out rows of n_in elements of `type`, rows row_bytes apart. */
typedef struct st_wt {
    const void *data;
    uint32_t type;
    int64_t n_in;
    int64_t n_out;
    size_t row_bytes;
    float *packed; /* F32 only: the copy packed for matmul_f32_packed (kernels.h), owned by the
                    * model, or NULL (see ST_PACK_MAX_BYTES) */
    /* Q8_0 and Q4_0 only: the weights packed by st_pack_q8_0 / st_pack_q4_0, which the
     * matmuls read with the table's matmul_q8_0_packed / matmul_q4_0_packed (the table in use
     * at load has them), or NULL. Either data itself, packed
     * in place (the model's own copy of the file: then data is not row-major, and nothing but
     * the matmuls reads it) or q8p_own, a copy the model frees (borrowers clear q8p_own). */
    const void *q8p;
    void *q8p_own;
    /* Q4_K / Q5_K / Q6_K only: the weights packed by st_pack_kq (kquant.h), read by the table's
     * matmul_q4_k_packed / matmul_q6_k_packed, owned as q8p is (kqp_own). */
    const void *kqp;
    void *kqp_own;
} st_wt;

/* Small F32 models (matrices up to ST_PACK_MAX_BYTES in all) get a packed copy of every matrix
 * at load when the kernel table has matmul_f32_packed, which needs no horizontal reductions
 * (1.3-1.9x the row-major kernel on stories260K's shapes, in cache); the copy costs as much
 * memory again. The bound is where sessions default to one thread: with several, each call
 * gets a small share of rows and streams it without the prefetch that lets the packed kernel
 * keep up with the row-major one on weights from DRAM (it measured 20-28% slower there for 4
 * and 8 tokens). ST_PACK=0 in the environment turns packing off; results are bitwise the same
 * either way. */
#define ST_PACK_MAX_BYTES ((size_t)16 << 20)

/* The most target layers an EAGLE-3 head reads (the published heads read 3). */
enum { ST_CAP_MAX = 3 };

typedef struct st_layer {
    float *attn_norm;    /* (n_embd) owned float copy */
    float *ffn_norm;     /* (n_embd) */
    st_wt wq;            /* (n_head*head_dim, n_embd) */
    st_wt wk;            /* (n_head_kv*head_dim, n_embd) */
    st_wt wv;            /* (n_head_kv*head_dim, n_embd) */
    st_wt wo;            /* (n_embd, n_head*head_dim) */
    st_wt w_gate;        /* (n_ff, n_embd) */
    st_wt w_up;          /* (n_ff, n_embd) */
    st_wt w_down;        /* (n_embd, n_ff) */
    float *bq, *bk, *bv; /* q/k/v biases (Qwen2), owned float copies in the rows' order, or
                          * NULL */
} st_layer;

struct st_model {
    st_gguf *gguf;
    void *gguf_mem; /* the GGUF built from a Hugging Face checkpoint (gguf reads it; free()), or
                     * NULL for a file */
    st_model_hparams hp;
    st_wt tok_embd;      /* (n_vocab, n_embd) */
    float *out_norm;     /* (n_embd) */
    st_wt output;        /* (n_vocab, n_embd); = tok_embd when tied */
    st_layer *layers;    /* (n_layer) */
    float *rope_factors; /* (n_rot/2) rope_freqs.weight (Llama 3 rope scaling): frequency j is
                          * divided by rope_factors[j]; NULL: none */
    st_tokenizer *tok;
    /* an EAGLE head (src/draft/eagle_load.c) has an input projection over [embedding; feature] and
     * no norms where attn_norm / out_norm are NULL; plain models have fc.data NULL */
    st_wt fc;               /* (n_embd, 2*n_embd) */
    float *fc_bias;         /* (n_embd) or NULL */
    void *owned;            /* an EAGLE head's weights: one 64-byte-aligned block, or NULL */
    void *owned_conv;       /* ... its matrices converted by st_eagle_head_set_type, or NULL */
    const st_model *target; /* an EAGLE head: the model it was loaded for (its embedding and
                             * output layer are borrowed from it), else NULL */
    st_load_info load;      /* what the load did (load.c) */
    /* EAGLE-3 (src/draft/eagle3_load.c): fc (n_embd, n_cap * target n_embd) fuses the target's
     * states entering layers cap_layer; layer 0's attn_norm normalizes the embedding and
     * hidden_norm the incoming state, its q/k/v read both (2 * n_embd); out_norm and output
     * are its own (output: its lm_head over the draft vocabulary, output.n_out rows) */
    int eagle3;
    float *hidden_norm;            /* (n_embd) in owned */
    int32_t *d2t;                  /* (output.n_out) target id of each draft id, in owned */
    int32_t n_cap;                 /* target layers read */
    int32_t cap_layer[ST_CAP_MAX]; /* residual stream entering each (n_layer: after the last) */
};

/* The mode a load runs in (load.c): an explicit MMAP or COPY as requested; for AUTO the
 * environment's choice (env, from ST_LOAD) if any, else COPY for a file of at least
 * ST_LOAD_COPY_MIN_BYTES when avail (MemAvailable) holds it plus max(a quarter of it, 512 MB),
 * else MMAP. *reason gets a static string saying which rule decided. */
st_load_mode st_load_choose(st_load_mode requested, st_load_mode env, size_t file_bytes,
                            size_t avail, const char **reason);

/* What a token of a forward pass attends to: the rows [0, n_prefix) of its sequence's KV (each
 * only where prefix_mask[row] != 0 when prefix_mask is given), then the rows listed in
 * extra_rows[extra_off[i] .. extra_off[i+1]) in increasing position order. Keys are visited in
 * exactly this order with the same arithmetic as sequential decoding, so a tree node's output
 * equals that of decoding its path one token at a time (DESIGN.md invariant 1). */
typedef struct st_fwd {
    int32_t n;                         /* tokens, 1..n_batch */
    const int32_t *tokens;             /* (n) */
    const int32_t *pos;                /* (n) RoPE positions */
    const int32_t *seq;                /* (n) sequence of each token */
    const int32_t *kv_row;             /* (n) KV row its K/V are written to */
    const int32_t *n_prefix;           /* (n) */
    const uint8_t *const *prefix_mask; /* (n) pointers to n_prefix bytes, or NULL */
    const int32_t *extra_off;          /* (n+1) or NULL when no token has extra rows */
    const int32_t *extra_rows;         /* CSR values */
    const float *features;             /* (n, n_embd): EAGLE heads' input features, else NULL;
                                        * EAGLE-3: (n, fc.n_in) the target's fused layers */
    int32_t own_states;                /* EAGLE-3: features are the head's own outputs, (n,
                                        * n_embd), and fc is skipped */
    float *hidden;                     /* (n, n_embd) out, or NULL: the final-normed states */
    int32_t logits_from;               /* tokens i >= logits_from get logits ... */
    float *logits;                     /* ... in row i - logits_from, (n - logits_from, n_vocab) */
    int32_t defer_logits; /* keep the final-normed states of all n tokens in the session for
                           * st_session_logits instead of computing logits */
} st_fwd;

/* A parallel region of fewer multiply-adds than this runs on the calling thread alone: handing
 * part of it to a worker costs more (a few cache-line transfers, and on a busy machine a wait
 * for a descheduled thread) than it saves. A model of stories260K's size then decodes as fast
 * with two threads as with one. */
enum { ST_MIN_PARALLEL_MACS = 1 << 16 };

/* A session over m that runs on `with`'s backend and thread pool (its n_threads, whatever p
 * says) instead of its own: a drafter's session beside its target's, so that the two never hold
 * more threads than the target was given. It also uses `with`'s attention scores when they are
 * as large (scratch of one call). The two must never run at the same time (the pool runs one job
 * at a time), and `with` must outlive it. populate: commit its context-sized region at once
 * (st_lazy_alloc), the caller's choice, since it knows how many such sessions there are. */
st_status st_session_create_shared(const st_model *m, const st_session_params *p, st_session *with,
                                   bool populate, st_session **out);
/* Bytes of the context-sized region (KV cache and scores) of a session over m with n_ctx
 * positions and n_seq sequences beside `with` (its threads and KV cache types), as
 * st_session_create_shared would make it: what the session can commit at most. SIZE_MAX when
 * the size overflows. */
size_t st_session_context_bytes(const st_model *m, int32_t n_ctx, int32_t n_seq,
                                const st_session *with);

/* Tokens per attention work item: their shared prefix is streamed once for all of them. */
enum { ST_ATTN_TOKENS = 16 };
/* Floats per thread of f16 KV rows converted for the attention kernels (at least one row). */
enum { ST_KV_CONV_FLOATS = 2048 };

/* The backend seam (backend.h). */
typedef struct st_backend st_backend;

struct st_session {
    const st_model *m;
    st_session_params p;
    const st_backend *be;   /* every forward, verify and commit computes through it */
    const st_kernels *kern; /* the CPU backend's kernel table */
    st_pool *pool;
    bool pool_borrowed; /* another session's pool (st_session_create_shared): not freed here */
    int32_t *seq_len;   /* (n_seq) */
    void *k_cache;      /* (n_seq, n_layer, n_ctx, n_head_kv*head_dim) of p.type_k (f32 or f16) */
    void *v_cache;      /* same, of p.type_v */
    size_t k_elem, v_elem; /* bytes per element of k_cache, v_cache (4 or 2) */
    float *kv_conv;        /* (n_threads, max(ST_KV_CONV_FLOATS, head_dim)) f16 rows converted */
    float *rope_cos;       /* (n_batch, n_rot/2) of the tokens of the current forward pass */
    float *rope_sin;       /* (n_batch, n_rot/2) */
    void *lazy; /* the region of k_cache, v_cache and scores unless borrowed (st_lazy_alloc) */
    size_t lazy_bytes;
    /* scratch for n_batch tokens */
    float *x;           /* (n_batch, n_embd) residual stream */
    float *xb;          /* (n_batch, n_embd) normed input */
    int32_t n_deferred; /* rows of xb that hold final-normed states for st_session_logits */
    int32_t n_states;   /* rows of xb that hold the last forward's final-normed states */
    float *cat;         /* (n_batch, max(2*n_embd, fc.n_in)) an EAGLE head's input rows */
    float *q;           /* (n_batch, n_head*head_dim) */
    float *kt;          /* (n_batch, n_head_kv*head_dim) */
    float *vt;          /* (n_batch, n_head_kv*head_dim) */
    float *att;         /* (n_batch, n_head*head_dim) attention output */
    float *hb;          /* (n_batch, n_ff) */
    float *hb2;         /* (n_batch, n_ff) */
    float *tmp;         /* (n_batch, n_embd) matmul output before the residual add */
    st_block_q8x *xq;   /* (n_batch, max(n_embd, n_ff, n_head*head_dim)/32) */
    st_block_q8k *xk;   /* (n_batch, max(n_embd, n_ff, n_head*head_dim)/256) */
    float *scores; /* (n_threads, ST_ATTN_TOKENS, n_head/n_head_kv, n_ctx + 1) attention scores,
                    * or st_session_create_shared's lender's */
    /* per-token attention descriptions for st_session_eval */
    int32_t *b_pos, *b_seq, *b_row, *b_prefix; /* (n_batch) each */
    int32_t *b_extra_off;                      /* (n_batch + 1) */
    int32_t *b_extra;        /* (n_batch, n_batch): tree rows visible to each token */
    const uint8_t **b_pmask; /* (n_batch) prefix-mask row pointers (dense backend) */
    int64_t kv_seq_stride;   /* elements per sequence in k_cache and v_cache */
    int64_t kv_layer_stride; /* elements per layer */

    /* EAGLE-3 features (st_session_set_capture) */
    int32_t n_cap; /* layers captured (0: none) */
    int32_t cap_layer[ST_CAP_MAX];
    float *cap; /* (n_batch, n_cap*n_embd) the residual stream entering each, owned */
};

/* Runs one forward pass (see st_fwd). Validates ids, rows and sequences; allocates nothing. */
st_status st_forward(st_session *s, const st_fwd *f);

/* The final-normed state of token i of the last forward pass that normed them (a verify with
 * deferred logits, a plain step, an eval with logits or hidden states): the feature an EAGLE
 * head reads; with capture set (st_session_set_capture), the captured layers instead. Valid
 * until the next forward pass; NULL for i out of range. */
const float *st_session_state(const st_session *s, int64_t i);

/* Captures, in every later forward pass, the residual stream entering layers layers[0..n)
 * (n_layer: the last layer's output, before the final norm), concatenated in that order:
 * st_session_state then returns these n*n_embd floats per token instead of the final-normed
 * state (EAGLE-3's features). n = 0 turns capture off. Allocates its buffer here (not while
 * decoding); logits are unchanged. */
st_status st_session_set_capture(st_session *s, int32_t n, const int32_t *layers);

/* Receives the final-normed state (n_embd) of the token at position pos: the target's features
 * an EAGLE drafter reads. */
typedef st_status (*st_state_fn)(void *user, int64_t pos, const float *state);

/* st_session_eval that also hands every evaluated token's final-normed state to fn (NULL: none),
 * chunk by chunk in increasing position order, before the next chunk's forward pass. */
st_status st_session_eval_states(st_session *s, int32_t seq, const int32_t *tokens, int32_t n,
                                 float *logits, int32_t n_logits, st_state_fn fn, void *user);

/* Bytes of one position's K and V rows over every layer (what st_session_kv_save writes per
 * position). */
size_t st_session_kv_row_bytes(const st_session *s);
/* Copies the K/V rows of positions [pos, pos + n) of sequence seq to dst (n *
 * st_session_kv_row_bytes bytes, the backend's kv_copy layout): rows the caller knows hold what
 * it wants (committed ones; a drafter's own rows, which it tracks itself). ST_ERR_RANGE outside
 * the context. */
st_status st_session_kv_save(st_session *s, int32_t seq, int32_t pos, int32_t n, void *dst);
/* Appends n positions to sequence seq from src, as st_session_kv_save wrote them: the rows go to
 * [L, L + n) (L: its length) and the length grows by n. ST_ERR_RANGE past the context. The rows
 * must be those a forward pass writes at these positions for the same tokens after the same
 * prefix (the prefix cache's), or the sequence's later outputs are not what decoding computes. */
st_status st_session_kv_load(st_session *s, int32_t seq, int32_t n, const void *src);

/* K/V rows of sequence seq, layer l (elements of k_elem / v_elem bytes). */
static inline uint8_t *st_kv_k(const st_session *s, int32_t seq, int32_t l) {
    return (uint8_t *)s->k_cache +
           (size_t)(seq * s->kv_seq_stride + l * s->kv_layer_stride) * s->k_elem;
}
static inline uint8_t *st_kv_v(const st_session *s, int32_t seq, int32_t l) {
    return (uint8_t *)s->v_cache +
           (size_t)(seq * s->kv_seq_stride + l * s->kv_layer_stride) * s->v_elem;
}

#endif /* ST_MODEL_H */
