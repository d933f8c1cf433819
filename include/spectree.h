/*
 * spectree.h: the one public header of spectree, a C11 inference engine for Llama-family models
 * built around lossless tree speculative decoding. This header is the manual.
 *
 * Usage (greedy generation, errors abbreviated):
 *
 *     st_model *model;
 *     if (st_model_load("stories260K.gguf", &model) != ST_OK) {
 *         fprintf(stderr, "%s\n", st_last_error());
 *         return 1;
 *     }
 *     const st_tokenizer *tok = st_model_tokenizer(model);
 *     int32_t ids[256];
 *     int64_t n_ids;
 *     st_tokenize(tok, "Once upon a time", 16, 1, ids, 256, &n_ids);
 *     st_gen_params gp = st_gen_default_params();
 *     gp.n_predict = 64;
 *     st_generate(model, ids, n_ids, &gp, on_token, user_data, &stats);
 *     st_model_free(model);
 *
 * Conventions:
 * - Fallible functions return st_status (ST_OK = 0, negative on error). The human-readable detail
 *   of the last error on the calling thread is in st_last_error(); it names the file or the
 *   argument and what is wrong. Nothing in the library exits or aborts on bad input.
 * - Objects are opaque handles created by st_<object>_load/_create and released by
 *   st_<object>_free, which accepts NULL.
 * - Output arrays are owned by the caller; each function documents the size it needs.
 * - Token ids and positions are int32_t; element counts are int64_t; byte sizes are size_t.
 */
#ifndef SPECTREE_H
#define SPECTREE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Status codes and errors
 * ------------------------------------------------------------------------------------------- */

typedef enum st_status {
    ST_OK = 0,
    ST_ERR_INVALID = -1,     /* bad argument (flag, shape, token id, tree index) */
    ST_ERR_IO = -2,          /* a file could not be opened, read or mapped */
    ST_ERR_FORMAT = -3,      /* a file is truncated, corrupt or not what it claims to be */
    ST_ERR_NOMEM = -4,       /* an allocation failed */
    ST_ERR_UNSUPPORTED = -5, /* valid input this build does not handle (tensor type, arch) */
    ST_ERR_RANGE = -6,       /* an index or size outside its array or capacity */
} st_status;

/* Detail of the last error on the calling thread ("" if none). Valid until the next failing call
 * on the same thread. */
const char *st_last_error(void);

/* A short fixed name for a status code ("ok", "invalid argument", ...). */
const char *st_status_str(st_status s);

/* Allocation hook: every heap allocation of the library goes through these counters, so tests can
 * assert that a hot loop allocates nothing. st_alloc_count() returns the number of allocations
 * made by the library since the process started (all threads). */
int64_t st_alloc_count(void);

/* Monotonic clock in seconds (for timing in tools and benchmarks). */
double st_time_seconds(void);

/* ---------------------------------------------------------------------------------------------
 * GGUF files (read-only, memory-mapped). See docs/FORMATS.md in the shared folder, section (b).
 * ------------------------------------------------------------------------------------------- */

typedef struct st_gguf st_gguf;

typedef enum st_gguf_type {
    ST_GGUF_UINT8 = 0,
    ST_GGUF_INT8 = 1,
    ST_GGUF_UINT16 = 2,
    ST_GGUF_INT16 = 3,
    ST_GGUF_UINT32 = 4,
    ST_GGUF_INT32 = 5,
    ST_GGUF_FLOAT32 = 6,
    ST_GGUF_BOOL = 7,
    ST_GGUF_STRING = 8,
    ST_GGUF_ARRAY = 9,
    ST_GGUF_UINT64 = 10,
    ST_GGUF_INT64 = 11,
    ST_GGUF_FLOAT64 = 12,
} st_gguf_type;

/* Tensor element types (ggml ids). */
typedef enum st_dtype {
    ST_DTYPE_F32 = 0,
    ST_DTYPE_F16 = 1,
    ST_DTYPE_Q4_0 = 2,
    ST_DTYPE_Q8_0 = 8,
    ST_DTYPE_BF16 = 30,
} st_dtype;

/* One tensor of a GGUF file. ne[0] is the innermost (contiguous) dimension. `data` points into the
 * read-only mapping and stays valid until st_gguf_free. */
typedef struct st_gguf_tensor {
    const char *name; /* NUL-terminated copy owned by the st_gguf */
    uint32_t type;    /* ggml type id; st_dtype for the supported ones */
    uint32_t n_dims;  /* 1..4 */
    int64_t ne[4];    /* unused dims are 1 */
    uint64_t offset;  /* from the start of the data blob */
    size_t size;      /* bytes */
    const void *data;
} st_gguf_tensor;

/* A string inside the file: not NUL-terminated. */
typedef struct st_gguf_str {
    const char *ptr;
    uint64_t len;
} st_gguf_str;

/* Opens and validates a GGUF v2/v3 file: header, every key/value, every tensor info, alignment,
 * that every tensor lies inside the file. Vocab-only files (no tensors) are accepted. On error,
 * *out is NULL and st_last_error() names the file and the problem. */
st_status st_gguf_open(const char *path, st_gguf **out);

/* Same, over a caller-owned buffer that must outlive the st_gguf (used by tests and fuzzers).
 * `name` is used in error messages. */
st_status st_gguf_open_memory(const void *data, size_t size, const char *name, st_gguf **out);

void st_gguf_free(st_gguf *g);

uint32_t st_gguf_version(const st_gguf *g);
int64_t st_gguf_n_kv(const st_gguf *g);
int64_t st_gguf_n_tensors(const st_gguf *g);
uint32_t st_gguf_alignment(const st_gguf *g);

/* Key/value access. st_gguf_find returns the index of a key or -1. */
int64_t st_gguf_find(const st_gguf *g, const char *key);
const char *st_gguf_key(const st_gguf *g, int64_t i); /* NUL-terminated */
st_gguf_type st_gguf_kv_type(const st_gguf *g, int64_t i);
/* For arrays: the element type and count. */
st_gguf_type st_gguf_arr_type(const st_gguf *g, int64_t i);
int64_t st_gguf_arr_len(const st_gguf *g, int64_t i);

/* Typed getters. Each fails with ST_ERR_FORMAT (message names file and key) when the key is
 * missing or its type does not fit. Integer getters accept any integer type whose value fits;
 * st_gguf_get_f32 accepts FLOAT32 and FLOAT64. */
st_status st_gguf_get_u32(const st_gguf *g, const char *key, uint32_t *out);
st_status st_gguf_get_i64(const st_gguf *g, const char *key, int64_t *out);
st_status st_gguf_get_f32(const st_gguf *g, const char *key, float *out);
st_status st_gguf_get_bool(const st_gguf *g, const char *key, int *out);
st_status st_gguf_get_str(const st_gguf *g, const char *key, st_gguf_str *out);

/* Array access by KV index. Element i of an array of strings; of any numeric array as double
 * (exact for all 32-bit types); a pointer to the raw little-endian elements of a numeric array. */
st_status st_gguf_arr_str(const st_gguf *g, int64_t kv, int64_t i, st_gguf_str *out);
st_status st_gguf_arr_num(const st_gguf *g, int64_t kv, int64_t i, double *out);
const void *st_gguf_arr_data(const st_gguf *g, int64_t kv);

/* A value of any non-array type formatted as text into buf (for `spectree info`); arrays print
 * their type and length with the first few elements. Returns the length written (truncated to
 * cap-1). */
int st_gguf_format_value(const st_gguf *g, int64_t kv, char *buf, size_t cap);

const st_gguf_tensor *st_gguf_tensor_at(const st_gguf *g, int64_t i);
const st_gguf_tensor *st_gguf_tensor_find(const st_gguf *g, const char *name);

/* Name of a ggml type id ("f32", "q8_0", ...; "type<N>" for unknown ids, returned in a static
 * buffer per id range so it is always a valid string). */
const char *st_dtype_name(uint32_t type);

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */

typedef struct st_model st_model;
typedef struct st_tokenizer st_tokenizer;

/* Hyper-parameters of a loaded Llama model (names as in STYLE.md). */
typedef struct st_model_hparams {
    int32_t n_vocab;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_ff;
    int32_t n_ctx_train; /* llama.context_length */
    int32_t n_rot;       /* llama.rope.dimension_count (= head_dim) */
    float rope_base;     /* llama.rope.freq_base, default 10000 */
    float rms_eps;       /* llama.attention.layer_norm_rms_epsilon */
    int tied_output;     /* 1 when output.weight is absent and token_embd is reused */
    uint32_t wtype;      /* type of the attention/FFN weights of block 0 (st_dtype) */
} st_model_hparams;

/* Loads a GGUF Llama model (weights mmap'd read-only) with its tokenizer. Validates the
 * architecture, every hyper-parameter and every tensor's name, type and shape; on error *out is
 * NULL and st_last_error() names the file and the problem. */
st_status st_model_load(const char *path, st_model **out);
void st_model_free(st_model *m);
const st_model_hparams *st_model_get_hparams(const st_model *m);
/* The model's tokenizer; owned by the model. */
const st_tokenizer *st_model_tokenizer(const st_model *m);
/* Bytes of weights read per token by a forward pass (all matrices). */
size_t st_model_weight_bytes(const st_model *m);

/* ---------------------------------------------------------------------------------------------
 * Tokenizers (built from a GGUF vocabulary)
 * ------------------------------------------------------------------------------------------- */

/* Builds the tokenizer described by the tokenizer.ggml.* keys of g ("llama": SentencePiece BPE
 * with byte fallback; "gpt2": byte-level BPE with the pre-tokenizer named by
 * tokenizer.ggml.pre). Copies what it needs, so it outlives g. */
st_status st_tokenizer_load(const st_gguf *g, st_tokenizer **out);
void st_tokenizer_free(st_tokenizer *t);
int32_t st_tokenizer_n_vocab(const st_tokenizer *t);

/* ---------------------------------------------------------------------------------------------
 * Sessions: a KV cache for up to n_seq sequences, scratch sized once, and a thread pool.
 * ------------------------------------------------------------------------------------------- */

typedef struct st_session st_session;

typedef struct st_session_params {
    int32_t n_ctx;     /* positions per sequence; 0 = the model's training context */
    int32_t n_seq;     /* sequences held at once (default 1) */
    int32_t n_batch;   /* most tokens in one forward pass (default 64) */
    int32_t n_threads; /* threads incl. the caller; 0: all cores (1 below 16 MB of weights) */
} st_session_params;

st_session_params st_session_default_params(void);

/* Creates a session: every buffer is allocated here, none during evaluation. */
st_status st_session_create(const st_model *m, const st_session_params *p, st_session **out);
void st_session_free(st_session *s);
const st_session_params *st_session_get_params(const st_session *s);

/* Number of positions committed in sequence seq (its KV length). */
int32_t st_session_seq_len(const st_session *s, int32_t seq);
/* Forgets sequence seq (length 0). */
st_status st_session_seq_reset(st_session *s, int32_t seq);

/* Evaluates n tokens of sequence seq with causal attention at positions L..L+n-1 (L = the
 * sequence's length), appends their K/V, and advances the length by n. Any n >= 1 is accepted
 * (split internally into forward passes of at most n_batch tokens). If logits is not NULL it
 * receives the logits of the last n_logits tokens, shape (n_logits, n_vocab), n_logits <= n.
 * Errors: ST_ERR_INVALID for a bad token id or seq, ST_ERR_RANGE when the context is full. */
st_status st_session_eval(st_session *s, int32_t seq, const int32_t *tokens, int32_t n,
                          float *logits, int32_t n_logits);

/* ---------------------------------------------------------------------------------------------
 * Sampling
 * ------------------------------------------------------------------------------------------- */

typedef struct st_sampler_params {
    float temp;    /* 0 = greedy (argmax, lowest id on ties) */
    int32_t top_k; /* <= 0: off */
    float top_p;   /* >= 1: off */
    float min_p;   /* <= 0: off; keeps tokens with p >= min_p * p_max */
    uint64_t seed;
} st_sampler_params;

st_sampler_params st_sampler_default_params(void);

/* Bytes of scratch st_sample needs for a vocabulary of n_vocab. */
size_t st_sample_scratch_size(int32_t n_vocab);

/* Samples the token that will occupy absolute position pos from logits (n_vocab floats).
 * Filters apply in this order: top-k, then softmax at temperature temp, top-p, min-p; the kept
 * tokens are ordered by probability (ties by lower id) and the token is found by inverse CDF with
 * the uniform st_sample_uniform(seed, pos). The result is therefore a pure function of (logits,
 * params, pos): speculative decoding reproduces it exactly. scratch: st_sample_scratch_size
 * bytes, caller-owned. */
st_status st_sample(const float *logits, int32_t n_vocab, const st_sampler_params *p, int64_t pos,
                    void *scratch, int32_t *out);

/* The uniform draw in [0, 1) used for position pos. */
float st_sample_uniform(uint64_t seed, int64_t pos);

#ifdef __cplusplus
}
#endif

/* TEMPORARY until the fragments are merged into this header. */
#include "../src/tok/tok_api.h"
#include "../src/spec/attn_api.h"
#include "../src/engine/engine_api.h"

#endif /* SPECTREE_H */
