/*
 * spectree.h: the one public header of spectree, a C11 inference engine for Llama-family models
 * built around lossless tree speculative decoding. This header is the manual.
 *
 * Usage (greedy generation with tree speculation; tests/test_example.c compiles and runs exactly
 * the code between the two lines of dashes, with the model path it is given):
 *
 * ----
 *     static int on_token(void *user, int32_t token) { // prints each token's text as it comes
 *         char text[256];
 *         size_t n;
 *         if (st_detok_push(user, token, text, sizeof text, &n) == ST_OK)
 *             fwrite(text, 1, n, stdout);
 *         return 0; // nonzero stops generation
 *     }
 *
 *     int example(const char *path) {
 *         st_model *model;
 *         if (st_model_load(path, &model) != ST_OK) { // e.g. "stories260K.gguf"
 *             fprintf(stderr, "%s\n", st_last_error());
 *             return 1;
 *         }
 *         const st_tokenizer *tok = st_model_tokenizer(model);
 *         int32_t ids[256];
 *         int64_t n_ids;
 *         st_tokenize(tok, "Once upon a time", 16, 1, ids, 256, &n_ids);
 *         st_gen_params gp = st_gen_default_params();
 *         gp.n_predict = 64;
 *         gp.sampler.temp = 0.0f;       // greedy
 *         gp.spec.algo = ST_SPEC_NGRAM; // tree speculation: the same text, sooner
 *         st_detok detok;
 *         st_detok_init(&detok, tok);
 *         st_detok_set_prev(&detok, ids[n_ids - 1]);
 *         st_gen_stats stats;
 *         st_status rc = st_generate(model, ids, n_ids, &gp, on_token, &detok, &stats);
 *         if (rc != ST_OK)
 *             fprintf(stderr, "%s\n", st_last_error());
 *         st_model_free(model);
 *         return rc == ST_OK ? 0 : 1;
 *     }
 * ----
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
    ST_ERR_BUSY = -7,        /* a queue is full: try again later (st_engine_submit) */
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

/* Environment. The library reads five variables; none changes a result (every kernel table is
 * bitwise equal to the scalar reference):
 *   ST_KERNELS=ref   the scalar reference kernels; ST_KERNELS=avx2: the AVX2 table even on an
 *                    AVX-512 machine; unset (or anything else): the best the CPU supports.
 *                    Read once, when the first kernel is needed.
 *   ST_PACK=0        no packed copy of small F32 models' matrices (read by each st_model_load;
 *                    the copy, 1.3-1.9x faster on stories260K, is made for models with at most
 *                    16 MB of F32 matrices), and Q8_0, Q4_0, Q4_K, Q5_K and Q6_K matrices
 *                    stay row-major (else the kernel table gets them packed at load, in place
 *                    when the weights are copied).
 *   ST_LOAD=mmap|copy  how ST_LOAD_AUTO loads (st_load_mode; read by each load; an explicit
 *                    mode in st_load_params wins).
 *   ST_CLOCK=cpu     the library's clock (st_time_seconds, the statistics' times, the timings
 *                    `auto` plans with) counts the process's CPU time instead of wall time:
 *                    with one thread, a measurement that other jobs on a shared machine do
 *                    not disturb. Read once, at the first reading of the clock.
 *   ST_AMX=0         the AVX-512 table never uses the AMX matrix unit (Q8_0 batches of 3 or
 *                    more tokens use it where the CPU and the OS allow). Read once.
 *   ST_AVXVNNI=0     the AVX2 table's packed Q8_0 and Q4_0 matmuls never use AVX-VNNI (they do
 *                    where the CPU has it: Intel client cores since Alder Lake, AMD since
 *                    Zen 5). Read once.
 * The name of the kernel table in use: "ref", "avx2" or "avx512". */
const char *st_kernels_name(void);

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
    ST_DTYPE_Q2_K = 10,
    ST_DTYPE_Q3_K = 11,
    ST_DTYPE_Q4_K = 12,
    ST_DTYPE_Q5_K = 13,
    ST_DTYPE_Q6_K = 14,
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

/* Loads a GGUF Llama model with its tokenizer, the weights placed as ST_LOAD_AUTO says (below:
 * big files are copied into huge pages, small ones stay mmap'd read-only). Validates the
 * architecture, every hyper-parameter and every tensor's name, type and shape; on error *out is
 * NULL and st_last_error() names the file and the problem. A directory is a Hugging Face
 * checkpoint (config.json, model.safetensors or its shards with their index, tokenizer.json,
 * tokenizer_config.json; model_type llama or mistral, F32/F16/BF16): it is converted to GGUF in
 * memory as st_convert_hf would write it (the weights are copied, keeping their types) and
 * loaded from there. */
st_status st_model_load(const char *path, st_model **out);
/* st_convert_hf's types for llama-quantize's K-quant file types: each tensor gets the type
 * llama-quantize gives it in such a file (Q4_K_M: output, and attn_v and ffn_down of the first
 * and last eighth of the layers and every third between, in Q6_K, the rest Q4_K; ...). */
enum {
    ST_CONVERT_Q2_K = 0x100 + 10,
    ST_CONVERT_Q3_K_S,
    ST_CONVERT_Q3_K_M,
    ST_CONVERT_Q3_K_L,
    ST_CONVERT_Q4_K_S,
    ST_CONVERT_Q4_K_M,
    ST_CONVERT_Q5_K_S,
    ST_CONVERT_Q5_K_M,
    ST_CONVERT_Q6_K
};
/* Writes the GGUF of the Hugging Face checkpoint `dir` to out_path: llama.cpp's llama
 * architecture keys and tensor names, q/k in GGUF's rotary layout, the tokenizer.ggml.* keys.
 * type: the matrices' type, ST_DTYPE_F32, F16, BF16, Q8_0 or Q4_0, a K-quant type
 * ST_DTYPE_Q2_K .. Q6_K for every matrix, one of the ST_CONVERT_Q*_K* mixes above, or -1 to keep
 * each as stored. Q8_0/Q4_0 leave matrices whose rows are not a multiple of 32 in F16; the
 * K-quants give rows that are not whole 256-element super-blocks Q4_0 (for Q2_K, Q3_K) or Q8_0
 * (Q4_K .. Q6_K), F16 when not even 32 divides them. Norms are F32. Errors name the file and
 * the field or tensor at fault. out_path appears whole or not at all (written beside it, then
 * renamed); ST_ERR_INVALID when it is the checkpoint's directory or one of its files, or exists
 * as anything but a regular file. */
st_status st_convert_hf(const char *dir, const char *out_path, int type);
/* Progress of st_convert_hf_ex, called after each tensor is written: tensors and data bytes
 * written so far, and their totals (the same function type as the GGUF writer's). */
typedef void (*st_convert_progress_fn)(void *user, int64_t tensors_done, int64_t n_tensors,
                                       size_t bytes_done, size_t total_bytes);
/* st_convert_hf with a progress callback (may be NULL; user is passed to it). */
st_status st_convert_hf_ex(const char *dir, const char *out_path, int type,
                           st_convert_progress_fn progress, void *user);
/* The same for a GGUF model `src` of any type the engine loads (every check st_model_load makes
 * is made first): its keys copied in their order (general.file_type set for the new type), its
 * tensors in their order, the matrices converted to `type` as above (each row dequantized and
 * quantized again: a quantized source keeps its rounding; to F32 it is exact), vectors F32; -1
 * copies every tensor as stored. For tools that read only some types (F32 for the EAGLE
 * trainers). ST_ERR_INVALID when out_path is src. progress may be NULL. */
st_status st_convert_gguf(const char *src, const char *out_path, int type,
                          st_convert_progress_fn progress, void *user);
/* Loads a GGUF Llama model from a caller-owned buffer of `size` bytes holding the whole file, with
 * the same checks as st_model_load (for tests, fuzzers and embedded models). The weights are not
 * copied: the buffer must stay valid and unchanged until st_model_free. `name` (NULL: "<memory>")
 * is used in error messages in place of a path. On error *out is NULL and st_last_error() names
 * `name` and the problem. */
st_status st_model_load_memory(const void *data, size_t size, const char *name, st_model **out);

/* How st_model_load_ex places the weights. */
typedef enum st_load_mode {
    ST_LOAD_AUTO = 0,   /* COPY for files of at least ST_LOAD_COPY_MIN_BYTES when the memory is
                         * there (the file plus a quarter of it, at least 512 MB, within
                         * MemAvailable), else MMAP; ST_LOAD=mmap or ST_LOAD=copy in the
                         * environment decides instead (the test suite runs both ways) */
    ST_LOAD_MMAP = 1,   /* the weights stay in the read-only file mapping (4 KB page-cache pages,
                         * read in on first use, shared with other processes) */
    ST_LOAD_COPY = 2,   /* the file is read into anonymous memory aligned to 2 MB and advised
                         * MADV_HUGEPAGE (transparent huge pages), committed up front; the page
                         * cache's copy of the file is then released (POSIX_FADV_DONTNEED), so
                         * the machine holds the weights once. Decoding a multi-GB model streams
                         * the weights faster from it (fewer TLB misses, no page faults) */
    ST_LOAD_BUFFER = 3, /* reported for st_model_load_memory: the caller's buffer */
} st_load_mode;
#define ST_LOAD_COPY_MIN_BYTES ((size_t)256 << 20)

/* Called during a COPY load as the file is read (every 64 MB and at the end) with the bytes
 * read so far, the file's size and the seconds since the load started; in MMAP mode once, at the
 * end. Tools print it for big files; return nothing, it cannot stop the load. */
typedef void (*st_load_progress_fn)(void *user, size_t done, size_t total, double seconds);

typedef struct st_load_params {
    st_load_mode mode;            /* default ST_LOAD_AUTO */
    int mlock;                    /* 1: lock the weights in RAM (mlock; fails with a message
                                   * when RLIMIT_MEMLOCK is too low); default 0 */
    st_load_progress_fn progress; /* NULL: none */
    void *progress_user;
} st_load_params;
st_load_params st_load_default_params(void);

/* st_model_load with load parameters (params NULL: the defaults). Output is bitwise the same in
 * every mode: only where the bytes live changes. */
st_status st_model_load_ex(const char *path, const st_load_params *params, st_model **out);

/* What a load did (st_model_get_load_info). */
typedef struct st_load_info {
    st_load_mode mode;  /* the mode that ran: MMAP, COPY or BUFFER */
    const char *reason; /* why, a static string: "requested", "ST_LOAD", "file under 256 MB",
                         * "not enough available memory", "big file", "buffer",
                         * "Hugging Face checkpoint converted in memory" */
    int locked;         /* the weights are mlock'ed */
    size_t file_bytes;  /* the file's size (a converted checkpoint: its GGUF's) */
    size_t huge_bytes;  /* COPY: bytes backed by 2 MB pages when the load ended (0 without
                         * transparent huge pages) */
    double seconds;     /* wall time of the whole load (read, checks, tokenizer) */
    double cpu_seconds; /* CPU time of the loading thread over the same span (the load runs
                         * on it alone): what the load costs on a machine busy with others */
} st_load_info;
const st_load_info *st_model_get_load_info(const st_model *m);
/* "auto", "mmap", "copy", "buffer". */
const char *st_load_mode_name(st_load_mode mode);

void st_model_free(st_model *m);
const st_model_hparams *st_model_get_hparams(const st_model *m);
/* The model's tokenizer; owned by the model. */
const st_tokenizer *st_model_tokenizer(const st_model *m);
/* The model's GGUF metadata (for a Hugging Face directory, the GGUF converted in memory, with
 * tokenizer_config.json's chat_template as tokenizer.chat_template); owned by the model. */
const st_gguf *st_model_gguf(const st_model *m);
/* Bytes of weights read per token by a forward pass (all matrices). */
size_t st_model_weight_bytes(const st_model *m);

/* ---------------------------------------------------------------------------------------------
 * Tokenizers (built from a GGUF vocabulary)
 *
 * Two kinds, chosen by tokenizer.ggml.model:
 * - "llama": SentencePiece BPE with byte fallback (Llama 2, TinyLlama, Mistral, stories260K).
 *   One "▁" (U+2581) is prepended when add_space_prefix (default true), every space becomes "▁",
 *   then the adjacent pair whose concatenation is a piece with the highest score merges first
 *   (ties: leftmost); characters left without a piece become their <0xHH> byte pieces.
 * - "gpt2": byte-level BPE (Llama 3, Qwen2, DeepSeek, GPT-2). The text is split by the
 *   pre-tokenizer named by tokenizer.ggml.pre, then each part is merged by the rank order of
 *   tokenizer.ggml.merges. Supported pre-tokenizers: "gpt-2" (also "gpt2", "default", absent,
 *   "mpt", "olmo", "phi-2", "roberta-bpe", "jais"), "llama-bpe" ("llama3", "llama-v3", "falcon3";
 *   a whole part that is a piece is emitted without merging), "dbrx" and "smaug-bpe" (the
 *   Llama 3 split, merges always applied), "qwen2" ("stablelm2", "megrez"), "deepseek-llm".
 *
 * Text is UTF-8. Bytes that are not valid UTF-8 get a defined result: each such byte stands
 * alone (SentencePiece: its <0xHH> piece; byte-level BPE: its byte symbol, classed as
 * punctuation by the pre-tokenizer), so nothing is lost and nothing crashes.
 * Control-token text such as "<s>" in the input is plain text. Pieces of user-defined tokens
 * (token type 4) are matched first, longest first, and emitted as their id, as llama.cpp does.
 *
 * A tokenizer is immutable after loading: any number of threads may use one at once.
 * ------------------------------------------------------------------------------------------- */

/* Builds a tokenizer from the tokenizer.ggml.* keys of g. Everything needed is copied, so the
 * tokenizer outlives g. Errors (st_last_error() names the file and the key):
 * ST_ERR_FORMAT for missing tokenizer.ggml.model/tokens (or merges for gpt2), a key of the wrong
 * type, scores/token_type arrays whose length differs from the token count, a malformed merge
 * (no separating space), a BOS/EOS id outside the vocabulary (an id of 0xFFFFFFFF or -1 means
 * "none"); ST_ERR_UNSUPPORTED for an unknown model or pre-tokenizer name; ST_ERR_NOMEM.
 * A merge naming a piece that is not in the vocabulary can never apply and is ignored.
 * On error *out is NULL. */
st_status st_tokenizer_load(const st_gguf *g, st_tokenizer **out);

/* Frees a tokenizer; accepts NULL. */
void st_tokenizer_free(st_tokenizer *t);

/* Number of tokens (valid ids are 0 .. n_vocab-1). */
int32_t st_tokenizer_n_vocab(const st_tokenizer *t);

/* Special ids, -1 if the vocabulary has none. Defaults when the key is absent: "llama" BOS 1,
 * EOS 2; "gpt2" none. */
int32_t st_tokenizer_bos(const st_tokenizer *t);
int32_t st_tokenizer_eos(const st_tokenizer *t);

/* Whether prompts should start with BOS: tokenizer.ggml.add_bos_token, else true for "llama"
 * and for the Llama 3 pre-tokenizers, false otherwise. */
int st_tokenizer_add_bos_default(const st_tokenizer *t);

/* 1 if id ends generation: EOS, tokenizer.ggml.eot_token_id / eom_token_id, and the pieces
 * "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
 * "<EOT>" (as llama.cpp). 0 otherwise, including ids out of range. */
int st_tokenizer_is_eog(const st_tokenizer *t, int32_t id);

/* Tokenizes len bytes of text (no NUL needed; text may be NULL when len is 0), prepending BOS
 * when add_bos is nonzero. Writes at most cap ids to out (out may be NULL when cap is 0) and
 * sets *n_out to the number of ids the whole result has. Returns ST_OK; ST_ERR_RANGE when
 * cap < *n_out (out then holds the first cap ids: call again with a larger buffer);
 * ST_ERR_INVALID for a bad argument, a text over 1 GiB, or add_bos without a BOS token;
 * ST_ERR_NOMEM. The empty text gives no tokens (just BOS when asked). Scratch memory, about 100
 * bytes per input byte, is allocated per call and freed before returning. */
st_status st_tokenize(const st_tokenizer *t, const char *text, size_t len, int add_bos,
                      int32_t *out, int64_t cap, int64_t *n_out);

/* st_tokenize for a text that may give at most max_tokens ids (>= 0; BOS counted): ST_ERR_RANGE
 * when it gives more, decided without tokenizing when the text alone is too long for them (over
 * max_tokens times twice the longest token's decoded bytes, or 4: a token never stands for more
 * input than it decodes to, an unknown character for at most 4 bytes), so that a huge prompt is
 * refused at once; *n_out is then max_tokens + 1, a lower bound. Otherwise as st_tokenize
 * (ST_ERR_RANGE also when cap < *n_out <= max_tokens). */
st_status st_tokenize_max(const st_tokenizer *t, const char *text, size_t len, int add_bos,
                          int64_t max_tokens, int32_t *out, int64_t cap, int64_t *n_out);

/* The raw vocabulary text of token id ("▁the", "Ġthe", "<0x0A>", "<s>"), NUL-terminated and
 * owned by the tokenizer; *len (if len is not NULL) gets its length in bytes. NULL for ids out
 * of range. */
const char *st_tokenizer_piece(const st_tokenizer *t, int32_t id, size_t *len);

/* Streaming detokenizer. The state is caller-owned and fixed-size; nothing is allocated.
 *
 *     st_detok d;
 *     st_detok_init(&d, tok);
 *     for each generated id: st_detok_push(&d, id, buf, sizeof buf, &n); fwrite(buf, 1, n, f);
 *     st_detok_flush(&d, buf, sizeof buf, &n); fwrite(buf, 1, n, f);
 *
 * Each token contributes its bytes: "llama" pieces with "▁" as a space and <0xHH> pieces as the
 * raw byte; "gpt2" pieces mapped back from the byte alphabet ("Ġ" -> space); user-defined
 * pieces as written. Control, unknown and unused tokens (BOS, EOS, <unk>) contribute nothing.
 * Output is always valid UTF-8: the bytes of a character split across tokens are held back
 * until the token that completes it, and a sequence that cannot be completed is written as one
 * U+FFFD per maximal ill-formed subpart as soon as that is certain (or at flush).
 * Leading space: for "llama" vocabularies with add_space_prefix, the first token with text after
 * BOS loses one leading space ("<s> ▁Hello" -> "Hello"), as tokenize added it. */
typedef struct st_detok {
    const st_tokenizer *tok;
    int32_t prev;        /* last id pushed or primed; -1 at the start */
    int32_t strip_space; /* 1: drop one leading space from the next token with text */
    uint8_t pend[4];     /* bytes of an incomplete UTF-8 character held back */
    uint32_t n_pend;     /* 0..3 */
} st_detok;

/* Starts a stream: no previous token, nothing held. */
void st_detok_init(st_detok *d, const st_tokenizer *t);

/* Makes id the previous token without writing anything and without touching held bytes, e.g.
 * the last prompt token before generation so that the first generated token reads as a
 * continuation (its leading space is kept unless id is BOS). ST_ERR_INVALID for an id out of
 * range. */
st_status st_detok_set_prev(st_detok *d, int32_t id);

/* An upper bound on the bytes one st_detok_push or st_detok_flush can write for this tokenizer;
 * a buffer of this size never gives ST_ERR_RANGE. */
size_t st_detok_max_bytes(const st_tokenizer *t);

/* Appends the text of token id. Writes *n_out bytes to out (no NUL). ST_ERR_RANGE if cap is too
 * small: *n_out is then the size needed, the state is unchanged and out's contents are
 * unspecified; ST_ERR_INVALID for an id out of range (state unchanged). */
st_status st_detok_push(st_detok *d, int32_t id, char *out, size_t cap, size_t *n_out);

/* Writes whatever is held (an incomplete character becomes U+FFFD) and empties the hold; the
 * previous token is kept. Same return codes as push. */
st_status st_detok_flush(st_detok *d, char *out, size_t cap, size_t *n_out);

/* ---------------------------------------------------------------------------------------------
 * Sessions: a KV cache for up to n_seq sequences, scratch sized once, and a thread pool.
 * ------------------------------------------------------------------------------------------- */

typedef struct st_session st_session;

/* The context a session gets when none is given, if the model's is longer (llama.cpp's default).
 * A session's KV cache is sized for its context but committed as tokens use it; a context that
 * cannot fit the machine's memory is refused at creation with the estimate. */
#define ST_DEFAULT_N_CTX 4096

/* The context a session over m gets when none is given: min(training context, ST_DEFAULT_N_CTX). */
int32_t st_model_default_ctx(const st_model *m);

typedef struct st_session_params {
    int32_t n_ctx;     /* positions per sequence; 0 = min(training context, ST_DEFAULT_N_CTX) */
    int32_t n_seq;     /* sequences held at once (default 1) */
    int32_t n_batch;   /* most tokens in one forward pass (default 64) */
    int32_t n_threads; /* threads incl. the caller; 0: all cores (1 below 16 MB of weights) */
    /* KV cache element types, ST_DTYPE_F32 (default) or ST_DTYPE_F16 (half the memory; what
     * llama.cpp stores by default). With type_k F16 the queries are rounded to f16 for the
     * scores, with type_v F16 the softmax probabilities for the value sums (ggml's arithmetic:
     * it converts the other operand of an f16 matrix product to f16); products of two f16
     * values are exact in float, and the sums keep the canonical order, so speculative and plain
     * decoding stay bitwise equal in either type. Other values: ST_ERR_INVALID. */
    uint32_t type_k, type_v;
    /* Nonzero: compute as llama.cpp's CPU backend does (ggml at c392e509, an AVX-512 build
     * without flash attention), to reproduce its greedy texts: RMSNorm's sum of squares in
     * double; the K-quant dot products in the float order of ggml's AVX2 kernels; attention
     * scores as double sums times 1/sqrt(head_dim); softmax with ggml's exp, summed in double
     * per 16 keys of the key list padded to 32, times the sum's inverse; value sums in the order
     * of ggml_vec_dot_f16 (a double sum below 64 keys, else four 16-lane chains per 64 keys);
     * SiLU with ggml's exp; RoPE's rotation with the fused multiply-adds GCC forms in ggml's
     * C code. Every piece is per token, so speculative and plain decoding stay
     * bitwise equal; slower (scalar K-quant kernels). RoPE's angles are ggml's in every session.
     * Default 0. */
    int32_t match_ggml;
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
/* Shortens sequence seq to its first len positions (0 <= len <= its length): the rows after them
 * are forgotten and the next token is evaluated at position len. ST_ERR_RANGE otherwise. */
st_status st_session_seq_truncate(st_session *s, int32_t seq, int32_t len);

/* Evaluates n tokens of sequence seq with causal attention at positions L..L+n-1 (L = the
 * sequence's length), appends their K/V, and advances the length by n. Any n >= 1 is accepted
 * (split internally into forward passes of at most n_batch tokens). If logits is not NULL it
 * receives the logits of the last n_logits tokens, shape (n_logits, n_vocab), n_logits <= n.
 * Errors: ST_ERR_INVALID for a bad token id or seq, ST_ERR_RANGE when the context is full. */
st_status st_session_eval(st_session *s, int32_t seq, const int32_t *tokens, int32_t n,
                          float *logits, int32_t n_logits);

/* One decoding step for n distinct sequences in one forward pass: token tokens[i] of sequence
 * seqs[i] at position L_i (its length), causal over its own KV; each length grows by one.
 * logits: (n, n_vocab), row i bitwise what st_session_eval of that token alone gives.
 * Requires 1 <= n <= n_batch; ST_ERR_RANGE when a sequence's context is full. */
st_status st_session_decode_batch(st_session *s, int32_t n, const int32_t *seqs,
                                  const int32_t *tokens, float *logits);

#include "spectree_sample.h" /* sampling, penalties and biases, grammars */
#include "spectree_tree.h"   /* draft trees, verification, attention backends */

/* ---------------------------------------------------------------------------------------------
 * Speculative generation
 * ------------------------------------------------------------------------------------------- */

/* Limits of speculative generation, checked by the engine, the drafters and the tools alike. */
#define ST_SPEC_MAX_N 64          /* verified tree nodes per sequence, root included */
#define ST_SPEC_MAX_K 10          /* candidates per node (EAGLE-2's default top-K is 10) */
#define ST_SPEC_MAX_S 16          /* draft levels */
#define ST_GEN_MAX_BATCH 64       /* sequences of one st_generate_batch */
#define ST_NGRAM_MAX_MATCH 64     /* NGRAM: longest suffix matched */
#define ST_NGRAM_MAX_BREADTH 4096 /* NGRAM: most occurrences merged */

/* Drafting algorithms (SGLang's --speculative-algorithm names). */
typedef enum st_spec_algo {
    ST_SPEC_NONE = 0,       /* plain decoding */
    ST_SPEC_STANDALONE = 1, /* a draft model with the target's vocabulary */
    ST_SPEC_NGRAM = 2,      /* n-gram lookup in the prompt and the generated text */
    ST_SPEC_EAGLE = 3,      /* an EAGLE-1/2 head over the target's hidden states */
    ST_SPEC_EAGLE3 = 4,     /* an EAGLE-3 head over three of the target's layers */
} st_spec_algo;

/* "NONE", "STANDALONE", "NGRAM", "EAGLE", "EAGLE3" (case-insensitive); ST_ERR_INVALID
 * otherwise. */
st_status st_spec_algo_parse(const char *name, st_spec_algo *out);
const char *st_spec_algo_name(st_spec_algo a);

typedef struct st_spec_params {
    st_spec_algo algo;
    const st_model *draft_model; /* STANDALONE: a draft model; EAGLE, EAGLE3: a head of that
                                  * kind loaded for this target by st_eagle_head_load;
                                  * borrowed, must outlive the call */
    int32_t num_steps;           /* S: draft depth; 0 = auto */
    int32_t topk;                /* K: branching; 0 = auto; K = 1 forces N = S + 1 */
    int32_t num_draft_tokens;    /* N: verified nodes incl. the root (<= ST_SPEC_MAX_N); 0 = auto */
    st_attn_backend backend;     /* target-verify attention (default cascade) */
    int32_t ngram_min_match;     /* NGRAM: shortest suffix matched (default 1) */
    int32_t ngram_max_match;     /* NGRAM: longest suffix matched (default 8) */
    int32_t ngram_breadth;       /* NGRAM: most matches merged (default 8) */
    int32_t draft_coupling;      /* seed-coupled drafting (TREE_SPEC §9): each draft node's first
                                  * candidate is what the target's sampler, with the uniform of
                                  * its position, picks from the draft's logits. 0 (default,
                                  * auto): STANDALONE only (a draft model's distribution is
                                  * close to the target's: tau up to 2.2x at temperature 1.2;
                                  * the committed EAGLE heads' is not: their tau fell 0-7%);
                                  * 1: STANDALONE, EAGLE and EAGLE3; -1: none (their own top-K).
                                  * Output is the same either way; acceptance is not */
} st_spec_params;

st_spec_params st_spec_default_params(void);

/* Why a sequence stopped. */
typedef enum st_stop_reason {
    ST_STOP_NONE = 0,    /* not stopped (an error ended the call) */
    ST_STOP_EOS = 1,     /* the model emitted an end-of-generation token */
    ST_STOP_LENGTH = 2,  /* n_predict tokens were generated */
    ST_STOP_STOP = 3,    /* the emit callback asked to stop (a stop string, a client) */
    ST_STOP_CONTEXT = 4, /* the context is full */
    ST_STOP_CANCEL = 5,  /* st_engine_cancel, or the engine was freed with the request pending */
} st_stop_reason;

/* "eos", "length", "stop", "context", "cancelled" (OpenAI's finish_reason words where they
 * exist), "none". */
const char *st_stop_reason_name(st_stop_reason r);

/* Loads an EAGLE-1/2 draft head (Li et al., EAGLE, 2024) for `target` from a checkpoint
 * directory as published: config.json (a Llama config with num_hidden_layers 1, hidden_size and
 * vocab_size equal to the target's, optional "bias" and rope_theta, default 10000) and
 * model.safetensors, or shards with model.safetensors.index.json, holding fc.weight [H, 2H],
 * fc.bias [H] (unless "bias": false), layers.0.self_attn.{q,k,v,o}_proj.weight,
 * layers.0.post_attention_layernorm.weight, layers.0.mlp.{gate,up,down}_proj.weight, and
 * optionally layers.0.input_layernorm.weight and embed_tokens.weight [V, H] (else the target's
 * embedding is used); F32, F16 or BF16. The output layer is the target's. The weights are
 * copied (the files are closed on return); the target is borrowed and must outlive the head.
 * Use it as st_spec_params.draft_model with ST_SPEC_EAGLE; free it with st_model_free. Errors
 * (one line naming the file and the key): ST_ERR_IO (no config.json or safetensors),
 * ST_ERR_FORMAT (a missing, unexpected or misshapen tensor, a bad or mismatched config field, a
 * truncated file), ST_ERR_UNSUPPORTED (another dtype, more than one layer, rope_scaling),
 * ST_ERR_NOMEM. */
st_status st_eagle_head_load(const char *dir, const st_model *target, st_model **out);

/* Converts the matrices an EAGLE-1/2 or EAGLE-3 head owns (fc, its layer's projections, an
 * EAGLE-3 head's lm_head; not the embedding, nor the target's output layer an EAGLE-1/2 head
 * borrows) to `type`: ST_DTYPE_F32, F16, BF16 or Q8_0 (Q8_0 leaves a matrix whose rows are not a
 * multiple of 32 in F16), or -1 for st_eagle_head_auto_type's choice, which never widens a
 * matrix. Small F32 heads (like small models) also get packed copies for the F32 kernel. Drafts
 * may change; the output of speculative decoding does not (the target verifies). Once per
 * head; errors: ST_ERR_INVALID (another type, not a head, a second call), ST_ERR_FORMAT (a
 * weight that is not finite), ST_ERR_NOMEM. Call it before drafting with the head. */
st_status st_eagle_head_set_type(st_model *head, int type);
/* The type `-1` converts a head to beside `target`: -1 (as stored) beside F32 matrices, Q8_0
 * beside any other (F16, BF16, Q8_0, Q4_0, the K-quants). */
int st_eagle_head_auto_type(const st_model *target);

/* Loads an EAGLE-3 draft head (Li et al., EAGLE-3, 2025; FORMATS.md §d.2) for `target` from a
 * checkpoint directory as published: config.json (num_hidden_layers 1, vocab_size equal to the
 * target's, optional draft_vocab_size V' (default vocab_size), target_hidden_size (default
 * hidden_size; must be the target's), rope_theta (default 10000), tie_word_embeddings, and
 * eagle_config.eagle_aux_hidden_state_layer_ids: the three target layers whose outputs it reads,
 * SGLang's convention; without it the inputs of layers 2, L/2 and L-3) and safetensors holding
 * fc.weight [H, 3 H_t], midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}.weight,
 * midlayer.self_attn.{q,k,v}_proj.weight [*, 2H], midlayer.self_attn.o_proj.weight,
 * midlayer.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight [V', H] (absent when
 * tied), d2t [V'] I64 (draft id i is target id i + d2t[i]; required when V' < V), optionally t2d
 * [V] BOOL and embed_tokens.weight [V, H] (required when H != H_t; else the target's). d2t must
 * map every draft id to a distinct target id, and t2d, when present, mark exactly those: any
 * other map is refused here, so no draft id outside the target's vocabulary reaches a tree.
 * st_eagle_head_load loads these too (it recognizes the `midlayer` tensors). Use it with
 * ST_SPEC_EAGLE3. Errors as st_eagle_head_load's, one line naming the file and the key. */
st_status st_eagle3_head_load(const char *dir, const st_model *target, st_model **out);

/* What an EAGLE head is, for tools (`spectree info`). */
typedef struct st_eagle_info {
    int version;            /* 0: not an EAGLE head; 1: EAGLE-1/2; 3: EAGLE-3 */
    int32_t n_embd;         /* the head's width */
    int32_t n_ff;           /* its MLP's */
    int32_t n_vocab;        /* the target's vocabulary (the head's inputs) */
    int32_t n_draft_vocab;  /* the vocabulary it drafts over (EAGLE-1/2: n_vocab) */
    int32_t target_n_embd;  /* the target's width */
    int32_t target_layers;  /* the target's layer count */
    int32_t n_layers_read;  /* EAGLE-3: 3; EAGLE-1/2: 1 (the final-normed state) */
    int32_t layers_read[3]; /* EAGLE-3: the residual stream entering these target layers
                             * (target_layers: the last layer's output); EAGLE-1/2: the
                             * final-normed output, written as target_layers */
    int own_embedding;      /* 1: its own embed_tokens; 0: the target's */
    int layers_default;     /* st_eagle_head_describe: EAGLE-3 with no layer ids in its config
                             * (it reads the target's 2, L/2, L-3; layers_read unset) */
} st_eagle_info;

/* Fills *out for a loaded model: version 0 for a plain model. */
void st_eagle_head_info(const st_model *m, st_eagle_info *out);
/* Describes a head directory without a target, from config.json and the safetensors header:
 * the kind (EAGLE-3 when it holds midlayer tensors), widths, vocabulary sizes and, for EAGLE-3,
 * the target layers named in its config; target_layers is 0 (unknown) and target_n_embd the
 * width the head expects. Errors as st_eagle_head_load's. */
st_status st_eagle_head_describe(const char *dir, st_eagle_info *out);

/* What `auto` makes of drafting, from its own estimates (all zero with a fixed shape or plain
 * decoding, and before auto has measured anything: known 0). Costs in plain-token times, the
 * time of one sequence's plain decoding step. */
typedef struct st_spec_outlook {
    int32_t known;       /* 1: the fields below hold auto's estimates */
    int32_t drafting;    /* 1: auto drafts (a shape paid lately); 0: it has backed off */
    double weight_ratio; /* a draft model's weight bytes over the target's (0: no model) */
    int32_t weight_off;  /* 1: that ratio is too high for a draft model to pay: never drafted */
    double level_cost;   /* a draft model's level pass (0: a drafter without a model) */
    double verify_cost;  /* the verify of its best tree */
    int32_t tree_n;      /* that tree's tokens, the root included */
    double accept;       /* the drafts that tree is expected to accept per step */
    double speedup;      /* the best shape's expected speed-up over plain decoding */
} st_spec_outlook;

/* Statistics of one st_generate call. Times in milliseconds. */
typedef struct st_gen_stats {
    int64_t prompt_tokens, gen_tokens;
    int64_t spec_steps;  /* steps that verified a drafted tree */
    int64_t plain_steps; /* steps decoded without drafts (speculation off or no draft) */
    double tau;          /* mean tokens per speculative step (accepted + bonus) */
    int64_t accept_hist[ST_SPEC_MAX_S + 1]; /* [k]: speculative steps accepting k drafts */
    double prompt_ms, gen_ms;               /* prefill; everything after it */
    double draft_ms, verify_ms;             /* drafting; target verify forward passes */
    double overhead_ms; /* gen_ms - draft_ms - verify_ms: tree, mask, sampling, commit */
    double prompt_tok_s, gen_tok_s;
    int32_t num_steps, topk, num_draft_tokens; /* the (K, S) pool and the largest tree N */
    int32_t auto_shape;  /* 1: `auto` chose each step's tree (at most N tokens) */
    int64_t tree_tokens; /* tokens of all verified trees (mean tree: / spec_steps) */
    st_stop_reason stop_reason[ST_GEN_MAX_BATCH]; /* why each sequence ended ([0]: st_generate) */
    int32_t n_ctx; /* the context the generation ran with (positions per sequence) */
    /* sums over the speculative steps of the pool (K, S) they drafted (means: / spec_steps;
     * `auto` plans it each step for a model drafter) */
    int64_t topk_sum, steps_sum;
    st_spec_outlook outlook; /* auto's view of drafting at the end */
    /* a draft model's level passes (S-1 per proposal, each over up to K nodes) and their time */
    int64_t level_passes;
    double level_ms;
} st_gen_stats;

/* Everything st_generate needs besides the model and the prompt. Start from
 * st_gen_default_params() and change what you need. */
typedef struct st_gen_params {
    int64_t n_predict;         /* most tokens to generate (default 256) */
    st_sampler_params sampler; /* default st_sampler_default_params(); temp 0 = greedy */
    st_spec_params spec;       /* default st_spec_default_params(): plain decoding */
    int32_t n_threads;         /* 0: all cores (1 below 16 MB of weights), as st_session_params */
    int32_t n_ctx;             /* positions per sequence; 0 = as st_session_params */
    uint32_t type_k, type_v;   /* the target's KV cache types, as st_session_params (F32) */
    int32_t match_ggml;        /* the target computes as ggml does, as st_session_params (0) */
} st_gen_params;

st_gen_params st_gen_default_params(void);

/* Called for each generated token in order; return nonzero to stop generation there. */
typedef int (*st_emit_fn)(void *user, int32_t token);

/* Generates up to p->n_predict tokens after the prompt (n_prompt >= 1 tokens) with the target
 * model m, drafting with p->spec and verifying trees, and calls emit (may be NULL) for each
 * token. Stops at an end-of-generation token (not emitted), after n_predict tokens, when emit
 * returns nonzero, or when the context is full. Whatever the drafter and tree shape, the
 * emitted tokens equal plain decoding with the same sampler parameters (greedy, or seeded
 * sampling with the position-coupled draw of st_sample). p NULL: the defaults; stats may be
 * NULL (stats->stop_reason[0] says why generation ended). Errors: ST_ERR_INVALID for bad
 * parameters (a message names the field), ST_ERR_RANGE for a prompt that does not fit the
 * context, ST_ERR_FORMAT when the model's logits are not finite (NaN or infinite: broken weights;
 * the message names the position), ST_ERR_NOMEM. */
st_status st_generate(const st_model *m, const int32_t *prompt, int64_t n_prompt,
                      const st_gen_params *p, st_emit_fn emit, void *user, st_gen_stats *stats);

/* Called for each generated token of sequence seq (the prompt's index) in order; return nonzero
 * to stop that sequence there. */
typedef int (*st_emit_seq_fn)(void *user, int32_t seq, int32_t token);

/* Generates for bs prompts (1..ST_GEN_MAX_BATCH) at once: every step drafts a tree per sequence
 * and verifies all of them in one target forward pass (FULL_MASK rows with per-request prefix
 * lengths for dense, the tree block for cascade). Each sequence's tokens equal its own
 * st_generate output. Sequences finish independently; stats sum over them. */
st_status st_generate_batch(const st_model *m, int32_t bs, const int32_t *const *prompts,
                            const int64_t *n_prompts, const st_gen_params *p, st_emit_seq_fn emit,
                            void *user, st_gen_stats *stats);

/* ---------------------------------------------------------------------------------------------
 * The continuous-batching engine (for servers)
 *
 * Requests join and leave between steps. Each st_engine_step admits queued requests while a
 * slot and the KV budget allow (a running request is never evicted), prefills at most one
 * chunk of the joining prompts, then runs ONE target forward pass over every running sequence:
 * a speculative step (every sequence's tree verified together, as st_generate_batch does) or a
 * plain step, as the `auto` controller chooses for the batch as a whole from the measured cost
 * at the current batch size (a fixed K/S/N always speculates). A request's tokens equal
 * st_generate's with the same prompt, sampler, n_predict and engine parameters (greedy and
 * seeded sampling alike), whatever else runs, joins or leaves: the kernels are batch-invariant
 * and st_sample's draw is coupled to the position.
 *
 * Threads: an engine is NOT thread-safe. A server serializes every st_engine_* call on one
 * engine (a mutex) and runs st_engine_step on one thread. Callbacks run inside st_engine_step
 * (and st_engine_free) on the calling thread; they must not call st_engine_* on the same engine
 * (to stop a request from a callback, return nonzero from its emit callback).
 *
 * Typical loop:
 *     st_engine_create(model, &ep, &e);
 *     st_engine_submit(e, ids, n_ids, &rp, on_token, on_finish, ctx, &id);  // any time
 *     while (st_engine_running(e) + st_engine_queued(e) > 0) st_engine_step(e);
 *     st_engine_free(e);
 * ------------------------------------------------------------------------------------------- */

typedef struct st_engine st_engine;

typedef struct st_engine_params {
    /* For every request: gen.spec (algorithm, draft model, K/S/N, backend), gen.n_threads and
     * gen.n_ctx (positions per sequence, 0 = st_session_params' default); gen.n_predict and
     * gen.sampler are the defaults of a request submitted without st_request_params. The draft
     * model (and gen.sampler.logit_bias, if any) is borrowed and must outlive the engine. */
    st_gen_params gen;
    int32_t max_running;   /* slots: sequences running at once, 1..ST_GEN_MAX_BATCH (default 8) */
    int32_t max_queued;    /* requests waiting for a slot, >= 0 (default 256); beyond: BUSY */
    int32_t prefill_chunk; /* most prompt tokens prefilled per step, >= 1 (default 256) */
    int64_t kv_budget;     /* most KV positions reserved by the running requests together;
                            * 0 = max_running * n_ctx (every slot can hold a full context) */
    /* Nonzero: a request that finishes leaves its KV cache in its slot, and a request admitted
     * takes the free slot whose kept tokens share the longest prefix with its prompt and
     * prefills only the rest (a conversation's next turn: only the new turn), at most all but
     * the prompt's last token. The kept rows are those a prefill would compute, bitwise, so
     * the outputs do not change. Drafters that read the target's states (EAGLE, EAGLE3) need
     * every prompt position: with them each request starts afresh. Default 0. */
    int32_t reuse_prefix;
    /* The prefix cache: at most this many bytes of the target's K/V rows (and an EAGLE or
     * EAGLE-3 drafter's target states) of past prompts, kept in blocks of prefix_cache_block
     * tokens after each request's prefill and at its end (prompt and generated tokens), least
     * recently used blocks evicted first. A request admitted to any slot copies the rows of the
     * longest cached whole-block prefix of its prompt (at most all but its last token) and
     * prefills only the rest; the copies are the rows a prefill writes, bitwise, so the outputs
     * do not change, and every drafter speculates right after a hit (an EAGLE or EAGLE-3 head
     * gets the cached target states through its usual path, and its own cached K/V rows).
     * The budget is reserved as address space at creation and committed as blocks are used;
     * capped at a quarter of the machine's available memory then. 0 (the default): no cache.
     * st_request_stats.cached_tokens and st_engine_stats.prefix_* report on it. */
    size_t prefix_cache_bytes;
    int32_t prefix_cache_block; /* tokens per block, 1..4096; 0 = 32 */
} st_engine_params;

st_engine_params st_engine_default_params(void);

#define ST_MAX_TOP_LOGPROBS 20 /* most likely tokens reported per position */

/* An emitted token's log-probability and the most likely tokens at its position: the
 * log-softmax of the target's logits there after the request's penalties, biases and bans
 * (st_sample_penalize: the logits the token was sampled from, as OpenAI reports the processed
 * distribution) but before temperature, top-k, top-p and min-p. Without penalties that is the
 * model's own distribution, whatever the sampler then does with it (vLLM's default). Under
 * speculation a token's logits are bitwise the plain decoding's, so are these values. */
typedef struct st_token_logprobs {
    int32_t token;                          /* the emitted token */
    float logprob;                          /* its log-probability (<= 0) */
    int32_t n_top;                          /* entries below: the request's top_logprobs */
    int32_t top_token[ST_MAX_TOP_LOGPROBS]; /* most likely first (ties: lower id first) */
    float top_logprob[ST_MAX_TOP_LOGPROBS]; /* their log-probabilities, non-increasing */
} st_token_logprobs;

/* Called with an emitted token's log-probabilities (user: the submit's), just before its emit
 * callback; lp is valid during the call only. */
typedef void (*st_request_logprobs_fn)(void *user, const st_token_logprobs *lp);

/* Per-request generation parameters. */
typedef struct st_request_params {
    int64_t n_predict;         /* most tokens to generate, >= 0 */
    st_sampler_params sampler; /* temp 0 = greedy; a seed makes sampling reproducible */
    /* Log-probabilities, opt-in: with on_logprobs set, each emitted token's are computed from
     * the logits it was sampled from and handed to it, with the top_logprobs (0 ..
     * ST_MAX_TOP_LOGPROBS) most likely tokens. NULL (the default): nothing is computed. The
     * tokens are the same either way. */
    st_request_logprobs_fn on_logprobs;
    int32_t top_logprobs;
    /* Prompt log-probabilities, opt-in (OpenAI's echo with logprobs, for scoring a text): with
     * on_prompt_logprobs set, each prompt token after the first is handed, in order during the
     * prefill, the log-softmax of the target's logits at the position before it (the model's
     * own distribution: no penalties, biases or temperature), with the top_logprobs most likely
     * tokens; then, with n_predict > 0, the generated tokens follow as above. The values are
     * bitwise those a plain decode of the prompt computes at those positions. Such a request
     * takes nothing from the prefix cache or a kept slot (their rows' logits were never
     * computed): its whole prompt is evaluated, bs tokens per forward pass. */
    st_request_logprobs_fn on_prompt_logprobs;
    /* Speculation for this request (the engine's drafter and `auto` otherwise): 0 the engine's
     * (the default), 1 none (every step of it plain, inside the batch's forward passes, and
     * no drafting for it), n >= 2 a tree of at most n nodes, the root included (more than the
     * engine's largest tree N is N). The other requests of a batch keep theirs: each sequence's
     * tree has its own size (TREE_SPEC §2.5). The tokens are the same whatever it is. */
    int32_t spec_max_tree;
} st_request_params;

/* The engine's defaults: its gen.n_predict and gen.sampler, no log-probabilities. */
st_request_params st_engine_request_defaults(const st_engine *e);

/* Statistics of one request, handed to its finish callback. Times in milliseconds from
 * st_engine_submit. */
typedef struct st_request_stats {
    uint64_t id;
    st_status status;           /* ST_OK, or the error that ended the request (the message was
                                 * st_last_error() when the callback ran) */
    st_stop_reason stop_reason; /* ST_STOP_NONE with an error */
    int64_t prompt_tokens, gen_tokens;
    int64_t spec_steps;   /* steps that verified a drafted tree of this request */
    int64_t plain_steps;  /* decoding steps without drafts */
    int64_t verify_ct;    /* SGLang's spec_verify_ct: decoding forward passes (spec + plain) */
    double accept_length; /* SGLang's spec_accept_length: gen_tokens / verify_ct (0 if none) */
    double tau;           /* mean tokens per speculative step (accepted drafts + bonus) */
    int64_t accept_hist[ST_SPEC_MAX_S + 1]; /* [k]: speculative steps accepting k drafts */
    double queue_ms;                        /* until admitted to a slot */
    double ttft_ms;                         /* until the first token (-1: none) */
    double total_ms;                        /* until finished */
    int64_t reused_tokens; /* prompt tokens whose KV was not computed: kept in the slot
                            * (reuse_prefix) or copied from the prefix cache */
    int64_t cached_tokens; /* of those, the ones copied from the prefix cache */
} st_request_stats;

/* Called for each generated token of a request, in order (user: the submit's); return nonzero
 * to stop the request there (a stop string matched, a client went away): it finishes with
 * ST_STOP_STOP. */
typedef int (*st_request_emit_fn)(void *user, int32_t token);

/* Called exactly once for every request st_engine_submit accepted, when it ends for any reason
 * (including cancellation, an error, and st_engine_free). After it returns the engine no
 * longer uses `user`. stats is valid during the call only. */
typedef void (*st_request_finish_fn)(void *user, const st_request_stats *stats);

/* Creates an engine over model m: a session of max_running sequences, one drafter per slot,
 * the verify-mask owner and the controller, all allocated here. p NULL: the defaults. Errors:
 * ST_ERR_INVALID for bad parameters (the message names the field), ST_ERR_NOMEM. */
st_status st_engine_create(const st_model *m, const st_engine_params *p, st_engine **out);

/* Finishes every queued or running request with ST_STOP_CANCEL (calling their finish
 * callbacks), then frees the engine; accepts NULL. */
void st_engine_free(st_engine *e);

/* Queues a request: the prompt (n_prompt >= 1 tokens, copied), its parameters (rp NULL: the
 * engine's defaults), callbacks (emit may be NULL; finish may be NULL) and their user pointer.
 * *id (may be NULL) receives its id, unique for the engine's lifetime and never 0. Nothing
 * runs until st_engine_step. A request reserves min(n_prompt + n_predict + N, n_ctx) KV
 * positions from admission to its end (N: the largest verified tree, 1 for plain decoding).
 * Refused at once, with no callback:
 *   ST_ERR_BUSY     max_queued requests are already waiting;
 *   ST_ERR_RANGE    the prompt can never run: n_prompt >= n_ctx, or its reservation exceeds
 *                   kv_budget;
 *   ST_ERR_INVALID  a bad argument (token id outside the vocabulary, negative n_predict or
 *                   temperature, top_logprobs outside 0..ST_MAX_TOP_LOGPROBS, ...),
 *                   ST_ERR_NOMEM. */
st_status st_engine_submit(st_engine *e, const int32_t *prompt, int64_t n_prompt,
                           const st_request_params *rp, st_request_emit_fn emit,
                           st_request_finish_fn finish, void *user, uint64_t *id);

/* Cancels request id, queued or running: at the next st_engine_step it finishes with
 * ST_STOP_CANCEL and its slot and KV reservation are freed. ST_ERR_RANGE if no such request is
 * pending (unknown, or already finished). */
st_status st_engine_cancel(st_engine *e, uint64_t id);

/* One step: cancellations, admissions, at most prefill_chunk prompt tokens of joining
 * requests (a prompt whose last chunk is done gets its first token), then one forward pass
 * over every running sequence that has its first token; requests that end finish (callback)
 * and free their slot. Does nothing when no request is pending. Returns ST_OK, or the error
 * of a forward pass: every request that pass ran then finishes with that status and the
 * engine stays usable. */
st_status st_engine_step(st_engine *e);

/* Requests holding a slot (prefilling or decoding). */
int32_t st_engine_running(const st_engine *e);
/* Requests waiting for a slot. */
int32_t st_engine_queued(const st_engine *e);
/* KV positions in use: committed by the running sequences, and reserved for them. */
int64_t st_engine_kv_used(const st_engine *e);
int64_t st_engine_kv_reserved(const st_engine *e);

/* Totals of an engine since its creation (for a server's metrics). */
typedef struct st_engine_stats {
    int64_t steps;                             /* st_engine_step calls that ran a forward pass */
    int64_t spec_steps, plain_steps;           /* decoding forward passes of each kind */
    int64_t requests_finished;                 /* finish callbacks called */
    int64_t prompt_tokens, gen_tokens;         /* prefilled and generated */
    int64_t accept_hist[ST_SPEC_MAX_S + 1];    /* over all requests' speculative steps */
    double prefill_ms, draft_ms, verify_ms;    /* prefill, drafting, target forward passes */
    int32_t n_ctx, max_running;                /* as resolved at creation */
    int32_t num_steps, topk, num_draft_tokens; /* the (K, S) pool and largest tree N (0: plain) */
    int64_t kv_budget;                         /* as resolved */
    st_spec_outlook outlook;                   /* auto's view of drafting now */
    /* context-sized memory, committed as positions are used: at most kv_bytes for the target's
     * KV cache and attention scores, draft_bytes for every slot's drafter together (a draft
     * model's KV cache, an EAGLE head's and its target states, an n-gram index) */
    size_t kv_bytes, draft_bytes;
    /* the prefix cache (all 0 without one): admissions that found a cached prefix and that did
     * not, the prompt tokens served from it, blocks held now, blocks evicted, bytes held now
     * and the budget as resolved */
    int64_t prefix_hits, prefix_misses, prefix_hit_tokens, prefix_blocks, prefix_evictions;
    size_t prefix_bytes, prefix_budget;
} st_engine_stats;

void st_engine_get_stats(const st_engine *e, st_engine_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* SPECTREE_H */
