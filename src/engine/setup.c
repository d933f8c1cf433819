/*
 * setup.c: the generation's set-up, which the engine (sched.c) builds on. Resolves the
 * parameters (SGLang's rules for the tree shape), plans every buffer of the slots into one
 * allocation and creates the session, the drafters (through the table of drafting algorithms,
 * draft/algos.c), the verify-mask owner and the controller.
 */
#include "engine/engine.h"

#include <math.h>
#include <string.h>

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
    const int model = st_draft_algo_of(sp->algo)->needs_model;
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
    g->cap = st_plan_take(p, B, sizeof *g->cap);
    g->nsz = st_plan_take(p, B, sizeof *g->nsz);
    g->nb = st_plan_take(p, B, sizeof *g->nb);
    g->off = st_plan_take(p, B + 1, sizeof *g->off);
    g->masks = st_plan_take(p, B, sizeof *g->masks);
    g->logits = st_plan_take(p, B * V, sizeof *g->logits);
    g->lps = st_plan_take(p, B * N, sizeof *g->lps);
    g->scratch = st_plan_take(p, st_sample_scratch_size(g->V), 1);
    g->counts = st_plan_take(p, st_sample_penalty_scratch_size(g->V), 1);
    g->eog = st_plan_take(p, (size_t)g->n_eog, sizeof *g->eog);
    for (int32_t b = 0; b < g->bs; b++)
        g->hist[b] = st_plan_take(p, (size_t)n_ctx + 1, sizeof *g->hist[b]);
}

static st_status gen_alloc(st_gen *g, int32_t n_ctx) {
    g->n_eog = 0;
    for (int32_t t = 0; t < g->n_tok; t++)
        g->n_eog += st_tokenizer_is_eog(g->m->tok, t) != 0;
    st_plan pl = {0};
    gen_layout(g, &pl, n_ctx);
    if (!(g->mem = st_plan_alloc(&pl)))
        return st_fail(ST_ERR_NOMEM, "generate: out of memory (%zu bytes of step buffers)", pl.off);
    gen_layout(g, &pl, n_ctx);
    for (int32_t t = 0, i = 0; t < g->n_tok; t++)
        if (st_tokenizer_is_eog(g->m->tok, t))
            g->eog[i++] = t;
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
    st_status rc = st_sampler_check(&p->sampler, 0);
    if (rc)
        return rc;
    *K = 1, *S = 0, *N = 1;
    if (p->spec.algo != ST_SPEC_NONE && (rc = st_gen_resolve_shape(&p->spec, K, S, N)))
        return rc;
    if (st_draft_algo_of(p->spec.algo)->needs_model && !p->spec.draft_model)
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
    const st_draft_algo *algo = st_draft_algo_of(sp->algo);
    g->target_bytes = g->s->lazy_bytes;
    if (!algo->create)
        return ST_OK;
    /* The drafters' context-sized memory is committed as their positions are used, as the
     * target's is, and refused with it when the two together exceed the machine's memory; it is
     * committed at once only when all the slots' drafters together are small, as a lone
     * session's region is (st_lazy_alloc). */
    const size_t one = algo->context_bytes(sp, ps.n_ctx, g->s), phys = st_phys_mem();
    size_t total = 0;
    if (one == SIZE_MAX || !st_mul_size(one, (size_t)g->bs, &g->draft_bytes) ||
        !st_add_size(g->target_bytes, g->draft_bytes, &total) || (phys && total > phys))
        return st_fail(ST_ERR_NOMEM,
                       "a context of %d positions x %d slots with %s drafters needs %.1f GB: "
                       "%.1f GB of the target's KV cache and scores and %.1f GB of the drafters' "
                       "(%.1f MB a slot); this machine has %.1f GB (use a smaller -c or fewer "
                       "slots)",
                       ps.n_ctx, g->bs, st_spec_algo_name(sp->algo),
                       one == SIZE_MAX ? INFINITY : ((double)one * g->bs + g->target_bytes) / 1e9,
                       (double)g->target_bytes / 1e9,
                       one == SIZE_MAX ? INFINITY : (double)one * g->bs / 1e9,
                       one == SIZE_MAX ? INFINITY : (double)one / 1e6, (double)phys / 1e9);
    const bool populate = g->draft_bytes <= ST_LAZY_POPULATE_MAX;
    for (int32_t b = 0; b < g->bs; b++)
        if ((rc = algo->create(sp, g->m, ps.n_ctx, g->s, populate, K, S, &g->dr[b])))
            return rc;
    if (algo->attach && (rc = algo->attach(sp, g->s)))
        return rc;
    const int autotune = auto_shape(sp);
    /* a model drafter's bytes read per token (an EAGLE head's include the target's output
     * layer) over the target's */
    const double wr = algo->needs_model ? (double)st_model_weight_bytes(sp->draft_model) /
                                              (double)st_model_weight_bytes(g->m)
                                        : 0.0;
    g->stats->auto_shape = autotune;
    if ((rc = st_verify_mask_create(sp->backend, g->bs, N, (int64_t)g->bs * ps.n_ctx, &g->vm)) ||
        (rc = st_ctl_create(g->bs, K, S, N, autotune, wr, &g->ctl)))
        return rc;
    st_ctl_auto_shape(g->ctl, sp->topk == 0, sp->num_steps == 0);
    return ST_OK;
}
