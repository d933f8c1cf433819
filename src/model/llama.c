/*
 * llama.c: loading a GGUF Llama model (every tensor's presence, type and shape checked) and the
 * batched forward pass: RMSNorm, RoPE in GGUF's adjacent-pair layout, grouped-query attention
 * over an explicit key list per token, SwiGLU, all in float32 activations. Every output element
 * is reduced in one fixed order whatever the batch size, tree shape or thread count, which is
 * what makes tree verification bitwise equal to sequential decoding (DESIGN.md invariant 1).
 */
#include "model/model.h"

#include "io/gguf_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Loading                                                                                    */

static st_status get_hparam(const st_gguf *g, const char *key, int required, int64_t def,
                            int64_t lo, int64_t hi, int32_t *out) {
    int64_t v = def;
    if (st_gguf_find(g, key) >= 0) {
        st_status s = st_gguf_get_i64(g, key, &v);
        if (s)
            return s;
    } else if (required) {
        return st_fail(ST_ERR_FORMAT, "%s: missing metadata key '%s'", st_gguf_name(g), key);
    }
    if (v < lo || v > hi)
        return st_fail(ST_ERR_FORMAT,
                       "%s: %s = %" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]",
                       st_gguf_name(g), key, v, lo, hi);
    *out = (int32_t)v;
    return ST_OK;
}

static bool is_matrix_type(uint32_t t) {
    return t == ST_DTYPE_F32 || t == ST_DTYPE_F16 || t == ST_DTYPE_BF16 || t == ST_DTYPE_Q8_0 ||
           t == ST_DTYPE_Q4_0;
}

static bool is_quantized(uint32_t t) { return t == ST_DTYPE_Q8_0 || t == ST_DTYPE_Q4_0; }

/* The forward pass gives q/k/v (and gate/up) one shared input, float or quantized to Q8 as the
 * first matrix's type says, so each group must be all float or all quantized. */
static st_status check_group(const st_gguf *g, int32_t l, const char *group, const st_wt *a,
                             const st_wt *b, const st_wt *c) {
    if (is_quantized(a->type) == is_quantized(b->type) &&
        (!c || is_quantized(a->type) == is_quantized(c->type)))
        return ST_OK;
    return st_fail(ST_ERR_UNSUPPORTED,
                   "%s: block %d mixes float and quantized %s weights (%s, %s%s%s)",
                   st_gguf_name(g), (int)l, group, st_dtype_name(a->type), st_dtype_name(b->type),
                   c ? ", " : "", c ? st_dtype_name(c->type) : "");
}

/* Finds a 2-D weight of shape ne = [n_in, n_out]. */
static st_status get_matrix(const st_gguf *g, const char *name, int64_t n_in, int64_t n_out,
                            int optional, st_wt *out) {
    memset(out, 0, sizeof *out);
    const st_gguf_tensor *t = st_gguf_tensor_find(g, name);
    if (!t) {
        if (optional)
            return ST_OK;
        return st_fail(ST_ERR_FORMAT, "%s: missing tensor '%s'", st_gguf_name(g), name);
    }
    if (!is_matrix_type(t->type))
        return st_fail(ST_ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported type %s",
                       st_gguf_name(g), name, st_dtype_name(t->type));
    char shape[96];
    if (t->n_dims > 2 || t->ne[0] != n_in || t->ne[1] != n_out)
        return st_fail(
            ST_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected [%" PRId64 ", %" PRId64 "]",
            st_gguf_name(g), name, st_gguf_tensor_shape(t, shape, sizeof shape), n_in, n_out);
    /* The kernels read float and block fields in place (a file with general.alignment 1 or 2,
     * or a buffer at an odd address, can misplace them). */
    const uintptr_t align = t->type == ST_DTYPE_F32 ? 4 : 2;
    if ((uintptr_t)t->data % align != 0)
        return st_fail(ST_ERR_UNSUPPORTED,
                       "%s: tensor '%s' data is not %u-byte aligned in memory (alignment %u)",
                       st_gguf_name(g), name, (unsigned)align, st_gguf_alignment(g));
    out->data = t->data;
    out->type = t->type;
    out->n_in = n_in;
    out->n_out = n_out;
    out->row_bytes = st_row_bytes(t->type, n_in);
    return ST_OK;
}

/* Copies a 1-D norm weight of n elements into a new float array. */
static st_status get_vector(const st_gguf *g, const char *name, int64_t n, float **out) {
    *out = NULL;
    const st_gguf_tensor *t = st_gguf_tensor_find(g, name);
    if (!t)
        return st_fail(ST_ERR_FORMAT, "%s: missing tensor '%s'", st_gguf_name(g), name);
    if (t->type != ST_DTYPE_F32 && t->type != ST_DTYPE_F16 && t->type != ST_DTYPE_BF16)
        return st_fail(ST_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, expected f32/f16/bf16",
                       st_gguf_name(g), name, st_dtype_name(t->type));
    char shape[96];
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected [%" PRId64 "]",
                       st_gguf_name(g), name, st_gguf_tensor_shape(t, shape, sizeof shape), n);
    *out = st_malloc((size_t)n * sizeof(float));
    if (!*out)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", st_gguf_name(g));
    st_dequant_row(t->type, t->data, *out, n);
    return ST_OK;
}

static st_status load_hparams(const st_gguf *g, st_model_hparams *hp) {
    st_gguf_str arch;
    st_status s = st_gguf_get_str(g, "general.architecture", &arch);
    if (s)
        return s;
    if (arch.len != 5 || memcmp(arch.ptr, "llama", 5) != 0)
        return st_fail(ST_ERR_UNSUPPORTED, "%s: architecture '%.*s' is not supported (llama)",
                       st_gguf_name(g), (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    const int32_t big = 1 << 24;
    if ((s = get_hparam(g, "llama.embedding_length", 1, 0, 1, big, &hp->n_embd)) ||
        (s = get_hparam(g, "llama.block_count", 1, 0, 1, 4096, &hp->n_layer)) ||
        (s = get_hparam(g, "llama.feed_forward_length", 1, 0, 1, big, &hp->n_ff)) ||
        (s = get_hparam(g, "llama.attention.head_count", 1, 0, 1, 4096, &hp->n_head)) ||
        (s = get_hparam(g, "llama.attention.head_count_kv", 0, hp->n_head, 1, hp->n_head,
                        &hp->n_head_kv)) ||
        (s = get_hparam(g, "llama.context_length", 1, 0, 1, 1 << 24, &hp->n_ctx_train)))
        return s;
    if (hp->n_head % hp->n_head_kv != 0)
        return st_fail(ST_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d",
                       st_gguf_name(g), hp->n_head, hp->n_head_kv);
    int32_t def_hd = hp->n_embd / hp->n_head;
    if ((s = get_hparam(g, "llama.attention.key_length", 0, def_hd, 1, 65536, &hp->head_dim)))
        return s;
    int32_t vlen;
    if ((s = get_hparam(g, "llama.attention.value_length", 0, hp->head_dim, 1, 65536, &vlen)))
        return s;
    if (vlen != hp->head_dim)
        return st_fail(ST_ERR_UNSUPPORTED, "%s: value_length %d differs from key_length %d",
                       st_gguf_name(g), vlen, hp->head_dim);
    if ((s = get_hparam(g, "llama.rope.dimension_count", 0, hp->head_dim, 2, hp->head_dim,
                        &hp->n_rot)))
        return s;
    if (hp->n_rot % 2 != 0)
        return st_fail(ST_ERR_FORMAT, "%s: rope dimension count %d is odd", st_gguf_name(g),
                       hp->n_rot);
    hp->rope_base = 10000.0f;
    if (st_gguf_find(g, "llama.rope.freq_base") >= 0 &&
        (s = st_gguf_get_f32(g, "llama.rope.freq_base", &hp->rope_base)))
        return s;
    if (!(hp->rope_base > 1.0f) || !isfinite(hp->rope_base))
        return st_fail(ST_ERR_FORMAT, "%s: rope freq_base %g is invalid", st_gguf_name(g),
                       (double)hp->rope_base);
    if ((s = st_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &hp->rms_eps)))
        return s;
    if (!(hp->rms_eps >= 0.0f) || !(hp->rms_eps < 1.0f))
        return st_fail(ST_ERR_FORMAT, "%s: rms epsilon %g is invalid", st_gguf_name(g),
                       (double)hp->rms_eps);
    if (st_gguf_find(g, "llama.rope.scaling.type") >= 0) {
        st_gguf_str st;
        if ((s = st_gguf_get_str(g, "llama.rope.scaling.type", &st)))
            return s;
        if (!(st.len == 4 && memcmp(st.ptr, "none", 4) == 0))
            return st_fail(ST_ERR_UNSUPPORTED, "%s: rope scaling '%.*s' is not supported yet",
                           st_gguf_name(g), (int)(st.len > 32 ? 32 : st.len), st.ptr);
    }
    if (st_gguf_tensor_find(g, "rope_freqs.weight"))
        return st_fail(ST_ERR_UNSUPPORTED,
                       "%s: rope_freqs.weight (llama3 rope scaling) is not "
                       "supported yet",
                       st_gguf_name(g));
    return ST_OK;
}

/* The matrices the forward pass multiplies by (8 per layer and the output), in order. */
static int64_t n_mats(const st_model *m) { return 7 * (int64_t)m->hp.n_layer + 1; }
static st_wt *mat_at(st_model *m, int64_t i) {
    if (i == 7 * (int64_t)m->hp.n_layer)
        return &m->output;
    st_layer *L = &m->layers[i / 7];
    st_wt *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return w[i % 7];
}

void st_model_free(st_model *m) {
    if (!m)
        return;
    if (m->layers) {
        for (int64_t i = 0; i < n_mats(m); i++)
            st_free_aligned(mat_at(m, i)->packed);
        for (int32_t l = 0; l < m->hp.n_layer; l++) {
            st_free(m->layers[l].attn_norm);
            st_free(m->layers[l].ffn_norm);
        }
    }
    st_free(m->layers);
    st_free(m->out_norm);
    st_tokenizer_free(m->tok);
    st_gguf_free(m->gguf);
    st_free(m);
}

/* Packs the F32 matrices of a small model (ST_PACK_MAX_BYTES, model.h); a failed allocation
 * leaves the rest unpacked (the row-major kernels give the same results). */
static void pack_matrices(st_model *m) {
    const char *env = getenv("ST_PACK");
    if ((env && strcmp(env, "0") == 0) || !st_kernels_get()->matmul_f32_packed)
        return;
    size_t total = 0;
    for (int64_t i = 0; i < n_mats(m); i++) {
        const st_wt *w = mat_at(m, i);
        if (w->type == ST_DTYPE_F32)
            total += st_pack_f32_floats(w->n_out, w->n_in) * sizeof(float);
    }
    if (total > ST_PACK_MAX_BYTES)
        return;
    for (int64_t i = 0; i < n_mats(m); i++) {
        st_wt *w = mat_at(m, i);
        if (w->type != ST_DTYPE_F32)
            continue;
        w->packed = st_malloc_aligned(st_pack_f32_floats(w->n_out, w->n_in) * sizeof(float), 64);
        if (!w->packed)
            return;
        st_pack_f32(w->packed, w->data, w->row_bytes, w->n_out, w->n_in);
    }
}

/* Everything after opening the file: hyper-parameters, tensors, tokenizer. m->gguf is set; on
 * error the caller frees m. */
static st_status model_from_gguf(st_model *m) {
    const st_gguf *g = m->gguf;
    const char *path = st_gguf_name(g);
    st_model_hparams *hp = &m->hp;
    st_status s = load_hparams(g, hp);
    if (s)
        return s;
    const st_gguf_tensor *te = st_gguf_tensor_find(g, "token_embd.weight");
    if (!te)
        return st_fail(ST_ERR_FORMAT, "%s: missing tensor 'token_embd.weight'%s", path,
                       st_gguf_n_tensors(g) == 0 ? " (this is a vocabulary-only file)" : "");
    if (te->ne[1] < 1 || te->ne[1] > (1 << 24))
        return st_fail(ST_ERR_FORMAT, "%s: token_embd.weight has %" PRId64 " rows", path,
                       te->ne[1]);
    hp->n_vocab = (int32_t)te->ne[1];
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim,
                  KV = (int64_t)hp->n_head_kv * hp->head_dim;
    if ((s = get_matrix(g, "token_embd.weight", E, hp->n_vocab, 0, &m->tok_embd)) ||
        (s = get_matrix(g, "output.weight", E, hp->n_vocab, 1, &m->output)) ||
        (s = get_vector(g, "output_norm.weight", E, &m->out_norm)))
        return s;
    hp->tied_output = m->output.data == NULL;
    if (hp->tied_output)
        m->output = m->tok_embd;
    m->layers = st_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        st_layer *L = &m->layers[l];
        char name[96];
#define ST_NAME(suffix) (snprintf(name, sizeof name, "blk.%d." suffix, (int)l), name)
        if ((s = get_vector(g, ST_NAME("attn_norm.weight"), E, &L->attn_norm)) ||
            (s = get_vector(g, ST_NAME("ffn_norm.weight"), E, &L->ffn_norm)) ||
            (s = get_matrix(g, ST_NAME("attn_q.weight"), E, Q, 0, &L->wq)) ||
            (s = get_matrix(g, ST_NAME("attn_k.weight"), E, KV, 0, &L->wk)) ||
            (s = get_matrix(g, ST_NAME("attn_v.weight"), E, KV, 0, &L->wv)) ||
            (s = get_matrix(g, ST_NAME("attn_output.weight"), Q, E, 0, &L->wo)) ||
            (s = get_matrix(g, ST_NAME("ffn_gate.weight"), E, hp->n_ff, 0, &L->w_gate)) ||
            (s = get_matrix(g, ST_NAME("ffn_up.weight"), E, hp->n_ff, 0, &L->w_up)) ||
            (s = get_matrix(g, ST_NAME("ffn_down.weight"), hp->n_ff, E, 0, &L->w_down)) ||
            (s = check_group(g, l, "attention", &L->wq, &L->wk, &L->wv)) ||
            (s = check_group(g, l, "feed-forward", &L->w_gate, &L->w_up, NULL)))
            return s;
#undef ST_NAME
    }
    hp->wtype = m->layers[0].wq.type;
    pack_matrices(m);
    if ((s = st_tokenizer_load(g, &m->tok))) {
        st_error_prefix("%s: tokenizer", path);
        return s;
    }
    if (st_tokenizer_n_vocab(m->tok) > hp->n_vocab)
        return st_fail(ST_ERR_FORMAT, "%s: tokenizer has %d tokens but the embedding only %d rows",
                       path, st_tokenizer_n_vocab(m->tok), hp->n_vocab);
    return ST_OK;
}

/* Builds a model over an opened GGUF, taking ownership of g (freed on error). Shared by
 * st_model_load and st_model_load_memory (load_memory.c). */
st_status st_model_from_gguf(st_gguf *g, st_model **out);
st_status st_model_from_gguf(st_gguf *g, st_model **out) {
    *out = NULL;
    st_model *m = st_calloc(1, sizeof *m);
    if (!m) {
        st_status s = st_fail(ST_ERR_NOMEM, "%s: out of memory", st_gguf_name(g));
        st_gguf_free(g);
        return s;
    }
    m->gguf = g;
    st_status s = model_from_gguf(m);
    if (s) {
        st_model_free(m);
        return s;
    }
    *out = m;
    return ST_OK;
}

st_status st_model_load(const char *path, st_model **out) {
    if (!out || !path)
        return st_fail(ST_ERR_INVALID, "st_model_load: NULL argument");
    *out = NULL;
    st_gguf *g;
    st_status s = st_gguf_open(path, &g);
    if (s)
        return s;
    return st_model_from_gguf(g, out);
}

const st_model_hparams *st_model_get_hparams(const st_model *m) { return &m->hp; }
const st_tokenizer *st_model_tokenizer(const st_model *m) { return m->tok; }

size_t st_model_weight_bytes(const st_model *m) {
    size_t total = (size_t)m->output.n_out * m->output.row_bytes;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const st_layer *L = &m->layers[l];
        const st_wt *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            total += (size_t)w[i]->n_out * w[i]->row_bytes;
    }
    return total;
}

/* ------------------------------------------------------------------------------------------ */
/* Sessions                                                                                   */

st_session_params st_session_default_params(void) {
    st_session_params p = {.n_ctx = 0, .n_seq = 1, .n_batch = 64, .n_threads = 0};
    return p;
}

const st_session_params *st_session_get_params(const st_session *s) { return &s->p; }

void st_session_free(st_session *s) {
    if (!s)
        return;
    st_pool_free(s->pool);
    st_free(s->seq_len);
    st_free_aligned(s->k_cache);
    st_free_aligned(s->v_cache);
    void *bufs[] = {s->rope_cos,    s->rope_sin,   s->x,
                    s->xb,          s->q,          s->kt,
                    s->vt,          s->att,        s->hb,
                    s->hb2,         s->tmp,        s->xq,
                    s->scores,      s->logits_tmp, s->b_pos,
                    s->b_seq,       s->b_row,      s->b_prefix,
                    s->b_extra_off, s->b_extra,    (void *)s->b_pmask};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        st_free_aligned(bufs[i]);
    st_free(s);
}

static void *alloc_f(size_t n, size_t elem, bool *ok) {
    size_t bytes;
    if (!st_mul_size(n ? n : 1, elem, &bytes)) {
        *ok = false;
        return NULL;
    }
    void *p = st_malloc_aligned(bytes, 64);
    if (!p)
        *ok = false;
    else
        memset(p, 0, bytes);
    return p;
}

st_status st_session_create(const st_model *m, const st_session_params *pp, st_session **out) {
    if (!out || !m)
        return st_fail(ST_ERR_INVALID, "st_session_create: NULL argument");
    *out = NULL;
    st_session_params p = pp ? *pp : st_session_default_params();
    const st_model_hparams *hp = &m->hp;
    if (p.n_ctx <= 0)
        p.n_ctx = hp->n_ctx_train;
    if (p.n_seq <= 0)
        p.n_seq = 1;
    if (p.n_batch <= 0)
        p.n_batch = 64;
    if (p.n_threads <= 0) /* tiny models: a barrier costs more than the work it splits */
        p.n_threads = st_model_weight_bytes(m) < ((size_t)16 << 20) ? 1 : st_n_cores();
    if (p.n_ctx > (1 << 24) || p.n_seq > 4096 || p.n_batch > 4096)
        return st_fail(ST_ERR_INVALID, "session: n_ctx %d, n_seq %d or n_batch %d is too large",
                       p.n_ctx, p.n_seq, p.n_batch);
    st_session *s = st_calloc(1, sizeof *s);
    if (!s)
        return st_fail(ST_ERR_NOMEM, "session: out of memory");
    s->m = m;
    s->kern = st_kernels_get();
    st_status st = st_pool_create(p.n_threads, &s->pool);
    if (st) {
        st_free(s);
        return st;
    }
    p.n_threads = st_pool_size(s->pool);
    s->p = p;
    const size_t E = (size_t)hp->n_embd, Q = (size_t)hp->n_head * (size_t)hp->head_dim,
                 KV = (size_t)hp->n_head_kv * (size_t)hp->head_dim, B = (size_t)p.n_batch,
                 F = (size_t)hp->n_ff;
    size_t kv_total = 1;
    bool ok = st_mul_size((size_t)p.n_seq * (size_t)hp->n_layer, (size_t)p.n_ctx, &kv_total) &&
              st_mul_size(kv_total, KV, &kv_total);
    s->kv_layer_stride = (int64_t)p.n_ctx * (int64_t)KV;
    s->kv_seq_stride = s->kv_layer_stride * hp->n_layer;
    size_t qmax = E > F ? E : F;
    if (Q > qmax)
        qmax = Q;
    s->seq_len = st_calloc((size_t)p.n_seq, sizeof(int32_t));
    ok = ok && s->seq_len;
    if (ok) {
        s->k_cache = alloc_f(kv_total, sizeof(float), &ok);
        s->v_cache = alloc_f(kv_total, sizeof(float), &ok);
    }
    size_t nrot2 = (size_t)hp->n_rot / 2;
    s->rope_cos = alloc_f((size_t)p.n_ctx * nrot2, sizeof(float), &ok);
    s->rope_sin = alloc_f((size_t)p.n_ctx * nrot2, sizeof(float), &ok);
    s->x = alloc_f(B * E, sizeof(float), &ok);
    s->xb = alloc_f(B * E, sizeof(float), &ok);
    s->tmp = alloc_f(B * E, sizeof(float), &ok);
    s->q = alloc_f(B * Q, sizeof(float), &ok);
    s->att = alloc_f(B * Q, sizeof(float), &ok);
    s->kt = alloc_f(B * KV, sizeof(float), &ok);
    s->vt = alloc_f(B * KV, sizeof(float), &ok);
    s->hb = alloc_f(B * F, sizeof(float), &ok);
    s->hb2 = alloc_f(B * F, sizeof(float), &ok);
    s->xq = alloc_f(B * (qmax / ST_QK + 1), sizeof(st_block_q8x), &ok);
    s->scores = alloc_f((size_t)p.n_threads * ST_ATTN_TOKENS *
                            (size_t)(hp->n_head / hp->n_head_kv) * ((size_t)p.n_ctx + 1),
                        sizeof(float), &ok);
    s->logits_tmp = alloc_f((size_t)hp->n_vocab, sizeof(float), &ok);
    s->b_pos = alloc_f(B, sizeof(int32_t), &ok);
    s->b_seq = alloc_f(B, sizeof(int32_t), &ok);
    s->b_row = alloc_f(B, sizeof(int32_t), &ok);
    s->b_prefix = alloc_f(B, sizeof(int32_t), &ok);
    s->b_extra_off = alloc_f(B + 1, sizeof(int32_t), &ok);
    s->b_extra = alloc_f(B * B, sizeof(int32_t), &ok);
    s->b_pmask = alloc_f(B, sizeof(uint8_t *), &ok);
    if (!ok) {
        st_session_free(s);
        return st_fail(ST_ERR_NOMEM,
                       "session: out of memory (n_ctx %d, n_seq %d, n_batch %d: KV cache %zu MB)",
                       p.n_ctx, p.n_seq, p.n_batch, kv_total * 8 / (1024 * 1024));
    }
    /* RoPE tables in double precision: theta = pos * base^(-2j/n_rot). */
    for (int32_t pos = 0; pos < p.n_ctx; pos++)
        for (size_t j = 0; j < nrot2; j++) {
            double freq = pow((double)hp->rope_base, -2.0 * (double)j / (double)hp->n_rot);
            double a = (double)pos * freq;
            s->rope_cos[(size_t)pos * nrot2 + j] = (float)cos(a);
            s->rope_sin[(size_t)pos * nrot2 + j] = (float)sin(a);
        }
    *out = s;
    return ST_OK;
}

int32_t st_session_seq_len(const st_session *s, int32_t seq) {
    return (seq >= 0 && seq < s->p.n_seq) ? s->seq_len[seq] : -1;
}

st_status st_session_seq_reset(st_session *s, int32_t seq) {
    if (seq < 0 || seq >= s->p.n_seq)
        return st_fail(ST_ERR_INVALID, "sequence %d out of range (n_seq %d)", seq, s->p.n_seq);
    s->seq_len[seq] = 0;
    return ST_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Forward pass                                                                               */

/* y = x / sqrt(mean(x^2) + eps) * w, with the canonical dot product for the sum of squares. */
static void rmsnorm(const st_kernels *k, float *y, const float *x, const float *w, int64_t n,
                    float eps) {
    float ss = k->dot(x, x, n) / (float)n;
    float scale = 1.0f / sqrtf(ss + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = (x[i] * scale) * w[i];
}

/* Rotates adjacent pairs (2j, 2j+1) of each head (GGUF/llama.cpp NORMAL mode). */
static void rope(float *v, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float *cs,
                 const float *sn) {
    for (int32_t h = 0; h < n_heads; h++) {
        float *vh = v + (int64_t)h * head_dim;
        for (int32_t j = 0; j < n_rot / 2; j++) {
            float a = vh[2 * j], b = vh[2 * j + 1];
            vh[2 * j] = a * cs[j] - b * sn[j];
            vh[2 * j + 1] = a * sn[j] + b * cs[j];
        }
    }
}

typedef struct mm_job {
    const st_kernels *k;
    int n_mat;
    const st_wt *w[3];
    float *y[3];
    const void *x; /* float (M, ldx) or st_block_q8x (M, ldx) */
    int64_t ldx;
    int64_t M;
    int64_t chunk;       /* rows per work item */
    int64_t n_chunks[3]; /* work items of each matrix */
    atomic_llong next;   /* next work item, over the matrices in order */
} mm_job;

static st_matmul_fn matmul_for(const st_kernels *k, uint32_t type) {
    switch (type) {
    case ST_DTYPE_F32:
        return k->matmul_f32;
    case ST_DTYPE_F16:
        return k->matmul_f16;
    case ST_DTYPE_BF16:
        return k->matmul_bf16;
    case ST_DTYPE_Q8_0:
        return k->matmul_q8_0;
    default:
        return k->matmul_q4_0;
    }
}

static bool is_quant(uint32_t type) { return type == ST_DTYPE_Q8_0 || type == ST_DTYPE_Q4_0; }

/* A parallel region of fewer multiply-adds than this runs on the calling thread alone: handing
 * part of it to a worker costs more (a few cache-line transfers, and on a busy machine a wait
 * for a descheduled thread) than it saves. A model of stories260K's size then decodes as fast
 * with two threads as with one. */
enum { ST_MIN_PARALLEL_MACS = 1 << 16 };

/* Threads take chunks of rows of the matrices in turn from a shared counter (memory bandwidth
 * is shared unevenly, so a static split leaves one thread waiting at the barrier). Which thread
 * computes a row changes nothing in its value. Outputs are row-major (M, n_out). */
static void mm_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    mm_job *j = ctx;
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        int i = 0;
        while (i < j->n_mat && c >= j->n_chunks[i])
            c -= j->n_chunks[i++];
        if (i == j->n_mat)
            return;
        const st_wt *w = j->w[i];
        const int64_t r0 = c * j->chunk;
        const int64_t r1 = r0 + j->chunk < w->n_out ? r0 + j->chunk : w->n_out;
        if (w->packed && j->k->matmul_f32_packed) {
            j->k->matmul_f32_packed(j->y[i], w->n_out, w->packed, j->x, j->ldx, w->n_in, j->M, r0,
                                    r1);
            continue;
        }
        matmul_for(j->k, w->type)(j->y[i], w->n_out, w->data, w->row_bytes, j->x, j->ldx, w->n_in,
                                  j->M, r0, r1);
    }
}

/* y_i = W_i x for up to three matrices with the same input (M tokens of n_in floats). */
static void matmuls(st_session *s, int n_mat, const st_wt *const *w, float *const *y,
                    const float *x, int64_t M) {
    mm_job j = {.k = s->kern, .n_mat = n_mat, .M = M};
    int64_t rows = 0;
    for (int i = 0; i < n_mat; i++) {
        j.w[i] = w[i];
        j.y[i] = y[i];
        rows += w[i]->n_out;
    }
    /* About 8 chunks per thread, a multiple of the kernels' 8-row tiles (16-row blocks of
     * packed weights). */
    const int nth = rows * w[0]->n_in * M < ST_MIN_PARALLEL_MACS ? 1 : st_pool_size(s->pool);
    const int64_t tile = w[0]->packed ? ST_PACK_ROWS : 8;
    j.chunk = nth == 1 ? rows : (rows / (8 * nth) + tile - 1) & ~(tile - 1);
    if (j.chunk < tile)
        j.chunk = tile;
    for (int i = 0; i < n_mat; i++)
        j.n_chunks[i] = (w[i]->n_out + j.chunk - 1) / j.chunk;
    atomic_init(&j.next, 0);
    int64_t K = w[0]->n_in;
    if (is_quant(w[0]->type)) {
        int64_t nb = K / ST_QK;
        for (int64_t m = 0; m < M; m++)
            s->kern->quantize_q8x(s->xq + m * nb, x + m * K, K);
        j.x = s->xq;
        j.ldx = nb;
    } else {
        j.x = x;
        j.ldx = K;
    }
    if (nth == 1)
        mm_task(&j, 0, 1);
    else
        st_pool_run(s->pool, mm_task, &j);
}

static void matmul1(st_session *s, const st_wt *w, float *y, const float *x, int64_t M) {
    matmuls(s, 1, &w, &y, x, M);
}

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
 * head), which are score column col onward of each token. Every row is read once for all those
 * queries. */
static void attn_run(const st_session *s, const st_fwd *f, int wsum, int32_t i0, int32_t t0,
                     int32_t t1, int32_t kvh, float *sc, const float *KV, int32_t a, int32_t b,
                     int32_t col) {
    const st_model_hparams *hp = &s->m->hp;
    const int32_t hd = hp->head_dim, g = hp->n_head / hp->n_head_kv;
    const int64_t kvd = (int64_t)hp->n_head_kv * hd, Q = (int64_t)hp->n_head * hd;
    const float sq = sqrtf((float)hd);
    float *wr[ST_ATTN_Q];
    const float *rd[ST_ATTN_Q];
    int nq = 0;
    for (int32_t i = t0; i < t1; i++) {
        const int32_t n1 = tok_n(f, i) + 1;
        float *st = tok_scores(s, f, i, i0, sc);
        for (int32_t h = 0; h < g; h++) {
            float *q = s->q + (int64_t)i * Q + ((int64_t)kvh * g + h) * hd;
            float *out = s->att + (int64_t)i * Q + ((int64_t)kvh * g + h) * hd;
            float *sh = st + (int64_t)h * n1 + col;
            wr[nq] = wsum ? out : sh;
            rd[nq] = wsum ? sh : q;
            if (++nq == ST_ATTN_Q || (i == t1 - 1 && h == g - 1)) {
                if (wsum)
                    s->kern->attn_wsum(wr, rd, nq, KV + (int64_t)a * kvd, kvd, b - a, hd);
                else
                    s->kern->attn_scores(wr, rd, nq, KV + (int64_t)a * kvd, kvd, b - a, hd, sq);
                nq = 0;
            }
        }
    }
}

/* Token i's own rows: its prefix rows [P, n_prefix) (skipping those its prefix mask hides, whose
 * score is -inf) and its extra rows, in runs of consecutive rows. */
static void attn_own(const st_session *s, const st_fwd *f, int wsum, int32_t i0, int32_t i,
                     int32_t kvh, float *sc, const float *KV, int32_t P) {
    const int32_t g = s->m->hp.n_head / s->m->hp.n_head_kv, np = f->n_prefix[i];
    const uint8_t *pm = f->prefix_mask ? f->prefix_mask[i] : NULL;
    for (int32_t a = P, c; a < np; a = c) {
        const bool vis = !pm || pm[a];
        for (c = a + 1; c < np && (!pm || !pm[c] == !vis); c++)
            ;
        if (vis) {
            attn_run(s, f, wsum, i0, i, i + 1, kvh, sc, KV, a, c, a);
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
        attn_run(s, f, wsum, i0, i, i + 1, kvh, sc, KV, rows[a], rows[a] + (b - a), np + a);
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
                        int32_t kvh, float *sc) {
    const st_model_hparams *hp = &s->m->hp;
    const int32_t hd = hp->head_dim, g = hp->n_head / hp->n_head_kv;
    const int64_t Q = (int64_t)hp->n_head * hd;
    const float *K = st_kv_k(s, f->seq[i0], l) + (int64_t)kvh * hd;
    const float *V = st_kv_v(s, f->seq[i0], l) + (int64_t)kvh * hd;
    const int32_t chunk = hd >= 512 ? 8 : (int32_t)(4096 / hd + 7) / 8 * 8;
    int32_t P = f->prefix_mask ? 0 : f->n_prefix[i0];
    for (int32_t i = i0; i < i1; i++)
        P = f->n_prefix[i] < P ? f->n_prefix[i] : P;
    for (int32_t a = 0; a < P; a += chunk)
        attn_run(s, f, 0, i0, i0, i1, kvh, sc, K, a, P - a < chunk ? P : a + chunk, a);
    for (int32_t i = i0; i < i1; i++) {
        attn_own(s, f, 0, i0, i, kvh, sc, K, P);
        /* softmax per head, in place: p = exp(s - max) / sum; a head with no visible key gets
         * a zero output */
        const int32_t n = tok_n(f, i);
        float *st = tok_scores(s, f, i, i0, sc);
        for (int32_t h0 = 0; h0 < g; h0 += 16) {
            const int32_t nh = g - h0 < 16 ? g - h0 : 16;
            float *sh = st + (int64_t)h0 * (n + 1), sums[16];
            s->kern->softmax(sh, n, nh, n + 1, sums);
            for (int32_t h = 0; h < nh; h++)
                sh[(int64_t)h * (n + 1) + n] = sums[h] > 0.0f ? 0.0f : 1.0f;
        }
        memset(s->att + (int64_t)i * Q + (int64_t)kvh * g * hd, 0,
               (size_t)g * (size_t)hd * sizeof(float));
    }
    for (int32_t a = 0; a < P; a += chunk)
        attn_run(s, f, 1, i0, i0, i1, kvh, sc, V, a, P - a < chunk ? P : a + chunk, a);
    for (int32_t i = i0; i < i1; i++) {
        attn_own(s, f, 1, i0, i, kvh, sc, V, P);
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
    int64_t gi = 0;
    for (int32_t i = 0, i1; i < j->f->n && gi * nkv < e; i = i1, gi++) {
        i1 = attn_group_end(j->f, i);
        for (int32_t h = 0; h < nkv; h++)
            if (gi * nkv + h >= b && gi * nkv + h < e)
                attn_tokens(s, j->f, j->layer, i, i1, h, sc);
    }
}

static st_status check_fwd(const st_session *s, const st_fwd *f) {
    const st_model_hparams *hp = &s->m->hp;
    if (f->n < 1 || f->n > s->p.n_batch)
        return st_fail(ST_ERR_INVALID, "forward: %d tokens (must be 1..%d)", f->n, s->p.n_batch);
    if (f->logits_from < 0 || f->logits_from > f->n)
        return st_fail(ST_ERR_INVALID, "forward: logits_from %d out of range", f->logits_from);
    for (int32_t i = 0; i < f->n; i++) {
        if (f->tokens[i] < 0 || f->tokens[i] >= hp->n_vocab)
            return st_fail(ST_ERR_INVALID, "token id %d out of range [0, %d)", f->tokens[i],
                           hp->n_vocab);
        if (f->seq[i] < 0 || f->seq[i] >= s->p.n_seq)
            return st_fail(ST_ERR_INVALID, "sequence %d out of range [0, %d)", f->seq[i],
                           s->p.n_seq);
        if (f->pos[i] < 0 || f->pos[i] >= s->p.n_ctx || f->kv_row[i] < 0 ||
            f->kv_row[i] >= s->p.n_ctx)
            return st_fail(ST_ERR_RANGE, "position %d / KV row %d outside the context of %d",
                           f->pos[i], f->kv_row[i], s->p.n_ctx);
        int32_t ne = f->extra_off ? f->extra_off[i + 1] - f->extra_off[i] : 0;
        if (f->n_prefix[i] < 0 || f->n_prefix[i] > s->p.n_ctx || ne < 0 ||
            ne > s->p.n_ctx - f->n_prefix[i])
            return st_fail(ST_ERR_RANGE,
                           "token %d: %d prefix keys + %d extra keys exceed the "
                           "context of %d",
                           i, f->n_prefix[i], ne, s->p.n_ctx);
        for (int32_t e = 0; e < ne; e++) {
            int32_t r = f->extra_rows[f->extra_off[i] + e];
            if (r < 0 || r >= s->p.n_ctx)
                return st_fail(ST_ERR_RANGE, "token %d: key row %d outside the context", i, r);
        }
    }
    return ST_OK;
}

st_status st_forward(st_session *s, const st_fwd *f) {
    st_status st = check_fwd(s, f);
    if (st)
        return st;
    const st_model *m = s->m;
    const st_model_hparams *hp = &m->hp;
    const st_kernels *k = s->kern;
    const int64_t E = hp->n_embd, hd = hp->head_dim, Q = (int64_t)hp->n_head * hd,
                  KV = (int64_t)hp->n_head_kv * hd, F = hp->n_ff, T = f->n;
    const int32_t nrot2 = hp->n_rot / 2;
    for (int64_t i = 0; i < T; i++)
        st_dequant_row(m->tok_embd.type,
                       (const char *)m->tok_embd.data +
                           (size_t)f->tokens[i] * m->tok_embd.row_bytes,
                       s->x + i * E, E);
    int64_t attn_macs = 0; /* scores and values: 2 x keys x n_head x head_dim */
    for (int32_t i = 0; i < T; i++)
        attn_macs += 2 * (int64_t)tok_n(f, i) * hp->n_head * hd;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const st_layer *L = &m->layers[l];
        for (int64_t i = 0; i < T; i++)
            rmsnorm(k, s->xb + i * E, s->x + i * E, L->attn_norm, E, hp->rms_eps);
        const st_wt *wqkv[3] = {&L->wq, &L->wk, &L->wv};
        float *yqkv[3] = {s->q, s->kt, s->vt};
        matmuls(s, 3, wqkv, yqkv, s->xb, T);
        for (int64_t i = 0; i < T; i++) {
            const float *cs = s->rope_cos + (int64_t)f->pos[i] * nrot2;
            const float *sn = s->rope_sin + (int64_t)f->pos[i] * nrot2;
            rope(s->q + i * Q, hp->n_head, (int32_t)hd, hp->n_rot, cs, sn);
            rope(s->kt + i * KV, hp->n_head_kv, (int32_t)hd, hp->n_rot, cs, sn);
            memcpy(st_kv_k(s, f->seq[i], l) + (int64_t)f->kv_row[i] * KV, s->kt + i * KV,
                   (size_t)KV * sizeof(float));
            memcpy(st_kv_v(s, f->seq[i], l) + (int64_t)f->kv_row[i] * KV, s->vt + i * KV,
                   (size_t)KV * sizeof(float));
        }
        attn_job aj = {s, f, l};
        if (attn_macs < ST_MIN_PARALLEL_MACS)
            attn_task(&aj, 0, 1);
        else
            st_pool_run(s->pool, attn_task, &aj);
        matmul1(s, &L->wo, s->tmp, s->att, T);
        for (int64_t i = 0; i < T * E; i++)
            s->x[i] += s->tmp[i];
        for (int64_t i = 0; i < T; i++)
            rmsnorm(k, s->xb + i * E, s->x + i * E, L->ffn_norm, E, hp->rms_eps);
        const st_wt *wgu[2] = {&L->w_gate, &L->w_up};
        float *ygu[2] = {s->hb, s->hb2};
        matmuls(s, 2, wgu, ygu, s->xb, T);
        k->silu_mul(s->hb, s->hb2, T * F);
        matmul1(s, &L->w_down, s->tmp, s->hb, T);
        for (int64_t i = 0; i < T * E; i++)
            s->x[i] += s->tmp[i];
    }
    int64_t n_out = T - f->logits_from;
    s->n_deferred = 0;
    if (f->hidden || (f->logits && n_out > 0) || f->defer_logits) {
        for (int64_t i = 0; i < T; i++)
            rmsnorm(k, s->xb + i * E, s->x + i * E, m->out_norm, E, hp->rms_eps);
        if (f->hidden)
            memcpy(f->hidden, s->xb, (size_t)(T * E) * sizeof(float));
        if (f->logits && n_out > 0)
            matmul1(s, &m->output, f->logits, s->xb + f->logits_from * E, n_out);
        else if (f->defer_logits)
            s->n_deferred = (int32_t)T;
    }
    return ST_OK;
}

st_status st_session_logits(st_session *s, int64_t i, float *logits) {
    if (!s || !logits)
        return st_fail(ST_ERR_INVALID, "logits: NULL argument");
    if (i < 0 || i >= s->n_deferred)
        return st_fail(ST_ERR_INVALID,
                       "logits: node %lld is not one of the %d nodes of the last deferred "
                       "verify",
                       (long long)i, s->n_deferred);
    /* one row of the output layer: the same canonical reductions as a batch (invariant 1) */
    matmul1(s, &s->m->output, logits, s->xb + i * s->m->hp.n_embd, 1);
    return ST_OK;
}

st_status st_session_eval(st_session *s, int32_t seq, const int32_t *tokens, int32_t n,
                          float *logits, int32_t n_logits) {
    if (!s || !tokens || n < 1)
        return st_fail(ST_ERR_INVALID, "eval: need at least one token");
    if (seq < 0 || seq >= s->p.n_seq)
        return st_fail(ST_ERR_INVALID, "eval: sequence %d out of range [0, %d)", seq, s->p.n_seq);
    if (logits && (n_logits < 1 || n_logits > n))
        return st_fail(ST_ERR_INVALID, "eval: n_logits %d must be in [1, %d]", n_logits, n);
    if (!logits)
        n_logits = 0;
    int32_t L = s->seq_len[seq];
    if (n > s->p.n_ctx - L)
        return st_fail(ST_ERR_RANGE, "context full: %d positions used, %d more requested, n_ctx %d",
                       L, n, s->p.n_ctx);
    int32_t V = s->m->hp.n_vocab;
    for (int32_t done = 0; done < n;) {
        int32_t c = n - done < s->p.n_batch ? n - done : s->p.n_batch;
        for (int32_t i = 0; i < c; i++) {
            s->b_pos[i] = L + done + i;
            s->b_row[i] = L + done + i;
            s->b_seq[i] = seq;
            s->b_prefix[i] = L + done + i + 1;
        }
        /* logits wanted for tokens [n - n_logits, n) */
        int32_t first = n - n_logits; /* global index of first token with logits */
        int32_t from = first - done;
        if (from < 0)
            from = 0;
        if (from > c)
            from = c;
        st_fwd f = {.n = c,
                    .tokens = tokens + done,
                    .pos = s->b_pos,
                    .seq = s->b_seq,
                    .kv_row = s->b_row,
                    .n_prefix = s->b_prefix,
                    .logits_from = from,
                    .logits = logits ? logits + (int64_t)(done + from - first) * V : NULL};
        st_status st = st_forward(s, &f);
        if (st)
            return st;
        done += c;
        s->seq_len[seq] = L + done;
    }
    return ST_OK;
}
