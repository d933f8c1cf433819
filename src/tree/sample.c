/*
 * sample.c: token sampling as a pure function of (logits, parameters, position). The uniform
 * for absolute position p comes from a counter-based generator keyed by (seed, p), so plain
 * decoding and speculative verification draw the same token at the same position
 * (DESIGN.md invariant 1, the position-coupled sampler). Penalties and biases are a pure
 * function of (logits, the tokens along the sequence's path), applied in place to the few
 * logits they touch, so a tree node that is handed its own path gets plain decoding's logits.
 */
#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
    float logit;
    int32_t id;
} cand;

/* Total order: st_ranks_before (higher logit first, then lower id; NaN last). */
static int cand_before(const cand *a, const cand *b) {
    return st_ranks_before(a->logit, a->id, b->logit, b->id);
}

static int cand_cmp(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (a->id == b->id)
        return 0;
    return cand_before(a, b) ? -1 : 1;
}

/* The top-k heap keeps the worst kept candidate on top. */
static bool worse_above(const void *a, const void *b, const void *ctx) {
    (void)ctx;
    return cand_before(b, a);
}

/* The first index of the largest value; NaN never wins unless every value is NaN (index 0):
 * st_ranks_before's order. Eight running maxima (a loop compilers turn into vector max
 * instructions; NaN compares false and is skipped), then the first index holding the maximum. */
int32_t st_argmax(const float *x, int32_t n) {
    int32_t i0 = 0;
    while (i0 < n && isnan(x[i0]))
        i0++;
    if (i0 >= n)
        return 0;
    float m[8];
    for (int l = 0; l < 8; l++)
        m[l] = x[i0];
    int32_t i = i0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
    for (; i < n; i++)
        m[0] = x[i] > m[0] ? x[i] : m[0];
    float mx = m[0];
    for (int l = 1; l < 8; l++)
        mx = m[l] > mx ? m[l] : mx;
    for (i = i0; i < n; i++)
        if (x[i] == mx)
            return i;
    return i0;
}

st_sampler_params st_sampler_default_params(void) {
    st_sampler_params p = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 0};
    return p;
}

size_t st_sample_scratch_size(int32_t n_vocab) {
    return (size_t)(n_vocab > 0 ? n_vocab : 1) * (sizeof(cand) + sizeof(float));
}

float st_sample_uniform(uint64_t seed, int64_t pos) { return st_rng_uniform(seed, (uint64_t)pos); }

st_status st_sampler_check(const st_sampler_params *p, int32_t n_vocab) {
    if (!p)
        return st_fail(ST_ERR_INVALID, "sampler: NULL parameters");
    if (!(p->temp >= 0.0f) || !(p->temp < INFINITY))
        return st_fail(ST_ERR_INVALID, "sampler: temp %g must be finite and >= 0", (double)p->temp);
    if (p->temp > 0.0f && (!(p->top_p > 0.0f) || !(p->min_p <= 1.0f)))
        return st_fail(ST_ERR_INVALID, "sampler: top_p %g or min_p %g out of range",
                       (double)p->top_p, (double)p->min_p);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return st_fail(ST_ERR_INVALID, "sampler: presence_penalty %g outside -2..2",
                       (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return st_fail(ST_ERR_INVALID, "sampler: frequency_penalty %g outside -2..2",
                       (double)p->frequency_penalty);
    if (!(p->repeat_penalty >= 0.0f && p->repeat_penalty <= 10.0f))
        return st_fail(ST_ERR_INVALID, "sampler: repeat_penalty %g outside 0..10 (0 and 1: off)",
                       (double)p->repeat_penalty);
    if (p->repeat_last_n < -1)
        return st_fail(ST_ERR_INVALID,
                       "sampler: repeat_last_n %d must be -1 (whole context), 0 (default %d) or "
                       "a window of >= 1 tokens",
                       p->repeat_last_n, ST_REPEAT_LAST_N_DEFAULT);
    if (p->min_tokens < 0)
        return st_fail(ST_ERR_INVALID, "sampler: min_tokens %d is negative", p->min_tokens);
    if (p->n_logit_bias < 0 || p->n_logit_bias > ST_MAX_LOGIT_BIAS ||
        (p->n_logit_bias > 0 && !p->logit_bias))
        return st_fail(ST_ERR_INVALID, "sampler: logit_bias has %d entries (0..%d, non-NULL)",
                       p->n_logit_bias, ST_MAX_LOGIT_BIAS);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const st_logit_bias *lb = &p->logit_bias[i];
        if (lb->token < 0 || (n_vocab > 0 && lb->token >= n_vocab))
            return st_fail(ST_ERR_INVALID,
                           "sampler: logit_bias token %d is outside the vocabulary of %d",
                           lb->token, n_vocab);
        if (!(lb->bias >= -100.0f && lb->bias <= 100.0f))
            return st_fail(ST_ERR_INVALID,
                           "sampler: logit_bias of token %d is %g, outside -100..100", lb->token,
                           (double)lb->bias);
    }
    return ST_OK;
}

/* repeat_penalty 0 and 1 are off; presence, frequency, biases and bans are off at zero. */
static bool repeat_on(const st_sampler_params *p) {
    return p->repeat_penalty != 0.0f && p->repeat_penalty != 1.0f;
}

int st_sampler_penalized(const st_sampler_params *p) {
    return repeat_on(p) || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f ||
           p->n_logit_bias > 0 || p->ignore_eos || p->min_tokens > 0;
}

size_t st_sample_penalty_scratch_size(int32_t n_vocab) {
    return (size_t)(n_vocab > 0 ? n_vocab : 1) * sizeof(int32_t);
}

/* Token i of the history h: committed tokens, then the path. */
static int32_t hist_at(const st_sample_history *h, int64_t i) {
    return i < h->n_tokens ? h->tokens[i] : h->path[i - h->n_tokens];
}

st_status st_sample_penalize(float *logits, int32_t n_vocab, const st_sampler_params *p,
                             const st_sample_history *h, const int32_t *eog, int32_t n_eog,
                             int32_t *counts) {
    if (!logits || n_vocab < 1 || !p || !h || !counts || (n_eog > 0 && !eog) || h->n_tokens < 0 ||
        h->n_path < 0 || h->n_prompt < 0 || h->n_prompt > h->n_tokens ||
        (h->n_tokens > 0 && !h->tokens) || (h->n_path > 0 && !h->path))
        return st_fail(ST_ERR_INVALID, "sample_penalize: bad arguments");
    const int64_t n = h->n_tokens + h->n_path;
    for (int64_t i = 0; i < n; i++)
        if (hist_at(h, i) < 0 || hist_at(h, i) >= n_vocab)
            return st_fail(ST_ERR_INVALID,
                           "sample_penalize: history token %d at %lld is outside the vocabulary "
                           "of %d",
                           hist_at(h, i), (long long)i, n_vocab);
    for (int32_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token >= 0 && p->logit_bias[i].token < n_vocab)
            logits[p->logit_bias[i].token] += p->logit_bias[i].bias;
    /* repetition: each distinct token of the window once (counts marks the seen ones) */
    if (repeat_on(p)) {
        const int64_t w = p->repeat_last_n == 0 ? ST_REPEAT_LAST_N_DEFAULT : p->repeat_last_n;
        const int64_t from = w < 0 || w > n ? 0 : n - w;
        for (int64_t i = from; i < n; i++) {
            const int32_t t = hist_at(h, i);
            if (counts[t])
                continue;
            counts[t] = 1;
            logits[t] =
                logits[t] > 0.0f ? logits[t] / p->repeat_penalty : logits[t] * p->repeat_penalty;
        }
        for (int64_t i = from; i < n; i++)
            counts[hist_at(h, i)] = 0;
    }
    /* presence and frequency: counts of the generated tokens, applied at a token's first
     * occurrence, which also resets its count */
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        for (int64_t i = h->n_prompt; i < n; i++)
            counts[hist_at(h, i)]++;
        for (int64_t i = h->n_prompt; i < n; i++) {
            const int32_t t = hist_at(h, i);
            if (!counts[t])
                continue;
            logits[t] -= (float)counts[t] * p->frequency_penalty + p->presence_penalty;
            counts[t] = 0;
        }
    }
    if (p->ignore_eos || n - h->n_prompt < (int64_t)p->min_tokens)
        for (int32_t i = 0; i < n_eog; i++)
            if (eog[i] >= 0 && eog[i] < n_vocab)
                logits[eog[i]] = -INFINITY;
    return ST_OK;
}

/* Parameters other than temp are read only when temp > 0. */
st_status st_sample(const float *logits, int32_t n_vocab, const st_sampler_params *p, int64_t pos,
                    void *scratch, int32_t *out) {
    if (!logits || !p || !out || n_vocab < 1 || !scratch)
        return st_fail(ST_ERR_INVALID, "sample: bad arguments");
    if (!(p->temp >= 0.0f) || (p->temp > 0.0f && (!(p->top_p > 0.0f) || !(p->min_p <= 1.0f))))
        return st_fail(ST_ERR_INVALID, "sample: temp %g, top_p %g or min_p %g out of range",
                       (double)p->temp, (double)p->top_p, (double)p->min_p);
    if (p->temp == 0.0f) {
        *out = st_argmax(logits, n_vocab);
        return ST_OK;
    }
    cand *c = scratch;
    float *pr = (float *)(c + n_vocab);
    int32_t n;
    if (p->top_k > 0 && p->top_k < n_vocab) {
        int64_t len = 0;
        for (int32_t i = 0; i < n_vocab; i++) {
            const cand x = {logits[i], i};
            if (len < p->top_k)
                st_heap_push(c, sizeof *c, &len, &x, worse_above, NULL);
            else if (cand_before(&x, &c[0]))
                st_heap_replace_top(c, sizeof *c, len, &x, worse_above, NULL);
        }
        n = (int32_t)len;
    } else {
        n = n_vocab;
        for (int32_t i = 0; i < n; i++)
            c[i] = (cand){logits[i], i};
    }
    qsort(c, (size_t)n, sizeof *c, cand_cmp);
    while (n > 1 && !isfinite(c[n - 1].logit)) /* drop NaN and -inf */
        n--;
    float mx = c[0].logit;
    if (!isfinite(mx)) {
        *out = c[0].id;
        return ST_OK;
    }
    float sum = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        pr[i] = expf((c[i].logit - mx) / p->temp);
        sum += pr[i];
    }
    if (p->top_p < 1.0f) {
        float acc = 0.0f, lim = p->top_p * sum;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            acc += pr[i];
            if (acc >= lim) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        float lim = p->min_p * pr[0]; /* pr[0] is the largest */
        int32_t keep = 1;
        while (keep < n && pr[keep] >= lim)
            keep++;
        n = keep;
    }
    float kept = 0.0f;
    for (int32_t i = 0; i < n; i++)
        kept += pr[i];
    float r = st_sample_uniform(p->seed, pos) * kept;
    float acc = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        acc += pr[i];
        if (r < acc) {
            *out = c[i].id;
            return ST_OK;
        }
    }
    *out = c[n - 1].id;
    return ST_OK;
}
