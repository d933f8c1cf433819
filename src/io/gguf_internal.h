/* gguf_internal.h: internal additions to the public GGUF reader (file name, data offset). */
#ifndef ST_GGUF_INTERNAL_H
#define ST_GGUF_INTERNAL_H
#include "core/core.h"

/* The name the file was opened with (used to prefix error messages). */
const char *st_gguf_name(const st_gguf *g);
/* The bytes the reader parsed (the mapped file or the caller's buffer) and their size. */
const void *st_gguf_bytes(const st_gguf *g, size_t *size);
/* Moves the reader onto `copy`, a st_huge_alloc region of at least the file's size holding the
 * same bytes (the caller checked them): tensor data pointers move with it, the file mapping (if
 * any) is closed and the reader owns copy from now on (st_gguf_free releases it). Metadata is
 * kept as offsets, so nothing else changes. */
void st_gguf_adopt_copy(st_gguf *g, void *copy);
/* Where the tensor data lives: 2 for the reader's own copy (st_gguf_adopt_copy: writable),
 * 1 for a file mapping (read-only; pages can be dropped and re-read), 0 for a caller's buffer. */
int st_gguf_data_kind(const st_gguf *g);
/* Byte offset of the tensor data blob from the start of the file. */
size_t st_gguf_data_offset(const st_gguf *g);
/* Bytes of one value of a fixed-size metadata type; 0 for STRING and ARRAY. */
size_t st_gguf_type_size(st_gguf_type t);
/* Bytes of a tensor of this type and shape ne[0..n_dims): the checks the reader and the writer
 * share (a loadable type, 1..4 dimensions, none negative, an element count within int64 and
 * size_t, a row length that is a whole number of blocks). Fails with bad_type for a type this
 * library cannot load and bad_shape otherwise; the detail names only the problem, so callers
 * prefix the file and tensor. */
st_status st_gguf_tensor_size(uint32_t type, uint32_t n_dims, const int64_t *ne, st_status bad_type,
                              st_status bad_shape, size_t *out);

/* Writes a tensor's shape as "[ne0, ne1, ...]" (n_dims entries) into buf; returns buf. */
const char *st_gguf_tensor_shape(const st_gguf_tensor *t, char *buf, size_t cap);
#endif
