/*
 * peak_avxvnni.c: the AVX-VNNI loop of the roofline (peak.h): vpdpbusd on ymm registers (the
 * VEX form of Alder Lake, Sapphire Rapids and Zen 5), 12 independent chains. No kernel table
 * uses it yet. Compiled with -mavxvnni (CMakeLists.txt), called only where
 * st_peak_has(PEAK_ISA_AVXVNNI).
 */
#include "peak.h"

#include <immintrin.h>

#define PEAK_UNROLL_ALL _Pragma("GCC unroll 16")
/* acc += the products of a and b, in place (GCC 12 copies the accumulator of the intrinsic
 * through a second register or the stack on every step). */
#define PEAK_DPBUSD(acc, a, b) __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b))

uint64_t st_peak_avxvnni_dpbusd(int64_t iters) {
    enum { U = 12 };
    const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(1);
    __m256i acc[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        acc[i] = _mm256_set1_epi32(i);
    for (int64_t it = 0; it < iters; it++) {
        PEAK_UNROLL_ALL
        for (int i = 0; i < U; i++)
            PEAK_DPBUSD(acc[i], a, b);
    }
    __m256i s = acc[0];
    PEAK_UNROLL_ALL
    for (int i = 1; i < U; i++)
        s = _mm256_xor_si256(s, acc[i]);
    return (uint64_t)_mm256_extract_epi64(s, 0) ^ (uint64_t)_mm256_extract_epi64(s, 3);
}
