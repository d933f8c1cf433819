/*
 * safetensors_write.c: writes one safetensors file (FORMATS.md §c.1) for tools and tests. The
 * header is built and escaped by jansson, padded with spaces so the data starts 8-byte
 * aligned, and the tensors are stored back to back in the order given. The file appears whole
 * or not at all (st_outfile).
 */
#include "io/safetensors.h"

#include "core/core.h"

#include <jansson.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of a tensor as its dtype and shape say; -1 when the shape is invalid. */
static int64_t tensor_bytes(const st_sf_tensor *t) {
    if ((unsigned)t->dtype >= ST_SF_N_DTYPES || t->n_dims < 0 || (t->n_dims && !t->shape))
        return -1;
    int64_t n = 1;
    for (int32_t i = 0; i < t->n_dims; i++)
        if (t->shape[i] < 0 || __builtin_mul_overflow(n, t->shape[i], &n))
            return -1;
    if (__builtin_mul_overflow(n, (int64_t)st_sf_dtype_bits(t->dtype), &n) || n % 8)
        return -1;
    return n / 8;
}

static json_t *tensor_entry(const st_sf_tensor *t, int64_t begin, int64_t end) {
    json_t *e = json_object(), *shape = json_array(), *off = json_array();
    bool ok = e && shape && off;
    for (int32_t i = 0; ok && i < t->n_dims; i++)
        ok = json_array_append_new(shape, json_integer(t->shape[i])) == 0;
    ok = ok && json_array_append_new(off, json_integer(begin)) == 0 &&
         json_array_append_new(off, json_integer(end)) == 0;
    ok = ok && json_object_set_new(e, "dtype", json_string(st_sf_dtype_name(t->dtype))) == 0;
    ok = ok && json_object_set(e, "shape", shape) == 0 &&
         json_object_set(e, "data_offsets", off) == 0;
    json_decref(shape);
    json_decref(off);
    if (!ok) {
        json_decref(e);
        return NULL;
    }
    return e;
}

st_status st_safetensors_write(const char *path, const st_sf_tensor *tensors, int64_t n) {
    json_t *root = json_object(), *meta = json_object();
    char *header = NULL;
    st_status s = ST_OK;
    if (!root || !meta || json_object_set_new(meta, "format", json_string("pt")) != 0 ||
        json_object_set(root, "__metadata__", meta) != 0) {
        s = st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const st_sf_tensor *t = &tensors[i];
        int64_t bytes = tensor_bytes(t);
        if (!t->name || !strcmp(t->name, "__metadata__") || json_object_get(root, t->name)) {
            s = st_fail(ST_ERR_INVALID, "%s: tensor %" PRId64 ": missing or repeated name", path,
                        i);
            goto fail;
        }
        if (bytes < 0 || (size_t)bytes != t->size || (bytes && !t->data)) {
            s = st_fail(ST_ERR_INVALID,
                        "%s: tensor '%s': size %zu does not match its dtype and shape", path,
                        t->name, t->size);
            goto fail;
        }
        json_t *e = tensor_entry(t, off, off + bytes);
        if (!e || json_object_set_new(root, t->name, e) != 0) {
            s = st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        off += bytes;
    }
    header = json_dumps(root, JSON_COMPACT);
    if (!header) {
        s = st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    size_t hn = strlen(header), pad = (8 - hn % 8) % 8;
    uint64_t len = hn + pad;
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(len >> (8 * i));
    st_outfile out;
    if ((s = st_outfile_open(path, &out)))
        goto fail;
    FILE *fp = out.f;
    bool ok = fwrite(le, 1, 8, fp) == 8 && fwrite(header, 1, hn, fp) == hn;
    for (size_t i = 0; ok && i < pad; i++)
        ok = fputc(' ', fp) != EOF;
    for (int64_t i = 0; ok && i < n; i++)
        ok = tensors[i].size == 0 ||
             fwrite(tensors[i].data, 1, tensors[i].size, fp) == tensors[i].size;
    if (!ok)
        s = st_fail(ST_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    st_status e = st_outfile_close(&out, ok);
    if (!s)
        s = e;
fail:
    free(header);
    json_decref(meta);
    json_decref(root);
    return s;
}
