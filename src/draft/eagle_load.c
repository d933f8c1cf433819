/*
 * eagle_load.c: an EAGLE-1/2 head as published (Li et al., EAGLE, 2024; FORMATS.md §d.1):
 * config.json and safetensors (one file or shards) become an st_model of one decoder layer with
 * an input projection over [embedding; feature], no input norm unless the checkpoint has one and
 * no final norm. The embedding (unless the checkpoint has its own) and the output layer are the
 * target's, borrowed. Every weight is copied into one 64-byte-aligned block (safetensors data
 * may be unaligned, and the files are closed after loading), with the q/k rows permuted from
 * Hugging Face's half-split RoPE layout to the adjacent pairs the forward pass rotates.
 */
#include "draft/drafter.h"
#include "draft/eagle_io.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

typedef st_head_tensor head_tensor;

enum {
    HT_EMBD,
    HT_FC,
    HT_FC_BIAS,
    HT_ATTN_NORM,
    HT_Q,
    HT_K,
    HT_V,
    HT_O,
    HT_FFN_NORM,
    HT_GATE,
    HT_UP,
    HT_DOWN,
    HT_N
};

/* The head's hyper-parameters from config.json, checked against the target. */
static st_status read_config(const char *dir, const st_model *target, st_model_hparams *hp,
                             bool *bias) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    st_hf_config *c = NULL;
    st_status st = st_hf_config_open(path, &c);
    if (st)
        return st;
    static const char *const acts[] = {"silu"}; /* the SwiGLU of forward.c */
    const int32_t big = 1 << 24;
    int32_t n_layer = 0, n_vocab = 0;
    if ((st = st_head_cfg_int(c, path, "hidden_size", 0, 0, 1, big, &hp->n_embd)) ||
        (st = st_head_cfg_int(c, path, "vocab_size", 0, 0, 1, big, &n_vocab)) ||
        (st = st_head_cfg_int(c, path, "num_hidden_layers", 0, 0, 1, 4096, &n_layer)) ||
        (st = st_head_cfg_int(c, path, "num_attention_heads", 0, 0, 1, 4096, &hp->n_head)) ||
        (st = st_head_cfg_int(c, path, "num_key_value_heads", 1, hp->n_head, 1, hp->n_head,
                              &hp->n_head_kv)) ||
        (st = st_head_cfg_int(c, path, "head_dim", 1, hp->n_embd / hp->n_head, 0, 65536,
                              &hp->head_dim)) ||
        (st = st_head_cfg_int(c, path, "intermediate_size", 0, 0, 1, big, &hp->n_ff)) ||
        (st = st_hf_config_str_in(c, path, "hidden_act", acts, 1)))
        goto done;
    if (hp->n_embd != target->hp.n_embd) {
        st = st_fail(ST_ERR_FORMAT, "%s: hidden_size %d does not match the target's %d", path,
                     hp->n_embd, target->hp.n_embd);
        goto done;
    }
    if (n_vocab != target->hp.n_vocab) {
        st = st_fail(ST_ERR_FORMAT, "%s: vocab_size %d does not match the target's %d", path,
                     n_vocab, target->hp.n_vocab);
        goto done;
    }
    if (n_layer != 1) {
        st = st_fail(ST_ERR_UNSUPPORTED,
                     "%s: num_hidden_layers = %d; only one-layer EAGLE-1/2 heads are supported",
                     path, n_layer);
        goto done;
    }
    if ((st = st_hf_config_check_heads(c, path, hp->n_embd, hp->n_head, hp->n_head_kv,
                                       hp->head_dim)))
        goto done;
    if (st_hf_config_has(c, "rope_scaling")) {
        st = st_fail(ST_ERR_UNSUPPORTED, "%s: rope_scaling is not supported yet", path);
        goto done;
    }
    double eps = 1e-6, theta = 10000.0; /* LlamaConfig's default; EAGLE's RoPE default (§d) */
    *bias = true;                       /* EAGLE's loader defaults the fc bias to true */
    if ((st_hf_config_has(c, "rms_norm_eps") &&
         (st = st_hf_config_get_float(c, "rms_norm_eps", &eps))) ||
        (st_hf_config_has(c, "rope_theta") &&
         (st = st_hf_config_get_float(c, "rope_theta", &theta))) ||
        (st_hf_config_has(c, "bias") && (st = st_hf_config_get_bool(c, "bias", bias))))
        goto done;
    if (!(eps >= 0.0 && eps < 1.0) || !(theta > 1.0 && theta < 1e30)) {
        st = st_fail(ST_ERR_FORMAT, "%s: rms_norm_eps %g or rope_theta %g is invalid", path, eps,
                     theta);
        goto done;
    }
    hp->rms_eps = (float)eps;
    hp->rope_base = (float)theta;
    hp->n_vocab = target->hp.n_vocab;
    hp->n_layer = 1;
    hp->n_rot = hp->head_dim;
    hp->n_ctx_train = target->hp.n_ctx_train;
done:
    st_hf_config_free(c);
    return st;
}

st_status st_eagle1_head_load(const char *dir, const st_model *target, st_model **out) {
    if (!dir || !target || !out)
        return st_fail(ST_ERR_INVALID, "st_eagle_head_load: NULL argument");
    *out = NULL;
    if (target->fc.data)
        return st_fail(ST_ERR_INVALID, "st_eagle_head_load: the target is itself an EAGLE head");
    st_model *m = st_calloc(1, sizeof *m);
    st_safetensors *sf = NULL;
    if (!m)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", dir);
    st_model_hparams *hp = &m->hp;
    bool bias = true;
    st_status st = read_config(dir, target, hp, &bias);
    if (st || (st = st_safetensors_open(dir, &sf)))
        goto fail;
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim,
                  KV = (int64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff, V = hp->n_vocab;
    head_tensor ht[HT_N] = {
        [HT_EMBD] = {"embed_tokens.weight", V, E, 0, 0, NULL, NULL},
        [HT_FC] = {"fc.weight", E, 2 * E, 1, 0, NULL, NULL},
        [HT_FC_BIAS] = {"fc.bias", E, 0, bias, 0, NULL, NULL},
        [HT_ATTN_NORM] = {"layers.0.input_layernorm.weight", E, 0, 0, 0, NULL, NULL},
        [HT_Q] = {"layers.0.self_attn.q_proj.weight", Q, E, 1, hp->n_head, NULL, NULL},
        [HT_K] = {"layers.0.self_attn.k_proj.weight", KV, E, 1, hp->n_head_kv, NULL, NULL},
        [HT_V] = {"layers.0.self_attn.v_proj.weight", KV, E, 1, 0, NULL, NULL},
        [HT_O] = {"layers.0.self_attn.o_proj.weight", E, Q, 1, 0, NULL, NULL},
        [HT_FFN_NORM] = {"layers.0.post_attention_layernorm.weight", E, 0, 1, 0, NULL, NULL},
        [HT_GATE] = {"layers.0.mlp.gate_proj.weight", F, E, 1, 0, NULL, NULL},
        [HT_UP] = {"layers.0.mlp.up_proj.weight", F, E, 1, 0, NULL, NULL},
        [HT_DOWN] = {"layers.0.mlp.down_proj.weight", E, F, 1, 0, NULL, NULL},
    };
    if (!bias && st_safetensors_find(sf, "fc.bias")) {
        st = st_fail(ST_ERR_FORMAT,
                     "%s: tensor 'fc.bias' present but config.json says \"bias\": false",
                     st_safetensors_find(sf, "fc.bias")->file);
        goto fail;
    }
    if ((st = st_head_find_tensors(sf, ht, HT_N, "EAGLE-1/2", NULL)))
        goto fail;
    /* one block: every tensor's bytes, then the fc bias as floats (st_plan: a sizing pass,
     * then a carving pass) */
    st_plan pl = {0};
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && !(m->owned = st_plan_alloc(&pl)))
            break;
        for (int k = 0; k < HT_N; k++)
            if (ht[k].t)
                ht[k].copy = st_plan_take(&pl, ht[k].t->size, 1);
        if (ht[HT_FC_BIAS].t)
            m->fc_bias = st_plan_take(&pl, (size_t)E, sizeof(float));
    }
    m->layers = st_calloc(1, sizeof *m->layers);
    if (!m->owned || !m->layers) {
        st = st_fail(ST_ERR_NOMEM, "%s: out of memory for the head's weights", dir);
        goto fail;
    }
    for (int k = 0; k < HT_N; k++)
        if (ht[k].t)
            st_head_copy_tensor(&ht[k]);
    for (int k = 0; k < HT_N; k++)
        if (ht[k].t && (st = st_head_check_finite(&ht[k])))
            goto fail;
    st_layer *L = &m->layers[0];
    st_head_set_wt(&m->fc, &ht[HT_FC]);
    st_head_set_wt(&L->wq, &ht[HT_Q]);
    st_head_set_wt(&L->wk, &ht[HT_K]);
    st_head_set_wt(&L->wv, &ht[HT_V]);
    st_head_set_wt(&L->wo, &ht[HT_O]);
    st_head_set_wt(&L->w_gate, &ht[HT_GATE]);
    st_head_set_wt(&L->w_up, &ht[HT_UP]);
    st_head_set_wt(&L->w_down, &ht[HT_DOWN]);
    if (ht[HT_FC_BIAS].t)
        st_head_vector_of(&ht[HT_FC_BIAS], m->fc_bias);
    L->ffn_norm = st_head_vector_of(&ht[HT_FFN_NORM], NULL);
    if (!L->ffn_norm ||
        (ht[HT_ATTN_NORM].t && !(L->attn_norm = st_head_vector_of(&ht[HT_ATTN_NORM], NULL)))) {
        st = st_fail(ST_ERR_NOMEM, "%s: out of memory for the head's weights", dir);
        goto fail;
    }
    if (ht[HT_EMBD].t) {
        st_head_set_wt(&m->tok_embd, &ht[HT_EMBD]);
    } else {
        m->tok_embd = target->tok_embd;
        m->tok_embd.packed = NULL;
        m->tok_embd.q8p_own = NULL;
        m->tok_embd.kqp_own = NULL;
    }
    m->output = target->output; /* borrowed: never packed or freed by the head */
    m->output.packed = NULL;
    m->output.q8p_own = NULL;
    m->output.kqp_own = NULL;
    hp->wtype = L->wq.type;
    m->target = target;
    st_safetensors_free(sf);
    *out = m;
    return ST_OK;
fail:
    st_safetensors_free(sf);
    st_model_free(m);
    return st;
}
