/*
 * safetensors.h: the safetensors reader (FORMATS.md §c.1) for Hugging Face checkpoints and
 * EAGLE heads, a small writer for tools and tests, and typed access to a checkpoint's
 * config.json (§c.2). Internal to the library: the HF and EAGLE loaders build on it.
 *
 * A st_safetensors is one .safetensors file or a whole checkpoint directory (model.safetensors,
 * or shards plus model.safetensors.index.json). Every file is mapped read-only and its header
 * is validated completely at open; tensors point into the mappings, so they live as long as
 * the st_safetensors. JSON is parsed with jansson; nothing of it is kept after open.
 */
#ifndef ST_SAFETENSORS_H
#define ST_SAFETENSORS_H
#include "core/core.h"

/* Element types of the format. The engine computes with F32, F16 and BF16 (see
 * st_sf_tensor_dtype); the others are recognized so that a file holding them opens (EAGLE-3's
 * d2t is I64, t2d BOOL) and errors can name them. */
typedef enum st_sf_dtype {
    ST_SF_BOOL,
    ST_SF_U8,
    ST_SF_I8,
    ST_SF_U16,
    ST_SF_I16,
    ST_SF_U32,
    ST_SF_I32,
    ST_SF_U64,
    ST_SF_I64,
    ST_SF_F16,
    ST_SF_BF16,
    ST_SF_F32,
    ST_SF_F64,
    ST_SF_C64,
    ST_SF_F8_E4M3,
    ST_SF_F8_E5M2,
    ST_SF_F8_E8M0,
    ST_SF_F6_E2M3,
    ST_SF_F6_E3M2,
    ST_SF_F4,
    ST_SF_N_DTYPES
} st_sf_dtype;

/* The format's spelling of a dtype ("BF16"); "?" for a value out of range. */
const char *st_sf_dtype_name(st_sf_dtype t);
/* Bits per element (1 byte for BOOL; 4 for F4, 6 for the F6 types). */
int st_sf_dtype_bits(st_sf_dtype t);

/* One tensor of an open file or checkpoint. */
typedef struct st_sf_tensor {
    const char *name;
    st_sf_dtype dtype;
    int32_t n_dims;       /* 0 for a scalar */
    const int64_t *shape; /* (n_dims), outermost first (PyTorch order); data is C-order */
    int64_t n_elem;       /* product of shape; 1 for a scalar, 0 for an empty tensor */
    const void *data;     /* first byte, inside the file mapping; little-endian, possibly
                             unaligned (the format does not promise alignment) */
    size_t size;          /* bytes */
    const char *file;     /* path of the file the tensor is stored in */
} st_sf_tensor;

typedef struct st_safetensors st_safetensors;

/* Opens a .safetensors file, or a checkpoint directory: its model.safetensors if present
 * (transformers' order), else model.safetensors.index.json and every shard its weight_map
 * names. Returns ST_OK; ST_ERR_IO when a file cannot be opened or mapped (the directory has
 * neither file, a shard is missing); ST_ERR_FORMAT, with a one-line error naming the file and
 * the key, for anything malformed: a truncated file, a header length past the file or over
 * 100 MB, a header that is not a JSON object (a duplicated key counts: jansson's
 * JSON_REJECT_DUPLICATES), a tensor entry missing dtype, shape or data_offsets or with one of
 * the wrong type, an unknown dtype, a negative or overflowing shape, data_offsets that disagree
 * with dtype x shape or run past the data, tensors that overlap, leave holes or leave bytes
 * after the last one (the reference implementation requires the tensors to tile the data
 * exactly), a __metadata__ that is not a string->string map, a name stored in two shards, a
 * weight_map entry whose tensor is missing from its shard, a shard tensor weight_map does not
 * name; ST_ERR_NOMEM. */
st_status st_safetensors_open(const char *path, st_safetensors **out);
/* Reads one file's bytes from memory (not copied: `data` must outlive the result). `name`
 * stands for the path in errors and in each tensor's `file`. */
st_status st_safetensors_open_memory(const void *data, size_t size, const char *name,
                                     st_safetensors **out);
/* Accepts NULL. */
void st_safetensors_free(st_safetensors *sf);

/* The path given to open (the directory for a checkpoint). */
const char *st_safetensors_path(const st_safetensors *sf);
/* Number of tensors over all files. */
int64_t st_safetensors_n_tensors(const st_safetensors *sf);
/* The i-th tensor in byte order of the names (strcmp), for enumerating; NULL out of range. */
const st_sf_tensor *st_safetensors_tensor_at(const st_safetensors *sf, int64_t i);
/* The tensor with this name, or NULL (binary search; no error set). */
const st_sf_tensor *st_safetensors_find(const st_safetensors *sf, const char *name);
/* Like find, but a missing tensor is ST_ERR_FORMAT with an error naming the checkpoint and
 * the tensor. */
st_status st_safetensors_get(const st_safetensors *sf, const char *name, const st_sf_tensor **out);
/* A value of the first file's __metadata__ map, or NULL when absent. */
const char *st_safetensors_metadata(const st_safetensors *sf, const char *key);

/* The st_dtype of a tensor the engine can compute with (F32, F16, BF16); ST_ERR_UNSUPPORTED
 * for any other dtype, with an error naming the file, the tensor and its dtype. */
st_status st_sf_tensor_dtype(const st_sf_tensor *t, st_dtype *out);

/* Writer, for tools and tests: one file holding n tensors (n_dims, shape, dtype, data and
 * size are read; name must be unique; size must equal dtype x shape), in the order given,
 * data 8-byte aligned after a space-padded header, with __metadata__ {"format": "pt"}.
 * ST_ERR_INVALID for a bad tensor, ST_ERR_IO when the file cannot be written; the file appears
 * whole or not at all (written beside path, then renamed). */
st_status st_safetensors_write(const char *path, const st_sf_tensor *tensors, int64_t n);

/* config.json of a checkpoint, for typed reads of its fields. */
typedef struct st_hf_config st_hf_config;

/* Reads `path`, or `path`/config.json when path is a directory. ST_ERR_IO when it cannot be
 * read; ST_ERR_FORMAT (file named) when it is not a JSON object. */
st_status st_hf_config_open(const char *path, st_hf_config **out);
/* Parses a JSON text of `len` bytes; `name` stands for the path in errors. */
st_status st_hf_config_open_memory(const char *json, size_t len, const char *name,
                                   st_hf_config **out);
/* Accepts NULL. */
void st_hf_config_free(st_hf_config *c);

/* Field access. `key` is a field name, or a dotted path into nested objects
 * ("rope_scaling.factor"). Each getter returns ST_ERR_FORMAT with an error naming the file and
 * the key when the field is missing, null, or of the wrong type:
 * - int: a JSON integer;
 * - float: a JSON number (integers accepted: "rope_theta": 10000);
 * - bool: true or false;
 * - str: a string; *out points into the config and lives as long as it;
 * - ints: an array of integers, or a single integer read as an array of one (eos_token_id
 *   is either); at most `cap` of them are stored, *n gets the full count. */
bool st_hf_config_has(const st_hf_config *c, const char *key); /* present and not null */
st_status st_hf_config_get_int(const st_hf_config *c, const char *key, int64_t *out);
st_status st_hf_config_get_float(const st_hf_config *c, const char *key, double *out);
st_status st_hf_config_get_bool(const st_hf_config *c, const char *key, bool *out);
st_status st_hf_config_get_str(const st_hf_config *c, const char *key, const char **out);
st_status st_hf_config_get_ints(const st_hf_config *c, const char *key, int64_t *out, int64_t cap,
                                int64_t *n);
/* The attention heads of a config (the fields read into n_embd, n_head, n_head_kv and head_dim,
 * whose default is n_embd / n_head): ST_ERR_FORMAT naming the fields the file has, and their
 * values, when num_attention_heads does not divide hidden_size without a head_dim, does not
 * divide into num_key_value_heads groups, or the head width is odd or below 2 (RoPE rotates
 * pairs). */
st_status st_hf_config_check_heads(const st_hf_config *c, const char *path, int32_t n_embd,
                                   int32_t n_head, int32_t n_head_kv, int32_t head_dim);
/* A string field that, when present, must be one of the n_ok values in ok: else ST_ERR_UNSUPPORTED
 * naming the file `path`, the field, its value and the values supported. */
st_status st_hf_config_str_in(const st_hf_config *c, const char *path, const char *key,
                              const char *const *ok, int n_ok);
#endif
