/*
 * kernels_amx.c: the AVX-512 table's Q8_0 matmul on packed weights (st_pack_q8_0, kernels.h),
 * bitwise the per-block canonical dot product. A group of 16 rows per block is 16 scales and
 * one 8 x 64-byte tile of quants, row k holding the 16 rows' bytes 4k .. 4k+3, so the 16 rows'
 * exact block sums land in the 16 lanes of one vector and the float work per block is one
 * conversion, one scale and one fma per token for 16 rows.
 * - With AMX-INT8 (and 3 or more tokens): the tokens' blocks are tile A, read in place (up to 8
 *   tokens, 32 bytes each at the activations' stride), a group's block tile B; one tdpbssd per
 *   group, token tile and block gives all the sums; two groups share each A tile.
 * - Else vpdpbusd: eight per token and group-block, each with one dword of the activations
 *   broadcast from memory against the weights made unsigned (w + 128: one xor per vector for
 *   all the tokens); the lanes start at -128 * sum(x), summed once per call for every token
 *   and block. Tiles of 8 tokens (1.1B Q8_0 shape, 256 x 2048 in L2, one thread: 8 tokens
 *   25 -> 15 us, 16 tokens 50 -> 29 us against 4-token tiles with the weight-sum correction).
 * Rows past the last full group are row-major and go to the AVX2 kernel (same arithmetic).
 *
 * The file is compiled for AVX-512 and AMX (CMakeLists.txt: *_amx.c); AMX instructions run only
 * when st_amx_ready() says the CPU has AMX-INT8 and the OS let this process use it.
 */
#define _GNU_SOURCE
#include "kernels/kernels.h"
#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <cpuid.h>

/* Tokens per AMX tile (rows of A and C) and per vpdpbusd tile; batches from AMX_MIN tokens
 * take AMX; AMX prefetches AMX_PF blocks ahead. */
enum { AMX_TT = 8, VNNI_TT = 8, AMX_MIN = 3, AMX_PF = 4 };

static int amx_avail;     /* the CPU has AMX-INT8 and the OS lets this process use it */
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
        amx_avail =
            (xlo & (3u << 17)) == (3u << 17) &&
            syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
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

typedef struct tilecfg {
    uint8_t palette, start;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

/* Tiles for TT tokens: 0-1 A (TT tokens x 32 bytes: an even and an odd block), 2-3 B (the two
 * groups' block, 8 x 64 bytes), 4-7 C (TT tokens x 16 int32 sums: groups 0 and 1 of the even
 * block, then of the odd one). Two blocks in separate C tiles let one block's multiplies run
 * while the other's sums go through the float chains (tiles are not renamed). */
static void tiles_config(int TT) {
    tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int h = 0; h < 2; h++) {
        c.rows[h] = (uint8_t)TT;
        c.colsb[h] = ST_QK;
        c.rows[2 + h] = ST_QK / 4;
        c.colsb[2 + h] = 64;
    }
    for (int h = 4; h < 8; h++) {
        c.rows[h] = (uint8_t)TT;
        c.colsb[h] = 64;
    }
    _tile_loadconfig(&c);
}

/* The float step of one block for ng groups: acc[h][t] = fma(isum, d_w * d_x, acc[h][t]). */
ST_INLINE void amx_float(__m512 (*acc)[AMX_TT], int32_t (*c)[AMX_TT][ST_PACK_ROWS],
                         const uint8_t *p0, size_t gstride, int ng, const st_block_q8x *x,
                         int64_t ldx, int64_t b, const int TT) {
    for (int h = 0; h < ng; h++) {
        const __m512 dw =
            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p0 + (size_t)h * gstride)));
        for (int t = 0; t < TT; t++)
            acc[h][t] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[h][t])),
                                _mm512_mul_ps(dw, _mm512_set1_ps(x[t * ldx + b].d)), acc[h][t]);
    }
}

/* ng (1 or 2) groups at gp, gp + gstride x TT tokens (tiles configured for TT). Blocks go in
 * pairs, software-pipelined: a pair's multiplies are issued, then the float step of the pair
 * before it (whose sums were stored one iteration earlier, in the other half of c), then the
 * pair's sums are stored; a tile store cannot forward to the loads that read it back, and
 * waiting for it right away left the multiplier idle (1024 x 768 in L2, one thread: 4 tokens
 * 23.0 -> 19.9 us, 8 tokens 27.4 -> 25.6 us). The float steps still run in block order. */
static void amx_groups(float *y, int64_t ldy, const uint8_t *gp, size_t gstride, int ng, int64_t nb,
                       const st_block_q8x *x, int64_t ldx, const int TT) {
    _Alignas(64) int32_t c[2][4][AMX_TT][ST_PACK_ROWS];
    __m512 acc[2][AMX_TT];
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < AMX_TT; t++)
            acc[h][t] = _mm512_setzero_ps();
    const long xs = (long)(ldx * (int64_t)sizeof(st_block_q8x));
    const size_t Q = 2 * ST_PACK_ROWS; /* the quants after the 16 scales */
    int64_t b = 0, pb = -1; /* pb: the first block of the pair whose sums wait in c[cur ^ 1] */
    int cur = 0;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *p0 = gp + (size_t)b * ST_Q8P_GROUP_BYTES, *q0 = p0 + ST_Q8P_GROUP_BYTES;
        /* the groups' blocks AMX_PF ahead: from DRAM (1.1B Q8_0, 8 tokens) the pass took 56-62
         * ms with 2-8 blocks against 65 ms without (a tile load waits for all its lines) */
        if (b + AMX_PF + 2 <= nb)
            for (int l = 0; l < 2 * ST_Q8P_GROUP_BYTES; l += 64) {
                _mm_prefetch((const char *)p0 + AMX_PF * ST_Q8P_GROUP_BYTES + l, _MM_HINT_T0);
                if (ng == 2)
                    _mm_prefetch((const char *)p0 + gstride + AMX_PF * ST_Q8P_GROUP_BYTES + l,
                                 _MM_HINT_T0);
            }
        _tile_loadd(0, x[b].q, xs);
        _tile_loadd(2, p0 + Q, 64);
        _tile_zero(4);
        _tile_dpbssd(4, 0, 2);
        if (ng == 2) {
            _tile_loadd(3, p0 + gstride + Q, 64);
            _tile_zero(5);
            _tile_dpbssd(5, 0, 3);
        }
        _tile_loadd(1, x[b + 1].q, xs);
        _tile_loadd(2, q0 + Q, 64);
        _tile_zero(6);
        _tile_dpbssd(6, 1, 2);
        if (ng == 2) {
            _tile_loadd(3, q0 + gstride + Q, 64);
            _tile_zero(7);
            _tile_dpbssd(7, 1, 3);
        }
        if (pb >= 0) {
            const uint8_t *pp = gp + (size_t)pb * ST_Q8P_GROUP_BYTES;
            amx_float(acc, c[cur ^ 1], pp, gstride, ng, x, ldx, pb, TT);
            amx_float(acc, c[cur ^ 1] + 2, pp + ST_Q8P_GROUP_BYTES, gstride, ng, x, ldx, pb + 1,
                      TT);
        }
        _tile_stored(4, c[cur][0], 64);
        if (ng == 2)
            _tile_stored(5, c[cur][1], 64);
        _tile_stored(6, c[cur][2], 64);
        if (ng == 2)
            _tile_stored(7, c[cur][3], 64);
        pb = b;
        cur ^= 1;
    }
    if (pb >= 0) {
        const uint8_t *pp = gp + (size_t)pb * ST_Q8P_GROUP_BYTES;
        amx_float(acc, c[cur ^ 1], pp, gstride, ng, x, ldx, pb, TT);
        amx_float(acc, c[cur ^ 1] + 2, pp + ST_Q8P_GROUP_BYTES, gstride, ng, x, ldx, pb + 1, TT);
    }
    if (b < nb) {
        const uint8_t *p0 = gp + (size_t)b * ST_Q8P_GROUP_BYTES;
        _tile_loadd(0, x[b].q, xs);
        _tile_loadd(2, p0 + Q, 64);
        _tile_zero(4);
        _tile_dpbssd(4, 0, 2);
        _tile_stored(4, c[0][0], 64);
        if (ng == 2) {
            _tile_loadd(3, p0 + gstride + Q, 64);
            _tile_zero(5);
            _tile_dpbssd(5, 0, 3);
            _tile_stored(5, c[0][1], 64);
        }
        amx_float(acc, c[0], p0, gstride, ng, x, ldx, b, TT);
    }
    for (int h = 0; h < ng; h++)
        for (int t = 0; t < TT; t++)
            _mm512_storeu_ps(y + t * ldy + h * ST_PACK_ROWS, acc[h][t]);
}

/* The most block sums a call keeps on the stack (more go on the heap). */
enum { VNNI_SX = 8192 };

/* An unaligned int32 that may alias the quants: its broadcasts fold into vpdpbusd's memory
 * operand ({1to16}) instead of going through general registers. */
typedef int32_t i32u __attribute__((may_alias, aligned(1)));

/* s + the four products of u's bytes (unsigned) by *x's (signed) in each lane, *x broadcast
 * from memory by the instruction itself (compilers load it into a register first). */
ST_INLINE __m512i dpbusd_bcast(__m512i s, __m512i u, const i32u *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(s) : "v"(u), "m"(*x));
    return s;
}

/* One group x T tokens (T <= VNNI_TT) with vpdpbusd. The weights go unsigned (w + 128, one xor
 * per vector for all the tokens) against the tokens' signed quants broadcast from memory, so
 * each lane gets sum((w + 128) * x) = isum + 128 * sum(x); the chains start at -128 * sum(x)
 * (sx, per token and block), which leaves the exact isum. Two chains per token (bytes 0 .. 15
 * and 16 .. 31 of the block) halve the dependent run. */
ST_INLINE void vnni_group(float *y, int64_t ldy, const uint8_t *gp, int64_t nb,
                          const st_block_q8x *x, int64_t ldx, const int32_t *sx, const int T,
                          st_pf pf) {
    __m512 acc[VNNI_TT];
    ST_UNROLL
    for (int t = 0; t < T; t++)
        acc[t] = _mm512_setzero_ps();
    const __m512i off = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = gp + (size_t)b * ST_Q8P_GROUP_BYTES;
        pf_step(&pf);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        __m512i wu[ST_QK / 4];
        ST_UNROLL
        for (int k = 0; k < ST_QK / 4; k++)
            wu[k] = _mm512_xor_si512(_mm512_loadu_si512(p + 2 * ST_PACK_ROWS + 64 * k), off);
        ST_UNROLL
        for (int t = 0; t < T; t++) {
            const st_block_q8x *xb = x + t * ldx + b;
            const i32u *xq = (const i32u *)xb->q;
            __m512i s0 = _mm512_set1_epi32(sx[t * nb + b]), s1 = _mm512_setzero_si512();
            ST_UNROLL
            for (int k = 0; k < ST_QK / 8; k++) {
                s0 = dpbusd_bcast(s0, wu[k], xq + k);
                s1 = dpbusd_bcast(s1, wu[k + 4], xq + k + 4);
            }
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                                     _mm512_mul_ps(dw, _mm512_set1_ps(xb->d)), acc[t]);
        }
    }
    ST_UNROLL
    for (int t = 0; t < T; t++)
        _mm512_storeu_ps(y + t * ldy, acc[t]);
}

/* Rows [16g + n0, 16g + n1) of group g for all M tokens, one token at a time through a
 * scratch vector (ranges that do not start or end on a group boundary). */
static void partial_group(float *y, int64_t ldy, const uint8_t *gp, int64_t row0, int64_t nb,
                          const st_block_q8x *x, int64_t ldx, const int32_t *sx, int64_t M, int n0,
                          int n1) {
    for (int64_t m = 0; m < M; m++) {
        float tmp[ST_PACK_ROWS];
        vnni_group(tmp, 0, gp, nb, x + m * ldx, ldx, sx + m * nb, 1, pf_region(NULL, 0, 1));
        for (int n = n0; n < n1; n++)
            y[m * ldy + row0 + n] = tmp[n];
    }
}

/* Whole groups [r0, r1) (multiples of 16) x M tokens. */
static void full_groups(float *y, int64_t ldy, const uint8_t *w, size_t gstride, int64_t nb,
                        const st_block_q8x *xq, int64_t ldx, const int32_t *sx, int64_t M,
                        int64_t r0, int64_t r1) {
    if (M >= AMX_MIN && st_amx_ready()) {
        /* pairs of groups outside, token tiles inside: a pair's weights stay in L2 for its
         * token tiles after the first (the tile shape changes only for a last, shorter tile) */
        int cfg = 0;
        for (int64_t r = r0; r < r1; r += 2 * ST_PACK_ROWS) {
            const int ng = r1 - r >= 2 * ST_PACK_ROWS ? 2 : 1;
            const uint8_t *gp = w + (size_t)(r / ST_PACK_ROWS) * gstride;
            for (int64_t m0 = 0; m0 < M; m0 += AMX_TT) {
                const int TT = M - m0 < AMX_TT ? (int)(M - m0) : AMX_TT;
                if (TT != cfg)
                    tiles_config(cfg = TT);
                if (TT == AMX_TT)
                    amx_groups(y + m0 * ldy + r, ldy, gp, gstride, ng, nb, xq + m0 * ldx, ldx,
                               AMX_TT);
                else
                    amx_groups(y + m0 * ldy + r, ldy, gp, gstride, ng, nb, xq + m0 * ldx, ldx, TT);
            }
        }
        _tile_release();
        return;
    }
    /* group by group, the token tiles inside; the tiles bring in the next group (each its
     * share, spread over its blocks), so the memory stream runs while they compute and every
     * tile after the first finds the group in L2 */
    const int64_t nt = (M + VNNI_TT - 1) / VNNI_TT;
    for (int64_t r = r0; r < r1; r += ST_PACK_ROWS) {
        const uint8_t *gp = w + (size_t)(r / ST_PACK_ROWS) * gstride;
        const int64_t ahead = r + ST_PACK_ROWS < r1 ? (int64_t)gstride : 0;
        const int64_t share = (ahead + nt - 1) / nt;
        for (int64_t m = 0, i = 0; m < M; m += VNNI_TT, i++) {
            const st_block_q8x *xm = xq + m * ldx;
            const int32_t *sm = sx + m * nb;
            float *ym = y + m * ldy + r;
            const int64_t left = ahead - i * share, sb = left < share ? left : share;
            const st_pf pf = pf_region((const char *)gp + gstride + i * share, sb, nb);
            switch (M - m >= VNNI_TT ? VNNI_TT : M - m) {
            case 1:
                vnni_group(ym, ldy, gp, nb, xm, ldx, sm, 1, pf);
                break;
            case 2:
                vnni_group(ym, ldy, gp, nb, xm, ldx, sm, 2, pf);
                break;
            case 3:
                vnni_group(ym, ldy, gp, nb, xm, ldx, sm, 3, pf);
                break;
            case 4:
                vnni_group(ym, ldy, gp, nb, xm, ldx, sm, 4, pf);
                break;
            case 5:
                vnni_group(ym, ldy, gp, nb, xm, ldx, sm, 5, pf);
                break;
            case 6:
                vnni_group(ym, ldy, gp, nb, xm, ldx, sm, 6, pf);
                break;
            case 7:
                vnni_group(ym, ldy, gp, nb, xm, ldx, sm, 7, pf);
                break;
            default:
                vnni_group(ym, ldy, gp, nb, xm, ldx, sm, VNNI_TT, pf);
                break;
            }
        }
    }
}

/* Rows [r0, r1) for M tokens whose block sums are sx (st_q8_block_sums). */
static void rows_tokens(float *y, int64_t ldy, const uint8_t *w, size_t rb, int64_t rows,
                        const st_block_q8x *xq, int64_t ldx, const int32_t *sx, int64_t K,
                        int64_t M, int64_t r0, int64_t r1) {
    const int64_t nb = K / ST_QK, G = ST_PACK_ROWS, rfull = rows / G * G;
    const size_t gstride = (size_t)G * rb;
    int64_t r = r0;
    const int64_t re = r1 < rfull ? r1 : rfull;
    if (r < re && r % G) { /* a leading part of a group */
        const int64_t g = r / G, e = (g + 1) * G < re ? (g + 1) * G : re;
        partial_group(y, ldy, w + (size_t)g * gstride, g * G, nb, xq, ldx, sx, M, (int)(r - g * G),
                      (int)(e - g * G));
        r = e;
    }
    const int64_t rw = r + (re - r) / G * G;
    if (r < rw)
        full_groups(y, ldy, w, gstride, nb, xq, ldx, sx, M, r, rw);
    r = rw > r ? rw : r;
    if (r < re) { /* a trailing part of a group */
        const int64_t g = r / G;
        partial_group(y, ldy, w + (size_t)g * gstride, g * G, nb, xq, ldx, sx, M, 0,
                      (int)(re - g * G));
        r = re;
    }
    if (r < r1) /* rows past the last full group: row-major */
        st_matmul_q8_0_avx2(y, ldy, w, rb, xq, ldx, K, M, r, r1);
}

void st_matmul_q8_0_packed_avx512(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                                  const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                  int64_t r1) {
    if (M < 1 || r0 >= r1)
        return;
    const int64_t nb = K / ST_QK > 0 ? K / ST_QK : 1;
    const st_block_q8x *xq = x;
    /* the block sums of all the tokens on the stack, else on the heap (prompts), else tokens in
     * chunks whose sums fit the stack buffer (a multiple of the tile where it can) */
    int32_t sbuf[VNNI_SX], *sx = sbuf;
    int64_t chunk = M;
    if (M * nb > VNNI_SX && !(sx = malloc((size_t)(M * nb) * sizeof(int32_t)))) {
        sx = sbuf;
        chunk = VNNI_SX / nb;
        if (chunk > VNNI_TT)
            chunk -= chunk % VNNI_TT;
        if (chunk < 1)
            chunk = 1;
    }
    for (int64_t m = 0; m < M; m += chunk) {
        const int64_t mc = M - m < chunk ? M - m : chunk;
        st_q8_block_sums(sx, xq + m * ldx, ldx, mc, K / ST_QK);
        rows_tokens(y + m * ldy, ldy, wp, rb, rows, xq + m * ldx, ldx, sx, K, mc, r0, r1);
    }
    if (sx != sbuf)
        free(sx);
}
