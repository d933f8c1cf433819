/*
 * dispatch.c: picks the kernel table once: AVX-512 (F, BW, VL, DQ, VNNI, with the OS saving the
 * 512-bit state) over AVX2 (with FMA and F16C) over the scalar reference, as the CPU allows.
 * ST_KERNELS=ref forces the scalar table, ST_KERNELS=avx2 the AVX2 one.
 */
#include "kernels/kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <stdlib.h>
#include <string.h>

const st_kernels *st_kernels_avx2_table_get(void);
const st_kernels *st_kernels_avx512_table_get(void);

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

static int cpu_has_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!cpu_has_avx2() || !__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) /* OSXSAVE */
        return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0xe6) != 0xe6) /* SSE, AVX, opmask and both ZMM state components */
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    const unsigned ebx = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31); /* F DQ BW VL */
    return (b & ebx) == ebx && (c & (1u << 11));                            /* VNNI */
#else
    return 0;
#endif
}

/* AVX-VNNI (CPUID leaf 7 subleaf 1, EAX bit 4) on top of AVX2. */
static int vnni_avail;
static atomic_int vnni_on;
static pthread_once_t vnni_once = PTHREAD_ONCE_INIT;

static void vnni_detect(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    vnni_avail = cpu_has_avx2() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
#endif
    atomic_store(&vnni_on, vnni_avail && st_env_get().avxvnni);
}

int st_avxvnni_ready(void) {
    pthread_once(&vnni_once, vnni_detect);
    return atomic_load_explicit(&vnni_on, memory_order_relaxed);
}

int st_avxvnni_set(int on) {
    pthread_once(&vnni_once, vnni_detect);
    atomic_store(&vnni_on, on && vnni_avail);
    return atomic_load(&vnni_on);
}

const st_kernels *st_kernels_avx2(void) {
    return cpu_has_avx2() ? st_kernels_avx2_table_get() : NULL;
}

const st_kernels *st_kernels_avx512(void) {
    return cpu_has_avx512() ? st_kernels_avx512_table_get() : NULL;
}

static void choose(void) {
    const st_env_kernels want = st_env_get().kernels;
    const st_kernels *avx2 = st_kernels_avx2(), *avx512 = st_kernels_avx512();
    if (want == ST_ENV_KERNELS_REF || !avx2)
        st_chosen = st_kernels_ref();
    else if (want == ST_ENV_KERNELS_AVX2 || !avx512)
        st_chosen = avx2;
    else
        st_chosen = avx512;
}

const st_kernels *st_kernels_get(void) {
    pthread_once(&st_once, choose);
    return st_chosen;
}

const char *st_kernels_name(void) { return st_kernels_get()->name; }

st_matmul_fn st_kernels_matmul(const st_kernels *k, uint32_t type) {
    switch (type) {
    case ST_DTYPE_F32:
        return k->matmul_f32;
    case ST_DTYPE_F16:
        return k->matmul_f16;
    case ST_DTYPE_BF16:
        return k->matmul_bf16;
    case ST_DTYPE_Q8_0:
        return k->matmul_q8_0;
    case ST_DTYPE_Q4_0:
        return k->matmul_q4_0;
    case ST_DTYPE_Q2_K:
        return k->matmul_q2_k;
    case ST_DTYPE_Q3_K:
        return k->matmul_q3_k;
    case ST_DTYPE_Q4_K:
        return k->matmul_q4_k;
    case ST_DTYPE_Q5_K:
        return k->matmul_q5_k;
    default:
        return k->matmul_q6_k;
    }
}
