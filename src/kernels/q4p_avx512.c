/*
 * q4p_avx512.c: the AVX-512 table's Q4_0 matmul on packed weights (st_pack_q4_0; the layout's
 * use: q4p_x86.h), bitwise the per-lane canonical dot product. A 512-bit vector holds one lane of
 * all 16 rows of a group: vpdpbusd of the unsigned nibbles against a broadcast dword of the
 * token's block, starting from -8 times the dword's sum, gives the rows' exact lane sums; per
 * block and token, eight products, conversions and fmas and one scale for 16 rows. Tokens go in
 * tiles of Q4P_TT (eight accumulators each), so each weight byte is loaded from memory once per
 * pass and decoded once per tile.
 * The file is compiled for the ISA (CMakeLists.txt: *_avx512.c); it is only called when the
 * CPU and the OS support these features (dispatch.c).
 */
#include "kernels/kernels.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <string.h>

/* Tokens per tile (registers: eight accumulators per token, two decoded weight vectors, the
 * tokens' scales, constants). */
#define Q4P_TT 2

/* One group (16 rows) x T tokens, all blocks; y[t*ldy + n] for n < 16. */
ST_INLINE void group_tile(float *y, int64_t ldy, const uint8_t *gp, int64_t nb,
                          const st_block_q8x *x, int64_t ldx, const int T, st_pf pf) {
    __m512 acc[8 * Q4P_TT];
    ST_UNROLL
    for (int i = 0; i < 8 * T; i++)
        acc[i] = _mm512_setzero_ps();
    const __m512i mask = _mm512_set1_epi8(0xf);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = gp + (size_t)b * ST_Q4P_GROUP_BYTES;
        pf_step(&pf);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        __m512 dx[Q4P_TT];
        int32_t off[Q4P_TT][8];
        ST_UNROLL
        for (int t = 0; t < T; t++) {
            const st_block_q8x *xb = x + t * ldx + b;
            dx[t] = _mm512_mul_ps(dw, _mm512_set1_ps(xb->d));
            const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8),
                                                  _mm256_loadu_si256((const __m256i *)xb->q));
            _mm256_storeu_si256((__m256i *)off[t], _mm256_sub_epi32(_mm256_setzero_si256(), s));
        }
        ST_UNROLL
        for (int k = 0; k < 4; k++) {
            const __m512i raw = _mm512_loadu_si512(p + 32 + 64 * k);
            const __m512i lo = _mm512_and_si512(raw, mask);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
            ST_UNROLL
            for (int t = 0; t < T; t++) {
                const st_block_q8x *xb = x + t * ldx + b;
                int32_t xl, xh;
                memcpy(&xl, xb->q + 4 * k, 4);
                memcpy(&xh, xb->q + 16 + 4 * k, 4);
                const __m512i sl =
                    _mm512_dpbusd_epi32(_mm512_set1_epi32(off[t][k]), lo, _mm512_set1_epi32(xl));
                const __m512i sh = _mm512_dpbusd_epi32(_mm512_set1_epi32(off[t][k + 4]), hi,
                                                       _mm512_set1_epi32(xh));
                acc[8 * t + k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl), dx[t], acc[8 * t + k]);
                acc[8 * t + k + 4] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(sh), dx[t], acc[8 * t + k + 4]);
            }
        }
    }
    ST_UNROLL
    for (int t = 0; t < T; t++) {
        const __m512 *a = acc + 8 * t;
        const __m512 even = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
        const __m512 odd = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
        _mm512_storeu_ps(y + t * ldy, _mm512_add_ps(even, odd));
    }
}

#include "kernels/q4p_x86.h"

const st_kernels *st_kernels_avx512_table_get(void);

void st_matmul_q4_0_packed_avx512(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                                  const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                  int64_t r1) {
    q4p_run(y, ldy, wp, rb, rows, x, ldx, K, M, r0, r1, st_kernels_avx512_table_get()->matmul_q4_0);
}
