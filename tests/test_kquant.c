/*
 * test_kquant.c: the K-quant formats on real files (tests/data/kquant, quantized by
 * llama.cpp's llama-quantize from a widened stories260K).
 * - Every file loads; its K-quant tensors report their types.
 * - Dequantized rows equal gguf-py's bit for bit (dequant/index.json).
 * - Greedy texts against llama.cpp's (golden/, see test_golden_texts for what is asserted).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/kernels.h"
#include "spectree.h"
#include "testutil.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *files[] = {"x256-Q2_K",   "x256-Q3_K_M", "x256-Q4_K_M",
                              "x256-Q5_K_M", "x256-Q6_K",   "x256-f32"};
enum { N_FILES = 6, N_GEN = 100 };

static const char *vec(const char *rel) {
    static char buf[4][4096];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 4096, "%s", tu_data(rel));
    return b;
}

static void test_load_all(void **state) {
    (void)state;
    const char *expect_wtype[] = {"q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "f32"};
    for (int f = 0; f < N_FILES; f++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/kquant/%s.gguf", files[f]);
        st_model *m = NULL;
        if (st_model_load(vec(rel), &m) != ST_OK)
            fail_msg("%s: %s", rel, st_last_error());
        assert_string_equal(st_dtype_name(st_model_get_hparams(m)->wtype), expect_wtype[f]);
        st_model_free(m);
    }
}

/* The value of "key": "..." or "key": N after p, copied into out. */
static const char *json_field(const char *p, const char *key, char *out, size_t cap) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *q = strstr(p, pat);
    assert_non_null(q);
    q += strlen(pat);
    while (*q == ' ' || *q == '"')
        q++;
    size_t n = 0;
    while (*q && *q != '"' && *q != ',' && *q != '\n' && n + 1 < cap)
        out[n++] = *q++;
    out[n] = 0;
    return q;
}

static void test_dequant_rows(void **state) {
    (void)state;
    char *idx = tu_read_file(vec("tests/data/kquant/dequant/index.json"), NULL);
    assert_non_null(idx);
    int n_checked = 0, n_kquant = 0;
    for (const char *p = strstr(idx, "\"file\":"); p; p = strstr(p, "\"file\":")) {
        char file[256], tensor[256], type[32], cols[32], expected[256], path[512];
        p = json_field(p, "file", file, sizeof file);
        p = json_field(p, "tensor", tensor, sizeof tensor);
        p = json_field(p, "type", type, sizeof type);
        p = json_field(p, "cols", cols, sizeof cols);
        p = json_field(p, "expected", expected, sizeof expected);
        snprintf(path, sizeof path, "tests/data/kquant/%s", file);
        st_gguf *g = NULL;
        if (st_gguf_open(vec(path), &g) != ST_OK)
            fail_msg("%s: %s", path, st_last_error());
        const st_gguf_tensor *t = st_gguf_tensor_find(g, tensor);
        assert_non_null(t);
        for (char *c = type; *c; c++)
            *c = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
        assert_string_equal(st_dtype_name(t->type), type);
        const int64_t K = atoll(cols);
        assert_int_equal(K, t->ne[0]);
        snprintf(path, sizeof path, "tests/data/kquant/%s", expected);
        size_t bytes = 0;
        char *want = tu_read_file(vec(path), &bytes);
        assert_non_null(want);
        const int64_t rows = (int64_t)(bytes / ((size_t)K * 4));
        assert_true(rows >= 1 && rows <= t->ne[1]);
        float *got = malloc(bytes);
        const size_t rb = st_row_bytes(t->type, K);
        assert_true(rb > 0);
        for (int64_t r = 0; r < rows; r++)
            st_dequant_row(t->type, (const char *)t->data + (size_t)r * rb, got + r * K, K);
        if (memcmp(got, want, bytes) != 0)
            fail_msg("%s %s (%s): dequantized rows differ", file, tensor, type);
        n_kquant += st_kquant_block_bytes(t->type) != 0;
        n_checked++;
        free(got);
        free(want);
        st_gguf_free(g);
    }
    free(idx);
    assert_true(n_checked >= 18);
    assert_true(n_kquant >= 10);
}

/* Whether token id's text starts the rest of llama.cpp's text (it split the same text into
 * other tokens, e.g. " with" where we would take " " then "with"). */
static bool consistent(const st_tokenizer *tok, int32_t id, const char *rest, size_t n_rest) {
    size_t n = 0;
    const char *p = st_tokenizer_piece(tok, id, &n);
    char buf[256];
    size_t k = 0;
    for (size_t i = 0; p && i < n && k < sizeof buf; i++) /* U+2581 stands for a space */
        if (i + 2 < n && memcmp(p + i, "\xe2\x96\x81", 3) == 0)
            buf[k++] = ' ', i += 2;
        else
            buf[k++] = p[i];
    return k > 0 && k <= n_rest && memcmp(buf, rest, k) == 0;
}

typedef struct agree_stats {
    int first;   /* tokens before the first position where our greedy choice differs */
    int same, n; /* positions where it is the same, of n */
    float
        max_gap; /* the largest logit lead of our choice over llama.cpp's token where they differ */
} agree_stats;

/* llama.cpp's text, tokenized (our tokenizer reproduces its ids: the detokenized ids give the text
 * back), evaluated in one batch with logits at every position: at each of its generated tokens,
 * is our greedy choice, given the same history, the token it took? */
static agree_stats agreement(st_model *m, const char *prompt, const char *golden, uint32_t kv,
                             int ggml) {
    const st_tokenizer *tok = st_model_tokenizer(m);
    const size_t lp = strlen(prompt);
    /* llama-simple ends its output with a newline of its own */
    const size_t lg_len = strlen(golden) - (golden[strlen(golden) - 1] == '\n');
    assert_memory_equal(golden, prompt, lp);
    enum { CAP = 512 };
    int32_t ids[CAP];
    int64_t np = 0, n = 0;
    const int bos = st_tokenizer_add_bos_default(tok);
    assert_int_equal(st_tokenize(tok, prompt, lp, bos, ids, CAP, &np), ST_OK);
    assert_int_equal(st_tokenize(tok, golden, lg_len, bos, ids, CAP, &n), ST_OK);
    assert_true(n > np && n - np <= N_GEN + 4);
    /* the golden ids start with the prompt's and give the text back */
    int32_t pids[CAP];
    assert_int_equal(st_tokenize(tok, prompt, lp, bos, pids, CAP, &np), ST_OK);
    assert_memory_equal(ids, pids, (size_t)np * sizeof(int32_t));
    const size_t cap = st_detok_max_bytes(tok);
    char *text = calloc((size_t)n * cap + 1, 1);
    size_t len = 0, k = 0;
    st_detok d;
    st_detok_init(&d, tok);
    size_t *off = malloc((size_t)n * sizeof(size_t));
    for (int64_t i = 0; i < n; i++, len += k) {
        off[i] = len;
        assert_int_equal(st_detok_push(&d, ids[i], text + len, cap, &k), ST_OK);
    }
    assert_int_equal(st_detok_flush(&d, text + len, cap, &k), ST_OK);
    len += k;
    assert_int_equal(len, lg_len);
    assert_memory_equal(text, golden, len);
    free(text);

    st_session_params sp = st_session_default_params();
    sp.n_ctx = CAP;
    sp.type_k = sp.type_v = kv;
    sp.match_ggml = ggml;
    st_session *s = NULL;
    assert_int_equal(st_session_create(m, &sp, &s), ST_OK);
    const int32_t V = st_model_get_hparams(m)->n_vocab;
    float *lg = malloc((size_t)(n * V) * 4);
    assert_int_equal(st_session_eval(s, 0, ids, (int32_t)n, lg, (int32_t)n), ST_OK);
    agree_stats a = {-1, 0, (int)(n - np), 0.0f};
    for (int64_t i = np; i < n; i++) {
        const float *l = lg + (i - 1) * V; /* logits after token i - 1 predict token i */
        int32_t best = 0;
        for (int32_t j = 1; j < V; j++)
            if (l[j] > l[best])
                best = j;
        if (best == ids[i] || consistent(tok, best, golden + off[i], lg_len - off[i])) {
            a.same++;
            continue;
        }
        if (a.first < 0)
            a.first = (int)(i - np);
        a.max_gap = fmaxf(a.max_gap, l[best] - l[ids[i]]);
    }
    if (a.first < 0)
        a.first = a.n;
    free(lg), free(off);
    st_session_free(s);
    return a;
}

/* Free-running greedy decoding: tokens after the prompt while our text stays a prefix of
 * llama.cpp's (the count the CLI's `generate --temp 0` output agrees for). */
static int greedy_prefix(st_model *m, const char *prompt, const char *golden, uint32_t kv,
                         int ggml) {
    const st_tokenizer *tok = st_model_tokenizer(m);
    const size_t lp = strlen(prompt);
    const char *want = golden + lp;
    const size_t n_want = strlen(want) - (want[0] && want[strlen(want) - 1] == '\n');
    int32_t ids[256];
    int64_t n = 0;
    assert_int_equal(st_tokenize(tok, prompt, lp, st_tokenizer_add_bos_default(tok), ids, 256, &n),
                     ST_OK);
    st_session_params sp = st_session_default_params();
    sp.n_ctx = 256;
    sp.type_k = sp.type_v = kv;
    sp.match_ggml = ggml;
    st_session *s = NULL;
    assert_int_equal(st_session_create(m, &sp, &s), ST_OK);
    const int32_t V = st_model_get_hparams(m)->n_vocab;
    float *lg = malloc((size_t)V * 4);
    assert_int_equal(st_session_eval(s, 0, ids, (int32_t)n, lg, 1), ST_OK);
    st_detok d;
    st_detok_init(&d, tok);
    assert_int_equal(st_detok_set_prev(&d, ids[n - 1]), ST_OK);
    const size_t cap = st_detok_max_bytes(tok);
    char *piece = malloc(cap);
    size_t len = 0;
    int agree = 0;
    for (; agree < N_GEN; agree++) {
        int32_t best = 0;
        for (int32_t j = 1; j < V; j++)
            if (lg[j] > lg[best])
                best = j;
        size_t k = 0;
        assert_int_equal(st_detok_push(&d, best, piece, cap, &k), ST_OK);
        if (len + k > n_want || memcmp(piece, want + len, k) != 0)
            break;
        len += k;
        assert_int_equal(st_session_eval(s, 0, &best, 1, lg, 1), ST_OK);
    }
    free(piece), free(lg);
    st_session_free(s);
    return agree;
}

/* llama.cpp (c392e509, llama-simple: no flash attention, f16 KV cache) stores K and V in f16,
 * converts Q to f16 for the K.Q product and the softmax probabilities to f16 for the V product
 * (ggml's CPU mul_mat converts its second operand to the first's f16) and quantizes activations
 * to Q8_K as we do. Three ways of computing are checked:
 * - f32 cache: our arithmetic without those roundings;
 * - f16 cache: the roundings, our order of summation otherwise;
 * - f16 cache + match_ggml: ggml's order of summation and functions too (RMSNorm in double,
 *   the K-quant dot products' lanes, scores, softmax and value sums, exp in softmax and SiLU).
 * What is asserted, in each:
 * - given llama.cpp's text, our greedy choice is its token at 90% of positions, and where it is
 *   not, its token is within 0.5 of our best logit (logits here reach 15-20; a wrong scale,
 *   sub-block or bit moves them by whole units). Q2_K is too coarse for that (its texts are half
 *   nonsense whose tokenization is ambiguous): two thirds of positions. The F32 file must agree
 *   on all 100 tokens.
 * - the rule, free-running greedy text equal to llama.cpp's for >= 40 tokens: with
 *   match_ggml all 15 K-quant texts (measured 2026-11-30: 13 of them all 100 tokens, x256-Q2_K
 *   prompt 3 65, x256-Q4_K_M prompt 1 47); with the f16 cache alone at least 12 (measured 12),
 * which keeps the roundings from going astray unnoticed (the f32 cache reached 5). */
static void test_golden_texts(void **state) {
    (void)state;
    for (int mode = 0; mode < 3; mode++) {
        const uint32_t kvt = mode ? ST_DTYPE_F16 : ST_DTYPE_F32;
        const int ggml = mode == 2;
        const char *mname = mode == 0 ? "f32 KV cache" : mode == 1 ? "f16 KV cache" : "match_ggml";
        int n40 = 0, n100 = 0;
        for (int f = 0; f < N_FILES; f++) {
            char rel[256];
            snprintf(rel, sizeof rel, "tests/data/kquant/%s.gguf", files[f]);
            st_model *m = NULL;
            if (st_model_load(vec(rel), &m) != ST_OK)
                fail_msg("%s: %s", rel, st_last_error());
            const int is_f32 = strstr(files[f], "f32") != NULL;
            const int is_q2 = strstr(files[f], "Q2_K") != NULL;
            for (int i = 1; i <= 3; i++) {
                char pr[256], gr[256];
                snprintf(pr, sizeof pr, "tests/data/kquant/golden/%s.%d.prompt", files[f], i);
                snprintf(gr, sizeof gr, "tests/data/kquant/golden/%s.%d.txt", files[f], i);
                char *prompt = tu_read_file(vec(pr), NULL), *golden = tu_read_file(vec(gr), NULL);
                assert_non_null(prompt);
                assert_non_null(golden);
                const agree_stats a = agreement(m, prompt, golden, kvt, ggml);
                const int g = greedy_prefix(m, prompt, golden, kvt, ggml);
                print_message("%s, %s prompt %d: greedy text agrees with llama.cpp for %d of %d "
                              "tokens; given its text, %d of %d choices agree (largest lead "
                              "%.3f)\n",
                              mname, files[f], i, g, N_GEN, a.same, a.n, (double)a.max_gap);
                if (is_f32) {
                    assert_int_equal(g, N_GEN);
                    assert_int_equal(a.same, a.n);
                } else if (is_q2) {
                    assert_true(3 * a.same >= 2 * a.n);
                } else {
                    assert_true(10 * a.same >= 9 * a.n);
                    assert_true(a.max_gap < 0.5f);
                }
                n40 += !is_f32 && g >= 40;
                n100 += !is_f32 && g == N_GEN;
                free(prompt);
                free(golden);
            }
            st_model_free(m);
        }
        print_message("%s: %d of 15 K-quant texts agree for >= 40 tokens, %d for all %d\n", mname,
                      n40, n100, N_GEN);
        if (mode == 1)
            assert_true(n40 >= 12);
        if (mode == 2)
            assert_true(n40 == 15 && n100 >= 13);
    }
}

static int collect(void *user, int32_t id) {
    int32_t *ids = user;
    if (ids[0] < 200)
        ids[1 + ids[0]++] = id;
    return 0;
}

/* match_ggml keeps speculation lossless: NGRAM trees (fixed shape, both backends) on the Q4_K_M
 * file give plain decoding's tokens, greedy and sampled. */
static void test_ggml_spec(void **state) {
    (void)state;
    st_model *m = NULL;
    assert_int_equal(st_model_load(vec("tests/data/kquant/x256-Q4_K_M.gguf"), &m), ST_OK);
    const st_tokenizer *tok = st_model_tokenizer(m);
    static const char prompt[] = "Tom and his dog. Tom and his dog played. Tom and his dog";
    int32_t ids[64];
    int64_t n = 0;
    assert_int_equal(st_tokenize(tok, prompt, strlen(prompt), 1, ids, 64, &n), ST_OK);
    int64_t spec_steps = 0;
    for (int c = 0; c < 4; c++) {
        int32_t plain[201] = {0}, spec[201] = {0};
        st_gen_params gp = st_gen_default_params();
        gp.n_predict = 60;
        gp.type_k = gp.type_v = ST_DTYPE_F16;
        gp.match_ggml = 1;
        gp.sampler.temp = c < 2 ? 0.0f : 0.8f;
        gp.sampler.seed = 99;
        assert_int_equal(st_generate(m, ids, n, &gp, collect, plain, NULL), ST_OK);
        gp.spec.algo = ST_SPEC_NGRAM;
        gp.spec.topk = 2;
        gp.spec.num_steps = 3;
        gp.spec.num_draft_tokens = 8;
        gp.spec.backend = c % 2 ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
        st_gen_stats st;
        assert_int_equal(st_generate(m, ids, n, &gp, collect, spec, &st), ST_OK);
        spec_steps += st.spec_steps;
        assert_int_equal(plain[0], spec[0]);
        assert_memory_equal(plain, spec, (size_t)(plain[0] + 1) * sizeof(int32_t));
    }
    print_message("match_ggml: %lld speculative steps, every token plain decoding's\n",
                  (long long)spec_steps);
    assert_true(spec_steps > 0);
    st_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_all),
        cmocka_unit_test(test_dequant_rows),
        cmocka_unit_test(test_golden_texts),
        cmocka_unit_test(test_ggml_spec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
