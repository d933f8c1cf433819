/*
 * eagle_io.c: what the EAGLE-1/2 (eagle_load.c) and EAGLE-3 (eagle3_load.c) head loaders share:
 * typed config.json fields with ranges, a layout's tensors checked against the checkpoint, and
 * the copies of its weights into the head's one block (q/k rows permuted to adjacent pairs).
 */
#include "draft/eagle_io.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

typedef st_head_tensor head_tensor;

static void shape_str(const st_sf_tensor *t, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < t->n_dims && i < 4 && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", t->shape[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "%s]", t->n_dims > 4 ? ", ..." : "");
}

st_status st_head_cfg_int(const st_hf_config *c, const char *path, const char *key, int optional,
                          int64_t def, int64_t lo, int64_t hi, int32_t *out) {
    int64_t v = def;
    if (!optional || st_hf_config_has(c, key)) {
        st_status st = st_hf_config_get_int(c, key, &v);
        if (st)
            return st;
    }
    if (v < lo || v > hi)
        return st_fail(ST_ERR_FORMAT,
                       "%s: %s = %" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]", path, key,
                       v, lo, hi);
    *out = (int32_t)v;
    return ST_OK;
}

static int listed(const char *name, const char *const *list) {
    for (; list && *list; list++)
        if (!strcmp(name, *list))
            return 1;
    return 0;
}

st_status st_head_find_tensors(const st_safetensors *sf, head_tensor *ht, int n_ht,
                               const char *what, const char *const *raw_ok) {
    for (int64_t i = 0; i < st_safetensors_n_tensors(sf); i++) {
        const st_sf_tensor *t = st_safetensors_tensor_at(sf, i);
        int known = 0;
        for (int k = 0; k < n_ht && !known; k++)
            known = strcmp(t->name, ht[k].name) == 0;
        const size_t n = strlen(t->name), m = strlen(".rotary_emb.inv_freq");
        if (n >= m && strcmp(t->name + n - m, ".rotary_emb.inv_freq") == 0)
            continue; /* HF exports may keep RoPE's table: recomputed, not read */
        if (!known)
            return st_fail(ST_ERR_FORMAT, "%s: unexpected tensor '%s' in an %s head", t->file,
                           t->name, what);
    }
    for (int k = 0; k < n_ht; k++) {
        head_tensor *h = &ht[k];
        h->t = st_safetensors_find(sf, h->name);
        if (!h->t) {
            if (!h->required)
                continue;
            return st_safetensors_get(sf, h->name, &h->t); /* the error naming it */
        }
        st_dtype dt;
        st_status st = listed(h->name, raw_ok) ? ST_OK : st_sf_tensor_dtype(h->t, &dt);
        if (st)
            return st;
        const int32_t nd = h->cols ? 2 : 1;
        if (h->t->n_dims != nd || h->t->shape[0] != h->rows ||
            (nd == 2 && h->t->shape[1] != h->cols)) {
            char got[128];
            shape_str(h->t, got, sizeof got);
            if (nd == 2)
                return st_fail(ST_ERR_FORMAT,
                               "%s: tensor '%s' has shape %s, expected [%" PRId64 ", %" PRId64 "]",
                               h->t->file, h->name, got, h->rows, h->cols);
            return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected [%" PRId64 "]",
                           h->t->file, h->name, got, h->rows);
        }
    }
    return ST_OK;
}

/* q/k rows go from HF's half-split order to adjacent pairs: per head, row 2j takes HF row j and
 * row 2j+1 HF row j + head_dim/2 (FORMATS.md §b.6). */
void st_head_copy_tensor(const head_tensor *h) {
    const char *src = h->t->data;
    char *dst = h->copy;
    if (!h->rope_heads) {
        memcpy(dst, src, h->t->size);
        return;
    }
    const size_t rb = h->t->size / (size_t)h->rows;
    const int64_t hd = h->rows / h->rope_heads;
    for (int64_t head = 0; head < h->rope_heads; head++)
        for (int64_t j = 0; j < hd / 2; j++)
            for (int64_t t = 0; t < 2; t++)
                memcpy(dst + (size_t)(head * hd + 2 * j + t) * rb,
                       src + (size_t)(head * hd + t * (hd / 2) + j) * rb, rb);
}

void st_head_set_wt(st_wt *w, const head_tensor *h) {
    st_dtype dt = ST_DTYPE_F32;
    st_sf_tensor_dtype(h->t, &dt); /* checked in find_tensors */
    w->data = h->copy;
    w->type = dt;
    w->n_out = h->rows;
    w->n_in = h->cols;
    w->row_bytes = st_row_bytes(dt, h->cols);
    w->packed = NULL;
}

float *st_head_vector_of(const head_tensor *h, float *into) {
    st_dtype dt = ST_DTYPE_F32;
    st_sf_tensor_dtype(h->t, &dt);
    float *v = into ? into : st_malloc((size_t)h->rows * sizeof(float));
    if (v)
        st_dequant_row(dt, h->copy, v, h->rows);
    return v;
}

st_status st_head_check_finite(const head_tensor *h) {
    st_dtype dt;
    if (st_sf_tensor_dtype(h->t, &dt) ||
        (dt != ST_DTYPE_F32 && dt != ST_DTYPE_F16 && dt != ST_DTYPE_BF16))
        return ST_OK; /* d2t / t2d: integers, checked by their loader */
    const int64_t n = h->rows * (h->cols ? h->cols : 1), es = dt == ST_DTYPE_F32 ? 4 : 2;
    float buf[256];
    for (int64_t i = 0; i < n; i += 256) {
        const int64_t k = n - i < 256 ? n - i : 256;
        st_dequant_row(dt, (const char *)h->copy + i * es, buf, k);
        const int64_t bad = st_first_non_finite(buf, k);
        if (bad < 0)
            continue;
        const int64_t at = i + bad;
        if (h->cols)
            return st_fail(ST_ERR_FORMAT,
                           "%s: tensor '%s' holds a non-finite value (%g at [%lld, %lld])",
                           h->t->file, h->name, (double)buf[bad], (long long)(at / h->cols),
                           (long long)(at % h->cols));
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value (%g at [%lld])",
                       h->t->file, h->name, (double)buf[bad], (long long)at);
    }
    return ST_OK;
}
