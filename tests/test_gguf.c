/*
 * test_gguf.c: the GGUF reader, the GGUF writer and loading models from memory.
 * - Reader: metadata and tensor tables of stories260K.gguf and of both vocab-only files (which
 *   end right after their KV section); clear errors for missing, directory and empty files.
 * - Writer: round trips of every value type and every tensor type, streaming, alignment; a copy
 *   of stories260K's KVs and tensors is byte-identical to the file; ggml's reference quantizers.
 * - spectree-mkmodel: every weight type loads and runs; --keep-layers keeps blocks bitwise.
 * - Fuzz-style: thousands of mutated and truncated files (stories260K and a writer-made model)
 *   go through st_gguf_open_memory and st_model_load_memory: no crash (run it under ASan), and
 *   every rejection has a negative status and an error that names the file.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

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

static const char *stories(void) { return tu_shared("models/stories260K.gguf"); }
static const char *spm(void) { return tu_shared("vectors/tokenizer/ggml-vocab-llama-spm.gguf"); }
static const char *gpt2(void) { return tu_shared("vectors/tokenizer/ggml-vocab-gpt-2.gguf"); }

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static uint64_t rng_below(uint64_t *s, uint64_t n) { return n ? rng_next(s) % n : 0; }
static float rng_float(uint64_t *s) { return (float)(rng_next(s) >> 40) / 16777216.0f * 2 - 1; }

static void assert_str_eq_n(st_gguf_str s, const char *want) {
    assert_int_equal(s.len, strlen(want));
    assert_memory_equal(s.ptr, want, s.len);
}

static uint32_t get_u32(const st_gguf *g, const char *key) {
    uint32_t v = 0;
    assert_int_equal(st_gguf_get_u32(g, key, &v), ST_OK);
    return v;
}

/* The error of the last failing call names `name`. */
static void assert_error_names(st_status s, const char *name) {
    assert_true(s < 0);
    const char *e = st_last_error();
    assert_non_null(e);
    if (!e[0] || !strstr(e, name))
        fail_msg("error '%s' does not name '%s'", e, name);
}

/* ------------------------------------------------------------------------------------------ */
/* Reader                                                                                     */

static void check_stories(const st_gguf *g) {
    assert_int_equal(st_gguf_version(g), 3);
    assert_int_equal(st_gguf_n_kv(g), 19);
    assert_int_equal(st_gguf_n_tensors(g), 48);
    assert_int_equal(st_gguf_alignment(g), 32);
    assert_int_equal(st_gguf_data_offset(g), 14176);
    st_gguf_str s;
    assert_int_equal(st_gguf_get_str(g, "general.architecture", &s), ST_OK);
    assert_str_eq_n(s, "llama");
    assert_int_equal(st_gguf_get_str(g, "tokenizer.ggml.model", &s), ST_OK);
    assert_str_eq_n(s, "llama");
    assert_int_equal(get_u32(g, "llama.context_length"), 2048);
    assert_int_equal(get_u32(g, "llama.embedding_length"), 64);
    assert_int_equal(get_u32(g, "llama.feed_forward_length"), 172);
    assert_int_equal(get_u32(g, "llama.attention.head_count"), 8);
    assert_int_equal(get_u32(g, "llama.attention.head_count_kv"), 4);
    assert_int_equal(get_u32(g, "llama.block_count"), 5);
    assert_int_equal(get_u32(g, "llama.rope.dimension_count"), 8);
    assert_int_equal(get_u32(g, "tokenizer.ggml.seperator_token_id"), 4294967295u);
    float eps;
    assert_int_equal(st_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps), ST_OK);
    assert_true(eps == 1e-5f);
    int64_t ti = st_gguf_find(g, "tokenizer.ggml.tokens");
    assert_int_equal(ti, 0);
    assert_int_equal(st_gguf_kv_type(g, ti), ST_GGUF_ARRAY);
    assert_int_equal(st_gguf_arr_type(g, ti), ST_GGUF_STRING);
    assert_int_equal(st_gguf_arr_len(g, ti), 512);
    const char *first[] = {"<unk>", "<s>", "</s>", "<0x00>"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(st_gguf_arr_str(g, ti, i, &s), ST_OK);
        assert_str_eq_n(s, first[i]);
    }
    assert_int_equal(st_gguf_arr_str(g, ti, 512, &s), ST_ERR_RANGE);
    int64_t tt = st_gguf_find(g, "tokenizer.ggml.token_type");
    assert_int_equal(st_gguf_arr_type(g, tt), ST_GGUF_INT32);
    /* Raw array data is little-endian and need not be aligned. */
    int32_t types[4];
    assert_non_null(st_gguf_arr_data(g, tt));
    memcpy(types, st_gguf_arr_data(g, tt), sizeof types);
    assert_int_equal(types[0], 2);
    assert_int_equal(types[1], 3);
    assert_int_equal(types[3], 6);
    double d;
    assert_int_equal(st_gguf_arr_num(g, tt, 2, &d), ST_OK);
    assert_true(d == 3.0);
    assert_int_equal(st_gguf_arr_type(g, st_gguf_find(g, "tokenizer.ggml.scores")),
                     ST_GGUF_FLOAT32);
    char buf[256];
    st_gguf_format_value(g, ti, buf, sizeof buf);
    assert_non_null(strstr(buf, "[string x 512]"));
    st_gguf_format_value(g, st_gguf_find(g, "llama.block_count"), buf, sizeof buf);
    assert_string_equal(buf, "5");

    /* Tensor table: stored densely in order with 32-byte padding. */
    const st_gguf_tensor *t = st_gguf_tensor_at(g, 0);
    assert_string_equal(t->name, "token_embd.weight");
    assert_int_equal(t->type, ST_DTYPE_F32);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 512);
    assert_int_equal(t->offset, 0);
    assert_int_equal(t->size, 131072);
    t = st_gguf_tensor_find(g, "blk.0.ffn_down.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 172);
    assert_int_equal(t->ne[1], 64);
    assert_int_equal(t->offset, 355840);
    t = st_gguf_tensor_at(g, 47);
    assert_string_equal(t->name, "blk.4.ffn_norm.weight");
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->ne[1], 1);
    assert_int_equal(t->offset, 1170944);
    assert_int_equal(14176 + t->offset + t->size, 1185376);
    uint64_t next = 0;
    for (int64_t i = 0; i < 48; i++) {
        t = st_gguf_tensor_at(g, i);
        assert_int_equal(t->offset, next);
        next = t->offset + (t->size + 31) / 32 * 32;
    }
    assert_null(st_gguf_tensor_at(g, 48));
    assert_null(st_gguf_tensor_find(g, "nope"));
    assert_int_equal(st_gguf_find(g, "nope"), -1);
}

static void test_read_stories(void **state) {
    (void)state;
    st_gguf *g;
    assert_int_equal(st_gguf_open(stories(), &g), ST_OK);
    check_stories(g);
    /* Typed getters fail with the file and key named. */
    uint32_t u;
    st_gguf_str s;
    float f;
    assert_int_equal(st_gguf_get_u32(g, "llama.missing", &u), ST_ERR_FORMAT);
    assert_error_names(ST_ERR_FORMAT, "stories260K.gguf");
    assert_non_null(strstr(st_last_error(), "llama.missing"));
    assert_int_equal(st_gguf_get_str(g, "llama.block_count", &s), ST_ERR_FORMAT);
    assert_non_null(strstr(st_last_error(), "llama.block_count"));
    assert_int_equal(st_gguf_get_f32(g, "general.name", &f), ST_ERR_FORMAT);
    assert_int_equal(st_gguf_get_u32(g, "general.name", &u), ST_ERR_FORMAT);
    const st_gguf_tensor *t = st_gguf_tensor_at(g, 3);
    size_t size;
    char *bytes = tu_read_file(stories(), &size);
    assert_non_null(bytes);
    assert_int_equal(size, 1185376);
    assert_memory_equal(t->data, bytes + 14176 + t->offset, t->size);
    const uint64_t off3 = t->offset;
    st_gguf_free(g);

    /* The same from memory, with the given name. */
    assert_int_equal(st_gguf_open_memory(bytes, size, "mem-stories", &g), ST_OK);
    check_stories(g);
    assert_ptr_equal(st_gguf_tensor_at(g, 3)->data, bytes + 14176 + off3);
    assert_string_equal(st_gguf_name(g), "mem-stories");
    st_gguf_free(g);
    free(bytes);
}

static void test_read_vocab_spm(void **state) {
    (void)state;
    size_t size;
    char *bytes = tu_read_file(spm(), &size);
    assert_non_null(bytes);
    st_gguf *g;
    assert_int_equal(st_gguf_open(spm(), &g), ST_OK);
    assert_int_equal(st_gguf_n_tensors(g), 0);
    assert_int_equal(st_gguf_n_kv(g), 22);
    assert_int_equal(st_gguf_data_offset(g), size); /* ends right after the KV section */
    assert_int_equal(get_u32(g, "llama.block_count"), 32);
    assert_int_equal(get_u32(g, "llama.context_length"), 4096);
    assert_int_equal(get_u32(g, "llama.embedding_length"), 4096);
    assert_int_equal(get_u32(g, "llama.feed_forward_length"), 11008);
    assert_int_equal(get_u32(g, "llama.attention.head_count"), 32);
    assert_int_equal(get_u32(g, "llama.attention.head_count_kv"), 32);
    assert_int_equal(get_u32(g, "llama.rope.dimension_count"), 128);
    assert_int_equal(get_u32(g, "llama.vocab_size"), 32000);
    assert_int_equal(get_u32(g, "general.file_type"), 1);
    assert_int_equal(get_u32(g, "tokenizer.ggml.bos_token_id"), 1);
    assert_int_equal(get_u32(g, "tokenizer.ggml.eos_token_id"), 2);
    assert_int_equal(get_u32(g, "tokenizer.ggml.unknown_token_id"), 0);
    int b;
    assert_int_equal(st_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b), ST_OK);
    assert_int_equal(b, 1);
    assert_int_equal(st_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b), ST_OK);
    assert_int_equal(b, 0);
    st_gguf_str s;
    assert_int_equal(st_gguf_get_str(g, "tokenizer.ggml.pre", &s), ST_OK);
    assert_str_eq_n(s, "default");
    assert_int_equal(st_gguf_get_str(g, "general.name", &s), ST_OK);
    assert_str_eq_n(s, "llama-spm");
    int64_t ti = st_gguf_find(g, "tokenizer.ggml.tokens");
    assert_int_equal(st_gguf_arr_len(g, ti), 32000);
    assert_int_equal(st_gguf_arr_str(g, ti, 1, &s), ST_OK);
    assert_str_eq_n(s, "<s>");
    assert_int_equal(st_gguf_arr_str(g, ti, 258, &s), ST_OK);
    assert_str_eq_n(s, "<0xFF>");
    int32_t tt[4];
    memcpy(tt, st_gguf_arr_data(g, st_gguf_find(g, "tokenizer.ggml.token_type")), sizeof tt);
    assert_int_equal(tt[0], 2);
    assert_int_equal(tt[1], 3);
    assert_int_equal(tt[2], 3);
    assert_int_equal(tt[3], 6);
    st_gguf_free(g);
    assert_int_equal(st_gguf_open_memory(bytes, size, "spm-mem", &g), ST_OK);
    assert_int_equal(st_gguf_n_kv(g), 22);
    st_gguf_free(g);
    /* A vocab-only file is not a model, and the error says so. */
    st_model *m;
    st_status st = st_model_load(spm(), &m);
    assert_null(m);
    assert_error_names(st, "ggml-vocab-llama-spm.gguf");
    assert_non_null(strstr(st_last_error(), "vocabulary-only"));
    /* One byte short is a truncated file. */
    assert_int_equal(st_gguf_open_memory(bytes, size - 1, "spm-short", &g), ST_ERR_FORMAT);
    assert_error_names(ST_ERR_FORMAT, "spm-short");
    free(bytes);
}

static void test_read_vocab_gpt2(void **state) {
    (void)state;
    st_gguf *g;
    assert_int_equal(st_gguf_open(gpt2(), &g), ST_OK);
    struct stat sb;
    assert_int_equal(stat(gpt2(), &sb), 0);
    assert_int_equal(st_gguf_data_offset(g), (size_t)sb.st_size);
    assert_int_equal(st_gguf_n_tensors(g), 0);
    assert_int_equal(st_gguf_n_kv(g), 16);
    st_gguf_str s;
    assert_int_equal(st_gguf_get_str(g, "general.architecture", &s), ST_OK);
    assert_str_eq_n(s, "gpt2");
    assert_int_equal(st_gguf_get_str(g, "tokenizer.ggml.model", &s), ST_OK);
    assert_str_eq_n(s, "gpt2");
    assert_int_equal(st_gguf_get_str(g, "tokenizer.ggml.pre", &s), ST_OK);
    assert_str_eq_n(s, "gpt-2");
    assert_int_equal(get_u32(g, "gpt2.context_length"), 1024);
    assert_int_equal(get_u32(g, "tokenizer.ggml.bos_token_id"), 50256);
    int64_t ti = st_gguf_find(g, "tokenizer.ggml.tokens");
    assert_int_equal(st_gguf_arr_len(g, ti), 50257);
    assert_int_equal(st_gguf_arr_str(g, ti, 0, &s), ST_OK);
    assert_str_eq_n(s, "!");
    int64_t mi = st_gguf_find(g, "tokenizer.ggml.merges");
    assert_int_equal(st_gguf_arr_len(g, mi), 50000);
    assert_int_equal(st_gguf_arr_str(g, mi, 0, &s), ST_OK);
    assert_str_eq_n(s, "\xc4\xa0 t");
    assert_int_equal(st_gguf_arr_len(g, st_gguf_find(g, "tokenizer.ggml.token_type")), 50257);
    assert_int_equal(st_gguf_find(g, "tokenizer.ggml.scores"), -1);
    st_gguf_free(g);
    st_model *m;
    assert_error_names(st_model_load(gpt2(), &m), "ggml-vocab-gpt-2.gguf");
}

static void test_open_errors(void **state) {
    (void)state;
    char dir[] = "/tmp/st_gguf_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    st_gguf *g = (st_gguf *)1;
    st_model *m = (st_model *)1;

    snprintf(path, sizeof path, "%s/missing.gguf", dir);
    assert_int_equal(st_gguf_open(path, &g), ST_ERR_IO);
    assert_null(g);
    assert_error_names(ST_ERR_IO, "missing.gguf");
    assert_error_names(st_model_load(path, &m), "missing.gguf");
    assert_null(m);

    st_status s = st_gguf_open(dir, &g);
    assert_null(g);
    assert_error_names(s, dir);
    assert_non_null(strstr(st_last_error(), "not a regular file"));

    snprintf(path, sizeof path, "%s/empty.gguf", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fclose(f);
    s = st_gguf_open(path, &g);
    assert_null(g);
    assert_error_names(s, "empty.gguf");
    assert_non_null(strstr(st_last_error(), "empty"));
    remove(path);

    snprintf(path, sizeof path, "%s/text.gguf", dir);
    f = fopen(path, "wb");
    fputs("hello, this is not a GGUF file at all", f);
    fclose(f);
    assert_int_equal(st_gguf_open(path, &g), ST_ERR_FORMAT);
    assert_error_names(ST_ERR_FORMAT, "text.gguf");
    assert_non_null(strstr(st_last_error(), "magic"));
    remove(path);
    rmdir(dir);

    assert_error_names(st_gguf_open_memory("", 0, "zero-bytes", &g), "zero-bytes");
    assert_null(g);
    assert_error_names(st_gguf_open_memory(NULL, 10, "null-buffer", &g), "null-buffer");
    assert_error_names(st_model_load_memory("GGUF", 4, "four-bytes", &m), "four-bytes");
    assert_null(m);
    assert_true(st_gguf_open(NULL, &g) < 0);
    assert_true(st_model_load_memory("GGUF", 4, "x", NULL) < 0);
    /* Big-endian and unknown versions. */
    const uint8_t be[24] = {'G', 'G', 'U', 'F', 0, 0, 0, 3};
    assert_int_equal(st_gguf_open_memory(be, sizeof be, "big-endian", &g), ST_ERR_UNSUPPORTED);
    assert_non_null(strstr(st_last_error(), "big-endian"));
    const uint8_t v1[24] = {'G', 'G', 'U', 'F', 1, 0, 0, 0};
    assert_int_equal(st_gguf_open_memory(v1, sizeof v1, "version-1", &g), ST_ERR_UNSUPPORTED);
    assert_error_names(ST_ERR_UNSUPPORTED, "version-1");
}

/* ------------------------------------------------------------------------------------------ */
/* Writer                                                                                     */

static st_gguf_writer *new_writer(void) {
    st_gguf_writer *w = NULL;
    assert_int_equal(st_gguf_writer_create(&w), ST_OK);
    return w;
}

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

/* ------------------------------------------------------------------------------------------ */
/* A small model made with the writer                                                         */

/* How build_small changes one metadata key. */
typedef enum {
    KEY_OK,
    KEY_MISSING,
    KEY_STRING,
    KEY_F32,
    KEY_ARRAY,
    KEY_BOOL,
    KEY_NEG,
    KEY_HUGE,
    KEY_ZERO,
    KEY_N
} key_mode;

typedef struct hparam {
    const char *key;
    uint32_t value; /* 0: a float key (value in fval) */
    float fval;
    const char *word; /* what an error about the key says at least */
} hparam;

enum { SM_DIM = 32, SM_FF = 64, SM_LAYERS = 2, SM_HEADS = 4, SM_KV = 2 };

static const hparam small_hparams[] = {
    {"llama.context_length", 64, 0, "context_length"},
    {"llama.embedding_length", SM_DIM, 0, "embedding_length"},
    {"llama.block_count", SM_LAYERS, 0, "block_count"},
    {"llama.feed_forward_length", SM_FF, 0, "feed_forward_length"},
    {"llama.attention.head_count", SM_HEADS, 0, "head_count"},
    {"llama.attention.head_count_kv", SM_KV, 0, "head_count"},
    {"llama.rope.dimension_count", SM_DIM / SM_HEADS, 0, "rope"},
    {"llama.rope.freq_base", 0, 10000.0f, "freq_base"},
    {"llama.attention.layer_norm_rms_epsilon", 0, 1e-5f, "epsilon"},
};
enum { N_SMALL_HPARAMS = sizeof small_hparams / sizeof small_hparams[0] };

static void add_key(st_gguf_writer *w, const hparam *h, key_mode mode) {
    const uint32_t arr[1] = {h->value};
    switch (mode) {
    case KEY_OK:
        if (h->value)
            assert_int_equal(st_gguf_writer_add_u32(w, h->key, h->value), ST_OK);
        else
            assert_int_equal(st_gguf_writer_add_f32(w, h->key, h->fval), ST_OK);
        break;
    case KEY_MISSING:
        break;
    case KEY_STRING:
        assert_int_equal(st_gguf_writer_add_str(w, h->key, "32"), ST_OK);
        break;
    case KEY_F32:
        if (h->value)
            assert_int_equal(st_gguf_writer_add_f32(w, h->key, (float)h->value), ST_OK);
        else
            assert_int_equal(st_gguf_writer_add_u32(w, h->key, 1), ST_OK);
        break;
    case KEY_ARRAY:
        assert_int_equal(st_gguf_writer_add_arr(w, h->key, ST_GGUF_UINT32, arr, 1), ST_OK);
        break;
    case KEY_BOOL:
        assert_int_equal(st_gguf_writer_add_bool(w, h->key, 1), ST_OK);
        break;
    case KEY_NEG:
        if (h->value)
            assert_int_equal(st_gguf_writer_add_i32(w, h->key, -(int32_t)h->value), ST_OK);
        else
            assert_int_equal(st_gguf_writer_add_f32(w, h->key, -h->fval), ST_OK);
        break;
    case KEY_HUGE:
        if (h->value)
            assert_int_equal(st_gguf_writer_add_u64(w, h->key, UINT64_MAX - 5), ST_OK);
        else
            assert_int_equal(st_gguf_writer_add_f32(w, h->key, INFINITY), ST_OK);
        break;
    case KEY_ZERO:
        if (h->value)
            assert_int_equal(st_gguf_writer_add_u32(w, h->key, 0), ST_OK);
        else
            assert_int_equal(st_gguf_writer_add_f32(w, h->key, NAN), ST_OK);
        break;
    case KEY_N:
        break;
    }
}

typedef struct small_tensor {
    const char *name;
    int64_t n_in, n_out;
    uint32_t type;
} small_tensor;

/* A 2-layer model with stories260K's tokenizer and every weight type (token_embd q8_0,
 * output q4_0, layer 0 f16, layer 1 bf16, norms f32) and general.alignment 64. Key `bad`
 * (or -1) gets `mode`. Returns a malloc'd image. */
static void *build_small(const st_gguf *vocab, int bad, key_mode mode, size_t *size) {
    st_gguf_writer *w = new_writer();
    assert_int_equal(st_gguf_writer_add_str(w, "general.architecture", "llama"), ST_OK);
    assert_int_equal(st_gguf_writer_add_u32(w, "general.alignment", 64), ST_OK);
    for (int i = 0; i < N_SMALL_HPARAMS; i++)
        add_key(w, &small_hparams[i], i == bad ? mode : KEY_OK);
    assert_int_equal(st_gguf_writer_copy_tokenizer(w, vocab, NULL, 0), ST_OK);
    const int64_t V = st_gguf_arr_len(vocab, st_gguf_find(vocab, "tokenizer.ggml.tokens"));
    const int64_t E = SM_DIM, F = SM_FF, KV = SM_KV * (SM_DIM / SM_HEADS);
    small_tensor ts[3 + 9 * SM_LAYERS];
    int n = 0;
    ts[n++] = (small_tensor){"token_embd.weight", E, V, ST_DTYPE_Q8_0};
    ts[n++] = (small_tensor){"output_norm.weight", E, 1, ST_DTYPE_F32};
    ts[n++] = (small_tensor){"output.weight", E, V, ST_DTYPE_Q4_0};
    static char names[SM_LAYERS][9][48];
    static const char *suffix[9] = {"attn_norm", "attn_q",   "attn_k", "attn_v",  "attn_output",
                                    "ffn_norm",  "ffn_gate", "ffn_up", "ffn_down"};
    for (int l = 0; l < SM_LAYERS; l++) {
        uint32_t wt = l == 0 ? ST_DTYPE_F16 : ST_DTYPE_BF16;
        const int64_t in[9] = {E, E, E, E, E, E, E, E, F}, out[9] = {1, E, KV, KV, E, 1, F, F, E};
        for (int k = 0; k < 9; k++) {
            snprintf(names[l][k], sizeof names[l][k], "blk.%d.%s.weight", l, suffix[k]);
            ts[n++] = (small_tensor){names[l][k], in[k], out[k], out[k] == 1 ? ST_DTYPE_F32 : wt};
        }
    }
    uint64_t seed = 7;
    for (int i = 0; i < n; i++) {
        int64_t nel = ts[i].n_in * ts[i].n_out;
        float *x = malloc((size_t)nel * sizeof(float));
        for (int64_t k = 0; k < nel; k++)
            x[k] = ts[i].n_out == 1 ? 1.0f + 0.1f * rng_float(&seed)
                                    : rng_float(&seed) / sqrtf((float)ts[i].n_in);
        int64_t ne[2] = {ts[i].n_in, ts[i].n_out};
        size_t bytes;
        assert_int_equal(st_gguf_tensor_bytes(ts[i].type, ts[i].n_out == 1 ? 1 : 2, ne, &bytes),
                         ST_OK);
        void *q = malloc(bytes);
        assert_int_equal(st_quantize_row(ts[i].type, x, nel, q), ST_OK);
        assert_int_equal(st_gguf_writer_add_tensor(w, ts[i].name, ts[i].type,
                                                   ts[i].n_out == 1 ? 1 : 2, ne, q, bytes,
                                                   ST_GGUF_COPY),
                         ST_OK);
        free(q);
        free(x);
    }
    void *buf;
    assert_int_equal(st_gguf_writer_write_memory(w, &buf, size), ST_OK);
    st_gguf_writer_free(w);
    return buf;
}

/* Logits of tokens {1, 5, 9} in a fresh session (n_vocab floats, malloc'd). */
static float *eval_logits(const st_model *m) {
    st_session_params p = st_session_default_params();
    p.n_ctx = 8;
    p.n_threads = 1;
    p.n_batch = 4;
    st_session *s;
    assert_int_equal(st_session_create(m, &p, &s), ST_OK);
    const int32_t toks[3] = {1, 5, 9};
    int32_t V = st_model_get_hparams(m)->n_vocab;
    float *lg = malloc((size_t)V * sizeof(float));
    assert_int_equal(st_session_eval(s, 0, toks, 3, lg, 1), ST_OK);
    for (int32_t i = 0; i < V; i++)
        assert_true(isfinite(lg[i]));
    st_session_free(s);
    return lg;
}

static void test_load_memory(void **state) {
    (void)state;
    size_t size;
    char *bytes = tu_read_file(stories(), &size);
    st_model *mf, *mm;
    assert_int_equal(st_model_load(stories(), &mf), ST_OK);
    assert_int_equal(st_model_load_memory(bytes, size, "stories-mem", &mm), ST_OK);
    assert_memory_equal(st_model_get_hparams(mf), st_model_get_hparams(mm),
                        sizeof(st_model_hparams));
    float *a = eval_logits(mf), *b = eval_logits(mm);
    assert_memory_equal(a, b, 512 * sizeof(float));
    free(a);
    free(b);
    st_model_free(mm);
    st_model_free(mf);

    /* The writer-made model: every weight type, loads from memory and from a file alike. */
    st_gguf *vocab;
    assert_int_equal(st_gguf_open_memory(bytes, size, "vocab", &vocab), ST_OK);
    size_t n;
    void *img = build_small(vocab, -1, KEY_OK, &n);
    assert_int_equal(st_model_load_memory(img, n, "small", &mm), ST_OK);
    const st_model_hparams *hp = st_model_get_hparams(mm);
    assert_int_equal(hp->n_vocab, 512);
    assert_int_equal(hp->n_embd, SM_DIM);
    assert_int_equal(hp->n_layer, SM_LAYERS);
    assert_int_equal(hp->n_head_kv, SM_KV);
    assert_int_equal(hp->wtype, ST_DTYPE_F16);
    assert_int_equal(hp->tied_output, 0);
    char path[] = "/tmp/st_gguf_small_XXXXXX";
    int fd = mkstemp(path);
    assert_int_equal(write(fd, img, n), (ssize_t)n);
    close(fd);
    assert_int_equal(st_model_load(path, &mf), ST_OK);
    a = eval_logits(mf);
    b = eval_logits(mm);
    assert_memory_equal(a, b, 512 * sizeof(float));
    free(a);
    free(b);
    st_model_free(mf);
    st_model_free(mm);
    remove(path);
    free(img);

    /* Every required key missing or of a wrong type: a clear error naming file and key. */
    for (int k = 0; k < N_SMALL_HPARAMS; k++)
        for (int mode = KEY_MISSING; mode < KEY_N; mode++) {
            img = build_small(vocab, k, (key_mode)mode, &n);
            char name[64];
            snprintf(name, sizeof name, "small-key%d-mode%d", k, mode);
            st_status s = st_model_load_memory(img, n, name, &mm);
            int optional = strstr(small_hparams[k].key, "head_count_kv") ||
                           strstr(small_hparams[k].key, "dimension_count") ||
                           strstr(small_hparams[k].key, "freq_base");
            if (s == ST_OK) {
                /* Only a missing optional key may load. */
                if (!(mode == KEY_MISSING && optional))
                    fail_msg("%s (%s) loaded", name, small_hparams[k].key);
                st_model_free(mm);
            } else {
                assert_null(mm);
                assert_error_names(s, name);
                /* A missing optional key takes its default, which may not fit the tensors. */
                if (!(mode == KEY_MISSING && optional) &&
                    !strstr(st_last_error(), small_hparams[k].word))
                    fail_msg("%s: error '%s' does not name the key %s", name, st_last_error(),
                             small_hparams[k].key);
            }
            free(img);
        }
    st_gguf_free(vocab);
    free(bytes);
}

/* ------------------------------------------------------------------------------------------ */
/* spectree-mkmodel                                                                           */

static int run_cmd(const char *cmd, char *out, size_t cap) {
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    int rc = pclose(f);
    return rc;
}

static void test_mkmodel(void **state) {
    (void)state;
    char tool[512];
    snprintf(tool, sizeof tool, "%s/spectree-mkmodel", ST_BUILD_DIR);
    if (access(tool, X_OK) != 0) {
        fprintf(stderr, "test_mkmodel: %s not built, skipped\n", tool);
        skip();
    }
    char dir[] = "/tmp/st_mkmodel_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[2048], out[4096], path[600], path2[600];
    const char *types[] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
    const uint32_t ids[] = {ST_DTYPE_F32, ST_DTYPE_F16, ST_DTYPE_BF16, ST_DTYPE_Q8_0,
                            ST_DTYPE_Q4_0};
    for (int i = 0; i < 5; i++) {
        int ff = i < 3 ? 172 : 192;
        snprintf(path, sizeof path, "%s/m_%s.gguf", dir, types[i]);
        snprintf(cmd, sizeof cmd,
                 "%s %s --vocab %s --dim 64 --ff %d --layers 5 --heads 8 --kv-heads 4 --type %s "
                 "--seed 3 2>&1",
                 tool, path, stories(), ff, types[i]);
        if (run_cmd(cmd, out, sizeof out) != 0)
            fail_msg("%s: %s", cmd, out);
        st_model *m;
        if (st_model_load(path, &m) != ST_OK)
            fail_msg("%s: %s", path, st_last_error());
        const st_model_hparams *hp = st_model_get_hparams(m);
        assert_int_equal(hp->n_vocab, 512);
        assert_int_equal(hp->n_embd, 64);
        assert_int_equal(hp->n_ff, ff);
        assert_int_equal(hp->n_layer, 5);
        assert_int_equal(hp->n_head, 8);
        assert_int_equal(hp->n_head_kv, 4);
        assert_int_equal(hp->head_dim, 8);
        assert_int_equal(hp->n_rot, 8);
        assert_int_equal(hp->n_ctx_train, 2048);
        assert_int_equal(hp->wtype, ids[i]);
        assert_true(hp->rms_eps == 1e-5f);
        free(eval_logits(m));
        st_model_free(m);
    }
    /* Other vocabularies: the tokenizer is copied and sets n_vocab. */
    snprintf(path, sizeof path, "%s/gpt2.gguf", dir);
    snprintf(cmd, sizeof cmd,
             "%s %s --vocab %s --dim 32 --ff 64 --layers 1 --heads 4 --type q8_0 --ctx 128 2>&1",
             tool, path, gpt2());
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    st_model *m;
    assert_int_equal(st_model_load(path, &m), ST_OK);
    assert_int_equal(st_model_get_hparams(m)->n_vocab, 50257);
    assert_int_equal(st_model_get_hparams(m)->n_ctx_train, 128);
    st_model_free(m);
    remove(path);

    /* --keep-layers: the first blocks, embeddings and output are bitwise those of the full
     * model; the same seed gives the same file, another seed another one. */
    snprintf(path, sizeof path, "%s/full.gguf", dir);
    snprintf(path2, sizeof path2, "%s/draft.gguf", dir);
    const char *shape = "--dim 64 --ff 192 --layers 4 --heads 8 --kv-heads 2 --type q4_0";
    snprintf(cmd, sizeof cmd, "%s %s --vocab %s %s --seed 11 2>&1", tool, path, spm(), shape);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "%s %s --vocab %s %s --seed 11 --keep-layers 2 2>&1", tool, path2,
             spm(), shape);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    st_gguf *gf, *gd;
    assert_int_equal(st_gguf_open(path, &gf), ST_OK);
    assert_int_equal(st_gguf_open(path2, &gd), ST_OK);
    assert_int_equal(get_u32(gf, "llama.block_count"), 4);
    assert_int_equal(get_u32(gd, "llama.block_count"), 2);
    assert_int_equal(st_gguf_n_tensors(gf), 3 + 9 * 4);
    assert_int_equal(st_gguf_n_tensors(gd), 3 + 9 * 2);
    for (int64_t i = 0; i < st_gguf_n_tensors(gd); i++) {
        const st_gguf_tensor *td = st_gguf_tensor_at(gd, i);
        const st_gguf_tensor *tf = st_gguf_tensor_find(gf, td->name);
        assert_non_null(tf);
        assert_int_equal(td->size, tf->size);
        assert_memory_equal(td->data, tf->data, td->size);
    }
    assert_null(st_gguf_tensor_find(gd, "blk.2.attn_q.weight"));
    st_model *md;
    assert_int_equal(st_model_load(path2, &md), ST_OK);
    assert_int_equal(st_model_get_hparams(md)->n_vocab, 32000);
    st_model_free(md);
    st_gguf_free(gd);
    snprintf(cmd, sizeof cmd, "%s %s --vocab %s %s --seed 12 --keep-layers 2 2>&1", tool, path2,
             spm(), shape);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    assert_int_equal(st_gguf_open(path2, &gd), ST_OK);
    const st_gguf_tensor *a = st_gguf_tensor_find(gd, "blk.0.attn_q.weight");
    assert_memory_not_equal(a->data, st_gguf_tensor_find(gf, "blk.0.attn_q.weight")->data, a->size);
    st_gguf_free(gd);
    st_gguf_free(gf);
    remove(path);
    remove(path2);

    /* Bad flags and shapes: one line on stderr, non-zero exit, no file. */
    snprintf(path, sizeof path, "%s/bad.gguf", dir);
    const char *bad[] = {
        "--dim 64 --ff 172 --layers 2 --heads 8 --type q8_0",     /* ff not a multiple of 32 */
        "--dim 60 --ff 192 --layers 2 --heads 8",                 /* dim % heads */
        "--dim 64 --ff 192 --layers 2 --heads 8 --kv-heads 3",    /* heads % kv-heads */
        "--dim 64 --ff 192 --layers 2 --heads 8 --type q5_0",     /* unknown type */
        "--dim 64 --ff 192 --layers 2",                           /* no heads */
        "--dim 64 --ff 192 --layers 2 --heads 8 --keep-layers 3", /* keep > layers */
        "--dim 64 --ff 192 --layers 2 --heads 8 --bogus",         /* unknown flag */
        "--dim x --ff 192 --layers 2 --heads 8",                  /* not a number */
        "--dim 64 --ff 192 --layers 2 --heads 8 --scale -1",      /* bad scale */
        "--dim 64 --ff 192 --layers 0 --heads 8",                 /* zero layers */
        "--dim 64 --ff 192 --layers 2 --heads 64",                /* odd head size (1) */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s %s --vocab %s %s 2>&1", tool, path, stories(), bad[i]);
        int rc = run_cmd(cmd, out, sizeof out);
        if (rc == 0 || !strstr(out, "spectree-mkmodel: ") ||
            strchr(out, '\n') != out + strlen(out) - 1)
            fail_msg("'%s' gave rc %d and '%s'", bad[i], rc, out);
        assert_int_equal(access(path, F_OK), -1);
    }
    snprintf(cmd, sizeof cmd,
             "%s %s --vocab %s/nope.gguf --dim 64 --ff 192 --layers 1 --heads 8 2>&1", tool, path,
             dir);
    assert_true(run_cmd(cmd, out, sizeof out) != 0);
    assert_non_null(strstr(out, "nope.gguf"));
    snprintf(cmd, sizeof cmd, "%s --help", tool);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "--keep-layers"));
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/m_%s.gguf", dir, types[i]);
        remove(path);
    }
    assert_int_equal(rmdir(dir), 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Fuzz-style: mutated and truncated files                                                    */

typedef struct field {
    size_t off;
    int width; /* bytes: 1, 2, 4 or 8 */
} field;

typedef struct span {
    size_t off, len;
} span;

/* Where the fields of a valid GGUF image are, for targeted mutations. */
typedef struct layout {
    field fields[4096];
    int n_fields;
    span keys[256], names[256];
    int n_keys, n_names;
    size_t type_offs[256]; /* value type field of each KV (and element type of arrays) */
    int n_types;
    size_t align_off; /* value of general.alignment, 0 if none */
    size_t meta_end;  /* end of the tensor infos */
} layout;

static void add_field(layout *L, size_t off, int width) {
    if (L->n_fields < (int)(sizeof L->fields / sizeof L->fields[0]))
        L->fields[L->n_fields++] = (field){off, width};
}

static uint64_t rd64(const uint8_t *p, size_t off) {
    uint64_t v;
    memcpy(&v, p + off, 8);
    return v;
}
static uint32_t rd32(const uint8_t *p, size_t off) {
    uint32_t v;
    memcpy(&v, p + off, 4);
    return v;
}

static size_t scalar_width(uint32_t t) {
    static const size_t w[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < 13 ? w[t] : 0;
}

static void map_layout(const uint8_t *p, layout *L) {
    memset(L, 0, sizeof *L);
    add_field(L, 4, 4); /* version */
    add_field(L, 8, 8);
    add_field(L, 16, 8);
    int64_t nt = (int64_t)rd64(p, 8), nkv = (int64_t)rd64(p, 16);
    size_t o = 24;
    for (int64_t i = 0; i < nkv; i++) {
        add_field(L, o, 8);
        uint64_t kl = rd64(p, o);
        L->keys[L->n_keys++] = (span){o + 8, (size_t)kl};
        int is_align = kl == 17 && memcmp(p + o + 8, "general.alignment", 17) == 0;
        o += 8 + kl;
        uint32_t t = rd32(p, o);
        L->type_offs[L->n_types++] = o;
        add_field(L, o, 4);
        o += 4;
        if (is_align)
            L->align_off = o;
        if (t == ST_GGUF_STRING) {
            add_field(L, o, 8);
            o += 8 + rd64(p, o);
        } else if (t == ST_GGUF_ARRAY) {
            uint32_t at = rd32(p, o);
            L->type_offs[L->n_types++] = o;
            add_field(L, o, 4);
            add_field(L, o + 4, 8);
            uint64_t n = rd64(p, o + 4);
            o += 12;
            if (at == ST_GGUF_STRING) {
                for (uint64_t k = 0; k < n; k++) {
                    if (k < 3 || k + 2 >= n || k % 97 == 0)
                        add_field(L, o, 8);
                    o += 8 + rd64(p, o);
                }
            } else {
                if (n)
                    add_field(L, o, (int)scalar_width(at));
                o += n * scalar_width(at);
            }
        } else {
            add_field(L, o, (int)scalar_width(t));
            o += scalar_width(t);
        }
    }
    for (int64_t i = 0; i < nt; i++) {
        add_field(L, o, 8);
        uint64_t nl = rd64(p, o);
        L->names[L->n_names++] = (span){o + 8, (size_t)nl};
        o += 8 + nl;
        uint32_t nd = rd32(p, o);
        add_field(L, o, 4);
        o += 4;
        for (uint32_t d = 0; d < nd; d++, o += 8)
            add_field(L, o, 8);
        add_field(L, o, 4);     /* type */
        add_field(L, o + 4, 8); /* offset */
        o += 12;
    }
    L->meta_end = o;
}

static void write_field(uint8_t *p, field f, uint64_t v) { memcpy(p + f.off, &v, (size_t)f.width); }

static uint64_t extreme(uint64_t *rng, size_t file_size) {
    const uint64_t vals[] = {0,
                             1,
                             2,
                             3,
                             4,
                             5,
                             7,
                             8,
                             13,
                             31,
                             32,
                             33,
                             63,
                             64,
                             255,
                             256,
                             0x7f,
                             0x80,
                             0xff,
                             0x7fff,
                             0x8000,
                             0xffff,
                             0x7fffffffu,
                             0x80000000u,
                             0xffffffffu,
                             0x100000000ULL,
                             (uint64_t)INT64_MAX,
                             (uint64_t)INT64_MIN,
                             UINT64_MAX,
                             UINT64_MAX - 1,
                             (uint64_t)file_size,
                             (uint64_t)file_size - 1,
                             (uint64_t)file_size + 1,
                             (uint64_t)file_size / 2,
                             1ULL << 62,
                             1ULL << 40};
    uint64_t r = rng_next(rng);
    if (r % 8 == 0)
        return rng_next(rng);
    if (r % 8 == 1)
        return rng_below(rng, 100000);
    return vals[(r >> 8) % (sizeof vals / sizeof vals[0])];
}

/* Swaps the text of one key (or tensor name) for another of the same length: a duplicate. */
static bool duplicate_span(uint8_t *p, const span *s, int n, uint64_t *rng) {
    for (int tries = 0; tries < 64 && n > 1; tries++) {
        int a = (int)rng_below(rng, (uint64_t)n), b = (int)rng_below(rng, (uint64_t)n);
        if (a != b && s[a].len == s[b].len) {
            memcpy(p + s[a].off, p + s[b].off, s[a].len);
            return true;
        }
    }
    return false;
}

/* Mutation `kind` (0..8) of the image in place; may shorten *size. Returns kind. */
static int mutate(uint8_t *p, size_t *size, const layout *L, uint64_t *rng, int kind) {
    size_t region = L->meta_end + 64 < *size ? L->meta_end + 64 : *size;
    switch (kind) {
    case 0: { /* random bytes in the header, KVs and tensor infos */
        int n = 1 + (int)rng_below(rng, 8);
        for (int i = 0; i < n; i++) {
            size_t o = (size_t)rng_below(rng, region);
            p[o] = rng_next(rng) & 1 ? (uint8_t)rng_next(rng)
                                     : p[o] ^ (uint8_t)(1u << (rng_next(rng) & 7));
        }
        break;
    }
    case 1:
    case 2: { /* extreme values in fields */
        int n = 1 + (int)rng_below(rng, kind == 1 ? 1 : 4);
        for (int i = 0; i < n; i++) {
            field f = L->fields[rng_below(rng, (uint64_t)L->n_fields)];
            if (f.width > 0 && f.off + (size_t)f.width <= *size)
                write_field(p, f, extreme(rng, *size));
        }
        break;
    }
    case 3: { /* truncation: in the metadata or anywhere, data included */
        size_t cut =
            rng_next(rng) & 1 ? (size_t)rng_below(rng, region) : (size_t)rng_below(rng, *size);
        *size = cut;
        break;
    }
    case 4: /* duplicate key or tensor name */
        if (!duplicate_span(p, L->keys, L->n_keys, rng) &&
            !duplicate_span(p, L->names, L->n_names, rng))
            p[rng_below(rng, region)] ^= 0x20;
        break;
    case 5: { /* bad alignment, or a bad type for general.alignment */
        if (L->align_off) {
            const uint32_t vals[] = {0, 1, 3, 5, 12, 48, 96, 1u << 31, 0xffffffffu, 2, 16, 128};
            uint32_t v = vals[rng_below(rng, sizeof vals / sizeof vals[0])];
            if (rng_next(rng) % 4 == 0) {
                uint32_t t = (uint32_t)rng_below(rng, 13);
                memcpy(p + L->align_off - 4, &t, 4);
            } else {
                memcpy(p + L->align_off, &v, 4);
            }
        } else {
            field f = L->fields[rng_below(rng, (uint64_t)L->n_fields)];
            write_field(p, f, extreme(rng, *size));
        }
        break;
    }
    case 6: { /* wrong value type (or array element type) */
        size_t o = L->type_offs[rng_below(rng, (uint64_t)L->n_types)];
        uint32_t t = (uint32_t)rng_below(rng, 16);
        memcpy(p + o, &t, 4);
        break;
    }
    case 7: { /* tensor type or dimension count */
        field f = L->fields[rng_below(rng, (uint64_t)L->n_fields)];
        if (f.width == 4 && f.off + 4 <= *size) {
            uint32_t t = (uint32_t)rng_below(rng, 40);
            memcpy(p + f.off, &t, 4);
        }
        break;
    }
    default: { /* several of the above, then maybe a truncation */
        static const int kinds[] = {0, 1, 2, 4, 5, 6, 7};
        int n = 2 + (int)rng_below(rng, 3);
        for (int i = 0; i < n; i++)
            mutate(p, size, L, rng, kinds[rng_below(rng, sizeof kinds / sizeof kinds[0])]);
        if (rng_next(rng) % 3 == 0)
            *size = (size_t)rng_below(rng, *size + 1);
        break;
    }
    }
    return kind;
}

/* Reads everything a reader client could: every KV formatted, array elements, getters, every
 * tensor's first and last byte. */
static void walk(const st_gguf *g) {
    char buf[512];
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < st_gguf_n_kv(g); i++) {
        const char *key = st_gguf_key(g, i);
        st_gguf_format_value(g, i, buf, sizeof buf);
        st_gguf_format_value(g, i, buf, 7);
        int64_t n = st_gguf_arr_len(g, i);
        if (n >= 0) {
            const int64_t idx[] = {0, 1, n / 2, n - 1};
            for (int k = 0; k < 4; k++) {
                if (idx[k] < 0 || idx[k] >= n)
                    continue;
                st_gguf_str s;
                double d;
                if (st_gguf_arr_type(g, i) == ST_GGUF_STRING) {
                    assert_int_equal(st_gguf_arr_str(g, i, idx[k], &s), ST_OK);
                    if (s.len)
                        sink ^= (uint8_t)(s.ptr[0] ^ s.ptr[s.len - 1]);
                } else {
                    assert_int_equal(st_gguf_arr_num(g, i, idx[k], &d), ST_OK);
                }
            }
            (void)st_gguf_arr_data(g, i);
        } else {
            uint32_t u;
            int64_t v;
            float f;
            int b;
            st_gguf_str s;
            (void)st_gguf_get_u32(g, key, &u);
            (void)st_gguf_get_i64(g, key, &v);
            (void)st_gguf_get_f32(g, key, &f);
            (void)st_gguf_get_bool(g, key, &b);
            if (st_gguf_get_str(g, key, &s) == ST_OK && s.len)
                sink ^= (uint8_t)(s.ptr[0] ^ s.ptr[s.len - 1]);
        }
    }
    for (int64_t i = 0; i < st_gguf_n_tensors(g); i++) {
        const st_gguf_tensor *t = st_gguf_tensor_at(g, i);
        assert_ptr_equal(st_gguf_tensor_find(g, t->name), t);
        if (t->size)
            sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->size - 1];
    }
    (void)sink;
}

typedef struct fuzz_stats {
    int n, gguf_rejected, model_rejected, loaded;
} fuzz_stats;

/* Opens one image (an exactly-sized heap copy, so ASan sees any read past its end). */
static void check_image(const uint8_t *img, size_t size, const char *name, fuzz_stats *st) {
    uint8_t *p = malloc(size ? size : 1);
    memcpy(p, img, size);
    st->n++;
    st_gguf *g = (st_gguf *)1;
    st_status s = st_gguf_open_memory(p, size, name, &g);
    if (s != ST_OK) {
        assert_null(g);
        assert_error_names(s, name);
        st->gguf_rejected++;
        free(p);
        return;
    }
    walk(g);
    st_gguf_free(g);
    st_model *m = (st_model *)1;
    s = st_model_load_memory(p, size, name, &m);
    if (s != ST_OK) {
        assert_null(m);
        assert_error_names(s, name);
        st->model_rejected++;
    } else {
        st->loaded++;
        /* A model that loads must also run. */
        st_session_params sp = st_session_default_params();
        sp.n_ctx = 4;
        sp.n_threads = 1;
        sp.n_batch = 2;
        st_session *ss;
        if (st_session_create(m, &sp, &ss) == ST_OK) {
            int32_t V = st_model_get_hparams(m)->n_vocab;
            int32_t toks[2] = {1 % V, 2 % V};
            float *lg = malloc((size_t)V * sizeof(float));
            assert_int_equal(st_session_eval(ss, 0, toks, 2, lg, 1), ST_OK);
            free(lg);
            st_session_free(ss);
        }
        st_model_free(m);
    }
    free(p);
}

static void fuzz_image(const uint8_t *base, size_t size, const char *tag, int iters,
                       uint64_t seed) {
    layout *L = malloc(sizeof *L);
    map_layout(base, L);
    uint8_t *work = malloc(size);
    fuzz_stats st = {0};
    char name[96];
    /* Every truncation point inside the metadata, then random mutations. */
    for (size_t cut = 0; cut < L->meta_end + 40; cut += 1 + cut / 64) {
        snprintf(name, sizeof name, "%s-cut%zu.gguf", tag, cut);
        check_image(base, cut, name, &st);
    }
    uint64_t rng = seed;
    for (int it = 0; it < iters; it++) {
        memcpy(work, base, size);
        size_t n = size;
        int kind = mutate(work, &n, L, &rng, (int)rng_below(&rng, 9));
        snprintf(name, sizeof name, "%s-mut%d-k%d.gguf", tag, it, kind);
        check_image(work, n, name, &st);
    }
    fprintf(stderr, "fuzz %s: %d images: %d rejected by the reader, %d by the loader, %d loaded\n",
            tag, st.n, st.gguf_rejected, st.model_rejected, st.loaded);
    assert_true(st.gguf_rejected > st.n / 4);
    assert_true(st.loaded > 0);
    free(work);
    free(L);
}

static void test_fuzz_stories(void **state) {
    (void)state;
    size_t size;
    uint8_t *base = (uint8_t *)tu_read_file(stories(), &size);
    assert_non_null(base);
    fuzz_image(base, size, "stories", 4000, 1);
    free(base);
}

static void test_fuzz_small(void **state) {
    (void)state;
    size_t size;
    char *bytes = tu_read_file(stories(), &size);
    st_gguf *vocab;
    assert_int_equal(st_gguf_open_memory(bytes, size, "vocab", &vocab), ST_OK);
    size_t n;
    uint8_t *img = build_small(vocab, -1, KEY_OK, &n);
    st_gguf_free(vocab);
    free(bytes);
    fuzz_image(img, n, "small", 4000, 2);
    free(img);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_stories),    cmocka_unit_test(test_read_vocab_spm),
        cmocka_unit_test(test_read_vocab_gpt2), cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_write_values),    cmocka_unit_test(test_write_errors),
        cmocka_unit_test(test_write_tensors),   cmocka_unit_test(test_rewrite_stories),
        cmocka_unit_test(test_quantizers),      cmocka_unit_test(test_load_memory),
        cmocka_unit_test(test_mkmodel),         cmocka_unit_test(test_fuzz_stories),
        cmocka_unit_test(test_fuzz_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
