/*
 * gguf_write.c: the GGUF v3 writer used by spectree-mkmodel and the tests (FORMATS.md §b).
 * KVs are serialized as they are added into one byte buffer, so the header is a few writes;
 * tensor data is written from the caller's buffers or streamed in chunks, so a model larger
 * than memory can be generated one row at a time. Also ggml's reference Q8_0/Q4_0 quantizers.
 */
#include "io/gguf_write.h"

#include "core/core.h"
#include "io/gguf_internal.h"
#include "kernels/kernels.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { W_MAX_DIMS = 4, W_MAX_NAME = 64, W_DEFAULT_ALIGNMENT = 32 };

typedef struct bytes {
    uint8_t *p;
    size_t n, cap;
} bytes;

typedef struct wtensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[W_MAX_DIMS];
    size_t size;
    const void *data; /* NULL: streamed */
    void *owned;      /* copy of data for ST_GGUF_COPY */
} wtensor;

struct st_gguf_writer {
    bytes kv;    /* serialized KV pairs */
    char **keys; /* (n_kv) for the uniqueness check */
    int64_t n_kv;
    wtensor *tensors; /* (n_tensors) */
    int64_t n_tensors, cap_tensors;
    uint32_t alignment;
    /* output state during a write */
    st_outfile out; /* the file being written: a temporary beside path until end_file */
    char *path;
    uint8_t *mem; /* memory target of write_memory */
    size_t mem_size;
    size_t pos;      /* bytes written so far */
    int64_t cur;     /* tensor being streamed */
    size_t cur_done; /* bytes of it written */
    int writing;
};

/* ------------------------------------------------------------------------------------------ */
/* Building                                                                                   */

static bool bytes_reserve(bytes *b, size_t extra) {
    size_t need;
    if (!st_add_size(b->n, extra, &need))
        return false;
    if (need <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        if (!st_mul_size(cap, 2, &cap))
            return false;
    uint8_t *p = st_realloc(b->p, cap);
    if (!p)
        return false;
    b->p = p;
    b->cap = cap;
    return true;
}

static bool bytes_put(bytes *b, const void *p, size_t n) {
    if (!bytes_reserve(b, n))
        return false;
    if (n)
        memcpy(b->p + b->n, p, n);
    b->n += n;
    return true;
}

static bool put_u32(bytes *b, uint32_t v) { return bytes_put(b, &v, 4); }
static bool put_u64(bytes *b, uint64_t v) { return bytes_put(b, &v, 8); }
static bool put_str(bytes *b, const char *s, uint64_t len) {
    return put_u64(b, len) && (len == 0 || bytes_put(b, s, (size_t)len));
}

st_status st_gguf_writer_create(st_gguf_writer **out) {
    if (!out)
        return st_fail(ST_ERR_INVALID, "st_gguf_writer_create: out is NULL");
    *out = st_calloc(1, sizeof **out);
    if (!*out)
        return st_fail(ST_ERR_NOMEM, "gguf writer: out of memory");
    (*out)->alignment = W_DEFAULT_ALIGNMENT;
    return ST_OK;
}

void st_gguf_writer_free(st_gguf_writer *w) {
    if (!w)
        return;
    if (w->out.f) /* freed while writing: the temporary file is removed */
        st_outfile_close(&w->out, 0);
    for (int64_t i = 0; i < w->n_kv; i++)
        st_free(w->keys[i]);
    st_free(w->keys);
    for (int64_t i = 0; i < w->n_tensors; i++) {
        st_free(w->tensors[i].name);
        st_free(w->tensors[i].owned);
    }
    st_free(w->tensors);
    st_free(w->kv.p);
    st_free(w->path);
    st_free(w);
}

/* Checks that a KV can be added and writes its key and type; *mark is where to roll back to. */
static st_status kv_begin(st_gguf_writer *w, const char *key, st_gguf_type type, size_t *mark) {
    if (!w || !key)
        return st_fail(ST_ERR_INVALID, "gguf writer: NULL argument");
    if (w->writing)
        return st_fail(ST_ERR_INVALID, "gguf writer: key '%s' added after begin_file", key);
    if (!key[0])
        return st_fail(ST_ERR_INVALID, "gguf writer: empty key");
    for (int64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0)
            return st_fail(ST_ERR_INVALID, "gguf writer: duplicate key '%s'", key);
    if (strcmp(key, "general.alignment") == 0 && type != ST_GGUF_UINT32)
        return st_fail(ST_ERR_INVALID, "gguf writer: general.alignment must be a u32");
    *mark = w->kv.n;
    if (!put_str(&w->kv, key, strlen(key)) || !put_u32(&w->kv, (uint32_t)type)) {
        w->kv.n = *mark;
        return st_fail(ST_ERR_NOMEM, "gguf writer: out of memory");
    }
    return ST_OK;
}

/* Records the key of a KV whose bytes are complete (ok) or rolls them back. */
static st_status kv_end(st_gguf_writer *w, const char *key, size_t mark, bool ok) {
    char **keys = ok ? st_realloc(w->keys, (size_t)(w->n_kv + 1) * sizeof *keys) : NULL;
    if (keys)
        w->keys = keys;
    char *k = keys ? st_strdup(key) : NULL;
    if (!k) {
        w->kv.n = mark;
        return st_fail(ST_ERR_NOMEM, "gguf writer: out of memory for key '%s'", key);
    }
    w->keys[w->n_kv++] = k;
    return ST_OK;
}

static st_status add_scalar(st_gguf_writer *w, const char *key, st_gguf_type type, const void *v) {
    size_t mark;
    st_status s = kv_begin(w, key, type, &mark);
    if (s)
        return s;
    return kv_end(w, key, mark, bytes_put(&w->kv, v, st_gguf_type_size(type)));
}

st_status st_gguf_writer_add_u8(st_gguf_writer *w, const char *key, uint8_t v) {
    return add_scalar(w, key, ST_GGUF_UINT8, &v);
}
st_status st_gguf_writer_add_i8(st_gguf_writer *w, const char *key, int8_t v) {
    return add_scalar(w, key, ST_GGUF_INT8, &v);
}
st_status st_gguf_writer_add_u16(st_gguf_writer *w, const char *key, uint16_t v) {
    return add_scalar(w, key, ST_GGUF_UINT16, &v);
}
st_status st_gguf_writer_add_i16(st_gguf_writer *w, const char *key, int16_t v) {
    return add_scalar(w, key, ST_GGUF_INT16, &v);
}
st_status st_gguf_writer_add_u32(st_gguf_writer *w, const char *key, uint32_t v) {
    bool align = key && strcmp(key, "general.alignment") == 0;
    if (align && (v == 0 || (v & (v - 1)) != 0))
        return st_fail(ST_ERR_INVALID, "gguf writer: general.alignment %u is not a power of two",
                       v);
    st_status s = add_scalar(w, key, ST_GGUF_UINT32, &v);
    if (s == ST_OK && align)
        w->alignment = v;
    return s;
}
st_status st_gguf_writer_add_i32(st_gguf_writer *w, const char *key, int32_t v) {
    return add_scalar(w, key, ST_GGUF_INT32, &v);
}
st_status st_gguf_writer_add_f32(st_gguf_writer *w, const char *key, float v) {
    return add_scalar(w, key, ST_GGUF_FLOAT32, &v);
}
st_status st_gguf_writer_add_bool(st_gguf_writer *w, const char *key, int v) {
    if (v != 0 && v != 1)
        return st_fail(ST_ERR_INVALID, "gguf writer: bool '%s' must be 0 or 1, got %d",
                       key ? key : "?", v);
    uint8_t b = (uint8_t)v;
    return add_scalar(w, key, ST_GGUF_BOOL, &b);
}
st_status st_gguf_writer_add_u64(st_gguf_writer *w, const char *key, uint64_t v) {
    return add_scalar(w, key, ST_GGUF_UINT64, &v);
}
st_status st_gguf_writer_add_i64(st_gguf_writer *w, const char *key, int64_t v) {
    return add_scalar(w, key, ST_GGUF_INT64, &v);
}
st_status st_gguf_writer_add_f64(st_gguf_writer *w, const char *key, double v) {
    return add_scalar(w, key, ST_GGUF_FLOAT64, &v);
}

st_status st_gguf_writer_add_strn(st_gguf_writer *w, const char *key, const char *s, uint64_t len) {
    if (!s && len)
        return st_fail(ST_ERR_INVALID, "gguf writer: NULL string for '%s'", key ? key : "?");
    size_t mark;
    st_status st = kv_begin(w, key, ST_GGUF_STRING, &mark);
    if (st)
        return st;
    return kv_end(w, key, mark, len <= SIZE_MAX && put_str(&w->kv, s, len));
}

st_status st_gguf_writer_add_str(st_gguf_writer *w, const char *key, const char *s) {
    if (!s)
        return st_fail(ST_ERR_INVALID, "gguf writer: NULL string for '%s'", key ? key : "?");
    return st_gguf_writer_add_strn(w, key, s, strlen(s));
}

/* An array argument: n >= 0 elements at data (NULL only when n is 0); false after st_fail. */
static bool arr_args_ok(const char *key, const void *data, int64_t n) {
    if (n >= 0 && (data || n == 0))
        return true;
    st_fail(ST_ERR_INVALID, "gguf writer: array '%s' has a bad length or data", key ? key : "?");
    return false;
}

st_status st_gguf_writer_add_arr(st_gguf_writer *w, const char *key, st_gguf_type type,
                                 const void *data, int64_t n) {
    size_t es = st_gguf_type_size(type), total;
    if (es == 0)
        return st_fail(ST_ERR_INVALID, "gguf writer: array '%s' has element type %d",
                       key ? key : "?", (int)type);
    if (!arr_args_ok(key, data, n))
        return ST_ERR_INVALID;
    if (!st_mul_size((size_t)n, es, &total))
        return st_fail(ST_ERR_INVALID, "gguf writer: array '%s' is too large", key ? key : "?");
    if (type == ST_GGUF_BOOL)
        for (int64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return st_fail(ST_ERR_INVALID, "gguf writer: array '%s': bool %" PRId64 " is %u",
                               key ? key : "?", i, ((const uint8_t *)data)[i]);
    size_t mark;
    st_status s = kv_begin(w, key, ST_GGUF_ARRAY, &mark);
    if (s)
        return s;
    bool ok = put_u32(&w->kv, (uint32_t)type) && put_u64(&w->kv, (uint64_t)n) &&
              bytes_put(&w->kv, data, total);
    return kv_end(w, key, mark, ok);
}

st_status st_gguf_writer_add_arr_strn(st_gguf_writer *w, const char *key, const st_gguf_str *s,
                                      int64_t n) {
    if (!arr_args_ok(key, s, n))
        return ST_ERR_INVALID;
    for (int64_t i = 0; i < n; i++)
        if ((!s[i].ptr && s[i].len) || s[i].len > SIZE_MAX)
            return st_fail(ST_ERR_INVALID, "gguf writer: array '%s': string %" PRId64 " is NULL",
                           key ? key : "?", i);
    size_t mark;
    st_status st = kv_begin(w, key, ST_GGUF_ARRAY, &mark);
    if (st)
        return st;
    bool ok = put_u32(&w->kv, ST_GGUF_STRING) && put_u64(&w->kv, (uint64_t)n);
    for (int64_t i = 0; ok && i < n; i++)
        ok = put_str(&w->kv, s[i].ptr, s[i].len);
    return kv_end(w, key, mark, ok);
}

st_status st_gguf_writer_add_arr_str(st_gguf_writer *w, const char *key, const char *const *s,
                                     int64_t n) {
    if (!arr_args_ok(key, s, n))
        return ST_ERR_INVALID;
    st_gguf_str *v = st_malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return st_fail(ST_ERR_NOMEM, "gguf writer: out of memory for array '%s'", key ? key : "?");
    st_status st = ST_OK;
    for (int64_t i = 0; i < n && !st; i++) {
        if (!s[i])
            st = st_fail(ST_ERR_INVALID, "gguf writer: array '%s': string %" PRId64 " is NULL",
                         key ? key : "?", i);
        else
            v[i] = (st_gguf_str){s[i], strlen(s[i])};
    }
    if (!st)
        st = st_gguf_writer_add_arr_strn(w, key, v, n);
    st_free(v);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Copying from a reader                                                                      */

static st_status copy_array(st_gguf_writer *w, const st_gguf *g, int64_t i, const char *key) {
    st_gguf_type at = st_gguf_arr_type(g, i);
    int64_t n = st_gguf_arr_len(g, i);
    if (at != ST_GGUF_STRING)
        return st_gguf_writer_add_arr(w, key, at, st_gguf_arr_data(g, i), n);
    st_gguf_str *v = st_malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return st_fail(ST_ERR_NOMEM, "gguf writer: out of memory copying '%s'", key);
    st_status s = ST_OK;
    for (int64_t k = 0; k < n && !s; k++)
        s = st_gguf_arr_str(g, i, k, &v[k]);
    if (!s)
        s = st_gguf_writer_add_arr_strn(w, key, v, n);
    st_free(v);
    return s;
}

st_status st_gguf_writer_copy_kv(st_gguf_writer *w, const st_gguf *g, const char *key) {
    if (!w || !g || !key)
        return st_fail(ST_ERR_INVALID, "gguf writer: NULL argument");
    int64_t i = st_gguf_find(g, key);
    if (i < 0)
        return st_fail(ST_ERR_INVALID, "gguf writer: source has no key '%s'", key);
    st_gguf_type t = st_gguf_kv_type(g, i);
    st_status s = ST_OK;
    int64_t iv = 0;
    float f = 0;
    int b = 0;
    if (t == ST_GGUF_ARRAY)
        return copy_array(w, g, i, key);
    if (t == ST_GGUF_STRING) {
        st_gguf_str str;
        if ((s = st_gguf_get_str(g, key, &str)))
            return s;
        return st_gguf_writer_add_strn(w, key, str.ptr, str.len);
    }
    if (t == ST_GGUF_UINT64) {
        /* The formatted value is exact for u64, including values above INT64_MAX. */
        char buf[32];
        st_gguf_format_value(g, i, buf, sizeof buf);
        return st_gguf_writer_add_u64(w, key, strtoull(buf, NULL, 10));
    }
    if (t == ST_GGUF_FLOAT32 || t == ST_GGUF_FLOAT64)
        s = st_gguf_get_f32(g, key, &f);
    else if (t == ST_GGUF_BOOL)
        s = st_gguf_get_bool(g, key, &b);
    else
        s = st_gguf_get_i64(g, key, &iv);
    if (s)
        return s;
    switch (t) {
    case ST_GGUF_UINT8:
        return st_gguf_writer_add_u8(w, key, (uint8_t)iv);
    case ST_GGUF_INT8:
        return st_gguf_writer_add_i8(w, key, (int8_t)iv);
    case ST_GGUF_UINT16:
        return st_gguf_writer_add_u16(w, key, (uint16_t)iv);
    case ST_GGUF_INT16:
        return st_gguf_writer_add_i16(w, key, (int16_t)iv);
    case ST_GGUF_UINT32:
        return st_gguf_writer_add_u32(w, key, (uint32_t)iv);
    case ST_GGUF_INT32:
        return st_gguf_writer_add_i32(w, key, (int32_t)iv);
    case ST_GGUF_INT64:
        return st_gguf_writer_add_i64(w, key, iv);
    case ST_GGUF_FLOAT32:
        return st_gguf_writer_add_f32(w, key, f);
    case ST_GGUF_FLOAT64:
        return st_gguf_writer_add_f64(w, key, (double)f);
    case ST_GGUF_BOOL:
        return st_gguf_writer_add_bool(w, key, b);
    default:
        return st_fail(ST_ERR_INVALID, "gguf writer: key '%s' has type %d", key, (int)t);
    }
}

st_status st_gguf_writer_copy_tokenizer(st_gguf_writer *w, const st_gguf *g,
                                        const char *const *extra, int n_extra) {
    if (!w || !g || (n_extra > 0 && !extra))
        return st_fail(ST_ERR_INVALID, "gguf writer: NULL argument");
    for (int64_t i = 0; i < st_gguf_n_kv(g); i++) {
        const char *key = st_gguf_key(g, i);
        bool want = strncmp(key, "tokenizer.", 10) == 0;
        for (int k = 0; k < n_extra && !want; k++)
            want = extra[k] && strcmp(extra[k], key) == 0;
        st_status s = want ? st_gguf_writer_copy_kv(w, g, key) : ST_OK;
        if (s)
            return s;
    }
    return ST_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Tensors                                                                                    */

st_status st_gguf_tensor_bytes(uint32_t type, uint32_t n_dims, const int64_t *ne, size_t *out) {
    if (!out || !ne)
        return st_fail(ST_ERR_INVALID, "gguf writer: NULL argument");
    st_status s = st_gguf_tensor_size(type, n_dims, ne, ST_ERR_INVALID, ST_ERR_INVALID, out);
    if (s)
        st_error_prefix("gguf writer");
    return s;
}

st_status st_gguf_writer_add_tensor(st_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const int64_t *ne, const void *data,
                                    size_t size, int mode) {
    if (!w || !name || !ne)
        return st_fail(ST_ERR_INVALID, "gguf writer: NULL argument");
    if (w->writing)
        return st_fail(ST_ERR_INVALID, "gguf writer: tensor '%s' added after begin_file", name);
    size_t len = strlen(name);
    if (len == 0 || len >= W_MAX_NAME)
        return st_fail(ST_ERR_INVALID, "gguf writer: tensor name '%s' must be 1..%d bytes", name,
                       W_MAX_NAME - 1);
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return st_fail(ST_ERR_INVALID, "gguf writer: duplicate tensor '%s'", name);
    size_t want;
    st_status s = st_gguf_tensor_bytes(type, n_dims, ne, &want);
    if (s) {
        st_error_prefix("tensor '%s'", name);
        return s;
    }
    if (data && size != want)
        return st_fail(ST_ERR_INVALID, "gguf writer: tensor '%s' needs %zu bytes, got %zu", name,
                       want, size);
    if (mode != ST_GGUF_REF && mode != ST_GGUF_COPY)
        return st_fail(ST_ERR_INVALID, "gguf writer: tensor '%s': bad mode %d", name, mode);
    if (w->n_tensors == w->cap_tensors) {
        int64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
        wtensor *t = st_realloc(w->tensors, (size_t)cap * sizeof *t);
        if (!t)
            return st_fail(ST_ERR_NOMEM, "gguf writer: out of memory");
        w->tensors = t;
        w->cap_tensors = cap;
    }
    wtensor t = {.type = type, .n_dims = n_dims, .size = want, .data = data};
    for (int d = 0; d < W_MAX_DIMS; d++)
        t.ne[d] = d < (int)n_dims ? ne[d] : 1;
    t.name = st_strdup(name);
    if (t.name && data && mode == ST_GGUF_COPY) {
        t.owned = st_malloc(want);
        if (t.owned)
            memcpy(t.owned, data, want);
        t.data = t.owned;
    }
    if (!t.name || (data && mode == ST_GGUF_COPY && !t.owned)) {
        st_free(t.name);
        return st_fail(ST_ERR_NOMEM, "gguf writer: out of memory for tensor '%s'", name);
    }
    w->tensors[w->n_tensors++] = t;
    return ST_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Writing                                                                                    */

uint32_t st_gguf_writer_alignment(const st_gguf_writer *w) { return w->alignment; }

static size_t pad_to(size_t n, uint32_t a) { return (a - n % a) % a; }

/* Bytes of the tensor infos. */
static size_t infos_size(const st_gguf_writer *w) {
    size_t n = 0;
    for (int64_t i = 0; i < w->n_tensors; i++)
        n += 8 + strlen(w->tensors[i].name) + 4 + 8 * (size_t)w->tensors[i].n_dims + 4 + 8;
    return n;
}

/* Header, KVs and tensor infos, before the padding to the data blob. */
static size_t meta_size(const st_gguf_writer *w) { return 24 + w->kv.n + infos_size(w); }

/* Total size, or 0 when it overflows size_t. */
size_t st_gguf_writer_file_size(const st_gguf_writer *w) {
    size_t n = meta_size(w);
    if (w->n_tensors == 0)
        return n;
    n += pad_to(n, w->alignment);
    for (int64_t i = 0; i < w->n_tensors; i++) {
        size_t sz = w->tensors[i].size;
        if (!st_add_size(n, sz, &n) || !st_add_size(n, pad_to(sz, w->alignment), &n))
            return 0;
    }
    return n;
}

static st_status out_write(st_gguf_writer *w, const void *p, size_t n) {
    if (n == 0)
        return ST_OK;
    if (w->mem) {
        if (n > w->mem_size - w->pos)
            return st_fail(ST_ERR_INVALID, "gguf writer: memory image overflow");
        memcpy(w->mem + w->pos, p, n);
    } else if (fwrite(p, 1, n, w->out.f) != n) {
        return st_fail(ST_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    }
    w->pos += n;
    return ST_OK;
}

static st_status out_zeros(st_gguf_writer *w, size_t n) {
    static const uint8_t zeros[256];
    while (n > 0) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        st_status s = out_write(w, zeros, k);
        if (s)
            return s;
        n -= k;
    }
    return ST_OK;
}

/* Writes everything before the tensor data and resets the stream position. */
static st_status write_meta(st_gguf_writer *w) {
    bytes b = {0};
    bool ok = bytes_put(&b, "GGUF", 4) && put_u32(&b, 3) && put_u64(&b, (uint64_t)w->n_tensors) &&
              put_u64(&b, (uint64_t)w->n_kv) && bytes_put(&b, w->kv.p, w->kv.n);
    uint64_t off = 0;
    for (int64_t i = 0; ok && i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        ok = put_str(&b, t->name, strlen(t->name)) && put_u32(&b, t->n_dims);
        for (uint32_t d = 0; ok && d < t->n_dims; d++)
            ok = put_u64(&b, (uint64_t)t->ne[d]);
        ok = ok && put_u32(&b, t->type) && put_u64(&b, off);
        off += t->size + pad_to(t->size, w->alignment);
    }
    st_status s = ok ? out_write(w, b.p, b.n) : st_fail(ST_ERR_NOMEM, "gguf writer: out of memory");
    if (!s && w->n_tensors > 0)
        s = out_zeros(w, pad_to(b.n, w->alignment));
    st_free(b.p);
    w->cur = 0;
    w->cur_done = 0;
    return s;
}

/* Pads and moves past every completed tensor at the stream position (empty ones included). */
static st_status advance(st_gguf_writer *w) {
    while (w->cur < w->n_tensors && w->cur_done == w->tensors[w->cur].size) {
        st_status s = out_zeros(w, pad_to(w->tensors[w->cur].size, w->alignment));
        if (s)
            return s;
        w->cur++;
        w->cur_done = 0;
    }
    return ST_OK;
}

st_status st_gguf_writer_stream(st_gguf_writer *w, const void *data, size_t size) {
    if (!w || (!data && size))
        return st_fail(ST_ERR_INVALID, "gguf writer: NULL argument");
    if (!w->writing)
        return st_fail(ST_ERR_INVALID, "gguf writer: stream without begin_file");
    const uint8_t *p = data;
    while (size > 0) {
        if (w->cur >= w->n_tensors)
            return st_fail(ST_ERR_INVALID, "gguf writer: %zu bytes streamed past the last tensor",
                           size);
        size_t k = w->tensors[w->cur].size - w->cur_done;
        if (k > size)
            k = size;
        st_status s = out_write(w, p, k);
        if (s)
            return s;
        p += k;
        size -= k;
        w->cur_done += k;
        if ((s = advance(w)))
            return s;
    }
    return ST_OK;
}

static st_status stream_all(st_gguf_writer *w, st_gguf_write_progress_fn progress, void *user) {
    st_status s = ST_OK;
    size_t done = 0, total = 0;
    for (int64_t i = 0; i < w->n_tensors; i++)
        total += w->tensors[i].size;
    for (int64_t i = 0; i < w->n_tensors && !s; i++) {
        if (!w->tensors[i].data && w->tensors[i].size)
            return st_fail(ST_ERR_INVALID, "gguf writer: tensor '%s' has no data",
                           w->tensors[i].name);
        s = st_gguf_writer_stream(w, w->tensors[i].data, w->tensors[i].size);
        done += w->tensors[i].size;
        if (!s && progress)
            progress(user, i + 1, w->n_tensors, done, total);
    }
    return s;
}

st_status st_gguf_writer_begin_file(st_gguf_writer *w, const char *path) {
    if (!w || !path)
        return st_fail(ST_ERR_INVALID, "gguf writer: NULL argument");
    if (w->writing)
        return st_fail(ST_ERR_INVALID, "gguf writer: begin_file while writing");
    st_free(w->path);
    if (!(w->path = st_strdup(path)))
        return st_fail(ST_ERR_NOMEM, "gguf writer: out of memory");
    st_status s = st_outfile_open(path, &w->out);
    if (s)
        return s;
    w->writing = 1;
    w->pos = 0;
    s = write_meta(w);
    return s ? s : advance(w);
}

st_status st_gguf_writer_end_file(st_gguf_writer *w) {
    if (!w || !w->writing)
        return st_fail(ST_ERR_INVALID, "gguf writer: end_file without begin_file");
    w->writing = 0;
    st_status s = ST_OK;
    if (w->cur < w->n_tensors)
        s = st_fail(ST_ERR_INVALID, "%s: tensor '%s' is missing %zu bytes of data", w->path,
                    w->tensors[w->cur].name, w->tensors[w->cur].size - w->cur_done);
    if (w->out.f) { /* renamed over path when every byte came and reached the disk */
        st_status e = st_outfile_close(&w->out, s == ST_OK);
        if (!s)
            s = e;
    }
    return s;
}

st_status st_gguf_writer_write_file(st_gguf_writer *w, const char *path) {
    return st_gguf_writer_write_file_ex(w, path, NULL, NULL);
}

st_status st_gguf_writer_write_file_ex(st_gguf_writer *w, const char *path,
                                       st_gguf_write_progress_fn progress, void *user) {
    st_status s = st_gguf_writer_begin_file(w, path);
    if (!s)
        s = stream_all(w, progress, user);
    if (w && w->writing) {
        st_status e = st_gguf_writer_end_file(w);
        if (!s)
            s = e;
    }
    return s;
}

st_status st_gguf_writer_write_memory(st_gguf_writer *w, void **buf, size_t *size) {
    if (!w || !buf || !size)
        return st_fail(ST_ERR_INVALID, "gguf writer: NULL argument");
    *buf = NULL;
    *size = 0;
    if (w->writing)
        return st_fail(ST_ERR_INVALID, "gguf writer: write_memory while writing");
    size_t total = st_gguf_writer_file_size(w);
    if (total == 0)
        return st_fail(ST_ERR_INVALID, "gguf writer: file too large");
    w->mem = st_malloc(total);
    if (!w->mem)
        return st_fail(ST_ERR_NOMEM, "gguf writer: out of memory for %zu bytes", total);
    w->mem_size = total;
    w->pos = 0;
    w->writing = 1;
    st_status s = write_meta(w);
    if (!s)
        s = advance(w);
    if (!s)
        s = stream_all(w, NULL, NULL);
    w->writing = 0;
    if (!s && w->pos != total)
        s = st_fail(ST_ERR_INVALID, "gguf writer: wrote %zu of %zu bytes", w->pos, total);
    if (s) {
        st_free(w->mem);
    } else {
        *buf = w->mem;
        *size = total;
    }
    w->mem = NULL;
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* Float to weight rows                                                                       */

/* The int8 of a rounded value in [-127, 127]; the clamp (and NaN -> 0) only matters for a
 * subnormal d, whose reciprocal overflows. */
static int8_t q8(float q) {
    if (q != q)
        return 0;
    return (int8_t)(q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q));
}

void st_quantize_q8_0(const float *x, int64_t n, void *dst) {
    st_block_q8_0 *y = dst;
    for (int64_t b = 0; b < n / ST_QK; b++) {
        const float *xb = x + b * ST_QK;
        float amax = 0.0f;
        for (int j = 0; j < ST_QK; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = st_f32_to_fp16(d);
        for (int j = 0; j < ST_QK; j++)
            y[b].q[j] = q8(roundf(xb[j] * id));
    }
}

/* min(15, trunc(v + 8.5)); the lower clamp (and NaN -> 0) only matters for a subnormal d. */
static int nibble(float v) {
    float t = v + 8.5f;
    if (!(t >= 0.0f))
        return 0;
    return t < 15.0f ? (int)t : 15;
}

void st_quantize_q4_0(const float *x, int64_t n, void *dst) {
    st_block_q4_0 *y = dst;
    for (int64_t b = 0; b < n / ST_QK; b++) {
        const float *xb = x + b * ST_QK;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < ST_QK; j++)
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = st_f32_to_fp16(d);
        for (int j = 0; j < ST_QK / 2; j++)
            y[b].qs[j] = (uint8_t)(nibble(xb[j] * id) | (nibble(xb[j + ST_QK / 2] * id) << 4));
    }
}

st_status st_quantize_row(uint32_t type, const float *x, int64_t n, void *dst) {
    if ((!x || !dst) && n > 0)
        return st_fail(ST_ERR_INVALID, "quantize: NULL argument");
    if (n < 0)
        return st_fail(ST_ERR_INVALID, "quantize: negative length %" PRId64, n);
    uint8_t *out = dst;
    switch (type) {
    case ST_DTYPE_F32:
        if (n)
            memcpy(dst, x, (size_t)n * sizeof(float));
        return ST_OK;
    case ST_DTYPE_F16:
    case ST_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = type == ST_DTYPE_F16 ? st_f32_to_fp16(x[i]) : st_f32_to_bf16(x[i]);
            memcpy(out + 2 * i, &h, 2);
        }
        return ST_OK;
    case ST_DTYPE_Q8_0:
    case ST_DTYPE_Q4_0:
        if (n % ST_QK != 0)
            return st_fail(ST_ERR_INVALID,
                           "quantize: %" PRId64 " elements is not a multiple of %d for %s", n,
                           ST_QK, st_dtype_name(type));
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(x[i]))
                return st_fail(ST_ERR_INVALID, "quantize: element %" PRId64 " is not finite", i);
        if (type == ST_DTYPE_Q8_0)
            st_quantize_q8_0(x, n, dst);
        else
            st_quantize_q4_0(x, n, dst);
        return ST_OK;
    case ST_DTYPE_Q2_K:
    case ST_DTYPE_Q3_K:
    case ST_DTYPE_Q4_K:
    case ST_DTYPE_Q5_K:
    case ST_DTYPE_Q6_K:
        if (n % ST_QK_K != 0)
            return st_fail(ST_ERR_INVALID,
                           "quantize: %" PRId64 " elements is not a multiple of %d for %s", n,
                           ST_QK_K, st_dtype_name(type));
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(x[i]))
                return st_fail(ST_ERR_INVALID, "quantize: element %" PRId64 " is not finite", i);
        st_quantize_row_kquant(type, x, dst, n);
        return ST_OK;
    default:
        return st_fail(ST_ERR_INVALID, "quantize: type %s (id %u) is not supported",
                       st_dtype_name(type), type);
    }
}

st_status st_dequantize_row(uint32_t type, const void *src, int64_t n, float *dst) {
    if ((!src || !dst) && n > 0)
        return st_fail(ST_ERR_INVALID, "dequantize: NULL argument");
    if (n < 0)
        return st_fail(ST_ERR_INVALID, "dequantize: negative length %" PRId64, n);
    switch (type) {
    case ST_DTYPE_F32:
    case ST_DTYPE_F16:
    case ST_DTYPE_BF16:
        break;
    case ST_DTYPE_Q8_0:
    case ST_DTYPE_Q4_0:
        if (n % ST_QK != 0)
            return st_fail(ST_ERR_INVALID,
                           "dequantize: %" PRId64 " elements is not a multiple of %d for %s", n,
                           ST_QK, st_dtype_name(type));
        break;
    case ST_DTYPE_Q2_K:
    case ST_DTYPE_Q3_K:
    case ST_DTYPE_Q4_K:
    case ST_DTYPE_Q5_K:
    case ST_DTYPE_Q6_K:
        if (n % ST_QK_K != 0)
            return st_fail(ST_ERR_INVALID,
                           "dequantize: %" PRId64 " elements is not a multiple of %d for %s", n,
                           ST_QK_K, st_dtype_name(type));
        break;
    default:
        return st_fail(ST_ERR_INVALID, "dequantize: type %s (id %u) is not supported",
                       st_dtype_name(type), type);
    }
    if (n)
        st_dequant_row(type, src, dst, n);
    return ST_OK;
}
