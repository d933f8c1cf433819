/*
 * engine.c: the generation loop. Prefill, then per step: draft (n-gram or draft model) ->
 * organize + build_tree -> one target verify forward over the tree -> verification with the
 * position-coupled sampler (greedy is its temperature-0 case) -> KV commit. The emitted tokens
 * equal plain decoding because the target's token at every node is the same pure function of
 * (logits, seed, position) that plain decoding computes, and the logits are bitwise equal
 * (DESIGN.md invariant 1). A small controller turns speculation off while it does not pay.
 */
#include "draft/drafter.h"
#include "engine/engine_api.h"

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
                        .ngram_max_match = 4,
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

typedef struct gen {
    st_session *s;
    st_drafter *dr;
    st_verify_mask *vm;
    int32_t V;
    /* per-step arrays */
    float *scores;
    int32_t *cand_tokens;
    int64_t *level_parents, *sel, *parent_list;
    int32_t *drafts;
    int32_t tree_tokens[ST_MAX_N], positions[ST_MAX_N];
    int64_t ri[ST_MAX_N], nt[ST_MAX_N], ns[ST_MAX_N];
    int32_t tp[ST_MAX_N], pred[ST_MAX_N];
    int64_t acc[ST_MAX_S + 2];
    float *logits; /* (ST_MAX_N, V) */
    void *scratch; /* sampler */
    int32_t *hist; /* (n_ctx + 1) */
} gen;

static void gen_free(gen *g) {
    st_session_free(g->s);
    if (g->dr)
        g->dr->free(g->dr);
    st_verify_mask_free(g->vm);
    st_free(g->scores);
    st_free(g->cand_tokens);
    st_free(g->level_parents);
    st_free(g->sel);
    st_free(g->parent_list);
    st_free(g->drafts);
    st_free(g->logits);
    st_free(g->scratch);
    st_free(g->hist);
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
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

st_status st_generate(const st_model *m, const int32_t *prompt, int64_t n_prompt, int64_t n_predict,
                      const st_sampler_params *sampler, const st_spec_params *spec,
                      int32_t n_threads, int32_t n_ctx, st_emit_fn emit, void *user,
                      st_gen_stats *stats) {
    if (!m || !prompt || n_prompt < 1 || n_predict < 0 || !sampler)
        return st_fail(ST_ERR_INVALID, "generate: need a model, a prompt of >= 1 token and a "
                                       "sampler");
    st_spec_params sp = spec ? *spec : st_spec_default_params();
    st_gen_stats st0;
    memset(&st0, 0, sizeof st0);
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
    g.V = m->hp.n_vocab;
    st_session_params ps = st_session_default_params();
    ps.n_ctx = n_ctx > 0 ? n_ctx : m->hp.n_ctx_train;
    ps.n_threads = n_threads;
    ps.n_batch = 64;
    if (n_prompt >= ps.n_ctx)
        return st_fail(ST_ERR_RANGE,
                       "generate: the prompt (%lld tokens) does not fit the "
                       "context of %d",
                       (long long)n_prompt, ps.n_ctx);
    if ((rc = st_session_create(m, &ps, &g.s)))
        return rc;
    g.logits = st_malloc((size_t)ST_MAX_N * (size_t)g.V * sizeof(float));
    g.scratch = st_malloc(st_sample_scratch_size(g.V));
    g.hist = st_malloc(((size_t)ps.n_ctx + 1) * sizeof(int32_t));
    if (!g.logits || !g.scratch || !g.hist) {
        rc = st_fail(ST_ERR_NOMEM, "generate: out of memory");
        goto done;
    }
    if (sp.algo != ST_SPEC_NONE) {
        int64_t M = st_tree_n_candidates(K, S), LPW = st_tree_level_parents_width(K, S);
        int64_t PW = st_tree_parent_width(K, S);
        g.scores = st_malloc((size_t)M * sizeof(float));
        g.cand_tokens = st_malloc((size_t)M * sizeof(int32_t));
        g.level_parents = st_malloc((size_t)LPW * sizeof(int64_t));
        g.sel = st_malloc((size_t)N * sizeof(int64_t));
        g.drafts = st_malloc((size_t)N * sizeof(int32_t));
        g.parent_list = st_malloc((size_t)(PW + 1) * sizeof(int64_t));
        if (!g.scores || !g.cand_tokens || !g.level_parents || !g.sel || !g.drafts ||
            !g.parent_list) {
            rc = st_fail(ST_ERR_NOMEM, "generate: out of memory");
            goto done;
        }
        if (sp.algo == ST_SPEC_NGRAM)
            rc = st_drafter_ngram_create(sp.ngram_min_match, sp.ngram_max_match, sp.ngram_breadth,
                                         K, S, &g.dr);
        else
            rc = st_drafter_model_create(sp.draft_model, m, ps.n_ctx, n_threads, K, S, &g.dr);
        if (rc)
            goto done;
        if ((rc = st_verify_mask_create(sp.backend, 1, N, ps.n_ctx, &g.vm)))
            goto done;
    }
    S_->num_steps = S, S_->topk = K, S_->num_draft_tokens = N;
    S_->prompt_tokens = n_prompt;

    double t0 = st_time_now();
    memcpy(g.hist, prompt, (size_t)n_prompt * sizeof(int32_t));
    int64_t n_hist = n_prompt;
    if ((rc = st_session_eval(g.s, 0, prompt, (int32_t)n_prompt, g.logits, 1)))
        goto done;
    double t1 = st_time_now();
    S_->prompt_ms = (t1 - t0) * 1e3;
    double verify_s = 0.0;
    int64_t n_gen = 0;
    int stop = n_predict == 0;
    int32_t next;
    /* the first token comes from the prefill's logits */
    if (!stop) {
        if ((rc = target_token(&g, g.logits, sampler, n_prompt, &next)))
            goto done;
        if (st_tokenizer_is_eog(m->tok, next)) {
            stop = 1;
        } else {
            g.hist[n_hist++] = next;
            n_gen++;
            stop = (emit && emit(user, next)) || n_gen >= n_predict;
        }
    }
    /* Controller (auto shapes only): plain decoding for 4 steps to measure it, then compare
     * speculative throughput with it every 32 emitted tokens; pause speculation for 64 steps
     * whenever it does not pay, then measure again. */
    int spec_on = sp.algo != ST_SPEC_NONE;
    int autotune = spec_on && (sp.topk == 0 || sp.num_steps == 0 ||
                               (sp.topk != 1 && sp.num_draft_tokens == 0));
    int64_t spec_emitted = 0;
    double spec_tok = 0, spec_time = 0, plain_tok = 0, plain_time = 0;
    int64_t off_until = autotune ? 4 : 0, step = 0;
    while (!stop) {
        int32_t L = st_session_seq_len(g.s, 0);
        if (L + 1 >= ps.n_ctx)
            break;
        int use_spec = spec_on && step >= off_until && L + N + 1 + K * S < ps.n_ctx;
        double ts = st_time_now();
        int64_t k = 0;
        int32_t nstep = 1;
        if (use_spec) {
            int64_t n_real = 0;
            if ((rc = g.dr->propose(g.dr, g.hist, n_hist, K, S, g.scores, g.cand_tokens,
                                    g.level_parents, &n_real)))
                goto done;
            nstep = (int32_t)(n_real + 1 < N ? n_real + 1 : N);
        }
        if (nstep > 1) {
            st_tree_shape shape = {1, K, S, nstep};
            st_tree_mask mk;
            if ((rc = st_tree_organize(&shape, g.scores, g.cand_tokens, g.level_parents, g.sel,
                                       g.drafts, g.parent_list)) ||
                (rc = st_verify_mask_prepare(g.vm, K, 1, nstep, L, &mk)))
                goto done;
            int64_t Lb = L;
            int32_t root = g.hist[n_hist - 1];
            st_tree_input in = {&root, st_tree_parent_width(K, S) ? g.parent_list : NULL, g.sel,
                                g.drafts, &Lb};
            st_tree tree = {g.tree_tokens, g.positions, g.ri, g.nt, g.ns};
            if ((rc = st_tree_build(&shape, &in, &tree, &mk)))
                goto done;
            int32_t seq = 0;
            double tv = st_time_now();
            if ((rc = st_session_verify(g.s, sp.backend, 1, nstep, &seq, &tree, &mk, g.logits)))
                goto done;
            verify_s += st_time_now() - tv;
            for (int32_t t = 0; t < nstep; t++)
                if ((rc = target_token(&g, g.logits + (size_t)t * g.V, sampler,
                                       (int64_t)g.positions[t] + 1, &g.tp[t])))
                    goto done;
            if ((rc = st_verify_tree_greedy(1, nstep, S, &tree, g.tp, g.pred, g.acc, &k)))
                goto done;
            if ((rc = st_session_commit(g.s, 0, nstep, g.acc, k + 1)))
                goto done;
            /* emit the accepted drafts, then the bonus */
            for (int64_t i = 1; i <= k + 1 && !stop; i++) {
                int32_t tok = i <= k ? g.tree_tokens[g.acc[i]] : g.pred[g.acc[k]];
                if (st_tokenizer_is_eog(m->tok, tok)) {
                    stop = 1;
                    break;
                }
                g.hist[n_hist++] = tok;
                n_gen++;
                stop = (emit && emit(user, tok)) || n_gen >= n_predict;
            }
        } else {
            double tv = st_time_now();
            if ((rc = st_session_eval(g.s, 0, &g.hist[n_hist - 1], 1, g.logits, 1)))
                goto done;
            verify_s += st_time_now() - tv;
            if ((rc = target_token(&g, g.logits, sampler, L + 1, &next)))
                goto done;
            if (st_tokenizer_is_eog(m->tok, next)) {
                stop = 1;
            } else {
                g.hist[n_hist++] = next;
                n_gen++;
                stop = (emit && emit(user, next)) || n_gen >= n_predict;
            }
        }
        double dt = st_time_now() - ts;
        if (nstep > 1) {
            S_->spec_steps++;
            S_->accept_hist[k]++;
            spec_emitted += k + 1;
        } else {
            S_->plain_steps++;
        }
        step++;
        if (autotune) {
            if (use_spec) {
                spec_tok += (double)(k + 1);
                spec_time += dt;
            } else {
                plain_tok += 1;
                plain_time += dt;
            }
            if (use_spec && spec_tok >= 32) {
                if (plain_time > 0 && spec_tok / spec_time < 0.98 * (plain_tok / plain_time)) {
                    off_until = step + 64;
                    plain_tok = plain_time = 0;
                }
                spec_tok = spec_time = 0;
            }
        }
    }
    double t2 = st_time_now();
    S_->gen_tokens = n_gen;
    S_->gen_ms = (t2 - t1) * 1e3;
    S_->draft_ms = g.dr ? g.dr->ms : 0.0;
    S_->verify_ms = verify_s * 1e3;
    S_->overhead_ms = S_->gen_ms - S_->draft_ms - S_->verify_ms;
    S_->tau = S_->spec_steps ? (double)spec_emitted / (double)S_->spec_steps : 0.0;
    S_->prompt_tok_s = S_->prompt_ms > 0 ? (double)n_prompt / (S_->prompt_ms / 1e3) : 0.0;
    S_->gen_tok_s = S_->gen_ms > 0 ? (double)n_gen / (S_->gen_ms / 1e3) : 0.0;
done:
    gen_free(&g);
    return rc;
}
