/*
 * session.c: a session over a model: the KV cache of n_seq sequences, the RoPE tables and the
 * scratch of a batch of n_batch tokens, all sized and allocated at creation (nothing is allocated
 * while decoding or verifying), the sequences' lengths, and prompt evaluation. The verify forward
 * and the KV commit are in kv.c.
 */
#include "model/model.h"

#include <math.h>
#include <string.h>

st_session_params st_session_default_params(void) {
    st_session_params p = {.n_ctx = 0, .n_seq = 1, .n_batch = 64, .n_threads = 0};
    return p;
}

const st_session_params *st_session_get_params(const st_session *s) { return &s->p; }

void st_session_free(st_session *s) {
    if (!s)
        return;
    st_pool_free(s->pool);
    st_free(s->seq_len);
    st_free_aligned(s->k_cache);
    st_free_aligned(s->v_cache);
    void *bufs[] = {s->rope_cos, s->rope_sin, s->x,           s->xb,      s->q,
                    s->kt,       s->vt,       s->att,         s->hb,      s->hb2,
                    s->tmp,      s->xq,       s->scores,      s->b_pos,   s->b_seq,
                    s->b_row,    s->b_prefix, s->b_extra_off, s->b_extra, (void *)s->b_pmask};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        st_free_aligned(bufs[i]);
    st_free_aligned(s->cat);
    st_free(s);
}

static void *alloc_f(size_t n, size_t elem, bool *ok) {
    size_t bytes;
    if (!st_mul_size(n ? n : 1, elem, &bytes)) {
        *ok = false;
        return NULL;
    }
    void *p = st_malloc_aligned(bytes, 64);
    if (!p)
        *ok = false;
    else
        memset(p, 0, bytes);
    return p;
}

st_status st_session_create(const st_model *m, const st_session_params *pp, st_session **out) {
    if (!out || !m)
        return st_fail(ST_ERR_INVALID, "st_session_create: NULL argument");
    *out = NULL;
    st_session_params p = pp ? *pp : st_session_default_params();
    const st_model_hparams *hp = &m->hp;
    if (p.n_ctx <= 0)
        p.n_ctx = hp->n_ctx_train;
    if (p.n_seq <= 0)
        p.n_seq = 1;
    if (p.n_batch <= 0)
        p.n_batch = 64;
    if (p.n_threads <= 0) /* tiny models: a barrier costs more than the work it splits */
        p.n_threads = st_model_weight_bytes(m) < ((size_t)16 << 20) ? 1 : st_n_cores();
    if (p.n_ctx > (1 << 24) || p.n_seq > 4096 || p.n_batch > 4096)
        return st_fail(ST_ERR_INVALID, "session: n_ctx %d, n_seq %d or n_batch %d is too large",
                       p.n_ctx, p.n_seq, p.n_batch);
    st_session *s = st_calloc(1, sizeof *s);
    if (!s)
        return st_fail(ST_ERR_NOMEM, "session: out of memory");
    s->m = m;
    s->kern = st_kernels_get();
    st_status st = st_pool_create(p.n_threads, &s->pool);
    if (st) {
        st_free(s);
        return st;
    }
    p.n_threads = st_pool_size(s->pool);
    s->p = p;
    const size_t E = (size_t)hp->n_embd, Q = (size_t)hp->n_head * (size_t)hp->head_dim,
                 KV = (size_t)hp->n_head_kv * (size_t)hp->head_dim, B = (size_t)p.n_batch,
                 F = (size_t)hp->n_ff;
    size_t kv_total = 1;
    bool ok = st_mul_size((size_t)p.n_seq * (size_t)hp->n_layer, (size_t)p.n_ctx, &kv_total) &&
              st_mul_size(kv_total, KV, &kv_total);
    s->kv_layer_stride = (int64_t)p.n_ctx * (int64_t)KV;
    s->kv_seq_stride = s->kv_layer_stride * hp->n_layer;
    size_t qmax = E > F ? E : F;
    if (Q > qmax)
        qmax = Q;
    s->seq_len = st_calloc((size_t)p.n_seq, sizeof(int32_t));
    ok = ok && s->seq_len;
    if (ok) {
        s->k_cache = alloc_f(kv_total, sizeof(float), &ok);
        s->v_cache = alloc_f(kv_total, sizeof(float), &ok);
    }
    size_t nrot2 = (size_t)hp->n_rot / 2;
    s->rope_cos = alloc_f((size_t)p.n_ctx * nrot2, sizeof(float), &ok);
    s->rope_sin = alloc_f((size_t)p.n_ctx * nrot2, sizeof(float), &ok);
    s->x = alloc_f(B * E, sizeof(float), &ok);
    s->xb = alloc_f(B * E, sizeof(float), &ok);
    s->tmp = alloc_f(B * E, sizeof(float), &ok);
    s->q = alloc_f(B * Q, sizeof(float), &ok);
    s->att = alloc_f(B * Q, sizeof(float), &ok);
    s->kt = alloc_f(B * KV, sizeof(float), &ok);
    s->vt = alloc_f(B * KV, sizeof(float), &ok);
    s->hb = alloc_f(B * F, sizeof(float), &ok);
    s->hb2 = alloc_f(B * F, sizeof(float), &ok);
    if (m->fc.data) /* an EAGLE head's [embedding; feature] rows */
        s->cat = alloc_f(B * 2 * E, sizeof(float), &ok);
    s->xq = alloc_f(B * (qmax / ST_QK + 1), sizeof(st_block_q8x), &ok);
    s->scores = alloc_f((size_t)p.n_threads * ST_ATTN_TOKENS *
                            (size_t)(hp->n_head / hp->n_head_kv) * ((size_t)p.n_ctx + 1),
                        sizeof(float), &ok);
    s->b_pos = alloc_f(B, sizeof(int32_t), &ok);
    s->b_seq = alloc_f(B, sizeof(int32_t), &ok);
    s->b_row = alloc_f(B, sizeof(int32_t), &ok);
    s->b_prefix = alloc_f(B, sizeof(int32_t), &ok);
    s->b_extra_off = alloc_f(B + 1, sizeof(int32_t), &ok);
    s->b_extra = alloc_f(B * B, sizeof(int32_t), &ok);
    s->b_pmask = alloc_f(B, sizeof(uint8_t *), &ok);
    if (!ok) {
        st_session_free(s);
        return st_fail(ST_ERR_NOMEM,
                       "session: out of memory (n_ctx %d, n_seq %d, n_batch %d: KV cache %zu MB)",
                       p.n_ctx, p.n_seq, p.n_batch, kv_total * 8 / (1024 * 1024));
    }
    /* RoPE tables in double precision: theta = pos * base^(-2j/n_rot). */
    for (int32_t pos = 0; pos < p.n_ctx; pos++)
        for (size_t j = 0; j < nrot2; j++) {
            double freq = pow((double)hp->rope_base, -2.0 * (double)j / (double)hp->n_rot);
            double a = (double)pos * freq;
            s->rope_cos[(size_t)pos * nrot2 + j] = (float)cos(a);
            s->rope_sin[(size_t)pos * nrot2 + j] = (float)sin(a);
        }
    *out = s;
    return ST_OK;
}

int32_t st_session_seq_len(const st_session *s, int32_t seq) {
    return (seq >= 0 && seq < s->p.n_seq) ? s->seq_len[seq] : -1;
}

st_status st_session_seq_reset(st_session *s, int32_t seq) {
    if (seq < 0 || seq >= s->p.n_seq)
        return st_fail(ST_ERR_INVALID, "sequence %d out of range (n_seq %d)", seq, s->p.n_seq);
    s->seq_len[seq] = 0;
    return ST_OK;
}

st_status st_session_seq_truncate(st_session *s, int32_t seq, int32_t len) {
    if (!s || seq < 0 || seq >= s->p.n_seq)
        return st_fail(ST_ERR_INVALID, "truncate: sequence %d out of range", seq);
    if (len < 0 || len > s->seq_len[seq])
        return st_fail(ST_ERR_RANGE, "truncate: length %d outside [0, %d] of sequence %d", len,
                       s->seq_len[seq], seq);
    s->seq_len[seq] = len;
    return ST_OK;
}

st_status st_session_eval_states(st_session *s, int32_t seq, const int32_t *tokens, int32_t n,
                                 float *logits, int32_t n_logits, st_state_fn fn, void *user) {
    if (!s || !tokens || n < 1)
        return st_fail(ST_ERR_INVALID, "eval: need at least one token");
    if (seq < 0 || seq >= s->p.n_seq)
        return st_fail(ST_ERR_INVALID, "eval: sequence %d out of range [0, %d)", seq, s->p.n_seq);
    if (logits && (n_logits < 1 || n_logits > n))
        return st_fail(ST_ERR_INVALID, "eval: n_logits %d must be in [1, %d]", n_logits, n);
    if (!logits)
        n_logits = 0;
    int32_t L = s->seq_len[seq];
    if (n > s->p.n_ctx - L)
        return st_fail(ST_ERR_RANGE, "context full: %d positions used, %d more requested, n_ctx %d",
                       L, n, s->p.n_ctx);
    int32_t V = s->m->hp.n_vocab;
    for (int32_t done = 0; done < n;) {
        int32_t c = n - done < s->p.n_batch ? n - done : s->p.n_batch;
        for (int32_t i = 0; i < c; i++) {
            s->b_pos[i] = L + done + i;
            s->b_row[i] = L + done + i;
            s->b_seq[i] = seq;
            s->b_prefix[i] = L + done + i + 1;
        }
        /* logits wanted for tokens [n - n_logits, n) */
        int32_t first = n - n_logits; /* global index of first token with logits */
        int32_t from = first - done;
        if (from < 0)
            from = 0;
        if (from > c)
            from = c;
        st_fwd f = {.n = c,
                    .tokens = tokens + done,
                    .pos = s->b_pos,
                    .seq = s->b_seq,
                    .kv_row = s->b_row,
                    .n_prefix = s->b_prefix,
                    .logits_from = from,
                    .logits = logits ? logits + (int64_t)(done + from - first) * V : NULL,
                    .defer_logits = fn != NULL}; /* every token's state normed and kept */
        st_status st = st_forward(s, &f);
        for (int32_t i = 0; i < c && fn && !st; i++)
            st = fn(user, L + done + i, st_session_state(s, i));
        if (st)
            return st;
        done += c;
        s->seq_len[seq] = L + done;
    }
    return ST_OK;
}

st_status st_session_eval(st_session *s, int32_t seq, const int32_t *tokens, int32_t n,
                          float *logits, int32_t n_logits) {
    return st_session_eval_states(s, seq, tokens, n, logits, n_logits, NULL, NULL);
}
