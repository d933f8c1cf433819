/*
 * test_e2e_perseq.c: per-sequence trees in one batched speculative step (TREE_SPEC §2.5) stay
 * invisible. On stories260K, one engine runs a busy batch of requests whose speculation caps
 * differ (st_request_params.spec_max_tree: the engine's, off, 2, 3, 5 nodes), greedy and seeded,
 * with NGRAM, STANDALONE (the model as its own draft) and EAGLE (a head that drafts what the
 * target predicts after a token alone), fixed shapes and auto, both attention backends: every
 * request's tokens equal its own plain st_generate, the "off" request shows no speculative step
 * while the others speculate in the same forward passes, and a capped request never accepts
 * more drafts than its cap allows. The ragged forward itself is checked against uniform ones:
 * each node's logits are bitwise those of the same tree verified alone.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "io/safetensors.h"
#include "model/model.h"
#include "spectree.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static st_model *model, *head;

static float bigram[512 * 64]; /* (n_vocab, n_embd) the target's state after [BOS, y] */

static st_status keep_state(void *user, int64_t pos, const float *state) {
    if (pos == 1)
        memcpy(user, state, 64 * sizeof(float));
    return ST_OK;
}

static int setup(void **state) {
    (void)state;
    if (st_model_load(tu_data("models/stories260K.gguf"), &model) != ST_OK)
        return -1;
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
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", ST_BUILD_DIR, "test_perseq_eagle_bigram");
    tu_head h = {.n_embd = 64,
                 .n_vocab = 512,
                 .n_head = 8,
                 .n_head_kv = 4,
                 .n_ff = 128,
                 .dtype = ST_SF_F32,
                 .seed = 1,
                 .scale = 2.0f,
                 .embed_values = bigram};
    if (tu_write_eagle_head(dir, &h) != 0 || st_eagle_head_load(dir, model, &head) != ST_OK)
        return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    st_model_free(head);
    st_model_free(model);
    return 0;
}

enum { N_GEN = 40, CTX = 256, NREQ = 6 };

typedef struct req {
    int32_t toks[N_GEN];
    int n;
    st_request_stats st;
} req;

static int on_token(void *user, int32_t t) {
    req *r = user;
    if (r->n < N_GEN)
        r->toks[r->n++] = t;
    return 0;
}

static void on_finish(void *user, const st_request_stats *st) { ((req *)user)->st = *st; }

static int on_token_plain(void *user, int32_t t) { return on_token(user, t); }

static const int32_t prompts[NREQ][5] = {{1, 403, 407, 261, 378}, {1, 261, 378, 403, 407},
                                         {1, 403, 407, 261, 378}, {1, 290, 261, 403, 299},
                                         {1, 378, 407, 403, 261}, {1, 403, 261, 403, 261}};
/* each request's cap: the engine's, off, 2, 3, 5, the engine's */
static const int32_t caps[NREQ] = {0, 1, 2, 3, 5, 0};

static st_sampler_params sampler(int i, int seeded) {
    st_sampler_params sp = st_sampler_default_params();
    if (seeded) {
        sp.temp = 0.9f + 0.1f * (float)(i % 3);
        sp.seed = 1234u + (uint64_t)i;
    } else {
        sp.temp = 0.0f;
    }
    return sp;
}

/* One busy engine over all NREQ requests; each compared with its own plain st_generate. */
static void mixed(st_spec_algo algo, int K, int S, int N, st_attn_backend be, int seeded) {
    st_engine_params ep = st_engine_default_params();
    ep.gen.spec.algo = algo;
    ep.gen.spec.topk = K, ep.gen.spec.num_steps = S, ep.gen.spec.num_draft_tokens = N;
    ep.gen.spec.backend = be;
    ep.gen.spec.ngram_min_match = 1;
    ep.gen.spec.draft_model = algo == ST_SPEC_STANDALONE ? model
                              : algo == ST_SPEC_EAGLE    ? head
                                                         : NULL;
    ep.gen.n_ctx = CTX;
    ep.gen.n_threads = 2;
    ep.max_running = NREQ;
    st_engine *e;
    if (st_engine_create(model, &ep, &e) != ST_OK)
        fail_msg("engine: %s", st_last_error());
    static req rq[NREQ];
    memset(rq, 0, sizeof rq);
    for (int i = 0; i < NREQ; i++) {
        st_request_params rp = st_engine_request_defaults(e);
        rp.n_predict = N_GEN;
        rp.sampler = sampler(i, seeded);
        rp.spec_max_tree = caps[i];
        assert_int_equal(st_engine_submit(e, prompts[i], 5, &rp, on_token, on_finish, &rq[i], NULL),
                         ST_OK);
    }
    while (st_engine_running(e) + st_engine_queued(e) > 0)
        if (st_engine_step(e) != ST_OK)
            fail_msg("step: %s", st_last_error());
    st_engine_stats es;
    st_engine_get_stats(e, &es);
    st_engine_free(e);
    const char *name = st_spec_algo_name(algo);
    int64_t spec_others = 0;
    for (int i = 0; i < NREQ; i++) {
        req one = {0};
        st_sampler_params sp = sampler(i, seeded);
        st_gen_params gp = st_gen_default_params();
        gp.n_predict = N_GEN, gp.sampler = sp, gp.n_ctx = CTX;
        assert_int_equal(st_generate(model, prompts[i], 5, &gp, on_token_plain, &one, NULL), ST_OK);
        if (one.n != rq[i].n || memcmp(one.toks, rq[i].toks, (size_t)one.n * sizeof(int32_t)))
            fail_msg("%s K%d S%d N%d %s %s: request %d (cap %d) differs from plain", name, K, S, N,
                     st_attn_backend_name(be), seeded ? "seeded" : "greedy", i, caps[i]);
        /* a cap of c nodes accepts at most c - 1 drafts a step */
        for (int k = caps[i] > 1 ? caps[i] : ST_SPEC_MAX_S + 1; k <= ST_SPEC_MAX_S; k++)
            if (rq[i].st.accept_hist[k])
                fail_msg("%s: request %d (cap %d) accepted %d drafts in a step", name, i, caps[i],
                         k);
        if (i != 1)
            spec_others += rq[i].st.spec_steps;
    }
    /* the "off" request: only plain steps, while the others speculated beside it */
    assert_int_equal(rq[1].st.spec_steps, 0);
    assert_true(rq[1].st.plain_steps >= N_GEN - 1);
    if (N > 0 || algo != ST_SPEC_NGRAM) {
        assert_true(es.spec_steps > 0);
        assert_true(spec_others > 0);
    }
}

static void test_mixed_caps(void **state) {
    (void)state;
    for (int seeded = 0; seeded < 2; seeded++) {
        mixed(ST_SPEC_NGRAM, 2, 3, 8, ST_ATTN_CASCADE, seeded);
        mixed(ST_SPEC_NGRAM, 1, 4, 5, ST_ATTN_DENSE, seeded);
        mixed(ST_SPEC_STANDALONE, 2, 3, 8, ST_ATTN_CASCADE, seeded);
        mixed(ST_SPEC_STANDALONE, 1, 5, 6, ST_ATTN_CASCADE, seeded);
        mixed(ST_SPEC_EAGLE, 4, 3, 10, ST_ATTN_DENSE, seeded);
        mixed(ST_SPEC_EAGLE, 2, 4, 8, ST_ATTN_CASCADE, seeded);
        mixed(ST_SPEC_EAGLE, 0, 0, 0, ST_ATTN_CASCADE, seeded); /* auto */
    }
}

/* A ragged verify of trees of 1, 4 and 7 nodes in one forward: every node's logits bitwise
 * those of its tree verified alone, on both backends. */
static void test_ragged_forward(void **state) {
    (void)state;
    for (int bi = 0; bi < 2; bi++) {
        const st_attn_backend be = bi ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
        const int64_t K = 2, S = 3, nb[3] = {1, 4, 7}, M = st_tree_n_candidates(K, S);
        const int64_t PW = st_tree_parent_width(K, S), LPW = st_tree_level_parents_width(K, S);
        st_session_params sp = st_session_default_params();
        sp.n_seq = 3, sp.n_ctx = 64, sp.n_batch = 24;
        st_session *s;
        assert_int_equal(st_session_create(model, &sp, &s), ST_OK);
        st_verify_mask *vm;
        assert_int_equal(st_verify_mask_create(be, 3, 8, 3 * 64, &vm), ST_OK);
        const int32_t seqs[3] = {0, 1, 2};
        int64_t L[3];
        for (int b = 0; b < 3; b++) {
            assert_int_equal(st_session_eval(s, b, prompts[b], 3 + b, NULL, 0), ST_OK);
            L[b] = 3 + b;
        }
        /* the candidate pool: a fixed EAGLE-2 shape with scores falling by index */
        float sc[64];
        int32_t tk[64];
        int64_t lp[64], sel[3][8], pl[3][8];
        int32_t dr[3][8], roots[3] = {261, 378, 403};
        for (int64_t i = 0; i < M; i++)
            sc[i] = 1.0f / (float)(i + 1), tk[i] = (int32_t)(300 + 7 * i);
        lp[0] = -1;
        for (int64_t i = 1; i < LPW; i++)
            lp[i] = i - 1;
        int32_t tok[24], pos[24];
        int64_t ri[24], nt[24], ns[24], off = 0;
        st_tree_mask mk[3];
        assert_int_equal(st_verify_mask_prepare_ragged(vm, K, 3, nb, L, mk), ST_OK);
        for (int b = 0; b < 3; b++) {
            const st_tree_shape sh = {1, K, S, nb[b]};
            if (nb[b] > 1)
                assert_int_equal(st_tree_organize(&sh, sc, tk, lp, sel[b], dr[b], pl[b]), ST_OK);
            const st_tree_input in = {roots + b, PW ? pl[b] : NULL, sel[b], dr[b], L + b};
            const st_tree t = {tok + off, pos + off, ri + off, nt + off, ns + off};
            assert_int_equal(st_tree_build(&sh, &in, &t, &mk[b]), ST_OK);
            off += nb[b];
        }
        const st_tree all = {tok, pos, ri, nt, ns};
        const size_t V = 512;
        float *lg = malloc(off * V * sizeof *lg), *one = malloc(8 * V * sizeof *one);
        assert_int_equal(st_session_verify_ragged(s, vm, 3, nb, seqs, &all, lg), ST_OK);
        /* a count that disagrees with the prepared step is refused */
        const int64_t bad[3] = {1, 4, 6};
        assert_int_equal(st_session_verify_ragged(s, vm, 3, bad, seqs, &all, lg), ST_ERR_INVALID);
        off = 0;
        for (int b = 0; b < 3; b++) {
            st_tree_mask m1;
            assert_int_equal(st_verify_mask_prepare(vm, K, 1, nb[b], L[b], &m1), ST_OK);
            const st_tree_shape sh = {1, K, S, nb[b]};
            const st_tree_input in = {roots + b, PW ? pl[b] : NULL, sel[b], dr[b], L + b};
            int32_t t1[8], p1[8];
            int64_t r1[8], n1[8], s1[8];
            const st_tree t = {t1, p1, r1, n1, s1};
            assert_int_equal(st_tree_build(&sh, &in, &t, &m1), ST_OK);
            assert_int_equal(st_session_verify(s, vm, 1, nb[b], seqs + b, &t, one), ST_OK);
            assert_memory_equal(t1, tok + off, (size_t)nb[b] * sizeof *t1);
            assert_memory_equal(one, lg + off * V, (size_t)nb[b] * V * sizeof *one);
            off += nb[b];
        }
        free(one);
        free(lg);
        st_verify_mask_free(vm);
        st_session_free(s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ragged_forward),
        cmocka_unit_test(test_mixed_caps),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
