/*
 * peak_avx2.c: the AVX2 (FMA, F16C) loops of the roofline (peak.h): vfmadd231ps, vcvtph2ps,
 * vpmaddubsw and the AVX2 kernels' int8 dot step, each with independent chains in registers,
 * and the AVX2 read-only stream. Compiled with -mavx2 -mfma -mf16c (CMakeLists.txt), called
 * only where st_peak_has(PEAK_ISA_AVX2).
 */
#include "peak.h"

#include <immintrin.h>
#include <string.h>

#define PEAK_UNROLL_ALL _Pragma("GCC unroll 16")
/* v is rewritten in place as far as the compiler knows (no instruction): a computation on it
 * cannot be hoisted out of the loop or merged with another. */
#define PEAK_TOUCH(v) __asm__ volatile("" : "+x"(v))
/* v is used (no instruction): the instruction that made it cannot be dropped. */
#define PEAK_USE(v) __asm__ volatile("" ::"x"(v))
/* acc += p in int32 lanes, in place: GCC 12 copies the accumulator of the intrinsic through a
 * second register (or the stack) on every step. */
#define PEAK_ADD_EPI32(acc, p) __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(p))

static inline __attribute__((always_inline)) uint64_t fold_ps(const __m256 *v, int n) {
    __m256 s = v[0];
    PEAK_UNROLL_ALL
    for (int i = 1; i < n; i++)
        s = _mm256_add_ps(s, v[i]);
    float f[8];
    _mm256_storeu_ps(f, s);
    uint32_t u;
    memcpy(&u, &f[0], 4);
    return u;
}

static inline __attribute__((always_inline)) uint64_t fold_epi(const __m256i *v, int n) {
    __m256i s = v[0];
    PEAK_UNROLL_ALL
    for (int i = 1; i < n; i++)
        s = _mm256_xor_si256(s, v[i]);
    return (uint64_t)_mm256_extract_epi64(s, 0) ^ (uint64_t)_mm256_extract_epi64(s, 3);
}

/* 12 chains acc = fma(a, b, acc): Zen 3 and the Intel cores run two per cycle at latency 4. */
uint64_t st_peak_avx2_fma(int64_t iters) {
    enum { U = 12 };
    volatile float seed = 1e-3f;
    const __m256 a = _mm256_set1_ps(seed), b = _mm256_set1_ps(seed);
    __m256 acc[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        acc[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++) {
        PEAK_UNROLL_ALL
        for (int i = 0; i < U; i++)
            acc[i] = _mm256_fmadd_ps(a, b, acc[i]);
    }
    return fold_ps(acc, U);
}

/* 8 independent conversions of 8 halves per iteration. */
uint64_t st_peak_avx2_cvtph(int64_t iters) {
    enum { U = 8 };
    __m128i h[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        h[i] = _mm_set1_epi16((short)(0x3c00 + i));
    for (int64_t it = 0; it < iters; it++) {
        PEAK_UNROLL_ALL
        for (int i = 0; i < U; i++) {
            PEAK_TOUCH(h[i]);
            const __m256 f = _mm256_cvtph_ps(h[i]);
            PEAK_USE(f);
        }
    }
    __m256i v[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        v[i] = _mm256_castsi128_si256(h[i]);
    return fold_epi(v, U);
}

/* 8 independent vpmaddubsw per iteration (32 byte products summed in pairs into 16 words). */
uint64_t st_peak_avx2_maddubs(int64_t iters) {
    enum { U = 8 };
    const __m256i s = _mm256_set1_epi8(3);
    __m256i u[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        u[i] = _mm256_set1_epi8((char)(i + 1));
    for (int64_t it = 0; it < iters; it++) {
        PEAK_UNROLL_ALL
        for (int i = 0; i < U; i++) {
            PEAK_TOUCH(u[i]);
            const __m256i p = _mm256_maddubs_epi16(u[i], s);
            PEAK_USE(p);
        }
    }
    return fold_epi(u, U);
}

/* The AVX2 kernels' int8 step into int32 lanes (what one vpdpbusd does): vpmaddubsw, vpmaddwd
 * by ones (or by the K-quant scales), vpaddd; eight chains, x touched before each step so that
 * every step multiplies afresh. */
uint64_t st_peak_avx2_i8dot(int64_t iters) {
    enum { U = 8 };
    const __m256i w = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    __m256i x = _mm256_set1_epi8(1), acc[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        acc[i] = _mm256_setzero_si256();
    for (int64_t it = 0; it < iters; it++) {
        PEAK_UNROLL_ALL
        for (int i = 0; i < U; i++) {
            PEAK_TOUCH(x);
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones);
            PEAK_ADD_EPI32(acc[i], p);
        }
    }
    return fold_epi(acc, U);
}

uint64_t st_peak_read_avx2(const void *p, size_t bytes) {
    enum { U = 8 };
    const __m256i *v = p;
    __m256i acc[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        acc[i] = _mm256_setzero_si256();
    for (size_t i = 0; i + U <= bytes / 32; i += U) {
        PEAK_UNROLL_ALL
        for (int k = 0; k < U; k++)
            acc[k] = _mm256_add_epi64(acc[k], _mm256_loadu_si256(v + i + k));
    }
    return fold_epi(acc, U);
}
