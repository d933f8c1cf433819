/*
 * test_kernels_kquant.c: the K-quant matmuls (Q2_K .. Q6_K). Every optimized table against the
 * `_ref` twin, bitwise, on 1..3 super-blocks and a long row, row counts around the tiles, 1..N
 * tokens, uneven row and token splits (batch invariance); the reference against a
 * double-precision product of the dequantized weights and activations (catches layout errors:
 * the dequantization itself is checked against gguf-py in test_kquant); and the unpacked
 * super-blocks of st_kq_unpack against the dequantized values.
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

static const uint32_t types[] = {ST_DTYPE_Q2_K, ST_DTYPE_Q3_K, ST_DTYPE_Q4_K, ST_DTYPE_Q5_K,
                                 ST_DTYPE_Q6_K};
static const int64_t ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 17, 64};

static uint64_t rs = 0x9e3779b97f4a7c15u;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}
static float frand(void) { return (float)((double)rnd() / 4294967296.0 * 2.0 - 1.0); }

/* Random blocks: random quant and scale bytes, fp16 scales of either sign and of realistic size
 * (a zero dmin now and then). */
static uint8_t *make_weights(uint32_t type, int64_t rows, int64_t K, size_t *rb) {
    *rb = st_row_bytes(type, K);
    const size_t bb = st_kquant_block_bytes(type);
    uint8_t *w = malloc(*rb * (size_t)rows);
    for (size_t i = 0; i < *rb * (size_t)rows; i++)
        w[i] = (uint8_t)rnd();
    for (int64_t b = 0; b < rows * (K / ST_QK_K); b++) {
        uint8_t *blk = w + (size_t)b * bb;
        const uint16_t d = st_f32_to_fp16(0.001f + 0.01f * frand());
        const uint16_t dmin = b % 5 == 0 ? 0 : st_f32_to_fp16(0.002f * frand());
        switch (type) {
        case ST_DTYPE_Q2_K:
            memcpy(blk + 80, &d, 2), memcpy(blk + 82, &dmin, 2);
            break;
        case ST_DTYPE_Q3_K:
            memcpy(blk + 108, &d, 2);
            break;
        case ST_DTYPE_Q4_K:
        case ST_DTYPE_Q5_K:
            memcpy(blk, &d, 2), memcpy(blk + 2, &dmin, 2);
            break;
        default:
            memcpy(blk + 208, &d, 2);
            break;
        }
    }
    return w;
}

static void check_case(uint32_t type, int64_t K, int64_t rows, int64_t M) {
    const st_kernels *ref = st_kernels_ref();
    const st_kernels *fast[2] = {st_kernels_avx2(), st_kernels_avx512()};
    size_t rb;
    uint8_t *w = make_weights(type, rows, K, &rb);
    const int64_t nb = K / ST_QK_K;
    float *x = malloc((size_t)(M * K) * 4);
    for (int64_t i = 0; i < M * K; i++)
        x[i] = frand() * (i % 97 == 0 ? 8.0f : 1.0f);
    st_block_q8k *xq = malloc(sizeof(st_block_q8k) * (size_t)(M * nb));
    for (int64_t m = 0; m < M; m++)
        st_quantize_q8k(xq + m * nb, x + m * K, K);
    const size_t ybytes = (size_t)(M * rows) * 4;
    float *y1 = malloc(ybytes), *y2 = malloc(ybytes);
    st_kernels_matmul(ref, type)(y1, rows, w, rb, xq, nb, K, M, 0, rows);
    for (int f = 0; f < 2; f++) {
        if (!fast[f])
            continue;
        const st_matmul_fn fn = st_kernels_matmul(fast[f], type);
        memset(y2, 0xff, ybytes);
        fn(y2, rows, w, rb, xq, nb, K, M, 0, rows);
        if (memcmp(y1, y2, ybytes) != 0)
            fail_msg("%s %s: K %lld rows %lld M %lld differs from ref", fast[f]->name,
                     st_dtype_name(type), (long long)K, (long long)rows, (long long)M);
        /* each token alone, rows in two uneven parts; then uneven token halves */
        memset(y2, 0xff, ybytes);
        for (int64_t m = 0; m < M; m++) {
            fn(y2 + m * rows, rows, w, rb, xq + m * nb, nb, K, 1, 0, rows / 3);
            fn(y2 + m * rows, rows, w, rb, xq + m * nb, nb, K, 1, rows / 3, rows);
        }
        assert_memory_equal(y1, y2, ybytes);
        const int64_t mc = M / 2 + 1 < M ? M / 2 + 1 : M;
        memset(y2, 0xff, ybytes);
        fn(y2, rows, w, rb, xq, nb, K, mc, 0, rows);
        if (mc < M)
            fn(y2 + mc * rows, rows, w, rb, xq + mc * nb, nb, K, M - mc, 0, rows);
        assert_memory_equal(y1, y2, ybytes);
    }
    /* the reference against the dequantized product in double precision */
    float *wf = malloc((size_t)K * 4);
    for (int64_t r = 0; r < rows; r++) {
        st_dequant_row(type, w + (size_t)r * rb, wf, K);
        for (int64_t m = 0; m < M; m++) {
            double ex = 0.0, mag = 0.0;
            for (int64_t i = 0; i < K; i++) {
                const st_block_q8k *xb = xq + m * nb + i / ST_QK_K;
                const double p = (double)wf[i] * ((double)xb->q[i % ST_QK_K] * (double)xb->d);
                ex += p;
                mag += fabs(p);
            }
            const double got = y1[m * rows + r];
            if (!(fabs(got - ex) <= 2e-6 * mag + 1e-30))
                fail_msg("ref %s: K %lld row %lld token %lld: %.9g, dequantized product %.9g",
                         st_dtype_name(type), (long long)K, (long long)r, (long long)m, got, ex);
        }
    }
    free(wf), free(w), free(x), free(xq), free(y1), free(y2);
}

static void test_matmul_kquant(void **state) {
    (void)state;
    const int64_t ks[] = {256, 512, 768, 4096};
    for (size_t t = 0; t < 5; t++)
        for (size_t s = 0; s < 4; s++)
            for (size_t im = 0; im < sizeof ms / sizeof ms[0]; im++)
                check_case(types[t], ks[s], ks[s] > 1000 ? 9 : 1 + (int64_t)(im * 5 + s) % 19,
                           ms[im]);
}

/* Packed Q4_K / Q5_K / Q6_K (st_pack_kq): the packed matmul of every table that has one against the
 * row-major reference, bitwise, on whole ranges and ranges cut at and inside groups, with guard
 * values around the outputs, for row counts around the 8-row groups and 1..64 tokens; packing in
 * place gives the bytes of packing into a copy, and every row reads back as it was. */
static st_matmul_q8p_fn packed_of(const st_kernels *k, uint32_t type) {
    return type == ST_DTYPE_Q4_K   ? k->matmul_q4_k_packed
           : type == ST_DTYPE_Q5_K ? k->matmul_q5_k_packed
                                   : k->matmul_q6_k_packed;
}

static void check_packed(uint32_t type, int64_t K, int64_t rows, int64_t M) {
    const st_kernels *tabs[3] = {st_kernels_ref(), st_kernels_avx2(), st_kernels_avx512()};
    size_t rb;
    uint8_t *w = make_weights(type, rows, K, &rb);
    uint8_t *wp = malloc(rb * (size_t)rows), *wi = malloc(rb * (size_t)rows), *row = malloc(rb);
    assert_int_equal(st_pack_kq(type, wp, w, rb, rows, K), 0);
    memcpy(wi, w, rb * (size_t)rows);
    assert_int_equal(st_pack_kq(type, wi, wi, rb, rows, K), 0);
    assert_memory_equal(wp, wi, rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        st_kq_packed_row(type, wp, rb, rows, K, r, row);
        assert_memory_equal(row, w + (size_t)r * rb, rb);
    }
    const int64_t nb = K / ST_QK_K, ldy = rows + 3;
    float *x = malloc((size_t)(M * K) * 4);
    for (int64_t i = 0; i < M * K; i++)
        x[i] = frand() * (i % 89 == 0 ? 8.0f : 1.0f);
    st_block_q8k *xq = malloc(sizeof(st_block_q8k) * (size_t)(M * nb));
    for (int64_t m = 0; m < M; m++)
        st_quantize_q8k(xq + m * nb, x + m * K, K);
    float *y1 = malloc((size_t)(M * ldy) * 4), *y2 = malloc((size_t)(M * ldy) * 4);
    for (int64_t i = 0; i < M * ldy; i++)
        y1[i] = -7.0f;
    st_kernels_matmul(tabs[0], type)(y1, ldy, w, rb, xq, nb, K, M, 0, rows);
    const int64_t cuts[][2] = {{0, rows}, {0, rows / 2}, {rows / 2, rows},
                               {8, rows}, {3, rows - 1}, {9, 10}};
    for (int it = 0; it < 3; it++) {
        const st_kernels *k = tabs[it];
        if (!k || !packed_of(k, type))
            continue;
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
            const int64_t a = cuts[c][0] < rows ? cuts[c][0] : 0;
            const int64_t cb = cuts[c][1] < rows ? cuts[c][1] : rows;
            const int64_t b = cb > a ? cb : rows;
            for (int64_t i = 0; i < M * ldy; i++)
                y2[i] = -7.0f;
            packed_of(k, type)(y2, ldy, wp, rb, rows, xq, nb, K, M, a, b);
            for (int64_t m = 0; m < M; m++)
                for (int64_t i = 0; i < ldy; i++) {
                    const float want = i >= a && i < b ? y1[m * ldy + i] : -7.0f;
                    if (memcmp(&want, &y2[m * ldy + i], 4))
                        fail_msg("%s packed %s K=%ld rows=%ld M=%ld [%ld,%ld): token %ld row "
                                 "%ld: %a, want %a",
                                 k->name, st_dtype_name(type), (long)K, (long)rows, (long)M,
                                 (long)a, (long)b, (long)m, (long)i, (double)y2[m * ldy + i],
                                 (double)want);
                }
        }
    }
    /* ggml's order on packed rows equals it on row-major ones */
    for (int64_t i = 0; i < M * ldy; i++)
        y1[i] = y2[i] = -7.0f;
    st_matmul_kq_ggml(type, y1, ldy, w, rb, xq, nb, K, M, 0, rows);
    st_matmul_kq_packed_rows(type, 1, y2, ldy, wp, rb, rows, xq, nb, K, M, 0, rows);
    assert_memory_equal(y1, y2, (size_t)(M * ldy) * 4);
    free(w), free(wp), free(wi), free(row), free(x), free(xq), free(y1), free(y2);
}

static void test_matmul_kquant_packed(void **state) {
    (void)state;
    const uint32_t pt[] = {ST_DTYPE_Q4_K, ST_DTYPE_Q5_K, ST_DTYPE_Q6_K};
    const int64_t ks[] = {256, 768, 2048};
    const int64_t rowss[] = {1, 7, 8, 9, 16, 23, 40};
    const int64_t mss[] = {1, 2, 3, 4, 5, 7, 8, 16, 17, 64};
    for (size_t t = 0; t < 3; t++) {
        assert_true(st_kq_packable(pt[t]));
        for (size_t a = 0; a < sizeof ks / sizeof ks[0]; a++)
            for (size_t b = 0; b < sizeof rowss / sizeof rowss[0]; b++)
                for (size_t c = 0; c < sizeof mss / sizeof mss[0]; c++)
                    if (ks[a] * rowss[b] * mss[c] <= 768 * 40 * 64)
                        check_packed(pt[t], ks[a], rowss[b], mss[c]);
    }
    assert_false(st_kq_packable(ST_DTYPE_Q3_K));
    assert_int_equal(st_pack_kq(ST_DTYPE_Q3_K, NULL, NULL, 110, 8, 256), -1);
}

/* st_kq_unpack: sc * (q - zero) - min rebuilds each dequantized value (up to rounding). */
static void test_unpack(void **state) {
    (void)state;
    for (size_t t = 0; t < 5; t++) {
        size_t rb;
        uint8_t *w = make_weights(types[t], 8, ST_QK_K, &rb);
        for (int r = 0; r < 8; r++) {
            float ref[ST_QK_K];
            st_kq_unpacked u;
            st_dequant_row(types[t], w + (size_t)r * rb, ref, ST_QK_K);
            st_kq_unpack(types[t], w + (size_t)r * rb, &u);
            const int sym = types[t] == ST_DTYPE_Q3_K || types[t] == ST_DTYPE_Q6_K;
            for (int e = 0; e < ST_QK_K; e++) {
                const int j = e / 16;
                const double v = sym ? (double)u.d * (u.sc[j] * (double)u.q[e] - u.bz[j])
                                     : (double)u.d * u.sc[j] * u.q[e] - (double)u.dmin * u.bz[j];
                assert_true(fabs(v - ref[e]) <= 1e-6 * (fabs(v) + 1e-3));
            }
        }
        free(w);
    }
}

/* The activation quantizer: the largest magnitude maps to -127, sums match, zero stays zero. */
static void test_quantize_q8k(void **state) {
    (void)state;
    float x[2 * ST_QK_K];
    for (int i = 0; i < 2 * ST_QK_K; i++)
        x[i] = i < ST_QK_K ? frand() : 0.0f;
    x[17] = 3.0f;
    st_block_q8k q[2];
    st_quantize_q8k(q, x, 2 * ST_QK_K);
    assert_int_equal(q[0].q[17], -127);
    assert_true(q[0].d == 1.0f / (-127.0f / 3.0f));
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int e = 0; e < 16; e++)
            s += q[0].q[16 * j + e];
        assert_int_equal(q[0].bsums[j], s);
    }
    assert_true(q[1].d == 0.0f);
    for (int e = 0; e < ST_QK_K; e++) {
        assert_int_equal(q[1].q[e], 0);
        assert_true(fabsf(q[0].q[e] * q[0].d - x[e]) <= 0.5f * fabsf(q[0].d) * 1.0001f);
    }
}

/* Every table's quantize_q8k against st_quantize_q8k, bitwise, on blocks that exercise its edge
 * cases: random values, a zero block, an infinity, NaNs beside numbers, the largest magnitude
 * twice with opposite signs (the first decides the sign of the scale), products that round to
 * even (x * iscale = k + 0.5), tiny and huge magnitudes. */
static void test_quantize_q8k_tables(void **state) {
    (void)state;
    enum { NB = 9 };
    float *x = malloc(sizeof(float) * NB * ST_QK_K);
    for (int i = 0; i < NB * ST_QK_K; i++)
        x[i] = frand();
    for (int e = 0; e < ST_QK_K; e++)
        x[ST_QK_K + e] = 0.0f;     /* block 1: zeros */
    x[2 * ST_QK_K + 9] = INFINITY; /* block 2: an infinity */
    x[3 * ST_QK_K + 4] = NAN;      /* block 3: NaNs among numbers */
    x[3 * ST_QK_K + 200] = -NAN;
    x[4 * ST_QK_K + 30] = 5.0f; /* block 4: +5 first, then -5 */
    x[4 * ST_QK_K + 31] = -5.0f;
    x[5 * ST_QK_K + 7] = -5.0f; /* block 5: -5 first, then +5 */
    x[5 * ST_QK_K + 100] = 5.0f;
    for (int e = 0; e < ST_QK_K; e++) /* block 6: max 127, values k + 0.5 */
        x[6 * ST_QK_K + e] = e == 0 ? -127.0f : (float)(e % 120) + 0.5f;
    for (int e = 0; e < ST_QK_K; e++) { /* blocks 7, 8: tiny and huge */
        x[7 * ST_QK_K + e] *= 1e-38f;
        x[8 * ST_QK_K + e] *= 3e38f;
    }
    st_block_q8k *a = malloc(sizeof(st_block_q8k) * NB), *b = malloc(sizeof(st_block_q8k) * NB);
    st_quantize_q8k(a, x, NB * ST_QK_K);
    assert_true(a[4].d < 0.0f && a[5].d > 0.0f); /* the first largest magnitude counts */
    const st_kernels *tabs[3] = {st_kernels_ref(), st_kernels_avx2(), st_kernels_avx512()};
    int checked = 0;
    for (int t = 0; t < 3; t++) {
        if (!tabs[t])
            continue;
        memset(b, 0x5a, sizeof(st_block_q8k) * NB);
        tabs[t]->quantize_q8k(b, x, NB * ST_QK_K);
        for (int k = 0; k < NB; k++)
            if (memcmp(&a[k], &b[k], sizeof a[k]))
                fail_msg("%s quantize_q8k: block %d differs from st_quantize_q8k", tabs[t]->name,
                         k);
        checked++;
    }
    print_message("quantize_q8k: %d tables checked\n", checked);
    free(x), free(a), free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_q8k),
        cmocka_unit_test(test_quantize_q8k_tables),
        cmocka_unit_test(test_unpack),
        cmocka_unit_test(test_matmul_kquant),
        cmocka_unit_test(test_matmul_kquant_packed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
