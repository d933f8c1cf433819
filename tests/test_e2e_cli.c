/*
 * test_e2e_cli.c: the `spectree` command as a user runs it.
 * - generate: the greedy continuation of "Once upon a time" is llama2.c's run.c text (its
 *   test_all.py expected output), speculative runs print the same text, --json has its keys,
 *   --stop cuts the text before the stop string.
 * - tokenize works on vocabulary-only files; info prints metadata and tensors.
 * - Bad arguments and files: a one-line message on stderr and a non-zero exit, no crash.
 */
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
#include <sys/wait.h>

static const char *golden =
    ", there was a little girl named Lily. She loved to play outside in the park. One day, she "
    "saw a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said, "
    "\"Lily, let's go to the park.\" Lily was sad and didn't know what to do. She said, \"I want "
    "to play with your ball, but I can't find it.\"\nLily was sad and didn't know what to do. She "
    "said, \"I'm sorry, Lily. I didn't know what to do.\"\nLily didn't want to help her mom, so "
    "she";

typedef struct result {
    int code;
    char *out, *err;
} result;

/* Runs `spectree ARGS` through the shell, capturing stdout and stderr in files. */
static result run(const char *args) {
    char cmd[8192], fo[512], fe[512];
    snprintf(fo, sizeof fo, "%s/cli_test.out", ST_BUILD_DIR);
    snprintf(fe, sizeof fe, "%s/cli_test.err", ST_BUILD_DIR);
    snprintf(cmd, sizeof cmd, "%s/spectree %s >%s 2>%s </dev/null", ST_BUILD_DIR, args, fo, fe);
    int st = system(cmd);
    result r = {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), NULL, NULL};
    r.out = tu_read_file(fo, NULL);
    r.err = tu_read_file(fe, NULL);
    assert_non_null(r.out);
    assert_non_null(r.err);
    return r;
}

static void done(result *r) {
    free(r->out);
    free(r->err);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void test_generate_golden(void **state) {
    (void)state;
    char args[2048];
    const char *algos[] = {
        "--speculative-algorithm NONE",
        "--speculative-algorithm NGRAM",
        "--speculative-algorithm NGRAM --speculative-eagle-topk 2 --speculative-num-steps 4 "
        "--speculative-num-draft-tokens 8 --attention-backend dense",
        "--speculative-algorithm STANDALONE --speculative-draft-model-path %s "
        "--speculative-eagle-topk 1 --speculative-num-steps 3",
        "--speculative-algorithm EAGLE --speculative-draft-model-path %s "
        "--speculative-eagle-topk 2 --speculative-num-steps 3",
    };
    /* a random EAGLE-1 head for stories260K in the published layout */
    char head[1024];
    snprintf(head, sizeof head, "%s/cli_eagle_head", ST_BUILD_DIR);
    const tu_head h = {.n_embd = 64,
                       .n_vocab = 512,
                       .n_head = 8,
                       .n_head_kv = 4,
                       .n_ff = 96,
                       .dtype = ST_SF_F16,
                       .seed = 3,
                       .scale = 1.0f};
    assert_int_equal(tu_write_eagle_head(head, &h), 0);
    for (int i = 0; i < 5; i++) {
        char alg[1024];
        snprintf(alg, sizeof alg, algos[i], i == 4 ? head : tu_shared("models/stories260K.gguf"));
        snprintf(args, sizeof args,
                 "generate -m %s -p 'Once upon a time' -n 199 --temp 0 --json -t 2 %s",
                 tu_shared("models/stories260K.gguf"), alg);
        result r = run(args);
        assert_int_equal(r.code, 0);
        size_t lg = strlen(golden);
        if (strncmp(r.out, golden, lg) != 0)
            fail_msg("config %d printed:\n%s", i, r.out);
        assert_non_null(strstr(r.err, "\"prompt_tokens\": 5"));
        assert_non_null(strstr(r.err, "\"gen_tokens\": 199"));
        assert_non_null(strstr(r.err, "\"prompt_tok_s\""));
        assert_non_null(strstr(r.err, "\"gen_tok_s\""));
        assert_non_null(strstr(r.err, "\"tau\""));
        done(&r);
    }
}

static void test_stop_and_tokenize(void **state) {
    (void)state;
    char args[2048];
    snprintf(args, sizeof args,
             "generate -m %s -p 'Once upon a time' -n 100 --temp 0 --stop 'red ball' "
             "--speculative-algorithm NGRAM",
             tu_shared("models/stories260K.gguf"));
    result r = run(args);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, ", there was a little girl named Lily. She loved to play outside "
                               "in the park. One day, she saw a big, \n");
    done(&r);
    snprintf(args, sizeof args, "tokenize -m %s --add-bos 'Once upon a time'",
             tu_shared("models/stories260K.gguf"));
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "1 403 407 261 378\n");
    done(&r);
    snprintf(args, sizeof args, "tokenize -m %s ' Hello world'",
             tu_shared("vectors/tokenizer/ggml-vocab-gpt-2.gguf"));
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "18435 995\n");
    done(&r);
    snprintf(args, sizeof args, "info -m %s", tu_shared("models/stories260K.gguf"));
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "blk.4.ffn_up.weight"));
    assert_non_null(strstr(r.out, "n_head_kv 4"));
    done(&r);
}

static void test_bad_usage(void **state) {
    (void)state;
    const char *m = tu_shared("models/stories260K.gguf");
    char cases[][1024] = {
        "",
        "frobnicate",
        "generate",
        "generate -m %s",
        "generate -m /nonexistent.gguf -p hi",
        "generate -m %s -p hi -n -5",
        "generate -m %s -p hi -n abc",
        "generate -m %s -p hi --temp -1",
        "generate -m %s -p hi --top-p 2",
        "generate -m %s -p hi --bogus",
        "generate -m %s -p hi --speculative-algorithm MAGIC",
        "generate -m %s -p hi --speculative-algorithm EAGLE",
        "generate -m %s -p hi --speculative-algorithm EAGLE3",
        "generate -m %s -p hi --speculative-algorithm EAGLE --speculative-draft-model-path /tmp",
        "generate -m %s -p hi --speculative-algorithm NGRAM --speculative-draft-model-path /tmp",
        "generate -m %s -p hi --speculative-algorithm STANDALONE",
        "generate -m %s -p hi --speculative-algorithm NGRAM --speculative-num-steps 0",
        "generate -m %s -p hi --speculative-algorithm NGRAM --speculative-eagle-topk 2 "
        "--speculative-num-steps 2 --speculative-num-draft-tokens 64",
        "generate -m %s -p hi --attention-backend flash",
        "generate -m %s -p hi --speculative-algorithm STANDALONE "
        "--speculative-draft-model-path /nonexistent.gguf",
        "generate -m %s -p hi -c 2",
        "tokenize -m %s",
        "tokenize -m /etc/passwd hi",
        "info",
        "info -m /dev/null",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[2048];
        snprintf(args, sizeof args, cases[i], m);
        result r = run(args);
        if (r.code == 0 || r.code >= 128 || count_lines(r.err) < 1 || strlen(r.err) < 10)
            fail_msg("'spectree %s': exit %d, stderr:\n%s", args, r.code, r.err);
        /* one line, except the usage summary of a bare `spectree` */
        if (i > 0 && count_lines(r.err) != 1)
            fail_msg("'spectree %s': expected one line on stderr, got:\n%s", args, r.err);
        done(&r);
    }
    /* --help everywhere */
    const char *helps[] = {"--help", "generate --help", "tokenize --help", "info --help"};
    for (size_t i = 0; i < 4; i++) {
        result r = run(helps[i]);
        assert_int_equal(r.code, 0);
        assert_non_null(strstr(r.out, "usage"));
        done(&r);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_golden),
        cmocka_unit_test(test_stop_and_tokenize),
        cmocka_unit_test(test_bad_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
