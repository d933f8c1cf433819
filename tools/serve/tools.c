/*
 * tools.c: OpenAI tool calling for `spectree serve` (api.h): the request's tools, tool_choice
 * and parallel_tool_calls checked; assistant tool_calls and tool messages read; the grammar that
 * forces a template's call syntax (tool_choice required or a named function) built from the
 * JSON-schema converter of src/grammar; and the calls parsed back out of a generated answer as
 * each template writes them (tmpl.c renders them into the prompt; docs/SERVING.md has the text).
 */
#define _POSIX_C_SOURCE 200809L
#include "api.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SRV_MAX_TOOLS = 128, SRV_MAX_NAME = 64 };

/* JSON as the templates' tojson writes it (", " and ": "; 15 significant digits, so 0.1 reads
 * 0.1 as Python writes it); indent 4 for Llama 3.1's function list. */
#define TOJSON (JSON_ENCODE_ANY | JSON_REAL_PRECISION(15))

static int fail(char *err, char *param, const char *field, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, SRV_ERR_CAP, fmt, ap);
    va_end(ap);
    snprintf(param, SRV_ERR_CAP, "%s", field ? field : "");
    return -1;
}

static char *dup_json_str(const json_t *v) {
    size_t n = json_string_length(v);
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, json_string_value(v), n);
        s[n] = 0;
    }
    return s;
}

/* OpenAI's rule for function names: 1..64 of a-z, A-Z, 0-9, _ and -. */
static int good_name(const char *s, size_t n) {
    if (n == 0 || n > SRV_MAX_NAME)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* Mistral v0.3's rendering of a tool: {"type": "function", "function": {...}} with each of the
 * function's fields but "return" as "key": "value" for a string (as it is, not escaped: the
 * template concatenates it) and "key": tojson(value) otherwise. */
static char *mistral_tool(const json_t *fn) {
    size_t cap = 256, n = 0;
    char *b = malloc(cap);
    const char *k;
    const json_t *v;
    int first = 1;
    if (!b)
        return NULL;
    n = (size_t)snprintf(b, cap, "{\"type\": \"function\", \"function\": {");
    json_object_foreach((json_t *)fn, k, v) {
        if (!strcmp(k, "return"))
            continue;
        char *val = json_is_string(v) ? NULL : json_dumps(v, TOJSON);
        const char *vs = val ? val : json_string_value(v);
        size_t need = n + strlen(k) + strlen(vs ? vs : "") + 16;
        if (need > cap) {
            char *nb = realloc(b, cap = need * 2);
            if (!nb) {
                free(val), free(b);
                return NULL;
            }
            b = nb;
        }
        n += (size_t)snprintf(b + n, cap - n, "%s\"%s\": %s%s%s", first ? "" : ", ", k,
                              val ? "" : "\"", vs ? vs : "", val ? "" : "\"");
        first = 0;
        free(val);
    }
    if (n + 3 > cap) {
        char *nb = realloc(b, n + 3);
        if (!nb) {
            free(b);
            return NULL;
        }
        b = nb;
    }
    memcpy(b + n, "}}", 3);
    return b;
}

static int get_tool(const json_t *t, size_t i, srv_tool *out, char *err, char *param) {
    char f[64];
    snprintf(f, sizeof f, "tools[%zu]", i);
    if (!json_is_object(t))
        return fail(err, param, f, "'%s' must be an object", f);
    const char *k;
    const json_t *v, *fn = NULL;
    json_object_foreach((json_t *)t, k, v) {
        if (!strcmp(k, "type")) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "function") != 0) {
                snprintf(f, sizeof f, "tools[%zu].type", i);
                return fail(err, param, f, "'%s' must be \"function\"", f);
            }
        } else if (!strcmp(k, "function")) {
            fn = v;
        } else {
            return fail(err, param, f, "'%s': unknown field '%s'", f, k);
        }
    }
    if (!json_object_get(t, "type")) {
        snprintf(f, sizeof f, "tools[%zu].type", i);
        return fail(err, param, f, "'%s' is required (\"function\")", f);
    }
    snprintf(f, sizeof f, "tools[%zu].function", i);
    if (!json_is_object(fn))
        return fail(err, param, f, "'%s' must be an object with a 'name'", f);
    const json_t *name = NULL, *params = NULL;
    json_object_foreach((json_t *)fn, k, v) {
        snprintf(f, sizeof f, "tools[%zu].function.%.20s", i, k);
        if (!strcmp(k, "name"))
            name = v;
        else if (!strcmp(k, "parameters"))
            params = v;
        else if (!strcmp(k, "description")) {
            if (!json_is_string(v))
                return fail(err, param, f, "'%s' must be a string", f);
        } else if (!strcmp(k, "strict")) {
            if (!json_is_boolean(v) && !json_is_null(v))
                return fail(err, param, f, "'%s' must be a boolean", f);
        } else {
            snprintf(f, sizeof f, "tools[%zu].function", i);
            return fail(err, param, f, "'%s': unknown field '%s'", f, k);
        }
    }
    snprintf(f, sizeof f, "tools[%zu].function.name", i);
    if (!json_is_string(name) || !good_name(json_string_value(name), json_string_length(name)))
        return fail(err, param, f, "'%s' must be a string of 1 to %d letters, digits, _ or -", f,
                    SRV_MAX_NAME);
    snprintf(f, sizeof f, "tools[%zu].function.parameters", i);
    if (params && !json_is_null(params) && !json_is_object(params))
        return fail(err, param, f, "'%s' must be a JSON schema object", f);
    out->name = dup_json_str(name);
    out->json = json_dumps(t, TOJSON);
    out->json4 = json_dumps(t, TOJSON | JSON_INDENT(4));
    out->mistral = mistral_tool(fn);
    if (params && !json_is_null(params))
        out->params = json_dumps(params, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!out->name || !out->json || !out->json4 || !out->mistral ||
        (params && !json_is_null(params) && !out->params))
        return fail(err, param, NULL, "out of memory");
    return 0;
}

static int get_tools(const json_t *v, srv_request *r, char *err, char *param) {
    if (!json_is_array(v))
        return fail(err, param, "tools", "'tools' must be an array, not %s",
                    json_is_object(v) ? "an object" : "a scalar");
    size_t n = json_array_size(v);
    if (n > SRV_MAX_TOOLS)
        return fail(err, param, "tools", "at most %d tools", SRV_MAX_TOOLS);
    if (n == 0)
        return 0;
    r->tools = calloc(n, sizeof *r->tools);
    if (!r->tools)
        return fail(err, param, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        r->n_tools = (int)i + 1;
        if (get_tool(json_array_get(v, i), i, &r->tools[i], err, param))
            return -1;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(r->tools[j].name, r->tools[i].name)) {
                char f[64];
                snprintf(f, sizeof f, "tools[%zu].function.name", i);
                return fail(err, param, f, "'%s': tools[%zu] has the name '%s' too", f, j,
                            r->tools[i].name);
            }
    }
    return 0;
}

static int get_choice(const json_t *v, srv_request *r, char *err, char *param) {
    const char *k = "tool_choice";
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "none"))
            r->tool_choice = SRV_TOOLS_NONE;
        else if (!strcmp(s, "auto"))
            r->tool_choice = SRV_TOOLS_AUTO;
        else if (!strcmp(s, "required"))
            r->tool_choice = SRV_TOOLS_REQUIRED;
        else
            return fail(err, param, k,
                        "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                        "\"function\", \"function\": {\"name\": NAME}}, not \"%.40s\"",
                        s);
        return 0;
    }
    const json_t *t = json_object_get(v, "type"), *fn = json_object_get(v, "function");
    const json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
    if (!json_is_object(v) || json_object_size(v) != 2 || !json_is_string(t) ||
        strcmp(json_string_value(t), "function") != 0 || !json_is_string(name) ||
        json_object_size(fn) != 1)
        return fail(err, param, k,
                    "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                    "\"function\", \"function\": {\"name\": NAME}}");
    free(r->tool_choice_name);
    r->tool_choice_name = dup_json_str(name);
    if (!r->tool_choice_name)
        return fail(err, param, NULL, "out of memory");
    r->tool_choice = SRV_TOOLS_NAMED;
    return 0;
}

int srv_tools_field(const char *k, const void *vp, srv_request *r, char *err, char *param) {
    const json_t *v = vp;
    if (strcmp(k, "tools") && strcmp(k, "tool_choice") && strcmp(k, "parallel_tool_calls"))
        return 1;
    if (json_is_null(v))
        return 0;
    if (!strcmp(k, "tools"))
        return get_tools(v, r, err, param);
    if (!strcmp(k, "tool_choice"))
        return get_choice(v, r, err, param);
    if (!json_is_boolean(v))
        return fail(err, param, k, "'parallel_tool_calls' must be a boolean");
    r->parallel_calls = json_is_true(v);
    return 0;
}

int srv_tools_check(srv_request *r, char *err, char *param) {
    if (r->tool_choice == SRV_TOOLS_REQUIRED && r->n_tools == 0)
        return fail(err, param, "tool_choice", "'tool_choice' \"required\" needs 'tools'");
    if (r->tool_choice != SRV_TOOLS_NAMED)
        return 0;
    for (int i = 0; i < r->n_tools; i++)
        if (!strcmp(r->tools[i].name, r->tool_choice_name)) {
            r->tool_named = i;
            return 0;
        }
    return fail(err, param, "tool_choice",
                "'tool_choice' names the function '%.64s', which is "
                "not in 'tools'",
                r->tool_choice_name);
}

/* An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
 * "arguments": a string of a JSON object}}]. */
static int get_calls(const json_t *v, size_t i, srv_msg *m, char *err, char *param) {
    char f[96];
    snprintf(f, sizeof f, "messages[%zu].tool_calls", i);
    if (!json_is_array(v))
        return fail(err, param, "messages", "'%s' must be an array", f);
    size_t n = json_array_size(v);
    if (n > SRV_MAX_TOOLS)
        return fail(err, param, "messages", "'%s' has more than %d calls", f, SRV_MAX_TOOLS);
    if (n == 0)
        return 0;
    m->calls = calloc(n, sizeof *m->calls);
    if (!m->calls)
        return fail(err, param, NULL, "out of memory");
    for (size_t c = 0; c < n; c++) {
        const json_t *e = json_array_get(v, c);
        snprintf(f, sizeof f, "messages[%zu].tool_calls[%zu]", i, c);
        const json_t *id = json_object_get(e, "id"), *t = json_object_get(e, "type");
        const json_t *fn = json_object_get(e, "function");
        const json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        if (!json_is_object(e) || !json_is_string(id) || !json_is_string(t) ||
            strcmp(json_string_value(t), "function") != 0 || !json_is_object(fn) ||
            !json_is_string(name) || !json_is_string(args))
            return fail(err, param, "messages",
                        "'%s' must be {\"id\": STRING, \"type\": \"function\", \"function\": "
                        "{\"name\": STRING, \"arguments\": STRING}}",
                        f);
        json_error_t je;
        json_t *a = json_loadb(json_string_value(args), json_string_length(args), 0, &je);
        if (!json_is_object(a)) {
            json_decref(a);
            return fail(err, param, "messages",
                        "'%s.function.arguments' must be a JSON object "
                        "in a string",
                        f);
        }
        m->n_calls = (int)c + 1;
        m->calls[c].id = dup_json_str(id);
        m->calls[c].name = dup_json_str(name);
        m->calls[c].args = json_dumps(a, TOJSON);
        json_decref(a);
        if (!m->calls[c].id || !m->calls[c].name || !m->calls[c].args)
            return fail(err, param, NULL, "out of memory");
    }
    return 0;
}

int srv_msg_tool_field(const char *k, const void *vp, size_t i, srv_msg *m, char *err,
                       char *param) {
    const json_t *v = vp;
    if (!strcmp(k, "tool_calls"))
        return json_is_null(v) ? 0 : get_calls(v, i, m, err, param);
    if (strcmp(k, "tool_call_id"))
        return 1;
    if (!json_is_string(v))
        return fail(err, param, "messages", "messages[%zu].tool_call_id must be a string", i);
    free(m->call_id);
    m->call_id = dup_json_str(v);
    return m->call_id ? 0 : fail(err, param, NULL, "out of memory");
}

void srv_calls_free(srv_call *calls, int n) {
    for (int i = 0; calls && i < n; i++) {
        free(calls[i].id);
        free(calls[i].name);
        free(calls[i].args);
    }
    free(calls);
}

void srv_msg_free(srv_msg *m) {
    free(m->content);
    srv_calls_free(m->calls, m->n_calls);
    free(m->call_id);
}

void srv_tools_free(srv_request *r) {
    for (int i = 0; r->tools && i < r->n_tools; i++) {
        free(r->tools[i].name);
        free(r->tools[i].json);
        free(r->tools[i].json4);
        free(r->tools[i].mistral);
        free(r->tools[i].params);
    }
    free(r->tools);
    free(r->tool_choice_name);
    r->tools = NULL;
    r->n_tools = 0;
    r->tool_choice_name = NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* The grammar of a forced call                                                              */

typedef struct gbuf {
    char *p;
    size_t n, cap;
    int oom;
} gbuf;

static void gput(gbuf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t c = (b->n + n + 1) * 2;
        char *q = realloc(b->p, c);
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

static void gputs(gbuf *b, const char *s) { gput(b, s, strlen(s)); }

static int name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* GBNF text g with every rule name prefixed by pfx (so that several schemas' grammars, each
 * with its own root, ws, string, ..., live in one grammar): literals, classes, repetition
 * bounds and comments are copied as they are. */
static void put_renamed(gbuf *b, const char *g, const char *pfx) {
    size_t n = strlen(g), i = 0;
    while (i < n) {
        char c = g[i];
        size_t j = i + 1;
        if (c == '"' || c == '[') {
            const char end = c == '"' ? '"' : ']';
            while (j < n && g[j] != end)
                j += g[j] == '\\' && j + 1 < n ? 2 : 1;
            j = j < n ? j + 1 : n;
        } else if (c == '{') {
            while (j < n && g[j] != '}')
                j++;
            j = j < n ? j + 1 : n;
        } else if (c == '#') {
            while (j < n && g[j] != '\n')
                j++;
        } else if (name_char(c)) {
            while (j < n && name_char(g[j]))
                j++;
            gputs(b, pfx);
        }
        gput(b, g + i, j - i);
        i = j;
    }
    if (n && g[n - 1] != '\n')
        gputs(b, "\n");
}

int srv_tools_grammar(srv_tmpl t, const srv_request *r, char **out, char *err) {
    *out = NULL;
    const char *open, *args_key, *close, *sep, *list_open = "", *list_close = "";
    int max_calls = r->parallel_calls ? SRV_MAX_CALLS : 1;
    switch (t) {
    case SRV_TMPL_CHATML:
        open = "<tool_call>\\n{\\\"name\\\": \\\"", args_key = "arguments";
        close = "}\\n</tool_call>", sep = "\\n";
        break;
    case SRV_TMPL_LLAMA3: /* Llama 3.1's template writes one call per assistant message */
        open = "{\\\"name\\\": \\\"", args_key = "parameters", close = "}", sep = "";
        max_calls = 1;
        break;
    case SRV_TMPL_MISTRAL:
        open = "{\\\"name\\\": \\\"", args_key = "arguments", close = "}", sep = ", ";
        list_open = "[TOOL_CALLS] [", list_close = "]";
        break;
    default:
        snprintf(err, SRV_ERR_CAP, "the chat template %s has no tool calling", srv_tmpl_name(t));
        return -1;
    }
    gbuf b = {0};
    char line[256];
    gputs(&b, "root ::= ");
    if (*list_open) {
        snprintf(line, sizeof line, "\"%s\" ", list_open);
        gputs(&b, line);
    }
    gputs(&b, "call");
    if (max_calls > 1) {
        snprintf(line, sizeof line, " (\"%s\" call){0,%d}", sep, max_calls - 1);
        gputs(&b, line);
    }
    if (*list_close) {
        snprintf(line, sizeof line, " \"%s\"", list_close);
        gputs(&b, line);
    }
    gputs(&b, "\ncall ::= ");
    int first = 1;
    for (int k = 0; k < r->n_tools; k++) {
        if (r->tool_choice == SRV_TOOLS_NAMED && k != r->tool_named)
            continue;
        snprintf(line, sizeof line, "%st%d-call", first ? "" : " | ", k);
        gputs(&b, line);
        first = 0;
    }
    gputs(&b, "\n");
    for (int k = 0; k < r->n_tools; k++) {
        if (r->tool_choice == SRV_TOOLS_NAMED && k != r->tool_named)
            continue;
        const srv_tool *tl = &r->tools[k];
        char *conv = NULL;
        if (tl->params && st_json_schema_to_gbnf(tl->params, strlen(tl->params), &conv)) {
            snprintf(err, SRV_ERR_CAP, "'tools[%d].function.parameters': %s", k, st_last_error());
            free(b.p);
            return -1;
        }
        char pfx[16];
        snprintf(pfx, sizeof pfx, "t%d-", k);
        put_renamed(&b, conv ? conv : st_grammar_json_object(), pfx);
        st_grammar_text_free(conv);
        snprintf(line, sizeof line, "t%d-call ::= \"%s%s\\\", \\\"%s\\\": \" t%d-root \"%s\"\n", k,
                 open, tl->name, args_key, k, close);
        gputs(&b, line);
    }
    if (b.oom) {
        free(b.p);
        snprintf(err, SRV_ERR_CAP, "out of memory");
        return -1;
    }
    *out = b.p;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Calls in an answer                                                                        */

static int blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_blank(const char *s, size_t i, size_t n) {
    while (i < n && blank(s[i]))
        i++;
    return i;
}

static size_t trim_end(const char *s, size_t n) {
    while (n && blank(s[n - 1]))
        n--;
    return n;
}

static size_t find(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, needle, k))
            return i;
    return n;
}

static int starts(const char *s, size_t i, size_t n, const char *lit) {
    size_t k = strlen(lit);
    return i + k <= n && !memcmp(s + i, lit, k);
}

/* One JSON value at s[*i..n), *i moved past it; NULL when there is none. */
static json_t *json_at(const char *s, size_t *i, size_t n) {
    json_error_t je;
    json_t *v = json_loadb(s + *i, n - *i, JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES, &je);
    if (v)
        *i += (size_t)je.position;
    return v;
}

typedef struct calls {
    srv_call *c;
    int n, cap, oom;
} calls;

/* A call object {"name": NAME, args_key: {...}} (alt_key also accepted) of a name in tools
 * appended; 0 when v is no such call. */
static int add_call(calls *cs, const json_t *v, const char *args_key, const char *alt_key,
                    const srv_tool *tools, int n_tools) {
    const json_t *name = json_object_get(v, "name"), *args = json_object_get(v, args_key);
    if (!args && alt_key)
        args = json_object_get(v, alt_key);
    if (!json_is_object(v) || !json_is_string(name) || !json_is_object(args))
        return 0;
    int known = 0;
    for (int k = 0; k < n_tools; k++)
        known |= !strcmp(tools[k].name, json_string_value(name));
    if (!known)
        return 0;
    if (cs->n == cs->cap) {
        int cap = cs->cap ? 2 * cs->cap : 4;
        srv_call *p = realloc(cs->c, (size_t)cap * sizeof *p);
        if (!p) {
            cs->oom = 1;
            return 0;
        }
        cs->c = p, cs->cap = cap;
    }
    srv_call *c = &cs->c[cs->n++];
    c->id = NULL;
    c->name = dup_json_str(name);
    c->args = json_dumps(args, TOJSON);
    if (!c->name || !c->args)
        cs->oom = 1;
    return 1;
}

/* Qwen 2.5: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one or more. */
static int parse_chatml(calls *cs, const char *s, size_t i, size_t n, const srv_tool *tools,
                        int n_tools) {
    while ((i = skip_blank(s, i, n)) < n) {
        if (!starts(s, i, n, "<tool_call>"))
            return 0;
        i = skip_blank(s, i + strlen("<tool_call>"), n);
        json_t *v = json_at(s, &i, n);
        int ok = v && add_call(cs, v, "arguments", NULL, tools, n_tools);
        json_decref(v);
        i = skip_blank(s, i, n);
        if (!ok || !starts(s, i, n, "</tool_call>"))
            return 0;
        i += strlen("</tool_call>");
    }
    return 1;
}

/* Llama 3.1: {"name": ..., "parameters": {...}} (calls separated by ';'). */
static int parse_llama3(calls *cs, const char *s, size_t i, size_t n, const srv_tool *tools,
                        int n_tools) {
    for (;;) {
        i = skip_blank(s, i, n);
        json_t *v = i < n && s[i] == '{' ? json_at(s, &i, n) : NULL;
        int ok = v && add_call(cs, v, "parameters", "arguments", tools, n_tools);
        json_decref(v);
        if (!ok)
            return 0;
        i = skip_blank(s, i, n);
        if (i == n)
            return 1;
        if (s[i] != ';')
            return 0;
        i++;
    }
}

/* Mistral: [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]. */
static int parse_mistral(calls *cs, const char *s, size_t i, size_t n, const srv_tool *tools,
                         int n_tools) {
    i = skip_blank(s, i, n);
    json_t *v = i < n && s[i] == '[' ? json_at(s, &i, n) : NULL;
    int ok = json_is_array(v) && json_array_size(v) > 0;
    for (size_t k = 0; ok && k < json_array_size(v); k++)
        ok = add_call(cs, json_array_get(v, k), "arguments", NULL, tools, n_tools);
    json_decref(v);
    return ok && skip_blank(s, i, n) == n;
}

/* Where a call may begin in text: its template's marker, or the answer's first non-blank byte
 * when that is '{' (Llama 3) or '[' (Mistral): <|python_tag|> and [TOOL_CALLS] are control
 * tokens in those models' vocabularies, which decode to no text. */
static const char *marker(srv_tmpl t) {
    return t == SRV_TMPL_CHATML    ? "<tool_call>"
           : t == SRV_TMPL_MISTRAL ? "[TOOL_CALLS]"
           : t == SRV_TMPL_LLAMA3  ? "<|python_tag|>"
                                   : NULL;
}

int srv_tools_parse(srv_tmpl t, const srv_tool *tools, int n_tools, const char *text, size_t n,
                    size_t *content_len, srv_call **out) {
    *content_len = n;
    *out = NULL;
    const char *mk = marker(t);
    if (!mk || n_tools == 0)
        return 0;
    size_t at = find(text, n, mk), body = at + strlen(mk), b = skip_blank(text, 0, n);
    if (at == n && b < n && text[b] == (t == SRV_TMPL_LLAMA3 ? '{' : '[') && t != SRV_TMPL_CHATML)
        at = body = 0;
    if (at == n)
        return 0;
    calls cs = {0};
    int ok = t == SRV_TMPL_CHATML    ? parse_chatml(&cs, text, at, n, tools, n_tools)
             : t == SRV_TMPL_MISTRAL ? parse_mistral(&cs, text, body, n, tools, n_tools)
                                     : parse_llama3(&cs, text, body, n, tools, n_tools);
    if (cs.oom) {
        srv_calls_free(cs.c, cs.n);
        return -1;
    }
    if (!ok || cs.n == 0) {
        srv_calls_free(cs.c, cs.n);
        return 0;
    }
    *content_len = trim_end(text, at);
    *out = cs.c;
    return cs.n;
}

size_t srv_tools_safe_prefix(srv_tmpl t, const char *text, size_t n) {
    const char *mk = marker(t);
    if (!mk)
        return n;
    if (t != SRV_TMPL_CHATML) {
        size_t b = skip_blank(text, 0, n);
        if (b == n || text[b] == (t == SRV_TMPL_LLAMA3 ? '{' : '['))
            return 0;
    }
    size_t at = find(text, n, mk), k = strlen(mk);
    if (at == n) /* a tail that may begin the marker */
        for (size_t from = n > k ? n - k + 1 : 0; from < n; from++)
            if (!memcmp(text + from, mk, n - from)) {
                at = from;
                break;
            }
    return trim_end(text, at);
}
