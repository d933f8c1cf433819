/*
 * head_load.c: EAGLE heads of either kind, as the public API sees them: st_eagle_head_load picks
 * the loader by the checkpoint's tensors (an EAGLE-3 layer is `midlayer`), and a head's
 * description, loaded (st_eagle_head_info) or from its files alone (st_eagle_head_describe).
 */
#include "draft/eagle_io.h"

#include <stdio.h>
#include <string.h>

st_status st_eagle_head_load(const char *dir, const st_model *target, st_model **out) {
    st_safetensors *probe = NULL;
    if (dir && target && out && st_safetensors_open(dir, &probe) == ST_OK) {
        const int v3 = st_safetensors_find(probe, "midlayer.self_attn.q_proj.weight") != NULL;
        st_safetensors_free(probe);
        if (v3)
            return st_eagle3_head_load(dir, target, out);
    }
    return st_eagle1_head_load(dir, target, out);
}

void st_eagle_head_info(const st_model *m, st_eagle_info *out) {
    memset(out, 0, sizeof *out);
    if (!m || !m->fc.data || !m->target)
        return;
    const st_model *t = m->target;
    out->version = m->eagle3 ? 3 : 1;
    out->n_embd = m->hp.n_embd;
    out->n_ff = m->hp.n_ff;
    out->n_vocab = m->hp.n_vocab;
    out->n_draft_vocab = (int32_t)m->output.n_out;
    out->target_n_embd = t->hp.n_embd;
    out->target_layers = t->hp.n_layer;
    out->n_layers_read = m->eagle3 ? m->n_cap : 1;
    for (int32_t i = 0; i < out->n_layers_read && i < 3; i++)
        out->layers_read[i] = m->eagle3 ? m->cap_layer[i] : t->hp.n_layer;
    out->own_embedding = m->tok_embd.data != t->tok_embd.data;
}

st_status st_eagle_head_describe(const char *dir, st_eagle_info *out) {
    if (!dir || !out)
        return st_fail(ST_ERR_INVALID, "st_eagle_head_describe: NULL argument");
    memset(out, 0, sizeof *out);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    st_hf_config *c = NULL;
    st_safetensors *sf = NULL;
    st_status st = st_hf_config_open(path, &c);
    if (st || (st = st_safetensors_open(dir, &sf)))
        goto done;
    const int v3 = st_safetensors_find(sf, "midlayer.self_attn.q_proj.weight") != NULL;
    const int32_t big = 1 << 24;
    if ((st = st_head_cfg_int(c, path, "hidden_size", 0, 0, 1, big, &out->n_embd)) ||
        (st = st_head_cfg_int(c, path, "intermediate_size", 0, 0, 1, big, &out->n_ff)) ||
        (st = st_head_cfg_int(c, path, "vocab_size", 0, 0, 1, big, &out->n_vocab)) ||
        (st = st_head_cfg_int(c, path, "draft_vocab_size", 1, out->n_vocab, 1, out->n_vocab,
                              &out->n_draft_vocab)) ||
        (st = st_head_cfg_int(c, path, "target_hidden_size", 1, out->n_embd, 1, big,
                              &out->target_n_embd)))
        goto done;
    out->version = v3 ? 3 : 1;
    out->own_embedding = st_safetensors_find(sf, "embed_tokens.weight") != NULL;
    out->n_layers_read = v3 ? ST_CAP_MAX : 1;
    const char *key = "eagle_config.eagle_aux_hidden_state_layer_ids";
    if (v3 && st_hf_config_has(c, key)) {
        int64_t ids[ST_CAP_MAX + 1], n = 0;
        if ((st = st_hf_config_get_ints(c, key, ids, ST_CAP_MAX + 1, &n)))
            goto done;
        if (n != ST_CAP_MAX) {
            st = st_fail(ST_ERR_FORMAT, "%s: %s has %lld layers, expected %d", path, key,
                         (long long)n, ST_CAP_MAX);
            goto done;
        }
        for (int i = 0; i < ST_CAP_MAX; i++)
            out->layers_read[i] = (int32_t)ids[i] + 1;
    } else {
        out->layers_default = v3;
    }
done:
    st_safetensors_free(sf);
    st_hf_config_free(c);
    return st;
}
