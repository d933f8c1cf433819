/*
 * q4p_avxvnni.c: the AVX2 table's Q4_0 matmul on packed weights where the CPU has AVX-VNNI
 * (st_avxvnni_ready; q4p_x86.h): the lane step is one vpdpbusd, which starts from the nibbles'
 * offset, so a block costs per token and eight rows eight products, conversions and fmas. One
 * token per tile (eight accumulators per half group, sixteen registers).
 */
#define Q4P_YMM
#define Q4P_TT 1
#define Q4P_LANES(init, w, x) _mm256_dpbusd_avx_epi32((init), (w), (x))
#include "kernels/q4p_x86.h"

const st_kernels *st_kernels_avx2_table_get(void);

void st_matmul_q4_0_packed_avxvnni(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                                   const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                   int64_t r1) {
    q4p_run(y, ldy, wp, rb, rows, x, ldx, K, M, r0, r1, st_kernels_avx2_table_get()->matmul_q4_0);
}
