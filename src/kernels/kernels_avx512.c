/*
 * kernels_avx512.c: AVX-512 (F, BW, VL, DQ, VNNI) matmuls for token batches, bitwise equal to
 * the `_ref` twins: a 512-bit register holds the 8-lane accumulators of two weight rows side by
 * side, so every output keeps exactly the canonical lanes and order of kernels.h while one
 * instruction serves two rows. Q4_0 blocks use vpdpbusd, whose 32-bit lanes are the canonical
 * integer lanes (lane l = bytes 4l .. 4l+3 of a block), the nibbles unsigned and the lanes
 * starting at -8 * sum(x). Q8_0 (per-block canonical) runs on packed weights (kernels_amx.c),
 * else the AVX2 kernel.
 * Packed float weights (kernels.h) take one 128-bit broadcast of four inputs per vector of four
 * rows x four columns, and reduce 16 rows with one vertical add and a few in-lane shuffles.
 * exp_sum and softmax run 16 lanes per step, each element still added to its canonical lane
 * (i mod 8) in increasing i; attention scores of heads up to 16 take 16 key rows per step.
 * F32 with a single token (memory-bound, measured no better here) and all the other kernels
 * are the AVX2 ones.
 * The file is compiled for the ISA (CMakeLists.txt: *_avx512.c); it is only called when the
 * CPU and the OS support these features (dispatch.c).
 */
#include "kernels/kernels.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

const st_kernels *st_kernels_avx2_table_get(void);
const st_kernels *st_kernels_avx512_table_get(void);

/* Rows per tile (in pairs), tokens per tile; prefetch distance of single-token quantized
 * streams (float tiles prefetch the next block of rows). */
enum { PAIRS_F = 4, TOK_F = 4, PAIRS_Q = 2, TOK_Q = 4, ST_PF_BYTES = 8192 };

/* acc[p*T + t] holds rows 2p (low half) and 2p+1 (high half) of token t; writes
 * y[t*ldy + r] for r < 2P, t < T. */
ST_INLINE void store_tile(float *y, int64_t ldy, const __m512 *acc, const int P, const int T) {
    __m256 h[32];
    ST_UNROLL
    for (int t = 0; t < T; t++)
        ST_UNROLL
    for (int p = 0; p < P; p++) {
        h[t * 2 * P + 2 * p] = _mm512_castps512_ps256(acc[p * T + t]);
        h[t * 2 * P + 2 * p + 1] = _mm512_extractf32x8_ps(acc[p * T + t], 1);
    }
    const int n = 2 * P * T;
    float out[32];
    ST_UNROLL
    for (int i = 0; i < n; i += 8) {
        __m256 a[8];
        ST_UNROLL
        for (int j = 0; j < 8; j++)
            a[j] = i + j < n ? h[i + j] : _mm256_setzero_ps();
        _mm256_storeu_ps(out + i, hsum8x8(a));
    }
    ST_UNROLL
    for (int t = 0; t < T; t++)
        ST_UNROLL
    for (int r = 0; r < 2 * P; r++)
        y[t * ldy + r] = out[t * 2 * P + r];
}

/* ------------------------------------------------------------------------------------------ */
/* Float matmuls                                                                              */

enum { KIND_F32, KIND_F16, KIND_BF16 };

/* Weights i .. i+7 of rows a (low half) and b (high half) as floats; rem < 8 loads a tail with
 * zeros after it. The high half comes in with a merging masked load (no shuffle): its address
 * is 8 elements early, and the masked-off lanes are never accessed. */
ST_INLINE __m512 load_pair(const char *a, const char *b, int64_t i, int rem, int kind) {
    if (kind == KIND_F32) {
        const float *fa = (const float *)a + i, *fb = (const float *)b + i;
        if (rem == 8)
            return _mm512_mask_loadu_ps(_mm512_castps256_ps512(_mm256_loadu_ps(fa)), 0xff00,
                                        fb - 8);
        const __mmask8 m = (__mmask8)((1u << rem) - 1);
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_maskz_loadu_ps(m, fa)),
                                  _mm256_maskz_loadu_ps(m, fb), 1);
    }
    const uint16_t *ha = (const uint16_t *)a + i, *hb = (const uint16_t *)b + i;
    __m256i h;
    if (rem == 8) {
        h = _mm256_mask_loadu_epi16(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)ha)),
                                    0xff00, hb - 8);
    } else {
        const __mmask8 m = (__mmask8)((1u << rem) - 1);
        h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_maskz_loadu_epi16(m, ha)),
                                    _mm_maskz_loadu_epi16(m, hb), 1);
    }
    if (kind == KIND_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* x_i .. x_i+7 in both halves. */
ST_INLINE __m512 load_x2(const float *x, int64_t i, int rem) {
    if (rem == 8)
        return _mm512_broadcast_f32x8(_mm256_loadu_ps(x + i));
    const __m256 v = _mm256_maskz_loadu_ps((__mmask8)((1u << rem) - 1), x + i);
    return _mm512_insertf32x8(_mm512_castps256_ps512(v), v, 1);
}

/* 2P rows x T tokens. */
ST_INLINE void tile_float(float *y, int64_t ldy, const char *w, size_t rb, const float *x,
                          int64_t ldx, int64_t K, const int P, const int T, const int kind,
                          st_pf pf) {
    __m512 acc[PAIRS_F * TOK_F];
    ST_UNROLL
    for (int i = 0; i < P * T; i++)
        acc[i] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= K; i += 8) {
        pf_step(&pf);
        __m512 xv[TOK_F];
        ST_UNROLL
        for (int t = 0; t < T; t++)
            xv[t] = load_x2(x + t * ldx, i, 8);
        ST_UNROLL
        for (int p = 0; p < P; p++) {
            const __m512 wv =
                load_pair(w + (size_t)(2 * p) * rb, w + (size_t)(2 * p + 1) * rb, i, 8, kind);
            ST_UNROLL
            for (int t = 0; t < T; t++)
                acc[p * T + t] = _mm512_fmadd_ps(wv, xv[t], acc[p * T + t]);
        }
    }
    if (i < K) {
        const int rem = (int)(K - i);
        __m512 xv[TOK_F];
        ST_UNROLL
        for (int t = 0; t < T; t++)
            xv[t] = load_x2(x + t * ldx, i, rem);
        ST_UNROLL
        for (int p = 0; p < P; p++) {
            const __m512 wv =
                load_pair(w + (size_t)(2 * p) * rb, w + (size_t)(2 * p + 1) * rb, i, rem, kind);
            ST_UNROLL
            for (int t = 0; t < T; t++)
                acc[p * T + t] = _mm512_fmadd_ps(wv, xv[t], acc[p * T + t]);
        }
    }
    store_tile(y, ldy, acc, P, T);
}

/* Blocks of 2*PAIRS_F rows, tokens in chunks of TOK_F sharing the prefetch of the next block;
 * a single token and leftover rows go to the AVX2 kernel (same results). */
ST_INLINE void matmul_float(st_matmul_fn avx2, float *y, int64_t ldy, const void *w, size_t rb,
                            const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                            int64_t r1, const int kind) {
    if (M < 1 || r0 >= r1)
        return;
    if (M == 1 && kind == KIND_F32) {
        avx2(y, ldy, w, rb, x, ldx, K, M, r0, r1);
        return;
    }
    const float *xf = x;
    const char *wc = w;
    const int64_t R = 2 * PAIRS_F, steps = K / 8 > 0 ? K / 8 : 1;
    const int64_t nc = (M + TOK_F - 1) / TOK_F, blk = R * (int64_t)rb, seg = (blk + nc - 1) / nc;
    int64_t r = r0;
    for (; r + R <= r1; r += R) {
        const char *wr = wc + (size_t)r * rb;
        for (int64_t m = 0, c = 0; m < M; m += TOK_F, c++) {
            const st_pf pf = pf_region(wr + blk + c * seg, seg, steps);
            float *ym = y + m * ldy + r;
            const float *xm = xf + m * ldx;
            switch (M - m >= TOK_F ? TOK_F : M - m) {
            case 1:
                tile_float(ym, ldy, wr, rb, xm, ldx, K, PAIRS_F, 1, kind, pf);
                break;
            case 2:
                tile_float(ym, ldy, wr, rb, xm, ldx, K, PAIRS_F, 2, kind, pf);
                break;
            case 3:
                tile_float(ym, ldy, wr, rb, xm, ldx, K, PAIRS_F, 3, kind, pf);
                break;
            default:
                tile_float(ym, ldy, wr, rb, xm, ldx, K, PAIRS_F, TOK_F, kind, pf);
                break;
            }
        }
    }
    if (r < r1)
        avx2(y, ldy, w, rb, x, ldx, K, M, r, r1);
}

static void matmul_f32_avx512(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                              int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    matmul_float(st_kernels_avx2_table_get()->matmul_f32, y, ldy, w, row_bytes, x, ldx, K, M, r0,
                 r1, KIND_F32);
}

static void matmul_f16_avx512(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                              int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    matmul_float(st_kernels_avx2_table_get()->matmul_f16, y, ldy, w, row_bytes, x, ldx, K, M, r0,
                 r1, KIND_F16);
}

static void matmul_bf16_avx512(float *y, int64_t ldy, const void *w, size_t row_bytes,
                               const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                               int64_t r1) {
    matmul_float(st_kernels_avx2_table_get()->matmul_bf16, y, ldy, w, row_bytes, x, ldx, K, M, r0,
                 r1, KIND_BF16);
}

/* ------------------------------------------------------------------------------------------ */
/* Packed float matmuls                                                                       */

/* Four values x[0 .. 3] in each 128-bit lane; the first n only (the rest +0) when n < 4. */
ST_INLINE __m512 load_x4(const float *x, int n) {
    if (n >= 4)
        return _mm512_broadcast_f32x4(_mm_loadu_ps(x));
    if (n <= 0)
        return _mm512_setzero_ps();
    return _mm512_broadcast_f32x4(_mm_maskz_loadu_ps((__mmask8)((1u << n) - 1), x));
}

/* One step of eight columns i .. i+7 (n of them present) of a tile_packed tile. */
ST_INLINE void packed_step(__m512 acc[3][4][2], const float *wb, const float *x, int64_t ldx,
                           int64_t i, int n, const int T, st_pf *pf) {
    pf_step(pf);
    ST_UNROLL
    for (int h = 0; h < 2; h++) {
        __m512 xv[3];
        ST_UNROLL
        for (int t = 0; t < T; t++)
            xv[t] = load_x4(x + t * ldx + i + 4 * h, n - 4 * h);
        ST_UNROLL
        for (int g = 0; g < 4; g++) {
            __m512 w = _mm512_loadu_ps(wb + (size_t)(i + 4 * h) * 16 + g * 16);
            /* one load of w for all the tokens (two loads per cycle are the limit) */
            __asm__("" : "+v"(w));
            ST_UNROLL
            for (int t = 0; t < T; t++)
                acc[t][g][h] = _mm512_fmadd_ps(w, xv[t], acc[t][g][h]);
        }
    }
}

/* One 16-row block wb of the packed layout (kernels.h) x T tokens: acc[t][g][h] holds lanes
 * 4h .. 4h+3 of rows 4c + g (c in the 128-bit lane c); columns past K have zero weights and
 * x = +0, so they add 0*0 as the canonical tail does. reduce8: (l0+l4, .., l3+l7) vertically,
 * then the rest within 128-bit lanes, which leaves rows 0 .. 15 in order; writes the rows of mk
 * (bit j = row j of the block). */
ST_INLINE void tile_packed(float *y, int64_t ldy, const float *wb, const float *x, int64_t ldx,
                           int64_t K, const int T, __mmask16 mk, st_pf pf) {
    __m512 acc[3][4][2];
    ST_UNROLL
    for (int t = 0; t < T; t++)
        ST_UNROLL
    for (int g = 0; g < 4; g++)
        acc[t][g][0] = acc[t][g][1] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= K; i += 8)
        packed_step(acc, wb, x, ldx, i, 8, T, &pf);
    if (i < K)
        packed_step(acc, wb, x, ldx, i, (int)(K - i), T, &pf);
    ST_UNROLL
    for (int t = 0; t < T; t++) {
        __m512 u[4];
        ST_UNROLL
        for (int g = 0; g < 4; g++) /* lanes k + (k+4) of rows 4c + g */
            u[g] = _mm512_add_ps(acc[t][g][0], acc[t][g][1]);
        /* (s0+s2), (s1+s3) of groups 0, 1 and of groups 2, 3 */
        const __m512 w01 =
            _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x44), _mm512_shuffle_ps(u[0], u[1], 0xee));
        const __m512 w23 =
            _mm512_add_ps(_mm512_shuffle_ps(u[2], u[3], 0x44), _mm512_shuffle_ps(u[2], u[3], 0xee));
        /* lane c: rows 4c + 0 .. 4c + 3 */
        const __m512 sum =
            _mm512_add_ps(_mm512_shuffle_ps(w01, w23, 0x88), _mm512_shuffle_ps(w01, w23, 0xdd));
        if (mk == 0xffff)
            _mm512_storeu_ps(y + t * ldy, sum);
        else
            _mm512_mask_storeu_ps(y + t * ldy, mk, sum);
    }
}

/* Block by block, all the tokens three at a time while the block stays in L1 (a single token
 * measured no faster with two blocks per tile: its weights come from L2 or further). */
static void matmul_f32_packed_avx512(float *y, int64_t ldy, const float *wp, const float *x,
                                     int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    const size_t bs = (size_t)((K + 7) & ~7) * 16;
    const int64_t nc = (M + 2) / 3, steps = (K + 7) / 8;
    /* Four tokens or more over a megabyte of weights (not all in L2) prefetch the next block,
     * spread over the token chunks (kernels_avx2.c's st_pf); measured 1.1-1.7x on 4.7 and 37 MB
     * matrices, while it slowed 1 MB ones by up to 13% and fewer tokens gain nothing. */
    const int prefetch = M >= 4 && (r1 - r0) * (int64_t)bs / 4 >= (1 << 20);
    for (int64_t b = r0 / 16; 16 * b < r1; b++) {
        const float *wb = wp + (size_t)b * bs;
        float *yb = y + 16 * b;
        const int64_t lo = r0 > 16 * b ? r0 - 16 * b : 0, hi = r1 < 16 * b + 16 ? r1 - 16 * b : 16;
        const __mmask16 mk = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
        const int64_t ahead = prefetch && 16 * (b + 1) < r1 ? (int64_t)bs * 4 : 0;
        const int64_t seg = (ahead + nc - 1) / nc;
        int64_t m = 0, c = 0;
        for (; m + 3 <= M; m += 3, c++)
            tile_packed(yb + m * ldy, ldy, wb, x + m * ldx, ldx, K, 3, mk,
                        pf_region((const char *)(wb + bs) + c * seg, seg, steps));
        const st_pf pf = pf_region((const char *)(wb + bs) + c * seg, seg, steps);
        if (M - m == 2)
            tile_packed(yb + m * ldy, ldy, wb, x + m * ldx, ldx, K, 2, mk, pf);
        else if (M - m == 1)
            tile_packed(yb + m * ldy, ldy, wb, x + m * ldx, ldx, K, 1, mk, pf);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Quantized matmuls                                                                          */

/* Block b of Q4_0 rows a and b as 64 bytes (the nibbles 0..15 in element order: j < 16 low,
 * j >= 16 high), and their fp16 scales as 8 + 8 floats. */
ST_INLINE __m512i load_q4pair(const char *ra, const char *rbp, int64_t b, __m512 *dw) {
    uint16_t da, db;
    const st_block_q4_0 *pa = (const st_block_q4_0 *)ra + b, *pb = (const st_block_q4_0 *)rbp + b;
    const __m256i raw =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)pa->qs)),
                                _mm_loadu_si128((const __m128i *)pb->qs), 1);
    const __m256i lowmask = _mm256_set1_epi8(0xf);
    const __m256i lo = _mm256_and_si256(raw, lowmask);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lowmask);
    /* [a lo, b lo, a hi, b hi] -> [a lo, a hi, b lo, b hi] */
    const __m512i v = _mm512_shuffle_i64x2(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                                           _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                                           _MM_SHUFFLE(3, 1, 2, 0));
    memcpy(&da, &pa->d, 2);
    memcpy(&db, &pb->d, 2);
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)da)),
                                              _mm_set1_epi16((short)db), 1);
    *dw = _mm512_cvtph_ps(h);
    return v;
}

/* 2P Q4_0 rows x T tokens of the per-lane canonical dot product: nibble * x with the lanes
 * starting at -8 * sum(x). */
ST_INLINE void tile_q4(float *y, int64_t ldy, const char *w, size_t rb, const st_block_q8x *x,
                       int64_t ldx, int64_t nb, const int P, const int T, st_pf pf) {
    __m512 acc[PAIRS_Q * TOK_Q];
    ST_UNROLL
    for (int i = 0; i < P * T; i++)
        acc[i] = _mm512_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t b = 0; b < nb; b++) {
        pf_step(&pf);
        __m512i xv[TOK_Q], xinit[TOK_Q];
        __m512 dx[TOK_Q];
        ST_UNROLL
        for (int t = 0; t < T; t++) {
            const st_block_q8x *xb = x + t * ldx + b;
            xv[t] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xb->q));
            dx[t] = _mm512_set1_ps(xb->d);
            xinit[t] =
                _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(8), xv[t]));
        }
        ST_UNROLL
        for (int p = 0; p < P; p++) {
            __m512 dw;
            const __m512i wv =
                load_q4pair(w + (size_t)(2 * p) * rb, w + (size_t)(2 * p + 1) * rb, b, &dw);
            ST_UNROLL
            for (int t = 0; t < T; t++) {
                const __m512i s = _mm512_dpbusd_epi32(xinit[t], wv, xv[t]);
                acc[p * T + t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, dx[t]),
                                                 acc[p * T + t]);
            }
        }
    }
    store_tile(y, ldy, acc, P, T);
}

static void matmul_q4_0_avx512(float *y, int64_t ldy, const void *w, size_t rb, const void *x,
                               int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    if (M < 1 || r0 >= r1)
        return;
    const st_block_q8x *xq = x;
    const char *wc = w;
    const int64_t nb = K / ST_QK, R = 2 * PAIRS_Q;
    const int64_t nc = (M + TOK_Q - 1) / TOK_Q, blk = R * (int64_t)rb, seg = (blk + nc - 1) / nc;
    int64_t r = r0;
    for (; r + R <= r1; r += R) {
        const char *wr = wc + (size_t)r * rb;
        for (int64_t m = 0, c = 0; m < M; m += TOK_Q, c++) {
            const st_pf pf = M == 1 ? pf_region(wr + ST_PF_BYTES, blk, nb)
                                    : pf_region(wr + blk + c * seg, seg, nb);
            float *ym = y + m * ldy + r;
            const st_block_q8x *xm = xq + m * ldx;
            switch (M - m >= TOK_Q ? TOK_Q : M - m) {
            case 1:
                tile_q4(ym, ldy, wr, rb, xm, ldx, nb, PAIRS_Q, 1, pf);
                break;
            case 2:
                tile_q4(ym, ldy, wr, rb, xm, ldx, nb, PAIRS_Q, 2, pf);
                break;
            case 3:
                tile_q4(ym, ldy, wr, rb, xm, ldx, nb, PAIRS_Q, 3, pf);
                break;
            default:
                tile_q4(ym, ldy, wr, rb, xm, ldx, nb, PAIRS_Q, TOK_Q, pf);
                break;
            }
        }
    }
    if (r < r1)
        st_kernels_avx2_table_get()->matmul_q4_0(y, ldy, w, rb, x, ldx, K, M, r, r1);
}

/* ------------------------------------------------------------------------------------------ */
/* Attention scores                                                                           */

/* Elements 8c .. 8c+7 of the key rows k + j*ldk, j < nr <= 16, as columns: col[i] holds element
 * 8c+i of rows 0 .. 15, zero for rows j >= nr and elements at or past hd. A full block puts
 * rows j, j+4, j+8, j+12 in the four 128-bit lanes of one register and transposes 4x4 within
 * the lanes. */
ST_INLINE void key_cols16(__m512 col[8], const float *k, int64_t ldk, int64_t nr, int64_t hd,
                          int64_t c) {
    const int64_t i0 = 8 * c;
    if (nr == 16 && hd - i0 >= 8) {
        __m512 a[8];
        ST_UNROLL
        for (int j = 0; j < 4; j++)
            ST_UNROLL
        for (int h = 0; h < 2; h++) {
            const float *p = k + j * ldk + i0 + 4 * h;
            __m512 v = _mm512_castps128_ps512(_mm_loadu_ps(p));
            v = _mm512_insertf32x4(v, _mm_loadu_ps(p + 4 * ldk), 1);
            v = _mm512_insertf32x4(v, _mm_loadu_ps(p + 8 * ldk), 2);
            a[4 * h + j] = _mm512_insertf32x4(v, _mm_loadu_ps(p + 12 * ldk), 3);
        }
        ST_UNROLL
        for (int h = 0; h < 8; h += 4) { /* a[h + j]: elements h .. h+3 of rows j + 4*lane */
            const __m512 t0 = _mm512_unpacklo_ps(a[h], a[h + 1]);
            const __m512 t1 = _mm512_unpackhi_ps(a[h], a[h + 1]);
            const __m512 t2 = _mm512_unpacklo_ps(a[h + 2], a[h + 3]);
            const __m512 t3 = _mm512_unpackhi_ps(a[h + 2], a[h + 3]);
            col[h] = _mm512_shuffle_ps(t0, t2, 0x44);
            col[h + 1] = _mm512_shuffle_ps(t0, t2, 0xee);
            col[h + 2] = _mm512_shuffle_ps(t1, t3, 0x44);
            col[h + 3] = _mm512_shuffle_ps(t1, t3, 0xee);
        }
        return;
    }
    const int64_t w = hd - i0 < 8 ? hd - i0 : 8;
    const __mmask8 mk = (__mmask8)((1u << w) - 1);
    __m256 lo[8], hi[8];
    ST_UNROLL
    for (int j = 0; j < 8; j++)
        lo[j] = j < nr ? _mm256_maskz_loadu_ps(mk, k + j * ldk + i0) : _mm256_setzero_ps();
    transpose8(lo);
    if (nr <= 8) { /* rows 8 .. 15 are not stored */
        ST_UNROLL
        for (int i = 0; i < 8; i++)
            col[i] = _mm512_zextps256_ps512(lo[i]);
        return;
    }
    ST_UNROLL
    for (int j = 0; j < 8; j++)
        hi[j] =
            j + 8 < nr ? _mm256_maskz_loadu_ps(mk, k + (j + 8) * ldk + i0) : _mm256_setzero_ps();
    transpose8(hi);
    ST_UNROLL
    for (int i = 0; i < 8; i++)
        col[i] = _mm512_insertf32x8(_mm512_castps256_ps512(lo[i]), hi[i], 1);
}

/* attn_scores for hd <= 8*NC <= 16, sixteen key rows at a time (scores_cols in kernels_avx2.c
 * with 16 lanes): the same canonical lanes per score, three vertical reduce8 steps. */
ST_INLINE void scores_cols16(float *const *sc, const float *const *q, int64_t nq, const float *k,
                             int64_t ldk, int64_t n, int64_t hd, float div, const int NC) {
    const __m512 vdiv = _mm512_set1_ps(div), zero = _mm512_setzero_ps();
    for (int64_t r0 = 0; r0 < n; r0 += 16) {
        const int64_t nr = n - r0 < 16 ? n - r0 : 16;
        __m512 col[16];
        ST_UNROLL
        for (int c = 0; c < NC; c++)
            key_cols16(col + 8 * c, k + r0 * ldk, ldk, nr, hd, c);
        const __mmask16 mk = (__mmask16)((1u << nr) - 1);
        for (int64_t j = 0; j < nq; j++) {
            const float *qj = q[j];
            __m512 acc[8];
            ST_UNROLL
            for (int l = 0; l < 8; l++)
                acc[l] = l < hd ? _mm512_fmadd_ps(_mm512_set1_ps(qj[l]), col[l], zero) : zero;
            ST_UNROLL
            for (int i = 8; i < 8 * NC; i++)
                acc[i & 7] = i < hd ? _mm512_fmadd_ps(_mm512_set1_ps(qj[i]), col[i], acc[i & 7])
                                    : _mm512_add_ps(acc[i & 7], zero);
            const __m512 s = _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6])),
                _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7])));
            _mm512_mask_storeu_ps(sc[j] + r0, mk, _mm512_div_ps(s, vdiv));
        }
    }
}

static void attn_scores_avx512(float *const *sc, const float *const *q, int64_t nq, const float *k,
                               int64_t ldk, int64_t n, int64_t hd, float div) {
    if (hd == 8)
        scores_cols16(sc, q, nq, k, ldk, n, 8, div, 1);
    else if (hd == 16)
        scores_cols16(sc, q, nq, k, ldk, n, 16, div, 2);
    else if (hd < 8)
        scores_cols16(sc, q, nq, k, ldk, n, hd, div, 1);
    else if (hd < 16)
        scores_cols16(sc, q, nq, k, ldk, n, hd, div, 2);
    else
        st_kernels_avx2_table_get()->attn_scores(sc, q, nq, k, ldk, n, hd, div);
}

/* ------------------------------------------------------------------------------------------ */
/* exp and softmax                                                                            */

/* Sixteen lanes of st_expf_ref, operation for operation (exp8 in kernels_avx2.c). */
ST_INLINE __m512 exp16(__m512 x) {
    const __mmask16 lo_ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GT_OQ);
    const __mmask16 isnan_ = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512 xc = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    xc = _mm512_max_ps(xc, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145751953125f), xc);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    const __m512 y = _mm512_maskz_mul_ps(lo_ok, p, _mm512_castsi512_ps(e)); /* x <= -87 -> 0 */
    return _mm512_mask_blend_ps(isnan_, y, x);                              /* NaN stays NaN */
}

/* exp_sum's eight lane sums, sixteen elements per step: element i still goes to lane i mod 8,
 * in increasing i (the low half of a step, then the high half). */
ST_INLINE __m256 exp_lanes16(float *x, int64_t n, float mx) {
    const __m512 vm = _mm512_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 y = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(x + i, y);
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(y));
        acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(y, 1));
    }
    if (i < n) {
        const __mmask16 mk = (__mmask16)((1u << (n - i)) - 1);
        const __m512 y =
            _mm512_maskz_mov_ps(mk, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + i), vm)));
        _mm512_mask_storeu_ps(x + i, mk, y);
        /* +0 in the missing lanes: no lane is ever -0 */
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(y));
        if (n - i > 8)
            acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(y, 1));
    }
    return acc;
}

static float exp_sum_avx512(float *x, int64_t n, float mx) { return hsum8(exp_lanes16(x, n, mx)); }

/* x[i] / sum for i < n. */
ST_INLINE void div16(float *x, int64_t n, float sum) {
    const __m512 vs = _mm512_set1_ps(sum);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_div_ps(_mm512_loadu_ps(x + i), vs));
    if (i < n) {
        const __mmask16 mk = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, mk, _mm512_div_ps(_mm512_maskz_loadu_ps(mk, x + i), vs));
    }
}

/* softmax_rows_avx2 (kernels_avx2.c) with sixteen lanes: R heads side by side in every pass;
 * max_ps keeps the running maximum (its second operand) when the input is NaN; the exp sums
 * keep their canonical lanes. */
ST_INLINE void softmax_rows16(float *x, int64_t n, int64_t ld, float *sums, const int R) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m[4], v[4];
    __m256 acc[4];
    ST_UNROLL
    for (int r = 0; r < R; r++)
        m[r] = ninf;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        ST_UNROLL
    for (int r = 0; r < R; r++)
        m[r] = _mm512_max_ps(_mm512_loadu_ps(x + r * ld + i), m[r]);
    const __mmask16 mk = (__mmask16)((1u << (n - i)) - 1);
    if (i < n)
        ST_UNROLL
    for (int r = 0; r < R; r++)
        m[r] = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, mk, x + r * ld + i), m[r]);
    float mx[4];
    int live = 1;
    ST_UNROLL
    for (int r = 0; r < R; r++) {
        mx[r] = _mm512_reduce_max_ps(m[r]); /* no NaN left: any order gives the maximum */
        live &= mx[r] != -INFINITY;
    }
    if (!live) {
        for (int r = 0; r < R; r++) {
            sums[r] = mx[r] == -INFINITY ? 0.0f : hsum8(exp_lanes16(x + r * ld, n, mx[r]));
            if (sums[r] > 0.0f)
                div16(x + r * ld, n, sums[r]);
        }
        return;
    }
    ST_UNROLL
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
        v[r] = _mm512_set1_ps(mx[r]);
    }
    for (i = 0; i + 16 <= n; i += 16)
        ST_UNROLL
    for (int r = 0; r < R; r++) { /* exp_lanes16, R rows side by side */
        const __m512 y = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + r * ld + i), v[r]));
        _mm512_storeu_ps(x + r * ld + i, y);
        acc[r] = _mm256_add_ps(acc[r], _mm512_castps512_ps256(y));
        acc[r] = _mm256_add_ps(acc[r], _mm512_extractf32x8_ps(y, 1));
    }
    if (i < n)
        ST_UNROLL
    for (int r = 0; r < R; r++) {
        const __m512 y = _mm512_maskz_mov_ps(
            mk, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + r * ld + i), v[r])));
        _mm512_mask_storeu_ps(x + r * ld + i, mk, y);
        acc[r] = _mm256_add_ps(acc[r], _mm512_castps512_ps256(y));
        if (n - i > 8)
            acc[r] = _mm256_add_ps(acc[r], _mm512_extractf32x8_ps(y, 1));
    }
    int pos = 1;
    ST_UNROLL
    for (int r = 0; r < R; r++) {
        sums[r] = hsum8(acc[r]);
        pos &= sums[r] > 0.0f;
        v[r] = _mm512_set1_ps(sums[r]);
    }
    if (!pos) {
        for (int r = 0; r < R; r++)
            if (sums[r] > 0.0f)
                div16(x + r * ld, n, sums[r]);
        return;
    }
    for (i = 0; i + 16 <= n; i += 16)
        ST_UNROLL
    for (int r = 0; r < R; r++)
        _mm512_storeu_ps(x + r * ld + i, _mm512_div_ps(_mm512_loadu_ps(x + r * ld + i), v[r]));
    if (i < n)
        ST_UNROLL
    for (int r = 0; r < R; r++)
        _mm512_mask_storeu_ps(x + r * ld + i, mk,
                              _mm512_div_ps(_mm512_maskz_loadu_ps(mk, x + r * ld + i), v[r]));
}

static void softmax_avx512(float *x, int64_t n, int64_t rows, int64_t ld, float *sums) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
        softmax_rows16(x + r * ld, n, ld, sums + r, 4);
    if (rows - r >= 2) {
        softmax_rows16(x + r * ld, n, ld, sums + r, 2);
        r += 2;
    }
    if (r < rows)
        softmax_rows16(x + r * ld, n, ld, sums + r, 1);
}

static st_kernels st_kernels_avx512_table;

static void table_init(void) {
    st_kernels_avx512_table = *st_kernels_avx2_table_get();
    st_kernels_avx512_table.name = "avx512";
    st_kernels_avx512_table.matmul_f32 = matmul_f32_avx512;
    st_kernels_avx512_table.matmul_f16 = matmul_f16_avx512;
    st_kernels_avx512_table.matmul_bf16 = matmul_bf16_avx512;
    st_kernels_avx512_table.matmul_q4_0 = matmul_q4_0_avx512;
    st_kernels_avx512_table.matmul_q2_k = st_matmul_q2_k_avx512;
    st_kernels_avx512_table.matmul_q3_k = st_matmul_q3_k_avx512;
    st_kernels_avx512_table.matmul_q4_k = st_matmul_q4_k_avx512;
    st_kernels_avx512_table.matmul_q5_k = st_matmul_q5_k_avx512;
    st_kernels_avx512_table.matmul_q6_k = st_matmul_q6_k_avx512;
    st_kernels_avx512_table.matmul_f32_packed = matmul_f32_packed_avx512;
    /* Q8_0 row-major stays the AVX2 kernel (the per-block order); packed weights take AMX/VNNI */
    st_kernels_avx512_table.matmul_q8_0_packed = st_matmul_q8_0_packed_avx512;
    st_kernels_avx512_table.matmul_q4_0_packed = st_matmul_q4_0_packed_avx512;
    st_kernels_avx512_table.matmul_q4_k_packed = st_matmul_q4_k_packed_avx512;
    st_kernels_avx512_table.matmul_q5_k_packed = st_matmul_q5_k_packed_avx512;
    st_kernels_avx512_table.matmul_q6_k_packed = st_matmul_q6_k_packed_avx512;
    st_kernels_avx512_table.attn_scores = attn_scores_avx512;
    st_kernels_avx512_table.exp_sum = exp_sum_avx512;
    st_kernels_avx512_table.softmax = softmax_avx512;
}

#include <pthread.h>

const st_kernels *st_kernels_avx512_table_get(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, table_init);
    return &st_kernels_avx512_table;
}
