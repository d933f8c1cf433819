/*
 * test_e2e_spec.c: speculation is invisible (DESIGN.md invariant 1). On stories260K, for
 * several prompts, every drafter (NGRAM; STANDALONE with stories260K as its own draft; EAGLE
 * and EAGLE3 with random heads in the published layouts written here, F32 and F16, EAGLE-3's
 * with a reduced draft vocabulary and with the full one, and heads converted to Q8_0 by
 * st_eagle_head_set_type, whose drafts may differ from the F32 ones), tree shapes K in
 * {1, 2, 4} (and 10 for EAGLE), S in {1, 3, 6}, N in {2, 4, 8, 16, 32} and auto, both attention
 * backends and 1 or 2 threads, f32 and f16 KV caches, greedy and seeded sampling, single
 * sequences and batches: the generated tokens equal plain decoding with the same seed and cache.
 * With the model as its own draft and K = 1, greedy decoding accepts every draft. An output layer
 * padded past the tokenizer never yields an id without a token, plain or speculative.
 * Penalties, logit biases, ignore_eos and min_tokens (each shown to change the output) keep all
 * of this: every drafter and fixed tree shape, greedy and sampled, single, batched and mixed
 * with unpenalized requests in one engine, equals plain decoding with the same penalties.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "io/gguf_write.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "spectree.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static st_model *model;
/* EAGLE heads for stories260K: EAGLE-1's own layout in F32 (fc bias, no input norm, the
 * target's embedding) and an F16 one with an input norm and its own embedding */
static st_model *head32, *head16;
/* an F32 "bigram" head (tu_head.embed_values): token y's row is the target's state after
 * [BOS, y], so it drafts what the target predicts after y alone; accepted often */
static st_model *headbi;
static float bigram[512 * 64]; /* (n_vocab, n_embd) */
/* EAGLE-3 heads: F32 with a draft vocabulary of 160 whose ids land on the top of the target's
 * (d2t nonzero), and F16 with the full vocabulary and its own embedding */
static st_model *head3r, *head3f;
/* the bigram head and the reduced-vocabulary EAGLE-3 head with their matrices in Q8_0 */
static st_model *headbq, *head3q;

static st_model *write_head3(const char *name, int f16) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", ST_BUILD_DIR, name);
    static int64_t d2t[160];
    static uint8_t t2d[512];
    for (int32_t i = 0; i < 160; i++) { /* target ids 352..511 */
        d2t[i] = 352;
        t2d[352 + i] = 1;
    }
    tu_head3 h = {.n_embd = 64,
                  .n_vocab = 512,
                  .n_draft = f16 ? 512 : 160,
                  .n_head = 8,
                  .n_head_kv = 4,
                  .n_ff = 128,
                  .target_layers = 5,
                  .layer_ids = {0, 2, 4},
                  .dtype = f16 ? ST_SF_F16 : ST_SF_F32,
                  .seed = f16 ? 4 : 3,
                  .scale = 2.0f,
                  .embed = f16,
                  .d2t = f16 ? NULL : d2t,
                  .t2d = f16 ? NULL : t2d};
    st_model *head = NULL;
    if (tu_write_eagle3_head(dir, &h) != 0 || st_eagle_head_load(dir, model, &head) != ST_OK)
        return NULL;
    return head;
}

static st_status keep_state(void *user, int64_t pos, const float *state) {
    if (pos == 1)
        memcpy(user, state, 64 * sizeof(float));
    return ST_OK;
}

static st_model *write_head(const char *name, int f16, const float *embed_values) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", ST_BUILD_DIR, name);
    tu_head h = {.n_embd = 64,
                 .n_vocab = 512,
                 .n_head = 8,
                 .n_head_kv = 4,
                 .n_ff = 128,
                 .dtype = f16 ? ST_SF_F16 : ST_SF_F32,
                 .seed = f16 ? 2 : 1,
                 .scale = 2.0f,
                 .no_bias = f16,
                 .input_norm = f16,
                 .embed = f16,
                 .embed_values = embed_values};
    st_model *head = NULL;
    if (tu_write_eagle_head(dir, &h) != 0 || st_eagle_head_load(dir, model, &head) != ST_OK)
        return NULL;
    return head;
}

static int setup(void **state) {
    (void)state;
    if (st_model_load(tu_data("models/stories260K.gguf"), &model) != ST_OK)
        return -1;
    head32 = write_head("test_e2e_eagle_f32", 0, NULL);
    head16 = write_head("test_e2e_eagle_f16", 1, NULL);
    st_session *s = NULL;
    if (st_session_create(model, NULL, &s) != ST_OK)
        return -1;
    for (int32_t y = 0; y < 512; y++) {
        const int32_t two[2] = {1, y};
        if (st_session_seq_reset(s, 0) != ST_OK ||
            st_session_eval_states(s, 0, two, 2, NULL, 0, keep_state, bigram + y * 64) != ST_OK)
            return -1;
    }
    st_session_free(s);
    headbi = write_head("test_e2e_eagle_bigram", 0, bigram);
    head3r = write_head3("test_e2e_eagle3_f32", 0);
    head3f = write_head3("test_e2e_eagle3_f16", 1);
    headbq = write_head("test_e2e_eagle_bigram", 0, bigram);
    head3q = write_head3("test_e2e_eagle3_f32", 0);
    if (!headbq || st_eagle_head_set_type(headbq, ST_DTYPE_Q8_0) != ST_OK || !head3q ||
        st_eagle_head_set_type(head3q, ST_DTYPE_Q8_0) != ST_OK)
        return -1;
    return head32 && head16 && headbi && head3r && head3f ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    st_model_free(head3q);
    st_model_free(headbq);
    st_model_free(head3f);
    st_model_free(head3r);
    st_model_free(headbi);
    st_model_free(head16);
    st_model_free(head32);
    st_model_free(model);
    return 0;
}

typedef struct rec {
    int32_t toks[512];
    int n;
} rec;

static int record(void *user, int32_t t) {
    rec *r = user;
    if (r->n < 512)
        r->toks[r->n++] = t;
    return 0;
}

enum { N_GEN = 32, CTX = 256 };

/* The KV cache type (K and V) of the target in the calls below. */
static uint32_t kv_type = ST_DTYPE_F32;

/* The generation parameters of one call (sampler and spec copied from the pointers). */
#define GEN_PARAMS(n_, sampler_, spec_, threads_, ctx_)                                            \
    (&(st_gen_params){.n_predict = (n_),                                                           \
                      .sampler = *(sampler_),                                                      \
                      .spec = *(spec_),                                                            \
                      .n_threads = (threads_),                                                     \
                      .n_ctx = (ctx_),                                                             \
                      .type_k = kv_type,                                                           \
                      .type_v = kv_type})

static void run(const int32_t *prompt, int np, const st_sampler_params *sp,
                const st_spec_params *spec, int threads, rec *out, st_gen_stats *gs) {
    memset(out, 0, sizeof *out);
    st_status s =
        st_generate(model, prompt, np, GEN_PARAMS(N_GEN, sp, spec, threads, CTX), record, out, gs);
    if (s != ST_OK)
        fail_msg("generate: %s", st_last_error());
}

static void test_lossless_matrix(void **state) {
    (void)state;
    const int32_t prompts[3][8] = {{1, 403, 407, 261, 378, 0, 0, 0},
                                   {1, 300, 301, 302, 303, 304, 305, 306},
                                   {1, 265, 282, 295, 433, 426, 385, 328}};
    const int np[3] = {5, 8, 8};
    const int Ks[] = {1, 2, 4}, Ss[] = {1, 3, 6}, Ns[] = {2, 4, 8, 16, 32};
    st_sampler_params greedy = {.temp = 0.0f};
    st_sampler_params sampled = {.temp = 0.8f, .top_p = 0.9f, .top_k = 40, .min_p = 0.0f};
    int runs = 0;
    int64_t eagle_accepted = 0;
    for (int p = 0; p < 3; p++)
        for (int smp = 0; smp < 2; smp++) {
            st_sampler_params sp = smp ? sampled : greedy;
            sp.seed = 1234 + (uint64_t)p;
            rec plains[2], got;
            st_gen_stats gs;
            st_spec_params none = st_spec_default_params();
            for (int kv = 0; kv < 2; kv++) {
                kv_type = kv ? ST_DTYPE_F16 : ST_DTYPE_F32;
                run(prompts[p], np[p], &sp, &none, 1, &plains[kv], &gs);
                assert_int_equal(plains[kv].n, N_GEN);
            }
            for (int algo = 0; algo < 4; algo++)
                for (size_t ki = 0; ki < 3; ki++)
                    for (size_t si = 0; si < 3; si++)
                        for (size_t ni = 0; ni < 5; ni++) {
                            int K = Ks[ki], S = Ss[si], N = Ns[ni];
                            if (K == 1 && ni > 0)
                                continue; /* K = 1 forces N = S + 1 */
                            if (K > 1 && N - 1 > K + (S - 1) * K * K)
                                continue;
                            st_spec_params spec = st_spec_default_params();
                            spec.algo = algo == 3   ? ST_SPEC_EAGLE3
                                        : algo == 2 ? ST_SPEC_EAGLE
                                        : algo == 1 ? ST_SPEC_STANDALONE
                                                    : ST_SPEC_NGRAM;
                            spec.draft_model = algo == 3   ? (p == 1   ? head3f
                                                              : p == 2 ? head3q
                                                                       : head3r)
                                               : algo == 2 ? (p == 1   ? head32
                                                              : p == 2 ? headbq
                                                                       : headbi)
                                                           : model;
                            spec.ngram_min_match = 1; /* draft as often as possible */
                            spec.topk = K;
                            spec.num_steps = S;
                            spec.num_draft_tokens = N;
                            /* vary backend and threads across the matrix */
                            int v = (int)(ki + si + ni + (size_t)p + (size_t)smp);
                            spec.backend = v % 2 ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
                            int threads = 1 + (v / 2) % 2;
                            const int kv = (v / 4 + algo) % 2;
                            kv_type = kv ? ST_DTYPE_F16 : ST_DTYPE_F32;
                            const rec plain = plains[kv];
                            run(prompts[p], np[p], &sp, &spec, threads, &got, &gs);
                            if (got.n != plain.n ||
                                memcmp(got.toks, plain.toks, sizeof(int32_t) * (size_t)plain.n))
                                fail_msg("mismatch: prompt %d %s algo %d K %d S %d N %d %s "
                                         "threads %d kv %s",
                                         p, smp ? "sampled" : "greedy", algo, K, S, N,
                                         st_attn_backend_name(spec.backend), threads,
                                         kv ? "f16" : "f32");
                            assert_true(gs.spec_steps > 0);
                            if (algo == 1 && K == 1 && !smp) /* self-draft chain: all accepted */
                                assert_int_equal(gs.accept_hist[S], gs.spec_steps);
                            for (int k = 1; algo == 2 && k <= S; k++)
                                eagle_accepted += gs.accept_hist[k];
                            runs++;
                        }
        }
    kv_type = ST_DTYPE_F32;
    print_message("%d speculative runs matched plain decoding; EAGLE accepted drafts in %lld "
                  "steps\n",
                  runs, (long long)eagle_accepted);
    assert_true(eagle_accepted > 0); /* the accepted paths' states were handed over too */
}

/* auto shapes with the controller, and both backends with all options on one config */
static void test_auto_and_stop(void **state) {
    (void)state;
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    st_sampler_params sp = {.temp = 0.0f};
    rec plain, got;
    st_gen_stats gs;
    st_spec_params spec = st_spec_default_params();
    run(prompt, 5, &sp, &spec, 2, &plain, &gs);
    for (int algo = 1; algo <= 4; algo++) {
        spec = st_spec_default_params();
        spec.algo = algo == 1   ? ST_SPEC_STANDALONE
                    : algo == 2 ? ST_SPEC_NGRAM
                    : algo == 3 ? ST_SPEC_EAGLE
                                : ST_SPEC_EAGLE3;
        spec.draft_model = algo == 3 ? head32 : algo == 4 ? head3r : model;
        run(prompt, 5, &sp, &spec, 2, &got, &gs);
        assert_int_equal(got.n, plain.n);
        assert_memory_equal(got.toks, plain.toks, sizeof(int32_t) * (size_t)plain.n);
    }
    /* bad parameters are errors */
    spec = st_spec_default_params();
    spec.algo = ST_SPEC_NGRAM;
    spec.topk = 2;
    spec.num_steps = 2;
    spec.num_draft_tokens = 64; /* more than 1 + K + (S-1)K^2 = 7 */
    assert_int_equal(
        st_generate(model, prompt, 5, GEN_PARAMS(8, &sp, &spec, 1, CTX), record, &got, &gs),
        ST_ERR_INVALID);
    spec = st_spec_default_params();
    spec.algo = ST_SPEC_STANDALONE;
    assert_int_equal(
        st_generate(model, prompt, 5, GEN_PARAMS(8, &sp, &spec, 1, CTX), record, &got, &gs),
        ST_ERR_INVALID);
    st_spec_algo a;
    assert_int_equal(st_spec_algo_parse("ngram", &a), ST_OK);
    assert_int_equal(a, ST_SPEC_NGRAM);
    assert_int_equal(st_spec_algo_parse("EAGLE3", &a), ST_OK);
    assert_int_equal(a, ST_SPEC_EAGLE3);
    assert_int_equal(st_spec_algo_parse("bogus", &a), ST_ERR_INVALID);
}

typedef struct brec {
    rec r[4];
} brec;

static int record_seq(void *user, int32_t seq, int32_t t) {
    brec *b = user;
    return record(&b->r[seq], t);
}

/* A batch of prompts verified together gives each sequence exactly its own output. */
static void test_batch(void **state) {
    (void)state;
    const int32_t p0[] = {1, 403, 407, 261, 378}, p1[] = {1, 300, 301, 302, 303, 304, 305},
                  p2[] = {1, 265, 282}, p3[] = {1, 7, 90, 450, 511, 3};
    const int32_t *prompts[4] = {p0, p1, p2, p3};
    const int64_t np[4] = {5, 7, 3, 6};
    /* cfg 8..11: auto shapes (the controller); 12, 13: plain decoding of the batch (one
     * forward pass per step for all sequences); odd cfg / 2 with an f16 KV cache */
    for (int cfg = 0; cfg < 14; cfg++) {
        kv_type = cfg / 2 % 2 ? ST_DTYPE_F16 : ST_DTYPE_F32;
        st_sampler_params sp = {
            .temp = cfg & 1 ? 0.8f : 0.0f, .top_k = 40, .top_p = 0.9f, .seed = 77};
        st_spec_params spec = st_spec_default_params();
        spec.algo = cfg & 2 ? ST_SPEC_STANDALONE : ST_SPEC_NGRAM;
        spec.draft_model = model;
        spec.backend = cfg & 4 ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
        spec.ngram_min_match = 1;
        spec.topk = 2;
        spec.num_steps = 3;
        spec.num_draft_tokens = 6;
        if (cfg >= 8)
            spec.topk = spec.num_steps = spec.num_draft_tokens = 0;
        if (cfg >= 12)
            spec.algo = ST_SPEC_NONE;
        brec got;
        memset(&got, 0, sizeof got);
        st_gen_stats gs;
        assert_int_equal(st_generate_batch(model, 4, prompts, np,
                                           GEN_PARAMS(N_GEN, &sp, &spec, 2, CTX), record_seq, &got,
                                           &gs),
                         ST_OK);
        if (cfg < 8) /* fixed shapes always verify a found draft; auto may find none worth it */
            assert_true(gs.spec_steps > 0);
        if (cfg >= 12)
            assert_int_equal(gs.spec_steps, 0);
        for (int b = 0; b < 4; b++) {
            rec one;
            st_spec_params none = st_spec_default_params();
            run(prompts[b], (int)np[b], &sp, &none, 1, &one, &gs);
            assert_int_equal(got.r[b].n, one.n);
            assert_memory_equal(got.r[b].toks, one.toks, sizeof(int32_t) * (size_t)one.n);
        }
    }
    kv_type = ST_DTYPE_F32;
}

/* EAGLE and EAGLE3 in batches of three sequences (one verify pass for all trees, one head
 * session per sequence): the bigram and the F16 head (EAGLE3: the reduced and the full
 * vocabulary), fixed shapes up to K = 10 and auto, greedy and sampled, both backends, 1 and 2
 * threads; every sequence equals its own plain decoding. */
static void test_eagle_batch(void **state) {
    (void)state;
    const int32_t p0[] = {1, 403, 407, 261, 378}, p1[] = {1, 300, 301, 302, 303, 304, 305},
                  p2[] = {1, 265};
    const int32_t *prompts[3] = {p0, p1, p2};
    const int64_t np[3] = {5, 7, 2};
    const int shapes[][3] = {{1, 4, 0}, {2, 3, 6}, {4, 4, 12}, {10, 2, 16}, {0, 0, 0}};
    int runs = 0;
    for (int cfg = 0; cfg < 2 * 2 * 2 * 5; cfg++) {
        const int smp = cfg & 1, f16 = (cfg >> 1) & 1, sh = (cfg >> 2) % 5, e3 = cfg / 20;
        st_sampler_params sp = {.temp = smp ? 0.8f : 0.0f, .top_k = 40, .top_p = 0.9f, .seed = 9};
        st_spec_params spec = st_spec_default_params();
        spec.algo = e3 ? ST_SPEC_EAGLE3 : ST_SPEC_EAGLE;
        spec.draft_model = e3 ? (f16 ? head3f : head3r) : f16 ? head16 : headbi;
        spec.backend = (cfg + sh) % 2 ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
        spec.topk = shapes[sh][0];
        spec.num_steps = shapes[sh][1];
        spec.num_draft_tokens = shapes[sh][2];
        const int threads = 1 + (cfg >> 1) % 2;
        brec got;
        memset(&got, 0, sizeof got);
        st_gen_stats gs;
        assert_int_equal(st_generate_batch(model, 3, prompts, np,
                                           GEN_PARAMS(N_GEN, &sp, &spec, threads, CTX), record_seq,
                                           &got, &gs),
                         ST_OK);
        if (spec.topk) /* fixed shapes verify every step's drafts */
            assert_true(gs.spec_steps > 0);
        for (int b = 0; b < 3; b++) {
            rec one;
            st_spec_params none = st_spec_default_params();
            run(prompts[b], (int)np[b], &sp, &none, 1, &one, &gs);
            if (got.r[b].n != one.n ||
                memcmp(got.r[b].toks, one.toks, sizeof(int32_t) * (size_t)one.n))
                fail_msg("%s batch mismatch: sequence %d, %s head, K %d S %d N %d, %s, %s, "
                         "%d threads",
                         st_spec_algo_name(spec.algo), b, f16 ? "F16" : "F32", spec.topk,
                         spec.num_steps, spec.num_draft_tokens, smp ? "sampled" : "greedy",
                         st_attn_backend_name(spec.backend), threads);
            runs++;
        }
    }
    print_message("%d EAGLE batch sequences matched plain decoding\n", runs);
}

/* STANDALONE with a small synthetic draft model of the same vocabulary written by
 * spectree-mkmodel (random weights: mostly wrong drafts), greedy and sampled, both backends. */
static void test_synthetic_draft(void **state) {
    (void)state;
    char path[1024], cmd[4096];
    snprintf(path, sizeof path, "%s/test_synthetic_draft.gguf", ST_BUILD_DIR);
    snprintf(cmd, sizeof cmd,
             "%s/spectree-mkmodel %s --vocab %s --dim 32 --ff 64 --layers 2 --heads 4 "
             "--kv-heads 2 --type f16 --seed 11 --ctx 512 2>/dev/null",
             ST_BUILD_DIR, path, tu_data("models/stories260K.gguf"));
    assert_int_equal(system(cmd), 0);
    st_model *draft = NULL;
    assert_int_equal(st_model_load(path, &draft), ST_OK);
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    for (int cfg = 0; cfg < 4; cfg++) {
        st_sampler_params sp = {
            .temp = cfg & 1 ? 0.8f : 0.0f, .top_k = 40, .top_p = 0.9f, .seed = 5};
        rec plain, got;
        st_gen_stats gs;
        st_spec_params none = st_spec_default_params();
        run(prompt, 5, &sp, &none, 1, &plain, &gs);
        st_spec_params spec = st_spec_default_params();
        spec.algo = ST_SPEC_STANDALONE;
        spec.draft_model = draft;
        spec.backend = cfg & 2 ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
        spec.topk = 2;
        spec.num_steps = 3;
        spec.num_draft_tokens = 6;
        run(prompt, 5, &sp, &spec, 2, &got, &gs);
        assert_true(gs.spec_steps > 0);
        assert_int_equal(got.n, plain.n);
        assert_memory_equal(got.toks, plain.toks, sizeof(int32_t) * (size_t)plain.n);
    }
    /* a vocabulary mismatch is a clear error */
    snprintf(cmd, sizeof cmd,
             "%s/spectree-mkmodel %s --vocab %s --dim 32 --ff 64 --layers 1 --heads 4 "
             "--type f32 2>/dev/null",
             ST_BUILD_DIR, path, tu_data("tests/data/tokenizer/ggml-vocab-llama-spm.gguf"));
    assert_int_equal(system(cmd), 0);
    st_model *other = NULL;
    assert_int_equal(st_model_load(path, &other), ST_OK);
    st_spec_params spec = st_spec_default_params();
    spec.algo = ST_SPEC_STANDALONE;
    spec.draft_model = other;
    st_sampler_params sp = {.temp = 0.0f};
    rec got;
    st_gen_stats gs;
    assert_int_equal(
        st_generate(model, prompt, 5, GEN_PARAMS(8, &sp, &spec, 1, CTX), record, &got, &gs),
        ST_ERR_INVALID);
    assert_non_null(strstr(st_last_error(), "vocabulary"));
    st_model_free(other);
    st_model_free(draft);
    remove(path);
}

/* `auto` with a cheap draft model: a random target (--scale 0.1) and a draft made of its first
 * block (--keep-layers 1, bitwise the same weights), a third of its weight bytes, which drafts,
 * is probed and paused by the controller (it agrees with the target on a few percent of the
 * tokens). Whatever the controller decides, single sequences and batches equal plain decoding,
 * greedy and sampled. */
static void test_auto_draft_model(void **state) {
    (void)state;
    char tpath[1024], dpath[1024], cmd[4096];
    snprintf(tpath, sizeof tpath, "%s/test_auto_target.gguf", ST_BUILD_DIR);
    snprintf(dpath, sizeof dpath, "%s/test_auto_draft.gguf", ST_BUILD_DIR);
    for (int d = 0; d < 2; d++) {
        snprintf(cmd, sizeof cmd,
                 "%s/spectree-mkmodel %s --vocab %s --dim 64 --ff 256 --layers 4 --heads 4 "
                 "--scale 0.1 --seed 3 --ctx 512 %s 2>/dev/null",
                 ST_BUILD_DIR, d ? dpath : tpath, tu_data("models/stories260K.gguf"),
                 d ? "--keep-layers 1" : "");
        assert_int_equal(system(cmd), 0);
    }
    st_model *target = NULL, *draft = NULL;
    assert_int_equal(st_model_load(tpath, &target), ST_OK);
    assert_int_equal(st_model_load(dpath, &draft), ST_OK);
    const int32_t p0[] = {1, 403, 407, 261, 378}, p1[] = {1, 300, 301}, p2[] = {1, 7, 90, 450};
    const int32_t *prompts[3] = {p0, p1, p2};
    const int64_t np[3] = {5, 3, 4};
    int64_t spec_steps = 0;
    for (int smp = 0; smp < 2; smp++) {
        st_sampler_params sp = {.temp = smp ? 0.8f : 0.0f, .top_k = 40, .top_p = 0.9f, .seed = 21};
        st_spec_params none = st_spec_default_params(), spec = st_spec_default_params();
        spec.algo = ST_SPEC_STANDALONE;
        spec.draft_model = draft;
        brec got;
        memset(&got, 0, sizeof got);
        st_gen_stats gs;
        assert_int_equal(st_generate_batch(target, 3, prompts, np,
                                           GEN_PARAMS(200, &sp, &spec, 1, CTX), record_seq, &got,
                                           &gs),
                         ST_OK);
        spec_steps += gs.spec_steps;
        for (int b = 0; b < 3; b++) {
            rec one, alone;
            one.n = alone.n = 0;
            assert_int_equal(st_generate(target, prompts[b], np[b],
                                         GEN_PARAMS(200, &sp, &none, 1, CTX), record, &one, &gs),
                             ST_OK);
            assert_int_equal(got.r[b].n, one.n);
            assert_memory_equal(got.r[b].toks, one.toks, sizeof(int32_t) * (size_t)one.n);
            assert_int_equal(st_generate(target, prompts[b], np[b],
                                         GEN_PARAMS(200, &sp, &spec, 1, CTX), record, &alone, &gs),
                             ST_OK);
            spec_steps += gs.spec_steps;
            assert_int_equal(alone.n, one.n);
            assert_memory_equal(alone.toks, one.toks, sizeof(int32_t) * (size_t)one.n);
        }
    }
    print_message("auto with the one-block draft: %lld verified trees over 8 runs\n",
                  (long long)spec_steps);
    st_model_free(draft);
    st_model_free(target);
    remove(tpath);
    remove(dpath);
}

typedef struct alloc_rec {
    int n;
    int64_t first, last;
} alloc_rec;

static int count_allocs(void *user, int32_t t) {
    (void)t;
    alloc_rec *a = user;
    if (a->n++ == 1)
        a->first = st_alloc_count();
    a->last = st_alloc_count();
    return 0;
}

/* The generation loop allocates nothing once it runs: build, verify, sampling, commit and
 * drafting all use buffers sized at the start. */
static void test_no_alloc_in_loop(void **state) {
    (void)state;
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    for (int algo = 0; algo < 8; algo++) { /* 3: NGRAM with auto shapes; 4, 5: EAGLE; 6, 7:
                                            * EAGLE3 */
        st_sampler_params sp = {
            .temp = algo == 2 ? 0.8f : 0.0f, .top_k = 40, .top_p = 0.9f, .seed = 1};
        st_spec_params spec = st_spec_default_params();
        spec.algo = algo == 1   ? ST_SPEC_STANDALONE
                    : algo >= 6 ? ST_SPEC_EAGLE3
                    : algo >= 4 ? ST_SPEC_EAGLE
                                : ST_SPEC_NGRAM;
        spec.draft_model = algo == 4   ? headbi
                           : algo == 5 ? head16
                           : algo == 6 ? head3r
                           : algo == 7 ? head3f
                                       : model;
        spec.ngram_min_match = 1;
        spec.topk = 2;
        spec.num_steps = 3;
        spec.num_draft_tokens = 6;
        spec.backend = algo == 2 ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
        if (algo == 3 || algo == 5 || algo == 7)
            spec.topk = spec.num_steps = spec.num_draft_tokens = 0;
        alloc_rec a = {0, 0, 0};
        st_gen_stats gs;
        assert_int_equal(st_generate(model, prompt, 5, GEN_PARAMS(64, &sp, &spec, 2, CTX),
                                     count_allocs, &a, &gs),
                         ST_OK);
        assert_true(a.n > 10);
        if (algo < 3 || algo == 4 || algo == 6)
            assert_true(gs.spec_steps > 0);
        assert_int_equal(a.last, a.first);
    }
}

/* Non-finite numbers: a NaN in a norm weight is refused at load (every norm value is checked,
 * and the first values of each matrix); a NaN deeper in a matrix passes that check but makes the
 * logits NaN, which generation reports as an error naming the position instead of printing
 * nothing. */
static void test_non_finite(void **state) {
    (void)state;
    size_t size = 0;
    char *buf = tu_read_file(tu_data("models/stories260K.gguf"), &size);
    assert_non_null(buf);
    st_gguf *g;
    assert_int_equal(st_gguf_open_memory(buf, size, "nan.gguf", &g), ST_OK);
    float *norm = (float *)st_gguf_tensor_find(g, "blk.2.ffn_norm.weight")->data;
    const st_gguf_tensor *emb = st_gguf_tensor_find(
        g, st_gguf_tensor_find(g, "output.weight") ? "output.weight" : "token_embd.weight");
    assert_int_equal(emb->type, ST_DTYPE_F32);
    float *deep = (float *)emb->data + 300 * emb->ne[0] + 7; /* row 300: past the load check */
    st_gguf_free(g);
    const float saved = norm[5];
    norm[5] = NAN;
    st_model *m = NULL;
    assert_int_equal(st_model_load_memory(buf, size, "nan.gguf", &m), ST_ERR_FORMAT);
    assert_non_null(strstr(st_last_error(), "blk.2.ffn_norm.weight"));
    assert_non_null(strstr(st_last_error(), "non-finite"));
    norm[5] = saved;
    *deep = NAN;
    assert_int_equal(st_model_load_memory(buf, size, "nan.gguf", &m), ST_OK);
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    st_gen_params gp = st_gen_default_params();
    gp.n_predict = 8;
    gp.sampler.temp = 0.0f;
    rec got;
    memset(&got, 0, sizeof got);
    st_gen_stats gs;
    assert_int_equal(st_generate(m, prompt, 5, &gp, record, &got, &gs), ST_ERR_FORMAT);
    assert_non_null(strstr(st_last_error(), "position 5"));
    assert_non_null(strstr(st_last_error(), "NaN"));
    assert_int_equal(got.n, 0);
    st_model_free(m);
    free(buf);
}

/* stories260K with its embedding and output layer padded from 512 to 1024 rows, as published
 * checkpoints pad vocab_size past their tokenizer: output row 512 + j is twice row j, so at any
 * position whose best logit is positive an unchosen padded id would win. *buf holds the file
 * (the model reads it in place). */
static st_model *padded_model(void **buf) {
    size_t size = 0;
    char *src = tu_read_file(tu_data("models/stories260K.gguf"), &size);
    assert_non_null(src);
    st_gguf *g;
    assert_int_equal(st_gguf_open_memory(src, size, "stories260K.gguf", &g), ST_OK);
    st_gguf_writer *w;
    assert_int_equal(st_gguf_writer_create(&w), ST_OK);
    for (int64_t i = 0; i < st_gguf_n_kv(g); i++)
        assert_int_equal(st_gguf_writer_copy_kv(w, g, st_gguf_key(g, i)), ST_OK);
    enum { E = 64, V = 512 };
    static float rows[2][2 * V * E];
    for (int64_t i = 0; i < st_gguf_n_tensors(g); i++) {
        const st_gguf_tensor *t = st_gguf_tensor_at(g, i);
        const int out = !strcmp(t->name, "output.weight");
        if (!out && strcmp(t->name, "token_embd.weight")) {
            assert_int_equal(st_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne,
                                                       t->data, t->size, ST_GGUF_COPY),
                             ST_OK);
            continue;
        }
        assert_int_equal(t->type, ST_DTYPE_F32);
        assert_int_equal(t->ne[0] * t->ne[1], E * V);
        float *r = rows[out];
        memcpy(r, t->data, sizeof(float) * E * V);
        for (int64_t j = 0; j < (int64_t)E * V; j++)
            r[E * V + j] = out ? 2.0f * r[j] : r[j];
        const int64_t ne[2] = {E, 2 * V};
        assert_int_equal(st_gguf_writer_add_tensor(w, t->name, ST_DTYPE_F32, 2, ne, r,
                                                   sizeof(float) * 2 * E * V, ST_GGUF_COPY),
                         ST_OK);
    }
    size_t n = 0;
    assert_int_equal(st_gguf_writer_write_memory(w, buf, &n), ST_OK);
    st_gguf_writer_free(w);
    st_gguf_free(g);
    free(src);
    st_model *m = NULL;
    assert_int_equal(st_model_load_memory(*buf, n, "padded.gguf", &m), ST_OK);
    assert_int_equal(st_model_get_hparams(m)->n_vocab, 2 * V);
    assert_int_equal(st_tokenizer_n_vocab(st_model_tokenizer(m)), V);
    return m;
}

static void test_padded_vocab(void **state) {
    (void)state;
    void *buf = NULL;
    st_model *pm = padded_model(&buf);
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    st_sampler_params greedy = st_sampler_default_params(), warm = greedy;
    greedy.temp = 0.0f;
    warm.temp = 0.8f, warm.seed = 7;
    const st_sampler_params *samplers[2] = {&greedy, &warm};
    for (int k = 0; k < 2; k++) {
        st_spec_params plain = st_spec_default_params();
        rec want, got;
        st_gen_stats gs;
        memset(&want, 0, sizeof want);
        assert_int_equal(st_generate(model, prompt, 5,
                                     GEN_PARAMS(N_GEN, samplers[k], &plain, 1, CTX), record, &want,
                                     &gs),
                         ST_OK);
        /* the construction: every position's best logit is positive (twice it is larger) */
        if (k == 0) {
            st_session *s = NULL;
            assert_int_equal(st_session_create(model, NULL, &s), ST_OK);
            float lg[512];
            for (int i = 0; i < want.n; i++) {
                const int32_t t = i == 0 ? 0 : want.toks[i - 1];
                if (i == 0)
                    assert_int_equal(st_session_eval(s, 0, prompt, 5, lg, 1), ST_OK);
                else
                    assert_int_equal(st_session_eval(s, 0, &t, 1, lg, 1), ST_OK);
                float mx = lg[0];
                for (int j = 1; j < 512; j++)
                    mx = lg[j] > mx ? lg[j] : mx;
                assert_true(mx > 0.0f);
            }
            st_session_free(s);
        }
        st_spec_params specs[3] = {plain, plain, plain};
        specs[1].algo = ST_SPEC_NGRAM;
        specs[2].algo = ST_SPEC_STANDALONE;
        specs[2].draft_model = pm;
        specs[2].topk = 1, specs[2].num_steps = 3;
        for (int a = 0; a < 3; a++) {
            memset(&got, 0, sizeof got);
            if (st_generate(pm, prompt, 5, GEN_PARAMS(N_GEN, samplers[k], &specs[a], 1, CTX),
                            record, &got, &gs) != ST_OK)
                fail_msg("generate: %s", st_last_error());
            /* the same tokens as the unpadded model: the padded rows are never candidates */
            assert_int_equal(got.n, want.n);
            assert_memory_equal(got.toks, want.toks, (size_t)want.n * sizeof *want.toks);
            for (int i = 0; i < got.n; i++)
                assert_true(got.toks[i] < 512);
            /* the model as its own draft never drafts a padded id: greedy accepts every draft */
            if (a == 2 && k == 0) {
                assert_true(gs.spec_steps > 0);
                assert_int_equal(gs.accept_hist[3], gs.spec_steps);
            }
        }
    }
    st_model_free(pm);
    free(buf);
}

/* Why generation stopped: length, the callback, the context. */
static int stop_after_3(void *user, int32_t t) {
    rec *r = user;
    record(user, t);
    return r->n >= 3;
}

static void test_stop_reasons(void **state) {
    (void)state;
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    st_gen_params gp = st_gen_default_params();
    gp.sampler.temp = 0.0f;
    gp.n_predict = 6;
    rec got;
    st_gen_stats gs;
    for (int algo = 0; algo < 2; algo++) {
        gp.spec.algo = algo ? ST_SPEC_NGRAM : ST_SPEC_NONE;
        gp.n_ctx = 0;
        memset(&got, 0, sizeof got);
        assert_int_equal(st_generate(model, prompt, 5, &gp, record, &got, &gs), ST_OK);
        assert_int_equal(gs.stop_reason[0], ST_STOP_LENGTH);
        assert_int_equal(got.n, 6);
        memset(&got, 0, sizeof got);
        assert_int_equal(st_generate(model, prompt, 5, &gp, stop_after_3, &got, &gs), ST_OK);
        assert_int_equal(gs.stop_reason[0], ST_STOP_STOP);
        assert_int_equal(got.n, 3);
        gp.n_ctx = 9; /* room for 4 more positions */
        gp.n_predict = 100;
        memset(&got, 0, sizeof got);
        assert_int_equal(st_generate(model, prompt, 5, &gp, record, &got, &gs), ST_OK);
        assert_int_equal(gs.stop_reason[0], ST_STOP_CONTEXT);
        assert_true(got.n >= 3 && got.n <= 5);
        gp.n_predict = 6;
    }
    assert_string_equal(st_stop_reason_name(ST_STOP_CONTEXT), "context");
    assert_string_equal(st_stop_reason_name(ST_STOP_EOS), "eos");
}

/* Penalty configurations; biases (ban, boost) are filled in per prompt. */
static st_sampler_params penalized(int cfg, int smp, const st_logit_bias *bias, int n_bias) {
    st_sampler_params sp = {.temp = smp ? 0.8f : 0.0f, .top_k = 40, .top_p = 0.9f, .seed = 99};
    switch (cfg) {
    case 0:
        sp.presence_penalty = 0.8f, sp.frequency_penalty = 0.6f;
        break;
    case 1:
        sp.repeat_penalty = 1.5f, sp.repeat_last_n = 16;
        break;
    case 2:
        sp.repeat_penalty = 1.3f, sp.repeat_last_n = -1, sp.presence_penalty = 0.4f;
        sp.frequency_penalty = 0.3f, sp.logit_bias = bias, sp.n_logit_bias = n_bias;
        sp.ignore_eos = 1, sp.min_tokens = 40;
        break;
    default:
        sp.logit_bias = bias, sp.n_logit_bias = n_bias;
        break;
    }
    return sp;
}

static int same(const rec *a, const rec *b) {
    return a->n == b->n && !memcmp(a->toks, b->toks, sizeof(int32_t) * (size_t)a->n);
}

/* Every drafter with fixed trees (so drafts are verified, and accepted: counted) under four
 * penalty configurations, greedy and sampled: token for token plain decoding with the same
 * penalties, which differs from plain decoding without them. */
static void test_penalties_lossless(void **state) {
    (void)state;
    const int32_t prompts[2][8] = {{1, 403, 407, 261, 378, 0, 0, 0},
                                   {1, 265, 282, 295, 433, 426, 385, 328}};
    const int np[2] = {5, 8};
    const int shapes[3][3] = {{1, 3, 4}, {2, 3, 6}, {4, 3, 8}};
    int runs = 0;
    int64_t accepted = 0;
    for (int p = 0; p < 2; p++)
        for (int smp = 0; smp < 2; smp++) {
            st_spec_params none = st_spec_default_params();
            st_sampler_params off = penalized(-1, smp, NULL, 0);
            off.n_logit_bias = 0;
            rec free_run, plain, got;
            st_gen_stats gs;
            run(prompts[p], np[p], &off, &none, 1, &free_run, &gs);
            /* ban the first token plain decoding picks, boost the fourth */
            const st_logit_bias bias[2] = {{free_run.toks[0], -100.0f}, {free_run.toks[3], 2.5f}};
            for (int cfg = 0; cfg < 4; cfg++) {
                const st_sampler_params sp = penalized(cfg, smp, bias, 2);
                run(prompts[p], np[p], &sp, &none, 1, &plain, &gs);
                assert_int_equal(plain.n, N_GEN);
                if (same(&plain, &free_run))
                    fail_msg("penalty config %d (prompt %d, %s) does not change the output", cfg, p,
                             smp ? "sampled" : "greedy");
                for (int i = 0; cfg >= 2 && i < plain.n; i++)
                    assert_true(plain.toks[i] != bias[0].token); /* banned */
                for (int algo = 0; algo < 4; algo++)
                    for (int sh = 0; sh < 3; sh++) {
                        st_spec_params spec = st_spec_default_params();
                        spec.algo = algo == 3   ? ST_SPEC_EAGLE3
                                    : algo == 2 ? ST_SPEC_EAGLE
                                    : algo == 1 ? ST_SPEC_STANDALONE
                                                : ST_SPEC_NGRAM;
                        spec.draft_model = algo == 3 ? head3r : algo == 2 ? headbi : model;
                        spec.ngram_min_match = 1;
                        spec.topk = shapes[sh][0];
                        spec.num_steps = shapes[sh][1];
                        spec.num_draft_tokens = shapes[sh][2];
                        spec.backend = (sh + cfg) % 2 ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
                        run(prompts[p], np[p], &sp, &spec, 1 + (algo + sh) % 2, &got, &gs);
                        if (!same(&got, &plain))
                            fail_msg("penalties: mismatch: prompt %d %s config %d algo %d shape "
                                     "%d",
                                     p, smp ? "sampled" : "greedy", cfg, algo, sh);
                        assert_true(gs.spec_steps > 0);
                        for (int k = 1; k <= shapes[sh][1]; k++)
                            accepted += gs.accept_hist[k];
                        runs++;
                    }
            }
        }
    print_message("%d penalized speculative runs matched plain decoding; drafts accepted in "
                  "%lld steps\n",
                  runs, (long long)accepted);
    assert_true(accepted > 0);
}

/* Seed-coupled drafting (TREE_SPEC §8), on and off: STANDALONE (the model drafting for itself),
 * the trained EAGLE and EAGLE-3 heads of models/ and the reduced-vocabulary EAGLE-3 head, three
 * seeds, temperatures 0.3, 0.8 and 1.2 with varied filters, one with penalties and a bias:
 * token for token plain decoding either way. The model drafting for itself with K = 1 has the
 * target's logits at every draft node, so coupled, its chain is accepted whole at every step
 * (the drafter applied the target's own rule at the right positions and paths), which the
 * uncoupled chain is not. */
static void test_coupled_lossless(void **state) {
    (void)state;
    st_model *eagle = NULL, *eagle3 = NULL;
    assert_int_equal(st_eagle_head_load(tu_data("models/eagle-stories260K"), model, &eagle), ST_OK);
    assert_int_equal(st_eagle_head_load(tu_data("models/eagle3-stories260K"), model, &eagle3),
                     ST_OK);
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    const float temps[3] = {0.3f, 0.8f, 1.2f};
    const st_logit_bias bias[1] = {{261, 1.5f}};
    const int shapes[3][3] = {{1, 4, 5}, {2, 3, 6}, {4, 6, 16}};
    int runs = 0;
    int64_t all_on = 0, steps_on = 0, all_off = 0, steps_off = 0;
    for (int seed = 0; seed < 3; seed++)
        for (int ti = 0; ti < 4; ti++) {
            st_sampler_params sp = {.temp = temps[ti % 3], .seed = 500 + (uint64_t)seed};
            sp.top_k = ti == 1 ? 0 : 40;
            sp.top_p = ti == 2 ? 1.0f : 0.9f;
            sp.min_p = ti == 0 ? 0.05f : 0.0f;
            if (ti == 3) { /* penalties and a bias, whose history includes the draft path */
                sp.repeat_penalty = 1.3f, sp.repeat_last_n = 16, sp.presence_penalty = 0.4f;
                sp.frequency_penalty = 0.3f, sp.logit_bias = bias, sp.n_logit_bias = 1;
            }
            st_spec_params none = st_spec_default_params();
            rec plain, got;
            st_gen_stats gs;
            run(prompt, 5, &sp, &none, 1, &plain, &gs);
            for (int algo = 0; algo < 4; algo++)
                for (int sh = 0; sh < 3; sh++)
                    for (int off = 0; off < 2; off++) {
                        st_spec_params spec = st_spec_default_params();
                        spec.algo = algo == 0   ? ST_SPEC_STANDALONE
                                    : algo == 1 ? ST_SPEC_EAGLE
                                                : ST_SPEC_EAGLE3;
                        spec.draft_model = algo == 0   ? model
                                           : algo == 1 ? eagle
                                           : algo == 2 ? eagle3
                                                       : head3r;
                        spec.topk = shapes[sh][0];
                        spec.num_steps = shapes[sh][1];
                        spec.num_draft_tokens = shapes[sh][2];
                        spec.draft_coupling = off ? -1 : 1;
                        run(prompt, 5, &sp, &spec, 1 + (sh + off) % 2, &got, &gs);
                        if (!same(&got, &plain))
                            fail_msg("coupled %s: mismatch: seed %d temp config %d algo %d "
                                     "shape %d",
                                     off ? "off" : "on", seed, ti, algo, sh);
                        assert_true(gs.spec_steps > 0);
                        if (algo == 0 && sh == 0) {
                            *(off ? &all_off : &all_on) += gs.accept_hist[4];
                            *(off ? &steps_off : &steps_on) += gs.spec_steps;
                        }
                        runs++;
                    }
        }
    print_message("%d coupled/uncoupled speculative runs matched plain decoding; self-draft chain "
                  "accepted whole in %lld of %lld steps coupled, %lld of %lld uncoupled\n",
                  runs, (long long)all_on, (long long)steps_on, (long long)all_off,
                  (long long)steps_off);
    assert_int_equal(all_on, steps_on);
    assert_true(all_off < steps_off);
    st_model_free(eagle3);
    st_model_free(eagle);
}

/* Batches with penalties: each sequence equals its own plain decoding with them (both attention
 * backends). */
static void test_penalties_batch(void **state) {
    (void)state;
    const int32_t p0[] = {1, 403, 407, 261, 378}, p1[] = {1, 300, 301, 302, 303, 304, 305},
                  p2[] = {1, 265, 282}, p3[] = {1, 7, 90, 450, 511, 3};
    const int32_t *prompts[4] = {p0, p1, p2, p3};
    const int64_t np[4] = {5, 7, 3, 6};
    const st_logit_bias bias[2] = {{261, -100.0f}, {300, 3.0f}};
    for (int cfg = 0; cfg < 8; cfg++) {
        const st_sampler_params sp = penalized((cfg & 3) == 3 ? 2 : cfg & 3, cfg & 1, bias, 2);
        st_spec_params spec = st_spec_default_params();
        spec.algo = cfg & 2 ? ST_SPEC_STANDALONE : ST_SPEC_NGRAM;
        spec.backend = cfg & 4 ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
        spec.draft_model = model;
        spec.ngram_min_match = 1;
        spec.topk = 2, spec.num_steps = 3, spec.num_draft_tokens = 6;
        brec got;
        memset(&got, 0, sizeof got);
        st_gen_stats gs;
        assert_int_equal(st_generate_batch(model, 4, prompts, np,
                                           GEN_PARAMS(N_GEN, &sp, &spec, 2, CTX), record_seq, &got,
                                           &gs),
                         ST_OK);
        assert_true(gs.spec_steps > 0);
        for (int b = 0; b < 4; b++) {
            rec one;
            st_spec_params none = st_spec_default_params();
            run(prompts[b], (int)np[b], &sp, &none, 1, &one, &gs);
            if (!same(&got.r[b], &one))
                fail_msg("penalties: batch config %d (%s) sequence %d differs from plain", cfg,
                         st_attn_backend_name(spec.backend), b);
        }
    }
}

typedef struct mixed_req {
    rec r;
    st_stop_reason why;
} mixed_req;

static int mixed_token(void *user, int32_t t) { return record(&((mixed_req *)user)->r, t); }

static void mixed_finish(void *user, const st_request_stats *rs) {
    ((mixed_req *)user)->why = rs->stop_reason;
}

/* One engine, one speculative batch: requests without penalties beside requests with different
 * ones (the biases given from a buffer overwritten after submit: the engine keeps a copy); each
 * equals its own plain st_generate. */
static void test_penalties_mixed(void **state) {
    (void)state;
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    st_engine_params ep = st_engine_default_params();
    ep.gen.spec.algo = ST_SPEC_NGRAM;
    ep.gen.spec.ngram_min_match = 1;
    ep.gen.spec.topk = 2, ep.gen.spec.num_steps = 3, ep.gen.spec.num_draft_tokens = 6;
    ep.gen.n_ctx = CTX;
    ep.max_running = 4;
    st_engine *e;
    assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
    st_logit_bias bias[2] = {{403, -100.0f}, {378, 4.0f}};
    st_sampler_params sps[4];
    static mixed_req mr[4];
    memset(mr, 0, sizeof mr);
    for (int i = 0; i < 4; i++) {
        sps[i] = penalized(i == 0 ? -1 : i, i % 2, bias, 2);
        if (i == 0)
            sps[i].n_logit_bias = 0;
        st_request_params rp = st_engine_request_defaults(e);
        rp.n_predict = N_GEN;
        rp.sampler = sps[i];
        assert_int_equal(
            st_engine_submit(e, prompt, 5, &rp, mixed_token, mixed_finish, &mr[i], NULL), ST_OK);
    }
    const st_logit_bias given[2] = {bias[0], bias[1]};
    bias[0].bias = 100.0f, bias[1].token = 0; /* the engine's copy is what counts */
    while (st_engine_running(e) + st_engine_queued(e) > 0)
        assert_int_equal(st_engine_step(e), ST_OK);
    st_engine_stats es;
    st_engine_get_stats(e, &es);
    assert_true(es.spec_steps > 0);
    st_engine_free(e);
    for (int i = 0; i < 4; i++) {
        st_sampler_params sp = sps[i];
        sp.logit_bias = given;
        rec one;
        st_gen_stats gs;
        st_spec_params none = st_spec_default_params();
        run(prompt, 5, &sp, &none, 1, &one, &gs);
        if (!same(&mr[i].r, &one))
            fail_msg("penalties: engine request %d differs from plain", i);
    }
}

/* ignore_eos and min_tokens. Greedy stories260K does not end its stories within hundreds of
 * tokens, so EOS gets a logit bias: the smallest (of 1, 2, ...) that ends the story after c >= 3
 * tokens. Then ignore_eos (the ban comes after the bias) runs it to n_predict, and min_tokens =
 * c + 8 runs it past c; both keep the first c tokens, and speculation (NGRAM) equals plain. */
static void test_eos_bans(void **state) {
    (void)state;
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    const int32_t eos = st_tokenizer_eos(st_model_tokenizer(model));
    st_gen_params gp = st_gen_default_params();
    gp.n_ctx = 512;
    static rec eos_run, got, spec_run;
    st_gen_stats gs;
    st_logit_bias boost = {eos, 0.0f};
    int c = 0;
    for (int b = 1; b <= 40 && c == 0; b++) {
        boost.bias = (float)b;
        gp.sampler = (st_sampler_params){.temp = 0.0f, .logit_bias = &boost, .n_logit_bias = 1};
        gp.n_predict = 200;
        memset(&eos_run, 0, sizeof eos_run);
        assert_int_equal(st_generate(model, prompt, 5, &gp, record, &eos_run, &gs), ST_OK);
        if (gs.stop_reason[0] == ST_STOP_EOS && eos_run.n >= 3)
            c = eos_run.n;
    }
    assert_true(c >= 3 && c + 40 < 200);
    for (int mode = 0; mode < 2; mode++) {
        gp.sampler.ignore_eos = mode == 0;
        gp.sampler.min_tokens = mode == 1 ? c + 8 : 0;
        gp.n_predict = mode == 0 ? 200 : c + 40;
        gp.spec = st_spec_default_params();
        memset(&got, 0, sizeof got);
        assert_int_equal(st_generate(model, prompt, 5, &gp, record, &got, &gs), ST_OK);
        if (mode == 0) {
            assert_int_equal(gs.stop_reason[0], ST_STOP_LENGTH);
            assert_int_equal(got.n, 200);
        } else {
            assert_true(got.n >= c + 8);
        }
        assert_memory_equal(got.toks, eos_run.toks, sizeof(int32_t) * (size_t)c);
        gp.spec.algo = ST_SPEC_NGRAM;
        gp.spec.ngram_min_match = 1;
        gp.spec.topk = 2, gp.spec.num_steps = 3, gp.spec.num_draft_tokens = 6;
        memset(&spec_run, 0, sizeof spec_run);
        assert_int_equal(st_generate(model, prompt, 5, &gp, record, &spec_run, &gs), ST_OK);
        assert_true(gs.spec_steps > 0);
        if (!same(&spec_run, &got))
            fail_msg("%s: speculation differs from plain", mode ? "min_tokens" : "ignore_eos");
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lossless_matrix),
        cmocka_unit_test(test_auto_and_stop),
        cmocka_unit_test(test_batch),
        cmocka_unit_test(test_eagle_batch),
        cmocka_unit_test(test_auto_draft_model),
        cmocka_unit_test(test_synthetic_draft),
        cmocka_unit_test(test_no_alloc_in_loop),
        cmocka_unit_test(test_non_finite),
        cmocka_unit_test(test_stop_reasons),
        cmocka_unit_test(test_padded_vocab),
        cmocka_unit_test(test_penalties_lossless),
        cmocka_unit_test(test_penalties_batch),
        cmocka_unit_test(test_coupled_lossless),
        cmocka_unit_test(test_penalties_mixed),
        cmocka_unit_test(test_eos_bans),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
