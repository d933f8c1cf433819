/*
 * gguf_convert.c: st_convert_gguf, a GGUF model written again with its matrices in another
 * type. The source is loaded first as a model (every check st_model_load makes), then read
 * tensor by tensor: each row is dequantized and quantized again (st_dequantize_row,
 * st_quantize_row, the engine's own converters) and streamed to the output, so the source is
 * never held in memory twice. Its keys (the tokenizer's among them) are copied in their order.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/hf.h"

#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

/* The output type of tensor t: vectors F32 (they are norms and tables), matrices
 * st_convert_matrix_type's choice; ST_HF_KEEP keeps both as stored. */
static uint32_t out_type(const st_gguf_tensor *t, int type, const st_model_hparams *hp) {
    if (type == ST_HF_KEEP)
        return t->type;
    if (t->n_dims < 2)
        return ST_DTYPE_F32;
    const uint32_t dt = st_convert_matrix_type(
        type, t->name, t->ne[0], hp->n_layer, hp->n_head / hp->n_head_kv, hp->tied_output, t->type);
    return type > ST_HF_MIX && dt == 0 ? t->type : dt; /* one the K-quant mix leaves alone */
}

/* Streams tensor t as dst rows. */
static st_status stream_tensor(st_gguf_writer *w, const char *path, const st_gguf_tensor *t,
                               uint32_t dst) {
    const int64_t n_in = t->ne[0], n_rows = t->ne[1] * t->ne[2] * t->ne[3];
    if (dst == t->type)
        return st_gguf_writer_stream(w, t->data, t->size);
    size_t dst_row;
    st_status s = st_gguf_tensor_bytes(dst, 1, &n_in, &dst_row);
    if (s)
        return s;
    const size_t src_row = t->size / (size_t)n_rows;
    float *f = st_malloc((size_t)n_in * sizeof(float) + dst_row);
    if (!f)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory converting '%s'", path, t->name);
    char *out = (char *)(f + n_in);
    for (int64_t r = 0; r < n_rows && !s; r++) {
        if ((s = st_dequantize_row(t->type, (const char *)t->data + (size_t)r * src_row, n_in,
                                   f)) ||
            (s = st_quantize_row(dst, f, n_in, out)))
            s = st_fail(s, "%s: tensor '%s' row %" PRId64 ": %s", path, t->name, r,
                        st_last_error());
        else
            s = st_gguf_writer_stream(w, out, dst_row);
    }
    st_free(f);
    return s;
}

st_status st_convert_gguf(const char *src, const char *out_path, int type,
                          st_convert_progress_fn progress, void *user) {
    if (!src || !out_path)
        return st_fail(ST_ERR_INVALID, "st_convert_gguf: NULL argument");
    if (!st_convert_type_valid(type))
        return st_fail(ST_ERR_INVALID, "st_convert_gguf: unsupported output type %d", type);
    struct stat si, so;
    if (stat(src, &si) == 0 && stat(out_path, &so) == 0 && si.st_dev == so.st_dev &&
        si.st_ino == so.st_ino)
        return st_fail(ST_ERR_INVALID,
                       "%s: the output is the source; write the GGUF file "
                       "elsewhere",
                       out_path);
    st_load_params lp = st_load_default_params();
    lp.mode = ST_LOAD_MMAP; /* only for its checks and hyper-parameters */
    st_model *m = NULL;
    st_gguf *g = NULL;
    st_gguf_writer *w = NULL;
    st_status s = st_model_load_ex(src, &lp, &m);
    if (s || (s = st_gguf_open(src, &g)) || (s = st_gguf_writer_create(&w)))
        goto done;
    const st_model_hparams *hp = st_model_get_hparams(m);
    for (int64_t i = 0; i < st_gguf_n_kv(g) && !s; i++) {
        const char *key = st_gguf_key(g, i);
        if (type != ST_HF_KEEP && strcmp(key, "general.file_type") == 0)
            continue; /* written below, for the new types */
        s = st_gguf_writer_copy_kv(w, g, key);
    }
    if (!s && type != ST_HF_KEEP)
        s = st_gguf_writer_add_u32(w, "general.file_type", st_convert_file_type(type));
    const int64_t n = st_gguf_n_tensors(g);
    size_t total = 0;
    for (int64_t i = 0; i < n && !s; i++) {
        const st_gguf_tensor *t = st_gguf_tensor_at(g, i);
        const uint32_t dt = out_type(t, type, hp);
        size_t size;
        if (!(s = st_gguf_tensor_bytes(dt, t->n_dims, t->ne, &size)))
            s = st_gguf_writer_add_tensor(w, t->name, dt, t->n_dims, t->ne, NULL, size,
                                          ST_GGUF_REF);
        total += size;
    }
    if (s || (s = st_gguf_writer_begin_file(w, out_path)))
        goto done;
    size_t done = 0;
    for (int64_t i = 0; i < n && !s; i++) {
        const st_gguf_tensor *t = st_gguf_tensor_at(g, i);
        const uint32_t dt = out_type(t, type, hp);
        size_t size = 0;
        s = stream_tensor(w, src, t, dt);
        if (!s)
            s = st_gguf_tensor_bytes(dt, t->n_dims, t->ne, &size);
        done += size;
        if (!s && progress)
            progress(user, i + 1, n, done, total);
    }
    if (!s)
        s = st_gguf_writer_end_file(w);
done:
    st_gguf_writer_free(w); /* before end_file: removes the partial output */
    st_gguf_free(g);
    st_model_free(m);
    return s;
}
