/*
 * schema.c: GBNF for JSON schemas (the subset st_json_schema_to_gbnf documents) and for any
 * JSON object. Every schema node becomes one rule; an object's properties are written in
 * their order, with the optional ones chained so that commas stay right; a pattern's regex is
 * translated item by item into GBNF over the JSON-escaped form of the string's characters.
 * Keywords outside the subset are refused, never ignored, so a grammar never admits less
 * checking than its schema asks for without saying so.
 */
#include "grammar/grammar.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LEN 1000 /* largest minLength, maxLength, minItems, maxItems */
#define MAX_SCHEMA_DEPTH 64

/* Shared rules, written once at the end when used. */
#define JSON_PRIMS                                                                                 \
    "ws ::= \" \"?\n"                                                                              \
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"           \
    "string ::= \"\\\"\" char* \"\\\"\"\n"                                                         \
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"                                             \
    "number ::= integer (\".\" [0-9]{1,15})? ([eE] [-+]? [0-9]{1,3})?\n"                           \
    "boolean ::= \"true\" | \"false\"\n"                                                           \
    "null ::= \"null\"\n"                                                                          \
    "value ::= object | array | string | number | boolean | null\n"                                \
    "object ::= \"{\" ws (string ws \":\" ws value ws (\",\" ws string ws \":\" ws value ws)*)? "  \
    "\"}\"\n"                                                                                      \
    "array ::= \"[\" ws (value ws (\",\" ws value ws)*)? \"]\"\n"

static const char json_object_gbnf[] = "root ::= object\n" JSON_PRIMS;

const char *st_grammar_json_object(void) { return json_object_gbnf; }

void st_grammar_text_free(char *text) { st_free(text); }

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1)
            c *= 2;
        char *q = st_realloc(b->p, c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q, b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt(sbuf *b, const char *fmt, ...) ST_PRINTF(2, 3);
static void sb_fmt(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A GBNF string literal of n bytes. */
static void sb_lit(sbuf *b, const char *s, size_t n) {
    sb_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            sb_fmt(b, "\\%c", c);
        else if (c < 0x20 || c == 0x7F)
            sb_fmt(b, "\\x%02X", c);
        else
            sb_put(b, (const char *)&c, 1);
    }
    sb_str(b, "\"");
}

typedef struct conv {
    sbuf out;
    json_t *root;
    int n_rules;
    char path[512];
    size_t n_path;
    st_status err;
    int depth;
    struct {
        char *ref;
        int id;
    } refs[256];
    int n_refs;
} conv;

static void path_push(conv *c, const char *seg) {
    size_t n = strlen(seg);
    if (c->n_path + n + 2 >= sizeof c->path)
        return;
    c->path[c->n_path++] = '/';
    memcpy(c->path + c->n_path, seg, n + 1);
    c->n_path += n;
}

static void path_pop(conv *c, size_t n) {
    c->n_path = n;
    c->path[n] = 0;
}

static const char *here(const conv *c) { return c->n_path ? c->path : "the top level"; }

#define CFAIL(c, code, ...)                                                                        \
    do {                                                                                           \
        char m_[640];                                                                              \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                                      \
        (c)->err = st_fail(code, "json schema: %s", m_);                                           \
        return -1;                                                                                 \
    } while (0)

static int gen(conv *c, json_t *s, int id);

/* A new rule id (the rule itself is written by whoever took it). */
static int take_id(conv *c) { return ++c->n_rules; }

static void rule_name(char *dst, size_t cap, int id) {
    if (id == 0)
        snprintf(dst, cap, "root");
    else
        snprintf(dst, cap, "r%d", id);
}

/* Appends a reference to a rule for schema s to body; -1 on error. */
static int ref_to(conv *c, sbuf *body, json_t *s, const char *seg) {
    size_t n = c->n_path;
    path_push(c, seg);
    int id = take_id(c);
    int rc = gen(c, s, id);
    path_pop(c, n);
    if (rc)
        return -1;
    char name[24];
    rule_name(name, sizeof name, id);
    sb_fmt(body, "%s", name);
    return 0;
}

static int get_count(conv *c, json_t *s, const char *key, int64_t def, int64_t *out) {
    json_t *v = json_object_get(s, key);
    *out = def;
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        CFAIL(c, ST_ERR_INVALID, "'%s' at %s must be a non-negative integer", key, here(c));
    if (json_integer_value(v) > MAX_LEN)
        CFAIL(c, ST_ERR_UNSUPPORTED, "'%s' at %s over %d is not supported", key, here(c), MAX_LEN);
    *out = json_integer_value(v);
    return 0;
}

/* A JSON value as a GBNF literal of its compact text. */
static int lit_value(conv *c, sbuf *body, json_t *v) {
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!t)
        CFAIL(c, ST_ERR_NOMEM, "out of memory");
    sb_lit(body, t, strlen(t));
    free(t);
    return 0;
}

/* item{lo,hi} in GBNF (hi -1: unbounded). */
static void repeat_suffix(sbuf *b, int64_t lo, int64_t hi) {
    if (hi < 0)
        sb_fmt(b, "{%lld,}", (long long)lo);
    else
        sb_fmt(b, "{%lld,%lld}", (long long)lo, (long long)hi);
}

/* ------------------------------------------------------------ pattern (a regex subset) */

typedef struct rx {
    const char *p, *end;
    conv *c;
} rx;

/* The JSON-escaped form of code point cp (a character inside a JSON string) as GBNF. */
static void json_char(sbuf *b, uint32_t cp) {
    char u[5] = {0};
    if (cp == '"')
        sb_str(b, "\"\\\\\\\"\"");
    else if (cp == '\\')
        sb_str(b, "\"\\\\\\\\\"");
    else if (cp < 0x20)
        sb_fmt(b, "\"\\\\u%04X\"", cp);
    else if (cp < 0x80) {
        u[0] = (char)cp;
        sb_lit(b, u, 1);
    } else {
        /* non-ASCII: as UTF-8 (gbnf literals are UTF-8) */
        int n = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (n == 2)
            u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F));
        else if (n == 3)
            u[0] = (char)(0xE0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
            u[2] = (char)(0x80 | (cp & 0x3F));
        else
            u[0] = (char)(0xF0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
            u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F));
        sb_put(b, "\"", 1);
        sb_put(b, u, (size_t)n);
        sb_put(b, "\"", 1);
    }
}

#define RXFAIL(r, ...) CFAIL((r)->c, ST_ERR_UNSUPPORTED, __VA_ARGS__)

static int rx_cp(rx *r, uint32_t *cp) {
    const uint8_t *s = (const uint8_t *)r->p;
    uint8_t b = s[0];
    int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    if (r->end - r->p < n)
        RXFAIL(r, "pattern at %s: invalid UTF-8", here(r->c));
    uint32_t v = n == 1 ? b : n == 2 ? (b & 0x1Fu) : n == 3 ? (b & 0x0Fu) : (b & 0x07u);
    for (int i = 1; i < n; i++)
        v = (v << 6) | (s[i] & 0x3Fu);
    r->p += n;
    *cp = v;
    return 0;
}

/* Class member: writes its GBNF class text (inside [...]) for a code point, escaped. */
static void class_cp(sbuf *b, uint32_t cp) {
    if (cp == ']' || cp == '[' || cp == '\\' || cp == '^' || cp == '-' || cp == '"')
        sb_fmt(b, "\\%c", (char)cp);
    else if (cp < 0x20 || cp == 0x7F)
        sb_fmt(b, "\\x%02X", cp);
    else if (cp < 0x80)
        sb_fmt(b, "%c", (char)cp);
    else
        sb_fmt(b, "\\U%08X", cp);
}

/* [...] of a pattern: the class without '"', '\\' and control characters, with those two as
 * their escapes when the class has them. */
static int rx_class(rx *r, sbuf *b) {
    r->p++; /* '[' */
    int neg = 0;
    if (r->p < r->end && *r->p == '^')
        neg = 1, r->p++;
    sbuf cls = {0};
    int has_quote = 0, has_bslash = 0, first = 1;
    for (;;) {
        if (r->p >= r->end) {
            st_free(cls.p);
            RXFAIL(r, "pattern at %s: '[' not closed", here(r->c));
        }
        if (*r->p == ']' && !first) {
            r->p++;
            break;
        }
        first = 0;
        uint32_t lo, hi;
        if (*r->p == '\\') {
            r->p++;
            if (r->p >= r->end) {
                st_free(cls.p);
                RXFAIL(r, "pattern at %s: ends with '\\'", here(r->c));
            }
            char e = *r->p++;
            if (e == 'd') {
                sb_str(&cls, "0-9");
                continue;
            }
            if (e == 'w') {
                sb_str(&cls, "a-zA-Z0-9_");
                continue;
            }
            if (e == 's') {
                sb_str(&cls, " ");
                continue;
            }
            if (strchr("\\.-[]^$*+?(){}|/\"", e)) {
                lo = (uint8_t)e;
            } else {
                st_free(cls.p);
                RXFAIL(r, "pattern at %s: escape '\\%c' in a class is not supported", here(r->c),
                       e);
            }
        } else if (rx_cp(r, &lo)) {
            st_free(cls.p);
            return -1;
        }
        hi = lo;
        if (r->end - r->p >= 2 && r->p[0] == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                st_free(cls.p);
                RXFAIL(r, "pattern at %s: an escape as a range's end is not supported", here(r->c));
            }
            if (rx_cp(r, &hi)) {
                st_free(cls.p);
                return -1;
            }
            if (hi < lo) {
                st_free(cls.p);
                CFAIL(r->c, ST_ERR_INVALID, "pattern at %s: reversed range", here(r->c));
            }
        }
        if (lo <= '"' && hi >= '"')
            has_quote = 1;
        if (lo <= '\\' && hi >= '\\')
            has_bslash = 1;
        if (lo < 0x20)
            lo = 0x20; /* control characters would need \\u escapes: left out */
        if (hi < lo)
            continue;
        class_cp(&cls, lo);
        if (hi > lo) {
            sb_str(&cls, "-");
            class_cp(&cls, hi);
        }
    }
    sb_str(b, "(");
    if (neg) {
        sb_fmt(b, "[^%s\"\\\\\\x00-\\x1F]", cls.p ? cls.p : "");
        if (!has_quote)
            sb_str(b, " | \"\\\\\\\"\"");
        if (!has_bslash)
            sb_str(b, " | \"\\\\\\\\\"");
    } else {
        int any = 0;
        if (cls.p && cls.n) {
            sb_fmt(b, "[%s]", cls.p);
            any = 1;
        }
        if (has_quote) {
            sb_str(b, any ? " | " : "");
            sb_str(b, "\"\\\\\\\"\"");
            any = 1;
        }
        if (has_bslash) {
            sb_str(b, any ? " | " : "");
            sb_str(b, "\"\\\\\\\\\"");
            any = 1;
        }
        if (!any) {
            st_free(cls.p);
            RXFAIL(r, "pattern at %s: a class of control characters only is not supported",
                   here(r->c));
        }
    }
    sb_str(b, ")");
    st_free(cls.p);
    return b->oom ? -1 : 0;
}

static int rx_alt(rx *r, sbuf *b, int depth);

static int rx_seq(rx *r, sbuf *b, int depth) {
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        char ch = *r->p;
        if (ch == '(') {
            r->p++;
            if (r->p < r->end && *r->p == '?') {
                if (r->end - r->p >= 2 && r->p[1] == ':')
                    r->p += 2;
                else
                    RXFAIL(r, "pattern at %s: '(?' groups other than '(?:' are not supported",
                           here(r->c));
            }
            if (depth > 32)
                RXFAIL(r, "pattern at %s: groups nested too deep", here(r->c));
            sb_str(b, "(");
            if (rx_alt(r, b, depth + 1))
                return -1;
            if (r->p >= r->end || *r->p != ')')
                RXFAIL(r, "pattern at %s: '(' not closed", here(r->c));
            r->p++;
            sb_str(b, ")");
        } else if (ch == '[') {
            if (rx_class(r, b))
                return -1;
        } else if (ch == '.') {
            r->p++;
            sb_str(b, "([^\"\\\\\\x00-\\x1F] | \"\\\\\\\"\" | \"\\\\\\\\\")");
        } else if (ch == '\\') {
            r->p++;
            if (r->p >= r->end)
                RXFAIL(r, "pattern at %s: ends with '\\'", here(r->c));
            char e = *r->p++;
            if (e == 'd')
                sb_str(b, "[0-9]");
            else if (e == 'w')
                sb_str(b, "[a-zA-Z0-9_]");
            else if (e == 's')
                sb_str(b, "\" \"");
            else if (strchr("\\.-[]^$*+?(){}|/\"", e))
                json_char(b, (uint8_t)e);
            else
                RXFAIL(r, "pattern at %s: escape '\\%c' is not supported", here(r->c), e);
        } else if (ch == '^' || ch == '$') {
            RXFAIL(r, "pattern at %s: '%c' other than at the pattern's ends is not supported",
                   here(r->c), ch);
        } else if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
            RXFAIL(r, "pattern at %s: '%c' with nothing to repeat", here(r->c), ch);
        } else {
            uint32_t cp;
            if (rx_cp(r, &cp))
                return -1;
            json_char(b, cp);
        }
        /* quantifier */
        if (r->p < r->end && (*r->p == '*' || *r->p == '+' || *r->p == '?')) {
            sb_put(b, r->p, 1);
            r->p++;
        } else if (r->p < r->end && *r->p == '{') {
            const char *q = r->p + 1;
            long lo = 0, hi = -1;
            int nd = 0;
            while (q < r->end && *q >= '0' && *q <= '9' && nd < 5)
                lo = lo * 10 + (*q++ - '0'), nd++;
            if (!nd)
                RXFAIL(r, "pattern at %s: '{' is not a repetition", here(r->c));
            if (q < r->end && *q == ',') {
                q++;
                if (q < r->end && *q >= '0' && *q <= '9') {
                    hi = 0, nd = 0;
                    while (q < r->end && *q >= '0' && *q <= '9' && nd < 5)
                        hi = hi * 10 + (*q++ - '0'), nd++;
                }
            } else {
                hi = lo;
            }
            if (q >= r->end || *q != '}')
                RXFAIL(r, "pattern at %s: '{' not closed", here(r->c));
            if (lo > MAX_LEN || hi > MAX_LEN || (hi >= 0 && hi < lo))
                RXFAIL(r, "pattern at %s: repetition {%ld,%ld} outside 0..%d", here(r->c), lo, hi,
                       MAX_LEN);
            r->p = q + 1;
            repeat_suffix(b, lo, hi);
        }
        if (r->p < r->end && (*r->p == '?' || *r->p == '+' || *r->p == '*' || *r->p == '{'))
            RXFAIL(r, "pattern at %s: lazy, possessive or double quantifiers are not supported",
                   here(r->c));
        sb_str(b, " ");
    }
    return 0;
}

static int rx_alt(rx *r, sbuf *b, int depth) {
    for (;;) {
        if (rx_seq(r, b, depth))
            return -1;
        if (r->p < r->end && *r->p == '|') {
            r->p++;
            sb_str(b, " | ");
            continue;
        }
        return 0;
    }
}

/* A string matching pattern pat (JSON Schema: a search, so unanchored ends match anything). */
static int pattern_body(conv *c, sbuf *body, const char *pat) {
    rx r = {pat, pat + strlen(pat), c};
    int start = 0, end = 0;
    if (r.p < r.end && *r.p == '^')
        start = 1, r.p++;
    if (r.end > r.p && r.end[-1] == '$' && (r.end - r.p < 2 || r.end[-2] != '\\'))
        end = 1, r.end--;
    sb_str(body, "\"\\\"\" ");
    if (!start)
        sb_str(body, "char* ");
    sb_str(body, "(");
    if (rx_alt(&r, body, 0))
        return -1;
    if (r.p != r.end)
        CFAIL(c, ST_ERR_UNSUPPORTED, "pattern at %s: unmatched ')'", here(c));
    sb_str(body, ") ");
    if (!end)
        sb_str(body, "char* ");
    sb_str(body, "\"\\\"\"");
    return 0;
}

/* ------------------------------------------------------------ schema nodes */

static const char *const annotations[] = {"title",   "description", "default",  "examples",
                                          "$schema", "$id",         "$comment", "strict",
                                          "$defs",   "definitions", NULL};

static int known(const char *k, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(k, list[i]))
            return 1;
    return 0;
}

/* Keywords each type understands, beside the annotations and "type". */
static const char *const kw_string[] = {"minLength", "maxLength", "pattern", "format", NULL};
static const char *const kw_object[] = {"properties", "required", "additionalProperties", NULL};
static const char *const kw_array[] = {"items", "prefixItems", "minItems", "maxItems", NULL};

static int gen_string(conv *c, json_t *s, sbuf *body) {
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    int64_t lo, hi;
    if (get_count(c, s, "minLength", 0, &lo) || get_count(c, s, "maxLength", -1, &hi))
        return -1;
    if (hi >= 0 && hi < lo)
        CFAIL(c, ST_ERR_INVALID, "maxLength below minLength at %s", here(c));
    int bounded = json_object_get(s, "minLength") || json_object_get(s, "maxLength");
    if ((pat || fmt) && bounded)
        CFAIL(c, ST_ERR_UNSUPPORTED, "minLength or maxLength with %s at %s is not supported",
              pat ? "pattern" : "format", here(c));
    if (pat && fmt)
        CFAIL(c, ST_ERR_UNSUPPORTED, "pattern with format at %s is not supported", here(c));
    if (pat) {
        if (!json_is_string(pat))
            CFAIL(c, ST_ERR_INVALID, "pattern at %s must be a string", here(c));
        return pattern_body(c, body, json_string_value(pat));
    }
    if (fmt) {
        const char *f = json_is_string(fmt) ? json_string_value(fmt) : "";
        const char *date = "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] "
                           "[0-9] | \"3\" [01])";
        const char *time = "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" "
                           "[0-9]{1,6})? (\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] "
                           "[0-9])";
        sb_str(body, "\"\\\"\" ");
        if (!strcmp(f, "date"))
            sb_str(body, date);
        else if (!strcmp(f, "time"))
            sb_str(body, time);
        else if (!strcmp(f, "date-time"))
            sb_fmt(body, "%s \"T\" %s", date, time);
        else if (!strcmp(f, "uuid"))
            sb_str(body, "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" "
                         "[0-9a-f]{12}");
        else
            CFAIL(c, ST_ERR_UNSUPPORTED, "format '%s' at %s is not supported", f, here(c));
        sb_str(body, " \"\\\"\"");
        return 0;
    }
    sb_str(body, "\"\\\"\" char");
    if (bounded)
        repeat_suffix(body, lo, hi);
    else
        sb_str(body, "*");
    sb_str(body, " \"\\\"\"");
    return 0;
}

static int gen_object(conv *c, json_t *s, sbuf *body, int id) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        CFAIL(c, ST_ERR_INVALID, "properties at %s must be an object", here(c));
    if (req && !json_is_array(req))
        CFAIL(c, ST_ERR_INVALID, "required at %s must be an array", here(c));
    size_t i;
    json_t *v;
    json_array_foreach(req, i, v) {
        if (!json_is_string(v))
            CFAIL(c, ST_ERR_INVALID, "required at %s must list strings", here(c));
        if (!props || !json_object_get(props, json_string_value(v)))
            CFAIL(c, ST_ERR_UNSUPPORTED, "required property '%s' at %s has no schema in properties",
                  json_string_value(v), here(c));
    }
    size_t np = props ? json_object_size(props) : 0;
    if (np == 0) {
        if (add && !json_is_boolean(add) && json_is_object(add)) {
            /* a map: every value of the additionalProperties schema */
            sbuf vb = {0};
            if (ref_to(c, &vb, add, "additionalProperties")) {
                st_free(vb.p);
                return -1;
            }
            sb_fmt(body,
                   "\"{\" ws (string ws \":\" ws %s ws (\",\" ws string ws \":\" ws %s ws)*)? "
                   "\"}\"",
                   vb.p, vb.p);
            st_free(vb.p);
            return 0;
        }
        if (add && json_is_false(add))
            sb_str(body, "\"{\" ws \"}\"");
        else
            sb_str(body, "object");
        return 0;
    }
    if (add && !json_is_boolean(add) && !json_is_object(add))
        CFAIL(c, ST_ERR_INVALID, "additionalProperties at %s must be a boolean or a schema",
              here(c));
    /* kv_i, then A_i ("none written yet") and B_i ("one written") chains */
    int base = c->n_rules + 1;
    c->n_rules += (int)(3 * np + 2);
    const char *key;
    size_t k = 0;
    sbuf rules = {0};
    json_object_foreach(props, key, v) {
        int opt = 1;
        json_t *rv;
        json_array_foreach(req, i, rv) if (!strcmp(json_string_value(rv), key)) opt = 0;
        json_t *ps = json_object_get(props, key);
        size_t n = c->n_path;
        path_push(c, "properties");
        sbuf vb = {0};
        int rc = ref_to(c, &vb, ps, key);
        path_pop(c, n);
        if (rc) {
            st_free(vb.p);
            st_free(rules.p);
            return -1;
        }
        json_t *ks = json_string(key);
        char *kt = ks ? json_dumps(ks, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        json_decref(ks);
        if (!kt) {
            st_free(vb.p);
            st_free(rules.p);
            CFAIL(c, ST_ERR_NOMEM, "out of memory");
        }
        int kv = base + (int)k, a = base + (int)np + (int)k, b = base + 2 * (int)np + 1 + (int)k;
        sb_fmt(&rules, "r%d ::= ", kv);
        sb_lit(&rules, kt, strlen(kt));
        sb_fmt(&rules, " ws \":\" ws %s ws\n", vb.p);
        free(kt);
        st_free(vb.p);
        sb_fmt(&rules, "r%d ::= r%d r%d%s", a, kv, b + 1, opt ? "" : "\n");
        if (opt)
            sb_fmt(&rules, " | r%d\n", a + 1);
        sb_fmt(&rules, "r%d ::= \",\" ws r%d r%d%s", b, kv, b + 1, opt ? "" : "\n");
        if (opt)
            sb_fmt(&rules, " | r%d\n", b + 1);
        k++;
    }
    sb_fmt(&rules, "r%d ::= \"\"\nr%d ::= \"\"\n", base + 2 * (int)np, base + 3 * (int)np + 1);
    sb_put(&c->out, rules.p, rules.n);
    st_free(rules.p);
    sb_fmt(body, "\"{\" ws r%d \"}\"", base + (int)np);
    (void)id;
    return 0;
}

static int gen_array(conv *c, json_t *s, sbuf *body) {
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    int64_t lo, hi;
    if (get_count(c, s, "minItems", 0, &lo) || get_count(c, s, "maxItems", -1, &hi))
        return -1;
    if (hi >= 0 && hi < lo)
        CFAIL(c, ST_ERR_INVALID, "maxItems below minItems at %s", here(c));
    if (prefix) {
        if (!json_is_array(prefix) || json_array_size(prefix) == 0)
            CFAIL(c, ST_ERR_INVALID, "prefixItems at %s must be a non-empty array", here(c));
        if (json_object_get(s, "minItems") || json_object_get(s, "maxItems") ||
            (items && !json_is_false(items)))
            CFAIL(c, ST_ERR_UNSUPPORTED,
                  "prefixItems with items, minItems or maxItems at %s is not supported", here(c));
        sb_str(body, "\"[\" ws ");
        size_t i;
        json_t *v;
        size_t n = c->n_path;
        path_push(c, "prefixItems");
        json_array_foreach(prefix, i, v) {
            char seg[24];
            snprintf(seg, sizeof seg, "%zu", i);
            if (i)
                sb_str(body, " \",\" ws ");
            if (ref_to(c, body, v, seg)) {
                path_pop(c, n);
                return -1;
            }
            sb_str(body, " ws");
        }
        path_pop(c, n);
        sb_str(body, " \"]\"");
        return 0;
    }
    sbuf ib = {0};
    if (items && json_is_false(items)) {
        sb_str(body, "\"[\" ws \"]\"");
        return 0;
    }
    if (items && !json_is_true(items)) {
        if (!json_is_object(items))
            CFAIL(c, ST_ERR_INVALID, "items at %s must be a schema", here(c));
        if (ref_to(c, &ib, items, "items")) {
            st_free(ib.p);
            return -1;
        }
    } else {
        sb_str(&ib, "value");
    }
    if (hi == 0) {
        sb_str(body, "\"[\" ws \"]\"");
    } else {
        sb_fmt(body, "\"[\" ws %s%s ws (\",\" ws %s ws)", lo == 0 ? "(" : "", ib.p, ib.p);
        repeat_suffix(body, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
        sb_fmt(body, "%s \"]\"", lo == 0 ? ")?" : "");
    }
    st_free(ib.p);
    return 0;
}

/* The body for schema s restricted to one type name. */
static int gen_type(conv *c, json_t *s, const char *t, sbuf *body, int id) {
    if (!strcmp(t, "string"))
        return gen_string(c, s, body);
    if (!strcmp(t, "object"))
        return gen_object(c, s, body, id);
    if (!strcmp(t, "array"))
        return gen_array(c, s, body);
    if (!strcmp(t, "number") || !strcmp(t, "integer") || !strcmp(t, "boolean") ||
        !strcmp(t, "null")) {
        sb_str(body, t);
        return 0;
    }
    CFAIL(c, ST_ERR_UNSUPPORTED, "type '%s' at %s is not supported", t, here(c));
}

/* The schema a "#/$defs/x" or "#/definitions/x" reference names, or NULL (error set). */
static json_t *resolve(conv *c, const char *ref) {
    const char *name = NULL;
    json_t *defs = NULL;
    if (!strncmp(ref, "#/$defs/", 8))
        name = ref + 8, defs = json_object_get(c->root, "$defs");
    else if (!strncmp(ref, "#/definitions/", 14))
        name = ref + 14, defs = json_object_get(c->root, "definitions");
    if (!name) {
        c->err = st_fail(ST_ERR_UNSUPPORTED,
                         "json schema: $ref '%s' at %s is not supported (only #/$defs/NAME and "
                         "#/definitions/NAME)",
                         ref, here(c));
        return NULL;
    }
    json_t *d = defs ? json_object_get(defs, name) : NULL;
    if (!d)
        c->err = st_fail(ST_ERR_INVALID, "json schema: $ref '%s' at %s names no definition", ref,
                         here(c));
    return d;
}

static int gen(conv *c, json_t *s, int id) {
    char name[24];
    rule_name(name, sizeof name, id);
    if (++c->depth > MAX_SCHEMA_DEPTH)
        CFAIL(c, ST_ERR_UNSUPPORTED, "schema nested over %d deep at %s", MAX_SCHEMA_DEPTH, here(c));
    sbuf body = {0};
    int rc = -1;
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        sb_str(&body, "value");
        rc = 0;
        goto done;
    }
    if (!json_is_object(s)) {
        c->err = st_fail(ST_ERR_INVALID, "json schema: the schema at %s is not an object", here(c));
        goto done;
    }
    json_t *v;
    const char *k;
    if ((v = json_object_get(s, "$ref"))) {
        if (json_object_size(s) > 1) {
            json_object_foreach(s, k, v) if (strcmp(k, "$ref") && !known(k, annotations)) {
                c->err =
                    st_fail(ST_ERR_UNSUPPORTED,
                            "json schema: '%s' beside $ref at %s is not supported", k, here(c));
                goto done;
            }
        }
        const char *ref = json_is_string(json_object_get(s, "$ref"))
                              ? json_string_value(json_object_get(s, "$ref"))
                              : "";
        for (int i = 0; i < c->n_refs; i++)
            if (!strcmp(c->refs[i].ref, ref)) {
                sb_fmt(&body, "r%d", c->refs[i].id);
                rc = 0;
                goto done;
            }
        json_t *d = resolve(c, ref);
        if (!d)
            goto done;
        if (c->n_refs == (int)(sizeof c->refs / sizeof c->refs[0])) {
            c->err = st_fail(ST_ERR_UNSUPPORTED, "json schema: over 256 distinct $ref targets");
            goto done;
        }
        int rid = take_id(c);
        size_t n = strlen(ref);
        c->refs[c->n_refs].ref = st_malloc(n + 1);
        if (!c->refs[c->n_refs].ref) {
            c->err = st_fail(ST_ERR_NOMEM, "json schema: out of memory");
            goto done;
        }
        memcpy(c->refs[c->n_refs].ref, ref, n + 1);
        c->refs[c->n_refs++].id = rid;
        size_t pn = c->n_path;
        c->n_path = 0, c->path[0] = 0;
        path_push(c, ref + 2);
        rc = gen(c, d, rid);
        path_pop(c, pn);
        if (!rc)
            sb_fmt(&body, "r%d", rid);
        goto done;
    }
    if ((v = json_object_get(s, "const")) || (v = json_object_get(s, "enum"))) {
        int is_enum = json_object_get(s, "const") == NULL;
        json_object_foreach(s, k, v) if (strcmp(k, is_enum ? "enum" : "const") &&
                                         !known(k, annotations) && strcmp(k, "type")) {
            c->err =
                st_fail(ST_ERR_UNSUPPORTED, "json schema: '%s' beside %s at %s is not supported", k,
                        is_enum ? "enum" : "const", here(c));
            goto done;
        }
        v = json_object_get(s, is_enum ? "enum" : "const");
        if (is_enum) {
            if (!json_is_array(v) || json_array_size(v) == 0) {
                c->err = st_fail(ST_ERR_INVALID,
                                 "json schema: enum at %s must be a non-empty array", here(c));
                goto done;
            }
            size_t i;
            json_t *e;
            json_array_foreach(v, i, e) {
                if (i)
                    sb_str(&body, " | ");
                if (lit_value(c, &body, e))
                    goto done;
            }
        } else if (lit_value(c, &body, v)) {
            goto done;
        }
        rc = 0;
        goto done;
    }
    const char *comb = json_object_get(s, "anyOf")   ? "anyOf"
                       : json_object_get(s, "oneOf") ? "oneOf"
                       : json_object_get(s, "allOf") ? "allOf"
                                                     : NULL;
    if (comb) {
        json_object_foreach(s, k, v) if (strcmp(k, comb) && !known(k, annotations)) {
            c->err =
                st_fail(ST_ERR_UNSUPPORTED, "json schema: '%s' beside %s at %s is not supported", k,
                        comb, here(c));
            goto done;
        }
        v = json_object_get(s, comb);
        if (!json_is_array(v) || json_array_size(v) == 0) {
            c->err = st_fail(ST_ERR_INVALID, "json schema: %s at %s must be a non-empty array",
                             comb, here(c));
            goto done;
        }
        if (!strcmp(comb, "allOf") && json_array_size(v) != 1) {
            c->err = st_fail(ST_ERR_UNSUPPORTED,
                             "json schema: allOf with more than one schema at %s is not supported",
                             here(c));
            goto done;
        }
        size_t i, pn = c->n_path;
        json_t *e;
        path_push(c, comb);
        json_array_foreach(v, i, e) {
            char seg[24];
            snprintf(seg, sizeof seg, "%zu", i);
            if (i)
                sb_str(&body, " | ");
            if (ref_to(c, &body, e, seg)) {
                path_pop(c, pn);
                goto done;
            }
        }
        path_pop(c, pn);
        rc = 0;
        goto done;
    }
    /* typed (or untyped: any value, with no type keywords allowed) */
    json_t *type = json_object_get(s, "type");
    json_object_foreach(s, k, v) {
        if (known(k, annotations) || !strcmp(k, "type"))
            continue;
        int ok = 0;
        const char *const *lists[] = {kw_string, kw_object, kw_array};
        const char *names[] = {"string", "object", "array"};
        for (int i = 0; i < 3; i++) {
            if (!known(k, lists[i]))
                continue;
            if (!type)
                ok = 1;
            else if (json_is_string(type))
                ok = !strcmp(json_string_value(type), names[i]);
            else if (json_is_array(type)) {
                size_t j;
                json_t *t;
                json_array_foreach(type, j, t) ok |=
                    json_is_string(t) && !strcmp(json_string_value(t), names[i]);
            }
        }
        if (!ok) {
            c->err =
                st_fail(ST_ERR_UNSUPPORTED, "json schema: '%s' at %s is not supported", k, here(c));
            goto done;
        }
    }
    if (!type) {
        /* keywords without a type: the type they imply (one family only) */
        const char *implied = NULL;
        json_object_foreach(s, k, v) {
            if (known(k, kw_string))
                implied = "string";
            else if (known(k, kw_object))
                implied = "object";
            else if (known(k, kw_array))
                implied = "array";
        }
        if (implied)
            rc = gen_type(c, s, implied, &body, id);
        else {
            sb_str(&body, "value");
            rc = 0;
        }
        goto done;
    }
    if (json_is_string(type)) {
        rc = gen_type(c, s, json_string_value(type), &body, id);
        goto done;
    }
    if (json_is_array(type) && json_array_size(type) > 0) {
        size_t i;
        json_t *t;
        json_array_foreach(type, i, t) {
            if (!json_is_string(t)) {
                c->err =
                    st_fail(ST_ERR_INVALID, "json schema: type at %s must list strings", here(c));
                goto done;
            }
            if (i)
                sb_str(&body, " | ");
            sb_str(&body, "(");
            if (gen_type(c, s, json_string_value(t), &body, id))
                goto done;
            sb_str(&body, ")");
        }
        rc = 0;
        goto done;
    }
    c->err = st_fail(ST_ERR_INVALID, "json schema: type at %s must be a string or a list", here(c));
done:
    c->depth--;
    if (rc == 0) {
        sb_fmt(&c->out, "%s ::= ", name);
        sb_put(&c->out, body.p ? body.p : "", body.n);
        sb_str(&c->out, "\n");
        if (c->out.oom || body.oom) {
            c->err = st_fail(ST_ERR_NOMEM, "json schema: out of memory");
            rc = -1;
        }
    }
    st_free(body.p);
    return rc;
}

st_status st_json_schema_to_gbnf(const char *schema, size_t len, char **out) {
    if (!schema || !out)
        return st_fail(ST_ERR_INVALID, "st_json_schema_to_gbnf: bad argument");
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY, &je);
    if (!root)
        return st_fail(ST_ERR_INVALID, "json schema: not JSON: %s (line %d, column %d)", je.text,
                       je.line, je.column);
    conv c;
    memset(&c, 0, sizeof c);
    c.root = root;
    int rc = gen(&c, root, 0);
    if (rc == 0)
        sb_str(&c.out, JSON_PRIMS);
    for (int i = 0; i < c.n_refs; i++)
        st_free(c.refs[i].ref);
    json_decref(root);
    if (rc || c.out.oom) {
        st_free(c.out.p);
        return rc ? c.err : st_fail(ST_ERR_NOMEM, "json schema: out of memory");
    }
    *out = c.out.p;
    return ST_OK;
}
