/*
 * kqp_avx512.c: the AVX-512 table's Q4_K, Q5_K and Q6_K matmuls on packed weights (st_pack_kq,
 * kquant.h), bitwise the canonical K-quant dot product. Two neighbouring groups of eight rows
 * make one 16-row tile: a 64-byte vector holds four quant bytes of each of the 16 rows (the
 * first group's 32 bytes, the second's merged into the high half by a masked load), so
 * vpdpbusd of the unsigned quants against a signed dword of a token's block broadcast from
 * memory leaves each row's exact sum of four products in its own lane. A sub-block's sum
 * (Q4_K, Q5_K: 32 elements, at most 32 * 31 * 127; Q6_K: 16, at most 16 * 63 * 127) takes one
 * vpmulld by the rows' scales, so the integer work is one vpdpbusd per 64 multiply-adds and
 * two instructions per sub-block and token; the mins (Q4_K, Q5_K) and Q6_K's offsets go through
 * vpdpwssd with pairs of scales against pairs of the token's sums. The float step is the shared
 * canonical one per super-block: one vector chain per token and 16 rows. Tokens go in tiles of
 * KQP_TT, each weight byte loaded from memory once per pass and unpacked once per tile.
 * Ranges that do not cover two whole groups (a leading part of a group, a last odd group, the
 * rows past the last group) go to the AVX2 packed kernel: the same arithmetic.
 * The file is compiled for the ISA (CMakeLists.txt: *_avx512.c).
 */
#include "kernels/kernels.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <string.h>

/* Tokens per tile (registers: per token two sub-block chains, the block's sum and the float
 * chain). */
enum { KQP_TT = 4 };

typedef int32_t i32u __attribute__((may_alias, aligned(1)));

/* s + the four products of u's bytes (unsigned) by *x's (signed) in each lane, *x broadcast by
 * the instruction itself. */
ST_INLINE __m512i dpbusd_bcast(__m512i s, __m512i u, const void *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(s) : "v"(u), "m"(*(const i32u *)x));
    return s;
}

/* s + the two products of u's 16-bit pairs by *x's in each lane, *x broadcast. */
ST_INLINE __m512i dpwssd_bcast(__m512i s, __m512i u, const void *x) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(s) : "v"(u), "m"(*(const i32u *)x));
    return s;
}

/* 32 bytes of the first group at p (rows 0 .. 7) and the same 32 bytes of the second, gs bytes
 * on (rows 8 .. 15): the masked-off low half of the second load is never accessed. */
ST_INLINE __m512i ld16(const uint8_t *p, size_t gs) {
    return _mm512_mask_loadu_epi32(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                                   0xff00, p + gs - 32);
}

/* 16 bytes at p and at p + gs as one 256-bit vector (the two groups' fp16 scales). */
ST_INLINE __m256i ld16x2(const uint8_t *p, size_t gs) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                                   _mm_loadu_si128((const __m128i *)(p + gs)), 1);
}

/* ---------------------------------------------------------------------------------------- */
/* Q4_K and Q5_K                                                                             */

/* Bit `bit` of each byte of h moved to bit 4 (Q5_K's fifth bit). */
ST_INLINE __m512i q5_bit(__m512i h, int bit) {
    const __m512i m = _mm512_set1_epi8(0x10);
    return _mm512_and_si512(bit <= 4 ? _mm512_slli_epi16(h, (unsigned)(4 - bit))
                                     : _mm512_srli_epi16(h, (unsigned)(bit - 4)),
                            m);
}

/* 16 rows (groups at gp and gp + gs) x T tokens, all super-blocks; y[t*ldy + n], n < 16. */
ST_INLINE void k4_tile(float *y, int64_t ldy, const uint8_t *gp, size_t gs, int64_t nb,
                       const st_block_q8k *x, int64_t ldx, const int T, st_pf pf, const int q5) {
    const int GB = ST_KQP_ROWS * (int)(q5 ? sizeof(st_block_q5_k) : sizeof(st_block_q4_k));
    const int QO = q5 ? 384 : 128;
    const __m512i m4 = _mm512_set1_epi8(0xf);
    const __m512 neg = _mm512_set1_ps(-0.0f);
    const __m256i ones = _mm256_set1_epi16(1);
    __m512 acc[KQP_TT];
    ST_UNROLL
    for (int t = 0; t < T; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = gp + (size_t)b * GB;
        pf_step(&pf);
        __m128i sc0[4], mn0[4], sc1[4], mn1[4];
        st_k4_scales(p, sc0, mn0);
        st_k4_scales(p + gs, sc1, mn1);
        __m512i S[KQP_TT];
        ST_UNROLL
        for (int t = 0; t < T; t++)
            S[t] = _mm512_setzero_si512();
        ST_UNROLL
        for (int c = 0; c < 4; c++) { /* sub-blocks 2c (low nibbles) and 2c + 1 (high) */
            __m512i Dl[KQP_TT], Dh[KQP_TT];
            ST_UNROLL
            for (int t = 0; t < T; t++)
                Dl[t] = Dh[t] = _mm512_setzero_si512();
            _Pragma("GCC unroll 2") for (int k = 0; k < 8; k++) {
                const __m512i v = ld16(p + QO + 32 * (8 * c + k), gs);
                __m512i ql = _mm512_and_si512(v, m4);
                __m512i qh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (q5) {
                    const __m512i h = ld16(p + 128 + 32 * k, gs);
                    ql = _mm512_or_si512(ql, q5_bit(h, 2 * c));
                    qh = _mm512_or_si512(qh, q5_bit(h, 2 * c + 1));
                }
                ST_UNROLL
                for (int t = 0; t < T; t++) {
                    const int8_t *xq = x[t * ldx + b].q + 64 * c + 4 * k;
                    Dl[t] = dpbusd_bcast(Dl[t], ql, xq);
                    Dh[t] = dpbusd_bcast(Dh[t], qh, xq + 32);
                }
            }
            const __m512i sl = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(sc0[c], sc1[c]));
            const __m512i sh = _mm512_cvtepu8_epi32(_mm_unpackhi_epi64(sc0[c], sc1[c]));
            ST_UNROLL
            for (int t = 0; t < T; t++)
                S[t] = _mm512_add_epi32(S[t], _mm512_add_epi32(_mm512_mullo_epi32(Dl[t], sl),
                                                               _mm512_mullo_epi32(Dh[t], sh)));
        }
        /* M_b = sum_j m_j xs_j: the rows' (m_2q, m_2q+1) pairs against the token's pairs of
         * sums over 32 elements */
        __m512i mp[4];
        ST_UNROLL
        for (int q = 0; q < 4; q++) {
            const __m128i lo = _mm_unpacklo_epi64(mn0[q], mn1[q]); /* m_2q, rows 0 .. 15 */
            const __m128i hi = _mm_unpackhi_epi64(mn0[q], mn1[q]); /* m_2q+1 */
            mp[q] = _mm512_cvtepu8_epi16(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_unpacklo_epi8(lo, hi)), _mm_unpackhi_epi8(lo, hi), 1));
        }
        const __m512 dv = _mm512_cvtph_ps(ld16x2(p, gs));
        const __m512 dmv = _mm512_cvtph_ps(ld16x2(p + 16, gs));
        ST_UNROLL
        for (int t = 0; t < T; t++) {
            const st_block_q8k *xb = x + t * ldx + b;
            const __m256i xs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums),
                                                 ones); /* xs_j, j = 0 .. 7 */
            _Alignas(16) int16_t xp[8];                 /* |xs_j| <= 32 * 127: 16 bits */
            _mm_store_si128((__m128i *)xp, _mm_packs_epi32(_mm256_castsi256_si128(xs),
                                                           _mm256_extracti128_si256(xs, 1)));
            __m512i Mv = _mm512_setzero_si512();
            ST_UNROLL
            for (int q = 0; q < 4; q++)
                Mv = dpwssd_bcast(Mv, mp[q], xp + 2 * q);
            const __m512 xd = _mm512_set1_ps(xb->d);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dv, xd), _mm512_cvtepi32_ps(S[t]), acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_xor_ps(_mm512_mul_ps(dmv, xd), neg),
                                     _mm512_cvtepi32_ps(Mv), acc[t]);
        }
    }
    ST_UNROLL
    for (int t = 0; t < T; t++)
        _mm512_storeu_ps(y + t * ldy, acc[t]);
}

ST_INLINE void q4k_tile(float *y, int64_t ldy, const uint8_t *gp, size_t gs, int64_t nb,
                        const st_block_q8k *x, int64_t ldx, const int T, st_pf pf) {
    k4_tile(y, ldy, gp, gs, nb, x, ldx, T, pf, 0);
}

ST_INLINE void q5k_tile(float *y, int64_t ldy, const uint8_t *gp, size_t gs, int64_t nb,
                        const st_block_q8k *x, int64_t ldx, const int T, st_pf pf) {
    k4_tile(y, ldy, gp, gs, nb, x, ldx, T, pf, 1);
}

/* ---------------------------------------------------------------------------------------- */
/* Q6_K                                                                                      */

ST_INLINE void q6k_tile(float *y, int64_t ldy, const uint8_t *gp, size_t gs, int64_t nb,
                        const st_block_q8k *x, int64_t ldx, const int T, st_pf pf) {
    const int GB = ST_KQP_ROWS * (int)sizeof(st_block_q6_k);
    const __m512i m4 = _mm512_set1_epi8(0xf), m63 = _mm512_set1_epi8(0x3f);
    __m512 acc[KQP_TT];
    ST_UNROLL
    for (int t = 0; t < T; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = gp + (size_t)b * GB;
        pf_step(&pf);
        __m512i S[KQP_TT];
        ST_UNROLL
        for (int t = 0; t < T; t++)
            S[t] = _mm512_setzero_si512();
        ST_UNROLL
        for (int h = 0; h < 2; h++)
            ST_UNROLL
        for (int half = 0; half < 2; half++) {
            /* elements 128h + 32s + 16 half + 4kk + e, s = 0 .. 3: sub-blocks 8h + 2s + half;
             * each ql vector serves s and s + 2 (its two nibbles), each qh vector all four s */
            __m512i D[4][KQP_TT];
            ST_UNROLL
            for (int s = 0; s < 4; s++)
                ST_UNROLL
            for (int t = 0; t < T; t++)
                D[s][t] = _mm512_setzero_si512();
            _Pragma("GCC unroll 1") for (int kk = 0; kk < 4; kk++) {
                const int k = 4 * half + kk;
                const __m512i l0 = ld16(p + 144 + 32 * (16 * h + k), gs);
                const __m512i l1 = ld16(p + 144 + 32 * (16 * h + 8 + k), gs);
                const __m512i hb = ld16(p + 1168 + 32 * (8 * h + k), gs);
                ST_UNROLL
                for (int s = 0; s < 4; s++) {
                    const __m512i l = s % 2 ? l1 : l0;
                    const __m512i lq = s < 2 ? l : _mm512_srli_epi16(l, 4);
                    const __m512i hq = s == 0   ? _mm512_slli_epi16(hb, 4)
                                       : s == 1 ? _mm512_slli_epi16(hb, 2)
                                       : s == 2 ? hb
                                                : _mm512_srli_epi16(hb, 2);
                    /* (lq & 0x0f) | (hq & 0x30): bits 0-3 from lq, 4-5 from hq (0xe4: c ? a :
                     * b), then the two top bits cleared */
                    const __m512i q =
                        _mm512_and_si512(_mm512_ternarylogic_epi32(lq, hq, m4, 0xe4), m63);
                    ST_UNROLL
                    for (int t = 0; t < T; t++)
                        D[s][t] = dpbusd_bcast(
                            D[s][t], q, x[t * ldx + b].q + 128 * h + 32 * s + 16 * half + 4 * kk);
                }
            }
            ST_UNROLL
            for (int s = 0; s < 4; s++) {
                const int j = 8 * h + 2 * s + half;
                const __m512i sc = _mm512_cvtepi8_epi32(
                    _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(p + 16 + 8 * j)),
                                       _mm_loadl_epi64((const __m128i *)(p + gs + 16 + 8 * j))));
                ST_UNROLL
                for (int t = 0; t < T; t++)
                    S[t] = _mm512_add_epi32(S[t], _mm512_mullo_epi32(D[s][t], sc));
            }
        }
        /* t_b = sum_j 32 s_j bsum_j: pairs of the rows' (32 s) against pairs of sums */
        __m512i tv[KQP_TT];
        ST_UNROLL
        for (int t = 0; t < T; t++)
            tv[t] = _mm512_setzero_si512();
        ST_UNROLL
        for (int q = 0; q < 8; q++) {
            const __m128i A = _mm_loadu_si128((const __m128i *)(p + 16 + 16 * q));
            const __m128i B = _mm_loadu_si128((const __m128i *)(p + gs + 16 + 16 * q));
            const __m512i bz = _mm512_slli_epi16(
                _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_unpacklo_epi8(A, _mm_srli_si128(A, 8))),
                    _mm_unpacklo_epi8(B, _mm_srli_si128(B, 8)), 1)),
                5);
            ST_UNROLL
            for (int t = 0; t < T; t++)
                tv[t] = dpwssd_bcast(tv[t], bz, x[t * ldx + b].bsums + 2 * q);
        }
        const __m512 dv = _mm512_cvtph_ps(ld16x2(p, gs));
        ST_UNROLL
        for (int t = 0; t < T; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(x[t * ldx + b].d)),
                                     _mm512_cvtepi32_ps(_mm512_sub_epi32(S[t], tv[t])), acc[t]);
    }
    ST_UNROLL
    for (int t = 0; t < T; t++)
        _mm512_storeu_ps(y + t * ldy, acc[t]);
}

/* ---------------------------------------------------------------------------------------- */

typedef void (*tile_fn)(float *, int64_t, const uint8_t *, size_t, int64_t, const st_block_q8k *,
                        int64_t, int, st_pf);

/* Pairs of whole groups in token tiles (each tile prefetching its share of the next pair, as
 * q8p_avx2.c); every other row through the AVX2 packed kernel. */
static void kqp_matmul(tile_fn tile, st_matmul_q8p_fn avx2, float *y, int64_t ldy, const void *wp,
                       size_t rb, int64_t rows, const void *x, int64_t ldx, int64_t K, int64_t M,
                       int64_t r0, int64_t r1) {
    if (M < 1 || r0 >= r1)
        return;
    const int64_t G = ST_KQP_ROWS, nb = K / ST_QK_K, rfull = rows / G * G;
    const int64_t re = r1 < rfull ? r1 : rfull, a = (r0 + G - 1) / G * G;
    const int64_t e = re > a ? a + (re - a) / (2 * G) * (2 * G) : a;
    if (a >= e) {
        avx2(y, ldy, wp, rb, rows, x, ldx, K, M, r0, r1);
        return;
    }
    if (r0 < a)
        avx2(y, ldy, wp, rb, rows, x, ldx, K, M, r0, a);
    const st_block_q8k *xq = x;
    const size_t gs = (size_t)G * rb;
    const int64_t nt = (M + KQP_TT - 1) / KQP_TT;
    for (int64_t r = a; r < e; r += 2 * G) {
        const uint8_t *gp = (const uint8_t *)wp + (size_t)(r / G) * gs;
        const int64_t bytes = r + 2 * G < e ? 2 * (int64_t)gs : 0, share = (bytes + nt - 1) / nt;
        for (int64_t m = 0, i = 0; m < M; m += KQP_TT, i++) {
            const int64_t left = bytes - i * share, sb = left < share ? left : share;
            tile(y + m * ldy + r, ldy, gp, gs, nb, xq + m * ldx, ldx,
                 (int)(M - m < KQP_TT ? M - m : KQP_TT),
                 pf_region((const char *)(gp + 2 * gs) + i * share, sb, nb));
        }
    }
    if (e < r1)
        avx2(y, ldy, wp, rb, rows, x, ldx, K, M, e, r1);
}

/* Tile widths up to KQP_TT (a constant in each instantiation). */
#define KQP_T(n) ((n) < KQP_TT ? (n) : KQP_TT)
#define KQP_DRIVER(name, tile)                                                                     \
    static void name##_tile_any(float *y, int64_t ldy, const uint8_t *gp, size_t gs, int64_t nb,   \
                                const st_block_q8k *x, int64_t ldx, int T, st_pf pf) {             \
        switch (T) {                                                                               \
        case 1:                                                                                    \
            tile(y, ldy, gp, gs, nb, x, ldx, 1, pf);                                               \
            break;                                                                                 \
        case 2:                                                                                    \
            tile(y, ldy, gp, gs, nb, x, ldx, KQP_T(2), pf);                                        \
            break;                                                                                 \
        case 3:                                                                                    \
            tile(y, ldy, gp, gs, nb, x, ldx, KQP_T(3), pf);                                        \
            break;                                                                                 \
        case 4:                                                                                    \
            tile(y, ldy, gp, gs, nb, x, ldx, KQP_T(4), pf);                                        \
            break;                                                                                 \
        case 5:                                                                                    \
            tile(y, ldy, gp, gs, nb, x, ldx, KQP_T(5), pf);                                        \
            break;                                                                                 \
        case 6:                                                                                    \
            tile(y, ldy, gp, gs, nb, x, ldx, KQP_T(6), pf);                                        \
            break;                                                                                 \
        case 7:                                                                                    \
            tile(y, ldy, gp, gs, nb, x, ldx, KQP_T(7), pf);                                        \
            break;                                                                                 \
        default:                                                                                   \
            tile(y, ldy, gp, gs, nb, x, ldx, KQP_TT, pf);                                          \
            break;                                                                                 \
        }                                                                                          \
    }                                                                                              \
    void st_matmul_##name##_packed_avx512(float *y, int64_t ldy, const void *wp, size_t rb,        \
                                          int64_t rows, const void *x, int64_t ldx, int64_t K,     \
                                          int64_t M, int64_t r0, int64_t r1) {                     \
        kqp_matmul(name##_tile_any, st_matmul_##name##_packed_avx2, y, ldy, wp, rb, rows, x, ldx,  \
                   K, M, r0, r1);                                                                  \
    }

KQP_DRIVER(q4_k, q4k_tile)
KQP_DRIVER(q5_k, q5k_tile)
KQP_DRIVER(q6_k, q6k_tile)
