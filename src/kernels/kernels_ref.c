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

static float exp_sum_ref(float *x, int64_t n, float mx) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i < n; i++) {
        x[i] = st_expf_ref(x[i] - mx);
        acc[i & 7] += x[i];
    }
    return reduce8(acc);
}

static void axpy_ref(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
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

static void matmul_f16_ref(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                           int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    const float *xf = x;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t m = 0; m < M; m++)
            y[m * ldy + r] =
                dot_h16((const uint8_t *)w + (size_t)r * row_bytes, xf + m * ldx, K, 0);
}

static void matmul_bf16_ref(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                            int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    const float *xf = x;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t m = 0; m < M; m++)
            y[m * ldy + r] =
                dot_h16((const uint8_t *)w + (size_t)r * row_bytes, xf + m * ldx, K, 1);
}

static void matmul_q8_0_ref(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                            int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    const st_block_q8x *xq = x;
    int64_t nb = K / ST_QK;
    for (int64_t r = r0; r < r1; r++) {
        const st_block_q8_0 *wb = (const st_block_q8_0 *)((const char *)w + (size_t)r * row_bytes);
        for (int64_t m = 0; m < M; m++) {
            const st_block_q8x *xb = xq + m * ldx;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t s = 0;
                for (int j = 0; j < ST_QK; j++)
                    s += (int32_t)wb[b].q[j] * (int32_t)xb[b].q[j];
                acc = fmaf((float)s, st_fp16_to_f32(wb[b].d) * xb[b].d, acc);
            }
            y[m * ldy + r] = acc;
        }
    }
}

static void matmul_q4_0_ref(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                            int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    const st_block_q8x *xq = x;
    int64_t nb = K / ST_QK;
    for (int64_t r = r0; r < r1; r++) {
        const st_block_q4_0 *wb = (const st_block_q4_0 *)((const char *)w + (size_t)r * row_bytes);
        for (int64_t m = 0; m < M; m++) {
            const st_block_q8x *xb = xq + m * ldx;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t s = 0;
                for (int j = 0; j < ST_QK / 2; j++) {
                    s += ((int32_t)(wb[b].qs[j] & 0xf) - 8) * (int32_t)xb[b].q[j];
                    s += ((int32_t)(wb[b].qs[j] >> 4) - 8) * (int32_t)xb[b].q[j + 16];
                }
                acc = fmaf((float)s, st_fp16_to_f32(wb[b].d) * xb[b].d, acc);
            }
            y[m * ldy + r] = acc;
        }
    }
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
    .dot = dot_ref,
    .axpy = axpy_ref,
    .exp_sum = exp_sum_ref,
    .quantize_q8x = quantize_q8x_ref,
};

const st_kernels *st_kernels_ref(void) { return &st_kernels_ref_table; }
