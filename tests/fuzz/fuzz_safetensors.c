/*
 * fuzz_safetensors.c: libFuzzer target for the safetensors reader and the config.json helper.
 * Each input is opened with st_safetensors_open_memory; when it opens, every tensor is looked
 * up by name, its first and last byte read, its dtype mapped, and the checkpoint written back
 * with st_safetensors_write and reopened: same names, dtypes, shapes and bytes. The same bytes
 * are also parsed as a config.json and read through every getter. Any rejection must come
 * with a negative status and an error naming the input.
 * Build: CC=clang cmake -S . -B build-fuzz -DST_FUZZ=ON -DST_SANITIZE=ON &&
 *        cmake --build build-fuzz -t fuzz_safetensors
 */
#include "io/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const name = "fuzz-input.safetensors";

static void check_error(st_status s, const char *who) {
    if (s >= 0 || !strstr(st_last_error(), who)) {
        fprintf(stderr, "rejection without a clear error: status %d, '%s'\n", (int)s,
                st_last_error());
        abort();
    }
}

static void check_same(const st_safetensors *a, const st_safetensors *b) {
    if (st_safetensors_n_tensors(a) != st_safetensors_n_tensors(b))
        abort();
    for (int64_t i = 0; i < st_safetensors_n_tensors(a); i++) {
        const st_sf_tensor *x = st_safetensors_tensor_at(a, i), *y = st_safetensors_tensor_at(b, i);
        if (strcmp(x->name, y->name) || x->dtype != y->dtype || x->n_dims != y->n_dims ||
            x->size != y->size || (x->size && memcmp(x->data, y->data, x->size)))
            abort();
        for (int32_t d = 0; d < x->n_dims; d++)
            if (x->shape[d] != y->shape[d])
                abort();
    }
}

static void walk(const st_safetensors *sf, const uint8_t *data, size_t size) {
    volatile uint8_t sink = 0;
    int64_t n = st_safetensors_n_tensors(sf);
    size_t total = 0;
    const uint8_t *lowest = data + size;
    st_sf_tensor *copy = malloc(((size_t)n + 1) * sizeof *copy);
    if (!copy)
        abort();
    for (int64_t i = 0; i < n; i++) {
        const st_sf_tensor *t = st_safetensors_tensor_at(sf, i);
        if (st_safetensors_find(sf, t->name) != t || strcmp(t->file, name))
            abort();
        const uint8_t *p = t->data;
        if (p < data + 8 || t->size > (size_t)(data + size - p))
            abort();
        if (t->size)
            sink ^= p[0] ^ p[t->size - 1];
        st_dtype dt;
        st_status s = st_sf_tensor_dtype(t, &dt);
        if (s != ST_OK)
            check_error(s, name);
        (void)st_sf_dtype_name(t->dtype);
        total += t->size;
        lowest = p < lowest ? p : lowest;
        copy[i] = *t;
    }
    /* The tensors tile the data section, which ends the input: their sizes add up to it. */
    if (n && total != (size_t)(data + size - lowest))
        abort();
    if (st_safetensors_metadata(sf, "format"))
        sink ^= (uint8_t)st_safetensors_metadata(sf, "format")[0];

    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz_safetensors_%d.safetensors", (int)getpid());
    if (st_safetensors_write(path, copy, n) != ST_OK)
        abort();
    st_safetensors *back;
    if (st_safetensors_open(path, &back) != ST_OK) {
        fprintf(stderr, "round trip failed: %s\n", st_last_error());
        abort();
    }
    check_same(sf, back);
    st_safetensors_free(back);
    unlink(path);
    free(copy);
    (void)sink;
}

static void config(const uint8_t *data, size_t size) {
    st_hf_config *c;
    st_status s = st_hf_config_open_memory((const char *)data, size, "fuzz-config.json", &c);
    if (s != ST_OK) {
        check_error(s, "fuzz-config.json");
        return;
    }
    static const char *const keys[] = {
        "hidden_size", "rope_scaling.factor", "eos_token_id", "a", "a.b", "", "."};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        int64_t v, ids[2], n;
        double d;
        bool b;
        const char *str;
        (void)st_hf_config_has(c, keys[i]);
        if ((s = st_hf_config_get_int(c, keys[i], &v)))
            check_error(s, "fuzz-config.json");
        if ((s = st_hf_config_get_float(c, keys[i], &d)))
            check_error(s, "fuzz-config.json");
        if ((s = st_hf_config_get_bool(c, keys[i], &b)))
            check_error(s, "fuzz-config.json");
        if ((s = st_hf_config_get_str(c, keys[i], &str)))
            check_error(s, "fuzz-config.json");
        else if (strlen(str) > size)
            abort();
        if ((s = st_hf_config_get_ints(c, keys[i], ids, 2, &n)))
            check_error(s, "fuzz-config.json");
    }
    st_hf_config_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_safetensors *sf;
    st_status s = st_safetensors_open_memory(data, size, name, &sf);
    if (s != ST_OK)
        check_error(s, name);
    else {
        walk(sf, data, size);
        st_safetensors_free(sf);
    }
    config(data, size);
    return 0;
}
