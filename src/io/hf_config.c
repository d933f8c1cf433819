/*
 * hf_config.c: typed reads of a Hugging Face config.json (FORMATS.md §c.2) for the HF and
 * EAGLE loaders. The JSON is parsed by jansson (duplicated keys rejected, since which one a
 * reader would take is ambiguous) and kept as a tree; each getter names the file and the key
 * when a field is missing or of the wrong type.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/safetensors.h"

#include <jansson.h>

#include <string.h>
#include <sys/stat.h>

struct st_hf_config {
    char *name;
    json_t *root;
};

st_status st_hf_config_open_memory(const char *json, size_t len, const char *name,
                                   st_hf_config **out) {
    if (!json || !name || !out)
        return st_fail(ST_ERR_INVALID, "st_hf_config_open_memory: NULL argument");
    *out = NULL;
    json_error_t err;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        for (char *c = err.text; *c; c++)
            if ((unsigned char)*c < 0x20)
                *c = '?';
        return st_fail(ST_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", name, err.text,
                       err.line, err.column);
    }
    st_hf_config *c = NULL;
    st_status s = ST_OK;
    if (!json_is_object(root)) {
        s = st_fail(ST_ERR_FORMAT, "%s: not a JSON object", name);
        goto fail;
    }
    c = st_calloc(1, sizeof *c);
    if (!c || !(c->name = st_strdup(name))) {
        s = st_fail(ST_ERR_NOMEM, "%s: out of memory", name);
        goto fail;
    }
    c->root = root;
    *out = c;
    return ST_OK;
fail:
    if (c)
        st_free(c->name);
    st_free(c);
    json_decref(root);
    return s;
}

st_status st_hf_config_open(const char *path, st_hf_config **out) {
    if (!path || !out)
        return st_fail(ST_ERR_INVALID, "st_hf_config_open: NULL argument");
    *out = NULL;
    struct stat st;
    char *file = NULL;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        size_t n = strlen(path);
        if (!(file = st_malloc(n + sizeof "/config.json")))
            return st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
        memcpy(file, path, n);
        memcpy(file + n, "/config.json", sizeof "/config.json");
    }
    const char *p = file ? file : path;
    st_mmap map;
    st_status s = st_mmap_open(p, &map);
    if (!s) {
        s = st_hf_config_open_memory(map.data, map.size, p, out);
        st_mmap_close(&map);
    }
    st_free(file);
    return s;
}

void st_hf_config_free(st_hf_config *c) {
    if (!c)
        return;
    json_decref(c->root);
    st_free(c->name);
    st_free(c);
}

/* The value at a dotted path, or NULL. */
static const json_t *lookup(const st_hf_config *c, const char *key) {
    const json_t *v = c->root;
    for (const char *p = key;;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (!json_is_object(v) || !(v = json_object_getn(v, p, n)))
            return NULL;
        if (!dot)
            return v;
        p = dot + 1;
    }
}

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "?";
}

/* The field, or an error when it is missing or null. */
static st_status field(const st_hf_config *c, const char *key, const json_t **out) {
    *out = lookup(c, key);
    if (!*out || json_is_null(*out))
        return st_fail(ST_ERR_FORMAT, "%s: missing field \"%s\"", c->name, key);
    return ST_OK;
}

static st_status wrong(const st_hf_config *c, const char *key, const json_t *v, const char *want) {
    return st_fail(ST_ERR_FORMAT, "%s: field \"%s\" is %s, expected %s", c->name, key, type_name(v),
                   want);
}

bool st_hf_config_has(const st_hf_config *c, const char *key) {
    const json_t *v = lookup(c, key);
    return v && !json_is_null(v);
}

st_status st_hf_config_get_int(const st_hf_config *c, const char *key, int64_t *out) {
    const json_t *v;
    st_status s = field(c, key, &v);
    if (s)
        return s;
    if (!json_is_integer(v))
        return wrong(c, key, v, "an integer");
    *out = (int64_t)json_integer_value(v);
    return ST_OK;
}

st_status st_hf_config_get_float(const st_hf_config *c, const char *key, double *out) {
    const json_t *v;
    st_status s = field(c, key, &v);
    if (s)
        return s;
    if (!json_is_number(v))
        return wrong(c, key, v, "a number");
    *out = json_number_value(v);
    return ST_OK;
}

st_status st_hf_config_get_bool(const st_hf_config *c, const char *key, bool *out) {
    const json_t *v;
    st_status s = field(c, key, &v);
    if (s)
        return s;
    if (!json_is_boolean(v))
        return wrong(c, key, v, "true or false");
    *out = json_is_true(v);
    return ST_OK;
}

st_status st_hf_config_get_str(const st_hf_config *c, const char *key, const char **out) {
    const json_t *v;
    st_status s = field(c, key, &v);
    if (s)
        return s;
    if (!json_is_string(v))
        return wrong(c, key, v, "a string");
    *out = json_string_value(v);
    return ST_OK;
}

st_status st_hf_config_str_in(const st_hf_config *c, const char *path, const char *key,
                              const char *const *ok, int n_ok) {
    if (!st_hf_config_has(c, key))
        return ST_OK;
    const char *v;
    st_status s = st_hf_config_get_str(c, key, &v);
    if (s)
        return s;
    for (int i = 0; i < n_ok; i++)
        if (strcmp(v, ok[i]) == 0)
            return ST_OK;
    char list[128] = "";
    for (int i = 0, k = 0; i < n_ok && k < (int)sizeof list; i++)
        k += snprintf(list + k, sizeof list - (size_t)k, "%s%s", i ? ", " : "", ok[i]);
    return st_fail(ST_ERR_UNSUPPORTED, "%s: field \"%s\" = \"%.64s\" is not supported (%s)", path,
                   key, v, list);
}

st_status st_hf_config_check_heads(const st_hf_config *c, const char *path, int32_t n_embd,
                                   int32_t n_head, int32_t n_head_kv, int32_t head_dim) {
    const bool given = st_hf_config_has(c, "head_dim");
    if (!given && n_embd % n_head != 0)
        return st_fail(ST_ERR_FORMAT,
                       "%s: field \"hidden_size\" (%d) is not a multiple of field "
                       "\"num_attention_heads\" (%d), and there is no \"head_dim\"",
                       path, n_embd, n_head);
    if (n_head % n_head_kv != 0)
        return st_fail(ST_ERR_FORMAT,
                       "%s: field \"num_attention_heads\" (%d) is not a multiple of field "
                       "\"num_key_value_heads\" (%d)",
                       path, n_head, n_head_kv);
    /* RoPE rotates pairs of a head's elements */
    if (head_dim < 2 || head_dim % 2 != 0)
        return given ? st_fail(ST_ERR_FORMAT,
                               "%s: field \"head_dim\" (%d) is not even and at least 2", path,
                               head_dim)
                     : st_fail(ST_ERR_FORMAT,
                               "%s: the head width, field \"hidden_size\" (%d) / field "
                               "\"num_attention_heads\" (%d) = %d, is not even and at least 2",
                               path, n_embd, n_head, head_dim);
    return ST_OK;
}

st_status st_hf_config_get_ints(const st_hf_config *c, const char *key, int64_t *out, int64_t cap,
                                int64_t *n) {
    const json_t *v;
    st_status s = field(c, key, &v);
    if (s)
        return s;
    if (json_is_integer(v)) {
        if (cap > 0)
            out[0] = (int64_t)json_integer_value(v);
        *n = 1;
        return ST_OK;
    }
    if (!json_is_array(v))
        return wrong(c, key, v, "an array of integers");
    size_t len = json_array_size(v);
    for (size_t i = 0; i < len; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e))
            return st_fail(ST_ERR_FORMAT, "%s: field \"%s\"[%zu] is %s, expected an integer",
                           c->name, key, i, type_name(e));
        if ((int64_t)i < cap)
            out[i] = (int64_t)json_integer_value(e);
    }
    *n = (int64_t)len;
    return ST_OK;
}
