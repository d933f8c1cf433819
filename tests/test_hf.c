/*
 * test_hf.c: Hugging Face checkpoints (src/io/hf_gguf.c, hf_tok.c).
 * - TinyStories-656K (a real published checkpoint): greedy text equals the folder's README,
 *   the same from its converted GGUF files (f32 and as stored bitwise equal logits), logits
 *   against the independent numpy forward pass (tests/oracle/hf_ref.py).
 * - Synthetic checkpoints of every architecture written by hf_ref.py (llama, Llama 3 rope
 *   scaling, Qwen2 biases, Mistral with its own head_dim, SmolLM; F32/F16/BF16; sharded):
 *   logits within 1e-4 relative of the numpy oracle through the HF loader and through the
 *   converted GGUF (which gives bitwise the HF loader's logits); speculation (NGRAM trees of
 *   several shapes, both attention backends, greedy and seeded sampling) gives plain decoding's
 *   tokens.
 * - Tokenization of 300 strings equals the independent Python BPE (tests/oracle/hf_bpe.py) for
 *   the SentencePiece-style vocabulary of TinyStories-656K and for synthetic byte-level
 *   vocabularies with Llama 3's, Qwen2's and SmolLM's pre-tokenizers.
 * - Malformed checkpoints: one-line errors naming the file and the field (tokenizer.json: an
 *   empty vocabulary beside added tokens, merges naming unknown pieces, repeated merges too).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "io/gguf_internal.h"
#include "io/gguf_write.h"
#include "io/hf.h"
#include "spectree.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmp[512];

static int setup(void **state) {
    (void)state;
    snprintf(tmp, sizeof tmp, "%s/hf_test_%d", ST_BUILD_DIR, (int)getpid());
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", tmp, tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static void sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "failed (%d): %s\n", rc, cmd);
    assert_int_equal(rc, 0);
}

static const char *tokdir(void) { return tu_data("models/TinyStories-656K"); }

/* Logits of every position of toks (n_vocab each) in a new session. */
static float *all_logits(const st_model *m, const int32_t *toks, int32_t n) {
    const int32_t V = st_model_get_hparams(m)->n_vocab;
    float *lg = malloc((size_t)n * (size_t)V * sizeof(float));
    assert_non_null(lg);
    st_session_params p = st_session_default_params();
    p.n_ctx = 64;
    st_session *s = NULL;
    assert_int_equal(st_session_create(m, &p, &s), ST_OK);
    for (int32_t i = 0; i < n; i++)
        assert_int_equal(st_session_eval(s, 0, toks + i, 1, lg + (size_t)i * V, 1), ST_OK);
    st_session_free(s);
    return lg;
}

/* The oracle's logits against ours: per row, max |diff| / max |logit| <= 1e-4. */
static void check_oracle(const char *dir, const float *lg, const int32_t *toks, int32_t n,
                         int32_t V) {
    char cmd[8192];
    int k = snprintf(cmd, sizeof cmd, "%s %s/tests/oracle/hf_ref.py logits %s", ST_PYTHON3,
                     ST_SOURCE_DIR, dir);
    for (int32_t i = 0; i < n; i++)
        k += snprintf(cmd + k, sizeof cmd - (size_t)k, " %d", toks[i]);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    float *want = malloc((size_t)n * (size_t)V * sizeof(float));
    assert_non_null(want);
    int64_t got = 0;
    while (got < (int64_t)n * V && fscanf(p, "%f", &want[got]) == 1)
        got++;
    assert_int_equal(pclose(p), 0);
    assert_int_equal(got, (int64_t)n * V);
    double worst = 0.0;
    for (int32_t r = 0; r < n; r++) {
        double mx = 0.0, err = 0.0;
        for (int32_t j = 0; j < V; j++) {
            const double w = want[(size_t)r * V + j], g = lg[(size_t)r * V + j];
            mx = fmax(mx, fabs(w));
            err = fmax(err, fabs(w - g));
        }
        worst = fmax(worst, err / mx);
    }
    printf("  %s: worst relative logit error %.2e over %d positions\n", dir, worst, (int)n);
    assert_true(worst <= 1e-4);
    free(want);
}

typedef struct text_buf {
    st_detok d;
    char s[4096];
    size_t n;
    int32_t ids[256];
    int32_t n_ids;
} text_buf;

static int on_tok(void *user, int32_t id) {
    text_buf *t = user;
    size_t n = 0;
    if (t->n_ids < 256)
        t->ids[t->n_ids++] = id;
    if (st_detok_push(&t->d, id, t->s + t->n, sizeof t->s - t->n - 1, &n) == ST_OK)
        t->n += n;
    return 0;
}

/* Speculation settings of the matrix: NGRAM with the auto shape or fixed (K, S, N), a backend,
 * greedy or seeded sampling. */
typedef struct spec_case {
    int spec;
    int32_t k, s, n;
    st_attn_backend backend;
    float temp;
} spec_case;

static int64_t spec_steps; /* speculative steps taken by gen_with (so the matrix verifies trees) */

static void gen_with(const st_model *m, int n, const spec_case *c, text_buf *t) {
    const st_tokenizer *tok = st_model_tokenizer(m);
    int32_t ids[64];
    int64_t n_ids = 0;
    assert_int_equal(st_tokenize(tok, "Once upon a time", 16, 1, ids, 64, &n_ids), ST_OK);
    st_gen_params gp = st_gen_default_params();
    gp.n_predict = n;
    gp.sampler.temp = c->temp;
    gp.sampler.seed = 1234;
    if (c->spec) {
        gp.spec.algo = ST_SPEC_NGRAM;
        gp.spec.topk = c->k;
        gp.spec.num_steps = c->s;
        gp.spec.num_draft_tokens = c->n;
        gp.spec.backend = c->backend;
    }
    memset(t, 0, sizeof *t);
    st_detok_init(&t->d, tok);
    st_detok_set_prev(&t->d, ids[n_ids - 1]);
    st_gen_stats st;
    assert_int_equal(st_generate(m, ids, n_ids, &gp, on_tok, t, &st), ST_OK);
    spec_steps += st.spec_steps;
    t->s[t->n] = 0;
}

/* Greedy generation of n tokens after "Once upon a time" (plain, or with NGRAM trees). */
static void gen(const st_model *m, int n, int spec, text_buf *t) {
    const st_tokenizer *tok = st_model_tokenizer(m);
    int32_t ids[64];
    int64_t n_ids = 0;
    assert_int_equal(st_tokenize(tok, "Once upon a time", 16, 1, ids, 64, &n_ids), ST_OK);
    st_gen_params gp = st_gen_default_params();
    gp.n_predict = n;
    gp.sampler.temp = 0.0f;
    if (spec)
        gp.spec.algo = ST_SPEC_NGRAM;
    memset(t, 0, sizeof *t);
    st_detok_init(&t->d, tok);
    st_detok_set_prev(&t->d, ids[n_ids - 1]);
    assert_int_equal(st_generate(m, ids, n_ids, &gp, on_tok, t, NULL), ST_OK);
    t->s[t->n] = 0;
}

static void test_tinystories(void **state) {
    (void)state;
    /* the README's text of TinyStories-656K (models/README.md) */
    static const char want[] =
        ", a little girl named Lily lived in a small house with her mom, dad, and her dog, "
        "Spot, Spot, loved to play all day. One day, Lily saw a small bird on the ground.";
    st_model *hf = NULL;
    assert_int_equal(st_model_load(tokdir(), &hf), ST_OK);
    text_buf *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    assert_true(a && b);
    gen(hf, 100, 0, a);
    printf("  TinyStories-656K: %.120s...\n", a->s);
    assert_int_equal(strncmp(a->s, want, strlen(want)), 0);
    const int32_t toks[12] = {1, 404, 374, 279, 1101, 15, 70, 300, 1300, 2000, 5, 7};
    float *lh = all_logits(hf, toks, 12);
    check_oracle(tokdir(), lh, toks, 12, 2048);
    /* the converted files: as stored (bitwise the same logits) and f16, q8_0 (load and run) */
    static const struct {
        const char *name;
        int type, min_same;
    } conv[] = {{"keep", -1, 100},
                {"f32", ST_DTYPE_F32, 100},
                {"f16", ST_DTYPE_F16, 100},
                {"q8_0", ST_DTYPE_Q8_0, 5}};
    for (size_t c = 0; c < sizeof conv / sizeof conv[0]; c++) {
        char path[640];
        snprintf(path, sizeof path, "%s/ts_%s.gguf", tmp, conv[c].name);
        assert_int_equal(st_convert_hf(tokdir(), path, conv[c].type), ST_OK);
        st_model *g = NULL;
        assert_int_equal(st_model_load(path, &g), ST_OK);
        gen(g, 100, 0, b);
        if (conv[c].type == -1 || conv[c].type == ST_DTYPE_F32) {
            assert_string_equal(a->s, b->s);
            float *lg = all_logits(g, toks, 12);
            assert_memory_equal(lh, lg, 12 * 2048 * sizeof(float));
            free(lg);
        } else { /* quantization noise moves near-ties: the first tokens agree */
            int same = 0;
            while (same < a->n_ids && same < b->n_ids && a->ids[same] == b->ids[same])
                same++;
            printf("  converted to %s: the first %d of 100 tokens agree\n", conv[c].name, same);
            assert_true(same >= conv[c].min_same);
        }
        st_model_free(g);
    }
    /* speculation on the HF-loaded model: plain decoding's tokens */
    gen(hf, 100, 1, b);
    assert_string_equal(a->s, b->s);
    free(lh);
    free(a);
    free(b);
    st_model_free(hf);
}

static void test_architectures(void **state) {
    (void)state;
    static const struct {
        const char *arch, *dtype;
        int shards;
    } cases[] = {
        {"llama", "F32", 1},  {"llama3", "F32", 1}, {"qwen2", "F32", 1}, {"mistral", "F32", 1},
        {"smollm", "F32", 1}, {"llama", "BF16", 2}, {"qwen2", "F16", 3}, {"llama3", "BF16", 1},
    };
    const int32_t toks[12] = {1, 404, 374, 279, 1101, 15, 70, 300, 1300, 2000, 5, 7};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char dir[640], gguf[700];
        snprintf(dir, sizeof dir, "%s/%s_%s_%d", tmp, cases[c].arch, cases[c].dtype,
                 cases[c].shards);
        snprintf(gguf, sizeof gguf, "%s.gguf", dir);
        sh("HF_REF_TOKDIR='%s' %s %s/tests/oracle/hf_ref.py mk '%s' %s %d %s %d", tokdir(),
           ST_PYTHON3, ST_SOURCE_DIR, dir, cases[c].arch, (int)c + 1, cases[c].dtype,
           cases[c].shards);
        st_model *hf = NULL, *g = NULL;
        if (st_model_load(dir, &hf) != ST_OK)
            fprintf(stderr, "%s\n", st_last_error());
        assert_non_null(hf);
        float *lh = all_logits(hf, toks, 12);
        check_oracle(dir, lh, toks, 12, 2048);
        assert_int_equal(st_convert_hf(dir, gguf, -1), ST_OK);
        assert_int_equal(st_model_load(gguf, &g), ST_OK);
        float *lg = all_logits(g, toks, 12);
        assert_memory_equal(lh, lg, 12 * 2048 * sizeof(float));
        text_buf *a = malloc(sizeof *a), *b = malloc(sizeof *b);
        assert_true(a && b);
        /* speculation is lossless on every architecture: NGRAM trees of several shapes, both
         * backends, greedy and seeded sampling, against plain decoding */
        static const spec_case sc[] = {
            {1, 0, 0, 0, ST_ATTN_CASCADE, 0.0f}, {1, 2, 3, 8, ST_ATTN_CASCADE, 0.0f},
            {1, 4, 6, 32, ST_ATTN_DENSE, 0.0f},  {1, 1, 4, 5, ST_ATTN_DENSE, 0.0f},
            {1, 0, 0, 0, ST_ATTN_DENSE, 0.8f},   {1, 2, 3, 8, ST_ATTN_CASCADE, 0.8f},
        };
        spec_steps = 0;
        for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
            const spec_case plain = {0, 0, 0, 0, ST_ATTN_CASCADE, sc[i].temp};
            gen_with(hf, 48, &plain, a);
            gen_with(hf, 48, &sc[i], b);
            assert_int_equal(a->n_ids, b->n_ids);
            assert_memory_equal(a->ids, b->ids, (size_t)a->n_ids * sizeof(int32_t));
        }
        printf("  %s: %lld speculative steps in the matrix, all equal to plain decoding\n", dir,
               (long long)spec_steps);
        assert_true(spec_steps > 0);
        free(a);
        free(b);
        free(lh);
        free(lg);
        st_model_free(hf);
        st_model_free(g);
    }
}

/* Tokenizes every string of the oracle's list with the tokenizer converted from dir and
 * compares with the oracle's ids. */
static void compare_tokens(const char *dir, const char *pre, const char *chat_template) {
    char strings[700], expect[700];
    snprintf(strings, sizeof strings, "%s/strings.txt", tmp);
    snprintf(expect, sizeof expect, "%s/expect.txt", tmp);
    sh("%s %s/tests/oracle/hf_bpe.py strings 300 1 > '%s'", ST_PYTHON3, ST_SOURCE_DIR, strings);
    sh("%s %s/tests/oracle/hf_bpe.py tokenize '%s' '%s' > '%s'", ST_PYTHON3, ST_SOURCE_DIR, dir,
       strings, expect);
    st_gguf_writer *w = NULL;
    assert_int_equal(st_gguf_writer_create(&w), ST_OK);
    assert_int_equal(st_hf_tokenizer_to_gguf(dir, w, -1, -1), ST_OK);
    void *buf = NULL;
    size_t size = 0;
    assert_int_equal(st_gguf_writer_write_memory(w, &buf, &size), ST_OK);
    st_gguf_writer_free(w);
    st_gguf *g = NULL;
    st_tokenizer *tok = NULL;
    assert_int_equal(st_gguf_open_memory(buf, size, dir, &g), ST_OK);
    assert_int_equal(st_tokenizer_load(g, &tok), ST_OK);
    st_gguf_str kv;
    assert_int_equal(st_gguf_get_str(g, "tokenizer.ggml.pre", &kv), ST_OK);
    assert_true(kv.len == strlen(pre) && memcmp(kv.ptr, pre, kv.len) == 0);
    if (chat_template) {
        assert_int_equal(st_gguf_get_str(g, "tokenizer.chat_template", &kv), ST_OK);
        assert_true(kv.len == strlen(chat_template) && memcmp(kv.ptr, chat_template, kv.len) == 0);
    }
    FILE *f = fopen(expect, "r");
    assert_non_null(f);
    static char line[1 << 16];
    int n = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        char *hex = strtok(line, " \n");
        assert_non_null(hex);
        char text[8192];
        size_t len = 0;
        if (strcmp(hex, "-") != 0)
            for (size_t i = 0; hex[2 * i]; i++) {
                unsigned v;
                assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
                text[len++] = (char)v;
            }
        int32_t want[4096], got[4096];
        int64_t nw = 0, ng = 0;
        for (char *t = strtok(NULL, " \n"); t; t = strtok(NULL, " \n"))
            want[nw++] = atoi(t);
        assert_int_equal(
            st_tokenize(tok, text, len, st_tokenizer_add_bos_default(tok), got, 4096, &ng), ST_OK);
        if (ng != nw || memcmp(got, want, (size_t)nw * sizeof(int32_t)) != 0) {
            if (bad++ < 3) {
                fprintf(stderr, "mismatch on \"%.*s\": want", (int)len, text);
                for (int64_t i = 0; i < nw; i++)
                    fprintf(stderr, " %d", want[i]);
                fprintf(stderr, ", got");
                for (int64_t i = 0; i < ng; i++)
                    fprintf(stderr, " %d", got[i]);
                fprintf(stderr, "\n");
            }
        }
        n++;
    }
    fclose(f);
    printf("  %s: %d strings, %d differ\n", dir, n, bad);
    assert_int_equal(n, 300);
    assert_int_equal(bad, 0);
    st_tokenizer_free(tok);
    st_gguf_free(g);
    free(buf);
}

static void test_tokenizers(void **state) {
    (void)state;
    compare_tokens(tokdir(), "default", NULL);
    static const char *const pre[] = {"llama3", "qwen2", "smollm"};
    static const char *const gguf_pre[] = {"llama-bpe", "qwen2", "smollm"};
    for (int i = 0; i < 3; i++) {
        char dir[640];
        snprintf(dir, sizeof dir, "%s/tok_%s", tmp, pre[i]);
        sh("%s %s/tests/oracle/hf_bpe.py mkbytelevel '%s' %s", ST_PYTHON3, ST_SOURCE_DIR, dir,
           pre[i]);
        compare_tokens(dir, gguf_pre[i], "{{ messages }}");
    }
}

/* A fresh copy of a synthetic llama checkpoint in tmp/bad (2 shards), then `edit` (a shell
 * command run in it); loading must fail with one line naming `file` and `field`. */
static void expect_error(const char *edit, const char *file, const char *field) {
    char dir[640];
    snprintf(dir, sizeof dir, "%s/bad", tmp);
    sh("rm -rf '%s' && cp -r '%s/good' '%s' && cd '%s' && %s", dir, tmp, dir, dir, edit);
    st_model *m = NULL;
    assert_int_not_equal(st_model_load(dir, &m), ST_OK);
    assert_null(m);
    const char *e = st_last_error();
    printf("  %s\n", e);
    assert_non_null(strstr(e, file));
    assert_non_null(strstr(e, field));
    assert_null(strchr(e, '\n'));
}

static void test_errors(void **state) {
    (void)state;
    sh("HF_REF_TOKDIR='%s' %s %s/tests/oracle/hf_ref.py mk '%s/good' llama 5 F32 2", tokdir(),
       ST_PYTHON3, ST_SOURCE_DIR, tmp);
    st_model *m = NULL;
    char good[640];
    snprintf(good, sizeof good, "%s/good", tmp);
    assert_int_equal(st_model_load(good, &m), ST_OK);
    st_model_free(m);
#define PY "/usr/bin/python3 -c "
    /* a missing shard */
    expect_error("rm model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors", "");
    /* shapes that disagree with config.json */
    expect_error(PY "'import json;c=json.load(open(\"config.json\"));c[\"intermediate_size\"]=128;"
                    "json.dump(c,open(\"config.json\",\"w\"))'",
                 ".safetensors", "mlp.");
    /* an unknown dtype, and one the engine cannot compute with */
    expect_error(
        "sed -i '1s/\"dtype\": \"F32\"/\"dtype\": \"Q32\"/' model-00001-of-00002.safetensors",
        "model-00001-of-00002.safetensors", "dtype");
    expect_error("sed -i '1s/\"dtype\": \"F32\"/\"dtype\": \"I32\"/' "
                 "model-00001-of-00002.safetensors",
                 "model-00001-of-00002.safetensors", "I32");
    /* a tokenizer.json of another kind */
    expect_error(PY "'import json;t=json.load(open(\"tokenizer.json\"));t[\"model\"][\"type\"]="
                    "\"Unigram\";json.dump(t,open(\"tokenizer.json\",\"w\"))'",
                 "tokenizer.json", "model.type");
    expect_error(PY "'import json;t=json.load(open(\"tokenizer.json\"));t[\"normalizer\"]="
                    "{\"type\":\"NFKC\"};json.dump(t,open(\"tokenizer.json\",\"w\"))'",
                 "tokenizer.json", "normalizer");
    expect_error("rm tokenizer.json", "tokenizer.json", "");
    /* one added token with a huge id: ten million placeholder tokens are refused */
    expect_error(PY "'import json;t=json.load(open(\"tokenizer.json\"));t[\"added_tokens\"]"
                    ".append({\"id\":10531111,\"content\":\"<x>\",\"special\":True});"
                    "json.dump(t,open(\"tokenizer.json\",\"w\"))'",
                 "tokenizer.json", "more than half the ids would be unused");
    /* a vocabulary of added tokens only; merges naming pieces the vocabulary lacks (either
     * piece, or what they merge into); a merge repeated a million times */
    expect_error(PY "'import json;t=json.load(open(\"tokenizer.json\"));t[\"model\"][\"vocab\"]={};"
                    "t[\"model\"][\"merges\"]=[];json.dump(t,open(\"tokenizer.json\",\"w\"))'",
                 "tokenizer.json", "\"model.vocab\" is empty (there are only added tokens)");
    expect_error(PY "'import json;t=json.load(open(\"tokenizer.json\"));m=t[\"model\"][\"merges\"];"
                    "m.append(\"zzqx \"+m[0].split()[1] if isinstance(m[0],str) else "
                    "[\"zzqx\",m[0][1]]);json.dump(t,open(\"tokenizer.json\",\"w\"))'",
                 "tokenizer.json", "the left piece is not in \"model.vocab\"");
    expect_error(PY "'import json;t=json.load(open(\"tokenizer.json\"));v=t[\"model\"][\"vocab\"];"
                    "m=t[\"model\"][\"merges\"];ks=sorted(v,key=v.get)[-40:];"
                    "a,b=next((a,b) for a in ks for b in ks if a+b not in v);"
                    "m.append(a+\" \"+b if isinstance(m[0],str) else [a,b]);"
                    "json.dump(t,open(\"tokenizer.json\",\"w\"))'",
                 "tokenizer.json", "the merged piece is not in \"model.vocab\"");
    expect_error(PY "'import json;t=json.load(open(\"tokenizer.json\"));m=t[\"model\"][\"merges\"];"
                    "m.extend([m[0]]*1000000);json.dump(t,open(\"tokenizer.json\",\"w\"))'",
                 "tokenizer.json", "repeats merges[0]");
    /* config.json missing a field, or with one unsupported */
    expect_error(PY "'import json;c=json.load(open(\"config.json\"));del c[\"hidden_size\"];"
                    "json.dump(c,open(\"config.json\",\"w\"))'",
                 "config.json", "hidden_size");
    /* attention heads that do not fit the width: the message names the fields the file has */
    expect_error(PY "'import json;c=json.load(open(\"config.json\"));c[\"num_attention_heads\"]=6;"
                    "json.dump(c,open(\"config.json\",\"w\"))'",
                 "config.json",
                 "field \"hidden_size\" (64) is not a multiple of field \"num_attention_heads\" "
                 "(6), and there is no \"head_dim\"");
    expect_error(PY "'import json;c=json.load(open(\"config.json\"));c[\"num_attention_heads\"]=64;"
                    "json.dump(c,open(\"config.json\",\"w\"))'",
                 "config.json",
                 "the head width, field \"hidden_size\" (64) / field \"num_attention_heads\" (64) "
                 "= 1, is not even and at least 2");
    expect_error(PY "'import json;c=json.load(open(\"config.json\"));c[\"head_dim\"]=7;"
                    "json.dump(c,open(\"config.json\",\"w\"))'",
                 "config.json", "field \"head_dim\" (7) is not even and at least 2");
    expect_error(PY "'import json;c=json.load(open(\"config.json\"));c[\"num_key_value_heads\"]=3;"
                    "json.dump(c,open(\"config.json\",\"w\"))'",
                 "config.json",
                 "field \"num_attention_heads\" (4) is not a multiple of field "
                 "\"num_key_value_heads\" (3)");
    expect_error(PY "'import json;c=json.load(open(\"config.json\"));c[\"model_type\"]=\"gpt2\";"
                    "json.dump(c,open(\"config.json\",\"w\"))'",
                 "config.json", "model_type");
    expect_error(PY "'import json;c=json.load(open(\"config.json\"));c[\"rope_scaling\"]="
                    "{\"rope_type\":\"yarn\",\"factor\":4.0};json.dump(c,open(\"config.json\","
                    "\"w\"))'",
                 "config.json", "rope_scaling.rope_type");
    expect_error(PY "'import json;c=json.load(open(\"config.json\"));c[\"rope_scaling\"]="
                    "{\"rope_type\":\"llama3\",\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                    "\"original_max_position_embeddings\":64};json.dump(c,open(\"config.json\","
                    "\"w\"))'",
                 "config.json", "rope_scaling.factor");
    /* a tensor the architecture does not have */
    expect_error(PY "'import json,struct;b=open(\"model-00001-of-00002.safetensors\",\"rb\")."
                    "read();n=struct.unpack(\"<Q\",b[:8])[0];h=json.loads(b[8:8+n]);"
                    "k=[x for x in h if x.startswith(\"model.layers.0.mlp.gate\")][0];"
                    "h[\"model.layers.0.mlp.extra.weight\"]=h.pop(k);s=json.dumps(h).encode();"
                    "s+=b\" \"*(-len(s)%8);open(\"model-00001-of-00002.safetensors\",\"wb\")."
                    "write(struct.pack(\"<Q\",len(s))+s+b[8+n:]);i=json.load(open("
                    "\"model.safetensors.index.json\"));i[\"weight_map\"][\"model.layers.0.mlp."
                    "extra.weight\"]=i[\"weight_map\"].pop(k);json.dump(i,open(\"model."
                    "safetensors.index.json\",\"w\"))'",
                 "model-00001-of-00002.safetensors", "model.layers.0.mlp.extra.weight");
#undef PY
}

/* Every tensor of the GGUF at path has the type the K-quant rule gives it: for a mix (ftype),
 * st_kquant_tensor_type; for a single K-quant type kq, kq or its fallback; norms and other
 * vectors F32. Returns the number of K-quant tensors. */
static int check_kquant_types(const char *path, uint32_t ftype, uint32_t kq, int64_t n_layer,
                              int64_t n_gqa, int tied) {
    st_gguf *g = NULL;
    assert_int_equal(st_gguf_open(path, &g), ST_OK);
    int n_kq = 0;
    for (int64_t i = 0; i < st_gguf_n_tensors(g); i++) {
        const st_gguf_tensor *t = st_gguf_tensor_at(g, i);
        uint32_t want = ST_DTYPE_F32;
        if (t->n_dims == 2)
            want = ftype ? st_kquant_tensor_type(ftype, t->name, t->ne[0], n_layer, n_gqa, tied)
                         : st_kquant_fit_type(kq, t->ne[0]);
        if (t->type != want)
            fail_msg("%s: %s is %s, the mix rule says %s", path, t->name, st_dtype_name(t->type),
                     st_dtype_name(want));
        n_kq += t->type >= ST_DTYPE_Q2_K && t->type <= ST_DTYPE_Q6_K;
    }
    st_gguf_free(g);
    return n_kq;
}

static uint32_t tensor_type(const char *path, const char *name) {
    st_gguf *g = NULL;
    assert_int_equal(st_gguf_open(path, &g), ST_OK);
    const st_gguf_tensor *t = st_gguf_tensor_find(g, name);
    assert_non_null(t);
    const uint32_t type = t->type;
    st_gguf_free(g);
    return type;
}

/* spectree convert --type q4_k_m etc.: the per-tensor types of llama-quantize's mixes, files that
 * load and run. TinyStories-656K's rows (128 and 384 elements) are not whole super-blocks, so
 * every matrix takes the fallback (Q8_0 for Q4_K .. Q6_K) and its text is the q8_0 file's; a
 * synthetic checkpoint of width 256 (ffn 512) gets real K-quant tensors, whose logits stay near
 * the F32 file's. */
static void test_convert_kquant(void **state) {
    (void)state;
    static const char want[] = ", a little girl named Lily lived in a small house";
    static const struct {
        const char *name;
        int type;
        uint32_t ftype, kq;
    } ts[] = {{"q4_k_m", ST_CONVERT_Q4_K_M, ST_FTYPE_Q4_K_M, 0},
              {"q6_k", ST_DTYPE_Q6_K, 0, ST_DTYPE_Q6_K}};
    text_buf *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    assert_true(a && b);
    for (size_t c = 0; c < sizeof ts / sizeof ts[0]; c++) {
        char path[640], q8[640];
        snprintf(path, sizeof path, "%s/ts_%s.gguf", tmp, ts[c].name);
        snprintf(q8, sizeof q8, "%s/ts_q8.gguf", tmp);
        assert_int_equal(st_convert_hf(tokdir(), path, ts[c].type), ST_OK);
        assert_int_equal(st_convert_hf(tokdir(), q8, ST_DTYPE_Q8_0), ST_OK);
        assert_int_equal(check_kquant_types(path, ts[c].ftype, ts[c].kq, 2, 2, 1), 0);
        assert_int_equal(tensor_type(path, "blk.1.ffn_down.weight"), ST_DTYPE_Q8_0);
        assert_int_equal(tensor_type(path, "token_embd.weight"), ST_DTYPE_Q8_0);
        st_model *g = NULL, *g8 = NULL;
        assert_int_equal(st_model_load(path, &g), ST_OK);
        assert_int_equal(st_model_load(q8, &g8), ST_OK);
        gen(g, 100, 0, a);
        gen(g8, 100, 0, b);
        printf("  TinyStories-656K as %s: %.60s...\n", ts[c].name, a->s);
        assert_int_equal(strncmp(a->s, want, strlen(want)), 0);
        assert_string_equal(a->s, b->s);
        st_model_free(g);
        st_model_free(g8);
    }
    /* width 256: real K-quant tensors */
    char dir[640], ref[700];
    snprintf(dir, sizeof dir, "%s/wide", tmp);
    snprintf(ref, sizeof ref, "%s/wide_f32.gguf", tmp);
    sh("HF_REF_TOKDIR='%s' %s %s/tests/oracle/hf_ref.py mk '%s' wide 7 F32 1", tokdir(), ST_PYTHON3,
       ST_SOURCE_DIR, dir);
    assert_int_equal(st_convert_hf(dir, ref, -1), ST_OK);
    st_model *m0 = NULL;
    assert_int_equal(st_model_load(ref, &m0), ST_OK);
    const int32_t toks[12] = {1, 404, 374, 279, 1101, 15, 70, 300, 1300, 2000, 5, 7};
    float *l0 = all_logits(m0, toks, 12);
    static const struct {
        const char *name;
        int type;
        uint32_t ftype, kq;
        double tol;
    } ws[] = {/* bounds: 1.4x what was measured (2026-11-30; uniform random weights are
               * the K-quants' worst case); the error must also fall with every added bit */
              {"q2_k", ST_DTYPE_Q2_K, 0, ST_DTYPE_Q2_K, 0.9},
              {"q3_k_m", ST_CONVERT_Q3_K_M, ST_FTYPE_Q3_K_M, 0, 0.33},
              {"q4_k_m", ST_CONVERT_Q4_K_M, ST_FTYPE_Q4_K_M, 0, 0.2},
              {"q5_k_s", ST_CONVERT_Q5_K_S, ST_FTYPE_Q5_K_S, 0, 0.12},
              {"q6_k", ST_DTYPE_Q6_K, 0, ST_DTYPE_Q6_K, 0.054}};
    double prev = INFINITY;
    for (size_t c = 0; c < sizeof ws / sizeof ws[0]; c++) {
        char path[700];
        snprintf(path, sizeof path, "%s/wide_%s.gguf", tmp, ws[c].name);
        assert_int_equal(st_convert_hf(dir, path, ws[c].type), ST_OK);
        /* 2 layers, 4 query heads on 2 KV heads, an output matrix of its own */
        const int n_kq = check_kquant_types(path, ws[c].ftype, ws[c].kq, 2, 2, 0);
        assert_int_equal(n_kq, 2 + 2 * 7); /* token_embd, output and 7 matrices a layer */
        st_model *m = NULL;
        assert_int_equal(st_model_load(path, &m), ST_OK);
        float *l = all_logits(m, toks, 12);
        double err = 0.0, mx = 0.0;
        for (size_t i = 0; i < 12 * 2048; i++) {
            assert_true(isfinite(l[i]));
            err = fmax(err, fabs((double)l[i] - l0[i]));
            mx = fmax(mx, fabs((double)l0[i]));
        }
        printf("  width-256 checkpoint as %s: %d K-quant tensors, logits within %.3f of the F32 "
               "file's (largest |logit| %.2f)\n",
               ws[c].name, n_kq, err, mx);
        assert_true(err <= ws[c].tol * mx);
        assert_true(err < prev);
        prev = err;
        gen(m, 32, 1, b); /* speculation runs on it */
        free(l);
        st_model_free(m);
    }
    /* llama-quantize's Q4_K_M on 2 layers: layer 1 (the last eighth) gets Q6_K attn_v/ffn_down */
    char q4km[700];
    snprintf(q4km, sizeof q4km, "%s/wide_q4_k_m.gguf", tmp);
    assert_int_equal(tensor_type(q4km, "output.weight"), ST_DTYPE_Q6_K);
    assert_int_equal(tensor_type(q4km, "token_embd.weight"), ST_DTYPE_Q4_K);
    assert_int_equal(tensor_type(q4km, "blk.0.attn_v.weight"), ST_DTYPE_Q4_K);
    assert_int_equal(tensor_type(q4km, "blk.1.attn_v.weight"), ST_DTYPE_Q6_K);
    assert_int_equal(tensor_type(q4km, "blk.1.ffn_down.weight"), ST_DTYPE_Q6_K);
    assert_int_equal(tensor_type(q4km, "blk.1.attn_q.weight"), ST_DTYPE_Q4_K);
    free(l0);
    free(a);
    free(b);
    st_model_free(m0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tinystories),    cmocka_unit_test(test_architectures),
        cmocka_unit_test(test_tokenizers),     cmocka_unit_test(test_errors),
        cmocka_unit_test(test_convert_kquant),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
