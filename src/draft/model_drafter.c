/*
 * model_drafter.c: the draft-model drafter (SGLang's STANDALONE algorithm with EAGLE-2's
 * dynamic tree, Li et al. 2024): a small model with the target's vocabulary expands the top-K
 * tokens of each of the K best nodes per level, scoring paths by cumulative probability. Unlike
 * SGLang (issue #7523), every draft node attends to its real ancestors: each level is one
 * forward pass whose tokens see the committed prefix plus their own ancestor rows.
 */
#include "draft/drafter.h"

#include <math.h>
#include <string.h>

typedef struct mdraft {
    st_drafter base;
    st_session *s; /* the draft model's session (sequence 0) */
    int64_t max_k, max_s;
    int32_t valid; /* rows [0, valid) of the draft KV hold committed tokens */
    int32_t n_vocab;
    float *logits;  /* (max_k, n_vocab) */
    float *probs;   /* (n_vocab) */
    int32_t *anc;   /* (max_k, max_s) ancestor rows of each expanded node of the level */
    int32_t *nanc;  /* (max_k) */
    int32_t *anc2;  /* (max_k, max_s) next level's */
    int32_t *nanc2; /* (max_k) */
    float *score;   /* (max_k) cumulative score of each expanded node */
    int32_t *tok;   /* (max_k) */
    int32_t *toks;  /* (max_k) batch tokens */
    int32_t *pos, *seq, *row, *npre; /* (max_k) each */
    int32_t *eoff;                   /* (max_k + 1) */
    int32_t *erow;                   /* (max_k, max_s + 1) */
    int64_t *pick;                   /* (max_k) expanded candidates of a level */
    void *mem;                       /* the one allocation all the arrays above live in */
} mdraft;

/* Top-k of softmax(logits): ids and probabilities, descending, ties by lower id. */
static void topk_probs(const float *lg, int32_t V, int64_t k, float *probs, int32_t *ids,
                       float *p_out) {
    float mx = lg[0];
    for (int32_t i = 1; i < V; i++)
        mx = lg[i] > mx ? lg[i] : mx;
    float sum = 0.0f;
    for (int32_t i = 0; i < V; i++) {
        probs[i] = expf(lg[i] - mx);
        sum += probs[i];
    }
    for (int64_t r = 0; r < k; r++) {
        int32_t best = -1;
        for (int32_t i = 0; i < V; i++) {
            int taken = 0;
            for (int64_t q = 0; q < r; q++)
                taken |= ids[q] == i;
            if (!taken && (best < 0 || probs[i] > probs[best]))
                best = i;
        }
        ids[r] = best;
        p_out[r] = probs[best] / sum;
    }
}

/* Evaluates committed tokens hist[valid, upto) causally in the draft session. */
static st_status catch_up(mdraft *g, const int32_t *hist, int32_t upto) {
    st_session *s = g->s;
    if (g->valid > upto)
        g->valid = upto;
    st_status tr = st_session_seq_truncate(s, 0, g->valid);
    if (tr)
        return tr;
    if (upto > g->valid) {
        st_status st = st_session_eval(s, 0, hist + g->valid, upto - g->valid, NULL, 0);
        if (st)
            return st;
        g->base.evals += upto - g->valid;
    }
    g->valid = upto;
    return ST_OK;
}

static st_status mdraft_propose(st_drafter *d, const int32_t *hist, int64_t n_hist, int64_t K,
                                int64_t S, float *scores, int32_t *tokens, int64_t *level_parents,
                                int64_t *n_real) {
    mdraft *g = (mdraft *)d;
    double t0 = st_time_now();
    if (K > g->max_k || S > g->max_s || n_hist < 1)
        return st_fail(ST_ERR_INVALID, "draft model: K %lld / S %lld above its limits",
                       (long long)K, (long long)S);
    const int32_t L = (int32_t)n_hist - 1, V = g->n_vocab;
    if (L + 1 + K * S > g->s->p.n_ctx)
        return st_fail(ST_ERR_RANGE, "draft model: context full");
    st_status st = catch_up(g, hist, L);
    if (st)
        return st;
    /* the root at row L: committed next step, so it stays valid */
    st = st_session_eval(g->s, 0, &hist[L], 1, g->logits, 1);
    if (st)
        return st;
    g->valid = L + 1;
    d->evals += 1 + K * (S - 1);
    int64_t M = st_tree_n_candidates(K, S);
    for (int64_t i = 0; i < M; i++) {
        scores[i] = -INFINITY;
        tokens[i] = 0;
    }
    topk_probs(g->logits, V, K, g->probs, tokens, scores);
    level_parents[0] = -1;
    for (int64_t c = 0; c < K; c++) {
        level_parents[1 + c] = c;
        g->score[c] = scores[c];
        g->tok[c] = tokens[c];
        g->nanc[c] = 0;
    }
    int32_t next_row = L + 1;
    int64_t lp = K + 1, lpw = st_tree_level_parents_width(K, S);
    for (int64_t i = 1; i < S; i++) {
        /* one forward pass over the K expanded nodes of level i-1 */
        int32_t e = 0;
        for (int64_t k = 0; k < K; k++) {
            g->toks[k] = g->tok[k];
            g->pos[k] = L + (int32_t)i;
            g->seq[k] = 0;
            g->row[k] = next_row + (int32_t)k;
            g->npre[k] = L + 1;
            g->eoff[k] = e;
            for (int32_t a = 0; a < g->nanc[k]; a++)
                g->erow[e++] = g->anc[k * g->max_s + a];
            g->erow[e++] = g->row[k];
        }
        g->eoff[K] = e;
        st_fwd f = {.n = (int32_t)K,
                    .tokens = g->toks,
                    .pos = g->pos,
                    .seq = g->seq,
                    .kv_row = g->row,
                    .n_prefix = g->npre,
                    .extra_off = g->eoff,
                    .extra_rows = g->erow,
                    .logits_from = 0,
                    .logits = g->logits};
        if ((st = st_forward(g->s, &f)))
            return st;
        const int64_t base = st_tree_level_base(K, i);
        for (int64_t p = 0; p < K; p++) {
            topk_probs(g->logits + p * V, V, K, g->probs, tokens + base + p * K,
                       scores + base + p * K);
            for (int64_t c = 0; c < K; c++)
                scores[base + p * K + c] =
                    g->score[p] == -INFINITY ? -INFINITY : scores[base + p * K + c] * g->score[p];
        }
        st_draft_expand_level(scores, K, i, level_parents + lp, lpw - lp, g->pick);
        for (int64_t k = 0; k < K; k++) {
            const int64_t best = g->pick[k] >= 0 ? g->pick[k] : 0, p = best / K;
            memcpy(g->anc2 + k * g->max_s, g->anc + p * g->max_s,
                   (size_t)g->nanc[p] * sizeof *g->anc);
            g->anc2[k * g->max_s + g->nanc[p]] = g->row[p];
            g->nanc2[k] = g->nanc[p] + 1;
            g->score[k] = g->pick[k] >= 0 ? scores[base + best] : -INFINITY;
            g->tok[k] = tokens[base + best];
        }
        /* level_parents slots past the last needed level are never read */
        memcpy(g->anc, g->anc2, (size_t)(K * g->max_s) * sizeof *g->anc);
        memcpy(g->nanc, g->nanc2, (size_t)K * sizeof *g->nanc);
        next_row += (int32_t)K;
        lp += K;
    }
    *n_real = M;
    d->ms += (st_time_now() - t0) * 1e3;
    return ST_OK;
}

static void mdraft_free(st_drafter *d) {
    mdraft *g = (mdraft *)d;
    if (!g)
        return;
    st_session_free(g->s);
    st_free_aligned(g->mem);
    st_free(g);
}

/* The arrays of g in one planned block (st_plan: a sizing pass, then a carving pass). */
static void mdraft_layout(mdraft *g, st_plan *p) {
    const size_t K = (size_t)g->max_k, S = (size_t)g->max_s, V = (size_t)g->n_vocab;
    g->logits = st_plan_take(p, K * V, sizeof *g->logits);
    g->probs = st_plan_take(p, V, sizeof *g->probs);
    g->anc = st_plan_take(p, K * S, sizeof *g->anc);
    g->anc2 = st_plan_take(p, K * S, sizeof *g->anc2);
    g->nanc = st_plan_take(p, K, sizeof *g->nanc);
    g->nanc2 = st_plan_take(p, K, sizeof *g->nanc2);
    g->score = st_plan_take(p, K, sizeof *g->score);
    g->tok = st_plan_take(p, K, sizeof *g->tok);
    g->toks = st_plan_take(p, K, sizeof *g->toks);
    g->pos = st_plan_take(p, K, sizeof *g->pos);
    g->seq = st_plan_take(p, K, sizeof *g->seq);
    g->row = st_plan_take(p, K, sizeof *g->row);
    g->npre = st_plan_take(p, K, sizeof *g->npre);
    g->eoff = st_plan_take(p, K + 1, sizeof *g->eoff);
    g->erow = st_plan_take(p, K * (S + 1), sizeof *g->erow);
    g->pick = st_plan_take(p, K, sizeof *g->pick);
}

st_status st_drafter_model_create(const st_model *draft, const st_model *target, int32_t n_ctx,
                                  int32_t n_threads, int64_t max_k, int64_t max_s,
                                  st_drafter **out) {
    *out = NULL;
    if (max_k < 1 || max_k > ST_SPEC_MAX_K || max_s < 1 || max_s > ST_SPEC_MAX_S)
        return st_fail(ST_ERR_INVALID, "draft model: K must be in 1..%d and S in 1..%d",
                       ST_SPEC_MAX_K, ST_SPEC_MAX_S);
    const st_tokenizer *td = st_model_tokenizer(draft), *tt = st_model_tokenizer(target);
    int32_t nd = st_tokenizer_n_vocab(td), nt = st_tokenizer_n_vocab(tt);
    if (nd != nt || draft->hp.n_vocab != target->hp.n_vocab)
        return st_fail(ST_ERR_INVALID,
                       "draft model: vocabulary mismatch (draft %d tokens, target %d)", nd, nt);
    for (int32_t i = 0; i < nd; i++) {
        size_t la, lb;
        const char *a = st_tokenizer_piece(td, i, &la), *b = st_tokenizer_piece(tt, i, &lb);
        if (la != lb || memcmp(a, b, la) != 0)
            return st_fail(ST_ERR_INVALID,
                           "draft model: vocabulary mismatch at token %d ('%.*s' vs '%.*s')", i,
                           (int)(la > 32 ? 32 : la), a, (int)(lb > 32 ? 32 : lb), b);
    }
    mdraft *g = st_calloc(1, sizeof *g);
    if (!g)
        return st_fail(ST_ERR_NOMEM, "draft model: out of memory");
    g->base.propose = mdraft_propose;
    g->base.free = mdraft_free;
    g->max_k = max_k;
    g->max_s = max_s;
    g->n_vocab = draft->hp.n_vocab;
    st_session_params sp = st_session_default_params();
    sp.n_ctx = n_ctx;
    sp.n_threads = n_threads;
    /* n_batch: the session's default (64) covers a level of K <= ST_SPEC_MAX_K nodes */
    st_status st = st_session_create(draft, &sp, &g->s);
    if (st) {
        st_free(g);
        return st;
    }
    st_plan pl = {0};
    mdraft_layout(g, &pl);
    if (!(g->mem = st_plan_alloc(&pl))) {
        mdraft_free(&g->base);
        return st_fail(ST_ERR_NOMEM, "draft model: out of memory");
    }
    mdraft_layout(g, &pl);
    *out = &g->base;
    return ST_OK;
}
