/*
 * test_tok.c: tokenizer tests. Every llama.cpp test vector (llama-spm and gpt-2 vocabularies)
 * must match exactly; detokenize(tokenize(x)) round-trips; the streaming detokenizer never
 * emits partial UTF-8; pre-tokenizer splits match the regexes; stories260K's prompt gives the
 * ids llama2.c gives; bad input and bad vocabulary data give errors, not crashes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"
#include "tok/tok.h"

/* ---- helpers ---- */

static st_tokenizer *load_tok(const char *rel) {
    st_gguf *g = NULL;
    st_status s = st_gguf_open(tu_data(rel), &g);
    if (s != ST_OK)
        fail_msg("%s: %s", rel, st_last_error());
    st_tokenizer *t = NULL;
    s = st_tokenizer_load(g, &t);
    if (s != ST_OK)
        fail_msg("%s: %s", rel, st_last_error());
    st_gguf_free(g); /* the tokenizer must not need it any more */
    return t;
}

/* Tokenizes into a malloc'd array. */
static int32_t *tokenize(const st_tokenizer *t, const char *s, size_t n, int bos, int64_t *n_ids) {
    int64_t need = 0;
    st_status st = st_tokenize(t, s, n, bos, NULL, 0, &need);
    assert_true(st == ST_OK || st == ST_ERR_RANGE);
    int32_t *ids = malloc(((size_t)need + 1) * sizeof *ids);
    assert_non_null(ids);
    assert_int_equal(st_tokenize(t, s, n, bos, ids, need, n_ids), ST_OK);
    assert_int_equal(*n_ids, need);
    return ids;
}

/* Detokenizes ids one at a time (checking each chunk is valid UTF-8); malloc'd, NUL-ended. */
static int valid_utf8(const char *s, size_t n);

static char *detokenize(const st_tokenizer *t, const int32_t *ids, int64_t n, size_t *len) {
    size_t cap = st_detok_max_bytes(t), total = 0;
    char *buf = malloc(cap), *res = malloc((size_t)(n + 1) * cap + 1);
    assert_non_null(buf);
    assert_non_null(res);
    st_detok d;
    st_detok_init(&d, t);
    for (int64_t i = 0; i < n; i++) {
        size_t k;
        assert_int_equal(st_detok_push(&d, ids[i], buf, cap, &k), ST_OK);
        assert_true(valid_utf8(buf, k));
        memcpy(res + total, buf, k);
        total += k;
    }
    size_t k;
    assert_int_equal(st_detok_flush(&d, buf, cap, &k), ST_OK);
    memcpy(res + total, buf, k);
    total += k;
    res[total] = 0;
    free(buf);
    *len = total;
    return res;
}

static int valid_utf8(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = st_utf8_decode(u + i, n - i, &cp);
        if (cp >= ST_CP_BAD)
            return 0;
        i += (size_t)l;
    }
    return 1;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static size_t put_utf8(char *p, uint32_t cp) {
    if (cp < 0x80) {
        p[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        p[0] = (char)(0xC0 | (cp >> 6));
        p[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        p[0] = (char)(0xE0 | (cp >> 12));
        p[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        p[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    p[0] = (char)(0xF0 | (cp >> 18));
    p[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    p[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    p[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A random valid UTF-8 string of up to n_cp code points drawn from a mix of scripts. */
static size_t random_utf8(char *p, int n_cp) {
    static const uint32_t ranges[][2] = {
        {0x20, 0x7E},     {0x20, 0x20},     {0x09, 0x0D},     {0x30, 0x39},     {0xA0, 0xFF},
        {0x400, 0x4FF},   {0x300, 0x36F},   {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0x1F300, 0x1F6FF},
        {0x2000, 0x206F}, {0x17E0, 0x17FF}, {0x1, 0x10FFFF},  {0x27, 0x27},     {0x3000, 0x3002},
    };
    size_t n = 0;
    int k = (int)(rnd() % (unsigned)(n_cp + 1));
    for (int i = 0; i < k; i++) {
        const uint32_t *r = ranges[rnd() % (sizeof ranges / sizeof ranges[0])];
        uint32_t cp = r[0] + rnd() % (r[1] - r[0] + 1);
        if (cp >= 0xD800 && cp <= 0xDFFF)
            cp = 'x';
        n += put_utf8(p + n, cp);
    }
    return n;
}

/* ---- llama.cpp test vectors ---- */

static void run_vectors(const char *vocab) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/tokenizer/%s", vocab);
    st_tokenizer *t = load_tok(rel);
    char path[4096];
    snprintf(path, sizeof path, "%s.inp", tu_data(rel));
    size_t n_inp;
    char *inp = tu_read_file(path, &n_inp);
    assert_non_null(inp);
    snprintf(path, sizeof path, "%s.out", tu_data(rel));
    char *outf = tu_read_file(path, NULL);
    assert_non_null(outf);

    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t n_sep = sizeof sep - 1;
    char *p = inp, *line = outf;
    int n_tests = 0, n_fail = 0;
    while (p < inp + n_inp) {
        char *end = strstr(p, sep);
        if (!end)
            break; /* a trailing remainder without separator is not a test */
        size_t len = (size_t)(end - p);
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = 0;
        int32_t want[1024];
        int n_want = 0;
        for (char *q = line; *q;) {
            char *e;
            long v = strtol(q, &e, 10);
            if (e == q)
                break;
            want[n_want++] = (int32_t)v;
            q = e;
        }
        int64_t n_got;
        int32_t *got = tokenize(t, p, len, 0, &n_got);
        int ok = n_got == n_want;
        for (int i = 0; ok && i < n_want; i++)
            ok = got[i] == want[i];
        if (!ok) {
            n_fail++;
            fprintf(stderr, "%s test %d (\"%.*s\"): expected", vocab, n_tests, (int)len, p);
            for (int i = 0; i < n_want; i++)
                fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n   got");
            for (int64_t i = 0; i < n_got; i++)
                fprintf(stderr, " %d", got[i]);
            fprintf(stderr, "\n");
        }
        free(got);
        n_tests++;
        p = end + n_sep;
        line = nl + 1;
    }
    assert_true(n_tests >= 40);
    assert_int_equal(n_fail, 0);
    free(inp);
    free(outf);
    st_tokenizer_free(t);
}

static void test_vectors_llama_spm(void **state) {
    (void)state;
    run_vectors("ggml-vocab-llama-spm.gguf");
}

static void test_vectors_gpt2(void **state) {
    (void)state;
    run_vectors("ggml-vocab-gpt-2.gguf");
}

/* ---- round trips ---- */

/* SPM: with BOS the prepended space is dropped again, so the text comes back exactly; without
 * BOS it comes back with that one leading space. Byte-level BPE: always exactly. */
static void check_roundtrip(const st_tokenizer *t, const char *s, size_t n) {
    int spm = st_tokenizer_add_bos_default(t) && st_tokenizer_bos(t) == 1;
    int64_t n_ids;
    int32_t *ids = tokenize(t, s, n, spm, &n_ids);
    size_t m;
    char *back = detokenize(t, ids, n_ids, &m);
    if (m != n || memcmp(back, s, n) != 0)
        fail_msg("round trip of \"%.*s\" gave \"%.*s\"", (int)n, s, (int)m, back);
    free(back);
    free(ids);
    if (spm && n > 0) {
        ids = tokenize(t, s, n, 0, &n_ids);
        back = detokenize(t, ids, n_ids, &m);
        assert_int_equal(m, n + 1);
        assert_int_equal(back[0], ' ');
        assert_memory_equal(back + 1, s, n);
        free(back);
        free(ids);
    }
}

static void roundtrip_vectors(const char *vocab) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/tokenizer/%s", vocab);
    st_tokenizer *t = load_tok(rel);
    char path[4096];
    snprintf(path, sizeof path, "%s.inp", tu_data(rel));
    size_t n_inp;
    char *inp = tu_read_file(path, &n_inp);
    assert_non_null(inp);
    for (char *p = inp, *end; (end = strstr(p, "\n__ggml_vocab_test__\n")); p = end + 21)
        check_roundtrip(t, p, (size_t)(end - p));
    char buf[4 * 200];
    for (int i = 0; i < 3000; i++) {
        size_t n = random_utf8(buf, 60);
        check_roundtrip(t, buf, n);
    }
    free(inp);
    st_tokenizer_free(t);
}

static void test_roundtrip_spm(void **state) {
    (void)state;
    roundtrip_vectors("ggml-vocab-llama-spm.gguf");
}

static void test_roundtrip_gpt2(void **state) {
    (void)state;
    roundtrip_vectors("ggml-vocab-gpt-2.gguf");
}

/* ---- streaming detokenization ---- */

static void test_detok_stream(void **state) {
    (void)state;
    st_tokenizer *t = load_tok("tests/data/tokenizer/ggml-vocab-llama-spm.gguf");
    /* "🦙" has no piece: ▁ then its four byte-fallback tokens */
    int64_t n;
    int32_t *ids = tokenize(t, "\xF0\x9F\xA6\x99", 4, 0, &n);
    assert_int_equal(n, 5);
    assert_int_equal(ids[0], 29871);
    assert_int_equal(ids[1], 3 + 0xF0);
    st_detok d;
    st_detok_init(&d, t);
    char out[64];
    size_t k;
    assert_int_equal(st_detok_push(&d, ids[0], out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 1);
    assert_int_equal(out[0], ' ');
    for (int i = 1; i < 4; i++) {
        assert_int_equal(st_detok_push(&d, ids[i], out, sizeof out, &k), ST_OK);
        assert_int_equal(k, 0); /* held back */
    }
    /* too small a buffer: refused, state unchanged */
    assert_int_equal(st_detok_push(&d, ids[4], out, 3, &k), ST_ERR_RANGE);
    assert_int_equal(k, 4);
    assert_int_equal(st_detok_push(&d, ids[4], out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 4);
    assert_memory_equal(out, "\xF0\x9F\xA6\x99", 4);
    free(ids);

    /* ill-formed: E2 then 'A' -> U+FFFD 'A'; a lone continuation byte -> U+FFFD at once; an
     * incomplete character at the end -> U+FFFD at flush */
    st_detok_init(&d, t);
    assert_int_equal(st_detok_push(&d, 3 + 0xE2, out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 0);
    assert_int_equal(st_detok_push(&d, 3 + 'A', out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 4);
    assert_memory_equal(out,
                        "\xEF\xBF\xBD"
                        "A",
                        4);
    assert_int_equal(st_detok_push(&d, 3 + 0x80, out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 3);
    assert_int_equal(st_detok_push(&d, 3 + 0xE0, out, sizeof out, &k), ST_OK);
    assert_int_equal(st_detok_push(&d, 3 + 0x80, out, sizeof out, &k), ST_OK); /* overlong */
    assert_int_equal(k, 6);
    assert_int_equal(st_detok_push(&d, 3 + 0xF0, out, sizeof out, &k), ST_OK);
    assert_int_equal(st_detok_flush(&d, out, 2, &k), ST_ERR_RANGE);
    assert_int_equal(st_detok_flush(&d, out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 3);
    assert_int_equal(st_detok_flush(&d, out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 0);

    /* BOS drops the leading space of the next piece; set_prev primes a continuation */
    int32_t hello = st_tok_find(t, "\xE2\x96\x81Hello", 8);
    assert_true(hello > 0);
    st_detok_init(&d, t);
    assert_int_equal(st_detok_push(&d, 1, out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 0);
    assert_int_equal(st_detok_push(&d, 2, out, sizeof out, &k), ST_OK); /* control: nothing */
    assert_int_equal(k, 0);
    assert_int_equal(st_detok_push(&d, hello, out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 5);
    assert_memory_equal(out, "Hello", 5);
    assert_int_equal(st_detok_push(&d, hello, out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 6);
    st_detok_init(&d, t);
    assert_int_equal(st_detok_set_prev(&d, hello), ST_OK);
    assert_int_equal(st_detok_push(&d, hello, out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 6);
    assert_memory_equal(out, " Hello", 6);
    assert_int_equal(st_detok_set_prev(&d, 1), ST_OK);
    assert_int_equal(st_detok_push(&d, hello, out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 5);
    assert_int_equal(st_detok_set_prev(&d, 32000), ST_ERR_INVALID);
    assert_int_equal(st_detok_push(&d, -1, out, sizeof out, &k), ST_ERR_INVALID);
    assert_int_equal(st_detok_push(&d, 32000, out, sizeof out, &k), ST_ERR_INVALID);

    /* random multi-byte text through byte fallback, one token at a time: every chunk valid */
    for (int it = 0; it < 300; it++) {
        char buf[800];
        size_t len = random_utf8(buf, 40);
        int64_t m;
        int32_t *r = tokenize(t, buf, len, 1, &m);
        size_t got;
        char *back = detokenize(t, r, m, &got); /* checks every chunk */
        assert_int_equal(got, len);
        assert_memory_equal(back, buf, len);
        free(back);
        free(r);
    }
    st_tokenizer_free(t);
}

/* ---- stories260K ---- */

/* llama2.c's encoder on this vocabulary: "▁Once▁upon▁a▁time" merges by score into
 * ▁Once (403), ▁upon (407), ▁a (261), ▁time (378); every intermediate pair (▁O, ce, ▁On, ...)
 * is a piece. */
static void test_stories260k(void **state) {
    (void)state;
    st_tokenizer *t = load_tok("models/stories260K.gguf");
    assert_int_equal(st_tokenizer_n_vocab(t), 512);
    assert_int_equal(st_tokenizer_bos(t), 1);
    assert_int_equal(st_tokenizer_eos(t), 2);
    assert_true(st_tokenizer_add_bos_default(t));
    assert_true(st_tokenizer_is_eog(t, 2));
    assert_false(st_tokenizer_is_eog(t, 1));
    assert_false(st_tokenizer_is_eog(t, 512));
    int64_t n;
    int32_t *ids = tokenize(t, "Once upon a time", 16, 1, &n);
    const int32_t want[] = {1, 403, 407, 261, 378};
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want, sizeof want);
    size_t len;
    char *back = detokenize(t, ids, n, &len);
    assert_string_equal(back, "Once upon a time");
    free(back);
    free(ids);
    size_t pl;
    assert_string_equal(st_tokenizer_piece(t, 403, &pl), "\xE2\x96\x81Once");
    assert_int_equal(pl, 7);
    assert_null(st_tokenizer_piece(t, 512, &pl));
    assert_null(st_tokenizer_piece(t, -1, NULL));
    st_tokenizer_free(t);
}

/* ---- API edges ---- */

static void test_api_edges(void **state) {
    (void)state;
    st_tokenizer *t = load_tok("tests/data/tokenizer/ggml-vocab-llama-spm.gguf");
    int32_t ids[4];
    int64_t n = -1;
    /* "Hello world" with BOS is 3 ids: a buffer of 2 gets the first 2 and ST_ERR_RANGE */
    assert_int_equal(st_tokenize(t, "Hello world", 11, 1, ids, 2, &n), ST_ERR_RANGE);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 15043);
    assert_int_equal(st_tokenize(t, "", 0, 0, NULL, 0, &n), ST_OK);
    assert_int_equal(n, 0);
    assert_int_equal(st_tokenize(t, NULL, 0, 1, ids, 4, &n), ST_OK);
    assert_int_equal(n, 1);
    assert_int_equal(st_tokenize(t, NULL, 3, 0, ids, 4, &n), ST_ERR_INVALID);
    assert_int_equal(st_tokenize(t, "x", 1, 0, NULL, 4, &n), ST_ERR_INVALID);
    assert_int_equal(st_tokenize(t, "x", 1, 0, ids, -1, &n), ST_ERR_INVALID);
    assert_int_equal(st_tokenize(NULL, "x", 1, 0, ids, 4, &n), ST_ERR_INVALID);
    /* special-token text is plain text */
    int32_t *r = tokenize(t, "<s>", 3, 0, &n);
    for (int64_t i = 0; i < n; i++)
        assert_int_not_equal(r[i], 1);
    free(r);
    assert_int_equal(st_tokenizer_n_vocab(t), 32000);
    assert_true(st_tokenizer_is_eog(t, 2));
    st_tokenizer_free(t);
    st_tokenizer_free(NULL);

    t = load_tok("tests/data/tokenizer/ggml-vocab-gpt-2.gguf");
    assert_int_equal(st_tokenizer_bos(t), 50256);
    assert_false(st_tokenizer_add_bos_default(t));
    assert_true(st_tokenizer_is_eog(t, 50256));
    size_t len;
    assert_string_equal(st_tokenizer_piece(t, 220, &len), "\xC4\xA0"); /* Ġ */
    /* the control token decodes to nothing */
    st_detok d;
    st_detok_init(&d, t);
    char out[64];
    size_t k;
    assert_int_equal(st_detok_push(&d, 50256, out, sizeof out, &k), ST_OK);
    assert_int_equal(k, 0);
    st_tokenizer_free(t);
}

/* ---- st_tokenize_max: a limit, and texts refused without being tokenized ---- */

static void test_tokenize_max(void **state) {
    (void)state;
    const char *vocabs[] = {"tests/data/tokenizer/ggml-vocab-llama-spm.gguf",
                            "tests/data/tokenizer/ggml-vocab-gpt-2.gguf"};
    enum { BIG = 50 << 20 };
    char *big = malloc(BIG);
    assert_non_null(big);
    for (int v = 0; v < 2; v++) {
        st_tokenizer *t = load_tok(vocabs[v]);
        int32_t ids[64];
        int64_t n = -1;
        /* within the limit: st_tokenize's ids; one over: ST_ERR_RANGE with the count */
        assert_int_equal(st_tokenize_max(t, "Hello world", 11, 0, 2, ids, 64, &n), ST_OK);
        assert_int_equal(n, 2);
        assert_int_equal(st_tokenize_max(t, "Hello world", 11, 0, 1, ids, 64, &n), ST_ERR_RANGE);
        assert_int_equal(n, 2);
        assert_int_equal(st_tokenize_max(t, "x", 1, 0, -1, ids, 64, &n), ST_ERR_INVALID);
        /* the refusal without tokenizing rests on every token standing for at most
         * 2 * max(longest decoded token, 4) bytes of input: texts of every kind give at least
         * their length over that many tokens (runs of spaces, random bytes, stories) */
        uint64_t seed = 5;
        for (int k = 0; k < 3; k++) {
            const size_t len = 1 << 16;
            for (size_t i = 0; i < len; i++) {
                seed = seed * 6364136223846793005u + 1442695040888963407u;
                big[i] = k == 0 ? ' ' : k == 1 ? (char)(seed >> 56) : "Once upon "[i % 10];
            }
            int32_t *r = tokenize(t, big, len, 0, &n);
            free(r);
            /* with the limit at the exact count it is tokenized (the count comes back, not the
             * limit + 1 of a text refused unread) */
            int64_t m = -1;
            assert_int_equal(st_tokenize_max(t, big, len, 0, n, NULL, 0, &m), ST_ERR_RANGE);
            assert_int_equal(m, n);
        }
        /* 50 MB: refused at once */
        memset(big, 'a', BIG);
        const double t0 = st_time_now();
        assert_int_equal(st_tokenize_max(t, big, BIG, 1, 4096, ids, 64, &n), ST_ERR_RANGE);
        assert_int_equal(n, 4097);
        assert_true(st_time_now() - t0 < 0.5);
        assert_non_null(strstr(st_last_error(), "gives more than 4096 tokens"));
        st_tokenizer_free(t);
    }
    free(big);
}

/* ---- invalid UTF-8 input ---- */

static void test_invalid_utf8(void **state) {
    (void)state;
    st_tokenizer *tk[2] = {load_tok("tests/data/tokenizer/ggml-vocab-llama-spm.gguf"),
                           load_tok("tests/data/tokenizer/ggml-vocab-gpt-2.gguf")};
    for (int v = 0; v < 2; v++) {
        for (int it = 0; it < 2000; it++) {
            char buf[64];
            size_t n = rnd() % sizeof buf;
            for (size_t i = 0; i < n; i++)
                buf[i] = (char)(rnd() % 4 == 0 ? (0x80 + rnd() % 128) : rnd());
            int64_t m;
            int32_t *ids = tokenize(tk[v], buf, n, 0, &m);
            for (int64_t i = 0; i < m; i++)
                assert_true(ids[i] >= 0 && ids[i] < st_tokenizer_n_vocab(tk[v]));
            size_t len;
            char *back = detokenize(tk[v], ids, m, &len); /* checks validity */
            assert_true(valid_utf8(back, len));
            if (valid_utf8(buf, n) && v == 1) {
                assert_int_equal(len, n);
                assert_memory_equal(back, buf, n);
            }
            free(back);
            free(ids);
        }
        /* every invalid byte stands alone: a stray byte keeps its value through BPE */
        int64_t m;
        int32_t *ids = tokenize(tk[v],
                                "a\xFF"
                                "b",
                                3, 0, &m);
        assert_true(m >= 3);
        free(ids);
        st_tokenizer_free(tk[v]);
    }
}

/* ---- speed: a 10 KB text well under 100 ms ---- */

#if defined(__SANITIZE_ADDRESS__)
#define SLOW_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLOW_BUILD 1
#endif
#endif
#ifndef SLOW_BUILD
#define SLOW_BUILD 0
#endif

static void test_speed(void **state) {
    (void)state;
    const char *vocabs[] = {"tests/data/tokenizer/ggml-vocab-llama-spm.gguf",
                            "tests/data/tokenizer/ggml-vocab-gpt-2.gguf"};
    char rel[4096];
    snprintf(rel, sizeof rel, "%s.inp", tu_data(vocabs[0]));
    size_t n_inp;
    char *inp = tu_read_file(rel, &n_inp);
    assert_non_null(inp);
    size_t len = 10240;
    char *text = malloc(len);
    for (size_t i = 0; i < len; i++)
        text[i] = inp[i % n_inp];
    for (int v = 0; v < 2; v++) {
        st_tokenizer *t = load_tok(vocabs[v]);
        int64_t n;
        free(tokenize(t, text, len, 0, &n)); /* warm-up */
        /* the least of 5 (a guard against a super-linear tokenizer, not a benchmark: one run
         * preempted on a busy machine once took 283 ms) */
        double ms = 1e30;
        for (int r = 0; r < 5; r++) {
            const double t0 = st_time_now();
            free(tokenize(t, text, len, 0, &n));
            const double m = (st_time_now() - t0) * 1e3;
            ms = m < ms ? m : ms;
        }
        fprintf(stderr, "%s: 10 KB -> %lld tokens in %.2f ms\n", vocabs[v], (long long)n, ms);
        assert_true(ms < (SLOW_BUILD ? 1000.0 : 100.0));
        st_tokenizer_free(t);
    }
    free(text);
    free(inp);
}

/* ---- pre-tokenizer splits (expected pieces from the regexes, via Python's regex module) ---- */

static void check_split(st_pre_kind pre, const char *text, const char *const *want, int n_want) {
    uint32_t cps[256];
    uint8_t cls[256];
    int64_t offs[257], ends[256], scratch[256];
    size_t len = strlen(text);
    int64_t n = 0;
    for (size_t i = 0; i < len;) {
        offs[n] = (int64_t)i;
        i += (size_t)st_utf8_decode((const uint8_t *)text + i, len - i, &cps[n]);
        cls[n] = (uint8_t)st_uni_class(cps[n]);
        n++;
    }
    offs[n] = (int64_t)len;
    int64_t k = st_pre_split(pre, cps, cls, n, ends, scratch);
    int ok = k == n_want;
    for (int64_t i = 0, start = 0; ok && i < k; start = ends[i++]) {
        size_t a = (size_t)offs[start], b = (size_t)offs[ends[i]];
        ok = strlen(want[i]) == b - a && memcmp(text + a, want[i], b - a) == 0;
    }
    if (!ok) {
        fprintf(stderr, "split %d of \"%s\":", (int)pre, text);
        for (int64_t i = 0, start = 0; i < k; start = ends[i++])
            fprintf(stderr, " [%.*s]", (int)(offs[ends[i]] - offs[start]), text + offs[start]);
        fprintf(stderr, "\n");
        fail();
    }
}

#define SPLIT(pre, text, ...)                                                                      \
    do {                                                                                           \
        const char *const w_[] = {__VA_ARGS__};                                                    \
        check_split(pre, text, w_, (int)(sizeof w_ / sizeof w_[0]));                               \
    } while (0)

static void test_pre_splits(void **state) {
    (void)state;
    const char *s;
    s = "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～";
    SPLIT(ST_PRE_GPT2, s, "Hello", ",", " y", "'", "all", "!", " How", " are", " you", " 😁", " ?",
          "我想在apple工作", "1314151", "天", "～");
    SPLIT(ST_PRE_LLAMA3, s, "Hello", ",", " y", "'all", "!", " How", " are", " you", " 😁", " ?",
          "我想在apple工作", "131", "415", "1", "天", "～");
    SPLIT(ST_PRE_QWEN2, s, "Hello", ",", " y", "'all", "!", " How", " are", " you", " 😁", " ?",
          "我想在apple工作", "1", "3", "1", "4", "1", "5", "1", "天", "～");
    SPLIT(ST_PRE_DEEPSEEK, s, "Hello", ",", " y", "'", "all", "!", " How", " are", " you", " 😁",
          " ?", "我想在", "apple", "工作", "1314151", "天", "～");
    s = "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D";
    SPLIT(ST_PRE_GPT2, s, "I", "'ve", " been", " '", "told", " he", "'s", " there", ",", " '", "RE",
          " you", " sure", "?", " '", "M", " not", " sure", " I", "'ll", " make", " it", ",", " '",
          "D");
    SPLIT(ST_PRE_LLAMA3, s, "I", "'ve", " been", " '", "told", " he", "'s", " there", ",", " '",
          "RE", " you", " sure", "?", " '", "M", " not", " sure", " I", "'ll", " make", " it", ",",
          " '", "D");
    SPLIT(ST_PRE_DEEPSEEK, s, "I", "'", "ve", " been", " '", "told", " he", "'", "s", " there", ",",
          " '", "RE", " you", " sure", "?", " '", "M", " not", " sure", " I", "'", "ll", " make",
          " it", ",", " '", "D");
    s = "We'Ve a'lL x'ſ";
    SPLIT(ST_PRE_GPT2, s, "We", "'", "Ve", " a", "'", "lL", " x", "'", "ſ");
    SPLIT(ST_PRE_LLAMA3, s, "We", "'Ve", " a", "'lL", " x", "'ſ");
    s = "\n \n\n \t\t x  y   \r\n3333 $$\n\n";
    SPLIT(ST_PRE_GPT2, s, "\n \n\n \t\t", " x", " ", " y", "   \r", "\n", "3333", " $$", "\n\n");
    SPLIT(ST_PRE_LLAMA3, s, "\n \n\n", " \t\t", " x", " ", " y", "   \r\n", "333", "3", " $$\n\n");
    SPLIT(ST_PRE_QWEN2, s, "\n \n\n", " \t\t", " x", " ", " y", "   \r\n", "3", "3", "3", "3",
          " $$\n\n");
    SPLIT(ST_PRE_DEEPSEEK, s, "\n", " ", "\n", "\n", " \t\t", " x", " ", " y", "   ", "\r", "\n",
          "3333", " $$", "\n", "\n");
    s = "\tword \xC2\xA0"
        "word";
    SPLIT(ST_PRE_GPT2, s, "\t", "word", " ",
          "\xC2\xA0"
          "",
          "word");
    SPLIT(ST_PRE_LLAMA3, s, "\tword", " ",
          "\xC2\xA0"
          "word");
    s = "\xCE\xA9mega \xE2\x84\xA6K \xEA\xB0\x80\xEB\x82\x98 end  "; /* U+03A9, U+2126 */
    SPLIT(ST_PRE_DEEPSEEK, s, "\xCE\xA9", "mega", " ", "\xE2\x84\xA6", "K", " ",
          "\xEA\xB0\x80\xEB\x82\x98", " end", "  ");
    /* bytes that are not UTF-8 stand alone and class as punctuation */
    SPLIT(ST_PRE_GPT2, "a\xFF\xFE b", "a", "\xFF\xFE", " b");
}

/* ---- UTF-8 decoding and code point classes ---- */

static void test_unicode(void **state) {
    (void)state;
    static const struct {
        const char *s;
        int len;
        uint32_t cp;
    } dec[] = {
        {"A", 1, 'A'},
        {"\xC3\xA9", 2, 0xE9},
        {"\xE2\x96\x81", 3, 0x2581},
        {"\xF0\x9F\xA6\x99", 4, 0x1F999},
        {"\xF4\x8F\xBF\xBF", 4, 0x10FFFF},
        {"\xC0\x80", 1, ST_CP_BAD + 0xC0},         /* overlong */
        {"\xE0\x80\x80", 1, ST_CP_BAD + 0xE0},     /* overlong */
        {"\xED\xA0\x80", 1, ST_CP_BAD + 0xED},     /* surrogate */
        {"\xF4\x90\x80\x80", 1, ST_CP_BAD + 0xF4}, /* past U+10FFFF */
        {"\xE2\x96", 1, ST_CP_BAD + 0xE2},         /* truncated */
        {"\xE2\x41\x41", 1, ST_CP_BAD + 0xE2},     /* bad continuation */
        {"\x80", 1, ST_CP_BAD + 0x80},
        {"\xFF", 1, ST_CP_BAD + 0xFF},
    };
    for (size_t i = 0; i < sizeof dec / sizeof dec[0]; i++) {
        uint32_t cp;
        int l = st_utf8_decode((const uint8_t *)dec[i].s, strlen(dec[i].s), &cp);
        assert_int_equal(l, dec[i].len);
        assert_int_equal(cp, dec[i].cp);
    }
    static const struct {
        uint32_t cp;
        int cls;
    } cls[] = {
        {'a', ST_UC_LETTER},     {'Z', ST_UC_LETTER},     {'7', ST_UC_NUMBER},
        {'_', ST_UC_OTHER},      {' ', ST_UC_SPACE},      {'\t', ST_UC_SPACE},
        {0x0B, ST_UC_SPACE},     {0x1C, ST_UC_OTHER},     {0x85, ST_UC_SPACE},
        {0xA0, ST_UC_SPACE},     {0xB2, ST_UC_NUMBER},    {0xB5, ST_UC_LETTER},
        {0x301, ST_UC_OTHER},    {0x663, ST_UC_NUMBER},   {0x1680, ST_UC_SPACE},
        {0x180E, ST_UC_OTHER},   {0x200B, ST_UC_OTHER},   {0x2028, ST_UC_SPACE},
        {0x3000, ST_UC_SPACE},   {0x216B, ST_UC_NUMBER},  {0x4E00, ST_UC_LETTER},
        {0xAC00, ST_UC_LETTER},  {0x20AC, ST_UC_OTHER},   {0x1F600, ST_UC_OTHER},
        {0x1E900, ST_UC_LETTER}, {0x10FFFF, ST_UC_OTHER}, {ST_CP_BAD + 0xFF, ST_UC_OTHER},
    };
    for (size_t i = 0; i < sizeof cls / sizeof cls[0]; i++)
        if (st_uni_class(cls[i].cp) != cls[i].cls)
            fail_msg("class of U+%04X is %d, expected %d", cls[i].cp, st_uni_class(cls[i].cp),
                     cls[i].cls);
    assert_true(st_uni_deepseek_letter(0x2126));
    assert_true(st_uni_deepseek_letter(0x1FBE));
    assert_false(st_uni_deepseek_letter(0x5D0)); /* Hebrew alef: Lo, uncased */
    assert_false(st_uni_deepseek_letter(0x2D00));
    /* the GPT-2 byte alphabet is a bijection */
    for (int b = 0; b < 256; b++)
        assert_int_equal(st_tok_cp_byte(st_tok_byte_cp((uint8_t)b)), b);
    assert_int_equal(st_tok_byte_cp(' '), 0x120);
    assert_int_equal(st_tok_byte_cp('\n'), 0x10A);
    assert_int_equal(st_tok_byte_cp(0xAD), 0x143);
    assert_int_equal(st_tok_cp_byte(0x144), -1);
}

/* ---- malformed vocabularies: hand-built GGUF bytes ---- */

typedef struct gbuf {
    uint8_t *p;
    size_t n, cap;
    int64_t n_kv;
} gbuf;

static void gb_put(gbuf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void gb_u32(gbuf *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(gbuf *b, uint64_t v) { gb_put(b, &v, 8); }
static void gb_s(gbuf *b, const char *s) {
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}
static void gb_begin(gbuf *b) {
    memset(b, 0, sizeof *b);
    gb_put(b, "GGUF", 4);
    gb_u32(b, 3);
    gb_u64(b, 0); /* tensors */
    gb_u64(b, 0); /* kv count, patched by gb_open */
}
static void kv_str(gbuf *b, const char *k, const char *v) {
    gb_s(b, k);
    gb_u32(b, ST_GGUF_STRING);
    gb_s(b, v);
    b->n_kv++;
}
static void kv_u32(gbuf *b, const char *k, uint32_t v) {
    gb_s(b, k);
    gb_u32(b, ST_GGUF_UINT32);
    gb_u32(b, v);
    b->n_kv++;
}
static void kv_strs(gbuf *b, const char *k, const char *const *v, int n) {
    gb_s(b, k);
    gb_u32(b, ST_GGUF_ARRAY);
    gb_u32(b, ST_GGUF_STRING);
    gb_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++)
        gb_s(b, v[i]);
    b->n_kv++;
}
static void kv_i32s(gbuf *b, const char *k, const int32_t *v, int n) {
    gb_s(b, k);
    gb_u32(b, ST_GGUF_ARRAY);
    gb_u32(b, ST_GGUF_INT32);
    gb_u64(b, (uint64_t)n);
    gb_put(b, v, 4 * (size_t)n);
    b->n_kv++;
}
static void kv_f32s(gbuf *b, const char *k, const float *v, int n) {
    gb_s(b, k);
    gb_u32(b, ST_GGUF_ARRAY);
    gb_u32(b, ST_GGUF_FLOAT32);
    gb_u64(b, (uint64_t)n);
    gb_put(b, v, 4 * (size_t)n);
    b->n_kv++;
}

/* Loads the built file; returns the status and leaves the tokenizer (or NULL) in *t. */
static st_status gb_load(gbuf *b, st_tokenizer **t) {
    memcpy(b->p + 16, &b->n_kv, 8);
    st_gguf *g = NULL;
    st_status s = st_gguf_open_memory(b->p, b->n, "bad.gguf", &g);
    if (s != ST_OK)
        fail_msg("the test GGUF itself is broken: %s", st_last_error());
    s = st_tokenizer_load(g, t);
    st_gguf_free(g);
    free(b->p);
    b->p = NULL;
    return s;
}

static const char *const mini_tokens[] = {"<unk>",
                                          "<s>",
                                          "</s>",
                                          "\xE2\x96\x81",
                                          "a",
                                          "b",
                                          "\xE2\x96\x81"
                                          "a",
                                          "ab"};
static const float mini_scores[] = {0, 0, 0, -1, -2, -3, -4, -5};

static void expect_error(gbuf *b, st_status want, const char *needle) {
    st_tokenizer *t = (st_tokenizer *)1;
    st_status s = gb_load(b, &t);
    assert_int_equal(s, want);
    assert_null(t);
    if (!strstr(st_last_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\"", st_last_error(), needle);
    assert_non_null(strstr(st_last_error(), "bad.gguf"));
}

static void test_bad_vocab(void **state) {
    (void)state;
    gbuf b;

    gb_begin(&b); /* no tokenizer at all */
    kv_str(&b, "general.architecture", "llama");
    expect_error(&b, ST_ERR_FORMAT, "tokenizer.ggml.model");

    gb_begin(&b);
    kv_str(&b, "tokenizer.ggml.model", "bert");
    kv_strs(&b, "tokenizer.ggml.tokens", mini_tokens, 8);
    expect_error(&b, ST_ERR_UNSUPPORTED, "bert");

    gb_begin(&b);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    expect_error(&b, ST_ERR_FORMAT, "tokenizer.ggml.tokens");

    gb_begin(&b); /* tokens of the wrong type */
    const int32_t ints[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_i32s(&b, "tokenizer.ggml.tokens", ints, 8);
    expect_error(&b, ST_ERR_FORMAT, "array of strings, found array of int32");

    gb_begin(&b);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_str(&b, "tokenizer.ggml.tokens", "abc");
    expect_error(&b, ST_ERR_FORMAT, "found string");

    gb_begin(&b); /* model of the wrong type */
    kv_u32(&b, "tokenizer.ggml.model", 7);
    expect_error(&b, ST_ERR_FORMAT, "tokenizer.ggml.model");

    gb_begin(&b); /* BOS outside the vocabulary */
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", mini_tokens, 8);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 8);
    expect_error(&b, ST_ERR_FORMAT, "bos_token_id = 8 is outside the vocabulary");

    gb_begin(&b);
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", mini_tokens, 8);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", 1000000);
    expect_error(&b, ST_ERR_FORMAT, "eos_token_id");

    gb_begin(&b); /* BOS of the wrong type */
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", mini_tokens, 8);
    kv_str(&b, "tokenizer.ggml.bos_token_id", "1");
    expect_error(&b, ST_ERR_FORMAT, "bos_token_id");

    gb_begin(&b); /* scores of the wrong length */
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", mini_tokens, 8);
    kv_f32s(&b, "tokenizer.ggml.scores", mini_scores, 7);
    expect_error(&b, ST_ERR_FORMAT, "tokenizer.ggml.scores has 7 entries");

    gb_begin(&b); /* token types as strings */
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", mini_tokens, 8);
    kv_strs(&b, "tokenizer.ggml.token_type", mini_tokens, 8);
    expect_error(&b, ST_ERR_FORMAT, "tokenizer.ggml.token_type must be a numeric array");

    static const char *const bpe_tokens[] = {"a", "b", "ab", "\xC4\xA0",
                                             "\xC4\xA0"
                                             "a"};
    gb_begin(&b); /* gpt2 without merges */
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_strs(&b, "tokenizer.ggml.tokens", bpe_tokens, 5);
    expect_error(&b, ST_ERR_FORMAT, "tokenizer.ggml.merges");

    gb_begin(&b); /* a merge that is not two pieces */
    static const char *const bad_merges[] = {"a b", "ab"};
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_strs(&b, "tokenizer.ggml.tokens", bpe_tokens, 5);
    kv_strs(&b, "tokenizer.ggml.merges", bad_merges, 2);
    expect_error(&b, ST_ERR_FORMAT, "tokenizer.ggml.merges[1]");

    gb_begin(&b);
    static const char *const merges[] = {"a b", "\xC4\xA0 a"};
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_str(&b, "tokenizer.ggml.pre", "no-such-pre");
    kv_strs(&b, "tokenizer.ggml.tokens", bpe_tokens, 5);
    kv_strs(&b, "tokenizer.ggml.merges", merges, 2);
    expect_error(&b, ST_ERR_UNSUPPORTED, "no-such-pre");

    /* defined results: merges naming unknown pieces are ignored; a byte with no piece is
     * dropped (no unk); BOS 0xFFFFFFFF means none */
    gb_begin(&b);
    static const char *const odd_merges[] = {"x y", "a b", "b zz", "\xC4\xA0 a", "a a"};
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_str(&b, "tokenizer.ggml.pre", "llama-bpe");
    kv_strs(&b, "tokenizer.ggml.tokens", bpe_tokens, 5);
    kv_strs(&b, "tokenizer.ggml.merges", odd_merges, 5);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 0xFFFFFFFFu);
    st_tokenizer *t = NULL;
    assert_int_equal(gb_load(&b, &t), ST_OK);
    assert_int_equal(st_tokenizer_bos(t), -1);
    int32_t ids[8];
    int64_t n;
    assert_int_equal(st_tokenize(t, "ab a", 4, 0, ids, 8, &n), ST_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 4);
    assert_int_equal(st_tokenize(t, "aq", 2, 0, ids, 8, &n), ST_OK);
    assert_int_equal(n, 1);
    assert_int_equal(st_tokenize(t, "a", 1, 1, ids, 8, &n), ST_ERR_INVALID);
    st_tokenizer_free(t);

    /* ignore_merges (llama-bpe): a part that is a piece is emitted whole, even where the merges
     * cannot build it; other pre-tokenizers merge */
    static const char *const ign_tokens[] = {"a", "b", "c", "ab", "abc"};
    static const char *const ign_merges[] = {"a b"};
    for (int llama3 = 0; llama3 < 2; llama3++) {
        gb_begin(&b);
        kv_str(&b, "tokenizer.ggml.model", "gpt2");
        kv_str(&b, "tokenizer.ggml.pre", llama3 ? "llama-bpe" : "gpt-2");
        kv_strs(&b, "tokenizer.ggml.tokens", ign_tokens, 5);
        kv_strs(&b, "tokenizer.ggml.merges", ign_merges, 1);
        assert_int_equal(gb_load(&b, &t), ST_OK);
        assert_int_equal(st_tokenize(t, "abc", 3, 0, ids, 8, &n), ST_OK);
        if (llama3) {
            assert_int_equal(n, 1);
            assert_int_equal(ids[0], 4);
            assert_true(st_tokenizer_add_bos_default(t));
        } else {
            assert_int_equal(n, 2);
            assert_int_equal(ids[0], 3);
            assert_int_equal(ids[1], 2);
            assert_false(st_tokenizer_add_bos_default(t));
        }
        st_tokenizer_free(t);
    }

    /* a minimal SPM vocabulary with a user-defined token */
    gb_begin(&b);
    static const char *const spm_tokens[] = {"<unk>",
                                             "<s>",
                                             "</s>",
                                             "\xE2\x96\x81",
                                             "a",
                                             "b",
                                             "\xE2\x96\x81"
                                             "a",
                                             "<|u|>"};
    const int32_t types[8] = {2, 3, 3, 1, 1, 1, 1, 4};
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", spm_tokens, 8);
    kv_f32s(&b, "tokenizer.ggml.scores", mini_scores, 8);
    kv_i32s(&b, "tokenizer.ggml.token_type", types, 8);
    assert_int_equal(gb_load(&b, &t), ST_OK);
    assert_int_equal(st_tokenize(t, "a<|u|>ab", 8, 1, ids, 8, &n), ST_OK);
    const int32_t want[] = {1, 6, 7, 6, 5};
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want, sizeof want);
    assert_int_equal(st_tokenize(t, "c", 1, 0, ids, 8, &n), ST_OK); /* no byte pieces: unk */
    assert_int_equal(n, 2);
    assert_int_equal(ids[1], 0);
    st_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_llama_spm), cmocka_unit_test(test_vectors_gpt2),
        cmocka_unit_test(test_roundtrip_spm),     cmocka_unit_test(test_roundtrip_gpt2),
        cmocka_unit_test(test_detok_stream),      cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_api_edges),         cmocka_unit_test(test_tokenize_max),
        cmocka_unit_test(test_invalid_utf8),      cmocka_unit_test(test_speed),
        cmocka_unit_test(test_pre_splits),        cmocka_unit_test(test_bad_vocab),
        cmocka_unit_test(test_unicode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
