/*
 * peak_avx512bf16.c: the AVX512-BF16 loop of the roofline (peak.h): vdpbf16ps on zmm registers
 * (32 bf16 products summed in pairs into 16 f32 lanes), 16 independent chains. No kernel table
 * uses it yet (BF16 weights are widened to f32 for vfmadd231ps). Compiled with -mavx512bf16
 * (CMakeLists.txt), called only where st_peak_has(PEAK_ISA_AVX512BF16).
 */
#include "peak.h"

#include <immintrin.h>
#include <string.h>

#define PEAK_UNROLL_ALL _Pragma("GCC unroll 16")

uint64_t st_peak_avx512bf16_dpbf16(int64_t iters) {
    enum { U = 16 };
    volatile float seed = 1e-3f;
    const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(seed), _mm512_set1_ps(seed));
    __m512 acc[U];
    PEAK_UNROLL_ALL
    for (int i = 0; i < U; i++)
        acc[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++) {
        PEAK_UNROLL_ALL
        for (int i = 0; i < U; i++)
            acc[i] = _mm512_dpbf16_ps(acc[i], a, a);
    }
    __m512 s = acc[0];
    PEAK_UNROLL_ALL
    for (int i = 1; i < U; i++)
        s = _mm512_add_ps(s, acc[i]);
    const float f = _mm512_reduce_add_ps(s);
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
