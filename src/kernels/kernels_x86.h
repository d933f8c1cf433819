/*
 * kernels_x86.h: helpers shared by the AVX2 and AVX-512 kernel files (each compiled for its own
 * ISA; these inline into both): the canonical eight-lane reduction, eight of them at once, an
 * 8x8 transposition, and the software prefetch of weights a tile works through.
 */
#ifndef ST_KERNELS_X86_H
#define ST_KERNELS_X86_H

#include "kernels/kernels.h"

#include <immintrin.h>
#include <stdint.h>

#define ST_INLINE static inline __attribute__((always_inline))
/* Tile loops have constant trip counts once inlined; unrolled, their accumulators live in
 * registers. */
#define ST_UNROLL _Pragma("GCC unroll 16")

/* A stretch of weights a tile prefetches while it computes, `per` cache lines per step: the
 * rows of tiles to come. The hardware prefetchers stop at page boundaries and see only a few
 * of the interleaved row streams, and a batch tile computes long enough to hide the whole
 * transfer of the next block of rows. */
typedef struct st_pf {
    const char *p, *end;
    int64_t per;
} st_pf;

static inline st_pf pf_region(const char *p, int64_t bytes, int64_t steps) {
    st_pf r = {p, p + (bytes > 0 ? bytes : 0), 0};
    if (bytes > 0)
        r.per = ((bytes + 63) / 64 + steps - 1) / (steps > 0 ? steps : 1);
    return r;
}

ST_INLINE void pf_step(st_pf *pf) {
    for (int64_t j = 0; j < pf->per && pf->p < pf->end; j++, pf->p += 64)
        _mm_prefetch(pf->p, _MM_HINT_T0);
}

/* sx[m*nb + b] = -128 * (the sum of block b's quants of token m), for m < M: the start of the
 * VNNI Q8_0 kernels' chains (kernels_amx.c, q8p_avxvnni.c), whose weights are made unsigned. */
static inline void st_q8_block_sums(int32_t *sx, const st_block_q8x *x, int64_t ldx, int64_t M,
                                    int64_t nb) {
    const __m256i off = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            /* the bytes as q + 128 (unsigned), summed in four 64-bit lanes */
            const __m256i u =
                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)x[m * ldx + b].q), off);
            const __m256i s = _mm256_sad_epu8(u, zero);
            const __m128i h =
                _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            const int64_t sum = _mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1) - 128 * ST_QK;
            sx[m * nb + b] = (int32_t)(-128 * sum);
        }
}

/* One 8-row group-block's 6-bit Q4_K/Q5_K scales and mins (kquant.h planes, at p + 32): sc[i]
 * holds sub-block 2i's eight rows in its low 8 bytes and 2i + 1's in the high 8, mn[i] the mins
 * alike (kqp_avx2.c, kqp_avx512.c). */
static inline void st_k4_scales(const uint8_t *p, __m128i sc[4], __m128i mn[4]) {
    const __m128i m63 = _mm_set1_epi8(63), m15 = _mm_set1_epi8(15), m30 = _mm_set1_epi8(0x30);
    const __m128i A = _mm_loadu_si128((const __m128i *)(p + 32));
    const __m128i B = _mm_loadu_si128((const __m128i *)(p + 48));
    const __m128i C = _mm_loadu_si128((const __m128i *)(p + 64));
    const __m128i D = _mm_loadu_si128((const __m128i *)(p + 80));
    const __m128i E = _mm_loadu_si128((const __m128i *)(p + 96));
    const __m128i F = _mm_loadu_si128((const __m128i *)(p + 112));
    sc[0] = _mm_and_si128(A, m63);
    sc[1] = _mm_and_si128(B, m63);
    sc[2] = _mm_or_si128(_mm_and_si128(E, m15), _mm_and_si128(_mm_srli_epi16(A, 2), m30));
    sc[3] = _mm_or_si128(_mm_and_si128(F, m15), _mm_and_si128(_mm_srli_epi16(B, 2), m30));
    mn[0] = _mm_and_si128(C, m63);
    mn[1] = _mm_and_si128(D, m63);
    mn[2] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(E, 4), m15),
                         _mm_and_si128(_mm_srli_epi16(C, 2), m30));
    mn[3] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(F, 4), m15),
                         _mm_and_si128(_mm_srli_epi16(D, 2), m30));
}

static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    __m128 s4 = _mm_add_ps(lo, hi);                    /* l0+l4, l1+l5, l2+l6, l3+l7 */
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4)); /* (l0+l4)+(l2+l6), (l1+l5)+(l3+l7) */
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

/* Eight canonical reductions at once: element j of the result is hsum8(a[j]), with the same
 * additions on the same operands. */
ST_INLINE __m256 hsum8x8(const __m256 a[8]) {
    __m256 u[4];
    ST_UNROLL
    for (int i = 0; i < 4; i++) /* [a(2i): l0+l4, l1+l5, l2+l6, l3+l7 | a(2i+1): same] */
        u[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31));
    /* [a0: (l0+l4)+(l2+l6), (l1+l5)+(l3+l7), a2: same | a1, a3], then a4, a6 | a5, a7 */
    __m256 s0 =
        _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], 0x44), _mm256_shuffle_ps(u[0], u[1], 0xee));
    __m256 s1 =
        _mm256_add_ps(_mm256_shuffle_ps(u[2], u[3], 0x44), _mm256_shuffle_ps(u[2], u[3], 0xee));
    __m256 h = _mm256_hadd_ps(s0, s1); /* a0 a2 a4 a6 | a1 a3 a5 a7 */
    return _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Transposes the 8x8 block r (row j in r[j]) in place: afterwards r[i] holds element i of every
 * row. */
ST_INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    ST_UNROLL
    for (int j = 0; j < 8; j += 2) {
        t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);     /* r_j0 r_j+1,0 r_j1 r_j+1,1 | 4 5 */
        t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]); /* elements 2, 3 | 6, 7 */
    }
    ST_UNROLL
    for (int h = 0; h < 8; h += 4) { /* rows h .. h+3: elements e | e+4 for e = 0 .. 3 */
        u[h] = _mm256_shuffle_ps(t[h], t[h + 2], 0x44);
        u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], 0xee);
        u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0x44);
        u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0xee);
    }
    ST_UNROLL
    for (int e = 0; e < 4; e++) {
        r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
        r[e + 4] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
}

#endif /* ST_KERNELS_X86_H */
