/*
 * test_engine_sched.c: the continuous-batching engine (st_engine) on stories260K. Requests with
 * mixed greedy and seeded samplers join, leave, stop and are cancelled at staggered steps under
 * every speculative algorithm (NGRAM, STANDALONE with the model as its own draft, EAGLE with the
 * committed models/eagle-stories260K head), auto and fixed shapes: each request's tokens equal
 * st_generate's with the same prompt and parameters. Also: the refusals (queue full, never
 * fits, bad arguments), admission under the KV budget, prefill chunks that let running streams
 * advance every step, drafters reset on join, finish called exactly once, the KV accounting
 * back at zero, and st_engine_free with requests pending; reuse_prefix (a slot's kept KV
 * prefix) leaves the tokens unchanged; opt-in log-probabilities are bitwise the same with and
 * without speculation and those of the session's logits; so are the prompt's (echo), which
 * reuse nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "spectree.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static st_model *model, *eagle;

enum { CTX = 192, MAX_TOK = 256, N_REQ = 9 };

static const char *texts[] = {
    "Once upon a time, there was a little girl named Lily. She liked to play",
    "The sun was shining and the birds were singing",
    "Tom had a red ball. Tom had a red ball. Tom had a",
    "Molly the cow lived on a green hill",
    "One day, a big dog saw a cat. The dog said",
    "Sam and Sue went to the park to play on the swings. Sam and Sue",
    "Once upon a time",
    "The little bird wanted to fly high in the sky, so it flapped its wings and",
    "Ben",
};

static int32_t prompts[N_REQ][64];
static int64_t n_prompts[N_REQ];

static int setup(void **state) {
    (void)state;
    if (st_model_load(tu_data("models/stories260K.gguf"), &model) != ST_OK)
        return -1;
    if (st_eagle_head_load(ST_SOURCE_DIR "/models/eagle-stories260K", model, &eagle) != ST_OK)
        return -1;
    for (int i = 0; i < N_REQ; i++)
        if (st_tokenize(st_model_tokenizer(model), texts[i], strlen(texts[i]), 1, prompts[i], 64,
                        &n_prompts[i]) != ST_OK)
            return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    st_model_free(eagle);
    st_model_free(model);
    return 0;
}

/* What one request saw through its callbacks. */
typedef struct req {
    int32_t toks[MAX_TOK];
    int n;
    int stop_after; /* > 0: the emit callback asks to stop after this many tokens */
    int finished;   /* finish calls */
    st_request_stats st;
} req;

static int on_token(void *user, int32_t t) {
    req *r = user;
    if (r->n < MAX_TOK)
        r->toks[r->n++] = t;
    return r->stop_after > 0 && r->n >= r->stop_after;
}

static void on_finish(void *user, const st_request_stats *st) {
    req *r = user;
    r->finished++;
    r->st = *st;
}

typedef struct plain_rec {
    int32_t toks[MAX_TOK];
    int n;
} plain_rec;

static int rec_token(void *user, int32_t t) {
    plain_rec *r = user;
    if (r->n < MAX_TOK)
        r->toks[r->n++] = t;
    return 0;
}

/* st_generate's tokens and stats for prompt i with the engine's parameters and rp. */
static void reference(const st_gen_params *base, int i, const st_request_params *rp, plain_rec *out,
                      st_gen_stats *gs) {
    st_gen_params p = *base;
    p.n_predict = rp->n_predict;
    p.sampler = rp->sampler;
    memset(out, 0, sizeof *out);
    if (st_generate(model, prompts[i], n_prompts[i], &p, rec_token, out, gs) != ST_OK)
        fail_msg("generate: %s", st_last_error());
}

/* The request parameters of request i: greedy or seeded, with varied samplers and lengths. */
static st_request_params req_params(int i, int cfg) {
    st_request_params rp = {.n_predict = 12 + (i * 7 + cfg * 5) % 40};
    rp.sampler = st_sampler_default_params();
    switch ((i + cfg) % 3) {
    case 0:
        rp.sampler.temp = 0.0f;
        break;
    case 1:
        rp.sampler.temp = 0.8f, rp.sampler.top_p = 0.9f, rp.sampler.top_k = 40;
        break;
    default:
        rp.sampler.temp = 1.0f, rp.sampler.min_p = 0.05f;
        break;
    }
    rp.sampler.seed = 1000 + (uint64_t)(i * 31 + cfg);
    return rp;
}

/* The speculation of configuration cfg. */
static st_spec_params spec_of(int cfg) {
    st_spec_params s = st_spec_default_params();
    switch (cfg) {
    case 0: /* plain */
        break;
    case 1: /* NGRAM, auto */
        s.algo = ST_SPEC_NGRAM;
        break;
    case 2: /* NGRAM, a fixed tree, dense backend */
        s.algo = ST_SPEC_NGRAM, s.topk = 2, s.num_steps = 3, s.num_draft_tokens = 6;
        s.backend = ST_ATTN_DENSE;
        break;
    case 3: /* STANDALONE: the model drafts for itself, a chain */
        s.algo = ST_SPEC_STANDALONE, s.draft_model = model, s.topk = 1, s.num_steps = 3;
        break;
    case 4: /* STANDALONE, auto (the controller never drafts with a model this heavy) */
        s.algo = ST_SPEC_STANDALONE, s.draft_model = model;
        break;
    case 5: /* EAGLE, a fixed tree */
        s.algo = ST_SPEC_EAGLE, s.draft_model = eagle, s.topk = 2, s.num_steps = 3;
        s.num_draft_tokens = 8;
        break;
    default: /* EAGLE, auto */
        s.algo = ST_SPEC_EAGLE, s.draft_model = eagle;
        break;
    }
    return s;
}

/* Requests join at staggered steps into 3 slots with prompts prefilled 5 tokens a step; one
 * stops itself from its emit callback, one is cancelled while running and one while queued.
 * Each request's tokens equal st_generate's (a prefix of them for the stopped and cancelled
 * ones), with the same stop reason. */
static void test_staggered_equals_generate(void **state) {
    (void)state;
    const int arrive[N_REQ] = {0, 0, 1, 3, 4, 4, 4, 9, 15};
    int64_t spec_total = 0;
    for (int cfg = 0; cfg <= 6; cfg++) {
        st_engine_params ep = st_engine_default_params();
        ep.gen.spec = spec_of(cfg);
        ep.gen.n_ctx = CTX;
        ep.gen.n_threads = 1 + cfg % 2;
        ep.max_running = 3;
        ep.prefill_chunk = 5;
        st_engine *e;
        assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
        static req rq[N_REQ];
        memset(rq, 0, sizeof rq);
        uint64_t ids[N_REQ] = {0};
        st_request_params rps[N_REQ];
        rq[2].stop_after = 5;
        const int cancel_running = 4, cancel_queued = 7;
        int submitted = 0, step = 0, cancelled = 0, max_run = 0, max_queue = 0;
        while (submitted < N_REQ || st_engine_running(e) + st_engine_queued(e) > 0) {
            while (submitted < N_REQ && arrive[submitted] <= step) {
                const int i = submitted++;
                rps[i] = req_params(i, cfg);
                if (i == cancel_running)
                    rps[i].n_predict = 100;
                assert_int_equal(st_engine_submit(e, prompts[i], n_prompts[i], &rps[i], on_token,
                                                  on_finish, &rq[i], &ids[i]),
                                 ST_OK);
                assert_true(ids[i] > 0);
                if (i == cancel_queued) /* admission happens in a step: still queued */
                    assert_int_equal(st_engine_cancel(e, ids[i]), ST_OK);
            }
            if (!cancelled && rq[cancel_running].n >= 3) { /* running, streaming */
                assert_int_equal(st_engine_cancel(e, ids[cancel_running]), ST_OK);
                cancelled = 1;
            }
            assert_true(st_engine_running(e) <= 3);
            max_run = st_engine_running(e) > max_run ? st_engine_running(e) : max_run;
            max_queue = st_engine_queued(e) > max_queue ? st_engine_queued(e) : max_queue;
            assert_true(st_engine_kv_used(e) <= st_engine_kv_reserved(e));
            if (st_engine_step(e) != ST_OK)
                fail_msg("step: %s", st_last_error());
            step++;
            assert_true(step < 2000);
        }
        assert_int_equal(max_run, 3); /* the requests overlapped and some waited */
        assert_true(max_queue >= 2);
        assert_int_equal(st_engine_kv_used(e), 0);
        assert_int_equal(st_engine_kv_reserved(e), 0);
        st_engine_stats es;
        st_engine_get_stats(e, &es);
        int64_t gen = 0, prompt = 0;
        for (int i = 0; i < N_REQ; i++) {
            assert_int_equal(rq[i].finished, 1);
            assert_int_equal(rq[i].st.id, ids[i]);
            assert_int_equal(rq[i].st.status, ST_OK);
            assert_int_equal(rq[i].st.gen_tokens, rq[i].n);
            gen += rq[i].st.gen_tokens;
            plain_rec ref;
            st_gen_stats gs;
            reference(&ep.gen, i, &rps[i], &ref, &gs);
            if (i == cancel_queued) {
                assert_int_equal(rq[i].st.stop_reason, ST_STOP_CANCEL);
                assert_int_equal(rq[i].n, 0);
                assert_true(rq[i].st.ttft_ms < 0.0);
                continue;
            }
            prompt += n_prompts[i];
            assert_int_equal(rq[i].st.prompt_tokens, n_prompts[i]);
            assert_true(rq[i].st.ttft_ms >= rq[i].st.queue_ms);
            assert_true(rq[i].st.total_ms >= rq[i].st.ttft_ms);
            assert_int_equal(rq[i].st.verify_ct, rq[i].st.spec_steps + rq[i].st.plain_steps);
            spec_total += rq[i].st.spec_steps;
            if (rq[i].n > ref.n || memcmp(rq[i].toks, ref.toks, (size_t)rq[i].n * sizeof(int32_t)))
                fail_msg("config %d request %d: %d tokens differ from st_generate's %d", cfg, i,
                         rq[i].n, ref.n);
            if (i == cancel_running) {
                assert_int_equal(rq[i].st.stop_reason, ST_STOP_CANCEL);
                assert_true(rq[i].n >= 3 && rq[i].n <= ref.n);
            } else if (i == 2) {
                assert_int_equal(rq[i].st.stop_reason, ST_STOP_STOP);
                assert_int_equal(rq[i].n, 5);
            } else {
                assert_int_equal(rq[i].n, ref.n);
                assert_int_equal(rq[i].st.stop_reason, gs.stop_reason[0]);
            }
        }
        assert_int_equal(es.requests_finished, N_REQ);
        assert_int_equal(es.gen_tokens, gen);
        assert_int_equal(es.prompt_tokens, prompt);
        if (cfg == 3 || cfg == 5) /* fixed shapes speculate every step */
            assert_int_equal(es.plain_steps, 0);
        st_engine_free(e);
    }
    assert_true(spec_total > 0);
}

/* Under load: 48 requests arriving a few per step into 32 slots, with a prefill chunk of 16 and
 * a KV budget that makes some wait, NGRAM with auto shapes and EAGLE with a fixed tree (so that
 * up to 32 trees are verified in one pass): every request's tokens equal st_generate's. */
static void test_load_equals_generate(void **state) {
    (void)state;
    enum { NR = 48 };
    const int cfgs[] = {1, 5};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        st_engine_params ep = st_engine_default_params();
        ep.gen.spec = spec_of(cfgs[c]);
        ep.gen.n_ctx = CTX;
        ep.gen.n_threads = 2;
        ep.max_running = 32;
        ep.max_queued = NR;
        ep.prefill_chunk = 16;
        ep.kv_budget = 24 * 80;
        st_engine *e;
        assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
        static req rq[NR];
        memset(rq, 0, sizeof rq);
        st_request_params rps[NR];
        int submitted = 0, max_run = 0;
        for (int step = 0; submitted < NR || st_engine_running(e) + st_engine_queued(e) > 0;
             step++) {
            for (int k = 0; k < 3 && submitted < NR; k++, submitted++) {
                const int i = submitted;
                rps[i] = req_params(i, (int)c);
                assert_int_equal(st_engine_submit(e, prompts[i % N_REQ], n_prompts[i % N_REQ],
                                                  &rps[i], on_token, on_finish, &rq[i], NULL),
                                 ST_OK);
            }
            assert_int_equal(st_engine_step(e), ST_OK);
            assert_true(st_engine_kv_reserved(e) <= 24 * 80);
            max_run = st_engine_running(e) > max_run ? st_engine_running(e) : max_run;
            assert_true(step < 5000);
        }
        assert_true(max_run > 8);
        st_engine_stats es;
        st_engine_get_stats(e, &es);
        if (cfgs[c] == 5)
            assert_true(es.spec_steps > 0 && es.plain_steps == 0);
        assert_int_equal(st_engine_kv_reserved(e), 0);
        for (int i = 0; i < NR; i++) {
            plain_rec ref;
            st_gen_stats gs;
            reference(&ep.gen, i % N_REQ, &rps[i], &ref, &gs);
            assert_int_equal(rq[i].finished, 1);
            if (rq[i].n != ref.n || memcmp(rq[i].toks, ref.toks, (size_t)ref.n * sizeof(int32_t)))
                fail_msg("config %d request %d differs from st_generate", cfgs[c], i);
            assert_int_equal(rq[i].st.stop_reason, gs.stop_reason[0]);
        }
        st_engine_free(e);
    }
}

/* With one slot, each request runs alone after the previous one: with a fixed shape its drafts
 * (so its accepted lengths) equal st_generate's only if the slot's drafter forgot the previous
 * request. The model as its own chain draft accepts every draft. */
static void test_drafter_reset_on_join(void **state) {
    (void)state;
    const int cfgs[] = {2, 3, 5};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        st_engine_params ep = st_engine_default_params();
        ep.gen.spec = spec_of(cfgs[c]);
        ep.gen.n_ctx = CTX;
        ep.gen.n_threads = 1;
        ep.max_running = 1;
        ep.prefill_chunk = 7;
        st_engine *e;
        assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
        static req rq[4];
        memset(rq, 0, sizeof rq);
        const int which[4] = {0, 5, 2, 7};
        st_request_params rps[4];
        for (int j = 0; j < 4; j++) {
            rps[j] = req_params(which[j], 0);
            rps[j].sampler.temp = 0.0f;
            rps[j].n_predict = 40;
            assert_int_equal(st_engine_submit(e, prompts[which[j]], n_prompts[which[j]], &rps[j],
                                              on_token, on_finish, &rq[j], NULL),
                             ST_OK);
        }
        assert_int_equal(st_engine_queued(e), 4);
        while (st_engine_running(e) + st_engine_queued(e) > 0) {
            assert_int_equal(st_engine_step(e), ST_OK);
            assert_true(st_engine_running(e) <= 1);
        }
        for (int j = 0; j < 4; j++) {
            plain_rec ref;
            st_gen_stats gs;
            reference(&ep.gen, which[j], &rps[j], &ref, &gs);
            assert_int_equal(rq[j].n, ref.n);
            assert_memory_equal(rq[j].toks, ref.toks, (size_t)ref.n * sizeof(int32_t));
            assert_int_equal(rq[j].st.spec_steps, gs.spec_steps);
            assert_memory_equal(rq[j].st.accept_hist, gs.accept_hist, sizeof gs.accept_hist);
            if (cfgs[c] == 3) /* self-draft chain: all accepted */
                assert_int_equal(rq[j].st.accept_hist[3], rq[j].st.spec_steps);
        }
        st_engine_free(e);
    }
}

/* reuse_prefix: a conversation's next turn (the last prompt, its answer and more tokens) takes
 * the slot that kept them and prefills only the rest; its tokens equal st_generate's. With two
 * slots, the request whose prompt the other slot holds goes there. EAGLE needs every prompt
 * position: nothing is reused. */
static void test_reuse_prefix(void **state) {
    (void)state;
    const int cfgs[] = {0, 1, 3, 5};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        st_engine_params ep = st_engine_default_params();
        ep.gen.spec = spec_of(cfgs[c]);
        ep.gen.n_ctx = CTX;
        ep.gen.n_threads = 1;
        ep.max_running = 2;
        ep.reuse_prefix = 1;
        st_engine *e;
        assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
        static req first[2], next[2];
        memset(first, 0, sizeof first);
        memset(next, 0, sizeof next);
        st_request_params rp = req_params(0, 0);
        rp.sampler.temp = 0.0f;
        rp.n_predict = 20;
        for (int j = 0; j < 2; j++) /* prompts 0 and 1 in slots 0 and 1 */
            assert_int_equal(st_engine_submit(e, prompts[j], n_prompts[j], &rp, on_token, on_finish,
                                              &first[j], NULL),
                             ST_OK);
        while (st_engine_running(e) + st_engine_queued(e) > 0)
            assert_int_equal(st_engine_step(e), ST_OK);
        /* the next turns, prompt 1's first: it goes to slot 1, which kept it */
        int32_t turn[2][128];
        int64_t n_turn[2];
        for (int j = 1; j >= 0; j--) {
            n_turn[j] = 0;
            memcpy(turn[j], prompts[j], (size_t)n_prompts[j] * sizeof(int32_t));
            n_turn[j] = n_prompts[j];
            memcpy(turn[j] + n_turn[j], first[j].toks, (size_t)first[j].n * sizeof(int32_t));
            n_turn[j] += first[j].n;
            memcpy(turn[j] + n_turn[j], prompts[8], (size_t)n_prompts[8] * sizeof(int32_t));
            n_turn[j] += n_prompts[8];
            assert_int_equal(
                st_engine_submit(e, turn[j], n_turn[j], &rp, on_token, on_finish, &next[j], NULL),
                ST_OK);
        }
        st_engine_stats es0, es1;
        st_engine_get_stats(e, &es0);
        while (st_engine_running(e) + st_engine_queued(e) > 0)
            assert_int_equal(st_engine_step(e), ST_OK);
        st_engine_get_stats(e, &es1);
        int64_t reused = 0;
        for (int j = 0; j < 2; j++) {
            plain_rec ref;
            st_gen_params p = ep.gen;
            p.n_predict = rp.n_predict;
            p.sampler = rp.sampler;
            memset(&ref, 0, sizeof ref);
            assert_int_equal(st_generate(model, turn[j], n_turn[j], &p, rec_token, &ref, NULL),
                             ST_OK);
            assert_int_equal(next[j].n, ref.n);
            assert_memory_equal(next[j].toks, ref.toks, (size_t)ref.n * sizeof(int32_t));
            assert_int_equal(next[j].st.prompt_tokens, n_turn[j]);
            if (cfgs[c] == 5) {
                assert_int_equal(next[j].st.reused_tokens, 0);
            } else { /* the prompt and the answer but its last token (never evaluated) */
                assert_true(next[j].st.reused_tokens >= n_prompts[j] + first[j].n - 1);
                assert_true(next[j].st.reused_tokens < n_turn[j]);
            }
            reused += next[j].st.reused_tokens;
        }
        assert_int_equal(es1.prompt_tokens - es0.prompt_tokens, n_turn[0] + n_turn[1] - reused);
        st_engine_free(e);
    }
}

/* Refusals at submit: a full queue (BUSY), a prompt that can never fit (RANGE: longer than the
 * context, or a reservation above the budget), bad arguments (INVALID); cancel of an unknown
 * request (RANGE). None calls a callback. */
static void test_refusals(void **state) {
    (void)state;
    st_engine_params ep = st_engine_default_params();
    ep.gen.n_ctx = 64;
    ep.max_running = 2;
    ep.max_queued = 2;
    ep.kv_budget = 100;
    st_engine *e;
    assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
    req r[6];
    memset(r, 0, sizeof r);
    st_request_params rp = st_engine_request_defaults(e);
    rp.n_predict = 10;
    uint64_t id = 99;
    assert_int_equal(
        st_engine_submit(e, prompts[0], n_prompts[0], &rp, on_token, on_finish, &r[0], &id), ST_OK);
    assert_int_equal(
        st_engine_submit(e, prompts[1], n_prompts[1], &rp, on_token, on_finish, &r[1], NULL),
        ST_OK);
    assert_int_equal(
        st_engine_submit(e, prompts[3], n_prompts[3], &rp, on_token, on_finish, &r[2], &id),
        ST_ERR_BUSY);
    assert_int_equal(id, 0);
    assert_non_null(strstr(st_last_error(), "queue is full"));
    /* never fits: 64 tokens in a context of 64; a reservation of min(40 + 50 + 1, 64) = 64
     * positions fits the budget of 100, but not one of 60 (next engine) */
    int32_t longp[64];
    for (int i = 0; i < 64; i++)
        longp[i] = 1 + i;
    assert_int_equal(st_engine_submit(e, longp, 64, &rp, on_token, on_finish, &r[3], NULL),
                     ST_ERR_RANGE);
    /* bad arguments */
    const int32_t bad[2] = {1, 512};
    assert_int_equal(st_engine_submit(e, bad, 2, &rp, on_token, on_finish, &r[3], NULL),
                     ST_ERR_INVALID);
    assert_int_equal(st_engine_submit(e, prompts[0], 0, &rp, on_token, on_finish, &r[3], NULL),
                     ST_ERR_INVALID);
    st_request_params neg = rp;
    neg.n_predict = -1;
    assert_int_equal(st_engine_submit(e, prompts[0], n_prompts[0], &neg, NULL, NULL, NULL, NULL),
                     ST_ERR_INVALID);
    assert_int_equal(st_engine_cancel(e, 12345), ST_ERR_RANGE);
    /* the two queued requests run; the queue then takes more */
    assert_int_equal(st_engine_step(e), ST_OK);
    assert_int_equal(st_engine_queued(e), 0);
    assert_int_equal(
        st_engine_submit(e, prompts[3], n_prompts[3], &rp, on_token, on_finish, &r[2], NULL),
        ST_OK);
    while (st_engine_running(e) + st_engine_queued(e) > 0)
        assert_int_equal(st_engine_step(e), ST_OK);
    assert_int_equal(r[0].finished + r[1].finished + r[2].finished, 3);
    assert_int_equal(r[3].finished, 0);
    st_engine_free(e);

    ep.kv_budget = 60;
    assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
    rp.n_predict = 50;
    assert_int_equal(st_engine_submit(e, longp, 40, &rp, NULL, NULL, NULL, NULL), ST_ERR_RANGE);
    assert_non_null(strstr(st_last_error(), "budget"));
    st_engine_free(e);

    /* bad engine parameters */
    ep = st_engine_default_params();
    ep.max_running = ST_GEN_MAX_BATCH + 1;
    assert_int_equal(st_engine_create(model, &ep, &e), ST_ERR_INVALID);
    assert_null(e);
    ep = st_engine_default_params();
    ep.prefill_chunk = 0;
    assert_int_equal(st_engine_create(model, &ep, &e), ST_ERR_INVALID);
    ep = st_engine_default_params();
    ep.gen.spec.algo = ST_SPEC_EAGLE; /* no head */
    assert_int_equal(st_engine_create(model, &ep, &e), ST_ERR_INVALID);
}

/* The KV budget admits a request only while its reservation fits: with room for one, requests
 * run one at a time, in order, and never more than the budget is reserved. */
static void test_kv_budget_admission(void **state) {
    (void)state;
    st_engine_params ep = st_engine_default_params();
    ep.gen.n_ctx = 128;
    ep.gen.sampler.temp = 0.0f;
    ep.gen.n_predict = 30;
    ep.max_running = 4;
    ep.kv_budget = 60; /* each request below reserves n_prompt + 30 + 1 <= 60; two do not fit */
    st_engine *e;
    assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
    req r[3];
    memset(r, 0, sizeof r);
    const int which[3] = {0, 3, 6};
    for (int j = 0; j < 3; j++)
        assert_int_equal(st_engine_submit(e, prompts[which[j]], n_prompts[which[j]], NULL, on_token,
                                          on_finish, &r[j], NULL),
                         ST_OK);
    int order = 0, first_done[3] = {0};
    while (st_engine_running(e) + st_engine_queued(e) > 0) {
        assert_int_equal(st_engine_step(e), ST_OK);
        assert_true(st_engine_running(e) <= 1);
        assert_true(st_engine_kv_reserved(e) <= 60);
        for (int j = 0; j < 3; j++)
            if (r[j].finished && !first_done[j])
                first_done[j] = ++order;
    }
    for (int j = 0; j < 3; j++) {
        assert_int_equal(first_done[j], j + 1);
        plain_rec ref;
        st_gen_stats gs;
        st_request_params rp = st_engine_request_defaults(e);
        reference(&ep.gen, which[j], &rp, &ref, &gs);
        assert_int_equal(r[j].n, ref.n);
        assert_memory_equal(r[j].toks, ref.toks, (size_t)ref.n * sizeof(int32_t));
    }
    assert_int_equal(st_engine_kv_reserved(e), 0);
    st_engine_free(e);
}

/* A long prompt joins running streams in chunks: each step prefills at most prefill_chunk
 * tokens and the running streams still get a token every step. */
static void test_chunked_prefill(void **state) {
    (void)state;
    st_engine_params ep = st_engine_default_params();
    ep.gen.n_ctx = 256;
    ep.gen.spec = spec_of(1);
    ep.gen.sampler.temp = 0.0f;
    ep.max_running = 3;
    ep.prefill_chunk = 8;
    st_engine *e;
    assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
    req r[3];
    memset(r, 0, sizeof r);
    st_request_params rp = st_engine_request_defaults(e);
    rp.n_predict = 200;
    for (int j = 0; j < 2; j++)
        assert_int_equal(
            st_engine_submit(e, prompts[j], n_prompts[j], &rp, on_token, on_finish, &r[j], NULL),
            ST_OK);
    for (int s = 0; s < 6; s++) /* both prompts prefilled, both streaming */
        assert_int_equal(st_engine_step(e), ST_OK);
    assert_true(r[0].n > 0 && r[1].n > 0);
    /* a 150-token prompt: the repeated texts */
    int32_t longp[150];
    int64_t n = 0;
    for (int i = 0; n < 150; i = (i + 1) % N_REQ)
        for (int64_t t = i == 0 && n == 0 ? 0 : 1; t < n_prompts[i] && n < 150; t++)
            longp[n++] = prompts[i][t];
    rp.n_predict = 10;
    assert_int_equal(st_engine_submit(e, longp, 150, &rp, on_token, on_finish, &r[2], NULL), ST_OK);
    st_engine_stats before, after;
    int prefill_steps = 0;
    while (r[2].n == 0 && !r[2].finished) {
        st_engine_get_stats(e, &before);
        const int n0 = r[0].n, n1 = r[1].n;
        assert_int_equal(st_engine_step(e), ST_OK);
        st_engine_get_stats(e, &after);
        assert_true(after.prompt_tokens - before.prompt_tokens <= 8);
        assert_true(r[0].n > n0 || r[0].finished);
        assert_true(r[1].n > n1 || r[1].finished);
        prefill_steps++;
    }
    assert_int_equal(prefill_steps, (150 + 7) / 8);
    while (st_engine_running(e) + st_engine_queued(e) > 0)
        assert_int_equal(st_engine_step(e), ST_OK);
    plain_rec ref;
    st_gen_stats gs;
    st_gen_params gp = ep.gen;
    gp.n_predict = 10;
    memset(&ref, 0, sizeof ref);
    assert_int_equal(st_generate(model, longp, 150, &gp, rec_token, &ref, &gs), ST_OK);
    assert_int_equal(r[2].n, ref.n);
    assert_memory_equal(r[2].toks, ref.toks, (size_t)ref.n * sizeof(int32_t));
    st_engine_free(e);
}

/* st_engine_free finishes every pending request, queued or running, with ST_STOP_CANCEL; a
 * request of n_predict 0 finishes after its prefill with ST_STOP_LENGTH and no token. */
static void test_free_pending(void **state) {
    (void)state;
    st_engine_params ep = st_engine_default_params();
    ep.gen.n_ctx = 128;
    ep.gen.spec = spec_of(5);
    ep.max_running = 2;
    st_engine *e;
    assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
    req r[4];
    memset(r, 0, sizeof r);
    st_request_params rp = st_engine_request_defaults(e);
    rp.n_predict = 0;
    assert_int_equal(
        st_engine_submit(e, prompts[1], n_prompts[1], &rp, on_token, on_finish, &r[3], NULL),
        ST_OK);
    assert_int_equal(st_engine_step(e), ST_OK);
    assert_int_equal(r[3].finished, 1);
    assert_int_equal(r[3].st.stop_reason, ST_STOP_LENGTH);
    assert_int_equal(r[3].n, 0);
    rp.n_predict = 100;
    for (int j = 0; j < 3; j++)
        assert_int_equal(
            st_engine_submit(e, prompts[j], n_prompts[j], &rp, on_token, on_finish, &r[j], NULL),
            ST_OK);
    for (int s = 0; s < 3; s++)
        assert_int_equal(st_engine_step(e), ST_OK);
    assert_int_equal(st_engine_running(e), 2);
    assert_int_equal(st_engine_queued(e), 1);
    assert_true(st_engine_kv_used(e) > 0);
    st_engine_free(e);
    for (int j = 0; j < 3; j++) {
        assert_int_equal(r[j].finished, 1);
        assert_int_equal(r[j].st.stop_reason, ST_STOP_CANCEL);
    }
    assert_int_equal(r[2].n, 0);
    st_engine_free(NULL);
    assert_string_equal(st_stop_reason_name(ST_STOP_CANCEL), "cancelled");
    assert_string_equal(st_status_str(ST_ERR_BUSY), "busy");
}

/* What a request's on_logprobs saw. */
typedef struct lp_rec {
    st_token_logprobs lp[MAX_TOK];
    int n;
    int32_t toks[MAX_TOK]; /* emitted, in order */
    int n_toks;
    int with; /* log-probabilities were asked for */
} lp_rec;

static void rec_logprobs(void *user, const st_token_logprobs *lp) {
    lp_rec *r = user;
    if (r->n < MAX_TOK)
        r->lp[r->n++] = *lp;
}

static int rec_emit(void *user, int32_t t) {
    lp_rec *r = user;
    if (r->with) { /* on_logprobs came just before, for this token */
        assert_int_equal(r->n, r->n_toks + 1);
        assert_int_equal(r->lp[r->n_toks].token, t);
    }
    if (r->n_toks < MAX_TOK)
        r->toks[r->n_toks++] = t;
    return 0;
}

enum { LP_REQ = 5 };

/* Runs LP_REQ requests together under configuration cfg (a fixed tree: every speculative step
 * verifies one), with log-probabilities (top: how many alternatives) or without; *spec: the
 * speculative steps they took. */
static void run_logprobs(int cfg, int with, int32_t top, lp_rec *out, int64_t *spec) {
    st_engine_params ep = st_engine_default_params();
    ep.gen.spec = spec_of(cfg);
    ep.gen.n_ctx = CTX;
    ep.max_running = 3;
    st_engine *e;
    assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
    static req rq[LP_REQ];
    memset(rq, 0, sizeof rq);
    for (int i = 0; i < LP_REQ; i++) {
        st_request_params rp = req_params(i, 0);
        rp.n_predict = 40;
        rp.on_logprobs = with ? rec_logprobs : NULL;
        rp.top_logprobs = top;
        memset(&out[i], 0, sizeof out[i]);
        out[i].with = with;
        assert_int_equal(
            st_engine_submit(e, prompts[i], n_prompts[i], &rp, rec_emit, NULL, &out[i], NULL),
            ST_OK);
    }
    while (st_engine_running(e) + st_engine_queued(e) > 0)
        assert_int_equal(st_engine_step(e), ST_OK);
    st_engine_stats es;
    st_engine_get_stats(e, &es);
    *spec = es.spec_steps;
    st_engine_free(e);
}

/* Opt-in log-probabilities: one per emitted token, just before it, the tokens unchanged; under
 * NGRAM and EAGLE with fixed trees bitwise equal to plain decoding's; equal to a log-softmax of
 * the session's own logits at each position; the top list sorted, headed by the maximum. */
static void test_logprobs(void **state) {
    (void)state;
    static lp_rec plain[LP_REQ], off[LP_REQ], got[LP_REQ];
    int64_t spec = 0;
    run_logprobs(0, 1, 5, plain, &spec);
    assert_int_equal(spec, 0);
    for (int i = 0; i < LP_REQ; i++) {
        assert_true(plain[i].n_toks > 0);
        assert_int_equal(plain[i].n, plain[i].n_toks);
    }
    const int cfgs[] = {0, 2, 5}; /* plain, NGRAM fixed, EAGLE fixed */
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        run_logprobs(cfgs[c], 0, 0, off, &spec);
        run_logprobs(cfgs[c], 1, 5, got, &spec);
        if (cfgs[c])
            assert_true(spec > 0); /* trees were verified */
        for (int i = 0; i < LP_REQ; i++) {
            assert_int_equal(off[i].n, 0); /* not asked: nothing */
            assert_int_equal(got[i].n_toks, plain[i].n_toks);
            assert_memory_equal(got[i].toks, plain[i].toks, sizeof(int32_t) * got[i].n_toks);
            assert_memory_equal(off[i].toks, plain[i].toks, sizeof(int32_t) * got[i].n_toks);
            for (int t = 0; t < got[i].n; t++) {
                const st_token_logprobs *a = &got[i].lp[t], *b = &plain[i].lp[t];
                assert_int_equal(a->n_top, 5);
                assert_memory_equal(&a->logprob, &b->logprob, sizeof a->logprob);
                assert_memory_equal(a->top_token, b->top_token, sizeof a->top_token[0] * 5);
                assert_memory_equal(a->top_logprob, b->top_logprob, sizeof a->top_logprob[0] * 5);
            }
        }
    }
    /* against the session: log-softmax of the logits each token was drawn from */
    st_session_params sp = st_session_default_params();
    sp.n_ctx = CTX;
    st_session *s;
    assert_int_equal(st_session_create(model, &sp, &s), ST_OK);
    const int32_t V = st_model_get_hparams(model)->n_vocab;
    float *lg = malloc((size_t)V * sizeof *lg);
    assert_non_null(lg);
    for (int i = 0; i < LP_REQ; i++) {
        assert_int_equal(st_session_seq_reset(s, 0), ST_OK);
        assert_int_equal(st_session_eval(s, 0, prompts[i], (int32_t)n_prompts[i], lg, 1), ST_OK);
        for (int t = 0; t < plain[i].n; t++) {
            const st_token_logprobs *a = &plain[i].lp[t];
            double mx = lg[0], sum = 0.0;
            int32_t best = 0;
            for (int32_t v = 0; v < V; v++)
                if (lg[v] > mx)
                    mx = lg[v], best = v;
            for (int32_t v = 0; v < V; v++)
                sum += exp((double)lg[v] - mx);
            assert_true(fabs(a->logprob - ((double)lg[a->token] - mx - log(sum))) < 1e-5);
            assert_true(a->logprob <= 0.0f);
            assert_int_equal(a->top_token[0], best);
            double mass = 0.0;
            for (int k = 0; k < a->n_top; k++) {
                assert_true(
                    fabs(a->top_logprob[k] - ((double)lg[a->top_token[k]] - mx - log(sum))) < 1e-5);
                if (k > 0)
                    assert_true(a->top_logprob[k] <= a->top_logprob[k - 1]);
                mass += exp(a->top_logprob[k]);
            }
            assert_true(mass <= 1.0 + 1e-6);
            if (req_params(i, 0).sampler.temp == 0.0f) /* greedy: the most likely token */
                assert_int_equal(a->token, best);
            assert_int_equal(st_session_eval(s, 0, &a->token, 1, lg, 1), ST_OK);
        }
    }
    free(lg);
    st_session_free(s);
    /* every count of alternatives, and the refusals */
    for (int32_t top = 0; top <= ST_MAX_TOP_LOGPROBS; top += 10) {
        run_logprobs(2, 1, top, got, &spec);
        for (int i = 0; i < LP_REQ; i++)
            for (int t = 0; t < got[i].n; t++) {
                assert_int_equal(got[i].lp[t].n_top, top);
                assert_memory_equal(&got[i].lp[t].logprob, &plain[i].lp[t].logprob, sizeof(float));
            }
    }
    st_engine *e;
    assert_int_equal(st_engine_create(model, NULL, &e), ST_OK);
    st_request_params rp = st_engine_request_defaults(e);
    assert_null(rp.on_logprobs);
    rp.on_logprobs = rec_logprobs;
    rp.top_logprobs = ST_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(st_engine_submit(e, prompts[0], n_prompts[0], &rp, NULL, NULL, NULL, NULL),
                     ST_ERR_INVALID);
    rp.top_logprobs = -1;
    assert_int_equal(st_engine_submit(e, prompts[0], n_prompts[0], &rp, NULL, NULL, NULL, NULL),
                     ST_ERR_INVALID);
    st_engine_free(e);
}

/* What an echo-with-logprobs request saw: the generated tokens' records first (rec_logprobs and
 * rec_emit read it as an lp_rec), then the prompt's and its stats. */
typedef struct echo_rec {
    lp_rec gen;
    st_token_logprobs plp[64];
    int n_plp;
    int n_gen_at_prompt; /* generated tokens seen when the last prompt record came */
    st_request_stats st;
} echo_rec;

static void rec_prompt_logprobs(void *user, const st_token_logprobs *lp) {
    echo_rec *r = user;
    if (r->n_plp < 64)
        r->plp[r->n_plp++] = *lp;
    r->n_gen_at_prompt = r->gen.n_toks;
}

static void echo_finish(void *user, const st_request_stats *st) {
    echo_rec *r = user;
    r->st = *st;
}

/* Prompt i's log-probabilities under configuration cfg from an engine whose prefix cache (and
 * kept slot) already hold the prompt: a request before it prefilled it. */
static void run_echo(int cfg, int i, int64_t n_predict, echo_rec *out) {
    st_engine_params ep = st_engine_default_params();
    ep.gen.spec = spec_of(cfg);
    ep.gen.n_ctx = CTX;
    ep.max_running = 2;
    ep.prefill_chunk = 7;
    ep.reuse_prefix = 1;
    ep.prefix_cache_bytes = (size_t)8 << 20;
    ep.prefix_cache_block = 4;
    st_engine *e;
    assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
    st_request_params rp = req_params(i, 0);
    rp.n_predict = 6;
    assert_int_equal(st_engine_submit(e, prompts[i], n_prompts[i], &rp, NULL, NULL, NULL, NULL),
                     ST_OK);
    while (st_engine_running(e) + st_engine_queued(e) > 0)
        assert_int_equal(st_engine_step(e), ST_OK);
    rp.n_predict = n_predict;
    rp.on_prompt_logprobs = rec_prompt_logprobs;
    rp.on_logprobs = rec_logprobs;
    rp.top_logprobs = 3;
    memset(out, 0, sizeof *out);
    out->gen.with = 1;
    assert_int_equal(
        st_engine_submit(e, prompts[i], n_prompts[i], &rp, rec_emit, echo_finish, out, NULL),
        ST_OK);
    while (st_engine_running(e) + st_engine_queued(e) > 0)
        assert_int_equal(st_engine_step(e), ST_OK);
    st_engine_free(e);
}

/* Prompt log-probabilities: one per prompt token after the first, in order, before any
 * generated token; nothing reused from the cache or the slot; bitwise the log-softmax of the
 * logits a plain session computes token by token (st_token_logprobs' formula), and the same
 * bits under NGRAM and EAGLE; the generated tokens and their records as without them. */
static void test_prompt_logprobs(void **state) {
    (void)state;
    st_session_params sp = st_session_default_params();
    sp.n_ctx = CTX;
    st_session *s;
    assert_int_equal(st_session_create(model, &sp, &s), ST_OK);
    const int32_t V = st_model_get_hparams(model)->n_vocab;
    float *lg = malloc((size_t)V * sizeof *lg);
    assert_non_null(lg);
    static echo_rec got, zero, ref;
    static lp_rec plain[LP_REQ];
    int64_t spec = 0;
    run_logprobs(0, 1, 3, plain, &spec);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(st_session_seq_reset(s, 0), ST_OK);
        const int cfgs[] = {0, 2, 5};
        for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
            run_echo(cfgs[c], i, 40, &got);
            assert_int_equal(got.st.reused_tokens, 0);
            assert_int_equal(got.n_plp, n_prompts[i] - 1);
            assert_int_equal(got.n_gen_at_prompt, 0);
            /* the generated tokens: those of the same request without prompt records */
            assert_int_equal(got.gen.n_toks, plain[i].n_toks);
            assert_memory_equal(got.gen.toks, plain[i].toks, sizeof(int32_t) * got.gen.n_toks);
            for (int t = 0; t < got.gen.n; t++)
                assert_memory_equal(&got.gen.lp[t].logprob, &plain[i].lp[t].logprob, sizeof(float));
            run_echo(cfgs[c], i, 0, &zero); /* scoring alone */
            assert_int_equal(zero.gen.n_toks, 0);
            assert_int_equal(zero.st.stop_reason, ST_STOP_LENGTH);
            assert_int_equal(zero.n_plp, n_prompts[i] - 1);
            for (int t = 0; t + 1 < n_prompts[i]; t++) {
                const st_token_logprobs *a = &got.plp[t];
                assert_int_equal(a->token, prompts[i][t + 1]);
                assert_int_equal(a->n_top, 3);
                assert_memory_equal(&zero.plp[t].logprob, &a->logprob, sizeof(float));
                if (c > 0)
                    continue;
                assert_int_equal(st_session_eval(s, 0, &prompts[i][t], 1, lg, 1), ST_OK);
                float mx = lg[0];
                for (int32_t v = 0; v < V; v++)
                    mx = lg[v] > mx ? lg[v] : mx;
                double sum = 0.0;
                for (int32_t v = 0; v < V; v++)
                    sum += exp((double)lg[v] - (double)mx);
                const double lse = (double)mx + log(sum);
                const float want = (float)((double)lg[a->token] - lse);
                assert_memory_equal(&a->logprob, &want, sizeof want);
                const float top0 = (float)((double)lg[a->top_token[0]] - lse);
                assert_memory_equal(&a->top_logprob[0], &top0, sizeof top0);
            }
            if (c == 0)
                memcpy(&ref, &got, sizeof got); /* the plain run's, for the others */
            else
                for (int t = 0; t + 1 < n_prompts[i]; t++) {
                    assert_memory_equal(&got.plp[t].logprob, &ref.plp[t].logprob, sizeof(float));
                    assert_memory_equal(got.plp[t].top_token, ref.plp[t].top_token,
                                        3 * sizeof(int32_t));
                }
        }
    }
    free(lg);
    st_session_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_staggered_equals_generate),
        cmocka_unit_test(test_load_equals_generate),
        cmocka_unit_test(test_drafter_reset_on_join),
        cmocka_unit_test(test_reuse_prefix),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_kv_budget_admission),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_free_pending),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_prompt_logprobs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
