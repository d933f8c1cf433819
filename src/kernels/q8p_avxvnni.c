/*
 * q8p_avxvnni.c: the AVX2 table's Q8_0 matmul on packed weights (st_pack_q8_0, kernels.h) on CPUs
 * with AVX-VNNI (the VEX-encoded vpdpbusd of Intel's client cores since Alder Lake and of AMD's
 * since Zen 5), bitwise the per-block canonical dot product. As kernels_amx.c's VNNI path at
 * half the width: the weights made unsigned (w + 128, one xor per vector for all the tokens of a
 * tile) against a broadcast dword of a token's signed quants, so each lane gets
 * isum + 128 * sum(x) and the chains start at -128 * sum(x), summed once per call for every
 * token and block; two vectors of eight rows per group-block row. One vpdpbusd replaces the
 * vpsignb, vpmaddubsw, vpmaddwd and vpaddd of q8p_avx2.c.
 * The file is compiled for AVX2, FMA, F16C and AVX-VNNI (CMakeLists.txt: *_avxvnni.c); it only
 * runs where st_avxvnni_ready() says the CPU has AVX-VNNI.
 */
#include "kernels/kernels.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

/* Tokens per tile (registers: two chains per token, the two weight vectors, constants); the
 * most block sums a call keeps on the stack (more go on the heap). */
enum { VV_TT = 4, VV_SX = 8192 };

typedef int32_t i32u __attribute__((may_alias, aligned(1)));

/* One group (16 rows) x T tokens, all blocks; y[t*ldy + n] for n < 16 (the float chains in y:
 * one load and one store per block and eight rows). */
ST_INLINE void group_tile(float *y, int64_t ldy, const uint8_t *gp, int64_t nb,
                          const st_block_q8x *x, int64_t ldx, const int32_t *sx, const int T,
                          st_pf pf) {
    const __m256i off = _mm256_set1_epi8((char)0x80);
    ST_UNROLL
    for (int t = 0; t < T; t++) {
        _mm256_storeu_ps(y + t * ldy, _mm256_setzero_ps());
        _mm256_storeu_ps(y + t * ldy + 8, _mm256_setzero_ps());
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = gp + (size_t)b * ST_Q8P_GROUP_BYTES;
        pf_step(&pf);
        __m256i s[2 * VV_TT];
        ST_UNROLL
        for (int t = 0; t < T; t++)
            s[2 * t] = s[2 * t + 1] = _mm256_set1_epi32(sx[t * nb + b]);
        ST_UNROLL
        for (int k = 0; k < ST_QK / 4; k++) {
            const __m256i w0 =
                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 32 + 64 * k)), off);
            const __m256i w1 =
                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 64 + 64 * k)), off);
            ST_UNROLL
            for (int t = 0; t < T; t++) {
                const __m256i xv = _mm256_set1_epi32(*(const i32u *)(x[t * ldx + b].q + 4 * k));
                s[2 * t] = _mm256_dpbusd_avx_epi32(s[2 * t], w0, xv);
                s[2 * t + 1] = _mm256_dpbusd_avx_epi32(s[2 * t + 1], w1, xv);
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

/* One group x M tokens in token tiles, each tile prefetching its share of the next group. */
static void group_all(float *y, int64_t ldy, const uint8_t *gp, int64_t nb, const st_block_q8x *x,
                      int64_t ldx, const int32_t *sx, int64_t M, const uint8_t *next,
                      int64_t bytes) {
    const int64_t nt = (M + VV_TT - 1) / VV_TT, share = (bytes + nt - 1) / nt;
    for (int64_t m = 0, i = 0; m < M; m += VV_TT, i++) {
        const int64_t left = bytes - i * share, sb = left < share ? left : share;
        const st_pf pf = pf_region((const char *)next + i * share, sb, nb);
        float *ym = y + m * ldy;
        const st_block_q8x *xm = x + m * ldx;
        const int32_t *sm = sx + m * nb;
        switch (M - m >= VV_TT ? VV_TT : M - m) {
        case 1:
            group_tile(ym, ldy, gp, nb, xm, ldx, sm, 1, pf);
            break;
        case 2:
            group_tile(ym, ldy, gp, nb, xm, ldx, sm, 2, pf);
            break;
        case 3:
            group_tile(ym, ldy, gp, nb, xm, ldx, sm, 3, pf);
            break;
        default:
            group_tile(ym, ldy, gp, nb, xm, ldx, sm, VV_TT, pf);
            break;
        }
    }
}

/* Rows [r0, r1) for M tokens whose block sums are sx. */
static void rows_tokens(float *y, int64_t ldy, const uint8_t *w, size_t rb, int64_t rows,
                        const st_block_q8x *xq, int64_t ldx, const int32_t *sx, int64_t K,
                        int64_t M, int64_t r0, int64_t r1) {
    const int64_t nb = K / ST_QK, G = ST_PACK_ROWS, rfull = rows / G * G;
    const size_t gstride = (size_t)G * rb;
    const int64_t re = r1 < rfull ? r1 : rfull;
    for (int64_t r = r0; r < re;) {
        const int64_t g = r / G, n0 = r - g * G, e = (g + 1) * G < re ? (g + 1) * G : re;
        const uint8_t *gp = w + (size_t)g * gstride;
        if (n0 == 0 && e == (g + 1) * G) {
            const int64_t nx = re - e < G ? re - e : G;
            group_all(y + r, ldy, gp, nb, xq, ldx, sx, M, gp + gstride,
                      nx > 0 ? nx * (int64_t)rb : 0);
        } else { /* part of a group: through a scratch tile, one token at a time */
            for (int64_t m = 0; m < M; m++) {
                float tmp[ST_PACK_ROWS];
                group_tile(tmp, 0, gp, nb, xq + m * ldx, ldx, sx + m * nb, 1,
                           pf_region(NULL, 0, 1));
                memcpy(y + m * ldy + r, tmp + n0, (size_t)(e - r) * sizeof(float));
            }
        }
        r = e;
    }
    if (r1 > (r0 > rfull ? r0 : rfull)) /* rows past the last full group: row-major */
        st_matmul_q8_0_avx2(y, ldy, w, rb, xq, ldx, K, M, r0 > rfull ? r0 : rfull, r1);
}

void st_matmul_q8_0_packed_avxvnni(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                                   const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                   int64_t r1) {
    if (M < 1 || r0 >= r1)
        return;
    const int64_t nb = K / ST_QK > 0 ? K / ST_QK : 1;
    const st_block_q8x *xq = x;
    /* the block sums on the stack, else on the heap, else tokens in chunks that fit */
    int32_t sbuf[VV_SX], *sx = sbuf;
    int64_t chunk = M;
    if (M * nb > VV_SX && !(sx = malloc((size_t)(M * nb) * sizeof(int32_t)))) {
        sx = sbuf;
        chunk = VV_SX / nb > 0 ? VV_SX / nb : 1;
    }
    for (int64_t m = 0; m < M; m += chunk) {
        const int64_t mc = M - m < chunk ? M - m : chunk;
        st_q8_block_sums(sx, xq + m * ldx, ldx, mc, K / ST_QK);
        rows_tokens(y + m * ldy, ldy, wp, rb, rows, xq + m * ldx, ldx, sx, K, mc, r0, r1);
    }
    if (sx != sbuf)
        free(sx);
}
