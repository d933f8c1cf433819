/*
 * tok_vocab.c: the piece -> id hash table (FNV-1a, open addressing) that the tokenizer's loader
 * builds (tokenizer.c) and both algorithms look pieces up in (tok_spm.c, tok_bpe.c).
 */
#include "tok/tok.h"

#include <string.h>

static uint64_t str_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ULL;
    }
    return h ^ (h >> 29);
}

int32_t st_tok_find(const st_tokenizer *t, const char *s, size_t n) {
    for (uint64_t h = str_hash(s, n) & t->map_mask;; h = (h + 1) & t->map_mask) {
        int32_t id = t->map[h];
        if (id < 0)
            return -1;
        size_t len;
        const char *p = st_tok_text(t, id, &len);
        if (len == n && memcmp(p, s, n) == 0)
            return id;
    }
}

/* Adds every non-empty piece; a repeated piece maps to its last id (as llama.cpp). */
void st_tok_build_map(st_tokenizer *t) {
    memset(t->map, 0xFF, (t->map_mask + 1) * sizeof *t->map);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t n;
        const char *s = st_tok_text(t, id, &n);
        if (n == 0)
            continue;
        uint64_t h = str_hash(s, n) & t->map_mask;
        for (;; h = (h + 1) & t->map_mask) {
            int32_t o = t->map[h];
            if (o < 0)
                break;
            size_t on;
            const char *os = st_tok_text(t, o, &on);
            if (on == n && memcmp(os, s, n) == 0)
                break;
        }
        t->map[h] = id;
    }
}
