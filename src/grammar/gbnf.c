/*
 * gbnf.c: parses GBNF, the grammar format of llama.cpp (grammars/README.md there), into a
 * grammar over bytes. Rules `name ::= alternatives`; items are string literals, character
 * classes over code points ([a-z], [^"], .), rule names and parenthesized groups, each
 * optionally followed by * + ? {m} {m,} {m,n}. A class becomes the UTF-8 byte sequences of its
 * code points (the split of Russ Cox's "UTF-8 ranges" construction), a group or repetition an
 * anonymous rule, so that matching only ever compares bytes. Left recursion is refused.
 */
#include "grammar/grammar.h"
#include "tok/tok.h"

#include <stdlib.h>
#include <string.h>

#define MAX_ELEMS (1 << 20) /* elements of a compiled grammar */
#define MAX_REPEAT 1000     /* largest m or n of {m,n} */
#define MAX_NEST 256        /* nested groups */

typedef struct gvec {
    st_gel *v;
    int32_t n, cap;
} gvec;

typedef struct brule {
    char *name;
    int defined;
    const char *used_at; /* first reference, for "undefined rule" */
    gvec *alts;
    int32_t n_alts, cap_alts;
} brule;

typedef struct parser {
    const char *s, *p, *end;
    brule *rules;
    int32_t n_rules, cap_rules;
    st_gset *sets;
    int32_t n_sets, cap_sets;
    int64_t total; /* elements so far */
    int depth;
    st_status err;
} parser;

static void where(const parser *ps, const char *at, int *line, int *col) {
    *line = 1, *col = 1;
    for (const char *q = ps->s; q < at && q < ps->end; q++) {
        if (*q == '\n')
            (*line)++, *col = 1;
        else
            (*col)++;
    }
}

#define FAIL(ps, at, ...)                                                                          \
    do {                                                                                           \
        int line_, col_;                                                                           \
        where(ps, at, &line_, &col_);                                                              \
        char msg_[256];                                                                            \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                                  \
        (ps)->err = st_fail(ST_ERR_INVALID, "grammar: line %d, column %d: %s", line_, col_, msg_); \
        return -1;                                                                                 \
    } while (0)

static int grow(void **v, int32_t *cap, int32_t need, size_t size) {
    if (need <= *cap)
        return 0;
    int32_t c = *cap ? *cap : 8;
    while (c < need)
        c *= 2;
    void *n = st_realloc(*v, (size_t)c * size);
    if (!n)
        return -1;
    *v = n, *cap = c;
    return 0;
}

static int push(parser *ps, gvec *g, int32_t kind, int32_t arg) {
    if (++ps->total > MAX_ELEMS) {
        ps->err =
            st_fail(ST_ERR_INVALID, "grammar: over %d elements (repetitions too large)", MAX_ELEMS);
        return -1;
    }
    if (grow((void **)&g->v, &g->cap, g->n + 1, sizeof *g->v)) {
        ps->err = st_fail(ST_ERR_NOMEM, "grammar: out of memory");
        return -1;
    }
    g->v[g->n++] = (st_gel){kind, arg};
    return 0;
}

static int append(parser *ps, gvec *dst, const gvec *src) {
    for (int32_t i = 0; i < src->n; i++)
        if (push(ps, dst, src->v[i].kind, src->v[i].arg))
            return -1;
    return 0;
}

/* A new rule (anonymous when name is NULL: named after base), or -1. */
static int32_t new_rule(parser *ps, const char *name, size_t len) {
    if (grow((void **)&ps->rules, &ps->cap_rules, ps->n_rules + 1, sizeof *ps->rules)) {
        ps->err = st_fail(ST_ERR_NOMEM, "grammar: out of memory");
        return -1;
    }
    brule *r = &ps->rules[ps->n_rules];
    memset(r, 0, sizeof *r);
    r->name = st_malloc(len + 1);
    if (!r->name) {
        ps->err = st_fail(ST_ERR_NOMEM, "grammar: out of memory");
        return -1;
    }
    memcpy(r->name, name, len);
    r->name[len] = 0;
    return ps->n_rules++;
}

static int32_t anon_rule(parser *ps) {
    char name[32];
    int n = snprintf(name, sizeof name, "(group %d)", ps->n_rules);
    int32_t r = new_rule(ps, name, (size_t)n);
    if (r >= 0)
        ps->rules[r].defined = 1;
    return r;
}

static int32_t find_rule(parser *ps, const char *name, size_t len) {
    for (int32_t i = 0; i < ps->n_rules; i++)
        if (strlen(ps->rules[i].name) == len && !memcmp(ps->rules[i].name, name, len))
            return i;
    return new_rule(ps, name, len);
}

/* Adds alternative a (moved) to rule r. */
static int add_alt(parser *ps, int32_t r, gvec *a) {
    brule *ru = &ps->rules[r];
    if (grow((void **)&ru->alts, &ru->cap_alts, ru->n_alts + 1, sizeof *ru->alts)) {
        ps->err = st_fail(ST_ERR_NOMEM, "grammar: out of memory");
        return -1;
    }
    ru->alts[ru->n_alts++] = *a;
    memset(a, 0, sizeof *a);
    return 0;
}

static int32_t new_set(parser *ps, const st_gset *s) {
    for (int32_t i = 0; i < ps->n_sets; i++)
        if (!memcmp(&ps->sets[i], s, sizeof *s))
            return i;
    if (grow((void **)&ps->sets, &ps->cap_sets, ps->n_sets + 1, sizeof *ps->sets)) {
        ps->err = st_fail(ST_ERR_NOMEM, "grammar: out of memory");
        return -1;
    }
    ps->sets[ps->n_sets] = *s;
    return ps->n_sets++;
}

static int push_byte_range(parser *ps, gvec *g, int lo, int hi) {
    st_gset s;
    memset(&s, 0, sizeof s);
    for (int b = lo; b <= hi; b++)
        s.bits[b >> 5] |= 1u << (b & 31);
    int32_t i = new_set(ps, &s);
    return i < 0 ? -1 : push(ps, g, ST_GEL_SET, i);
}

/* ---------------------------------------------------------------- lexing */

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* Skips spaces, tabs, comments and (when newline_ok) newlines. */
static void space(parser *ps, int newline_ok) {
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
            ps->p++;
        } else if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n')
                ps->p++;
        } else {
            break;
        }
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* One code point of a literal or class at ps->p (escapes included) into *cp; -1 on error. */
static int char_at(parser *ps, uint32_t *cp) {
    const char *at = ps->p;
    if (ps->p >= ps->end)
        FAIL(ps, at, "unexpected end of grammar");
    if (*ps->p == '\\') {
        if (++ps->p >= ps->end)
            FAIL(ps, at, "unexpected end of grammar after '\\'");
        char e = *ps->p++;
        int digits = 0;
        switch (e) {
        case 'n':
            *cp = '\n';
            return 0;
        case 'r':
            *cp = '\r';
            return 0;
        case 't':
            *cp = '\t';
            return 0;
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '\'':
            *cp = (uint8_t)e;
            return 0;
        case 'x':
            digits = 2;
            break;
        case 'u':
            digits = 4;
            break;
        case 'U':
            digits = 8;
            break;
        default:
            FAIL(ps, at, "unknown escape '\\%c'", e);
        }
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = ps->p < ps->end ? hexval(*ps->p) : -1;
            if (h < 0)
                FAIL(ps, at, "escape '\\%c' needs %d hexadecimal digits", e, digits);
            v = v * 16 + (uint32_t)h;
            ps->p++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            FAIL(ps, at, "escape names U+%X, not a Unicode scalar value", v);
        *cp = v;
        return 0;
    }
    int n = st_utf8_decode((const uint8_t *)ps->p, (size_t)(ps->end - ps->p), cp);
    if (*cp >= ST_CP_BAD)
        FAIL(ps, at, "invalid UTF-8 in the grammar text");
    ps->p += n;
    return 0;
}

static int utf8_encode(uint32_t cp, uint8_t *b) {
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (uint8_t)(0xC0 | (cp >> 6)), b[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (uint8_t)(0xE0 | (cp >> 12)), b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (uint8_t)(0xF0 | (cp >> 18)), b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)), b[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---------------------------------------------------------------- classes */

typedef struct cprange {
    uint32_t lo, hi;
} cprange;

/* The byte sequences of code points lo..hi (no surrogates, one encoded length... split here)
 * as alternatives of rule r; ASCII ranges go to *ascii instead. */
static int utf8_split(parser *ps, int32_t r, st_gset *ascii, uint32_t lo, uint32_t hi) {
    static const uint32_t lim[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= lim[i] && hi > lim[i])
            return utf8_split(ps, r, ascii, lo, lim[i]) || utf8_split(ps, r, ascii, lim[i] + 1, hi);
    if (hi <= 0x7F) {
        for (uint32_t b = lo; b <= hi; b++)
            ascii->bits[b >> 5] |= 1u << (b & 31);
        return 0;
    }
    uint8_t a[4], z[4];
    int n = utf8_encode(lo, a);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0)
                return utf8_split(ps, r, ascii, lo, lo | m) ||
                       utf8_split(ps, r, ascii, (lo | m) + 1, hi);
            if ((hi & m) != m)
                return utf8_split(ps, r, ascii, lo, (hi & ~m) - 1) ||
                       utf8_split(ps, r, ascii, hi & ~m, hi);
        }
    }
    utf8_encode(hi, z);
    gvec alt = {0};
    for (int i = 0; i < n; i++)
        if (push_byte_range(ps, &alt, a[i], z[i])) {
            st_free(alt.v);
            return -1;
        }
    return add_alt(ps, r, &alt);
}

/* Items for the code point ranges rg[0..n) (sorted, disjoint) into item. */
static int class_items(parser *ps, cprange *rg, int32_t n, gvec *item) {
    int ascii_only = 1;
    for (int32_t i = 0; i < n; i++)
        ascii_only &= rg[i].hi < 0x80;
    st_gset ascii;
    memset(&ascii, 0, sizeof ascii);
    if (ascii_only) {
        for (int32_t i = 0; i < n; i++)
            for (uint32_t b = rg[i].lo; b <= rg[i].hi; b++)
                ascii.bits[b >> 5] |= 1u << (b & 31);
        int32_t s = new_set(ps, &ascii);
        return s < 0 ? -1 : push(ps, item, ST_GEL_SET, s);
    }
    int32_t r = anon_rule(ps);
    if (r < 0)
        return -1;
    for (int32_t i = 0; i < n; i++) {
        uint32_t lo = rg[i].lo, hi = rg[i].hi; /* without the surrogates */
        if (lo <= 0xDFFF && hi >= 0xD800) {
            if (lo < 0xD800 && utf8_split(ps, r, &ascii, lo, 0xD7FF))
                return -1;
            if (hi > 0xDFFF && utf8_split(ps, r, &ascii, 0xE000, hi))
                return -1;
        } else if (utf8_split(ps, r, &ascii, lo, hi)) {
            return -1;
        }
    }
    static const st_gset none;
    if (memcmp(&ascii, &none, sizeof ascii)) {
        int32_t s = new_set(ps, &ascii);
        gvec alt = {0};
        if (s < 0 || push(ps, &alt, ST_GEL_SET, s) || add_alt(ps, r, &alt))
            return -1;
    }
    return push(ps, item, ST_GEL_REF, r);
}

static int cmp_range(const void *a, const void *b) {
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges rg[0..*n), complementing over all code points when negate. */
static int32_t normalize(cprange *rg, int32_t n, int negate, cprange *out) {
    qsort(rg, (size_t)n, sizeof *rg, cmp_range);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (m > 0 && rg[i].lo <= out[m - 1].hi + 1) {
            if (rg[i].hi > out[m - 1].hi)
                out[m - 1].hi = rg[i].hi;
        } else {
            out[m++] = rg[i];
        }
    }
    if (!negate)
        return m;
    int32_t k = 0;
    uint32_t next = 0;
    cprange tmp[130];
    for (int32_t i = 0; i < m; i++) {
        if (out[i].lo > next)
            tmp[k++] = (cprange){next, out[i].lo - 1};
        next = out[i].hi + 1;
    }
    if (next <= 0x10FFFF)
        tmp[k++] = (cprange){next, 0x10FFFF};
    memcpy(out, tmp, (size_t)k * sizeof *out);
    return k;
}

#define MAX_CLASS_RANGES 128

static int parse_class(parser *ps, gvec *item) {
    const char *at = ps->p++; /* '[' */
    int negate = 0;
    if (ps->p < ps->end && *ps->p == '^')
        negate = 1, ps->p++;
    cprange rg[MAX_CLASS_RANGES], merged[MAX_CLASS_RANGES + 2];
    int32_t n = 0;
    for (;;) {
        if (ps->p >= ps->end)
            FAIL(ps, at, "character class not closed with ']'");
        if (*ps->p == ']') {
            ps->p++;
            break;
        }
        if (n == MAX_CLASS_RANGES)
            FAIL(ps, at, "over %d ranges in one character class", MAX_CLASS_RANGES);
        uint32_t lo, hi;
        if (char_at(ps, &lo))
            return -1;
        hi = lo;
        if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
            ps->p++;
            if (char_at(ps, &hi))
                return -1;
            if (hi < lo)
                FAIL(ps, at, "character range U+%X-U+%X is reversed", lo, hi);
        }
        rg[n++] = (cprange){lo, hi};
    }
    if (n == 0 && !negate)
        FAIL(ps, at, "empty character class '[]' matches nothing");
    int32_t m = normalize(rg, n, negate, merged);
    if (m == 0)
        FAIL(ps, at, "character class matches nothing");
    return class_items(ps, merged, m, item);
}

/* ---------------------------------------------------------------- sequences */

static int parse_alternates(parser *ps, int32_t rule, int nested);

/* item repeated min..max times (max -1: unbounded), into seq. */
static int repeat(parser *ps, gvec *seq, gvec *item, int min, int max) {
    for (int i = 0; i < min; i++)
        if (append(ps, seq, item))
            return -1;
    if (max == min)
        return 0;
    if (max < 0) { /* R ::= item R | "" */
        int32_t r = anon_rule(ps);
        gvec a = {0}, e = {0};
        if (r < 0 || append(ps, &a, item) || push(ps, &a, ST_GEL_REF, r) || add_alt(ps, r, &a) ||
            add_alt(ps, r, &e))
            return -1;
        return push(ps, seq, ST_GEL_REF, r);
    }
    /* O_1 ::= item | "", O_k ::= item O_{k-1} | "" */
    int32_t prev = -1;
    for (int k = 1; k <= max - min; k++) {
        int32_t r = anon_rule(ps);
        gvec a = {0}, e = {0};
        if (r < 0 || append(ps, &a, item) || (prev >= 0 && push(ps, &a, ST_GEL_REF, prev)) ||
            add_alt(ps, r, &a) || add_alt(ps, r, &e))
            return -1;
        prev = r;
    }
    return push(ps, seq, ST_GEL_REF, prev);
}

static int parse_int(parser *ps, int *v) {
    const char *at = ps->p;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
        FAIL(ps, at, "expected a number in '{m,n}'");
    long x = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        x = x * 10 + (*ps->p++ - '0');
        if (x > MAX_REPEAT)
            FAIL(ps, at, "repetition count over %d", MAX_REPEAT);
    }
    *v = (int)x;
    return 0;
}

static int parse_sequence(parser *ps, gvec *seq, int nested) {
    for (;;) {
        space(ps, nested);
        if (ps->p >= ps->end)
            return 0;
        const char *at = ps->p;
        char c = *ps->p;
        gvec item = {0};
        int rc = 0;
        if (c == '"') {
            ps->p++;
            for (;;) {
                if (ps->p >= ps->end) {
                    st_free(item.v);
                    FAIL(ps, at, "string literal not closed with '\"'");
                }
                if (*ps->p == '"') {
                    ps->p++;
                    break;
                }
                uint32_t cp;
                uint8_t b[4];
                if (char_at(ps, &cp)) {
                    st_free(item.v);
                    return -1;
                }
                int nb = utf8_encode(cp, b);
                for (int i = 0; i < nb && !rc; i++)
                    rc = push_byte_range(ps, &item, b[i], b[i]);
                if (rc) {
                    st_free(item.v);
                    return -1;
                }
            }
        } else if (c == '[') {
            rc = parse_class(ps, &item);
        } else if (c == '.') {
            ps->p++;
            cprange any = {0, 0x10FFFF};
            rc = class_items(ps, &any, 1, &item);
        } else if (c == '(') {
            ps->p++;
            if (++ps->depth > MAX_NEST) {
                st_free(item.v);
                FAIL(ps, at, "groups nested over %d deep", MAX_NEST);
            }
            int32_t r = anon_rule(ps);
            rc = r < 0 || parse_alternates(ps, r, 1);
            ps->depth--;
            if (!rc) {
                space(ps, 1);
                if (ps->p >= ps->end || *ps->p != ')') {
                    st_free(item.v);
                    FAIL(ps, at, "group '(' not closed with ')'");
                }
                ps->p++;
                rc = push(ps, &item, ST_GEL_REF, r);
            }
        } else if (is_name_char(c)) {
            const char *name = ps->p;
            while (ps->p < ps->end && is_name_char(*ps->p))
                ps->p++;
            /* a name followed by ::= starts the next rule */
            const char *save = ps->p;
            space(ps, 0);
            if (ps->end - ps->p >= 3 && !memcmp(ps->p, "::=", 3)) {
                ps->p = name;
                return 0;
            }
            ps->p = save;
            int32_t r = find_rule(ps, name, (size_t)(save - name));
            if (r < 0)
                return -1;
            if (!ps->rules[r].used_at)
                ps->rules[r].used_at = name;
            rc = push(ps, &item, ST_GEL_REF, r);
        } else if (c == '<') {
            FAIL(ps, at, "token references '<...>' are not supported");
        } else {
            return 0; /* '|', ')', a newline or something the caller reports */
        }
        if (rc) {
            st_free(item.v);
            return -1;
        }
        /* postfix operators */
        space(ps, nested);
        int min = 1, max = 1;
        if (ps->p < ps->end && (*ps->p == '*' || *ps->p == '+' || *ps->p == '?')) {
            char op = *ps->p++;
            min = op == '+', max = op == '?' ? 1 : -1;
            if (op == '?')
                min = 0;
        } else if (ps->p < ps->end && *ps->p == '{') {
            const char *bat = ps->p++;
            space(ps, nested);
            if (parse_int(ps, &min)) {
                st_free(item.v);
                return -1;
            }
            space(ps, nested);
            max = min;
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                space(ps, nested);
                max = -1;
                if (ps->p < ps->end && *ps->p != '}' && parse_int(ps, &max)) {
                    st_free(item.v);
                    return -1;
                }
                space(ps, nested);
            }
            if (ps->p >= ps->end || *ps->p != '}') {
                st_free(item.v);
                FAIL(ps, bat, "repetition '{' not closed with '}'");
            }
            ps->p++;
            if (max >= 0 && max < min) {
                st_free(item.v);
                FAIL(ps, bat, "repetition {%d,%d} has max below min", min, max);
            }
        }
        if (ps->p < ps->end && (*ps->p == '*' || *ps->p == '+' || *ps->p == '?' || *ps->p == '{')) {
            st_free(item.v);
            FAIL(ps, ps->p, "two repetition operators in a row (group the item first)");
        }
        if (min == 1 && max == 1)
            rc = append(ps, seq, &item);
        else
            rc = repeat(ps, seq, &item, min, max);
        st_free(item.v);
        if (rc)
            return -1;
    }
}

static int parse_alternates(parser *ps, int32_t rule, int nested) {
    for (;;) {
        gvec seq = {0};
        if (parse_sequence(ps, &seq, nested) || add_alt(ps, rule, &seq)) {
            st_free(seq.v);
            return -1;
        }
        space(ps, nested);
        if (ps->p < ps->end && *ps->p == '|') {
            ps->p++;
            space(ps, 1);
            continue;
        }
        return 0;
    }
}

static int parse_rule(parser *ps) {
    const char *at = ps->p;
    const char *name = ps->p;
    while (ps->p < ps->end && is_name_char(*ps->p))
        ps->p++;
    if (ps->p == name)
        FAIL(ps, at, "expected a rule name, found '%c'", *at);
    size_t len = (size_t)(ps->p - name);
    space(ps, 0);
    if (ps->end - ps->p < 3 || memcmp(ps->p, "::=", 3))
        FAIL(ps, ps->p, "expected '::=' after rule name '%.*s'", (int)len, name);
    ps->p += 3;
    int32_t r = find_rule(ps, name, len);
    if (r < 0)
        return -1;
    if (ps->rules[r].defined)
        FAIL(ps, at, "rule '%.*s' is defined twice", (int)len, name);
    ps->rules[r].defined = 1;
    space(ps, 1);
    if (parse_alternates(ps, r, 0))
        return -1;
    space(ps, 0);
    if (ps->p < ps->end && *ps->p != '\n' && *ps->p != '\r') {
        if (*ps->p == ')')
            FAIL(ps, ps->p, "unmatched ')'");
        FAIL(ps, ps->p, "unexpected '%c' in rule '%.*s'", *ps->p, (int)len, name);
    }
    return 0;
}

/* ---------------------------------------------------------------- checks */

/* Rules that can match the empty string, by fixpoint. */
static void nullable(const parser *ps, uint8_t *nul) {
    int changed = 1;
    while (changed) {
        changed = 0;
        for (int32_t r = 0; r < ps->n_rules; r++) {
            if (nul[r])
                continue;
            for (int32_t a = 0; a < ps->rules[r].n_alts && !nul[r]; a++) {
                const gvec *g = &ps->rules[r].alts[a];
                int32_t i = 0;
                while (i < g->n && g->v[i].kind == ST_GEL_REF && nul[g->v[i].arg])
                    i++;
                if (i == g->n)
                    nul[r] = 1, changed = 1;
            }
        }
    }
}

/* Depth-first search for a rule that reaches itself before consuming a byte: 1 found (error set).
 */
static int left_rec(parser *ps, int32_t r, const uint8_t *nul, uint8_t *color) {
    if (color[r] == 2)
        return 0;
    if (color[r] == 1) {
        ps->err = st_fail(ST_ERR_INVALID,
                          "grammar: rule '%s' is left-recursive (it can reach itself without "
                          "consuming input, e.g. a repetition of something that can be empty)",
                          ps->rules[r].name);
        return 1;
    }
    color[r] = 1;
    for (int32_t a = 0; a < ps->rules[r].n_alts; a++) {
        const gvec *g = &ps->rules[r].alts[a];
        for (int32_t i = 0; i < g->n && g->v[i].kind == ST_GEL_REF; i++) {
            if (left_rec(ps, g->v[i].arg, nul, color))
                return 1;
            if (!nul[g->v[i].arg])
                break;
        }
    }
    color[r] = 2;
    return 0;
}

static void parser_free(parser *ps) {
    for (int32_t r = 0; r < ps->n_rules; r++) {
        for (int32_t a = 0; a < ps->rules[r].n_alts; a++)
            st_free(ps->rules[r].alts[a].v);
        st_free(ps->rules[r].alts);
        st_free(ps->rules[r].name);
    }
    st_free(ps->rules);
    st_free(ps->sets);
}

void st_grammar_free(st_grammar *g) {
    if (!g)
        return;
    st_free(g->el);
    st_free(g->sets);
    st_free(g->alt_off);
    st_free(g->alts);
    st_free(g);
}

st_status st_grammar_parse(const char *text, size_t len, st_grammar **out) {
    if (!out || (!text && len))
        return st_fail(ST_ERR_INVALID, "st_grammar_parse: bad argument");
    *out = NULL;
    if (len > (64u << 20))
        return st_fail(ST_ERR_INVALID, "grammar: text over 64 MiB");
    parser ps = {.s = text, .p = text, .end = text + len};
    st_grammar *g = NULL;
    uint8_t *nul = NULL, *color = NULL;
    for (;;) {
        space(&ps, 1);
        if (ps.p >= ps.end)
            break;
        if (parse_rule(&ps))
            goto fail;
    }
    int32_t root = -1;
    for (int32_t r = 0; r < ps.n_rules; r++) {
        if (!ps.rules[r].defined) {
            const char *at = ps.rules[r].used_at ? ps.rules[r].used_at : text;
            int line, col;
            where(&ps, at, &line, &col);
            ps.err = st_fail(ST_ERR_INVALID, "grammar: line %d, column %d: undefined rule '%s'",
                             line, col, ps.rules[r].name);
            goto fail;
        }
        if (!strcmp(ps.rules[r].name, "root"))
            root = r;
    }
    if (root < 0) {
        ps.err = st_fail(ST_ERR_INVALID, "grammar: no rule named 'root'");
        goto fail;
    }
    nul = st_calloc((size_t)ps.n_rules, 1);
    color = st_calloc((size_t)ps.n_rules, 1);
    g = st_calloc(1, sizeof *g);
    if (!nul || !color || !g) {
        ps.err = st_fail(ST_ERR_NOMEM, "grammar: out of memory");
        goto fail;
    }
    nullable(&ps, nul);
    for (int32_t r = 0; r < ps.n_rules; r++)
        if (left_rec(&ps, r, nul, color))
            goto fail;
    int64_t n_el = 0, n_alts = 0;
    for (int32_t r = 0; r < ps.n_rules; r++)
        for (int32_t a = 0; a < ps.rules[r].n_alts; a++, n_alts++)
            n_el += ps.rules[r].alts[a].n + 1;
    g->el = st_malloc((size_t)(n_el + 1) * sizeof *g->el);
    g->alt_off = st_malloc((size_t)(ps.n_rules + 1) * sizeof *g->alt_off);
    g->alts = st_malloc((size_t)(n_alts + 1) * sizeof *g->alts);
    g->sets = st_malloc((size_t)(ps.n_sets + 1) * sizeof *g->sets);
    if (!g->el || !g->alt_off || !g->alts || !g->sets) {
        ps.err = st_fail(ST_ERR_NOMEM, "grammar: out of memory");
        goto fail;
    }
    if (ps.n_sets)
        memcpy(g->sets, ps.sets, (size_t)ps.n_sets * sizeof *g->sets);
    g->n_sets = ps.n_sets;
    g->n_rules = ps.n_rules;
    g->root = root;
    int32_t e = 0, k = 0;
    for (int32_t r = 0; r < ps.n_rules; r++) {
        g->alt_off[r] = k;
        for (int32_t a = 0; a < ps.rules[r].n_alts; a++) {
            g->alts[k++] = e;
            const gvec *v = &ps.rules[r].alts[a];
            if (v->n)
                memcpy(g->el + e, v->v, (size_t)v->n * sizeof *v->v);
            e += v->n;
            g->el[e++] = (st_gel){ST_GEL_END, 0};
        }
    }
    g->alt_off[ps.n_rules] = k;
    g->n_el = e;
    st_free(nul);
    st_free(color);
    parser_free(&ps);
    *out = g;
    return ST_OK;
fail:
    st_free(nul);
    st_free(color);
    st_grammar_free(g);
    parser_free(&ps);
    return ps.err ? ps.err : st_fail(ST_ERR_INVALID, "grammar: invalid");
}
