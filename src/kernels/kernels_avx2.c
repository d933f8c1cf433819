/*
 * kernels_avx2.c: AVX2+FMA+F16C kernels, bitwise equal to their `_ref` twins in
 * kernels_ref.c: lane l of an 8-wide accumulator takes elements i = l (mod 8) with a fused
 * multiply-add, tails use zeroed lanes, and the horizontal sum is the canonical
 * ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). Quantized dot products are exact integer sums per
 * block followed by the same scalar fma chain as the reference.
 * Built with -mavx2 -mfma -mf16c; only called when the CPU reports those features.
 */
#include "kernels/kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    __m128 s4 = _mm_add_ps(lo, hi);                    /* l0+l4, l1+l5, l2+l6, l3+l7 */
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4)); /* (l0+l4)+(l2+l6), (l1+l5)+(l3+l7) */
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

static inline __m256i tail_mask(int64_t rem) {
    static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(m + 8 - rem));
}

static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    if (i < n) {
        __m256i mk = tail_mask(n - i);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, mk), _mm256_maskload_ps(b + i, mk), acc);
    }
    return hsum8(acc);
}

static void axpy_avx2(float *y, float a, const float *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
}

/* Eight lanes of st_expf_ref, operation for operation. */
static inline __m256 exp8(__m256 x) {
    __m256 lo_ok = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GT_OQ);
    __m256 isnan_ = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xc = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    xc = _mm256_max_ps(xc, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_and_ps(y, lo_ok);           /* x <= -87 (or -inf) -> 0 */
    return _mm256_blendv_ps(y, x, isnan_); /* NaN stays NaN */
}

static float exp_sum_avx2(float *x, int64_t n, float mx) {
    __m256 acc = _mm256_setzero_ps(), vm = _mm256_set1_ps(mx);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, y);
        acc = _mm256_add_ps(acc, y);
    }
    if (i < n) {
        __m256i mk = tail_mask(n - i);
        __m256 y = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, mk), vm));
        y = _mm256_and_ps(y, _mm256_castsi256_ps(mk));
        _mm256_maskstore_ps(x + i, mk, y);
        acc = _mm256_add_ps(acc, y);
    }
    return hsum8(acc);
}

/* Loads 8 weights of the given kind as floats. kind: 0 f32, 1 f16, 2 bf16. */
static inline __m256 load_w(const void *w, int64_t i, int kind) {
    if (kind == 0)
        return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (kind == 1)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __m256 load_w_tail(const void *w, int64_t i, int64_t rem, int kind) {
    if (kind == 0)
        return _mm256_maskload_ps((const float *)w + i, tail_mask(rem));
    uint16_t tmp[8] = {0};
    memcpy(tmp, (const uint16_t *)w + i, (size_t)rem * 2);
    __m128i h = _mm_loadu_si128((const __m128i *)tmp);
    if (kind == 1)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Four weight rows against one token at a time: each row keeps its own accumulator, so the
 * order per output element is the canonical one. */
static inline void matmul_float_rows(float *y, int64_t ldy, const void *w, size_t row_bytes,
                                     const float *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                     int64_t r1, int kind) {
    int64_t r = r0;
    int64_t kfull = K & ~(int64_t)7;
    for (; r + 4 <= r1; r += 4) {
        const char *w0 = (const char *)w + (size_t)r * row_bytes;
        const char *w1 = w0 + row_bytes, *w2 = w1 + row_bytes, *w3 = w2 + row_bytes;
        for (int64_t m = 0; m < M; m++) {
            const float *xm = x + m * ldx;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            int64_t i = 0;
            for (; i < kfull; i += 8) {
                __m256 xv = _mm256_loadu_ps(xm + i);
                a0 = _mm256_fmadd_ps(load_w(w0, i, kind), xv, a0);
                a1 = _mm256_fmadd_ps(load_w(w1, i, kind), xv, a1);
                a2 = _mm256_fmadd_ps(load_w(w2, i, kind), xv, a2);
                a3 = _mm256_fmadd_ps(load_w(w3, i, kind), xv, a3);
            }
            if (i < K) {
                __m256 xv = _mm256_maskload_ps(xm + i, tail_mask(K - i));
                a0 = _mm256_fmadd_ps(load_w_tail(w0, i, K - i, kind), xv, a0);
                a1 = _mm256_fmadd_ps(load_w_tail(w1, i, K - i, kind), xv, a1);
                a2 = _mm256_fmadd_ps(load_w_tail(w2, i, K - i, kind), xv, a2);
                a3 = _mm256_fmadd_ps(load_w_tail(w3, i, K - i, kind), xv, a3);
            }
            float *ym = y + m * ldy + r;
            ym[0] = hsum8(a0);
            ym[1] = hsum8(a1);
            ym[2] = hsum8(a2);
            ym[3] = hsum8(a3);
        }
    }
    for (; r < r1; r++) {
        const char *w0 = (const char *)w + (size_t)r * row_bytes;
        for (int64_t m = 0; m < M; m++) {
            const float *xm = x + m * ldx;
            __m256 a0 = _mm256_setzero_ps();
            int64_t i = 0;
            for (; i < kfull; i += 8)
                a0 = _mm256_fmadd_ps(load_w(w0, i, kind), _mm256_loadu_ps(xm + i), a0);
            if (i < K)
                a0 = _mm256_fmadd_ps(load_w_tail(w0, i, K - i, kind),
                                     _mm256_maskload_ps(xm + i, tail_mask(K - i)), a0);
            y[m * ldy + r] = hsum8(a0);
        }
    }
}

static void matmul_f32_avx2(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                            int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    matmul_float_rows(y, ldy, w, row_bytes, x, ldx, K, M, r0, r1, 0);
}

static void matmul_f16_avx2(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                            int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    matmul_float_rows(y, ldy, w, row_bytes, x, ldx, K, M, r0, r1, 1);
}

static void matmul_bf16_avx2(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                             int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    matmul_float_rows(y, ldy, w, row_bytes, x, ldx, K, M, r0, r1, 2);
}

/* Exact integer dot product of 32 signed bytes (weights may be -128, activations are in
 * [-127, 127], so maddubs never saturates). */
static inline int32_t idot32(__m256i w, __m256i x) {
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p32), _mm256_extracti128_si256(p32, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static void matmul_q8_0_avx2(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                             int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    const st_block_q8x *xq = x;
    int64_t nb = K / ST_QK;
    for (int64_t r = r0; r < r1; r++) {
        const st_block_q8_0 *wb = (const st_block_q8_0 *)((const char *)w + (size_t)r * row_bytes);
        for (int64_t m = 0; m < M; m++) {
            const st_block_q8x *xb = xq + m * ldx;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)wb[b].q);
                __m256i xv = _mm256_loadu_si256((const __m256i *)xb[b].q);
                int32_t s = idot32(wv, xv);
                acc = fmaf((float)s, st_fp16_to_f32(wb[b].d) * xb[b].d, acc);
            }
            y[m * ldy + r] = acc;
        }
    }
}

static void matmul_q4_0_avx2(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                             int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    const st_block_q8x *xq = x;
    int64_t nb = K / ST_QK;
    const __m256i lowmask = _mm256_set1_epi8(0xf), eight = _mm256_set1_epi8(8);
    for (int64_t r = r0; r < r1; r++) {
        const st_block_q4_0 *wb = (const st_block_q4_0 *)((const char *)w + (size_t)r * row_bytes);
        for (int64_t m = 0; m < M; m++) {
            const st_block_q8x *xb = xq + m * ldx;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                __m128i raw = _mm_loadu_si128((const __m128i *)wb[b].qs);
                __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
                __m256i wv = _mm256_sub_epi8(_mm256_and_si256(both, lowmask), eight);
                __m256i xv = _mm256_loadu_si256((const __m256i *)xb[b].q);
                int32_t s = idot32(wv, xv);
                acc = fmaf((float)s, st_fp16_to_f32(wb[b].d) * xb[b].d, acc);
            }
            y[m * ldy + r] = acc;
        }
    }
}

static void quantize_q8x_avx2(st_block_q8x *y, const float *x, int64_t K) {
    const __m256 signbit = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < K / ST_QK; b++) {
        const float *xb = x + b * ST_QK;
        __m256 v[4];
        __m256 mx = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(signbit, v[k]));
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, mx);
        float amax = 0.0f;
        for (int l = 0; l < 8; l++)
            amax = fmaxf(amax, lanes[l]);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = d;
        __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], vid));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], vid));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], vid));
        __m256i p01 = _mm256_packs_epi32(i0, i1);
        __m256i p23 = _mm256_packs_epi32(i2, i3);
        __m256i p = _mm256_packs_epi16(p01, p23);
        /* undo the lane interleave of the packs */
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[b].q, p);
    }
}

static const st_kernels st_kernels_avx2_table = {
    .name = "avx2",
    .matmul_f32 = matmul_f32_avx2,
    .matmul_f16 = matmul_f16_avx2,
    .matmul_bf16 = matmul_bf16_avx2,
    .matmul_q8_0 = matmul_q8_0_avx2,
    .matmul_q4_0 = matmul_q4_0_avx2,
    .dot = dot_avx2,
    .axpy = axpy_avx2,
    .exp_sum = exp_sum_avx2,
    .quantize_q8x = quantize_q8x_avx2,
};

const st_kernels *st_kernels_avx2_table_get(void);
const st_kernels *st_kernels_avx2_table_get(void) { return &st_kernels_avx2_table; }
