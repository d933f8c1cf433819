/*
 * generate.c: st_generate and st_generate_batch, the engine's first client: the prompts run as
 * the requests of one continuous-batching engine (sched.c) with one slot each and a single
 * prefill chunk, stepped until done, and their statistics gathered.
 */
#include "engine/engine.h"

#include <string.h>

/* st_generate_batch's requests: the caller's emit for sequence seq, and its stop reason. */
typedef struct batch_seq {
    st_emit_seq_fn emit;
    void *user;
    int32_t seq;
    st_stop_reason *reason;
} batch_seq;

static int batch_emit(void *user, int32_t token) {
    batch_seq *q = user;
    return q->emit ? q->emit(q->user, q->seq, token) : 0;
}

static void batch_finish(void *user, const st_request_stats *rs) {
    batch_seq *q = user;
    *q->reason = rs->stop_reason;
}

st_status st_generate_batch(const st_model *m, int32_t bs, const int32_t *const *prompts,
                            const int64_t *n_prompts, const st_gen_params *p, st_emit_seq_fn emit,
                            void *user, st_gen_stats *stats) {
    const st_gen_params gp = p ? *p : st_gen_default_params();
    if (!m || !prompts || !n_prompts || bs < 1 || bs > ST_GEN_MAX_BATCH)
        return st_fail(ST_ERR_INVALID, "generate: need a model and 1..%d prompts",
                       ST_GEN_MAX_BATCH);
    int32_t K, S, N;
    st_status rc = st_gen_check(&gp, "generate", &K, &S, &N);
    if (rc)
        return rc;
    const int32_t n_ctx = gp.n_ctx > 0 ? gp.n_ctx : st_model_default_ctx(m);
    for (int32_t b = 0; b < bs; b++) {
        if (!prompts[b] || n_prompts[b] < 1)
            return st_fail(ST_ERR_INVALID, "generate: prompt %d is empty", b);
        if (n_prompts[b] >= n_ctx)
            return st_fail(ST_ERR_RANGE,
                           "generate: prompt %d (%lld tokens) does not fit the context of %d", b,
                           (long long)n_prompts[b], n_ctx);
    }
    /* every prompt holds a slot from the start, prefilled whole in the first step */
    st_engine_params ep = st_engine_default_params();
    ep.gen = gp;
    ep.max_running = bs;
    ep.max_queued = bs;
    ep.prefill_chunk = INT32_MAX;
    st_gen_stats st0;
    st_gen_stats *st = stats ? stats : &st0;
    memset(st, 0, sizeof *st);
    st_engine *e;
    if ((rc = st_engine_create(m, &ep, &e)))
        return rc;
    batch_seq q[ST_GEN_MAX_BATCH];
    const double t0 = st_time_now();
    for (int32_t b = 0; b < bs && !rc; b++) {
        q[b] = (batch_seq){emit, user, b, &st->stop_reason[b]};
        rc = st_engine_submit(e, prompts[b], n_prompts[b], NULL, batch_emit, batch_finish, &q[b],
                              NULL);
    }
    while (!rc && st_engine_running(e) + st_engine_queued(e) > 0)
        rc = st_engine_step(e);
    const double t1 = st_time_now();
    if (!rc) {
        /* the engine's totals are those of this generation (gen_tokens and stop_reason were
         * filled in by the requests' callbacks) */
        st_stop_reason reasons[ST_GEN_MAX_BATCH];
        memcpy(reasons, st->stop_reason, sizeof reasons);
        st_engine_gen_stats(e, st);
        memcpy(st->stop_reason, reasons, sizeof reasons);
        st->prompt_ms = st_engine_prefill_ms(e);
        st->gen_ms = (t1 - t0) * 1e3 - st->prompt_ms;
        st->overhead_ms = st->gen_ms - st->draft_ms - st->verify_ms;
        st->prompt_tok_s =
            st->prompt_ms > 0 ? (double)st->prompt_tokens / (st->prompt_ms / 1e3) : 0.0;
        st->gen_tok_s = st->gen_ms > 0 ? (double)st->gen_tokens / (st->gen_ms / 1e3) : 0.0;
    }
    st_engine_free(e);
    return rc;
}

typedef struct one_ctx {
    st_emit_fn emit;
    void *user;
} one_ctx;

static int emit_one(void *user, int32_t seq, int32_t token) {
    (void)seq;
    one_ctx *c = user;
    return c->emit ? c->emit(c->user, token) : 0;
}

st_status st_generate(const st_model *m, const int32_t *prompt, int64_t n_prompt,
                      const st_gen_params *p, st_emit_fn emit, void *user, st_gen_stats *stats) {
    one_ctx c = {emit, user};
    return st_generate_batch(m, 1, &prompt, &n_prompt, p, emit_one, &c, stats);
}
