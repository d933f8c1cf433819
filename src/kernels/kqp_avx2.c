/*
 * kqp_avx2.c: the AVX2 table's Q4_K, Q5_K and Q6_K matmuls on packed weights (st_pack_kq,
 * kquant.h),
 * bitwise the canonical K-quant dot product. A 32-byte load of a group-block holds four quant
 * bytes of each of eight rows, so vpmaddubsw against a broadcast dword of a token's block
 * leaves each row's partial sums in its own lane: the eight rows' exact S_b and M_b end in the
 * lanes of two vectors with no horizontal reduction, and the float step is one vector chain
 * per token and eight rows. The quants' products are small enough to add in 16 bits before
 * the scale multiply (Q4_K: eight steps of at most 2 * 15 * 127; Q5_K: four of 2 * 31 * 127;
 * Q6_K: two of 2 * 63 * 127), so
 * a sub-block costs one vpmaddwd per token and eight rows. Tokens go in tiles of KQP_TT: each
 * weight byte is loaded from memory once per pass and unpacked once per tile.
 */
#include "kernels/kernels.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <string.h>

/* Tokens per tile. */
enum { KQP_TT = 3 };

ST_INLINE __m256i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* The 8 rows' (s, s) pairs of 16-bit scales of one sub-block from their 8 bytes (low or high
 * half of v), unsigned or signed. */
ST_INLINE __m256i pairs_u8(__m128i v, int hi) {
    return _mm256_cvtepu8_epi16(hi ? _mm_unpackhi_epi8(v, v) : _mm_unpacklo_epi8(v, v));
}

/* ---------------------------------------------------------------------------------------- */
/* Q4_K: 1152-byte group-blocks                                                              */

enum { Q4KP_BYTES = ST_KQP_ROWS * (int)sizeof(st_block_q4_k) };

/* The fifth bit of a Q5_K quant: bit `bit` of each byte moved to bit 4 (16-bit shifts; the mask
 * keeps each byte's own bit). */
ST_INLINE __m256i q5_bit(__m256i h, int bit) {
    const __m256i m = _mm256_set1_epi8(0x10);
    return _mm256_and_si256(
        bit <= 4 ? _mm256_slli_epi16(h, 4 - bit) : _mm256_srli_epi16(h, bit - 4), m);
}

/* Q4_K, and with q5 Q5_K (its fifth bits in 8 vectors after the scales, the quants after them;
 * products up to 2 * 31 * 127, so 16-bit sums of four steps). */
ST_INLINE void k4_tile(float *y, int64_t ldy, const uint8_t *gp, int64_t nb, const st_block_q8k *x,
                       int64_t ldx, const int T, st_pf pf, const int q5) {
    const int GB = q5 ? ST_KQP_ROWS * (int)sizeof(st_block_q5_k) : Q4KP_BYTES;
    const int QO = q5 ? 384 : 128;
    ST_UNROLL
    for (int t = 0; t < T; t++)
        _mm256_storeu_ps(y + t * ldy, _mm256_setzero_ps());
    const __m256i m4 = _mm256_set1_epi8(0xf), ones = _mm256_set1_epi16(1);
    const __m256 neg = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = gp + (size_t)b * GB;
        pf_step(&pf);
        __m128i sc[4], mn[4]; /* sc[i]: sub-blocks 2i (low 8 bytes) and 2i + 1 */
        st_k4_scales(p, sc, mn);
        __m256i Sv[KQP_TT];
        ST_UNROLL
        for (int t = 0; t < T; t++)
            Sv[t] = _mm256_setzero_si256();
        ST_UNROLL
        for (int c = 0; c < 4; c++) {
            __m256i lo[KQP_TT], hi[KQP_TT];
            /* sub-blocks 2c (low nibbles) and 2c + 1 (high) */
            const __m256i sl = pairs_u8(sc[c], 0), sh = pairs_u8(sc[c], 1);
            for (int half = 0; half < (q5 ? 2 : 1); half++) {
                ST_UNROLL
                for (int t = 0; t < T; t++)
                    lo[t] = hi[t] = _mm256_setzero_si256();
                const int k0 = q5 ? 4 * half : 0, k1 = q5 ? k0 + 4 : 8;
                _Pragma("GCC unroll 2") for (int k = k0; k < k1; k++) {
                    const __m256i v =
                        _mm256_loadu_si256((const __m256i *)(p + QO + 32 * (8 * c + k)));
                    __m256i ql = _mm256_and_si256(v, m4);
                    __m256i qh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if (q5) {
                        const __m256i h = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * k));
                        ql = _mm256_or_si256(ql, q5_bit(h, 2 * c));
                        qh = _mm256_or_si256(qh, q5_bit(h, 2 * c + 1));
                    }
                    ST_UNROLL
                    for (int t = 0; t < T; t++) {
                        const int8_t *xq = x[t * ldx + b].q + 64 * c + 4 * k;
                        lo[t] = _mm256_add_epi16(lo[t], _mm256_maddubs_epi16(ql, bcast32(xq)));
                        hi[t] = _mm256_add_epi16(hi[t], _mm256_maddubs_epi16(qh, bcast32(xq + 32)));
                    }
                }
                ST_UNROLL
                for (int t = 0; t < T; t++)
                    Sv[t] = _mm256_add_epi32(Sv[t], _mm256_add_epi32(_mm256_madd_epi16(lo[t], sl),
                                                                     _mm256_madd_epi16(hi[t], sh)));
            }
        }
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        const __m256 dmv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
        ST_UNROLL
        for (int t = 0; t < T; t++) {
            const st_block_q8k *xb = x + t * ldx + b;
            /* M_b: the mins times the sums of x over each 32 elements */
            const __m256i xs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums),
                                                 ones);    /* xs_j, j = 0 .. 7 */
            const __m256i xp = _mm256_packs_epi32(xs, xs); /* 16-bit: dword 0 (xs0, xs1), 1, 4, 5 */
            __m256i Mv = _mm256_setzero_si256();
            ST_UNROLL
            for (int q = 0; q < 4; q++) {
                const __m256i mp =
                    _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn[q], _mm_srli_si128(mn[q], 8)));
                const int idx = q < 2 ? q : q + 2;
                Mv = _mm256_add_epi32(Mv, _mm256_madd_epi16(mp, _mm256_permutevar8x32_epi32(
                                                                    xp, _mm256_set1_epi32(idx))));
            }
            const __m256 xd = _mm256_set1_ps(xb->d);
            float *yt = y + t * ldy;
            __m256 acc = _mm256_fmadd_ps(_mm256_mul_ps(dv, xd), _mm256_cvtepi32_ps(Sv[t]),
                                         _mm256_loadu_ps(yt));
            acc = _mm256_fmadd_ps(_mm256_xor_ps(_mm256_mul_ps(dmv, xd), neg),
                                  _mm256_cvtepi32_ps(Mv), acc);
            _mm256_storeu_ps(yt, acc);
        }
    }
}

ST_INLINE void q4k_tile(float *y, int64_t ldy, const uint8_t *gp, int64_t nb, const st_block_q8k *x,
                        int64_t ldx, const int T, st_pf pf) {
    k4_tile(y, ldy, gp, nb, x, ldx, T, pf, 0);
}

ST_INLINE void q5k_tile(float *y, int64_t ldy, const uint8_t *gp, int64_t nb, const st_block_q8k *x,
                        int64_t ldx, const int T, st_pf pf) {
    k4_tile(y, ldy, gp, nb, x, ldx, T, pf, 1);
}

/* ---------------------------------------------------------------------------------------- */
/* Q6_K: 1680-byte group-blocks                                                              */

enum { Q6KP_BYTES = ST_KQP_ROWS * (int)sizeof(st_block_q6_k) };

ST_INLINE void q6k_tile(float *y, int64_t ldy, const uint8_t *gp, int64_t nb, const st_block_q8k *x,
                        int64_t ldx, const int T, st_pf pf) {
    ST_UNROLL
    for (int t = 0; t < T; t++)
        _mm256_storeu_ps(y + t * ldy, _mm256_setzero_ps());
    const __m256i m4 = _mm256_set1_epi8(0xf), m30 = _mm256_set1_epi8(0x30);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = gp + (size_t)b * Q6KP_BYTES;
        pf_step(&pf);
        __m256i Sv[KQP_TT];
        ST_UNROLL
        for (int t = 0; t < T; t++)
            Sv[t] = _mm256_setzero_si256();
        ST_UNROLL
        for (int h = 0; h < 2; h++)
            ST_UNROLL
        for (int s = 0; s < 4; s++) {
            const uint8_t *ql = p + 144 + 32 * (16 * h + 8 * (s % 2));
            const uint8_t *qh = p + 1168 + 32 * (8 * h);
            /* sub-blocks 8h + 2s (k < 4) and 8h + 2s + 1 */
            const __m128i s8 = _mm_loadu_si128((const __m128i *)(p + 16 + 8 * (8 * h + 2 * s)));
            _Pragma("GCC unroll 1") for (int kp = 0; kp < 4; kp++) {
                const __m256i scv = _mm256_cvtepi8_epi16(kp < 2 ? _mm_unpacklo_epi8(s8, s8)
                                                                : _mm_unpackhi_epi8(s8, s8));
                __m256i q[2];
                ST_UNROLL
                for (int e = 0; e < 2; e++) {
                    const int k = 2 * kp + e;
                    const __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * k));
                    const __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + 32 * k));
                    const __m256i lq = s < 2 ? _mm256_and_si256(l, m4)
                                             : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                    const __m256i hq = s == 0   ? _mm256_slli_epi16(hb, 4)
                                       : s == 1 ? _mm256_slli_epi16(hb, 2)
                                       : s == 2 ? hb
                                                : _mm256_srli_epi16(hb, 2);
                    q[e] = _mm256_or_si256(lq, _mm256_and_si256(hq, m30));
                }
                ST_UNROLL
                for (int t = 0; t < T; t++) {
                    const int8_t *xq = x[t * ldx + b].q + 128 * h + 32 * s + 8 * kp;
                    const __m256i pr =
                        _mm256_add_epi16(_mm256_maddubs_epi16(q[0], bcast32(xq)),
                                         _mm256_maddubs_epi16(q[1], bcast32(xq + 4)));
                    Sv[t] = _mm256_add_epi32(Sv[t], _mm256_madd_epi16(pr, scv));
                }
            }
        }
        /* t_b = sum_j 32 s_j bsum_j: pairs of sub-blocks' (32 s) against pairs of sums */
        __m256i bz[8];
        ST_UNROLL
        for (int q = 0; q < 8; q++) {
            const __m128i s8 = _mm_loadl_epi64((const __m128i *)(p + 16 + 16 * q));
            const __m128i s9 = _mm_loadl_epi64((const __m128i *)(p + 24 + 16 * q));
            bz[q] = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s8, s9)), 5);
        }
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        ST_UNROLL
        for (int t = 0; t < T; t++) {
            const st_block_q8k *xb = x + t * ldx + b;
            __m256i tv = _mm256_setzero_si256();
            ST_UNROLL
            for (int q = 0; q < 8; q++)
                tv = _mm256_add_epi32(tv, _mm256_madd_epi16(bz[q], bcast32(xb->bsums + 2 * q)));
            float *yt = y + t * ldy;
            _mm256_storeu_ps(yt, _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_set1_ps(xb->d)),
                                                 _mm256_cvtepi32_ps(_mm256_sub_epi32(Sv[t], tv)),
                                                 _mm256_loadu_ps(yt)));
        }
    }
}

/* ---------------------------------------------------------------------------------------- */

typedef void (*tile_fn)(float *, int64_t, const uint8_t *, int64_t, const st_block_q8k *, int64_t,
                        int, st_pf);

#define KQP_DRIVER(name, tile, type)                                                               \
    static void name##_tile_any(float *y, int64_t ldy, const uint8_t *gp, int64_t nb,              \
                                const st_block_q8k *x, int64_t ldx, int T, st_pf pf) {             \
        if (T == 3)                                                                                \
            tile(y, ldy, gp, nb, x, ldx, 3, pf);                                                   \
        else if (T == 2)                                                                           \
            tile(y, ldy, gp, nb, x, ldx, 2, pf);                                                   \
        else                                                                                       \
            tile(y, ldy, gp, nb, x, ldx, 1, pf);                                                   \
    }                                                                                              \
    void st_matmul_##name##_packed_avx2(float *y, int64_t ldy, const void *wp, size_t rb,          \
                                        int64_t rows, const void *x, int64_t ldx, int64_t K,       \
                                        int64_t M, int64_t r0, int64_t r1) {                       \
        kqp_matmul(name##_tile_any, type, y, ldy, wp, rb, rows, x, ldx, K, M, r0, r1);             \
    }

/* Whole groups in token tiles; parts of groups through a scratch tile; rows past the last
 * group row-major (the AVX2 row-major kernel, same arithmetic). */
static void kqp_matmul(tile_fn tile, uint32_t type, float *y, int64_t ldy, const void *wp,
                       size_t rb, int64_t rows, const void *x, int64_t ldx, int64_t K, int64_t M,
                       int64_t r0, int64_t r1) {
    if (M < 1 || r0 >= r1)
        return;
    const int64_t nb = K / ST_QK_K, G = ST_KQP_ROWS, rfull = rows / G * G;
    const st_block_q8k *xq = x;
    const uint8_t *w = wp;
    const size_t gstride = (size_t)G * rb;
    const int64_t re = r1 < rfull ? r1 : rfull;
    for (int64_t r = r0; r < re;) {
        const int64_t g = r / G, n0 = r - g * G, e = (g + 1) * G < re ? (g + 1) * G : re;
        const uint8_t *gp = w + (size_t)g * gstride;
        if (n0 == 0 && e == (g + 1) * G) {
            /* the tiles bring in the next group, each its share spread over its blocks (as
             * q8p_avx2.c) */
            const int64_t nx = re - e < G ? re - e : G, bytes = nx > 0 ? nx * (int64_t)rb : 0;
            const int64_t nt = (M + KQP_TT - 1) / KQP_TT, share = (bytes + nt - 1) / nt;
            for (int64_t m = 0, i = 0; m < M; m += KQP_TT, i++) {
                const int64_t left = bytes - i * share, sb = left < share ? left : share;
                tile(y + m * ldy + r, ldy, gp, nb, xq + m * ldx, ldx,
                     (int)(M - m < KQP_TT ? M - m : KQP_TT),
                     pf_region((const char *)(gp + gstride) + i * share, sb, nb));
            }
        } else {
            for (int64_t m = 0; m < M; m++) {
                float tmp[ST_KQP_ROWS];
                tile(tmp, 0, gp, nb, xq + m * ldx, ldx, 1, pf_region(NULL, 0, 1));
                memcpy(y + m * ldy + r, tmp + n0, (size_t)(e - r) * sizeof(float));
            }
        }
        r = e;
    }
    const int64_t rt = r0 > rfull ? r0 : rfull;
    if (r1 > rt) {
        if (type == ST_DTYPE_Q4_K)
            st_matmul_q4_k_avx2(y, ldy, wp, rb, x, ldx, K, M, rt, r1);
        else if (type == ST_DTYPE_Q5_K)
            st_matmul_q5_k_avx2(y, ldy, wp, rb, x, ldx, K, M, rt, r1);
        else
            st_matmul_q6_k_avx2(y, ldy, wp, rb, x, ldx, K, M, rt, r1);
    }
}

KQP_DRIVER(q4_k, q4k_tile, ST_DTYPE_Q4_K)
KQP_DRIVER(q5_k, q5k_tile, ST_DTYPE_Q5_K)
KQP_DRIVER(q6_k, q6k_tile, ST_DTYPE_Q6_K)
