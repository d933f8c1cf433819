/*
 * api.c: request checking for `spectree serve` (api.h; the stop strings are stop.c's, the chat
 * templates tmpl.c's, the tool-calling fields tools.c's). Request bodies (OpenAI's completions
 * and chat, SGLang's /generate) are parsed by jansson; every field is checked for its type and
 * range here so that the server only ever sees a well-formed srv_request.
 */
#define _POSIX_C_SOURCE 200809L
#include "api.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Request parsing                                                                           */

static int fail(char *err, char *param, const char *field, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, SRV_ERR_CAP, fmt, ap);
    va_end(ap);
    snprintf(param, SRV_ERR_CAP, "%s", field ? field : "");
    return -1;
}

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

/* A number field in [lo, hi]; JSON integers and reals both count. Its value is shown in the
 * shortest decimal that reads back as it (100.0001 as sent, where %g prints 100). */
static int get_number(const json_t *v, const char *k, double lo, double hi, double *out, char *err,
                      char *param) {
    if (!json_is_number(v))
        return fail(err, param, k, "'%s' must be a number, not %s", k, type_name(v));
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) {
        char got[32];
        for (int digits = 1; digits <= 17; digits++) {
            snprintf(got, sizeof got, "%.*g", digits, x);
            if (strtod(got, NULL) == x)
                break;
        }
        return fail(err, param, k, "'%s' must be in [%g, %g], got %s", k, lo, hi, got);
    }
    *out = x;
    return 0;
}

static int get_int(const json_t *v, const char *k, json_int_t lo, json_int_t hi, json_int_t *out,
                   char *err, char *param) {
    if (!json_is_integer(v))
        return fail(err, param, k, "'%s' must be an integer, not %s", k, type_name(v));
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return fail(err, param, k, "'%s' must be in [%lld, %lld], got %lld", k, (long long)lo,
                    (long long)hi, (long long)x);
    *out = x;
    return 0;
}

static int get_bool(const json_t *v, const char *k, int *out, char *err, char *param) {
    if (!json_is_boolean(v))
        return fail(err, param, k, "'%s' must be a boolean, not %s", k, type_name(v));
    *out = json_is_true(v);
    return 0;
}

static char *dup_str(const json_t *v, size_t *len) {
    size_t n = json_string_length(v);
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, json_string_value(v), n);
        s[n] = 0;
    }
    if (len)
        *len = n;
    return s;
}

/* Message content: a string, or an array of {"type": "text", "text": ...} parts, joined. */
static int get_content(const json_t *v, srv_msg *m, char *err, char *param) {
    if (json_is_string(v)) {
        m->content = dup_str(v, &m->len);
        return m->content ? 0 : fail(err, param, NULL, "out of memory");
    }
    if (!json_is_array(v))
        return fail(err, param, "messages",
                    "message 'content' must be a string or an array of "
                    "text parts, not %s",
                    type_name(v));
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(v, i, part) {
        const json_t *ty = json_object_get(part, "type"), *tx = json_object_get(part, "text");
        if (!json_is_object(part) || json_object_size(part) != 2 || !json_is_string(ty) ||
            strcmp(json_string_value(ty), "text") != 0 || !json_is_string(tx))
            return fail(err, param, "messages",
                        "content parts must be {\"type\": \"text\", \"text\": STRING} (only "
                        "text is supported)");
        total += json_string_length(tx);
    }
    m->content = malloc(total + 1);
    if (!m->content)
        return fail(err, param, NULL, "out of memory");
    m->len = 0;
    json_array_foreach(v, i, part) {
        const json_t *tx = json_object_get(part, "text");
        memcpy(m->content + m->len, json_string_value(tx), json_string_length(tx));
        m->len += json_string_length(tx);
    }
    m->content[m->len] = 0;
    return 0;
}

static int get_messages(const json_t *v, srv_request *r, char *err, char *param) {
    if (!json_is_array(v))
        return fail(err, param, "messages", "'messages' must be an array, not %s", type_name(v));
    size_t n = json_array_size(v);
    if (n == 0)
        return fail(err, param, "messages", "'messages' must not be empty");
    if (n > SRV_MAX_MESSAGES)
        return fail(err, param, "messages", "at most %d messages", SRV_MAX_MESSAGES);
    r->msgs = calloc(n, sizeof *r->msgs);
    if (!r->msgs)
        return fail(err, param, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(v, i);
        r->n_msgs = (int)i + 1;
        if (!json_is_object(m))
            return fail(err, param, "messages", "messages[%zu] must be an object, not %s", i,
                        type_name(m));
        const char *k;
        const json_t *x;
        const json_t *role = NULL, *content = NULL;
        srv_msg *out = &r->msgs[i];
        json_object_foreach((json_t *)m, k, x) {
            int tf = srv_msg_tool_field(k, x, i, out, err, param);
            if (tf < 0)
                return -1;
            if (tf == 0)
                continue;
            if (!strcmp(k, "role"))
                role = x;
            else if (!strcmp(k, "content"))
                content = x;
            else if (!strcmp(k, "name")) {
                if (!json_is_string(x))
                    return fail(err, param, "messages", "messages[%zu].name must be a string", i);
            } else
                return fail(err, param, "messages", "messages[%zu]: unknown field '%s'", i, k);
        }
        if (!json_is_string(role))
            return fail(err, param, "messages", "messages[%zu] needs a string 'role'", i);
        const char *rs = json_string_value(role);
        if (!strcmp(rs, "system") || !strcmp(rs, "developer"))
            out->role = SRV_ROLE_SYSTEM;
        else if (!strcmp(rs, "user"))
            out->role = SRV_ROLE_USER;
        else if (!strcmp(rs, "assistant"))
            out->role = SRV_ROLE_ASSISTANT;
        else if (!strcmp(rs, "tool") || !strcmp(rs, "ipython"))
            out->role = SRV_ROLE_TOOL;
        else
            return fail(err, param, "messages",
                        "messages[%zu].role must be system, user, assistant or tool, not '%s'", i,
                        rs);
        if ((out->n_calls || out->call_id) &&
            (out->n_calls ? out->role != SRV_ROLE_ASSISTANT : out->role != SRV_ROLE_TOOL))
            return fail(err, param, "messages", "messages[%zu]: '%s' belongs to %s messages", i,
                        out->n_calls ? "tool_calls" : "tool_call_id",
                        out->n_calls ? "assistant" : "tool");
        if (out->role == SRV_ROLE_TOOL && !strcmp(rs, "tool") && !out->call_id)
            return fail(err, param, "messages",
                        "messages[%zu] (a tool message) needs "
                        "'tool_call_id'",
                        i);
        if (out->n_calls && (!content || json_is_null(content))) {
            out->content = calloc(1, 1); /* an assistant's call with null content */
            if (!out->content)
                return fail(err, param, NULL, "out of memory");
            continue;
        }
        if (!content)
            return fail(err, param, "messages", "messages[%zu] needs 'content'", i);
        if (get_content(content, out, err, param))
            return -1;
    }
    return 0;
}

static int get_prompt(const json_t *v, srv_request *r, char *err, char *param) {
    if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)))
        v = json_array_get(v, 0);
    if (json_is_string(v)) {
        r->prompt = dup_str(v, &r->prompt_len);
        return r->prompt ? 0 : fail(err, param, NULL, "out of memory");
    }
    if (!json_is_array(v))
        return fail(err, param, "prompt",
                    "'prompt' must be a string or an array of token ids, not %s", type_name(v));
    size_t n = json_array_size(v);
    if (n == 0)
        return fail(err, param, "prompt", "'prompt' must not be an empty array");
    r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
    if (!r->prompt_ids)
        return fail(err, param, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(v, i);
        if (json_is_string(x))
            return fail(err, param, "prompt", "one prompt per request (got an array of %zu)", n);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
            return fail(err, param, "prompt", "prompt[%zu] must be a token id (an integer >= 0)",
                        i);
        r->prompt_ids[i] = (int32_t)json_integer_value(x);
    }
    r->n_prompt_ids = (int64_t)n;
    return 0;
}

static int get_stops(const json_t *v, const char *name, srv_request *r, char *err, char *param) {
    if (json_is_null(v))
        return 0;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_string(v) && !json_is_array(v))
        return fail(err, param, name, "'%s' must be a string or an array of strings, not %s", name,
                    type_name(v));
    if (n > SRV_MAX_STOPS)
        return fail(err, param, name, "at most %d stop strings", SRV_MAX_STOPS);
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(x))
            return fail(err, param, name, "stop strings must be strings, not %s", type_name(x));
        size_t len = json_string_length(x);
        if (len == 0 || len > SRV_MAX_STOP_LEN)
            return fail(err, param, name, "stop strings must have 1..%d bytes", SRV_MAX_STOP_LEN);
        r->stops[r->n_stops] = dup_str(x, NULL);
        if (!r->stops[r->n_stops])
            return fail(err, param, NULL, "out of memory");
        r->n_stops++;
    }
    return 0;
}

/* Fields that do not change this server's answer at the values it accepts: metadata about the
 * request (user, metadata, store, service_tier), options of features it does not have at their
 * "off" value (plain text, no suffix).
 * Values that would change the answer, and that the server does not implement, are refused
 * with a message naming the field: never silently ignored. null is every field's default.
 * Returns 1 when k is none of these fields, 0 when v is accepted, -1 when refused. */
static int neutral_field(const char *k, const json_t *v, int chat, char *err, char *param) {
    static const char *const any_chat[] = {"modalities"};
    static const char *const any_completion[] = {"suffix"};
    static const char *const both[] = {"user", "metadata", "store", "service_tier"};
    int known = 0;
    for (size_t i = 0; i < sizeof both / sizeof both[0]; i++)
        known |= !strcmp(k, both[i]);
    for (size_t i = 0; chat && i < sizeof any_chat / sizeof any_chat[0]; i++)
        known |= !strcmp(k, any_chat[i]);
    for (size_t i = 0; !chat && i < sizeof any_completion / sizeof any_completion[0]; i++)
        known |= !strcmp(k, any_completion[i]);
    if (!known)
        return 1;
    if (json_is_null(v))
        return 0;
    if (!strcmp(k, "user") || !strcmp(k, "service_tier")) {
        if (!json_is_string(v))
            return fail(err, param, k, "'%s' must be a string, not %s", k, type_name(v));
        return 0;
    }
    if (!strcmp(k, "store")) {
        int b = 0;
        return get_bool(v, k, &b, err, param);
    }
    if (!strcmp(k, "metadata")) {
        const char *mk;
        const json_t *mv;
        if (!json_is_object(v))
            return fail(err, param, k, "'metadata' must be an object, not %s", type_name(v));
        json_object_foreach((json_t *)v, mk, mv) {
            if (!json_is_string(mv))
                return fail(err, param, k, "metadata values must be strings ('%s' is %s)", mk,
                            type_name(mv));
        }
        return 0;
    }
    if (!strcmp(k, "modalities")) {
        const json_t *m0 = json_is_array(v) ? json_array_get(v, 0) : NULL;
        if (!json_is_array(v) || json_array_size(v) != 1 || !json_is_string(m0) ||
            strcmp(json_string_value(m0), "text") != 0)
            return fail(err, param, k, "'modalities' must be [\"text\"]: this server writes text");
        return 0;
    }
    /* suffix: text after the completion (insertion), which this server does not do */
    if (!json_is_string(v))
        return fail(err, param, k, "'suffix' must be a string, not %s", type_name(v));
    if (json_string_length(v) > 0)
        return fail(err, param, k, "'suffix' is not supported by this server (only \"\")");
    return 0;
}

/* One logit_bias entry: token id key (a decimal string, or an integer in the list form) and
 * its bias (a number in [-100, 100]; false, in llama.cpp's list form, bans: -100). */
static int bias_entry(const json_t *id, const json_t *b, const char *name, srv_request *r,
                      char *err, char *param) {
    long long t = -1;
    if (json_is_string(id)) {
        const char *str = json_string_value(id);
        char *end = NULL;
        if (*str >= '0' && *str <= '9')
            t = strtoll(str, &end, 10);
        if (!end || *end || t > INT32_MAX)
            return fail(err, param, name, "'%s' keys must be token ids, not \"%.40s\"", name, str);
    } else if (json_is_integer(id) && json_integer_value(id) >= 0 &&
               json_integer_value(id) <= INT32_MAX) {
        t = json_integer_value(id);
    } else {
        return fail(err, param, name, "'%s' token ids must be integers >= 0", name);
    }
    double d = -100.0;
    if (!json_is_false(b)) {
        if (!json_is_number(b))
            return fail(err, param, name, "'%s' of token %lld must be a number, not %s", name, t,
                        type_name(b));
        d = json_number_value(b);
        if (!isfinite(d) || d < -100 || d > 100)
            return fail(err, param, name, "'%s' of token %lld must be in [-100, 100], got %g", name,
                        t, d);
    }
    r->bias[r->sp.n_logit_bias++] = (st_logit_bias){(int32_t)t, (float)d};
    return 0;
}

/* logit_bias: OpenAI's {"ID": BIAS, ...} or llama.cpp's [[ID, BIAS], ...]; {} and [] are none. */
static int get_logit_bias(const json_t *v, const char *name, srv_request *r, char *err,
                          char *param) {
    if (!json_is_object(v) && !json_is_array(v))
        return fail(err, param, name, "'%s' must be an object of token id: bias, not %s", name,
                    type_name(v));
    const size_t n = json_is_object(v) ? json_object_size(v) : json_array_size(v);
    if (n > ST_MAX_LOGIT_BIAS)
        return fail(err, param, name, "'%s' has %zu entries, at most %d", name, n,
                    ST_MAX_LOGIT_BIAS);
    free(r->bias);
    r->sp.n_logit_bias = 0;
    r->sp.logit_bias = r->bias = n ? malloc(n * sizeof *r->bias) : NULL;
    if (n && !r->bias)
        return fail(err, param, NULL, "out of memory");
    if (json_is_object(v)) {
        const char *k;
        const json_t *b;
        json_object_foreach((json_t *)v, k, b) {
            json_t *id = json_string(k);
            const int rc = id ? bias_entry(id, b, name, r, err, param) : -1;
            json_decref(id);
            if (rc)
                return id ? -1 : fail(err, param, NULL, "out of memory");
        }
        return 0;
    }
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_array(e) || json_array_size(e) != 2)
            return fail(err, param, name, "'%s' as a list holds [token id, bias] pairs", name);
        if (bias_entry(json_array_get(e, 0), json_array_get(e, 1), name, r, err, param))
            return -1;
    }
    return 0;
}

/* Sets r's grammar to gbnf (owned now; from field name), checked by compiling it: a 400 naming
 * the field and the error otherwise, also when another field already gave a grammar. */
static int set_grammar(srv_request *r, char *gbnf, const char *name, char *err, char *param) {
    if (r->grammar) {
        free(gbnf);
        return fail(err, param, name, "give one of '%s' and '%s', not both", r->grammar_from, name);
    }
    st_grammar *g = NULL;
    if (st_grammar_parse(gbnf, strlen(gbnf), &g)) {
        free(gbnf);
        return fail(err, param, name, "'%s': %s", name, st_last_error());
    }
    st_grammar_free(g);
    r->grammar = gbnf;
    snprintf(r->grammar_from, sizeof r->grammar_from, "%s", name);
    r->sp.grammar = gbnf;
    return 0;
}

/* A NUL-terminated malloc'd copy of s[0..n), or NULL. */
static char *grammar_copy(const char *s, size_t n) {
    char *gbnf = malloc(n + 1);
    if (gbnf) {
        memcpy(gbnf, s, n);
        gbnf[n] = 0;
    }
    return gbnf;
}

/* GBNF for a JSON schema (an object or boolean, or a string holding one: SGLang's json_schema). */
static int schema_grammar(const json_t *schema, srv_request *r, const char *name, char *err,
                          char *param) {
    char *text = json_is_string(schema) ? NULL : json_dumps(schema, JSON_ENCODE_ANY);
    const char *src = text ? text : json_string_value(schema);
    if (!src)
        return fail(err, param, name, "'%s' must be a JSON schema", name);
    char *conv = NULL;
    st_status rc = st_json_schema_to_gbnf(src, strlen(src), &conv);
    free(text);
    if (rc)
        return fail(err, param, name, "'%s': %s", name, st_last_error());
    char *gbnf = grammar_copy(conv, strlen(conv));
    st_grammar_text_free(conv);
    if (!gbnf)
        return fail(err, param, NULL, "out of memory");
    return set_grammar(r, gbnf, name, err, param);
}

/* response_format: {"type": "text"}, {"type": "json_object"} (with llama.cpp's optional
 * "schema"), {"type": "json_schema", "json_schema": {"name", "schema", "strict",
 * "description"}}. */
static int response_format(const json_t *v, srv_request *r, char *err, char *param) {
    const char *k = "response_format";
    const json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
    if (!json_is_string(t))
        return fail(err, param, k, "'response_format' must be an object with a string 'type'");
    const char *type = json_string_value(t), *f;
    const json_t *x;
    if (!strcmp(type, "text")) {
        if (json_object_size(v) != 1)
            return fail(err, param, k,
                        "'response_format' {\"type\": \"text\"} takes no other field");
        return 0;
    }
    if (!strcmp(type, "json_object")) {
        json_object_foreach(
            (json_t *)v, f,
            x) if (strcmp(f, "type") &&
                   strcmp(
                       f,
                       "schema")) return fail(err, param, k,
                                              "unknown field '%s' in response_format json_object",
                                              f);
        const json_t *schema = json_object_get(v, "schema");
        if (schema && !json_is_null(schema))
            return schema_grammar(schema, r, "response_format.schema", err, param);
        const char *obj = st_grammar_json_object();
        char *gbnf = grammar_copy(obj, strlen(obj));
        if (!gbnf)
            return fail(err, param, NULL, "out of memory");
        return set_grammar(r, gbnf, k, err, param);
    }
    if (!strcmp(type, "json_schema")) {
        const json_t *js = json_object_get(v, "json_schema");
        json_object_foreach(
            (json_t *)v, f,
            x) if (strcmp(f, "type") &&
                   strcmp(f, "json_schema")) return fail(err, param, k,
                                                         "unknown field '%s' in response_format "
                                                         "json_schema",
                                                         f);
        if (!json_is_object(js))
            return fail(err, param, "response_format.json_schema",
                        "'response_format.json_schema' must be an object with 'name' and 'schema'");
        json_object_foreach((json_t *)js, f, x) {
            if (!strcmp(f, "name") || !strcmp(f, "description")) {
                if (!json_is_string(x))
                    return fail(err, param, "response_format.json_schema",
                                "'response_format.json_schema.%s' must be a string", f);
            } else if (!strcmp(f, "strict")) {
                if (!json_is_boolean(x) && !json_is_null(x))
                    return fail(err, param, "response_format.json_schema",
                                "'response_format.json_schema.strict' must be a boolean");
            } else if (strcmp(f, "schema")) {
                return fail(err, param, "response_format.json_schema",
                            "unknown field '%s' in response_format.json_schema", f);
            }
        }
        const json_t *schema = json_object_get(js, "schema");
        if (!schema || json_is_null(schema))
            return fail(err, param, "response_format.json_schema.schema",
                        "'response_format.json_schema.schema' is required");
        return schema_grammar(schema, r, "response_format.json_schema.schema", err, param);
    }
    return fail(err, param, k,
                "'response_format' type '%s' is not supported (text, json_object, json_schema)",
                type);
}

/* A sampling field: key k (the OpenAI name), shown as name in messages and param. Returns 1
 * when k is not one, 0 when read into r, -1 when refused. null is the field's default. The
 * penalties' names: OpenAI's presence_penalty and frequency_penalty; vLLM's and SGLang's
 * repetition_penalty, min_tokens and ignore_eos; llama.cpp's repeat_penalty and repeat_last_n
 * (also penalty_last_n; 0 turns the repetition penalty off, -1 is the whole context). */
static int sampling_field(const char *k, const char *name, const json_t *v, srv_request *r,
                          char *err, char *param) {
    double d;
    json_int_t i;
    if (!strcmp(k, "stop"))
        return get_stops(v, name, r, err, param);
    static const char *const fields[] = {"max_tokens",
                                         "temperature",
                                         "top_p",
                                         "min_p",
                                         "top_k",
                                         "seed",
                                         "presence_penalty",
                                         "frequency_penalty",
                                         "repetition_penalty",
                                         "repeat_penalty",
                                         "repeat_last_n",
                                         "penalty_last_n",
                                         "logit_bias",
                                         "ignore_eos",
                                         "min_tokens",
                                         "grammar",
                                         "json_schema",
                                         "ebnf",
                                         "regex",
                                         "response_format"};
    size_t f = 0;
    while (f < sizeof fields / sizeof fields[0] && strcmp(k, fields[f]))
        f++;
    if (f == sizeof fields / sizeof fields[0])
        return 1;
    if (json_is_null(v))
        return 0;
    if (!strcmp(k, "response_format"))
        return response_format(v, r, err, param);
    if (!strcmp(k, "json_schema")) /* llama.cpp's field, SGLang's sampling_params.json_schema */
        return schema_grammar(v, r, name, err, param);
    if (!strcmp(k, "regex"))
        return fail(err, param, name,
                    "'%s' is not supported by this server (use json_schema, ebnf or grammar)",
                    name);
    if (!strcmp(k, "grammar") || !strcmp(k, "ebnf")) { /* llama.cpp's GBNF; SGLang's ebnf */
        if (!json_is_string(v))
            return fail(err, param, name, "'%s' must be a GBNF string, not %s", name, type_name(v));
        if (json_string_length(v) == 0)
            return 0;
        char *gbnf = grammar_copy(json_string_value(v), json_string_length(v));
        if (!gbnf)
            return fail(err, param, NULL, "out of memory");
        return set_grammar(r, gbnf, name, err, param);
    }
    if (!strcmp(k, "presence_penalty") || !strcmp(k, "frequency_penalty")) {
        if (get_number(v, name, -2, 2, &d, err, param))
            return -1;
        *(k[0] == 'p' ? &r->sp.presence_penalty : &r->sp.frequency_penalty) = (float)d;
    } else if (!strcmp(k, "repetition_penalty") || !strcmp(k, "repeat_penalty")) {
        if (get_number(v, name, 0, 10, &d, err, param))
            return -1;
        if (d == 0)
            return fail(err, param, name, "'%s' must be > 0 (1: off), got 0", name);
        r->sp.repeat_penalty = (float)d;
    } else if (!strcmp(k, "repeat_last_n") || !strcmp(k, "penalty_last_n")) {
        if (get_int(v, name, -1, INT32_MAX, &i, err, param))
            return -1;
        r->sp.repeat_last_n = (int32_t)i;
        r->repeat_off = i == 0;
    } else if (!strcmp(k, "logit_bias")) {
        return get_logit_bias(v, name, r, err, param);
    } else if (!strcmp(k, "ignore_eos")) {
        int b;
        if (get_bool(v, name, &b, err, param))
            return -1;
        r->sp.ignore_eos = b;
    } else if (!strcmp(k, "min_tokens")) {
        if (get_int(v, name, 0, INT32_MAX, &i, err, param))
            return -1;
        r->sp.min_tokens = (int32_t)i;
    } else if (!strcmp(k, "max_tokens")) {
        if (get_int(v, name, 0, INT32_MAX, &i, err, param)) /* 0: echo only (checked after) */
            return -1;
        if (i == 0)
            snprintf(r->zero_max, sizeof r->zero_max, "%s", name);
        r->max_tokens = i;
    } else if (!strcmp(k, "temperature")) {
        if (get_number(v, name, 0, 100, &d, err, param))
            return -1;
        r->sp.temp = (float)d;
        r->given |= SRV_GIVEN_TEMP;
    } else if (!strcmp(k, "top_p")) {
        if (get_number(v, name, 1e-9, 1, &d, err, param))
            return -1;
        r->sp.top_p = (float)d;
        r->given |= SRV_GIVEN_TOPP;
    } else if (!strcmp(k, "min_p")) {
        if (get_number(v, name, 0, 1, &d, err, param))
            return -1;
        r->sp.min_p = (float)d;
        r->given |= SRV_GIVEN_MINP;
    } else if (!strcmp(k, "top_k")) {
        if (get_int(v, name, -1, INT32_MAX, &i, err, param))
            return -1;
        r->sp.top_k = i < 0 ? 0 : (int32_t)i; /* -1 (SGLang, vLLM) and 0: off */
        r->given |= SRV_GIVEN_TOPK;
    } else {
        if (get_int(v, name, 0, LLONG_MAX, &i, err, param))
            return -1;
        r->sp.seed = (uint64_t)i;
        r->seed_set = 1;
    }
    return 0;
}

/* "speculative": false | true | {"enabled": BOOL, "num_draft_tokens": N (SGLang's name for the
 * tree's nodes, the root included; 1: none)}: this request's speculation cap (spec_max_tree). */
static int get_speculative(const json_t *v, srv_request *r, char *err, char *param) {
    if (json_is_null(v))
        return 0;
    int on = 1;
    if (json_is_boolean(v)) {
        r->spec_max_tree = json_is_true(v) ? 0 : 1;
        return 0;
    }
    if (!json_is_object(v))
        return fail(err, param, "speculative",
                    "'speculative' must be a boolean or an object, not %s", type_name(v));
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
        json_int_t n = 0;
        if (json_is_null(x))
            continue;
        if (!strcmp(k, "enabled")) {
            if (get_bool(x, "speculative.enabled", &on, err, param))
                return -1;
        } else if (!strcmp(k, "num_draft_tokens")) {
            if (get_int(x, "speculative.num_draft_tokens", 1, ST_SPEC_MAX_N, &n, err, param))
                return -1;
            r->spec_max_tree = (int32_t)n;
        } else {
            return fail(err, param, "speculative",
                        "unknown field 'speculative.%s' (enabled, num_draft_tokens)", k);
        }
    }
    if (!on)
        r->spec_max_tree = 1;
    return 0;
}

static int parse_fields(json_t *root, int chat, srv_request *r, char *err, char *param) {
    if (!json_is_object(root))
        return fail(err, param, NULL, "the request body must be a JSON object, not %s",
                    type_name(root));
    const char *k;
    json_t *v;
    const json_t *stream_options = NULL;
    int have_input = 0, top_given = 0, best_of = 0;
    json_object_foreach(root, k, v) {
        int sf = 1;
        if (!strcmp(k, "model")) {
            if (!json_is_string(v))
                return fail(err, param, k, "'model' must be a string, not %s", type_name(v));
        } else if (!chat && !strcmp(k, "prompt")) {
            if (get_prompt(v, r, err, param))
                return -1;
            have_input = 1;
        } else if (chat && !strcmp(k, "messages")) {
            if (get_messages(v, r, err, param))
                return -1;
            have_input = 1;
        } else if (chat && !strcmp(k, "max_completion_tokens")) {
            if (sampling_field("max_tokens", k, v, r, err, param))
                return -1;
        } else if ((sf = sampling_field(k, k, v, r, err, param)) <= 0) {
            if (sf < 0)
                return -1;
        } else if (!strcmp(k, "stream")) {
            if (!json_is_null(v) && get_bool(v, k, &r->stream, err, param))
                return -1;
        } else if (!strcmp(k, "stream_options")) {
            stream_options = v;
        } else if (!strcmp(k, "speculative")) {
            if (get_speculative(v, r, err, param))
                return -1;
        } else if (!strcmp(k, "n") || (!chat && !strcmp(k, "best_of"))) {
            json_int_t i;
            if (json_is_null(v))
                continue;
            if (get_int(v, k, 1, SRV_MAX_CHOICES, &i, err, param))
                return -1;
            *(!strcmp(k, "n") ? &r->n : &best_of) = (int)i;
        } else if (!chat && !strcmp(k, "echo")) {
            if (!json_is_null(v) && get_bool(v, k, &r->echo, err, param))
                return -1;
        } else if (!strcmp(k, "logprobs") && chat) { /* chat: a boolean, top_logprobs N */
            if (!json_is_null(v) && get_bool(v, k, &r->logprobs, err, param))
                return -1;
        } else if (!strcmp(k, chat ? "top_logprobs" : "logprobs")) {
            /* completions' logprobs: N alternatives (0: the token's own only) */
            json_int_t i;
            if (json_is_null(v))
                continue;
            if (get_int(v, k, 0, ST_MAX_TOP_LOGPROBS, &i, err, param))
                return -1;
            r->top_logprobs = (int)i;
            if (!chat)
                r->logprobs = 1;
            top_given = 1;
        } else if (chat && (sf = srv_tools_field(k, v, r, err, param)) <= 0) {
            if (sf < 0)
                return -1;
        } else {
            int nf = neutral_field(k, v, chat, err, param);
            if (nf < 0)
                return -1;
            if (nf > 0)
                return fail(err, param, k, "unknown field '%s'", k);
        }
    }
    if (!have_input)
        return fail(err, param, chat ? "messages" : "prompt", "'%s' is required",
                    chat ? "messages" : "prompt");
    if (chat && srv_tools_check(r, err, param))
        return -1;
    if (r->repeat_off)
        r->sp.repeat_penalty = 1.0f;
    if (best_of && best_of < r->n)
        return fail(err, param, "best_of", "'best_of' (%d) must be at least 'n' (%d)", best_of,
                    r->n);
    r->best_of = best_of ? best_of : r->n;
    if (r->max_tokens == 0 && !r->echo)
        return fail(err, param, r->zero_max, "'%s' must be at least 1%s", r->zero_max,
                    chat ? "" : " (0 only with \"echo\": true)");
    if (r->best_of > r->n && r->stream) /* OpenAI's rule: the best are known only at the end */
        return fail(err, param, "best_of", "'best_of' > 'n' cannot be streamed");
    if (chat && top_given && r->top_logprobs > 0 && !r->logprobs)
        return fail(err, param, "top_logprobs", "'top_logprobs' needs \"logprobs\": true");
    if (stream_options && !json_is_null(stream_options)) {
        if (!r->stream)
            return fail(err, param, "stream_options",
                        "'stream_options' is only allowed with \"stream\": true");
        if (!json_is_object(stream_options))
            return fail(err, param, "stream_options", "'stream_options' must be an object");
        json_object_foreach((json_t *)stream_options, k, v) {
            int b = 0;
            if (!strcmp(k, "include_obfuscation")) { /* padding against size side channels */
                if (get_bool(v, "stream_options.include_obfuscation", &b, err, param))
                    return -1;
                continue;
            }
            if (strcmp(k, "include_usage") != 0)
                return fail(err, param, "stream_options", "unknown field 'stream_options.%s'", k);
            if (get_bool(v, "stream_options.include_usage", &r->include_usage, err, param))
                return -1;
        }
    }
    return 0;
}

/* A request with the defaults of OpenAI and SGLang (plain sampling at temperature 1) and its
 * body parsed; NULL (the message in err) if the body is not JSON. */
static json_t *request_begin(const char *body, size_t len, srv_request *r, char *err, char *param) {
    memset(r, 0, sizeof *r);
    r->max_tokens = -1;
    r->n = r->best_of = 1;
    r->parallel_calls = 1;
    r->sp = st_sampler_default_params();
    r->sp.temp = 1.0f;
    r->sp.top_k = 0;
    r->sp.top_p = 1.0f;
    r->sp.min_p = 0.0f;
    err[0] = 0;
    param[0] = 0;
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        fail(err, param, NULL, "malformed JSON: %s (line %d, column %d)", je.text, je.line,
             je.column);
    return root;
}

int srv_request_parse(const char *body, size_t len, int chat, srv_request *r, char *err,
                      char *param) {
    json_t *root = request_begin(body, len, r, err, param);
    r->chat = chat;
    if (!root)
        return -1;
    int rc = parse_fields(root, chat, r, err, param);
    json_decref(root);
    if (rc) {
        char e[SRV_ERR_CAP], p[SRV_ERR_CAP];
        memcpy(e, err, SRV_ERR_CAP);
        memcpy(p, param, SRV_ERR_CAP);
        srv_request_free(r);
        memcpy(err, e, SRV_ERR_CAP);
        memcpy(param, p, SRV_ERR_CAP);
    }
    return rc;
}

/* SGLang's sampling parameters this server does not implement, at the values that leave the
 * answer as it is: {name, 'b'oolean / 'n'umber / 'i'nteger / empty 'a'rray, that value}. */
static const struct {
    const char *name;
    char type;
    double value;
} sglang_neutral[] = {
    {"n", 'i', 1},
    {"no_stop_trim", 'b', 0},
    {"skip_special_tokens", 'b', 1},
    {"spaces_between_special_tokens", 'b', 1},
    {"stop_token_ids", 'a', 0},
};

static int sglang_sampling(const json_t *sp, srv_request *r, char *err, char *param) {
    if (!json_is_object(sp))
        return fail(err, param, "sampling_params", "'sampling_params' must be an object, not %s",
                    type_name(sp));
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)sp, k, v) {
        char name[96];
        snprintf(name, sizeof name, "sampling_params.%.60s", k);
        const char *as = !strcmp(k, "max_new_tokens")   ? "max_tokens"
                         : !strcmp(k, "sampling_seed")  ? "seed"
                         : !strcmp(k, "min_new_tokens") ? "min_tokens"
                                                        : k;
        int sf = strcmp(k, "max_tokens") && strcmp(k, "seed") && strcmp(k, "min_tokens") &&
                         strcmp(k, "repeat_penalty") && strcmp(k, "repeat_last_n") &&
                         strcmp(k, "penalty_last_n")
                     ? sampling_field(as, name, v, r, err, param)
                     : 1;
        if (sf < 0)
            return -1;
        if (sf == 0)
            continue;
        size_t i = 0, n = sizeof sglang_neutral / sizeof sglang_neutral[0];
        while (i < n && strcmp(k, sglang_neutral[i].name) != 0)
            i++;
        if (i == n)
            return fail(err, param, name, "unknown field '%s'", name);
        if (json_is_null(v))
            continue;
        const char t = sglang_neutral[i].type;
        const double want = sglang_neutral[i].value;
        int ok;
        if (t == 'b')
            ok = json_is_boolean(v) && json_is_true(v) == (want != 0);
        else if (t == 'a')
            ok = json_is_array(v) && json_array_size(v) == 0;
        else
            ok =
                (t == 'i' ? json_is_integer(v) : json_is_number(v)) && json_number_value(v) == want;
        if (!ok) {
            const char *shown = t == 'a' ? "[]" : t == 'b' ? (want != 0 ? "true" : "false") : NULL;
            if (shown)
                return fail(err, param, name, "'%s' is not supported by this server (only %s)",
                            name, shown);
            return fail(err, param, name, "'%s' is not supported by this server (only %g)", name,
                        want);
        }
    }
    return 0;
}

int srv_generate_parse(const char *body, size_t len, srv_request *r, char *err, char *param) {
    json_t *root = request_begin(body, len, r, err, param);
    r->sglang = 1;
    if (!root)
        return -1;
    int rc = 0, have_input = 0;
    if (!json_is_object(root))
        rc = fail(err, param, NULL, "the request body must be a JSON object, not %s",
                  type_name(root));
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        if (rc)
            break;
        if (!strcmp(k, "text") || !strcmp(k, "input_ids")) {
            if (have_input) {
                rc = fail(err, param, k, "give 'text' or 'input_ids', not both");
            } else if (!strcmp(k, "text") && !json_is_string(v)) {
                rc = fail(err, param, k, "'text' must be a string (one prompt per request), not %s",
                          type_name(v));
            } else if (!strcmp(k, "input_ids") &&
                       (!json_is_array(v) || json_is_string(json_array_get(v, 0)))) {
                rc = fail(err, param, k, "'input_ids' must be an array of token ids");
            } else if (get_prompt(v, r, err, param)) {
                snprintf(param, SRV_ERR_CAP, "%s", k); /* get_prompt names 'prompt' */
                rc = -1;
            }
            have_input = 1;
        } else if (!strcmp(k, "sampling_params")) {
            rc = json_is_null(v) ? 0 : sglang_sampling(v, r, err, param);
        } else if (!strcmp(k, "speculative")) {
            rc = get_speculative(v, r, err, param);
        } else if (!strcmp(k, "stream")) {
            int b = 0;
            rc = json_is_null(v) ? 0 : get_bool(v, k, &b, err, param);
            if (!rc && b)
                rc = fail(err, param, k,
                          "'stream' is not supported on /generate (only false); "
                          "/v1/completions streams");
        } else if (!strcmp(k, "return_logprob") || !strcmp(k, "return_text_in_logprobs")) {
            int *out = !strcmp(k, "return_logprob") ? &r->logprobs : &r->lp_text;
            rc = json_is_null(v) ? 0 : get_bool(v, k, out, err, param);
        } else if (!strcmp(k, "top_logprobs_num")) {
            json_int_t i = 0;
            rc = json_is_null(v) ? 0 : get_int(v, k, 0, ST_MAX_TOP_LOGPROBS, &i, err, param);
            r->top_logprobs = (int)i;
        } else if (!strcmp(k, "logprob_start_len")) {
            json_int_t i = -1;
            rc = json_is_null(v) ? 0 : get_int(v, k, -1, INT32_MAX, &i, err, param);
            if (!rc && i != -1)
                rc = fail(err, param, k,
                          "'logprob_start_len' is not supported (only -1: no prompt logprobs)");
        } else if (!strcmp(k, "rid")) {
            if (!json_is_string(v) && !json_is_null(v))
                rc = fail(err, param, k, "'rid' must be a string, not %s", type_name(v));
        } else {
            rc = fail(err, param, k, "unknown field '%s'", k);
        }
    }
    if (!rc && !have_input)
        rc = fail(err, param, "text", "'text' (or 'input_ids') is required");
    if (!rc && r->max_tokens == 0)
        rc = fail(err, param, r->zero_max, "'%s' must be at least 1", r->zero_max);
    json_decref(root);
    if (rc) {
        char e[SRV_ERR_CAP], p[SRV_ERR_CAP];
        memcpy(e, err, SRV_ERR_CAP);
        memcpy(p, param, SRV_ERR_CAP);
        srv_request_free(r);
        memcpy(err, e, SRV_ERR_CAP);
        memcpy(param, p, SRV_ERR_CAP);
    }
    return rc;
}

void srv_request_free(srv_request *r) {
    if (!r)
        return;
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_msgs; i++)
        srv_msg_free(&r->msgs[i]);
    free(r->msgs);
    srv_tools_free(r);
    for (int i = 0; i < r->n_stops; i++)
        free(r->stops[i]);
    free(r->bias);
    free(r->grammar);
    memset(r, 0, sizeof *r);
}
