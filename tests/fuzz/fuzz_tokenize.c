/*
 * fuzz_tokenize.c: libFuzzer target for the tokenizers. Loads the llama-spm and gpt-2 test
 * vocabularies once, tokenizes the input with both, detokenizes the ids one at a time, and
 * checks that every detokenized chunk is valid UTF-8 and that valid UTF-8 input round-trips.
 * Vocabularies: the repository's tests/data/tokenizer ($ST_SOURCE_DIR overrides the root).
 * Build: CC=clang cmake -S . -B build-fuzz -DST_FUZZ=ON && cmake --build build-fuzz -t
 * fuzz_tokenize
 */
#include "spectree.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static st_tokenizer *load(const char *name) {
    char path[4096];
    const char *dir = getenv("ST_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/data/tokenizer/%s", dir ? dir : ST_SOURCE_DIR, name);
    st_gguf *g = NULL;
    st_tokenizer *t = NULL;
    if (st_gguf_open(path, &g) != ST_OK || st_tokenizer_load(g, &t) != ST_OK) {
        fprintf(stderr, "fuzz_tokenize: %s\n", st_last_error());
        abort();
    }
    st_gguf_free(g);
    return t;
}

/* Strict UTF-8 validity (no overlongs, surrogates or values past U+10FFFF). */
static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t b = s[i];
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b < 0x80) {
            i++;
            continue;
        } else if (b >= 0xC2 && b <= 0xDF) {
            len = 2;
        } else if (b >= 0xE0 && b <= 0xEF) {
            len = 3;
            lo = b == 0xE0 ? 0xA0 : 0x80;
            hi = b == 0xED ? 0x9F : 0xBF;
        } else if (b >= 0xF0 && b <= 0xF4) {
            len = 4;
            lo = b == 0xF0 ? 0x90 : 0x80;
            hi = b == 0xF4 ? 0x8F : 0xBF;
        } else {
            return 0;
        }
        if (i + len > n || s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += len;
    }
    return 1;
}

static void run(const st_tokenizer *t, int spm, const uint8_t *data, size_t size) {
    int add_bos = spm; /* SPM round-trips exactly only with BOS (the prefix space is dropped) */
    int64_t n = 0;
    st_status s = st_tokenize(t, (const char *)data, size, add_bos, NULL, 0, &n);
    if (s != ST_OK && s != ST_ERR_RANGE)
        abort();
    int32_t *ids = malloc((size_t)(n + 1) * sizeof *ids);
    if (st_tokenize(t, (const char *)data, size, add_bos, ids, n, &n) != ST_OK)
        abort();
    size_t cap = st_detok_max_bytes(t), total = 0;
    char *chunk = malloc(cap);
    char *text = malloc((size_t)(n + 1) * cap);
    st_detok d;
    st_detok_init(&d, t);
    for (int64_t i = 0; i < n; i++) {
        size_t k;
        if (ids[i] < 0 || ids[i] >= st_tokenizer_n_vocab(t))
            abort();
        if (st_detok_push(&d, ids[i], chunk, cap, &k) != ST_OK || !valid_utf8((uint8_t *)chunk, k))
            abort();
        memcpy(text + total, chunk, k);
        total += k;
    }
    size_t k;
    if (st_detok_flush(&d, chunk, cap, &k) != ST_OK || !valid_utf8((uint8_t *)chunk, k))
        abort();
    memcpy(text + total, chunk, k);
    total += k;
    /* SPM decodes a literal U+2581 in the text as a space, so such text is not compared */
    int comparable = valid_utf8(data, size);
    for (size_t i = 0; spm && comparable && i + 2 < size; i++)
        if (data[i] == 0xE2 && data[i + 1] == 0x96 && data[i + 2] == 0x81)
            comparable = 0;
    if (comparable && (total != size || memcmp(text, data, size) != 0))
        abort();
    free(text);
    free(chunk);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static st_tokenizer *spm, *bpe;
    if (!spm) {
        spm = load("ggml-vocab-llama-spm.gguf");
        bpe = load("ggml-vocab-gpt-2.gguf");
    }
    run(spm, 1, data, size);
    run(bpe, 0, data, size);
    return 0;
}
