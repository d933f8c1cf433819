/*
 * q4p_x86.h: the shared body of the Q4_0 matmuls on packed weights (st_pack_q4_0, kernels.h),
 * included by q4p_avx2.c, q4p_avxvnni.c and q4p_avx512.c, each compiled for its own ISA.
 * Row k of a group-block holds bytes 4k .. 4k+3 of the 16 rows' quants: its low nibbles are
 * lane k of every row's canonical Q4_0 product, its high nibbles lane k + 4, so one unsigned x
 * signed byte product against a broadcast dword of a token's block, starting from -8 times that
 * dword's sum (the nibbles' offset), leaves each row's exact lane sum in its own 32-bit lane;
 * each lane's chain takes one fma per block, and the final reduce8 is seven vertical additions
 * per vector of rows: no horizontal sums anywhere.
 *
 * The includer defines Q4P_TT (tokens per tile) and, before including, either Q4P_YMM with
 * Q4P_LANES(init, w, x) (the 256-bit lane step: exact int32 lanes init + sum of four u8 x s8
 * products) or its own group_tile (below). Rows past the last full group are row-major and go to
 * the row-major kernel passed to q4p_run (same arithmetic).
 */
#ifndef ST_Q4P_X86_H
#define ST_Q4P_X86_H

#include "kernels/kernels.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <string.h>

#ifdef Q4P_YMM
/* -8 times the sums of the activation dwords of a block: lane l = -8 (x[4l] + .. + x[4l+3]). */
ST_INLINE void q4p_offsets(int32_t off[8], const st_block_q8x *xb) {
    const __m256i s = Q4P_LANES(_mm256_setzero_si256(), _mm256_set1_epi8(8),
                                _mm256_loadu_si256((const __m256i *)xb->q));
    _mm256_storeu_si256((__m256i *)off, _mm256_sub_epi32(_mm256_setzero_si256(), s));
}

/* One group (16 rows, as two halves of eight) x T tokens, all blocks; y[t*ldy + n], n < 16. */
ST_INLINE void group_tile(float *y, int64_t ldy, const uint8_t *gp, int64_t nb,
                          const st_block_q8x *x, int64_t ldx, const int T, st_pf pf) {
    const __m256i mask = _mm256_set1_epi8(0xf);
    for (int h = 0; h < 2; h++) {
        __m256 acc[8 * Q4P_TT];
        ST_UNROLL
        for (int i = 0; i < 8 * T; i++)
            acc[i] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = gp + (size_t)b * ST_Q4P_GROUP_BYTES;
            if (h == 0)
                pf_step(&pf);
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
            __m256 dx[Q4P_TT];
            int32_t off[Q4P_TT][8];
            ST_UNROLL
            for (int t = 0; t < T; t++) {
                dx[t] = _mm256_mul_ps(dw, _mm256_set1_ps(x[t * ldx + b].d));
                q4p_offsets(off[t], x + t * ldx + b);
            }
            ST_UNROLL
            for (int k = 0; k < 4; k++) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 32 + 64 * k + 32 * h));
                const __m256i lo = _mm256_and_si256(raw, mask);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                ST_UNROLL
                for (int t = 0; t < T; t++) {
                    const st_block_q8x *xb = x + t * ldx + b;
                    int32_t xl, xh;
                    memcpy(&xl, xb->q + 4 * k, 4);
                    memcpy(&xh, xb->q + 16 + 4 * k, 4);
                    const __m256i sl =
                        Q4P_LANES(_mm256_set1_epi32(off[t][k]), lo, _mm256_set1_epi32(xl));
                    const __m256i sh =
                        Q4P_LANES(_mm256_set1_epi32(off[t][k + 4]), hi, _mm256_set1_epi32(xh));
                    acc[8 * t + k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sl), dx[t], acc[8 * t + k]);
                    acc[8 * t + k + 4] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(sh), dx[t], acc[8 * t + k + 4]);
                }
            }
        }
        ST_UNROLL
        for (int t = 0; t < T; t++) {
            const __m256 *a = acc + 8 * t;
            const __m256 even = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
            const __m256 odd = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
            _mm256_storeu_ps(y + t * ldy + 8 * h, _mm256_add_ps(even, odd));
        }
    }
}
#endif

/* One group x M tokens, in token tiles; the tiles bring in the next group (next, bytes; each
 * tile its share, spread over its blocks), so a tile finds its own group in the caches. */
static void group_all(float *y, int64_t ldy, const uint8_t *gp, int64_t nb, const st_block_q8x *x,
                      int64_t ldx, int64_t M, const uint8_t *next, int64_t bytes) {
    const int64_t nt = (M + Q4P_TT - 1) / Q4P_TT, share = (bytes + nt - 1) / nt;
    for (int64_t m = 0, i = 0; m < M; m += Q4P_TT, i++) {
        const int64_t left = bytes - i * share, sb = left < share ? left : share;
        const st_pf pf = pf_region((const char *)next + i * share, sb, nb);
        if (M - m >= Q4P_TT)
            group_tile(y + m * ldy, ldy, gp, nb, x + m * ldx, ldx, Q4P_TT, pf);
#if Q4P_TT > 2
        else if (M - m == 2)
            group_tile(y + m * ldy, ldy, gp, nb, x + m * ldx, ldx, 2, pf);
#endif
        else
            group_tile(y + m * ldy, ldy, gp, nb, x + m * ldx, ldx, 1, pf);
    }
}

/* Rows [r0, r1) of a packed matrix of `rows` rows: whole groups in token tiles, parts of groups
 * through a scratch tile, rows past the last full group by the row-major kernel. */
static void q4p_run(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows, const void *x,
                    int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1,
                    st_matmul_fn rowmajor) {
    if (M < 1 || r0 >= r1)
        return;
    const int64_t nb = K / ST_QK, G = ST_PACK_ROWS, rfull = rows / G * G;
    const st_block_q8x *xq = x;
    const uint8_t *w = wp;
    const size_t gstride = (size_t)G * rb;
    const int64_t re = r1 < rfull ? r1 : rfull;
    for (int64_t r = r0; r < re;) {
        const int64_t g = r / G, n0 = r - g * G, e = (g + 1) * G < re ? (g + 1) * G : re;
        const uint8_t *gp = w + (size_t)g * gstride;
        if (n0 == 0 && e == (g + 1) * G) {
            const int64_t nx = re - e < G ? re - e : G; /* the next group, up to the range's end */
            group_all(y + r, ldy, gp, nb, xq, ldx, M, gp + gstride, nx > 0 ? nx * (int64_t)rb : 0);
        } else {
            for (int64_t m = 0; m < M; m++) {
                float tmp[ST_PACK_ROWS];
                group_tile(tmp, 0, gp, nb, xq + m * ldx, ldx, 1, pf_region(NULL, 0, 1));
                memcpy(y + m * ldy + r, tmp + n0, (size_t)(e - r) * sizeof(float));
            }
        }
        r = e;
    }
    if (r1 > (r0 > rfull ? r0 : rfull))
        rowmajor(y, ldy, wp, rb, x, ldx, K, M, r0 > rfull ? r0 : rfull, r1);
}

#endif /* ST_Q4P_X86_H */
