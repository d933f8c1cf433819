/*
 * session.c: a session over a model: the KV cache of n_seq sequences and the attention scores,
 * sized for the whole context but committed by the OS only as the tokens use them (st_lazy_alloc),
 * and the scratch of a batch of n_batch tokens in one planned block; all sized and allocated at
 * creation (nothing is allocated while decoding or verifying), the region from the session's
 * backend (backend.h). Also the sequences' lengths and prompt evaluation. The verify forward and
 * the KV commit are in kv.c.
 */
#include "model/backend.h"

#include <math.h>

int32_t st_model_default_ctx(const st_model *m) {
    return m->hp.n_ctx_train < ST_DEFAULT_N_CTX ? m->hp.n_ctx_train : ST_DEFAULT_N_CTX;
}

st_session_params st_session_default_params(void) {
    st_session_params p = {.n_ctx = 0,
                           .n_seq = 1,
                           .n_batch = 64,
                           .n_threads = 0,
                           .type_k = ST_DTYPE_F32,
                           .type_v = ST_DTYPE_F32};
    return p;
}

const st_session_params *st_session_get_params(const st_session *s) { return &s->p; }

void st_session_free(st_session *s) {
    if (!s)
        return;
    if (!s->pool_borrowed)
        st_pool_free(s->pool);
    s->be->buf_free(s->lazy, s->lazy_bytes);
    st_free(s->cap);
    st_free_aligned(s); /* the struct heads the one block that holds every other buffer */
}

static size_t kv_elem(uint32_t type) { return type == ST_DTYPE_F16 ? 2 : sizeof(float); }

static size_t scores_floats(const st_model_hparams *hp, const st_session_params *p) {
    return (size_t)p->n_threads * ST_ATTN_TOKENS * (size_t)(hp->n_head / hp->n_head_kv) *
           ((size_t)p->n_ctx + 1);
}

/* The session whose attention scores a session beside `with` uses: `with`, when its buffer is
 * as large (scores are the scratch of one attention call, and the two never run at once), so
 * that the drafters of many slots do not each hold a context-sized copy; else NULL, its own. */
static const st_session *scores_lender(const st_model_hparams *hp, const st_session_params *p,
                                       const st_session *with) {
    return with && scores_floats(hp, p) <= scores_floats(&with->m->hp, &with->p) ? with : NULL;
}

/* The context-sized buffers, in one lazily committed region (the first pass sizes, the second
 * carves; core.h): kv is n_seq * n_layer * n_ctx * KV elements of each cache's type; the scores
 * are the lender's or the region's. */
static void session_lazy_layout(st_plan *pl, st_session *s, const st_model_hparams *hp,
                                const st_session_params *p, size_t kv, const st_session *lender) {
    s->k_cache = st_plan_take(pl, kv, kv_elem(p->type_k));
    s->v_cache = st_plan_take(pl, kv, kv_elem(p->type_v));
    s->scores = lender ? lender->scores : st_plan_take(pl, scores_floats(hp, p), sizeof(float));
}

/* Sizes the region of a session over hp with p (n_ctx, n_seq and n_threads resolved) beside
 * `with` (or NULL): lz->off its bytes, lz->overflow set when they overflow; *kv_total the
 * elements of each cache. */
static void session_lazy_size(st_plan *lz, const st_model_hparams *hp, const st_session_params *p,
                              const st_session *with, size_t *kv_total) {
    const size_t KV = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    *kv_total = 0;
    if (!st_mul_size((size_t)p->n_seq * (size_t)hp->n_layer, (size_t)p->n_ctx, kv_total) ||
        !st_mul_size(*kv_total, KV, kv_total))
        lz->overflow = true;
    st_session sizing;
    session_lazy_layout(lz, &sizing, hp, p, *kv_total, scores_lender(hp, p, with));
}

size_t st_session_context_bytes(const st_model *m, int32_t n_ctx, int32_t n_seq,
                                const st_session *with) {
    st_session_params p = st_session_default_params();
    p.n_ctx = n_ctx, p.n_seq = n_seq, p.n_threads = with->p.n_threads;
    p.type_k = with->p.type_k, p.type_v = with->p.type_v;
    st_plan lz = {0};
    size_t kv_total;
    session_lazy_size(&lz, &m->hp, &p, with, &kv_total);
    return lz.overflow ? SIZE_MAX : lz.off;
}

/* The session's one block: the struct, then every buffer of the batch (the first pass sizes,
 * the second carves; core.h). n_threads is the pool's size. */
static void session_layout(st_plan *pl, st_session *s, const st_model *m,
                           const st_session_params *p) {
    const st_model_hparams *hp = &m->hp;
    const size_t E = (size_t)hp->n_embd, Q = (size_t)hp->n_head * (size_t)hp->head_dim,
                 KV = (size_t)hp->n_head_kv * (size_t)hp->head_dim, B = (size_t)p->n_batch,
                 F = (size_t)hp->n_ff, nrot2 = (size_t)hp->n_rot / 2;
    /* an EAGLE head's projections also read its [embedding; feature] rows (cat) */
    const size_t C = !m->fc.data ? 0 : (size_t)m->fc.n_in > 2 * E ? (size_t)m->fc.n_in : 2 * E;
    size_t qmax = E > F ? (E > Q ? E : Q) : (F > Q ? F : Q);
    qmax = C > qmax ? C : qmax;
    st_plan_take(pl, 1, sizeof *s);
    s->seq_len = st_plan_take(pl, (size_t)p->n_seq, sizeof(int32_t));
    s->rope_cos = st_plan_take(pl, B * nrot2, sizeof(float));
    s->rope_sin = st_plan_take(pl, B * nrot2, sizeof(float));
    s->x = st_plan_take(pl, B * E, sizeof(float));
    s->xb = st_plan_take(pl, B * E, sizeof(float));
    s->tmp = st_plan_take(pl, B * E, sizeof(float));
    s->q = st_plan_take(pl, B * Q, sizeof(float));
    s->att = st_plan_take(pl, B * Q, sizeof(float));
    s->kt = st_plan_take(pl, B * KV, sizeof(float));
    s->vt = st_plan_take(pl, B * KV, sizeof(float));
    s->hb = st_plan_take(pl, B * F, sizeof(float));
    s->hb2 = st_plan_take(pl, B * F, sizeof(float));
    s->cat = C ? st_plan_take(pl, B * C, sizeof(float)) : NULL;
    s->xq = st_plan_take(pl, B * (qmax / ST_QK + 1), sizeof(st_block_q8x));
    s->xk = st_plan_take(pl, B * (qmax / ST_QK_K + 1), sizeof(st_block_q8k));
    s->b_pos = st_plan_take(pl, B, sizeof(int32_t));
    s->b_seq = st_plan_take(pl, B, sizeof(int32_t));
    s->b_row = st_plan_take(pl, B, sizeof(int32_t));
    s->b_prefix = st_plan_take(pl, B, sizeof(int32_t));
    s->b_extra_off = st_plan_take(pl, B + 1, sizeof(int32_t));
    s->b_extra = st_plan_take(pl, B * B, sizeof(int32_t));
    s->b_pmask = st_plan_take(pl, B, sizeof(uint8_t *));
    const size_t conv =
        (size_t)hp->head_dim > ST_KV_CONV_FLOATS ? (size_t)hp->head_dim : ST_KV_CONV_FLOATS;
    s->kv_conv = p->type_k == ST_DTYPE_F16 || p->type_v == ST_DTYPE_F16
                     ? st_plan_take(pl, (size_t)p->n_threads * conv, sizeof(float))
                     : NULL;
}

/* shared: NULL, or the session whose pool this one borrows (its n_threads then; and its scores,
 * scores_lender); be: the backend its buffers come from and it computes through; populate: 1 or
 * 0 to commit the context-sized region at once or not, -1 to decide by its size */
static st_status session_create(const st_model *m, const st_session_params *pp, st_session *shared,
                                const st_backend *be, int populate, st_session **out) {
    if (!out || !m)
        return st_fail(ST_ERR_INVALID, "st_session_create: NULL argument");
    *out = NULL;
    st_session_params p = pp ? *pp : st_session_default_params();
    const st_model_hparams *hp = &m->hp;
    if (p.n_ctx <= 0)
        p.n_ctx = st_model_default_ctx(m);
    if (p.n_seq <= 0)
        p.n_seq = 1;
    if (p.n_batch <= 0)
        p.n_batch = 64;
    if (p.n_threads <= 0) /* tiny models: a barrier costs more than the work it splits */
        p.n_threads = st_model_weight_bytes(m) < ((size_t)16 << 20) ? 1 : st_n_cores();
    if (p.n_ctx > (1 << 24) || p.n_seq > 4096 || p.n_batch > 4096)
        return st_fail(ST_ERR_INVALID, "session: n_ctx %d, n_seq %d or n_batch %d is too large",
                       p.n_ctx, p.n_seq, p.n_batch);
    if ((p.type_k != ST_DTYPE_F32 && p.type_k != ST_DTYPE_F16) ||
        (p.type_v != ST_DTYPE_F32 && p.type_v != ST_DTYPE_F16))
        return st_fail(ST_ERR_INVALID,
                       "session: KV cache types %s/%s: only f32 and f16 are supported",
                       st_dtype_name(p.type_k), st_dtype_name(p.type_v));
    st_pool *pool = shared ? shared->pool : NULL;
    if (!shared) {
        st_status st = st_pool_create(p.n_threads, &pool);
        if (st)
            return st;
    }
    p.n_threads = st_pool_size(pool);
    const size_t KV = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    size_t kv_total = 0;
    /* the context-sized region: refused at once when it exceeds the machine's memory (it is
     * committed only as tokens use it, but a context that cannot fit is a mistake) */
    st_plan lz = {0};
    session_lazy_size(&lz, hp, &p, shared, &kv_total);
    st_session sizing;
    const size_t phys = st_phys_mem();
    if (lz.overflow || (phys && lz.off > phys)) {
        if (!shared)
            st_pool_free(pool);
        return st_fail(ST_ERR_NOMEM,
                       "session: a context of %d positions x %d sequences needs %.1f GB of KV "
                       "cache and scores; this machine has %.1f GB (use a smaller -c)",
                       p.n_ctx, p.n_seq, lz.overflow ? INFINITY : (double)lz.off / 1e9,
                       (double)phys / 1e9);
    }
    st_plan pl = {0};
    session_layout(&pl, &sizing, m, &p);
    st_session *s = st_plan_alloc(&pl);
    if (populate < 0) /* a session of its own: a small region is committed at once */
        populate = lz.off <= ST_LAZY_POPULATE_MAX;
    void *lazy = s ? be->buf_alloc(lz.off, populate != 0) : NULL;
    if (!s || !lazy) {
        st_free_aligned(s);
        if (!shared)
            st_pool_free(pool);
        return st_fail(ST_ERR_NOMEM,
                       "session: out of memory for %zu MB of scratch and %zu MB of context "
                       "(n_ctx %d, n_seq %d, n_batch %d)",
                       pl.off >> 20, lz.off >> 20, p.n_ctx, p.n_seq, p.n_batch);
    }
    session_layout(&pl, s, m, &p);
    lz.base = lazy, lz.off = 0; /* carve the region (st_plan_alloc would touch every page) */
    session_lazy_layout(&lz, s, hp, &p, kv_total, scores_lender(hp, &p, shared));
    s->lazy = lazy;
    s->lazy_bytes = lz.off;
    s->m = m;
    s->be = be;
    s->kern = st_kernels_get();
    s->pool = pool;
    s->pool_borrowed = shared != NULL;
    s->p = p;
    s->k_elem = kv_elem(p.type_k);
    s->v_elem = kv_elem(p.type_v);
    s->kv_layer_stride = (int64_t)p.n_ctx * (int64_t)KV;
    s->kv_seq_stride = s->kv_layer_stride * hp->n_layer;
    *out = s;
    return ST_OK;
}

st_status st_session_create(const st_model *m, const st_session_params *p, st_session **out) {
    return session_create(m, p, NULL, st_backend_cpu(), -1, out);
}

st_status st_session_create_backend(const st_model *m, const st_session_params *p,
                                    const st_backend *be, st_session **out) {
    if (!be)
        return st_fail(ST_ERR_INVALID, "st_session_create_backend: NULL backend");
    return session_create(m, p, NULL, be, -1, out);
}

st_status st_session_create_shared(const st_model *m, const st_session_params *p, st_session *with,
                                   bool populate, st_session **out) {
    if (!with)
        return st_fail(ST_ERR_INVALID, "st_session_create_shared: NULL session");
    return session_create(m, p, with, with->be, populate, out);
}

st_status st_session_set_capture(st_session *s, int32_t n, const int32_t *layers) {
    if (!s || n < 0 || n > ST_CAP_MAX || (n > 0 && !layers))
        return st_fail(ST_ERR_INVALID, "capture: %d layers (at most %d)", n, ST_CAP_MAX);
    for (int32_t c = 0; c < n; c++)
        if (layers[c] < 0 || layers[c] > s->m->hp.n_layer)
            return st_fail(ST_ERR_INVALID, "capture: layer %d outside [0, %d]", layers[c],
                           s->m->hp.n_layer);
    st_free(s->cap);
    s->cap = NULL;
    s->n_cap = 0;
    s->n_states = 0;
    if (n == 0)
        return ST_OK;
    s->cap = st_malloc((size_t)s->p.n_batch * (size_t)n * (size_t)s->m->hp.n_embd * sizeof(float));
    if (!s->cap)
        return st_fail(ST_ERR_NOMEM, "capture: out of memory");
    for (int32_t c = 0; c < n; c++)
        s->cap_layer[c] = layers[c];
    s->n_cap = n;
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

size_t st_session_kv_row_bytes(const st_session *s) {
    const st_model_hparams *hp = &s->m->hp;
    return (size_t)hp->n_layer * (size_t)hp->n_head_kv * (size_t)hp->head_dim *
           (s->k_elem + s->v_elem);
}

st_status st_session_kv_save(st_session *s, int32_t seq, int32_t pos, int32_t n, void *dst) {
    if (!s || !dst || seq < 0 || seq >= s->p.n_seq)
        return st_fail(ST_ERR_INVALID, "kv save: bad sequence %d or NULL buffer", seq);
    if (pos < 0 || n < 0 || pos > s->p.n_ctx - n)
        return st_fail(ST_ERR_RANGE, "kv save: positions [%d, %d + %d) outside the context of %d",
                       pos, pos, n, s->p.n_ctx);
    s->be->kv_copy(s, seq, pos, n, dst, true);
    return ST_OK;
}

st_status st_session_kv_load(st_session *s, int32_t seq, int32_t n, const void *src) {
    if (!s || !src || seq < 0 || seq >= s->p.n_seq)
        return st_fail(ST_ERR_INVALID, "kv load: bad sequence %d or NULL buffer", seq);
    const int32_t L = s->seq_len[seq];
    if (n < 0 || n > s->p.n_ctx - L)
        return st_fail(ST_ERR_RANGE, "kv load: %d positions after %d exceed the context of %d", n,
                       L, s->p.n_ctx);
    s->be->kv_copy(s, seq, L, n, (void *)src, false);
    s->seq_len[seq] = L + n;
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
