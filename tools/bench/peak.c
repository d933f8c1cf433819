/*
 * peak.c: `spectree-bench peak [--json] [--seconds S]`: the machine's roofline, the yardstick of
 * the verify pass: the bandwidth of two streams over buffers far larger than the caches (a
 * memcpy and a read-only sum) and the peak rate of each kernel's core instruction in a
 * register-only loop (peak_<isa>.c), on one thread and on all threads at once; instructions the
 * CPU lacks are reported as not available and never run. Also the table of which loop each
 * kernel table's matmul of each weight type runs on, which `verify` turns into floors.
 */
#define _GNU_SOURCE
#include "peak.h"
#include "bench.h"

/* The thread pool is internal; the loops and streams run on it, one job per thread. */
#include "core/core.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#endif

static const char *usage =
    "usage: spectree-bench peak [--json] [--seconds S] [--reps R] [--threads N]\n"
    "  the roofline of this machine, on 1 thread and on N threads at once (default: every\n"
    "  online core; threads unpinned): copy = memcpy of half of a buffer of max(512 MB, 8 x\n"
    "  L3) into its other half, in GB/s of bytes read (as many are written); read = a\n"
    "  read-only sum of the whole buffer, GB/s; then each kernel instruction's rate in a "
    "register-only loop with\n"
    "  independent chains (G multiply-adds/s, or G elements/s for conversions); 'not\n"
    "  available' where the CPU lacks it. Each figure is the median of R timings (default 3)\n"
    "  of at least S seconds (default 0.2). Ends with the table of the loop each kernel\n"
    "  table's matmul of each weight type runs on (what `verify` divides by).\n";

/* ------------------------------------------------------------------------------------------ */
/* The loops                                                                                  */

/* The reference table's float arithmetic: chains of fmaf calls (kernels_ref.c), built for the
 * baseline ISA like the library (libm's fmaf, which picks the FMA instruction where there is
 * one). */
uint64_t st_peak_ref_fmaf(int64_t iters) {
    volatile float seed = 1e-3f;
    const float a = seed, b = seed;
    float acc[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int64_t it = 0; it < iters; it++)
        for (int l = 0; l < 8; l++)
            acc[l] = fmaf(a, b, acc[l]);
    uint32_t u;
    const float s =
        ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    memcpy(&u, &s, 4);
    return u;
}

/* The reference table's integer sums: the 32-element int8 dot of matmul_q8_0_ref, in C as it
 * is written there (the compiler vectorizes it for the baseline ISA), over eight blocks in L1. */
uint64_t st_peak_ref_i8(int64_t iters) {
    static int8_t w[8][32], x[32];
    for (int j = 0; j < 32; j++) {
        x[j] = (int8_t)(j - 16);
        for (int b = 0; b < 8; b++)
            w[b][j] = (int8_t)(j * 3 - b);
    }
    int32_t acc[8] = {0};
    for (int64_t it = 0; it < iters; it++) {
        const int8_t *wp = &w[0][0];
        const int8_t *xp = x;
        __asm__ volatile("" : "+r"(wp), "+r"(xp)); /* read afresh in every iteration */
        for (int b = 0; b < 8; b++) {
            int32_t s = 0;
            for (int j = 0; j < 32; j++)
                s += (int32_t)wp[b * 32 + j] * (int32_t)xp[j];
            acc[b] += s;
        }
    }
    uint64_t r = 0;
    for (int b = 0; b < 8; b++)
        r = r * 31 + (uint32_t)acc[b];
    return r;
}

uint64_t st_peak_read_base(const void *p, size_t bytes) {
    const uint64_t *v = p;
    uint64_t a[4] = {0};
    for (size_t i = 0; i + 4 <= bytes / 8; i += 4)
        for (int k = 0; k < 4; k++)
            a[k] += v[i + k];
    return a[0] ^ a[1] ^ a[2] ^ a[3];
}

const st_peak_loop st_peak_loops[PEAK_N_LOOPS] = {
    [PEAK_REF_FMAF] = {"ref_fmaf", PEAK_ISA_BASE, st_peak_ref_fmaf, "fmaf() call, scalar", 8, 1,
                       "mac"},
    [PEAK_REF_I8] = {"ref_i8", PEAK_ISA_BASE, st_peak_ref_i8, "int8 dot of 32 in C (L1)", 8, 32,
                     "mac"},
    [PEAK_AVX2_FMA] = {"avx2_fma", PEAK_ISA_AVX2, st_peak_avx2_fma, "vfmadd231ps ymm", 12, 8,
                       "mac"},
    [PEAK_AVX2_CVTPH] = {"avx2_cvtph", PEAK_ISA_AVX2, st_peak_avx2_cvtph, "vcvtph2ps ymm", 8, 8,
                         "cvt"},
    [PEAK_AVX2_MADDUBS] = {"avx2_maddubs", PEAK_ISA_AVX2, st_peak_avx2_maddubs, "vpmaddubsw ymm", 8,
                           32, "mac"},
    [PEAK_AVX2_I8DOT] = {"avx2_i8dot", PEAK_ISA_AVX2, st_peak_avx2_i8dot,
                         "vpmaddubsw+vpmaddwd+vpaddd ymm", 8, 32, "mac"},
    [PEAK_AVXVNNI_DPBUSD] = {"avxvnni_dpbusd", PEAK_ISA_AVXVNNI, st_peak_avxvnni_dpbusd,
                             "vpdpbusd ymm (VEX)", 12, 32, "mac"},
    [PEAK_AVX512_FMA] = {"avx512_fma", PEAK_ISA_AVX512, st_peak_avx512_fma, "vfmadd231ps zmm", 16,
                         16, "mac"},
    [PEAK_AVX512_CVTPH] = {"avx512_cvtph", PEAK_ISA_AVX512, st_peak_avx512_cvtph, "vcvtph2ps zmm",
                           16, 16, "cvt"},
    [PEAK_AVX512_DPBUSD] = {"avx512_dpbusd", PEAK_ISA_AVX512, st_peak_avx512_dpbusd, "vpdpbusd zmm",
                            16, 64, "mac"},
    [PEAK_AVX512_KQ] = {"avx512_kq", PEAK_ISA_AVX512, st_peak_avx512_kq, "vpmaddubsw+vpdpwssd zmm",
                        12, 64, "mac"},
    [PEAK_AVX512BF16_DPBF16] = {"avx512bf16_dpbf16", PEAK_ISA_AVX512BF16, st_peak_avx512bf16_dpbf16,
                                "vdpbf16ps zmm", 16, 32, "mac"},
    [PEAK_AMX_TDPBSSD] = {"amx_tdpbssd", PEAK_ISA_AMX, st_peak_amx_tdpbssd,
                          "tdpbssd 16x64 by 64x16 int8", 4, 16384, "mac"},
};

/* ------------------------------------------------------------------------------------------ */
/* Which loop each kernel's matmul runs on                                                    */

/* When a row applies: always; for the AVX-512 table's packed Q8_0 matrices with AMX from
 * kernels_amx.c's AMX_MIN = 3 tokens; packed otherwise (VNNI); row-major (ST_PACK=0, a tied
 * output layer, fewer than 16 rows). */
enum { WHEN_ANY, WHEN_PACKED_AMX, WHEN_PACKED_AVXVNNI, WHEN_PACKED, WHEN_ROW_MAJOR };
static const char *const when_name[] = {"", "packed, AMX, >= 3 tokens", "packed, AVX-VNNI",
                                        "packed", "row-major"};

/* The table: kernel table x weight types (st_dtype_name; "attn" = the attention's float
 * scores and value sums) -> the loop of the instruction its inner loop multiplies with. The
 * first row that matches applies. */
static const struct kmap {
    const char *table;
    const char *types;
    int when;
    st_peak_id loop;
    const char *how;
} kmap[] = {
    {"ref", "f32 f16 bf16 attn", WHEN_ANY, PEAK_REF_FMAF, "kernels_ref.c: fmaf chains"},
    {"ref", "q8_0 q4_0 q2_k q3_k q4_k q5_k q6_k", WHEN_ANY, PEAK_REF_I8,
     "kernels_ref.c, kquant_ref.c: int8 sums in C"},
    {"avx2", "f32 f16 bf16 attn", WHEN_ANY, PEAK_AVX2_FMA,
     "tile_float: f16 by vcvtph2ps, bf16 by a shift, then vfmadd231ps ymm"},
    {"avx2", "q8_0 q4_0", WHEN_PACKED_AVXVNNI, PEAK_AVXVNNI_DPBUSD,
     "q8p_avxvnni.c, q4p_avxvnni.c: vpdpbusd ymm, unsigned weights, a row per lane"},
    {"avx2", "q8_0 q4_0", WHEN_PACKED, PEAK_AVX2_I8DOT,
     "q8p_avx2.c, q4p_avx2.c: vpmaddubsw then vpmaddwd, a row per lane"},
    {"avx2", "q4_k q5_k q6_k", WHEN_PACKED, PEAK_AVX2_I8DOT,
     "kqp_avx2.c: vpmaddubsw, 16-bit sums, vpmaddwd by the scales, a row per lane"},
    {"avx2", "q8_0 q4_0 q2_k q3_k q4_k q5_k q6_k", WHEN_ANY, PEAK_AVX2_I8DOT,
     "q8_lanes, tile_q4, kq_idot: vpmaddubsw then vpmaddwd"},
    {"avx512", "f32 f16 bf16 attn", WHEN_ANY, PEAK_AVX512_FMA,
     "kernels_avx512.c: vfmadd231ps zmm (value sums: the AVX2 kernel)"},
    {"avx512", "q8_0", WHEN_PACKED_AMX, PEAK_AMX_TDPBSSD, "kernels_amx.c: tdpbssd, 8-token tiles"},
    {"avx512", "q8_0", WHEN_PACKED, PEAK_AVX512_DPBUSD,
     "kernels_amx.c: vpdpbusd zmm, unsigned weights, 8-token tiles"},
    {"avx512", "q8_0", WHEN_ROW_MAJOR, PEAK_AVX2_I8DOT, "st_matmul_q8_0_avx2"},
    {"avx512", "q4_0", WHEN_PACKED, PEAK_AVX512_DPBUSD,
     "q4p_avx512.c: vpdpbusd zmm, a lane of 16 rows per vector, 2-token tiles"},
    {"avx512", "q4_0", WHEN_ANY, PEAK_AVX512_DPBUSD, "tile_q4 (avx512): vpdpbusd zmm"},
    {"avx512", "q4_k q5_k q6_k", WHEN_PACKED, PEAK_AVX512_DPBUSD,
     "kqp_avx512.c: vpdpbusd zmm per sub-block, vpmulld by the scales, 16 rows"},
    {"avx512", "q2_k q3_k q4_k q5_k q6_k", WHEN_ANY, PEAK_AVX512_KQ,
     "kquant_avx512.c: vpmaddubsw then vpdpwssd zmm"},
};

static int has_word(const char *list, const char *w) {
    const size_t n = strlen(w);
    for (const char *p = strstr(list, w); p; p = strstr(p + 1, w))
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0))
            return 1;
    return 0;
}

int st_peak_kernel_loop(const char *table, int type, int n, int packed, int amx) {
    const char *tname = type == PEAK_TYPE_ATTN ? "attn" : st_dtype_name((uint32_t)type);
    for (size_t i = 0; i < sizeof kmap / sizeof kmap[0]; i++) {
        const struct kmap *k = &kmap[i];
        if (strcmp(k->table, table) || !has_word(k->types, tname))
            continue;
        if ((k->when == WHEN_PACKED_AMX && !(packed && amx && n >= 3)) ||
            (k->when == WHEN_PACKED_AVXVNNI && !(packed && st_avxvnni_ready())) ||
            (k->when == WHEN_PACKED && !packed) || (k->when == WHEN_ROW_MAJOR && packed))
            continue;
        return (int)k->loop;
    }
    return -1;
}

void st_peak_print_table(void) {
    printf("  kernel table x weight types -> loop (its inner loop)\n");
    for (size_t i = 0; i < sizeof kmap / sizeof kmap[0]; i++) {
        const struct kmap *k = &kmap[i];
        char types[96];
        snprintf(types, sizeof types, "%s%s%s%s", k->types, *when_name[k->when] ? " (" : "",
                 when_name[k->when], *when_name[k->when] ? ")" : "");
        printf("  %-7s %-44s -> %-14s %s\n", k->table, types, st_peak_loops[k->loop].name, k->how);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* What the CPU has                                                                           */

#if defined(__x86_64__) || defined(__i386__)
static unsigned xcr0(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) /* OSXSAVE */
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return lo;
}

static int cpuid7(unsigned sub, unsigned *a, unsigned *b, unsigned *c, unsigned *d) {
    return __get_cpuid_count(7, sub, a, b, c, d);
}

static int amx_permitted(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    /* the tile data state is off until the process asks (kernels_amx.c asks the same way) */
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
    return 0;
#endif
}
#endif

int st_peak_has(st_peak_isa isa) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    __builtin_cpu_init();
    const unsigned x = xcr0();
    const int avx2 = (x & 6) == 6 && __builtin_cpu_supports("avx2") &&
                     __builtin_cpu_supports("fma") && __get_cpuid(1, &a, &b, &c, &d) &&
                     (c & (1u << 29)); /* F16C */
    const int avx512 = avx2 && (x & 0xe6) == 0xe6 && __builtin_cpu_supports("avx512f") &&
                       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                       __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
    switch (isa) {
    case PEAK_ISA_BASE:
        return 1;
    case PEAK_ISA_AVX2:
        return avx2;
    case PEAK_ISA_AVXVNNI: /* CPUID.(7,1):EAX bit 4 */
        return avx2 && cpuid7(1, &a, &b, &c, &d) && (a & (1u << 4));
    case PEAK_ISA_AVX512:
        return avx512;
    case PEAK_ISA_AVX512BF16: /* CPUID.(7,1):EAX bit 5 */
        return avx512 && cpuid7(1, &a, &b, &c, &d) && (a & (1u << 5));
    case PEAK_ISA_AMX: /* AMX-TILE, AMX-INT8: CPUID.(7,0):EDX bits 24, 25; XTILECFG, XTILEDATA */
        return avx512 && cpuid7(0, &a, &b, &c, &d) && (d & (1u << 24)) && (d & (1u << 25)) &&
               (x & (3u << 17)) == (3u << 17) && amx_permitted();
    }
    return 0;
#else
    return isa == PEAK_ISA_BASE;
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* Measuring                                                                                  */

typedef struct loop_job {
    st_peak_loop_fn fn;
    int64_t iters;
    volatile uint64_t sink[1024];
} loop_job;

static void loop_task(void *ctx, int ith, int nth) {
    (void)nth;
    loop_job *j = ctx;
    j->sink[ith & 1023] = j->fn(j->iters);
}

static double run_loop(st_pool *pool, loop_job *j) {
    const double t0 = st_time_seconds();
    st_pool_run(pool, loop_task, j);
    return st_time_seconds() - t0;
}

/* Operations per second of loop `id` on every thread of `pool` at once. */
static double measure_loop(st_pool *pool, st_peak_id id, double seconds, int reps) {
    const st_peak_loop *L = &st_peak_loops[id];
    loop_job *j = calloc(1, sizeof *j);
    if (!j)
        return 0.0;
    j->fn = L->fn;
    j->iters = 64;
    for (double t = run_loop(pool, j); t < seconds; t = run_loop(pool, j)) {
        const double f = t > 0 ? 1.25 * seconds / t : 16.0;
        j->iters = (int64_t)((double)j->iters * (f < 2.0 ? 2.0 : f > 16.0 ? 16.0 : f));
    }
    double ts[64];
    const int n = reps < 64 ? reps : 64;
    for (int r = 0; r < n; r++)
        ts[r] = run_loop(pool, j);
    const double ops = (double)st_pool_size(pool) * (double)j->iters * L->steps * L->ops_per_step;
    const double rate = ops / st_bench_median(ts, n);
    free(j);
    return rate;
}

typedef struct read_job {
    const char *p;
    size_t bytes;
    int avx2, passes;
    volatile uint64_t sink[1024];
} read_job;

static void read_task(void *ctx, int ith, int nth) {
    read_job *j = ctx;
    int64_t b, e;
    st_split((int64_t)(j->bytes / 256), ith, nth, &b, &e);
    const char *p = j->p + b * 256;
    const size_t n = (size_t)(e - b) * 256;
    uint64_t r = 0;
    for (int k = 0; k < j->passes; k++)
        r ^= j->avx2 ? st_peak_read_avx2(p, n) : st_peak_read_base(p, n);
    j->sink[ith & 1023] = r;
}

/* Bytes per second of the read-only stream over buf (a buffer under 64 MB read over and over
 * for 64 MB per timing); the median of reps after one untimed. */
static double read_bps(st_pool *pool, const char *buf, size_t bytes, int reps) {
    read_job *j = calloc(1, sizeof *j);
    if (!j)
        return 0.0;
    j->p = buf;
    j->bytes = bytes;
    j->avx2 = st_peak_has(PEAK_ISA_AVX2);
    j->passes = bytes < ((size_t)64 << 20) ? (int)(((size_t)64 << 20) / bytes) : 1;
    st_pool_run(pool, read_task, j);
    double ts[64];
    const int n = reps < 64 ? reps : 64;
    for (int r = 0; r < n; r++) {
        const double t0 = st_time_seconds();
        st_pool_run(pool, read_task, j);
        ts[r] = st_time_seconds() - t0;
    }
    const double passes = j->passes;
    free(j);
    return (double)bytes * passes / st_bench_median(ts, n);
}

/* The L3 size of cpu0 from sysfs (glibc's sysconf reports 256 MB on some virtual machines
 * whose L3 is 32 MB), else sysconf's; 0 if neither says. */
static size_t l3_bytes(void) {
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f) {
        unsigned long kb = 0;
        char unit = 0;
        const int n = fscanf(f, "%lu%c", &kb, &unit);
        fclose(f);
        if (n >= 1 && kb > 0)
            return (size_t)kb << (unit == 'M' ? 20 : 10);
    }
#if defined(_SC_LEVEL3_CACHE_SIZE)
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > 0)
        return (size_t)l3;
#endif
    return 0;
}

size_t st_peak_stream_bytes(void) {
    const size_t l3 = l3_bytes(), min = (size_t)512 << 20, max = (size_t)4 << 30;
    const size_t bytes = 8 * l3 > min ? (8 * l3 < max ? 8 * l3 : max) : min;
    return bytes / 512 * 512;
}

int st_peak_measure(int n, const int *threads, double seconds, int reps, const int *want,
                    size_t stream_bytes, st_peak_rates *out) {
    memset(out, 0, (size_t)n * sizeof *out);
    const size_t bytes = stream_bytes < 512 ? 512 : stream_bytes / 512 * 512;
    char *buf = stream_bytes ? malloc(bytes) : NULL;
    if (stream_bytes && !buf)
        return 1;
    if (buf)
        memset(buf, 1, bytes);
    int rc = 0;
    for (int c = 0; c < n && !rc; c++) {
        st_pool *pool = NULL;
        if (st_pool_create(threads[c], &pool) != ST_OK) {
            rc = 1;
            break;
        }
        st_peak_rates *o = &out[c];
        o->threads = st_pool_size(pool);
        if (buf) {
            o->stream_bytes = bytes;
            o->copy_read_bps =
                1e9 * st_bench_copy_gbps(pool, buf + bytes / 2, buf, bytes / 2, reps);
            o->read_bps = read_bps(pool, buf, bytes, reps);
        }
        for (int id = 0; id < PEAK_N_LOOPS; id++)
            if ((!want || want[id]) && st_peak_has(st_peak_loops[id].isa))
                o->op_s[id] = measure_loop(pool, (st_peak_id)id, seconds, reps);
        st_pool_free(pool);
    }
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The subcommand                                                                             */

/* The CPU's name from /proc/cpuinfo ("unknown CPU" elsewhere), JSON-safe. */
static void cpu_name(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        const char *c = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !c)
            continue;
        c++;
        while (*c == ' ')
            c++;
        size_t n = 0;
        for (; *c && *c != '\n' && n + 1 < cap; c++)
            if (*c != '"' && *c != '\\')
                buf[n++] = *c;
        buf[n] = 0;
        break;
    }
    fclose(f);
}

static const char *unit_text(const st_peak_loop *L) {
    return strcmp(L->unit, "mac") ? "G elements/s" : "G MAC/s";
}

int st_bench_peak_main(int argc, char **argv) {
    double seconds = 0.2;
    int reps = 3, threads = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--seconds") && has) {
            char *end;
            seconds = strtod(argv[++i], &end);
            if (*end || !(seconds >= 0.001 && seconds <= 60.0)) {
                fprintf(stderr, "peak: --seconds must be in 0.001..60\n");
                return 2;
            }
        } else if (!strcmp(a, "--reps") && has) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > 64) {
                fprintf(stderr, "peak: --reps must be in 1..64\n");
                return 2;
            }
        } else if (!strcmp(a, "--threads") && has) {
            threads = atoi(argv[++i]);
            if (threads < 1 || threads > 1024) {
                fprintf(stderr, "peak: --threads must be in 1..1024\n");
                return 2;
            }
        } else {
            fprintf(stderr, "peak: unknown option or missing value: %s\n%s", a, usage);
            return 2;
        }
    }
    if (!threads)
        threads = st_n_cores();
    st_peak_rates r[2];
    const int nts[2] = {1, threads};
    if (st_peak_measure(2, nts, seconds, reps, NULL, st_peak_stream_bytes(), r)) {
        fprintf(stderr, "peak: out of memory for the %zu MB stream buffer\n",
                st_peak_stream_bytes() >> 20);
        return 1;
    }
    const st_peak_rates one = r[0], all = r[1];
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    const int nt = all.threads;
    const double mb = (double)one.stream_bytes / 2 / 1048576.0;
    const char *rd = st_peak_has(PEAK_ISA_AVX2) ? "AVX2 loads" : "64-bit loads";
    if (json) {
        printf("{\"bench\":\"peak\",\"kind\":\"stream\",\"name\":\"copy\",\"cpu\":\"%s\","
               "\"threads\":%d,\"buffer_mb\":%.0f,\"gbps_1t\":%.3f,\"gbps_all\":%.3f}\n",
               cpu, nt, mb, one.copy_read_bps / 1e9, all.copy_read_bps / 1e9);
        printf("{\"bench\":\"peak\",\"kind\":\"stream\",\"name\":\"read\",\"cpu\":\"%s\","
               "\"threads\":%d,\"buffer_mb\":%.0f,\"gbps_1t\":%.3f,\"gbps_all\":%.3f}\n",
               cpu, nt, 2 * mb, one.read_bps / 1e9, all.read_bps / 1e9);
    } else {
        printf("peak on %s, kernel table %s: medians of %d timings of >= %.2f s, on 1 thread and "
               "on %d at once (unpinned)\n",
               cpu, st_kernels_name(), reps, seconds, nt);
        printf("  %-18s %-42s %-13s %10s %10s\n", "stream / loop", "what (per instruction)", "unit",
               "1 thread", "all");
        printf("  %-18s %-42s %-13s %10.2f %10.2f\n", "copy",
               "memcpy, bytes read (as many written)", "GB/s", one.copy_read_bps / 1e9,
               all.copy_read_bps / 1e9);
        char what[64];
        snprintf(what, sizeof what, "read-only sum, %s", rd);
        printf("  %-18s %-42s %-13s %10.2f %10.2f\n", "read", what, "GB/s", one.read_bps / 1e9,
               all.read_bps / 1e9);
        printf("  (copy: %.0f MB into another %.0f MB; read: both, %.0f MB)\n", mb, mb, 2 * mb);
    }
    for (int id = 0; id < PEAK_N_LOOPS; id++) {
        const st_peak_loop *L = &st_peak_loops[id];
        const int avail = st_peak_has(L->isa);
        if (json) {
            printf("{\"bench\":\"peak\",\"kind\":\"loop\",\"name\":\"%s\",\"instr\":\"%s\","
                   "\"ops_per_instr\":%.0f,\"unit\":\"%s\",\"threads\":%d,\"available\":%s",
                   L->name, L->instr, L->ops_per_step, L->unit, nt, avail ? "true" : "false");
            if (avail)
                printf(",\"g_1t\":%.3f,\"g_all\":%.3f}\n", one.op_s[id] / 1e9, all.op_s[id] / 1e9);
            else
                printf(",\"g_1t\":null,\"g_all\":null}\n");
            continue;
        }
        char what[80];
        snprintf(what, sizeof what, "%s (%.0f %s%s)", L->instr, L->ops_per_step,
                 strcmp(L->unit, "mac") ? "element" : "MAC", L->ops_per_step > 1 ? "s" : "");
        if (avail)
            printf("  %-18s %-42s %-13s %10.2f %10.2f\n", L->name, what, unit_text(L),
                   one.op_s[id] / 1e9, all.op_s[id] / 1e9);
        else
            printf("  %-18s %-42s %-13s %21s\n", L->name, what, unit_text(L), "not available");
    }
    if (!json)
        st_peak_print_table();
    return 0;
}
