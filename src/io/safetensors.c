/*
 * safetensors.c: a bounds-checked reader for safetensors files and sharded Hugging Face
 * checkpoints (FORMATS.md §c.1). Each file is mapped read-only; its JSON header is parsed by
 * jansson with JSON_REJECT_DUPLICATES (jansson would otherwise keep the last of two equal
 * keys, so a duplicated tensor name would go unseen), then every entry is checked and the
 * tensors, sorted by data offset, must tile the data section exactly, as the reference
 * implementation demands. Names are sorted for binary-search lookups; a duplicate across
 * shards shows up as two equal neighbours. Everything is O(n log n) in the tensor count.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/safetensors.h"

#include <jansson.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The reference implementation's cap on the header length. */
#define SF_MAX_HEADER ((uint64_t)100000000)

static const char *const dtype_names[ST_SF_N_DTYPES] = {
    "BOOL", "U8",  "I8",  "U16", "I16",     "U32",     "I32",     "U64",     "I64",     "F16",
    "BF16", "F32", "F64", "C64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4"};
static const int dtype_bits[ST_SF_N_DTYPES] = {8,  8,  8,  16, 16, 32, 32, 64, 64, 16,
                                               16, 32, 64, 64, 8,  8,  8,  6,  6,  4};

const char *st_sf_dtype_name(st_sf_dtype t) {
    return (unsigned)t < ST_SF_N_DTYPES ? dtype_names[t] : "?";
}

int st_sf_dtype_bits(st_sf_dtype t) { return (unsigned)t < ST_SF_N_DTYPES ? dtype_bits[t] : 0; }

typedef struct sf_meta {
    const char *key, *val;
} sf_meta;

typedef struct sf_file {
    char *path;
    st_mmap map; /* owned when opened from a path */
    const uint8_t *base;
    size_t size;
    size_t data_off; /* 8 + header length */
    int64_t n;
    st_sf_tensor *t; /* (n), sorted by name */
    int64_t *shapes; /* all shapes, back to back */
    char *strings;   /* all names and metadata text, back to back */
    int64_t n_meta;
    sf_meta *meta;
} sf_file;

struct st_safetensors {
    char *path;
    int64_t n_files;
    sf_file *files;
    int64_t n;
    const st_sf_tensor **by_name; /* (n), sorted by name over all files */
};

/* A name made safe for a one-line message: control bytes become '?', long names are cut. */
typedef struct shown {
    char s[84];
} shown;

static shown show(const char *name) {
    shown r;
    size_t i = 0;
    for (; name[i] && i < 72; i++) {
        unsigned char c = (unsigned char)name[i];
        r.s[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (name[i]) {
        memcpy(r.s + i, "...", 3);
        i += 3;
    }
    r.s[i] = 0;
    return r;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const st_sf_tensor *)a)->name, ((const st_sf_tensor *)b)->name);
}

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp((*(const st_sf_tensor *const *)a)->name, (*(const st_sf_tensor *const *)b)->name);
}

static bool parse_dtype(const char *s, st_sf_dtype *out) {
    for (int i = 0; i < ST_SF_N_DTYPES; i++)
        if (!strcmp(s, dtype_names[i])) {
            *out = (st_sf_dtype)i;
            return true;
        }
    return false;
}

/* ------------------------------------------------------------------------------------------ */
/* One file                                                                                   */

typedef struct span {
    int64_t begin, end, idx;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* Reads a JSON array of non-negative integers into out (n entries known). */
static st_status read_uints(const sf_file *f, const char *name, const char *field,
                            const json_t *arr, int64_t *out) {
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v))
            return st_fail(ST_ERR_FORMAT, "%s: tensor '%s': \"%s\"[%zu] is not an integer", f->path,
                           show(name).s, field, i);
        json_int_t x = json_integer_value(v);
        if (x < 0)
            return st_fail(ST_ERR_FORMAT, "%s: tensor '%s': \"%s\"[%zu] is negative (%" PRId64 ")",
                           f->path, show(name).s, field, i, (int64_t)x);
        out[i] = (int64_t)x;
    }
    return ST_OK;
}

/* Checks one header entry and fills t (name, file and data are set by the caller); the
 * entry's byte range relative to the data section goes to sp. */
static st_status parse_entry(const sf_file *f, const char *name, const json_t *v, st_sf_tensor *t,
                             int64_t *shape, span *sp) {
    if (!json_is_object(v))
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", f->path,
                       show(name).s);
    const json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
                 *off = json_object_get(v, "data_offsets");
    if (!dt)
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s': missing \"dtype\"", f->path, show(name).s);
    if (!json_is_string(dt))
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is not a string", f->path,
                       show(name).s);
    if (!sh)
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s': missing \"shape\"", f->path, show(name).s);
    if (!json_is_array(sh))
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s': \"shape\" is not an array", f->path,
                       show(name).s);
    if (!off)
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s': missing \"data_offsets\"", f->path,
                       show(name).s);
    if (!json_is_array(off) || json_array_size(off) != 2)
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" is not an array of two",
                       f->path, show(name).s);
    if (!parse_dtype(json_string_value(dt), &t->dtype))
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", f->path, show(name).s,
                       show(json_string_value(dt)).s);
    st_status s = read_uints(f, name, "shape", sh, shape);
    if (s)
        return s;
    int64_t be[2];
    if ((s = read_uints(f, name, "data_offsets", off, be)))
        return s;

    t->n_dims = (int32_t)json_array_size(sh);
    t->shape = shape;
    int64_t n = 1;
    for (int32_t i = 0; i < t->n_dims; i++)
        if (__builtin_mul_overflow(n, shape[i], &n))
            return st_fail(ST_ERR_FORMAT, "%s: tensor '%s': shape's element count overflows int64",
                           f->path, show(name).s);
    t->n_elem = n;
    int64_t bits;
    if (__builtin_mul_overflow(n, (int64_t)st_sf_dtype_bits(t->dtype), &bits))
        return st_fail(ST_ERR_FORMAT, "%s: tensor '%s': byte size of %" PRId64 " x %s overflows",
                       f->path, show(name).s, n, st_sf_dtype_name(t->dtype));
    if (bits % 8)
        return st_fail(ST_ERR_FORMAT,
                       "%s: tensor '%s': %" PRId64 " %s elements are not whole bytes", f->path,
                       show(name).s, n, st_sf_dtype_name(t->dtype));
    if (be[1] < be[0])
        return st_fail(ST_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] end before begin",
                       f->path, show(name).s, be[0], be[1]);
    if (be[1] - be[0] != bits / 8)
        return st_fail(ST_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] hold %" PRId64
                       " bytes, but %" PRId64 " elements of %s need %" PRId64,
                       f->path, show(name).s, be[0], be[1], be[1] - be[0], n,
                       st_sf_dtype_name(t->dtype), bits / 8);
    size_t data_size = f->size - f->data_off;
    if ((uint64_t)be[1] > data_size)
        return st_fail(ST_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets end %" PRId64
                       " is past the end of the data section (%zu bytes; truncated file?)",
                       f->path, show(name).s, be[1], data_size);
    t->size = (size_t)(be[1] - be[0]);
    sp->begin = be[0];
    sp->end = be[1];
    return ST_OK;
}

/* The tensors, ordered by offset, must cover [0, data size) exactly. */
static st_status check_tiling(const sf_file *f, span *sp) {
    size_t data_size = f->size - f->data_off;
    if (f->n == 0) {
        if (data_size)
            return st_fail(ST_ERR_FORMAT, "%s: %zu data bytes but no tensors", f->path, data_size);
        return ST_OK;
    }
    qsort(sp, (size_t)f->n, sizeof *sp, cmp_span);
    if (sp[0].begin != 0)
        return st_fail(ST_ERR_FORMAT,
                       "%s: data bytes [0, %" PRId64 ") before tensor '%s' belong "
                       "to no tensor",
                       f->path, sp[0].begin, show(f->t[sp[0].idx].name).s);
    for (int64_t i = 1; i < f->n; i++) {
        const span *a = &sp[i - 1], *b = &sp[i];
        const char *na = f->t[a->idx].name, *nb = f->t[b->idx].name;
        if (b->begin < a->end)
            return st_fail(ST_ERR_FORMAT,
                           "%s: tensors '%s' [%" PRId64 ", %" PRId64 ") and '%s' [%" PRId64
                           ", %" PRId64 ") overlap",
                           f->path, show(na).s, a->begin, a->end, show(nb).s, b->begin, b->end);
        if (b->begin > a->end)
            return st_fail(ST_ERR_FORMAT,
                           "%s: data bytes [%" PRId64 ", %" PRId64 ") between tensors '%s' and "
                           "'%s' belong to no tensor",
                           f->path, a->end, b->begin, show(na).s, show(nb).s);
    }
    const span *last = &sp[f->n - 1];
    if ((uint64_t)last->end != data_size)
        return st_fail(ST_ERR_FORMAT,
                       "%s: %zu data bytes after the last tensor '%s' belong to no tensor", f->path,
                       data_size - (size_t)last->end, show(f->t[last->idx].name).s);
    return ST_OK;
}

static st_status parse_metadata(sf_file *f, const json_t *m, char **pool) {
    if (!json_is_object(m))
        return st_fail(ST_ERR_FORMAT, "%s: \"__metadata__\" is not a JSON object", f->path);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)m, k, v) {
        if (!json_is_string(v))
            return st_fail(ST_ERR_FORMAT, "%s: \"__metadata__\" key '%s' is not a string", f->path,
                           show(k).s);
        sf_meta *e = &f->meta[f->n_meta++];
        size_t lk = strlen(k) + 1, lv = strlen(json_string_value(v)) + 1;
        memcpy(*pool, k, lk);
        e->key = *pool;
        memcpy(*pool + lk, json_string_value(v), lv);
        e->val = *pool + lk;
        *pool += lk + lv;
    }
    return ST_OK;
}

/* Parses the header of f (base and size set) and builds its tensor table. */
static st_status file_parse(sf_file *f) {
    json_t *root = NULL;
    span *sp = NULL;
    st_status s = ST_OK;
    if (f->size < 8)
        return st_fail(ST_ERR_FORMAT,
                       "%s: truncated file: %zu bytes, the header length alone needs 8", f->path,
                       f->size);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--)
        hn = hn << 8 | f->base[i];
    if (hn > SF_MAX_HEADER)
        return st_fail(ST_ERR_FORMAT, "%s: header length %" PRIu64 " is over the 100 MB limit",
                       f->path, hn);
    if (hn > f->size - 8)
        return st_fail(ST_ERR_FORMAT,
                       "%s: header length %" PRIu64
                       " runs past the end of the file (%zu bytes; truncated file?)",
                       f->path, hn, f->size);
    f->data_off = 8 + (size_t)hn;
    /* As in the reference implementation; it also makes jansson's result an object. */
    if (hn == 0 || f->base[8] != '{')
        return st_fail(ST_ERR_FORMAT, "%s: header does not start with '{' (not a JSON object)",
                       f->path);

    json_error_t err;
    root = json_loadb((const char *)f->base + 8, (size_t)hn, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        for (char *c = err.text; *c; c++)
            if ((unsigned char)*c < 0x20)
                *c = '?';
        if (json_error_code(&err) == json_error_duplicate_key)
            return st_fail(ST_ERR_FORMAT, "%s: header has a duplicate key: %s (header byte %d)",
                           f->path, err.text, err.position);
        return st_fail(ST_ERR_FORMAT, "%s: header is not valid JSON: %s (header byte %d)", f->path,
                       err.text, err.position);
    }

    /* Sizes of the pools, then one pass that checks and fills. */
    const char *k;
    json_t *v;
    size_t n_str = 1, n_dims = 1, n_meta = 0;
    json_t *meta = json_object_get(root, "__metadata__");
    json_object_foreach(root, k, v) {
        n_str += strlen(k) + 1;
        if (v == meta) {
            const char *mk;
            json_t *mv;
            json_object_foreach(meta, mk, mv) {
                n_meta++;
                n_str +=
                    strlen(mk) + 1 + (json_is_string(mv) ? strlen(json_string_value(mv)) : 0) + 1;
            }
        } else {
            n_dims += json_array_size(json_object_get(v, "shape"));
        }
    }
    int64_t n = (int64_t)json_object_size(root) - (meta ? 1 : 0);
    f->t = st_calloc((size_t)n + 1, sizeof *f->t);
    sp = st_malloc(((size_t)n + 1) * sizeof *sp);
    f->shapes = st_malloc(n_dims * sizeof *f->shapes);
    f->strings = st_malloc(n_str);
    f->meta = st_malloc((n_meta + 1) * sizeof *f->meta);
    if (!f->t || !sp || !f->shapes || !f->strings || !f->meta) {
        s = st_fail(ST_ERR_NOMEM, "%s: out of memory for %" PRId64 " tensors", f->path, n);
        goto fail;
    }
    char *pool = f->strings;
    int64_t *shape = f->shapes;
    if (meta && (s = parse_metadata(f, meta, &pool)))
        goto fail;
    json_object_foreach(root, k, v) {
        if (v == meta)
            continue;
        st_sf_tensor *t = &f->t[f->n];
        span *p = &sp[f->n];
        if ((s = parse_entry(f, k, v, t, shape, p)))
            goto fail;
        size_t lk = strlen(k) + 1;
        memcpy(pool, k, lk);
        t->name = pool;
        pool += lk;
        shape += t->n_dims;
        t->data = f->base + f->data_off + p->begin;
        t->file = f->path;
        p->idx = f->n++;
    }
    if ((s = check_tiling(f, sp)))
        goto fail;
    qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_name);
fail:
    st_free(sp);
    json_decref(root);
    return s;
}

static void file_clear(sf_file *f) {
    st_mmap_close(&f->map);
    st_free(f->path);
    st_free(f->t);
    st_free(f->shapes);
    st_free(f->strings);
    st_free(f->meta);
}

static st_status file_open(sf_file *f, const char *path) {
    if (!(f->path = st_strdup(path)))
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
    st_status s = st_mmap_open(path, &f->map);
    if (s)
        return s;
    f->base = f->map.data;
    f->size = f->map.size;
    return file_parse(f);
}

static const st_sf_tensor *file_find(const sf_file *f, const char *name) {
    st_sf_tensor key = {.name = name};
    return bsearch(&key, f->t, (size_t)f->n, sizeof *f->t, cmp_name);
}

/* ------------------------------------------------------------------------------------------ */
/* Checkpoints                                                                                */

static st_status alloc_sf(const char *path, int64_t n_files, st_safetensors **out) {
    st_safetensors *sf = st_calloc(1, sizeof *sf);
    if (!sf)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
    sf->path = st_strdup(path);
    sf->files = st_calloc((size_t)n_files, sizeof *sf->files);
    if (!sf->path || !sf->files) {
        st_safetensors_free(sf);
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
    }
    sf->n_files = n_files;
    *out = sf;
    return ST_OK;
}

/* Builds the name index over every file; two equal names are the same tensor in two files. */
static st_status build_index(st_safetensors *sf) {
    int64_t n = 0;
    for (int64_t i = 0; i < sf->n_files; i++)
        n += sf->files[i].n;
    sf->by_name = st_malloc(((size_t)n + 1) * sizeof *sf->by_name);
    if (!sf->by_name)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory for %" PRId64 " tensors", sf->path, n);
    for (int64_t i = 0; i < sf->n_files; i++)
        for (int64_t j = 0; j < sf->files[i].n; j++)
            sf->by_name[sf->n++] = &sf->files[i].t[j];
    if (sf->n_files > 1)
        qsort(sf->by_name, (size_t)n, sizeof *sf->by_name, cmp_name_ptr);
    for (int64_t i = 1; i < n; i++)
        if (!strcmp(sf->by_name[i - 1]->name, sf->by_name[i]->name))
            return st_fail(ST_ERR_FORMAT, "%s: tensor '%s' is stored in both %s and %s", sf->path,
                           show(sf->by_name[i]->name).s, sf->by_name[i - 1]->file,
                           sf->by_name[i]->file);
    return ST_OK;
}

static st_status open_file(const char *path, const char *name, st_safetensors **out) {
    st_safetensors *sf = NULL;
    st_status s = alloc_sf(name, 1, &sf);
    if (s)
        return s;
    if ((s = file_open(&sf->files[0], path)) || (s = build_index(sf)))
        goto fail;
    *out = sf;
    return ST_OK;
fail:
    st_safetensors_free(sf);
    return s;
}

typedef struct wm_entry {
    const char *tensor, *shard;
} wm_entry;

static int cmp_wm_shard(const void *a, const void *b) {
    const wm_entry *x = a, *y = b;
    int c = strcmp(x->shard, y->shard);
    return c ? c : strcmp(x->tensor, y->tensor);
}

static int cmp_file_base(const void *key, const void *elem) {
    const char *p = ((const sf_file *)elem)->path;
    const char *slash = strrchr(p, '/');
    return strcmp((const char *)key, slash ? slash + 1 : p);
}

static char *join(const char *dir, const char *name) {
    size_t ld = strlen(dir), ln = strlen(name);
    char *p = st_malloc(ld + ln + 2);
    if (p) {
        memcpy(p, dir, ld);
        p[ld] = '/';
        memcpy(p + ld + 1, name, ln + 1);
    }
    return p;
}

static st_status open_sharded(const char *dir, const char *index, st_safetensors **out) {
    st_safetensors *sf = NULL;
    json_t *root = NULL;
    wm_entry *wm = NULL;
    char *path = NULL;
    st_mmap map = {0};
    st_status s = st_mmap_open(index, &map);
    if (s)
        return s;
    json_error_t err;
    root = json_loadb(map.data, map.size, JSON_REJECT_DUPLICATES, &err);
    st_mmap_close(&map);
    if (!root) {
        for (char *c = err.text; *c; c++)
            if ((unsigned char)*c < 0x20)
                *c = '?';
        return st_fail(ST_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", index,
                       err.text, err.line, err.column);
    }
    json_t *map_obj = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!map_obj) {
        s = st_fail(ST_ERR_FORMAT, "%s: missing \"weight_map\"", index);
        goto fail;
    }
    if (!json_is_object(map_obj) || json_object_size(map_obj) == 0) {
        s = st_fail(ST_ERR_FORMAT, "%s: \"weight_map\" is not a non-empty JSON object", index);
        goto fail;
    }
    size_t n = json_object_size(map_obj), i = 0;
    wm = st_malloc(n * sizeof *wm);
    if (!wm) {
        s = st_fail(ST_ERR_NOMEM, "%s: out of memory", index);
        goto fail;
    }
    const char *k;
    json_t *v;
    json_object_foreach(map_obj, k, v) {
        const char *shard = json_string_value(v);
        if (!shard || !shard[0] || strchr(shard, '/') || !strcmp(shard, ".") ||
            !strcmp(shard, "..")) {
            s = st_fail(ST_ERR_FORMAT,
                        "%s: weight_map entry for tensor '%s' is not a file name in the directory",
                        index, show(k).s);
            goto fail;
        }
        wm[i].tensor = k;
        wm[i++].shard = shard;
    }
    qsort(wm, n, sizeof *wm, cmp_wm_shard);
    int64_t n_files = 0;
    for (i = 0; i < n; i++)
        n_files += (i == 0 || strcmp(wm[i].shard, wm[i - 1].shard) != 0);
    if ((s = alloc_sf(dir, n_files, &sf)))
        goto fail;
    /* Files in shard-name order, so a shard is found by binary search on its base name. */
    int64_t fi = 0;
    for (i = 0; i < n; i++) {
        if (i > 0 && !strcmp(wm[i].shard, wm[i - 1].shard))
            continue;
        if (!(path = join(dir, wm[i].shard))) {
            s = st_fail(ST_ERR_NOMEM, "%s: out of memory", index);
            goto fail;
        }
        struct stat st;
        if (stat(path, &st) != 0) {
            s = st_fail(ST_ERR_IO, "%s: weight_map names shard '%s' (tensor '%s'), which is %s",
                        index, show(wm[i].shard).s, show(wm[i].tensor).s,
                        errno == ENOENT ? "missing" : strerror(errno));
            goto fail;
        }
        if ((s = file_open(&sf->files[fi++], path)))
            goto fail;
        st_free(path);
        path = NULL;
    }
    for (i = 0; i < n; i++) {
        const sf_file *f =
            bsearch(wm[i].shard, sf->files, (size_t)sf->n_files, sizeof *sf->files, cmp_file_base);
        if (!f || !file_find(f, wm[i].tensor)) {
            s = st_fail(ST_ERR_FORMAT, "%s: weight_map puts tensor '%s' in '%s', which lacks it",
                        index, show(wm[i].tensor).s, show(wm[i].shard).s);
            goto fail;
        }
    }
    if ((s = build_index(sf)))
        goto fail;
    /* Every weight_map entry was found in its shard and no name is in two shards, so a shard
     * tensor weight_map does not name is the only way the two can still differ. */
    for (int64_t j = 0; j < sf->n; j++)
        if (!json_object_get(map_obj, sf->by_name[j]->name)) {
            s = st_fail(ST_ERR_FORMAT, "%s: tensor '%s' of %s is not in weight_map", index,
                        show(sf->by_name[j]->name).s, sf->by_name[j]->file);
            goto fail;
        }
    st_free(wm);
    json_decref(root);
    *out = sf;
    return ST_OK;
fail:
    st_free(path);
    st_free(wm);
    json_decref(root);
    st_safetensors_free(sf);
    return s;
}

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

st_status st_safetensors_open(const char *path, st_safetensors **out) {
    if (!path || !out)
        return st_fail(ST_ERR_INVALID, "st_safetensors_open: NULL argument");
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return st_fail(ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return open_file(path, path, out);
    char *single = join(path, "model.safetensors");
    char *index = join(path, "model.safetensors.index.json");
    st_status s;
    if (!single || !index)
        s = st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
    else if (is_file(single))
        s = open_file(single, path, out);
    else if (is_file(index))
        s = open_sharded(path, index, out);
    else
        s = st_fail(ST_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", path);
    st_free(single);
    st_free(index);
    return s;
}

st_status st_safetensors_open_memory(const void *data, size_t size, const char *name,
                                     st_safetensors **out) {
    if (!data || !name || !out)
        return st_fail(ST_ERR_INVALID, "st_safetensors_open_memory: NULL argument");
    *out = NULL;
    st_safetensors *sf = NULL;
    st_status s = alloc_sf(name, 1, &sf);
    if (s)
        return s;
    sf_file *f = &sf->files[0];
    f->base = data;
    f->size = size;
    if (!(f->path = st_strdup(name)))
        s = st_fail(ST_ERR_NOMEM, "%s: out of memory", name);
    if (s || (s = file_parse(f)) || (s = build_index(sf))) {
        st_safetensors_free(sf);
        return s;
    }
    *out = sf;
    return ST_OK;
}

void st_safetensors_free(st_safetensors *sf) {
    if (!sf)
        return;
    for (int64_t i = 0; i < sf->n_files; i++)
        file_clear(&sf->files[i]);
    st_free(sf->files);
    st_free(sf->by_name);
    st_free(sf->path);
    st_free(sf);
}

const char *st_safetensors_path(const st_safetensors *sf) { return sf->path; }

int64_t st_safetensors_n_tensors(const st_safetensors *sf) { return sf->n; }

const st_sf_tensor *st_safetensors_tensor_at(const st_safetensors *sf, int64_t i) {
    return i >= 0 && i < sf->n ? sf->by_name[i] : NULL;
}

const st_sf_tensor *st_safetensors_find(const st_safetensors *sf, const char *name) {
    st_sf_tensor key = {.name = name};
    const st_sf_tensor *kp = &key;
    const st_sf_tensor *const *r =
        bsearch(&kp, sf->by_name, (size_t)sf->n, sizeof *sf->by_name, cmp_name_ptr);
    return r ? *r : NULL;
}

st_status st_safetensors_get(const st_safetensors *sf, const char *name, const st_sf_tensor **out) {
    *out = st_safetensors_find(sf, name);
    if (!*out)
        return st_fail(ST_ERR_FORMAT, "%s: missing tensor '%s'", sf->path, show(name).s);
    return ST_OK;
}

const char *st_safetensors_metadata(const st_safetensors *sf, const char *key) {
    const sf_file *f = &sf->files[0];
    for (int64_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[i].key, key))
            return f->meta[i].val;
    return NULL;
}

st_status st_sf_tensor_dtype(const st_sf_tensor *t, st_dtype *out) {
    switch (t->dtype) {
    case ST_SF_F32:
        *out = ST_DTYPE_F32;
        return ST_OK;
    case ST_SF_F16:
        *out = ST_DTYPE_F16;
        return ST_OK;
    case ST_SF_BF16:
        *out = ST_DTYPE_BF16;
        return ST_OK;
    default:
        return st_fail(ST_ERR_UNSUPPORTED,
                       "%s: tensor '%s' has dtype %s; only F32, F16 and BF16 are supported",
                       t->file, show(t->name).s, st_sf_dtype_name(t->dtype));
    }
}
