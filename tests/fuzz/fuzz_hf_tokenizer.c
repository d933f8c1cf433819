/*
 * fuzz_hf_tokenizer.c: libFuzzer target for tokenizer.json conversion (src/io/hf_tok.c). Each
 * input is read as a tokenizer.json; when it converts, the GGUF written from it is opened and
 * its tokenizer loaded (which may still refuse it, with an error), and a few texts are
 * tokenized and detokenized. Any rejection must come with a negative status and an error naming
 * the input.
 * Build: CC=clang cmake -S . -B build-fuzz -DST_FUZZ=ON -DST_SANITIZE=ON &&
 *        cmake --build build-fuzz -t fuzz_hf_tokenizer
 */
#include "io/hf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const name = "fuzz-tokenizer.json";

static void check_error(st_status s, const char *who) {
    if (s >= 0 || !strstr(st_last_error(), who)) {
        fprintf(stderr, "rejection without a clear error: status %d, '%s'\n", (int)s,
                st_last_error());
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_gguf_writer *w = NULL;
    if (st_gguf_writer_create(&w) != ST_OK)
        return 0;
    st_status s = st_hf_tokenizer_to_gguf_memory((const char *)data, size, name, w);
    if (s) {
        if (s != ST_ERR_NOMEM)
            check_error(s, name);
        st_gguf_writer_free(w);
        return 0;
    }
    void *buf = NULL;
    size_t n = 0;
    s = st_gguf_writer_write_memory(w, &buf, &n);
    st_gguf_writer_free(w);
    if (s)
        return 0;
    st_gguf *g = NULL;
    st_tokenizer *tok = NULL;
    if (st_gguf_open_memory(buf, n, name, &g) != ST_OK) {
        fprintf(stderr, "the converter wrote a GGUF its reader refuses: %s\n", st_last_error());
        abort();
    }
    s = st_tokenizer_load(g, &tok);
    if (s == ST_OK) {
        static const char *const texts[] = {"Once upon a time", " hello  world\n",
                                            "\xC3\xA9\xE6\x9D\xB1 12345!", ""};
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            int32_t ids[256];
            int64_t k = 0;
            if (st_tokenize(tok, texts[i], strlen(texts[i]), 0, ids, 256, &k) != ST_OK)
                continue;
            st_detok d;
            st_detok_init(&d, tok);
            char out[4096];
            size_t m;
            for (int64_t j = 0; j < k; j++)
                st_detok_push(&d, ids[j], out, sizeof out, &m);
        }
    } else if (s != ST_ERR_NOMEM) {
        check_error(s, name);
    }
    st_tokenizer_free(tok);
    st_gguf_free(g);
    free(buf);
    return 0;
}
