/*
 * test_grammar.c: the grammar engine (src/grammar/).
 * - GBNF: good grammars match and reject byte strings as written (literals, escapes, classes
 *   with negation and UTF-8, ., groups, * + ? {m,n}, comments, multi-line rules); bad grammars
 *   are refused with a message naming what and where.
 * - JSON schema to GBNF: nested objects, arrays with bounds, enums, const, numbers, strings with
 *   lengths and patterns, anyOf, $ref; each converted grammar matches valid texts and rejects
 *   invalid ones; unsupported keywords are refused naming the keyword and its place.
 * - Token masks on the stories260K vocabulary: a masked greedy walk produces a sentence of the
 *   grammar, and the mask after a path equals the mask after committing the same tokens.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "grammar/grammar.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int match(const st_grammar *g, const char *s) {
    int r = -2;
    assert_int_equal(st_grammar_match(g, s, strlen(s), &r), ST_OK);
    return r;
}

static st_grammar *parse_ok(const char *text) {
    st_grammar *g = NULL;
    st_status rc = st_grammar_parse(text, strlen(text), &g);
    if (rc)
        fail_msg("grammar refused: %s\n%s", st_last_error(), text);
    return g;
}

static void parse_bad(const char *text, const char *msg) {
    st_grammar *g = NULL;
    assert_int_equal(st_grammar_parse(text, strlen(text), &g), ST_ERR_INVALID);
    assert_null(g);
    if (!strstr(st_last_error(), msg))
        fail_msg("for %s: expected '%s' in '%s'", text, msg, st_last_error());
}

static void test_gbnf_match(void **state) {
    (void)state;
    st_grammar *g = parse_ok("root ::= \"ab\" [0-9]+ (\"x\" | \"yz\")? # a comment\n");
    assert_int_equal(match(g, "ab1"), 1);
    assert_int_equal(match(g, "ab123yz"), 1);
    assert_int_equal(match(g, "ab1x"), 1);
    assert_int_equal(match(g, "ab"), 0);
    assert_int_equal(match(g, "a"), 0);
    assert_int_equal(match(g, "ab1y"), 0);
    assert_int_equal(match(g, "abx"), -1);
    assert_int_equal(match(g, "ab1xx"), -1);
    assert_int_equal(match(g, "b"), -1);
    st_grammar_free(g);

    /* multi-line rules, nested groups, references, repetition counts */
    g = parse_ok("root ::= item (\",\" item){1,2}\n"
                 "item ::=\n"
                 "  ( [a-c]\n"
                 "    | \"z\"{2} )\n");
    assert_int_equal(match(g, "a,b"), 1);
    assert_int_equal(match(g, "a,zz,c"), 1);
    assert_int_equal(match(g, "a"), 0);
    assert_int_equal(match(g, "a,b,c,a"), -1);
    assert_int_equal(match(g, "z,a"), -1);
    st_grammar_free(g);

    /* {m,}, {m}, escapes, negated classes, UTF-8, . */
    g = parse_ok("root ::= \"\\\"\" [^\"\\\\]* \"\\\"\" \"\\n\" \"\\x41\\u00e9\" d{3,} . [α-ω]\n"
                 "d ::= [0-9]\n");
    assert_int_equal(match(g, "\"hé llo\"\nAé123€β"), 1);
    assert_int_equal(match(g, "\"\"\nAé1234xγ"), 1);
    assert_int_equal(match(g, "\"\"\nAé12xγ"), -1);
    assert_int_equal(match(g, "\"\"\nAé123xa"), -1);
    assert_int_equal(match(g, "\"a\"b\"\nAé123xγ"), -1);
    /* invalid UTF-8 never matches a class */
    assert_int_equal(match(g, "\"\xff\""), -1);
    assert_int_equal(match(g, "\"\xce"), 0); /* first byte of a two-byte character */
    st_grammar_free(g);

    /* an optional item, the empty alternative, a right-recursive rule */
    g = parse_ok("root ::= list\nlist ::= \"(\" list \")\" list | \"\"\n");
    assert_int_equal(match(g, ""), 1);
    assert_int_equal(match(g, "(()())()"), 1);
    assert_int_equal(match(g, "(()"), 0);
    assert_int_equal(match(g, "())"), -1);
    st_grammar_free(g);

    /* 2^40 ways through empty rules: bounded work, still the right answer */
    g = parse_ok(
        "root ::= x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x "
        "x x \"b\"\nx ::= \"\" | \"\"\n");
    assert_int_equal(match(g, "b"), 1);
    assert_int_equal(match(g, "a"), -1);
    st_grammar_free(g);
}

static void test_gbnf_errors(void **state) {
    (void)state;
    parse_bad("item ::= \"a\"\n", "no rule named 'root'");
    parse_bad("root ::= foo\n", "line 1, column 10: undefined rule 'foo'");
    parse_bad("root ::= \"a\"\nroot ::= \"b\"\n", "line 2, column 1: rule 'root' is defined twice");
    parse_bad("root ::= \"abc\n", "string literal not closed");
    parse_bad("root ::= [a-z\n", "not closed with ']'");
    parse_bad("root ::= [z-a]\n", "reversed");
    parse_bad("root ::= (\"a\"\n", "not closed with ')'");
    parse_bad("root ::= \"a\")\n", "unmatched ')'");
    parse_bad("root ::= \"a\" \"b\n", "line 1, column 14");
    parse_bad("root = \"a\"\n", "expected '::='");
    parse_bad("root ::= \"\\q\"\n", "unknown escape '\\q'");
    parse_bad("root ::= \"\\x4\"\n", "2 hexadecimal digits");
    parse_bad("root ::= \"a\"{3,1}\n", "max below min");
    parse_bad("root ::= \"a\"{2000}\n", "over 1000");
    parse_bad("root ::= \"a\"**\n", "two repetition operators");
    parse_bad("root ::= root \"a\" | \"b\"\n", "rule 'root' is left-recursive");
    parse_bad("root ::= (\"a\"?)*\n", "left-recursive");
    parse_bad("root ::= a\na ::= b \"x\"\nb ::= \"\" | a\n", "left-recursive");
    parse_bad("root ::= <[1000]>\n", "token references");
    parse_bad("root ::= []\n", "empty character class");
    parse_bad("root ::= \"\xff\"\n", "invalid UTF-8");
    parse_bad("::= \"a\"\n", "expected a rule name");
}

/* Converts schema and matches each of good (1: sentence) and bad (-1 or 0: not a sentence). */
static void schema_case(const char *schema, const char *const *good, const char *const *bad) {
    char *gbnf = NULL;
    st_status rc = st_json_schema_to_gbnf(schema, strlen(schema), &gbnf);
    if (rc)
        fail_msg("schema refused: %s\n%s", st_last_error(), schema);
    st_grammar *g = NULL;
    if (st_grammar_parse(gbnf, strlen(gbnf), &g))
        fail_msg("converted grammar refused: %s\n%s", st_last_error(), gbnf);
    for (int i = 0; good[i]; i++)
        if (match(g, good[i]) != 1)
            fail_msg("schema %s\nshould accept %s\ngrammar:\n%s", schema, good[i], gbnf);
    for (int i = 0; bad[i]; i++)
        if (match(g, bad[i]) == 1)
            fail_msg("schema %s\nshould reject %s\ngrammar:\n%s", schema, bad[i], gbnf);
    st_grammar_free(g);
    st_grammar_text_free(gbnf);
}

static void test_schema_convert(void **state) {
    (void)state;
    schema_case(
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":"
        "{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":"
        "\"string\",\"enum\":[\"a\",\"b\"]},\"minItems\":1,\"maxItems\":2}},"
        "\"required\":[\"name\",\"tags\"],\"additionalProperties\":false}",
        (const char *const[]){"{\"name\":\"x\",\"tags\":[\"a\"]}",
                              "{\"name\": \"x\", \"age\": -12, \"tags\": [\"a\", \"b\"]}",
                              "{\"name\":\"\\\"q\\u00e9\",\"age\":0,\"tags\":[\"b\"]}", NULL},
        (const char *const[]){
            "{\"name\":\"x\"}", "{\"tags\":[\"a\"],\"name\":\"x\"}", "{\"name\":\"x\",\"tags\":[]}",
            "{\"name\":\"x\",\"tags\":[\"a\",\"b\",\"a\"]}", "{\"name\":\"x\",\"tags\":[\"c\"]}",
            "{\"name\":\"x\",\"age\":01,\"tags\":[\"a\"]}",
            "{\"name\":\"x\",\"age\":1.5,\"tags\":[\"a\"]}",
            "{\"name\":\"x\",\"tags\":[\"a\"],\"z\":1}", NULL});
    /* nested objects and arrays, all properties optional */
    schema_case("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{"
                "\"b\":{\"type\":\"array\",\"items\":{\"type\":\"number\"}}}},\"c\":{\"type\":"
                "\"boolean\"},\"d\":{\"type\":\"null\"}}}",
                (const char *const[]){"{}", "{\"c\":true}", "{\"a\":{},\"d\":null}",
                                      "{\"a\":{\"b\":[1,-2.5,3e10]},\"c\":false}", NULL},
                (const char *const[]){"{,}", "{\"c\":true,}", "{\"d\":null,\"c\":true}",
                                      "{\"a\":{\"b\":[1,]}}", "{\"a\":{\"b\":[\"x\"]}}", NULL});
    /* strings: lengths, patterns, formats; const and anyOf; $ref */
    schema_case("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"minLength\":2,"
                "\"maxLength\":3},{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d+(x|yz)?$\"},"
                "{\"const\":{\"k\":[1,2]}},{\"anyOf\":[{\"type\":\"integer\"},{\"$ref\":\"#/"
                "$defs/s\"}]},{\"type\":\"string\",\"format\":\"date\"}],\"$defs\":{\"s\":{"
                "\"type\":\"string\",\"enum\":[\"p\",\"q\"]}}}",
                (const char *const[]){"[\"ab\",\"AB-12\",{\"k\":[1,2]},7,\"2024-02-29\"]",
                                      "[\"abc\",\"XY-0yz\",{\"k\":[1,2]},\"q\",\"1999-12-01\"]",
                                      NULL},
                (const char *const[]){"[\"a\",\"AB-12\",{\"k\":[1,2]},7,\"2024-02-29\"]",
                                      "[\"abcd\",\"AB-12\",{\"k\":[1,2]},7,\"2024-02-29\"]",
                                      "[\"ab\",\"Ab-12\",{\"k\":[1,2]},7,\"2024-02-29\"]",
                                      "[\"ab\",\"AB-12x \",{\"k\":[1,2]},7,\"2024-02-29\"]",
                                      "[\"ab\",\"AB-12\",{\"k\":[1]},7,\"2024-02-29\"]",
                                      "[\"ab\",\"AB-12\",{\"k\":[1,2]},\"r\",\"2024-02-29\"]",
                                      "[\"ab\",\"AB-12\",{\"k\":[1,2]},7,\"2024-13-01\"]", NULL});
    /* an unanchored pattern is a search; a recursive $ref */
    schema_case("{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
                "\"string\",\"pattern\":\"a.c\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":"
                "\"#/$defs/n\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/n\"}",
                (const char *const[]){"{\"v\":\"abc\"}", "{\"v\":\"xxa\\\"cyy\",\"kids\":[]}",
                                      "{\"v\":\"abc\",\"kids\":[{\"v\":\"a c\",\"kids\":[{\"v\":"
                                      "\"aac\"}]}]}",
                                      NULL},
                (const char *const[]){"{\"v\":\"ab\"}", "{\"kids\":[]}",
                                      "{\"v\":\"abc\",\"kids\":[{\"v\":\"x\"}]}", NULL});
}

static void schema_bad(const char *schema, st_status code, const char *msg) {
    char *gbnf = NULL;
    assert_int_equal(st_json_schema_to_gbnf(schema, strlen(schema), &gbnf), code);
    assert_null(gbnf);
    if (!strstr(st_last_error(), msg))
        fail_msg("for %s: expected '%s' in '%s'", schema, msg, st_last_error());
}

static void test_schema_errors(void **state) {
    (void)state;
    schema_bad(
        "{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"minimum\":0}}}",
        ST_ERR_UNSUPPORTED, "'minimum' at /properties/age is not supported");
    schema_bad("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", ST_ERR_UNSUPPORTED,
               "escape '\\1' is not supported");
    schema_bad("{\"type\":\"string\",\"pattern\":\"a(?=b)\"}", ST_ERR_UNSUPPORTED, "'(?' groups");
    schema_bad("{\"type\":\"string\",\"pattern\":\"a+?\"}", ST_ERR_UNSUPPORTED, "lazy");
    schema_bad("{\"type\":\"string\",\"format\":\"email\"}", ST_ERR_UNSUPPORTED, "format 'email'");
    schema_bad("{\"not\":{\"type\":\"string\"}}", ST_ERR_UNSUPPORTED, "'not' at the top level");
    schema_bad("{\"type\":\"object\",\"required\":[\"x\"]}", ST_ERR_UNSUPPORTED,
               "required property 'x'");
    schema_bad("{\"allOf\":[{},{}]}", ST_ERR_UNSUPPORTED, "allOf with more than one");
    schema_bad("{\"$ref\":\"http://x/y\"}", ST_ERR_UNSUPPORTED, "$ref 'http://x/y'");
    schema_bad("{\"type\":\"strin\"}", ST_ERR_UNSUPPORTED, "type 'strin'");
    schema_bad("{\"type\":\"string\",\"maxLength\":5000}", ST_ERR_UNSUPPORTED, "over 1000");
    schema_bad("{\"type\":", ST_ERR_INVALID, "not JSON");
    schema_bad("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"exclusiveMaximum\":3}}",
               ST_ERR_UNSUPPORTED, "'exclusiveMaximum' at /items");
}

static void test_json_object(void **state) {
    (void)state;
    st_grammar *g = parse_ok(st_grammar_json_object());
    assert_int_equal(match(g, "{}"), 1);
    assert_int_equal(match(g, "{\"a\": [1, {\"b\": null}, \"x\"], \"c\": -0.5e3}"), 1);
    assert_int_equal(match(g, "[1]"), -1);
    assert_int_equal(match(g, "{\"a\":}"), -1);
    assert_int_equal(match(g, "{\"a\":1"), 0);
    st_grammar_free(g);
}

/* Masks on the real vocabulary: a greedy walk under a mask with deterministic fake logits
 * ends in a sentence, and masks after a path equal masks after committing it. */
static void test_token_mask(void **state) {
    (void)state;
    st_model *m = NULL;
    assert_int_equal(st_model_load(tu_data("models/stories260K.gguf"), &m), ST_OK);
    const st_tokenizer *t = st_model_tokenizer(m);
    const int32_t V = st_tokenizer_n_vocab(t);
    st_grammar *g =
        parse_ok("root ::= \"{\\\"n\\\": \" [0-9]{1,3} \", \\\"w\\\": \\\"\" [a-z ]{2,12} "
                 "\"\\\"}\"\n");
    st_gmatcher *a = NULL, *b = NULL;
    assert_int_equal(st_gmatcher_create(g, t, V, &a), ST_OK);
    assert_int_equal(st_gmatcher_create(g, t, V, &b), ST_OK);
    float *lg = malloc((size_t)V * sizeof *lg), *lg2 = malloc((size_t)V * sizeof *lg2);
    int32_t path[64];
    int n = 0, ended = 0;
    char text[512];
    size_t nt = 0;
    for (int step = 0; step < 60 && !ended; step++) {
        for (int32_t i = 0; i < V; i++)
            lg[i] = lg2[i] = (float)((i * 7919 + step * 104729) % 1000) / 100.0f;
        assert_int_equal(st_gmatcher_mask(a, path, n, lg), ST_OK);  /* path, uncommitted */
        assert_int_equal(st_gmatcher_mask(b, NULL, 0, lg2), ST_OK); /* the same, committed */
        assert_memory_equal(lg, lg2, (size_t)V * sizeof *lg);
        int32_t tok = st_argmax(lg, V);
        assert_true(isfinite(lg[tok]));
        if (st_tokenizer_is_eog(t, tok)) {
            ended = 1;
            break;
        }
        assert_true(st_gmatcher_path_ok(a, path, n));
        path[n++] = tok;
        assert_true(st_gmatcher_path_ok(a, path, n));
        assert_int_equal(st_gmatcher_accept(b, tok), ST_OK);
        st_detok d;
        st_detok_init(&d, t);
        st_detok_set_prev(&d, tok == 0 ? 1 : 0);
        size_t w;
        assert_int_equal(st_detok_push(&d, tok, text + nt, sizeof text - nt, &w), ST_OK);
        nt += w;
    }
    assert_true(ended);
    text[nt] = 0;
    assert_int_equal(match(g, text), 1);
    /* a path through a token the grammar rejects */
    int32_t bad[8];
    int64_t n_bad = 0;
    assert_int_equal(st_tokenize(t, "x", 1, 0, bad, 8, &n_bad), ST_OK);
    assert_true(n_bad >= 1);
    const int32_t bo = bad[0];
    st_gmatcher_free(a);
    assert_int_equal(st_gmatcher_create(g, t, V, &a), ST_OK);
    assert_false(st_gmatcher_path_ok(a, &bo, 1));
    st_gmatcher_free(a);
    st_gmatcher_free(b);
    st_grammar_free(g);
    free(lg);
    free(lg2);
    st_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_match),     cmocka_unit_test(test_gbnf_errors),
        cmocka_unit_test(test_schema_convert), cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_json_object),    cmocka_unit_test(test_token_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
