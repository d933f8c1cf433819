/*
 * test_e2e_robust.c: the hardening issue's two whole-program checks, kept in the suite.
 * - 120 mutations of stories260K.gguf (bytes changed in the header, words set to huge or
 *   negative values, truncations, NaN and garbage in the weights): each is refused with a
 *   message or loads, and a model that loads generates or fails with a message; never a crash
 *   (the suite also runs under ASan+UBSan).
 * - 480 generations: 10 prompts x {plain, NGRAM, STANDALONE, EAGLE} x {1, 2 threads} x {greedy,
 *   seeded sampling} x 3 repeats. For each prompt and sampler, all 24 runs emit the same tokens.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "io/gguf_internal.h"
#include "spectree.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct tokens {
    int32_t t[64];
    int n;
} tokens;

static int record(void *user, int32_t tok) {
    tokens *r = user;
    if (r->n < 64)
        r->t[r->n++] = tok;
    return 0;
}

enum { N_MUTATIONS = 120 };

/* Mutation i of the file image `buf` (in place); returns the size to load. */
static size_t mutate(uint8_t *buf, size_t size, size_t data_off, int i, uint64_t *seed) {
    const size_t header = data_off;
    switch (i / 20) {
    case 0: /* one header byte set to a random value */
        buf[rng(seed) % header] = (uint8_t)rng(seed);
        return size;
    case 1: { /* an aligned header word set to a huge, negative or small value */
        const uint64_t vals[] = {UINT64_MAX, 1ULL << 40, 1ULL << 31, (uint64_t)-2, 0, 7};
        size_t at = (rng(seed) % (header - 8)) & ~(size_t)3;
        uint64_t v = vals[rng(seed) % 6];
        memcpy(buf + at, &v, 8);
        return size;
    }
    case 2: /* truncated anywhere */
        return (size_t)(rng(seed) % size);
    case 3: /* eight random header bytes in a row */
        for (size_t at = rng(seed) % (header - 8), k = 0; k < 8; k++)
            buf[at + k] = (uint8_t)rng(seed);
        return size;
    case 4: { /* a NaN, an infinity or a huge value among the weights */
        const float vals[] = {NAN, INFINITY, -INFINITY, 3e38f};
        float v = vals[i % 4];
        size_t at = data_off + ((rng(seed) % (size - data_off - 4)) & ~(size_t)3);
        memcpy(buf + at, &v, 4);
        return size;
    }
    default: /* a run of random bytes among the weights */
        for (size_t at = data_off + rng(seed) % (size - data_off - 256), k = 0; k < 256; k++)
            buf[at + k] = (uint8_t)rng(seed);
        return size;
    }
}

static void test_mutations(void **state) {
    (void)state;
    size_t size;
    uint8_t *orig = (uint8_t *)tu_read_file(tu_data("models/stories260K.gguf"), &size);
    assert_non_null(orig);
    st_gguf *g;
    assert_int_equal(st_gguf_open_memory(orig, size, "orig", &g), ST_OK);
    const size_t data_off = st_gguf_data_offset(g);
    st_gguf_free(g);
    uint8_t *buf = malloc(size);
    assert_non_null(buf);
    uint64_t seed = 120;
    int refused = 0, ran = 0, failed_run = 0;
    for (int i = 0; i < N_MUTATIONS; i++) {
        memcpy(buf, orig, size);
        const size_t n = mutate(buf, size, data_off, i, &seed);
        st_model *m = NULL;
        st_status s = st_model_load_memory(buf, n, "mutated.gguf", &m);
        if (s != ST_OK) {
            assert_null(m);
            assert_true(strlen(st_last_error()) > 0);
            refused++;
            continue;
        }
        st_gen_params gp = st_gen_default_params();
        gp.n_predict = 8;
        gp.sampler.temp = 0.0f;
        gp.spec.algo = i % 2 ? ST_SPEC_NGRAM : ST_SPEC_NONE;
        const int32_t V = st_model_get_hparams(m)->n_vocab;
        const int32_t prompt[3] = {1, 100 % V, 200 % V};
        tokens out = {.n = 0};
        s = st_generate(m, prompt, 3, &gp, record, &out, NULL);
        if (s == ST_OK) {
            ran++;
            for (int k = 0; k < out.n; k++)
                assert_true(out.t[k] >= 0 && out.t[k] < V);
        } else {
            assert_true(strlen(st_last_error()) > 0);
            failed_run++;
        }
        st_model_free(m);
    }
    printf("mutations: %d refused at load, %d generated, %d refused while generating\n", refused,
           ran, failed_run);
    assert_int_equal(refused + ran + failed_run, N_MUTATIONS);
    assert_true(refused > 0 && ran > 0); /* both paths were exercised */
    free(buf);
    free(orig);
}

static void test_determinism(void **state) {
    (void)state;
    static const char *texts[10] = {
        "Once upon a time",
        "The little dog",
        "Lily and Ben went to the park",
        "One day, a big",
        "Tom had a red ball.",
        "The sun was shining and",
        "Mom said, \"",
        "There was a small bird who",
        "In the forest, ",
        "Sue liked to play with her",
    };
    st_model *m, *head;
    assert_int_equal(st_model_load(tu_data("models/stories260K.gguf"), &m), ST_OK);
    assert_int_equal(st_eagle_head_load(ST_SOURCE_DIR "/models/eagle-stories260K", m, &head),
                     ST_OK);
    const st_tokenizer *tok = st_model_tokenizer(m);
    const st_spec_algo algos[4] = {ST_SPEC_NONE, ST_SPEC_NGRAM, ST_SPEC_STANDALONE, ST_SPEC_EAGLE};
    int runs = 0;
    for (int p = 0; p < 10; p++) {
        int32_t prompt[64];
        int64_t np = 0;
        assert_int_equal(st_tokenize(tok, texts[p], strlen(texts[p]), 1, prompt, 64, &np), ST_OK);
        for (int sampled = 0; sampled < 2; sampled++) {
            tokens first = {.n = -1};
            for (int a = 0; a < 4; a++)
                for (int th = 1; th <= 2; th++)
                    for (int rep = 0; rep < 3; rep++) {
                        st_gen_params gp = st_gen_default_params();
                        gp.n_predict = 48;
                        gp.n_threads = th;
                        gp.sampler.temp = sampled ? 0.8f : 0.0f;
                        gp.sampler.seed = 1000 + (uint64_t)p;
                        gp.spec.algo = algos[a];
                        gp.spec.draft_model = algos[a] == ST_SPEC_EAGLE ? head : m;
                        tokens out = {.n = 0};
                        assert_int_equal(st_generate(m, prompt, np, &gp, record, &out, NULL),
                                         ST_OK);
                        runs++;
                        if (first.n < 0) {
                            first = out;
                            assert_true(out.n > 0);
                            continue;
                        }
                        if (out.n != first.n || memcmp(out.t, first.t, sizeof(int32_t) * out.n))
                            fail_msg("prompt %d %s: %s, %d threads, repeat %d differs", p,
                                     sampled ? "sampled" : "greedy", st_spec_algo_name(algos[a]),
                                     th, rep);
                    }
        }
    }
    assert_int_equal(runs, 480);
    st_model_free(head);
    st_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_determinism),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
