/*
 * engine.c: the generation loop. Prefill, then per step: draft (n-gram or draft model) ->
 * organize + build_tree -> one target verify forward over the tree -> verification with the
 * position-coupled sampler (greedy is its temperature-0 case) -> KV commit. The emitted tokens
 * equal plain decoding because the target's token at every node is the same pure function of
 * (logits, seed, position) that plain decoding computes, and the logits are bitwise equal
 * (DESIGN.md invariant 1). A small controller turns speculation off while it does not pay.
 */
#include "draft/drafter.h"
#include "engine/ctl.h"
#include "spectree.h"

#include <ctype.h>
#include <math.h>
#include <string.h>
#include <strings.h>

enum { ST_MAX_N = 64, ST_MAX_K = 8, ST_MAX_S = 16 };

st_status st_spec_algo_parse(const char *name, st_spec_algo *out) {
    if (name && !strcasecmp(name, "NONE"))
        *out = ST_SPEC_NONE;
    else if (name && !strcasecmp(name, "STANDALONE"))
        *out = ST_SPEC_STANDALONE;
    else if (name && !strcasecmp(name, "NGRAM"))
        *out = ST_SPEC_NGRAM;
    else if (name && (!strcasecmp(name, "EAGLE") || !strcasecmp(name, "EAGLE3")))
        return st_fail(ST_ERR_UNSUPPORTED,
                       "speculative algorithm '%s' is not supported yet "
                       "(NONE, STANDALONE, NGRAM)",
                       name);
    else
        return st_fail(ST_ERR_INVALID,
                       "unknown speculative algorithm '%s' (NONE, STANDALONE, "
                       "NGRAM)",
                       name ? name : "(null)");
    return ST_OK;
}

const char *st_spec_algo_name(st_spec_algo a) {
    return a == ST_SPEC_STANDALONE ? "STANDALONE" : a == ST_SPEC_NGRAM ? "NGRAM" : "NONE";
}

st_spec_params st_spec_default_params(void) {
    st_spec_params p = {.algo = ST_SPEC_NONE,
                        .backend = ST_ATTN_CASCADE,
                        .ngram_min_match = 1,
                        .ngram_max_match = 8,
                        .ngram_breadth = 8};
    return p;
}

/* Resolves `auto` (0) values and SGLang's rules into a valid (K, S, N). */
static st_status resolve_shape(const st_spec_params *sp, int32_t *K, int32_t *S, int32_t *N) {
    *K = sp->topk, *S = sp->num_steps, *N = sp->num_draft_tokens;
    if (*K < 0 || *S < 0 || *N < 0)
        return st_fail(ST_ERR_INVALID, "speculative tree: negative topk/steps/draft tokens");
    if (*S == 0)
        *S = sp->algo == ST_SPEC_NGRAM ? 6 : 4;
    if (*K == 0)
        *K = sp->algo == ST_SPEC_NGRAM ? 2 : 1;
    if (*K > ST_MAX_K || *S > ST_MAX_S)
        return st_fail(ST_ERR_INVALID, "speculative tree: topk %d (max %d) or steps %d (max %d)",
                       *K, ST_MAX_K, *S, ST_MAX_S);
    if (*K == 1) {
        *N = *S + 1; /* a chain, as SGLang adjusts it */
    } else if (*N == 0) {
        *N = *K * *S + 1 < 12 ? *K * *S + 1 : 12;
    }
    int64_t M = st_tree_n_candidates(*K, *S);
    if (*N < 2 || *N > ST_MAX_N || *N - 1 > M)
        return st_fail(ST_ERR_INVALID,
                       "speculative tree: num_draft_tokens %d must be in 2..%d and at most "
                       "1 + K + (S-1)*K*K = %lld",
                       *N, ST_MAX_N, (long long)(1 + M));
    return ST_OK;
}

enum { ST_MAX_BS = 64 };

typedef struct gen {
    st_session *s;
    st_drafter *dr[ST_MAX_BS]; /* one drafter per sequence (each keeps its own state) */
    st_verify_mask *vm;
    int32_t V, bs;
    int64_t M, LPW, PW;
    /* per-step arrays, row b = active request b */
    float *scores;                                /* (bs, M) */
    int32_t *cand_tokens;                         /* (bs, M) */
    int64_t *level_parents;                       /* (bs, LPW) */
    int64_t *sel;                                 /* (bs, N-1) */
    int64_t *parent_list;                         /* (bs, PW) */
    int32_t *drafts;                              /* (bs, N-1) */
    int32_t *roots;                               /* (bs) */
    int64_t *seq_lens;                            /* (bs) */
    int32_t *seqs;                                /* (bs) */
    int32_t *tree_tokens, *positions, *tp, *pred; /* (bs, N) */
    int64_t *ri, *nt, *ns;                        /* (bs, N) */
    int64_t *acc;                                 /* (bs, S+1) */
    int64_t *n_acc;                               /* (bs) */
    float *logits;                                /* (bs*N, V) */
    void *scratch;                                /* sampler */
    int32_t *hist[ST_MAX_BS];                     /* (n_ctx + 1) each */
    int64_t n_hist[ST_MAX_BS];
    int64_t n_gen[ST_MAX_BS];
    int done[ST_MAX_BS];
} gen;

static void gen_free(gen *g) {
    st_session_free(g->s);
    for (int i = 0; i < ST_MAX_BS; i++) {
        if (g->dr[i])
            g->dr[i]->free(g->dr[i]);
        st_free(g->hist[i]);
    }
    st_verify_mask_free(g->vm);
    void *p[] = {g->scores,    g->cand_tokens, g->level_parents, g->sel,    g->parent_list,
                 g->drafts,    g->roots,       g->seq_lens,      g->seqs,   g->tree_tokens,
                 g->positions, g->tp,          g->pred,          g->ri,     g->nt,
                 g->ns,        g->acc,         g->n_acc,         g->logits, g->scratch};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        st_free(p[i]);
}

/* First index of the largest value (NaN never wins; index 0 if x[0] is NaN), as the scalar
 * loop `if (x[i] > x[b]) b = i` gives it: eight running maxima (a loop compilers turn into
 * vector max instructions), then the first index holding the maximum. */
static int32_t argmax(const float *x, int32_t n) {
    if (n < 16 || isnan(x[0])) {
        int32_t b = 0;
        for (int32_t i = 1; i < n; i++)
            if (x[i] > x[b])
                b = i;
        return b;
    }
    float m[8];
    for (int l = 0; l < 8; l++)
        m[l] = x[0];
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
    for (; i < n; i++)
        m[0] = x[i] > m[0] ? x[i] : m[0];
    float mx = m[0];
    for (int l = 1; l < 8; l++)
        mx = m[l] > mx ? m[l] : mx;
    for (i = 0; i < n; i++)
        if (x[i] == mx)
            return i;
    return 0;
}

/* The target's token after a node at position pos: what plain decoding would pick there. */
static st_status target_token(gen *g, const float *lg, const st_sampler_params *sp, int64_t pos,
                              int32_t *out) {
    if (sp->temp == 0.0f) {
        *out = argmax(lg, g->V);
        return ST_OK;
    }
    return st_sample(lg, g->V, sp, pos, g->scratch, out);
}

/* The target's tokens at the nodes greedy verification visits, and only there (it reads no
 * other entry of g->tp): from the root, the target's token selects the child to accept next.
 * Each visited node costs its output layer (deferred by the verify forward), one argmax or
 * sampler draw; the rest of the tree costs none of these. */
static st_status path_targets(gen *g, int32_t na, int32_t n, int64_t S, const st_tree *tree,
                              const st_sampler_params *sp) {
    for (int32_t a = 0; a < na; a++) {
        const int64_t o = (int64_t)a * n;
        const int32_t *cand = tree->tokens + o;
        const int64_t *ri = tree->retrieve_index + o, *nt = tree->next_token + o,
                      *ns = tree->next_sibling + o;
        for (int64_t j = 0, cur = 0;; j++) {
            const int64_t row = ri[cur];
            if (row < 0 || row >= (int64_t)na * n)
                return st_fail(ST_ERR_INVALID, "verify: tree row %lld out of range",
                               (long long)row);
            float *lg = g->logits + (size_t)row * (size_t)g->V;
            st_status rc = st_session_logits(g->s, row, lg);
            if (!rc)
                rc = target_token(g, lg, sp, (int64_t)g->positions[row] + 1, &g->tp[row]);
            if (rc)
                return rc;
            if (j == S)
                break;
            int64_t c = nt[cur], hops = 0;
            while (c != -1 && cand[c] != g->tp[row] && ++hops < n)
                c = ns[c];
            if (c == -1 || cand[c] != g->tp[row])
                break;
            cur = c;
        }
    }
    return ST_OK;
}

typedef struct emit_ctx {
    st_emit_seq_fn emit;
    void *user;
} emit_ctx;

/* Appends token tok to sequence b's output; returns nonzero when b is finished. */
static int push_token(gen *g, const st_model *m, int32_t b, int32_t tok, int64_t n_predict,
                      const emit_ctx *ec) {
    if (st_tokenizer_is_eog(m->tok, tok))
        return g->done[b] = 1;
    g->hist[b][g->n_hist[b]++] = tok;
    g->n_gen[b]++;
    if ((ec->emit && ec->emit(ec->user, b, tok)) || g->n_gen[b] >= n_predict)
        g->done[b] = 1;
    return g->done[b];
}

#define ALLOC(ptr, n)                                                                              \
    do {                                                                                           \
        (ptr) = st_malloc((size_t)(n) * sizeof *(ptr));                                            \
        if (!(ptr)) {                                                                              \
            rc = st_fail(ST_ERR_NOMEM, "generate: out of memory");                                 \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

st_status st_generate_batch(const st_model *m, int32_t bs, const int32_t *const *prompts,
                            const int64_t *n_prompts, int64_t n_predict,
                            const st_sampler_params *sampler, const st_spec_params *spec,
                            int32_t n_threads, int32_t n_ctx, st_emit_seq_fn emit, void *user,
                            st_gen_stats *stats) {
    if (!m || !prompts || !n_prompts || n_predict < 0 || !sampler || bs < 1 || bs > ST_MAX_BS)
        return st_fail(ST_ERR_INVALID, "generate: need a model, 1..%d prompts and a sampler",
                       ST_MAX_BS);
    for (int32_t b = 0; b < bs; b++)
        if (!prompts[b] || n_prompts[b] < 1)
            return st_fail(ST_ERR_INVALID, "generate: prompt %d is empty", b);
    st_spec_params sp = spec ? *spec : st_spec_default_params();
    st_gen_stats st0;
    st_gen_stats *S_ = stats ? stats : &st0;
    memset(S_, 0, sizeof *S_);
    int32_t K = 1, S = 0, N = 1;
    st_status rc = ST_OK;
    if (sp.algo != ST_SPEC_NONE && (rc = resolve_shape(&sp, &K, &S, &N)))
        return rc;
    if (sp.algo == ST_SPEC_STANDALONE && !sp.draft_model)
        return st_fail(ST_ERR_INVALID, "generate: STANDALONE needs a draft model "
                                       "(--speculative-draft-model-path)");
    gen g;
    memset(&g, 0, sizeof g);
    st_ctl *ctl = NULL;
    g.V = m->hp.n_vocab;
    g.bs = bs;
    emit_ctx ec = {emit, user};
    st_session_params ps = st_session_default_params();
    ps.n_ctx = n_ctx > 0 ? n_ctx : m->hp.n_ctx_train;
    ps.n_threads = n_threads;
    ps.n_seq = bs;
    ps.n_batch = bs * N > 64 ? bs * N : 64;
    for (int32_t b = 0; b < bs; b++)
        if (n_prompts[b] >= ps.n_ctx)
            return st_fail(ST_ERR_RANGE,
                           "generate: prompt %d (%lld tokens) does not fit the context of %d", b,
                           (long long)n_prompts[b], ps.n_ctx);
    if ((rc = st_session_create(m, &ps, &g.s)))
        return rc;
    ALLOC(g.logits, (size_t)bs * (size_t)N * (size_t)g.V);
    g.scratch = st_malloc(st_sample_scratch_size(g.V));
    if (!g.scratch) {
        rc = st_fail(ST_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    for (int32_t b = 0; b < bs; b++)
        ALLOC(g.hist[b], ps.n_ctx + 1);
    ALLOC(g.roots, bs);
    ALLOC(g.seq_lens, bs);
    ALLOC(g.seqs, bs);
    ALLOC(g.tree_tokens, bs * N);
    ALLOC(g.positions, bs * N);
    ALLOC(g.tp, bs * N);
    ALLOC(g.pred, bs * N);
    ALLOC(g.ri, bs * N);
    ALLOC(g.nt, bs * N);
    ALLOC(g.ns, bs * N);
    ALLOC(g.acc, bs * (S + 1));
    ALLOC(g.n_acc, bs);
    if (sp.algo != ST_SPEC_NONE) {
        g.M = st_tree_n_candidates(K, S);
        g.LPW = st_tree_level_parents_width(K, S);
        g.PW = st_tree_parent_width(K, S);
        ALLOC(g.scores, bs * g.M);
        ALLOC(g.cand_tokens, bs * g.M);
        ALLOC(g.level_parents, bs * g.LPW);
        ALLOC(g.sel, bs * (N - 1));
        ALLOC(g.drafts, bs * (N - 1));
        ALLOC(g.parent_list, bs * g.PW + 1);
        for (int32_t b = 0; b < bs; b++) {
            if (sp.algo == ST_SPEC_NGRAM)
                rc = st_drafter_ngram_create(sp.ngram_min_match, sp.ngram_max_match,
                                             sp.ngram_breadth, K, S, ps.n_ctx + 1, &g.dr[b]);
            else
                rc =
                    st_drafter_model_create(sp.draft_model, m, ps.n_ctx, n_threads, K, S, &g.dr[b]);
            if (rc)
                goto done;
        }
        int64_t ctx_sum = (int64_t)bs * ps.n_ctx;
        if ((rc = st_verify_mask_create(sp.backend, bs, N, ctx_sum, &g.vm)))
            goto done;
    }
    S_->num_steps = S, S_->topk = K, S_->num_draft_tokens = N;

    double t0 = st_time_now();
    for (int32_t b = 0; b < bs; b++) {
        memcpy(g.hist[b], prompts[b], (size_t)n_prompts[b] * sizeof(int32_t));
        g.n_hist[b] = n_prompts[b];
        S_->prompt_tokens += n_prompts[b];
        if ((rc = st_session_eval(g.s, b, prompts[b], (int32_t)n_prompts[b], g.logits, 1)))
            goto done;
        int32_t next;
        if (n_predict == 0) {
            g.done[b] = 1;
            continue;
        }
        if ((rc = target_token(&g, g.logits, sampler, n_prompts[b], &next)))
            goto done;
        push_token(&g, m, b, next, n_predict, &ec);
    }
    double t1 = st_time_now();
    S_->prompt_ms = (t1 - t0) * 1e3;
    double verify_s = 0.0;
    /* `auto` (ctl.h): each step the controller ranks the drafted candidates, estimates from
     * calibrated acceptance and the measured verify-cost curve how many of them to verify, and
     * verifies none when no tree promises a gain. A plain step every 64 steps keeps the plain
     * time per token fresh. A model drafter costs time before the choice is made, so it is
     * also judged by its realized gain over windows of 4 drafted steps: a losing window pauses
     * it for a back-off that doubles with each failure (16 .. 512 steps). */
    int spec_on = sp.algo != ST_SPEC_NONE;
    int autotune = spec_on && (sp.topk == 0 || sp.num_steps == 0 ||
                               (sp.topk != 1 && sp.num_draft_tokens == 0));
    const int model_drafter = sp.algo == ST_SPEC_STANDALONE;
    int64_t spec_emitted = 0;
    if (autotune && (rc = st_ctl_create(bs, K, S, N, &ctl)))
        goto done;
    S_->auto_shape = autotune;
    double win_benefit = 0.0;
    int32_t win_steps = 0;
    int64_t backoff = 16, off_until = 0, step = 0, last_plain = 0;
    /* A draft model reading more than half the target's weight bytes per token cannot pay for
     * its drafts (its tokens cost more than half a target token; the self-draft costs one):
     * `auto` does not draft with it at all. Fixed shapes still do as told. */
    if (autotune && model_drafter &&
        (double)st_model_weight_bytes(sp.draft_model) > 0.5 * (double)st_model_weight_bytes(m))
        off_until = INT64_MAX;
    int failed_probes = 0;
    for (;;) {
        /* active sequences with room for one more token */
        int32_t na = 0, maxL = 0;
        for (int32_t b = 0; b < bs; b++) {
            int32_t L = st_session_seq_len(g.s, b);
            if (!g.done[b] && L + 1 >= ps.n_ctx)
                g.done[b] = 1;
            if (!g.done[b]) {
                g.seqs[na++] = b;
                maxL = L > maxL ? L : maxL;
            }
        }
        if (na == 0)
            break;
        /* (a model drafter only drafts once the plain time per token is known: its drafts
         * cost time before the controller can judge them) */
        int use_spec = spec_on && step >= off_until && maxL + N + 1 + K * S < ps.n_ctx &&
                       !(autotune && step - last_plain >= 64) &&
                       !(ctl && model_drafter && st_ctl_t1(ctl) <= 0.0);
        double ts = st_time_now();
        int64_t emitted = 0;
        int32_t nstep = 1;
        if (use_spec) {
            int64_t max_real = 0;
            for (int32_t a = 0; a < na; a++) {
                int32_t b = g.seqs[a];
                int64_t n_real = 0;
                if ((rc = g.dr[b]->propose(g.dr[b], g.hist[b], g.n_hist[b], K, S,
                                           g.scores + a * g.M, g.cand_tokens + a * g.M,
                                           g.level_parents + a * g.LPW, &n_real)))
                    goto done;
                max_real = n_real > max_real ? n_real : max_real;
                if (ctl)
                    st_ctl_rank(ctl, a, b, K, S, g.scores + a * g.M, g.cand_tokens + a * g.M,
                                g.level_parents + a * g.LPW, g.n_hist[b], g.dr[b]->conf);
            }
            if (ctl) {
                double eg;
                nstep = st_ctl_choose(ctl, na, &eg);
            } else {
                nstep = (int32_t)(max_real + 1 < N ? max_real + 1 : N);
            }
        }
        double tp = st_time_now();
        if (nstep > 1) {
            st_tree_shape shape = {na, K, S, nstep};
            st_tree_mask mk;
            int64_t sum = 0;
            for (int32_t a = 0; a < na; a++) {
                int32_t b = g.seqs[a];
                g.roots[a] = g.hist[b][g.n_hist[b] - 1];
                g.seq_lens[a] = st_session_seq_len(g.s, b);
                sum += g.seq_lens[a];
            }
            if ((rc = st_tree_organize(&shape, g.scores, g.cand_tokens, g.level_parents, g.sel,
                                       g.drafts, g.parent_list)) ||
                (rc = st_verify_mask_prepare(g.vm, K, na, nstep, sum, &mk)))
                goto done;
            st_tree_input in = {g.roots, g.PW ? g.parent_list : NULL, g.sel, g.drafts, g.seq_lens};
            st_tree tree = {g.tree_tokens, g.positions, g.ri, g.nt, g.ns};
            if ((rc = st_tree_build(&shape, &in, &tree, &mk)))
                goto done;
            double tv = st_time_now();
            if ((rc = st_session_verify(g.s, g.vm, na, nstep, g.seqs, &tree, NULL)))
                goto done;
            if ((rc = path_targets(&g, na, nstep, S, &tree, sampler)))
                goto done;
            verify_s += st_time_now() - tv; /* the forward and the logits it deferred */
            if ((rc = st_verify_tree_greedy(na, nstep, S, &tree, g.tp, g.pred, g.acc, g.n_acc)))
                goto done;
            for (int32_t a = 0; a < na; a++) {
                int32_t b = g.seqs[a];
                int64_t k = g.n_acc[a], *acc = g.acc + (int64_t)a * (S + 1);
                for (int64_t i = 0; i <= k; i++)
                    acc[i] -= (int64_t)a * nstep; /* global -> node-in-request */
                if ((rc = st_session_commit(g.s, b, nstep, acc, k + 1)))
                    goto done;
                S_->spec_steps++;
                S_->tree_tokens += nstep;
                S_->accept_hist[k]++;
                int64_t before = g.n_gen[b];
                for (int64_t i = 1; i <= k + 1; i++) {
                    int32_t tok = i <= k ? g.tree_tokens[(int64_t)a * nstep + acc[i]]
                                         : g.pred[(int64_t)a * nstep + acc[k]];
                    if (push_token(&g, m, b, tok, n_predict, &ec))
                        break;
                }
                spec_emitted += k + 1;
                emitted += g.n_gen[b] - before;
            }
        } else {
            /* one decoding step for all active sequences in one forward pass */
            for (int32_t a = 0; a < na; a++) {
                int32_t b = g.seqs[a];
                g.roots[a] = g.hist[b][g.n_hist[b] - 1];
                g.seq_lens[a] = st_session_seq_len(g.s, b);
            }
            double tv = st_time_now();
            if ((rc = st_session_decode_batch(g.s, na, g.seqs, g.roots, g.logits)))
                goto done;
            verify_s += st_time_now() - tv;
            for (int32_t a = 0; a < na; a++) {
                int32_t b = g.seqs[a], next;
                if ((rc = target_token(&g, g.logits + (size_t)a * (size_t)g.V, sampler,
                                       g.seq_lens[a] + 1, &next)))
                    goto done;
                push_token(&g, m, b, next, n_predict, &ec);
                S_->plain_steps++;
                emitted++;
            }
        }
        double te = st_time_now();
        step++;
        if (ctl) {
            for (int32_t a = 0; a < na; a++) {
                int32_t b = g.seqs[a];
                st_ctl_observe(ctl, b, g.hist[b], g.n_hist[b], g.done[b]);
            }
            if (nstep == 1) {
                if (emitted > 0)
                    st_ctl_time_plain(ctl, (te - tp) / (double)na);
                last_plain = step;
            } else {
                st_ctl_time_verify(ctl, (int64_t)na * nstep, te - tp);
            }
            if (use_spec && model_drafter) {
                /* realized gain of this drafted step: plain time of its tokens minus its time */
                win_benefit += (double)emitted * st_ctl_t1(ctl) - (te - ts);
                /* drafts that cost more than half a target token each can never pay back
                 * the drafting: off for good (checked from the first drafted step on) */
                double dms = 0;
                int64_t ev = 0;
                for (int32_t b = 0; b < bs; b++)
                    dms += g.dr[b]->ms, ev += g.dr[b]->evals;
                const int hopeless = ev > 0 && dms / 1e3 / (double)ev > 0.5 * st_ctl_t1(ctl);
                /* a window ends after 4 drafted steps, or at once on a clear loss (each
                 * probe's proposals still calibrate the acceptance as shadows) */
                ++win_steps;
                if (hopeless || win_steps == 4 || win_benefit < -0.5 * st_ctl_t1(ctl)) {
                    if (win_benefit >= 0.0 && !hopeless) {
                        backoff = 16;
                        failed_probes = 0;
                    } else {
                        off_until = hopeless ? INT64_MAX : step + backoff;
                        backoff = backoff * 2 < 512 ? backoff * 2 : 512;
                        /* every probe must first catch up on the tokens since the last one:
                         * after three failed probes in a row, pause for 4096 steps */
                        if (++failed_probes >= 3 && off_until != INT64_MAX)
                            off_until = step + 4096;
                    }
                    win_benefit = 0.0;
                    win_steps = 0;
                }
            }
        }
    }
    double t2 = st_time_now();
    for (int32_t b = 0; b < bs; b++)
        S_->gen_tokens += g.n_gen[b];
    S_->gen_ms = (t2 - t1) * 1e3;
    for (int32_t b = 0; b < bs; b++)
        S_->draft_ms += g.dr[b] ? g.dr[b]->ms : 0.0;
    S_->verify_ms = verify_s * 1e3;
    S_->overhead_ms = S_->gen_ms - S_->draft_ms - S_->verify_ms;
    S_->tau = S_->spec_steps ? (double)spec_emitted / (double)S_->spec_steps : 0.0;
    S_->prompt_tok_s = S_->prompt_ms > 0 ? (double)S_->prompt_tokens / (S_->prompt_ms / 1e3) : 0.0;
    S_->gen_tok_s = S_->gen_ms > 0 ? (double)S_->gen_tokens / (S_->gen_ms / 1e3) : 0.0;
done:
    st_ctl_free(ctl);
    gen_free(&g);
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

st_status st_generate(const st_model *m, const int32_t *prompt, int64_t n_prompt, int64_t n_predict,
                      const st_sampler_params *sampler, const st_spec_params *spec,
                      int32_t n_threads, int32_t n_ctx, st_emit_fn emit, void *user,
                      st_gen_stats *stats) {
    one_ctx c = {emit, user};
    return st_generate_batch(m, 1, &prompt, &n_prompt, n_predict, sampler, spec, n_threads, n_ctx,
                             emit_one, &c, stats);
}
