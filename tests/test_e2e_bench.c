/*
 * test_e2e_bench.c: `spectree-bench e2e` as an honest benchmark, on stories260K.
 * - A normal run exits 0 and reports plain and speculative tok/s beside the speed-up, greedy and
 *   sampled, and says how many speculative runs it found token-identical to plain decoding;
 *   with an EAGLE head, the cost of one draft level in plain-token times.
 * - The token check fails loudly: the engine is lossless by construction, so no drafter can make
 *   its output differ; --debug-corrupt-spec alters the speculative runs' record instead, and the
 *   run must exit 3 with a MISMATCH line naming the drafter, shape, prompt, position and both
 *   tokens (the plain one as st_generate emits it), and print no figure for those runs.
 * - --sweep measures every shape at least 3 times, interleaved with plain runs, and prints the
 *   repetitions it used; --sweep-reps raises them and refuses fewer than 3.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "spectree.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Runs `spectree-bench e2e -m stories260K.gguf ARGS`. */
static tu_result bench(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "e2e -m %s -n 32 -t 1 %s", tu_data("models/stories260K.gguf"), args);
    tu_result r = tu_run("spectree-bench", cmd, "/dev/null");
    assert_non_null(r.out);
    assert_non_null(r.err);
    return r;
}

static int count(const char *s, const char *sub) {
    int n = 0;
    for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub))
        n++;
    return n;
}

static void test_reports_tok_s(void **state) {
    (void)state;
    tu_result r = bench("--reps 1");
    if (r.code != 0)
        fail_msg("exit %d:\n%s", r.code, r.err);
    assert_int_equal(count(r.out, "speculative runs token-identical to plain"), 2);
    assert_non_null(strstr(r.out, "NGRAM"));
    assert_non_null(strstr(r.out, "STANDALONE(self)"));
    assert_non_null(strstr(r.out, " tok/s  speculative "));
    assert_non_null(strstr(r.out, " tok/s  speed-up "));
    assert_null(strstr(r.err, "MISMATCH"));
    tu_result_free(&r);

    /* seeded sampling is lossless too: the check holds at a temperature */
    r = bench("--reps 2 --json --temp 0.8");
    if (r.code != 0)
        fail_msg("exit %d:\n%s", r.code, r.err);
    assert_int_equal(count(r.out, "\"plain_tok_s\": "), 2);
    assert_int_equal(count(r.out, "\"spec_tok_s\": "), 2);
    assert_int_equal(count(r.out, "\"speedup\": "), 2);
    assert_int_equal(count(r.out, "\"reps\": 2, \"spec_runs_checked\": 3}"), 2);
    assert_int_equal(count(r.out, "\"draft_level\": 0.0000, "), 2); /* (no draft model) */
    tu_result_free(&r);

    /* an EAGLE head drafting chains of 4: the time of one of its level passes, in plain-token
     * times; a drafter without a model has none */
    char args[512];
    snprintf(args, sizeof args, "--reps 1 --no-self --topk 1 --steps 4 --eagle %s",
             tu_data("models/eagle-stories260K"));
    r = bench(args);
    if (r.code != 0)
        fail_msg("exit %d:\n%s", r.code, r.err);
    const char *lv = strstr(r.out, "; a draft level ");
    assert_non_null(lv);
    assert_true(strtod(lv + strlen("; a draft level "), NULL) > 0.0);
    assert_int_equal(count(r.out, "; a draft level "), 1);
    tu_result_free(&r);
}

/* The token plain greedy decoding emits at generated position pos after "Once upon a time". */
static int32_t plain_token(int64_t pos) {
    st_model *m = NULL;
    assert_int_equal(st_model_load(tu_data("models/stories260K.gguf"), &m), ST_OK);
    const st_tokenizer *tok = st_model_tokenizer(m);
    int32_t ids[64];
    int64_t n_ids = 0;
    const char *text = "Once upon a time";
    assert_int_equal(
        st_tokenize(tok, text, strlen(text), st_tokenizer_add_bos_default(tok), ids, 64, &n_ids),
        ST_OK);
    st_gen_params gp = st_gen_default_params();
    gp.n_predict = 32;
    gp.sampler.temp = 0.0f;
    gp.n_threads = 1;
    tu_toks k = {.n = 0};
    assert_int_equal(st_generate(m, ids, n_ids, &gp, tu_keep, &k, NULL), ST_OK);
    assert_true(pos < k.n);
    st_model_free(m);
    return k.t[pos];
}

static void test_corrupted_spec_fails(void **state) {
    (void)state;
    tu_result r = bench("--reps 1 --sweep --shapes 1/2/3 --debug-corrupt-spec 7");
    if (r.code != 3)
        fail_msg("exit %d, expected 3:\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    /* every speculative configuration fails at its first run, and none prints a figure */
    assert_int_equal(count(r.err, "MISMATCH: "), 4);
    assert_non_null(strstr(r.err, "MISMATCH: NGRAM, shape auto, prompt 1 (\"Once upon a time\"), "
                                  "warm-up: the speculative run emitted token "));
    assert_non_null(strstr(r.err, "MISMATCH: NGRAM, shape 1/2/3, prompt 1"));
    assert_non_null(strstr(r.err, "MISMATCH: STANDALONE(self), shape auto, prompt 1"));
    assert_non_null(strstr(r.err, "MISMATCH: STANDALONE(self), shape 1/2/3, prompt 1"));
    assert_non_null(strstr(r.err, "--debug-corrupt-spec altered this run's record"));
    assert_non_null(strstr(r.err, "FAILED: 4 configurations emitted tokens that differ"));
    assert_null(strstr(r.out, "speed-up"));
    assert_null(strstr(r.out, "best fixed"));
    /* both tokens named: the plain one as st_generate emits it, the altered one beside it */
    int spec = -1, plain = -1, pos = -1;
    const char *msg = strstr(r.err, "the speculative run emitted token ");
    assert_non_null(msg);
    assert_int_equal(sscanf(msg,
                            "the speculative run emitted token %d at generated position %d "
                            "(0-based; 32 tokens in all) where the reference plain run emitted "
                            "token %d",
                            &spec, &pos, &plain),
                     3);
    assert_int_equal(pos, 7);
    assert_int_equal(plain, plain_token(7));
    assert_int_equal(spec, (plain + 1) % 512);
    tu_result_free(&r);

    /* a position no run reaches alters nothing: the check passes */
    r = bench("--reps 1 --no-self --debug-corrupt-spec 32");
    assert_int_equal(r.code, 0);
    assert_null(strstr(r.err, "MISMATCH"));
    tu_result_free(&r);
}

static void test_sweep_reps(void **state) {
    (void)state;
    /* --reps 1 is raised to 3 under --sweep, for auto and every shape */
    tu_result r = bench("--reps 1 --no-self --sweep --shapes 1/2/3,2/3/6");
    if (r.code != 0)
        fail_msg("exit %d:\n%s", r.code, r.err);
    assert_int_equal(count(r.out, "; reps 3; 4 speculative runs token-identical to plain)"), 3);
    assert_non_null(strstr(r.out, "NGRAM                        1/2/3 "));
    assert_non_null(strstr(r.out, "NGRAM                        2/3/6 "));
    assert_non_null(strstr(r.out, "NGRAM                        best fixed K/S/N "));
    assert_non_null(strstr(r.out, "(3 reps auto, 3 per shape)"));
    assert_non_null(strstr(r.out, " tok/s (plain "));
    tu_result_free(&r);

    r = bench("--reps 1 --no-self --shapes 1/2/3 --sweep-reps 4 --json");
    if (r.code != 0)
        fail_msg("exit %d:\n%s", r.code, r.err);
    assert_non_null(strstr(r.out, "\"shape\": \"auto\""));
    assert_non_null(strstr(r.out, "\"reps\": 3, \"spec_runs_checked\": 4}"));
    assert_non_null(strstr(r.out, "\"shape\": \"1/2/3\""));
    assert_non_null(strstr(r.out, "\"reps\": 4, \"spec_runs_checked\": 5}"));
    assert_non_null(strstr(r.out, "\"best_fixed\": \"1/2/3\""));
    assert_non_null(strstr(r.out, "\"best_fixed_spec_tok_s\": "));
    assert_non_null(strstr(r.out, "\"auto_spec_tok_s\": "));
    assert_non_null(strstr(r.out, "\"reps\": 3, \"sweep_reps\": 4}"));
    tu_result_free(&r);

    r = bench("--sweep --sweep-reps 2");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "--sweep-reps must be an integer in 3..64; got '2'"));
    tu_result_free(&r);
    r = bench("--shapes 1/2");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "--shapes takes up to 16 K/S/N"));
    tu_result_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reports_tok_s),
        cmocka_unit_test(test_corrupted_spec_fails),
        cmocka_unit_test(test_sweep_reps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
