/*
 * test_example.c: the usage example at the top of include/spectree.h, compiled as printed
 * (tests/example/extract.py copies it out at build time) and run on stories260K. Its text
 * must equal plain greedy decoding of the same prompt, which the test computes itself.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "spectree.h"
#include "testutil.h"

int example(const char *path);
#include "example_from_header.c"

typedef struct text {
    char buf[8192];
    size_t n;
    st_detok d;
} text;

static int collect(void *user, int32_t token) {
    text *t = user;
    size_t n;
    if (st_detok_push(&t->d, token, t->buf + t->n, sizeof t->buf - t->n, &n) == ST_OK)
        t->n += n;
    return 0;
}

static void test_header_example(void **state) {
    (void)state;
    const char *path = tu_data("models/stories260K.gguf");
    /* the example's stdout, captured in a file */
    char out_path[] = "/tmp/st_example_XXXXXX";
    int fd = mkstemp(out_path);
    assert_true(fd >= 0);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    assert_true(dup2(fd, STDOUT_FILENO) >= 0);
    int rc = example(path);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    close(fd);
    assert_int_equal(rc, 0);
    size_t got_n = 0;
    char *got = tu_read_file(out_path, &got_n);
    unlink(out_path);
    assert_non_null(got);
    /* plain greedy decoding of the same prompt, no speculation */
    st_model *m;
    assert_int_equal(st_model_load(path, &m), ST_OK);
    int32_t ids[256];
    int64_t n_ids;
    assert_int_equal(
        st_tokenize(st_model_tokenizer(m), "Once upon a time", 16, 1, ids, 256, &n_ids), ST_OK);
    st_gen_params gp = st_gen_default_params();
    gp.n_predict = 64;
    gp.sampler.temp = 0.0f;
    text *want = calloc(1, sizeof *want);
    st_detok_init(&want->d, st_model_tokenizer(m));
    st_detok_set_prev(&want->d, ids[n_ids - 1]);
    assert_int_equal(st_generate(m, ids, n_ids, &gp, collect, want, NULL), ST_OK);
    st_model_free(m);
    assert_true(want->n > 100);
    assert_int_equal(got_n, want->n);
    assert_memory_equal(got, want->buf, want->n);
    free(got);
    free(want);
    /* and a missing model is an error with a message, not a crash */
    assert_int_equal(example("/nonexistent/model.gguf"), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_header_example)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
