/*
 * test_kernels.c: every optimized kernel against its scalar `_ref` twin, bitwise (the kernel
 * table promises the same reduction order), on sizes that straddle vector widths and tails;
 * plus conversions and the batch invariance of matmul (a token's output does not depend on how
 * many tokens share the call or on the row split).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const int64_t sizes[] = {0, 1, 7, 8, 15, 16, 17, 63, 64, 65, 4096, 4099};
/* Token counts of a matmul: around the 2- and 3-token tiles, up to a full verify batch. */
static const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 64};

static uint64_t rs = 0x1234567;
static float frand(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++)
        x[i] = frand() * scale;
}

/* The optimized tables this CPU supports (AVX2, AVX-512); the reference itself when none. */
static int fast_tables(const st_kernels *out[2]) {
    int n = 0;
    if (st_kernels_avx2())
        out[n++] = st_kernels_avx2();
    if (st_kernels_avx512())
        out[n++] = st_kernels_avx512();
    if (n == 0) {
        print_message("note: this CPU has no AVX2; comparing ref against ref\n");
        out[n++] = st_kernels_ref();
    }
    return n;
}

static const st_kernels *avx2_or_skip(void) {
    const st_kernels *k = st_kernels_avx2();
    return k ? k : st_kernels_ref();
}

static void test_dot(void **state) {
    (void)state;
    const st_kernels *r = st_kernels_ref(), *a = avx2_or_skip();
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        float *x = malloc((size_t)(n + 1) * 4), *y = malloc((size_t)(n + 1) * 4);
        fill(x, n, 3.0f);
        fill(y, n, 2.0f);
        float dr = r->dot(x, y, n), da = a->dot(x, y, n);
        assert_memory_equal(&dr, &da, 4);
        if (n > 0) {
            double ex = 0;
            for (int64_t i = 0; i < n; i++)
                ex += (double)x[i] * y[i];
            /* sanity against a double-precision sum: |err| <= n * eps * sum|x*y| */
            double bound = 0;
            for (int64_t i = 0; i < n; i++)
                bound += fabs((double)x[i] * y[i]);
            assert_true(fabs(ex - dr) <= (double)n * 1.2e-7 * bound + 1e-30);
        }
        free(x), free(y);
    }
}

/* Attention scores and value sums for nq queries with scattered scores and outputs, head sizes
 * around the vector width, row counts around the row blocks; the scores also equal dot / div
 * row by row. */
static void test_attn(void **state) {
    (void)state;
    const st_kernels *r = st_kernels_ref(), *fast[2];
    const int nfast = fast_tables(fast);
    const int64_t hds[] = {1, 7, 8, 9, 16, 17, 31, 32, 33, 64, 100, 128};
    const int64_t nqs[] = {1, 2, 3, 4, 5, 8, 9, 17};
    const int64_t ns[] = {0, 1, 3, 4, 5, 7, 8, 9, 17, 64};
    for (int ia = 0; ia < nfast; ia++)
        for (size_t ih = 0; ih < sizeof hds / sizeof hds[0]; ih++)
            for (size_t iq = 0; iq < sizeof nqs / sizeof nqs[0]; iq++)
                for (size_t in = 0; in < sizeof ns / sizeof ns[0]; in++) {
                    const st_kernels *a = fast[ia];
                    const int64_t hd = hds[ih], nq = nqs[iq], n = ns[in];
                    const int64_t ldq = hd + 3, ldk = 2 * hd + 5, lds = n + 2, ldo = hd + 1;
                    float *q = malloc((size_t)(nq * ldq) * 4);
                    float *kv = malloc((size_t)(n * ldk + 1) * 4);
                    float *s1 = calloc((size_t)(nq * lds), 4), *s2 = calloc((size_t)(nq * lds), 4);
                    float *o1 = malloc((size_t)(nq * ldo) * 4),
                          *o2 = malloc((size_t)(nq * ldo) * 4);
                    const float *qp[17], *pp[17];
                    float *sp1[17], *sp2[17], *op1[17], *op2[17];
                    for (int64_t j = 0; j < nq; j++) { /* queries in reverse, scores shuffled */
                        const int64_t js = (j + nq / 2) % nq;
                        qp[j] = q + (nq - 1 - j) * ldq;
                        sp1[j] = s1 + js * lds + 1;
                        sp2[j] = s2 + js * lds + 1;
                        pp[j] = sp1[j];
                        op1[j] = o1 + (nq - 1 - j) * ldo;
                        op2[j] = o2 + (nq - 1 - j) * ldo;
                    }
                    fill(q, nq * ldq, 1.0f);
                    fill(kv, n * ldk, 1.0f);
                    fill(s1, nq * lds, 1.0f);
                    memcpy(s2, s1, (size_t)(nq * lds) * 4);
                    r->attn_scores(sp1, qp, nq, kv, ldk, n, hd, 2.5f);
                    a->attn_scores(sp2, qp, nq, kv, ldk, n, hd, 2.5f);
                    assert_memory_equal(s1, s2, (size_t)(nq * lds) * 4);
                    for (int64_t j = 0; j < nq; j++)
                        for (int64_t i = 0; i < n; i++) {
                            float want = r->dot(qp[j], kv + i * ldk, hd) / 2.5f;
                            assert_memory_equal(&sp1[j][i], &want, 4);
                        }
                    /* p from the scores; out starts non-zero (a chain continued across runs) */
                    fill(o1, nq * ldo, 1.0f);
                    memcpy(o2, o1, (size_t)(nq * ldo) * 4);
                    r->attn_wsum(op1, pp, nq, kv + 1, ldk, n, hd);
                    a->attn_wsum(op2, pp, nq, kv + 1, ldk, n, hd);
                    assert_memory_equal(o1, o2, (size_t)(nq * ldo) * 4);
                    free(q), free(kv), free(s1), free(s2), free(o1), free(o2);
                }
}

/* Values that make a score's sign of zero matter: zeros of both signs, and products so small
 * that they round to -0 (the canonical lanes start at +0 and a missing tail element adds 0*0,
 * which turns a -0 lane into +0). mode 0: random with zeros sprinkled in; mode 1: every product
 * a negative underflow; mode 2: zeros only. */
static void fill_signed_zeros(float *x, int64_t n, int mode, float sign) {
    for (int64_t i = 0; i < n; i++) {
        const float v = frand();
        if (mode == 1)
            x[i] = sign * (1e-30f + 1e-31f * fabsf(v));
        else if (mode == 2)
            x[i] = v < 0 ? -0.0f : 0.0f;
        else
            x[i] = v > 0.8f ? 0.0f : v < -0.8f ? -0.0f : v;
    }
}

/* Small heads against the reference, every size: hd 1 .. 20 (the transposed small-head path
 * and its tails), n 0 .. 40 rows (full and partial blocks of 8), nq 1 .. 9 queries. Keys and
 * queries are packed tightly in exactly-sized buffers (no reads past them), scores land in
 * rows with a guard element on each side. */
static void test_attn_small(void **state) {
    (void)state;
    const st_kernels *r = st_kernels_ref(), *fast[2];
    const int nfast = fast_tables(fast);
    for (int ia = 0; ia < nfast; ia++)
        for (int64_t hd = 1; hd <= 20; hd++)
            for (int64_t n = 0; n <= 40; n++)
                for (int64_t nq = 1; nq <= 9; nq++) {
                    const st_kernels *a = fast[ia];
                    const int mode = (int)((hd + n + nq) % 3);
                    const int64_t ldk = n % 2 ? hd : hd + 3, lds = n + 2;
                    const int64_t nk = n > 0 ? (n - 1) * ldk + hd : 0;
                    float *q = malloc((size_t)(nq * hd) * 4);
                    float *kv = malloc((size_t)(nk > 0 ? nk : 1) * 4);
                    float *s1 = malloc((size_t)(nq * lds) * 4),
                          *s2 = malloc((size_t)(nq * lds) * 4);
                    const float *qp[9];
                    float *sp1[9], *sp2[9];
                    for (int64_t j = 0; j < nq; j++) {
                        qp[j] = q + j * hd;
                        sp1[j] = s1 + (nq - 1 - j) * lds + 1;
                        sp2[j] = s2 + (nq - 1 - j) * lds + 1;
                    }
                    fill_signed_zeros(q, nq * hd, mode, -1.0f);
                    fill_signed_zeros(kv, nk, mode, 1.0f);
                    fill(s1, nq * lds, 1.0f);
                    memcpy(s2, s1, (size_t)(nq * lds) * 4);
                    r->attn_scores(sp1, qp, nq, kv, ldk, n, hd, 2.5f);
                    a->attn_scores(sp2, qp, nq, kv, ldk, n, hd, 2.5f);
                    assert_memory_equal(s1, s2, (size_t)(nq * lds) * 4);
                    free(q), free(kv), free(s1), free(s2);
                }
}

/* Scores of one head for the softmax tests; kind 0 .. 9 (see the comments), 0 .. 2 ordinary. */
static void fill_scores(float *x, int64_t n, int kind) {
    const float special[] = {-INFINITY, 0.0f,   -0.0f,   1e-30f,  -1e-30f, 3.0e38f,
                             -3.0e38f,  -87.0f, 88.0f,   -100.0f, 100.0f,  NAN,
                             INFINITY,  1e-45f, -1e-45f, 1.0f};
    const int nsp = (int)(sizeof special / sizeof special[0]);
    fill(x, n, kind == 0 ? 1.0f : kind == 1 ? 30.0f : 200.0f);
    for (int64_t i = 0; i < n; i++) {
        if (kind == 3 && i % 3 != 1) /* masked keys */
            x[i] = -INFINITY;
        else if (kind == 4) /* all masked */
            x[i] = -INFINITY;
        else if (kind == 5) /* zeros of both signs, the max among them */
            x[i] = i % 2 ? -0.0f : (i % 5 ? -fabsf(x[i]) : 0.0f);
        else if (kind == 6) /* one special value, the rest ordinary */
            x[i] = i == n / 2 ? special[n % nsp] : x[i];
        else if (kind == 7) /* specials scattered */
            x[i] = i % 3 == 0 ? special[(i / 3) % nsp] : x[i];
        else if (kind == 8) /* NaN and -inf, ordinary scores in between */
            x[i] = i % 2 ? NAN : (i % 4 ? -INFINITY : x[i]);
        else if (kind == 9) /* NaN everywhere after the first score */
            x[i] = i > 0 ? NAN : x[i];
    }
}

/* One softmax call of `rows` heads (kinds[r]) of n scores, ld apart with a guard in between,
 * against the reference. */
static void check_softmax(const st_kernels *a, int64_t n, int64_t rows, int64_t ld,
                          const int *kinds) {
    const st_kernels *r = st_kernels_ref();
    const int64_t len = rows > 0 ? (rows - 1) * ld + n : 0;
    float *x1 = malloc((size_t)(len > 0 ? len : 1) * 4),
          *x2 = malloc((size_t)(len > 0 ? len : 1) * 4);
    float s1[8], s2[8];
    fill(x1, len, 1.0f); /* the guards */
    for (int64_t h = 0; h < rows; h++)
        fill_scores(x1 + h * ld, n, kinds[h]);
    memcpy(x2, x1, (size_t)len * 4);
    r->softmax(x1, n, rows, ld, s1);
    a->softmax(x2, n, rows, ld, s2);
    assert_memory_equal(s1, s2, (size_t)rows * 4);
    assert_memory_equal(x1, x2, (size_t)len * 4);
    for (int64_t h = 0; h < rows; h++) {
        if (kinds[h] == 4 || n == 0) {
            assert_true(s1[h] == 0.0f);
        } else if (kinds[h] <= 2) { /* a proper distribution */
            double t = 0;
            for (int64_t i = 0; i < n; i++)
                t += x1[h * ld + i];
            assert_true(s1[h] >= 1.0f && fabs(t - 1.0) < 1e-5);
        }
    }
    free(x1), free(x2);
}

/* softmax against the reference: one head of every length 0 .. 300 with scores of several
 * scales, masked (-inf) keys, all masked, NaN, +inf, huge and tiny scores, zeros of both signs;
 * then 1 .. 7 heads per call (interleaved in groups of 4, 2, 1) of ordinary scores only and
 * mixed with heads that have no maximum or no positive sum. */
static void test_softmax(void **state) {
    (void)state;
    const st_kernels *fast[2];
    const int nfast = fast_tables(fast);
    for (int ia = 0; ia < nfast; ia++) {
        for (int64_t n = 0; n <= 300; n++)
            for (int kind = 0; kind < 10; kind++)
                check_softmax(fast[ia], n, 1, n, &kind);
        for (int64_t n = 0; n <= 70; n += n < 40 ? 1 : 15)
            for (int64_t rows = 1; rows <= 7; rows++)
                for (int mix = 0; mix < 12; mix++) {
                    int kinds[8];
                    for (int h = 0; h < rows; h++)
                        kinds[h] = mix < 2 ? (h + mix) % 3 : (mix + 3 * h) % 10;
                    check_softmax(fast[ia], n, rows, n + 1 + mix % 3, kinds);
                }
    }
}

/* exp_sum and silu_mul of every table against the scalar twin, special values included, on
 * the standard sizes and every length up to 40 (tails of 8 and 16 lanes). */
static void test_exp_silu(void **state) {
    (void)state;
    const st_kernels *r = st_kernels_ref(), *fast[2];
    const int nfast = fast_tables(fast);
    const float special[] = {0.0f,     -0.0f,     1.0f,    -1.0f,    87.5f,  -86.9f, -87.0f,
                             -87.1f,   88.0f,     89.0f,   -100.0f,  100.0f, 1e-30f, -1e-30f,
                             INFINITY, -INFINITY, 3.0e38f, -3.0e38f, NAN};
    const int ns = (int)(sizeof special / sizeof special[0]);
    const int nsz = (int)(sizeof sizes / sizeof sizes[0]);
    for (int ia = 0; ia < nfast; ia++)
        for (int s = 0; s < nsz + 41; s++) {
            const st_kernels *a = fast[ia];
            const int64_t n = s < nsz ? sizes[s] : s - nsz;
            float *x1 = malloc((size_t)(n + 1) * 4), *x2 = malloc((size_t)(n + 1) * 4);
            float *u = malloc((size_t)(n + 1) * 4);
            fill(u, n, 2.0f);
            for (int sp = 0; sp < 2; sp++) { /* plain sums (order-sensitive), then specials */
                fill(x1, n, 20.0f);
                for (int64_t i = 0; sp && i < n && i < ns; i++)
                    x1[(i * 7) % n] = special[(i + s) % ns];
                memcpy(x2, x1, (size_t)n * 4);
                float m1 = r->exp_sum(x1, n, 3.0f), m2 = a->exp_sum(x2, n, 3.0f);
                assert_memory_equal(&m1, &m2, 4);
                assert_memory_equal(x1, x2, (size_t)n * 4);
            }
            fill(x1, n, 30.0f);
            for (int64_t i = 0; i < n && i < ns; i++)
                x1[(i * 5) % n] = special[i];
            memcpy(x2, x1, (size_t)n * 4);
            r->silu_mul(x1, u, n);
            a->silu_mul(x2, u, n);
            assert_memory_equal(x1, x2, (size_t)n * 4);
            free(x1), free(x2), free(u);
        }
    /* st_expf_ref against libm: relative error below 3e-7 over the useful range */
    for (float x = -86.0f; x < 88.0f; x += 0.0137f) {
        double want = exp((double)x);
        assert_true(fabs((double)st_expf_ref(x) - want) <= 3e-7 * want);
    }
}

/* Builds a weight matrix of `rows` rows of K elements in `type` from random floats. */
static void *make_weights(uint32_t type, int64_t rows, int64_t K, size_t *row_bytes) {
    *row_bytes = st_row_bytes(type, K);
    uint8_t *w = malloc(*row_bytes * (size_t)rows + 1);
    float *tmp = malloc((size_t)(K + 1) * 4);
    for (int64_t r = 0; r < rows; r++) {
        fill(tmp, K, 1.0f);
        uint8_t *row = w + (size_t)r * *row_bytes;
        if (type == ST_DTYPE_F32) {
            memcpy(row, tmp, (size_t)K * 4);
        } else if (type == ST_DTYPE_F16 || type == ST_DTYPE_BF16) {
            for (int64_t i = 0; i < K; i++) {
                uint16_t h = type == ST_DTYPE_F16 ? st_f32_to_fp16(tmp[i]) : st_f32_to_bf16(tmp[i]);
                memcpy(row + 2 * i, &h, 2);
            }
        } else if (type == ST_DTYPE_Q8_0) {
            st_block_q8_0 *b = (st_block_q8_0 *)row;
            for (int64_t i = 0; i < K / ST_QK; i++) {
                b[i].d = st_f32_to_fp16(0.01f + 0.001f * (float)(i % 7));
                for (int j = 0; j < ST_QK; j++)
                    b[i].q[j] =
                        (int8_t)(int)lrintf(tmp[i * ST_QK + j] * 127.0f + (j == 3 ? -1 : 0));
                b[i].q[0] = -128; /* the extreme value the kernels must handle */
            }
        } else {
            st_block_q4_0 *b = (st_block_q4_0 *)row;
            for (int64_t i = 0; i < K / ST_QK; i++) {
                b[i].d = st_f32_to_fp16(0.02f);
                for (int j = 0; j < ST_QK / 2; j++)
                    b[i].qs[j] = (uint8_t)(rs >> (j % 56));
                frand();
            }
        }
    }
    free(tmp);
    return w;
}

static st_matmul_fn matmul_of(const st_kernels *k, uint32_t type) {
    return type == ST_DTYPE_F32    ? k->matmul_f32
           : type == ST_DTYPE_F16  ? k->matmul_f16
           : type == ST_DTYPE_BF16 ? k->matmul_bf16
           : type == ST_DTYPE_Q8_0 ? k->matmul_q8_0
                                   : k->matmul_q4_0;
}

static void check_matmul_with(const st_kernels *a, uint32_t type, int64_t K, int64_t rows,
                              int64_t M) {
    const st_kernels *r = st_kernels_ref();
    size_t rb;
    void *w = make_weights(type, rows, K, &rb);
    float *x = malloc((size_t)(M * K + 1) * 4);
    fill(x, M * K, 2.0f);
    int quant = type == ST_DTYPE_Q8_0 || type == ST_DTYPE_Q4_0;
    int64_t nb = K / ST_QK;
    st_block_q8x *xq = malloc(sizeof(st_block_q8x) * (size_t)(M * nb + 1));
    st_block_q8x *xq2 = malloc(sizeof(st_block_q8x) * (size_t)(M * nb + 1));
    const void *xin = x;
    int64_t ldx = K;
    if (quant) {
        for (int64_t m = 0; m < M; m++) {
            r->quantize_q8x(xq + m * nb, x + m * K, K);
            a->quantize_q8x(xq2 + m * nb, x + m * K, K);
        }
        assert_memory_equal(xq, xq2, sizeof(st_block_q8x) * (size_t)(M * nb));
        xin = xq;
        ldx = nb;
    }
    float *y1 = calloc((size_t)(M * rows + 1), 4), *y2 = calloc((size_t)(M * rows + 1), 4),
          *y3 = calloc((size_t)(M * rows + 1), 4);
    st_matmul_fn fr = matmul_of(r, type), fa = matmul_of(a, type);
    fr(y1, rows, w, rb, xin, ldx, K, M, 0, rows);
    fa(y2, rows, w, rb, xin, ldx, K, M, 0, rows);
    assert_memory_equal(y1, y2, (size_t)(M * rows) * 4);
    /* batch and split invariance: each token alone, rows in two uneven parts */
    for (int64_t m = 0; m < M; m++) {
        const void *xm = quant ? (const void *)(xq + m * nb) : (const void *)(x + m * K);
        int64_t cut = rows / 3;
        fa(y3 + m * rows, rows, w, rb, xm, ldx, K, 1, 0, cut);
        fa(y3 + m * rows, rows, w, rb, xm, ldx, K, 1, cut, rows);
    }
    assert_memory_equal(y1, y3, (size_t)(M * rows) * 4);
    /* uneven token and row splits: tiles with every tail */
    if (M > 2) {
        const int64_t mc = M / 2 + 1, cut = rows / 2 + 1 < rows ? rows / 2 + 1 : rows;
        const size_t xstride = quant ? sizeof(st_block_q8x) : sizeof(float);
        const void *x2 = (const char *)xin + (size_t)(mc * ldx) * xstride;
        memset(y3, 0, (size_t)(M * rows) * 4);
        fa(y3, rows, w, rb, xin, ldx, K, mc, 0, cut);
        fa(y3, rows, w, rb, xin, ldx, K, mc, cut, rows);
        fa(y3 + mc * rows, rows, w, rb, x2, ldx, K, M - mc, 0, rows);
        assert_memory_equal(y1, y3, (size_t)(M * rows) * 4);
    }
    /* against a dequantized double-precision product, loosely: catches layout errors */
    float *wf = malloc((size_t)(K + 1) * 4);
    float *xf = malloc((size_t)(K + 1) * 4);
    for (int64_t row = 0; row < rows; row++) {
        st_dequant_row(type, (const uint8_t *)w + (size_t)row * rb, wf, K);
        for (int64_t m = 0; m < M; m += (M > 1 ? M - 1 : 1)) {
            if (quant)
                for (int64_t b = 0; b < nb; b++)
                    for (int j = 0; j < ST_QK; j++)
                        xf[b * ST_QK + j] = (float)xq[m * nb + b].q[j] * xq[m * nb + b].d;
            else
                memcpy(xf, x + m * K, (size_t)K * 4);
            double ex = 0, mag = 0;
            for (int64_t i = 0; i < K; i++) {
                ex += (double)wf[i] * xf[i];
                mag += fabs((double)wf[i] * xf[i]);
            }
            assert_true(fabs(ex - y1[m * rows + row]) <= 1e-5 * mag + 1e-6);
        }
    }
    free(wf), free(xf), free(w), free(x), free(xq), free(xq2), free(y1), free(y2), free(y3);
}

static void check_matmul(uint32_t type, int64_t K, int64_t rows, int64_t M) {
    const st_kernels *fast[2];
    const int n = fast_tables(fast);
    for (int i = 0; i < n; i++)
        check_matmul_with(fast[i], type, K, rows, M);
}

static void test_matmul_float(void **state) {
    (void)state;
    uint32_t types[] = {ST_DTYPE_F32, ST_DTYPE_F16, ST_DTYPE_BF16};
    for (size_t t = 0; t < 3; t++)
        for (size_t s = 1; s < sizeof sizes / sizeof sizes[0]; s++)
            for (size_t im = 0; im < sizeof ms / sizeof ms[0]; im++)
                check_matmul(types[t], sizes[s], sizes[s] > 100 ? 11 : 1 + (int64_t)im * 3, ms[im]);
}

static void test_matmul_quant(void **state) {
    (void)state;
    const int64_t ks[] = {32, 64, 96, 4096};
    for (int t = 0; t < 2; t++)
        for (size_t s = 0; s < 4; s++)
            for (size_t im = 0; im < sizeof ms / sizeof ms[0]; im++)
                check_matmul(t ? ST_DTYPE_Q4_0 : ST_DTYPE_Q8_0, ks[s],
                             ks[s] > 100 ? 13 : 1 + (int64_t)im * 3, ms[im]);
}

/* Packed Q8_0 (st_pack_q8_0): every table that has the packed kernel against the row-major
 * reference, bitwise, on whole ranges, on ranges cut at and between groups, with guard values
 * around the outputs; packing in place gives the same bytes as packing into a copy. */
static void check_q8p(int64_t K, int64_t rows, int64_t M) {
    const st_kernels *r = st_kernels_ref(), *fast[2];
    const int nfast = fast_tables(fast);
    size_t rb;
    void *w = make_weights(ST_DTYPE_Q8_0, rows, K, &rb);
    void *wp = malloc(rb * (size_t)rows + 1), *wi = malloc(rb * (size_t)rows + 1);
    assert_int_equal(st_pack_q8_0(wp, w, rb, rows, K), 0);
    memcpy(wi, w, rb * (size_t)rows);
    assert_int_equal(st_pack_q8_0(wi, wi, rb, rows, K), 0);
    assert_memory_equal(wp, wi, rb * (size_t)rows);
    const int64_t nb = K / ST_QK, ldy = rows + 5;
    float *x = malloc((size_t)(M * K) * 4);
    fill(x, M * K, 2.0f);
    st_block_q8x *xq = malloc(sizeof(st_block_q8x) * (size_t)(M * nb));
    for (int64_t m = 0; m < M; m++)
        r->quantize_q8x(xq + m * nb, x + m * K, K);
    float *y1 = malloc((size_t)(M * ldy) * 4), *y2 = malloc((size_t)(M * ldy) * 4);
    for (int64_t i = 0; i < M * ldy; i++)
        y1[i] = -7.0f;
    r->matmul_q8_0(y1, ldy, w, rb, xq, nb, K, M, 0, rows);
    const st_kernels *tabs[3] = {r, fast[0], nfast > 1 ? fast[1] : NULL};
    for (int it = 0; it < 3; it++) {
        const st_kernels *k = tabs[it];
        if (!k || !k->matmul_q8_0_packed)
            continue;
        const int64_t cuts[][2] = {{0, rows},  {0, rows / 2}, {rows / 2, rows},
                                   {16, rows}, {3, rows - 1}, {17, 18}};
        for (int amx = 1; amx >= 0; amx--) {
            st_amx_set(amx); /* the AVX-512 table's AMX path, and the AVX2 table's AVX-VNNI one */
            st_avxvnni_set(amx);
            for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
                const int64_t a = cuts[c][0] < rows ? cuts[c][0] : 0;
                const int64_t cb = cuts[c][1] < rows ? cuts[c][1] : rows;
                const int64_t b = cb > a ? cb : rows;
                for (int64_t i = 0; i < M * ldy; i++)
                    y2[i] = -7.0f;
                k->matmul_q8_0_packed(y2, ldy, wp, rb, rows, xq, nb, K, M, a, b);
                for (int64_t m = 0; m < M; m++)
                    for (int64_t i = 0; i < ldy; i++) {
                        const float want = i >= a && i < b ? y1[m * ldy + i] : -7.0f;
                        if (memcmp(&want, &y2[m * ldy + i], 4))
                            fail_msg(
                                "%s packed q8_0 K=%ld rows=%ld M=%ld [%ld,%ld) amx/avx-vnni %d: "
                                "token %ld row %ld: %a, want %a",
                                k->name, (long)K, (long)rows, (long)M, (long)a, (long)b, amx,
                                (long)m, (long)i, (double)y2[m * ldy + i], (double)want);
                    }
            }
        }
        st_amx_set(1);
        st_avxvnni_set(1);
    }
    free(w), free(wp), free(wi), free(x), free(xq), free(y1), free(y2);
}

static void test_matmul_q8_packed(void **state) {
    (void)state;
    print_message("AMX-INT8 %s, AVX-VNNI %s\n", st_amx_set(1) ? "in use" : "not available here",
                  st_avxvnni_set(1) ? "in use" : "not available here");
    const int64_t ks[] = {32, 96, 1056, 4096};
    const int64_t rowss[] = {1, 15, 16, 17, 40, 64, 130};
    const int64_t mss[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33};
    for (size_t a = 0; a < sizeof ks / sizeof ks[0]; a++)
        for (size_t b = 0; b < sizeof rowss / sizeof rowss[0]; b++)
            for (size_t c = 0; c < sizeof mss / sizeof mss[0]; c++)
                if (ks[a] * rowss[b] * mss[c] <= 4096 * 64 * 17)
                    check_q8p(ks[a], rowss[b], mss[c]);
    /* long rows: the VNNI kernel keeps the block sums of these tokens on the heap */
    check_q8p(14336, 17, 33);
    check_q8p(14336, 32, 20);
}

/* One packed matmul case: W rows x K (rows rb apart, NaN in the gaps), tokens ldx apart with
 * NaN between them, outputs ldy apart with guards; the row-major reference against the packed
 * kernel of the reference and of every fast table, bitwise, whole buffers (rows outside
 * [r0, r1) and the guards must stay). mode: 0 random with zeros of both signs, 1 every product
 * a negative underflow (each lane -0, so only a tail's 0*0 makes a sum +0), 2 zeros only,
 * 3 random. */
static void check_packed(int64_t K, int64_t rows, int64_t M, int64_t r0, int64_t r1, int mode) {
    const st_kernels *r = st_kernels_ref(), *fast[2];
    const int nfast = fast_tables(fast);
    const int64_t rbf = K + (K % 3 == 0), ldx = K + 1 + K % 2, ldy = rows + 3;
    float *w = malloc((size_t)(rows * rbf) * 4), *x = malloc((size_t)(M * ldx) * 4);
    float *wp = malloc(st_pack_f32_floats(rows, K) * 4);
    float *y1 = malloc((size_t)(M * ldy) * 4), *y2 = malloc((size_t)(M * ldy) * 4);
    for (int64_t i = 0; i < rows * rbf; i++)
        w[i] = NAN;
    for (int64_t i = 0; i < M * ldx; i++)
        x[i] = NAN;
    for (int64_t j = 0; j < rows; j++)
        mode == 3 ? fill(w + j * rbf, K, 1.0f) : fill_signed_zeros(w + j * rbf, K, mode, 1.0f);
    for (int64_t m = 0; m < M; m++)
        mode == 3 ? fill(x + m * ldx, K, 2.0f) : fill_signed_zeros(x + m * ldx, K, mode, -1.0f);
    fill(y1, M * ldy, 1.0f);
    memcpy(y2, y1, (size_t)(M * ldy) * 4);
    r->matmul_f32(y1, ldy, w, (size_t)rbf * 4, x, ldx, K, M, r0, r1);
    st_pack_f32(wp, w, (size_t)rbf * 4, rows, K);
    float *guard = malloc((size_t)(M * ldy) * 4);
    memcpy(guard, y2, (size_t)(M * ldy) * 4);
    for (int ia = -1; ia < nfast; ia++) {
        const st_kernels *a = ia < 0 ? r : fast[ia];
        if (!a->matmul_f32_packed)
            continue;
        memcpy(y2, guard, (size_t)(M * ldy) * 4);
        a->matmul_f32_packed(y2, ldy, wp, x, ldx, K, M, r0, r1);
        assert_memory_equal(y1, y2, (size_t)(M * ldy) * 4);
    }
    free(w), free(x), free(wp), free(y1), free(y2), free(guard);
}

/* The packed float matmul against the row-major reference: every K up to 48 and steps to 600
 * (64, 172, 256, 512 and every remainder mod 8 among them), M 1 .. 20, 1 .. 45 rows (blocks of
 * 16 and their tails), whole and partial row ranges that cut blocks, four kinds of data; then
 * 600 rows x 600 (the prefetching path). */
static void test_matmul_packed(void **state) {
    (void)state;
    const int64_t extra[] = {63, 64, 65, 127, 128, 129, 172, 255, 256, 257, 511, 512, 513, 600};
    const int nextra = (int)(sizeof extra / sizeof extra[0]);
    for (int64_t s = 1; s <= 48 + 42 + nextra; s++) {
        const int64_t K = s <= 48 ? s : s <= 90 ? 48 + 13 * (s - 48) : extra[s - 91];
        const int all_m = K <= 20 || s > 90;
        for (int64_t M = 1; M <= 20; M++) {
            if (!all_m && M != 1 && M != 2 && M != 3 && M != 4 && M != 5 + K % 16)
                continue;
            const int64_t rows = 1 + (K * 13 + M * 7) % 45;
            const int mode = (int)((K + M) % 4);
            check_packed(K, rows, M, 0, rows, mode);
            if (rows > 2)
                check_packed(K, rows, M, 1 + (K + M) % (rows / 2), rows - (K % 3), 3 - mode);
        }
    }
    /* over a megabyte of rows: four tokens or more prefetch the next block */
    for (int64_t M = 3; M <= 7; M += 2) {
        check_packed(600, 600, M, 0, 600, 3);
        check_packed(597, 601, M, 5, 590, (int)M % 3);
    }
}

static void test_fp16_roundtrip(void **state) {
    (void)state;
    /* every half value converts to float and back exactly (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = st_fp16_to_f32((uint16_t)h);
        uint16_t back = st_f32_to_fp16(f);
        if (isnan(f))
            assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
        else
            assert_int_equal(back, h);
    }
    assert_int_equal(st_f32_to_fp16(65520.0f), 0x7c00);
    assert_int_equal(st_f32_to_fp16(1.0f + 1.0f / 2048), 0x3c00); /* tie to even */
    assert_int_equal(st_f32_to_bf16(1.0f), 0x3f80);
    assert_true(st_bf16_to_f32(0x3f80) == 1.0f);
}

/* f16_to_f32 (an f16 KV cache's rows): every table converts every non-NaN half exactly, at
 * every length (vector bodies and tails). */
static void test_f16_to_f32(void **state) {
    (void)state;
    enum { N = 65536 };
    uint16_t *h = malloc(N * sizeof *h);
    float *want = malloc(N * sizeof *want), *got = malloc(N * sizeof *got);
    assert_true(h && want && got);
    int64_t n = 0;
    for (uint32_t v = 0; v < 65536; v++)
        if (!isnan(st_fp16_to_f32((uint16_t)v)))
            h[n++] = (uint16_t)v;
    const st_kernels *t[3] = {st_kernels_ref(), NULL, NULL};
    const int nt = 1 + fast_tables(t + 1);
    for (int64_t i = 0; i < n; i++)
        want[i] = st_fp16_to_f32(h[i]);
    for (int k = 0; k < nt; k++) {
        t[k]->f16_to_f32(got, h, n);
        assert_memory_equal(got, want, (size_t)n * sizeof(float));
        for (int64_t len = 0; len <= 17; len++) {
            memset(got, 0xff, 32 * sizeof(float));
            t[k]->f16_to_f32(got, h + 1000 + len, len);
            assert_memory_equal(got, want + 1000 + len, (size_t)len * sizeof(float));
            assert_true(isnan(got[len])); /* nothing past n written */
        }
    }
    free(h), free(want), free(got);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_to_f32),     cmocka_unit_test(test_dot),
        cmocka_unit_test(test_attn),           cmocka_unit_test(test_attn_small),
        cmocka_unit_test(test_softmax),        cmocka_unit_test(test_exp_silu),
        cmocka_unit_test(test_matmul_float),   cmocka_unit_test(test_matmul_quant),
        cmocka_unit_test(test_matmul_packed),  cmocka_unit_test(test_matmul_q8_packed),
        cmocka_unit_test(test_fp16_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
