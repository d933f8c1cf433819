/*
 * test_e2e_grammar.c: structured output is exact under speculation. On stories260K with a JSON
 * schema's grammar, the JSON-object grammar and a hand-written GBNF grammar: every drafter
 * (NGRAM, STANDALONE with the model as its own draft, the bundled EAGLE and EAGLE-3 heads) with
 * fixed tree shapes, greedy and seeded sampling, single sequences and a batch mixed with
 * unconstrained requests, emits token for token what plain decoding with the same grammar
 * emits; that differs from unconstrained decoding, every output is a prefix of a sentence of
 * the grammar, and one that ends at EOS is a whole sentence. A bad grammar is refused at submit.
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

static st_model *model, *eagle, *eagle3;
static char *schema_gbnf;

static const char *const schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":10},"
    "\"age\":{\"type\":\"integer\"},\"pet\":{\"enum\":[\"cat\",\"dog\",\"bird\"]},\"tags\":{"
    "\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^[a-z]{1,6}$\"},"
    "\"maxItems\":2}},\"required\":[\"name\",\"age\",\"pet\"],\"additionalProperties\":false}";

static const char *const story_gbnf = "root ::= \"Once upon a time, \" name \" \" words \".\"\n"
                                      "name ::= (\"Lily\" | \"Tom\" | \"Ben\") \" was\"\n"
                                      "words ::= [a-z]+ (\" \" [a-z]+){0,8}\n";

static int setup(void **state) {
    (void)state;
    if (st_model_load(tu_data("models/stories260K.gguf"), &model) != ST_OK ||
        st_eagle_head_load(tu_data("models/eagle-stories260K"), model, &eagle) != ST_OK ||
        st_eagle3_head_load(tu_data("models/eagle3-stories260K"), model, &eagle3) != ST_OK)
        return -1;
    return st_json_schema_to_gbnf(schema, strlen(schema), &schema_gbnf) == ST_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    st_grammar_text_free(schema_gbnf);
    st_model_free(eagle3);
    st_model_free(eagle);
    st_model_free(model);
    return 0;
}

typedef struct rec {
    int32_t toks[256];
    int n;
} rec;

static int record(void *user, int32_t t) {
    rec *r = user;
    if (r->n < 256)
        r->toks[r->n++] = t;
    return 0;
}

typedef struct brec {
    rec r[4];
} brec;

enum { N_GEN = 64, CTX = 256 };

static st_gen_params params(const st_sampler_params *sp, const st_spec_params *spec, int thr) {
    st_gen_params gp = st_gen_default_params();
    gp.n_predict = N_GEN, gp.sampler = *sp, gp.spec = *spec, gp.n_threads = thr, gp.n_ctx = CTX;
    return gp;
}

static void run(const int32_t *prompt, int64_t np, const st_sampler_params *sp,
                const st_spec_params *spec, int thr, rec *out, st_gen_stats *gs) {
    memset(out, 0, sizeof *out);
    st_gen_params gp = params(sp, spec, thr);
    if (st_generate(model, prompt, np, &gp, record, out, gs) != ST_OK)
        fail_msg("generate: %s", st_last_error());
}

static int same(const rec *a, const rec *b) {
    return a->n == b->n && !memcmp(a->toks, b->toks, sizeof(int32_t) * (size_t)a->n);
}

/* The output's bytes match grammar gbnf: a prefix, and a whole sentence when it ended at EOS
 * (fewer tokens than N_GEN). */
static void check_valid(const char *gbnf, const int32_t *prompt, int64_t np, const rec *r) {
    const st_tokenizer *t = st_model_tokenizer(model);
    st_detok d;
    st_detok_init(&d, t);
    st_detok_set_prev(&d, prompt[np - 1]);
    char text[4096];
    size_t n = 0, w;
    for (int i = 0; i < r->n; i++) {
        assert_int_equal(st_detok_push(&d, r->toks[i], text + n, sizeof text - n - 16, &w), ST_OK);
        n += w;
    }
    assert_int_equal(st_detok_flush(&d, text + n, 16, &w), ST_OK);
    n += w;
    st_grammar *g = NULL;
    assert_int_equal(st_grammar_parse(gbnf, strlen(gbnf), &g), ST_OK);
    int m = -2;
    assert_int_equal(st_grammar_match(g, text, n, &m), ST_OK);
    if (m < 0 || (r->n < N_GEN && m != 1))
        fail_msg("output %.*s (%d tokens) is %s", (int)n, text, r->n,
                 m < 0 ? "outside the grammar" : "not a whole sentence at EOS");
    st_grammar_free(g);
}

static void tokenize(const char *s, int32_t *out, int64_t *n) {
    assert_int_equal(st_tokenize(st_model_tokenizer(model), s, strlen(s), 1, out, 64, n), ST_OK);
}

static void test_exact_matrix(void **state) {
    (void)state;
    const char *grammars[3] = {schema_gbnf, st_grammar_json_object(), story_gbnf};
    const char *texts[2] = {"{\"name\":\"Lily\",\"age\":3,\"pet\":\"cat\"} {\"name\":\"",
                            "Once upon a time, Lily was"};
    const int shapes[3][3] = {{1, 3, 4}, {2, 3, 6}, {4, 3, 8}};
    int runs = 0, whole = 0, by_backend[2] = {0, 0};
    int64_t accepted = 0;
    for (int gi = 0; gi < 3; gi++)
        for (int p = 0; p < 2; p++)
            for (int smp = 0; smp < 2; smp++) {
                int32_t prompt[64];
                int64_t np;
                tokenize(texts[p], prompt, &np);
                st_sampler_params sp = st_sampler_default_params();
                sp.temp = smp ? 0.9f : 0.0f, sp.top_k = 40, sp.seed = 7 + (uint64_t)p;
                const st_spec_params none = st_spec_default_params();
                rec free_run, plain, got;
                st_gen_stats gs;
                run(prompt, np, &sp, &none, 1, &free_run, &gs);
                sp.grammar = grammars[gi];
                run(prompt, np, &sp, &none, 1, &plain, &gs);
                if (same(&plain, &free_run))
                    fail_msg("grammar %d does not change the output", gi);
                check_valid(grammars[gi], prompt, np, &plain);
                whole += plain.n < N_GEN;
                for (int algo = 0; algo < 4; algo++)
                    for (int sh = 0; sh < 3; sh++) {
                        st_spec_params spec = st_spec_default_params();
                        spec.algo = algo == 3   ? ST_SPEC_EAGLE3
                                    : algo == 2 ? ST_SPEC_EAGLE
                                    : algo == 1 ? ST_SPEC_STANDALONE
                                                : ST_SPEC_NGRAM;
                        spec.draft_model = algo == 3 ? eagle3 : algo == 2 ? eagle : model;
                        spec.ngram_min_match = 1;
                        spec.topk = shapes[sh][0];
                        spec.num_steps = shapes[sh][1];
                        spec.num_draft_tokens = shapes[sh][2];
                        /* each grammar and drafter meets both attention backends */
                        spec.backend = (p + smp + sh) % 2 ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
                        by_backend[(p + smp + sh) % 2]++;
                        run(prompt, np, &sp, &spec, 1 + (algo + sh) % 2, &got, &gs);
                        if (!same(&got, &plain))
                            fail_msg("grammar %d prompt %d %s algo %d shape %d (%s): speculative "
                                     "output differs from plain",
                                     gi, p, smp ? "sampled" : "greedy", algo, sh,
                                     st_attn_backend_name(spec.backend));
                        for (int k = 1; k <= shapes[sh][1]; k++)
                            accepted += gs.accept_hist[k];
                        runs++;
                    }
            }
    print_message("%d constrained speculative runs matched plain decoding (%d with the cascade "
                  "backend, %d dense; %d outputs ended as whole sentences); drafts accepted in "
                  "%lld steps\n",
                  runs, by_backend[0], by_backend[1], whole, (long long)accepted);
    assert_true(accepted > 0);
    assert_true(by_backend[0] > 0 && by_backend[1] > 0);
    assert_true(whole > 0);
}

/* A batch: two constrained sequences (different grammars) and two unconstrained ones share the
 * engine; each equals its own plain decoding (NGRAM and STANDALONE, both attention backends). */
static void test_exact_batch(void **state) {
    (void)state;
    const char *texts[4] = {"{\"name\":\"", "Once upon a time", "Lily and Tom", "{"};
    const char *gram[4] = {schema_gbnf, story_gbnf, NULL, NULL};
    int32_t toks[4][64];
    const int32_t *prompts[4];
    int64_t np[4];
    for (int b = 0; b < 4; b++) {
        tokenize(texts[b], toks[b], &np[b]);
        prompts[b] = toks[b];
    }
    for (int smp = 0; smp < 2; smp++)
        for (int algo = 0; algo < 4; algo++) {
            st_engine_params ep = st_engine_default_params();
            st_spec_params spec = st_spec_default_params();
            spec.algo = algo & 1 ? ST_SPEC_STANDALONE : ST_SPEC_NGRAM;
            spec.draft_model = model, spec.ngram_min_match = 1;
            spec.topk = 2, spec.num_steps = 3, spec.num_draft_tokens = 6;
            spec.backend = algo & 2 ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
            st_sampler_params sp = st_sampler_default_params();
            sp.temp = smp ? 0.8f : 0.0f, sp.seed = 5;
            ep.gen = params(&sp, &spec, 2);
            ep.max_running = 4;
            st_engine *e = NULL;
            assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
            brec got;
            memset(&got, 0, sizeof got);
            for (int b = 0; b < 4; b++) {
                st_request_params rp = st_engine_request_defaults(e);
                rp.sampler.grammar = gram[b];
                assert_int_equal(
                    st_engine_submit(e, prompts[b], np[b], &rp, record, NULL, &got.r[b], NULL),
                    ST_OK);
            }
            int guard = 0;
            while (st_engine_running(e) + st_engine_queued(e) > 0 && guard++ < 10000)
                assert_int_equal(st_engine_step(e), ST_OK);
            st_engine_free(e);
            for (int b = 0; b < 4; b++) {
                rec one;
                st_gen_stats gs;
                const st_spec_params none = st_spec_default_params();
                st_sampler_params s1 = sp;
                s1.grammar = gram[b];
                run(prompts[b], np[b], &s1, &none, 1, &one, &gs);
                if (!same(&got.r[b], &one))
                    fail_msg("batch %s %s, %s backend: sequence %d differs from plain",
                             smp ? "sampled" : "greedy", algo & 1 ? "STANDALONE" : "NGRAM",
                             st_attn_backend_name(spec.backend), b);
                if (gram[b])
                    check_valid(gram[b], prompts[b], np[b], &one);
            }
        }
}

static void test_bad_grammar(void **state) {
    (void)state;
    st_engine *e = NULL;
    assert_int_equal(st_engine_create(model, NULL, &e), ST_OK);
    st_request_params rp = st_engine_request_defaults(e);
    rp.sampler.grammar = "root ::= undefined-rule\n";
    const int32_t prompt[2] = {1, 403};
    uint64_t id = 1;
    assert_int_equal(st_engine_submit(e, prompt, 2, &rp, NULL, NULL, NULL, &id), ST_ERR_INVALID);
    assert_non_null(strstr(st_last_error(), "undefined rule 'undefined-rule'"));
    assert_int_equal(id, 0);
    st_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_matrix),
        cmocka_unit_test(test_exact_batch),
        cmocka_unit_test(test_bad_grammar),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
