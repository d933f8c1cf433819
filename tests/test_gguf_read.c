/*
 * test_gguf_read.c: the GGUF reader.
 * - Metadata and tensor tables of stories260K.gguf and of both vocab-only files (which end right
 *   after their KV section); clear errors for missing, directory and empty files.
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
        cmocka_unit_test(test_fuzz_stories),    cmocka_unit_test(test_fuzz_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
