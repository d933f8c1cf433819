/*
 * test_gguf_hostile.c: GGUF headers built to be expensive or misleading.
 * - SipHash matches the paper's test vectors; the name index finds every name and reports
 *   duplicates.
 * - 200,000 metadata keys or tensor names open (every one found again), and the same with one
 *   duplicate at the very end is refused naming it. With a pairwise duplicate check this takes
 *   minutes; with the hash index, a fraction of a second.
 * - A header cut short says "truncated", not that a count is invalid.
 * - A FIFO or directory given as a file is refused at once instead of blocking on open.
 * - A weight of the wrong rank or shape is refused with its real shape, all dimensions.
 * - Tensors whose data overlap are refused naming both.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/core.h"
#include "io/gguf_internal.h"
#include "io/gguf_write.h"
#include "spectree.h"
#include "testutil.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { N_HOSTILE = 200000 };

/* A growing byte buffer for hand-built files. */
typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void header(buf *b, int64_t n_tensors, int64_t n_kv) {
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, (uint64_t)n_tensors);
    put_u64(b, (uint64_t)n_kv);
}

/* n distinct u8 keys, then the first key again when dup. */
static buf many_keys(int64_t n, int dup) {
    buf b = {0};
    header(&b, 0, n + dup);
    char key[64];
    for (int64_t i = 0; i < n + dup; i++) {
        snprintf(key, sizeof key, "hostile.key.%" PRId64, i < n ? i : 0);
        put_str(&b, key);
        put_u32(&b, ST_GGUF_UINT8);
        uint8_t v = (uint8_t)i;
        put(&b, &v, 1);
    }
    return b;
}

/* n distinct empty f32 tensors (ne = [0], all at offset 0), then the first name again when dup. */
static buf many_tensors(int64_t n, int dup) {
    buf b = {0};
    header(&b, n + dup, 0);
    char name[64];
    for (int64_t i = 0; i < n + dup; i++) {
        snprintf(name, sizeof name, "blk.%" PRId64 ".w", i < n ? i : 0);
        put_str(&b, name);
        put_u32(&b, 1);
        put_u64(&b, 0);
        put_u32(&b, ST_DTYPE_F32);
        put_u64(&b, 0);
    }
    uint8_t zero[32] = {0};
    put(&b, zero, (32 - b.n % 32) % 32);
    return b;
}

static void test_siphash_vectors(void **state) {
    (void)state;
    /* The SipHash paper (appendix A) and its reference vectors: key 00..0f, message 00..(n-1). */
    uint8_t msg[64];
    for (int i = 0; i < 64; i++)
        msg[i] = (uint8_t)i;
    const uint64_t k0 = 0x0706050403020100ULL, k1 = 0x0f0e0d0c0b0a0908ULL;
    assert_true(st_siphash(k0, k1, msg, 0, 2, 4) == 0x726fdb47dd0e0e31ULL);
    assert_true(st_siphash(k0, k1, msg, 15, 2, 4) == 0xa129ca6149be45e5ULL);
    /* Different keys give different hashes (the point of keying). */
    assert_true(st_siphash(1, 2, "abc", 3, 1, 3) != st_siphash(3, 4, "abc", 3, 1, 3));
}

static const char *name_at(const void *names, int64_t i) { return ((const char(*)[24])names)[i]; }

static void test_name_index(void **state) {
    (void)state;
    enum { N = 50000 };
    char(*names)[24] = malloc(sizeof(*names) * N);
    assert_non_null(names);
    for (int i = 0; i < N; i++)
        snprintf(names[i], sizeof names[i], "n%d", i * 7919);
    st_name_index t;
    int64_t dup = 0;
    assert_int_equal(st_name_index_build(&t, N, name_at, names, &dup), ST_OK);
    assert_int_equal(dup, -1);
    for (int i = 0; i < N; i++)
        assert_int_equal(st_name_index_find(&t, names[i]), i);
    assert_int_equal(st_name_index_find(&t, "n1"), -1);
    assert_int_equal(st_name_index_find(&t, ""), -1);
    st_name_index_free(&t);
    st_name_index_free(&t); /* freeing twice (a zeroed table) is harmless */
    assert_int_equal(st_name_index_find(&t, "n0"), -1);
    /* The first repeat is reported, wherever it is (the prefetch window is 16 names). */
    const int at[] = {1, 15, 16, 17, 40000, N - 1};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        snprintf(names[at[k]], sizeof names[at[k]], "n%d", 0);
        if (at[k] + 1 < N)
            snprintf(names[N - 1], sizeof names[N - 1], "n%d", 7919);
        assert_int_equal(st_name_index_build(&t, N, name_at, names, &dup), ST_OK);
        assert_int_equal(dup, at[k]);
        st_name_index_free(&t);
        snprintf(names[at[k]], sizeof names[at[k]], "n%d", at[k] * 7919);
        snprintf(names[N - 1], sizeof names[N - 1], "n%d", (N - 1) * 7919);
    }
    assert_int_equal(st_name_index_build(&t, 0, name_at, names, &dup), ST_OK);
    assert_int_equal(dup, -1);
    assert_int_equal(st_name_index_find(&t, "n0"), -1);
    st_name_index_free(&t);
    free(names);
}

static void test_many_keys(void **state) {
    (void)state;
    buf b = many_keys(N_HOSTILE, 0);
    st_gguf *g = NULL;
    assert_int_equal(st_gguf_open_memory(b.p, b.n, "keys.gguf", &g), ST_OK);
    assert_int_equal(st_gguf_n_kv(g), N_HOSTILE);
    char key[64];
    for (int64_t i = 0; i < N_HOSTILE; i += 997) {
        snprintf(key, sizeof key, "hostile.key.%" PRId64, i);
        assert_int_equal(st_gguf_find(g, key), i);
        assert_string_equal(st_gguf_key(g, i), key);
    }
    assert_int_equal(st_gguf_find(g, "hostile.key.-1"), -1);
    st_gguf_free(g);
    free(b.p);

    b = many_keys(N_HOSTILE, 1);
    g = (st_gguf *)1;
    assert_int_equal(st_gguf_open_memory(b.p, b.n, "dup-keys.gguf", &g), ST_ERR_FORMAT);
    assert_null(g);
    assert_non_null(strstr(st_last_error(), "dup-keys.gguf"));
    assert_non_null(strstr(st_last_error(), "duplicate metadata key 'hostile.key.0'"));
    free(b.p);
}

static void test_many_tensors(void **state) {
    (void)state;
    buf b = many_tensors(N_HOSTILE, 0);
    st_gguf *g = NULL;
    assert_int_equal(st_gguf_open_memory(b.p, b.n, "tensors.gguf", &g), ST_OK);
    assert_int_equal(st_gguf_n_tensors(g), N_HOSTILE);
    char name[64];
    for (int64_t i = 0; i < N_HOSTILE; i += 991) {
        snprintf(name, sizeof name, "blk.%" PRId64 ".w", i);
        assert_ptr_equal(st_gguf_tensor_find(g, name), st_gguf_tensor_at(g, i));
    }
    assert_null(st_gguf_tensor_find(g, "blk.x.w"));
    st_gguf_free(g);
    free(b.p);

    b = many_tensors(N_HOSTILE, 1);
    g = (st_gguf *)1;
    assert_int_equal(st_gguf_open_memory(b.p, b.n, "dup-tensors.gguf", &g), ST_ERR_FORMAT);
    assert_null(g);
    assert_non_null(strstr(st_last_error(), "duplicate tensor name 'blk.0.w'"));
    free(b.p);
}

/* Two f32 tensors "a" (na elements at offset 0) and "b" (nb at offset ob), 128 data bytes. */
static buf two_tensors(uint64_t na, uint64_t ob, uint64_t nb) {
    buf b = {0};
    header(&b, 2, 0);
    const char *names[2] = {"a", "b"};
    const uint64_t ne[2] = {na, nb}, off[2] = {0, ob};
    for (int i = 0; i < 2; i++) {
        put_str(&b, names[i]);
        put_u32(&b, 1);
        put_u64(&b, ne[i]);
        put_u32(&b, ST_DTYPE_F32);
        put_u64(&b, off[i]);
    }
    uint8_t zero[128] = {0};
    put(&b, zero, (32 - b.n % 32) % 32);
    put(&b, zero, sizeof zero);
    return b;
}

static void test_overlapping_tensors(void **state) {
    (void)state;
    /* tensors whose data share bytes are refused naming both (as the safetensors reader does);
     * adjacent ones, and an empty one anywhere, open */
    static const struct {
        uint64_t na, ob, nb;
        int ok;
    } cases[] = {{8, 0, 8, 0}, {16, 32, 8, 0}, {32, 32, 1, 0}, {8, 32, 8, 1}, {8, 0, 0, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        buf b = two_tensors(cases[i].na, cases[i].ob, cases[i].nb);
        st_gguf *g = NULL;
        st_status s = st_gguf_open_memory(b.p, b.n, "overlap.gguf", &g);
        if (cases[i].ok) {
            assert_int_equal(s, ST_OK);
            st_gguf_free(g);
        } else if (s != ST_ERR_FORMAT || !strstr(st_last_error(), "overlap.gguf: tensors 'a'") ||
                   !strstr(st_last_error(), "'b'") || !strstr(st_last_error(), "overlap")) {
            fail_msg("case %zu: status %d, '%s'", i, (int)s, st_last_error());
        }
        free(b.p);
    }
}

static void test_truncated_header(void **state) {
    (void)state;
    size_t size = 0;
    char *file = tu_read_file(tu_data("models/stories260K.gguf"), &size);
    assert_non_null(file);
    st_gguf *g = NULL;
    /* Cut inside the counts, just after them, and inside the KV section. */
    const size_t cuts[] = {20, 24, 100, 1000};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        st_status s = st_gguf_open_memory(file, cuts[i], "cut.gguf", &g);
        assert_int_equal(s, ST_ERR_FORMAT);
        if (!strstr(st_last_error(), "truncated") || !strstr(st_last_error(), "cut.gguf"))
            fail_msg("cut at %zu bytes: '%s'", cuts[i], st_last_error());
    }
    free(file);
    /* A count no file could hold is refused before anything is sized from it. */
    buf b = {0};
    header(&b, 0, INT64_MAX);
    assert_int_equal(st_gguf_open_memory(b.p, b.n, "huge.gguf", &g), ST_ERR_FORMAT);
    assert_non_null(strstr(st_last_error(), "truncated"));
    b.n = 0;
    header(&b, 0, -1);
    assert_int_equal(st_gguf_open_memory(b.p, b.n, "negative.gguf", &g), ST_ERR_FORMAT);
    assert_non_null(strstr(st_last_error(), "invalid metadata count -1"));
    free(b.p);
}

static void test_not_regular(void **state) {
    (void)state;
    /* Opening a FIFO for reading blocks until a writer comes; the alarm ends a hang here. */
    alarm(60);
    char dir[] = "/tmp/st_hostile_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char fifo[256];
    snprintf(fifo, sizeof fifo, "%s/model.gguf", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    st_gguf *g = (st_gguf *)1;
    assert_int_equal(st_gguf_open(fifo, &g), ST_ERR_IO);
    assert_null(g);
    assert_non_null(strstr(st_last_error(), "model.gguf: not a regular file (a FIFO)"));
    st_model *m = (st_model *)1;
    assert_true(st_model_load(fifo, &m) < 0);
    assert_null(m);
    assert_non_null(strstr(st_last_error(), "a FIFO"));
    assert_int_equal(st_gguf_open(dir, &g), ST_ERR_IO);
    assert_non_null(strstr(st_last_error(), "not a regular file (a directory)"));
    assert_int_equal(st_gguf_open("/dev/null", &g), ST_ERR_IO);
    assert_non_null(strstr(st_last_error(), "(a character device)"));
    remove(fifo);
    rmdir(dir);
    alarm(0);
}

/* stories260K with tensor `name` given shape ne (n_dims dims, same element count), loaded. */
static st_status load_reshaped(const char *name, uint32_t n_dims, const int64_t *ne) {
    size_t size = 0;
    char *file = tu_read_file(tu_data("models/stories260K.gguf"), &size);
    assert_non_null(file);
    st_gguf *g = NULL;
    assert_int_equal(st_gguf_open_memory(file, size, "stories", &g), ST_OK);
    st_gguf_writer *w = NULL;
    assert_int_equal(st_gguf_writer_create(&w), ST_OK);
    for (int64_t i = 0; i < st_gguf_n_kv(g); i++)
        assert_int_equal(st_gguf_writer_copy_kv(w, g, st_gguf_key(g, i)), ST_OK);
    for (int64_t i = 0; i < st_gguf_n_tensors(g); i++) {
        const st_gguf_tensor *t = st_gguf_tensor_at(g, i);
        const int mine = strcmp(t->name, name) == 0;
        assert_int_equal(st_gguf_writer_add_tensor(w, t->name, t->type, mine ? n_dims : t->n_dims,
                                                   mine ? ne : t->ne, t->data, t->size,
                                                   ST_GGUF_REF),
                         ST_OK);
    }
    void *out = NULL;
    size_t n = 0;
    assert_int_equal(st_gguf_writer_write_memory(w, &out, &n), ST_OK);
    st_model *m = NULL;
    st_status s = st_model_load_memory(out, n, "reshaped.gguf", &m);
    st_model_free(m);
    free(out);
    st_gguf_writer_free(w);
    st_gguf_free(g);
    free(file);
    return s;
}

static void test_weight_shapes(void **state) {
    (void)state;
    const int64_t same[] = {64, 64}; /* the real shape: the copy loads */
    assert_int_equal(load_reshaped("blk.0.attn_q.weight", 2, same), ST_OK);
    const int64_t three[] = {64, 64, 1};
    assert_int_equal(load_reshaped("blk.0.attn_q.weight", 3, three), ST_ERR_FORMAT);
    assert_non_null(strstr(st_last_error(), "reshaped.gguf: tensor 'blk.0.attn_q.weight' has "
                                            "shape [64, 64, 1], expected [64, 64]"));
    const int64_t four[] = {64, 16, 2, 2};
    assert_int_equal(load_reshaped("blk.0.attn_q.weight", 4, four), ST_ERR_FORMAT);
    assert_non_null(strstr(st_last_error(), "shape [64, 16, 2, 2], expected [64, 64]"));
    const int64_t norm[] = {32, 2};
    assert_int_equal(load_reshaped("blk.1.ffn_norm.weight", 2, norm), ST_ERR_FORMAT);
    assert_non_null(
        strstr(st_last_error(), "tensor 'blk.1.ffn_norm.weight' has shape [32, 2], expected [64]"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_siphash_vectors),  cmocka_unit_test(test_name_index),
        cmocka_unit_test(test_many_keys),        cmocka_unit_test(test_many_tensors),
        cmocka_unit_test(test_truncated_header), cmocka_unit_test(test_not_regular),
        cmocka_unit_test(test_weight_shapes),    cmocka_unit_test(test_overlapping_tensors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
