/*
 * kquant_ref.c: the K-quant formats in scalar C: row dequantization (the float arithmetic of
 * gguf-py's dequantize, so rows match it bit for bit), the activation quantizer every table
 * shares, the unpacking of a super-block into quants and per-16 scales, and the `_ref` matmuls
 * that define the canonical dot product of kquant.h.
 */
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

static float h2f(const uint16_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return st_fp16_to_f32(h);
}

/* Q4_K / Q5_K: the six-bit scale and min of sub-block j (of 32 elements). */
static void scale_min_k4(const uint8_t s[12], int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q3_K: the signed scale of sub-block j (of 16 elements). */
static int scale_q3_k(const uint8_t s[12], int j) {
    const int lo = j < 8 ? s[j] & 0xf : s[j - 8] >> 4;
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | hi << 4) - 32;
}

/* The quant of element e, unsigned (Q3_K: q + 4, Q6_K: q + 32). */
static int quant_q2_k(const st_block_q2_k *b, int e) {
    return (b->qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
}
static int quant_q3_k(const st_block_q3_k *b, int e) {
    const int lo = (b->qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
    return lo + 4 * ((b->hmask[e % 32] >> (e / 32)) & 1);
}
static int quant_q4_k(const uint8_t *qs, int e) {
    return (qs[32 * (e / 64) + e % 32] >> (4 * (e % 64 / 32))) & 0xf;
}
static int quant_q5_k(const st_block_q5_k *b, int e) {
    return quant_q4_k(b->qs, e) | ((b->qh[e % 32] >> (e / 32)) & 1) << 4;
}
static int quant_q6_k(const st_block_q6_k *b, int e) {
    const int h = e / 128, s = e % 128 / 32, l = e % 32;
    const int lo = (b->ql[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 0xf;
    return lo | ((b->qh[32 * h + l] >> (2 * s)) & 3) << 4;
}

size_t st_kquant_block_bytes(uint32_t type) {
    switch (type) {
    case ST_DTYPE_Q2_K:
        return sizeof(st_block_q2_k);
    case ST_DTYPE_Q3_K:
        return sizeof(st_block_q3_k);
    case ST_DTYPE_Q4_K:
        return sizeof(st_block_q4_k);
    case ST_DTYPE_Q5_K:
        return sizeof(st_block_q5_k);
    case ST_DTYPE_Q6_K:
        return sizeof(st_block_q6_k);
    default:
        return 0;
    }
}

/* One block's 256 values, each as gguf-py computes it in float32: a sub-block factor
 * (scale times d, min times dmin) first, then factor * q - min. */
static void dequant_block(uint32_t type, const uint8_t *blk, float *y) {
    switch (type) {
    case ST_DTYPE_Q2_K: {
        const st_block_q2_k *b = (const void *)blk;
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        for (int e = 0; e < ST_QK_K; e++) {
            const int s = b->scales[e / 16];
            y[e] = (d * (float)(s & 0xf)) * (float)quant_q2_k(b, e) - dmin * (float)(s >> 4);
        }
        break;
    }
    case ST_DTYPE_Q3_K: {
        const st_block_q3_k *b = (const void *)blk;
        const float d = h2f(&b->d);
        for (int e = 0; e < ST_QK_K; e++)
            y[e] = (d * (float)scale_q3_k(b->scales, e / 16)) * (float)(quant_q3_k(b, e) - 4);
        break;
    }
    case ST_DTYPE_Q4_K:
    case ST_DTYPE_Q5_K: {
        const int q5 = type == ST_DTYPE_Q5_K;
        const st_block_q4_k *b4 = (const void *)blk;
        const st_block_q5_k *b5 = (const void *)blk;
        const float d = h2f(q5 ? &b5->d : &b4->d), dmin = h2f(q5 ? &b5->dmin : &b4->dmin);
        for (int e = 0; e < ST_QK_K; e++) {
            int sc, mn;
            scale_min_k4(q5 ? b5->scales : b4->scales, e / 32, &sc, &mn);
            const int q = q5 ? quant_q5_k(b5, e) : quant_q4_k(b4->qs, e);
            y[e] = (d * (float)sc) * (float)q - dmin * (float)mn;
        }
        break;
    }
    case ST_DTYPE_Q6_K: {
        const st_block_q6_k *b = (const void *)blk;
        const float d = h2f(&b->d);
        for (int e = 0; e < ST_QK_K; e++)
            y[e] = (d * (float)b->scales[e / 16]) * (float)(quant_q6_k(b, e) - 32);
        break;
    }
    default:
        break;
    }
}

int st_dequant_row_kquant(uint32_t type, const void *row, float *out, int64_t n) {
    const size_t bb = st_kquant_block_bytes(type);
    if (!bb)
        return 0;
    for (int64_t i = 0; i < n / ST_QK_K; i++)
        dequant_block(type, (const uint8_t *)row + (size_t)i * bb, out + i * ST_QK_K);
    return 1;
}

void st_quantize_q8k(st_block_q8k *y, const float *x, int64_t K) {
    for (int64_t b = 0; b < K / ST_QK_K; b++) {
        const float *xb = x + b * ST_QK_K;
        float amax = 0.0f, mx = 0.0f;
        for (int j = 0; j < ST_QK_K; j++)
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                mx = xb[j];
            }
        memset(&y[b], 0, sizeof y[b]);
        if (amax == 0.0f || !isfinite(amax))
            continue;
        const float iscale = -127.0f / mx;
        for (int j = 0; j < ST_QK_K; j++) {
            const long v = lrintf(iscale * xb[j]);
            y[b].q[j] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
            y[b].bsums[j / 16] = (int16_t)(y[b].bsums[j / 16] + y[b].q[j]);
        }
        y[b].d = 1.0f / iscale;
    }
}

void st_kq_unpack(uint32_t type, const void *blk, st_kq_unpacked *u) {
    u->dmin = 0.0f;
    switch (type) {
    case ST_DTYPE_Q2_K: {
        const st_block_q2_k *b = blk;
        for (int e = 0; e < ST_QK_K; e++)
            u->q[e] = (uint8_t)quant_q2_k(b, e);
        for (int j = 0; j < 16; j++) {
            u->sc[j] = (int16_t)(b->scales[j] & 0xf);
            u->bz[j] = (int16_t)(b->scales[j] >> 4);
        }
        u->d = h2f(&b->d);
        u->dmin = h2f(&b->dmin);
        break;
    }
    case ST_DTYPE_Q3_K: {
        const st_block_q3_k *b = blk;
        for (int e = 0; e < ST_QK_K; e++)
            u->q[e] = (uint8_t)quant_q3_k(b, e);
        for (int j = 0; j < 16; j++) {
            u->sc[j] = (int16_t)scale_q3_k(b->scales, j);
            u->bz[j] = (int16_t)(4 * u->sc[j]);
        }
        u->d = h2f(&b->d);
        break;
    }
    case ST_DTYPE_Q4_K:
    case ST_DTYPE_Q5_K: {
        const int q5 = type == ST_DTYPE_Q5_K;
        const st_block_q4_k *b4 = blk;
        const st_block_q5_k *b5 = blk;
        for (int e = 0; e < ST_QK_K; e++)
            u->q[e] = (uint8_t)(q5 ? quant_q5_k(b5, e) : quant_q4_k(b4->qs, e));
        for (int j = 0; j < 16; j++) {
            int sc, mn;
            scale_min_k4(q5 ? b5->scales : b4->scales, j / 2, &sc, &mn);
            u->sc[j] = (int16_t)sc;
            u->bz[j] = (int16_t)mn;
        }
        u->d = h2f(q5 ? &b5->d : &b4->d);
        u->dmin = h2f(q5 ? &b5->dmin : &b4->dmin);
        break;
    }
    default: { /* Q6_K */
        const st_block_q6_k *b = blk;
        for (int e = 0; e < ST_QK_K; e++)
            u->q[e] = (uint8_t)quant_q6_k(b, e);
        for (int j = 0; j < 16; j++) {
            u->sc[j] = b->scales[j];
            u->bz[j] = (int16_t)(32 * b->scales[j]);
        }
        u->d = h2f(&b->d);
        break;
    }
    }
}

/* ggml's accumulators of one row and one activation row (kquant.h). */
typedef struct kq_ggml_acc {
    float acc[8], accm[4], summs;
} kq_ggml_acc;

/* Adds super-block u (unpacked) times activation block xb to a, in ggml's order. */
static void kq_ggml_step(uint32_t type, const st_kq_unpacked *u, const st_block_q8k *xb,
                         kq_ggml_acc *a) {
    const int off = type == ST_DTYPE_Q3_K ? 4 : type == ST_DTYPE_Q6_K ? 32 : 0;
    const float d = xb->d * u->d, dmin = -xb->d * u->dmin;
    int32_t lane[8] = {0};
    for (int e = 0; e < ST_QK_K; e++)
        lane[e % 32 / 4] += u->sc[e / 16] * ((int32_t)u->q[e] - off) * xb->q[e];
    if (type == ST_DTYPE_Q2_K) /* mins first, in the same accumulators */
        for (int k = 0; k < 8; k++)
            a->acc[k] = fmaf(
                dmin,
                (float)(u->bz[2 * k] * xb->bsums[2 * k] + u->bz[2 * k + 1] * xb->bsums[2 * k + 1]),
                a->acc[k]);
    if (type == ST_DTYPE_Q4_K)
        for (int i = 0; i < 4; i++) {
            int32_t m = 0;
            for (int j = 4 * i; j < 4 * i + 4; j++)
                m += u->bz[j] * xb->bsums[j];
            a->accm[i] = fmaf(dmin, (float)m, a->accm[i]);
        }
    if (type == ST_DTYPE_Q5_K) {
        int32_t m = 0;
        for (int j = 0; j < 16; j++)
            m += u->bz[j] * xb->bsums[j];
        a->summs = fmaf(dmin, (float)m, a->summs); /* summs += dmin * m, contracted */
    }
    for (int k = 0; k < 8; k++)
        a->acc[k] = fmaf(d, (float)lane[k], a->acc[k]);
}

static float kq_ggml_result(uint32_t type, const kq_ggml_acc *a) {
    const float *c = a->acc;
    float r = ((c[0] + c[4]) + (c[2] + c[6])) + ((c[1] + c[5]) + (c[3] + c[7]));
    if (type == ST_DTYPE_Q4_K)
        r = r + ((a->accm[0] + a->accm[2]) + (a->accm[1] + a->accm[3]));
    else if (type == ST_DTYPE_Q5_K)
        r = r + a->summs;
    return r;
}

void st_matmul_kq_ggml(uint32_t type, float *y, int64_t ldy, const void *w, size_t row_bytes,
                       const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    enum { MT = 16 }; /* tokens per pass: each super-block is unpacked once for them */
    const st_block_q8k *xq = x;
    const size_t bb = st_kquant_block_bytes(type);
    st_kq_unpacked u;
    kq_ggml_acc a[MT];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
        for (int64_t m0 = 0; m0 < M; m0 += MT) {
            const int64_t mt = M - m0 < MT ? M - m0 : MT;
            memset(a, 0, sizeof a);
            for (int64_t b = 0; b < K / ST_QK_K; b++) {
                st_kq_unpack(type, wr + (size_t)b * bb, &u);
                for (int64_t t = 0; t < mt; t++)
                    kq_ggml_step(type, &u, xq + (m0 + t) * ldx + b, &a[t]);
            }
            for (int64_t t = 0; t < mt; t++)
                y[(m0 + t) * ldy + r] = kq_ggml_result(type, &a[t]);
        }
    }
}

static void matmul_kq_ref(uint32_t type, int has_min, float *y, int64_t ldy, const void *w,
                          size_t row_bytes, const void *x, int64_t ldx, int64_t K, int64_t M,
                          int64_t r0, int64_t r1) {
    const st_block_q8k *xq = x;
    const int64_t nb = K / ST_QK_K;
    const size_t bb = st_kquant_block_bytes(type);
    st_kq_unpacked u;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
        for (int64_t m = 0; m < M; m++)
            y[m * ldy + r] = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            st_kq_unpack(type, wr + (size_t)b * bb, &u);
            for (int64_t m = 0; m < M; m++) {
                const st_block_q8k *xb = xq + m * ldx + b;
                int32_t idot = 0, t = 0;
                for (int j = 0; j < 16; j++) {
                    int32_t s = 0;
                    for (int e = 16 * j; e < 16 * j + 16; e++)
                        s += (int32_t)u.q[e] * xb->q[e];
                    idot += u.sc[j] * s;
                    t += u.bz[j] * xb->bsums[j];
                }
                y[m * ldy + r] = st_kq_step(y[m * ldy + r], u.d, u.dmin, xb->d, idot, t, has_min);
            }
        }
    }
}

#define ST_KQ_REF(name, type, has_min)                                                             \
    void st_matmul_##name##_ref(float *y, int64_t ldy, const void *w, size_t row_bytes,            \
                                const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,      \
                                int64_t r1) {                                                      \
        matmul_kq_ref(type, has_min, y, ldy, w, row_bytes, x, ldx, K, M, r0, r1);                  \
    }
ST_KQ_REF(q2_k, ST_DTYPE_Q2_K, 1)
ST_KQ_REF(q3_k, ST_DTYPE_Q3_K, 0)
ST_KQ_REF(q4_k, ST_DTYPE_Q4_K, 1)
ST_KQ_REF(q5_k, ST_DTYPE_Q5_K, 1)
ST_KQ_REF(q6_k, ST_DTYPE_Q6_K, 0)
