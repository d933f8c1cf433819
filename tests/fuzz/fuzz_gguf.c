/*
 * fuzz_gguf.c: libFuzzer target for the GGUF reader and the model loader. Each input is opened
 * with st_gguf_open_memory; when it opens, every KV is formatted and read through the typed and
 * array accessors, and every tensor's first and last byte is read; then the same bytes go to
 * st_model_load_memory, and a model that loads evaluates two tokens. Any rejection must come
 * with a negative status and an error naming the input. Build with -DST_FUZZ=ON (clang).
 */
#include "spectree.h"

#include "spectree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const name = "fuzz-input.gguf";

static void check_error(st_status s) {
    if (s >= 0 || !strstr(st_last_error(), name)) {
        fprintf(stderr, "rejection without a clear error: status %d, '%s'\n", (int)s,
                st_last_error());
        abort();
    }
}

static void walk(const st_gguf *g) {
    char buf[256];
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < st_gguf_n_kv(g); i++) {
        const char *key = st_gguf_key(g, i);
        st_gguf_format_value(g, i, buf, sizeof buf);
        st_gguf_format_value(g, i, buf, 5);
        int64_t n = st_gguf_arr_len(g, i);
        if (n >= 0) {
            const int64_t idx[] = {0, n / 2, n - 1, n};
            for (int k = 0; k < 4; k++) {
                st_gguf_str s;
                double d;
                if (st_gguf_arr_type(g, i) == ST_GGUF_STRING) {
                    if (st_gguf_arr_str(g, i, idx[k], &s) == ST_OK && s.len)
                        sink ^= (uint8_t)(s.ptr[0] ^ s.ptr[s.len - 1]);
                } else if (st_gguf_arr_num(g, i, idx[k], &d) == ST_OK) {
                    sink ^= (uint8_t)(d != d);
                }
            }
            const uint8_t *raw = st_gguf_arr_data(g, i);
            if (raw && n > 0)
                sink ^= raw[0];
        } else {
            uint32_t u;
            int64_t v;
            float f;
            int b;
            st_gguf_str s;
            (void)st_gguf_get_u32(g, key, &u);
            (void)st_gguf_get_i64(g, key, &v);
            (void)st_gguf_get_f32(g, key, &f);
            (void)st_gguf_get_bool(g, key, &b);
            if (st_gguf_get_str(g, key, &s) == ST_OK && s.len)
                sink ^= (uint8_t)(s.ptr[0] ^ s.ptr[s.len - 1]);
        }
    }
    for (int64_t i = 0; i < st_gguf_n_tensors(g); i++) {
        const st_gguf_tensor *t = st_gguf_tensor_at(g, i);
        if (st_gguf_tensor_find(g, t->name) != t)
            abort();
        (void)st_dtype_name(t->type);
        if (t->size)
            sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->size - 1];
    }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_gguf *g;
    st_status s = st_gguf_open_memory(data, size, name, &g);
    if (s != ST_OK) {
        check_error(s);
        return 0;
    }
    walk(g);
    st_gguf_free(g);
    st_model *m;
    s = st_model_load_memory(data, size, name, &m);
    if (s != ST_OK) {
        check_error(s);
        return 0;
    }
    st_session_params p = st_session_default_params();
    p.n_ctx = 4;
    p.n_batch = 2;
    p.n_threads = 1;
    st_session *ss;
    if (st_session_create(m, &p, &ss) == ST_OK) {
        int32_t V = st_model_get_hparams(m)->n_vocab;
        int32_t toks[2] = {1 % V, 2 % V};
        float *lg = malloc((size_t)V * sizeof(float));
        if (!lg || st_session_eval(ss, 0, toks, 2, lg, 1) != ST_OK)
            abort();
        free(lg);
        st_session_free(ss);
    }
    st_model_free(m);
    return 0;
}
