/*
 * test_gguf_write.c: the GGUF writer: round trips of every value type and every tensor type,
 * streaming, alignment; a copy of stories260K's KVs and tensors is byte-identical to the file;
 * ggml's reference quantizers.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "gguf_util.h"
#include "io/gguf_internal.h"
#include "io/gguf_write.h"
#include "kernels/kernels.h"
#include "spectree.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Writer                                                                                     */

static void test_write_values(void **state) {
    (void)state;
    st_gguf_writer *w = new_writer();
    assert_int_equal(st_gguf_writer_add_u8(w, "v.u8", 255), ST_OK);
    assert_int_equal(st_gguf_writer_add_i8(w, "v.i8", -128), ST_OK);
    assert_int_equal(st_gguf_writer_add_u16(w, "v.u16", 65535), ST_OK);
    assert_int_equal(st_gguf_writer_add_i16(w, "v.i16", -32768), ST_OK);
    assert_int_equal(st_gguf_writer_add_u32(w, "v.u32", 4294967295u), ST_OK);
    assert_int_equal(st_gguf_writer_add_i32(w, "v.i32", INT32_MIN), ST_OK);
    assert_int_equal(st_gguf_writer_add_f32(w, "v.f32", -1.5f), ST_OK);
    assert_int_equal(st_gguf_writer_add_bool(w, "v.true", 1), ST_OK);
    assert_int_equal(st_gguf_writer_add_bool(w, "v.false", 0), ST_OK);
    assert_int_equal(st_gguf_writer_add_u64(w, "v.u64", UINT64_MAX), ST_OK);
    assert_int_equal(st_gguf_writer_add_i64(w, "v.i64", INT64_MIN), ST_OK);
    assert_int_equal(st_gguf_writer_add_f64(w, "v.f64", 0.1), ST_OK);
    assert_int_equal(st_gguf_writer_add_str(w, "v.str", "h\xc3\xa9llo"), ST_OK);
    assert_int_equal(st_gguf_writer_add_str(w, "v.empty", ""), ST_OK);
    assert_int_equal(st_gguf_writer_add_strn(w, "v.nul", "a\0b", 3), ST_OK);
    const uint8_t au8[] = {0, 1, 255};
    const int8_t ai8[] = {-128, 0, 127};
    const uint16_t au16[] = {0, 65535};
    const int16_t ai16[] = {-32768, 32767};
    const uint32_t au32[] = {0, 4294967295u, 7};
    const int32_t ai32[] = {INT32_MIN, -1, INT32_MAX};
    const float af32[] = {0.5f, -2.0f, 1e30f};
    const uint8_t abool[] = {1, 0, 1, 1};
    const uint64_t au64[] = {UINT64_MAX, 0};
    const int64_t ai64[] = {INT64_MIN, INT64_MAX};
    const double af64[] = {0.1, -1e300};
    struct {
        const char *key;
        st_gguf_type t;
        const void *data;
        int64_t n;
        size_t es;
    } arrs[] = {
        {"a.u8", ST_GGUF_UINT8, au8, 3, 1},     {"a.i8", ST_GGUF_INT8, ai8, 3, 1},
        {"a.u16", ST_GGUF_UINT16, au16, 2, 2},  {"a.i16", ST_GGUF_INT16, ai16, 2, 2},
        {"a.u32", ST_GGUF_UINT32, au32, 3, 4},  {"a.i32", ST_GGUF_INT32, ai32, 3, 4},
        {"a.f32", ST_GGUF_FLOAT32, af32, 3, 4}, {"a.bool", ST_GGUF_BOOL, abool, 4, 1},
        {"a.u64", ST_GGUF_UINT64, au64, 2, 8},  {"a.i64", ST_GGUF_INT64, ai64, 2, 8},
        {"a.f64", ST_GGUF_FLOAT64, af64, 2, 8}, {"a.empty", ST_GGUF_INT32, NULL, 0, 4},
    };
    size_t n_arrs = sizeof arrs / sizeof arrs[0];
    for (size_t i = 0; i < n_arrs; i++)
        assert_int_equal(st_gguf_writer_add_arr(w, arrs[i].key, arrs[i].t, arrs[i].data, arrs[i].n),
                         ST_OK);
    const char *strs[] = {"one", "", "\xe2\x96\x81three"};
    assert_int_equal(st_gguf_writer_add_arr_str(w, "a.str", strs, 3), ST_OK);
    const st_gguf_str strn[] = {{"x\0y", 3}, {NULL, 0}};
    assert_int_equal(st_gguf_writer_add_arr_strn(w, "a.strn", strn, 2), ST_OK);
    assert_int_equal(st_gguf_writer_add_arr_str(w, "a.strempty", NULL, 0), ST_OK);

    void *buf;
    size_t size;
    assert_int_equal(st_gguf_writer_write_memory(w, &buf, &size), ST_OK);
    assert_int_equal(size, st_gguf_writer_file_size(w));
    st_gguf *g;
    assert_int_equal(st_gguf_open_memory(buf, size, "values", &g), ST_OK);
    assert_int_equal(st_gguf_n_kv(g), 15 + (int64_t)n_arrs + 3);
    assert_int_equal(st_gguf_n_tensors(g), 0);
    assert_int_equal(st_gguf_data_offset(g), size);
    const char *keys[] = {"v.u8",   "v.i8",    "v.u16", "v.i16", "v.u32", "v.i32", "v.f32",
                          "v.true", "v.false", "v.u64", "v.i64", "v.f64", "v.str"};
    const st_gguf_type types[] = {ST_GGUF_UINT8,  ST_GGUF_INT8,   ST_GGUF_UINT16,  ST_GGUF_INT16,
                                  ST_GGUF_UINT32, ST_GGUF_INT32,  ST_GGUF_FLOAT32, ST_GGUF_BOOL,
                                  ST_GGUF_BOOL,   ST_GGUF_UINT64, ST_GGUF_INT64,   ST_GGUF_FLOAT64,
                                  ST_GGUF_STRING};
    for (int i = 0; i < 13; i++) {
        assert_int_equal(st_gguf_find(g, keys[i]), i);
        assert_string_equal(st_gguf_key(g, i), keys[i]);
        assert_int_equal(st_gguf_kv_type(g, i), types[i]);
    }
    int64_t v;
    char txt[128];
    assert_int_equal(st_gguf_get_i64(g, "v.u8", &v), ST_OK);
    assert_int_equal(v, 255);
    assert_int_equal(st_gguf_get_i64(g, "v.i8", &v), ST_OK);
    assert_int_equal(v, -128);
    assert_int_equal(st_gguf_get_i64(g, "v.u16", &v), ST_OK);
    assert_int_equal(v, 65535);
    assert_int_equal(st_gguf_get_i64(g, "v.i16", &v), ST_OK);
    assert_int_equal(v, -32768);
    assert_int_equal(get_u32(g, "v.u32"), 4294967295u);
    assert_int_equal(st_gguf_get_i64(g, "v.i32", &v), ST_OK);
    assert_int_equal(v, INT32_MIN);
    assert_int_equal(st_gguf_get_i64(g, "v.i64", &v), ST_OK);
    assert_true(v == INT64_MIN);
    assert_int_equal(st_gguf_get_i64(g, "v.u64", &v), ST_ERR_FORMAT); /* > INT64_MAX */
    st_gguf_format_value(g, st_gguf_find(g, "v.u64"), txt, sizeof txt);
    assert_string_equal(txt, "18446744073709551615");
    st_gguf_format_value(g, st_gguf_find(g, "v.i64"), txt, sizeof txt);
    assert_string_equal(txt, "-9223372036854775808");
    float f;
    assert_int_equal(st_gguf_get_f32(g, "v.f32", &f), ST_OK);
    assert_true(f == -1.5f);
    assert_int_equal(st_gguf_get_f32(g, "v.f64", &f), ST_OK);
    assert_true(f == 0.1f);
    /* The f64 bytes are exact: the 8 bytes before "v.str"'s key length field. */
    double d64 = 0.1;
    size_t koff = 24;
    for (int i = 0; i < 11; i++) { /* skip to v.f64's value */
        koff += 8 + strlen(keys[i]) + 4;
        koff += (types[i] == ST_GGUF_BOOL || types[i] <= ST_GGUF_INT8) ? 1
                : (types[i] <= ST_GGUF_INT16)                          ? 2
                : (types[i] <= ST_GGUF_FLOAT32)                        ? 4
                                                                       : 8;
    }
    koff += 8 + strlen("v.f64") + 4;
    assert_memory_equal((uint8_t *)buf + koff, &d64, 8);
    int b;
    assert_int_equal(st_gguf_get_bool(g, "v.true", &b), ST_OK);
    assert_int_equal(b, 1);
    assert_int_equal(st_gguf_get_bool(g, "v.false", &b), ST_OK);
    assert_int_equal(b, 0);
    st_gguf_str s;
    assert_int_equal(st_gguf_get_str(g, "v.str", &s), ST_OK);
    assert_str_eq_n(s, "h\xc3\xa9llo");
    assert_int_equal(st_gguf_get_str(g, "v.empty", &s), ST_OK);
    assert_int_equal(s.len, 0);
    assert_int_equal(st_gguf_get_str(g, "v.nul", &s), ST_OK);
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.ptr, "a\0b", 3);
    for (size_t i = 0; i < n_arrs; i++) {
        int64_t k = st_gguf_find(g, arrs[i].key);
        assert_true(k >= 0);
        assert_int_equal(st_gguf_kv_type(g, k), ST_GGUF_ARRAY);
        assert_int_equal(st_gguf_arr_type(g, k), arrs[i].t);
        assert_int_equal(st_gguf_arr_len(g, k), arrs[i].n);
        if (arrs[i].n)
            assert_memory_equal(st_gguf_arr_data(g, k), arrs[i].data,
                                (size_t)arrs[i].n * arrs[i].es);
    }
    double d;
    assert_int_equal(st_gguf_arr_num(g, st_gguf_find(g, "a.i8"), 0, &d), ST_OK);
    assert_true(d == -128.0);
    assert_int_equal(st_gguf_arr_num(g, st_gguf_find(g, "a.f64"), 1, &d), ST_OK);
    assert_true(d == -1e300);
    assert_int_equal(st_gguf_arr_num(g, st_gguf_find(g, "a.u32"), 1, &d), ST_OK);
    assert_true(d == 4294967295.0);
    int64_t k = st_gguf_find(g, "a.str");
    assert_int_equal(st_gguf_arr_type(g, k), ST_GGUF_STRING);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(st_gguf_arr_str(g, k, i, &s), ST_OK);
        assert_str_eq_n(s, strs[i]);
    }
    k = st_gguf_find(g, "a.strn");
    assert_int_equal(st_gguf_arr_str(g, k, 0, &s), ST_OK);
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.ptr, "x\0y", 3);
    assert_int_equal(st_gguf_arr_str(g, k, 1, &s), ST_OK);
    assert_int_equal(s.len, 0);
    assert_int_equal(st_gguf_arr_len(g, st_gguf_find(g, "a.strempty")), 0);
    assert_int_equal(st_gguf_arr_num(g, k, 0, &d), ST_ERR_FORMAT);

    /* Copying every KV reproduces the KV section byte for byte (f64 aside, see copy_kv). */
    st_gguf_writer *w2 = new_writer();
    for (int64_t i = 0; i < st_gguf_n_kv(g); i++)
        if (strcmp(st_gguf_key(g, i), "v.f64") != 0)
            assert_int_equal(st_gguf_writer_copy_kv(w2, g, st_gguf_key(g, i)), ST_OK);
        else
            assert_int_equal(st_gguf_writer_add_f64(w2, "v.f64", 0.1), ST_OK);
    void *buf2;
    size_t size2;
    assert_int_equal(st_gguf_writer_write_memory(w2, &buf2, &size2), ST_OK);
    assert_int_equal(size2, size);
    assert_memory_equal(buf2, buf, size);
    free(buf2);
    st_gguf_writer_free(w2);

    /* write_file gives the same bytes. */
    char path[] = "/tmp/st_gguf_values_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(st_gguf_writer_write_file(w, path), ST_OK);
    size_t fsize;
    char *fbytes = tu_read_file(path, &fsize);
    assert_int_equal(fsize, size);
    assert_memory_equal(fbytes, buf, size);
    free(fbytes);
    remove(path);
    st_gguf_free(g);
    free(buf);
    st_gguf_writer_free(w);
}

static void test_write_errors(void **state) {
    (void)state;
    st_gguf_writer *w = new_writer();
    assert_int_equal(st_gguf_writer_add_u32(w, "k", 1), ST_OK);
    size_t before = st_gguf_writer_file_size(w);
    assert_int_equal(st_gguf_writer_add_u32(w, "k", 2), ST_ERR_INVALID);
    assert_non_null(strstr(st_last_error(), "duplicate"));
    assert_int_equal(st_gguf_writer_add_str(w, "k", "x"), ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_u32(w, "", 2), ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_u32(w, "general.alignment", 48), ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_u32(w, "general.alignment", 0), ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_u64(w, "general.alignment", 64), ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_bool(w, "b", 2), ST_ERR_INVALID);
    const uint8_t bad_bool[] = {0, 2};
    assert_int_equal(st_gguf_writer_add_arr(w, "ab", ST_GGUF_BOOL, bad_bool, 2), ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_arr(w, "aa", ST_GGUF_ARRAY, bad_bool, 2), ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_arr(w, "as", ST_GGUF_STRING, bad_bool, 2), ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_arr(w, "an", ST_GGUF_UINT8, NULL, 2), ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_arr(w, "an", ST_GGUF_UINT8, bad_bool, -1), ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_file_size(w), before); /* failed adds change nothing */

    float x[128] = {0}; /* 512 bytes: room for every stream below */
    int64_t ne[4] = {32, 2, 1, 1};
    char long_name[80];
    memset(long_name, 'a', 64);
    long_name[64] = 0;
    assert_int_equal(st_gguf_writer_add_tensor(w, long_name, ST_DTYPE_F32, 2, ne, x, 256, 0),
                     ST_ERR_INVALID);
    long_name[63] = 0; /* 63 bytes is the longest name */
    assert_int_equal(st_gguf_writer_add_tensor(w, long_name, ST_DTYPE_F32, 2, ne, x, 256, 0),
                     ST_OK);
    assert_int_equal(st_gguf_writer_add_tensor(w, long_name, ST_DTYPE_F32, 2, ne, x, 256, 0),
                     ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_tensor(w, "t", ST_DTYPE_F32, 2, ne, x, 255, 0),
                     ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_tensor(w, "t", ST_DTYPE_F32, 5, ne, x, 256, 0),
                     ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_tensor(w, "t", ST_DTYPE_F32, 0, ne, x, 256, 0),
                     ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_tensor(w, "t", 3 /* q4_1 */, 2, ne, x, 256, 0),
                     ST_ERR_INVALID);
    int64_t ne_odd[2] = {33, 1};
    assert_int_equal(st_gguf_writer_add_tensor(w, "t", ST_DTYPE_Q8_0, 2, ne_odd, NULL, 0, 0),
                     ST_ERR_INVALID);
    assert_non_null(strstr(st_last_error(), "multiple"));
    int64_t ne_neg[2] = {32, -1};
    assert_int_equal(st_gguf_writer_add_tensor(w, "t", ST_DTYPE_F32, 2, ne_neg, NULL, 0, 0),
                     ST_ERR_INVALID);
    int64_t ne_huge[4] = {INT64_MAX, 2, 1, 1};
    assert_int_equal(st_gguf_writer_add_tensor(w, "t", ST_DTYPE_F32, 2, ne_huge, NULL, 0, 0),
                     ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_tensor(w, "t", ST_DTYPE_F32, 1, ne, x, 128, 7),
                     ST_ERR_INVALID);
    /* A tensor without data cannot be written in one go... */
    assert_int_equal(st_gguf_writer_add_tensor(w, "streamed", ST_DTYPE_F32, 1, ne, NULL, 0, 0),
                     ST_OK);
    void *buf;
    size_t size;
    assert_int_equal(st_gguf_writer_write_memory(w, &buf, &size), ST_ERR_INVALID);
    assert_null(buf);
    /* ...and streaming checks its byte count. */
    char path[] = "/tmp/st_gguf_err_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    assert_int_equal(st_gguf_writer_begin_file(w, path), ST_OK);
    assert_int_equal(st_gguf_writer_add_u32(w, "late", 1), ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_add_tensor(w, "late", ST_DTYPE_F32, 1, ne, x, 128, 0),
                     ST_ERR_INVALID);
    assert_int_equal(st_gguf_writer_stream(w, x, 256 + 100), ST_OK);
    assert_int_equal(st_gguf_writer_end_file(w), ST_ERR_INVALID);
    assert_non_null(strstr(st_last_error(), "streamed"));
    assert_int_equal(st_gguf_writer_stream(w, x, 4), ST_ERR_INVALID); /* not writing */
    assert_int_equal(st_gguf_writer_begin_file(w, path), ST_OK);
    assert_int_equal(st_gguf_writer_stream(w, x, 256), ST_OK);
    assert_int_equal(st_gguf_writer_stream(w, x, 128 + 1), ST_ERR_INVALID); /* past the end */
    st_gguf_writer_free(w); /* closes the half-written file */
    remove(path);
    assert_int_equal(st_gguf_writer_write_file(NULL, path), ST_ERR_INVALID);
    w = new_writer();
    assert_int_equal(st_gguf_writer_write_file(w, "/nonexistent-dir/x.gguf"), ST_ERR_IO);
    assert_error_names(ST_ERR_IO, "/nonexistent-dir/x.gguf");
    st_gguf_writer_free(w);
    st_gguf_writer_free(NULL);
}

/* Fills n floats with a deterministic pattern including zeros, negatives and a wide range. */
static void fill_floats(float *x, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_float(&seed) * (float)(1 + (i % 7) * 3);
    if (n > 5)
        x[5] = 0.0f;
}

static void test_write_tensors(void **state) {
    (void)state;
    static const uint32_t types[] = {ST_DTYPE_F32, ST_DTYPE_F16, ST_DTYPE_BF16, ST_DTYPE_Q8_0,
                                     ST_DTYPE_Q4_0};
    static const int64_t shapes[][4] = {{64, 3, 1, 1}, {32, 1, 1, 1}, {96, 2, 2, 1},
                                        {32, 1, 2, 2}, {0, 4, 1, 1},  {64, 0, 1, 1}};
    static const uint32_t dims[] = {2, 1, 3, 4, 2, 2};
    const uint32_t aligns[] = {0 /* default 32 */, 1, 64, 4096};
    for (size_t ai = 0; ai < sizeof aligns / sizeof aligns[0]; ai++) {
        st_gguf_writer *w = new_writer();
        assert_int_equal(st_gguf_writer_add_str(w, "general.architecture", "test"), ST_OK);
        if (aligns[ai])
            assert_int_equal(st_gguf_writer_add_u32(w, "general.alignment", aligns[ai]), ST_OK);
        uint32_t A = aligns[ai] ? aligns[ai] : 32;
        assert_int_equal(st_gguf_writer_alignment(w), A);
        enum { NT = 5 * 6 };
        void *data[NT];
        size_t sizes[NT];
        char names[NT][32];
        int t = 0;
        for (int ti = 0; ti < 5; ti++)
            for (int si = 0; si < 6; si++, t++) {
                int64_t nel = shapes[si][0] * shapes[si][1] * shapes[si][2] * shapes[si][3];
                float *x = malloc((size_t)(nel ? nel : 1) * sizeof(float));
                fill_floats(x, nel, (uint64_t)t);
                assert_int_equal(st_gguf_tensor_bytes(types[ti], dims[si], shapes[si], &sizes[t]),
                                 ST_OK);
                data[t] = malloc(sizes[t] ? sizes[t] : 1);
                assert_int_equal(st_quantize_row(types[ti], x, nel, data[t]), ST_OK);
                free(x);
                snprintf(names[t], sizeof names[t], "t.%s.%d", st_dtype_name(types[ti]), si);
                assert_int_equal(st_gguf_writer_add_tensor(w, names[t], types[ti], dims[si],
                                                           shapes[si], data[t], sizes[t],
                                                           t % 2 ? ST_GGUF_COPY : ST_GGUF_REF),
                                 ST_OK);
            }
        void *buf;
        size_t size;
        assert_int_equal(st_gguf_writer_write_memory(w, &buf, &size), ST_OK);
        st_gguf *g;
        assert_int_equal(st_gguf_open_memory(buf, size, "tensors", &g), ST_OK);
        assert_int_equal(st_gguf_alignment(g), A);
        assert_int_equal(st_gguf_data_offset(g) % A, 0);
        assert_int_equal(st_gguf_n_tensors(g), NT);
        uint64_t next = 0;
        for (t = 0; t < NT; t++) {
            const st_gguf_tensor *tt = st_gguf_tensor_at(g, t);
            int si = t % 6;
            assert_string_equal(tt->name, names[t]);
            assert_int_equal(tt->type, types[t / 6]);
            assert_int_equal(tt->n_dims, dims[si]);
            for (int d = 0; d < 4; d++)
                assert_int_equal(tt->ne[d], shapes[si][d]);
            assert_int_equal(tt->offset, next);
            assert_int_equal(tt->size, sizes[t]);
            if (sizes[t])
                assert_memory_equal(tt->data, data[t], sizes[t]);
            next += (sizes[t] + A - 1) / A * A;
        }
        assert_int_equal(st_gguf_data_offset(g) + next, size);
        st_gguf_free(g);

        /* Streaming in odd chunks gives the same file. */
        st_gguf_writer *ws = new_writer();
        assert_int_equal(st_gguf_writer_add_str(ws, "general.architecture", "test"), ST_OK);
        if (aligns[ai])
            assert_int_equal(st_gguf_writer_add_u32(ws, "general.alignment", aligns[ai]), ST_OK);
        for (t = 0; t < NT; t++)
            assert_int_equal(st_gguf_writer_add_tensor(ws, names[t], types[t / 6], dims[t % 6],
                                                       shapes[t % 6], NULL, 0, ST_GGUF_REF),
                             ST_OK);
        assert_int_equal(st_gguf_writer_file_size(ws), size);
        uint8_t *all = malloc(next ? next : 1);
        size_t n_all = 0;
        for (t = 0; t < NT; t++) {
            memcpy(all + n_all, data[t], sizes[t]);
            n_all += sizes[t];
        }
        char path[] = "/tmp/st_gguf_stream_XXXXXX";
        int fd = mkstemp(path);
        close(fd);
        assert_int_equal(st_gguf_writer_begin_file(ws, path), ST_OK);
        for (size_t off = 0, chunk = 1; off < n_all; off += chunk, chunk = chunk * 3 + 1) {
            if (chunk > n_all - off)
                chunk = n_all - off;
            assert_int_equal(st_gguf_writer_stream(ws, all + off, chunk), ST_OK);
        }
        assert_int_equal(st_gguf_writer_end_file(ws), ST_OK);
        size_t fsize;
        char *fbytes = tu_read_file(path, &fsize);
        assert_int_equal(fsize, size);
        assert_memory_equal(fbytes, buf, size);
        free(fbytes);
        remove(path);
        free(all);
        st_gguf_writer_free(ws);
        free(buf);
        st_gguf_writer_free(w);
        for (t = 0; t < NT; t++)
            free(data[t]);
    }
}

/* Copying every KV and tensor of stories260K reproduces the file exactly. */
static void test_rewrite_stories(void **state) {
    (void)state;
    size_t size;
    char *bytes = tu_read_file(stories(), &size);
    st_gguf *g;
    assert_int_equal(st_gguf_open_memory(bytes, size, "stories", &g), ST_OK);
    st_gguf_writer *w = new_writer();
    for (int64_t i = 0; i < st_gguf_n_kv(g); i++)
        assert_int_equal(st_gguf_writer_copy_kv(w, g, st_gguf_key(g, i)), ST_OK);
    for (int64_t i = 0; i < st_gguf_n_tensors(g); i++) {
        const st_gguf_tensor *t = st_gguf_tensor_at(g, i);
        assert_int_equal(st_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                                   t->size, ST_GGUF_REF),
                         ST_OK);
    }
    void *buf;
    size_t n;
    assert_int_equal(st_gguf_writer_write_memory(w, &buf, &n), ST_OK);
    assert_int_equal(n, size);
    assert_memory_equal(buf, bytes, size);
    free(buf);
    st_gguf_writer_free(w);
    assert_int_equal(st_gguf_writer_copy_kv(NULL, g, "x"), ST_ERR_INVALID);

    /* copy_tokenizer takes tokenizer.* and the named extras, in the source's order. */
    w = new_writer();
    const char *extra[] = {"general.name", "not.there"};
    assert_int_equal(st_gguf_writer_copy_tokenizer(w, g, extra, 2), ST_OK);
    assert_int_equal(st_gguf_writer_write_memory(w, &buf, &n), ST_OK);
    st_gguf *g2;
    assert_int_equal(st_gguf_open_memory(buf, n, "tok-copy", &g2), ST_OK);
    assert_int_equal(st_gguf_n_kv(g2), 10);
    assert_string_equal(st_gguf_key(g2, 0), "tokenizer.ggml.tokens");
    assert_string_equal(st_gguf_key(g2, 4), "general.name");
    assert_int_equal(st_gguf_find(g2, "llama.block_count"), -1);
    int64_t ti = st_gguf_find(g2, "tokenizer.ggml.scores");
    assert_memory_equal(st_gguf_arr_data(g2, ti),
                        st_gguf_arr_data(g, st_gguf_find(g, "tokenizer.ggml.scores")), 512 * 4);
    assert_int_equal(st_gguf_writer_copy_tokenizer(w, g, NULL, 0), ST_ERR_INVALID); /* dups */
    st_gguf_free(g2);
    free(buf);
    st_gguf_writer_free(w);
    st_gguf_free(g);
    free(bytes);
}

static void test_quantizers(void **state) {
    (void)state;
    float x[64];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16); /* block 0: -16 .. 15 */
    for (int j = 32; j < 64; j++)
        x[j] = 0.0f; /* block 1: all zero */
    st_block_q4_0 q4[2];
    assert_int_equal(st_quantize_row(ST_DTYPE_Q4_0, x, 64, q4), ST_OK);
    /* m = -16 (largest magnitude, sign kept), d = m / -8 = 2, nibble = min(15, trunc(x/2+8.5)) */
    assert_int_equal(q4[0].d, st_f32_to_fp16(2.0f));
    for (int j = 0; j < 16; j++) {
        int lo = (int)((float)(j - 16) * 0.5f + 8.5f), hi = (int)((float)j * 0.5f + 8.5f);
        hi = hi > 15 ? 15 : hi;
        assert_int_equal(q4[0].qs[j], lo | (hi << 4));
    }
    assert_int_equal(q4[0].qs[0] & 15, 0);   /* -16 -> 0 */
    assert_int_equal(q4[0].qs[15] >> 4, 15); /* 15 -> 16, clamped to 15 */
    assert_int_equal(q4[1].d, 0x8000);       /* m = +0, d = m / -8 = -0, as in ggml */
    for (int j = 0; j < 16; j++)
        assert_int_equal(q4[1].qs[j], 0x88);
    /* A positive extreme gives a negative scale. */
    float y[32];
    for (int j = 0; j < 32; j++)
        y[j] = j == 7 ? 4.0f : 1.0f;
    assert_int_equal(st_quantize_row(ST_DTYPE_Q4_0, y, 32, q4), ST_OK);
    assert_true(st_fp16_to_f32(q4[0].d) == -0.5f);
    assert_int_equal(q4[0].qs[7] & 15, 0); /* 4 / -0.5 + 8.5 = 0.5 */
    assert_int_equal(q4[0].qs[0] & 15, 6); /* 1 / -0.5 + 8.5 = 6.5 */

    st_block_q8_0 q8[2];
    assert_int_equal(st_quantize_row(ST_DTYPE_Q8_0, x, 64, q8), ST_OK);
    const float d = 16.0f / 127.0f, id = 1.0f / d;
    assert_int_equal(q8[0].d, st_f32_to_fp16(d));
    for (int j = 0; j < 32; j++)
        assert_int_equal(q8[0].q[j], (int)roundf((float)(j - 16) * id));
    assert_int_equal(q8[0].q[0], -127);
    assert_int_equal(q8[1].d, 0);
    for (int j = 0; j < 32; j++)
        assert_int_equal(q8[1].q[j], 0);

    /* Dequantization error is within half a step (plus the fp16 rounding of d). */
    enum { N = 4096 };
    float *r = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    fill_floats(r, N, 42);
    void *qb = malloc(N * 2);
    for (int qt = 0; qt < 2; qt++) {
        uint32_t type = qt ? ST_DTYPE_Q4_0 : ST_DTYPE_Q8_0;
        assert_int_equal(st_quantize_row(type, r, N, qb), ST_OK);
        st_dequant_row(type, qb, back, N);
        for (int b = 0; b < N / 32; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(r[b * 32 + j]));
            /* Q4_0 clamps nibble 16 (the far side of the extreme) to 15: a whole step. */
            float bound = qt ? amax / 8 : amax / 127 * 0.5f;
            for (int j = 0; j < 32; j++)
                assert_true(fabsf(back[b * 32 + j] - r[b * 32 + j]) <= bound + amax * 1e-3f);
        }
    }
    free(qb);
    free(r);
    free(back);

    uint16_t h[3];
    const float v[3] = {1.0f, -2.5f, 65504.0f};
    assert_int_equal(st_quantize_row(ST_DTYPE_F16, v, 3, h), ST_OK);
    assert_int_equal(h[0], 0x3c00);
    assert_int_equal(h[1], 0xc100);
    assert_int_equal(h[2], 0x7bff);
    assert_int_equal(st_quantize_row(ST_DTYPE_BF16, v, 3, h), ST_OK);
    assert_int_equal(h[0], 0x3f80);
    assert_int_equal(h[1], 0xc020);
    float f[3];
    assert_int_equal(st_quantize_row(ST_DTYPE_F32, v, 3, f), ST_OK);
    assert_memory_equal(f, v, sizeof v);

    x[3] = NAN;
    assert_int_equal(st_quantize_row(ST_DTYPE_Q8_0, x, 32, q8), ST_ERR_INVALID);
    x[3] = INFINITY;
    assert_int_equal(st_quantize_row(ST_DTYPE_Q4_0, x, 32, q4), ST_ERR_INVALID);
    assert_int_equal(st_quantize_row(ST_DTYPE_Q4_0, y, 31, q4), ST_ERR_INVALID);
    assert_int_equal(st_quantize_row(3, y, 32, q4), ST_ERR_INVALID);
    /* A block whose scale is subnormal (1/d = inf) does not overflow the integer conversion. */
    for (int j = 0; j < 32; j++)
        y[j] = j % 2 ? 1e-38f : 0.0f;
    assert_int_equal(st_quantize_row(ST_DTYPE_Q8_0, y, 32, q8), ST_OK);
    assert_int_equal(q8[0].q[0], 0);
    assert_int_equal(q8[0].q[1], 127);
    assert_int_equal(st_quantize_row(ST_DTYPE_Q4_0, y, 32, q4), ST_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_values),  cmocka_unit_test(test_write_errors),
        cmocka_unit_test(test_write_tensors), cmocka_unit_test(test_rewrite_stories),
        cmocka_unit_test(test_quantizers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
