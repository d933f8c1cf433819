/*
 * reply.c: between a checked request and the engine: a request's prompt as token ids (text,
 * token ids or a rendered chat, with the length checks), the job made from it, and the JSON of a
 * finished job's answer (choices, usage, SGLang's speculative meta_info) that http.c sends.
 */
#define _GNU_SOURCE
#include "serve.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *srv_finish_reason(const srv_job *j) {
    if (j->stopper.stopped)
        return "stop";
    switch (j->stats.stop_reason) {
    case ST_STOP_LENGTH:
    case ST_STOP_CONTEXT:
        return "length";
    default:
        return "stop";
    }
}

/* SGLang's meta_info fields for speculative decoding, per request. */
json_t *srv_spec_info(const srv_job *j) {
    const st_request_stats *st = &j->stats;
    json_t *hist = json_array();
    int top = 0;
    for (int a = 0; a <= ST_SPEC_MAX_S; a++)
        if (st->accept_hist[a])
            top = a;
    for (int a = 0; a <= top; a++)
        json_array_append_new(hist, json_integer(st->accept_hist[a]));
    return json_pack(
        "{s:I,s:I,s:I,s:f,s:f,s:o,s:f,s:f,s:f}", "spec_verify_ct", (json_int_t)st->verify_ct,
        "spec_steps", (json_int_t)st->spec_steps, "plain_steps", (json_int_t)st->plain_steps,
        "spec_accept_length", st->accept_length, "spec_tau", st->tau, "spec_accept_histogram", hist,
        "queue_time", st->queue_ms / 1e3, "ttft", st->ttft_ms >= 0 ? st->ttft_ms / 1e3 : 0.0,
        "e2e_latency", (j->t_done - j->t_submit));
}

json_t *srv_usage_obj(const srv_job *j) {
    return json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)j->n_prompt, "completion_tokens",
                     (json_int_t)j->stats.gen_tokens, "total_tokens",
                     (json_int_t)(j->n_prompt + j->stats.gen_tokens));
}

/* A JSON string of valid UTF-8 (the detokenizer writes only valid UTF-8; this is a guard). */
json_t *srv_text_str(const char *t, size_t n) {
    json_t *v = json_stringn(t, n);
    return v ? v : json_string("\xEF\xBF\xBD");
}

json_t *srv_full_response(const srv_job *j) {
    json_t *choice;
    if (j->req.chat)
        choice = json_pack("{s:i,s:{s:s,s:o},s:n,s:s}", "index", 0, "message", "role", "assistant",
                           "content", srv_text_str(j->text ? j->text : "", j->n_text), "logprobs",
                           "finish_reason", srv_finish_reason(j));
    else
        choice = json_pack("{s:i,s:o,s:n,s:s}", "index", 0, "text",
                           srv_text_str(j->text ? j->text : "", j->n_text), "logprobs",
                           "finish_reason", srv_finish_reason(j));
    return json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o,s:o}", "id", j->id, "object",
                     j->req.chat ? "chat.completion" : "text_completion", "created",
                     (json_int_t)j->created, "model", j->srv->model_name, "choices", choice,
                     "usage", srv_usage_obj(j), "meta_info", srv_spec_info(j));
}

/* Appends a token list. 0, or -1 out of memory. */
static int push_ids(int32_t **ids, int64_t *n, int64_t *cap, const int32_t *add, int64_t k) {
    if (*n + k > *cap) {
        int64_t c = (*n + k) * 2 + 16;
        int32_t *b = realloc(*ids, (size_t)c * sizeof *b);
        if (!b)
            return -1;
        *ids = b;
        *cap = c;
    }
    memcpy(*ids + *n, add, (size_t)k * sizeof *add);
    *n += k;
    return 0;
}

/* A prompt over --max-prompt-tokens: n tokens, or more than the limit when n is the limit + 1
 * (a text too long to be tokenized whole, st_tokenize_max). */
static unsigned too_long(const srv *s, int64_t n, char *err) {
    if (n == s->o.max_prompt + 1)
        snprintf(err, SRV_ERR_CAP,
                 "the prompt has more than %ld tokens; this server takes at most %ld",
                 s->o.max_prompt, s->o.max_prompt);
    else
        snprintf(err, SRV_ERR_CAP,
                 "the prompt has %" PRId64 " tokens; this server takes at most %ld", n,
                 s->o.max_prompt);
    return 400;
}

/* The prompt's token ids; 0, or an HTTP status with a message in err. */
static unsigned build_prompt(srv *s, srv_job *j, char *err) {
    const srv_request *r = &j->req;
    const int add_bos = !s->o.c.no_bos && st_tokenizer_add_bos_default(s->tok);
    int64_t cap = 0;
    if (!r->chat && r->prompt_ids) {
        int32_t nv = st_tokenizer_n_vocab(s->tok);
        for (int64_t i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] >= nv) {
                snprintf(err, SRV_ERR_CAP, "prompt[%" PRId64 "] = %d is not a token id (< %d)", i,
                         r->prompt_ids[i], nv);
                return 400;
            }
        if (push_ids(&j->prompt, &j->n_prompt, &cap, r->prompt_ids, r->n_prompt_ids))
            return 500;
    } else if (!r->chat) {
        const int tr = cli_tokenize_max(s->tok, r->prompt, r->prompt_len, add_bos, s->o.max_prompt,
                                        &j->prompt, &j->n_prompt);
        if (tr == 1)
            return too_long(s, j->n_prompt, err);
        if (tr) {
            snprintf(err, SRV_ERR_CAP, "prompt: %s", st_last_error());
            return 400;
        }
        if (j->n_prompt == 0) { /* an empty prompt starts from BOS, as `generate` does */
            int32_t bos = st_tokenizer_bos(s->tok);
            if (bos < 0) {
                snprintf(err, SRV_ERR_CAP, "the prompt is empty and the model has no BOS token");
                return 400;
            }
            if (push_ids(&j->prompt, &j->n_prompt, &cap, &bos, 1))
                return 500;
        }
    } else {
        srv_rendered rd;
        if (srv_chat_render(s->tmpl, r->msgs, r->n_msgs, &s->specials, &rd, err))
            return 400;
        if (!rd.has_bos && add_bos && st_tokenizer_bos(s->tok) >= 0) {
            int32_t bos = st_tokenizer_bos(s->tok);
            push_ids(&j->prompt, &j->n_prompt, &cap, &bos, 1);
        }
        int32_t *part = NULL;
        for (int i = 0; i < rd.n_segs; i++) {
            const srv_seg *g = &rd.segs[i];
            int64_t np = 0;
            if (g->special >= 0) {
                if (push_ids(&j->prompt, &j->n_prompt, &cap, &g->special, 1))
                    break;
                continue;
            }
            /* what is left of the limit: a segment past it is not tokenized whole */
            const int64_t left = s->o.max_prompt - j->n_prompt;
            const int tr =
                left < 0 ? 1
                         : cli_tokenize_max(s->tok, rd.text + g->off, g->len, 0, left, &part, &np);
            if (tr == 1) {
                free(part);
                srv_rendered_free(&rd);
                return too_long(s, s->o.max_prompt + 1, err); /* the rest is not counted */
            }
            if (tr || push_ids(&j->prompt, &j->n_prompt, &cap, part, np)) {
                snprintf(err, SRV_ERR_CAP, "chat prompt: %s", st_last_error());
                free(part);
                srv_rendered_free(&rd);
                return 400;
            }
        }
        free(part);
        srv_rendered_free(&rd);
    }
    if (j->n_prompt == 0) {
        snprintf(err, SRV_ERR_CAP, "the prompt is empty");
        return 400;
    }
    if (j->n_prompt > s->o.max_prompt)
        return too_long(s, j->n_prompt, err);
    int64_t room = s->n_ctx - j->n_prompt;
    if (r->max_tokens > 0) {
        if (r->max_tokens > s->o.max_tokens_limit) {
            snprintf(err, SRV_ERR_CAP, "max_tokens is %" PRId64 "; this server allows at most %ld",
                     r->max_tokens, s->o.max_tokens_limit);
            return 400;
        }
        if (r->max_tokens > room) {
            snprintf(err, SRV_ERR_CAP,
                     "this model's maximum context length is %d tokens; the prompt has %" PRId64
                     " and max_tokens asks for %" PRId64,
                     s->n_ctx, j->n_prompt, r->max_tokens);
            return 400;
        }
        j->n_predict = r->max_tokens;
    } else {
        int64_t d = r->chat ? room : s->o.default_max_tokens;
        if (d > room)
            d = room;
        if (d > s->o.max_tokens_limit)
            d = s->o.max_tokens_limit;
        j->n_predict = d;
    }
    return 0;
}

/* Creates a job from a checked request (moved into it); 0, or an HTTP status with err. */
unsigned srv_job_create(srv *s, srv_request *req, srv_job **out, char *err) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) {
        srv_request_free(req);
        snprintf(err, SRV_ERR_CAP, "out of memory");
        return 500;
    }
    j->srv = s;
    j->req = *req;
    memset(req, 0, sizeof *req);
    j->refs = 1;
    pthread_cond_init(&j->cv, NULL);
    j->t_submit = st_time_seconds();
    j->created = (int64_t)time(NULL);
    j->tok_cap = st_detok_max_bytes(s->tok);
    j->tok_buf = malloc(j->tok_cap);
    j->stopper.stops = (const char *const *)j->req.stops;
    j->stopper.n_stops = j->req.n_stops;
    pthread_mutex_lock(&s->mu);
    s->live_jobs++;
    uint64_t seq = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(j->id, sizeof j->id, "%s-%" PRIx64 "-%" PRIu64, j->req.chat ? "chatcmpl" : "cmpl",
             (uint64_t)s->created, seq);
    /* sampling: the request's fields, else the server's flags, else OpenAI's defaults */
    unsigned code = j->tok_buf ? build_prompt(s, j, err) : 500;
    if (code == 500 && !err[0])
        snprintf(err, SRV_ERR_CAP, "out of memory");
    if (!code) {
        st_detok_init(&j->detok, s->tok);
        st_detok_set_prev(&j->detok, j->prompt[j->n_prompt - 1]);
        if (!j->req.seed_set) { /* a fresh seed per request */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            j->req.sp.seed = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
                             (seq * 0x9E3779B97F4A7C15ull);
        }
    }
    *out = j;
    return code;
}
