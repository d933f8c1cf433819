/*
 * forward.c: the batched forward pass over an explicit attention description (st_fwd): RMSNorm,
 * RoPE in GGUF's adjacent-pair layout, the projections through the kernel table split over the
 * thread pool by rows, attention (attn.c), SwiGLU, and the output layer, now or deferred. Every
 * output element is reduced in one fixed order whatever the batch size, tree shape or thread
 * count, which is what makes tree verification bitwise equal to sequential decoding (DESIGN.md
 * invariant 1).
 */
#include "model/model.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* Stores n floats as a KV row of elem bytes per element (f16: rounded to nearest even). */
static void kv_store(uint8_t *dst, size_t elem, const float *x, int64_t n) {
    if (elem == sizeof(float)) {
        memcpy(dst, x, (size_t)n * sizeof(float));
        return;
    }
    for (int64_t e = 0; e < n; e++) {
        const uint16_t h = st_f32_to_fp16(x[e]);
        memcpy(dst + 2 * e, &h, 2);
    }
}

/* y = x / sqrt(mean(x^2) + eps) * w, with the canonical dot product for the sum of squares, or
 * (match_ggml) ggml's: float squares summed in double, the mean rounded to float. */
static void rmsnorm(const st_session *s, float *y, const float *x, const float *w, int64_t n,
                    float eps) {
    float ss;
    if (s->p.match_ggml) {
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++)
            sum += (double)(x[i] * x[i]);
        ss = (float)(sum / (double)n);
    } else {
        ss = s->kern->dot(x, x, n) / (float)n;
    }
    float scale = 1.0f / sqrtf(ss + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = (x[i] * scale) * w[i];
}

/* RMSNorm with weight w, or a plain copy where the model has no norm there (an EAGLE-1 head has
 * none before its layer and none after it). */
static void norm_or_copy(const st_session *s, float *y, const float *x, const float *w, int64_t n,
                         float eps) {
    if (w)
        rmsnorm(s, y, x, w, n, eps);
    else
        memcpy(y, x, (size_t)n * sizeof(float));
}

/* The embedding row of token t (the target's, for an EAGLE head that shares it). */
static void embed_row(const st_model *m, int32_t t, float *out) {
    st_dequant_row(m->tok_embd.type,
                   (const char *)m->tok_embd.data + (size_t)t * m->tok_embd.row_bytes, out,
                   m->hp.n_embd);
}

/* Rotates adjacent pairs (2j, 2j+1) of each head (GGUF/llama.cpp NORMAL mode). ggml: the same
 * expressions in C, which GCC 12 at -O3 -march=native contracts to fma(a, cos, -(b sin)) and
 * fma(a, sin, b cos) (checked in its assembly). */
static void rope(float *v, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float *cs,
                 const float *sn, int ggml) {
    for (int32_t h = 0; h < n_heads; h++) {
        float *vh = v + (int64_t)h * head_dim;
        for (int32_t j = 0; j < n_rot / 2; j++) {
            float a = vh[2 * j], b = vh[2 * j + 1];
            if (ggml) {
                vh[2 * j] = fmaf(a, cs[j], -(b * sn[j]));
                vh[2 * j + 1] = fmaf(a, sn[j], b * cs[j]);
            } else {
                vh[2 * j] = a * cs[j] - b * sn[j];
                vh[2 * j + 1] = a * sn[j] + b * cs[j];
            }
        }
    }
}

typedef struct mm_job {
    const st_kernels *k;
    int ggml; /* K-quant matrices in ggml's float order (st_matmul_kq_ggml) */
    int n_mat;
    const st_wt *w[3];
    float *y[3];
    const void *x[3]; /* per matrix: float, st_block_q8x or st_block_q8k (M, ldx) */
    int64_t ldx[3];
    int64_t M;
    int64_t chunk;       /* rows per work item */
    int64_t n_chunks[3]; /* work items of each matrix */
    atomic_llong next;   /* next work item, over the matrices in order */
} mm_job;

static st_matmul_fn matmul_for(const st_kernels *k, uint32_t type) {
    switch (type) {
    case ST_DTYPE_F32:
        return k->matmul_f32;
    case ST_DTYPE_F16:
        return k->matmul_f16;
    case ST_DTYPE_BF16:
        return k->matmul_bf16;
    case ST_DTYPE_Q8_0:
        return k->matmul_q8_0;
    case ST_DTYPE_Q4_0:
        return k->matmul_q4_0;
    case ST_DTYPE_Q2_K:
        return k->matmul_q2_k;
    case ST_DTYPE_Q3_K:
        return k->matmul_q3_k;
    case ST_DTYPE_Q4_K:
        return k->matmul_q4_k;
    case ST_DTYPE_Q5_K:
        return k->matmul_q5_k;
    default:
        return k->matmul_q6_k;
    }
}

/* The input a weight type multiplies: float, Q8 blocks of 32 (Q8_0, Q4_0) or Q8_K super-blocks
 * (the K-quants). */
enum { ACT_F32, ACT_Q8, ACT_Q8K };
static int act_kind(uint32_t type) {
    return type == ST_DTYPE_Q8_0 || type == ST_DTYPE_Q4_0 ? ACT_Q8
           : st_kquant_block_bytes(type)                  ? ACT_Q8K
                                                          : ACT_F32;
}

/* Threads take chunks of rows of the matrices in turn from a shared counter (memory bandwidth
 * is shared unevenly, so a static split leaves one thread waiting at the barrier). Which thread
 * computes a row changes nothing in its value. Outputs are row-major (M, n_out). */
static void mm_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    mm_job *j = ctx;
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        int i = 0;
        while (i < j->n_mat && c >= j->n_chunks[i])
            c -= j->n_chunks[i++];
        if (i == j->n_mat)
            return;
        const st_wt *w = j->w[i];
        const int64_t r0 = c * j->chunk;
        const int64_t r1 = r0 + j->chunk < w->n_out ? r0 + j->chunk : w->n_out;
        if (w->packed && j->k->matmul_f32_packed) {
            j->k->matmul_f32_packed(j->y[i], w->n_out, w->packed, j->x[i], j->ldx[i], w->n_in, j->M,
                                    r0, r1);
            continue;
        }
        if (w->q8p && j->k->matmul_q8_0_packed) {
            j->k->matmul_q8_0_packed(j->y[i], w->n_out, w->q8p, w->row_bytes, w->n_out, j->x[i],
                                     j->ldx[i], w->n_in, j->M, r0, r1);
            continue;
        }
        if (j->ggml && st_kquant_block_bytes(w->type))
            st_matmul_kq_ggml(w->type, j->y[i], w->n_out, w->data, w->row_bytes, j->x[i], j->ldx[i],
                              w->n_in, j->M, r0, r1);
        else
            matmul_for(j->k, w->type)(j->y[i], w->n_out, w->data, w->row_bytes, j->x[i], j->ldx[i],
                                      w->n_in, j->M, r0, r1);
    }
}

/* y_i = W_i x for up to three matrices with the same input (M tokens of n_in floats). */
static void matmuls(st_session *s, int n_mat, const st_wt *const *w, float *const *y,
                    const float *x, int64_t M) {
    mm_job j = {.k = s->kern, .ggml = s->p.match_ggml != 0, .n_mat = n_mat, .M = M};
    int64_t rows = 0;
    for (int i = 0; i < n_mat; i++) {
        j.w[i] = w[i];
        j.y[i] = y[i];
        rows += w[i]->n_out;
    }
    /* About 8 chunks per thread, a multiple of the kernels' 8-row tiles (16-row blocks of
     * packed weights; pairs of them for packed Q8_0, whose AMX kernel shares each token tile
     * between two blocks: 1024 x 768, 8 tokens, in 48-row chunks 31.0 us, 64-row 28.5). */
    const int nth = rows * w[0]->n_in * M < ST_MIN_PARALLEL_MACS ? 1 : st_pool_size(s->pool);
    int64_t tile = 8;
    for (int i = 0; i < n_mat; i++) {
        const int64_t t = w[i]->q8p ? 2 * ST_PACK_ROWS : w[i]->packed ? ST_PACK_ROWS : 8;
        tile = t > tile ? t : tile;
    }
    j.chunk = nth == 1 ? rows : (rows / (8 * nth) + tile - 1) & ~(tile - 1);
    if (j.chunk < tile)
        j.chunk = tile;
    for (int i = 0; i < n_mat; i++)
        j.n_chunks[i] = (w[i]->n_out + j.chunk - 1) / j.chunk;
    atomic_init(&j.next, 0);
    /* The input once in each form the matrices take (a group may mix weight types). */
    const int64_t K = w[0]->n_in;
    bool done[3] = {false, false, false};
    for (int i = 0; i < n_mat; i++) {
        const int a = act_kind(w[i]->type);
        if (a == ACT_Q8 && !done[a])
            for (int64_t m = 0; m < M; m++)
                s->kern->quantize_q8x(s->xq + m * (K / ST_QK), x + m * K, K);
        if (a == ACT_Q8K && !done[a])
            for (int64_t m = 0; m < M; m++)
                st_quantize_q8k(s->xk + m * (K / ST_QK_K), x + m * K, K);
        done[a] = true;
        j.x[i] = a == ACT_Q8 ? (const void *)s->xq : a == ACT_Q8K ? (const void *)s->xk : x;
        j.ldx[i] = a == ACT_Q8 ? K / ST_QK : a == ACT_Q8K ? K / ST_QK_K : K;
    }
    if (nth == 1)
        mm_task(&j, 0, 1);
    else
        st_pool_run(s->pool, mm_task, &j);
}

static void matmul1(st_session *s, const st_wt *w, float *y, const float *x, int64_t M) {
    matmuls(s, 1, &w, &y, x, M);
}

/* EAGLE-3 features: copies the residual stream of the batch entering layer l into the capture
 * rows of every captured layer equal to l (st_session_set_capture). */
static void capture(st_session *s, int32_t l, int64_t T) {
    const int64_t E = s->m->hp.n_embd, W = (int64_t)s->n_cap * E;
    for (int32_t c = 0; c < s->n_cap; c++)
        if (s->cap_layer[c] == l)
            for (int64_t i = 0; i < T; i++)
                memcpy(s->cap + i * W + c * E, s->x + i * E, (size_t)E * sizeof(float));
}

/* EAGLE-3 (Li et al., EAGLE-3, 2025; SafeAILab/EAGLE traineagle3/cnets.py): the head's state g,
 * fc over the target's fused layers or its own previous output, into s->x (the residual). */
static void eagle3_state(st_session *s, const st_fwd *f) {
    const int64_t E = s->m->hp.n_embd, T = f->n;
    if (f->own_states)
        memcpy(s->x, f->features, (size_t)(T * E) * sizeof(float));
    else
        matmul1(s, &s->m->fc, s->x, f->features, T);
}

/* EAGLE-3's layer input: [input_layernorm(embedding); hidden_norm(g)] (2 * n_embd) per token in
 * s->cat, the order of the published code. */
static void eagle3_layer_input(st_session *s, const st_fwd *f) {
    const st_model *m = s->m;
    const int64_t E = m->hp.n_embd;
    for (int64_t i = 0; i < f->n; i++) {
        float *c = s->cat + i * 2 * E;
        embed_row(m, f->tokens[i], c);
        rmsnorm(s, c, c, m->layers[0].attn_norm, E, m->hp.rms_eps);
        rmsnorm(s, c + E, s->x + i * E, m->hidden_norm, E, m->hp.rms_eps);
    }
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
    const st_kernels *k = s->kern;
    const int64_t E = hp->n_embd, hd = hp->head_dim, Q = (int64_t)hp->n_head * hd,
                  KV = (int64_t)hp->n_head_kv * hd, F = hp->n_ff, T = f->n;
    const int32_t nrot2 = hp->n_rot / 2;
    if (m->eagle3) {
        eagle3_state(s, f);
    } else if (m->fc.data) {
        /* an EAGLE head: x = fc([embedding; feature]) + bias (the order of the published code) */
        for (int64_t i = 0; i < T; i++) {
            embed_row(m, f->tokens[i], s->cat + i * 2 * E);
            memcpy(s->cat + i * 2 * E + E, f->features + i * E, (size_t)E * sizeof(float));
        }
        matmul1(s, &m->fc, s->x, s->cat, T);
        if (m->fc_bias)
            for (int64_t i = 0; i < T; i++)
                for (int64_t j = 0; j < E; j++)
                    s->x[i * E + j] += m->fc_bias[j];
    } else {
        for (int64_t i = 0; i < T; i++)
            embed_row(m, f->tokens[i], s->x + i * E);
    }
    /* RoPE angles of the batch's positions as ggml computes them (its rope cache): theta =
     * pos in float, multiplied by base^(-2/n_rot) (float powf) once per pair, divided by the
     * pair's Llama 3 factor; cosf and sinf. */
    const float theta_scale = powf(hp->rope_base, -2.0f / (float)hp->n_rot);
    for (int64_t i = 0; i < T; i++) {
        float theta = (float)f->pos[i];
        for (int32_t j = 0; j < nrot2; j++) {
            const float t = m->rope_factors ? theta / m->rope_factors[j] : theta;
            s->rope_cos[i * nrot2 + j] = cosf(t);
            s->rope_sin[i * nrot2 + j] = sinf(t);
            theta *= theta_scale;
        }
    }
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const st_layer *L = &m->layers[l];
        capture(s, l, T);
        if (m->eagle3)
            eagle3_layer_input(s, f);
        else
            for (int64_t i = 0; i < T; i++)
                norm_or_copy(s, s->xb + i * E, s->x + i * E, L->attn_norm, E, hp->rms_eps);
        const st_wt *wqkv[3] = {&L->wq, &L->wk, &L->wv};
        float *yqkv[3] = {s->q, s->kt, s->vt};
        matmuls(s, 3, wqkv, yqkv, m->eagle3 ? s->cat : s->xb, T);
        const float *bqkv[3] = {L->bq, L->bk, L->bv};
        const int64_t nqkv[3] = {Q, KV, KV};
        for (int b = 0; b < 3; b++)
            if (bqkv[b])
                for (int64_t i = 0; i < T; i++)
                    for (int64_t j = 0; j < nqkv[b]; j++)
                        yqkv[b][i * nqkv[b] + j] += bqkv[b][j];
        for (int64_t i = 0; i < T; i++) {
            const float *cs = s->rope_cos + i * nrot2;
            const float *sn = s->rope_sin + i * nrot2;
            rope(s->q + i * Q, hp->n_head, (int32_t)hd, hp->n_rot, cs, sn, s->p.match_ggml);
            rope(s->kt + i * KV, hp->n_head_kv, (int32_t)hd, hp->n_rot, cs, sn, s->p.match_ggml);
            kv_store(st_kv_k(s, f->seq[i], l) + (size_t)f->kv_row[i] * KV * s->k_elem, s->k_elem,
                     s->kt + i * KV, KV);
            kv_store(st_kv_v(s, f->seq[i], l) + (size_t)f->kv_row[i] * KV * s->v_elem, s->v_elem,
                     s->vt + i * KV, KV);
            if (s->p.type_k == ST_DTYPE_F16) /* the scores multiply f16 by f16 (ggml) */
                for (int64_t e = i * Q; e < (i + 1) * Q; e++)
                    s->q[e] = st_fp16_to_f32(st_f32_to_fp16(s->q[e]));
        }
        st_attn_layer(s, f, l);
        matmul1(s, &L->wo, s->tmp, s->att, T);
        for (int64_t i = 0; i < T * E; i++)
            s->x[i] += s->tmp[i];
        for (int64_t i = 0; i < T; i++)
            rmsnorm(s, s->xb + i * E, s->x + i * E, L->ffn_norm, E, hp->rms_eps);
        const st_wt *wgu[2] = {&L->w_gate, &L->w_up};
        float *ygu[2] = {s->hb, s->hb2};
        matmuls(s, 2, wgu, ygu, s->xb, T);
        if (s->p.match_ggml) /* ggml: silu(g) = g / (1 + exp(-g)) with its exp, then * u */
            for (int64_t e = 0; e < T * F; e++)
                s->hb[e] = (s->hb[e] / (1.0f + st_expf_ggml(-s->hb[e]))) * s->hb2[e];
        else
            k->silu_mul(s->hb, s->hb2, T * F);
        matmul1(s, &L->w_down, s->tmp, s->hb, T);
        for (int64_t i = 0; i < T * E; i++)
            s->x[i] += s->tmp[i];
    }
    capture(s, hp->n_layer, T);
    int64_t n_out = T - f->logits_from;
    s->n_deferred = 0;
    s->n_states = 0;
    if ((f->logits && n_out > 0) || f->defer_logits || f->hidden) {
        for (int64_t i = 0; i < T; i++)
            norm_or_copy(s, s->xb + i * E, s->x + i * E, m->out_norm, E, hp->rms_eps);
        s->n_states = (int32_t)T;
        if (f->hidden)
            memcpy(f->hidden, s->xb, (size_t)(T * E) * sizeof(float));
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
