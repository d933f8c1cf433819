/*
 * load_memory.c: st_model_load_memory, the model loader over a caller-owned buffer. It opens the
 * buffer with st_gguf_open_memory and hands it to the loader shared with st_model_load, so a
 * buffer is validated exactly like a file (the fuzz target and the GGUF tests rely on this).
 */
#include "model/model.h"
#include "spectree.h"

/* Defined in llama.c (takes ownership of g). */
st_status st_model_from_gguf(st_gguf *g, st_model **out);

st_status st_model_load_memory(const void *data, size_t size, const char *name, st_model **out) {
    if (!out)
        return st_fail(ST_ERR_INVALID, "st_model_load_memory: out is NULL");
    *out = NULL;
    st_gguf *g;
    st_status s = st_gguf_open_memory(data, size, name, &g);
    if (s)
        return s;
    if ((s = st_model_from_gguf(g, out)))
        return s;
    (*out)->load.mode = ST_LOAD_BUFFER;
    (*out)->load.reason = "buffer";
    (*out)->load.file_bytes = size;
    return ST_OK;
}
