/*
 * verify.c: verification of a draft tree against the target model (TREE_SPEC.md §3): SGLang's
 * verify_tree_greedy (also the position-coupled sampler of DESIGN.md invariant 1) and the legacy
 * tree_speculative_sampling_target_only, whose one-coin-per-sibling-group walk samples each
 * level from the target distribution (EAGLE, Li et al. 2024; SpecInfer-style tree acceptance).
 * Every list index is range-checked and sibling cycles are detected, so caller arrays that do
 * not come from st_tree_build can at worst produce an error, never an out-of-bounds access.
 */
#include "core/core.h"

#include <stdbool.h>

static st_status check_verify_args(const char *fn, int64_t bs, int64_t n, int64_t steps,
                                   const st_tree *tree, bool has_target, int32_t *predicts,
                                   int64_t *accept_index, int64_t *accept_token_num) {
    if (bs < 1)
        return st_fail(ST_ERR_INVALID, "%s: bs = %lld, must be >= 1", fn, (long long)bs);
    if (n < 1 || n > ST_TREE_MAX_N)
        return st_fail(ST_ERR_INVALID, "%s: n = %lld tree nodes, must be in 1..%d", fn,
                       (long long)n, ST_TREE_MAX_N);
    if (steps < 0 || steps > ST_TREE_MAX_DEPTH)
        return st_fail(ST_ERR_INVALID, "%s: steps = %lld, must be in 0..%d", fn, (long long)steps,
                       ST_TREE_MAX_DEPTH);
    size_t rows;
    if (!st_mul_size((size_t)bs, (size_t)n, &rows) || rows > (size_t)INT64_MAX / 2)
        return st_fail(ST_ERR_RANGE, "%s: bs*n overflows", fn);
    if (!tree || !tree->tokens || !tree->retrieve_index || !tree->next_token || !tree->next_sibling)
        return st_fail(ST_ERR_INVALID,
                       "%s: tree or one of its arrays (tokens, retrieve_index, "
                       "next_token, next_sibling) is NULL",
                       fn);
    if (!has_target || !predicts || !accept_index || !accept_token_num)
        return st_fail(ST_ERR_INVALID, "%s: an input or output array is NULL", fn);
    const int64_t total = bs * n;
    for (int64_t x = 0; x < total; x++) {
        int64_t r = tree->retrieve_index[x], t = tree->next_token[x], s = tree->next_sibling[x];
        if (r < 0 || r >= total)
            return st_fail(ST_ERR_RANGE, "%s: retrieve_index[%lld][%lld] = %lld is outside 0..%lld",
                           fn, (long long)(x / n), (long long)(x % n), (long long)r,
                           (long long)(total - 1));
        if (t < -1 || t >= n)
            return st_fail(ST_ERR_RANGE, "%s: next_token[%lld][%lld] = %lld is outside -1..%lld",
                           fn, (long long)(x / n), (long long)(x % n), (long long)t,
                           (long long)(n - 1));
        if (s < -1 || s >= n)
            return st_fail(ST_ERR_RANGE, "%s: next_sibling[%lld][%lld] = %lld is outside -1..%lld",
                           fn, (long long)(x / n), (long long)(x % n), (long long)s,
                           (long long)(n - 1));
    }
    for (int64_t x = 0; x < total; x++)
        predicts[x] = -1;
    return ST_OK;
}

static st_status sibling_cycle(const char *fn, int64_t b, int64_t node) {
    return st_fail(ST_ERR_INVALID,
                   "%s: request %lld: the sibling list of the children of node "
                   "%lld has a cycle",
                   fn, (long long)b, (long long)node);
}

st_status st_verify_tree_walk(int64_t bs, int64_t n, int64_t steps, const st_tree *tree,
                              st_target_fn target, void *user, int32_t *predicts,
                              int64_t *accept_index, int64_t *accept_token_num) {
    const char *fn = "st_verify_tree_walk";
    st_status s = check_verify_args(fn, bs, n, steps, tree, target != NULL, predicts, accept_index,
                                    accept_token_num);
    if (s != ST_OK)
        return s;
    for (int64_t b = 0; b < bs; b++) {
        const int32_t *cand = tree->tokens + b * n;
        const int64_t *ri = tree->retrieve_index + b * n;
        const int64_t *nt = tree->next_token + b * n;
        const int64_t *ns = tree->next_sibling + b * n;
        int64_t *acc = accept_index + b * (steps + 1);
        for (int64_t i = 1; i <= steps; i++)
            acc[i] = -1;
        int64_t last = ri[0], k = 0, cur = 0;
        acc[0] = last;
        for (int64_t j = 0;; j++) {
            /* the target's token after the last accepted node: the bonus token if no child
             * matches it (or the walk is `steps` deep), else it selects the child */
            if ((s = target(user, last, &predicts[last])))
                return s;
            if (j == steps)
                break;
            int64_t parent = cur, hops = 0;
            for (cur = nt[cur]; cur != -1; cur = ns[cur]) {
                if (cand[cur] == predicts[last])
                    break;
                if (ns[cur] != -1 && ++hops >= n)
                    return sibling_cycle(fn, b, parent);
            }
            if (cur == -1)
                break;
            acc[++k] = ri[cur];
            last = ri[cur];
        }
        accept_token_num[b] = k;
    }
    return ST_OK;
}

static st_status target_from_array(void *user, int64_t x, int32_t *token) {
    *token = ((const int32_t *)user)[x];
    return ST_OK;
}

st_status st_verify_tree_greedy(int64_t bs, int64_t n, int64_t steps, const st_tree *tree,
                                const int32_t *target_predict, int32_t *predicts,
                                int64_t *accept_index, int64_t *accept_token_num) {
    if (!target_predict)
        return st_fail(ST_ERR_INVALID, "st_verify_tree_greedy: an input or output array is NULL");
    return st_verify_tree_walk(bs, n, steps, tree, target_from_array, (void *)target_predict,
                               predicts, accept_index, accept_token_num);
}

/* The final (bonus or correction) token: inverse-CDF draw from r[v] = max(q[v] - p[v], 0),
 * where p[v] = q[v] for the excluded tokens ex[0..n_ex) (ascending) and 0 elsewhere. */
static int32_t sample_residual(const float *q, int64_t n_vocab, const int32_t *ex, int64_t n_ex,
                               float coin) {
    double total = 0.0;
    for (int64_t v = 0, e = 0; v < n_vocab; v++) {
        while (e < n_ex && ex[e] < v)
            e++;
        float r = q[v] - (e < n_ex && ex[e] == v ? q[v] : 0.0f);
        total += r > 0.0f ? r : 0.0f;
    }
    const double u = (double)coin * total;
    double c = 0.0;
    int64_t last_valid = -1;
    for (int64_t v = 0, e = 0; v < n_vocab; v++) {
        while (e < n_ex && ex[e] < v)
            e++;
        float r = q[v] - (e < n_ex && ex[e] == v ? q[v] : 0.0f);
        if (!(r > 0.0f))
            r = 0.0f;
        else
            last_valid = v;
        c += r;
        if (c > u)
            return (int32_t)v;
    }
    return (int32_t)(last_valid >= 0 ? last_valid : n_vocab - 1);
}

st_status st_verify_tree_target_only(int64_t bs, int64_t n, int64_t steps, int64_t n_vocab,
                                     const st_tree *tree, const float *target_probs,
                                     const float *coins, const float *coins_final,
                                     float threshold_single, float threshold_acc, int32_t *predicts,
                                     int64_t *accept_index, int64_t *accept_token_num) {
    const char *fn = "st_verify_tree_target_only";
    if (n_vocab < 1 || n_vocab > INT32_MAX)
        return st_fail(ST_ERR_INVALID, "%s: n_vocab = %lld, must be in 1..%d", fn,
                       (long long)n_vocab, INT32_MAX);
    if (!(threshold_single >= 0.0f && threshold_single <= 1.0f) ||
        !(threshold_acc >= 0.0f && threshold_acc <= 1.0f))
        return st_fail(ST_ERR_INVALID,
                       "%s: threshold_single = %g and threshold_acc = %g must be in [0, 1]", fn,
                       (double)threshold_single, (double)threshold_acc);
    if (!coins || !coins_final)
        return st_fail(ST_ERR_INVALID, "%s: coins or coins_final is NULL", fn);
    st_status s = check_verify_args(fn, bs, n, steps, tree, target_probs != NULL, predicts,
                                    accept_index, accept_token_num);
    if (s != ST_OK)
        return s;
    size_t cells;
    if (!st_mul_size((size_t)(bs * n), (size_t)n_vocab, &cells) || cells > (size_t)INT64_MAX)
        return st_fail(ST_ERR_RANGE, "%s: bs*n*n_vocab overflows", fn);
    const double th_acc = threshold_acc > 1e-9 ? (double)threshold_acc : 1e-9;
    /* Tokens of the children rejected at the current level, i.e. under node `row`. */
    int32_t rejected[ST_TREE_MAX_N];

    for (int64_t b = 0; b < bs; b++) {
        const int32_t *cand = tree->tokens + b * n;
        const int64_t *ri = tree->retrieve_index + b * n;
        const int64_t *nt = tree->next_token + b * n;
        const int64_t *ns = tree->next_sibling + b * n;
        const float *probs = target_probs + b * n * n_vocab;
        int64_t *acc = accept_index + b * (steps + 1);
        for (int64_t i = 1; i <= steps; i++)
            acc[i] = -1;
        double prob_acc = 0.0;
        int64_t row = 0, last = ri[0], k = 0, cur = 0, n_rej = 0;
        float coin = coins[b * n];
        acc[0] = last;
        for (int64_t j = 1; j <= steps; j++) {
            int64_t hops = 0;
            n_rej = 0;
            for (cur = nt[cur]; cur != -1;) {
                int32_t tok = cand[cur];
                if (tok < 0 || tok >= n_vocab)
                    return st_fail(ST_ERR_RANGE,
                                   "%s: token %d of node %lld of request %lld is outside the "
                                   "vocabulary of %lld",
                                   fn, (int)tok, (long long)cur, (long long)b, (long long)n_vocab);
                float q = probs[row * n_vocab + tok];
                prob_acc += q;
                if ((double)coin <= prob_acc / th_acc || q >= threshold_single) {
                    prob_acc = 0.0;
                    row = cur;
                    coin = coins[b * n + cur];
                    predicts[last] = tok;
                    acc[++k] = ri[cur];
                    last = ri[cur];
                    break;
                }
                rejected[n_rej++] = tok;
                cur = ns[cur];
                if (cur != -1 && ++hops >= n)
                    return sibling_cycle(fn, b, row);
            }
            if (cur == -1)
                break;
        }
        accept_token_num[b] = k;
        if (k == steps)
            n_rej = 0; /* a full-depth path samples the bonus from q itself */
        for (int64_t i = 1; i < n_rej; i++) {
            int32_t t = rejected[i];
            int64_t j = i;
            for (; j > 0 && rejected[j - 1] > t; j--)
                rejected[j] = rejected[j - 1];
            rejected[j] = t;
        }
        predicts[last] =
            sample_residual(probs + row * n_vocab, n_vocab, rejected, n_rej, coins_final[b]);
    }
    return ST_OK;
}
