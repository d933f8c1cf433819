/*
 * q4p_avx2.c: the AVX2 table's Q4_0 matmul on packed weights (st_pack_q4_0; the body and the
 * layout's use: q4p_x86.h), bitwise the per-lane canonical dot product. The lane step is
 * vpmaddubsw (nibble x activation, pairs at most 2 * 15 * 128, exact) and vpmaddwd by ones;
 * one token per tile (eight accumulators per half group, sixteen registers). Where the CPU has
 * AVX-VNNI (st_avxvnni_ready) the work goes to q4p_avxvnni.c.
 */
#define Q4P_YMM
#define Q4P_TT 1
#define Q4P_LANES(init, w, x)                                                                      \
    _mm256_add_epi32((init),                                                                       \
                     _mm256_madd_epi16(_mm256_maddubs_epi16((w), (x)), _mm256_set1_epi16(1)))
#include "kernels/q4p_x86.h"

const st_kernels *st_kernels_avx2_table_get(void);

void st_matmul_q4_0_packed_avx2(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                                const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                int64_t r1) {
    if (st_avxvnni_ready()) {
        st_matmul_q4_0_packed_avxvnni(y, ldy, wp, rb, rows, x, ldx, K, M, r0, r1);
        return;
    }
    q4p_run(y, ldy, wp, rb, rows, x, ldx, K, M, r0, r1, st_kernels_avx2_table_get()->matmul_q4_0);
}
