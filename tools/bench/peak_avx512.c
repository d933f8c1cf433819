/*
 * peak_avx512.c: the AVX-512 loops of the roofline (peak.h): vfmadd231ps, vcvtph2ps and
 * vpdpbusd on zmm registers, and the AVX-512 K-quant step (vpmaddubsw then vpdpwssd), each with
 * 16 (12 for the pair) independent chains in registers. Compiled for AVX-512 F, BW, VL, DQ and
 * VNNI (CMakeLists.txt), called only where st_peak_has(PEAK_ISA_AVX512).
 */
#include "peak.h"

#include <immintrin.h>

#define PEAK_UNROLL_ALL _Pragma("GCC unroll 16")
/* As in peak_avx2.c, for any of the 32 vector registers. */
#define PEAK_TOUCH(v) __asm__ volatile("" : "+v"(v))
#define PEAK_USE(v) __asm__ volatile("" ::"v"(v))
/* acc += the products of a and b, in place: GCC 12 copies the accumulator of the intrinsics
 * through a second register (or the stack) on every step. */
#define PEAK_DPBUSD(acc, a, b) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))
#define PEAK_DPWSSD(acc, a, b) __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))

static inline __attribute__((always_inline)) uint64_t fold_epi(const __m512i *v, int n) {
    __m512i s = v[0];
    PEAK_UNROLL_ALL
    for (int i = 1; i < n; i++)
        s = _mm512_xor_si512(s, v[i]);
    /* summed as unsigned (wrapping): _mm512_reduce_add_epi64 adds signed 64-bit lanes, an
     * overflow UBSan reports on the float bit patterns this folds */
    uint64_t l[8], r = 0;
    _mm512_storeu_si512(l, s);
    for (int i = 0; i < 8; i++)
        r += l[i];
    return r;
}

uint64_t st_peak_avx512_fma(int64_t iters) {
    enum { U = 16 };
    volatile float seed = 1e-3f;
    const __m512 a = _mm512_set1_ps(seed), b = _mm512_set1_ps(seed);
    __m512 acc[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        acc[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++) {
        PEAK_UNROLL_ALL
        for (int i = 0; i < U; i++)
            acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
    }
    __m512i v[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        v[i] = _mm512_castps_si512(acc[i]);
    return fold_epi(v, U);
}

uint64_t st_peak_avx512_cvtph(int64_t iters) {
    enum { U = 16 };
    __m256i h[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        h[i] = _mm256_set1_epi16((short)(0x3c00 + i));
    for (int64_t it = 0; it < iters; it++) {
        PEAK_UNROLL_ALL
        for (int i = 0; i < U; i++) {
            PEAK_TOUCH(h[i]);
            const __m512 f = _mm512_cvtph_ps(h[i]);
            PEAK_USE(f);
        }
    }
    __m512i v[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        v[i] = _mm512_castsi256_si512(h[i]);
    return fold_epi(v, U);
}

uint64_t st_peak_avx512_dpbusd(int64_t iters) {
    enum { U = 16 };
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(1);
    __m512i acc[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        acc[i] = _mm512_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++) {
        PEAK_UNROLL_ALL
        for (int i = 0; i < U; i++)
            PEAK_DPBUSD(acc[i], a, b);
    }
    return fold_epi(acc, U);
}

/* kquant_avx512.c's step: 64 quants times 64 activations in word pairs, then the words times
 * the per-16 scales added into the int32 lanes. */
uint64_t st_peak_avx512_kq(int64_t iters) {
    enum { U = 12 };
    const __m512i x = _mm512_set1_epi8(3), sc = _mm512_set1_epi16(2);
    __m512i q = _mm512_set1_epi8(1), acc[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        acc[i] = _mm512_setzero_si512();
    for (int64_t it = 0; it < iters; it++) {
        PEAK_UNROLL_ALL
        for (int i = 0; i < U; i++) {
            PEAK_TOUCH(q);
            const __m512i p = _mm512_maddubs_epi16(q, x);
            PEAK_DPWSSD(acc[i], p, sc);
        }
    }
    return fold_epi(acc, U);
}
