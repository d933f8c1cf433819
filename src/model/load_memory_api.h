/*
 * load_memory_api.h: st_model_load_memory, kept here until it is pasted into include/spectree.h
 * (Models section, after st_model_load).
 */
#ifndef ST_LOAD_MEMORY_API_H
#define ST_LOAD_MEMORY_API_H

#include "spectree.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loads a GGUF Llama model from a caller-owned buffer of `size` bytes holding the whole file, with
 * the same checks as st_model_load (for tests, fuzzers and embedded models). The weights are not
 * copied: the buffer must stay valid and unchanged until st_model_free. `name` (NULL: "<memory>")
 * is used in error messages in place of a path. On error *out is NULL and st_last_error() names
 * `name` and the problem. */
st_status st_model_load_memory(const void *data, size_t size, const char *name, st_model **out);

#ifdef __cplusplus
}
#endif

#endif /* ST_LOAD_MEMORY_API_H */
