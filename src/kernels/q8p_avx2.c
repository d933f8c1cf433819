/*
 * q8p_avx2.c: the AVX2 table's Q8_0 matmul on packed weights (st_pack_q8_0, kernels.h), bitwise
 * the per-block canonical dot product. A group-block holds the 16 rows' bytes 4k .. 4k+3 in its
 * row k of 64 bytes, two vectors of eight rows, so vpmaddubsw and vpmaddwd against one
 * broadcast dword of a token's block leave each row's partial sum in its own lane: eight steps
 * give the 16 rows' exact block sums in two vectors, with no horizontal reduction, and the
 * float work per block is one conversion, one scale and one fma per token and eight rows.
 * Tokens go in tiles of Q8P_TT, so each weight byte is loaded from memory once per pass and
 * from the caches once per tile. Rows past the last full group are row-major and go to
 * st_matmul_q8_0_avx2 (same arithmetic).
 */
#include "kernels/kernels.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <string.h>

/* Tokens per tile (registers: two integer sums per token, the four weight vectors, constants). */
enum { Q8P_TT = 3 };

/* One group (16 rows) x T tokens, all blocks; y[t*ldy + n] for n < 16. The integer sums live in
 * registers, the float chains in y itself (one load and one store per block and eight rows:
 * registers enough for four tokens' sums). */
ST_INLINE void group_tile(float *y, int64_t ldy, const uint8_t *gp, int64_t nb,
                          const st_block_q8x *x, int64_t ldx, const int T, st_pf pf) {
    const __m256i ones = _mm256_set1_epi16(1);
    ST_UNROLL
    for (int t = 0; t < T; t++) {
        _mm256_storeu_ps(y + t * ldy, _mm256_setzero_ps());
        _mm256_storeu_ps(y + t * ldy + 8, _mm256_setzero_ps());
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = gp + (size_t)b * ST_Q8P_GROUP_BYTES;
        pf_step(&pf);
        __m256i s[2 * Q8P_TT];
        ST_UNROLL
        for (int i = 0; i < 2 * T; i++)
            s[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 1") for (int k = 0; k < ST_QK / 4; k++) {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(p + 32 + 64 * k));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(p + 64 + 64 * k));
            const __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);
            ST_UNROLL
            for (int t = 0; t < T; t++) {
                int32_t xd;
                memcpy(&xd, x[t * ldx + b].q + 4 * k, 4);
                const __m256i xv = _mm256_set1_epi32(xd);
                /* maddubs(|w|, sign(x, w)): exact, at most 2 * 128 * 127 per 16-bit pair */
                s[2 * t] = _mm256_add_epi32(
                    s[2 * t],
                    _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(xv, w0)), ones));
                s[2 * t + 1] = _mm256_add_epi32(
                    s[2 * t + 1],
                    _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(xv, w1)), ones));
            }
        }
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
        ST_UNROLL
        for (int t = 0; t < T; t++) {
            const __m256 dx = _mm256_set1_ps(x[t * ldx + b].d);
            float *yt = y + t * ldy;
            _mm256_storeu_ps(yt, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[2 * t]),
                                                 _mm256_mul_ps(d0, dx), _mm256_loadu_ps(yt)));
            _mm256_storeu_ps(yt + 8,
                             _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[2 * t + 1]),
                                             _mm256_mul_ps(d1, dx), _mm256_loadu_ps(yt + 8)));
        }
    }
}

/* One group x M tokens, in token tiles; the tiles bring in the next group (next, bytes; each
 * tile its share, spread over its blocks): the memory stream runs while every tile computes,
 * and a tile finds its own group in L2. */
static void group_all(float *y, int64_t ldy, const uint8_t *gp, int64_t nb, const st_block_q8x *x,
                      int64_t ldx, int64_t M, const uint8_t *next, int64_t bytes) {
    const int64_t nt = (M + Q8P_TT - 1) / Q8P_TT, share = (bytes + nt - 1) / nt;
    for (int64_t m = 0, i = 0; m < M; m += Q8P_TT, i++) {
        const int64_t left = bytes - i * share, sb = left < share ? left : share;
        const st_pf pf = pf_region((const char *)next + i * share, sb, nb);
        switch (M - m >= Q8P_TT ? Q8P_TT : M - m) {
        case 1:
            group_tile(y + m * ldy, ldy, gp, nb, x + m * ldx, ldx, 1, pf);
            break;
        case 2:
            group_tile(y + m * ldy, ldy, gp, nb, x + m * ldx, ldx, 2, pf);
            break;
        default:
            group_tile(y + m * ldy, ldy, gp, nb, x + m * ldx, ldx, Q8P_TT, pf);
            break;
        }
    }
}

void st_matmul_q8_0_packed_avx2(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                                const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                int64_t r1) {
    if (M < 1 || r0 >= r1)
        return;
    if (st_avxvnni_ready()) {
        st_matmul_q8_0_packed_avxvnni(y, ldy, wp, rb, rows, x, ldx, K, M, r0, r1);
        return;
    }
    const int64_t nb = K / ST_QK, G = ST_PACK_ROWS, rfull = rows / G * G;
    const st_block_q8x *xq = x;
    const uint8_t *w = wp;
    const size_t gstride = (size_t)G * rb;
    const int64_t re = r1 < rfull ? r1 : rfull;
    for (int64_t r = r0; r < re;) {
        const int64_t g = r / G, n0 = r - g * G, e = (g + 1) * G < re ? (g + 1) * G : re;
        const uint8_t *gp = w + (size_t)g * gstride;
        if (n0 == 0 && e == (g + 1) * G) {
            /* the next group, up to the end of the range */
            const int64_t nx = re - e < G ? re - e : G;
            group_all(y + r, ldy, gp, nb, xq, ldx, M, gp + gstride, nx > 0 ? nx * (int64_t)rb : 0);
        } else { /* part of a group: through a scratch tile, one token at a time */
            for (int64_t m = 0; m < M; m++) {
                float tmp[ST_PACK_ROWS];
                group_tile(tmp, 0, gp, nb, xq + m * ldx, ldx, 1, pf_region(NULL, 0, 1));
                memcpy(y + m * ldy + r, tmp + n0, (size_t)(e - r) * sizeof(float));
            }
        }
        r = e;
    }
    if (r1 > (r0 > rfull ? r0 : rfull)) /* rows past the last full group: row-major */
        st_matmul_q8_0_avx2(y, ldy, wp, rb, x, ldx, K, M, r0 > rfull ? r0 : rfull, r1);
}
