/* testutil.c: helpers shared by the test programs. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "io/safetensors.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char *tu_data(const char *rel) {
    static char bufs[4][4096];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, 4096, "%s/%s", ST_SOURCE_DIR, rel);
    return b;
}

char *tu_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (size)
            *size = (size_t)n;
    }
    return buf;
}

static float tu_uniform(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (float)((*s * 0x2545F4914F6CDD1DULL) >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}

int tu_write_eagle_head(const char *dir, const tu_head *h) {
    const int64_t E = h->n_embd, hd = h->n_embd / h->n_head, Q = (int64_t)h->n_head * hd,
                  KV = (int64_t)h->n_head_kv * hd, F = h->n_ff, V = h->n_vocab;
    struct {
        const char *name;
        int64_t rows, cols; /* cols 0: a vector */
        int present;
    } spec[] = {
        {"embed_tokens.weight", V, E, h->embed || h->embed_values},
        {"fc.weight", E, 2 * E, 1},
        {"fc.bias", E, 0, !h->no_bias && !h->embed_values},
        {"layers.0.input_layernorm.weight", E, 0, h->input_norm},
        {"layers.0.self_attn.q_proj.weight", Q, E, 1},
        {"layers.0.self_attn.k_proj.weight", KV, E, 1},
        {"layers.0.self_attn.v_proj.weight", KV, E, 1},
        {"layers.0.self_attn.o_proj.weight", E, Q, 1},
        {"layers.0.post_attention_layernorm.weight", E, 0, 1},
        {"layers.0.mlp.gate_proj.weight", F, E, 1},
        {"layers.0.mlp.up_proj.weight", F, E, 1},
        {"layers.0.mlp.down_proj.weight", E, F, 1},
        {h->extra ? h->extra : "", 4, 0, h->extra != NULL},
    };
    enum { N_SPEC = sizeof spec / sizeof spec[0] };
    st_sf_tensor t[N_SPEC];
    int64_t shapes[N_SPEC][2];
    void *bufs[N_SPEC] = {0};
    int n = 0, rc = -1;
    uint64_t rng = h->seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int i = 0; i < N_SPEC; i++) {
        if (!spec[i].present || (h->skip && !strcmp(h->skip, spec[i].name)))
            continue;
        const int vec = spec[i].cols == 0;
        int64_t rows = spec[i].rows, cols = vec ? 1 : spec[i].cols;
        if (h->bad_shape && !strcmp(h->bad_shape, spec[i].name))
            rows += 1;
        const int64_t ne = rows * cols;
        const int i32 = h->bad_dtype && !strcmp(h->bad_dtype, spec[i].name);
        const st_sf_dtype dt = i32 ? ST_SF_I32 : (st_sf_dtype)h->dtype;
        const size_t es = (size_t)st_sf_dtype_bits(dt) / 8;
        char *b = malloc((size_t)ne * es);
        if (!b)
            goto done;
        bufs[n] = b;
        const float a = h->scale / sqrtf((float)cols);
        for (int64_t j = 0; j < ne; j++) {
            /* norms near 1, the bias small, matrices uniform */
            float v = vec ? (strstr(spec[i].name, "norm") ? 1.0f + 0.2f * tu_uniform(&rng)
                                                          : 0.1f * tu_uniform(&rng))
                          : a * tu_uniform(&rng);
            if (h->embed_values && i == 0)
                v = h->embed_values[j];
            else if (h->embed_values && i == 1) /* fc = [I | 0.1 I] */
                v = j % cols == j / cols ? 1.0f : j % cols == j / cols + E ? 0.1f : 0.0f;
            else if (h->embed_values &&
                     (strstr(spec[i].name, "o_proj") || strstr(spec[i].name, "down_proj")))
                v = 0.0f;
            if (dt == ST_SF_F32 || dt == ST_SF_I32)
                memcpy(b + (size_t)j * 4, &v, 4);
            else {
                uint16_t u = dt == ST_SF_F16 ? st_f32_to_fp16(v) : st_f32_to_bf16(v);
                memcpy(b + (size_t)j * 2, &u, 2);
            }
        }
        shapes[n][0] = rows;
        shapes[n][1] = cols;
        t[n] = (st_sf_tensor){.name = spec[i].name,
                              .dtype = dt,
                              .n_dims = vec ? 1 : 2,
                              .shape = shapes[n],
                              .n_elem = ne,
                              .data = b,
                              .size = (size_t)ne * es};
        n++;
    }
    char path[4096];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_safetensors_write(path, t, n) != ST_OK)
        goto done;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        goto done;
    fprintf(f,
            "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": %d, "
            "\"intermediate_size\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
            "\"num_hidden_layers\": 1, \"vocab_size\": %d, \"rms_norm_eps\": 1e-05, "
            "\"hidden_act\": \"silu\"%s}\n",
            h->n_embd, h->n_ff, h->n_head, h->n_head_kv, h->n_vocab,
            h->no_bias || h->embed_values ? ", \"bias\": false" : "");
    rc = fclose(f) == 0 ? 0 : -1;
done:
    for (int i = 0; i < N_SPEC; i++)
        free(bufs[i]);
    return rc;
}

int tu_write_eagle3_head(const char *dir, const tu_head3 *h) {
    const int64_t E = h->n_embd, hd = h->n_embd / h->n_head, Q = (int64_t)h->n_head * hd,
                  KV = (int64_t)h->n_head_kv * hd, F = h->n_ff, V = h->n_vocab, D = h->n_draft;
    enum { RAW_NONE, RAW_D2T, RAW_T2D };
    struct {
        const char *name;
        int64_t rows, cols; /* cols 0: a vector */
        int present, raw;
    } spec[] = {
        {"embed_tokens.weight", V, E, h->embed, 0},
        {"fc.weight", E, 3 * E, 1, 0},
        {"midlayer.input_layernorm.weight", E, 0, 1, 0},
        {"midlayer.hidden_norm.weight", E, 0, 1, 0},
        {"midlayer.self_attn.q_proj.weight", Q, 2 * E, 1, 0},
        {"midlayer.self_attn.k_proj.weight", KV, 2 * E, 1, 0},
        {"midlayer.self_attn.v_proj.weight", KV, 2 * E, 1, 0},
        {"midlayer.self_attn.o_proj.weight", E, Q, 1, 0},
        {"midlayer.post_attention_layernorm.weight", E, 0, 1, 0},
        {"midlayer.mlp.gate_proj.weight", F, E, 1, 0},
        {"midlayer.mlp.up_proj.weight", F, E, 1, 0},
        {"midlayer.mlp.down_proj.weight", E, F, 1, 0},
        {"norm.weight", E, 0, 1, 0},
        {"lm_head.weight", D, E, 1, 0},
        {"d2t", D, 0, D != V || h->d2t, RAW_D2T},
        {"t2d", V, 0, (D != V || h->t2d) && !h->no_t2d, RAW_T2D},
        {h->extra ? h->extra : "", 4, 0, h->extra != NULL, 0},
    };
    enum { N_SPEC = sizeof spec / sizeof spec[0] };
    st_sf_tensor t[N_SPEC];
    int64_t shapes[N_SPEC][2];
    void *bufs[N_SPEC] = {0};
    int n = 0, rc = -1;
    uint64_t rng = h->seed * 0x9E3779B97F4A7C15ULL + 3;
    for (int i = 0; i < N_SPEC; i++) {
        if (!spec[i].present || (h->skip && !strcmp(h->skip, spec[i].name)))
            continue;
        const int vec = spec[i].cols == 0;
        int64_t rows = spec[i].rows, cols = vec ? 1 : spec[i].cols;
        if (h->bad_shape && !strcmp(h->bad_shape, spec[i].name))
            rows += 1;
        const int64_t ne = rows * cols;
        const int i32 = h->bad_dtype && !strcmp(h->bad_dtype, spec[i].name);
        const st_sf_dtype dt = i32                      ? ST_SF_I32
                               : spec[i].raw == RAW_D2T ? ST_SF_I64
                               : spec[i].raw == RAW_T2D ? ST_SF_BOOL
                                                        : (st_sf_dtype)h->dtype;
        const size_t es = (size_t)st_sf_dtype_bits(dt) / 8;
        char *b = calloc((size_t)ne, es);
        if (!b)
            goto done;
        bufs[n] = b;
        const float a = h->scale / sqrtf((float)cols);
        for (int64_t j = 0; j < ne; j++) {
            if (spec[i].raw == RAW_D2T && !i32) {
                const int64_t v = h->d2t ? (j < D ? h->d2t[j] : 0) : (j * V) / D - j;
                memcpy(b + (size_t)j * 8, &v, 8);
                continue;
            }
            if (spec[i].raw == RAW_T2D && !i32) {
                const int64_t di = (j * D + V - 1) / V; /* the draft id that could map to j */
                b[j] = h->t2d ? h->t2d[j] : (uint8_t)(di < D && (di * V) / D == j);
                continue;
            }
            float v = vec ? (strstr(spec[i].name, "norm") ? 1.0f + 0.2f * tu_uniform(&rng)
                                                          : 0.1f * tu_uniform(&rng))
                          : a * tu_uniform(&rng);
            if (dt == ST_SF_F32 || dt == ST_SF_I32)
                memcpy(b + (size_t)j * 4, &v, 4);
            else {
                uint16_t u = dt == ST_SF_F16 ? st_f32_to_fp16(v) : st_f32_to_bf16(v);
                memcpy(b + (size_t)j * 2, &u, 2);
            }
        }
        shapes[n][0] = rows;
        shapes[n][1] = cols;
        t[n] = (st_sf_tensor){.name = spec[i].name,
                              .dtype = dt,
                              .n_dims = vec ? 1 : 2,
                              .shape = shapes[n],
                              .n_elem = ne,
                              .data = b,
                              .size = (size_t)ne * es};
        n++;
    }
    char path[4096], ids[128] = "";
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_safetensors_write(path, t, n) != ST_OK)
        goto done;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        goto done;
    if (!h->no_layer_ids)
        snprintf(ids, sizeof ids,
                 ", \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [%d, %d, %d]}",
                 h->layer_ids[0], h->layer_ids[1], h->layer_ids[2]);
    fprintf(f,
            "{\"architectures\": [\"LlamaForCausalLMEagle3\"], \"hidden_size\": %d, "
            "\"intermediate_size\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": "
            "%d, \"num_hidden_layers\": 1, \"vocab_size\": %d, \"draft_vocab_size\": %d, "
            "\"rms_norm_eps\": 1e-05, \"hidden_act\": \"silu\"%s%s}\n",
            h->n_embd, h->n_ff, h->n_head, h->n_head_kv, h->n_vocab, h->n_draft, ids,
            h->config_extra ? h->config_extra : "");
    rc = fclose(f) == 0 ? 0 : -1;
done:
    for (int i = 0; i < N_SPEC; i++)
        free(bufs[i]);
    return rc;
}

tu_result tu_run(const char *prog, const char *args, const char *in) {
    char cmd[8192], fo[600], fe[600];
    snprintf(fo, sizeof fo, "%s/tu_run_%d.out", ST_BUILD_DIR, (int)getpid());
    snprintf(fe, sizeof fe, "%s/tu_run_%d.err", ST_BUILD_DIR, (int)getpid());
    snprintf(cmd, sizeof cmd, "%s/%s %s >%s 2>%s <%s", ST_BUILD_DIR, prog, args, fo, fe, in);
    int st = system(cmd);
    tu_result r = {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), NULL, NULL};
    r.out = tu_read_file(fo, NULL);
    r.err = tu_read_file(fe, NULL);
    remove(fo);
    remove(fe);
    return r;
}

void tu_result_free(tu_result *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

int tu_keep(void *user, int32_t t) {
    tu_toks *k = user;
    if (k->n < 256)
        k->t[k->n++] = t;
    return 0;
}

int tu_inflated_head_drafts_alike(const st_model *target, const char *dir, const char *head_rel,
                                  int algo) {
    char cmd[2048], tpath[512], hpath[512], src[512];
    snprintf(src, sizeof src, "%s/%s", ST_SOURCE_DIR, head_rel);
    snprintf(tpath, sizeof tpath, "%s/t128.gguf", dir);
    snprintf(hpath, sizeof hpath, "%s/wide_head", dir);
    snprintf(cmd, sizeof cmd,
             "%s/spectree-mkmodel '%s' --inflate '%s' --dim 128 --ff 384 --layers 7 --type f32 "
             ">/dev/null 2>&1 && %s %s/train/eagle/inflate_head.py '%s' '%s' --dim 128 2>/dev/null",
             ST_BUILD_DIR, tpath, tu_data("models/stories260K.gguf"), ST_PYTHON3, ST_SOURCE_DIR,
             src, hpath);
    if (system(cmd) != 0) {
        fprintf(stderr, "inflated head: %s failed\n", cmd);
        return -1;
    }
    st_model *wide = NULL, *wide_head = NULL, *head = NULL;
    int rc = -1;
    if (st_model_load(tpath, &wide) || st_eagle_head_load(hpath, wide, &wide_head) ||
        st_eagle_head_load(src, target, &head)) {
        fprintf(stderr, "inflated head: %s\n", st_last_error());
        goto done;
    }
    const char *prompt = "Molly the cow lived on a green hill";
    int32_t ids[64];
    int64_t n = 0;
    if (st_tokenize(st_model_tokenizer(target), prompt, strlen(prompt), 1, ids, 64, &n))
        goto done;
    st_gen_params p = st_gen_default_params();
    p.n_predict = 96;
    p.sampler.temp = 0.0f;
    p.n_threads = 1;
    p.spec.algo = algo;
    p.spec.topk = 1;
    p.spec.num_steps = 4;
    tu_toks a = {0}, b = {0};
    st_gen_stats ga, gb;
    p.spec.draft_model = head;
    if (st_generate(target, ids, n, &p, tu_keep, &a, &ga))
        goto done;
    p.spec.draft_model = wide_head;
    if (st_generate(wide, ids, n, &p, tu_keep, &b, &gb))
        goto done;
    if (a.n != b.n || memcmp(a.t, b.t, (size_t)a.n * sizeof(int32_t)) || ga.spec_steps <= 10 ||
        ga.spec_steps != gb.spec_steps ||
        memcmp(ga.accept_hist, gb.accept_hist, sizeof ga.accept_hist)) {
        fprintf(stderr,
                "inflated head: %d / %d tokens, %lld / %lld speculative steps: the texts or "
                "accept histograms differ\n",
                a.n, b.n, (long long)ga.spec_steps, (long long)gb.spec_steps);
        goto done;
    }
    rc = 0;
done:
    if (rc && st_last_error()[0])
        fprintf(stderr, "inflated head: %s\n", st_last_error());
    st_model_free(head);
    st_model_free(wide_head);
    st_model_free(wide);
    return rc;
}

int tu_poke_head_f32(const char *dir, const char *name, int64_t i, float v) {
    char path[1024], key[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(key, sizeof key, "\"%s\"", name);
    FILE *f = fopen(path, "r+b");
    if (!f)
        return -1;
    uint64_t hl = 0;
    char *hdr = NULL;
    int rc = -1;
    if (fread(&hl, 8, 1, f) != 1 || hl > (1u << 24) || !(hdr = calloc(1, hl + 1)) ||
        fread(hdr, 1, hl, f) != hl)
        goto done;
    const char *at = strstr(hdr, key), *off = at ? strstr(at, "\"data_offsets\"") : NULL;
    const char *br = off ? strchr(off, '[') : NULL;
    if (!br)
        goto done;
    const long long begin = strtoll(br + 1, NULL, 10);
    if (fseek(f, (long)(8 + hl + (uint64_t)begin + (uint64_t)i * 4), SEEK_SET) == 0 &&
        fwrite(&v, 4, 1, f) == 1)
        rc = 0;
done:
    free(hdr);
    return fclose(f) == 0 ? rc : -1;
}
