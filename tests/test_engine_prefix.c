/*
 * test_engine_prefix.c: the engine's prefix cache. The cache itself (prefix.c): insert, lookup of
 * the longest whole-block prefix, shared blocks, least-recently-used eviction under a small
 * budget. The rows it copies: a prompt prefilled in chunks writes the same K/V bits as prefilled
 * whole or decoded token by token. The engine on stories260K: a request sharing a long prefix
 * with an earlier one (whose slot another request has reused since) copies the cached rows
 * (its stats say how many) and its tokens equal those of a fresh engine without a cache, greedy
 * and seeded, plain and speculating with NGRAM (also over an f16 KV cache), EAGLE and EAGLE-3,
 * with the same drafts as a fresh engine's; a conversation's next turn reuses the last prompt
 * and its answer; a request joining while another with the same start prefills copies the
 * chunks done so far.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "spectree.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static st_model *model, *eagle, *eagle3;

/* ---- the cache ---- */

/* Payload of block i of a test prompt: its first token and i, repeated. */
static st_status fill_tag(void *user, int64_t i, void *payload, int fresh) {
    const int32_t *t = user;
    int32_t *p = payload;
    if (!fresh)
        return ST_OK;
    p[0] = t[0];
    p[1] = (int32_t)i;
    return ST_OK;
}

static void seq_tokens(int32_t *t, int64_t n, int32_t first) {
    for (int64_t i = 0; i < n; i++)
        t[i] = first + (int32_t)(i * 7 % 97);
}

static void test_cache_lookup(void **state) {
    (void)state;
    st_prefix_cache *c;
    assert_int_equal(st_prefix_create(16, 8, 1 << 20, &c), ST_OK);
    int32_t a[100], b[100];
    seq_tokens(a, 100, 1);
    memcpy(b, a, sizeof b);
    b[40] = 999; /* diverges in block 2 */
    const st_pfx_block *ch[8];
    assert_int_equal(st_prefix_lookup(c, a, 100, ch, 8), 0);
    int64_t k = -1;
    assert_int_equal(st_prefix_insert(c, a, 100, fill_tag, a, &k), ST_OK);
    assert_int_equal(k, 6); /* 96 of 100 tokens: whole blocks only */
    assert_int_equal(st_prefix_lookup(c, a, 100, ch, 8), 6);
    for (int i = 0; i < 6; i++) {
        const int32_t *p = st_prefix_payload(c, ch[i]);
        assert_int_equal(p[0], 1);
        assert_int_equal(p[1], i);
    }
    assert_int_equal(st_prefix_lookup(c, a, 47, ch, 8), 2);  /* at most n tokens */
    assert_int_equal(st_prefix_lookup(c, a, 100, ch, 3), 3); /* at most max_blocks */
    assert_int_equal(st_prefix_lookup(c, b, 100, ch, 8), 2); /* the longest shared prefix */
    /* b shares its first two blocks: only its four new ones are added */
    assert_int_equal(st_prefix_insert(c, b, 100, fill_tag, b, &k), ST_OK);
    assert_int_equal(k, 6);
    st_prefix_stats ps;
    st_prefix_get_stats(c, &ps);
    assert_int_equal(ps.blocks, 10);
    assert_int_equal(ps.inserted, 10);
    assert_int_equal(ps.evictions, 0);
    assert_int_equal(st_prefix_lookup(c, b, 100, ch, 8), 6);
    const int32_t *p = st_prefix_payload(c, ch[1]);
    assert_int_equal(p[0], 1); /* the block a wrote */
    /* a block of the same tokens after a different prefix is a different block */
    int32_t d[32];
    memcpy(d, a + 16, 16 * sizeof(int32_t));
    memcpy(d + 16, a + 16, 16 * sizeof(int32_t));
    assert_int_equal(st_prefix_lookup(c, d, 32, ch, 8), 0);
    st_prefix_get_stats(c, &ps);
    assert_int_equal(ps.hits, 5);
    assert_int_equal(ps.misses, 2);
    st_prefix_free(c);
    st_prefix_free(NULL);
}

static void test_cache_eviction(void **state) {
    (void)state;
    /* the size of one block with its bookkeeping */
    st_prefix_cache *c;
    int32_t a[64], b[64], x[64];
    seq_tokens(a, 64, 1);
    seq_tokens(b, 64, 200);
    seq_tokens(x, 64, 400);
    assert_int_equal(st_prefix_create(16, 100, 1 << 20, &c), ST_OK);
    assert_int_equal(st_prefix_insert(c, a, 16, fill_tag, a, NULL), ST_OK);
    st_prefix_stats ps;
    st_prefix_get_stats(c, &ps);
    const size_t node = ps.bytes;
    st_prefix_free(c);
    /* four blocks fit: a (3 blocks), then b (3 blocks) evicts a's last two, newest last */
    assert_int_equal(st_prefix_create(16, 100, 4 * node, &c), ST_OK);
    int64_t k;
    assert_int_equal(st_prefix_insert(c, a, 48, fill_tag, a, &k), ST_OK);
    assert_int_equal(k, 3);
    assert_int_equal(st_prefix_insert(c, b, 48, fill_tag, b, &k), ST_OK);
    assert_int_equal(k, 3);
    st_prefix_get_stats(c, &ps);
    assert_int_equal(ps.blocks, 4);
    assert_int_equal(ps.evictions, 2);
    assert_true(ps.bytes <= 4 * node);
    const st_pfx_block *ch[8];
    assert_int_equal(st_prefix_lookup(c, a, 48, ch, 8), 1);
    assert_int_equal(st_prefix_lookup(c, b, 48, ch, 8), 3);
    /* a was used last: x's block evicts b's last block, not a's */
    assert_int_equal(st_prefix_lookup(c, a, 48, ch, 8), 1);
    assert_int_equal(st_prefix_insert(c, x, 16, fill_tag, x, &k), ST_OK);
    assert_int_equal(k, 1);
    assert_int_equal(st_prefix_lookup(c, a, 48, ch, 8), 1);
    assert_int_equal(st_prefix_lookup(c, b, 48, ch, 8), 2);
    assert_int_equal(st_prefix_lookup(c, x, 48, ch, 8), 1);
    /* a prompt longer than the budget keeps as many of its first blocks as fit */
    assert_int_equal(st_prefix_insert(c, x, 64, fill_tag, x, &k), ST_OK);
    assert_int_equal(k, 4);
    assert_int_equal(st_prefix_lookup(c, a, 48, ch, 8), 0);
    st_prefix_get_stats(c, &ps);
    assert_int_equal(ps.blocks, 4);
    assert_true(ps.bytes <= 4 * node);
    st_prefix_free(c);
    /* a budget below one block caches nothing */
    assert_int_equal(st_prefix_create(16, 100, node - 1, &c), ST_OK);
    assert_int_equal(st_prefix_insert(c, a, 64, fill_tag, a, &k), ST_OK);
    assert_int_equal(k, 0);
    st_prefix_free(c);
    assert_int_equal(st_prefix_create(0, 100, node, &c), ST_ERR_INVALID);
}

/* ---- the rows: chunked prefill writes what a whole prefill and decoding write ---- */

enum { N_LONG = 300, CTX = 512, MAX_TOK = 128 };
static int32_t longp[N_LONG + 64];

static int setup(void **state) {
    (void)state;
    if (st_model_load(tu_data("models/stories260K.gguf"), &model) != ST_OK)
        return -1;
    if (st_eagle_head_load(ST_SOURCE_DIR "/models/eagle-stories260K", model, &eagle) != ST_OK)
        return -1;
    if (st_eagle3_head_load(ST_SOURCE_DIR "/models/eagle3-stories260K", model, &eagle3) != ST_OK)
        return -1;
    const char *text = "Once upon a time, there was a little girl named Lily. She liked to play "
                       "with her red ball in the park with her friend Tom. ";
    int64_t n = 0;
    while (n < N_LONG) {
        int64_t got = 0;
        if (st_tokenize(st_model_tokenizer(model), text, strlen(text), n == 0, longp + n,
                        N_LONG + 64 - n, &got) != ST_OK)
            return -1;
        n += got;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    st_model_free(eagle3);
    st_model_free(eagle);
    st_model_free(model);
    return 0;
}

static void test_chunked_rows_equal(void **state) {
    (void)state;
    st_session_params sp = st_session_default_params();
    sp.n_ctx = CTX;
    sp.n_seq = 3;
    sp.n_threads = 2;
    const int32_t n = 200;
    for (int f16 = 0; f16 < 2; f16++) {
        sp.type_k = sp.type_v = f16 ? ST_DTYPE_F16 : ST_DTYPE_F32;
        st_session *s;
        assert_int_equal(st_session_create(model, &sp, &s), ST_OK);
        assert_int_equal(st_session_eval(s, 0, longp, n, NULL, 0), ST_OK);
        const int32_t cuts[] = {7, 33, 1, 64, 95};
        for (int32_t done = 0, i = 0; done < n; i++) {
            const int32_t c = cuts[i % 5] < n - done ? cuts[i % 5] : n - done;
            assert_int_equal(st_session_eval(s, 1, longp + done, c, NULL, 0), ST_OK);
            done += c;
        }
        float lg[2048];
        for (int32_t t = 0; t < n; t++)
            assert_int_equal(st_session_decode_batch(s, 1, (int32_t[]){2}, longp + t, lg), ST_OK);
        const size_t bytes = (size_t)n * st_session_kv_row_bytes(s);
        char *r0 = malloc(bytes), *r1 = malloc(bytes), *r2 = malloc(bytes);
        assert_non_null(r0);
        assert_non_null(r1);
        assert_non_null(r2);
        assert_int_equal(st_session_kv_save(s, 0, 0, n, r0), ST_OK);
        assert_int_equal(st_session_kv_save(s, 1, 0, n, r1), ST_OK);
        assert_int_equal(st_session_kv_save(s, 2, 0, n, r2), ST_OK);
        assert_memory_equal(r0, r1, bytes);
        assert_memory_equal(r0, r2, bytes);
        assert_int_equal(st_session_kv_save(s, 0, CTX - 10, 20, r1), ST_ERR_RANGE);
        /* loaded rows give the same logits as computed ones */
        assert_int_equal(st_session_seq_reset(s, 1), ST_OK);
        assert_int_equal(st_session_kv_save(s, 0, 0, n - 1, r1), ST_OK);
        assert_int_equal(st_session_kv_load(s, 1, n - 1, r1), ST_OK);
        assert_int_equal(st_session_seq_len(s, 1), n - 1);
        float l0[2048], l1[2048];
        assert_int_equal(st_session_seq_truncate(s, 0, n - 1), ST_OK);
        assert_int_equal(st_session_eval(s, 0, longp + n - 1, 1, l0, 1), ST_OK);
        assert_int_equal(st_session_eval(s, 1, longp + n - 1, 1, l1, 1), ST_OK);
        assert_memory_equal(l0, l1, sizeof(float) * (size_t)st_model_get_hparams(model)->n_vocab);
        assert_int_equal(st_session_kv_load(s, 1, CTX, r0), ST_ERR_RANGE);
        free(r0);
        free(r1);
        free(r2);
        st_session_free(s);
    }
}

/* ---- the engine ---- */

typedef struct req {
    int32_t toks[MAX_TOK];
    int n;
    st_request_stats st;
} req;

static int on_token(void *user, int32_t t) {
    req *r = user;
    if (r->n < MAX_TOK)
        r->toks[r->n++] = t;
    return 0;
}

static void on_finish(void *user, const st_request_stats *st) { ((req *)user)->st = *st; }

static st_spec_params spec_of(int cfg) {
    st_spec_params s = st_spec_default_params();
    if (cfg == 1)
        s.algo = ST_SPEC_NGRAM, s.topk = 2, s.num_steps = 3, s.num_draft_tokens = 6;
    else if (cfg == 2)
        s.algo = ST_SPEC_EAGLE, s.draft_model = eagle, s.topk = 2, s.num_steps = 3,
        s.num_draft_tokens = 8;
    else if (cfg == 3)
        s.algo = ST_SPEC_EAGLE3, s.draft_model = eagle3, s.topk = 2, s.num_steps = 3,
        s.num_draft_tokens = 8;
    return s;
}

static st_engine_params engine_params(int cfg, size_t cache) {
    st_engine_params ep = st_engine_default_params();
    ep.gen.spec = spec_of(cfg == 4 ? 1 : cfg);
    if (cfg == 4) /* NGRAM over an f16 KV cache */
        ep.gen.type_k = ep.gen.type_v = ST_DTYPE_F16;
    ep.gen.n_ctx = CTX;
    ep.gen.n_threads = 2;
    ep.max_running = 2;
    ep.prefill_chunk = 64;
    ep.prefix_cache_bytes = cache;
    ep.prefix_cache_block = 16;
    return ep;
}

static void run(st_engine *e, const int32_t *p, int64_t n, const st_request_params *rp, req *r) {
    memset(r, 0, sizeof *r);
    assert_int_equal(st_engine_submit(e, p, n, rp, on_token, on_finish, r, NULL), ST_OK);
    while (st_engine_running(e) + st_engine_queued(e) > 0)
        assert_int_equal(st_engine_step(e), ST_OK);
}

/* The same request on a fresh engine without a cache. */
static void fresh(int cfg, const int32_t *p, int64_t n, const st_request_params *rp, req *r) {
    st_engine_params ep = engine_params(cfg, 0);
    st_engine *e;
    assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
    run(e, p, n, rp, r);
    assert_int_equal(r->st.reused_tokens, 0);
    st_engine_free(e);
}

static void test_engine_hit_exact(void **state) {
    (void)state;
    for (int cfg = 0; cfg < 5; cfg++)
        for (int seeded = 0; seeded < 2; seeded++) {
            st_engine_params ep = engine_params(cfg, 64u << 20);
            st_engine *e;
            assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
            st_request_params rp = st_engine_request_defaults(e);
            rp.n_predict = 40;
            rp.sampler.temp = seeded ? 0.9f : 0.0f;
            rp.sampler.seed = 1234;
            /* A: the long prefix and a tail; X (another prompt) then takes A's slot */
            int32_t pa[N_LONG + 8], pb[N_LONG + 8], px[40];
            memcpy(pa, longp, N_LONG * sizeof(int32_t));
            memcpy(pb, longp, N_LONG * sizeof(int32_t));
            for (int i = 0; i < 5; i++)
                pa[N_LONG + i] = 100 + i, pb[N_LONG + i] = 300 + 3 * i;
            for (int i = 0; i < 40; i++)
                px[i] = longp[i + 5];
            static req ra, rx, rb, rb0, rt, rt0;
            run(e, pa, N_LONG + 5, &rp, &ra);
            assert_int_equal(ra.st.cached_tokens, 0);
            run(e, px, 40, &rp, &rx);
            /* B shares A's first N_LONG tokens: their whole blocks come from the cache */
            run(e, pb, N_LONG + 5, &rp, &rb);
            assert_int_equal(rb.st.cached_tokens, N_LONG / 16 * 16);
            assert_int_equal(rb.st.reused_tokens, rb.st.cached_tokens);
            fresh(cfg, pb, N_LONG + 5, &rp, &rb0);
            assert_int_equal(rb.n, rp.n_predict);
            assert_int_equal(rb.n, rb0.n);
            assert_memory_equal(rb.toks, rb0.toks, (size_t)rb.n * sizeof(int32_t));
            if (cfg > 0) { /* the drafter's state after a hit is a fresh one's: same drafts */
                assert_true(rb.st.spec_steps > 0);
                assert_int_equal(rb.st.spec_steps, rb0.st.spec_steps);
                assert_memory_equal(rb.st.accept_hist, rb0.st.accept_hist,
                                    sizeof rb.st.accept_hist);
            }
            /* the next turn of A: its prompt, its answer and more; the answer's rows too */
            int32_t pt[N_LONG + 8 + MAX_TOK + 8];
            int64_t nt = N_LONG + 5;
            memcpy(pt, pa, (size_t)nt * sizeof(int32_t));
            memcpy(pt + nt, ra.toks, (size_t)ra.n * sizeof(int32_t));
            nt += ra.n;
            for (int i = 0; i < 6; i++)
                pt[nt++] = 50 + i;
            run(e, pt, nt, &rp, &rt);
            assert_true(rt.st.cached_tokens > N_LONG + 5);
            assert_true(rt.st.cached_tokens < nt);
            fresh(cfg, pt, nt, &rp, &rt0);
            assert_int_equal(rt.n, rt0.n);
            assert_memory_equal(rt.toks, rt0.toks, (size_t)rt.n * sizeof(int32_t));
            assert_memory_equal(rt.st.accept_hist, rt0.st.accept_hist, sizeof rt.st.accept_hist);
            st_engine_stats es;
            st_engine_get_stats(e, &es);
            assert_int_equal(es.prefix_hits, 2);
            assert_true(es.prefix_misses >= 1);
            assert_int_equal(es.prefix_hit_tokens, rb.st.cached_tokens + rt.st.cached_tokens);
            assert_true(es.prefix_blocks > 0);
            assert_true(es.prefix_bytes > 0 && es.prefix_bytes <= es.prefix_budget);
            st_engine_free(e);
        }
}

/* Two requests sharing the prefix run at once: the second admitted after the first's prefill
 * copies its rows while the first is still decoding; both equal a fresh engine's. A budget of a
 * few blocks evicts and still gives exact tokens. */
static void test_engine_concurrent_and_small_budget(void **state) {
    (void)state;
    for (int small = 0; small < 2; small++) {
        st_engine_params ep = engine_params(2, small ? 3 * 16 * 2600 : 64u << 20);
        st_engine *e;
        assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
        st_request_params rp = st_engine_request_defaults(e);
        rp.n_predict = 30;
        rp.sampler.temp = 0.0f;
        static req r1, r2, f1, f2;
        memset(&r1, 0, sizeof r1);
        memset(&r2, 0, sizeof r2);
        int32_t p2[N_LONG + 2];
        memcpy(p2, longp, N_LONG * sizeof(int32_t));
        p2[N_LONG] = 77;
        assert_int_equal(st_engine_submit(e, longp, N_LONG, &rp, on_token, on_finish, &r1, NULL),
                         ST_OK);
        while (r1.n == 0)
            assert_int_equal(st_engine_step(e), ST_OK);
        assert_int_equal(st_engine_submit(e, p2, N_LONG + 1, &rp, on_token, on_finish, &r2, NULL),
                         ST_OK);
        while (st_engine_running(e) + st_engine_queued(e) > 0)
            assert_int_equal(st_engine_step(e), ST_OK);
        if (!small)
            assert_int_equal(r2.st.cached_tokens, N_LONG / 16 * 16);
        fresh(2, longp, N_LONG, &rp, &f1);
        fresh(2, p2, N_LONG + 1, &rp, &f2);
        assert_int_equal(r1.n, f1.n);
        assert_memory_equal(r1.toks, f1.toks, (size_t)r1.n * sizeof(int32_t));
        assert_int_equal(r2.n, f2.n);
        assert_memory_equal(r2.toks, f2.toks, (size_t)r2.n * sizeof(int32_t));
        if (small) { /* another prompt's blocks evict the old ones */
            static req r3;
            run(e, longp + 101, 64, &rp, &r3);
        }
        st_engine_stats es;
        st_engine_get_stats(e, &es);
        assert_true(es.prefix_bytes <= es.prefix_budget);
        if (small)
            assert_true(es.prefix_evictions > 0);
        st_engine_free(e);
    }
}

/* A prompt is cached chunk by chunk as its prefill goes: a request with the same start that
 * joins meanwhile copies the chunks done so far; both equal a fresh engine's. */
static void test_engine_mid_prefill(void **state) {
    (void)state;
    for (int cfg = 1; cfg < 3; cfg++) {
        st_engine_params ep = engine_params(cfg, 64u << 20);
        st_engine *e;
        assert_int_equal(st_engine_create(model, &ep, &e), ST_OK);
        st_request_params rp = st_engine_request_defaults(e);
        rp.n_predict = 20;
        rp.sampler.temp = 0.0f;
        static req r1, r2, f1, f2;
        memset(&r1, 0, sizeof r1);
        memset(&r2, 0, sizeof r2);
        int32_t p2[N_LONG + 2];
        memcpy(p2, longp, N_LONG * sizeof(int32_t));
        p2[N_LONG] = 77;
        assert_int_equal(st_engine_submit(e, longp, N_LONG, &rp, on_token, on_finish, &r1, NULL),
                         ST_OK);
        assert_int_equal(st_engine_step(e), ST_OK); /* its first chunk of 64 tokens */
        assert_int_equal(r1.n, 0);
        assert_int_equal(st_engine_submit(e, p2, N_LONG + 1, &rp, on_token, on_finish, &r2, NULL),
                         ST_OK);
        while (st_engine_running(e) + st_engine_queued(e) > 0)
            assert_int_equal(st_engine_step(e), ST_OK);
        assert_int_equal(r2.st.cached_tokens, 64);
        fresh(cfg, longp, N_LONG, &rp, &f1);
        fresh(cfg, p2, N_LONG + 1, &rp, &f2);
        assert_int_equal(r1.n, f1.n);
        assert_memory_equal(r1.toks, f1.toks, (size_t)r1.n * sizeof(int32_t));
        assert_int_equal(r2.n, f2.n);
        assert_memory_equal(r2.toks, f2.toks, (size_t)r2.n * sizeof(int32_t));
        /* (the drafts may differ: a step's tree size is chosen for the batch as a whole) */
        st_engine_free(e);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_lookup),
        cmocka_unit_test(test_cache_eviction),
        cmocka_unit_test(test_chunked_rows_equal),
        cmocka_unit_test(test_engine_hit_exact),
        cmocka_unit_test(test_engine_concurrent_and_small_budget),
        cmocka_unit_test(test_engine_mid_prefill),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
