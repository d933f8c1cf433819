/*
 * llama.c: building a model over an opened GGUF: every tensor's presence, type and shape is
 * checked, the weights are used where the file's bytes are (mapped or copied, load.c; small F32
 * models also get a packed copy, see model.h), and the hyper-parameters are read with their
 * defaults. The forward pass is in forward.c and attn.c,
 * the session that runs it in session.c and kv.c.
 */
#define _POSIX_C_SOURCE 200809L
#include "model/model.h"

#include "io/gguf_internal.h"
#include "io/hf.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
           t == ST_DTYPE_Q4_0 || st_kquant_block_bytes(t) != 0;
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
    /* a cheap check for a corrupt or badly converted file: the first values of the first row */
    float head[256];
    const int64_t nh = n_in < 256 ? n_in : 256;
    st_dequant_row(t->type, t->data, head, nh);
    const int64_t bad = st_first_non_finite(head, nh);
    if (bad >= 0)
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value (%g at [0, %lld])",
                       st_gguf_name(g), name, (double)head[bad], (long long)bad);
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
    const int64_t bad = st_first_non_finite(*out, n);
    if (bad >= 0)
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value (%g at [%lld])",
                       st_gguf_name(g), name, (double)(*out)[bad], (long long)bad);
    return ST_OK;
}

/* An optional bias vector (NULL when the file has none). */
static st_status get_bias(const st_gguf *g, const char *name, int64_t n, float **out) {
    *out = NULL;
    return st_gguf_tensor_find(g, name) ? get_vector(g, name, n, out) : ST_OK;
}

/* The architectures loaded: llama (Llama 1-3, Mistral, SmolLM) and qwen2 (the same layers with
 * q/k/v biases); their keys differ only in the prefix. */
static st_status load_hparams(const st_gguf *g, st_model_hparams *hp) {
    st_gguf_str arch;
    st_status s = st_gguf_get_str(g, "general.architecture", &arch);
    if (s)
        return s;
    const char *pfx = NULL;
    if (arch.len == 5 && memcmp(arch.ptr, "llama", 5) == 0)
        pfx = "llama";
    else if (arch.len == 5 && memcmp(arch.ptr, "qwen2", 5) == 0)
        pfx = "qwen2";
    if (!pfx)
        return st_fail(ST_ERR_UNSUPPORTED,
                       "%s: architecture '%.*s' is not supported (llama, qwen2)", st_gguf_name(g),
                       (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    char key[12][64]; /* the keys below with the architecture's prefix */
    static const char *const suf[12] = {"embedding_length",
                                        "block_count",
                                        "feed_forward_length",
                                        "attention.head_count",
                                        "attention.head_count_kv",
                                        "context_length",
                                        "attention.key_length",
                                        "attention.value_length",
                                        "rope.dimension_count",
                                        "rope.freq_base",
                                        "attention.layer_norm_rms_epsilon",
                                        "rope.scaling.type"};
    for (int i = 0; i < 12; i++)
        snprintf(key[i], sizeof key[i], "%s.%s", pfx, suf[i]);
    const int32_t big = 1 << 24;
    if ((s = get_hparam(g, key[0], 1, 0, 1, big, &hp->n_embd)) ||
        (s = get_hparam(g, key[1], 1, 0, 1, 4096, &hp->n_layer)) ||
        (s = get_hparam(g, key[2], 1, 0, 1, big, &hp->n_ff)) ||
        (s = get_hparam(g, key[3], 1, 0, 1, 4096, &hp->n_head)) ||
        (s = get_hparam(g, key[4], 0, hp->n_head, 1, hp->n_head, &hp->n_head_kv)) ||
        (s = get_hparam(g, key[5], 1, 0, 1, 1 << 24, &hp->n_ctx_train)))
        return s;
    if (hp->n_head % hp->n_head_kv != 0)
        return st_fail(ST_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d",
                       st_gguf_name(g), hp->n_head, hp->n_head_kv);
    int32_t def_hd = hp->n_embd / hp->n_head;
    if ((s = get_hparam(g, key[6], 0, def_hd, 1, 65536, &hp->head_dim)))
        return s;
    int32_t vlen;
    if ((s = get_hparam(g, key[7], 0, hp->head_dim, 1, 65536, &vlen)))
        return s;
    if (vlen != hp->head_dim)
        return st_fail(ST_ERR_UNSUPPORTED, "%s: value_length %d differs from key_length %d",
                       st_gguf_name(g), vlen, hp->head_dim);
    if ((s = get_hparam(g, key[8], 0, hp->head_dim, 2, hp->head_dim, &hp->n_rot)))
        return s;
    if (hp->n_rot % 2 != 0)
        return st_fail(ST_ERR_FORMAT, "%s: rope dimension count %d is odd", st_gguf_name(g),
                       hp->n_rot);
    hp->rope_base = 10000.0f;
    if (st_gguf_find(g, key[9]) >= 0 && (s = st_gguf_get_f32(g, key[9], &hp->rope_base)))
        return s;
    if (!(hp->rope_base > 1.0f) || !isfinite(hp->rope_base))
        return st_fail(ST_ERR_FORMAT, "%s: rope freq_base %g is invalid", st_gguf_name(g),
                       (double)hp->rope_base);
    if ((s = st_gguf_get_f32(g, key[10], &hp->rms_eps)))
        return s;
    if (!(hp->rms_eps >= 0.0f) || !(hp->rms_eps < 1.0f))
        return st_fail(ST_ERR_FORMAT, "%s: rms epsilon %g is invalid", st_gguf_name(g),
                       (double)hp->rms_eps);
    if (st_gguf_find(g, key[11]) >= 0) {
        st_gguf_str st;
        if ((s = st_gguf_get_str(g, key[11], &st)))
            return s;
        if (!(st.len == 4 && memcmp(st.ptr, "none", 4) == 0))
            return st_fail(ST_ERR_UNSUPPORTED, "%s: rope scaling '%.*s' is not supported yet",
                           st_gguf_name(g), (int)(st.len > 32 ? 32 : st.len), st.ptr);
    }
    return ST_OK;
}

/* The matrices the forward pass multiplies by (7 per layer: q, k, v, o, gate, up, down; then the
 * output), in order. */
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
        for (int64_t i = 0; i < n_mats(m); i++) {
            st_free_aligned(mat_at(m, i)->packed);
            st_free_aligned(mat_at(m, i)->q8p_own);
            st_free_aligned(mat_at(m, i)->kqp_own);
        }
        for (int32_t l = 0; l < m->hp.n_layer; l++) {
            st_free(m->layers[l].attn_norm);
            st_free(m->layers[l].ffn_norm);
            st_free(m->layers[l].bq);
            st_free(m->layers[l].bk);
            st_free(m->layers[l].bv);
        }
    }
    st_free(m->layers);
    st_free(m->out_norm);
    st_free(m->rope_factors);
    st_free_aligned(m->owned);
    st_free_aligned(m->owned_conv);
    st_free_aligned(m->fc.packed);
    st_tokenizer_free(m->tok);
    st_gguf_free(m->gguf);
    free(m->gguf_mem);
    st_free(m);
}

/* Packs the F32 matrices of a small model (ST_PACK_MAX_BYTES, model.h); a failed allocation
 * leaves the rest unpacked (the row-major kernels give the same results). */
static void pack_matrices(st_model *m) {
    if (!st_env_get().pack || !st_kernels_get()->matmul_f32_packed)
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

/* The table's matmul on weights of this type packed at load, or NULL (kernels.h, kquant.h). */
static st_matmul_q8p_fn packed_fn(uint32_t type) {
    const st_kernels *k = st_kernels_get();
    return type == ST_DTYPE_Q8_0   ? k->matmul_q8_0_packed
           : type == ST_DTYPE_Q4_0 ? k->matmul_q4_0_packed
           : type == ST_DTYPE_Q4_K ? k->matmul_q4_k_packed
           : type == ST_DTYPE_Q5_K ? k->matmul_q5_k_packed
           : type == ST_DTYPE_Q6_K ? k->matmul_q6_k_packed
                                   : NULL;
}

/* Packs the Q8_0, Q4_0, Q4_K, Q5_K and Q6_K matrices (not the embedding, nor a tied output
 * layer: their rows are read) for the table's packed matmuls, which need no horizontal
 * reductions (Q8_0 and Q4_0: st_pack_q8_0, st_pack_q4_0, kernels.h; the K-quants: st_pack_kq,
 * kquant.h): in place where the model holds
 * its own copy of the file (COPY loads), else into a copy, after which the file mapping's pages
 * of the matrix are dropped (their row-major bytes are not read again; the kernel would re-read
 * them if they were). A failed allocation leaves the rest row-major (same results). ST_PACK=0
 * turns it off. */
static void pack_quant(st_model *m) {
    if (!st_env_get().pack)
        return;
    const int kind = st_gguf_data_kind(m->gguf);
    for (int64_t i = 0; i < n_mats(m); i++) {
        st_wt *w = mat_at(m, i);
        const int q8 = w->type == ST_DTYPE_Q8_0 || w->type == ST_DTYPE_Q4_0; /* 16-row groups */
        if (!packed_fn(w->type) || w->n_out < (q8 ? ST_PACK_ROWS : ST_KQP_ROWS) || w->q8p ||
            w->kqp || (w == &m->output && m->hp.tied_output))
            continue;
        const size_t bytes = (size_t)w->n_out * w->row_bytes;
        void *dst = (void *)w->data;
        if (kind != 2 && !(dst = st_malloc_aligned(bytes, 64)))
            return;
        if (w->type == ST_DTYPE_Q8_0 ? st_pack_q8_0(dst, w->data, w->row_bytes, w->n_out, w->n_in)
            : w->type == ST_DTYPE_Q4_0
                ? st_pack_q4_0(dst, w->data, w->row_bytes, w->n_out, w->n_in)
                : st_pack_kq(w->type, dst, w->data, w->row_bytes, w->n_out, w->n_in)) {
            if (dst != w->data)
                st_free_aligned(dst);
            return;
        }
        if (kind == 1)
            st_mmap_drop(w->data, bytes);
        if (q8) {
            w->q8p = dst;
            w->q8p_own = dst != w->data ? dst : NULL;
        } else {
            w->kqp = dst;
            w->kqp_own = dst != w->data ? dst : NULL;
        }
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
            (s = get_bias(g, ST_NAME("attn_q.bias"), Q, &L->bq)) ||
            (s = get_bias(g, ST_NAME("attn_k.bias"), KV, &L->bk)) ||
            (s = get_bias(g, ST_NAME("attn_v.bias"), KV, &L->bv)))
            return s;
#undef ST_NAME
    }
    if (st_gguf_tensor_find(g, "rope_freqs.weight")) { /* Llama 3 rope scaling */
        if ((s = get_vector(g, "rope_freqs.weight", hp->n_rot / 2, &m->rope_factors)))
            return s;
        for (int32_t j = 0; j < hp->n_rot / 2; j++)
            if (!(m->rope_factors[j] > 0.0f))
                return st_fail(ST_ERR_FORMAT, "%s: rope_freqs.weight[%d] = %g is not positive",
                               path, (int)j, (double)m->rope_factors[j]);
    }
    hp->wtype = m->layers[0].wq.type;
    pack_matrices(m);
    pack_quant(m);
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
 * st_model_load_ex (load.c) and st_model_load_memory (load_memory.c). */
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

/* A Hugging Face checkpoint directory: its GGUF (hf.h) built in memory, then loaded like a file.
 * The buffer is the model's (gguf_mem). Called by st_model_load_ex (load.c) for a directory. */
st_status st_model_load_hf(const char *dir, st_model **out);
st_status st_model_load_hf(const char *dir, st_model **out) {
    st_gguf_writer *w = NULL;
    void *buf = NULL;
    size_t size = 0;
    st_status s = st_hf_to_gguf(dir, ST_HF_KEEP, &w);
    if (!s)
        s = st_gguf_writer_write_memory(w, &buf, &size);
    st_gguf_writer_free(w);
    if (s)
        return s;
    st_gguf *g;
    if ((s = st_gguf_open_memory(buf, size, dir, &g))) {
        free(buf);
        return s;
    }
    st_model *m = st_calloc(1, sizeof *m);
    if (!m) {
        st_gguf_free(g);
        free(buf);
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", dir);
    }
    m->gguf = g;
    m->gguf_mem = buf;
    if ((s = model_from_gguf(m))) {
        st_model_free(m);
        return s;
    }
    *out = m;
    return ST_OK;
}

const st_model_hparams *st_model_get_hparams(const st_model *m) { return &m->hp; }
const st_tokenizer *st_model_tokenizer(const st_model *m) { return m->tok; }

const st_gguf *st_model_gguf(const st_model *m) { return m->gguf; }

size_t st_model_weight_bytes(const st_model *m) {
    size_t total = (size_t)m->output.n_out * m->output.row_bytes +
                   (size_t)m->fc.n_out * m->fc.row_bytes; /* an EAGLE head's input projection */
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const st_layer *L = &m->layers[l];
        const st_wt *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            total += (size_t)w[i]->n_out * w[i]->row_bytes;
    }
    return total;
}
