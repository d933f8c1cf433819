/*
 * gguf_util.c: helpers the GGUF test programs share (test_gguf_read, test_gguf_write,
 * test_gguf_model): paths of the shared files, a seeded RNG, error and value checks, and
 * build_small, a 2-layer model made with the writer.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "gguf_util.h"

#include "io/gguf_internal.h"
#include "io/gguf_write.h"
#include "kernels/kernels.h"
#include "spectree.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *stories(void) { return tu_data("models/stories260K.gguf"); }
const char *spm(void) { return tu_data("tests/data/tokenizer/ggml-vocab-llama-spm.gguf"); }
const char *gpt2(void) { return tu_data("tests/data/tokenizer/ggml-vocab-gpt-2.gguf"); }

uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
uint64_t rng_below(uint64_t *s, uint64_t n) { return n ? rng_next(s) % n : 0; }
float rng_float(uint64_t *s) { return (float)(rng_next(s) >> 40) / 16777216.0f * 2 - 1; }

void assert_str_eq_n(st_gguf_str s, const char *want) {
    assert_int_equal(s.len, strlen(want));
    assert_memory_equal(s.ptr, want, s.len);
}

uint32_t get_u32(const st_gguf *g, const char *key) {
    uint32_t v = 0;
    assert_int_equal(st_gguf_get_u32(g, key, &v), ST_OK);
    return v;
}

/* The error of the last failing call names `name`. */
void assert_error_names(st_status s, const char *name) {
    assert_true(s < 0);
    const char *e = st_last_error();
    assert_non_null(e);
    if (!e[0] || !strstr(e, name))
        fail_msg("error '%s' does not name '%s'", e, name);
}

st_gguf_writer *new_writer(void) {
    st_gguf_writer *w = NULL;
    assert_int_equal(st_gguf_writer_create(&w), ST_OK);
    return w;
}

const hparam small_hparams[N_SMALL_HPARAMS] = {
    {"llama.context_length", 64, 0, "context_length"},
    {"llama.embedding_length", SM_DIM, 0, "embedding_length"},
    {"llama.block_count", SM_LAYERS, 0, "block_count"},
    {"llama.feed_forward_length", SM_FF, 0, "feed_forward_length"},
    {"llama.attention.head_count", SM_HEADS, 0, "head_count"},
    {"llama.attention.head_count_kv", SM_KV, 0, "head_count"},
    {"llama.rope.dimension_count", SM_DIM / SM_HEADS, 0, "rope"},
    {"llama.rope.freq_base", 0, 10000.0f, "freq_base"},
    {"llama.attention.layer_norm_rms_epsilon", 0, 1e-5f, "epsilon"},
};

static void add_key(st_gguf_writer *w, const hparam *h, key_mode mode) {
    const uint32_t arr[1] = {h->value};
    switch (mode) {
    case KEY_OK:
        if (h->value)
            assert_int_equal(st_gguf_writer_add_u32(w, h->key, h->value), ST_OK);
        else
            assert_int_equal(st_gguf_writer_add_f32(w, h->key, h->fval), ST_OK);
        break;
    case KEY_MISSING:
        break;
    case KEY_STRING:
        assert_int_equal(st_gguf_writer_add_str(w, h->key, "32"), ST_OK);
        break;
    case KEY_F32:
        if (h->value)
            assert_int_equal(st_gguf_writer_add_f32(w, h->key, (float)h->value), ST_OK);
        else
            assert_int_equal(st_gguf_writer_add_u32(w, h->key, 1), ST_OK);
        break;
    case KEY_ARRAY:
        assert_int_equal(st_gguf_writer_add_arr(w, h->key, ST_GGUF_UINT32, arr, 1), ST_OK);
        break;
    case KEY_BOOL:
        assert_int_equal(st_gguf_writer_add_bool(w, h->key, 1), ST_OK);
        break;
    case KEY_NEG:
        if (h->value)
            assert_int_equal(st_gguf_writer_add_i32(w, h->key, -(int32_t)h->value), ST_OK);
        else
            assert_int_equal(st_gguf_writer_add_f32(w, h->key, -h->fval), ST_OK);
        break;
    case KEY_HUGE:
        if (h->value)
            assert_int_equal(st_gguf_writer_add_u64(w, h->key, UINT64_MAX - 5), ST_OK);
        else
            assert_int_equal(st_gguf_writer_add_f32(w, h->key, INFINITY), ST_OK);
        break;
    case KEY_ZERO:
        if (h->value)
            assert_int_equal(st_gguf_writer_add_u32(w, h->key, 0), ST_OK);
        else
            assert_int_equal(st_gguf_writer_add_f32(w, h->key, NAN), ST_OK);
        break;
    case KEY_N:
        break;
    }
}

typedef struct small_tensor {
    const char *name;
    int64_t n_in, n_out;
    uint32_t type;
} small_tensor;

/* A 2-layer model with stories260K's tokenizer and every weight type (token_embd q8_0,
 * output q4_0, layer 0 f16, layer 1 bf16, norms f32) and general.alignment 64. Key `bad`
 * (or -1) gets `mode`. Returns a malloc'd image. */
void *build_small(const st_gguf *vocab, int bad, key_mode mode, size_t *size) {
    st_gguf_writer *w = new_writer();
    assert_int_equal(st_gguf_writer_add_str(w, "general.architecture", "llama"), ST_OK);
    assert_int_equal(st_gguf_writer_add_u32(w, "general.alignment", 64), ST_OK);
    for (int i = 0; i < N_SMALL_HPARAMS; i++)
        add_key(w, &small_hparams[i], i == bad ? mode : KEY_OK);
    assert_int_equal(st_gguf_writer_copy_tokenizer(w, vocab, NULL, 0), ST_OK);
    const int64_t V = st_gguf_arr_len(vocab, st_gguf_find(vocab, "tokenizer.ggml.tokens"));
    const int64_t E = SM_DIM, F = SM_FF, KV = SM_KV * (SM_DIM / SM_HEADS);
    small_tensor ts[3 + 9 * SM_LAYERS];
    int n = 0;
    ts[n++] = (small_tensor){"token_embd.weight", E, V, ST_DTYPE_Q8_0};
    ts[n++] = (small_tensor){"output_norm.weight", E, 1, ST_DTYPE_F32};
    ts[n++] = (small_tensor){"output.weight", E, V, ST_DTYPE_Q4_0};
    static char names[SM_LAYERS][9][48];
    static const char *suffix[9] = {"attn_norm", "attn_q",   "attn_k", "attn_v",  "attn_output",
                                    "ffn_norm",  "ffn_gate", "ffn_up", "ffn_down"};
    for (int l = 0; l < SM_LAYERS; l++) {
        uint32_t wt = l == 0 ? ST_DTYPE_F16 : ST_DTYPE_BF16;
        const int64_t in[9] = {E, E, E, E, E, E, E, E, F}, out[9] = {1, E, KV, KV, E, 1, F, F, E};
        for (int k = 0; k < 9; k++) {
            snprintf(names[l][k], sizeof names[l][k], "blk.%d.%s.weight", l, suffix[k]);
            ts[n++] = (small_tensor){names[l][k], in[k], out[k], out[k] == 1 ? ST_DTYPE_F32 : wt};
        }
    }
    uint64_t seed = 7;
    for (int i = 0; i < n; i++) {
        int64_t nel = ts[i].n_in * ts[i].n_out;
        float *x = malloc((size_t)nel * sizeof(float));
        for (int64_t k = 0; k < nel; k++)
            x[k] = ts[i].n_out == 1 ? 1.0f + 0.1f * rng_float(&seed)
                                    : rng_float(&seed) / sqrtf((float)ts[i].n_in);
        int64_t ne[2] = {ts[i].n_in, ts[i].n_out};
        size_t bytes;
        assert_int_equal(st_gguf_tensor_bytes(ts[i].type, ts[i].n_out == 1 ? 1 : 2, ne, &bytes),
                         ST_OK);
        void *q = malloc(bytes);
        assert_int_equal(st_quantize_row(ts[i].type, x, nel, q), ST_OK);
        assert_int_equal(st_gguf_writer_add_tensor(w, ts[i].name, ts[i].type,
                                                   ts[i].n_out == 1 ? 1 : 2, ne, q, bytes,
                                                   ST_GGUF_COPY),
                         ST_OK);
        free(q);
        free(x);
    }
    void *buf;
    assert_int_equal(st_gguf_writer_write_memory(w, &buf, size), ST_OK);
    st_gguf_writer_free(w);
    return buf;
}

/* Logits of tokens {1, 5, 9} in a fresh session (n_vocab floats, malloc'd). */
float *eval_logits(const st_model *m) {
    st_session_params p = st_session_default_params();
    p.n_ctx = 8;
    p.n_threads = 1;
    p.n_batch = 4;
    st_session *s;
    assert_int_equal(st_session_create(m, &p, &s), ST_OK);
    const int32_t toks[3] = {1, 5, 9};
    int32_t V = st_model_get_hparams(m)->n_vocab;
    float *lg = malloc((size_t)V * sizeof(float));
    assert_int_equal(st_session_eval(s, 0, toks, 3, lg, 1), ST_OK);
    for (int32_t i = 0; i < V; i++)
        assert_true(isfinite(lg[i]));
    st_session_free(s);
    return lg;
}
