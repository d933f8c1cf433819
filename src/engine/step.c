/*
 * step.c: one generation step. The speculative step reads top to bottom as DESIGN.md's "One
 * speculative step": the drafters propose, the controller chooses the tree size, the tree is
 * organized, masked and built, the target verifies every sequence's tree in one forward pass,
 * one walk per tree computes the target's token at each node it reaches and accepts the
 * matching child, and the accepted nodes are committed. The emitted tokens equal plain decoding
 * because the target's token at every node is the same pure function of (logits, seed,
 * position, the tokens along the node's own path for penalties) that plain decoding computes,
 * and the logits are bitwise equal (invariant 1).
 */
#include "engine/engine.h"

#include <math.h>

/* log-softmax of the logits lg (finite) at token tok and at the n most likely tokens: one pass
 * for the maximum and the n best (st_ranks_before's order), one for the sum of exponentials, in
 * index order and in double, so the values are a pure function of the logits. */
static void logprobs(const float *lg, int32_t V, int32_t tok, int32_t n, st_token_logprobs *lp) {
    float mx = lg[0];
    int32_t k = 0; /* entries of the top list so far */
    for (int32_t i = 0; i < V; i++) {
        mx = lg[i] > mx ? lg[i] : mx;
        if (lg[i] == -INFINITY) /* banned (ignore_eos, a grammar): never among the likely */
            continue;
        if (k == n &&
            (n == 0 || !st_ranks_before(lg[i], i, lg[lp->top_token[n - 1]], lp->top_token[n - 1])))
            continue;
        int32_t j = k < n ? k++ : n - 1; /* insertion into the sorted list */
        for (; j > 0 && st_ranks_before(lg[i], i, lg[lp->top_token[j - 1]], lp->top_token[j - 1]);
             j--)
            lp->top_token[j] = lp->top_token[j - 1];
        lp->top_token[j] = i;
    }
    double sum = 0.0;
    for (int32_t i = 0; i < V; i++)
        sum += exp((double)lg[i] - (double)mx);
    const double lse = (double)mx + log(sum);
    lp->token = tok;
    lp->logprob = (float)((double)lg[tok] - lse);
    lp->n_top = k;
    for (int32_t j = 0; j < k; j++)
        lp->top_logprob[j] = (float)((double)lg[lp->top_token[j]] - lse);
}

void st_gen_logprobs(const st_gen *g, const float *lg, int32_t tok, int32_t n,
                     st_token_logprobs *lp) {
    logprobs(lg, g->n_tok, tok, n, lp);
}

st_status st_gen_target_token(st_gen *g, int32_t b, float *lg, int64_t pos, const int32_t *path,
                              int64_t n_path, int32_t *out, st_token_logprobs *lp) {
    /* Only ids with a token are candidates: an output layer padded past the tokenizer (published
     * checkpoints round vocab_size up) has rows that would otherwise be sampled; plain and
     * speculative decoding both choose here, so they stay equal. NaN or infinity: broken
     * weights, never a token. x * 0 is 0 for finite x and NaN otherwise; eight independent sums
     * (a loop compilers vectorize, as in st_argmax) stay 0 unless one is not finite, and only
     * then is the row searched for the culprit. */
    float z[8] = {0};
    int32_t i = 0;
    for (; i + 8 <= g->n_tok; i += 8)
        for (int l = 0; l < 8; l++)
            z[l] += lg[i + l] * 0.0f;
    for (; i < g->n_tok; i++)
        z[0] += lg[i] * 0.0f;
    int bad = 0;
    for (int l = 0; l < 8; l++)
        bad |= z[l] != 0.0f;
    if (bad)
        for (i = 0; i < g->n_tok; i++)
            if (!isfinite(lg[i]))
                return st_fail(ST_ERR_FORMAT,
                               "generate: the logits at position %lld are not finite (token %d "
                               "is %s): the model's weights or activations are broken",
                               (long long)pos, i, isnan(lg[i]) ? "NaN" : "infinite");
    const st_req *r = g->req[b];
    const st_request_params *rp = &r->rp;
    st_status rc;
    if (st_sampler_penalized(&rp->sampler)) {
        /* only the logits of the tokens of the history, the biases and EOS change, in place */
        const st_sample_history h = {g->hist[b], g->n_hist[b], r->n_prompt, path, n_path};
        if ((rc = st_sample_penalize(lg, g->n_tok, &rp->sampler, &h, g->eog, g->n_eog, g->counts)))
            return rc;
    }
    /* the grammar's mask after the committed tokens and the path: -inf where it forbids */
    if (r->gm && (rc = st_gmatcher_mask(r->gm, path, n_path, lg)))
        return rc;
    rc = st_sample(lg, g->n_tok, &rp->sampler, pos, g->scratch, out);
    if (rc == ST_OK && rp->on_logprobs && lp)
        logprobs(lg, g->n_tok, *out, rp->top_logprobs, lp);
    return rc;
}

/* Ends slot b for reason r; returns 1. */
static int finish(st_gen *g, int32_t b, st_stop_reason r) {
    g->done[b] = 1;
    g->req[b]->st.stop_reason = r;
    return 1;
}

int st_gen_push(st_gen *g, int32_t b, int32_t tok, const st_token_logprobs *lp) {
    st_req *r = g->req[b];
    if (st_tokenizer_is_eog(g->m->tok, tok))
        return finish(g, b, ST_STOP_EOS);
    g->hist[b][g->n_hist[b]++] = tok;
    if (r->gm)
        (void)st_gmatcher_accept(r->gm, tok); /* on failure it allows only EOS from then on */
    g->n_gen[b]++;
    g->stats->gen_tokens++;
    r->st.gen_tokens++;
    if (lp && r->rp.on_logprobs)
        r->rp.on_logprobs(r->user, lp);
    if (r->emit && r->emit(r->user, tok))
        return finish(g, b, ST_STOP_STOP);
    if (g->n_gen[b] >= r->rp.n_predict)
        return finish(g, b, ST_STOP_LENGTH);
    return 0;
}

const char *st_stop_reason_name(st_stop_reason r) {
    switch (r) {
    case ST_STOP_EOS:
        return "eos";
    case ST_STOP_LENGTH:
        return "length";
    case ST_STOP_STOP:
        return "stop";
    case ST_STOP_CONTEXT:
        return "context";
    case ST_STOP_CANCEL:
        return "cancelled";
    default:
        return "none";
    }
}

/* The tokens from the root's child down to node i of a tree (nt/ns: its first-child and
 * next-sibling lists, tok its tokens) into path, depth-first from node u at depth d; 1 when i
 * was found (*n_path: its depth). *budget bounds the nodes visited (a tree has at most that
 * many, so a malformed list cannot loop). */
static int node_path(const int64_t *nt, const int64_t *ns, const int32_t *tok, int64_t u, int64_t i,
                     int64_t d, int32_t *path, int64_t *n_path, int64_t *budget) {
    if (u == i) {
        *n_path = d;
        return 1;
    }
    if (d > ST_SPEC_MAX_S)
        return 0;
    for (int64_t c = nt[u]; c != -1 && --*budget >= 0; c = ns[c]) {
        path[d] = tok[c];
        if (node_path(nt, ns, tok, c, i, d + 1, path, n_path, budget))
            return 1;
    }
    return 0;
}

/* The verify walk's target (st_target_fn): node x's logits, computed now from the states the
 * deferred verify forward kept, then the token plain decoding would pick after it, which sees
 * the tokens of x's own path when the request has penalties. */
static st_status path_target(void *user, int64_t x, int32_t *token) {
    st_gen *g = user;
    const int32_t a = g->walk_a, b = g->seqs[a];
    const int64_t o = g->off[a]; /* x: a node of sequence a's tree, o + x in the forward */
    st_status rc = st_session_logits(g->s, o + x, g->logits);
    if (rc)
        return rc;
    int32_t path[ST_SPEC_MAX_S + 1];
    int64_t n_path = 0, budget = g->nb[a];
    if ((st_sampler_penalized(&g->req[b]->rp.sampler) || g->req[b]->gm) &&
        !node_path(g->nt + o, g->ns + o, g->tree_tokens + o, 0, x, 0, path, &n_path, &budget))
        return st_fail(ST_ERR_INVALID, "generate: tree node %lld is not reachable from its root",
                       (long long)x);
    return st_gen_target_token(g, b, g->logits, (int64_t)g->positions[o + x] + 1, path, n_path,
                               token, g->lps + o + x);
}

/* Prunes a drafted candidate pool (K candidates per node; sc, tok: M; lp: level parents) by
 * the request's grammar: a candidate whose path from the root the grammar rejects, and so each
 * of its descendants, gets score -inf. st_tree_organize then keeps it only when fewer valid
 * candidates than tree nodes remain, and the walk never accepts it (the target's masked token
 * never equals a rejected one), so the emitted tokens are the same either way. */
static void grammar_prune(st_gmatcher *gm, int64_t K, int64_t M, float *sc, const int32_t *tok,
                          const int64_t *lp) {
    int32_t up[ST_SPEC_MAX_S + 1], path[ST_SPEC_MAX_S + 1];
    for (int64_t c = 0; c < M; c++) {
        if (!isfinite(sc[c]))
            continue;
        int64_t n = 0, u = c;
        for (;;) {
            if (n > ST_SPEC_MAX_S)
                break;
            up[n++] = tok[u];
            const int64_t slot = u / K, p = slot ? lp[slot] : -1;
            if (slot == 0 || p < 0 || p >= u)
                break;
            u = p;
        }
        if (n > ST_SPEC_MAX_S || u / K != 0)
            continue; /* not a path from the root: organize's business */
        for (int64_t i = 0; i < n; i++)
            path[i] = up[n - 1 - i];
        if (!st_gmatcher_path_ok(gm, path, n))
            sc[c] = -INFINITY;
    }
}

/* Commits active sequence a after the walk: its accepted nodes' KV rows, then the accepted
 * draft tokens and the target's token after the last of them (the bonus). A tree of one node
 * (the root) was a plain step inside the forward, and counts as one. */
static st_status commit(st_gen *g, int32_t a, int64_t *emitted) {
    const int32_t b = g->seqs[a];
    const int64_t k = g->n_acc[a], o = g->off[a], n = g->nb[a];
    const int64_t *acc = g->acc + (int64_t)a * (g->St + 1); /* nodes of this tree */
    st_status rc = st_session_commit(g->s, b, n, acc, k + 1);
    if (rc)
        return rc;
    /* the accepted nodes' states (positions L .. L+k) to a drafter that reads them */
    for (int64_t i = 0; i <= k && g->dr[b]->observe; i++)
        if ((rc = g->dr[b]->observe(g->dr[b], g->seq_lens[a] + i,
                                    st_session_state(g->s, o + acc[i]))))
            return rc;
    const int64_t before = g->n_gen[b];
    /* token i was the target's at node acc[i-1] (the accepted draft matched it, or the bonus) */
    for (int64_t i = 1; i <= k + 1; i++)
        if (st_gen_push(g, b, i <= k ? g->tree_tokens[o + acc[i]] : g->pred[o + acc[k]],
                        g->lps + o + acc[i - 1]))
            break;
    st_req *r = g->req[b];
    if (n == 1) {
        g->stats->plain_steps++;
        r->st.plain_steps++;
        *emitted += g->n_gen[b] - before;
        return ST_OK;
    }
    g->stats->spec_steps++;
    g->stats->tree_tokens += n;
    g->stats->accept_hist[k]++;
    g->spec_emitted += k + 1;
    r->st.spec_steps++;
    r->st.accept_hist[k]++;
    r->spec_emitted += k + 1;
    *emitted += g->n_gen[b] - before;
    return ST_OK;
}

st_status st_gen_spec_step(st_gen *g, int32_t K, int32_t S, int64_t *T_out, int64_t *emitted) {
    const int32_t na = g->na;
    const int64_t M = st_tree_n_candidates(K, S), LPW = st_tree_level_parents_width(K, S),
                  PW = st_tree_parent_width(K, S), N1 = g->N - 1;
    g->Kt = K, g->St = S;
    st_status rc;
    /* propose: each sequence's drafter scores its (K, S) candidate pool, unless its request
     * speculates not at all */
    for (int32_t a = 0; a < na; a++) {
        const int32_t b = g->seqs[a];
        g->roots[a] = g->hist[b][g->n_hist[b] - 1];
        g->seq_lens[a] = st_session_seq_len(g->s, b);
        g->cap[a] = g->req[b]->rp.spec_max_tree;
        g->nb[a] = 0; /* (here: its drafted candidates) */
        if (g->cap[a] == 1) {
            st_ctl_skip(g->ctl, a, b, g->n_hist[b]);
            continue;
        }
        float *sc = g->scores + a * M;
        int32_t *tok = g->cand_tokens + a * M;
        int64_t *lp = g->level_parents + a * LPW;
        st_drafter *d = g->dr[b];
        const st_req *r = g->req[b];
        const st_draft_coupling cp = {&r->rp.sampler, g->eog, g->n_eog, g->n_tok, r->n_prompt};
        const int coupled = g->p.spec.draft_coupling > 0 ||
                            (g->p.spec.draft_coupling == 0 && g->p.spec.algo == ST_SPEC_STANDALONE);
        d->coupling = coupled ? &cp : NULL;
        rc = d->propose(d, g->hist[b], g->n_hist[b], K, S, sc, tok, lp, &g->nb[a]);
        d->coupling = NULL;
        if (rc)
            return rc;
        if (g->req[b]->gm)
            grammar_prune(g->req[b]->gm, K, M, sc, tok, lp);
        if (d->evals > 0) {
            st_ctl_draft_cost(g->ctl, K, S, d->catch_s, d->catch_rows, d->levels_s);
            if (S > 1 && d->levels_s > 0.0)
                g->stats->level_passes += S - 1, g->stats->level_ms += d->levels_s * 1e3;
        }
        st_ctl_rank(g->ctl, a, b, K, S, sc, tok, lp, g->n_hist[b], g->dr[b]->conf);
    }
    /* choose sizes: n_a tree nodes for each sequence, root included (1: its root only) */
    double gain;
    const int64_t T = *T_out = st_ctl_choose_each(g->ctl, na, g->cap, g->nb, g->nsz, &gain);
    g->t_chosen = st_time_now();
    if (T == na)
        return st_gen_plain_step(g, emitted);
    g->off[0] = 0;
    for (int32_t a = 0; a < na; a++)
        g->nb[a] = g->nsz[a], g->off[a + 1] = g->off[a] + g->nb[a];
    /* mask: the verify-mask owner lays out what the attention backend reads, nothing more;
     * sequence a's block is its own, its tree's nodes are [off[a], off[a+1]) of the forward */
    if ((rc = st_verify_mask_prepare_ragged(g->vm, K, na, g->nb, g->seq_lens, g->masks)))
        return rc;
    for (int32_t a = 0; a < na; a++) {
        /* organize: the n_a-1 best-scored candidates of the pool, with their parents */
        const st_tree_shape shape = {1, K, S, g->nb[a]};
        int64_t *sel = g->sel + a * N1, *pl = g->parent_list + a * PW;
        int32_t *dr = g->drafts + a * N1;
        if (g->nb[a] > 1 &&
            (rc = st_tree_organize(&shape, g->scores + a * M, g->cand_tokens + a * M,
                                   g->level_parents + a * LPW, sel, dr, pl)))
            return rc;
        /* build: positions, retrieve/next-token/next-sibling lists and the mask */
        const int64_t o = g->off[a];
        const st_tree_input in = {g->roots + a, PW ? pl : NULL, sel, dr, g->seq_lens + a};
        const st_tree tr = {g->tree_tokens + o, g->positions + o, g->ri + o, g->nt + o, g->ns + o};
        if ((rc = st_tree_build(&shape, &in, &tr, &g->masks[a])))
            return rc;
    }
    /* verify forward: one target pass over every tree (sum n_a tokens), the output layer
     * deferred */
    const double t0 = st_time_now();
    const st_tree tree = {g->tree_tokens, g->positions, g->ri, g->nt, g->ns};
    if ((rc = st_session_verify_ragged(g->s, g->vm, na, g->nb, g->seqs, &tree, NULL)))
        return rc;
    /* targets along the path + accept: one walk per tree; only walked nodes get logits */
    for (int32_t a = 0; a < na; a++) {
        const int64_t o = g->off[a];
        const st_tree tr = {g->tree_tokens + o, g->positions + o, g->ri + o, g->nt + o, g->ns + o};
        g->walk_a = a;
        if ((rc = st_verify_tree_walk(1, g->nb[a], S, &tr, path_target, g, g->pred + o,
                                      g->acc + (int64_t)a * (S + 1), g->n_acc + a)))
            return rc;
    }
    g->verify_s += st_time_now() - t0;
    /* commit: accepted KV rows into place, accepted tokens and the bonus emitted */
    for (int32_t a = 0; a < na; a++)
        if ((rc = commit(g, a, emitted)))
            return rc;
    return ST_OK;
}

st_status st_gen_plain_step(st_gen *g, int64_t *emitted) {
    const int32_t na = g->na;
    for (int32_t a = 0; a < na; a++) {
        const int32_t b = g->seqs[a];
        g->roots[a] = g->hist[b][g->n_hist[b] - 1];
        g->seq_lens[a] = st_session_seq_len(g->s, b);
    }
    const double t0 = st_time_now();
    st_status rc = st_session_decode_batch(g->s, na, g->seqs, g->roots, g->logits);
    if (rc)
        return rc;
    g->verify_s += st_time_now() - t0;
    for (int32_t a = 0; a < na; a++) {
        st_drafter *d = g->dr[g->seqs[a]];
        if (d && d->observe && (rc = d->observe(d, g->seq_lens[a], st_session_state(g->s, a))))
            return rc;
        int32_t next;
        if ((rc = st_gen_target_token(g, g->seqs[a], g->logits + (size_t)a * (size_t)g->V,
                                      g->seq_lens[a] + 1, NULL, 0, &next, g->lps + a)))
            return rc;
        st_gen_push(g, g->seqs[a], next, g->lps + a);
        g->stats->plain_steps++;
        g->req[g->seqs[a]]->st.plain_steps++;
        (*emitted)++;
    }
    return ST_OK;
}
