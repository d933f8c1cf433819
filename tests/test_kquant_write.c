/*
 * test_kquant_write.c: the K-quant writer (kquant_quantize.c).
 * - Exact: every K-quant tensor of llama.cpp's files in tests/data/kquant, requantized here
 *   from the F32 file they were made from, has llama-quantize's bytes.
 * - Round trip on random and degenerate rows: each element dequantizes to within half a step of
 *   its sub-block (or lies past the end of the quant range it was clamped to).
 * - The per-tensor types of the mixes (Q4_K_M ...) equal those of llama.cpp's files.
 * - Refusals: lengths that are not whole super-blocks, non-finite values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "io/gguf_write.h"
#include "kernels/kernels.h"
#include "spectree.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint32_t kq_types[] = {ST_DTYPE_Q2_K, ST_DTYPE_Q3_K, ST_DTYPE_Q4_K, ST_DTYPE_Q5_K,
                                    ST_DTYPE_Q6_K};
enum { N_KQ = 5 };

static void test_llama_cpp_bytes(void **state) {
    (void)state;
    static const char *files[] = {"x256-Q2_K", "x256-Q3_K_M", "x256-Q4_K_M", "x256-Q5_K_M",
                                  "x256-Q6_K"};
    char path[4096];
    snprintf(path, sizeof path, "%s", tu_data("tests/data/kquant/x256-f32.gguf"));
    st_gguf *src = NULL;
    if (st_gguf_open(path, &src) != ST_OK)
        fail_msg("%s: %s", path, st_last_error());
    int per_type[N_KQ] = {0};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/kquant/%s.gguf", files[f]);
        snprintf(path, sizeof path, "%s", tu_data(rel));
        st_gguf *g = NULL;
        if (st_gguf_open(path, &g) != ST_OK)
            fail_msg("%s: %s", path, st_last_error());
        for (int64_t i = 0; i < st_gguf_n_tensors(g); i++) {
            const st_gguf_tensor *t = st_gguf_tensor_at(g, i);
            if (!st_kquant_block_bytes(t->type))
                continue;
            const st_gguf_tensor *s = st_gguf_tensor_find(src, t->name);
            assert_non_null(s);
            assert_int_equal(s->type, ST_DTYPE_F32);
            const int64_t K = t->ne[0], rows = t->ne[1];
            assert_int_equal(s->ne[0], K);
            assert_int_equal(s->ne[1], rows);
            const size_t rb = st_row_bytes(t->type, K);
            uint8_t *q = malloc(rb);
            assert_non_null(q);
            int64_t bad_blocks = 0;
            for (int64_t r = 0; r < rows; r++) {
                const float *x = (const float *)s->data + r * K;
                assert_int_equal(st_quantize_row(t->type, x, K, q), ST_OK);
                const uint8_t *want = (const uint8_t *)t->data + (size_t)r * rb;
                const size_t bb = st_kquant_block_bytes(t->type);
                for (int64_t b = 0; b < K / ST_QK_K; b++)
                    bad_blocks += memcmp(q + b * bb, want + b * bb, bb) != 0;
            }
            if (bad_blocks)
                fail_msg("%s %s (%s): %ld of %ld blocks differ from llama-quantize's", files[f],
                         t->name, st_dtype_name(t->type), (long)bad_blocks,
                         (long)(rows * (K / ST_QK_K)));
            for (int k = 0; k < N_KQ; k++)
                per_type[k] += kq_types[k] == t->type;
            free(q);
        }
        st_gguf_free(g);
    }
    for (int k = 0; k < N_KQ; k++) {
        print_message("%s: %d tensors equal llama-quantize's\n", st_dtype_name(kq_types[k]),
                      per_type[k]);
        assert_true(per_type[k] >= 1);
    }
    st_gguf_free(src);
}

/* Quant range of each type as (q - off) in [lo, hi]: affine types (with mins) have off 0. */
static void quant_range(uint32_t type, int *off, int *hi) {
    switch (type) {
    case ST_DTYPE_Q2_K:
        *off = 0, *hi = 3;
        break;
    case ST_DTYPE_Q3_K:
        *off = 4, *hi = 3;
        break;
    case ST_DTYPE_Q4_K:
        *off = 0, *hi = 15;
        break;
    case ST_DTYPE_Q5_K:
        *off = 0, *hi = 31;
        break;
    default:
        *off = 32, *hi = 31;
        break;
    }
}

/* Quantizes row x (K values) to type and checks every element against its quant: with step
 * s = d * sc and offset m = dmin * min of its sub-block, t = (x + m) / s lies within half a step
 * of q - off, or past the end of the range where q was clamped. Returns the number of elements in
 * sub-blocks of step 0 (their quants are not requantized); *rms_err gets the RMS round-trip
 * error. */
static int64_t check_row(uint32_t type, const float *x, int64_t K, double *rms_err) {
    const size_t bb = st_kquant_block_bytes(type);
    uint8_t *q = malloc(st_row_bytes(type, K));
    float *y = malloc((size_t)K * sizeof *y);
    assert_true(q && y);
    assert_int_equal(st_quantize_row(type, x, K, q), ST_OK);
    assert_int_equal(st_dequantize_row(type, q, K, y), ST_OK);
    int off, hi;
    quant_range(type, &off, &hi);
    const int lo = -off;
    int64_t zero_step = 0;
    double se = 0.0;
    for (int64_t b = 0; b < K / ST_QK_K; b++) {
        st_kq_unpacked u;
        st_kq_unpack(type, q + b * bb, &u);
        for (int e = 0; e < ST_QK_K; e++) {
            const int64_t i = b * ST_QK_K + e;
            const float step = u.d * (float)u.sc[e / 16];
            const float m = u.dmin * (float)(off ? 0 : u.bz[e / 16]);
            se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
            if (step == 0.0f) {
                zero_step++;
                continue;
            }
            const double t = ((double)x[i] + m) / step, qv = u.q[e] - off, tol = 1e-4;
            if ((qv > lo && qv < hi && fabs(t - qv) > 0.5 + tol) ||
                (qv == lo && t > qv + 0.5 + tol) || (qv == hi && t < qv - 0.5 - tol) || qv < lo ||
                qv > hi)
                fail_msg("%s element %ld: x %g, quant %g, t %g (step %g, min %g)",
                         st_dtype_name(type), (long)i, (double)x[i], qv, t, (double)step,
                         (double)m);
        }
    }
    *rms_err = sqrt(se / (double)K);
    free(q);
    free(y);
    return zero_step;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static float urand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)(rng_state >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

static void test_round_trip(void **state) {
    (void)state;
    enum { K = 4 * ST_QK_K };
    float *x = malloc(K * sizeof *x);
    assert_non_null(x);
    for (int k = 0; k < N_KQ; k++) {
        const uint32_t type = kq_types[k];
        int off, hi;
        quant_range(type, &off, &hi);
        /* random rows of magnitude 0.01 .. 100, some with outliers: every sub-block requantized,
         * and the RMS error within half the step of a plain min-max quantizer of each row */
        for (int rep = 0; rep < 40; rep++) {
            const float mag = (float)pow(10.0, rep % 5 - 2); /* fp16 scales: not much smaller */
            float amax = 0.0f;
            for (int i = 0; i < K; i++) {
                x[i] = mag * urand() * (rep % 3 == 2 && i % 97 == 0 ? 8.0f : 1.0f);
                if (fabsf(x[i]) > amax)
                    amax = fabsf(x[i]);
            }
            double rms;
            assert_int_equal(check_row(type, x, K, &rms), 0);
            const double minmax_step = 2.0 * amax / (off ? 2 * off - 1 : hi);
            if (rms > 0.5 * minmax_step)
                fail_msg("%s rep %d: RMS error %g over half the min-max step %g",
                         st_dtype_name(type), rep, rms, minmax_step);
        }
        /* degenerate rows: zeros, constants, one spike, a sign alternation, denormal scale */
        for (int kind = 0; kind < 6; kind++) {
            for (int i = 0; i < K; i++)
                x[i] = kind == 0   ? 0.0f
                       : kind == 1 ? 0.75f
                       : kind == 2 ? -3.0f
                       : kind == 3 ? (i == 300 ? 5.0f : 0.0f)
                       : kind == 4 ? (i % 2 ? 1.0f : -1.0f)
                                   : 1e-9f * urand();
            double rms;
            check_row(type, x, K, &rms);
            if (kind == 0)
                assert_true(rms == 0.0);
        }
    }
    free(x);
}

static void test_refusals(void **state) {
    (void)state;
    float x[2 * ST_QK_K] = {0};
    uint8_t q[2 * 256];
    for (int k = 0; k < N_KQ; k++) {
        assert_int_equal(st_quantize_row(kq_types[k], x, ST_QK_K + 32, q), ST_ERR_INVALID);
        assert_non_null(strstr(st_last_error(), "multiple of 256"));
        x[17] = NAN;
        assert_int_equal(st_quantize_row(kq_types[k], x, ST_QK_K, q), ST_ERR_INVALID);
        assert_non_null(strstr(st_last_error(), "not finite"));
        x[17] = INFINITY;
        assert_int_equal(st_quantize_row(kq_types[k], x, ST_QK_K, q), ST_ERR_INVALID);
        x[17] = 0.0f;
        float y[ST_QK_K + 32];
        assert_int_equal(st_dequantize_row(kq_types[k], q, ST_QK_K + 32, y), ST_ERR_INVALID);
    }
}

/* The per-tensor types of each mix equal those of llama.cpp's file of that mix. */
static void test_mix_types(void **state) {
    (void)state;
    static const char *files[] = {"x256-Q2_K", "x256-Q3_K_M", "x256-Q4_K_M", "x256-Q5_K_M",
                                  "x256-Q6_K"};
    static const char *names[] = {"q2_k", "q3_k_m", "q4_k_m", "q5_k_m", "q6_k"};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char rel[256], path[4096];
        snprintf(rel, sizeof rel, "tests/data/kquant/%s.gguf", files[f]);
        snprintf(path, sizeof path, "%s", tu_data(rel));
        st_gguf *g = NULL;
        if (st_gguf_open(path, &g) != ST_OK)
            fail_msg("%s: %s", path, st_last_error());
        uint32_t ftype, n_layer, n_head, n_head_kv;
        assert_int_equal(st_gguf_get_u32(g, "general.file_type", &ftype), ST_OK);
        assert_int_equal(st_gguf_get_u32(g, "llama.block_count", &n_layer), ST_OK);
        assert_int_equal(st_gguf_get_u32(g, "llama.attention.head_count", &n_head), ST_OK);
        assert_int_equal(st_gguf_get_u32(g, "llama.attention.head_count_kv", &n_head_kv), ST_OK);
        assert_int_equal(st_kquant_ftype_from_name(names[f]), ftype);
        assert_string_equal(st_kquant_ftype_name(ftype), names[f]);
        const int tied = st_gguf_tensor_find(g, "output.weight") == NULL;
        int n_mixed = 0;
        for (int64_t i = 0; i < st_gguf_n_tensors(g); i++) {
            const st_gguf_tensor *t = st_gguf_tensor_at(g, i);
            uint32_t want =
                st_kquant_tensor_type(ftype, t->name, t->ne[0], n_layer, n_head / n_head_kv, tied);
            if (!want)
                want = ST_DTYPE_F32;
            if (want != t->type)
                fail_msg("%s %s: the rule gives %s, llama-quantize wrote %s", files[f], t->name,
                         st_dtype_name(want), st_dtype_name(t->type));
            n_mixed += t->type != ST_DTYPE_F32;
        }
        assert_true(n_mixed == 2 + 7 * (int)n_layer);
        st_gguf_free(g);
    }
    assert_int_equal(st_kquant_ftype_from_name("q4_k_x"), 0);
    assert_int_equal(st_kquant_tensor_type(ST_FTYPE_Q4_K_M, "blk.0.attn_norm.weight", 256, 4, 1, 0),
                     0);
    assert_int_equal(st_kquant_tensor_type(7, "blk.0.attn_q.weight", 256, 4, 1, 0), 0);
    assert_int_equal(st_kquant_tensor_type(ST_FTYPE_Q4_K_M, "token_embd.weight", 256, 4, 1, 1),
                     ST_DTYPE_Q6_K);
    /* rows that are not whole super-blocks (SmolLM's 576): types that fit them */
    assert_int_equal(st_kquant_tensor_type(ST_FTYPE_Q4_K_M, "blk.1.attn_q.weight", 576, 4, 1, 0),
                     ST_DTYPE_Q8_0);
    assert_int_equal(st_kquant_tensor_type(ST_FTYPE_Q4_K_M, "output.weight", 576, 4, 1, 0),
                     ST_DTYPE_Q8_0);
    assert_int_equal(st_kquant_tensor_type(ST_FTYPE_Q2_K, "blk.1.ffn_up.weight", 576, 4, 1, 0),
                     ST_DTYPE_Q4_0);
    assert_int_equal(st_kquant_tensor_type(ST_FTYPE_Q6_K, "blk.1.ffn_up.weight", 100, 4, 1, 0),
                     ST_DTYPE_F16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_cpp_bytes),
        cmocka_unit_test(test_mix_types),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
