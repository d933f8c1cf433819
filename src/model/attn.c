/*
 * attn.c: grouped-query attention of one layer for the tokens of a forward pass, each over its
 * own key list (a prefix of its sequence's KV rows, optionally masked, then extra rows: a tree
 * node's ancestors). Keys are visited in increasing position with the same arithmetic as
 * sequential decoding, and a shared prefix is streamed once for a group of tokens.
 */
#include "model/model.h"

#include <math.h>
#include <string.h>

typedef struct attn_job {
    st_session *s;
    const st_fwd *f;
    int32_t layer;
} attn_job;

/* Queries per attention kernel call (pointer arrays on the stack). */
enum { ST_ATTN_Q = 128 };

/* Where token i of a group starting at i0 keeps its scores: (g, n_i + 1) floats, the last of
 * each head's row its dead flag. */
static float *tok_scores(const st_session *s, const st_fwd *f, int32_t i, int32_t i0, float *sc) {
    (void)f;
    const int32_t g = s->m->hp.n_head / s->m->hp.n_head_kv;
    return sc + (int64_t)(i - i0) * g * (s->p.n_ctx + 1);
}

static int32_t tok_n(const st_fwd *f, int32_t i) {
    return f->n_prefix[i] + (f->extra_off ? f->extra_off[i + 1] - f->extra_off[i] : 0);
}

/* Scores (wsum = 0) or value terms (wsum = 1) of the queries of tokens [t0, t1) x the g heads of
 * KV head kvh against the rows [a, b) of KV (K or V of the sequence, already offset to the KV
 * head; elements of the cache's type), which are score column col onward of each token. Every
 * row is read once for all those queries; rows of an f16 cache are converted to float in `conv`
 * (the thread's, ST_KV_CONV_FLOATS or one row) a run of rows at a time, which changes no
 * arithmetic: each score is its own dot product, and each value sum continues its chain over
 * the rows in order. */
static void attn_run(const st_session *s, const st_fwd *f, int wsum, int32_t i0, int32_t t0,
                     int32_t t1, int32_t kvh, float *sc, const uint8_t *KV, float *conv, int32_t a,
                     int32_t b, int32_t col) {
    const st_model_hparams *hp = &s->m->hp;
    const int32_t hd = hp->head_dim, g = hp->n_head / hp->n_head_kv;
    const int64_t kvd = (int64_t)hp->n_head_kv * hd, Q = (int64_t)hp->n_head * hd;
    const float sq = sqrtf((float)hd);
    const int f16 = (wsum ? s->v_elem : s->k_elem) == 2;
    const int32_t run = !f16 ? b - a : hd >= ST_KV_CONV_FLOATS ? 1 : ST_KV_CONV_FLOATS / hd;
    float *wr[ST_ATTN_Q];
    const float *rd[ST_ATTN_Q];
    for (int32_t c0 = a, c1; c0 < b; c0 = c1) {
        c1 = b - c0 < run ? b : c0 + run;
        const float *rows = (const float *)KV + (int64_t)c0 * kvd;
        int64_t ld = kvd;
        if (f16) {
            const uint16_t *h16 = (const uint16_t *)KV + (int64_t)c0 * kvd;
            for (int32_t r = 0; r < c1 - c0; r++)
                s->kern->f16_to_f32(conv + (int64_t)r * hd, h16 + (int64_t)r * kvd, hd);
            rows = conv, ld = hd;
        }
        const int32_t off = col + (c0 - a);
        int nq = 0;
        for (int32_t i = t0; i < t1; i++) {
            const int32_t n1 = tok_n(f, i) + 1;
            float *st = tok_scores(s, f, i, i0, sc);
            for (int32_t h = 0; h < g; h++) {
                float *q = s->q + (int64_t)i * Q + ((int64_t)kvh * g + h) * hd;
                float *out = s->att + (int64_t)i * Q + ((int64_t)kvh * g + h) * hd;
                float *sh = st + (int64_t)h * n1 + off;
                wr[nq] = wsum ? out : sh;
                rd[nq] = wsum ? sh : q;
                if (++nq == ST_ATTN_Q || (i == t1 - 1 && h == g - 1)) {
                    if (wsum)
                        s->kern->attn_wsum(wr, rd, nq, rows, ld, c1 - c0, hd);
                    else
                        s->kern->attn_scores(wr, rd, nq, rows, ld, c1 - c0, hd, sq);
                    nq = 0;
                }
            }
        }
    }
}

/* Token i's own rows: its prefix rows [P, n_prefix) (skipping those its prefix mask hides, whose
 * score is -inf) and its extra rows, in runs of consecutive rows. */
static void attn_own(const st_session *s, const st_fwd *f, int wsum, int32_t i0, int32_t i,
                     int32_t kvh, float *sc, const uint8_t *KV, float *conv, int32_t P) {
    const int32_t g = s->m->hp.n_head / s->m->hp.n_head_kv, np = f->n_prefix[i];
    const uint8_t *pm = f->prefix_mask ? f->prefix_mask[i] : NULL;
    for (int32_t a = P, c; a < np; a = c) {
        const bool vis = !pm || pm[a];
        for (c = a + 1; c < np && (!pm || !pm[c] == !vis); c++)
            ;
        if (vis) {
            attn_run(s, f, wsum, i0, i, i + 1, kvh, sc, KV, conv, a, c, a);
        } else if (!wsum) {
            const int32_t n1 = tok_n(f, i) + 1;
            float *st = tok_scores(s, f, i, i0, sc);
            for (int32_t h = 0; h < g; h++)
                for (int32_t r = a; r < c; r++)
                    st[(int64_t)h * n1 + r] = -INFINITY;
        }
    }
    if (!f->extra_off)
        return;
    const int32_t e0 = f->extra_off[i], ne = f->extra_off[i + 1] - e0;
    const int32_t *rows = f->extra_rows + e0;
    for (int32_t a = 0, b; a < ne; a = b) {
        for (b = a + 1; b < ne && rows[b] == rows[b - 1] + 1; b++)
            ;
        attn_run(s, f, wsum, i0, i, i + 1, kvh, sc, KV, conv, rows[a], rows[a] + (b - a), np + a);
    }
}

/* Attention of the g query heads of KV head kvh for tokens [i0, i1) of one sequence
 * (grouped-query attention). Each token sees its prefix rows, then its extra rows, in that
 * order. The rows [0, P) that every token's prefix has (none when prefix masks are given) are
 * streamed in chunks that stay in cache, each chunk once for all the tokens' queries. Per token
 * the arithmetic is exactly that of attending alone: scores in visit order, a max-subtracted
 * softmax per head, and the value sums continued across chunks in visit order.
 * sc: (i1 - i0, g, n_ctx + 1) floats. */
static void attn_tokens(const st_session *s, const st_fwd *f, int32_t l, int32_t i0, int32_t i1,
                        int32_t kvh, float *sc, float *conv) {
    const st_model_hparams *hp = &s->m->hp;
    const int32_t hd = hp->head_dim, g = hp->n_head / hp->n_head_kv;
    const int64_t Q = (int64_t)hp->n_head * hd;
    const uint8_t *K = st_kv_k(s, f->seq[i0], l) + (size_t)kvh * (size_t)hd * s->k_elem;
    const uint8_t *V = st_kv_v(s, f->seq[i0], l) + (size_t)kvh * (size_t)hd * s->v_elem;
    const int32_t chunk = hd >= 512 ? 8 : (int32_t)(4096 / hd + 7) / 8 * 8;
    int32_t P = f->prefix_mask ? 0 : f->n_prefix[i0];
    for (int32_t i = i0; i < i1; i++)
        P = f->n_prefix[i] < P ? f->n_prefix[i] : P;
    for (int32_t a = 0; a < P; a += chunk)
        attn_run(s, f, 0, i0, i0, i1, kvh, sc, K, conv, a, P - a < chunk ? P : a + chunk, a);
    for (int32_t i = i0; i < i1; i++) {
        attn_own(s, f, 0, i0, i, kvh, sc, K, conv, P);
        /* softmax per head, in place: p = exp(s - max) / sum; a head with no visible key gets
         * a zero output */
        const int32_t n = tok_n(f, i);
        float *st = tok_scores(s, f, i, i0, sc);
        for (int32_t h0 = 0; h0 < g; h0 += 16) {
            const int32_t nh = g - h0 < 16 ? g - h0 : 16;
            float *sh = st + (int64_t)h0 * (n + 1), sums[16];
            s->kern->softmax(sh, n, nh, n + 1, sums);
            if (s->p.type_v == ST_DTYPE_F16) /* the value sums multiply f16 by f16 (ggml) */
                for (int32_t h = 0; h < nh; h++)
                    for (int32_t r = 0; r < n; r++) {
                        float *p = sh + (int64_t)h * (n + 1) + r;
                        *p = st_fp16_to_f32(st_f32_to_fp16(*p));
                    }
            for (int32_t h = 0; h < nh; h++)
                sh[(int64_t)h * (n + 1) + n] = sums[h] > 0.0f ? 0.0f : 1.0f;
        }
        memset(s->att + (int64_t)i * Q + (int64_t)kvh * g * hd, 0,
               (size_t)g * (size_t)hd * sizeof(float));
    }
    for (int32_t a = 0; a < P; a += chunk)
        attn_run(s, f, 1, i0, i0, i1, kvh, sc, V, conv, a, P - a < chunk ? P : a + chunk, a);
    for (int32_t i = i0; i < i1; i++) {
        attn_own(s, f, 1, i0, i, kvh, sc, V, conv, P);
        const int32_t n = tok_n(f, i);
        const float *st = tok_scores(s, f, i, i0, sc);
        float *out = s->att + (int64_t)i * Q + (int64_t)kvh * g * hd;
        for (int32_t h = 0; h < g; h++)
            if (st[(int64_t)h * (n + 1) + n] != 0.0f)
                memset(out + (int64_t)h * hd, 0, (size_t)hd * sizeof(float));
    }
}

/* Token groups: runs of at most ST_ATTN_TOKENS consecutive tokens of one sequence (single tokens
 * when prefix masks are given). Returns the end of the group that starts at token i. */
static int32_t attn_group_end(const st_fwd *f, int32_t i) {
    int32_t e = i + 1;
    while (e < f->n && e - i < ST_ATTN_TOKENS && !f->prefix_mask && f->seq[e] == f->seq[i])
        e++;
    return e;
}

/* Work items are (token group, KV head) pairs, split evenly over the threads. */
static void attn_task(void *ctx, int ith, int nth) {
    const attn_job *j = ctx;
    const st_session *s = j->s;
    const int32_t nkv = s->m->hp.n_head_kv, g = s->m->hp.n_head / nkv;
    int64_t ng = 0;
    for (int32_t i = 0; i < j->f->n; i = attn_group_end(j->f, i))
        ng++;
    int64_t b, e;
    st_split(ng * nkv, ith, nth, &b, &e);
    float *sc = s->scores + (int64_t)ith * ST_ATTN_TOKENS * g * (s->p.n_ctx + 1);
    const int64_t hd = s->m->hp.head_dim, per = hd > ST_KV_CONV_FLOATS ? hd : ST_KV_CONV_FLOATS;
    float *conv = s->kv_conv ? s->kv_conv + ith * per : NULL;
    int64_t gi = 0;
    for (int32_t i = 0, i1; i < j->f->n && gi * nkv < e; i = i1, gi++) {
        i1 = attn_group_end(j->f, i);
        for (int32_t h = 0; h < nkv; h++)
            if (gi * nkv + h >= b && gi * nkv + h < e)
                attn_tokens(s, j->f, j->layer, i, i1, h, sc, conv);
    }
}

void st_attn_layer(st_session *s, const st_fwd *f, int32_t layer) {
    attn_job aj = {s, f, layer};
    int64_t macs = 0; /* scores and values: 2 x keys x n_head x head_dim */
    for (int32_t i = 0; i < f->n; i++)
        macs += 2 * (int64_t)tok_n(f, i) * s->m->hp.n_head * s->m->hp.head_dim;
    if (macs < ST_MIN_PARALLEL_MACS)
        attn_task(&aj, 0, 1);
    else
        st_pool_run(s->pool, attn_task, &aj);
}
