/*
 * kernels_ref.c: the scalar reference kernels. They define the canonical reduction order
 * (kernels.h) with explicit fmaf calls, so the AVX2 kernels can reproduce them bit for bit and
 * results never depend on the number of tokens in a batch or on threads.
 */
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

static float reduce8(const float a[8]) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static float dot_ref(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] = fmaf(a[i + l], b[i + l], acc[l]);
    if (i < n)
        for (int l = 0; l < 8; l++)
            acc[l] = i + l < n ? fmaf(a[i + l], b[i + l], acc[l]) : fmaf(0.0f, 0.0f, acc[l]);
    return reduce8(acc);
}

float st_expf_ref(float x) {
    if (!(x > -87.0f)) /* also NaN -> 0 would hide NaN: keep it */
        return isnan(x) ? x : 0.0f;
    if (x > 88.0f)
        x = 88.0f;
    float n = nearbyintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693145751953125f, x);
    r = fmaf(n, -1.428606765330187045e-06f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r);
    p = p + 1.0f;
    union {
        uint32_t u;
        float f;
    } s = {(uint32_t)((int32_t)n + 127) << 23};
    return p * s.f;
}

float st_expf_ggml(float x) {
    const float shift = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, shift);
    const float n = z - shift; /* x / ln 2 rounded to an integer */
    if (isnan(x))
        return x;
    if (fabsf(n) > 192.0f)
        return n > 0.0f ? INFINITY : 0.0f;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x)); /* x - n ln 2 */
    const float u = b * b;
    const float j = fmaf(
        fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
        u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    return ldexpf(j, (int)n);
}

static float exp_sum_ref(float *x, int64_t n, float mx) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i < n; i++) {
        x[i] = st_expf_ref(x[i] - mx);
        acc[i & 7] += x[i];
    }
    return reduce8(acc);
}

static void softmax_ref(float *xs, int64_t n, int64_t rows, int64_t ld, float *sums) {
    for (int64_t r = 0; r < rows; r++) {
        float *x = xs + r * ld, mx = -INFINITY;
        for (int64_t i = 0; i < n; i++)
            mx = x[i] > mx ? x[i] : mx;
        const float sum = mx == -INFINITY ? 0.0f : exp_sum_ref(x, n, mx);
        if (sum > 0.0f)
            for (int64_t i = 0; i < n; i++)
                x[i] = x[i] / sum;
        sums[r] = sum;
    }
}

static void attn_scores_ref(float *const *sc, const float *const *q, int64_t nq, const float *k,
                            int64_t ldk, int64_t n, int64_t hd, float div) {
    for (int64_t j = 0; j < nq; j++)
        for (int64_t r = 0; r < n; r++)
            sc[j][r] = dot_ref(q[j], k + r * ldk, hd) / div;
}

static void attn_wsum_ref(float *const *out, const float *const *p, int64_t nq, const float *v,
                          int64_t ldv, int64_t n, int64_t hd) {
    for (int64_t j = 0; j < nq; j++)
        for (int64_t r = 0; r < n; r++)
            for (int64_t d = 0; d < hd; d++)
                out[j][d] = fmaf(p[j][r], v[r * ldv + d], out[j][d]);
}

static void f16_to_f32_ref(float *y, const uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = st_fp16_to_f32(x[i]);
}

static void silu_mul_ref(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        g[i] = (g[i] / (1.0f + st_expf_ref(-g[i]))) * u[i];
}

static void matmul_f32_ref(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                           int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    const float *xf = x;
    for (int64_t r = r0; r < r1; r++) {
        const float *wr = (const float *)((const char *)w + (size_t)r * row_bytes);
        for (int64_t m = 0; m < M; m++)
            y[m * ldy + r] = dot_ref(wr, xf + m * ldx, K);
    }
}

/* Packed rows (kernels.h): the canonical dot product reading row r's elements where the
 * packing put them. */
static void matmul_f32_packed_ref(float *y, int64_t ldy, const float *wp, const float *x,
                                  int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    const int64_t K8 = (K + 7) & ~7;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t j = r % ST_PACK_ROWS;
        const float *wr =
            wp + (size_t)(r / ST_PACK_ROWS * K8) * ST_PACK_ROWS + (j % 4) * 16 + (j / 4) * 4;
        for (int64_t m = 0; m < M; m++) {
            const float *xm = x + m * ldx;
            float acc[8] = {0};
            for (int64_t i = 0; i < K; i += 8)
                for (int l = 0; l < 8; l++)
                    acc[l] = i + l < K ? fmaf(wr[(size_t)(i + l) / 4 * 64 + (size_t)(i + l) % 4],
                                              xm[i + l], acc[l])
                                       : fmaf(0.0f, 0.0f, acc[l]);
            y[m * ldy + r] = reduce8(acc);
        }
    }
}

/* 16-bit float weights: widen a row once into a stack buffer chunk by chunk, keeping the lane
 * order of the canonical dot product. */
static float dot_h16(const uint8_t *wr, const float *x, int64_t K, int bf16) {
    float acc[8] = {0};
    for (int64_t i = 0; i < K; i += 8) {
        for (int l = 0; l < 8; l++) {
            float wv = 0.0f, xv = 0.0f;
            if (i + l < K) {
                uint16_t h;
                memcpy(&h, wr + 2 * (i + l), 2);
                wv = bf16 ? st_bf16_to_f32(h) : st_fp16_to_f32(h);
                xv = x[i + l];
            }
            acc[l] = fmaf(wv, xv, acc[l]);
        }
    }
    return reduce8(acc);
}

static void matmul_h16_ref(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                           int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1, int bf16) {
    const float *xf = x;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t m = 0; m < M; m++)
            y[m * ldy + r] =
                dot_h16((const uint8_t *)w + (size_t)r * row_bytes, xf + m * ldx, K, bf16);
}

static void matmul_f16_ref(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                           int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    matmul_h16_ref(y, ldy, w, row_bytes, x, ldx, K, M, r0, r1, 0);
}

static void matmul_bf16_ref(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                            int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    matmul_h16_ref(y, ldy, w, row_bytes, x, ldx, K, M, r0, r1, 1);
}

/* One block of the canonical quantized dot product (kernels.h): lane l gets the exact integer
 * sum over elements 4l .. 4l+3, times the block's combined scale. */
static void qdot_block(float acc[8], const int8_t w[ST_QK], uint16_t wd, const st_block_q8x *xb) {
    const float d = st_fp16_to_f32(wd) * xb->d;
    for (int l = 0; l < 8; l++) {
        int32_t s = 0;
        for (int j = 4 * l; j < 4 * l + 4; j++)
            s += (int32_t)w[j] * (int32_t)xb->q[j];
        acc[l] = fmaf((float)s, d, acc[l]);
    }
}

/* The per-lane canonical Q4_0 dot product (kernels.h): blocks unpacked to int8 first. */
static void matmul_q4_0_ref(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                            int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    const st_block_q8x *xq = x;
    int64_t nb = K / ST_QK;
    for (int64_t r = r0; r < r1; r++) {
        const st_block_q4_0 *wr = (const st_block_q4_0 *)((const char *)w + (size_t)r * row_bytes);
        for (int64_t m = 0; m < M; m++) {
            float acc[8] = {0};
            for (int64_t b = 0; b < nb; b++) {
                int8_t unpacked[ST_QK];
                st_q4_0_unpack(wr + b, unpacked);
                qdot_block(acc, unpacked, wr[b].d, xq + m * ldx + b);
            }
            y[m * ldy + r] = reduce8(acc);
        }
    }
}

/* The per-block canonical Q8_0 dot product (kernels.h). */
static void matmul_q8_0_ref(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                            int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    const st_block_q8x *xq = x;
    const int64_t nb = K / ST_QK;
    for (int64_t r = r0; r < r1; r++) {
        const st_block_q8_0 *wr = (const st_block_q8_0 *)((const char *)w + (size_t)r * row_bytes);
        for (int64_t m = 0; m < M; m++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const st_block_q8x *xb = xq + m * ldx + b;
                int32_t s = 0;
                for (int j = 0; j < ST_QK; j++)
                    s += (int32_t)wr[b].q[j] * (int32_t)xb->q[j];
                acc = fmaf((float)s, st_fp16_to_f32(wr[b].d) * xb->d, acc);
            }
            y[m * ldy + r] = acc;
        }
    }
}

/* The same on weights packed by st_pack_q8_0 (rows past the last full group are row-major). */
static void matmul_q8_0_packed_ref(float *y, int64_t ldy, const void *wp, size_t row_bytes,
                                   int64_t rows, const void *x, int64_t ldx, int64_t K, int64_t M,
                                   int64_t r0, int64_t r1) {
    const st_block_q8x *xq = x;
    const int64_t nb = K / ST_QK, rfull = rows / ST_PACK_ROWS * ST_PACK_ROWS;
    int64_t r = r0;
    for (; r < r1 && r < rfull; r++) {
        const uint8_t *gp =
            (const uint8_t *)wp + (size_t)(r / ST_PACK_ROWS) * ST_PACK_ROWS * row_bytes;
        const int n = (int)(r % ST_PACK_ROWS);
        for (int64_t m = 0; m < M; m++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *p = gp + (size_t)b * ST_Q8P_GROUP_BYTES;
                const st_block_q8x *xb = xq + m * ldx + b;
                uint16_t d;
                memcpy(&d, p + 2 * n, 2);
                int32_t s = 0;
                for (int k = 0; k < ST_QK / 4; k++)
                    for (int i = 0; i < 4; i++)
                        s += (int32_t)(int8_t)p[2 * ST_PACK_ROWS + 64 * k + 4 * n + i] *
                             (int32_t)xb->q[4 * k + i];
                acc = fmaf((float)s, st_fp16_to_f32(d) * xb->d, acc);
            }
            y[m * ldy + r] = acc;
        }
    }
    if (r < r1)
        matmul_q8_0_ref(y, ldy, wp, row_bytes, x, ldx, K, M, r, r1);
}

/* The per-lane Q4_0 product on weights packed by st_pack_q4_0: each block read back into its
 * row-major form first (rows past the last full group are row-major). */
static void matmul_q4_0_packed_ref(float *y, int64_t ldy, const void *wp, size_t row_bytes,
                                   int64_t rows, const void *x, int64_t ldx, int64_t K, int64_t M,
                                   int64_t r0, int64_t r1) {
    const st_block_q8x *xq = x;
    const int64_t nb = K / ST_QK, rfull = rows / ST_PACK_ROWS * ST_PACK_ROWS;
    int64_t r = r0;
    for (; r < r1 && r < rfull; r++) {
        const uint8_t *gp =
            (const uint8_t *)wp + (size_t)(r / ST_PACK_ROWS) * ST_PACK_ROWS * row_bytes;
        const int n = (int)(r % ST_PACK_ROWS);
        for (int64_t m = 0; m < M; m++) {
            float acc[8] = {0};
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *p = gp + (size_t)b * ST_Q4P_GROUP_BYTES;
                st_block_q4_0 blk;
                int8_t unpacked[ST_QK];
                memcpy(&blk.d, p + 2 * n, 2);
                for (int k = 0; k < ST_QK / 8; k++)
                    memcpy(blk.qs + 4 * k, p + 2 * ST_PACK_ROWS + 64 * k + 4 * n, 4);
                st_q4_0_unpack(&blk, unpacked);
                qdot_block(acc, unpacked, blk.d, xq + m * ldx + b);
            }
            y[m * ldy + r] = reduce8(acc);
        }
    }
    if (r < r1)
        matmul_q4_0_ref(y, ldy, wp, row_bytes, x, ldx, K, M, r, r1);
}

static void quantize_q8x_ref(st_block_q8x *y, const float *x, int64_t K) {
    for (int64_t b = 0; b < K / ST_QK; b++) {
        const float *xb = x + b * ST_QK;
        float amax = 0.0f;
        for (int j = 0; j < ST_QK; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = d;
        for (int j = 0; j < ST_QK; j++)
            y[b].q[j] = (int8_t)lrintf(xb[j] * id);
    }
}

static const st_kernels st_kernels_ref_table = {
    .name = "ref",
    .matmul_f32 = matmul_f32_ref,
    .matmul_f16 = matmul_f16_ref,
    .matmul_bf16 = matmul_bf16_ref,
    .matmul_q8_0 = matmul_q8_0_ref,
    .matmul_q4_0 = matmul_q4_0_ref,
    .matmul_q2_k = st_matmul_q2_k_ref,
    .matmul_q3_k = st_matmul_q3_k_ref,
    .matmul_q4_k = st_matmul_q4_k_ref,
    .matmul_q5_k = st_matmul_q5_k_ref,
    .matmul_q6_k = st_matmul_q6_k_ref,
    .matmul_f32_packed = matmul_f32_packed_ref,
    .matmul_q8_0_packed = matmul_q8_0_packed_ref,
    .matmul_q4_0_packed = matmul_q4_0_packed_ref,
    .matmul_q4_k_packed = st_matmul_q4_k_packed_ref,
    .matmul_q5_k_packed = st_matmul_q5_k_packed_ref,
    .matmul_q6_k_packed = st_matmul_q6_k_packed_ref,
    .dot = dot_ref,
    .attn_scores = attn_scores_ref,
    .attn_wsum = attn_wsum_ref,
    .exp_sum = exp_sum_ref,
    .softmax = softmax_ref,
    .silu_mul = silu_mul_ref,
    .quantize_q8x = quantize_q8x_ref,
    .quantize_q8k = st_quantize_q8k,
    .f16_to_f32 = f16_to_f32_ref,
};

const st_kernels *st_kernels_ref(void) { return &st_kernels_ref_table; }
