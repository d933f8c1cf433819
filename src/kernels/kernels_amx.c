/*
 * kernels_amx.c: Q8_0 weights times batches of tokens on the AMX-INT8 matrix unit, bitwise the
 * per-block canonical dot product of kernels.h. A tile multiply (tdpbssd) gives the exact
 * integer sums isum[b] of 16 weight rows x 16 tokens for one block at once: the weight rows are
 * tile A, read in place (32 bytes per row at the row stride), and the activations are tile B,
 * repacked per span of blocks into AMX's layout (row k = dword k of each token's block). Then
 * per row one fma chain over the token lanes, acc = fma((float)isum[b], d_b, acc), as the
 * scalar reference runs it. Rows past the last full group of 16 go to the AVX2 kernel (same
 * arithmetic).
 *
 * The file is compiled for AVX-512 and AMX (CMakeLists.txt: *_amx.c) and only called when
 * st_amx_ready() says the CPU has AMX-INT8 and the OS let this process use it.
 */
#define _GNU_SOURCE
#include "kernels/kernels.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <cpuid.h>

/* Tokens and rows per tile; blocks per span of repacked activations; row groups per pass over
 * a span (the repacking is shared by them; their accumulators wait in memory between spans). */
enum { AMX_T = 16, AMX_R = 16, SPAN = 32, GROUPS = 8 };

typedef struct tilecfg {
    uint8_t palette, start;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

static int amx_avail;   /* the CPU has AMX-INT8 and the OS lets this process use it */
static atomic_int amx_on; /* amx_avail, unless ST_AMX=0 or st_amx_set(0) */
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_detect(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 24)) && (d & (1u << 25)) &&
        __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27))) {
        unsigned xlo, xhi;
        __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
        /* XTILECFG and XTILEDATA enabled by the OS, and this process allowed to use them */
        amx_avail = (xlo & (3u << 17)) == (3u << 17) &&
                    syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                            18 /* XTILEDATA */) == 0;
    }
#endif
    atomic_store(&amx_on, amx_avail && st_env_get().amx);
}

int st_amx_ready(void) {
    pthread_once(&amx_once, amx_detect);
    return atomic_load_explicit(&amx_on, memory_order_relaxed);
}

int st_amx_set(int on) {
    pthread_once(&amx_once, amx_detect);
    atomic_store(&amx_on, on && amx_avail);
    return atomic_load(&amx_on);
}

static void tiles_config(void) {
    tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int h = 0; h < 2; h++) {
        c.rows[h] = AMX_R; /* C: 16 rows x 16 int32 sums */
        c.colsb[h] = 4 * AMX_T;
        c.rows[2 + h] = AMX_R; /* A: 16 weight rows x one block's 32 values */
        c.colsb[2 + h] = ST_QK;
        c.rows[4 + h] = ST_QK / 4; /* B: dword k of 16 tokens' blocks, k = 0 .. 7 */
        c.colsb[4 + h] = 4 * AMX_T;
    }
    _tile_loadconfig(&c);
}

/* Activations of blocks [b0, b0 + n) of T tokens in B's layout (missing tokens are zeros) and
 * their scales. */
static void pack_span(int32_t (*bp)[ST_QK / 4][AMX_T], float (*dx)[AMX_T], const st_block_q8x *x,
                      int64_t ldx, int64_t b0, int64_t n, int T) {
    for (int64_t j = 0; j < n; j++) {
        for (int t = 0; t < AMX_T; t++) {
            int32_t q[ST_QK / 4] = {0};
            dx[j][t] = 0.0f;
            if (t < T) {
                const st_block_q8x *xb = x + t * ldx + b0 + j;
                memcpy(q, xb->q, sizeof q);
                dx[j][t] = xb->d;
            }
            for (int k = 0; k < ST_QK / 4; k++)
                bp[j][k][t] = q[k];
        }
    }
}

/* Groups of 16 rows from `wr` (ng of them) x the span's tokens, continuing the chains in acc
 * (per group, row i's 16 token lanes at acc[g][i]). While a group computes, the next group's
 * part of the span is prefetched, a few cache lines per block: a tile load waits for all 16 of
 * its rows, so the hardware prefetchers' few streams are not enough. */
static void groups_span(float (*acc)[AMX_R][AMX_T], const char *wr, size_t rb, int ng,
                        int32_t (*bp)[ST_QK / 4][AMX_T], float (*dx)[AMX_T], int64_t b0,
                        int64_t n) {
    _Alignas(64) int32_t c[2][AMX_R][AMX_T];
    const int64_t seg = n * (int64_t)sizeof(st_block_q8_0);         /* bytes of a row's span */
    const int64_t lines = (seg + 63) / 64 + 1, per = (AMX_R * lines + n - 1) / n;
    const __m512i roff = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)rb));
    for (int g = 0; g < ng; g++) {
        const char *w = wr + (size_t)g * AMX_R * rb;
        const char *nx = g + 1 < ng ? w + AMX_R * rb + b0 * (int64_t)sizeof(st_block_q8_0) : NULL;
        int64_t pf = 0; /* next line of the next group's span: row pf / lines, line pf % lines */
        __m512 a[AMX_R];
        ST_UNROLL
        for (int i = 0; i < AMX_R; i++)
            a[i] = _mm512_load_ps(acc[g][i]);
        /* two blocks per step in their own tiles (C 0/1, A 2/3, B 4/5): one block's multiply
         * overlaps the other's store and float chain */
        for (int64_t j = 0; j < n; j += 2) {
            const char *wb = w + (size_t)(b0 + j) * sizeof(st_block_q8_0);
            const int two = j + 1 < n;
            for (int64_t e = pf + 2 * per; nx && pf < e && pf < AMX_R * lines; pf++)
                _mm_prefetch(nx + (pf / lines) * (int64_t)rb + (pf % lines) * 64, _MM_HINT_T0);
            _tile_zero(0);
            _tile_loadd(2, wb + offsetof(st_block_q8_0, q), (long)rb);
            _tile_loadd(4, bp[j], 4 * AMX_T);
            _tile_dpbssd(0, 2, 4);
            if (two) {
                _tile_zero(1);
                _tile_loadd(3, wb + sizeof(st_block_q8_0) + offsetof(st_block_q8_0, q), (long)rb);
                _tile_loadd(5, bp[j + 1], 4 * AMX_T);
                _tile_dpbssd(1, 3, 5);
            }
            _tile_stored(0, c[0], 4 * AMX_T);
            if (two)
                _tile_stored(1, c[1], 4 * AMX_T);
            for (int h = 0; h <= two; h++) {
                /* the 16 rows' scales: the dword at each block's start holds d in its low half */
                const __m512i gd = _mm512_i32gather_epi32(roff, wb + h * sizeof(st_block_q8_0), 1);
                _Alignas(64) float dw[AMX_R];
                _mm512_store_ps(dw, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(gd)));
                const __m512 dxv = _mm512_load_ps(dx[j + h]);
                ST_UNROLL
                for (int i = 0; i < AMX_R; i++)
                    a[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[h][i])),
                                           _mm512_mul_ps(dxv, _mm512_set1_ps(dw[i])), a[i]);
            }
        }
        ST_UNROLL
        for (int i = 0; i < AMX_R; i++)
            _mm512_store_ps(acc[g][i], a[i]);
    }
}

void st_matmul_q8_0_amx(float *y, int64_t ldy, const void *w, size_t rb, const void *x,
                        int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    const int64_t nb = K / ST_QK, rfull = r0 + (r1 - r0) / AMX_R * AMX_R;
    const st_block_q8x *xq = x;
    if (M >= 1 && rfull > r0 && nb > 0) {
        _Alignas(64) int32_t bp[SPAN][ST_QK / 4][AMX_T];
        _Alignas(64) float dx[SPAN][AMX_T];
        _Alignas(64) float acc[GROUPS][AMX_R][AMX_T];
        tiles_config();
        for (int64_t m0 = 0; m0 < M; m0 += AMX_T) {
            const int T = M - m0 < AMX_T ? (int)(M - m0) : AMX_T;
            for (int64_t g0 = r0; g0 < rfull; g0 += GROUPS * AMX_R) {
                const int ng = (int)((rfull - g0) / AMX_R < GROUPS ? (rfull - g0) / AMX_R : GROUPS);
                memset(acc, 0, sizeof acc);
                for (int64_t b0 = 0; b0 < nb; b0 += SPAN) {
                    const int64_t n = nb - b0 < SPAN ? nb - b0 : SPAN;
                    pack_span(bp, dx, xq + m0 * ldx, ldx, b0, n, T);
                    groups_span(acc, (const char *)w + (size_t)g0 * rb, rb, ng, bp, dx, b0, n);
                }
                for (int g = 0; g < ng; g++)
                    for (int i = 0; i < AMX_R; i++)
                        for (int t = 0; t < T; t++)
                            y[(m0 + t) * ldy + g0 + g * AMX_R + i] = acc[g][i][t];
            }
        }
        _tile_release();
    }
    if (rfull < r1)
        st_matmul_q8_0_avx2(y, ldy, w, rb, x, ldx, K, M, rfull, r1);
}
