/*
 * forward.c: the batched forward pass over an explicit attention description (st_fwd): the
 * embedding (or an EAGLE head's input), then per layer RMSNorm, the q/k/v projections, RoPE,
 * attention, the output projection, RMSNorm and SwiGLU, and the output layer, now or deferred,
 * every step an operation of the session's backend (backend.h), whose results are bitwise
 * batch-invariant: what makes tree verification equal to sequential decoding (DESIGN.md
 * invariant 1).
 */
#include "model/backend.h"

/* EAGLE-3 features: copies the residual stream of the batch entering layer l into the capture
 * rows of every captured layer equal to l (st_session_set_capture). */
static void capture(st_session *s, int32_t l, int64_t T) {
    const int64_t E = s->m->hp.n_embd, W = (int64_t)s->n_cap * E;
    for (int32_t c = 0; c < s->n_cap; c++)
        if (s->cap_layer[c] == l)
            s->be->copy_rows(s, s->cap + c * E, W, s->x, E, T, E);
}

static void matmul1(st_session *s, const st_wt *w, float *y, const float *x, int64_t M) {
    s->be->matmul(s, 1, &w, &y, x, M);
}

/* EAGLE-3 (Li et al., EAGLE-3, 2025; SafeAILab/EAGLE traineagle3/cnets.py): the head's state g,
 * fc over the target's fused layers or its own previous output, into s->x (the residual). */
static void eagle3_state(st_session *s, const st_fwd *f) {
    const int64_t E = s->m->hp.n_embd, T = f->n;
    if (f->own_states)
        s->be->copy_rows(s, s->x, E, f->features, E, T, E);
    else
        matmul1(s, &s->m->fc, s->x, f->features, T);
}

/* EAGLE-3's layer input: [input_layernorm(embedding); hidden_norm(g)] (2 * n_embd) per token in
 * s->cat, the order of the published code. */
static void eagle3_layer_input(st_session *s, const st_fwd *f) {
    const st_model *m = s->m;
    const int64_t E = m->hp.n_embd;
    s->be->get_rows(s, &m->tok_embd, f->tokens, f->n, s->cat, 2 * E);
    s->be->norm(s, s->cat, 2 * E, s->cat, 2 * E, m->layers[0].attn_norm, f->n, E, m->hp.rms_eps);
    s->be->norm(s, s->cat + E, 2 * E, s->x, E, m->hidden_norm, f->n, E, m->hp.rms_eps);
}

static st_status check_fwd(const st_session *s, const st_fwd *f) {
    const st_model_hparams *hp = &s->m->hp;
    if (s->m->fc.data && (!f->features || !s->cat))
        return st_fail(ST_ERR_INVALID, "forward: an EAGLE head needs the target's features");
    if (f->n < 1 || f->n > s->p.n_batch)
        return st_fail(ST_ERR_INVALID, "forward: %d tokens (must be 1..%d)", f->n, s->p.n_batch);
    if (f->logits_from < 0 || f->logits_from > f->n)
        return st_fail(ST_ERR_INVALID, "forward: logits_from %d out of range", f->logits_from);
    for (int32_t i = 0; i < f->n; i++) {
        if (f->tokens[i] < 0 || f->tokens[i] >= hp->n_vocab)
            return st_fail(ST_ERR_INVALID, "token id %d out of range [0, %d)", f->tokens[i],
                           hp->n_vocab);
        if (f->seq[i] < 0 || f->seq[i] >= s->p.n_seq)
            return st_fail(ST_ERR_INVALID, "sequence %d out of range [0, %d)", f->seq[i],
                           s->p.n_seq);
        if (f->pos[i] < 0 || f->pos[i] >= s->p.n_ctx || f->kv_row[i] < 0 ||
            f->kv_row[i] >= s->p.n_ctx)
            return st_fail(ST_ERR_RANGE, "position %d / KV row %d outside the context of %d",
                           f->pos[i], f->kv_row[i], s->p.n_ctx);
        int32_t ne = f->extra_off ? f->extra_off[i + 1] - f->extra_off[i] : 0;
        if (f->n_prefix[i] < 0 || f->n_prefix[i] > s->p.n_ctx || ne < 0 ||
            ne > s->p.n_ctx - f->n_prefix[i])
            return st_fail(ST_ERR_RANGE,
                           "token %d: %d prefix keys + %d extra keys exceed the "
                           "context of %d",
                           i, f->n_prefix[i], ne, s->p.n_ctx);
        for (int32_t e = 0; e < ne; e++) {
            int32_t r = f->extra_rows[f->extra_off[i] + e];
            if (r < 0 || r >= s->p.n_ctx)
                return st_fail(ST_ERR_RANGE, "token %d: key row %d outside the context", i, r);
        }
    }
    return ST_OK;
}

st_status st_forward(st_session *s, const st_fwd *f) {
    st_status st = check_fwd(s, f);
    if (st)
        return st;
    const st_model *m = s->m;
    const st_model_hparams *hp = &m->hp;
    const st_backend *be = s->be;
    const int64_t E = hp->n_embd, hd = hp->head_dim, Q = (int64_t)hp->n_head * hd,
                  KV = (int64_t)hp->n_head_kv * hd, F = hp->n_ff, T = f->n;
    if (m->eagle3) {
        eagle3_state(s, f);
    } else if (m->fc.data) {
        /* an EAGLE head: x = fc([embedding; feature]) + bias (the order of the published code) */
        be->get_rows(s, &m->tok_embd, f->tokens, T, s->cat, 2 * E);
        be->copy_rows(s, s->cat + E, 2 * E, f->features, E, T, E);
        matmul1(s, &m->fc, s->x, s->cat, T);
        if (m->fc_bias)
            be->add_rows(s, s->x, m->fc_bias, 0, T, E);
    } else {
        be->get_rows(s, &m->tok_embd, f->tokens, T, s->x, E);
    }
    be->rope_angles(s, f->pos, T);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const st_layer *L = &m->layers[l];
        capture(s, l, T);
        if (m->eagle3)
            eagle3_layer_input(s, f);
        else
            be->norm(s, s->xb, E, s->x, E, L->attn_norm, T, E, hp->rms_eps);
        const st_wt *wqkv[3] = {&L->wq, &L->wk, &L->wv};
        float *yqkv[3] = {s->q, s->kt, s->vt};
        be->matmul(s, 3, wqkv, yqkv, m->eagle3 ? s->cat : s->xb, T);
        const float *bqkv[3] = {L->bq, L->bk, L->bv};
        const int64_t nqkv[3] = {Q, KV, KV};
        for (int b = 0; b < 3; b++)
            if (bqkv[b])
                be->add_rows(s, yqkv[b], bqkv[b], 0, T, nqkv[b]);
        be->rope(s, s->q, hp->n_head, T);
        be->rope(s, s->kt, hp->n_head_kv, T);
        be->kv_store(s, f, l);
        be->attn(s, f, l);
        matmul1(s, &L->wo, s->tmp, s->att, T);
        be->add_rows(s, s->x, s->tmp, E, T, E);
        be->norm(s, s->xb, E, s->x, E, L->ffn_norm, T, E, hp->rms_eps);
        const st_wt *wgu[2] = {&L->w_gate, &L->w_up};
        float *ygu[2] = {s->hb, s->hb2};
        be->matmul(s, 2, wgu, ygu, s->xb, T);
        be->swiglu(s, s->hb, s->hb2, T * F);
        matmul1(s, &L->w_down, s->tmp, s->hb, T);
        be->add_rows(s, s->x, s->tmp, E, T, E);
    }
    capture(s, hp->n_layer, T);
    int64_t n_out = T - f->logits_from;
    s->n_deferred = 0;
    s->n_states = 0;
    if ((f->logits && n_out > 0) || f->defer_logits || f->hidden) {
        be->norm(s, s->xb, E, s->x, E, m->out_norm, T, E, hp->rms_eps);
        s->n_states = (int32_t)T;
        if (f->hidden)
            be->copy_rows(s, f->hidden, E, s->xb, E, T, E);
        if (f->logits && n_out > 0)
            matmul1(s, &m->output, f->logits, s->xb + f->logits_from * E, n_out);
        else if (f->defer_logits)
            s->n_deferred = (int32_t)T;
    }
    return ST_OK;
}

const float *st_session_state(const st_session *s, int64_t i) {
    if (!s || i < 0 || i >= s->n_states)
        return NULL;
    return s->n_cap ? s->cap + i * s->n_cap * s->m->hp.n_embd : s->xb + i * s->m->hp.n_embd;
}

st_status st_session_logits(st_session *s, int64_t i, float *logits) {
    if (!s || !logits)
        return st_fail(ST_ERR_INVALID, "logits: NULL argument");
    if (i < 0 || i >= s->n_deferred)
        return st_fail(ST_ERR_INVALID,
                       "logits: node %lld is not one of the %d nodes of the last deferred "
                       "verify",
                       (long long)i, s->n_deferred);
    /* one row of the output layer: the same canonical reductions as a batch (invariant 1) */
    matmul1(s, &s->m->output, logits, s->xb + i * s->m->hp.n_embd, 1);
    return ST_OK;
}
