/*
 * kquant_avx512.c: K-quant matmuls with AVX-512 (BW, VNNI), bitwise equal to the `_ref` twins
 * (kquant.h): the super-blocks are unpacked into registers as in the AVX2 file (kquant_x86.h),
 * then paired into 512-bit vectors; the integer dot
 * takes 64 quants per step with vpmaddubsw and vpdpwssd against the per-16 scales (one 128-bit
 * lane per 16 elements). The exact integers take the shared float step, in block order.
 * The file is compiled for the ISA (CMakeLists.txt: *_avx512.c); it is only called when the
 * CPU and the OS support these features (dispatch.c).
 */
#include "kernels/kquant_x86.h"

/* Word k of step i: the scale of sub-block 4i + k/8. */
static const int16_t kq_pick[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};

/* Eight int32 lanes whose sum is idot = sum_j sc_j sum_{e in j} q_e x_e (exact: |idot| < 2^31
 * for every type); q and sc: the block's quants and scales, 64 elements per vector. */
ST_INLINE __m256i kq_idot512(const __m512i q[4], const __m512i sc[4], const st_block_q8k *xb) {
    __m512i acc = _mm512_setzero_si512();
    ST_UNROLL
    for (int i = 0; i < 4; i++)
        acc = _mm512_dpwssd_epi32(
            acc, _mm512_maddubs_epi16(q[i], _mm512_loadu_si512(xb->q + 64 * i)), sc[i]);
    return _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
}

/* The block as four vectors of 64 quants and their scales (one per 128-bit lane). */
ST_INLINE void kq_widen(const kq_regs *u, __m512i q[4], __m512i sc[4]) {
    const __m512i s16 = _mm512_zextsi256_si512(u->sc), pick = _mm512_loadu_si512(kq_pick);
    ST_UNROLL
    for (int i = 0; i < 4; i++) {
        q[i] = _mm512_inserti64x4(_mm512_castsi256_si512(u->q[2 * i]), u->q[2 * i + 1], 1);
        sc[i] = _mm512_permutexvar_epi16(_mm512_add_epi16(pick, _mm512_set1_epi16((short)(4 * i))),
                                         s16);
    }
}

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
            __m512i q[4], sc[4];
            kq_widen(&u, q, sc);
            for (int64_t m = 0; m < M; m++) {
                const st_block_q8k *xb = xq + m * ldx + b;
                float *yo = y + m * ldy + r;
                int32_t idot, t;
                kq_sums(kq_idot512(q, sc, xb), &u, xb, &idot, &t);
                *yo = st_kq_step(b ? *yo : 0.0f, u.d, u.dmin, xb->d, idot, t, has_min);
            }
        }
    }
}

#define ST_KQ_AVX512(name, type, has_min)                                                          \
    void st_matmul_##name##_avx512(float *y, int64_t ldy, const void *w, size_t row_bytes,         \
                                   const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,   \
                                   int64_t r1) {                                                   \
        matmul_kq(type, has_min, y, ldy, w, row_bytes, x, ldx, K, M, r0, r1);                      \
    }
ST_KQ_AVX512(q2_k, ST_DTYPE_Q2_K, 1)
ST_KQ_AVX512(q3_k, ST_DTYPE_Q3_K, 0)
ST_KQ_AVX512(q4_k, ST_DTYPE_Q4_K, 1)
ST_KQ_AVX512(q5_k, ST_DTYPE_Q5_K, 1)
ST_KQ_AVX512(q6_k, ST_DTYPE_Q6_K, 0)
