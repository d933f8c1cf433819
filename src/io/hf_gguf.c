/*
 * hf_gguf.c: a Hugging Face Llama-family checkpoint (LlamaForCausalLM and its relatives:
 * model_type llama or mistral) as a GGUF writer with llama.cpp's names and keys (hf.h). The
 * hyper-parameters come from config.json with transformers' defaults; every tensor the
 * architecture has is checked for presence, dtype and shape against them, and any other tensor
 * is an error (rotary_emb.inv_freq tables excepted: recomputed, not read).
 */
#define _POSIX_C_SOURCE 200809L
#include "io/hf.h"
#include "io/safetensors.h"

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct hf_hp {
    int32_t n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx;
    double eps, theta;
    bool tied, qwen2;
    int64_t bos, eos;
    float *rope_factors; /* (head_dim/2) Llama 3 rope scaling, or NULL */
} hf_hp;

/* An integer field in [lo, hi] (def when absent and optional). */
static st_status cfg_int(const st_hf_config *c, const char *path, const char *key, int optional,
                         int64_t def, int64_t lo, int64_t hi, int32_t *out) {
    int64_t v = def;
    if (!optional || st_hf_config_has(c, key)) {
        st_status s = st_hf_config_get_int(c, key, &v);
        if (s)
            return s;
    }
    if (v < lo || v > hi)
        return st_fail(ST_ERR_FORMAT,
                       "%s: field \"%s\" = %" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]",
                       path, key, v, lo, hi);
    *out = (int32_t)v;
    return ST_OK;
}

/* "rope_scaling": "default" is none; "llama3" gives each frequency's divisor, as
 * transformers' _compute_llama3_parameters and llama.cpp's rope_freqs.weight have it:
 * wavelengths under original_max_position_embeddings / high_freq_factor keep their frequency,
 * those over it / low_freq_factor are divided by factor, those between are interpolated. */
static st_status rope_scaling(const st_hf_config *c, const char *path, hf_hp *hp) {
    const char *ty = NULL;
    const char *tkey = st_hf_config_has(c, "rope_scaling.rope_type") ? "rope_scaling.rope_type"
                                                                     : "rope_scaling.type";
    st_status s = st_hf_config_get_str(c, tkey, &ty);
    if (s)
        return s;
    if (strcmp(ty, "default") == 0)
        return ST_OK;
    if (strcmp(ty, "llama3") != 0)
        return st_fail(ST_ERR_UNSUPPORTED,
                       "%s: field \"%s\" = \"%.32s\" is not supported (llama3, default)", path,
                       tkey, ty);
    double factor, lo, hi, orig;
    if ((s = st_hf_config_get_float(c, "rope_scaling.factor", &factor)) ||
        (s = st_hf_config_get_float(c, "rope_scaling.low_freq_factor", &lo)) ||
        (s = st_hf_config_get_float(c, "rope_scaling.high_freq_factor", &hi)) ||
        (s = st_hf_config_get_float(c, "rope_scaling.original_max_position_embeddings", &orig)))
        return s;
    if (!(factor >= 1.0 && factor < 1e6) || !(lo > 0.0) || !(hi > lo) || !(orig >= 1.0))
        return st_fail(ST_ERR_FORMAT,
                       "%s: field \"rope_scaling\": factor %g, low_freq_factor %g, "
                       "high_freq_factor %g or original_max_position_embeddings %g is invalid",
                       path, factor, lo, hi, orig);
    const int32_t n = hp->head_dim / 2;
    if (!(hp->rope_factors = st_malloc((size_t)n * sizeof(float))))
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
    const double pi = 3.14159265358979323846;
    for (int32_t j = 0; j < n; j++) {
        const double freq = pow(hp->theta, -2.0 * j / hp->head_dim), wavelen = 2.0 * pi / freq;
        double f = 1.0;
        if (wavelen > orig / lo) {
            f = factor;
        } else if (wavelen >= orig / hi) {
            const double smooth = (orig / wavelen - lo) / (hi - lo);
            f = 1.0 / ((1.0 - smooth) / factor + smooth);
        }
        hp->rope_factors[j] = (float)f;
    }
    return ST_OK;
}

static st_status read_config(const char *dir, hf_hp *hp) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    st_hf_config *c = NULL;
    st_status s = st_hf_config_open(path, &c);
    if (s)
        return s;
    const int32_t big = 1 << 24;
    static const char *const types[] = {"llama", "mistral", "qwen2"};
    static const char *const acts[] = {"silu"};
    if ((s = st_hf_config_has(c, "model_type")
                 ? st_hf_config_str_in(c, path, "model_type", types, 3)
                 : st_fail(ST_ERR_FORMAT, "%s: missing field \"model_type\"", path)) ||
        (s = st_hf_config_str_in(c, path, "hidden_act", acts, 1)) ||
        (s = cfg_int(c, path, "hidden_size", 0, 0, 1, big, &hp->n_embd)) ||
        (s = cfg_int(c, path, "num_hidden_layers", 0, 0, 1, 4096, &hp->n_layer)) ||
        (s = cfg_int(c, path, "intermediate_size", 0, 0, 1, big, &hp->n_ff)) ||
        (s = cfg_int(c, path, "num_attention_heads", 0, 0, 1, 4096, &hp->n_head)) ||
        (s = cfg_int(c, path, "num_key_value_heads", 1, hp->n_head, 1, hp->n_head,
                     &hp->n_head_kv)) ||
        (s = cfg_int(c, path, "head_dim", 1, hp->n_embd / hp->n_head, 0, 65536, &hp->head_dim)) ||
        (s = cfg_int(c, path, "vocab_size", 0, 0, 1, big, &hp->n_vocab)) ||
        (s = cfg_int(c, path, "max_position_embeddings", 0, 0, 1, big, &hp->n_ctx)))
        goto done;
    if ((s = st_hf_config_check_heads(c, path, hp->n_embd, hp->n_head, hp->n_head_kv,
                                      hp->head_dim)))
        goto done;
    /* Mistral's sliding window: attention over the whole context equals it only up to the
     * window, so the context is capped there. */
    const char *mt = "";
    st_hf_config_get_str(c, "model_type", &mt);
    hp->qwen2 = strcmp(mt, "qwen2") == 0;
    bool sliding = !hp->qwen2; /* Qwen2 slides only with "use_sliding_window": true */
    if (hp->qwen2 && st_hf_config_has(c, "use_sliding_window") &&
        (s = st_hf_config_get_bool(c, "use_sliding_window", &sliding)))
        goto done;
    if (sliding && st_hf_config_has(c, "sliding_window")) {
        int32_t win;
        if ((s = cfg_int(c, path, "sliding_window", 0, 0, 1, big, &win)))
            goto done;
        if (win < hp->n_ctx)
            hp->n_ctx = win;
    }
    static const char *const no_bias[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++) {
        bool b = false;
        if (st_hf_config_has(c, no_bias[i]) &&
            ((s = st_hf_config_get_bool(c, no_bias[i], &b)) ||
             (b && (s = st_fail(ST_ERR_UNSUPPORTED, "%s: field \"%s\" = true is not supported",
                                path, no_bias[i])))))
            goto done;
    }
    hp->eps = 1e-6;
    hp->theta = 10000.0;
    hp->tied = false; /* LlamaConfig's defaults */
    if ((st_hf_config_has(c, "rms_norm_eps") &&
         (s = st_hf_config_get_float(c, "rms_norm_eps", &hp->eps))) ||
        (st_hf_config_has(c, "rope_theta") &&
         (s = st_hf_config_get_float(c, "rope_theta", &hp->theta))) ||
        (st_hf_config_has(c, "tie_word_embeddings") &&
         (s = st_hf_config_get_bool(c, "tie_word_embeddings", &hp->tied))))
        goto done;
    if (!(hp->eps >= 0.0 && hp->eps < 1.0)) {
        s = st_fail(ST_ERR_FORMAT, "%s: field \"rms_norm_eps\" = %g is invalid", path, hp->eps);
        goto done;
    }
    if (!(hp->theta > 1.0 && hp->theta < 1e30)) {
        s = st_fail(ST_ERR_FORMAT, "%s: field \"rope_theta\" = %g is invalid", path, hp->theta);
        goto done;
    }
    if (st_hf_config_has(c, "rope_scaling") && (s = rope_scaling(c, path, hp)))
        goto done;
    int64_t ids[8], n = 0;
    hp->bos = hp->eos = -1;
    if (st_hf_config_has(c, "bos_token_id") &&
        !(s = st_hf_config_get_ints(c, "bos_token_id", ids, 8, &n)) && n > 0)
        hp->bos = ids[0];
    if (!s && st_hf_config_has(c, "eos_token_id") &&
        !(s = st_hf_config_get_ints(c, "eos_token_id", ids, 8, &n)) && n > 0)
        hp->eos = ids[0];
done:
    st_hf_config_free(c);
    return s;
}

static void shape_str(const st_sf_tensor *t, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < t->n_dims && i < 4 && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", t->shape[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "%s]", t->n_dims > 4 ? ", ..." : "");
}

/* The tensor `name` of shape [rows, cols] (cols 0: a vector of rows), checked. */
static st_status get_tensor(const st_safetensors *sf, const char *name, int64_t rows, int64_t cols,
                            const st_sf_tensor **out, st_dtype *dt) {
    st_status s = st_safetensors_get(sf, name, out);
    if (s)
        return s;
    const st_sf_tensor *t = *out;
    if ((s = st_sf_tensor_dtype(t, dt)))
        return s;
    const int32_t nd = cols ? 2 : 1;
    if (t->n_dims != nd || t->shape[0] != rows || (nd == 2 && t->shape[1] != cols)) {
        char got[128];
        shape_str(t, got, sizeof got);
        if (nd == 2)
            return st_fail(ST_ERR_FORMAT,
                           "%s: tensor '%s' has shape %s, expected [%" PRId64 ", %" PRId64
                           "] from config.json",
                           t->file, name, got, rows, cols);
        return st_fail(ST_ERR_FORMAT,
                       "%s: tensor '%s' has shape %s, expected [%" PRId64 "] from config.json",
                       t->file, name, got, rows);
    }
    return ST_OK;
}

static int is_kquant(int type) { return type >= ST_DTYPE_Q2_K && type <= ST_DTYPE_Q6_K; }

uint32_t st_convert_matrix_type(int wtype, const char *name, int64_t n_in, int64_t n_layer,
                                int64_t n_gqa, int tied, uint32_t src) {
    if (wtype == ST_HF_KEEP)
        return src;
    if (wtype > ST_HF_MIX) /* llama-quantize's choice for this tensor */
        return st_kquant_tensor_type((uint32_t)(wtype - ST_HF_MIX), name, n_in, n_layer, n_gqa,
                                     tied);
    if (is_kquant(wtype))
        return st_kquant_fit_type((uint32_t)wtype, n_in);
    if ((wtype == ST_DTYPE_Q8_0 || wtype == ST_DTYPE_Q4_0) && n_in % 32 != 0)
        return ST_DTYPE_F16; /* rows the 32-element blocks do not tile */
    return (uint32_t)wtype;
}

int st_convert_type_valid(int wtype) {
    return wtype == ST_HF_KEEP || wtype == ST_DTYPE_F32 || wtype == ST_DTYPE_F16 ||
           wtype == ST_DTYPE_BF16 || wtype == ST_DTYPE_Q8_0 || wtype == ST_DTYPE_Q4_0 ||
           is_kquant(wtype) ||
           (wtype > ST_HF_MIX && st_kquant_ftype_name((uint32_t)(wtype - ST_HF_MIX)) != NULL);
}

uint32_t st_convert_file_type(int wtype) {
    /* a single K-quant type as the mix closest to it, as spectree-mkmodel labels it */
    static const uint32_t kq_ftype[] = {ST_FTYPE_Q2_K, ST_FTYPE_Q3_K_S, ST_FTYPE_Q4_K_S,
                                        ST_FTYPE_Q5_K_S, ST_FTYPE_Q6_K};
    if (wtype > ST_HF_MIX)
        return (uint32_t)(wtype - ST_HF_MIX);
    if (is_kquant(wtype))
        return kq_ftype[wtype - ST_DTYPE_Q2_K];
    switch (wtype) {
    case ST_DTYPE_F16:
        return 1;
    case ST_DTYPE_Q4_0:
        return 2;
    case ST_DTYPE_Q8_0:
        return 7;
    case ST_DTYPE_BF16:
        return 32;
    default:
        return 0;
    }
}

/* Adds HF tensor `hf` as GGUF tensor `gg`: rows x cols (cols 0: a vector, written F32), type
 * st_convert_matrix_type, q/k rows permuted when rope_heads > 0. */
static st_status add_tensor(st_gguf_writer *w, const st_safetensors *sf, const hf_hp *hp,
                            const char *hf, const char *gg, int64_t rows, int64_t cols,
                            int32_t rope_heads, int wtype) {
    const st_sf_tensor *t;
    st_dtype src;
    st_status s = get_tensor(sf, hf, rows, cols, &t, &src);
    if (s)
        return s;
    const int64_t n_in = cols ? cols : rows, n_rows = cols ? rows : 1;
    const uint32_t dst = cols ? st_convert_matrix_type(wtype, gg, n_in, hp->n_layer,
                                                       hp->n_head / hp->n_head_kv, hp->tied, src)
                              : ST_DTYPE_F32;
    int64_t ne[2] = {n_in, n_rows};
    size_t dst_row;
    if ((s = st_gguf_tensor_bytes(dst, 1, ne, &dst_row)))
        return s;
    const size_t src_row = t->size / (size_t)n_rows;
    char *out = st_malloc(dst_row * (size_t)n_rows);
    float *f = st_malloc((size_t)n_in * sizeof(float) + src_row);
    if (!out || !f) {
        st_free(out);
        st_free(f);
        return st_fail(ST_ERR_NOMEM, "%s: out of memory converting '%s'", t->file, hf);
    }
    char *raw = (char *)(f + n_in); /* the source row, aligned (safetensors data may not be) */
    const int64_t hd = rope_heads ? rows / rope_heads : 0;
    if (!cols) { /* a vector, written F32; a q/k bias is permuted like the rows it adds to */
        memcpy(raw, t->data, src_row);
        if ((s = st_dequantize_row(src, raw, n_in, f)))
            s = st_fail(ST_ERR_FORMAT, "%s: tensor '%s': %s", t->file, hf, st_last_error());
        for (int64_t r = 0; r < n_in && !s; r++)
            ((float *)out)[r] = f[rope_heads ? r / hd * hd + (r % 2) * (hd / 2) + (r % hd) / 2 : r];
    }
    for (int64_t r = 0; r < n_rows && cols && !s; r++) {
        /* GGUF row r of head h = h*hd + 2j + t takes HF row h*hd + t*hd/2 + j */
        int64_t from = r;
        if (rope_heads) {
            const int64_t h = r / hd, j = (r % hd) / 2, half = r % 2;
            from = h * hd + half * (hd / 2) + j;
        }
        memcpy(raw, (const char *)t->data + (size_t)from * src_row, src_row);
        if (dst == (uint32_t)src) {
            memcpy(out + (size_t)r * dst_row, raw, src_row);
            continue;
        }
        if ((s = st_dequantize_row(src, raw, n_in, f)) ||
            (s = st_quantize_row(dst, f, n_in, out + (size_t)r * dst_row)))
            s = st_fail(ST_ERR_FORMAT, "%s: tensor '%s' row %" PRId64 ": %s", t->file, hf, from,
                        st_last_error());
    }
    if (!s)
        s = st_gguf_writer_add_tensor(w, gg, dst, cols ? 2 : 1, ne, out, dst_row * (size_t)n_rows,
                                      ST_GGUF_COPY);
    st_free(out);
    st_free(f);
    return s;
}

/* Every tensor of the checkpoint must be one the architecture reads. */
static st_status check_names(const st_safetensors *sf, const hf_hp *hp) {
    static const char *const per_layer[] = {
        "input_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "post_attention_layernorm.weight",
        "mlp.down_proj.weight",
        "self_attn.rotary_emb.inv_freq",
        /* Qwen2 only: */
        "self_attn.q_proj.bias",
        "self_attn.k_proj.bias",
        "self_attn.v_proj.bias",
    };
    for (int64_t i = 0; i < st_safetensors_n_tensors(sf); i++) {
        const st_sf_tensor *t = st_safetensors_tensor_at(sf, i);
        const char *n = t->name;
        if (strcmp(n, "model.embed_tokens.weight") == 0 || strcmp(n, "model.norm.weight") == 0 ||
            strcmp(n, "lm_head.weight") == 0)
            continue;
        int layer = -1, used = 0;
        if (sscanf(n, "model.layers.%d.%n", &layer, &used) == 1 && used > 0 && layer >= 0 &&
            layer < hp->n_layer) {
            int known = 0;
            const size_t n_known = sizeof per_layer / sizeof per_layer[0] - (hp->qwen2 ? 0 : 3);
            for (size_t k = 0; k < n_known && !known; k++)
                known = strcmp(n + used, per_layer[k]) == 0;
            if (known)
                continue;
        }
        return st_fail(ST_ERR_FORMAT,
                       "%s: unexpected tensor '%s' (not part of a %d-layer %s checkpoint)", t->file,
                       n, hp->n_layer, hp->qwen2 ? "qwen2" : "llama");
    }
    return ST_OK;
}

static st_status add_hparams(st_gguf_writer *w, const char *dir, const hf_hp *hp, int wtype) {
    const char *base = strrchr(dir, '/');
    base = base && base[1] ? base + 1 : dir;
    const uint32_t ft = st_convert_file_type(wtype);
    const char *arch = hp->qwen2 ? "qwen2" : "llama";
    char k[12][64];
    static const char *const suf[12] = {"context_length",
                                        "embedding_length",
                                        "block_count",
                                        "feed_forward_length",
                                        "rope.dimension_count",
                                        "attention.head_count",
                                        "attention.head_count_kv",
                                        "attention.layer_norm_rms_epsilon",
                                        "rope.freq_base",
                                        "vocab_size",
                                        "attention.key_length",
                                        "attention.value_length"};
    for (int i = 0; i < 12; i++)
        snprintf(k[i], sizeof k[i], "%s.%s", arch, suf[i]);
    st_status s;
    if ((s = st_gguf_writer_add_str(w, "general.architecture", arch)) ||
        (s = st_gguf_writer_add_str(w, "general.name", base)) ||
        (wtype != ST_HF_KEEP && (s = st_gguf_writer_add_u32(w, "general.file_type", ft))) ||
        (s = st_gguf_writer_add_u32(w, k[0], (uint32_t)hp->n_ctx)) ||
        (s = st_gguf_writer_add_u32(w, k[1], (uint32_t)hp->n_embd)) ||
        (s = st_gguf_writer_add_u32(w, k[2], (uint32_t)hp->n_layer)) ||
        (s = st_gguf_writer_add_u32(w, k[3], (uint32_t)hp->n_ff)) ||
        (s = st_gguf_writer_add_u32(w, k[4], (uint32_t)hp->head_dim)) ||
        (s = st_gguf_writer_add_u32(w, k[5], (uint32_t)hp->n_head)) ||
        (s = st_gguf_writer_add_u32(w, k[6], (uint32_t)hp->n_head_kv)) ||
        (s = st_gguf_writer_add_f32(w, k[7], (float)hp->eps)) ||
        (s = st_gguf_writer_add_f32(w, k[8], (float)hp->theta)) ||
        (s = st_gguf_writer_add_u32(w, k[9], (uint32_t)hp->n_vocab)))
        return s;
    if (hp->head_dim != hp->n_embd / hp->n_head &&
        ((s = st_gguf_writer_add_u32(w, k[10], (uint32_t)hp->head_dim)) ||
         (s = st_gguf_writer_add_u32(w, k[11], (uint32_t)hp->head_dim))))
        return s;
    return ST_OK;
}

st_status st_hf_to_gguf(const char *dir, int wtype, st_gguf_writer **out) {
    if (!dir || !out)
        return st_fail(ST_ERR_INVALID, "st_hf_to_gguf: NULL argument");
    *out = NULL;
    if (!st_convert_type_valid(wtype))
        return st_fail(ST_ERR_INVALID, "st_hf_to_gguf: unsupported output type %d", wtype);
    hf_hp hp = {0};
    st_safetensors *sf = NULL;
    st_gguf_writer *w = NULL;
    st_status s = read_config(dir, &hp);
    if (s || (s = st_safetensors_open(dir, &sf)) || (s = check_names(sf, &hp)) ||
        (s = st_gguf_writer_create(&w)) || (s = add_hparams(w, dir, &hp, wtype)) ||
        (s = st_hf_tokenizer_to_gguf(dir, w, hp.bos, hp.eos)))
        goto fail;
    const int64_t E = hp.n_embd, Q = (int64_t)hp.n_head * hp.head_dim,
                  KV = (int64_t)hp.n_head_kv * hp.head_dim, F = hp.n_ff, V = hp.n_vocab;
    /* tied weights saved once (safetensors keeps one name of shared tensors): the embedding
     * may be stored as lm_head.weight only */
    const char *embd = hp.tied && !st_safetensors_find(sf, "model.embed_tokens.weight") &&
                               st_safetensors_find(sf, "lm_head.weight")
                           ? "lm_head.weight"
                           : "model.embed_tokens.weight";
    if ((s = add_tensor(w, sf, &hp, embd, "token_embd.weight", V, E, 0, wtype)) ||
        (s = add_tensor(w, sf, &hp, "model.norm.weight", "output_norm.weight", E, 0, 0, wtype)))
        goto fail;
    if (!hp.tied && (s = add_tensor(w, sf, &hp, "lm_head.weight", "output.weight", V, E, 0, wtype)))
        goto fail;
    for (int32_t l = 0; l < hp.n_layer; l++) {
        static const struct {
            const char *hf, *gg;
            int rows, cols, rope; /* 0 E, 1 Q, 2 KV, 3 F; rope: 1 q heads, 2 kv heads */
        } lt[] = {
            {"input_layernorm.weight", "attn_norm.weight", 0, -1, 0},
            {"self_attn.q_proj.weight", "attn_q.weight", 1, 0, 1},
            {"self_attn.k_proj.weight", "attn_k.weight", 2, 0, 2},
            {"self_attn.v_proj.weight", "attn_v.weight", 2, 0, 0},
            {"self_attn.o_proj.weight", "attn_output.weight", 0, 1, 0},
            {"post_attention_layernorm.weight", "ffn_norm.weight", 0, -1, 0},
            {"mlp.gate_proj.weight", "ffn_gate.weight", 3, 0, 0},
            {"mlp.up_proj.weight", "ffn_up.weight", 3, 0, 0},
            {"mlp.down_proj.weight", "ffn_down.weight", 0, 3, 0},
            {"self_attn.q_proj.bias", "attn_q.bias", 1, -1, 1},
            {"self_attn.k_proj.bias", "attn_k.bias", 2, -1, 2},
            {"self_attn.v_proj.bias", "attn_v.bias", 2, -1, 0},
        };
        const int64_t dims[4] = {E, Q, KV, F};
        const size_t n_lt = sizeof lt / sizeof lt[0] - (hp.qwen2 ? 0 : 3); /* biases: Qwen2 */
        for (size_t k = 0; k < n_lt; k++) {
            char hn[128], gn[64];
            snprintf(hn, sizeof hn, "model.layers.%d.%s", (int)l, lt[k].hf);
            snprintf(gn, sizeof gn, "blk.%d.%s", (int)l, lt[k].gg);
            const int32_t heads = lt[k].rope == 1 ? hp.n_head : lt[k].rope == 2 ? hp.n_head_kv : 0;
            if ((s = add_tensor(w, sf, &hp, hn, gn, dims[lt[k].rows],
                                lt[k].cols < 0 ? 0 : dims[lt[k].cols], heads, wtype)))
                goto fail;
        }
    }
    if (hp.rope_factors) {
        const int64_t ne[1] = {hp.head_dim / 2};
        if ((s = st_gguf_writer_add_tensor(w, "rope_freqs.weight", ST_DTYPE_F32, 1, ne,
                                           hp.rope_factors, (size_t)ne[0] * sizeof(float),
                                           ST_GGUF_COPY)))
            goto fail;
    }
    st_free(hp.rope_factors);
    st_safetensors_free(sf);
    *out = w;
    return ST_OK;
fail:
    st_free(hp.rope_factors);
    st_safetensors_free(sf);
    st_gguf_writer_free(w);
    return s;
}

/* The name of the checkpoint's file (or "the checkpoint directory") that path is, through any
 * link, in buf; NULL when path is none of them or does not exist. */
static const char *input_named(const char *dir, const char *path, char *buf, size_t cap) {
    struct stat so, si;
    if (stat(path, &so) != 0)
        return NULL;
    if (stat(dir, &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
        return "the checkpoint directory";
    DIR *d = opendir(dir);
    const char *hit = NULL;
    for (struct dirent *e; d && !hit && (e = readdir(d));) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        if (stat(full, &si) == 0 && S_ISREG(si.st_mode) && si.st_dev == so.st_dev &&
            si.st_ino == so.st_ino) {
            snprintf(buf, cap, "the checkpoint's %s", e->d_name);
            hit = buf;
        }
    }
    if (d)
        closedir(d);
    return hit;
}

st_status st_convert_hf(const char *dir, const char *out_path, int type) {
    return st_convert_hf_ex(dir, out_path, type, NULL, NULL);
}

st_status st_convert_hf_ex(const char *dir, const char *out_path, int type,
                           st_convert_progress_fn progress, void *user) {
    if (!dir || !out_path)
        return st_fail(ST_ERR_INVALID, "st_convert_hf: NULL argument");
    char name[512];
    const char *in = input_named(dir, out_path, name, sizeof name);
    if (in)
        return st_fail(ST_ERR_INVALID, "%s: the output is %s; write the GGUF file elsewhere",
                       out_path, in);
    st_gguf_writer *w;
    st_status s = st_hf_to_gguf(dir, type, &w);
    if (s)
        return s;
    s = st_gguf_writer_write_file_ex(w, out_path, progress, user);
    st_gguf_writer_free(w);
    return s;
}
