/*
 * test_kernels_batch.c: the whole matmul matrix against the scalar reference, bitwise. Every
 * table this CPU has (ref, AVX2 with and without AVX-VNNI, AVX-512 with and without AMX: the
 * st_avxvnni_set / st_amx_set switches), every weight type (F32, F16, BF16, Q8_0, Q4_0,
 * Q2_K .. Q6_K), row-major and packed (st_pack_f32, st_pack_q8_0, st_pack_q4_0, st_pack_kq)
 * kernels, N = 1 .. 17, 31, 32, 33, 63 and 64 tokens, row counts that are no multiple of any
 * tile or group (1, 15, 17, 47), whole row ranges and ranges cut inside groups, outputs with
 * guard values between them (nothing outside the range may change); then rows of 1031 or 4096
 * elements.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

static const int64_t ns[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                             12, 13, 14, 15, 16, 17, 31, 32, 33, 63, 64};
static const int64_t rowss[] = {1, 15, 17, 47};
static const uint32_t types[] = {ST_DTYPE_F32,  ST_DTYPE_F16,  ST_DTYPE_BF16, ST_DTYPE_Q8_0,
                                 ST_DTYPE_Q4_0, ST_DTYPE_Q2_K, ST_DTYPE_Q3_K, ST_DTYPE_Q4_K,
                                 ST_DTYPE_Q5_K, ST_DTYPE_Q6_K};

static uint64_t rs = 0x2545f4914f6cdd1du;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}
static float frand(void) { return (float)((double)rnd() / 4294967296.0 * 2.0 - 1.0); }

/* K of a case: float rows with a tail of 8, three Q8 blocks, two K-quant super-blocks. */
static int64_t k_of(uint32_t type) {
    return type == ST_DTYPE_F32 || type == ST_DTYPE_F16 || type == ST_DTYPE_BF16 ? 41
           : st_kquant_block_bytes(type)                                         ? 512
                                                                                 : 96;
}

/* rows x K random weights of the type: random quant bytes, realistic fp16 scales of either sign
 * (the scales sit at the start of Q8_0 / Q4_0 / Q4_K / Q5_K blocks, at the end of the others). */
static uint8_t *make_weights(uint32_t type, int64_t rows, int64_t K, size_t *rb) {
    *rb = st_row_bytes(type, K);
    uint8_t *w = malloc(*rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = w + (size_t)r * *rb;
        if (type == ST_DTYPE_F32 || type == ST_DTYPE_F16 || type == ST_DTYPE_BF16) {
            for (int64_t i = 0; i < K; i++) {
                const float v = frand();
                const uint16_t h = type == ST_DTYPE_F16 ? st_f32_to_fp16(v) : st_f32_to_bf16(v);
                if (type == ST_DTYPE_F32)
                    memcpy(row + 4 * i, &v, 4);
                else
                    memcpy(row + 2 * i, &h, 2);
            }
            continue;
        }
        for (size_t i = 0; i < *rb; i++)
            row[i] = (uint8_t)rnd();
        const size_t bb = st_kquant_block_bytes(type);
        const size_t step = bb ? bb : type == ST_DTYPE_Q8_0 ? 34 : 18;
        const size_t at = type == ST_DTYPE_Q2_K   ? 80
                          : type == ST_DTYPE_Q3_K ? 108
                          : type == ST_DTYPE_Q6_K ? 208
                                                  : 0;
        for (size_t b = 0; b < *rb / step; b++) {
            uint16_t d[2] = {st_f32_to_fp16(0.002f + 0.01f * frand()),
                             st_f32_to_fp16(0.003f * frand())};
            memcpy(row + b * step + at, d, type == ST_DTYPE_Q2_K || (at == 0 && bb) ? 4 : 2);
            if (type == ST_DTYPE_Q8_0)
                row[b * step + 2 + b % 32] = 0x80; /* -128, the extreme quant */
        }
    }
    return w;
}

/* The table's packed quantized matmul for the type, or NULL. */
static st_matmul_q8p_fn packed_of(const st_kernels *k, uint32_t t) {
    return t == ST_DTYPE_Q8_0   ? k->matmul_q8_0_packed
           : t == ST_DTYPE_Q4_0 ? k->matmul_q4_0_packed
           : t == ST_DTYPE_Q4_K ? k->matmul_q4_k_packed
           : t == ST_DTYPE_Q5_K ? k->matmul_q5_k_packed
           : t == ST_DTYPE_Q6_K ? k->matmul_q6_k_packed
                                : NULL;
}

static int pack_into(uint32_t t, void *dst, const void *src, size_t rb, int64_t rows, int64_t K) {
    return t == ST_DTYPE_Q8_0   ? st_pack_q8_0(dst, src, rb, rows, K)
           : t == ST_DTYPE_Q4_0 ? st_pack_q4_0(dst, src, rb, rows, K)
                                : st_pack_kq(t, dst, src, rb, rows, K);
}

typedef struct ctx {
    uint32_t type;
    int64_t K, rows, M, ldy;
    const float *want; /* the reference's row-major results, guards included */
} ctx;

static void expect(const ctx *c, const float *got, const char *table, const char *path, int sw,
                   int64_t r0, int64_t r1) {
    for (int64_t m = 0; m < c->M; m++)
        for (int64_t i = 0; i < c->ldy; i++) {
            const float want = i >= r0 && i < r1 ? c->want[m * c->ldy + i] : -7.0f;
            if (memcmp(&want, &got[m * c->ldy + i], 4))
                fail_msg("%s %s %s (switch %d): K %ld rows %ld N %ld [%ld, %ld): token %ld row "
                         "%ld: %a, want %a",
                         table, path, st_dtype_name(c->type), sw, (long)c->K, (long)c->rows,
                         (long)c->M, (long)r0, (long)r1, (long)m, (long)i,
                         (double)got[m * c->ldy + i], (double)want);
        }
}

static void guards(float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = -7.0f;
}

static void check_case(uint32_t type, int64_t K, int64_t rows, int64_t M) {
    const int64_t ldy = rows + 3;
    const int kq = st_kquant_block_bytes(type) != 0;
    const int q8 = type == ST_DTYPE_Q8_0 || type == ST_DTYPE_Q4_0;
    size_t rb;
    uint8_t *w = make_weights(type, rows, K, &rb);
    float *xf = malloc((size_t)(M * K) * 4);
    for (int64_t i = 0; i < M * K; i++)
        xf[i] = frand() * (i % 89 == 0 ? 8.0f : 1.0f);
    const void *x = xf;
    int64_t ldx = K;
    void *xq = NULL;
    if (q8) {
        st_block_q8x *b = malloc(sizeof *b * (size_t)(M * (K / ST_QK)));
        for (int64_t m = 0; m < M; m++)
            st_kernels_ref()->quantize_q8x(b + m * (K / ST_QK), xf + m * K, K);
        x = xq = b, ldx = K / ST_QK;
    } else if (kq) {
        st_block_q8k *b = malloc(sizeof *b * (size_t)(M * (K / ST_QK_K)));
        for (int64_t m = 0; m < M; m++)
            st_quantize_q8k(b + m * (K / ST_QK_K), xf + m * K, K);
        x = xq = b, ldx = K / ST_QK_K;
    }
    const size_t ybytes = (size_t)(M * ldy) * 4;
    float *want = malloc(ybytes), *got = malloc(ybytes);
    guards(want, M * ldy);
    st_kernels_matmul(st_kernels_ref(), type)(want, ldy, w, rb, x, ldx, K, M, 0, rows);
    const ctx c = {type, K, rows, M, ldy, want};
    /* the packed copies: quantized in place-compatible layout, float into its own buffer */
    uint8_t *wp = malloc(rb * (size_t)rows);
    const int qpacked = q8 || st_kq_packable(type);
    if (qpacked)
        assert_int_equal(pack_into(type, wp, w, rb, rows, K), 0);
    float *fp = NULL;
    if (type == ST_DTYPE_F32) {
        fp = malloc(st_pack_f32_floats(rows, K) * 4);
        st_pack_f32(fp, (const float *)w, rb, rows, K);
    }
    const int64_t cut0 = rows / 3, cut1 = rows - rows / 4 > cut0 ? rows - rows / 4 : rows;
    const st_kernels *tabs[3] = {st_kernels_ref(), st_kernels_avx2(), st_kernels_avx512()};
    for (int ti = 0; ti < 3; ti++) {
        const st_kernels *k = tabs[ti];
        if (!k)
            continue;
        for (int sw = 1; sw >= (ti ? 0 : 1); sw--) {
            st_avxvnni_set(sw);
            st_amx_set(sw);
            guards(got, M * ldy);
            st_kernels_matmul(k, type)(got, ldy, w, rb, x, ldx, K, M, 0, rows);
            expect(&c, got, k->name, "row-major", sw, 0, rows);
            guards(got, M * ldy);
            st_kernels_matmul(k, type)(got, ldy, w, rb, x, ldx, K, M, cut0, cut1);
            expect(&c, got, k->name, "row-major", sw, cut0, cut1);
            const st_matmul_q8p_fn pf = packed_of(k, type);
            if (qpacked && pf)
                for (int cut = 0; cut < 2; cut++) {
                    const int64_t a = cut ? cut0 : 0, b = cut ? cut1 : rows;
                    guards(got, M * ldy);
                    pf(got, ldy, wp, rb, rows, x, ldx, K, M, a, b);
                    expect(&c, got, k->name, "packed", sw, a, b);
                }
            if (fp && k->matmul_f32_packed)
                for (int cut = 0; cut < 2; cut++) {
                    const int64_t a = cut ? cut0 : 0, b = cut ? cut1 : rows;
                    guards(got, M * ldy);
                    k->matmul_f32_packed(got, ldy, fp, xf, K, K, M, a, b);
                    expect(&c, got, k->name, "packed", sw, a, b);
                }
        }
    }
    st_avxvnni_set(1);
    st_amx_set(1);
    free(w), free(xf), free(xq), free(want), free(got), free(wp), free(fp);
}

static void test_matrix(void **state) {
    (void)state;
    print_message("tables: ref%s%s; AVX-VNNI %s, AMX %s\n", st_kernels_avx2() ? ", avx2" : "",
                  st_kernels_avx512() ? ", avx512" : "",
                  st_avxvnni_set(1) ? "in use" : "not available here",
                  st_amx_set(1) ? "in use" : "not available here");
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t r = 0; r < sizeof rowss / sizeof rowss[0]; r++)
            for (size_t n = 0; n < sizeof ns / sizeof ns[0]; n++)
                check_case(types[t], k_of(types[t]), rowss[r], ns[n]);
    /* long rows (the packed kernels prefetch the next group while a tile computes) */
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (int64_t M = 3; M <= 33; M += 30)
            check_case(types[t], k_of(types[t]) == 41 ? 1031 : 4096, 47, M);
}

/* st_pack_q4_0 in place gives the bytes of packing into a copy; the layout of kernels.h. */
static void test_pack_q4_0(void **state) {
    (void)state;
    size_t rb;
    const int64_t rows = 35, K = 96;
    uint8_t *w = make_weights(ST_DTYPE_Q4_0, rows, K, &rb);
    uint8_t *a = malloc(rb * rows), *b = malloc(rb * rows);
    assert_int_equal(st_pack_q4_0(a, w, rb, rows, K), 0);
    memcpy(b, w, rb * rows);
    assert_int_equal(st_pack_q4_0(b, b, rb, rows, K), 0);
    assert_memory_equal(a, b, rb * rows);
    for (int64_t r = 0; r < 32; r++)
        for (int64_t blk = 0; blk < K / ST_QK; blk++) {
            const st_block_q4_0 *src = (const st_block_q4_0 *)(w + r * rb) + blk;
            const uint8_t *p = a + (r / 16) * 16 * rb + blk * ST_Q4P_GROUP_BYTES;
            assert_memory_equal(p + 2 * (r % 16), &src->d, 2);
            for (int k = 0; k < 4; k++)
                assert_memory_equal(p + 32 + 64 * k + 4 * (r % 16), src->qs + 4 * k, 4);
        }
    assert_memory_equal(a + 32 * rb, w + 32 * rb, 3 * rb); /* the tail stays row-major */
    free(w), free(a), free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_q4_0),
        cmocka_unit_test(test_matrix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
