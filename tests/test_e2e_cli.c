/*
 * test_e2e_cli.c: the `spectree` command as a user runs it.
 * - generate: the greedy continuation of "Once upon a time" is llama2.c's run.c text (its
 *   test_all.py expected output), speculative runs print the same text, --json has its keys,
 *   --stop cuts the text before the stop string.
 * - tokenize works on vocabulary-only files, --file gives each line the ids of the line given
 *   alone, --model-bos generate's BOS; info prints metadata and tensors, tells a Hugging
 *   Face checkpoint (refused as generate refuses it) from an EAGLE head; a head given as the
 *   model or as a STANDALONE draft model is named as such.
 * - Bad arguments and files: a one-line message on stderr and a non-zero exit, no crash; every
 *   numeric flag refuses signs, blanks and garbage naming the flag; an unknown option is named;
 *   a FIFO given as the model is refused at once, a directory without config.json too.
 * - The prompt from a file (-f) or standard input (-p -), past the 128 KiB a single argument
 *   can carry.
 * - Buffers sized from the tokenizer: a vocabulary without the word-boundary piece spends three
 *   byte tokens on each space, more tokens than bytes; a model with more rows than its tokenizer
 *   has pieces generates ids without text, which are printed as U+FFFD and counted.
 * - --mmap and --no-mmap (weights copied into huge pages) print the same text, plain and
 *   speculative, greedy and sampled; --json names the load mode and time.
 * - Output that cannot be written (stdout on a full disk or closed, --json's stderr on a full
 *   disk): exit status 1 and the system's message.
 * - convert refuses to write over its checkpoint's files; convert's and spectree-mkmodel's
 *   outputs appear whole or not at all (a write cut by a file size limit keeps the old file).
 * - llama.cpp's flags and habits: -md, --draft-max, -n -1, --seed -1, its long names, GPU-only
 *   flags (and SGLang's) accepted with one warning, -ngl / -xyz never split into short options;
 *   SPECTREE_ARG_<FLAG> for the server's flags; --version; Ctrl-C in generate prints the
 *   statistics and exits 130; convert prints its progress and a summary.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "io/gguf_write.h"
#include "io/safetensors.h"
#include "spectree.h"
#include "testutil.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *golden =
    ", there was a little girl named Lily. She loved to play outside in the park. One day, she "
    "saw a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said, "
    "\"Lily, let's go to the park.\" Lily was sad and didn't know what to do. She said, \"I want "
    "to play with your ball, but I can't find it.\"\nLily was sad and didn't know what to do. She "
    "said, \"I'm sorry, Lily. I didn't know what to do.\"\nLily didn't want to help her mom, so "
    "she";

typedef tu_result result;

/* Runs `spectree ARGS` with standard input from `in`. */
static result run_in(const char *args, const char *in) {
    result r = tu_run("spectree", args, in);
    assert_non_null(r.out);
    assert_non_null(r.err);
    return r;
}

static result run(const char *args) { return run_in(args, "/dev/null"); }

static void done(result *r) { tu_result_free(r); }

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
        "--speculative-algorithm EAGLE --speculative-draft-model-path %s "
        "--speculative-draft-type q8_0 --speculative-eagle-topk 2 --speculative-num-steps 3",
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
    for (int i = 0; i < 6; i++) {
        char alg[1024];
        snprintf(alg, sizeof alg, algos[i], i >= 4 ? head : tu_data("models/stories260K.gguf"));
        snprintf(args, sizeof args,
                 "generate -m %s -p 'Once upon a time' -n 199 --temp 0 --json -t 2 %s",
                 tu_data("models/stories260K.gguf"), alg);
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

static void test_load_flags(void **state) {
    (void)state;
    const char *runs[] = {"--temp 0", "--temp 0.8 --seed 11 --speculative-algorithm NGRAM"};
    for (int i = 0; i < 2; i++) {
        char *text[2] = {NULL, NULL};
        for (int mode = 0; mode < 2; mode++) {
            char args[2048];
            snprintf(args, sizeof args,
                     "generate -m %s -p 'Once upon a time' -n 80 -t 2 --json %s %s",
                     tu_data("models/stories260K.gguf"), runs[i], mode ? "--no-mmap" : "--mmap");
            result r = run(args);
            assert_int_equal(r.code, 0);
            assert_non_null(
                strstr(r.err, mode ? "\"load_mode\": \"copy\"" : "\"load_mode\": \"mmap\""));
            assert_non_null(strstr(r.err, "\"load_s\": "));
            assert_non_null(
                strstr(r.err, mode ? "weights copy (requested)" : "weights mmap (requested)"));
            assert_true(strlen(r.out) > 100);
            text[mode] = strdup(r.out);
            done(&r);
        }
        if (strcmp(text[0], text[1]) != 0)
            fail_msg("%s: --mmap printed\n%s\n--no-mmap printed\n%s", runs[i], text[0], text[1]);
        free(text[0]);
        free(text[1]);
    }
}

/* `tokenize --file`: line i of the output is what `tokenize TEXT` prints for line i. */
static void check_tokenize_file(void) {
    char dir[] = "/tmp/st_cli_XXXXXX", path[256], args[2048];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/lines.txt", dir);
    const char *lines[] = {"Once upon a time", "", " Hello world, said the cat.", "caf\xc3\xa9 42"};
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 4; i++)
        fprintf(f, "%s\n", lines[i]);
    fclose(f);
    const char *models[] = {"models/stories260K.gguf", "tests/data/tokenizer/ggml-vocab-gpt-2.gguf",
                            "models/TinyStories-656K"};
    const char *bos[] = {"--add-bos", "--model-bos", ""};
    for (int m = 0; m < 3; m++) {
        for (int b = 0; b < 3; b++) {
            for (int stdin_ = 0; stdin_ < 2; stdin_++) {
                snprintf(args, sizeof args, "tokenize -m %s %s --file %s", tu_data(models[m]),
                         bos[b], stdin_ ? "-" : path);
                result r = run_in(args, stdin_ ? path : "/dev/null");
                if (r.code != 0)
                    fail_msg("spectree %s: exit %d: %s", args, r.code, r.err);
                assert_int_equal(count_lines(r.out), 4);
                const char *at = r.out;
                for (int i = 0; i < 4; i++) {
                    /* --model-bos is --add-bos for SentencePiece and this checkpoint, none for
                     * GPT-2 */
                    const char *one = b == 0 || (b == 1 && m != 1) ? "--add-bos" : "";
                    snprintf(args, sizeof args, "tokenize -m %s %s -- '%s'", tu_data(models[m]),
                             one, lines[i]);
                    result w = run(args);
                    assert_int_equal(w.code, 0);
                    const size_t len = strlen(w.out);
                    if (strncmp(at, w.out, len) != 0)
                        fail_msg("%s, %s, line %d: %.*s, alone %s", models[m], bos[b], i + 1,
                                 (int)(strchr(at, '\n') - at), at, w.out);
                    at += len;
                    done(&w);
                }
                done(&r);
            }
        }
    }
    remove(path);
    rmdir(dir);
}

static void test_stop_and_tokenize(void **state) {
    (void)state;
    char args[2048];
    snprintf(args, sizeof args,
             "generate -m %s -p 'Once upon a time' -n 100 --temp 0 --stop 'red ball' "
             "--speculative-algorithm NGRAM",
             tu_data("models/stories260K.gguf"));
    result r = run(args);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, ", there was a little girl named Lily. She loved to play outside "
                               "in the park. One day, she saw a big, \n");
    done(&r);
    snprintf(args, sizeof args, "tokenize -m %s --add-bos 'Once upon a time'",
             tu_data("models/stories260K.gguf"));
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "1 403 407 261 378\n");
    done(&r);
    snprintf(args, sizeof args, "tokenize -m %s ' Hello world'",
             tu_data("tests/data/tokenizer/ggml-vocab-gpt-2.gguf"));
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "18435 995\n");
    done(&r);
    check_tokenize_file();
    snprintf(args, sizeof args, "info -m %s", tu_data("models/stories260K.gguf"));
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "blk.4.ffn_up.weight"));
    assert_non_null(strstr(r.out, "n_head_kv 4"));
    done(&r);
}

static void test_bad_usage(void **state) {
    (void)state;
    const char *m = tu_data("models/stories260K.gguf");
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
        "generate -m %s -p hi --speculative-algorithm EAGLE3 "
        "--speculative-draft-model-path " ST_SOURCE_DIR "/models/eagle-stories260K",
        "info -m %s --target /nonexistent.gguf",
        "info -m " ST_SOURCE_DIR "/models --target /nonexistent.gguf",
        "info -m " ST_SOURCE_DIR "/models/eagle-stories260K --target /nonexistent.gguf",
        "generate -m %s -p hi --speculative-algorithm EAGLE --speculative-draft-model-path /tmp",
        "generate -m %s -p hi --speculative-algorithm NGRAM --speculative-draft-model-path /tmp",
        "generate -m %s -p hi --speculative-algorithm STANDALONE",
        "generate -m %s -p hi --speculative-algorithm NGRAM --speculative-num-steps 0",
        "generate -m %s -p hi --speculative-algorithm NGRAM --speculative-eagle-topk 2 "
        "--speculative-num-steps 2 --speculative-num-draft-tokens 64",
        "generate -m %s -p hi --attention-backend flash",
        "generate -m %s -p hi --speculative-draft-type q4_k",
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

/* A usage error: exit 2 and one line on stderr that contains `want`. */
static void expect_usage_error(const char *args, const char *want) {
    result r = run(args);
    if (r.code != 2 || count_lines(r.err) != 1 || !strstr(r.err, want))
        fail_msg("'spectree %s': exit %d, stderr (expected '%s'):\n%s", args, r.code, want, r.err);
    done(&r);
}

static void test_numeric_flags(void **state) {
    (void)state;
    const char *flags[] = {"-n",
                           "-t",
                           "-c",
                           "--temp",
                           "--top-k",
                           "--top-p",
                           "--min-p",
                           "--seed",
                           "--speculative-num-steps",
                           "--speculative-eagle-topk",
                           "--speculative-num-draft-tokens",
                           "--ngram-min-match",
                           "--ngram-max-match",
                           "--ngram-breadth"};
    /* strtoull took " -1" as 2^64-1; strtol/strtod skip blanks and take '+' */
    const char *values[] = {"' -1'", "-1", "' 1'", "+1", "1x", "''", "0x10", "nan", "1e999"};
    char args[2048];
    for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++)
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            if (!strcmp(values[v], "-1"))
                continue; /* refused by the range check; -n -1 and --seed -1 are llama.cpp's
                           * "until the end" and random seed (test_llama_flags) */
            snprintf(args, sizeof args, "generate -m %s -p hi %s %s",
                     tu_data("models/stories260K.gguf"), flags[f], values[v]);
            char want[256];
            snprintf(want, sizeof want, "%s expects", flags[f]);
            expect_usage_error(args, want);
        }
    /* `serve` parses the flags it shares with `generate` with the same code (tools/common/opts.c)
     */
    for (size_t f = 1; f < sizeof flags / sizeof flags[0]; f++)
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            if (!strcmp(flags[f], "-c") || !strcmp(flags[f], "--seed") || !strcmp(values[v], "-1"))
                continue; /* serve's -c is --context-length; its seeds come with requests */
            snprintf(args, sizeof args, "serve -m %s %s %s", tu_data("models/stories260K.gguf"),
                     flags[f], values[v]);
            char want[256];
            snprintf(want, sizeof want, "%s expects", flags[f]);
            expect_usage_error(args, want);
        }
    const char *more[][2] = {
        {"-ctk f17", "--cache-type-k must be f32 or f16"},
        {"--cache-type-v q8", "--cache-type-v must be f32 or f16"},
        {"--speculative-draft-type f8", "--speculative-draft-type"},
        {"--attention-backend flash", "flash"},
        {"--speculative-algorithm EAGLE", "need --speculative-draft-model-path"},
        {"--speculative-draft-model-path x", "needs --speculative-algorithm"}};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        for (int cmd = 0; cmd < 2; cmd++) {
            snprintf(args, sizeof args, "%s -m %s %s %s", cmd ? "serve" : "generate",
                     tu_data("models/stories260K.gguf"), cmd ? "" : "-p hi", more[i][0]);
            expect_usage_error(args, more[i][1]);
        }
    /* the values themselves still work */
    snprintf(args, sizeof args,
             "generate -m %s -p hi -n 3 -t 1 -c 64 --temp 0.5 --top-k 5 --top-p .9 --min-p 0 "
             "--seed 18446744073709551615",
             tu_data("models/stories260K.gguf"));
    result r = run(args);
    assert_int_equal(r.code, 0);
    done(&r);
}

static void test_option_names(void **state) {
    (void)state;
    char args[2048];
    const char *m = tu_data("models/stories260K.gguf");
    snprintf(args, sizeof args, "generate -m %s -p hi --bogus", m);
    expect_usage_error(args, "unknown option '--bogus'");
    snprintf(args, sizeof args, "generate -m %s -p hi --temperature=1", m);
    expect_usage_error(args, "unknown option '--temperature=1'");
    snprintf(args, sizeof args, "generate -m %s -x -p hi", m);
    expect_usage_error(args, "unknown option '-x'");
    snprintf(args, sizeof args, "generate -m %s -p hi --temp", m);
    expect_usage_error(args, "missing value for option '--temp'");
    snprintf(args, sizeof args, "generate -p hi -m");
    expect_usage_error(args, "missing value for option '-m'");
    expect_usage_error("tokenize --frobnicate x", "unknown option '--frobnicate'");
    expect_usage_error("tokenize -m x --file a b", "--file takes no TEXT argument");
    expect_usage_error("tokenize -m x --add-bos --model-bos t", "do not go together");
    expect_usage_error("info -q", "unknown option '-q'");
    snprintf(args, sizeof args, "generate -m %s -p hi -f %s", m, m);
    expect_usage_error(args, "not both");
}

static void test_model_not_a_file(void **state) {
    (void)state;
    char dir[] = "/tmp/st_cli_XXXXXX", fifo[256], args[1024];
    assert_non_null(mkdtemp(dir));
    snprintf(fifo, sizeof fifo, "%s/model.gguf", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(120); /* opening the FIFO used to block forever */
    const char *fmt[] = {"generate -m %s -p hi", "info -m %s", "tokenize -m %s hi",
                         "generate -m %s -p hi --speculative-algorithm STANDALONE "
                         "--speculative-draft-model-path %s"};
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof args, fmt[i], i == 3 ? tu_data("models/stories260K.gguf") : fifo,
                 fifo);
        result r = run(args);
        if (r.code != 1 || count_lines(r.err) != 1 ||
            !strstr(r.err, "model.gguf: not a regular "
                           "file (a FIFO)"))
            fail_msg("'spectree %s': exit %d, stderr:\n%s", args, r.code, r.err);
        done(&r);
    }
    alarm(0);
    snprintf(args, sizeof args, "generate -m %s -p hi", dir);
    result r = run(args);
    assert_int_equal(r.code, 1);
    /* a directory is a Hugging Face checkpoint: this one lacks config.json */
    assert_int_equal(count_lines(r.err), 1);
    assert_non_null(strstr(r.err, "config.json: cannot open"));
    done(&r);
    remove(fifo);
    /* a header cut short says so */
    size_t size = 0;
    char *bytes = tu_read_file(tu_data("models/stories260K.gguf"), &size);
    assert_non_null(bytes);
    char cut[256];
    snprintf(cut, sizeof cut, "%s/cut.gguf", dir);
    FILE *f = fopen(cut, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, 100, f), 100);
    fclose(f);
    free(bytes);
    snprintf(args, sizeof args, "info -m %s", cut);
    r = run(args);
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "cut.gguf: truncated file"));
    done(&r);
    remove(cut);
    rmdir(dir);
}

static void test_prompt_input(void **state) {
    (void)state;
    char path[512], args[2048];
    snprintf(path, sizeof path, "%s/cli_test_prompt.txt", ST_BUILD_DIR);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs("Once upon a time", f);
    fclose(f);
    const char *m = tu_data("models/stories260K.gguf");
    /* -f FILE and -p - give the continuation -p TEXT gives */
    snprintf(args, sizeof args, "generate -m %s -f %s -n 199 --temp 0", m, path);
    result r = run(args);
    assert_int_equal(r.code, 0);
    assert_int_equal(strncmp(r.out, golden, strlen(golden)), 0);
    done(&r);
    snprintf(args, sizeof args, "generate -m %s -p - -n 199 --temp 0", m);
    r = run_in(args, path);
    assert_int_equal(r.code, 0);
    assert_int_equal(strncmp(r.out, golden, strlen(golden)), 0);
    done(&r);
    /* 200 KiB: more than one argument can carry; it is read whole and tokenized (and is then
     * too long for the model's context) */
    f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 200 * 1024 / 16; i++)
        fputs("Once upon a time", f);
    fclose(f);
    snprintf(args, sizeof args, "generate -m %s -f %s -n 1", m, path);
    r = run(args);
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "tokens"));
    done(&r);
    snprintf(args, sizeof args, "generate -m %s -p - -n 1", m);
    r = run_in(args, path);
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "tokens"));
    done(&r);
    snprintf(args, sizeof args, "generate -m %s -f %s/no-such-prompt.txt", m, ST_BUILD_DIR);
    r = run(args);
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "no-such-prompt.txt: cannot open"));
    done(&r);
    remove(path);
}

/* `auto` says why it does not draft, with its estimates: the committed EAGLE heads read 0.7 of
 * stories260K's weight bytes (auto never drafts them; a fixed shape does, and says nothing);
 * NGRAM's trees there cost more plain tokens than they accept drafts (its verify is
 * compute-bound): on a short generation it backs off, and the line's numbers agree with its
 * speed-up, (1 + accepted) / verify. */
static void test_generate_why_plain(void **state) {
    (void)state;
    const char *m = tu_data("models/stories260K.gguf");
    char args[2048];
    const char *heads[][2] = {{"EAGLE", "eagle-stories260K"}, {"EAGLE3", "eagle3-stories260K"}};
    for (int h = 0; h < 2; h++) {
        for (int fixed = 0; fixed < 2; fixed++) {
            snprintf(args, sizeof args,
                     "generate -m %s -p 'Once upon a time' -n 40 --temp 0 "
                     "--speculative-algorithm %s --speculative-draft-model-path %s/models/%s%s",
                     m, heads[h][0], ST_SOURCE_DIR, heads[h][1],
                     fixed ? " --speculative-eagle-topk 1 --speculative-num-steps 2 "
                             "--speculative-num-draft-tokens 3"
                           : "");
            result r = run(args);
            assert_int_equal(r.code, 0);
            char want[256];
            snprintf(want, sizeof want,
                     "\n%s: not drafting, the draft model reads 0.7%s of the target's weight "
                     "bytes per token: speculation cannot pay here",
                     heads[h][0], h ? "0" : "1");
            if (fixed)
                assert_null(strstr(r.err, "drafting"));
            else if (!strstr(r.err, want) || !strstr(r.err, " 0 speculative steps"))
                fail_msg("no line saying why not:\n%s", r.err);
            done(&r);
        }
    }
    int backed_off = 0;
    for (int run_i = 0; run_i < 5 && !backed_off; run_i++) {
        snprintf(args, sizeof args,
                 "generate -m %s -p 'Once upon a time' -n 40 --temp 0 --speculative-algorithm "
                 "NGRAM",
                 m);
        result r = run(args);
        assert_int_equal(r.code, 0);
        const char *l = strstr(r.err, "\nNGRAM: not drafting, the best tree (");
        if (l) {
            int n = 0;
            double acc = 0, ver = 0, x = 0;
            if (sscanf(l,
                       "\nNGRAM: not drafting, the best tree (%d tokens) accepts %lf drafts for "
                       "a verify of %lf plain tokens: speculation would be %lfx here",
                       &n, &acc, &ver, &x) != 4)
                fail_msg("the line does not parse:\n%s", r.err);
            assert_true(n >= 2 && n <= 12 && acc >= 0.0 && acc <= n - 1 && ver > 0.0);
            assert_true(x < 1.03 && fabs(x - (1.0 + acc) / ver) < 0.02);
            backed_off = 1;
        }
        done(&r);
    }
    assert_true(backed_off);
}

/* No silent truncation or surprise: the stop reason on stderr and in --json, a warning when
 * the context fills, when -c exceeds the trained context, when K = 1 overrides N, and when
 * speculative flags come without an algorithm; two unseeded runs get different seeds. */
static void test_stop_reason_and_warnings(void **state) {
    (void)state;
    const char *m = tu_data("models/stories260K.gguf");
    char args[2048];
    snprintf(args, sizeof args, "generate -m %s -p 'Once upon a time' -n 100 -c 16 --temp 0 --json",
             m);
    result r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.err, "stopped: context"));
    assert_non_null(strstr(r.err, "the context (16 positions) is full"));
    assert_non_null(strstr(r.err, "\"stop_reason\": \"context\""));
    done(&r);
    snprintf(args, sizeof args, "generate -m %s -p 'Once upon a time' -n 5 --temp 0 --json", m);
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.err, "\"stop_reason\": \"length\""));
    assert_null(strstr(r.err, "warning"));
    done(&r);
    snprintf(args, sizeof args,
             "generate -m %s -p 'Once upon a time' -n 60 --temp 0 --stop 'park' --json", m);
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.err, "\"stop_reason\": \"stop\""));
    done(&r);
    snprintf(args, sizeof args, "generate -m %s -p 'Hi' -n 2 --temp 0 -c 4000", m);
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.err, "above the model's trained context"));
    done(&r);
    snprintf(args, sizeof args,
             "generate -m %s -p 'Hi' -n 2 --temp 0 --speculative-algorithm NGRAM "
             "--speculative-eagle-topk 1 --speculative-num-steps 3 "
             "--speculative-num-draft-tokens 8",
             m);
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.err, "N = S + 1 = 4"));
    done(&r);
    snprintf(args, sizeof args, "generate -m %s -p 'Hi' -n 2 --temp 0 --speculative-num-steps 3",
             m);
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.err, "no effect with --speculative-algorithm NONE"));
    done(&r);
    /* unseeded sampling: the seed has sub-second resolution */
    char seed1[64] = "", seed2[64] = "";
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "generate -m %s -p 'Hi' -n 2", m);
        r = run(args);
        assert_int_equal(r.code, 0);
        const char *sd = strstr(r.err, "seed: ");
        assert_non_null(sd);
        snprintf(i ? seed2 : seed1, sizeof seed1, "%.40s", sd);
        done(&r);
    }
    assert_string_not_equal(seed1, seed2);
}

/* How write_vocab_variant changes stories260K's tokenizer. */
enum { VOCAB_NO_SPACE_PIECE, VOCAB_CUT_300 };

/* Writes stories260K with its tokenizer changed (every other key and every tensor as they are):
 * VOCAB_NO_SPACE_PIECE renames the piece "\xE2\x96\x81" (SentencePiece's word boundary) so a
 * space falls back to its three UTF-8 byte tokens; VOCAB_CUT_300 keeps the first 300 pieces of
 * 512 while the model keeps all 512 rows. */
static void write_vocab_variant(const char *path, int mode) {
    st_gguf *g;
    assert_int_equal(st_gguf_open(tu_data("models/stories260K.gguf"), &g), ST_OK);
    st_gguf_writer *w;
    assert_int_equal(st_gguf_writer_create(&w), ST_OK);
    const int64_t kt = st_gguf_find(g, "tokenizer.ggml.tokens");
    const int64_t V = st_gguf_arr_len(g, kt), keep = mode == VOCAB_CUT_300 ? 300 : V;
    st_gguf_str *tokens = calloc((size_t)V, sizeof *tokens);
    assert_non_null(tokens);
    int renamed = 0;
    for (int64_t i = 0; i < V; i++) {
        assert_int_equal(st_gguf_arr_str(g, kt, i, &tokens[i]), ST_OK);
        if (tokens[i].len == 3 && !memcmp(tokens[i].ptr, "\xE2\x96\x81", 3) &&
            mode == VOCAB_NO_SPACE_PIECE) {
            tokens[i].ptr = "<no-word-boundary>";
            tokens[i].len = strlen(tokens[i].ptr);
            renamed++;
        }
    }
    assert_int_equal(renamed, mode == VOCAB_NO_SPACE_PIECE);
    for (int64_t i = 0; i < st_gguf_n_kv(g); i++) {
        const char *key = st_gguf_key(g, i);
        if (i == kt) {
            assert_int_equal(st_gguf_writer_add_arr_strn(w, key, tokens, keep), ST_OK);
        } else if (!strcmp(key, "tokenizer.ggml.scores") ||
                   !strcmp(key, "tokenizer.ggml.token_type")) {
            assert_int_equal(st_gguf_arr_len(g, i), V);
            assert_int_equal(st_gguf_writer_add_arr(w, key, st_gguf_arr_type(g, i),
                                                    st_gguf_arr_data(g, i), keep),
                             ST_OK);
        } else {
            assert_int_equal(st_gguf_writer_copy_kv(w, g, key), ST_OK);
        }
    }
    for (int64_t i = 0; i < st_gguf_n_tensors(g); i++) {
        const st_gguf_tensor *t = st_gguf_tensor_at(g, i);
        assert_int_equal(st_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                                   t->size, ST_GGUF_REF),
                         ST_OK);
    }
    assert_int_equal(st_gguf_writer_write_file(w, path), ST_OK);
    st_gguf_writer_free(w);
    free(tokens);
    st_gguf_free(g);
}

static int count_words(const char *s) {
    int n = 0;
    for (const char *p = s; *p; p++)
        n += (p == s || p[-1] == ' ') && *p != ' ' && *p != '\n';
    return n;
}

/* Runs `spectree ARGS REDIRECT` (REDIRECT: the shell's, of stdout or stderr); its exit status,
 * its stderr (a file) in *err unless REDIRECT sends stderr elsewhere. */
static int run_redirected(const char *args, const char *redirect, char **err) {
    char cmd[4096], fe[600];
    snprintf(fe, sizeof fe, "%s/cli_redirect_%d.err", ST_BUILD_DIR, (int)getpid());
    snprintf(cmd, sizeof cmd, "%s/spectree %s 2>%s %s </dev/null", ST_BUILD_DIR, args, fe,
             redirect);
    int st = system(cmd);
    *err = tu_read_file(fe, NULL);
    remove(fe);
    assert_non_null(*err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* 1 when path exists. */
static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* 1 when dir holds a name with ".tmp-" in it (a temporary output left behind). */
static int temporaries(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c '\\.tmp-' >/dev/null", dir);
    return system(cmd) == 0;
}

static void test_convert_outputs(void **state) {
    (void)state;
    /* convert never writes over its checkpoint; an output appears whole or not at all */
    char dir[600], cmd[2400], args[1400];
    snprintf(dir, sizeof dir, "%s/cli_convert_ck", ST_BUILD_DIR);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir,
             tu_data("models/TinyStories-656K"), dir);
    assert_int_equal(system(cmd), 0);
    char src[700];
    snprintf(src, sizeof src, "%s/model.safetensors", dir);
    size_t n_before = 0, n_after = 0;
    char *before = tu_read_file(src, &n_before);
    assert_non_null(before);
    static const struct {
        const char *out, *msg;
    } refused[] = {{"/model.safetensors", "the checkpoint's model.safetensors"},
                   {"/config.json", "the checkpoint's config.json"},
                   {"", "the checkpoint directory"},
                   {"/", "the checkpoint directory"}};
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "convert %s %s%s", dir, dir, refused[i].out);
        result r = run(args);
        if (r.code != 1 || !strstr(r.err, refused[i].msg))
            fail_msg("spectree %s: exit %d, stderr %s", args, r.code, r.err);
        done(&r);
    }
    char *after = tu_read_file(src, &n_after);
    assert_non_null(after);
    assert_true(n_after == n_before && memcmp(before, after, n_before) == 0);
    free(after);
    result r = run("convert " ST_SOURCE_DIR "/models/TinyStories-656K /dev/full");
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "/dev/full: exists and is not a regular file"));
    done(&r);
    /* a write that fails midway (a file size limit) leaves the old output as it was and no
     * temporary file; a whole one replaces it */
    char out[700];
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    FILE *f = fopen(out, "wb");
    assert_non_null(f);
    fputs("the previous output", f);
    assert_int_equal(fclose(f), 0);
    snprintf(cmd, sizeof cmd,
             "sh -c \"trap '' XFSZ; ulimit -f 64; exec '%s/spectree' convert '%s' '%s'\" "
             ">/dev/null 2>&1",
             ST_BUILD_DIR, tu_data("models/TinyStories-656K"), out);
    int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    char *kept = tu_read_file(out, NULL);
    assert_non_null(kept);
    assert_string_equal(kept, "the previous output");
    free(kept);
    assert_false(temporaries(dir));
    snprintf(args, sizeof args, "convert %s %s", tu_data("models/TinyStories-656K"), out);
    r = run(args);
    assert_int_equal(r.code, 0);
    done(&r);
    snprintf(args, sizeof args, "generate -m %s -p 'Once' -n 4 --temp 0", out);
    r = run(args);
    assert_int_equal(r.code, 0);
    done(&r);
    assert_false(temporaries(dir));
    /* spectree-mkmodel likewise, and it refuses its --vocab file as OUT */
    snprintf(cmd, sizeof cmd,
             "sh -c \"trap '' XFSZ; ulimit -f 64; exec '%s/spectree-mkmodel' '%s' --vocab '%s' "
             "--dim 64 --ff 96 --layers 8 --heads 8\" >/dev/null 2>&1",
             ST_BUILD_DIR, out, tu_data("models/stories260K.gguf"));
    size_t n_gguf = 0, n_kept = 0;
    char *gguf = tu_read_file(out, &n_gguf);
    assert_non_null(gguf);
    st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    assert_false(temporaries(dir));
    kept = tu_read_file(out, &n_kept);
    assert_non_null(kept);
    assert_true(n_kept == n_gguf && memcmp(kept, gguf, n_gguf) == 0);
    free(kept);
    free(gguf);
    snprintf(cmd, sizeof cmd,
             "'%s/spectree-mkmodel' '%s' --vocab '%s' --dim 64 --ff 96 --layers 1 --heads 8 "
             ">/dev/null 2>&1",
             ST_BUILD_DIR, out, out);
    st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    assert_true(exists(out));
    free(before);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_info_kinds(void **state) {
    (void)state;
    /* info tells a checkpoint from an EAGLE head, and refuses a checkpoint as generate does */
    char args[1400], dir[600], cmd[4096];
    snprintf(args, sizeof args, "info -m %s", tu_data("models/TinyStories-656K"));
    result r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "checkpoint: "));
    assert_non_null(strstr(r.out, "llama: n_vocab 2048, n_embd 128, n_layer 2"));
    assert_null(strstr(r.out, "EAGLE"));
    done(&r);
    snprintf(args, sizeof args, "info -m %s", tu_data("models/eagle-stories260K"));
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "EAGLE head: "));
    assert_non_null(strstr(r.out, "kind: EAGLE-1/2"));
    done(&r);
    snprintf(dir, sizeof dir, "%s/cli_info_gpt2", ST_BUILD_DIR);
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' && cp -r '%s' '%s' && sed -i 's/\"model_type\": *\"llama\"/"
             "\"model_type\": \"gpt2\"/' '%s/config.json'",
             dir, tu_data("models/TinyStories-656K"), dir, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(args, sizeof args, "info -m %s", dir);
    r = run(args);
    snprintf(args, sizeof args, "generate -m %s -p x -n 1", dir);
    result g = run(args);
    assert_int_equal(g.code, 1);
    const char *why = strstr(g.err, dir); /* the loader's message, after the command's name */
    assert_non_null(why);
    if (r.code != 1 || !strstr(r.err, why) || !strstr(why, "model_type"))
        fail_msg("info on a checkpoint generate refuses: exit %d, stdout %s, stderr %s", r.code,
                 r.out, r.err);
    assert_string_equal(r.out, "");
    done(&r);
    done(&g);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    /* an EAGLE head given as the model, or as a STANDALONE draft model, is named as such */
    const char *head = tu_data("models/eagle-stories260K");
    char head_copy[1024];
    snprintf(head_copy, sizeof head_copy, "%s", head);
    snprintf(args, sizeof args, "generate -m %s -p x -n 1", head_copy);
    r = run(args);
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "is an EAGLE head, not a model"));
    done(&r);
    snprintf(args, sizeof args,
             "generate -m %s -p x -n 1 --speculative-algorithm STANDALONE "
             "--speculative-draft-model-path %s",
             tu_data("models/stories260K.gguf"), head_copy);
    r = run(args);
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "is an EAGLE head, not a model"));
    done(&r);
}

static void test_output_errors(void **state) {
    (void)state;
    /* stdout on a full disk or closed: a non-zero exit with the system's message, for every
     * command that prints; --json's record goes to stderr, which is checked too */
    const char *model = tu_data("models/stories260K.gguf");
    char args[5][1024];
    snprintf(args[0], sizeof args[0], "generate -m %s -p 'Once upon a time' -n 300 --temp 0",
             model);
    snprintf(args[1], sizeof args[1], "generate -m %s -p 'Once' -n 3 --temp 0", model);
    snprintf(args[2], sizeof args[2], "tokenize -m %s 'Once upon a time'", model);
    snprintf(args[3], sizeof args[3], "info -m %s", model);
    snprintf(args[4], sizeof args[4], "generate --help");
    static const struct {
        const char *redirect, *msg;
    } outs[] = {{">/dev/full", "standard output: No space left on device"},
                {">&-", "standard output: Bad file descriptor"}};
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < 2; k++) {
            char *err = NULL;
            int code = run_redirected(args[i], outs[k].redirect, &err);
            if (code != 1 || !strstr(err, outs[k].msg))
                fail_msg("spectree %s %s: exit %d, stderr:\n%s", args[i], outs[k].redirect, code,
                         err);
            assert_int_equal(count_lines(strstr(err, "standard output")), 1);
            free(err);
        }
    char *err = NULL;
    char json[1200];
    snprintf(json, sizeof json, "%s --json", args[1]);
    assert_int_equal(run_redirected(json, ">/dev/null 2>/dev/full", &err), 1);
    free(err);
    assert_int_equal(run_redirected(json, ">/dev/null", &err), 0);
    free(err);
}

/* Tokenizer-sized buffers, and a model with rows past its tokenizer's tokens, which are never
 * generated. */
static void test_tokenizer_sized_buffers(void **state) {
    (void)state;
    char path[512], args[2048];
    snprintf(path, sizeof path, "%s/cli_test_nospace.gguf", ST_BUILD_DIR);
    write_vocab_variant(path, VOCAB_NO_SPACE_PIECE);
    /* 10 spaces (+ the dummy prefix) are 11 boundaries of 3 byte tokens each: 33 > 10 + 8 */
    snprintf(args, sizeof args, "tokenize -m %s '          '", path);
    result r = run(args);
    assert_int_equal(r.code, 0);
    assert_int_equal(count_words(r.out), 33);
    done(&r);
    snprintf(args, sizeof args, "generate -m %s -p '          ' -n 4 --temp 0 --json", path);
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.err, "prompt: 34 tokens")); /* with BOS */
    done(&r);
    remove(path);

    snprintf(path, sizeof path, "%s/cli_test_cut300.gguf", ST_BUILD_DIR);
    write_vocab_variant(path, VOCAB_CUT_300);
    snprintf(args, sizeof args, "generate -m %s -p 'Once upon a time' -n 60 --temp 0", path);
    r = run(args);
    assert_int_equal(r.code, 0);
    /* the model's rows past the 300 tokens are never sampled: every token has its text */
    assert_null(strstr(r.out, "\xEF\xBF\xBD"));
    assert_null(strstr(r.err, "warning"));
    assert_true(count_words(r.out) > 10);
    done(&r);
    remove(path);
}

/* Runs `spectree ARGS` with the environment variable name=value set (NULL name: none). */
static result run_env(const char *name, const char *value, const char *args) {
    if (name)
        setenv(name, value, 1);
    result r = run(args);
    if (name)
        unsetenv(name);
    return r;
}

/* Lines of s that contain `what`. */
static int count_matches(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

/* llama.cpp's flags and habits: its names of the shared flags, -md, --draft-max, -n -1,
 * --seed -1, GPU-only flags accepted with one warning, single-dash names of several letters
 * named as typed instead of split into short options, --version. */
static void test_llama_flags(void **state) {
    (void)state;
    const char *m = tu_data("models/stories260K.gguf");
    char args[4096];
    /* GPU-only flags: the golden text, and one warning naming them all */
    snprintf(args, sizeof args,
             "generate -m %s -p 'Once upon a time' -n 199 --temp 0 -ngl 99 -fa -fa on "
             "--flash-attn=auto --gpu-layers 10 --n-gpu-layers all -ngld 5 -sm row --split-mode "
             "layer -mg 0 --main-gpu 1 -ts 3,1 --mem-fraction-static 0.8 --tp-size 2 --tp 1 "
             "--dp 2 --cuda-graph-max-bs 8 --disable-cuda-graph --attention-backend flashinfer",
             m);
    result r = run(args);
    assert_int_equal(r.code, 0);
    if (strncmp(r.out, golden, strlen(golden)) != 0)
        fail_msg("with GPU flags:\n%s", r.out);
    assert_int_equal(count_matches(r.err, "warning"), 1);
    assert_non_null(strstr(r.err, "this build runs on the CPU; --n-gpu-layers, "
                                  "--n-gpu-layers-draft, --flash-attn, --split-mode, --main-gpu, "
                                  "--tensor-split, --mem-fraction-static, --tp-size, --dp-size, "
                                  "--cuda-graph-max-bs, --disable-cuda-graph, --attention-backend "
                                  "ignored"));
    done(&r);
    /* the same flags in `serve` (a missing model stops it after the flags are read) */
    r = run("serve -m /nonexistent.gguf -ngl 99 -fa --tp 2 --mem-fraction-static 0.9 "
            "--cuda-graph-max-bs 4 --disable-cuda-graph -np 2 --parallel 3");
    assert_int_equal(r.code, 1);
    assert_int_equal(count_matches(r.err, "warning"), 1);
    assert_non_null(strstr(r.err, "this build runs on the CPU; --n-gpu-layers, --flash-attn"));
    assert_non_null(strstr(r.err, "/nonexistent.gguf: cannot open"));
    done(&r);
    /* -md: a draft model, STANDALONE; --draft-max D: trees of D drafted tokens and the root;
     * llama.cpp's long names of -c, -n, -t and -s */
    snprintf(args, sizeof args,
             "generate -m %s -p 'Once upon a time' --n-predict 199 --temp 0 --json -md %s "
             "--draft-max 4 --draft-min 1 --ctx-size 512 --threads 2",
             m, m);
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_int_equal(strncmp(r.out, golden, strlen(golden)), 0);
    assert_non_null(strstr(r.err, "\"algorithm\": \"STANDALONE\""));
    assert_non_null(strstr(r.err, "\"num_draft_tokens\": 5"));
    assert_non_null(strstr(r.err, "--draft-min ignored"));
    done(&r);
    snprintf(args, sizeof args,
             "generate -m %s -p 'Once upon a time' -n 199 --temp 0 --json --model-draft %s "
             "--speculative-algorithm EAGLE3",
             m, m);
    r = run(args);
    assert_int_equal(r.code, 1); /* -md is the path of the algorithm chosen */
    done(&r);
    /* -s S is --seed S; --seed -1 is a random seed, printed */
    char *text[2];
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "generate -m %s -p 'Once upon a time' -n 40 %s 7", m,
                 i ? "--seed" : "-s");
        r = run(args);
        assert_int_equal(r.code, 0);
        text[i] = strdup(r.out);
        done(&r);
    }
    assert_string_equal(text[0], text[1]);
    free(text[0]);
    free(text[1]);
    snprintf(args, sizeof args, "generate -m %s -p 'Once upon a time' -n 4 --seed -1", m);
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.err, "seed: "));
    done(&r);
    /* -n -1: until the end of text or of the context, which is then no surprise */
    snprintf(args, sizeof args, "generate -m %s -p 'Once upon a time' -n -1 -c 40 --temp 0 --json",
             m);
    r = run(args);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.err, "\"gen_tokens\": 35"));
    assert_non_null(strstr(r.err, "stopped: context"));
    assert_null(strstr(r.err, "warning"));
    done(&r);
    /* glued values of short options still work; -p takes "-xyz" as its text */
    snprintf(args, sizeof args, "generate -m %s -p -xyz -n3 -t1 -c64 --temp 0", m);
    r = run(args);
    assert_int_equal(r.code, 0);
    done(&r);
    /* single-dash names of several letters: recognized, or named as typed */
    const char *named[][2] = {{"-np 2", "unknown option '-np'"},
                              {"-cnv", "unknown option '-cnv'"},
                              {"-xyz", "unknown option '-xyz'"},
                              {"-hx", "unknown option '-hx'"},
                              {"-ngl x", "--n-gpu-layers expects"},
                              {"-ngl", "missing value for option '--n-gpu-layers'"},
                              {"-fa maybe", "unexpected argument 'maybe'"},
                              {"--flash-attn=maybe", "--flash-attn takes on, off or auto"},
                              {"-sm diagonal", "--split-mode takes none, layer or row"},
                              {"-mg x", "--main-gpu expects"},
                              {"-ts a", "--tensor-split takes"},
                              {"--mem-fraction-static 2", "--mem-fraction-static expects"},
                              {"--tp 0", "--tp-size expects"},
                              {"--cuda-graph-max-bs x", "--cuda-graph-max-bs expects"},
                              {"--draft-max 0", "--draft-max expects"},
                              {"--draft-max 64", "--draft-max expects"},
                              {"-md", "missing value for option '--model-draft'"},
                              {"-tb x", "--threads-batch expects"},
                              {"--draft-max 2 --draft-min 3", "--draft-min is above --draft-max"},
                              {"-n -2", "-n expects"},
                              {"--seed -2", "--seed expects"}};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        snprintf(args, sizeof args, "generate -m %s -p hi %s", m, named[i][0]);
        expect_usage_error(args, named[i][1]);
    }
    expect_usage_error("info -ngl 1", "unknown option '-ngl'");
    expect_usage_error("tokenize -mx hi", "unknown option '-mx'");
    expect_usage_error("convert -xyz a b", "unknown option '-xyz'");
    expect_usage_error("serve -m x -np 0", "--parallel expects");
    expect_usage_error("serve -m x -cnv", "unknown option '-cnv'");
    expect_usage_error("serve -m x --log-level loud", "--log-level takes error, warn, info");
    expect_usage_error("serve -m x -n 0", "-n expects");
    /* --version: the version, the commit and the kernel table in use */
    r = run_env("ST_KERNELS", "ref", "--version");
    assert_int_equal(r.code, 0);
    assert_int_equal(strncmp(r.out, "spectree 0.1.0 (commit ", 23), 0);
    assert_non_null(strstr(r.out, "), kernels ref\n"));
    assert_null(strstr(r.out, "commit )"));
    done(&r);
}

/* SPECTREE_ARG_<FLAG>: every server flag from the environment; the command line wins. */
static void test_serve_env(void **state) {
    (void)state;
    result r = run_env("SPECTREE_ARG_PORT", "x", "serve -m /nonexistent.gguf");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "--port expects an integer"));
    done(&r);
    r = run_env("SPECTREE_ARG_PORT", "x", "serve -m /nonexistent.gguf --port 0");
    assert_int_equal(r.code, 1); /* the command line's port: the variable is not read */
    assert_non_null(strstr(r.err, "cannot open"));
    done(&r);
    r = run_env("SPECTREE_ARG_MODEL", "/nonexistent-env.gguf", "serve");
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "/nonexistent-env.gguf: cannot open"));
    done(&r);
    r = run_env("SPECTREE_ARG_CTX_SIZE", "1", "serve -m /nonexistent.gguf");
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "--context-length expects"));
    done(&r);
    r = run_env("SPECTREE_ARG_CTX_SIZE", "1", "serve -m /nonexistent.gguf -c 64");
    assert_int_equal(r.code, 1);
    done(&r);
    r = run_env("SPECTREE_ARG_DISABLE_CUDA_GRAPH", "1", "serve -m /nonexistent.gguf");
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "--disable-cuda-graph ignored"));
    done(&r);
    r = run_env("SPECTREE_ARG_DISABLE_CUDA_GRAPH", "false", "serve -m /nonexistent.gguf");
    assert_int_equal(r.code, 1);
    assert_null(strstr(r.err, "warning"));
    done(&r);
    r = run_env("SPECTREE_ARG_SPECULATIVE_ALGORITHM", "MAGIC", "serve -m /nonexistent.gguf");
    assert_int_equal(r.code, 2);
    assert_int_equal(count_lines(r.err), 1);
    done(&r);
}

/* A prompt longer than the context is refused with st_generate's message; a huge one (50 MB)
 * at once, without being tokenized (which took minutes). */
static void test_prompt_too_long(void **state) {
    (void)state;
    char path[600], args[1400];
    snprintf(path, sizeof path, "%s/cli_huge_prompt.txt", ST_BUILD_DIR);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    static const char line[] = "Once upon a time there was a little girl named Lily. ";
    for (size_t n = 0; n < ((size_t)50 << 20); n += sizeof line - 1)
        assert_int_equal(fwrite(line, 1, sizeof line - 1, f), sizeof line - 1);
    assert_int_equal(fclose(f), 0);
    snprintf(args, sizeof args, "generate -m '%s' -f '%s' -n 4", tu_data("models/stories260K.gguf"),
             path);
    char *err = NULL;
    const double t0 = st_time_now();
    assert_int_equal(run_redirected(args, ">/dev/null", &err), 1);
    const double secs = st_time_now() - t0;
    print_message("  50 MB prompt refused in %.2f s: %s", secs, err);
    assert_non_null(strstr(
        err, "generate: the prompt (more than 2047 tokens) does not fit the context of 2048"));
    assert_true(secs < 20.0);
    free(err);
    remove(path);
    /* one just over the context is tokenized and counted */
    snprintf(args, sizeof args, "generate -m '%s' -c 8 -n 4 -p '%s'",
             tu_data("models/stories260K.gguf"), line);
    assert_int_equal(run_redirected(args, ">/dev/null", &err), 1);
    assert_non_null(strstr(err, "generate: the prompt ("));
    assert_non_null(strstr(err, " tokens) does not fit the context of 8"));
    assert_null(strstr(err, "more than"));
    free(err);
}

/* Ctrl-C in `generate`: the statistics of what was generated so far, exit status 130. */
static void test_generate_sigint(void **state) {
    (void)state;
    char out[512], err[512], prog[512];
    snprintf(out, sizeof out, "%s/cli_sigint_%d.out", ST_BUILD_DIR, (int)getpid());
    snprintf(err, sizeof err, "%s/cli_sigint_%d.err", ST_BUILD_DIR, (int)getpid());
    snprintf(prog, sizeof prog, "%s/spectree", ST_BUILD_DIR);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen(out, "w", stdout) || !freopen(err, "w", stderr))
            _exit(99);
        /* a context too long to fill before the signal comes */
        execl(prog, prog, "generate", "-m", tu_data("models/stories260K.gguf"), "-p",
              "Once upon a time", "-n", "-1", "-c", "1000000", "-t", "1", "--json", (char *)NULL);
        _exit(98);
    }
    /* wait until text streams, then interrupt */
    for (int i = 0; i < 600; i++) {
        struct stat sb;
        if (stat(out, &sb) == 0 && sb.st_size > 200)
            break;
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
    assert_int_equal(kill(pid, SIGINT), 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    char *e = tu_read_file(err, NULL), *o = tu_read_file(out, NULL);
    assert_non_null(e);
    assert_non_null(o);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 130 || !strstr(e, "stopped: interrupted") ||
        !strstr(e, "\"stop_reason\": \"interrupted\"") || !strstr(e, "prompt: 5 tokens"))
        fail_msg("status %d, stderr:\n%s", st, e);
    assert_true(strlen(o) > 200);
    free(e);
    free(o);
    remove(out);
    remove(err);
}

/* `convert`: progress (tensors and MB written) and a summary on stderr. */
static void test_convert_progress(void **state) {
    (void)state;
    char args[2048], path[512];
    snprintf(path, sizeof path, "%s/cli_convert_%d.gguf", ST_BUILD_DIR, (int)getpid());
    snprintf(args, sizeof args, "convert %s %s --type q8_0", tu_data("models/TinyStories-656K"),
             path);
    result r = run(args);
    assert_int_equal(r.code, 0);
    st_gguf *g;
    assert_int_equal(st_gguf_open(path, &g), ST_OK);
    char want[128];
    snprintf(want, sizeof want, "convert: %lld/%lld tensors, ", (long long)st_gguf_n_tensors(g),
             (long long)st_gguf_n_tensors(g));
    if (!strstr(r.err, want) || !strstr(r.err, "convert: wrote ") ||
        !strstr(r.err, " tensors, 0.8 MB, matrices q8_0, in "))
        fail_msg("convert printed:\n%s", r.err);
    st_gguf_free(g);
    done(&r);
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_golden),
        cmocka_unit_test(test_load_flags),
        cmocka_unit_test(test_stop_and_tokenize),
        cmocka_unit_test(test_bad_usage),
        cmocka_unit_test(test_numeric_flags),
        cmocka_unit_test(test_option_names),
        cmocka_unit_test(test_model_not_a_file),
        cmocka_unit_test(test_prompt_input),
        cmocka_unit_test(test_stop_reason_and_warnings),
        cmocka_unit_test(test_generate_why_plain),
        cmocka_unit_test(test_tokenizer_sized_buffers),
        cmocka_unit_test(test_info_kinds),
        cmocka_unit_test(test_output_errors),
        cmocka_unit_test(test_convert_outputs),
        cmocka_unit_test(test_llama_flags),
        cmocka_unit_test(test_serve_env),
        cmocka_unit_test(test_generate_sigint),
        cmocka_unit_test(test_prompt_too_long),
        cmocka_unit_test(test_convert_progress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
