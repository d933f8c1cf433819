/*
 * compat.c: the answers of the routes other servers have that users script against, beside
 * OpenAI's: a model by id (/v1/models/ID), llama.cpp's /tokenize, /detokenize and /props, and
 * SGLang's /server_info and /get_model_info (its /generate is a completion job: reply.c). Each
 * returns the JSON to send and its status; bad input is a 400 naming the field.
 */
#define _GNU_SOURCE
#include "serve.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *srv_model_obj(const srv *s) {
    return json_pack("{s:s,s:s,s:I,s:s,s:i}", "id", s->model_name, "object", "model", "created",
                     (json_int_t)s->created, "owned_by", "spectree", "max_model_len",
                     (int)s->n_ctx);
}

/* /v1/models/ID: the model, or OpenAI's 404 (code "model_not_found", param "model"). */
json_t *srv_model_by_id(const srv *s, const char *id, unsigned *code) {
    if (!strcmp(id, s->model_name)) {
        *code = 200;
        return srv_model_obj(s);
    }
    char msg[320];
    snprintf(msg, sizeof msg, "The model '%.150s' does not exist (this server has '%.60s')", id,
             s->model_name);
    *code = 404;
    return json_pack("{s:{s:s,s:s,s:s,s:s}}", "error", "message", msg, "type",
                     "invalid_request_error", "param", "model", "code", "model_not_found");
}

static json_t *bad(unsigned *code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static json_t *bad(unsigned *code, const char *field, const char *fmt, ...) {
    char msg[SRV_ERR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    *code = 400;
    return srv_error_obj(400, msg, field);
}

/* The body as a JSON object with only the fields named in allowed (NULL-terminated); NULL with
 * the 400 in *err otherwise. */
static json_t *load_object(const char *body, size_t n, const char *const *allowed, unsigned *code,
                           json_t **err) {
    json_error_t je;
    json_t *root = json_loadb(body, n, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        *err =
            bad(code, NULL, "malformed JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        *err = bad(code, NULL, "the request body must be a JSON object");
        return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            ok |= !strcmp(k, *a);
        if (!ok) {
            *err = bad(code, k, "unknown field '%.100s'", k);
            json_decref(root);
            return NULL;
        }
    }
    return root;
}

/* An optional boolean field: 0 (*out set or left), or -1 with the 400 in *err. */
static int opt_bool(const json_t *root, const char *k, int *out, unsigned *code, json_t **err) {
    const json_t *v = json_object_get(root, k);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v)) {
        *err = bad(code, k, "'%s' must be a boolean", k);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

/* A piece's text for with_pieces: a string when it is valid UTF-8, else its bytes (as
 * llama-server writes them). */
static json_t *piece_json(const char *p, size_t n) {
    if (srv_utf8_valid_prefix(p, n) == n)
        return json_stringn(p, n);
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

/* llama-server's POST /tokenize: {"content": STRING, "add_special": false, "with_pieces": false}
 * -> {"tokens": [ids]} (with_pieces: [{"id": ID, "piece": TEXT}], each token's own text). */
json_t *srv_tokenize(srv *s, const char *body, size_t n, unsigned *code) {
    static const char *const allowed[] = {"content", "add_special", "with_pieces", NULL};
    json_t *err = NULL;
    json_t *root = load_object(body, n, allowed, code, &err);
    if (!root)
        return err;
    int add_special = 0, with_pieces = 0;
    const json_t *c = json_object_get(root, "content");
    if (opt_bool(root, "add_special", &add_special, code, &err) ||
        opt_bool(root, "with_pieces", &with_pieces, code, &err)) {
        json_decref(root);
        return err;
    }
    if (!json_is_string(c)) {
        json_decref(root);
        return bad(code, "content", "'content' (a string) is required");
    }
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    const int bos = add_special && st_tokenizer_bos(s->tok) >= 0;
    if (cli_tokenize_all(s->tok, json_string_value(c), json_string_length(c), bos, &ids, &n_ids)) {
        json_t *e = bad(code, "content", "content: %s", st_last_error());
        json_decref(root);
        free(ids);
        return e;
    }
    json_decref(root);
    json_t *toks = json_array();
    st_detok d;
    const size_t cap = st_detok_max_bytes(s->tok) + 4;
    char *buf = with_pieces ? malloc(cap) : NULL;
    for (int64_t i = 0; toks && i < n_ids; i++) {
        if (!with_pieces) {
            json_array_append_new(toks, json_integer(ids[i]));
            continue;
        }
        /* the token's own text (its leading space kept), with the bytes of a character it
         * does not complete as they are */
        size_t nb = 0;
        st_detok_init(&d, s->tok);
        st_detok_set_prev(&d, ids[i]);
        if (!buf || st_detok_push(&d, ids[i], buf, cap, &nb) != ST_OK)
            nb = 0;
        if (buf && d.n_pend <= cap - nb) {
            memcpy(buf + nb, d.pend, d.n_pend);
            nb += d.n_pend;
        }
        json_array_append_new(
            toks, json_pack("{s:i,s:o}", "id", ids[i], "piece", piece_json(buf ? buf : "", nb)));
    }
    free(buf);
    free(ids);
    *code = 200;
    return json_pack("{s:o}", "tokens", toks);
}

/* llama-server's POST /detokenize: {"tokens": [ids]} -> {"content": TEXT}, each id checked
 * against the vocabulary. */
json_t *srv_detokenize(srv *s, const char *body, size_t n, unsigned *code) {
    static const char *const allowed[] = {"tokens", NULL};
    json_t *err = NULL;
    json_t *root = load_object(body, n, allowed, code, &err);
    if (!root)
        return err;
    const json_t *t = json_object_get(root, "tokens");
    if (!json_is_array(t)) {
        json_decref(root);
        return bad(code, "tokens", "'tokens' (an array of token ids) is required");
    }
    const int32_t nv = st_tokenizer_n_vocab(s->tok);
    for (size_t i = 0; i < json_array_size(t); i++) {
        const json_t *x = json_array_get(t, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= nv) {
            json_decref(root);
            return bad(code, "tokens", "tokens[%zu] is not a token id (an integer in 0..%d)", i,
                       nv - 1);
        }
    }
    const size_t cap = st_detok_max_bytes(s->tok);
    size_t len = 0, room = cap * (json_array_size(t) + 1) + 1;
    char *text = malloc(room);
    if (!text) {
        json_decref(root);
        *code = 500;
        return srv_error_obj(500, "out of memory", NULL);
    }
    st_detok d;
    st_detok_init(&d, s->tok);
    size_t nb = 0;
    for (size_t i = 0; i < json_array_size(t); i++) {
        st_detok_push(&d, (int32_t)json_integer_value(json_array_get(t, i)), text + len, cap, &nb);
        len += nb;
    }
    st_detok_flush(&d, text + len, cap, &nb);
    len += nb;
    json_decref(root);
    json_t *out = json_pack("{s:o}", "content", srv_text_str(text, len));
    free(text);
    *code = 200;
    return out;
}

/* The drafter and its tree bounds, as both info routes report them. */
static json_t *spec_obj(const srv *s, const st_engine_stats *es) {
    const st_spec_params *sp = &s->o.ep.gen.spec;
    const int fixed = sp->topk && sp->num_steps && sp->num_draft_tokens;
    return json_pack("{s:s,s:s?,s:i,s:i,s:i,s:s}", "algorithm", st_spec_algo_name(sp->algo),
                     "draft", s->o.c.draft_path, "topk", es->topk, "num_steps", es->num_steps,
                     "num_draft_tokens", es->num_draft_tokens, "tree",
                     sp->algo == ST_SPEC_NONE ? "none"
                     : fixed                  ? "fixed"
                                              : "auto");
}

/* The mean tokens per decoding pass of the finished requests (SGLang's spec_accept_length). */
static double accept_length(const srv *s) {
    return s->metrics.spec_verify_steps
               ? (double)s->metrics.gen_tokens / (double)s->metrics.spec_verify_steps
               : 0.0;
}

/* llama-server's GET /props: the model, context, slots, chat template and the defaults of a
 * request; with spectree's drafter, the slots busy now and the decoding steps so far. */
json_t *srv_props(srv *s) {
    pthread_mutex_lock(&s->mu);
    const st_engine_stats es = s->engine_stats;
    const int running = s->gauge_running, queued = s->gauge_queued;
    const double acc = accept_length(s);
    pthread_mutex_unlock(&s->mu);
    const st_sampler_params *sp = &s->o.c.sp;
    const unsigned g = s->o.c.sp_given;
    return json_pack(
        "{s:s,s:s,s:i,s:i,s:s,s:{s:i,s:{s:f,s:i,s:f,s:f,s:I}},s:o,s:{s:i,s:i},s:{s:I,s:I,s:f}}",
        "model_path", s->o.model, "model_alias", s->model_name, "n_ctx", (int)s->n_ctx,
        "total_slots", (int)es.max_running, "chat_template", srv_tmpl_name(s->tmpl),
        "default_generation_settings", "n_ctx", (int)s->n_ctx, "params", "temperature",
        (double)(g & SRV_GIVEN_TEMP ? sp->temp : 1.0f), "top_k",
        (int)(g & SRV_GIVEN_TOPK ? sp->top_k : 0), "top_p",
        (double)(g & SRV_GIVEN_TOPP ? sp->top_p : 1.0f), "min_p",
        (double)(g & SRV_GIVEN_MINP ? sp->min_p : 0.0f), "n_predict",
        (json_int_t)s->o.default_max_tokens, "speculative", spec_obj(s, &es), "slots", "running",
        running, "queued", queued, "steps", "speculative", (json_int_t)es.spec_steps, "plain",
        (json_int_t)es.plain_steps, "accept_length", acc);
}

/* SGLang's GET /server_info (and /get_server_info): its server arguments' names, and
 * internal_states with the mean accepted length of the requests so far. */
json_t *srv_server_info(srv *s) {
    pthread_mutex_lock(&s->mu);
    const st_engine_stats es = s->engine_stats;
    const double acc = accept_length(s);
    const int running = s->gauge_running;
    pthread_mutex_unlock(&s->mu);
    const st_spec_params *sp = &s->o.ep.gen.spec;
    return json_pack(
        "{s:s,s:s,s:i,s:i,s:i,s:i,s:I,s:s,s:s?,s:i,s:i,s:i,s:s,s:i,s:[{s:f,s:i}]}", "model_path",
        s->o.model, "served_model_name", s->model_name, "context_length", (int)s->n_ctx,
        "max_running_requests", (int)es.max_running, "max_queued_requests", (int)s->o.ep.max_queued,
        "chunked_prefill_size", (int)s->o.ep.prefill_chunk, "max_total_tokens",
        (json_int_t)es.kv_budget, "speculative_algorithm",
        sp->algo == ST_SPEC_NONE ? "NONE" : st_spec_algo_name(sp->algo),
        "speculative_draft_model_path", s->o.c.draft_path, "speculative_num_steps", es.num_steps,
        "speculative_eagle_topk", es.topk, "speculative_num_draft_tokens", es.num_draft_tokens,
        "host", s->o.host, "port", s->port, "internal_states", "avg_spec_accept_length", acc,
        "running_requests", running);
}

/* SGLang's GET /get_model_info. */
json_t *srv_model_info(const srv *s) {
    return json_pack("{s:s,s:s,s:b,s:i}", "model_path", s->o.model, "tokenizer_path", s->o.model,
                     "is_generation", 1, "context_length", (int)s->n_ctx);
}
