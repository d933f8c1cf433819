/* Prototype: the current canonical Q8_0 tile (the library's AVX-512 kernel) against a block-lane
 * kernel on repacked weights (lane l of a group of 8 blocks = block l's whole integer sum), M
 * tokens, 2 threads, weights of BYTES total. Prints ms per call of each, interleaved.  *
 * Built by the opt-in target `dev` (`cmake --build build --target dev`: build/dev_NAME); by
 * hand, from the repository root after building into build/:
 *   gcc -O2 -march=native -Isrc -Iinclude dev/q8_lanes.c build/libspectree.a \
 *       -lpthread -lm -o /tmp/q8_lanes && /tmp/q8_lanes [TOKENS (8)] [GB of weights (1.1)]
 */
#define _GNU_SOURCE
#include "kernels/kernels.h"
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* repacked row: per group of 8 blocks: 8 f16 scales (16 bytes), then 8 chunks k of 32 bytes:
 * bytes 4k..4k+3 of blocks 0..7. Rows a, b of a pair: groups interleaved (a's group, b's group). */
typedef struct {
    uint16_t d[8];
    int8_t q[256];
} grp; /* 272 bytes */
typedef struct {
    float d[8];
    int32_t neg[8];
    int8_t q[256];
} xgrp; /* x: scales, -128*sum per lane? no: per block */

static void repack_pair(grp *out, const st_block_q8_0 *ra, const st_block_q8_0 *rb, int64_t ng) {
    for (int64_t g = 0; g < ng; g++)
        for (int r = 0; r < 2; r++) {
            const st_block_q8_0 *src = (r ? rb : ra) + g * 8;
            grp *o = out + 2 * g + r;
            for (int l = 0; l < 8; l++)
                o->d[l] = src[l].d;
            for (int k = 0; k < 8; k++)
                for (int l = 0; l < 8; l++)
                    memcpy(o->q + 32 * k + 4 * l, src[l].q + 4 * k, 4);
        }
}

/* x: per token per group: 8 scales, 8 lanes of -128*sum(block), the bytes interleaved */
static void pack_x(xgrp *out, const st_block_q8x *x, int64_t ng) {
    for (int64_t g = 0; g < ng; g++) {
        xgrp *o = out + g;
        for (int l = 0; l < 8; l++) {
            const st_block_q8x *b = x + g * 8 + l;
            int s = 0;
            for (int j = 0; j < 32; j++)
                s += b->q[j];
            o->d[l] = b->d;
            o->neg[l] = -128 * s;
            for (int k = 0; k < 8; k++)
                memcpy(o->q + 32 * k + 4 * l, b->q + 4 * k, 4);
        }
    }
}

enum { T = 4, P = 2 };
/* P pairs x T tokens over ng groups: acc lanes 0-7 row a, 8-15 row b; 8 independent integer
 * chains per chunk k */
static void tile_lane(float *y, int64_t ldy, const grp *w, int64_t ldwg, const xgrp *x,
                      int64_t ldxg, int64_t ng, int nt) {
    __m512 acc[P * T];
    for (int i = 0; i < P * T; i++)
        acc[i] = _mm512_setzero_ps();
    const __m512i off = _mm512_set1_epi8((char)0x80);
    for (int64_t g = 0; g < ng; g++) {
        __m512i s[P * T];
        for (int t = 0; t < T; t++) {
            const __m512i init = t < nt ? _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                              (const __m256i *)x[t * ldxg + g].neg))
                                        : _mm512_setzero_si512();
            for (int p = 0; p < P; p++)
                s[p * T + t] = init;
        }
        for (int k = 0; k < 8; k++) {
            __m512i wv[P], xv[T];
            for (int p = 0; p < P; p++) {
                const grp *ga = w + p * ldwg + 2 * g, *gb = ga + 1;
                wv[p] = _mm512_xor_si512(
                    _mm512_inserti64x4(_mm512_castsi256_si512(
                                           _mm256_loadu_si256((const __m256i *)(ga->q + 32 * k))),
                                       _mm256_loadu_si256((const __m256i *)(gb->q + 32 * k)), 1),
                    off);
            }
            for (int t = 0; t < T; t++)
                xv[t] = t < nt ? _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                     (const __m256i *)(x[t * ldxg + g].q + 32 * k)))
                               : _mm512_setzero_si512();
            for (int p = 0; p < P; p++)
                for (int t = 0; t < T; t++)
                    s[p * T + t] = _mm512_dpbusd_epi32(s[p * T + t], wv[p], xv[t]);
        }
        for (int p = 0; p < P; p++) {
            const grp *ga = w + p * ldwg + 2 * g, *gb = ga + 1;
            const __m512 dw = _mm512_cvtph_ps(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)ga->d)),
                _mm_loadu_si128((const __m128i *)gb->d), 1));
            for (int t = 0; t < T; t++) {
                const __m512 dx = t < nt
                                      ? _mm512_broadcast_f32x8(_mm256_loadu_ps(x[t * ldxg + g].d))
                                      : _mm512_setzero_ps();
                acc[p * T + t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[p * T + t]),
                                                 _mm512_mul_ps(dw, dx), acc[p * T + t]);
            }
        }
    }
    for (int p = 0; p < P; p++)
        for (int t = 0; t < nt; t++) {
            float o[16];
            _mm512_storeu_ps(o, acc[p * T + t]);
            float a = ((o[0] + o[4]) + (o[2] + o[6])) + ((o[1] + o[5]) + (o[3] + o[7]));
            float b = ((o[8] + o[12]) + (o[10] + o[14])) + ((o[9] + o[13]) + (o[11] + o[15]));
            y[t * ldy + 2 * p] = a;
            y[t * ldy + 2 * p + 1] = b;
        }
}

typedef struct {
    int kind;
    float *y;
    const void *w;
    const void *x;
    int64_t K, M, rows, r0, r1;
    size_t rb;
} job;
static void *run(void *a) {
    job *j = a;
    if (j->kind == 0) {
        st_kernels_avx512()->matmul_q8_0(j->y, j->rows, j->w, j->rb, j->x, j->K / 32, j->K, j->M,
                                         j->r0, j->r1);
    } else {
        const int64_t ng = j->K / 256;
        const grp *w = j->w;
        for (int64_t r = j->r0; r < j->r1; r += 2 * P)
            for (int64_t m = 0; m < j->M; m += T)
                tile_lane(j->y + m * j->rows + r, j->rows, w + (r / 2) * 2 * ng, 2 * ng,
                          (const xgrp *)j->x + m * ng, ng, ng, j->M - m < T ? (int)(j->M - m) : T);
    }
    return NULL;
}

static double call(int kind, float *y, const void *w, size_t rb, const void *x, int64_t K,
                   int64_t M, int64_t rows) {
    job j[2];
    pthread_t th;
    for (int i = 0; i < 2; i++)
        j[i] = (job){kind, y, w, x, K, M, rows, i * rows / 2, (i + 1) * rows / 2, rb};
    double t0 = now();
    pthread_create(&th, NULL, run, &j[1]);
    run(&j[0]);
    pthread_join(th, NULL);
    return now() - t0;
}

int main(int argc, char **argv) {
    const int64_t K = 2048, M = argc > 1 ? atoi(argv[1]) : 8;
    const double gb = argc > 2 ? atof(argv[2]) : 1.1;
    const int64_t rows = ((int64_t)(gb * 1e9 / (K / 32 * 34)) / 64) * 64;
    const size_t rb = (size_t)(K / 32) * 34, bytes = rb * rows;
    st_block_q8_0 *w =
        mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(w, bytes, MADV_HUGEPAGE);
    grp *wr = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(wr, bytes, MADV_HUGEPAGE);
    srand(1);
    for (int64_t i = 0; i < rows * K / 32; i++) {
        w[i].d = 0x2000 + rand() % 256;
        for (int j = 0; j < 32; j++)
            w[i].q[j] = (int8_t)(rand() % 255 - 127);
    }
    for (int64_t r = 0; r < rows; r += 2)
        repack_pair(wr + r * (K / 256), (const st_block_q8_0 *)((char *)w + r * rb),
                    (const st_block_q8_0 *)((char *)w + (r + 1) * rb), K / 256);
    float *xf = malloc(sizeof(float) * K * M);
    for (int64_t i = 0; i < K * M; i++)
        xf[i] = (float)rand() / RAND_MAX - 0.5f;
    st_block_q8x *xq = malloc(sizeof(st_block_q8x) * (K / 32) * M);
    xgrp *xg = malloc(sizeof(xgrp) * (K / 256) * M);
    for (int64_t m = 0; m < M; m++) {
        st_kernels_ref()->quantize_q8x(xq + m * (K / 32), xf + m * K, K);
        pack_x(xg + m * (K / 256), xq + m * (K / 32), K / 256);
    }
    float *y0 = malloc(sizeof(float) * rows * M), *y1 = malloc(sizeof(float) * rows * M);
    double best[2] = {1e9, 1e9}, tot[2] = {0, 0};
    for (int rep = 0; rep < 7; rep++)
        for (int k = 0; k < 2; k++) {
            double t = call(k, k ? y1 : y0, k ? (void *)wr : (void *)w, rb,
                            k ? (void *)xg : (void *)xq, K, M, rows);
            if (rep) {
                tot[k] += t;
                if (t < best[k])
                    best[k] = t;
            }
        }
    double maxrel = 0;
    for (int64_t i = 0; i < rows * M; i += 97) {
        double d = (y0[i] - y1[i]) / (1e-3 + __builtin_fabs(y0[i]));
        if (d < 0)
            d = -d;
        if (d > maxrel)
            maxrel = d;
    }
    printf("M=%lld weights %.2f GB: canonical %.1f ms (best %.1f), block-lane %.1f ms (best %.1f); "
           "max rel diff %.2g\n",
           (long long)M, bytes / 1e9, tot[0] / 6 * 1e3, best[0] * 1e3, tot[1] / 6 * 1e3,
           best[1] * 1e3, maxrel);
    return 0;
}
