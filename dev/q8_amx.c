/* Prototype: AMX-INT8 Q8_0 matmul with a per-block canonical (acc = fma(float(isum_b), dw*dx, acc),
 * one chain per output) against the library's AVX-512 kernel: 2 threads, BYTES of weights, M
 * tokens.  *
 * Built by the opt-in target `dev` (`cmake --build build --target dev`: build/dev_NAME); by
 * hand, from the repository root after building into build/:
 *   gcc -O2 -march=native -mamx-tile -mamx-int8 -Isrc -Iinclude dev/q8_amx.c \
 *       build/libspectree.a -lpthread -lm -o /tmp/q8_amx
 *   /tmp/q8_amx [TOKENS (8)] [GB of weights (1.1)]
 */
#define _GNU_SOURCE
#include "kernels/kernels.h"
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* repacked: per group of 16 rows, per block: 16 fp16 scales (32 bytes) then B tile 8 x 64 bytes:
 * B[k][4n+i] = w[row n][4k+i] */
typedef struct {
    uint16_t d[16];
    int8_t q[512];
} rgrp; /* 544 bytes = 16 x 34 */

static void repack16(rgrp *out, const char *w, size_t rb, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        rgrp *o = out + b;
        for (int n = 0; n < 16; n++) {
            const st_block_q8_0 *src = (const st_block_q8_0 *)(w + n * rb) + b;
            o->d[n] = src->d;
            for (int k = 0; k < 8; k++)
                for (int i = 0; i < 4; i++)
                    o->q[k * 64 + 4 * n + i] = src->q[4 * k + i];
        }
    }
}

typedef struct {
    uint8_t palette, start;
    uint8_t res[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

static void amx_init(void) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) {
        perror("arch_prctl");
        exit(1);
    }
    tilecfg c = {0};
    c.palette = 1;
    for (int t = 0; t < 4; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    } /* C0..C3: 16 tokens x 16 int32 */
    c.rows[4] = 16;
    c.colsb[4] = 32; /* A: 16 tokens x 32 bytes */
    c.rows[5] = 8;
    c.colsb[5] = 64; /* B: 8 x 64 */
    c.rows[6] = 16;
    c.colsb[6] = 32;
    c.rows[7] = 8;
    c.colsb[7] = 64;
    _tile_loadconfig(&c);
}

/* x: M(<=16, padded to 16 rows) tokens: xq[t][K] int8 contiguous, xd[t][nb] scales */
typedef struct {
    const rgrp *w;
    const int8_t *xq;
    const float *xd;
    float *y;
    int64_t K, g0, g1, rows;
    int M;
} ajob;

static void *amx_run(void *a) {
    ajob *j = a;
    amx_init();
    const int64_t nb = j->K / 32;
    int32_t buf[4][16][16] __attribute__((aligned(64)));
    for (int64_t g = j->g0; g < j->g1; g++) {
        const rgrp *wg = j->w + g * nb;
        __m512 acc[16];
        for (int t = 0; t < 16; t++)
            acc[t] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b += 4) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
#define ST_STEP(i)                                                                                 \
    _tile_loadd(4, j->xq + (b + i) * 32, j->K);                                                    \
    _tile_loadd(5, wg[b + i].q, 64);                                                               \
    _tile_dpbssd(i, 4, 5);
            ST_STEP(0) ST_STEP(1) ST_STEP(2) ST_STEP(3) _tile_stored(0, buf[0], 64);
            _tile_stored(1, buf[1], 64);
            _tile_stored(2, buf[2], 64);
            _tile_stored(3, buf[3], 64);
            for (int i = 0; i < 4; i++) {
                const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wg[b + i].d));
                for (int t = 0; t < j->M; t++)
                    acc[t] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(_mm512_load_si512(buf[i][t])),
                        _mm512_mul_ps(dw, _mm512_set1_ps(j->xd[t * nb + b + i])), acc[t]);
            }
        }
        for (int t = 0; t < j->M; t++)
            _mm512_storeu_ps(j->y + t * j->rows + g * 16, acc[t]);
    }
    _tile_release();
    return NULL;
}

typedef struct {
    float *y;
    const void *w;
    const void *x;
    int64_t K, M, rows, r0, r1;
    size_t rb;
} cjob;
static void *c_run(void *a) {
    cjob *j = a;
    st_kernels_avx512()->matmul_q8_0(j->y, j->rows, j->w, j->rb, j->x, j->K / 32, j->K, j->M, j->r0,
                                     j->r1);
    return NULL;
}

int main(int argc, char **argv) {
    const int64_t K = 2048, M = argc > 1 ? atoi(argv[1]) : 8, nb = K / 32;
    const double gb = argc > 2 ? atof(argv[2]) : 1.1;
    const int64_t rows = ((int64_t)(gb * 1e9 / (nb * 34)) / 64) * 64;
    const size_t rb = (size_t)nb * 34, bytes = rb * rows;
    char *w = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    rgrp *wr = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(w, bytes, MADV_HUGEPAGE);
    madvise(wr, bytes, MADV_HUGEPAGE);
    srand(1);
    for (int64_t i = 0; i < rows * nb; i++) {
        st_block_q8_0 *b = (st_block_q8_0 *)w + i;
        b->d = 0x2000 + rand() % 256;
        for (int j = 0; j < 32; j++)
            b->q[j] = (int8_t)(rand() % 255 - 127);
    }
    for (int64_t g = 0; g < rows / 16; g++)
        repack16(wr + g * nb, w + g * 16 * rb, rb, nb);
    float *xf = malloc(sizeof(float) * K * M);
    for (int64_t i = 0; i < K * M; i++)
        xf[i] = (float)rand() / RAND_MAX - 0.5f;
    st_block_q8x *xq = malloc(sizeof(st_block_q8x) * nb * M);
    int8_t *xi = calloc(16 * K, 1);
    float *xd = calloc(16 * nb, 4);
    for (int64_t m = 0; m < M; m++) {
        st_kernels_ref()->quantize_q8x(xq + m * nb, xf + m * K, K);
        for (int64_t b = 0; b < nb; b++) {
            xd[m * nb + b] = xq[m * nb + b].d;
            memcpy(xi + m * K + b * 32, xq[m * nb + b].q, 32);
        }
    }
    float *y0 = malloc(4 * rows * M), *y1 = malloc(4 * rows * 16);
    double tot[2] = {0, 0}, best[2] = {1e9, 1e9};
    for (int rep = 0; rep < 7; rep++) {
        {
            cjob j[2];
            pthread_t th;
            for (int i = 0; i < 2; i++)
                j[i] = (cjob){y0, w, xq, K, M, rows, i * rows / 2, (i + 1) * rows / 2, rb};
            double t0 = now();
            pthread_create(&th, NULL, c_run, &j[1]);
            c_run(&j[0]);
            pthread_join(th, NULL);
            double t = now() - t0;
            if (rep) {
                tot[0] += t;
                if (t < best[0])
                    best[0] = t;
            }
        }
        {
            ajob j[2];
            pthread_t th;
            for (int i = 0; i < 2; i++)
                j[i] = (ajob){wr, xi, xd, y1, K, i * rows / 32, (i + 1) * rows / 32, rows, (int)M};
            double t0 = now();
            pthread_create(&th, NULL, amx_run, &j[1]);
            amx_run(&j[0]);
            pthread_join(th, NULL);
            double t = now() - t0;
            if (rep) {
                tot[1] += t;
                if (t < best[1])
                    best[1] = t;
            }
        }
    }
    double maxrel = 0;
    for (int64_t i = 0; i < rows * M; i += 97) {
        double d = (y0[i] - y1[i]) / (1e-2 + __builtin_fabs(y0[i]));
        if (d < 0)
            d = -d;
        if (d > maxrel)
            maxrel = d;
    }
    printf("M=%lld weights %.2f GB: avx512 canonical %.1f ms (best %.1f), AMX per-block %.1f ms "
           "(best %.1f); max rel diff %.2g\n",
           (long long)M, bytes / 1e9, tot[0] / 6 * 1e3, best[0] * 1e3, tot[1] / 6 * 1e3,
           best[1] * 1e3, maxrel);
    return 0;
}
