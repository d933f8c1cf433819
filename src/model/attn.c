/*
 * attn.c: the CPU backend's attention (backend.h): grouped-query attention of one layer for the
 * tokens of a forward pass, each over its own key list (a prefix of its sequence's KV rows,
 * optionally masked, then extra rows: a tree node's ancestors). Keys are visited in increasing
 * position with the same arithmetic as sequential decoding, and a shared prefix is streamed once
 * for a group of tokens.
 */
#include "model/backend.h"

#include <math.h>
#include <string.h>

typedef struct attn_job {
    st_session *s;
    const st_fwd *f;
    int32_t layer;
} attn_job;

/* match_ggml (st_session_params): the attention arithmetic of ggml's CPU backend without flash
 * attention. GCC's _mm512_reduce_add_ps of 16 floats. */
static float ggml_reduce16(const float *v) {
    float t8[8], t4[4];
    for (int i = 0; i < 8; i++)
        t8[i] = v[i + 8] + v[i];
    for (int i = 0; i < 4; i++)
        t4[i] = t8[i + 4] + t8[i];
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

/* ggml_soft_max over a key list of n (padded with masked keys to a multiple of 32, ggml's KV
 * window): exp with ggml's function, each 16 keys reduced in float and summed in double, then
 * every probability times (float)(1 / sum). Scores already carry the 1/sqrt(head_dim) factor. */
static void softmax_ggml(float *x, int32_t n) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    const int32_t nkv = (n + 31) & ~31;
    double sum = 0.0;
    for (int32_t c = 0; c < nkv; c += 16) {
        float v[16];
        for (int l = 0; l < 16; l++) {
            v[l] = c + l < n ? st_expf_ggml(x[c + l] - mx) : 0.0f;
            if (c + l < n)
                x[c + l] = v[l];
        }
        sum += (double)ggml_reduce16(v);
    }
    const float inv = (float)(1.0 / sum);
    for (int32_t i = 0; i < n; i++)
        x[i] *= inv;
}

/* Element d of key-list entry c (of token i) of the K or V cache at KV (already offset to the KV
 * head; rows kvd elements apart, elem bytes each), as float. */
static float kv_at(const st_fwd *f, int32_t i, const uint8_t *KV, size_t elem, int64_t kvd,
                   int32_t c, int32_t d) {
    const int32_t np = f->n_prefix[i];
    const int64_t r = c < np ? c : f->extra_rows[f->extra_off[i] + c - np];
    const uint8_t *p = KV + ((size_t)r * (size_t)kvd + (size_t)d) * elem;
    if (elem == 2) {
        uint16_t h;
        memcpy(&h, p, 2);
        return st_fp16_to_f32(h);
    }
    float v;
    memcpy(&v, p, 4);
    return v;
}

/* ggml_vec_dot_f16 of each value dimension over token i's n probabilities p (key list padded to
 * a multiple of 32 with zeros): below 64 keys a double sum of the products; else four 16-lane
 * fma chains over each 64 keys, added pairwise, reduced, then the remaining keys in double. */
static void vsum_ggml(const st_session *s, const st_fwd *f, int32_t i, const float *p, int32_t n,
                      const uint8_t *V, int32_t hd, float *out) {
    const int64_t kvd = (int64_t)s->m->hp.n_head_kv * hd;
    const int32_t nkv = (n + 31) & ~31, n64 = nkv & ~63;
    for (int32_t d = 0; d < hd; d++) {
        double sum = 0.0;
        if (n64) {
            float acc[4][16] = {{0}};
            for (int32_t c0 = 0; c0 < n64; c0 += 64)
                for (int k = 0; k < 4; k++)
                    for (int l = 0; l < 16; l++) {
                        const int32_t c = c0 + 16 * k + l;
                        if (c < n)
                            acc[k][l] = fmaf(kv_at(f, i, V, s->v_elem, kvd, c, d), p[c], acc[k][l]);
                    }
            for (int l = 0; l < 16; l++)
                acc[0][l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
            sum = (double)ggml_reduce16(acc[0]);
        }
        for (int32_t c = n64; c < n; c++)
            sum += (double)(kv_at(f, i, V, s->v_elem, kvd, c, d) * p[c]);
        out[d] = (float)sum;
    }
}

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
                    else if (s->p.match_ggml) /* ggml: the dot in double, times the scale */
                        for (int j = 0; j < nq; j++)
                            for (int32_t r = 0; r < c1 - c0; r++) {
                                double dot = 0.0;
                                for (int32_t d = 0; d < hd; d++)
                                    dot += (double)(rd[j][d] * rows[(int64_t)r * ld + d]);
                                wr[j][r] = (float)dot * (1.0f / sq);
                            }
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
            if (s->p.match_ggml)
                for (int32_t h = 0; h < nh; h++) {
                    float *x = sh + (int64_t)h * (n + 1);
                    int any = 0;
                    for (int32_t r = 0; r < n && !any; r++)
                        any = x[r] > -INFINITY;
                    if (any)
                        softmax_ggml(x, n);
                    sums[h] = any ? 1.0f : 0.0f;
                }
            else
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
            else if (s->p.match_ggml) /* the value sums again, in ggml's order */
                vsum_ggml(s, f, i, st + (int64_t)h * (n + 1), n, V, hd, out + (int64_t)h * hd);
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
    if (s->p.type_k == ST_DTYPE_F16) /* the scores multiply f16 by f16 (ggml) */
        for (int64_t e = 0; e < (int64_t)f->n * s->m->hp.n_head * s->m->hp.head_dim; e++)
            s->q[e] = st_fp16_to_f32(st_f32_to_fp16(s->q[e]));
    attn_job aj = {s, f, layer};
    int64_t macs = 0; /* scores and values: 2 x keys x n_head x head_dim */
    for (int32_t i = 0; i < f->n; i++)
        macs += 2 * (int64_t)tok_n(f, i) * s->m->hp.n_head * s->m->hp.head_dim;
    if (macs < ST_MIN_PARALLEL_MACS)
        attn_task(&aj, 0, 1);
    else
        st_pool_run(s->pool, attn_task, &aj);
}
