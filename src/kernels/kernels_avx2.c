/*
 * kernels_avx2.c: AVX2+FMA+F16C kernels, bitwise equal to their `_ref` twins in kernels_ref.c
 * (the canonical orders are in kernels.h). Matmuls work on tiles of R weight rows x T tokens,
 * one 8-lane accumulator per output element, so each weight load serves T tokens and R*T
 * independent fma chains are in flight; a tile ends with one transposed reduction that gives
 * eight outputs the canonical ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) at once. Q8_0 (per-block
 * canonical) sums each block's lanes across eight rows into one vector and keeps one fma chain
 * per output.
 * Built with -mavx2 -mfma -mf16c; only called when the CPU reports those features.
 */
#include "kernels/kernels.h"

#include "kernels/kernels_x86.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* The most accumulators a tile keeps (R*T). */
enum { ST_TILE_MAX = 12 };
/* Software prefetch distance of single-token quantized weight streams, in bytes (see st_pf). */
enum { ST_PF_BYTES = 8192 };

static inline __m256i tail_mask(int64_t rem) {
    static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(m + 8 - rem));
}

/* Reduces n <= ST_TILE_MAX accumulators, out[i] = hsum8(acc[i]). */
ST_INLINE void reduce_tile(float *out, const __m256 *acc, int n) {
    ST_UNROLL
    for (int i = 0; i < n; i += 8) {
        __m256 a[8];
        ST_UNROLL
        for (int j = 0; j < 8; j++)
            a[j] = i + j < n ? acc[i + j] : _mm256_setzero_ps();
        float tmp[8];
        _mm256_storeu_ps(tmp, hsum8x8(a));
        for (int j = 0; j < 8 && i + j < n; j++)
            out[i + j] = tmp[j];
    }
}

static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    if (i < n) {
        __m256i mk = tail_mask(n - i);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, mk), _mm256_maskload_ps(b + i, mk), acc);
    }
    return hsum8(acc);
}

/* ------------------------------------------------------------------------------------------ */
/* Attention                                                                                  */

/* Elements 8c .. 8c+7 of the key rows k + j*ldk, j < nr <= 8, as columns: col[i] holds element
 * 8c+i of rows 0 .. 7, zero for rows j >= nr and elements at or past hd. A full block loads
 * row halves side by side (rows j and j+4 in one register) and needs only the in-lane half of
 * the transposition. */
ST_INLINE void key_cols(__m256 col[8], const float *k, int64_t ldk, int64_t nr, int64_t hd,
                        int64_t c) {
    const int64_t i0 = 8 * c;
    if (nr == 8 && hd - i0 >= 8) {
        __m256 a[8];
        ST_UNROLL
        for (int j = 0; j < 4; j++) {
            const float *lo = k + j * ldk + i0, *hi = k + (j + 4) * ldk + i0;
            a[j] =
                _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)), _mm_loadu_ps(hi), 1);
            a[j + 4] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo + 4)),
                                            _mm_loadu_ps(hi + 4), 1);
        }
        ST_UNROLL
        for (int h = 0; h < 8; h += 4) { /* a[h + j]: elements h .. h+3 of rows j | j+4 */
            const __m256 t0 = _mm256_unpacklo_ps(a[h], a[h + 1]);
            const __m256 t1 = _mm256_unpackhi_ps(a[h], a[h + 1]);
            const __m256 t2 = _mm256_unpacklo_ps(a[h + 2], a[h + 3]);
            const __m256 t3 = _mm256_unpackhi_ps(a[h + 2], a[h + 3]);
            col[h] = _mm256_shuffle_ps(t0, t2, 0x44);
            col[h + 1] = _mm256_shuffle_ps(t0, t2, 0xee);
            col[h + 2] = _mm256_shuffle_ps(t1, t3, 0x44);
            col[h + 3] = _mm256_shuffle_ps(t1, t3, 0xee);
        }
        return;
    }
    const int64_t w = hd - i0 < 8 ? hd - i0 : 8;
    const __m256i mk = tail_mask(w);
    ST_UNROLL
    for (int j = 0; j < 8; j++)
        col[j] = j < nr ? _mm256_maskload_ps(k + j * ldk + i0, mk) : _mm256_setzero_ps();
    transpose8(col);
}

/* Head sizes hd <= 8*NC <= 16: eight key rows at a time, transposed once for all the queries.
 * acc[l] holds lane l of the canonical dot product of eight rows at once (element i of the
 * query, broadcast, times column i, in increasing i; past hd a missing element adds 0*0), so
 * the canonical reduce8 is three vertical steps and gives eight scores in one register. */
ST_INLINE void scores_cols(float *const *sc, const float *const *q, int64_t nq, const float *k,
                           int64_t ldk, int64_t n, int64_t hd, float div, const int NC) {
    const __m256 vdiv = _mm256_set1_ps(div), zero = _mm256_setzero_ps();
    for (int64_t r0 = 0; r0 < n; r0 += 8) {
        const int64_t nr = n - r0 < 8 ? n - r0 : 8;
        __m256 col[16];
        ST_UNROLL
        for (int c = 0; c < NC; c++)
            key_cols(col + 8 * c, k + r0 * ldk, ldk, nr, hd, c);
        const __m256i mk = tail_mask(nr);
        for (int64_t j = 0; j < nq; j++) {
            const float *qj = q[j];
            __m256 acc[8];
            ST_UNROLL
            for (int l = 0; l < 8; l++)
                acc[l] = l < hd ? _mm256_fmadd_ps(_mm256_broadcast_ss(qj + l), col[l], zero) : zero;
            ST_UNROLL
            for (int i = 8; i < 8 * NC; i++)
                acc[i & 7] = i < hd
                                 ? _mm256_fmadd_ps(_mm256_broadcast_ss(qj + i), col[i], acc[i & 7])
                                 : _mm256_add_ps(acc[i & 7], zero);
            const __m256 s = _mm256_add_ps(
                _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])),
                _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])));
            if (nr == 8)
                _mm256_storeu_ps(sc[j] + r0, _mm256_div_ps(s, vdiv));
            else
                _mm256_maskstore_ps(sc[j] + r0, mk, _mm256_div_ps(s, vdiv));
        }
    }
}

/* Small heads (hd <= 16) go to scores_cols (8 and 16 with constant sizes). Larger ones: two
 * queries x four key rows per step, eight canonical dot products with their own accumulators,
 * reduced at once; a block of rows is loaded once and serves every query pair from cache.
 * Missing rows or queries of a partial block repeat a valid one; their results are not
 * stored. */
static void attn_scores_avx2(float *const *sc, const float *const *q, int64_t nq, const float *k,
                             int64_t ldk, int64_t n, int64_t hd, float div) {
    if (hd <= 16) {
        if (hd == 8)
            scores_cols(sc, q, nq, k, ldk, n, 8, div, 1);
        else if (hd == 16)
            scores_cols(sc, q, nq, k, ldk, n, 16, div, 2);
        else if (hd < 8)
            scores_cols(sc, q, nq, k, ldk, n, hd, div, 1);
        else
            scores_cols(sc, q, nq, k, ldk, n, hd, div, 2);
        return;
    }
    const __m256 vdiv = _mm256_set1_ps(div);
    const int64_t hfull = hd & ~(int64_t)7;
    const __m256i mk = tail_mask(hd - hfull);
    for (int64_t r0 = 0; r0 < n; r0 += 4) {
        const int64_t nr = n - r0 < 4 ? n - r0 : 4;
        const float *kr[4];
        ST_UNROLL
        for (int j = 0; j < 4; j++)
            kr[j] = k + (r0 + (j < nr ? j : 0)) * ldk;
        for (int64_t j0 = 0; j0 < nq; j0 += 2) {
            const float *qa = q[j0], *qb = q[j0 + 1 < nq ? j0 + 1 : j0];
            __m256 acc[8];
            ST_UNROLL
            for (int j = 0; j < 8; j++)
                acc[j] = _mm256_setzero_ps();
            int64_t i = 0;
            for (; i < hfull; i += 8) {
                const __m256 va = _mm256_loadu_ps(qa + i), vb = _mm256_loadu_ps(qb + i);
                ST_UNROLL
                for (int j = 0; j < 4; j++) {
                    const __m256 kv = _mm256_loadu_ps(kr[j] + i);
                    acc[j] = _mm256_fmadd_ps(va, kv, acc[j]);
                    acc[4 + j] = _mm256_fmadd_ps(vb, kv, acc[4 + j]);
                }
            }
            if (i < hd) {
                const __m256 va = _mm256_maskload_ps(qa + i, mk),
                             vb = _mm256_maskload_ps(qb + i, mk);
                ST_UNROLL
                for (int j = 0; j < 4; j++) {
                    const __m256 kv = _mm256_maskload_ps(kr[j] + i, mk);
                    acc[j] = _mm256_fmadd_ps(va, kv, acc[j]);
                    acc[4 + j] = _mm256_fmadd_ps(vb, kv, acc[4 + j]);
                }
            }
            const __m256 s = _mm256_div_ps(hsum8x8(acc), vdiv);
            float tmp[8];
            _mm256_storeu_ps(tmp, s);
            memcpy(sc[j0] + r0, tmp, (size_t)nr * sizeof(float));
            if (j0 + 1 < nq)
                memcpy(sc[j0 + 1] + r0, tmp + 4, (size_t)nr * sizeof(float));
        }
    }
}

/* NQ queries x NV vectors of one output chunk starting at d0; vector NV-1 may be partial (mask).
 * NQ*NV independent chains, each over the rows in order, in registers. */
ST_INLINE void wsum_chunk(float *const *out, const float *const *p, const int NQ, const int NV,
                          int64_t d0, const float *v, int64_t ldv, int64_t n, __m256i mk_last) {
    __m256 acc[8][2];
    ST_UNROLL
    for (int h = 0; h < NQ; h++)
        ST_UNROLL
    for (int j = 0; j < NV; j++)
        acc[h][j] = j == NV - 1 ? _mm256_maskload_ps(out[h] + d0 + 8 * j, mk_last)
                                : _mm256_loadu_ps(out[h] + d0 + 8 * j);
    for (int64_t r = 0; r < n; r++) {
        const float *vr = v + r * ldv + d0;
        __m256 vv[2];
        ST_UNROLL
        for (int j = 0; j < NV; j++)
            vv[j] =
                j == NV - 1 ? _mm256_maskload_ps(vr + 8 * j, mk_last) : _mm256_loadu_ps(vr + 8 * j);
        ST_UNROLL
        for (int h = 0; h < NQ; h++) {
            const __m256 ph = _mm256_broadcast_ss(p[h] + r);
            ST_UNROLL
            for (int j = 0; j < NV; j++)
                acc[h][j] = _mm256_fmadd_ps(ph, vv[j], acc[h][j]);
        }
    }
    ST_UNROLL
    for (int h = 0; h < NQ; h++)
        ST_UNROLL
    for (int j = 0; j < NV; j++) {
        if (j == NV - 1)
            _mm256_maskstore_ps(out[h] + d0 + 8 * j, mk_last, acc[h][j]);
        else
            _mm256_storeu_ps(out[h] + d0 + 8 * j, acc[h][j]);
    }
}

/* Eight chains in flight: 8 queries x 8 values, or 4 queries x 16 values. */
static void attn_wsum_avx2(float *const *out, const float *const *p, int64_t nq, const float *v,
                           int64_t ldv, int64_t n, int64_t hd) {
    for (int64_t d0 = 0; d0 < hd; d0 += 16) {
        const int64_t w = hd - d0 < 16 ? hd - d0 : 16;
        const int nv = w > 8 ? 2 : 1;
        const __m256i mk = tail_mask(w - 8 * (nv - 1));
        const int64_t step = nv == 2 ? 4 : 8;
        for (int64_t j = 0; j < nq; j += step) {
            const int64_t c = nq - j < step ? nq - j : step;
#define ST_WSUM(NQ, NV) wsum_chunk(out + j, p + j, NQ, NV, d0, v, ldv, n, mk)
            if (nv == 2) {
                switch (c) {
                case 1:
                    ST_WSUM(1, 2);
                    break;
                case 2:
                    ST_WSUM(2, 2);
                    break;
                case 3:
                    ST_WSUM(3, 2);
                    break;
                default:
                    ST_WSUM(4, 2);
                    break;
                }
            } else {
                switch (c) {
                case 1:
                    ST_WSUM(1, 1);
                    break;
                case 2:
                    ST_WSUM(2, 1);
                    break;
                case 3:
                    ST_WSUM(3, 1);
                    break;
                case 4:
                    ST_WSUM(4, 1);
                    break;
                case 5:
                    ST_WSUM(5, 1);
                    break;
                case 6:
                    ST_WSUM(6, 1);
                    break;
                case 7:
                    ST_WSUM(7, 1);
                    break;
                default:
                    ST_WSUM(8, 1);
                    break;
                }
            }
#undef ST_WSUM
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* exp, softmax, SwiGLU                                                                       */

/* Eight lanes of st_expf_ref, operation for operation. */
static inline __m256 exp8(__m256 x) {
    __m256 lo_ok = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GT_OQ);
    __m256 isnan_ = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xc = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    xc = _mm256_max_ps(xc, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_and_ps(y, lo_ok);           /* x <= -87 (or -inf) -> 0 */
    return _mm256_blendv_ps(y, x, isnan_); /* NaN stays NaN */
}

/* exp_sum's eight lane sums (not yet reduced). */
ST_INLINE __m256 exp_lanes(float *x, int64_t n, float mx) {
    __m256 acc = _mm256_setzero_ps(), vm = _mm256_set1_ps(mx);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, y);
        acc = _mm256_add_ps(acc, y);
    }
    if (i < n) {
        __m256i mk = tail_mask(n - i);
        __m256 y = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, mk), vm));
        y = _mm256_and_ps(y, _mm256_castsi256_ps(mk));
        _mm256_maskstore_ps(x + i, mk, y);
        acc = _mm256_add_ps(acc, y); /* +0 in the missing lanes: no lane is ever -0 */
    }
    return acc;
}

static float exp_sum_avx2(float *x, int64_t n, float mx) { return hsum8(exp_lanes(x, n, mx)); }

/* x[i] / sum for i < n. */
ST_INLINE void div_avx2(float *x, int64_t n, float sum) {
    const __m256 vs = _mm256_set1_ps(sum);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), vs));
    if (i < n) {
        const __m256i mk = tail_mask(n - i);
        _mm256_maskstore_ps(x + i, mk, _mm256_div_ps(_mm256_maskload_ps(x + i, mk), vs));
    }
}

/* The largest lane of m (no NaN in m: any order gives the maximum). */
static inline float hmax8(__m256 m) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}

/* The softmax of R heads at once: each pass (max, exp and sum, division) runs over the R rows
 * side by side, so their dependency chains overlap. The max: max_ps returns its second operand,
 * the running maximum, when the first is NaN, so NaNs never count. A head without a maximum
 * (or, after the sums, without a positive sum) is finished on its own. */
ST_INLINE void softmax_rows_avx2(float *x, int64_t n, int64_t ld, float *sums, const int R) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 m[4], acc[4], vm[4];
    ST_UNROLL
    for (int r = 0; r < R; r++)
        m[r] = ninf;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        ST_UNROLL
    for (int r = 0; r < R; r++)
        m[r] = _mm256_max_ps(_mm256_loadu_ps(x + r * ld + i), m[r]);
    const __m256i mk = tail_mask(n - i);
    if (i < n)
        ST_UNROLL
    for (int r = 0; r < R; r++)
        m[r] = _mm256_max_ps(
            _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + r * ld + i, mk), _mm256_castsi256_ps(mk)),
            m[r]);
    float mx[4];
    int live = 1;
    ST_UNROLL
    for (int r = 0; r < R; r++) {
        mx[r] = hmax8(m[r]);
        live &= mx[r] != -INFINITY;
    }
    if (!live) {
        for (int r = 0; r < R; r++) {
            sums[r] = mx[r] == -INFINITY ? 0.0f : hsum8(exp_lanes(x + r * ld, n, mx[r]));
            if (sums[r] > 0.0f)
                div_avx2(x + r * ld, n, sums[r]);
        }
        return;
    }
    ST_UNROLL
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
        vm[r] = _mm256_set1_ps(mx[r]);
    }
    for (i = 0; i + 8 <= n; i += 8)
        ST_UNROLL
    for (int r = 0; r < R; r++) {
        const __m256 y = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + r * ld + i), vm[r]));
        _mm256_storeu_ps(x + r * ld + i, y);
        acc[r] = _mm256_add_ps(acc[r], y);
    }
    if (i < n)
        ST_UNROLL
    for (int r = 0; r < R; r++) { /* exp_lanes' tail: +0 in the missing lanes */
        __m256 y = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + r * ld + i, mk), vm[r]));
        y = _mm256_and_ps(y, _mm256_castsi256_ps(mk));
        _mm256_maskstore_ps(x + r * ld + i, mk, y);
        acc[r] = _mm256_add_ps(acc[r], y);
    }
    int pos = 1;
    ST_UNROLL
    for (int r = 0; r < R; r++) {
        sums[r] = hsum8(acc[r]);
        pos &= sums[r] > 0.0f;
        vm[r] = _mm256_set1_ps(sums[r]);
    }
    if (!pos) {
        for (int r = 0; r < R; r++)
            if (sums[r] > 0.0f)
                div_avx2(x + r * ld, n, sums[r]);
        return;
    }
    for (i = 0; i + 8 <= n; i += 8)
        ST_UNROLL
    for (int r = 0; r < R; r++)
        _mm256_storeu_ps(x + r * ld + i, _mm256_div_ps(_mm256_loadu_ps(x + r * ld + i), vm[r]));
    if (i < n)
        ST_UNROLL
    for (int r = 0; r < R; r++)
        _mm256_maskstore_ps(x + r * ld + i, mk,
                            _mm256_div_ps(_mm256_maskload_ps(x + r * ld + i, mk), vm[r]));
}

/* Heads four at a time, then two, then one. */
static void softmax_avx2(float *x, int64_t n, int64_t rows, int64_t ld, float *sums) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
        softmax_rows_avx2(x + r * ld, n, ld, sums + r, 4);
    if (rows - r >= 2) {
        softmax_rows_avx2(x + r * ld, n, ld, sums + r, 2);
        r += 2;
    }
    if (r < rows)
        softmax_rows_avx2(x + r * ld, n, ld, sums + r, 1);
}

static inline __m256 silu_mul8(__m256 g, __m256 u) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static void silu_mul_avx2(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(g + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        __m256i mk = tail_mask(n - i);
        _mm256_maskstore_ps(
            g + i, mk, silu_mul8(_mm256_maskload_ps(g + i, mk), _mm256_maskload_ps(u + i, mk)));
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Float matmuls                                                                              */

enum { KIND_F32, KIND_F16, KIND_BF16 };

/* Loads 8 weights of the given kind as floats. */
ST_INLINE __m256 load_w(const char *w, int64_t i, int kind) {
    if (kind == KIND_F32)
        return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)(w + 2 * i));
    if (kind == KIND_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

ST_INLINE __m256 load_w_tail(const char *w, int64_t i, int64_t rem, int kind) {
    if (kind == KIND_F32)
        return _mm256_maskload_ps((const float *)w + i, tail_mask(rem));
    uint16_t tmp[8] = {0};
    memcpy(tmp, w + 2 * i, (size_t)rem * 2);
    __m128i h = _mm_loadu_si128((const __m128i *)tmp);
    if (kind == KIND_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* R rows x T tokens: y[t*ldy + r] for rows w + r*rb and tokens x + t*ldx, prefetching pf. */
ST_INLINE void tile_float(float *y, int64_t ldy, const char *w, size_t rb, const float *x,
                          int64_t ldx, int64_t K, const int R, const int T, const int kind,
                          st_pf pf) {
    __m256 acc[ST_TILE_MAX];
    ST_UNROLL
    for (int i = 0; i < R * T; i++)
        acc[i] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= K; i += 8) {
        pf_step(&pf);
        __m256 xv[3];
        ST_UNROLL
        for (int t = 0; t < T; t++)
            xv[t] = _mm256_loadu_ps(x + t * ldx + i);
        ST_UNROLL
        for (int r = 0; r < R; r++) {
            __m256 wv = load_w(w + (size_t)r * rb, i, kind);
            ST_UNROLL
            for (int t = 0; t < T; t++)
                acc[t * R + r] = _mm256_fmadd_ps(wv, xv[t], acc[t * R + r]);
        }
    }
    if (i < K) {
        __m256 xv[3];
        ST_UNROLL
        for (int t = 0; t < T; t++)
            xv[t] = _mm256_maskload_ps(x + t * ldx + i, tail_mask(K - i));
        ST_UNROLL
        for (int r = 0; r < R; r++) {
            __m256 wv = load_w_tail(w + (size_t)r * rb, i, K - i, kind);
            ST_UNROLL
            for (int t = 0; t < T; t++)
                acc[t * R + r] = _mm256_fmadd_ps(wv, xv[t], acc[t * R + r]);
        }
    }
    float out[ST_TILE_MAX];
    reduce_tile(out, acc, R * T);
    ST_UNROLL
    for (int t = 0; t < T; t++)
        ST_UNROLL
    for (int r = 0; r < R; r++)
        y[t * ldy + r] = out[t * R + r];
}

/* Rows in blocks of R, all M tokens per block (the block's weights stay in cache while they
 * serve every token): a single token uses 8-row tiles that prefetch the next tile, a batch
 * 4 rows x 3 tokens, its token chunks sharing the prefetch of the next block of rows. */
ST_INLINE void matmul_float(float *y, int64_t ldy, const void *w, size_t rb, const void *x,
                            int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1,
                            const int kind) {
    if (M < 1)
        return;
    const float *xf = x;
    const char *wc = w;
    const int64_t steps = K / 8;
    int64_t r = r0;
    if (M == 1) {
        for (; r + 8 <= r1; r += 8) {
            const char *wr = wc + (size_t)r * rb;
            /* F32 single-token streams measured faster with the hardware prefetchers alone */
            const int64_t ahead = kind == KIND_F32 ? 0 : 8 * (int64_t)rb;
            tile_float(y + r, ldy, wr, rb, xf, ldx, K, 8, 1, kind,
                       pf_region(wr + 8 * (int64_t)rb, ahead, steps));
        }
        for (; r < r1; r++)
            tile_float(y + r, ldy, wc + (size_t)r * rb, rb, xf, ldx, K, 1, 1, kind,
                       pf_region(NULL, 0, 1));
        return;
    }
    const int64_t nc = (M + 2) / 3, blk = 4 * (int64_t)rb, seg = (blk + nc - 1) / nc;
    for (; r + 4 <= r1; r += 4) {
        const char *wr = wc + (size_t)r * rb;
        for (int64_t m = 0, c = 0; m < M; m += 3, c++) {
            const st_pf pf = pf_region(wr + blk + c * seg, seg, steps);
            if (M - m >= 3)
                tile_float(y + m * ldy + r, ldy, wr, rb, xf + m * ldx, ldx, K, 4, 3, kind, pf);
            else if (M - m == 2)
                tile_float(y + m * ldy + r, ldy, wr, rb, xf + m * ldx, ldx, K, 4, 2, kind, pf);
            else
                tile_float(y + m * ldy + r, ldy, wr, rb, xf + m * ldx, ldx, K, 4, 1, kind, pf);
        }
    }
    for (; r < r1; r++) {
        const char *wr = wc + (size_t)r * rb;
        const st_pf none = pf_region(NULL, 0, 1);
        int64_t m = 0;
        for (; m + 3 <= M; m += 3)
            tile_float(y + m * ldy + r, ldy, wr, rb, xf + m * ldx, ldx, K, 1, 3, kind, none);
        for (; m < M; m++)
            tile_float(y + m * ldy + r, ldy, wr, rb, xf + m * ldx, ldx, K, 1, 1, kind, none);
    }
}

static void matmul_f32_avx2(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                            int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    matmul_float(y, ldy, w, row_bytes, x, ldx, K, M, r0, r1, KIND_F32);
}

static void matmul_f16_avx2(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                            int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    matmul_float(y, ldy, w, row_bytes, x, ldx, K, M, r0, r1, KIND_F16);
}

static void matmul_bf16_avx2(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                             int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    matmul_float(y, ldy, w, row_bytes, x, ldx, K, M, r0, r1, KIND_BF16);
}

/* ------------------------------------------------------------------------------------------ */
/* Quantized matmuls                                                                          */

/* R Q4_0 rows x T tokens of the per-lane canonical dot product (kernels.h). Per block, the madd
 * lanes of the 32 byte products are the canonical integer lanes (lane l = bytes 4l .. 4l+3),
 * exact: maddubs(nibble, x) - maddubs(8, x), both exact in 16 bits. */
ST_INLINE void tile_q4(float *y, int64_t ldy, const char *w, size_t rb, const st_block_q8x *x,
                       int64_t ldx, int64_t nb, const int R, const int T, st_pf pf) {
    __m256 acc[ST_TILE_MAX];
    ST_UNROLL
    for (int i = 0; i < R * T; i++)
        acc[i] = _mm256_setzero_ps();
    const __m256i ones16 = _mm256_set1_epi16(1), lowmask = _mm256_set1_epi8(0xf);
    const __m256i eight = _mm256_set1_epi8(8);
    for (int64_t b = 0; b < nb; b++) {
        pf_step(&pf);
        __m256i xv[3], xoff[3];
        __m256 dx[3];
        ST_UNROLL
        for (int t = 0; t < T; t++) {
            const st_block_q8x *xb = x + t * ldx + b;
            xv[t] = _mm256_loadu_si256((const __m256i *)xb->q);
            dx[t] = _mm256_broadcast_ss(&xb->d);
            xoff[t] = _mm256_maddubs_epi16(eight, xv[t]);
        }
        ST_UNROLL
        for (int r = 0; r < R; r++) {
            const st_block_q4_0 *blk = (const st_block_q4_0 *)(w + (size_t)r * rb) + b;
            __m128i raw = _mm_loadu_si128((const __m128i *)blk->qs);
            const __m256i wv =
                _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), lowmask);
            uint16_t wd;
            memcpy(&wd, &blk->d, 2);
            const __m256 dw = _mm256_set1_ps(_cvtsh_ss(wd));
            ST_UNROLL
            for (int t = 0; t < T; t++) {
                __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(wv, xv[t]), xoff[t]);
                __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones16));
                acc[t * R + r] = _mm256_fmadd_ps(s, _mm256_mul_ps(dw, dx[t]), acc[t * R + r]);
            }
        }
    }
    float out[ST_TILE_MAX];
    reduce_tile(out, acc, R * T);
    ST_UNROLL
    for (int t = 0; t < T; t++)
        ST_UNROLL
    for (int r = 0; r < R; r++)
        y[t * ldy + r] = out[t * R + r];
}

/* Q4_0 rows in blocks of 4 with the tokens in pairs; a single token prefetches ST_PF_BYTES
 * ahead, a batch's token pairs share the prefetch of the next block of rows. */
static void matmul_q4_0_avx2(float *y, int64_t ldy, const void *w, size_t rb, const void *x,
                             int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    if (M < 1)
        return;
    const st_block_q8x *xq = x;
    const char *wc = w;
    const int64_t nb = K / ST_QK;
    const int64_t nc = (M + 1) / 2, blk = 4 * (int64_t)rb, seg = (blk + nc - 1) / nc;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        const char *wr = wc + (size_t)r * rb;
        for (int64_t m = 0, c = 0; m < M; m += 2, c++) {
            const st_pf pf = M == 1 ? pf_region(wr + ST_PF_BYTES, blk, nb)
                                    : pf_region(wr + blk + c * seg, seg, nb);
            if (M - m >= 2)
                tile_q4(y + m * ldy + r, ldy, wr, rb, xq + m * ldx, ldx, nb, 4, 2, pf);
            else
                tile_q4(y + m * ldy + r, ldy, wr, rb, xq + m * ldx, ldx, nb, 4, 1, pf);
        }
    }
    for (; r < r1; r++) {
        const char *wr = wc + (size_t)r * rb;
        for (int64_t m = 0; m < M; m++)
            tile_q4(y + m * ldy + r, ldy, wr, rb, xq + m * ldx, ldx, nb, 1, 1,
                    pf_region(NULL, 0, 1));
    }
}

/* The eight madd lanes of a Q8_0 block times an activation block: maddubs(|w|, sign(x, w)) is
 * exact (at most 2*128*127 per 16-bit pair), so lane l holds the exact sum over bytes 4l..4l+3. */
ST_INLINE __m256i q8_lanes(__m256i wabs, __m256i wv, __m256i xv) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xv, wv)),
                             _mm256_set1_epi16(1));
}

/* Lane r of the result: the sum of the eight lanes of s[r] (exact integers, any order). */
ST_INLINE __m256i hsum_epi32x8(const __m256i s[8]) {
    const __m256i a =
        _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    const __m256i b =
        _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}

/* Eight Q8_0 rows x T tokens of the per-block canonical dot product (kernels.h): per block the
 * eight rows' exact sums land in the lanes of one vector, then one fma chain per output. */
ST_INLINE void tile_q8_rows8(float *y, int64_t ldy, const char *w, size_t rb, const st_block_q8x *x,
                             int64_t ldx, int64_t nb, const int T, st_pf pf) {
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256i offs =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)rb));
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    for (int64_t b = 0; b < nb; b++) {
        pf_step(&pf);
        const char *wb = w + (size_t)b * sizeof(st_block_q8_0);
        /* the rows' fp16 scales: the dword at each block's start holds d in its low half */
        const __m256i g = _mm256_and_si256(_mm256_i32gather_epi32((const int *)wb, offs, 1), lo16);
        const __m256i h = _mm256_permute4x64_epi64(_mm256_packus_epi32(g, g), 0x08);
        const __m256 dw = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        __m256i s[2][8];
        ST_UNROLL
        for (int r = 0; r < 8; r++) {
            const __m256i wv =
                _mm256_loadu_si256((const __m256i *)((const st_block_q8_0 *)(wb + r * rb))->q);
            const __m256i wabs = _mm256_sign_epi8(wv, wv);
            ST_UNROLL
            for (int t = 0; t < T; t++)
                s[t][r] = q8_lanes(wabs, wv, _mm256_loadu_si256((const __m256i *)x[t * ldx + b].q));
        }
        ST_UNROLL
        for (int t = 0; t < T; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum_epi32x8(s[t])),
                                     _mm256_mul_ps(dw, _mm256_set1_ps(x[t * ldx + b].d)), acc[t]);
    }
    ST_UNROLL
    for (int t = 0; t < T; t++)
        _mm256_storeu_ps(y + t * ldy, acc[t]);
}

/* One Q8_0 row x one token, per block. */
static float dot_q8_row(const char *w, const st_block_q8x *x, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const st_block_q8_0 *blk = (const st_block_q8_0 *)w + b;
        const __m256i wv = _mm256_loadu_si256((const __m256i *)blk->q);
        __m256i v =
            q8_lanes(_mm256_sign_epi8(wv, wv), wv, _mm256_loadu_si256((const __m256i *)x[b].q));
        __m128i u = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4e));
        u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0xb1));
        uint16_t wd;
        memcpy(&wd, &blk->d, 2);
        acc = fmaf((float)_mm_cvtsi128_si32(u), _cvtsh_ss(wd) * x[b].d, acc);
    }
    return acc;
}

/* Q8_0 rows in blocks of 8 with the tokens in pairs (prefetch as matmul_q4_0_avx2). Also the
 * AVX-512 table's for row-major weights and the rows past a packed matrix's last group. */
void st_matmul_q8_0_avx2(float *y, int64_t ldy, const void *w, size_t rb, const void *x,
                         int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1) {
    if (M < 1)
        return;
    const st_block_q8x *xq = x;
    const char *wc = w;
    const int64_t nb = K / ST_QK;
    const int64_t nc = (M + 1) / 2, blk = 8 * (int64_t)rb, seg = (blk + nc - 1) / nc;
    int64_t r = r0;
    for (; r + 8 <= r1; r += 8) {
        const char *wr = wc + (size_t)r * rb;
        for (int64_t m = 0, c = 0; m < M; m += 2, c++) {
            const st_pf pf = M == 1 ? pf_region(wr + ST_PF_BYTES, blk, nb)
                                    : pf_region(wr + blk + c * seg, seg, nb);
            if (M - m >= 2)
                tile_q8_rows8(y + m * ldy + r, ldy, wr, rb, xq + m * ldx, ldx, nb, 2, pf);
            else
                tile_q8_rows8(y + m * ldy + r, ldy, wr, rb, xq + m * ldx, ldx, nb, 1, pf);
        }
    }
    for (; r < r1; r++)
        for (int64_t m = 0; m < M; m++)
            y[m * ldy + r] = dot_q8_row(wc + (size_t)r * rb, xq + m * ldx, nb);
}

static void quantize_q8x_avx2(st_block_q8x *y, const float *x, int64_t K) {
    const __m256 signbit = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < K / ST_QK; b++) {
        const float *xb = x + b * ST_QK;
        __m256 v[4];
        __m256 mx = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            /* |x|, a NaN as 0: the largest |x| that is a number, as the reference's fmaxf */
            const __m256 a = _mm256_and_ps(_mm256_andnot_ps(signbit, v[k]),
                                           _mm256_cmp_ps(v[k], v[k], _CMP_ORD_Q));
            mx = _mm256_max_ps(mx, a);
        }
        /* the maximum of the lanes (exact in any order); a call of libm's fmaxf per lane made
         * this function 5-10% of a 4-token pass of the 768-wide Q8_0 model */
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = d;
        __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], vid));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], vid));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], vid));
        __m256i p01 = _mm256_packs_epi32(i0, i1);
        __m256i p23 = _mm256_packs_epi32(i2, i3);
        __m256i p = _mm256_packs_epi16(p01, p23);
        /* undo the lane interleave of the packs */
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[b].q, p);
    }
}

static void f16_to_f32_avx2(float *y, const uint16_t *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++)
        y[i] = st_fp16_to_f32(x[i]);
}

static const st_kernels st_kernels_avx2_table = {
    .name = "avx2",
    .matmul_f32 = matmul_f32_avx2,
    .matmul_f16 = matmul_f16_avx2,
    .matmul_bf16 = matmul_bf16_avx2,
    .matmul_q8_0 = st_matmul_q8_0_avx2,
    .matmul_q4_0 = matmul_q4_0_avx2,
    .matmul_q2_k = st_matmul_q2_k_avx2,
    .matmul_q3_k = st_matmul_q3_k_avx2,
    .matmul_q4_k = st_matmul_q4_k_avx2,
    .matmul_q5_k = st_matmul_q5_k_avx2,
    .matmul_q6_k = st_matmul_q6_k_avx2,
    .matmul_q8_0_packed = st_matmul_q8_0_packed_avx2,
    .matmul_q4_0_packed = st_matmul_q4_0_packed_avx2,
    .matmul_q4_k_packed = st_matmul_q4_k_packed_avx2,
    .matmul_q5_k_packed = st_matmul_q5_k_packed_avx2,
    .matmul_q6_k_packed = st_matmul_q6_k_packed_avx2,
    .dot = dot_avx2,
    .attn_scores = attn_scores_avx2,
    .attn_wsum = attn_wsum_avx2,
    .exp_sum = exp_sum_avx2,
    .softmax = softmax_avx2,
    .silu_mul = silu_mul_avx2,
    .quantize_q8x = quantize_q8x_avx2,
    .quantize_q8k = st_quantize_q8k_avx2,
    .f16_to_f32 = f16_to_f32_avx2,
};

const st_kernels *st_kernels_avx2_table_get(void);
const st_kernels *st_kernels_avx2_table_get(void) { return &st_kernels_avx2_table; }
