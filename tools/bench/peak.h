/* peak.h: the roofline of `spectree-bench peak` and `verify`: register-only loops of each
 * kernel's core instruction, one file per ISA (peak_<isa>.c, compiled with its own flags and
 * called only where the CPU has it), the stream bandwidths, and the table of which loop each
 * kernel table's matmul of each weight type runs on. */
#ifndef ST_BENCH_PEAK_H
#define ST_BENCH_PEAK_H

#include <stddef.h>
#include <stdint.h>

/* A loop runs `iters` iterations of `steps` independent instructions (or instruction groups;
 * st_peak_loops) and returns a value folded from its results, which the caller consumes. Each
 * loop keeps at least as many independent chains as latency x throughput of its instruction
 * (8-16 for the vector ones: 4-5 cycles x 2 per cycle). */
typedef uint64_t (*st_peak_loop_fn)(int64_t iters);

uint64_t st_peak_ref_fmaf(int64_t iters);
uint64_t st_peak_ref_i8(int64_t iters);
uint64_t st_peak_avx2_fma(int64_t iters);
uint64_t st_peak_avx2_cvtph(int64_t iters);
uint64_t st_peak_avx2_maddubs(int64_t iters);
uint64_t st_peak_avx2_i8dot(int64_t iters);
uint64_t st_peak_avxvnni_dpbusd(int64_t iters);
uint64_t st_peak_avx512_fma(int64_t iters);
uint64_t st_peak_avx512_cvtph(int64_t iters);
uint64_t st_peak_avx512_dpbusd(int64_t iters);
uint64_t st_peak_avx512_kq(int64_t iters);
uint64_t st_peak_avx512bf16_dpbf16(int64_t iters);
/* AMX: tiles configured and released inside the call (needs st_peak_has(PEAK_ISA_AMX)). */
uint64_t st_peak_amx_tdpbssd(int64_t iters);

/* Read-only stream: a value folded from the 64-bit words of p[0 .. bytes) (bytes a multiple of
 * 256), AVX2 loads with eight accumulators; the baseline version for CPUs without AVX2. */
uint64_t st_peak_read_avx2(const void *p, size_t bytes);
uint64_t st_peak_read_base(const void *p, size_t bytes);

typedef enum st_peak_isa {
    PEAK_ISA_BASE,
    PEAK_ISA_AVX2, /* AVX2, FMA, F16C */
    PEAK_ISA_AVXVNNI,
    PEAK_ISA_AVX512, /* F, BW, VL, DQ, VNNI with the ZMM state enabled: the AVX-512 table's */
    PEAK_ISA_AVX512BF16,
    PEAK_ISA_AMX, /* AMX-TILE and AMX-INT8, the OS's permission granted to this process */
} st_peak_isa;

/* Whether this CPU (and OS) runs the ISA's instructions. */
int st_peak_has(st_peak_isa isa);

typedef enum st_peak_id {
    PEAK_REF_FMAF,
    PEAK_REF_I8,
    PEAK_AVX2_FMA,
    PEAK_AVX2_CVTPH,
    PEAK_AVX2_MADDUBS,
    PEAK_AVX2_I8DOT,
    PEAK_AVXVNNI_DPBUSD,
    PEAK_AVX512_FMA,
    PEAK_AVX512_CVTPH,
    PEAK_AVX512_DPBUSD,
    PEAK_AVX512_KQ,
    PEAK_AVX512BF16_DPBF16,
    PEAK_AMX_TDPBSSD,
    PEAK_N_LOOPS
} st_peak_id;

/* One loop: its ISA, what each of its `steps` steps per iteration executes, and the
 * operations (f32 or int8 multiply-adds, or conversions) one step performs. */
typedef struct st_peak_loop {
    const char *name;
    st_peak_isa isa;
    st_peak_loop_fn fn;
    const char *instr;
    int steps;
    double ops_per_step;
    const char *unit; /* "mac" (multiply-adds) or "cvt" (elements converted) */
} st_peak_loop;

extern const st_peak_loop st_peak_loops[PEAK_N_LOOPS];

/* The loop whose instruction the matmul of weight type `type` (st_dtype) runs on in kernel
 * table `table` (st_kernels_name()) for a pass of n tokens; packed: whether the matrix is
 * packed for the table (the AVX-512 table's Q8_0 matrices, kernels.h), amx: whether that table
 * uses AMX (st_amx_ready). The float attention (scores and value sums) is type
 * PEAK_TYPE_ATTN. -1 if the table or type is unknown. */
enum { PEAK_TYPE_ATTN = -1 };
int st_peak_kernel_loop(const char *table, int type, int n, int packed, int amx);

/* Prints the table above, one row per kernel table and group of weight types (the end of
 * `peak`'s report). */
void st_peak_print_table(void);

/* Rates measured on `threads` threads at once (each runs the loop; ops per second in all), the
 * median of `reps` timings of at least `seconds` each; 0 for a loop the CPU lacks. */
typedef struct st_peak_rates {
    int threads;
    double op_s[PEAK_N_LOOPS];
    double copy_read_bps; /* bytes read per second by memcpy of a buffer (as many written) */
    double read_bps;      /* bytes per second of the read-only stream */
    size_t stream_bytes;  /* the stream buffer: copy from its first half into the second */
} st_peak_rates;

/* Bytes of the stream buffer: max(512 MB, 8 x L3), at most 4 GB. */
size_t st_peak_stream_bytes(void);

/* For each of n thread counts threads[c]: out[c] gets the rates of the loops with want[id] != 0
 * (all when want is NULL) and, unless stream_bytes is 0, both stream bandwidths over one buffer
 * of stream_bytes (rounded down to 512; st_peak_stream_bytes() for memory) for all counts.
 * Returns nonzero when out of memory. */
int st_peak_measure(int n, const int *threads, double seconds, int reps, const int *want,
                    size_t stream_bytes, st_peak_rates *out);

#endif
