/*
 * test_memory.c: memory follows what is used. A session's KV cache is sized for its context but
 * committed only as tokens use it (a 131072-position session over stories260K must not take the
 * 168 MB its full KV cache would); the default context is capped at ST_DEFAULT_N_CTX; a context
 * beyond the machine's memory is refused at creation with the estimate.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/model.h"
#include "testutil.h"

static st_model *model;

static int setup(void **state) {
    (void)state;
    return st_model_load(tu_data("models/stories260K.gguf"), &model) == ST_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    st_model_free(model);
    return 0;
}

/* Resident bytes of this process (/proc/self/statm). */
static size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    if (!f || fscanf(f, "%ld %ld", &size, &resident) != 2)
        fail_msg("cannot read /proc/self/statm");
    fclose(f);
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

static void test_kv_committed_as_used(void **state) {
    (void)state;
    const st_model_hparams *hp = st_model_get_hparams(model);
    st_session_params p = st_session_default_params();
    p.n_ctx = 131072;
    p.n_threads = 1;
    const size_t full_kv = (size_t)hp->n_layer * (size_t)p.n_ctx * (size_t)hp->n_head_kv *
                           (size_t)hp->head_dim * sizeof(float) * 2;
    assert_true(full_kv > ((size_t)150 << 20));
    const size_t before = rss_bytes();
    st_session *s;
    assert_int_equal(st_session_create(model, &p, &s), ST_OK);
    int32_t toks[64];
    for (int i = 0; i < 64; i++)
        toks[i] = 1 + (i * 37) % 500;
    float *logits = malloc((size_t)hp->n_vocab * sizeof(float));
    assert_int_equal(st_session_eval(s, 0, toks, 64, logits, 1), ST_OK);
    const size_t grown = rss_bytes() - before;
    /* weights are already resident; what grows is scratch plus 64 tokens of KV */
    assert_true(grown < full_kv / 8);
    free(logits);
    st_session_free(s);
}

static void test_default_context_capped(void **state) {
    (void)state;
    st_model_hparams saved = model->hp;
    model->hp.n_ctx_train = 131072; /* a model that declares a long context */
    st_session *s;
    assert_int_equal(st_session_create(model, NULL, &s), ST_OK);
    assert_int_equal(st_session_get_params(s)->n_ctx, ST_DEFAULT_N_CTX);
    assert_int_equal(st_model_default_ctx(model), ST_DEFAULT_N_CTX);
    st_session_free(s);
    model->hp = saved;
    /* a shorter trained context is kept */
    assert_int_equal(st_session_create(model, NULL, &s), ST_OK);
    assert_int_equal(st_session_get_params(s)->n_ctx, saved.n_ctx_train);
    st_session_free(s);
}

static void test_too_large_refused(void **state) {
    (void)state;
    st_session_params p = st_session_default_params();
    p.n_ctx = 1 << 24;
    p.n_seq = 64; /* 64 x 21 GB of KV: more than any machine this runs on */
    p.n_threads = 1;
    st_session *s = NULL;
    assert_int_equal(st_session_create(model, &p, &s), ST_ERR_NOMEM);
    assert_null(s);
    assert_non_null(strstr(st_last_error(), "GB"));
    assert_non_null(strstr(st_last_error(), "this machine has"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_committed_as_used),
        cmocka_unit_test(test_default_context_capped),
        cmocka_unit_test(test_too_large_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
