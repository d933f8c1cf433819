/*
 * backend_cpu.c: the CPU backend of the seam (backend.h): the kernel table chosen at start
 * (kernels.h), matrices split over the session's thread pool by rows, RMSNorm, RoPE in GGUF's
 * adjacent-pair layout, SwiGLU and the KV rows, each output element reduced in one fixed order
 * whatever the batch size, tree shape or thread count (DESIGN.md invariant 1).
 */
#include "model/backend.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

static void *cpu_buf_alloc(size_t bytes, bool populate) { return st_lazy_alloc(bytes, populate); }

static void cpu_buf_free(void *buf, size_t bytes) { st_lazy_free(buf, bytes); }

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

static void cpu_kv_store(st_session *s, const st_fwd *f, int32_t layer) {
    const int64_t KV = (int64_t)s->m->hp.n_head_kv * s->m->hp.head_dim;
    for (int64_t i = 0; i < f->n; i++) {
        kv_store(st_kv_k(s, f->seq[i], layer) + (size_t)f->kv_row[i] * KV * s->k_elem, s->k_elem,
                 s->kt + i * KV, KV);
        kv_store(st_kv_v(s, f->seq[i], layer) + (size_t)f->kv_row[i] * KV * s->v_elem, s->v_elem,
                 s->vt + i * KV, KV);
    }
}

/* Every layer's K and V rows of a sequence are planes n_ctx rows apart. */
static st_status cpu_kv_move(st_session *s, int32_t seq, int64_t pos, int64_t n,
                             const int64_t *accept_nodes, int64_t n_accept) {
    const st_model_hparams *hp = &s->m->hp;
    const size_t KV = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    st_status st = ST_OK;
    for (int c = 0; c < 2 && !st; c++) { /* K, then V */
        const size_t elem = c ? s->v_elem : s->k_elem, row = KV * elem;
        const size_t stride = (size_t)s->kv_layer_stride * elem;
        const size_t bytes = (size_t)(hp->n_layer - 1) * stride + (size_t)(pos + n) * row;
        st = st_tree_commit_rows(c ? st_kv_v(s, seq, 0) : st_kv_k(s, seq, 0), bytes, row,
                                 hp->n_layer, stride, pos, n, accept_nodes, n_accept);
    }
    return st;
}

static void cpu_kv_copy(st_session *s, int32_t seq, int32_t pos, int32_t n, void *buf, bool save) {
    const st_model_hparams *hp = &s->m->hp;
    const size_t KV = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    uint8_t *p = buf;
    for (int32_t l = 0; l < hp->n_layer; l++)
        for (int c = 0; c < 2; c++) { /* K, then V */
            const size_t row = KV * (c ? s->v_elem : s->k_elem), bytes = (size_t)n * row;
            uint8_t *kv = (c ? st_kv_v(s, seq, l) : st_kv_k(s, seq, l)) + (size_t)pos * row;
            if (save)
                memcpy(p, kv, bytes);
            else
                memcpy(kv, p, bytes);
            p += bytes;
        }
}

static void cpu_get_rows(st_session *s, const st_wt *w, const int32_t *ids, int64_t n, float *y,
                         int64_t ldy) {
    for (int64_t i = 0; i < n; i++)
        st_dequant_row(w->type, (const char *)w->data + (size_t)ids[i] * w->row_bytes, y + i * ldy,
                       s->m->hp.n_embd);
}

static void cpu_copy_rows(st_session *s, float *y, int64_t ldy, const float *x, int64_t ldx,
                          int64_t rows, int64_t n) {
    (void)s;
    if (ldy == n && ldx == n) {
        memcpy(y, x, (size_t)(rows * n) * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < rows; i++)
        memcpy(y + i * ldy, x + i * ldx, (size_t)n * sizeof(float));
}

static void cpu_add_rows(st_session *s, float *y, const float *x, int64_t ldx, int64_t rows,
                         int64_t n) {
    (void)s;
    if (ldx == n) { /* the residual stream: one run */
        for (int64_t e = 0; e < rows * n; e++)
            y[e] += x[e];
        return;
    }
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < n; j++)
            y[i * n + j] += x[i * ldx + j];
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
static void cpu_norm(st_session *s, float *y, int64_t ldy, const float *x, int64_t ldx,
                     const float *w, int64_t rows, int64_t n, float eps) {
    for (int64_t i = 0; i < rows; i++)
        if (w)
            rmsnorm(s, y + i * ldy, x + i * ldx, w, n, eps);
        else
            memcpy(y + i * ldy, x + i * ldx, (size_t)n * sizeof(float));
}

/* RoPE angles of the batch's positions as ggml computes them (its rope cache): theta = pos in
 * float, multiplied by base^(-2/n_rot) (float powf) once per pair, divided by the pair's Llama 3
 * factor; cosf and sinf. */
static void cpu_rope_angles(st_session *s, const int32_t *pos, int64_t n) {
    const st_model *m = s->m;
    const int32_t nrot2 = m->hp.n_rot / 2;
    const float theta_scale = powf(m->hp.rope_base, -2.0f / (float)m->hp.n_rot);
    for (int64_t i = 0; i < n; i++) {
        float theta = (float)pos[i];
        for (int32_t j = 0; j < nrot2; j++) {
            const float t = m->rope_factors ? theta / m->rope_factors[j] : theta;
            s->rope_cos[i * nrot2 + j] = cosf(t);
            s->rope_sin[i * nrot2 + j] = sinf(t);
            theta *= theta_scale;
        }
    }
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

static void cpu_rope(st_session *s, float *v, int32_t n_heads, int64_t n) {
    const st_model_hparams *hp = &s->m->hp;
    const int32_t nrot2 = hp->n_rot / 2;
    const int64_t ld = (int64_t)n_heads * hp->head_dim;
    for (int64_t i = 0; i < n; i++)
        rope(v + i * ld, n_heads, (int32_t)hp->head_dim, hp->n_rot, s->rope_cos + i * nrot2,
             s->rope_sin + i * nrot2, s->p.match_ggml);
}

static void cpu_swiglu(st_session *s, float *g, const float *u, int64_t n) {
    if (s->p.match_ggml) /* ggml: silu(g) = g / (1 + exp(-g)) with its exp, then * u */
        for (int64_t e = 0; e < n; e++)
            g[e] = (g[e] / (1.0f + st_expf_ggml(-g[e]))) * u[e];
    else
        s->kern->silu_mul(g, u, n);
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
        if (w->q8p) { /* Q8_0 or Q4_0, packed by the table in use at load */
            (w->type == ST_DTYPE_Q4_0 ? j->k->matmul_q4_0_packed : j->k->matmul_q8_0_packed)(
                j->y[i], w->n_out, w->q8p, w->row_bytes, w->n_out, j->x[i], j->ldx[i], w->n_in,
                j->M, r0, r1);
            continue;
        }
        if (w->kqp) {
            if (j->ggml)
                st_matmul_kq_packed_rows(w->type, 1, j->y[i], w->n_out, w->kqp, w->row_bytes,
                                         w->n_out, j->x[i], j->ldx[i], w->n_in, j->M, r0, r1);
            else
                (w->type == ST_DTYPE_Q4_K ? j->k->matmul_q4_k_packed
                 : w->type == ST_DTYPE_Q5_K
                     ? j->k->matmul_q5_k_packed
                     : j->k->matmul_q6_k_packed)(j->y[i], w->n_out, w->kqp, w->row_bytes, w->n_out,
                                                 j->x[i], j->ldx[i], w->n_in, j->M, r0, r1);
            continue;
        }
        if (j->ggml && st_kquant_block_bytes(w->type))
            st_matmul_kq_ggml(w->type, j->y[i], w->n_out, w->data, w->row_bytes, j->x[i], j->ldx[i],
                              w->n_in, j->M, r0, r1);
        else
            st_kernels_matmul(j->k, w->type)(j->y[i], w->n_out, w->data, w->row_bytes, j->x[i],
                                             j->ldx[i], w->n_in, j->M, r0, r1);
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
     * packed weights, packed K-quants included: the AVX-512 kernel takes two 8-row groups at a
     * time and leaves an odd one to the AVX2 kernel; pairs of them for packed Q8_0, whose AMX
     * kernel shares each token tile between two blocks: 1024 x 768, 8 tokens, in 48-row chunks 31.0
     * us, 64-row 28.5). */
    const int nth = rows * w[0]->n_in * M < ST_MIN_PARALLEL_MACS ? 1 : st_pool_size(s->pool);
    int64_t tile = 8;
    for (int i = 0; i < n_mat; i++) {
        const int64_t t = w[i]->q8p                   ? 2 * ST_PACK_ROWS
                          : w[i]->packed || w[i]->kqp ? ST_PACK_ROWS
                                                      : 8;
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
                s->kern->quantize_q8k(s->xk + m * (K / ST_QK_K), x + m * K, K);
        done[a] = true;
        j.x[i] = a == ACT_Q8 ? (const void *)s->xq : a == ACT_Q8K ? (const void *)s->xk : x;
        j.ldx[i] = a == ACT_Q8 ? K / ST_QK : a == ACT_Q8K ? K / ST_QK_K : K;
    }
    if (nth == 1)
        mm_task(&j, 0, 1);
    else
        st_pool_run(s->pool, mm_task, &j);
}

static const st_backend cpu = {
    .name = "cpu",
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .get_rows = cpu_get_rows,
    .copy_rows = cpu_copy_rows,
    .add_rows = cpu_add_rows,
    .kv_store = cpu_kv_store,
    .kv_move = cpu_kv_move,
    .kv_copy = cpu_kv_copy,
    .matmul = matmuls,
    .norm = cpu_norm,
    .rope_angles = cpu_rope_angles,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .attn_reads = st_attn_backend_reads,
    .attn = st_attn_layer,
};

const st_backend *st_backend_cpu(void) { return &cpu; }
