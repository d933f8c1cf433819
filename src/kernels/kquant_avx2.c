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
