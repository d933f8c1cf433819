/*
 * kquant_avx2.c: K-quant matmuls with AVX2, bitwise equal to the `_ref` twins (kquant.h): each
 * weight super-block is unpacked once into registers (kquant_x86.h) and multiplied with every
 * token's activation block by vpmaddubsw (pairs of products, at most 2 * 63 * 127, so never
 * saturating) and vpmaddwd with the per-16 scales; the exact integers then take the shared
 * float step, in block order, per output.
 */
#include "kernels/kquant_x86.h"

/* Eight int32 lanes whose sum is idot = sum_j sc_j sum_{e in j} q_e x_e (exact: |idot| < 2^31
 * for every type). */
ST_INLINE void matmul_kq(uint32_t type, int has_min, float *y, int64_t ldy, const void *w,
                         size_t row_bytes, const void *x, int64_t ldx, int64_t K, int64_t M,
                         int64_t r0, int64_t r1) {
    const st_block_q8k *xq = x;
    const int64_t nb = K / ST_QK_K;
    const size_t bb = kq_block_bytes(type);
    if (M == 1) { /* decode: the chain in a register (y might alias the inputs) */
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                kq_regs u;
                kq_unpack(type, wr + (size_t)b * bb, &u);
                int32_t idot, t;
                kq_sums(kq_idot(type, &u, xq + b), &u, xq + b, &idot, &t);
                acc = st_kq_step(acc, u.d, u.dmin, xq[b].d, idot, t, has_min);
            }
            y[r] = acc;
        }
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            kq_regs u;
            kq_unpack(type, wr + (size_t)b * bb, &u);
            for (int64_t m = 0; m < M; m++) {
                const st_block_q8k *xb = xq + m * ldx + b;
                float *yo = y + m * ldy + r;
                int32_t idot, t;
                kq_sums(kq_idot(type, &u, xb), &u, xb, &idot, &t);
                *yo = st_kq_step(b ? *yo : 0.0f, u.d, u.dmin, xb->d, idot, t, has_min);
            }
        }
    }
}

#define ST_KQ_AVX2(name, type, has_min)                                                            \
    void st_matmul_##name##_avx2(float *y, int64_t ldy, const void *w, size_t row_bytes,           \
                                 const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,     \
                                 int64_t r1) {                                                     \
        matmul_kq(type, has_min, y, ldy, w, row_bytes, x, ldx, K, M, r0, r1);                      \
    }
ST_KQ_AVX2(q2_k, ST_DTYPE_Q2_K, 1)
ST_KQ_AVX2(q3_k, ST_DTYPE_Q3_K, 0)
ST_KQ_AVX2(q4_k, ST_DTYPE_Q4_K, 1)
ST_KQ_AVX2(q5_k, ST_DTYPE_Q5_K, 1)
ST_KQ_AVX2(q6_k, ST_DTYPE_Q6_K, 0)

/* st_quantize_q8k (kquant_ref.c), eight elements per step and bitwise its result: the first
 * element of largest magnitude (NaNs never count: vmaxps keeps its second operand, the running
 * maximum, when the first is NaN), iscale = -127 / that element, q = the product rounded to
 * nearest even (vcvtps2dq, as lrintf in the default rounding mode; a NaN product gives INT_MIN
 * either way, clamped to -127), the sums of each 16 and d = 1 / iscale. */
void st_quantize_q8k_avx2(st_block_q8k *y, const float *x, int64_t K) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i off = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    for (int64_t b = 0; b < K / ST_QK_K; b++) {
        const float *xb = x + b * ST_QK_K;
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < ST_QK_K; i += 8)
            m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + i), absm), m);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        memset(&y[b], 0, sizeof y[b]);
        if (amax == 0.0f || !isfinite(amax))
            continue;
        float mx = 0.0f;
        const __m256 va = _mm256_set1_ps(amax);
        for (int i = 0; i < ST_QK_K; i += 8) {
            const int hit = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(xb + i), absm), va, _CMP_EQ_OQ));
            if (hit) {
                mx = xb[i + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = -127.0f / mx;
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int i = 0; i < ST_QK_K; i += 32) {
            __m256i v[4];
            for (int k = 0; k < 4; k++)
                v[k] = _mm256_min_epi32(
                    _mm256_max_epi32(
                        _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8 * k), vs)), lo),
                    hi);
            const __m256i q = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3])),
                perm);
            _mm256_storeu_si256((__m256i *)(y[b].q + i), q);
            /* the sums of bytes 0-7, 8-15, 16-23, 24-31 as q + 128 */
            const __m256i s = _mm256_sad_epu8(_mm256_xor_si256(q, off), zero);
            y[b].bsums[i / 16] =
                (int16_t)(_mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1) - 16 * 128);
            y[b].bsums[i / 16 + 1] =
                (int16_t)(_mm256_extract_epi64(s, 2) + _mm256_extract_epi64(s, 3) - 16 * 128);
        }
        y[b].d = 1.0f / iscale;
    }
}
