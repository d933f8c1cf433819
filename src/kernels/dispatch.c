/*
 * dispatch.c: picks the kernel table once: AVX2 when the CPU supports AVX2, FMA and F16C and
 * ST_KERNELS is not "ref"; the scalar reference otherwise.
 */
#include "kernels/kernels.h"

#include <pthread.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <stdlib.h>
#include <string.h>

const st_kernels *st_kernels_avx2_table_get(void);

static const st_kernels *st_chosen;
static pthread_once_t st_once = PTHREAD_ONCE_INIT;

static int cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    /* F16C is CPUID leaf 1, ECX bit 29 (older compilers do not know the feature name). */
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 29)))
        return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

const st_kernels *st_kernels_avx2(void) {
    return cpu_has_avx2() ? st_kernels_avx2_table_get() : NULL;
}

static void choose(void) {
    const char *env = getenv("ST_KERNELS");
    const st_kernels *avx2 = st_kernels_avx2();
    st_chosen = (env && strcmp(env, "ref") == 0) || !avx2 ? st_kernels_ref() : avx2;
}

const st_kernels *st_kernels_get(void) {
    pthread_once(&st_once, choose);
    return st_chosen;
}
