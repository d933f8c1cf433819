/*
 * eagle3_load.c: an EAGLE-3 head as published (Li et al., EAGLE-3, 2025; SafeAILab/EAGLE
 * traineagle3/cnets.py, SGLang llama_eagle3.py; FORMATS.md §d.2): config.json and safetensors
 * become an st_model of one layer (`midlayer`) whose q/k/v read [embedding; state] (2H), with
 * fc fusing three of the target's layers, its own final norm and lm_head over a draft
 * vocabulary, and d2t mapping each draft id to a target id. The maps are checked here so that no
 * draft id can name a token outside the target's vocabulary. Weights are copied into one
 * 64-byte-aligned block, as for EAGLE-1/2 (eagle_load.c).
 */
#include "draft/drafter.h"
#include "draft/eagle_io.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

enum {
    E3_EMBD,
    E3_FC,
    E3_IN_NORM,
    E3_HID_NORM,
    E3_Q,
    E3_K,
    E3_V,
    E3_O,
    E3_POST_NORM,
    E3_GATE,
    E3_UP,
    E3_DOWN,
    E3_NORM,
    E3_LM_HEAD,
    E3_D2T,
    E3_T2D,
    E3_N
};

/* What config.json says beyond the Llama hyper-parameters. */
typedef struct e3_config {
    int32_t n_draft;  /* draft_vocab_size (default vocab_size) */
    int32_t target_e; /* target_hidden_size (default hidden_size) */
    bool tie;         /* tie_word_embeddings: lm_head is the embedding */
    int32_t cap[ST_CAP_MAX];
} e3_config;

static st_status e3_read_config(const char *dir, const st_model *target, st_model_hparams *hp,
                                e3_config *ec) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    st_hf_config *c = NULL;
    st_status st = st_hf_config_open(path, &c);
    if (st)
        return st;
    static const char *const acts[] = {"silu"}; /* the SwiGLU of forward.c */
    const int32_t big = 1 << 24, TL = target->hp.n_layer;
    int32_t n_layer = 0, n_vocab = 0;
    if ((st = st_head_cfg_int(c, path, "hidden_size", 0, 0, 1, big, &hp->n_embd)) ||
        (st = st_head_cfg_int(c, path, "vocab_size", 0, 0, 1, big, &n_vocab)) ||
        (st = st_head_cfg_int(c, path, "draft_vocab_size", 1, n_vocab, 1, n_vocab, &ec->n_draft)) ||
        (st = st_head_cfg_int(c, path, "target_hidden_size", 1, hp->n_embd, 1, big,
                              &ec->target_e)) ||
        (st = st_head_cfg_int(c, path, "num_hidden_layers", 0, 0, 1, 4096, &n_layer)) ||
        (st = st_head_cfg_int(c, path, "num_attention_heads", 0, 0, 1, 4096, &hp->n_head)) ||
        (st = st_head_cfg_int(c, path, "num_key_value_heads", 1, hp->n_head, 1, hp->n_head,
                              &hp->n_head_kv)) ||
        (st = st_head_cfg_int(c, path, "head_dim", 1, hp->n_embd / hp->n_head, 0, 65536,
                              &hp->head_dim)) ||
        (st = st_head_cfg_int(c, path, "intermediate_size", 0, 0, 1, big, &hp->n_ff)) ||
        (st = st_hf_config_str_in(c, path, "hidden_act", acts, 1)))
        goto done;
    if (ec->target_e != target->hp.n_embd) {
        st = st_fail(ST_ERR_FORMAT, "%s: target_hidden_size %d does not match the target's %d",
                     path, ec->target_e, target->hp.n_embd);
        goto done;
    }
    if (n_vocab != target->hp.n_vocab) {
        st = st_fail(ST_ERR_FORMAT, "%s: vocab_size %d does not match the target's %d", path,
                     n_vocab, target->hp.n_vocab);
        goto done;
    }
    if (n_layer != 1) {
        st = st_fail(ST_ERR_UNSUPPORTED,
                     "%s: num_hidden_layers = %d; EAGLE-3 heads have one layer (midlayer)", path,
                     n_layer);
        goto done;
    }
    if ((st = st_hf_config_check_heads(c, path, hp->n_embd, hp->n_head, hp->n_head_kv,
                                       hp->head_dim)))
        goto done;
    if (st_hf_config_has(c, "rope_scaling")) {
        st = st_fail(ST_ERR_UNSUPPORTED, "%s: rope_scaling is not supported yet", path);
        goto done;
    }
    double eps = 1e-6, theta = 10000.0; /* EAGLE's RoPE default when the config has none (§d) */
    ec->tie = false;
    if ((st_hf_config_has(c, "rms_norm_eps") &&
         (st = st_hf_config_get_float(c, "rms_norm_eps", &eps))) ||
        (st_hf_config_has(c, "rope_theta") &&
         (st = st_hf_config_get_float(c, "rope_theta", &theta))) ||
        (st_hf_config_has(c, "tie_word_embeddings") &&
         (st = st_hf_config_get_bool(c, "tie_word_embeddings", &ec->tie))))
        goto done;
    if (!(eps >= 0.0 && eps < 1.0) || !(theta > 1.0 && theta < 1e30)) {
        st = st_fail(ST_ERR_FORMAT, "%s: rms_norm_eps %g or rope_theta %g is invalid", path, eps,
                     theta);
        goto done;
    }
    if (ec->tie && ec->n_draft != n_vocab) {
        st = st_fail(ST_ERR_FORMAT,
                     "%s: tie_word_embeddings with draft_vocab_size %d != vocab_size %d", path,
                     ec->n_draft, n_vocab);
        goto done;
    }
    /* the target layers read: SGLang's eagle_aux_hidden_state_layer_ids name the layer whose
     * output is read (the input of the next), else EAGLE-3's inputs of 2, L/2 and L-3 */
    const char *key = "eagle_config.eagle_aux_hidden_state_layer_ids";
    if (st_hf_config_has(c, key)) {
        int64_t ids[ST_CAP_MAX + 1], n = 0;
        if ((st = st_hf_config_get_ints(c, key, ids, ST_CAP_MAX + 1, &n)))
            goto done;
        if (n != ST_CAP_MAX) {
            st = st_fail(ST_ERR_FORMAT, "%s: %s has %lld layers, expected %d", path, key,
                         (long long)n, ST_CAP_MAX);
            goto done;
        }
        for (int i = 0; i < ST_CAP_MAX; i++) {
            if (ids[i] < -1 || ids[i] >= TL) {
                st = st_fail(ST_ERR_FORMAT,
                             "%s: %s[%d] = %lld is outside the target's layers [-1, %d)", path, key,
                             i, (long long)ids[i], TL);
                goto done;
            }
            ec->cap[i] = (int32_t)ids[i] + 1;
        }
    } else {
        ec->cap[0] = 2, ec->cap[1] = TL / 2, ec->cap[2] = TL - 3;
        if (TL < 3) {
            st = st_fail(ST_ERR_FORMAT,
                         "%s: no eagle_config.eagle_aux_hidden_state_layer_ids and the target has "
                         "%d layers (the default 2, L/2, L-3 needs 3)",
                         path, TL);
            goto done;
        }
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

/* Reads d2t (draft id -> offset to its target id) into target ids, checking every id lands in
 * the target's vocabulary, no two draft ids share one, and t2d (when present) marks exactly
 * those target ids. */
static st_status e3_maps(const st_head_tensor *d2t, const st_head_tensor *t2d, int32_t n_draft,
                         int32_t n_vocab, int32_t *ids) {
    if (!d2t->t) { /* the identity: the draft vocabulary is the target's */
        for (int32_t i = 0; i < n_draft; i++)
            ids[i] = i;
    } else {
        if (d2t->t->dtype != ST_SF_I64)
            return st_fail(ST_ERR_FORMAT, "%s: tensor 'd2t' has dtype %s, expected I64",
                           d2t->t->file, st_sf_dtype_name(d2t->t->dtype));
        for (int32_t i = 0; i < n_draft; i++) {
            int64_t off;
            memcpy(&off, (const char *)d2t->t->data + (size_t)i * 8, 8);
            const int in = off >= -(int64_t)n_vocab && off <= (int64_t)n_vocab;
            const int64_t t = in ? (int64_t)i + off : -1;
            if (t < 0 || t >= n_vocab)
                return st_fail(ST_ERR_FORMAT,
                               "%s: d2t[%d] = %" PRId64
                               " maps draft id %d outside the target's vocabulary of %d",
                               d2t->t->file, i, off, i, n_vocab);
            ids[i] = (int32_t)t;
        }
    }
    uint8_t *seen = st_calloc((size_t)n_vocab, 1);
    if (!seen)
        return st_fail(ST_ERR_NOMEM, "EAGLE-3: out of memory checking d2t");
    st_status st = ST_OK;
    for (int32_t i = 0; i < n_draft && !st; i++) {
        if (seen[ids[i]])
            st = st_fail(ST_ERR_FORMAT, "%s: d2t maps two draft ids to target id %d (draft id %d)",
                         d2t->t->file, ids[i], i);
        seen[ids[i]] = 1;
    }
    if (!st && t2d->t) {
        const char *f = t2d->t->file;
        const uint8_t *b = t2d->t->data;
        if (t2d->t->dtype != ST_SF_BOOL)
            st = st_fail(ST_ERR_FORMAT, "%s: tensor 't2d' has dtype %s, expected BOOL", f,
                         st_sf_dtype_name(t2d->t->dtype));
        for (int32_t t = 0; t < n_vocab && !st; t++)
            if (b[t] > 1)
                st = st_fail(ST_ERR_FORMAT, "%s: t2d[%d] = %u is not a boolean", f, t, b[t]);
            else if (b[t] != seen[t])
                st = st_fail(ST_ERR_FORMAT, "%s: t2d[%d] is %s but d2t %s (the maps disagree)", f,
                             t, b[t] ? "true" : "false",
                             seen[t] ? "maps a draft id to it" : "maps no draft id to it");
    }
    st_free(seen);
    return st;
}

st_status st_eagle3_head_load(const char *dir, const st_model *target, st_model **out) {
    if (!dir || !target || !out)
        return st_fail(ST_ERR_INVALID, "st_eagle3_head_load: NULL argument");
    *out = NULL;
    if (target->fc.data)
        return st_fail(ST_ERR_INVALID, "st_eagle3_head_load: the target is itself an EAGLE head");
    st_model *m = st_calloc(1, sizeof *m);
    st_safetensors *sf = NULL;
    if (!m)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", dir);
    st_model_hparams *hp = &m->hp;
    e3_config ec = {0};
    st_status st = e3_read_config(dir, target, hp, &ec);
    if (st || (st = st_safetensors_open(dir, &sf)))
        goto fail;
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim,
                  KV = (int64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff, V = hp->n_vocab,
                  D = ec.n_draft, TE = ec.target_e;
    const int reduced = D != V;
    st_head_tensor ht[E3_N] = {
        [E3_EMBD] = {"embed_tokens.weight", V, E, E != TE, 0, NULL, NULL},
        [E3_FC] = {"fc.weight", E, ST_CAP_MAX * TE, 1, 0, NULL, NULL},
        [E3_IN_NORM] = {"midlayer.input_layernorm.weight", E, 0, 1, 0, NULL, NULL},
        [E3_HID_NORM] = {"midlayer.hidden_norm.weight", E, 0, 1, 0, NULL, NULL},
        [E3_Q] = {"midlayer.self_attn.q_proj.weight", Q, 2 * E, 1, hp->n_head, NULL, NULL},
        [E3_K] = {"midlayer.self_attn.k_proj.weight", KV, 2 * E, 1, hp->n_head_kv, NULL, NULL},
        [E3_V] = {"midlayer.self_attn.v_proj.weight", KV, 2 * E, 1, 0, NULL, NULL},
        [E3_O] = {"midlayer.self_attn.o_proj.weight", E, Q, 1, 0, NULL, NULL},
        [E3_POST_NORM] = {"midlayer.post_attention_layernorm.weight", E, 0, 1, 0, NULL, NULL},
        [E3_GATE] = {"midlayer.mlp.gate_proj.weight", F, E, 1, 0, NULL, NULL},
        [E3_UP] = {"midlayer.mlp.up_proj.weight", F, E, 1, 0, NULL, NULL},
        [E3_DOWN] = {"midlayer.mlp.down_proj.weight", E, F, 1, 0, NULL, NULL},
        [E3_NORM] = {"norm.weight", E, 0, 1, 0, NULL, NULL},
        [E3_LM_HEAD] = {"lm_head.weight", D, E, !ec.tie, 0, NULL, NULL},
        [E3_D2T] = {"d2t", D, 0, reduced, 0, NULL, NULL},
        [E3_T2D] = {"t2d", V, 0, 0, 0, NULL, NULL},
    };
    static const char *const raw[] = {"d2t", "t2d", NULL};
    if ((st = st_head_find_tensors(sf, ht, E3_N, "EAGLE-3", raw)))
        goto fail;
    if (ec.tie && ht[E3_LM_HEAD].t) {
        st = st_fail(ST_ERR_FORMAT,
                     "%s: tensor 'lm_head.weight' present but config.json says "
                     "\"tie_word_embeddings\": true",
                     ht[E3_LM_HEAD].t->file);
        goto fail;
    }
    /* one block: the weights' bytes (d2t and t2d are read, not copied), hidden_norm as floats,
     * then d2t as target ids */
    st_plan pl = {0};
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && !(m->owned = st_plan_alloc(&pl)))
            break;
        for (int k = 0; k < E3_D2T; k++)
            if (ht[k].t)
                ht[k].copy = st_plan_take(&pl, ht[k].t->size, 1);
        m->hidden_norm = st_plan_take(&pl, (size_t)E, sizeof(float));
        m->d2t = st_plan_take(&pl, (size_t)D, sizeof(int32_t));
    }
    m->layers = st_calloc(1, sizeof *m->layers);
    if (!m->owned || !m->layers) {
        st = st_fail(ST_ERR_NOMEM, "%s: out of memory for the head's weights", dir);
        goto fail;
    }
    if ((st = e3_maps(&ht[E3_D2T], &ht[E3_T2D], (int32_t)D, (int32_t)V, m->d2t)))
        goto fail;
    for (int k = 0; k < E3_D2T; k++)
        if (ht[k].t)
            st_head_copy_tensor(&ht[k]);
    for (int k = 0; k < E3_D2T; k++)
        if (ht[k].t && (st = st_head_check_finite(&ht[k])))
            goto fail;
    st_layer *L = &m->layers[0];
    st_head_set_wt(&m->fc, &ht[E3_FC]);
    st_head_set_wt(&L->wq, &ht[E3_Q]);
    st_head_set_wt(&L->wk, &ht[E3_K]);
    st_head_set_wt(&L->wv, &ht[E3_V]);
    st_head_set_wt(&L->wo, &ht[E3_O]);
    st_head_set_wt(&L->w_gate, &ht[E3_GATE]);
    st_head_set_wt(&L->w_up, &ht[E3_UP]);
    st_head_set_wt(&L->w_down, &ht[E3_DOWN]);
    st_head_vector_of(&ht[E3_HID_NORM], m->hidden_norm);
    L->attn_norm = st_head_vector_of(&ht[E3_IN_NORM], NULL);
    L->ffn_norm = st_head_vector_of(&ht[E3_POST_NORM], NULL);
    m->out_norm = st_head_vector_of(&ht[E3_NORM], NULL);
    if (!L->attn_norm || !L->ffn_norm || !m->out_norm) {
        st = st_fail(ST_ERR_NOMEM, "%s: out of memory for the head's weights", dir);
        goto fail;
    }
    if (ht[E3_EMBD].t) {
        st_head_set_wt(&m->tok_embd, &ht[E3_EMBD]);
    } else {
        m->tok_embd = target->tok_embd; /* borrowed: never packed or freed by the head */
        m->tok_embd.packed = NULL;
        m->tok_embd.q8p_own = NULL;
        m->tok_embd.kqp_own = NULL;
    }
    if (ec.tie)
        m->output = m->tok_embd;
    else
        st_head_set_wt(&m->output, &ht[E3_LM_HEAD]);
    m->output.packed = NULL;
    m->output.q8p_own = NULL;
    m->output.kqp_own = NULL;
    m->eagle3 = 1;
    m->n_cap = ST_CAP_MAX;
    memcpy(m->cap_layer, ec.cap, sizeof ec.cap);
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
