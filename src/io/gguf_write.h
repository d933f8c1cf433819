/*
 * gguf_write.h: a GGUF v3 writer for tools and tests (FORMATS.md §b), and the float-to-weight
 * converters it needs (F32, F16, BF16, and ggml's reference Q8_0/Q4_0 quantizers) and back.
 * Self-contained on the public header so tools can include it: "../src/io/gguf_write.h".
 *
 * Usage:
 *
 *     st_gguf_writer *w;
 *     st_gguf_writer_create(&w);
 *     st_gguf_writer_add_str(w, "general.architecture", "llama");
 *     st_gguf_writer_add_u32(w, "llama.block_count", 2);
 *     int64_t ne[2] = {64, 512};
 *     st_gguf_writer_add_tensor(w, "token_embd.weight", ST_DTYPE_F32, 2, ne, data, size,
 *                               ST_GGUF_REF);
 *     st_gguf_writer_write_file(w, "out.gguf");
 *     st_gguf_writer_free(w);
 *
 * Layout written: header, the KVs in the order they were added, the tensor infos in the order
 * they were added, padding to the alignment (from the file start), then each tensor's data in
 * the same order, each padded to a multiple of the alignment (as gguf-py and ggml write it). The
 * alignment is the value of general.alignment (a u32 power of two) or 32. A file without tensors
 * ends right after the KV section. Keys and tensor names must be unique; every add checks its
 * arguments and fails with ST_ERR_INVALID (st_last_error() says why) without changing the writer.
 */
#ifndef ST_GGUF_WRITE_H
#define ST_GGUF_WRITE_H

#include "spectree.h"

#include <stddef.h>
#include <stdint.h>

typedef struct st_gguf_writer st_gguf_writer;

st_status st_gguf_writer_create(st_gguf_writer **out);
/* Frees the writer, its copies of keys, values and copied tensor data; closes a file left open
 * by st_gguf_writer_begin_file (the partial file stays on disk). Accepts NULL. */
void st_gguf_writer_free(st_gguf_writer *w);

/* Scalar KVs. `key` is a NUL-terminated non-empty string; the value is copied. */
st_status st_gguf_writer_add_u8(st_gguf_writer *w, const char *key, uint8_t v);
st_status st_gguf_writer_add_i8(st_gguf_writer *w, const char *key, int8_t v);
st_status st_gguf_writer_add_u16(st_gguf_writer *w, const char *key, uint16_t v);
st_status st_gguf_writer_add_i16(st_gguf_writer *w, const char *key, int16_t v);
st_status st_gguf_writer_add_u32(st_gguf_writer *w, const char *key, uint32_t v);
st_status st_gguf_writer_add_i32(st_gguf_writer *w, const char *key, int32_t v);
st_status st_gguf_writer_add_f32(st_gguf_writer *w, const char *key, float v);
st_status st_gguf_writer_add_bool(st_gguf_writer *w, const char *key, int v); /* 0 or 1 */
st_status st_gguf_writer_add_u64(st_gguf_writer *w, const char *key, uint64_t v);
st_status st_gguf_writer_add_i64(st_gguf_writer *w, const char *key, int64_t v);
st_status st_gguf_writer_add_f64(st_gguf_writer *w, const char *key, double v);
/* A string value: NUL-terminated, or `len` bytes (may contain any byte). */
st_status st_gguf_writer_add_str(st_gguf_writer *w, const char *key, const char *s);
st_status st_gguf_writer_add_strn(st_gguf_writer *w, const char *key, const char *s, uint64_t len);

/* An array of n >= 0 numbers of element type `type` (any type but STRING and ARRAY; BOOL
 * elements must be 0 or 1), read from `data` as little-endian values of the type's size. */
st_status st_gguf_writer_add_arr(st_gguf_writer *w, const char *key, st_gguf_type type,
                                 const void *data, int64_t n);
/* An array of n strings: NUL-terminated, or (ptr, len) pairs as the reader returns them. */
st_status st_gguf_writer_add_arr_str(st_gguf_writer *w, const char *key, const char *const *s,
                                     int64_t n);
st_status st_gguf_writer_add_arr_strn(st_gguf_writer *w, const char *key, const st_gguf_str *s,
                                      int64_t n);

/* Copies the KV `key` of g with its type and value (FLOAT64 scalars pass through float: the
 * reader has no exact f64 getter). ST_ERR_INVALID if g has no such key or w already has it. */
st_status st_gguf_writer_copy_kv(st_gguf_writer *w, const st_gguf *g, const char *key);
/* Copies every KV of g whose key starts with "tokenizer.", then each of the n_extra keys in
 * `extra` that g has (missing extras are skipped), in g's order. */
st_status st_gguf_writer_copy_tokenizer(st_gguf_writer *w, const st_gguf *g,
                                        const char *const *extra, int n_extra);

/* How add_tensor treats `data`. */
enum { ST_GGUF_REF = 0, ST_GGUF_COPY = 1 };

/* Adds a tensor: name of 1..63 bytes, type one of st_dtype, n_dims 1..4, ne[0..n_dims-1] >= 0
 * with ne[0] a multiple of the type's block size. `size` must equal the tensor's byte size
 * (st_gguf_tensor_bytes). `data` is copied (ST_GGUF_COPY) or referenced (ST_GGUF_REF; it
 * must then stay valid until the last write), or NULL: the bytes are then streamed with
 * st_gguf_writer_stream. */
st_status st_gguf_writer_add_tensor(st_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const int64_t *ne, const void *data,
                                    size_t size, int mode);
/* Bytes of a tensor of that type and shape in *out. ST_ERR_INVALID for an unsupported type, a
 * bad n_dims, a negative dimension, ne[0] not a multiple of the block size, or a size that does
 * not fit in size_t. */
st_status st_gguf_tensor_bytes(uint32_t type, uint32_t n_dims, const int64_t *ne, size_t *out);

/* Alignment in effect (general.alignment or 32), and the size of the file a write produces
 * (0 if it would not fit in size_t). */
uint32_t st_gguf_writer_alignment(const st_gguf_writer *w);
size_t st_gguf_writer_file_size(const st_gguf_writer *w);

/* Writes the whole file (every tensor must have data). ST_ERR_IO names the path on failure.
 * Files appear at their path whole or not at all: they are written to a temporary file beside
 * it, renamed over it at the end (see st_outfile_open). */
st_status st_gguf_writer_write_file(st_gguf_writer *w, const char *path);
/* The same, calling progress (may be NULL) after each tensor's data is written: tensors and
 * data bytes written so far, and their totals. */
typedef void (*st_gguf_write_progress_fn)(void *user, int64_t tensors_done, int64_t n_tensors,
                                          size_t bytes_done, size_t total_bytes);
st_status st_gguf_writer_write_file_ex(st_gguf_writer *w, const char *path,
                                       st_gguf_write_progress_fn progress, void *user);
/* Writes the whole file into a new buffer of st_gguf_writer_file_size bytes; *buf is released
 * with free(). */
st_status st_gguf_writer_write_memory(st_gguf_writer *w, void **buf, size_t *size);

/* Streaming, for files larger than memory: begin_file writes everything up to the tensor data;
 * then stream passes the data of the tensors in order, in chunks of any size (a chunk may span
 * tensors; tensors given data at add time must be streamed too); end_file checks that every
 * byte came and closes the file (renamed into place only then; freeing the writer before
 * end_file removes it). No KV or tensor may be added after begin_file. */
st_status st_gguf_writer_begin_file(st_gguf_writer *w, const char *path);
st_status st_gguf_writer_stream(st_gguf_writer *w, const void *data, size_t size);
st_status st_gguf_writer_end_file(st_gguf_writer *w);

/* Converts n floats to a weight row of `type` (F32, F16, BF16, Q8_0, Q4_0, Q2_K .. Q6_K) in dst,
 * which has room for st_gguf_tensor_bytes(type, 1, &n, ...) bytes. Quantized types need n a
 * multiple of their block (32; 256 for the K-quants, st_quantize_row_kquant in kquant.h) and
 * finite inputs (ST_ERR_INVALID otherwise). Q8_0 and Q4_0 follow ggml's reference
 * quantizers bit for bit (see st_quantize_q8_0 / st_quantize_q4_0): like ggml they multiply by
 * the reciprocal of d where FORMATS.md §b.3 writes x/d (the two differ only at rounding ties). */
st_status st_quantize_row(uint32_t type, const float *x, int64_t n, void *dst);
/* Q8_0 per block of 32: d = max|x|/127, q = roundf(x * (1/d)) (0 when d = 0), d stored as fp16. */
void st_quantize_q8_0(const float *x, int64_t n, void *dst);
/* Q4_0 per block of 32: m = the element of largest magnitude with its sign, d = m / -8,
 * nibble = min(15, trunc(x * (1/d) + 8.5)), d stored as fp16. */
void st_quantize_q4_0(const float *x, int64_t n, void *dst);
/* The inverse: n values of a weight row of `type` (F32, F16, BF16, Q8_0, Q4_0, Q2_K .. Q6_K) at
 * src, as floats in dst (for tools that read one model's weights to write another). Quantized
 * types need n a multiple of their block; ST_ERR_INVALID otherwise or for another type. */
st_status st_dequantize_row(uint32_t type, const void *src, int64_t n, float *dst);

/* llama.cpp's K-quant file types (the general.file_type values of llama_ftype). */
enum {
    ST_FTYPE_Q2_K = 10,
    ST_FTYPE_Q3_K_S = 11,
    ST_FTYPE_Q3_K_M = 12,
    ST_FTYPE_Q3_K_L = 13,
    ST_FTYPE_Q4_K_S = 14,
    ST_FTYPE_Q4_K_M = 15,
    ST_FTYPE_Q5_K_S = 16,
    ST_FTYPE_Q5_K_M = 17,
    ST_FTYPE_Q6_K = 18
};
/* The file type named "q4_k_m" etc. (lower case: q2_k, q3_k_s/m/l, q4_k_s/m, q5_k_s/m, q6_k), or
 * 0; and back (NULL for another value). */
uint32_t st_kquant_ftype_from_name(const char *name);
const char *st_kquant_ftype_name(uint32_t ftype);
/* The weight type llama-quantize gives tensor `name` (GGUF llama names) of a file of K-quant
 * file type `ftype` (quant_mix.c): rows of ncols elements, n_layer blocks, n_gqa query heads per
 * KV head, tied = the file has no output.weight (token_embd then takes output's type). 0 for
 * tensors it leaves alone (norms, non-weights) and for an ftype that is not a K-quant one. Rows
 * that are not whole 256-element super-blocks get a type that fits them: Q4_0 for Q2_K and
 * Q3_K, as llama.cpp does, Q8_0 for Q4_K .. Q6_K (llama.cpp's Q5_0 and Q5_1 are not written
 * here), F16 when not even 32 divides the row. Every type returned is one st_quantize_row
 * writes. */
uint32_t st_kquant_tensor_type(uint32_t ftype, const char *name, int64_t ncols, int64_t n_layer,
                               int64_t n_gqa, int tied);
/* The type rows of ncols elements get when every matrix is to be `type` (a K-quant type): that
 * type when 256 divides ncols, else the fallback st_kquant_tensor_type uses. */
uint32_t st_kquant_fit_type(uint32_t type, int64_t ncols);

#endif /* ST_GGUF_WRITE_H */
