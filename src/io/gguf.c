/*
 * gguf.c: a bounds-checked GGUF v2/v3 reader over a read-only mapping (FORMATS.md §b).
 * One pass validates the whole header: every key, value, array and tensor info is checked
 * against the end of the buffer before it is used (and no two tensors' data may overlap), so a
 * truncated or corrupt file gives an error naming the file and the problem, never a crash. Values
 * are not copied: the KV table keeps offsets into the mapping. Keys and tensor names are copied,
 * NUL-terminated, into two growing blocks (a hostile header of millions of names costs a few
 * allocations, not millions).
 */
#include "io/gguf_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GGUF_MAX_DIMS = 4, GGUF_MAX_NAME = 64, GGUF_DEFAULT_ALIGNMENT = 32 };

typedef struct gguf_kv {
    const char *key; /* in st_gguf.names */
    st_gguf_type type;
    st_gguf_type arr_type; /* for arrays */
    int64_t n;             /* element count for arrays, 1 otherwise */
    size_t off;            /* offset of the value (for arrays: of the first element) */
    size_t *str_offs;      /* for arrays of strings: offset of each element's length field */
} gguf_kv;

struct st_gguf {
    char *name;
    st_mmap map; /* owned when opened from a path */
    void *copy;  /* owned: a st_huge_alloc copy of the file that replaced the mapping, or NULL */
    const uint8_t *data;
    size_t size;
    uint32_t version;
    uint32_t alignment;
    int64_t n_kv;
    gguf_kv *kv;
    int64_t n_tensors;
    st_gguf_tensor *tensors;
    char *keys, *tensor_names;  /* each block: the names in order, each NUL-terminated */
    st_name_index kv_index;     /* key -> index into kv */
    st_name_index tensor_index; /* name -> index into tensors */
    size_t data_off;            /* start of the tensor data blob */
};

/* A block names are copied into, in order. It moves as it grows: the pointers to its names
 * are set again once the last name is in. */
typedef struct name_block {
    char *p;
    size_t len, cap;
} name_block;

/* A cursor over the buffer; every read checks the remaining length. */
typedef struct cursor {
    const uint8_t *p;
    size_t size;
    size_t off;
    const char *name;
    name_block *names;
} cursor;

static st_status need(cursor *c, size_t n, const char *what) {
    if (n > c->size - c->off)
        return st_fail(ST_ERR_FORMAT,
                       "%s: truncated file: %s at byte %zu needs %zu bytes, %zu left", c->name,
                       what, c->off, n, c->size - c->off);
    return ST_OK;
}

static st_status rd(cursor *c, void *dst, size_t n, const char *what) {
    st_status s = need(c, n, what);
    if (s)
        return s;
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return ST_OK;
}

size_t st_gguf_type_size(st_gguf_type t) {
    switch (t) {
    case ST_GGUF_UINT8:
    case ST_GGUF_INT8:
    case ST_GGUF_BOOL:
        return 1;
    case ST_GGUF_UINT16:
    case ST_GGUF_INT16:
        return 2;
    case ST_GGUF_UINT32:
    case ST_GGUF_INT32:
    case ST_GGUF_FLOAT32:
        return 4;
    case ST_GGUF_UINT64:
    case ST_GGUF_INT64:
    case ST_GGUF_FLOAT64:
        return 8;
    case ST_GGUF_STRING:
    case ST_GGUF_ARRAY:
        return 0;
    }
    return 0;
}

static bool type_valid(uint32_t t) { return t <= ST_GGUF_FLOAT64; }

static const char *type_name(st_gguf_type t) {
    static const char *names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                  "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t <= ST_GGUF_FLOAT64 ? names[t] : "?";
}

/* Reads a string header: length then bytes. Returns the offset of the bytes. */
static st_status rd_str(cursor *c, size_t *str_off, uint64_t *len, const char *what) {
    uint64_t n;
    st_status s = rd(c, &n, 8, what);
    if (s)
        return s;
    if (n > c->size - c->off)
        return st_fail(ST_ERR_FORMAT, "%s: %s at byte %zu has length %" PRIu64 " past end of file",
                       c->name, what, c->off - 8, n);
    *str_off = c->off;
    *len = n;
    c->off += (size_t)n;
    return ST_OK;
}

/* Tensor types by GGUF id: name, elements per block and bytes per block (0: names only, a type
 * this reader cannot load). */
static const struct dtype_info {
    uint32_t id;
    const char *name;
    int64_t blk;
    size_t bytes;
} dtypes[] = {
    {ST_DTYPE_F32, "f32", 1, 4},
    {ST_DTYPE_F16, "f16", 1, 2},
    {ST_DTYPE_BF16, "bf16", 1, 2},
    {ST_DTYPE_Q8_0, "q8_0", 32, 34},
    {ST_DTYPE_Q4_0, "q4_0", 32, 18},
    {3, "q4_1", 0, 0},
    {6, "q5_0", 0, 0},
    {7, "q5_1", 0, 0},
    {ST_DTYPE_Q2_K, "q2_k", 256, 84}, /* K-quants: 256-element super-blocks (kernels/kquant.h) */
    {ST_DTYPE_Q3_K, "q3_k", 256, 110},
    {ST_DTYPE_Q4_K, "q4_k", 256, 144},
    {ST_DTYPE_Q5_K, "q5_k", 256, 176},
    {ST_DTYPE_Q6_K, "q6_k", 256, 210},
};

static const struct dtype_info *dtype_find(uint32_t type) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].id == type)
            return &dtypes[i];
    return NULL;
}

const char *st_dtype_name(uint32_t type) {
    const struct dtype_info *d = dtype_find(type);
    return d ? d->name : "unsupported";
}

st_status st_gguf_tensor_size(uint32_t type, uint32_t n_dims, const int64_t *ne, st_status bad_type,
                              st_status bad_shape, size_t *out) {
    const struct dtype_info *dt = dtype_find(type);
    if (!dt || dt->blk == 0)
        return st_fail(bad_type,
                       "type %s (id %u) is not supported; supported: f32, f16, bf16, "
                       "q8_0, q4_0, q2_k .. q6_k",
                       st_dtype_name(type), type);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return st_fail(bad_shape, "%u dimensions (must be 1..4)", n_dims);
    int64_t nel = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 0)
            return st_fail(bad_shape, "negative dimension %" PRId64, ne[d]);
        if (ne[d] != 0 && nel > INT64_MAX / ne[d])
            return st_fail(bad_shape, "too many elements");
        nel *= ne[d];
    }
    if (ne[0] % dt->blk != 0)
        return st_fail(bad_shape,
                       "row length %" PRId64 " is not a multiple of the %s block size %" PRId64,
                       ne[0], dt->name, dt->blk);
    if ((uint64_t)(nel / dt->blk) > SIZE_MAX ||
        !st_mul_size((size_t)(nel / dt->blk), dt->bytes, out))
        return st_fail(bad_shape, "too large");
    return ST_OK;
}

/* Reads a name (a metadata key or a tensor name): a string of 1..max-1 bytes without NUL,
 * appended with a NUL to the cursor's name block; *out points to it until the block next grows.
 * what: "metadata key" or "tensor name"; idx: its position, for the message. */
static st_status rd_name(cursor *c, const char *what, int64_t idx, uint64_t max, const char **out) {
    size_t off;
    uint64_t len;
    st_status s = rd_str(c, &off, &len, what);
    if (s)
        return s;
    if (len == 0)
        return st_fail(ST_ERR_FORMAT, "%s: %s %" PRId64 " is empty", c->name, what, idx);
    if (len >= max)
        return st_fail(ST_ERR_FORMAT,
                       "%s: %s %" PRId64 " is %" PRIu64 " bytes (at most %" PRIu64 ")", c->name,
                       what, idx, len, max - 1);
    if (memchr(c->p + off, 0, (size_t)len))
        return st_fail(ST_ERR_FORMAT, "%s: %s %" PRId64 " contains a NUL byte", c->name, what, idx);
    name_block *b = c->names;
    if ((size_t)len + 1 > b->cap - b->len) { /* len < the file's size: no overflow */
        size_t cap = b->cap ? b->cap : 4096;
        while ((size_t)len + 1 > cap - b->len)
            cap *= 2;
        char *p = st_realloc(b->p, cap);
        if (!p)
            return st_fail(ST_ERR_NOMEM, "%s: out of memory for %zu bytes of names", c->name, cap);
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, c->p + off, (size_t)len);
    b->p[b->len + (size_t)len] = '\0';
    *out = b->p + b->len;
    b->len += (size_t)len + 1;
    return ST_OK;
}

static st_status parse_kv(cursor *c, gguf_kv *kv, int64_t idx) {
    st_status s = rd_name(c, "metadata key", idx, UINT64_MAX, &kv->key);
    if (s)
        return s;
    uint32_t t;
    if ((s = rd(c, &t, 4, "metadata value type")))
        return s;
    if (!type_valid(t))
        return st_fail(ST_ERR_FORMAT, "%s: key '%s' has invalid value type %u", c->name, kv->key,
                       t);
    kv->type = (st_gguf_type)t;
    kv->n = 1;
    if (t == ST_GGUF_STRING) {
        size_t so;
        uint64_t sl;
        kv->off = c->off;
        return rd_str(c, &so, &sl, "string value");
    }
    if (t != ST_GGUF_ARRAY) {
        kv->off = c->off;
        if ((s = need(c, st_gguf_type_size(kv->type), "metadata value")))
            return s;
        if (t == ST_GGUF_BOOL && c->p[c->off] > 1)
            return st_fail(ST_ERR_FORMAT, "%s: key '%s' has bool value %u (must be 0 or 1)",
                           c->name, kv->key, c->p[c->off]);
        c->off += st_gguf_type_size(kv->type);
        return ST_OK;
    }
    uint32_t at;
    uint64_t n;
    if ((s = rd(c, &at, 4, "array element type")) || (s = rd(c, &n, 8, "array length")))
        return s;
    if (!type_valid(at) || at == ST_GGUF_ARRAY)
        return st_fail(ST_ERR_FORMAT, "%s: key '%s' is an array of invalid element type %u",
                       c->name, kv->key, at);
    if (n > (uint64_t)INT64_MAX || n > c->size - c->off)
        return st_fail(ST_ERR_FORMAT, "%s: key '%s': array length %" PRIu64 " past end of file",
                       c->name, kv->key, n);
    kv->arr_type = (st_gguf_type)at;
    kv->n = (int64_t)n;
    kv->off = c->off;
    if (at != ST_GGUF_STRING) {
        size_t bytes;
        if (!st_mul_size((size_t)n, st_gguf_type_size(kv->arr_type), &bytes))
            return st_fail(ST_ERR_FORMAT, "%s: key '%s': array too large", c->name, kv->key);
        if ((s = need(c, bytes, "array data")))
            return s;
        if (at == ST_GGUF_BOOL)
            for (size_t i = 0; i < bytes; i++)
                if (c->p[c->off + i] > 1)
                    return st_fail(ST_ERR_FORMAT, "%s: key '%s': bool element %zu is %u", c->name,
                                   kv->key, i, c->p[c->off + i]);
        c->off += bytes;
        return ST_OK;
    }
    /* Each string takes at least 8 bytes, so n is bounded by the file size checked above. */
    kv->str_offs = st_malloc((size_t)(n ? n : 1) * sizeof(size_t));
    if (!kv->str_offs)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory for array '%s'", c->name, kv->key);
    for (uint64_t i = 0; i < n; i++) {
        size_t so;
        uint64_t sl;
        kv->str_offs[i] = c->off;
        if ((s = rd_str(c, &so, &sl, "array string")))
            return s;
    }
    return ST_OK;
}

static st_status parse_tensor(cursor *c, st_gguf_tensor *t, int64_t idx) {
    st_status s = rd_name(c, "tensor name", idx, GGUF_MAX_NAME, &t->name);
    if (s)
        return s;
    if ((s = rd(c, &t->n_dims, 4, "tensor dimension count")))
        return s;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' has %u dimensions (must be 1..4)", c->name,
                       t->name, t->n_dims);
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        if ((s = rd(c, &t->ne[d], 8, "tensor dimension")))
            return s;
    if ((s = rd(c, &t->type, 4, "tensor type")) || (s = rd(c, &t->offset, 8, "tensor offset")))
        return s;
    s = st_gguf_tensor_size(t->type, t->n_dims, t->ne, ST_ERR_UNSUPPORTED, ST_ERR_FORMAT, &t->size);
    if (s)
        st_error_prefix("%s: tensor '%s'", c->name, t->name);
    return s;
}

void st_gguf_free(st_gguf *g) {
    if (!g)
        return;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++)
            st_free(g->kv[i].str_offs);
    st_free(g->kv);
    st_free(g->tensors);
    st_free(g->keys);
    st_free(g->tensor_names);
    st_name_index_free(&g->kv_index);
    st_name_index_free(&g->tensor_index);
    st_mmap_close(&g->map);
    st_huge_free(g->copy, g->size);
    st_free(g->name);
    st_free(g);
}

/* The name after `name` in its block (names were appended in order). */
static const char *next_name(const char *name) { return name + strlen(name) + 1; }

static const char *kv_key(const void *kv, int64_t i) { return ((const gguf_kv *)kv)[i].key; }
static const char *tensor_name(const void *t, int64_t i) {
    return ((const st_gguf_tensor *)t)[i].name;
}

static int cmp_by_offset(const void *a, const void *b) {
    const st_gguf_tensor *x = *(const st_gguf_tensor *const *)a,
                         *y = *(const st_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* No two tensors share a byte of data (a write into one would change the other, and a crafted
 * file could pass one blob off as several weights); empty tensors share nothing. */
static st_status check_overlaps(const st_gguf *g) {
    const st_gguf_tensor **by = st_malloc((size_t)g->n_tensors * sizeof *by);
    if (!by)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", g->name);
    int64_t n = 0;
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].size)
            by[n++] = &g->tensors[i];
    qsort(by, (size_t)n, sizeof *by, cmp_by_offset);
    st_status s = ST_OK;
    for (int64_t i = 1; i < n && !s; i++) {
        const st_gguf_tensor *a = by[i - 1], *b = by[i];
        if (b->offset < a->offset + a->size)
            s = st_fail(ST_ERR_FORMAT,
                        "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64
                        ", %" PRIu64 ") overlap",
                        g->name, a->name, a->offset, a->offset + a->size, b->name, b->offset,
                        b->offset + b->size);
    }
    st_free(by);
    return s;
}

static st_status gguf_parse(st_gguf *g) {
    name_block keys = {0}, tensor_names = {0};
    cursor c = {g->data, g->size, 0, g->name, &keys};
    char magic[4];
    st_status s = rd(&c, magic, 4, "magic");
    if (s)
        return s;
    if (memcmp(magic, "GGUF", 4) != 0)
        return st_fail(ST_ERR_FORMAT, "%s: not a GGUF file (bad magic)", g->name);
    if ((s = rd(&c, &g->version, 4, "version")))
        return s;
    if (g->version != 2 && g->version != 3) {
        if (g->version == 0x03000000u || g->version == 0x02000000u)
            return st_fail(ST_ERR_UNSUPPORTED, "%s: big-endian GGUF files are not supported",
                           g->name);
        return st_fail(ST_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2 or 3)", g->name,
                       g->version);
    }
    int64_t nt, nkv;
    if ((s = rd(&c, &nt, 8, "tensor count")) || (s = rd(&c, &nkv, 8, "metadata count")))
        return s;
    if (nkv < 0)
        return st_fail(ST_ERR_FORMAT, "%s: invalid metadata count %" PRId64, g->name, nkv);
    if (nt < 0)
        return st_fail(ST_ERR_FORMAT, "%s: invalid tensor count %" PRId64, g->name, nt);
    /* Each KV takes at least 8+1+4+1 bytes and each tensor info 8+1+4+8+4+8 bytes: a count the
     * rest of the file cannot hold is a truncated (or corrupt) header, refused before any
     * allocation is sized from it. */
    size_t left = g->size - c.off;
    if ((uint64_t)nkv > left / 14 || (uint64_t)nt > (left - (size_t)nkv * 14) / 33)
        return st_fail(ST_ERR_FORMAT,
                       "%s: truncated file: the header declares %" PRId64
                       " metadata entries and %" PRId64
                       " tensors, more than the %zu bytes after it can hold",
                       g->name, nkv, nt, left);
    g->kv = st_calloc((size_t)(nkv ? nkv : 1), sizeof *g->kv);
    g->tensors = st_calloc((size_t)(nt ? nt : 1), sizeof *g->tensors);
    if (!g->kv || !g->tensors)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", g->name);
    for (int64_t i = 0; i < nkv; i++) {
        g->n_kv = i + 1;
        if ((s = parse_kv(&c, &g->kv[i], i))) {
            st_free(keys.p);
            return s;
        }
    }
    g->keys = keys.p; /* no more keys: point each at its final place */
    for (int64_t i = 0; i < nkv; i++)
        g->kv[i].key = i ? next_name(g->kv[i - 1].key) : g->keys;
    int64_t dup;
    if ((s = st_name_index_build(&g->kv_index, nkv, kv_key, g->kv, &dup))) {
        st_error_prefix("%s", g->name);
        return s;
    }
    if (dup >= 0)
        return st_fail(ST_ERR_FORMAT, "%s: duplicate metadata key '%s'", g->name, g->kv[dup].key);
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = st_gguf_find(g, "general.alignment");
    if (ai >= 0) {
        if (g->kv[ai].type != ST_GGUF_UINT32)
            return st_fail(ST_ERR_FORMAT, "%s: general.alignment has type %s, expected u32",
                           g->name, type_name(g->kv[ai].type));
        memcpy(&g->alignment, g->data + g->kv[ai].off, 4);
        if (g->alignment == 0 || (g->alignment & (g->alignment - 1)) != 0)
            return st_fail(ST_ERR_FORMAT, "%s: general.alignment %u is not a power of two", g->name,
                           g->alignment);
    }
    c.names = &tensor_names;
    for (int64_t i = 0; i < nt; i++) {
        g->n_tensors = i + 1;
        if ((s = parse_tensor(&c, &g->tensors[i], i))) {
            st_free(tensor_names.p);
            return s;
        }
    }
    g->tensor_names = tensor_names.p;
    for (int64_t i = 0; i < nt; i++)
        g->tensors[i].name = i ? next_name(g->tensors[i - 1].name) : g->tensor_names;
    if ((s = st_name_index_build(&g->tensor_index, nt, tensor_name, g->tensors, &dup))) {
        st_error_prefix("%s", g->name);
        return s;
    }
    if (dup >= 0)
        return st_fail(ST_ERR_FORMAT, "%s: duplicate tensor name '%s'", g->name,
                       g->tensors[dup].name);
    if (nt == 0) {
        g->data_off = c.off; /* vocab-only file: no padding required after the KV section */
        return ST_OK;
    }
    size_t pad = (g->alignment - c.off % g->alignment) % g->alignment;
    if (pad > g->size - c.off)
        return st_fail(ST_ERR_FORMAT, "%s: truncated file: tensor data would start past the end",
                       g->name);
    g->data_off = c.off + pad;
    size_t blob = g->size - g->data_off;
    for (int64_t i = 0; i < nt; i++) {
        st_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return st_fail(ST_ERR_FORMAT,
                           "%s: tensor '%s' offset %" PRIu64
                           " is not a multiple of the alignment %u",
                           g->name, t->name, t->offset, g->alignment);
        if (t->offset > blob || t->size > blob - t->offset)
            return st_fail(ST_ERR_FORMAT,
                           "%s: tensor '%s' (offset %" PRIu64
                           ", %zu bytes) extends past end of file",
                           g->name, t->name, t->offset, t->size);
        t->data = g->data + g->data_off + t->offset;
    }
    return check_overlaps(g);
}

/* A zeroed reader named name (the path, or the caller's name for a buffer). */
static st_status gguf_new(const char *name, st_gguf **out) {
    st_gguf *g = st_calloc(1, sizeof *g);
    if (!g || !(g->name = st_strdup(name))) {
        st_free(g);
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", name);
    }
    *out = g;
    return ST_OK;
}

/* Parses g's buffer; on error frees g. */
static st_status gguf_open_common(st_gguf *g, st_gguf **out) {
    st_status s = gguf_parse(g);
    if (s) {
        st_gguf_free(g);
        return s;
    }
    *out = g;
    return ST_OK;
}

st_status st_gguf_open_memory(const void *data, size_t size, const char *name, st_gguf **out) {
    if (!out)
        return st_fail(ST_ERR_INVALID, "st_gguf_open_memory: out is NULL");
    *out = NULL;
    if (!name)
        name = "<memory>";
    if (!data && size)
        return st_fail(ST_ERR_INVALID, "%s: NULL buffer", name);
    st_gguf *g;
    st_status s = gguf_new(name, &g);
    if (s)
        return s;
    g->data = data;
    g->size = size;
    return gguf_open_common(g, out);
}

st_status st_gguf_open(const char *path, st_gguf **out) {
    if (!out || !path)
        return st_fail(ST_ERR_INVALID, "st_gguf_open: NULL argument");
    *out = NULL;
    st_gguf *g;
    st_status s = gguf_new(path, &g);
    if (s)
        return s;
    if ((s = st_mmap_open(path, &g->map))) {
        st_gguf_free(g);
        return s;
    }
    g->data = g->map.data;
    g->size = g->map.size;
    return gguf_open_common(g, out);
}

void st_gguf_adopt_copy(st_gguf *g, void *copy) {
    const uint8_t *old = g->data;
    g->data = copy;
    for (int64_t i = 0; i < g->n_tensors; i++)
        g->tensors[i].data = g->data + ((const uint8_t *)g->tensors[i].data - old);
    st_mmap_close(&g->map);
    st_huge_free(g->copy, g->size);
    g->copy = copy;
}

int st_gguf_data_kind(const st_gguf *g) { return g->copy ? 2 : g->map.data ? 1 : 0; }

const void *st_gguf_bytes(const st_gguf *g, size_t *size) {
    *size = g->size;
    return g->data;
}

const char *st_gguf_name(const st_gguf *g) { return g->name; }
uint32_t st_gguf_version(const st_gguf *g) { return g->version; }
int64_t st_gguf_n_kv(const st_gguf *g) { return g->n_kv; }
int64_t st_gguf_n_tensors(const st_gguf *g) { return g->n_tensors; }
uint32_t st_gguf_alignment(const st_gguf *g) { return g->alignment; }
size_t st_gguf_data_offset(const st_gguf *g) { return g->data_off; }

int64_t st_gguf_find(const st_gguf *g, const char *key) {
    return st_name_index_find(&g->kv_index, key);
}

const char *st_gguf_key(const st_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_kv) ? g->kv[i].key : NULL;
}

st_gguf_type st_gguf_kv_type(const st_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_kv) ? g->kv[i].type : (st_gguf_type)-1;
}

st_gguf_type st_gguf_arr_type(const st_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_kv && g->kv[i].type == ST_GGUF_ARRAY) ? g->kv[i].arr_type
                                                                     : (st_gguf_type)-1;
}

int64_t st_gguf_arr_len(const st_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_kv && g->kv[i].type == ST_GGUF_ARRAY) ? g->kv[i].n : -1;
}

/* Reads one numeric element of type t at p as double; false for non-numeric types. */
static bool num_at(st_gguf_type t, const uint8_t *p, double *out) {
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        float f32;
        uint64_t u64;
        int64_t i64;
        double f64;
    } v;
    size_t n = st_gguf_type_size(t);
    if (n == 0)
        return false;
    memcpy(&v, p, n);
    switch (t) {
    case ST_GGUF_UINT8:
    case ST_GGUF_BOOL:
        *out = v.u8;
        return true;
    case ST_GGUF_INT8:
        *out = v.i8;
        return true;
    case ST_GGUF_UINT16:
        *out = v.u16;
        return true;
    case ST_GGUF_INT16:
        *out = v.i16;
        return true;
    case ST_GGUF_UINT32:
        *out = v.u32;
        return true;
    case ST_GGUF_INT32:
        *out = v.i32;
        return true;
    case ST_GGUF_FLOAT32:
        *out = v.f32;
        return true;
    case ST_GGUF_UINT64:
        *out = (double)v.u64;
        return true;
    case ST_GGUF_INT64:
        *out = (double)v.i64;
        return true;
    case ST_GGUF_FLOAT64:
        *out = v.f64;
        return true;
    default:
        return false;
    }
}

static bool is_int_type(st_gguf_type t) {
    return t == ST_GGUF_UINT8 || t == ST_GGUF_INT8 || t == ST_GGUF_UINT16 || t == ST_GGUF_INT16 ||
           t == ST_GGUF_UINT32 || t == ST_GGUF_INT32 || t == ST_GGUF_UINT64 || t == ST_GGUF_INT64;
}

static bool is_float_type(st_gguf_type t) { return t == ST_GGUF_FLOAT32 || t == ST_GGUF_FLOAT64; }
static bool is_bool_type(st_gguf_type t) { return t == ST_GGUF_BOOL; }
static bool is_string_type(st_gguf_type t) { return t == ST_GGUF_STRING; }

/* The value of key, which must exist and have a type `accepts` takes (expected: its name for
 * the message). */
static st_status find_typed(const st_gguf *g, const char *key, bool (*accepts)(st_gguf_type),
                            const char *expected, const gguf_kv **out) {
    int64_t i = st_gguf_find(g, key);
    if (i < 0)
        return st_fail(ST_ERR_FORMAT, "%s: missing metadata key '%s'", g->name, key);
    if (!accepts(g->kv[i].type))
        return st_fail(ST_ERR_FORMAT, "%s: key '%s' has type %s, expected %s", g->name, key,
                       type_name(g->kv[i].type), expected);
    *out = &g->kv[i];
    return ST_OK;
}

/* The string whose length field is at byte off (validated at parse time). */
static st_gguf_str str_at(const st_gguf *g, size_t off) {
    uint64_t n;
    memcpy(&n, g->data + off, 8);
    return (st_gguf_str){(const char *)g->data + off + 8, n};
}

st_status st_gguf_get_i64(const st_gguf *g, const char *key, int64_t *out) {
    const gguf_kv *kv;
    st_status s = find_typed(g, key, is_int_type, "an integer", &kv);
    if (s)
        return s;
    const uint8_t *p = g->data + kv->off;
    if (kv->type == ST_GGUF_UINT64) {
        uint64_t u;
        memcpy(&u, p, 8);
        if (u > (uint64_t)INT64_MAX)
            return st_fail(ST_ERR_FORMAT, "%s: key '%s' value %" PRIu64 " is too large", g->name,
                           key, u);
        *out = (int64_t)u;
    } else if (kv->type == ST_GGUF_INT64) {
        memcpy(out, p, 8);
    } else {
        double d;
        num_at(kv->type, p, &d);
        *out = (int64_t)d;
    }
    return ST_OK;
}

st_status st_gguf_get_u32(const st_gguf *g, const char *key, uint32_t *out) {
    int64_t v;
    st_status s = st_gguf_get_i64(g, key, &v);
    if (s)
        return s;
    if (v < 0 || v > (int64_t)UINT32_MAX)
        return st_fail(ST_ERR_FORMAT, "%s: key '%s' value %" PRId64 " is out of range", g->name,
                       key, v);
    *out = (uint32_t)v;
    return ST_OK;
}

st_status st_gguf_get_f32(const st_gguf *g, const char *key, float *out) {
    const gguf_kv *kv;
    st_status s = find_typed(g, key, is_float_type, "a float", &kv);
    if (s)
        return s;
    double d;
    num_at(kv->type, g->data + kv->off, &d);
    *out = (float)d;
    return ST_OK;
}

st_status st_gguf_get_bool(const st_gguf *g, const char *key, int *out) {
    const gguf_kv *kv;
    st_status s = find_typed(g, key, is_bool_type, "bool", &kv);
    if (s)
        return s;
    *out = g->data[kv->off] != 0;
    return ST_OK;
}

st_status st_gguf_get_str(const st_gguf *g, const char *key, st_gguf_str *out) {
    const gguf_kv *kv;
    st_status s = find_typed(g, key, is_string_type, "string", &kv);
    if (s)
        return s;
    *out = str_at(g, kv->off);
    return ST_OK;
}

/* Whether metadata kv is an array of strings (strings) or of numbers (!strings). */
static bool is_array_of(const st_gguf *g, int64_t kv, bool strings) {
    if (kv < 0 || kv >= g->n_kv || g->kv[kv].type != ST_GGUF_ARRAY)
        return false;
    return strings ? g->kv[kv].arr_type == ST_GGUF_STRING
                   : st_gguf_type_size(g->kv[kv].arr_type) != 0;
}

/* Checks that element i of the array kv (of strings or numbers) exists. */
static st_status arr_check(const st_gguf *g, int64_t kv, int64_t i, bool strings) {
    if (!is_array_of(g, kv, strings))
        return st_fail(ST_ERR_FORMAT, "%s: metadata %" PRId64 " is not %s", g->name, kv,
                       strings ? "an array of strings" : "a numeric array");
    if (i < 0 || i >= g->kv[kv].n)
        return st_fail(ST_ERR_RANGE, "%s: key '%s': index %" PRId64 " out of range (%" PRId64 ")",
                       g->name, g->kv[kv].key, i, g->kv[kv].n);
    return ST_OK;
}

st_status st_gguf_arr_str(const st_gguf *g, int64_t kv, int64_t i, st_gguf_str *out) {
    st_status s = arr_check(g, kv, i, true);
    if (s)
        return s;
    *out = str_at(g, g->kv[kv].str_offs[i]);
    return ST_OK;
}

st_status st_gguf_arr_num(const st_gguf *g, int64_t kv, int64_t i, double *out) {
    st_status s = arr_check(g, kv, i, false);
    if (s)
        return s;
    size_t es = st_gguf_type_size(g->kv[kv].arr_type);
    num_at(g->kv[kv].arr_type, g->data + g->kv[kv].off + (size_t)i * es, out);
    return ST_OK;
}

const void *st_gguf_arr_data(const st_gguf *g, int64_t kv) {
    return is_array_of(g, kv, false) ? g->data + g->kv[kv].off : NULL;
}

/* Appends printable text of a string value (escaping control bytes), at most `max` bytes. */
static int put_str(char *buf, size_t cap, int n, const char *s, uint64_t len, uint64_t max) {
    for (uint64_t i = 0; i < len && i < max && (size_t)n + 5 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f)
            n += snprintf(buf + n, cap - (size_t)n, "\\x%02x", ch);
        else
            buf[n++] = (char)ch;
    }
    if (len > max && (size_t)n + 4 < cap)
        n += snprintf(buf + n, cap - (size_t)n, "...");
    buf[n] = 0;
    return n;
}

int st_gguf_format_value(const st_gguf *g, int64_t i, char *buf, size_t cap) {
    if (cap == 0)
        return 0;
    buf[0] = 0;
    if (i < 0 || i >= g->n_kv)
        return 0;
    const gguf_kv *kv = &g->kv[i];
    int n = 0;
    if (kv->type == ST_GGUF_STRING) {
        st_gguf_str str = str_at(g, kv->off);
        return put_str(buf, cap, 0, str.ptr, str.len, 200);
    }
    if (kv->type != ST_GGUF_ARRAY) {
        double d;
        num_at(kv->type, g->data + kv->off, &d);
        if (kv->type == ST_GGUF_BOOL)
            n = snprintf(buf, cap, "%s", d != 0 ? "true" : "false");
        else if (kv->type == ST_GGUF_FLOAT32 || kv->type == ST_GGUF_FLOAT64)
            n = snprintf(buf, cap, "%g", d);
        else if (kv->type == ST_GGUF_UINT64) {
            uint64_t u;
            memcpy(&u, g->data + kv->off, 8);
            n = snprintf(buf, cap, "%" PRIu64, u);
        } else if (kv->type == ST_GGUF_INT64) {
            int64_t v;
            memcpy(&v, g->data + kv->off, 8);
            n = snprintf(buf, cap, "%" PRId64, v);
        } else
            n = snprintf(buf, cap, "%.0f", d);
        return n < 0 ? 0 : (n >= (int)cap ? (int)cap - 1 : n);
    }
    n = snprintf(buf, cap, "[%s x %" PRId64 "]", type_name(kv->arr_type), kv->n);
    for (int64_t k = 0; k < kv->n && k < 5 && n > 0 && (size_t)n + 8 < cap; k++) {
        n += snprintf(buf + n, cap - (size_t)n, k ? ", " : " ");
        if (kv->arr_type == ST_GGUF_STRING) {
            st_gguf_str s;
            st_gguf_arr_str(g, i, k, &s);
            n = put_str(buf, cap, n, s.ptr, s.len, 24);
        } else {
            double d;
            st_gguf_arr_num(g, i, k, &d);
            n += snprintf(buf + n, cap - (size_t)n, "%g", d);
        }
    }
    if (kv->n > 5 && n > 0 && (size_t)n + 5 < cap)
        n += snprintf(buf + n, cap - (size_t)n, ", ...");
    return n < 0 ? 0 : (n >= (int)cap ? (int)cap - 1 : n);
}

const st_gguf_tensor *st_gguf_tensor_at(const st_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_tensors) ? &g->tensors[i] : NULL;
}

const char *st_gguf_tensor_shape(const st_gguf_tensor *t, char *buf, size_t cap) {
    size_t n = 0;
    if (cap == 0)
        return buf;
    buf[0] = 0;
    for (uint32_t d = 0; d < t->n_dims && d < GGUF_MAX_DIMS && n < cap; d++) {
        int k = snprintf(buf + n, cap - n, "%s%" PRId64, d ? ", " : "[", t->ne[d]);
        if (k < 0)
            return buf;
        n += (size_t)k;
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
    return buf;
}

const st_gguf_tensor *st_gguf_tensor_find(const st_gguf *g, const char *name) {
    int64_t i = st_name_index_find(&g->tensor_index, name);
    return i >= 0 ? &g->tensors[i] : NULL;
}
