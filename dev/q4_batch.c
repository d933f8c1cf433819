/* Benchmark: the Q4_0 matmul of each kernel table on row-major weights against its packed kernel
 * (st_pack_q4_0), one thread, a ROWS x K matrix (default 5632 x 2048, a 1.1B model's FFN up
 * projection, 6.5 MB: from memory, past the caches of the development VM), N tokens; prints
 * the median us per call over REPS calls and t(N)/t(1) of each, and checks that packed and
 * row-major results agree bitwise.
 * Built by the opt-in target `dev` (`cmake --build build --target dev`: build/dev_q4_batch);
 *   build/dev_q4_batch [ROWS (5632)] [K (2048)] [REPS (30)]
 */
#define _GNU_SOURCE
#include "kernels/kernels.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median us of REPS calls; packed: wp with the q8p contract, else w row-major. */
static double time_it(const st_kernels *k, int packed, const void *w, size_t rb, int64_t rows,
                      const st_block_q8x *x, int64_t K, int64_t M, float *y, int reps) {
    double t[64];
    reps = reps > 64 ? 64 : reps;
    for (int i = 0; i < reps; i++) {
        const double t0 = now();
        if (packed)
            k->matmul_q4_0_packed(y, rows, w, rb, rows, x, K / ST_QK, K, M, 0, rows);
        else
            k->matmul_q4_0(y, rows, w, rb, x, K / ST_QK, K, M, 0, rows);
        t[i] = (now() - t0) * 1e6;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp);
    return t[reps / 2];
}

int main(int argc, char **argv) {
    const int64_t rows = argc > 1 ? atoll(argv[1]) : 5632, K = argc > 2 ? atoll(argv[2]) : 2048;
    const int reps = argc > 3 ? atoi(argv[3]) : 30;
    if (rows < 16 || K < 32 || K % 32 || reps < 1) {
        fprintf(stderr, "usage: dev_q4_batch [ROWS >= 16] [K, a multiple of 32] [REPS >= 1]\n");
        return 2;
    }
    const size_t rb = st_row_bytes(ST_DTYPE_Q4_0, K);
    uint8_t *w = malloc(rb * (size_t)rows), *wp = malloc(rb * (size_t)rows);
    srand(1);
    for (size_t i = 0; i < rb * (size_t)rows; i++)
        w[i] = (uint8_t)rand();
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < K / ST_QK; b++) {
            const uint16_t d = st_f32_to_fp16(0.01f);
            memcpy(w + (size_t)r * rb + (size_t)b * sizeof(st_block_q4_0), &d, 2);
        }
    if (st_pack_q4_0(wp, w, rb, rows, K)) {
        fprintf(stderr, "dev_q4_batch: st_pack_q4_0 failed\n");
        return 1;
    }
    const int64_t Ms[] = {1, 8, 16};
    float *xf = malloc(sizeof(float) * (size_t)(16 * K));
    st_block_q8x *x = malloc(sizeof(st_block_q8x) * (size_t)(16 * K / ST_QK));
    for (int64_t i = 0; i < 16 * K; i++)
        xf[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int m = 0; m < 16; m++)
        st_kernels_ref()->quantize_q8x(x + m * (K / ST_QK), xf + m * K, K);
    float *y1 = malloc(sizeof(float) * (size_t)(16 * rows)),
          *y2 = malloc(sizeof(float) * (size_t)(16 * rows));
    const st_kernels *tabs[] = {st_kernels_avx2(), st_kernels_avx2(), st_kernels_avx512()};
    const char *names[] = {"avx2", "avx2+avx-vnni", "avx512"};
    printf("Q4_0 %lld x %lld, one thread, median of %d calls (us)\n", (long long)rows, (long long)K,
           reps);
    printf("%-14s %-9s %9s %9s %9s %7s %7s\n", "table", "weights", "N=1", "N=8", "N=16", "t8/t1",
           "t16/t1");
    for (int ti = 0; ti < 3; ti++) {
        const st_kernels *k = tabs[ti];
        if (!k || (ti == 1 && !st_avxvnni_set(1)))
            continue;
        st_avxvnni_set(ti == 1);
        for (int packed = 0; packed < 2; packed++) {
            double t[3];
            for (int i = 0; i < 3; i++)
                t[i] = time_it(k, packed, packed ? (const void *)wp : w, rb, rows, x, K, Ms[i],
                               packed ? y2 : y1, reps);
            printf("%-14s %-9s %9.1f %9.1f %9.1f %7.2f %7.2f\n", names[ti],
                   packed ? "packed" : "row-major", t[0], t[1], t[2], t[1] / t[0], t[2] / t[0]);
        }
        if (memcmp(y1, y2, sizeof(float) * (size_t)(16 * rows))) {
            fprintf(stderr, "dev_q4_batch: %s: packed and row-major results differ\n", names[ti]);
            return 1;
        }
    }
    st_avxvnni_set(1);
    free(w), free(wp), free(xf), free(x), free(y1), free(y2);
    return 0;
}
