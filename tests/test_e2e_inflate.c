/*
 * test_e2e_inflate.c: `spectree-mkmodel --inflate`, stories260K widened into a larger model.
 * - In f32 the widened model (random or zero fill, extra layers or none) prints stories260K's
 *   greedy text for several prompts.
 * - The layout: SRC's block in the top-left corner (norms times sqrt(d/D)), the entries that
 *   write into the residual stream's extra dims or take extra heads and units into real outputs
 *   zero, the others random or zero as asked; metadata kept but the shape keys; seeded.
 * - Quantized and f16 widenings load, keep their zero blocks, and run.
 * - Bad flags: one line on stderr, a non-zero exit, no file.
 * Also st_dequantize_row, which the tool reads SRC's weights with.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "io/gguf_write.h"
#include "spectree.h"
#include "testutil.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[] = "/tmp/st_inflate_XXXXXX";

static const char *stories(void) { return tu_data("models/stories260K.gguf"); }

/* A path in the test's directory, in a rotating static buffer. */
static const char *tmp(const char *name) {
    static char bufs[4][600];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, 600, "%s/%s", dir, name);
    return b;
}

typedef tu_result result;

/* Runs `build/PROG ARGS`, capturing stdout and stderr. */
static result run(const char *prog, const char *args) {
    result r = tu_run(prog, args, "/dev/null");
    assert_non_null(r.out);
    assert_non_null(r.err);
    return r;
}

static void done(result *r) { tu_result_free(r); }

/* spectree-mkmodel OUT --inflate stories260K ARGS, which must succeed. */
static void inflate(const char *out, const char *args) {
    char a[2048];
    snprintf(a, sizeof a, "%s --inflate %s %s", out, stories(), args);
    result r = run("spectree-mkmodel", a);
    if (r.code != 0)
        fail_msg("spectree-mkmodel %s: exit %d: %s", a, r.code, r.err);
    done(&r);
}

/* The greedy text of 100 tokens (stdout of spectree generate). */
static char *greedy(const char *model, const char *prompt) {
    char a[2048];
    snprintf(a, sizeof a, "generate -m %s -p '%s' -n 100 --temp 0 -t 1", model, prompt);
    result r = run("spectree", a);
    if (r.code != 0)
        fail_msg("spectree %s: exit %d: %s", a, r.code, r.err);
    free(r.err);
    return r.out;
}

static int setup(void **state) {
    (void)state;
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    const char *files[] = {"r.gguf", "r2.gguf",  "r3.gguf", "z.gguf", "q.gguf",
                           "k.gguf", "src.gguf", "run.out", "run.err"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        remove(tmp(files[i]));
    return rmdir(dir);
}

static void test_greedy_text(void **state) {
    (void)state;
    inflate(tmp("r.gguf"), "--dim 128 --ff 384 --layers 7 --fill random --seed 5");
    inflate(tmp("z.gguf"), "--dim 96 --ff 172 --layers 5 --fill zero");
    const char *prompts[] = {"Once upon a time", "The cat", "Tom and Sue went to the"};
    for (size_t i = 0; i < sizeof prompts / sizeof prompts[0]; i++) {
        char *want = greedy(stories(), prompts[i]);
        assert_true(strlen(want) > 100);
        const char *models[] = {tmp("r.gguf"), tmp("z.gguf")};
        for (int m = 0; m < 2; m++) {
            char *got = greedy(models[m], prompts[i]);
            if (strcmp(got, want) != 0)
                fail_msg("%s, '%s':\n%s\nstories260K:\n%s", models[m], prompts[i], got, want);
            free(got);
        }
        free(want);
    }
}

/* Row r of a tensor as floats (n = ne[0] of them). */
static void row_of(const st_gguf *g, const char *name, int64_t r, float *out) {
    const st_gguf_tensor *t = st_gguf_tensor_find(g, name);
    if (!t)
        fail_msg("no tensor %s", name);
    size_t rb;
    assert_int_equal(st_gguf_tensor_bytes(t->type, 1, &t->ne[0], &rb), ST_OK);
    assert_true(r < t->ne[1]);
    assert_int_equal(
        st_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * rb, t->ne[0], out),
        ST_OK);
}

/* Checks tensor `name` of the widened g (shape [n_in, n_out]) against SRC's tensor of the same
 * name (NULL: an extra layer): the corner is SRC's (times `scale`), the rest is zero where
 * `zero`, else nonzero when `random` and zero otherwise. */
static void check_tensor(const st_gguf *g, const st_gguf *s, const char *name, const char *sname,
                         int64_t n_in, int64_t n_out, float scale, int zero, int random) {
    const st_gguf_tensor *t = st_gguf_tensor_find(g, name);
    if (!t)
        fail_msg("no tensor %s", name);
    assert_int_equal(t->ne[0], n_in);
    assert_int_equal(t->ne[1], n_out);
    const st_gguf_tensor *ts = sname ? st_gguf_tensor_find(s, sname) : NULL;
    float row[512], srow[512];
    int64_t n_random = 0, n_other = 0;
    for (int64_t r = 0; r < n_out; r++) {
        row_of(g, name, r, row);
        int64_t k = 0;
        if (ts && r < ts->ne[1]) {
            row_of(s, sname, r, srow);
            for (; k < ts->ne[0]; k++)
                if (row[k] != srow[k] * scale)
                    fail_msg("%s[%" PRId64 "][%" PRId64 "] = %g, SRC's is %g", name, r, k,
                             (double)row[k], (double)srow[k]);
        }
        for (; k < n_in; k++) {
            n_other++;
            n_random += row[k] != 0.0f;
            if (zero && row[k] != 0.0f)
                fail_msg("%s[%" PRId64 "][%" PRId64 "] = %g, expected 0", name, r, k,
                         (double)row[k]);
        }
    }
    if (!zero && random && n_random < n_other * 99 / 100)
        fail_msg("%s: %" PRId64 " of %" PRId64 " fill values are random", name, n_random, n_other);
    if (!random && n_random)
        fail_msg("%s: %" PRId64 " fill values are not zero", name, n_random);
}

static void check_layout(const char *path, int random) {
    st_gguf *g, *s;
    assert_int_equal(st_gguf_open(path, &g), ST_OK);
    assert_int_equal(st_gguf_open(stories(), &s), ST_OK);
    const int64_t D = 128, F = 384, V = 512;
    const float ns = (float)sqrt(64.0 / 128.0);
    check_tensor(g, s, "token_embd.weight", "token_embd.weight", D, V, 1, 1, random);
    check_tensor(g, s, "output.weight", "output.weight", D, V, 1, 0, random);
    check_tensor(g, s, "output_norm.weight", "output_norm.weight", D, 1, ns, 0, random);
    const char *names[9] = {"attn_norm", "attn_q",   "attn_k", "attn_v",  "attn_output",
                            "ffn_norm",  "ffn_gate", "ffn_up", "ffn_down"};
    const int64_t in[9] = {D, D, D, D, D, D, D, D, F}, out[9] = {1, D, 64, 64, D, 1, F, F, D};
    for (int l = 0; l < 7; l++)
        for (int k = 0; k < 9; k++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, names[k]);
            const int zero = k == 4 || k == 8, norm = k == 0 || k == 5;
            check_tensor(g, s, nm, l < 5 ? nm : NULL, in[k], out[k], norm ? ns : 1.0f, zero,
                         random);
        }
    assert_int_equal(st_gguf_n_tensors(g), 3 + 9 * 7);
    /* SRC's metadata in SRC's order, but the shape keys; general.file_type added. */
    const char *shape[] = {"llama.embedding_length",
                           "llama.feed_forward_length",
                           "llama.block_count",
                           "llama.attention.head_count",
                           "llama.attention.head_count_kv",
                           "llama.attention.layer_norm_rms_epsilon"};
    const char *want[] = {"128", "384", "7", "16", "8", "5e-06"};
    assert_int_equal(st_gguf_n_kv(g), st_gguf_n_kv(s) + 1);
    for (int64_t i = 0; i < st_gguf_n_kv(s); i++) {
        assert_string_equal(st_gguf_key(g, i), st_gguf_key(s, i));
        char a[256], b[256];
        st_gguf_format_value(g, i, a, sizeof a);
        st_gguf_format_value(s, i, b, sizeof b);
        size_t j = 0;
        while (j < 6 && strcmp(shape[j], st_gguf_key(s, i)) != 0)
            j++;
        assert_string_equal(a, j < 6 ? want[j] : b);
    }
    assert_string_equal(st_gguf_key(g, st_gguf_n_kv(s)), "general.file_type");
    st_gguf_free(s);
    st_gguf_free(g);

    st_model *m;
    assert_int_equal(st_model_load(path, &m), ST_OK);
    const st_model_hparams *hp = st_model_get_hparams(m);
    assert_int_equal(hp->n_embd, 128);
    assert_int_equal(hp->n_head, 16);
    assert_int_equal(hp->n_head_kv, 8);
    assert_int_equal(hp->head_dim, 8);
    assert_int_equal(hp->n_ff, 384);
    assert_int_equal(hp->n_layer, 7);
    assert_int_equal(hp->n_vocab, 512);
    assert_true(hp->rms_eps == (float)(1e-5f * 0.5));
    st_model_free(m);
}

static void test_layout(void **state) {
    (void)state;
    inflate(tmp("r.gguf"), "--dim 128 --ff 384 --layers 7 --seed 5");
    inflate(tmp("r2.gguf"), "--dim 128 --ff 384 --layers 7 --seed 5");
    inflate(tmp("r3.gguf"), "--dim 128 --ff 384 --layers 7 --seed 6");
    inflate(tmp("z.gguf"), "--dim 128 --ff 384 --layers 7 --fill zero");
    check_layout(tmp("r.gguf"), 1);
    check_layout(tmp("z.gguf"), 0);
    /* The seed sets the random values, and only them. */
    size_t n1, n2, n3;
    char *a = tu_read_file(tmp("r.gguf"), &n1), *b = tu_read_file(tmp("r2.gguf"), &n2),
         *c = tu_read_file(tmp("r3.gguf"), &n3);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_int_equal(n1, n2);
    assert_int_equal(n1, n3);
    assert_memory_equal(a, b, n1);
    assert_memory_not_equal(a, c, n1);
    free(a);
    free(b);
    free(c);
}

/* Quantized and 16-bit widenings: the type is set, zero blocks stay zero, the model runs (the
 * text may differ from stories260K's: its weights are rounded). */
static void test_types(void **state) {
    (void)state;
    const char *types[] = {"q8_0", "q4_0", "f16", "bf16"};
    const uint32_t ids[] = {ST_DTYPE_Q8_0, ST_DTYPE_Q4_0, ST_DTYPE_F16, ST_DTYPE_BF16};
    for (int i = 0; i < 4; i++) {
        char a[256];
        snprintf(a, sizeof a, "--dim 128 --ff 384 --layers 6 --type %s", types[i]);
        inflate(tmp("q.gguf"), a);
        st_model *m;
        assert_int_equal(st_model_load(tmp("q.gguf"), &m), ST_OK);
        assert_int_equal(st_model_get_hparams(m)->wtype, ids[i]);
        st_model_free(m);
        st_gguf *g;
        assert_int_equal(st_gguf_open(tmp("q.gguf"), &g), ST_OK);
        float row[384];
        for (int64_t r = 64; r < 128; r += 21) {
            row_of(g, "blk.1.ffn_down.weight", r, row);
            for (int k = 0; k < 384; k++)
                assert_true(row[k] == 0.0f);
        }
        row_of(g, "blk.5.attn_output.weight", 3, row);
        for (int k = 0; k < 128; k++)
            assert_true(row[k] == 0.0f);
        st_gguf_free(g);
        char *text = greedy(tmp("q.gguf"), "Once upon a time");
        assert_true(strlen(text) > 100);
        free(text);
    }
}

/* K-quant widenings, single types and llama.cpp's mixes: the per-tensor types, zero blocks stay
 * zero, the model runs. */
static void test_kquant_types(void **state) {
    (void)state;
    const char *types[] = {"q4_k_m", "q6_k", "q2_k", "q5_k_m"};
    const uint32_t ids[] = {ST_DTYPE_Q4_K, ST_DTYPE_Q6_K, ST_DTYPE_Q2_K, ST_DTYPE_Q5_K};
    for (int i = 0; i < 4; i++) {
        char a[256];
        snprintf(a, sizeof a, "--dim 256 --ff 512 --layers 6 --type %s", types[i]);
        inflate(tmp("k.gguf"), a);
        st_model *m;
        assert_int_equal(st_model_load(tmp("k.gguf"), &m), ST_OK);
        assert_int_equal(st_model_get_hparams(m)->wtype, ids[i]);
        st_model_free(m);
        st_gguf *g;
        assert_int_equal(st_gguf_open(tmp("k.gguf"), &g), ST_OK);
        const int mix = strstr(types[i], "_m") != NULL;
        /* Q4_K_M / Q5_K_M, 6 layers: attn_v and ffn_down in Q6_K in layers 2 and 5 (llama.cpp:
         * the first and last eighth, none and 5, and every third from the first eighth on) */
        for (int l = 0; l < 6; l++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.ffn_down.weight", l);
            const uint32_t want = mix && (l == 2 || l == 5) ? ST_DTYPE_Q6_K : ids[i];
            assert_int_equal(st_gguf_tensor_find(g, nm)->type, want);
            snprintf(nm, sizeof nm, "blk.%d.attn_v.weight", l);
            assert_int_equal(st_gguf_tensor_find(g, nm)->type, want);
        }
        assert_int_equal(st_gguf_tensor_find(g, "token_embd.weight")->type,
                         st_gguf_tensor_find(g, "output.weight") ? ids[i] : ST_DTYPE_Q6_K);
        float row[512];
        for (int64_t r = 64; r < 256; r += 37) {
            row_of(g, "blk.1.ffn_down.weight", r, row);
            for (int k = 0; k < 512; k++)
                assert_true(row[k] == 0.0f);
        }
        row_of(g, "blk.5.attn_output.weight", 3, row);
        for (int k = 0; k < 256; k++)
            assert_true(row[k] == 0.0f);
        st_gguf_free(g);
        char *text = greedy(tmp("k.gguf"), "Once upon a time");
        assert_true(strlen(text) > 100);
        free(text);
    }
}

static void test_bad_flags(void **state) {
    (void)state;
    const char *bad[] = {
        "--dim 100 --ff 384 --layers 7",             /* not a multiple of the head size 8 */
        "--dim 56 --ff 384 --layers 7",              /* narrower than SRC */
        "--dim 120 --ff 384 --layers 7",             /* 15 heads: breaks the 2:1 GQA ratio */
        "--dim 128 --ff 100 --layers 7",             /* ff below SRC's 172 */
        "--dim 128 --ff 384 --layers 4",             /* fewer layers than SRC's 5 */
        "--dim 128 --ff 200 --layers 7 --type q8_0", /* ff not a multiple of 32 */
        "--dim 144 --ff 384 --layers 7 --type q4_0", /* dim not a multiple of 32 */
        "--dim 128 --ff 384 --layers 7 --fill half", /* unknown fill */
        "--dim 128 --ff 384",                        /* no --layers */
        "--dim 128 --ff 384 --layers 7 --heads 16",  /* SRC sets the heads */
        "--dim 128 --ff 384 --layers 7 --keep-layers 2",
        "--dim 128 --ff 384 --layers 7 --type q4_1",   /* unknown type */
        "--dim 128 --ff 512 --layers 7 --type q4_k_m", /* dim not a multiple of 256 */
        "--dim 256 --ff 384 --layers 7 --type q6_k",   /* ff not a multiple of 256 */
        "--dim 16777216 --ff 384 --layers 7",          /* too many heads */
    };
    const char *out = tmp("bad.gguf");
    size_t n;
    char *copy = tu_read_file(stories(), &n);
    assert_non_null(copy);
    FILE *f = fopen(tmp("src.gguf"), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(copy, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0] + 3; i++) {
        char a[2048];
        if (i < sizeof bad / sizeof bad[0])
            snprintf(a, sizeof a, "%s --inflate %s %s", out, stories(), bad[i]);
        else if (i == sizeof bad / sizeof bad[0])
            snprintf(a, sizeof a, "%s --inflate /nonexistent.gguf --dim 128 --ff 384 --layers 7",
                     out);
        else if (i == sizeof bad / sizeof bad[0] + 1)
            snprintf(a, sizeof a, "%s --vocab %s --dim 64 --ff 64 --layers 1 --heads 8 --fill zero",
                     out, stories());
        else
            snprintf(a, sizeof a, "%s --inflate %s --dim 128 --ff 384 --layers 7", tmp("src.gguf"),
                     tmp("src.gguf")); /* would overwrite its own source */
        result r = run("spectree-mkmodel", a);
        size_t nl = 0;
        for (const char *p = r.err; *p; p++)
            nl += *p == '\n';
        if (r.code == 0 || r.code >= 128 || nl != 1 || strlen(r.err) < 20)
            fail_msg("spectree-mkmodel %s: exit %d, stderr:\n%s", a, r.code, r.err);
        assert_int_not_equal(access(out, F_OK), 0);
        done(&r);
    }
    char *after = tu_read_file(tmp("src.gguf"), NULL);
    assert_non_null(after);
    assert_memory_equal(after, copy, n);
    free(after);
    free(copy);
    result r = run("spectree-mkmodel", "--help");
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "--inflate SRC"));
    assert_non_null(strstr(r.out, "--fill"));
    done(&r);
}

static void test_dequantize_row(void **state) {
    (void)state;
    float x[64], y[64];
    uint8_t q[256];
    for (int i = 0; i < 64; i++)
        x[i] = (float)((i * 37) % 64 - 32) / 16.0f; /* multiples of 1/16 in [-2, 2) */
    const uint32_t types[] = {ST_DTYPE_F32, ST_DTYPE_F16, ST_DTYPE_BF16, ST_DTYPE_Q8_0,
                              ST_DTYPE_Q4_0};
    for (int t = 0; t < 5; t++) {
        assert_int_equal(st_quantize_row(types[t], x, 64, q), ST_OK);
        memset(y, 0xff, sizeof y);
        assert_int_equal(st_dequantize_row(types[t], q, 64, y), ST_OK);
        /* exact in the float formats; Q8_0 within half a step (max|x|/127); Q4_0 within one
         * step (2/8: its 16 levels run from -8 to 7 steps, so the top clamps) */
        const float tol = types[t] == ST_DTYPE_Q8_0   ? 2.0f / 127 / 2 * 1.01f
                          : types[t] == ST_DTYPE_Q4_0 ? 2.0f / 8 * 1.01f
                                                      : 0.0f;
        for (int i = 0; i < 64; i++)
            if (!(fabsf(y[i] - x[i]) <= tol))
                fail_msg("%s: element %d: %g for %g", st_dtype_name(types[t]), i, (double)y[i],
                         (double)x[i]);
    }
    assert_int_equal(st_dequantize_row(ST_DTYPE_Q8_0, q, 40, y), ST_ERR_INVALID);
    assert_int_equal(st_dequantize_row(3 /* q4_1 */, q, 32, y), ST_ERR_INVALID);
    assert_int_equal(st_dequantize_row(ST_DTYPE_F32, q, -1, y), ST_ERR_INVALID);
    assert_int_equal(st_dequantize_row(ST_DTYPE_F32, NULL, 4, y), ST_ERR_INVALID);
    assert_int_equal(st_dequantize_row(ST_DTYPE_F32, NULL, 0, NULL), ST_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_text), cmocka_unit_test(test_layout),
        cmocka_unit_test(test_types),       cmocka_unit_test(test_kquant_types),
        cmocka_unit_test(test_bad_flags),   cmocka_unit_test(test_dequantize_row),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
