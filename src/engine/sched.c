/*
 * sched.c: the continuous-batching engine (st_engine). Requests wait in a FIFO queue, are
 * admitted to a slot (a sequence of the session, with its own drafter) while the slots and the
 * KV budget allow, have their prompts prefilled a chunk per step, and then take part in every
 * step's one forward pass over all running sequences (step.c: speculative or plain, as the
 * controller chooses for the whole batch). A request's tokens do not depend on what else runs:
 * every forward is batch-invariant and each token is drawn from its own position's coin.
 * With a prefix cache (prefix.c), an admitted request copies the target's K/V rows of its
 * longest cached prefix into its slot (and hands an EAGLE drafter the cached target states of
 * those positions and its head's own rows) and prefills the rest; prompts are cached as their
 * prefill goes, and prompt and answer when a request ends. The rows are copied, not shared: copying
 * is far cheaper than recomputing them; sharing pages copy-on-write would save the copy and the
 * memory twice held.
 */
#include "engine/engine.h"

#include <string.h>

struct st_engine {
    st_gen g;
    st_gen_stats gs; /* totals over every sequence (g.stats points here) */
    int32_t n_ctx, max_running, max_queued, prefill_chunk;
    int reuse_prefix; /* st_engine_params.reuse_prefix, for a drafter that reads no states */
    int64_t kv_budget, kv_reserved;
    int32_t n_running, n_queued;
    st_req *qhead, *qtail; /* the queue, oldest first */
    uint64_t next_id;
    double prefill_s;                   /* seconds in prefill */
    int64_t steps, spec_fwd, plain_fwd; /* steps that ran a forward; decoding passes by kind */
    int64_t finished;                   /* finish callbacks called */
    int64_t accept_hist[ST_SPEC_MAX_S + 1];
    st_prefix_cache *pfx;       /* NULL: no prefix cache */
    const st_pfx_block **chain; /* (n_ctx / block + 1) a lookup's blocks */
    /* a block's payload: the target's K/V rows of its B positions, then (EAGLE) the drafter's
     * states of them, then a flag and the head's own rows [iB - 1, (i + 1)B - 1) of block i
     * (those that read only this block's and earlier tokens; B - 1 rows for block 0) */
    size_t pfx_kv_bytes, pfx_own_off;
    int64_t pfx_hits, pfx_misses, pfx_served; /* admissions with and without, tokens served */
};

/* What an insertion copies from: slot b of the engine. */
typedef struct pfx_src {
    st_engine *e;
    int32_t b;
} pfx_src;

/* The head's own rows block i holds: [first, first + *n). */
static int64_t own_rows(int32_t B, int64_t i, int64_t *n) {
    *n = i == 0 ? B - 1 : B;
    return i == 0 ? 0 : i * B - 1;
}

/* Block i's own rows from slot b's drafter, when it has them all (the flag says). */
static void pfx_fill_own(const pfx_src *ps, int64_t i, char *payload) {
    st_drafter *d = ps->e->g.dr[ps->b];
    int64_t *flag = (int64_t *)(payload + ps->e->pfx_own_off), n;
    const int64_t first = own_rows(st_prefix_block(ps->e->pfx), i, &n);
    *flag = d->own_valid(d) >= first + n && d->own_save(d, first, n, flag + 1) == ST_OK;
}

/* Block i of slot b: its K/V rows, then (EAGLE) the drafter's states of its positions and the
 * head's rows; a block cached before without the head's rows gets them once they exist. */
static st_status pfx_fill(void *user, int64_t i, void *payload, int fresh) {
    const pfx_src *ps = user;
    st_gen *g = &ps->e->g;
    st_drafter *d = g->dr[ps->b];
    const int own = d && d->own_save;
    if (!fresh) {
        if (own && !*(const int64_t *)((char *)payload + ps->e->pfx_own_off))
            pfx_fill_own(ps, i, payload);
        return ST_OK;
    }
    const int32_t B = st_prefix_block(ps->e->pfx), pos = (int32_t)i * B;
    st_status rc = st_session_kv_save(g->s, ps->b, pos, B, payload);
    if (rc || !d || !d->state)
        return rc;
    float *st = (float *)((char *)payload + ps->e->pfx_kv_bytes);
    for (int32_t t = 0; t < B; t++) {
        const float *row = d->state(d, pos + t);
        if (!row)
            return ST_ERR_RANGE;
        memcpy(st + (size_t)t * (size_t)d->state_width, row,
               (size_t)d->state_width * sizeof(float));
    }
    if (own)
        pfx_fill_own(ps, i, payload);
    return ST_OK;
}

/* Caches the first n tokens of slot b's history (their K/V rows committed; with a drafter that
 * keeps states, as many as it observed). */
static void pfx_insert(st_engine *e, int32_t b, int64_t n) {
    st_gen *g = &e->g;
    const int64_t L = st_session_seq_len(g->s, b);
    n = n < L ? n : L;
    n = n < g->n_hist[b] ? n : g->n_hist[b];
    const st_drafter *d = g->dr[b];
    while (d && d->state && n > 0 && !d->state(d, n - 1))
        n--;
    pfx_src ps = {e, b};
    st_prefix_insert(e->pfx, g->hist[b], n, pfx_fill, &ps, NULL);
}

/* Request r, admitted to slot b with keep tokens kept there: when the cache holds a longer
 * prefix of its prompt (at most all but the last token), the slot starts afresh with those rows
 * (and the drafter with their states). Returns the tokens the slot now holds; *cached: how many
 * came from the cache. */
static int64_t pfx_admit(st_engine *e, const st_req *r, int32_t b, int64_t keep, int64_t *cached) {
    st_gen *g = &e->g;
    *cached = 0;
    const int32_t B = st_prefix_block(e->pfx);
    const int64_t k =
        st_prefix_lookup(e->pfx, r->prompt, r->n_prompt - 1, e->chain, (int64_t)e->n_ctx / B + 1);
    if (k * B <= keep) {
        e->pfx_misses += keep == 0;
        return keep;
    }
    st_drafter *d = g->dr[b];
    st_session_seq_reset(g->s, b);
    if (d)
        d->reset(d);
    st_status rc = ST_OK;
    for (int64_t i = 0; i < k && !rc; i++) {
        const char *p = st_prefix_payload(e->pfx, e->chain[i]);
        rc = st_session_kv_load(g->s, b, B, p);
        const float *st = (const float *)(p + e->pfx_kv_bytes);
        for (int32_t t = 0; t < B && !rc && d && d->observe; t++)
            rc = d->observe(d, i * B + t, st + (size_t)t * (size_t)d->state_width);
    }
    /* the head's rows, as far as the blocks have them (it computes the rest itself) */
    for (int64_t i = 0; i < k && !rc && d && d->own_load; i++) {
        const int64_t *flag =
            (const int64_t *)((const char *)st_prefix_payload(e->pfx, e->chain[i]) +
                              e->pfx_own_off);
        int64_t n;
        own_rows(B, i, &n);
        if (!*flag)
            break;
        rc = d->own_load(d, n, flag + 1);
    }
    if (rc) { /* start from scratch (the slot held no request: nothing else is lost) */
        st_session_seq_reset(g->s, b);
        if (d)
            d->reset(d);
        e->pfx_misses++;
        return 0;
    }
    e->pfx_hits++;
    e->pfx_served += k * B;
    *cached = k * B;
    return k * B;
}

st_engine_params st_engine_default_params(void) {
    st_engine_params p = {.gen = st_gen_default_params(),
                          .max_running = 8,
                          .max_queued = 256,
                          .prefill_chunk = 256,
                          .kv_budget = 0};
    return p;
}

st_request_params st_engine_request_defaults(const st_engine *e) {
    st_request_params r = {.n_predict = e->g.p.n_predict, .sampler = e->g.p.sampler};
    return r;
}

/* Ends request r: releases its slot and reservation, fills in its final statistics, calls its
 * finish callback and frees it. status: ST_OK, or the error that ended it. */
static void req_finish(st_engine *e, st_req *r, st_status status) {
    st_gen *g = &e->g;
    const int32_t b = r->slot;
    if (b >= 0) {
        if (e->pfx && status == ST_OK && r->n_prefilled == r->n_prompt)
            pfx_insert(e, b, g->n_hist[b]); /* the prompt and the answer */
        g->req[b] = NULL;
        g->done[b] = 1;
        if (!e->reuse_prefix || status != ST_OK) /* kept for the next request's prefix */
            st_session_seq_reset(g->s, b);
        if (g->ctl) /* its pending shadows are dropped */
            st_ctl_observe(g->ctl, b, NULL, 0, 1);
        e->kv_reserved -= r->reserve;
        e->n_running--;
    }
    st_request_stats *st = &r->st;
    st->status = status;
    if (status != ST_OK)
        st->stop_reason = ST_STOP_NONE;
    st->verify_ct = st->spec_steps + st->plain_steps;
    st->accept_length = st->verify_ct ? (double)st->gen_tokens / (double)st->verify_ct : 0.0;
    st->tau = st->spec_steps ? (double)r->spec_emitted / (double)st->spec_steps : 0.0;
    st->total_ms = (st_time_now() - r->t_submit) * 1e3;
    e->finished++;
    if (r->finish)
        r->finish(r->user, st);
    st_gmatcher_free(r->gm);
    st_grammar_free(r->grammar);
    st_free(r);
}

void st_engine_free(st_engine *e) {
    if (!e)
        return;
    for (int32_t b = 0; b < e->g.bs; b++)
        if (e->g.req[b]) {
            e->g.req[b]->st.stop_reason = ST_STOP_CANCEL;
            req_finish(e, e->g.req[b], ST_OK);
        }
    while (e->qhead) {
        st_req *r = e->qhead;
        e->qhead = r->next;
        r->st.stop_reason = ST_STOP_CANCEL;
        req_finish(e, r, ST_OK);
    }
    st_gen_free(&e->g);
    st_prefix_free(e->pfx);
    st_free(e->chain);
    st_free(e);
}

st_status st_engine_create(const st_model *m, const st_engine_params *pp, st_engine **out) {
    if (!out)
        return st_fail(ST_ERR_INVALID, "engine: NULL output");
    *out = NULL;
    if (!m)
        return st_fail(ST_ERR_INVALID, "engine: need a model");
    const st_engine_params p = pp ? *pp : st_engine_default_params();
    if (p.max_running < 1 || p.max_running > ST_GEN_MAX_BATCH)
        return st_fail(ST_ERR_INVALID, "engine: max_running %d outside 1..%d", p.max_running,
                       ST_GEN_MAX_BATCH);
    if (p.max_queued < 1)
        return st_fail(ST_ERR_INVALID, "engine: max_queued %d must be at least 1", p.max_queued);
    if (p.prefill_chunk < 1)
        return st_fail(ST_ERR_INVALID, "engine: prefill_chunk %d must be at least 1",
                       p.prefill_chunk);
    if (p.prefix_cache_block < 0 || p.prefix_cache_block > 4096)
        return st_fail(ST_ERR_INVALID, "engine: prefix_cache_block %d outside 0..4096",
                       p.prefix_cache_block);
    if (p.kv_budget < 0)
        return st_fail(ST_ERR_INVALID, "engine: kv_budget %lld is negative",
                       (long long)p.kv_budget);
    int32_t K, S, N;
    st_status rc = st_gen_check(&p.gen, "engine", &K, &S, &N);
    if (rc)
        return rc;
    st_engine *e = st_calloc(1, sizeof *e);
    if (!e)
        return st_fail(ST_ERR_NOMEM, "engine: out of memory");
    e->g.m = m;
    e->g.p = p.gen;
    e->g.bs = p.max_running;
    e->g.V = m->hp.n_vocab;
    e->g.n_tok = st_tokenizer_n_vocab(m->tok) < e->g.V ? st_tokenizer_n_vocab(m->tok) : e->g.V;
    e->g.stats = &e->gs;
    if ((rc = st_gen_setup(&e->g, K, S, N))) {
        st_engine_free(e);
        return rc;
    }
    e->n_ctx = st_session_get_params(e->g.s)->n_ctx;
    e->gs.n_ctx = e->n_ctx;
    if (p.gen.spec.algo != ST_SPEC_NONE)
        e->gs.num_steps = S, e->gs.topk = K, e->gs.num_draft_tokens = N;
    e->max_running = p.max_running;
    e->max_queued = p.max_queued;
    e->prefill_chunk = p.prefill_chunk;
    e->reuse_prefix = p.reuse_prefix && !(e->g.dr[0] && e->g.dr[0]->observe);
    e->kv_budget = p.kv_budget ? p.kv_budget : (int64_t)p.max_running * e->n_ctx;
    e->next_id = 1;
    for (int32_t b = 0; b < e->g.bs; b++)
        e->g.done[b] = 1;
    if (p.prefix_cache_bytes > 0) {
        const int32_t B = p.prefix_cache_block ? p.prefix_cache_block : 32;
        const size_t avail = st_mem_available() / 4;
        const size_t budget = avail && avail < p.prefix_cache_bytes ? avail : p.prefix_cache_bytes;
        const st_drafter *d = e->g.dr[0];
        e->pfx_kv_bytes = (size_t)B * st_session_kv_row_bytes(e->g.s);
        const size_t states =
            d && d->state ? (size_t)B * (size_t)d->state_width * sizeof(float) : 0;
        e->pfx_own_off = (e->pfx_kv_bytes + states + 7) / 8 * 8;
        const size_t own = d && d->own_save ? 8 + (size_t)B * d->own_row_bytes : 0;
        e->chain = st_calloc((size_t)(e->n_ctx / B + 1), sizeof *e->chain);
        if (!e->chain) {
            st_engine_free(e);
            return st_fail(ST_ERR_NOMEM, "engine: out of memory");
        }
        if ((rc = st_prefix_create(B, e->pfx_own_off + own, budget, &e->pfx))) {
            st_engine_free(e);
            return rc;
        }
    }
    *out = e;
    return ST_OK;
}

st_status st_engine_submit(st_engine *e, const int32_t *prompt, int64_t n_prompt,
                           const st_request_params *rp, st_request_emit_fn emit,
                           st_request_finish_fn finish, void *user, uint64_t *id) {
    if (id)
        *id = 0;
    if (!e || !prompt || n_prompt < 1)
        return st_fail(ST_ERR_INVALID, "engine: a request needs a prompt of at least one token");
    const st_request_params r = rp ? *rp : st_engine_request_defaults(e);
    if (r.n_predict < 0)
        return st_fail(ST_ERR_INVALID, "engine: n_predict %lld is negative",
                       (long long)r.n_predict);
    if (!(r.sampler.temp >= 0.0f))
        return st_fail(ST_ERR_INVALID, "engine: sampler temp %g is negative",
                       (double)r.sampler.temp);
    st_status rc = st_sampler_check(&r.sampler, e->g.n_tok);
    if (rc)
        return rc;
    if (r.spec_max_tree < 0)
        return st_fail(ST_ERR_INVALID,
                       "engine: spec_max_tree %d is negative (0: the engine's, 1: no speculation, "
                       "n: at most n tree nodes)",
                       r.spec_max_tree);
    if (r.top_logprobs < 0 || r.top_logprobs > ST_MAX_TOP_LOGPROBS)
        return st_fail(ST_ERR_INVALID, "engine: top_logprobs %d outside 0..%d", r.top_logprobs,
                       ST_MAX_TOP_LOGPROBS);
    if (n_prompt >= e->n_ctx)
        return st_fail(ST_ERR_RANGE,
                       "engine: a prompt of %lld tokens does not fit the context of %d",
                       (long long)n_prompt, e->n_ctx);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->g.V)
            return st_fail(ST_ERR_INVALID,
                           "engine: prompt token %d at %lld is outside the vocabulary of %d",
                           prompt[i], (long long)i, e->g.V);
    /* the most positions it can use: prompt, generated tokens and one tree beyond them */
    int64_t reserve = e->n_ctx;
    if (r.n_predict < e->n_ctx && n_prompt + r.n_predict + e->g.N < e->n_ctx)
        reserve = n_prompt + r.n_predict + e->g.N;
    if (reserve > e->kv_budget)
        return st_fail(ST_ERR_RANGE,
                       "engine: the request needs %lld KV positions, more than the budget of %lld",
                       (long long)reserve, (long long)e->kv_budget);
    if (e->n_queued >= e->max_queued)
        return st_fail(ST_ERR_BUSY, "engine: the queue is full (%d requests waiting)", e->n_queued);
    /* the grammar, compiled with the matcher of its tokens */
    st_grammar *gr = NULL;
    st_gmatcher *gm = NULL;
    if (r.sampler.grammar && r.sampler.grammar[0] &&
        ((rc = st_grammar_parse(r.sampler.grammar, strlen(r.sampler.grammar), &gr)) ||
         (rc = st_gmatcher_create(gr, st_model_tokenizer(e->g.m), e->g.n_tok, &gm)))) {
        st_grammar_free(gr);
        return rc;
    }
    /* the prompt, then a copy of the logit biases (the caller's are borrowed) */
    const size_t n_bias = (size_t)r.sampler.n_logit_bias;
    st_req *q =
        st_malloc(sizeof *q + (size_t)n_prompt * sizeof(int32_t) + n_bias * sizeof(st_logit_bias));
    if (!q) {
        st_gmatcher_free(gm);
        st_grammar_free(gr);
        return st_fail(ST_ERR_NOMEM, "engine: out of memory for a request of %lld tokens",
                       (long long)n_prompt);
    }
    memset(q, 0, sizeof *q);
    q->grammar = gr, q->gm = gm;
    memcpy(q->prompt, prompt, (size_t)n_prompt * sizeof(int32_t));
    q->n_prompt = n_prompt;
    q->id = e->next_id++;
    q->rp = r;
    if (n_bias) {
        st_logit_bias *lb = (st_logit_bias *)(q->prompt + n_prompt);
        memcpy(lb, r.sampler.logit_bias, n_bias * sizeof *lb);
        q->rp.sampler.logit_bias = lb;
    } else {
        q->rp.sampler.logit_bias = NULL;
    }
    q->rp.sampler.grammar = NULL; /* borrowed: the compiled copy above is used */
    q->emit = emit;
    q->finish = finish;
    q->user = user;
    q->t_submit = st_time_now();
    q->reserve = reserve;
    q->slot = -1;
    q->st.id = q->id;
    q->st.prompt_tokens = n_prompt;
    q->st.ttft_ms = -1.0;
    if (e->qtail)
        e->qtail->next = q;
    else
        e->qhead = q;
    e->qtail = q;
    e->n_queued++;
    if (id)
        *id = q->id;
    return ST_OK;
}

st_status st_engine_cancel(st_engine *e, uint64_t id) {
    if (!e)
        return st_fail(ST_ERR_INVALID, "engine: NULL engine");
    for (int32_t b = 0; b < e->g.bs; b++)
        if (e->g.req[b] && e->g.req[b]->id == id) {
            e->g.req[b]->cancelled = 1;
            return ST_OK;
        }
    for (st_req *r = e->qhead; r; r = r->next)
        if (r->id == id) {
            r->cancelled = 1;
            return ST_OK;
        }
    return st_fail(ST_ERR_RANGE, "engine: no pending request %llu", (unsigned long long)id);
}

/* Finishes the cancelled requests, queued or running. */
static void drop_cancelled(st_engine *e) {
    for (int32_t b = 0; b < e->g.bs; b++)
        if (e->g.req[b] && e->g.req[b]->cancelled) {
            e->g.req[b]->st.stop_reason = ST_STOP_CANCEL;
            req_finish(e, e->g.req[b], ST_OK);
        }
    st_req **link = &e->qhead, *last = NULL;
    while (*link) {
        st_req *r = *link;
        if (r->cancelled) {
            *link = r->next;
            e->n_queued--;
            r->st.stop_reason = ST_STOP_CANCEL;
            req_finish(e, r, ST_OK);
        } else {
            last = r;
            link = &r->next;
        }
    }
    e->qtail = last;
}

/* Moves queued requests, oldest first, into free slots while their reservations fit the
 * budget (the oldest waits rather than being overtaken, so a long request cannot starve). */
static void admit(st_engine *e) {
    st_gen *g = &e->g;
    while (e->qhead && e->n_running < e->max_running &&
           e->kv_reserved + e->qhead->reserve <= e->kv_budget) {
        st_req *r = e->qhead;
        e->qhead = r->next;
        if (!e->qhead)
            e->qtail = NULL;
        r->next = NULL;
        e->n_queued--;
        int32_t b = 0;
        while (g->req[b])
            b++;
        /* prompt log-probabilities need every prompt position's logits: nothing is reused */
        const int reuse = !r->rp.on_prompt_logprobs;
        int64_t keep = 0; /* reuse_prefix: the free slot that shares the longest prefix */
        for (int32_t i = b; reuse && e->reuse_prefix && i < g->bs; i++) {
            const int64_t L = st_session_seq_len(g->s, i);
            int64_t k = 0;
            while (!g->req[i] && k < L && k < r->n_prompt - 1 && g->hist[i][k] == r->prompt[k])
                k++;
            if (k > keep)
                keep = k, b = i;
        }
        g->req[b] = r;
        r->slot = b;
        e->n_running++;
        e->kv_reserved += r->reserve;
        r->st.queue_ms = (st_time_now() - r->t_submit) * 1e3;
        /* a fresh sequence: empty KV (but the prefix kept), a drafter and controller shadows
         * that forget the last */
        if (keep > 0)
            st_session_seq_truncate(g->s, b, (int32_t)keep);
        else
            st_session_seq_reset(g->s, b);
        if (g->dr[b])
            g->dr[b]->reset(g->dr[b]);
        int64_t cached = 0;
        if (e->pfx && reuse)
            keep = pfx_admit(e, r, b, keep, &cached);
        r->n_prefilled = keep;
        r->st.reused_tokens = keep;
        r->st.cached_tokens = cached;
        if (g->ctl)
            st_ctl_observe(g->ctl, b, NULL, 0, 1);
        memcpy(g->hist[b], r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
        g->n_hist[b] = r->n_prompt;
        g->n_gen[b] = 0;
        g->done[b] = 0;
    }
}

/* Hands a prompt token's state to the drafter that reads the target's states (st_state_fn). */
static st_status observe_prompt(void *user, int64_t pos, const float *state) {
    st_drafter *d = user;
    return d->observe(d, pos, state);
}

/* Prefills at most prefill_chunk prompt tokens of the joining requests, oldest first; a prompt
 * whose last chunk is done samples its first token. *ran: whether anything was evaluated. */
static st_status prefill(st_engine *e, int *ran) {
    st_gen *g = &e->g;
    int64_t budget = e->prefill_chunk;
    while (budget > 0) {
        int32_t b = -1;
        for (int32_t i = 0; i < g->bs; i++)
            if (g->req[i] && g->req[i]->n_prefilled < g->req[i]->n_prompt &&
                (b < 0 || g->req[i]->id < g->req[b]->id))
                b = i;
        if (b < 0)
            return ST_OK;
        st_req *r = g->req[b];
        const int64_t left = r->n_prompt - r->n_prefilled;
        /* prompt log-probabilities: every token's logits, as many as g->logits has rows */
        const int all = r->rp.on_prompt_logprobs != NULL;
        const int64_t most = all && budget > g->bs ? g->bs : budget;
        const int64_t c = left < most ? left : most;
        const int last = c == left;
        const int32_t n_lg = all ? (int32_t)c : last ? 1 : 0;
        st_drafter *d = g->dr[b] && g->dr[b]->observe ? g->dr[b] : NULL;
        const double t0 = st_time_now();
        st_status rc =
            st_session_eval_states(g->s, b, r->prompt + r->n_prefilled, (int32_t)c,
                                   n_lg ? g->logits : NULL, n_lg, d ? observe_prompt : NULL, d);
        *ran = 1;
        /* row t predicts prompt token n_prefilled + t + 1 (the first token has none) */
        for (int64_t t = 0; !rc && all && t < c && r->n_prefilled + t + 1 < r->n_prompt; t++) {
            st_gen_logprobs(g, g->logits + (size_t)t * (size_t)g->V,
                            r->prompt[r->n_prefilled + t + 1], r->rp.top_logprobs, g->lps);
            r->rp.on_prompt_logprobs(r->user, g->lps);
        }
        float *lg = g->logits + (size_t)(n_lg > 0 ? n_lg - 1 : 0) * (size_t)g->V;
        int32_t next = 0;
        if (!rc && last && r->rp.n_predict > 0)
            rc = st_gen_target_token(g, b, lg, r->n_prompt, NULL, 0, &next, g->lps);
        e->prefill_s += st_time_now() - t0;
        if (rc) {
            req_finish(e, r, rc);
            return rc;
        }
        r->n_prefilled += c;
        g->stats->prompt_tokens += c;
        budget -= c;
        if (!last) {
            if (e->pfx) /* the chunks so far, for requests that start the same way meanwhile */
                pfx_insert(e, b, r->n_prefilled);
            continue;
        }
        r->st.ttft_ms = (st_time_now() - r->t_submit) * 1e3;
        if (r->rp.n_predict == 0) {
            g->done[b] = 1;
            r->st.stop_reason = ST_STOP_LENGTH;
        } else {
            st_gen_push(g, b, next, g->lps);
        }
        if (e->pfx) /* after the first token is out */
            pfx_insert(e, b, r->n_prompt);
    }
    return ST_OK;
}

/* One forward pass over every running sequence that has its first token (gen_loop's body of
 * old): a speculative step when the controller wants drafts and the trees fit the context, a
 * plain step otherwise; then the controller's bookkeeping. */
static st_status forward(st_engine *e, int *ran) {
    st_gen *g = &e->g;
    int32_t maxL = 0;
    g->na = 0;
    for (int32_t b = 0; b < g->bs; b++) {
        const st_req *r = g->req[b];
        if (!r || g->done[b] || r->n_prefilled < r->n_prompt)
            continue;
        const int32_t L = st_session_seq_len(g->s, b);
        if (L + 1 >= e->n_ctx) {
            g->done[b] = 1;
            g->req[b]->st.stop_reason = ST_STOP_CONTEXT;
            continue;
        }
        g->seqs[g->na++] = b;
        maxL = L > maxL ? L : maxL;
    }
    if (g->na == 0)
        return ST_OK;
    *ran = 1;
    /* a speculative step needs room for the drafters' pools and the trees */
    int64_t K = 0, S = 0; /* the pool this step drafts (auto plans it for model drafters) */
    const int drafted = g->ctl && st_ctl_want_draft(g->ctl, g->na, &K, &S) &&
                        maxL + g->N + 1 + g->K * g->S < e->n_ctx;
    const double ts = st_time_now();
    int64_t emitted = 0, T = g->na;
    const int64_t spec0 = g->stats->spec_steps;
    int64_t hist0[ST_SPEC_MAX_S + 1];
    memcpy(hist0, g->stats->accept_hist, sizeof hist0);
    st_status rc = drafted ? st_gen_spec_step(g, (int32_t)K, (int32_t)S, &T, &emitted)
                           : st_gen_plain_step(g, &emitted);
    if (rc) {
        for (int32_t a = 0; a < g->na; a++)
            if (g->req[g->seqs[a]])
                req_finish(e, g->req[g->seqs[a]], rc);
        return rc;
    }
    if (g->stats->spec_steps > spec0)
        e->spec_fwd++;
    else
        e->plain_fwd++;
    for (int32_t k = 0; k <= ST_SPEC_MAX_S; k++)
        e->accept_hist[k] += g->stats->accept_hist[k] - hist0[k];
    if (!g->ctl)
        return ST_OK;
    const double te = st_time_now();
    for (int32_t a = 0; a < g->na; a++) {
        const int32_t b = g->seqs[a];
        st_ctl_observe(g->ctl, b, g->hist[b], g->n_hist[b], g->done[b]);
    }
    g->stats->topk_sum += K * (g->stats->spec_steps - spec0); /* (the sequences that drafted) */
    g->stats->steps_sum += S * (g->stats->spec_steps - spec0);
    /* the forward's time: from the choice of the tree sizes on */
    st_ctl_step_end_ragged(g->ctl, drafted, T, g->na, emitted, te - ts,
                           te - (drafted ? g->t_chosen : ts));
    return ST_OK;
}

st_status st_engine_step(st_engine *e) {
    if (!e)
        return st_fail(ST_ERR_INVALID, "engine: NULL engine");
    drop_cancelled(e);
    admit(e);
    int ran = 0;
    st_status rc = prefill(e, &ran);
    if (!rc)
        rc = forward(e, &ran);
    e->steps += ran;
    /* requests that ended (or that an error left behind) leave their slots */
    for (int32_t b = 0; b < e->g.bs; b++)
        if (e->g.req[b] && e->g.done[b])
            req_finish(e, e->g.req[b], ST_OK);
    return rc;
}

int32_t st_engine_running(const st_engine *e) { return e ? e->n_running : 0; }

int32_t st_engine_queued(const st_engine *e) { return e ? e->n_queued : 0; }

int64_t st_engine_kv_used(const st_engine *e) {
    int64_t used = 0;
    for (int32_t b = 0; e && b < e->g.bs; b++)
        if (e->g.req[b])
            used += st_session_seq_len(e->g.s, b);
    return used;
}

int64_t st_engine_kv_reserved(const st_engine *e) { return e ? e->kv_reserved : 0; }

static double draft_ms(const st_engine *e) {
    double ms = 0.0;
    for (int32_t b = 0; b < e->g.bs; b++)
        ms += e->g.dr[b] ? e->g.dr[b]->ms : 0.0;
    return ms;
}

void st_engine_get_stats(const st_engine *e, st_engine_stats *out) {
    memset(out, 0, sizeof *out);
    if (!e)
        return;
    out->steps = e->steps;
    out->spec_steps = e->spec_fwd;
    out->plain_steps = e->plain_fwd;
    out->requests_finished = e->finished;
    out->prompt_tokens = e->gs.prompt_tokens;
    out->gen_tokens = e->gs.gen_tokens;
    memcpy(out->accept_hist, e->accept_hist, sizeof out->accept_hist);
    out->prefill_ms = e->prefill_s * 1e3;
    out->draft_ms = draft_ms(e);
    out->verify_ms = e->g.verify_s * 1e3;
    out->n_ctx = e->n_ctx;
    out->max_running = e->max_running;
    out->num_steps = e->gs.num_steps;
    out->topk = e->gs.topk;
    out->num_draft_tokens = e->gs.num_draft_tokens;
    out->kv_budget = e->kv_budget;
    st_ctl_outlook(e->g.ctl, &out->outlook);
    out->kv_bytes = e->g.target_bytes;
    out->draft_bytes = e->g.draft_bytes;
    if (e->pfx) {
        st_prefix_stats ps;
        st_prefix_get_stats(e->pfx, &ps);
        out->prefix_hits = e->pfx_hits;
        out->prefix_misses = e->pfx_misses;
        out->prefix_hit_tokens = e->pfx_served;
        out->prefix_blocks = ps.blocks;
        out->prefix_evictions = ps.evictions;
        out->prefix_bytes = ps.bytes;
        out->prefix_budget = ps.budget_bytes;
    }
}

void st_engine_gen_stats(const st_engine *e, st_gen_stats *out) {
    *out = e->gs;
    memset(out->stop_reason, 0, sizeof out->stop_reason);
    out->draft_ms = draft_ms(e);
    out->verify_ms = e->g.verify_s * 1e3;
    out->tau = out->spec_steps ? (double)e->g.spec_emitted / (double)out->spec_steps : 0.0;
    st_ctl_outlook(e->g.ctl, &out->outlook);
}

double st_engine_prefill_ms(const st_engine *e) { return e->prefill_s * 1e3; }
