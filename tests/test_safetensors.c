/*
 * test_safetensors.c: the safetensors reader, its writer and the config.json helper.
 * - The real TinyStories-656K checkpoint: tensor shapes and dtypes agree with its config.json,
 *   data pointers land on the file's bytes, lookups and enumeration agree.
 * - Writer round trips and a sharded checkpoint (two shards + index.json) built in a temp dir.
 * - One test per malformed input, each asserting the error names the file and the problem;
 *   every truncation of the real file and thousands of mutated headers are rejected cleanly.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "io/safetensors.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *tiny_dir(void) { return tu_data("models/TinyStories-656K"); }

static char tmp_dir[256];

static int setup_tmp(void **state) {
    (void)state;
    snprintf(tmp_dir, sizeof tmp_dir, "%s/st_sf_XXXXXX", ST_BUILD_DIR);
    return mkdtemp(tmp_dir) ? 0 : -1;
}

/* Removes the temp dir and what the tests put in it (plain files and one level of dirs). */
static int teardown_tmp(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *tmp_path(const char *name) {
    static char bufs[4][512];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, 512, "%s/%s", tmp_dir, name);
    return b;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A file of: the header length `len`, then `header`, then `data_len` bytes of data. */
static void write_raw_len(const char *path, uint64_t len, const char *header, size_t data_len) {
    size_t hn = strlen(header);
    uint8_t *buf = calloc(1, 8 + hn + data_len);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(len >> (8 * i));
    memcpy(buf + 8, header, hn);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hn + i] = (uint8_t)(i * 7 + 1);
    write_bytes(path, buf, 8 + hn + data_len);
    free(buf);
}

static void write_raw(const char *path, const char *header, size_t data_len) {
    write_raw_len(path, strlen(header), header, data_len);
}

static void assert_contains(const char *s, const char *want) {
    if (!strstr(s, want))
        fail_msg("'%s' does not contain '%s'", s, want);
}

/* Opening `path` fails with `want` and an error holding the path and every given part. */
static void expect_fail_v(const char *path, st_status want, va_list ap) {
    st_safetensors *sf = (st_safetensors *)1;
    st_status s = st_safetensors_open(path, &sf);
    if (s != want)
        fail_msg("status %d, want %d; error '%s'", (int)s, (int)want, st_last_error());
    assert_null(sf);
    const char *e = st_last_error();
    assert_null(strchr(e, '\n'));
    assert_contains(e, path);
    for (const char *part; (part = va_arg(ap, const char *));)
        assert_contains(e, part);
}

static void expect_fail(const char *path, st_status want, ...) {
    va_list ap;
    va_start(ap, want);
    expect_fail_v(path, want, ap);
    va_end(ap);
}

/* A one-file case: the header and data bytes go to a fresh file, which must fail. */
static void bad_header(const char *header, size_t data_len, ...) {
    const char *path = tmp_path("bad.safetensors");
    write_raw(path, header, data_len);
    va_list ap;
    va_start(ap, data_len);
    expect_fail_v(path, ST_ERR_FORMAT, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------------------------ */
/* The real checkpoint                                                                        */

static int64_t cfg_int(const st_hf_config *c, const char *key) {
    int64_t v = -1;
    assert_int_equal(st_hf_config_get_int(c, key, &v), ST_OK);
    return v;
}

static void assert_shape(const st_safetensors *sf, const char *name, int32_t n_dims, int64_t d0,
                         int64_t d1) {
    const st_sf_tensor *t = NULL;
    if (st_safetensors_get(sf, name, &t) != ST_OK)
        fail_msg("%s", st_last_error());
    assert_string_equal(t->name, name);
    assert_int_equal(t->dtype, ST_SF_F32);
    assert_int_equal(t->n_dims, n_dims);
    assert_int_equal(t->shape[0], d0);
    if (n_dims > 1)
        assert_int_equal(t->shape[1], d1);
    assert_int_equal(t->n_elem, d0 * (n_dims > 1 ? d1 : 1));
    assert_int_equal(t->size, (size_t)t->n_elem * 4);
    st_dtype dt = ST_DTYPE_Q8_0;
    assert_int_equal(st_sf_tensor_dtype(t, &dt), ST_OK);
    assert_int_equal(dt, ST_DTYPE_F32);
}

static void test_tinystories(void **state) {
    (void)state;
    st_hf_config *c = NULL;
    assert_int_equal(st_hf_config_open(tiny_dir(), &c), ST_OK);
    int64_t H = cfg_int(c, "hidden_size"), I = cfg_int(c, "intermediate_size");
    int64_t L = cfg_int(c, "num_hidden_layers"), NH = cfg_int(c, "num_attention_heads");
    int64_t NKV = cfg_int(c, "num_key_value_heads"), V = cfg_int(c, "vocab_size");
    int64_t hd = H / NH;
    bool tied = false;
    assert_int_equal(st_hf_config_get_bool(c, "tie_word_embeddings", &tied), ST_OK);
    st_hf_config_free(c);

    st_safetensors *sf = NULL;
    if (st_safetensors_open(tiny_dir(), &sf) != ST_OK)
        fail_msg("%s", st_last_error());
    assert_string_equal(st_safetensors_path(sf), tiny_dir());
    /* 9 tensors per layer, the final norm, and one output matrix (the embedding is tied and
     * transformers stored it once, as lm_head.weight). */
    assert_true(tied);
    assert_int_equal(st_safetensors_n_tensors(sf), 9 * L + 2);
    assert_shape(sf, "lm_head.weight", 2, V, H);
    assert_shape(sf, "model.norm.weight", 1, H, 0);
    char name[128];
    for (int64_t l = 0; l < L; l++) {
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", (int)l);
        assert_shape(sf, name, 2, NH * hd, H);
        snprintf(name, sizeof name, "model.layers.%d.self_attn.k_proj.weight", (int)l);
        assert_shape(sf, name, 2, NKV * hd, H);
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", (int)l);
        assert_shape(sf, name, 2, H, I);
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", (int)l);
        assert_shape(sf, name, 1, H, 0);
    }
    assert_string_equal(st_safetensors_metadata(sf, "format"), "pt");
    assert_null(st_safetensors_metadata(sf, "nope"));

    /* Enumeration is sorted, complete and agrees with lookup; data is the file's bytes. */
    size_t fsize = 0;
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", tiny_dir());
    uint8_t *file = (uint8_t *)tu_read_file(path, &fsize);
    assert_non_null(file);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--)
        hn = hn << 8 | file[i];
    size_t total = 0;
    const uint8_t *lm = NULL;
    for (int64_t i = 0; i < st_safetensors_n_tensors(sf); i++) {
        const st_sf_tensor *t = st_safetensors_tensor_at(sf, i);
        assert_ptr_equal(st_safetensors_find(sf, t->name), t);
        if (i > 0)
            assert_true(strcmp(st_safetensors_tensor_at(sf, i - 1)->name, t->name) < 0);
        assert_string_equal(t->file, path);
        total += t->size;
        if (!strcmp(t->name, "lm_head.weight"))
            lm = t->data;
    }
    assert_null(st_safetensors_tensor_at(sf, -1));
    assert_null(st_safetensors_tensor_at(sf, st_safetensors_n_tensors(sf)));
    assert_int_equal(8 + hn + total, fsize); /* the tensors tile the data section */
    /* lm_head.weight is stored first (data_offsets [0, ...]). */
    assert_non_null(lm);
    assert_memory_equal(lm, file + 8 + hn, (size_t)(V * H * 4));
    const st_sf_tensor *norm = st_safetensors_find(sf, "model.norm.weight");
    assert_memory_equal(norm->data, file + fsize - norm->size, norm->size); /* stored last */
    free(file);

    assert_null(st_safetensors_find(sf, "model.embed_tokens.weight"));
    const st_sf_tensor *t = (const st_sf_tensor *)1;
    assert_int_equal(st_safetensors_get(sf, "model.embed_tokens.weight", &t), ST_ERR_FORMAT);
    assert_null(t);
    assert_contains(st_last_error(), tiny_dir());
    assert_contains(st_last_error(), "model.embed_tokens.weight");
    st_safetensors_free(sf);

    /* The file itself opens the same way. */
    assert_int_equal(st_safetensors_open(path, &sf), ST_OK);
    assert_int_equal(st_safetensors_n_tensors(sf), 9 * L + 2);
    st_safetensors_free(sf);
    st_safetensors_free(NULL);
}

/* Every prefix of the real file is rejected with an error naming it, never a crash. */
static void test_truncated(void **state) {
    (void)state;
    char src[512];
    snprintf(src, sizeof src, "%s/model.safetensors", tiny_dir());
    size_t n = 0;
    uint8_t *file = (uint8_t *)tu_read_file(src, &n);
    assert_non_null(file);
    const char *path = tmp_path("trunc.safetensors");
    const size_t cuts[] = {1, 4, 7, 8, 9, 100, 2000, 2167, 2168, 2169, 1048576, n / 2, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_bytes(path, file, cuts[i]);
        expect_fail(path, ST_ERR_FORMAT, "truncated", NULL);
    }
    write_bytes(path, file, n);
    st_safetensors *sf = NULL;
    assert_int_equal(st_safetensors_open(path, &sf), ST_OK);
    st_safetensors_free(sf);
    /* Memory: every length, without touching bytes past it (run under ASan). */
    for (size_t len = 0; len < 2300; len++) {
        uint8_t *copy = malloc(len + 1);
        memcpy(copy, file, len);
        st_status s = st_safetensors_open_memory(copy, len, "mem.safetensors", &sf);
        assert_int_equal(s, ST_ERR_FORMAT);
        assert_contains(st_last_error(), "mem.safetensors");
        free(copy);
    }
    free(file);
    write_bytes(path, "", 0);
    expect_fail(path, ST_ERR_FORMAT, "empty", NULL);
}

/* Random byte flips in the header of the real file: each open succeeds or fails cleanly. */
static void test_mutations(void **state) {
    (void)state;
    char src[512];
    snprintf(src, sizeof src, "%s/model.safetensors", tiny_dir());
    size_t n = 0;
    uint8_t *file = (uint8_t *)tu_read_file(src, &n);
    assert_non_null(file);
    uint8_t *copy = malloc(n);
    uint64_t rng = 12345;
    int n_ok = 0, n_fail = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(copy, file, n);
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t at = (size_t)(rng >> 33) % 2168;
            copy[at] = (uint8_t)(rng >> 13);
        }
        st_safetensors *sf = NULL;
        st_status s = st_safetensors_open_memory(copy, n, "mut.safetensors", &sf);
        if (s == ST_OK) {
            n_ok++;
            for (int64_t i = 0; i < st_safetensors_n_tensors(sf); i++) {
                const st_sf_tensor *t = st_safetensors_tensor_at(sf, i);
                assert_true((const uint8_t *)t->data + t->size <= copy + n);
                assert_true((const uint8_t *)t->data >= copy + 8);
            }
            st_safetensors_free(sf);
        } else {
            n_fail++;
            assert_true(s < 0);
            assert_contains(st_last_error(), "mut.safetensors");
        }
    }
    assert_true(n_fail > 0);
    free(copy);
    free(file);
}

/* ------------------------------------------------------------------------------------------ */
/* Writer and sharded checkpoints                                                             */

static const int64_t shape_23[] = {2, 3}, shape_4[] = {4}, shape_0[] = {0};

static void test_write_roundtrip(void **state) {
    (void)state;
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[4] = {0x3c00, 0x4000, 0xbc00, 0};
    int64_t c = 7;
    uint8_t d[3] = {1, 0, 1};
    const int64_t shape_3[] = {3};
    st_sf_tensor in[] = {
        {.name = "w.a", .dtype = ST_SF_F32, .n_dims = 2, .shape = shape_23, .data = a, .size = 24},
        {.name = "b\"quoted\"",
         .dtype = ST_SF_BF16,
         .n_dims = 1,
         .shape = shape_4,
         .data = b,
         .size = 8},
        {.name = "scalar", .dtype = ST_SF_I64, .n_dims = 0, .data = &c, .size = 8},
        {.name = "empty", .dtype = ST_SF_F16, .n_dims = 1, .shape = shape_0, .size = 0},
        {.name = "mask", .dtype = ST_SF_BOOL, .n_dims = 1, .shape = shape_3, .data = d, .size = 3},
    };
    const char *path = tmp_path("rt.safetensors");
    assert_int_equal(st_safetensors_write(path, in, 5), ST_OK);
    st_safetensors *sf = NULL;
    if (st_safetensors_open(path, &sf) != ST_OK)
        fail_msg("%s", st_last_error());
    assert_int_equal(st_safetensors_n_tensors(sf), 5);
    assert_string_equal(st_safetensors_metadata(sf, "format"), "pt");
    for (int i = 0; i < 5; i++) {
        const st_sf_tensor *t = st_safetensors_find(sf, in[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, in[i].dtype);
        assert_int_equal(t->n_dims, in[i].n_dims);
        for (int j = 0; j < t->n_dims; j++)
            assert_int_equal(t->shape[j], in[i].shape[j]);
        assert_int_equal(t->size, in[i].size);
        if (t->size)
            assert_memory_equal(t->data, in[i].data, t->size);
    }
    const st_sf_tensor *t = st_safetensors_find(sf, "scalar");
    assert_int_equal(t->n_elem, 1);
    assert_int_equal(st_safetensors_find(sf, "empty")->n_elem, 0);
    st_dtype dt;
    assert_int_equal(st_sf_tensor_dtype(st_safetensors_find(sf, "b\"quoted\""), &dt), ST_OK);
    assert_int_equal(dt, ST_DTYPE_BF16);
    assert_int_equal(st_sf_tensor_dtype(st_safetensors_find(sf, "empty"), &dt), ST_OK);
    assert_int_equal(dt, ST_DTYPE_F16);
    /* Other dtypes are recognized and reported by name. */
    assert_int_equal(st_sf_tensor_dtype(t, &dt), ST_ERR_UNSUPPORTED);
    assert_contains(st_last_error(), path);
    assert_contains(st_last_error(), "'scalar'");
    assert_contains(st_last_error(), "I64");
    assert_int_equal(st_safetensors_find(sf, "mask")->dtype, ST_SF_BOOL);
    st_safetensors_free(sf);

    /* Data starts 8-byte aligned in the file. */
    size_t n = 0;
    uint8_t *raw = (uint8_t *)tu_read_file(path, &n);
    assert_non_null(raw);
    assert_int_equal((8 + raw[0] + 256 * raw[1]) % 8, 0);
    free(raw);

    /* The writer refuses a repeated name and a size that disagrees with the shape. */
    st_sf_tensor dup[] = {in[0], in[0]};
    assert_int_equal(st_safetensors_write(path, dup, 2), ST_ERR_INVALID);
    st_sf_tensor bad = in[0];
    bad.size = 20;
    assert_int_equal(st_safetensors_write(path, &bad, 1), ST_ERR_INVALID);
    assert_contains(st_last_error(), "w.a");
}

static void test_dtype_names(void **state) {
    (void)state;
    assert_string_equal(st_sf_dtype_name(ST_SF_BF16), "BF16");
    assert_string_equal(st_sf_dtype_name(ST_SF_F8_E4M3), "F8_E4M3");
    assert_string_equal(st_sf_dtype_name(ST_SF_N_DTYPES), "?");
    assert_int_equal(st_sf_dtype_bits(ST_SF_BOOL), 8);
    assert_int_equal(st_sf_dtype_bits(ST_SF_C64), 64);
    assert_int_equal(st_sf_dtype_bits(ST_SF_F4), 4);
    /* Every dtype name is read back (a one-element tensor of each, sized by its bits). */
    for (int d = 0; d < ST_SF_N_DTYPES; d++) {
        char header[256];
        int64_t bits = st_sf_dtype_bits((st_sf_dtype)d);
        int64_t n = bits % 8 ? 8 : 1; /* sub-byte types: 8 elements */
        snprintf(header, sizeof header,
                 "{\"t\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":[0,%d]}}",
                 st_sf_dtype_name((st_sf_dtype)d), (int)n, (int)(n * bits / 8));
        const char *path = tmp_path("dt.safetensors");
        write_raw(path, header, (size_t)(n * bits / 8));
        st_safetensors *sf = NULL;
        if (st_safetensors_open(path, &sf) != ST_OK)
            fail_msg("%s: %s", st_sf_dtype_name((st_sf_dtype)d), st_last_error());
        assert_int_equal(st_safetensors_find(sf, "t")->dtype, d);
        st_safetensors_free(sf);
    }
}

/* Shard files in a fresh sub-directory: two shards and an index naming them. */
static const char *make_sharded(const char *sub, const char *index_json) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmp_dir, sub);
    assert_int_equal(mkdir(dir, 0755), 0);
    static float w0[6] = {1, 2, 3, 4, 5, 6}, w1[4] = {7, 8, 9, 10}, w2[4] = {11, 12, 13, 14};
    static uint16_t h[4] = {1, 2, 3, 4};
    st_sf_tensor s1[] = {
        {.name = "a.weight",
         .dtype = ST_SF_F32,
         .n_dims = 2,
         .shape = shape_23,
         .data = w0,
         .size = 24},
        {.name = "b.weight",
         .dtype = ST_SF_F16,
         .n_dims = 1,
         .shape = shape_4,
         .data = h,
         .size = 8},
    };
    st_sf_tensor s2[] = {
        {.name = "c.weight",
         .dtype = ST_SF_F32,
         .n_dims = 1,
         .shape = shape_4,
         .data = w1,
         .size = 16},
        {.name = "d.weight",
         .dtype = ST_SF_F32,
         .n_dims = 1,
         .shape = shape_4,
         .data = w2,
         .size = 16},
    };
    char path[600];
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    assert_int_equal(st_safetensors_write(path, s1, 2), ST_OK);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(st_safetensors_write(path, s2, 2), ST_OK);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_bytes(path, index_json, strlen(index_json));
    return dir;
}

#define SHARD1 "\"model-00001-of-00002.safetensors\""
#define SHARD2 "\"model-00002-of-00002.safetensors\""

static void test_sharded(void **state) {
    (void)state;
    const char *dir = make_sharded("ok", "{\"metadata\": {\"total_size\": 64}, \"weight_map\": {"
                                         "\"d.weight\": " SHARD2 ", \"a.weight\": " SHARD1 ","
                                         "\"c.weight\": " SHARD2 ", \"b.weight\": " SHARD1 "}}");
    st_safetensors *sf = NULL;
    if (st_safetensors_open(dir, &sf) != ST_OK)
        fail_msg("%s", st_last_error());
    assert_int_equal(st_safetensors_n_tensors(sf), 4);
    const char *names[] = {"a.weight", "b.weight", "c.weight", "d.weight"};
    const char *files[] = {"model-00001", "model-00001", "model-00002", "model-00002"};
    const float first[] = {1, 0, 7, 11};
    for (int i = 0; i < 4; i++) {
        const st_sf_tensor *t = st_safetensors_tensor_at(sf, i);
        assert_string_equal(t->name, names[i]);
        assert_ptr_equal(st_safetensors_find(sf, names[i]), t);
        assert_contains(t->file, dir);
        assert_contains(t->file, files[i]);
        if (t->dtype == ST_SF_F32) {
            float v;
            memcpy(&v, t->data, 4);
            assert_true(v == first[i]);
        }
    }
    assert_int_equal(st_safetensors_find(sf, "b.weight")->dtype, ST_SF_F16);
    assert_null(st_safetensors_find(sf, "e.weight"));
    st_safetensors_free(sf);
}

static void test_sharded_missing_shard(void **state) {
    (void)state;
    const char *dir = make_sharded("noshard", "{\"weight_map\": {\"a.weight\": " SHARD1 ","
                                              "\"b.weight\": " SHARD1 ","
                                              "\"c.weight\": \"model-00003-of-00002.safetensors\","
                                              "\"d.weight\": " SHARD2 "}}");
    expect_fail(dir, ST_ERR_IO, "model.safetensors.index.json", "model-00003-of-00002", "c.weight",
                "missing", NULL);
}

static void test_sharded_tensor_absent(void **state) {
    (void)state;
    const char *dir =
        make_sharded("absent", "{\"weight_map\": {\"a.weight\": " SHARD1 ","
                               "\"b.weight\": " SHARD1 ", \"c.weight\": " SHARD2 ","
                               "\"d.weight\": " SHARD2 ", \"e.weight\": " SHARD2 "}}");
    expect_fail(dir, ST_ERR_FORMAT, "model.safetensors.index.json", "'e.weight'",
                "model-00002-of-00002.safetensors", NULL);
    /* Mapped to the wrong shard: the one named lacks it. */
    dir = make_sharded("wrong", "{\"weight_map\": {\"a.weight\": " SHARD2 ","
                                "\"b.weight\": " SHARD1 ", \"c.weight\": " SHARD2 ","
                                "\"d.weight\": " SHARD2 "}}");
    expect_fail(dir, ST_ERR_FORMAT, "'a.weight'", "lacks it", NULL);
}

static void test_sharded_unlisted(void **state) {
    (void)state;
    const char *dir =
        make_sharded("unlisted", "{\"weight_map\": {\"a.weight\": " SHARD1 ","
                                 "\"c.weight\": " SHARD2 ", \"d.weight\": " SHARD2 "}}");
    expect_fail(dir, ST_ERR_FORMAT, "'b.weight'", "not in weight_map", NULL);
}

static void test_sharded_duplicate(void **state) {
    (void)state;
    const char *dir = make_sharded("dup", "{\"weight_map\": {\"a.weight\": " SHARD1 ","
                                          "\"b.weight\": " SHARD1 ", \"c.weight\": " SHARD2 ","
                                          "\"d.weight\": " SHARD2 "}}");
    /* A third shard that holds z and also a.weight. */
    float w[6] = {0};
    st_sf_tensor t[] = {
        {.name = "a.weight",
         .dtype = ST_SF_F32,
         .n_dims = 2,
         .shape = shape_23,
         .data = w,
         .size = 24},
        {.name = "z", .dtype = ST_SF_F32, .n_dims = 1, .shape = shape_4, .data = w, .size = 16}};
    char path[600];
    snprintf(path, sizeof path, "%s/extra.safetensors", dir);
    assert_int_equal(st_safetensors_write(path, t, 2), ST_OK);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    const char *index =
        "{\"weight_map\": {\"a.weight\": " SHARD1 ", \"b.weight\": " SHARD1
        ", \"c.weight\": " SHARD2 ", \"d.weight\": " SHARD2 ", \"z\": \"extra.safetensors\"}}";
    write_bytes(path, index, strlen(index));
    expect_fail(dir, ST_ERR_FORMAT, "'a.weight'", "stored in both", "extra.safetensors", NULL);
    /* A duplicated key in the index itself. */
    index = "{\"weight_map\": {\"a.weight\": " SHARD1 ", \"a.weight\": " SHARD1 "}}";
    write_bytes(path, index, strlen(index));
    expect_fail(dir, ST_ERR_FORMAT, "duplicate", "a.weight", NULL);
}

static void test_sharded_bad_index(void **state) {
    (void)state;
    const char *dir = make_sharded("badidx", "{\"weight_map\": [1, 2]}");
    expect_fail(dir, ST_ERR_FORMAT, "model.safetensors.index.json", "weight_map", NULL);
    dir = make_sharded("noidx", "{\"metadata\": {}}");
    expect_fail(dir, ST_ERR_FORMAT, "missing \"weight_map\"", NULL);
    dir = make_sharded("badjson", "{\"weight_map\": {");
    expect_fail(dir, ST_ERR_FORMAT, "not valid JSON", NULL);
    dir = make_sharded("escape", "{\"weight_map\": {\"a.weight\": \"../x.safetensors\"}}");
    expect_fail(dir, ST_ERR_FORMAT, "'a.weight'", "not a file name", NULL);
    dir = make_sharded("notstr", "{\"weight_map\": {\"a.weight\": 3}}");
    expect_fail(dir, ST_ERR_FORMAT, "'a.weight'", NULL);
}

static void test_open_errors(void **state) {
    (void)state;
    expect_fail(tmp_path("does-not-exist"), ST_ERR_IO, "cannot open", NULL);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/emptydir", tmp_dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    expect_fail(dir, ST_ERR_IO, "no model.safetensors", NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* Malformed single files                                                                     */

#define F32_2 "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

static void test_bad_header_length(void **state) {
    (void)state;
    const char *path = tmp_path("len.safetensors");
    write_raw_len(path, 1000, "{}", 0);
    expect_fail(path, ST_ERR_FORMAT, "header length 1000", "past the end", NULL);
    write_raw_len(path, (uint64_t)1 << 40, "{}", 0);
    expect_fail(path, ST_ERR_FORMAT, "100 MB", NULL);
    write_raw_len(path, UINT64_MAX, "{}", 0);
    expect_fail(path, ST_ERR_FORMAT, "100 MB", NULL);
    write_raw_len(path, 0, "", 0);
    expect_fail(path, ST_ERR_FORMAT, "'{'", NULL);
}

static void test_bad_json(void **state) {
    (void)state;
    bad_header("{\"a\": ", 0, "not valid JSON", NULL);
    bad_header("{\"a\": 1} x", 0, "not valid JSON", NULL);
    bad_header("[1, 2]", 0, "not a JSON object", NULL);
    bad_header(" {}", 0, "not a JSON object", NULL);
}

static void test_entry_fields(void **state) {
    (void)state;
    bad_header("{\"w\": 5}", 0, "'w'", "not a JSON object", NULL);
    bad_header("{\"w\": {\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "'w'", "missing \"dtype\"",
               NULL);
    bad_header("{\"w\": {\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "'w'", "missing \"shape\"",
               NULL);
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[2]}}", 8, "'w'", "missing \"data_offsets\"",
               NULL);
    bad_header("{\"w\": {\"dtype\":32,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "'w'",
               "\"dtype\" is not a string", NULL);
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "'w'",
               "\"shape\" is not an array", NULL);
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "'w'",
               "\"shape\"[0] is not an integer", NULL);
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "'w'",
               "\"shape\"[0] is not an integer", NULL);
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,16]}}", 8, "'w'",
               "\"data_offsets\" is not an array of two", NULL);
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":{}}}", 8, "'w'",
               "\"data_offsets\" is not an array of two", NULL);
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,\"8\"]}}", 8, "'w'",
               "\"data_offsets\"[1] is not an integer", NULL);
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, "'w'",
               "\"data_offsets\"[0] is negative", NULL);
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "'w'",
               "end before begin", NULL);
}

static void test_unknown_dtype(void **state) {
    (void)state;
    bad_header("{\"w\": {\"dtype\":\"Q4_0\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "'w'",
               "unknown dtype 'Q4_0'", NULL);
    bad_header("{\"w\": {\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "'w'",
               "unknown dtype 'f32'", NULL);
}

static void test_bad_shape(void **state) {
    (void)state;
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[-1,2],\"data_offsets\":[0,8]}}", 8, "'w'",
               "\"shape\"[0] is negative", NULL);
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]"
               "}}",
               8, "'w'", "overflows", NULL);
    /* Count fits int64 but bytes do not. */
    bad_header(
        "{\"w\": {\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}", 8,
        "'w'", "overflows", NULL);
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]"
               "}}",
               8, "not valid JSON", "too big integer", NULL);
    bad_header("{\"w\": {\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", 1, "'w'",
               "not whole bytes", NULL);
}

static void test_offsets_mismatch(void **state) {
    (void)state;
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "'w'",
               "[0, 4] hold 4 bytes", "2 elements of F32 need 8", NULL);
    bad_header("{\"w\": {\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24, "'w'",
               "need 12", NULL);
}

static void test_offsets_past_end(void **state) {
    (void)state;
    bad_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "'w'",
               "end 16 is past the end of the data section (8 bytes", NULL);
    bad_header("{\"a\":" F32_2 ",\"w\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
               12, "'w'", "past the end", NULL);
}

static void test_overlap(void **state) {
    (void)state;
    bad_header("{\"a\":" F32_2 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, "'a' [0, 8)", "'b' [4, 12)", "overlap", NULL);
    /* The same range twice. */
    bad_header("{\"b\":" F32_2 ",\"a\":" F32_2 "}", 8, "'a'", "'b'", "overlap", NULL);
}

static void test_holes(void **state) {
    (void)state;
    bad_header("{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]},\"a\":" F32_2 "}",
               20, "[8, 12)", "'a' and 'b'", "belong to no tensor", NULL);
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "[0, 4)",
               "before tensor 'a'", NULL);
    bad_header("{\"a\":" F32_2 "}", 12, "4 data bytes after the last tensor 'a'", NULL);
    bad_header("{}", 3, "3 data bytes but no tensors", NULL);
}

static void test_duplicate_names(void **state) {
    (void)state;
    bad_header("{\"a\":" F32_2 ",\"b\":" F32_2 ",\"a\":" F32_2 "}", 8, "duplicate", "\"a\"", NULL);
    /* Inside an entry too: two dtypes are ambiguous. */
    bad_header("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,8]}}",
               8, "duplicate", "dtype", NULL);
}

static void test_bad_metadata(void **state) {
    (void)state;
    bad_header("{\"__metadata__\":{\"format\":1},\"a\":" F32_2 "}", 8, "__metadata__", "'format'",
               "not a string", NULL);
    bad_header("{\"__metadata__\":[],\"a\":" F32_2 "}", 8, "__metadata__", "not a JSON object",
               NULL);
}

/* A control character in a name is not copied into the (one-line) message. */
static void test_error_one_line(void **state) {
    (void)state;
    bad_header("{\"a\\nb\":{\"dtype\":\"X\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "'a?b'",
               "unknown dtype", NULL);
}

/* Many tensors: the checks are n log n, and lookups find each one. */
static void test_many_tensors(void **state) {
    (void)state;
    enum { N = 20000 };
    static float one = 1;
    static char names[N][16];
    st_sf_tensor *t = calloc(N, sizeof *t);
    const int64_t shape_1[] = {1};
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "t%d", (i * 7919) % N);
        t[i] = (st_sf_tensor){.name = names[i],
                              .dtype = ST_SF_F32,
                              .n_dims = 1,
                              .shape = shape_1,
                              .data = &one,
                              .size = 4};
    }
    const char *path = tmp_path("many.safetensors");
    assert_int_equal(st_safetensors_write(path, t, N), ST_OK);
    st_safetensors *sf = NULL;
    assert_int_equal(st_safetensors_open(path, &sf), ST_OK);
    assert_int_equal(st_safetensors_n_tensors(sf), N);
    for (int i = 0; i < N; i++)
        assert_non_null(st_safetensors_find(sf, names[i]));
    st_safetensors_free(sf);
    free(t);
}

/* ------------------------------------------------------------------------------------------ */
/* config.json                                                                                */

static void test_config_tinystories(void **state) {
    (void)state;
    st_hf_config *c = NULL;
    assert_int_equal(st_hf_config_open(tiny_dir(), &c), ST_OK);
    int64_t v = 0;
    assert_int_equal(st_hf_config_get_int(c, "hidden_size", &v), ST_OK);
    assert_int_equal(v, 128);
    double d = 0;
    assert_int_equal(st_hf_config_get_float(c, "rms_norm_eps", &d), ST_OK);
    assert_true(d == 1e-6);
    assert_int_equal(st_hf_config_get_float(c, "rope_theta", &d), ST_OK);
    assert_true(d == 10000.0);
    assert_int_equal(st_hf_config_get_float(c, "vocab_size", &d), ST_OK); /* int as float */
    assert_true(d == 2048.0);
    const char *s = NULL;
    assert_int_equal(st_hf_config_get_str(c, "model_type", &s), ST_OK);
    assert_string_equal(s, "llama");
    int64_t ids[4];
    int64_t n = 0;
    assert_int_equal(st_hf_config_get_ints(c, "eos_token_id", ids, 4, &n), ST_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 2);
    assert_false(st_hf_config_has(c, "rope_scaling")); /* null */
    assert_true(st_hf_config_has(c, "rope_theta"));
    assert_int_equal(st_hf_config_get_float(c, "rope_scaling.factor", &d), ST_ERR_FORMAT);
    assert_contains(st_last_error(), "config.json");
    assert_contains(st_last_error(), "missing field \"rope_scaling.factor\"");
    assert_int_equal(st_hf_config_get_int(c, "rope_theta", &v), ST_ERR_FORMAT);
    assert_contains(st_last_error(), "\"rope_theta\" is a real number, expected an integer");
    assert_int_equal(st_hf_config_get_str(c, "architectures", &s), ST_ERR_FORMAT);
    assert_contains(st_last_error(), "\"architectures\" is an array, expected a string");
    st_hf_config_free(c);
    st_hf_config_free(NULL);
}

static void test_config_fields(void **state) {
    (void)state;
    const char *json = "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
                       " \"original_max_position_embeddings\": 8192},"
                       " \"eos_token_id\": [128001, 128008, 128009], \"bad\": [1, \"x\"],"
                       " \"flag\": true, \"n\": null, \"i\": 3}";
    st_hf_config *c = NULL;
    assert_int_equal(st_hf_config_open_memory(json, strlen(json), "cfg.json", &c), ST_OK);
    double d = 0;
    assert_int_equal(st_hf_config_get_float(c, "rope_scaling.factor", &d), ST_OK);
    assert_true(d == 8.0);
    int64_t v = 0;
    assert_int_equal(st_hf_config_get_int(c, "rope_scaling.original_max_position_embeddings", &v),
                     ST_OK);
    assert_int_equal(v, 8192);
    const char *s = NULL;
    assert_int_equal(st_hf_config_get_str(c, "rope_scaling.rope_type", &s), ST_OK);
    assert_string_equal(s, "llama3");
    int64_t ids[2] = {0, 0}, n = 0;
    assert_int_equal(st_hf_config_get_ints(c, "eos_token_id", ids, 2, &n), ST_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 128001);
    assert_int_equal(ids[1], 128008);
    assert_int_equal(st_hf_config_get_ints(c, "bad", ids, 2, &n), ST_ERR_FORMAT);
    assert_contains(st_last_error(), "cfg.json: field \"bad\"[1] is a string, expected an integer");
    assert_int_equal(st_hf_config_get_ints(c, "flag", ids, 2, &n), ST_ERR_FORMAT);
    assert_contains(st_last_error(), "\"flag\" is a boolean");
    bool b = false;
    assert_int_equal(st_hf_config_get_bool(c, "flag", &b), ST_OK);
    assert_true(b);
    assert_int_equal(st_hf_config_get_bool(c, "i", &b), ST_ERR_FORMAT);
    assert_contains(st_last_error(), "\"i\" is an integer, expected true or false");
    assert_int_equal(st_hf_config_get_int(c, "n", &v), ST_ERR_FORMAT);
    assert_contains(st_last_error(), "cfg.json: missing field \"n\"");
    assert_int_equal(st_hf_config_get_float(c, "rope_scaling", &d), ST_ERR_FORMAT);
    assert_contains(st_last_error(), "\"rope_scaling\" is an object, expected a number");
    assert_int_equal(st_hf_config_get_int(c, "i.x", &v), ST_ERR_FORMAT);
    assert_contains(st_last_error(), "missing field \"i.x\"");
    assert_false(st_hf_config_has(c, "n"));
    assert_false(st_hf_config_has(c, "zzz"));
    st_hf_config_free(c);

    const char *bad[] = {"[1]", "{\"a\": 1, \"a\": 2}", "{", ""};
    const char *want[] = {"not a JSON object", "duplicate", "not valid JSON", "not valid JSON"};
    for (int i = 0; i < 4; i++) {
        c = (st_hf_config *)1;
        assert_int_equal(st_hf_config_open_memory(bad[i], strlen(bad[i]), "cfg.json", &c),
                         ST_ERR_FORMAT);
        assert_null(c);
        assert_contains(st_last_error(), "cfg.json");
        assert_contains(st_last_error(), want[i]);
    }
    assert_int_equal(st_hf_config_open(tmp_path("nope.json"), &c), ST_ERR_IO);
    assert_contains(st_last_error(), "nope.json");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tinystories),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_write_roundtrip),
        cmocka_unit_test(test_dtype_names),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_sharded_missing_shard),
        cmocka_unit_test(test_sharded_tensor_absent),
        cmocka_unit_test(test_sharded_unlisted),
        cmocka_unit_test(test_sharded_duplicate),
        cmocka_unit_test(test_sharded_bad_index),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_bad_header_length),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_entry_fields),
        cmocka_unit_test(test_unknown_dtype),
        cmocka_unit_test(test_bad_shape),
        cmocka_unit_test(test_offsets_mismatch),
        cmocka_unit_test(test_offsets_past_end),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_holes),
        cmocka_unit_test(test_duplicate_names),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_error_one_line),
        cmocka_unit_test(test_many_tensors),
        cmocka_unit_test(test_config_tinystories),
        cmocka_unit_test(test_config_fields),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}
