/*
 * model_drafter.c: the drafters that run a model of their own with EAGLE-2's dynamic tree (Li
 * et al. 2024): the top-K tokens of each of the K best nodes per level are expanded, paths
 * scored by cumulative probability. Unlike SGLang (issue #7523), every draft node attends to
 * its real ancestors: each level is one forward pass whose tokens see the committed prefix plus
 * their own ancestor rows. Two kinds of model:
 * - STANDALONE: a small model with the target's vocabulary; its rows [0, L] hold the committed
 *   tokens including the root, and level i's nodes sit at position L + i.
 * - EAGLE-1/2 (Li et al., EAGLE, 2024; SafeAILab/EAGLE cnets1.py): a head whose position t reads
 *   (embedding of x_{t+1}, the target's final-normed state f_t) and outputs h_t, the predicted
 *   state of position t+1, whose logits (the target's output layer) predict x_{t+2}. Its rows
 *   [0, L) are committed (row L-1 pairs the root with f_{L-1} and gives level 0); level i's
 *   nodes sit at position L + i - 1 and read their parent's h in place of a target state. The
 *   engine hands every committed position's state over through `observe`.
 * - EAGLE-3 (Li et al., EAGLE-3, 2025; SafeAILab/EAGLE traineagle3/cnets.py): the same rows and
 *   positions, but a committed row reads three of the target's layers (fused by its fc), a
 *   draft node reads its parent's pre-norm output, and the head's logits cover its own draft
 *   vocabulary, whose ids d2t maps to target ids before they enter the pool.
 * Seed-coupled drafting (TREE_SPEC §9): when the engine hands over the request's sampler, each
 * expanded node's first candidate is the token the target's sampler would pick from the draft's
 * logits at that candidate's position (the same uniform), its siblings the draft's top-K.
 */
#include "draft/drafter.h"

#include <math.h>
#include <string.h>

typedef struct mdraft {
    st_drafter base;
    st_session *s; /* the draft model's session (sequence 0) */
    int eagle;     /* an EAGLE head (see the top of the file) */
    int64_t max_k, max_s;
    int32_t valid; /* rows [0, valid) of the draft KV hold committed tokens */
    int32_t n_vocab;
    int32_t n_cand; /* ids it drafts: [0, n_cand), the target's tokenizer's (the rows of a padded
                     * output layer past it have no token); EAGLE-3: its draft vocabulary */
    int32_t nb;     /* tokens of one forward pass: the session's n_batch */
    int32_t n_ctx;  /* positions */
    int64_t n_embd; /* EAGLE: width of a state */
    int32_t n_feat; /* EAGLE: the target's states of positions [0, n_feat) are in feat */
    float *feat;    /* EAGLE: (n_ctx + 1, feat_w) the target's state at each position (one row
                     * per position for now; only [valid, L) is read by a step), a region of
                     * its own committed as positions are used (st_lazy_alloc) */
    size_t feat_bytes;
    float *fin;     /* EAGLE: (max_k, n_embd) a level's input features: the parents' outputs */
    float *hout;    /* EAGLE: (max_k, n_embd) a level's outputs */
    float *logits;  /* (max_k, n_vocab) */
    float *probs;   /* (n_vocab) */
    int32_t *anc;   /* (max_k, max_s) ancestor rows of each expanded node of the level */
    int32_t *nanc;  /* (max_k) */
    int32_t *anc2;  /* (max_k, max_s) next level's */
    int32_t *nanc2; /* (max_k) */
    float *score;   /* (max_k) cumulative score of each expanded node */
    int32_t *tok;   /* (max_k) */
    int32_t *toks;  /* (max_k) batch tokens */
    int32_t *pos, *seq, *row, *npre; /* (nb) each */
    int32_t *eoff;                   /* (max_k + 1) */
    int32_t *erow;                   /* (max_k, max_s + 1) */
    int64_t *pick;                   /* (max_k) expanded candidates of a level */
    int32_t *ptok;                   /* (max_k, max_s) tokens of each expanded node's path below
                                      * the root, the node's own last (nanc[k] + 1 of them) */
    int32_t *ptok2;                  /* (max_k, max_s) next level's */
    int32_t n_tgt;                   /* coupling: the target's ids [0, n_tgt) */
    float *clog;                     /* (n_tgt) coupling: draft logits as target ids */
    int32_t *counts;                 /* (n_tgt) coupling: st_sample_penalize's counts */
    void *sscratch;                  /* coupling: st_sample's scratch for n_tgt */
    void *mem;                       /* the one allocation all the arrays above live in */

    /* EAGLE-3: logits cover the draft vocabulary (n_vocab = its size); d2t maps its ids */
    int eagle3;
    const int32_t *d2t; /* (n_vocab) target id of each draft id */
    int64_t feat_w;     /* width of a target state (n_embd; EAGLE-3: n_cap * target n_embd) */
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

/* EAGLE: evaluates head rows [start, L) (row t: token hist[t+1] with the target's state f_t),
 * up to nb per forward pass, from the first row not yet valid (at least row L-1, whose logits
 * are level 0's). The root's output h becomes the input feature of every level-1 node. */
static st_status eagle_catch_up(mdraft *g, const int32_t *hist, int32_t L, int64_t K) {
    if (g->n_feat < L)
        return st_fail(ST_ERR_INVALID,
                       "EAGLE: the target's states of positions %d..%d were not observed",
                       g->n_feat, L - 1);
    const int32_t start = g->valid < L ? g->valid : L - 1;
    int32_t last = 0;
    for (int32_t t0 = start; t0 < L;) {
        const int32_t c = L - t0 < g->nb ? L - t0 : g->nb;
        for (int32_t i = 0; i < c; i++) {
            g->pos[i] = g->row[i] = t0 + i;
            g->seq[i] = 0;
            g->npre[i] = t0 + i + 1;
        }
        st_fwd f = {.n = c,
                    .tokens = hist + t0 + 1,
                    .pos = g->pos,
                    .seq = g->seq,
                    .kv_row = g->row,
                    .n_prefix = g->npre,
                    .features = g->feat + (int64_t)t0 * g->feat_w,
                    .logits_from = t0 + c == L ? c - 1 : c,
                    .logits = g->logits};
        st_status st = st_forward(g->s, &f);
        if (st)
            return st;
        t0 += c;
        last = c - 1;
    }
    g->base.evals += L - start;
    g->base.catch_rows = L - start;
    g->valid = L;
    const float *h = st_session_state(g->s, last);
    for (int64_t k = 0; k < K; k++)
        memcpy(g->fin + k * g->n_embd, h, (size_t)g->n_embd * sizeof(float));
    return ST_OK;
}

/* STANDALONE: evaluates the committed tokens hist[valid, L] causally in one pass, the root at
 * row L last (committed next step, so it stays valid): its logits are level 0's. */
static st_status standalone_catch_up(mdraft *g, const int32_t *hist, int32_t L) {
    if (g->valid > L)
        g->valid = L;
    st_status st = st_session_seq_truncate(g->s, 0, g->valid);
    if (st || (st = st_session_eval(g->s, 0, hist + g->valid, L + 1 - g->valid, g->logits, 1)))
        return st;
    g->base.evals += L + 1 - g->valid;
    g->base.catch_rows = L + 1 - g->valid;
    g->valid = L + 1;
    return ST_OK;
}

/* EAGLE-3: draft ids to target ids (d2t), before they enter the pool. */
static void map_ids(const mdraft *g, int32_t *ids, int64_t n) {
    for (int64_t i = 0; g->d2t && i < n; i++)
        ids[i] = g->d2t[ids[i]];
}

/* Seed coupling of one node's K candidates ids (target ids, the draft's top-K by probability
 * p_out, descending) from its draft logits lg: the token the target's sampler would pick at
 * position pos after hist and path, with the draft's logits in place of the target's, becomes
 * the first candidate with the best score, the rest keep their order. */
static st_status couple(mdraft *g, const st_draft_coupling *cp, const float *lg,
                        const int32_t *hist, int64_t n_hist, const int32_t *path, int64_t n_path,
                        int64_t pos, int64_t K, int32_t *ids, float *p_out) {
    const st_sampler_params *sp = cp->sampler;
    const int pen = st_sampler_penalized(sp);
    if (sp->temp == 0.0f && !pen)
        return ST_OK; /* the argmax: the draft's top-1 already */
    const int32_t V = cp->n_tok < g->n_tgt ? cp->n_tok : g->n_tgt;
    if (g->d2t) {
        for (int32_t i = 0; i < V; i++)
            g->clog[i] = -INFINITY;
        for (int32_t i = 0; i < g->n_cand; i++)
            if (g->d2t[i] < V)
                g->clog[g->d2t[i]] = lg[i];
    } else {
        for (int32_t i = 0; i < V; i++)
            g->clog[i] = i < g->n_cand ? lg[i] : -INFINITY;
    }
    st_status st;
    if (pen) {
        const st_sample_history h = {hist, n_hist, cp->n_prompt, path, n_path};
        if ((st = st_sample_penalize(g->clog, V, sp, &h, cp->eog, cp->n_eog, g->counts)))
            return st;
    }
    int32_t t;
    if ((st = st_sample(g->clog, V, sp, pos, g->sscratch, &t)))
        return st;
    int64_t j = 0; /* where t is among the top-K, or K - 1 (dropped) */
    while (j < K - 1 && ids[j] != t)
        j++;
    const float best = p_out[0];
    for (int64_t q = j; q > 0; q--) {
        ids[q] = ids[q - 1];
        p_out[q] = p_out[q - 1];
    }
    ids[0] = t;
    p_out[0] = best;
    return ST_OK;
}

/* A pool with no drafts (every score -INFINITY), as the engine expects one laid out. */
static void no_drafts(mdraft *g, int64_t K, int64_t S, float *scores, int32_t *tokens,
                      int64_t *level_parents) {
    const int64_t M = st_tree_n_candidates(K, S), lpw = st_tree_level_parents_width(K, S);
    for (int64_t i = 0; i < M; i++) {
        scores[i] = -INFINITY;
        tokens[i] = 0;
    }
    level_parents[0] = -1;
    for (int64_t c = 0; c < K; c++)
        level_parents[1 + c] = c;
    for (int64_t i = 1, lp = K + 1; i < S; i++, lp += K)
        st_draft_expand_level(scores, K, i, level_parents + lp, lpw - lp, g->pick);
}

static st_status mdraft_propose(st_drafter *d, const int32_t *hist, int64_t n_hist, int64_t K,
                                int64_t S, float *scores, int32_t *tokens, int64_t *level_parents,
                                int64_t *n_real) {
    mdraft *g = (mdraft *)d;
    double t0 = st_time_now();
    const char *what = g->eagle ? "EAGLE" : "draft model";
    if (K > g->max_k || S > g->max_s || n_hist < 1)
        return st_fail(ST_ERR_INVALID, "%s: K %lld / S %lld above its limits", what, (long long)K,
                       (long long)S);
    const int32_t L = (int32_t)n_hist - 1, V = g->n_vocab;
    if (L + 1 + K * S > g->n_ctx)
        return st_fail(ST_ERR_RANGE, "%s: context full", what);
    if (g->eagle && L < 1) { /* no target state yet: nothing to draft from */
        no_drafts(g, K, S, scores, tokens, level_parents);
        d->catch_s = d->levels_s = 0.0;
        *n_real = 0;
        return ST_OK;
    }
    st_status st = g->eagle ? eagle_catch_up(g, hist, L, K) : standalone_catch_up(g, hist, L);
    if (st)
        return st;
    const double t1 = st_time_now();
    d->catch_s = t1 - t0;
    d->evals += K * (S - 1);
    int64_t M = st_tree_n_candidates(K, S);
    for (int64_t i = 0; i < M; i++) {
        scores[i] = -INFINITY;
        tokens[i] = 0;
    }
    const st_draft_coupling *cp = d->coupling;
    topk_probs(g->logits, g->n_cand, K, g->probs, tokens, scores);
    map_ids(g, tokens, K);
    if (cp && (st = couple(g, cp, g->logits, hist, n_hist, NULL, 0, n_hist, K, tokens, scores)))
        return st;
    level_parents[0] = -1;
    for (int64_t c = 0; c < K; c++) {
        level_parents[1 + c] = c;
        g->score[c] = scores[c];
        g->tok[c] = tokens[c];
        g->nanc[c] = 0;
        g->ptok[c * g->max_s] = tokens[c];
    }
    /* the draft rows follow the committed ones; level i's nodes share position first + i - 1 */
    const int32_t first = g->valid;
    int32_t next_row = first;
    int64_t lp = K + 1, lpw = st_tree_level_parents_width(K, S);
    for (int64_t i = 1; i < S; i++) {
        /* one forward pass over the K expanded nodes of level i-1 */
        int32_t e = 0;
        for (int64_t k = 0; k < K; k++) {
            g->toks[k] = g->tok[k];
            g->pos[k] = first + (int32_t)i - 1;
            g->seq[k] = 0;
            g->row[k] = next_row + (int32_t)k;
            g->npre[k] = first;
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
                    .features = g->eagle ? g->fin : NULL,
                    .own_states = g->eagle3,
                    .logits_from = 0,
                    .logits = g->logits};
        if ((st = st_forward(g->s, &f)))
            return st;
        for (int64_t k = 0; g->eagle && k < K; k++) /* each node's h, for its children */
            memcpy(g->hout + k * g->n_embd, st_session_state(g->s, k),
                   (size_t)g->n_embd * sizeof(float));
        const int64_t base = st_tree_level_base(K, i);
        for (int64_t p = 0; p < K; p++) {
            topk_probs(g->logits + p * V, g->n_cand, K, g->probs, tokens + base + p * K,
                       scores + base + p * K);
            map_ids(g, tokens + base + p * K, K);
            /* level i's candidates sit at position n_hist + i, after their parent's path */
            if (cp && g->score[p] != -INFINITY &&
                (st = couple(g, cp, g->logits + p * V, hist, n_hist, g->ptok + p * g->max_s,
                             g->nanc[p] + 1, n_hist + i, K, tokens + base + p * K,
                             scores + base + p * K)))
                return st;
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
            memcpy(g->ptok2 + k * g->max_s, g->ptok + p * g->max_s,
                   (size_t)g->nanc2[k] * sizeof *g->ptok);
            if (g->nanc2[k] < g->max_s)
                g->ptok2[k * g->max_s + g->nanc2[k]] = tokens[base + best];
            g->score[k] = g->pick[k] >= 0 ? scores[base + best] : -INFINITY;
            g->tok[k] = tokens[base + best];
            if (g->eagle)
                memcpy(g->fin + k * g->n_embd, g->hout + p * g->n_embd,
                       (size_t)g->n_embd * sizeof(float));
        }
        /* level_parents slots past the last needed level are never read */
        memcpy(g->anc, g->anc2, (size_t)(K * g->max_s) * sizeof *g->anc);
        memcpy(g->nanc, g->nanc2, (size_t)K * sizeof *g->nanc);
        memcpy(g->ptok, g->ptok2, (size_t)(K * g->max_s) * sizeof *g->ptok);
        next_row += (int32_t)K;
        lp += K;
    }
    *n_real = M;
    const double t2 = st_time_now();
    d->levels_s = t2 - t1;
    d->ms += (t2 - t0) * 1e3;
    return ST_OK;
}

/* EAGLE: the target's state at committed position pos (positions come in increasing order; a
 * position seen again replaces its state and invalidates the head rows from it on). */
static st_status eagle_observe(st_drafter *d, int64_t pos, const float *state) {
    mdraft *g = (mdraft *)d;
    if (!state || pos < 0 || pos > g->n_feat || pos > g->n_ctx)
        return st_fail(ST_ERR_INVALID,
                       "EAGLE: target state of position %lld out of order (next is %d)",
                       (long long)pos, g->n_feat);
    memcpy(g->feat + pos * g->feat_w, state, (size_t)g->feat_w * sizeof(float));
    g->n_feat = (int32_t)pos + 1;
    if (g->valid > (int32_t)pos)
        g->valid = (int32_t)pos;
    return ST_OK;
}

static const float *eagle_state(const st_drafter *d, int64_t pos) {
    const mdraft *g = (const mdraft *)d;
    return pos >= 0 && pos < g->n_feat ? g->feat + pos * g->feat_w : NULL;
}

static int64_t eagle_own_valid(const st_drafter *d) { return ((const mdraft *)d)->valid; }

static st_status eagle_own_save(st_drafter *d, int64_t pos, int64_t n, void *dst) {
    mdraft *g = (mdraft *)d;
    if (pos < 0 || n < 0 || pos + n > g->valid)
        return st_fail(ST_ERR_RANGE, "EAGLE: head rows [%lld, %lld) not all valid (%d)",
                       (long long)pos, (long long)(pos + n), g->valid);
    return st_session_kv_save(g->s, 0, (int32_t)pos, (int32_t)n, dst);
}

static st_status eagle_own_load(st_drafter *d, int64_t n, const void *src) {
    mdraft *g = (mdraft *)d;
    /* the head session's length counts the rows loaded since reset (nothing else moves it) */
    if (n < 0 || g->valid + n > g->n_feat || st_session_seq_len(g->s, 0) != g->valid)
        return st_fail(ST_ERR_RANGE, "EAGLE: head rows up to %lld without their states (%d)",
                       (long long)(g->valid + n), g->n_feat);
    st_status st = st_session_kv_load(g->s, 0, (int32_t)n, src);
    if (!st)
        g->valid += (int32_t)n;
    return st;
}

/* A new sequence: no committed draft rows, no target states. */
static void mdraft_reset(st_drafter *d) {
    mdraft *g = (mdraft *)d;
    g->valid = 0;
    g->n_feat = 0;
    st_session_seq_reset(g->s, 0);
}

static void mdraft_free(st_drafter *d) {
    mdraft *g = (mdraft *)d;
    if (!g)
        return;
    st_session_free(g->s);
    st_lazy_free(g->feat, g->feat_bytes);
    st_free_aligned(g->mem);
    st_free(g);
}

/* The arrays of g in one planned block (st_plan: a sizing pass, then a carving pass). */
static void mdraft_layout(mdraft *g, st_plan *p) {
    const size_t K = (size_t)g->max_k, S = (size_t)g->max_s, V = (size_t)g->n_vocab,
                 B = (size_t)g->nb > K ? (size_t)g->nb : K, E = (size_t)g->n_embd,
                 H = g->eagle ? K * E : 0;
    g->logits = st_plan_take(p, K * V, sizeof *g->logits);
    g->probs = st_plan_take(p, V, sizeof *g->probs);
    g->fin = st_plan_take(p, H, sizeof *g->fin);
    g->hout = st_plan_take(p, H, sizeof *g->hout);
    g->anc = st_plan_take(p, K * S, sizeof *g->anc);
    g->anc2 = st_plan_take(p, K * S, sizeof *g->anc2);
    g->nanc = st_plan_take(p, K, sizeof *g->nanc);
    g->nanc2 = st_plan_take(p, K, sizeof *g->nanc2);
    g->score = st_plan_take(p, K, sizeof *g->score);
    g->tok = st_plan_take(p, K, sizeof *g->tok);
    g->toks = st_plan_take(p, K, sizeof *g->toks);
    g->pos = st_plan_take(p, B, sizeof *g->pos);
    g->seq = st_plan_take(p, B, sizeof *g->seq);
    g->row = st_plan_take(p, B, sizeof *g->row);
    g->npre = st_plan_take(p, B, sizeof *g->npre);
    g->eoff = st_plan_take(p, K + 1, sizeof *g->eoff);
    g->erow = st_plan_take(p, K * (S + 1), sizeof *g->erow);
    g->pick = st_plan_take(p, K, sizeof *g->pick);
    g->ptok = st_plan_take(p, K * S, sizeof *g->ptok);
    g->ptok2 = st_plan_take(p, K * S, sizeof *g->ptok2);
    g->clog = st_plan_take(p, (size_t)g->n_tgt, sizeof *g->clog);
    g->counts = st_plan_take(p, (size_t)g->n_tgt, sizeof *g->counts);
    g->sscratch = st_plan_take(p, st_sample_scratch_size(g->n_tgt), 1);
}

/* Width of the target state an EAGLE head reads per position (0: a draft model reads none). */
static int64_t state_width(const st_model *draft) {
    return draft->eagle3    ? (int64_t)draft->n_cap * draft->target->hp.n_embd
           : draft->fc.data ? draft->hp.n_embd
                            : 0;
}

/* Bytes of the states of n_ctx + 1 positions of width w; false on overflow. */
static bool feat_size(int32_t n_ctx, int64_t w, size_t *out) {
    return st_mul_size((size_t)n_ctx + 1, (size_t)w, out) && st_mul_size(*out, sizeof(float), out);
}

size_t st_drafter_model_context_bytes(const st_model *draft, int32_t n_ctx,
                                      const st_session *with) {
    size_t sess = st_session_context_bytes(draft, n_ctx, 1, with), feat = 0, sum;
    if (sess == SIZE_MAX || !feat_size(n_ctx, state_width(draft), &feat) ||
        !st_add_size(sess, feat, &sum))
        return SIZE_MAX;
    return sum;
}

/* The drafter over a draft model or an EAGLE head (eagle), its checks done by the caller. */
static st_status mdraft_new(const st_model *draft, int eagle, int32_t n_ctx, st_session *with,
                            bool populate, int64_t max_k, int64_t max_s, st_drafter **out) {
    mdraft *g = st_calloc(1, sizeof *g);
    if (!g)
        return st_fail(ST_ERR_NOMEM, "draft model: out of memory");
    g->base.propose = mdraft_propose;
    g->base.observe = eagle ? eagle_observe : NULL;
    g->base.reset = mdraft_reset;
    g->base.free = mdraft_free;
    g->eagle = eagle;
    g->eagle3 = draft->eagle3;
    g->d2t = draft->eagle3 ? draft->d2t : NULL;
    g->max_k = max_k;
    g->max_s = max_s;
    g->n_vocab = (int32_t)draft->output.n_out;
    const int32_t n_tok =
        st_tokenizer_n_vocab(st_model_tokenizer(draft->target ? draft->target : draft));
    g->n_cand = draft->eagle3 || n_tok > g->n_vocab ? g->n_vocab : n_tok;
    /* the engine's sampled ids: the tokenizer's, within the target's output layer */
    const int64_t n_out = draft->target ? draft->target->output.n_out : draft->output.n_out;
    g->n_tgt = n_tok < n_out ? n_tok : (int32_t)n_out;
    g->n_embd = draft->hp.n_embd;
    g->feat_w = state_width(draft);
    g->base.state = eagle ? eagle_state : NULL;
    g->base.state_width = eagle ? g->feat_w : 0;
    st_session_params sp = st_session_default_params();
    sp.n_ctx = n_ctx;
    /* The drafter runs on the target's thread pool (the two never run at once). A pool of
     * its own, as before, put a third busy thread on two cores for a while after each switch
     * (idle workers spin before they sleep), so that a 768-wide Q8_0 EAGLE head beside its
     * 84 MB target at -t 2 drafted a K/S 1/3 tree in 0.71 plain-token times on two threads and
     * 0.40 on one; on the target's pool it takes 0.23 (2026-12-01, README). Operations too
     * small to split still run on one thread (ST_MIN_PARALLEL_MACS). */
    sp.n_threads = 1; /* without a target session (with == NULL): one thread */
    /* n_batch: the session's default (64) covers a level of K <= ST_SPEC_MAX_K nodes */
    st_status st = with ? st_session_create_shared(draft, &sp, with, populate, &g->s)
                        : st_session_create(draft, &sp, &g->s);
    if (st) {
        st_free(g);
        return st;
    }
    /* EAGLE-3: its states are its layer's output before the final norm (the head's session
     * captures them for st_session_state) */
    const int32_t after_layer = 1;
    if (draft->eagle3 && (st = st_session_set_capture(g->s, 1, &after_layer))) {
        mdraft_free(&g->base);
        return st;
    }
    g->nb = st_session_get_params(g->s)->n_batch;
    g->n_ctx = st_session_get_params(g->s)->n_ctx;
    if (eagle) {
        g->base.own_row_bytes = st_session_kv_row_bytes(g->s);
        g->base.own_valid = eagle_own_valid;
        g->base.own_save = eagle_own_save;
        g->base.own_load = eagle_own_load;
    }
    st_plan pl = {0};
    mdraft_layout(g, &pl);
    if (!(g->mem = st_plan_alloc(&pl))) {
        mdraft_free(&g->base);
        return st_fail(ST_ERR_NOMEM, "draft model: out of memory");
    }
    mdraft_layout(g, &pl);
    if (eagle && (!feat_size(g->n_ctx, g->feat_w, &g->feat_bytes) ||
                  !(g->feat = st_lazy_alloc(g->feat_bytes, populate)))) {
        const size_t mb = g->feat_bytes >> 20;
        g->feat_bytes = 0;
        mdraft_free(&g->base);
        return st_fail(ST_ERR_NOMEM, "EAGLE: out of memory for %zu MB of target states (n_ctx %d)",
                       mb, n_ctx);
    }
    *out = &g->base;
    return ST_OK;
}

static st_status check_limits(const char *what, int64_t max_k, int64_t max_s) {
    if (max_k < 1 || max_k > ST_SPEC_MAX_K || max_s < 1 || max_s > ST_SPEC_MAX_S)
        return st_fail(ST_ERR_INVALID, "%s: K must be in 1..%d and S in 1..%d", what, ST_SPEC_MAX_K,
                       ST_SPEC_MAX_S);
    return ST_OK;
}

st_status st_drafter_model_create(const st_model *draft, const st_model *target, int32_t n_ctx,
                                  st_session *with, bool populate, int64_t max_k, int64_t max_s,
                                  st_drafter **out) {
    *out = NULL;
    st_status st = check_limits("draft model", max_k, max_s);
    if (st)
        return st;
    if (draft->fc.data)
        return st_fail(ST_ERR_INVALID,
                       "draft model: this is an EAGLE head (use the EAGLE algorithm)");
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
    return mdraft_new(draft, 0, n_ctx, with, populate, max_k, max_s, out);
}

st_status st_drafter_eagle_create(const st_model *head, const st_model *target, int32_t n_ctx,
                                  st_session *with, bool populate, int64_t max_k, int64_t max_s,
                                  st_drafter **out) {
    *out = NULL;
    st_status st = check_limits("EAGLE", max_k, max_s);
    if (st)
        return st;
    if (!head->fc.data)
        return st_fail(ST_ERR_INVALID, "EAGLE: the draft model is not an EAGLE head (load it with "
                                       "st_eagle_head_load)");
    if (head->eagle3)
        return st_fail(ST_ERR_INVALID, "EAGLE: this is an EAGLE-3 head (use the EAGLE3 algorithm)");
    if (head->target != target)
        return st_fail(ST_ERR_INVALID,
                       "EAGLE: the head was loaded for another target model (its embedding and "
                       "output layer are that model's)");
    return mdraft_new(head, 1, n_ctx, with, populate, max_k, max_s, out);
}

st_status st_drafter_eagle3_create(const st_model *head, const st_model *target, int32_t n_ctx,
                                   st_session *with, bool populate, int64_t max_k, int64_t max_s,
                                   st_drafter **out) {
    *out = NULL;
    st_status st = check_limits("EAGLE3", max_k, max_s);
    if (st)
        return st;
    if (!head->eagle3)
        return st_fail(ST_ERR_INVALID,
                       head->fc.data ? "EAGLE3: this is an EAGLE-1/2 head (use the EAGLE algorithm)"
                                     : "EAGLE3: the draft model is not an EAGLE-3 head");
    if (head->target != target)
        return st_fail(ST_ERR_INVALID, "EAGLE3: the head was loaded for another target model");
    if (head->output.n_out < max_k)
        return st_fail(ST_ERR_INVALID, "EAGLE3: a draft vocabulary of %lld tokens is below K %lld",
                       (long long)head->output.n_out, (long long)max_k);
    return mdraft_new(head, 1, n_ctx, with, populate, max_k, max_s, out);
}
