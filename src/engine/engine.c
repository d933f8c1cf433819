/*
 * engine.c: the generation's set-up. Resolves the parameters (SGLang's rules for the tree
 * shape), plans every buffer of the slots into one allocation and creates the session, the
 * drafters, the verify-mask owner and the controller; st_generate_batch runs its prompts as
 * the requests of one continuous-batching engine (sched.c) and gathers their statistics.
 */
#include "engine/engine.h"

#include <string.h>
#include <strings.h>

st_status st_spec_algo_parse(const char *name, st_spec_algo *out) {
    if (name && !strcasecmp(name, "NONE"))
        *out = ST_SPEC_NONE;
    else if (name && !strcasecmp(name, "STANDALONE"))
        *out = ST_SPEC_STANDALONE;
    else if (name && !strcasecmp(name, "NGRAM"))
        *out = ST_SPEC_NGRAM;
    else if (name && !strcasecmp(name, "EAGLE"))
        *out = ST_SPEC_EAGLE;
    else if (name && !strcasecmp(name, "EAGLE3"))
        *out = ST_SPEC_EAGLE3;
    else
        return st_fail(ST_ERR_INVALID,
                       "unknown speculative algorithm '%s' (NONE, STANDALONE, "
                       "NGRAM, EAGLE, EAGLE3)",
                       name ? name : "(null)");
    return ST_OK;
}

const char *st_spec_algo_name(st_spec_algo a) {
    return a == ST_SPEC_STANDALONE ? "STANDALONE"
           : a == ST_SPEC_NGRAM    ? "NGRAM"
           : a == ST_SPEC_EAGLE    ? "EAGLE"
           : a == ST_SPEC_EAGLE3   ? "EAGLE3"
                                   : "NONE";
}

st_spec_params st_spec_default_params(void) {
    st_spec_params p = {.algo = ST_SPEC_NONE,
                        .backend = ST_ATTN_CASCADE,
                        .ngram_min_match = 1,
                        .ngram_max_match = 8,
                        .ngram_breadth = 8};
    return p;
}

st_gen_params st_gen_default_params(void) {
    st_gen_params p = {
        .n_predict = 256, .sampler = st_sampler_default_params(), .spec = st_spec_default_params()};
    return p;
}

/* Whether the controller chooses the tree (`auto`): some of K, S, N not given. */
static int auto_shape(const st_spec_params *sp) {
    return sp->topk == 0 || sp->num_steps == 0 || (sp->topk != 1 && sp->num_draft_tokens == 0);
}

/* Resolves `auto` (0) values and SGLang's rules into a valid (K, S, N): NGRAM's pool (2, 6),
 * a model drafter's largest pool under auto (ST_CTL_AUTO_K, ST_CTL_AUTO_S; the controller
 * plans each step's within it). */
st_status st_gen_resolve_shape(const st_spec_params *sp, int32_t *K, int32_t *S, int32_t *N) {
    *K = sp->topk, *S = sp->num_steps, *N = sp->num_draft_tokens;
    if (*K < 0 || *S < 0 || *N < 0)
        return st_fail(ST_ERR_INVALID, "speculative tree: negative topk/steps/draft tokens");
    const int model = sp->algo != ST_SPEC_NGRAM;
    if (*S == 0)
        *S = model ? ST_CTL_AUTO_S : 6;
    if (*K == 0)
        *K = model ? ST_CTL_AUTO_K : 2;
    if (*K > ST_SPEC_MAX_K || *S > ST_SPEC_MAX_S)
        return st_fail(ST_ERR_INVALID, "speculative tree: topk %d (max %d) or steps %d (max %d)",
                       *K, ST_SPEC_MAX_K, *S, ST_SPEC_MAX_S);
    if (*K == 1) {
        *N = *S + 1; /* a chain, as SGLang adjusts it */
    } else if (*N == 0) {
        const int32_t cap = model && auto_shape(sp) ? ST_CTL_AUTO_N : 12;
        *N = *K * *S + 1 < cap ? *K * *S + 1 : cap;
    }
    int64_t M = st_tree_n_candidates(*K, *S);
    if (*N < 2 || *N > ST_SPEC_MAX_N || *N - 1 > M)
        return st_fail(ST_ERR_INVALID,
                       "speculative tree: num_draft_tokens %d must be in 2..%d and at most "
                       "1 + K + (S-1)*K*K = %lld",
                       *N, ST_SPEC_MAX_N, (long long)(1 + M));
    return ST_OK;
}

void st_gen_free(st_gen *g) {
    st_session_free(g->s);
    for (int i = 0; i < ST_GEN_MAX_BATCH; i++)
        if (g->dr[i])
            g->dr[i]->free(g->dr[i]);
    st_verify_mask_free(g->vm);
    st_ctl_free(g->ctl);
    st_free_aligned(g->mem);
}

/* Every array of the generation in one planned block (sizes in engine.h; st_plan: a sizing
 * pass, then a carving pass). */
static void gen_layout(st_gen *g, st_plan *p, int32_t n_ctx) {
    const size_t B = (size_t)g->bs, N = (size_t)g->N, V = (size_t)g->V, M = (size_t)g->M;
    g->seqs = st_plan_take(p, B, sizeof *g->seqs);
    g->roots = st_plan_take(p, B, sizeof *g->roots);
    g->seq_lens = st_plan_take(p, B, sizeof *g->seq_lens);
    g->scores = st_plan_take(p, B * M, sizeof *g->scores);
    g->cand_tokens = st_plan_take(p, B * M, sizeof *g->cand_tokens);
    g->level_parents = st_plan_take(p, B * (size_t)g->LPW, sizeof *g->level_parents);
    g->sel = st_plan_take(p, B * N, sizeof *g->sel);
    g->parent_list = st_plan_take(p, B * (size_t)g->PW + 1, sizeof *g->parent_list);
    g->drafts = st_plan_take(p, B * N, sizeof *g->drafts);
    g->tree_tokens = st_plan_take(p, B * N, sizeof *g->tree_tokens);
    g->positions = st_plan_take(p, B * N, sizeof *g->positions);
    g->pred = st_plan_take(p, B * N, sizeof *g->pred);
    g->ri = st_plan_take(p, B * N, sizeof *g->ri);
    g->nt = st_plan_take(p, B * N, sizeof *g->nt);
    g->ns = st_plan_take(p, B * N, sizeof *g->ns);
    g->acc = st_plan_take(p, B * (size_t)(g->S + 1), sizeof *g->acc);
    g->n_acc = st_plan_take(p, B, sizeof *g->n_acc);
    g->logits = st_plan_take(p, B * V, sizeof *g->logits);
    g->scratch = st_plan_take(p, st_sample_scratch_size(g->V), 1);
    for (int32_t b = 0; b < g->bs; b++)
        g->hist[b] = st_plan_take(p, (size_t)n_ctx + 1, sizeof *g->hist[b]);
}

static st_status gen_alloc(st_gen *g, int32_t n_ctx) {
    st_plan pl = {0};
    gen_layout(g, &pl, n_ctx);
    if (!(g->mem = st_plan_alloc(&pl)))
        return st_fail(ST_ERR_NOMEM, "generate: out of memory (%zu bytes of step buffers)", pl.off);
    gen_layout(g, &pl, n_ctx);
    return ST_OK;
}

st_status st_gen_check(const st_gen_params *p, const char *who, int32_t *K, int32_t *S,
                       int32_t *N) {
    if (p->n_predict < 0)
        return st_fail(ST_ERR_INVALID, "%s: n_predict %lld is negative", who,
                       (long long)p->n_predict);
    if (!(p->sampler.temp >= 0.0f))
        return st_fail(ST_ERR_INVALID, "%s: sampler temp %g is negative", who,
                       (double)p->sampler.temp);
    *K = 1, *S = 0, *N = 1;
    st_status rc;
    if (p->spec.algo != ST_SPEC_NONE && (rc = st_gen_resolve_shape(&p->spec, K, S, N)))
        return rc;
    if ((p->spec.algo == ST_SPEC_STANDALONE || p->spec.algo == ST_SPEC_EAGLE ||
         p->spec.algo == ST_SPEC_EAGLE3) &&
        !p->spec.draft_model)
        return st_fail(ST_ERR_INVALID,
                       "%s: %s needs a draft model "
                       "(--speculative-draft-model-path)",
                       who, st_spec_algo_name(p->spec.algo));
    return ST_OK;
}

st_status st_gen_setup(st_gen *g, int32_t K, int32_t S, int32_t N) {
    const st_spec_params *sp = &g->p.spec;
    st_session_params ps = st_session_default_params();
    ps.n_ctx = g->p.n_ctx;
    ps.n_threads = g->p.n_threads;
    ps.type_k = g->p.type_k;
    ps.match_ggml = g->p.match_ggml;
    ps.type_v = g->p.type_v;
    ps.n_seq = g->bs;
    if (g->bs * N > ps.n_batch) /* every tree of a step in one forward pass */
        ps.n_batch = g->bs * N;
    g->K = K, g->S = S, g->N = N;
    if (sp->algo != ST_SPEC_NONE) { /* the drafters' pools (plain decoding has none) */
        g->M = st_tree_n_candidates(K, S);
        g->LPW = st_tree_level_parents_width(K, S);
        g->PW = st_tree_parent_width(K, S);
    }
    st_status rc;
    if ((rc = st_session_create(g->m, &ps, &g->s)))
        return rc;
    ps.n_ctx = st_session_get_params(g->s)->n_ctx; /* the default resolved */
    if ((rc = gen_alloc(g, ps.n_ctx)))
        return rc;
    if (sp->algo == ST_SPEC_NONE)
        return ST_OK;
    for (int32_t b = 0; b < g->bs; b++) {
        if (sp->algo == ST_SPEC_NGRAM)
            rc = st_drafter_ngram_create(sp->ngram_min_match, sp->ngram_max_match,
                                         sp->ngram_breadth, K, S, ps.n_ctx + 1, &g->dr[b]);
        else if (sp->algo == ST_SPEC_EAGLE)
            rc = st_drafter_eagle_create(sp->draft_model, g->m, ps.n_ctx, g->s, K, S, &g->dr[b]);
        else if (sp->algo == ST_SPEC_EAGLE3)
            rc = st_drafter_eagle3_create(sp->draft_model, g->m, ps.n_ctx, g->s, K, S, &g->dr[b]);
        else
            rc = st_drafter_model_create(sp->draft_model, g->m, ps.n_ctx, g->s, K, S, &g->dr[b]);
        if (rc)
            return rc;
    }
    /* EAGLE-3 reads three of the target's layers: the session captures them for observe */
    if (sp->algo == ST_SPEC_EAGLE3 &&
        (rc = st_session_set_capture(g->s, sp->draft_model->n_cap, sp->draft_model->cap_layer)))
        return rc;
    const int autotune = auto_shape(sp);
    /* a model drafter's bytes read per token (an EAGLE head's include the target's output
     * layer) over the target's */
    const double wr =
        sp->algo == ST_SPEC_STANDALONE || sp->algo == ST_SPEC_EAGLE || sp->algo == ST_SPEC_EAGLE3
            ? (double)st_model_weight_bytes(sp->draft_model) / (double)st_model_weight_bytes(g->m)
            : 0.0;
    g->stats->auto_shape = autotune;
    if ((rc = st_verify_mask_create(sp->backend, g->bs, N, (int64_t)g->bs * ps.n_ctx, &g->vm)) ||
        (rc = st_ctl_create(g->bs, K, S, N, autotune, wr, &g->ctl)))
        return rc;
    st_ctl_auto_shape(g->ctl, sp->topk == 0, sp->num_steps == 0);
    return ST_OK;
}

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
