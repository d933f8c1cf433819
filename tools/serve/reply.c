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
    if (j->n_calls)
        return "tool_calls";
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

int srv_tools_active(const srv_job *j) {
    const srv_request *r = j->lead ? &j->lead->req : &j->req;
    return r->chat && r->n_tools > 0 && r->tool_choice != SRV_TOOLS_NONE;
}

void srv_job_calls(srv_job *j) {
    if (!srv_tools_active(j) || j->status != ST_OK || j->n_calls)
        return;
    const srv_request *r = j->lead ? &j->lead->req : &j->req;
    srv_call *calls = NULL;
    const int n = srv_tools_parse(j->srv->tmpl, r->tools, r->n_tools, j->text ? j->text : "",
                                  j->n_text, &j->content_len, &calls);
    if (n <= 0)
        return;
    j->calls = calls;
    j->n_calls = r->parallel_calls ? n : 1;
    for (int k = 0; k < n; k++) {
        char id[96];
        snprintf(id, sizeof id, "call_%s_%d_%d", j->id + strcspn(j->id, "-") + 1, j->index, k);
        calls[k].id = k < j->n_calls ? strdup(id) : NULL;
    }
    for (int k = j->n_calls; k < n; k++) { /* parallel_tool_calls false: the first only */
        free(calls[k].name);
        free(calls[k].args);
    }
}

/* An answer's tool_calls array: OpenAI's [{"id", "type": "function", "function": {"name",
 * "arguments": a string}}]. */
static json_t *calls_json(const srv_job *c) {
    json_t *a = json_array();
    for (int k = 0; a && k < c->n_calls; k++)
        json_array_append_new(a, json_pack("{s:s?,s:s,s:{s:s,s:s}}", "id", c->calls[k].id, "type",
                                           "function", "function", "name", c->calls[k].name,
                                           "arguments", c->calls[k].args));
    return a;
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

srv_job *srv_choice(srv_job *lead, int i) { return i == 0 ? lead : lead->more[i - 1]; }

int srv_group_done(const srv_job *lead) {
    int done = lead->done;
    for (int i = 0; i < lead->n_more; i++)
        done &= lead->more[i]->done;
    return done;
}

json_t *srv_usage_obj(const srv_job *j) {
    /* prompt_tokens_details.cached_tokens: OpenAI's count of prompt tokens not recomputed (the
     * lead's: the prompt counts once); completion_tokens: every choice's, best_of's all */
    int64_t gen = j->stats.gen_tokens;
    for (int i = 0; i < j->n_more; i++)
        gen += j->more[i]->stats.gen_tokens;
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)j->n_prompt,
                     "completion_tokens", (json_int_t)gen, "total_tokens",
                     (json_int_t)(j->n_prompt + gen), "prompt_tokens_details", "cached_tokens",
                     (json_int_t)j->stats.reused_tokens);
}

/* A JSON string of valid UTF-8 (the detokenizer writes only valid UTF-8; this is a guard). */
json_t *srv_text_str(const char *t, size_t n) {
    json_t *v = json_stringn(t, n);
    return v ? v : json_string("\xEF\xBF\xBD");
}

int64_t srv_logprobs_kept(const srv_job *j) {
    int64_t n = j->n_lps;
    while (j->stopper.stopped && n > 0 && j->lps[n - 1].off >= j->n_text)
        n--;
    return n;
}

int64_t srv_logprobs_upto(const srv_job *j, size_t upto) {
    int64_t n = 0;
    while (n < j->n_lps && j->lps[n].off < upto && j->lps[n].off + j->lps[n].len <= upto)
        n++;
    return n;
}

static json_t *bytes_json(const char *p, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

/* A string of n bytes that may not be whole UTF-8 (an alternative that only begins a
 * character): its valid prefix, then U+FFFD for the rest (its bytes say exactly). */
static json_t *lossy_str(const char *p, size_t n) {
    const size_t ok = srv_utf8_valid_prefix(p, n);
    if (ok == n)
        return srv_text_str(p, n);
    char buf[64];
    const size_t k = ok < sizeof buf - 4 ? ok : sizeof buf - 4;
    memcpy(buf, p, k);
    memcpy(buf + k, "\xEF\xBF\xBD", 3);
    return srv_text_str(buf, k + 3);
}

/* An alternative token's text in a token's place (after the token before it, prev): its bytes,
 * with those of a character it only begins; buf holds st_detok_max_bytes + 4. */
static size_t alt_text(const srv *s, int32_t prev, int32_t tok, char *buf, size_t cap) {
    st_detok d;
    size_t nb = 0;
    st_detok_init(&d, s->tok);
    st_detok_set_prev(&d, prev);
    if (st_detok_push(&d, tok, buf, cap, &nb) != ST_OK)
        nb = 0;
    if (d.n_pend <= cap - nb) {
        memcpy(buf + nb, d.pend, d.n_pend);
        nb += d.n_pend;
    }
    return nb;
}

/* The text of record r in the answer: its bytes of j->text, cut where a stop string cut it. */
static const char *record_text(const srv_job *j, const srv_lp *r, size_t *len) {
    const size_t off = r->off < j->n_text ? r->off : j->n_text;
    *len = r->off + r->len <= j->n_text ? r->len : j->n_text - off;
    return j->text ? j->text + off : "";
}

/* SGLang's return_logprob: output_token_logprobs [[LOGPROB, ID, TEXT or null], ...] and
 * output_top_logprobs (top_logprobs_num of them per token, null when 0), added to mi. */
static void sglang_logprobs(const srv_job *j, json_t *mi) {
    const srv *s = j->srv;
    const int text = j->req.lp_text;
    const size_t cap = st_detok_max_bytes(s->tok) + 4;
    char *buf = malloc(cap);
    json_t *out = json_array(), *tops = json_array();
    const int64_t n = srv_logprobs_kept(j);
    for (int64_t i = 0; buf && out && tops && i < n; i++) {
        const srv_lp *r = &j->lps[i];
        size_t len;
        const char *t = record_text(j, r, &len);
        json_array_append_new(out, json_pack("[f,i,o]", (double)r->lp.logprob, r->lp.token,
                                             text ? srv_text_str(t, len) : json_null()));
        if (!j->req.top_logprobs) {
            json_array_append_new(tops, json_null());
            continue;
        }
        json_t *top = json_array();
        for (int k = 0; top && k < r->lp.n_top; k++) {
            const size_t nb = text ? alt_text(s, r->prev, r->lp.top_token[k], buf, cap) : 0;
            json_array_append_new(top, json_pack("[f,i,o]", (double)r->lp.top_logprob[k],
                                                 r->lp.top_token[k],
                                                 text ? lossy_str(buf, nb) : json_null()));
        }
        json_array_append_new(tops, top);
    }
    free(buf);
    json_object_set_new(mi, "output_token_logprobs", out ? out : json_null());
    json_object_set_new(mi, "output_top_logprobs", tops ? tops : json_null());
}

/* Completions' echo with logprobs: the prompt's records into the arrays (the first token's
 * logprob and top_logprobs null, as OpenAI's). */
static void prompt_records(const srv *s, const srv_job *lead, char *buf, size_t cap, json_t *tokens,
                           json_t *lps, json_t *tops, json_t *offs) {
    for (int64_t i = 0; i < lead->n_plps; i++) {
        const srv_lp *r = &lead->plps[i];
        json_array_append_new(tokens, srv_text_str(lead->ptext + r->off, r->len));
        json_array_append_new(offs, json_integer((json_int_t)r->off));
        if (i == 0) {
            json_array_append_new(lps, json_null());
            json_array_append_new(tops, json_null());
            continue;
        }
        json_array_append_new(lps, json_real((double)r->lp.logprob));
        json_t *top = json_object();
        for (int k = 0; top && k < r->lp.n_top; k++) {
            const size_t nb = alt_text(s, r->prev, r->lp.top_token[k], buf, cap);
            json_t *key = lossy_str(buf, nb);
            if (key && !json_object_get(top, json_string_value(key)))
                json_object_set_new(top, json_string_value(key),
                                    json_real((double)r->lp.top_logprob[k]));
            json_decref(key);
        }
        json_array_append_new(tops, top);
    }
}

json_t *srv_logprobs_json(const srv *s, const srv_job *j, int64_t from, int64_t to, int prompt) {
    const int chat = j->req.chat;
    const size_t cap = st_detok_max_bytes(s->tok) + 4;
    char *buf = malloc(cap);
    json_t *content = json_array(), *tokens = json_array(), *lps = json_array(),
           *tops = json_array(), *offs = json_array();
    if (!buf || !content || !tokens || !lps || !tops || !offs)
        goto fail;
    const srv_job *lead = j->lead ? j->lead : j;
    if (prompt && !chat && lead->plps)
        prompt_records(s, lead, buf, cap, tokens, lps, tops, offs);
    for (int64_t i = from; i < to; i++) {
        const srv_lp *r = &j->lps[i];
        size_t len;
        const char *t = record_text(j, r, &len);
        const size_t off = (size_t)(t - (j->text ? j->text : t)) + j->n_echo;
        json_t *top = chat ? json_array() : json_object();
        for (int k = 0; top && k < r->lp.n_top; k++) {
            const size_t nb = alt_text(s, r->prev, r->lp.top_token[k], buf, cap);
            if (chat) {
                json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", lossy_str(buf, nb),
                                                     "logprob", (double)r->lp.top_logprob[k],
                                                     "bytes", bytes_json(buf, nb)));
            } else {
                json_t *key = lossy_str(buf, nb);
                if (key && !json_object_get(top, json_string_value(key)))
                    json_object_set_new(top, json_string_value(key),
                                        json_real((double)r->lp.top_logprob[k]));
                json_decref(key);
            }
        }
        if (chat) {
            json_array_append_new(content,
                                  json_pack("{s:o,s:f,s:o,s:o}", "token", srv_text_str(t, len),
                                            "logprob", (double)r->lp.logprob, "bytes",
                                            bytes_json(t, len), "top_logprobs", top));
        } else {
            json_array_append_new(tokens, srv_text_str(t, len));
            json_array_append_new(lps, json_real((double)r->lp.logprob));
            json_array_append_new(tops, top);
            json_array_append_new(offs, json_integer((json_int_t)off));
        }
    }
    free(buf);
    if (chat) {
        json_decref(tokens), json_decref(lps), json_decref(tops), json_decref(offs);
        return json_pack("{s:o,s:n}", "content", content, "refusal");
    }
    json_decref(content);
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs",
                     tops, "text_offset", offs);
fail:
    free(buf);
    json_decref(content), json_decref(tokens), json_decref(lps), json_decref(tops);
    json_decref(offs);
    return NULL;
}

/* SGLang's /generate answer: the text and meta_info (ids, token counts, finish_reason as an
 * object: {"type": "length", "length": N} or {"type": "stop"} with "matched": the stop string,
 * and the speculative fields). */
static json_t *sglang_response(const srv_job *j) {
    json_t *fin;
    if (j->stopper.stopped)
        fin = json_pack("{s:s,s:s}", "type", "stop", "matched", j->req.stops[j->stopper.matched]);
    else if (!strcmp(srv_finish_reason(j), "length"))
        fin = json_pack("{s:s,s:I}", "type", "length", "length", (json_int_t)j->stats.gen_tokens);
    else
        fin = json_pack("{s:s}", "type", "stop");
    json_t *mi = srv_spec_info(j);
    if (mi)
        json_object_update_new(mi,
                               json_pack("{s:s,s:I,s:I,s:I,s:o}", "id", j->id, "prompt_tokens",
                                         (json_int_t)j->n_prompt, "completion_tokens",
                                         (json_int_t)j->stats.gen_tokens, "cached_tokens",
                                         (json_int_t)j->stats.reused_tokens, "finish_reason", fin));
    else
        json_decref(fin);
    if (mi && j->req.logprobs)
        sglang_logprobs(j, mi);
    return json_pack("{s:o,s:o}", "text", srv_text_str(j->text ? j->text : "", j->n_text),
                     "meta_info", mi);
}

/* The sum of the log-probabilities of a choice's kept tokens (best_of's score). */
static double cumulative_logprob(const srv_job *j) {
    double sum = 0;
    const int64_t n = srv_logprobs_kept(j);
    for (int64_t i = 0; i < n; i++)
        sum += j->lps[i].lp.logprob;
    return sum;
}

/* A choice's text: the echoed prompt, then what it generated (stop strings cut). */
json_t *srv_choice_text(const srv_job *c, const char *t, size_t n, int with_echo) {
    if (!with_echo || !c->n_echo)
        return srv_text_str(t, n);
    char *b = malloc(c->n_echo + n + 1);
    if (!b)
        return NULL;
    memcpy(b, c->echo, c->n_echo);
    memcpy(b + c->n_echo, t, n);
    json_t *v = srv_text_str(b, c->n_echo + n);
    free(b);
    return v;
}

json_t *srv_full_response(const srv_job *j) {
    if (j->req.sglang)
        return sglang_response(j);
    /* the choices answered: all n in order, or best_of's n highest cumulative log-probabilities
     * (ties: the lower choice first), numbered in that order */
    const srv_job *order[SRV_MAX_CHOICES];
    double score[SRV_MAX_CHOICES];
    const int total = j->n_more + 1;
    for (int i = 0; i < total; i++) {
        const srv_job *c = srv_choice((srv_job *)j, i);
        double sc = j->req.best_of > j->req.n ? cumulative_logprob(c) : -(double)i;
        int k = i;
        while (k > 0 && score[k - 1] < sc) {
            order[k] = order[k - 1];
            score[k] = score[k - 1];
            k--;
        }
        order[k] = c;
        score[k] = sc;
    }
    json_t *choices = json_array();
    for (int i = 0; choices && i < j->req.n; i++) {
        const srv_job *c = order[i];
        json_t *lp = j->req.logprobs ? srv_logprobs_json(c->srv, c, 0, srv_logprobs_kept(c), 1)
                                     : json_null();
        json_t *text = srv_choice_text(c, c->text ? c->text : "", c->n_text, 1);
        if (j->req.chat && c->n_calls) { /* content: the text before the calls, or null */
            json_decref(text);
            json_t *msg =
                json_pack("{s:s,s:o,s:o}", "role", "assistant", "content",
                          c->content_len ? srv_text_str(c->text, c->content_len) : json_null(),
                          "tool_calls", calls_json(c));
            json_array_append_new(choices,
                                  json_pack("{s:i,s:o,s:o,s:s}", "index", i, "message", msg,
                                            "logprobs", lp, "finish_reason", srv_finish_reason(c)));
        } else if (j->req.chat)
            json_array_append_new(choices,
                                  json_pack("{s:i,s:{s:s,s:o},s:o,s:s}", "index", i, "message",
                                            "role", "assistant", "content", text, "logprobs", lp,
                                            "finish_reason", srv_finish_reason(c)));
        else
            json_array_append_new(choices,
                                  json_pack("{s:i,s:o,s:o,s:s}", "index", i, "text", text,
                                            "logprobs", lp, "finish_reason", srv_finish_reason(c)));
    }
    return json_pack("{s:s,s:s,s:I,s:s,s:o,s:o,s:o}", "id", j->id, "object",
                     j->req.chat ? "chat.completion" : "text_completion", "created",
                     (json_int_t)j->created, "model", j->srv->model_name, "choices", choices,
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

/* The prompt's token ids; 0, or an HTTP status with a message in err and the field in param. */
static unsigned build_prompt(srv *s, srv_job *j, char *err, char *param) {
    const srv_request *r = &j->req;
    const char *pf = r->chat     ? "messages"
                     : r->sglang ? (r->prompt_ids ? "input_ids" : "text")
                                 : "prompt";
    const char *mf = r->sglang ? "sampling_params.max_new_tokens" : "max_tokens";
    const int add_bos = !s->o.c.no_bos && st_tokenizer_add_bos_default(s->tok);
    int64_t cap = 0;
    if (!r->chat && r->prompt_ids) {
        int32_t nv = st_tokenizer_n_vocab(s->tok);
        for (int64_t i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] >= nv) {
                snprintf(err, SRV_ERR_CAP, "%s[%" PRId64 "] = %d is not a token id (< %d)", pf, i,
                         r->prompt_ids[i], nv);
                snprintf(param, SRV_ERR_CAP, "%s", pf);
                return 400;
            }
        if (push_ids(&j->prompt, &j->n_prompt, &cap, r->prompt_ids, r->n_prompt_ids))
            return 500;
    } else if (!r->chat) {
        const int tr = cli_tokenize_max(s->tok, r->prompt, r->prompt_len, add_bos, s->o.max_prompt,
                                        &j->prompt, &j->n_prompt);
        if (tr == 1) {
            snprintf(param, SRV_ERR_CAP, "%s", pf);
            return too_long(s, j->n_prompt, err);
        }
        if (tr) {
            snprintf(err, SRV_ERR_CAP, "%s: %s", pf, st_last_error());
            snprintf(param, SRV_ERR_CAP, "%s", pf);
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
        if (srv_chat_render_tools(s->tmpl, r->msgs, r->n_msgs, r->tools, r->n_tools, &s->specials,
                                  &rd, err)) {
            snprintf(param, SRV_ERR_CAP, "messages");
            return 400;
        }
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
                snprintf(param, SRV_ERR_CAP, "messages");
                return too_long(s, s->o.max_prompt + 1, err); /* the rest is not counted */
            }
            if (tr || push_ids(&j->prompt, &j->n_prompt, &cap, part, np)) {
                snprintf(err, SRV_ERR_CAP, "chat prompt: %s", st_last_error());
                snprintf(param, SRV_ERR_CAP, "messages");
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
    if (j->n_prompt > s->o.max_prompt) {
        snprintf(param, SRV_ERR_CAP, "%s", pf);
        return too_long(s, j->n_prompt, err);
    }
    int64_t room = s->n_ctx - j->n_prompt;
    if (r->max_tokens >= 0) { /* 0: echo alone */
        if (r->max_tokens > s->o.max_tokens_limit) {
            snprintf(err, SRV_ERR_CAP, "%s is %" PRId64 "; this server allows at most %ld", mf,
                     r->max_tokens, s->o.max_tokens_limit);
            snprintf(param, SRV_ERR_CAP, "%s", mf);
            return 400;
        }
        if (r->max_tokens > room) {
            snprintf(param, SRV_ERR_CAP, "%s", mf);
            snprintf(err, SRV_ERR_CAP,
                     "this model's maximum context length is %d tokens; the prompt has %" PRId64
                     " and %s asks for %" PRId64,
                     s->n_ctx, j->n_prompt, mf, r->max_tokens);
            return 400;
        }
        j->n_predict = r->max_tokens;
    } else {
        int64_t d = r->chat     ? room
                    : r->sglang ? SRV_SGLANG_MAX_NEW_TOKENS
                                : s->o.default_max_tokens;
        if (d > room)
            d = room;
        if (d > s->o.max_tokens_limit)
            d = s->o.max_tokens_limit;
        j->n_predict = d;
    }
    return 0;
}

/* The prompt's text for echo: as sent, or its token ids detokenized; with logprobs the records
 * of its tokens too (their text pieces: the prompt detokenized token by token, the bytes a
 * token leaves pending going to the one that completes them). 0, or -1 out of memory. */
static int echo_text(const srv *s, srv_job *j) {
    const int lp = j->req.logprobs;
    if (lp && !(j->plps = calloc((size_t)j->n_prompt, sizeof *j->plps)))
        return -1;
    st_detok d;
    st_detok_init(&d, s->tok);
    size_t cap = 64, n = 0, nb = 0;
    char *t = malloc(cap);
    for (int64_t i = 0; t && i <= j->n_prompt; i++) {
        if (n + j->tok_cap > cap) {
            cap = (n + j->tok_cap) * 2;
            char *b = realloc(t, cap);
            if (!b)
                break;
            t = b;
        }
        st_status rc = i < j->n_prompt ? st_detok_push(&d, j->prompt[i], t + n, cap - n, &nb)
                                       : st_detok_flush(&d, t + n, cap - n, &nb);
        nb = rc == ST_OK ? nb : 0;
        if (lp && i < j->n_prompt)
            j->plps[i] = (srv_lp){.lp = {.token = j->prompt[i]},
                                  .prev = i > 0 ? j->prompt[i - 1] : -1,
                                  .off = n,
                                  .len = nb};
        else if (lp && j->n_prompt > 0)
            j->plps[j->n_prompt - 1].len += nb;
        n += nb;
        if (i < j->n_prompt)
            continue;
        if (lp) {
            j->ptext = t;
            j->n_plps = 1; /* the first token's record; the engine's follow */
        }
        if (j->req.prompt) { /* as sent */
            if (!lp)
                free(t);
            j->echo = malloc(j->req.prompt_len + 1);
            if (!j->echo)
                return -1;
            memcpy(j->echo, j->req.prompt, j->req.prompt_len);
            j->n_echo = j->req.prompt_len;
        } else if (lp) {
            j->echo = malloc(n + 1);
            if (!j->echo)
                return -1;
            memcpy(j->echo, t, n);
            j->n_echo = n;
        } else {
            j->echo = t;
            j->n_echo = n;
        }
        return 0;
    }
    free(t);
    return -1;
}

/* Choice i of lead's request: a job of its own with the lead's prompt and fields, seeded with
 * the lead's seed + i (so a seeded request's choices are each reproducible). NULL out of
 * memory. */
static srv_job *job_sibling(srv *s, srv_job *lead, int i) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->srv = s;
    j->refs = 1; /* the lead's */
    j->req = lead->req;
    j->req.prompt = NULL, j->req.prompt_ids = NULL, j->req.msgs = NULL, j->req.n_msgs = 0;
    j->req.bias = NULL, j->req.sp.logit_bias = NULL;
    j->req.n_stops = 0;
    j->req.tools = NULL, j->req.n_tools = 0, j->req.tool_choice_name = NULL; /* the lead's */
    j->req.grammar = lead->req.grammar ? strdup(lead->req.grammar) : NULL;
    j->req.sp.grammar = j->req.grammar;
    pthread_cond_init(&j->cv, NULL);
    pthread_mutex_lock(&s->mu);
    s->live_jobs++;
    pthread_mutex_unlock(&s->mu);
    int ok = !lead->req.grammar || j->req.grammar;
    for (int k = 0; k < lead->req.n_stops; k++) {
        j->req.stops[k] = strdup(lead->req.stops[k]);
        ok &= j->req.stops[k] != NULL;
        j->req.n_stops++;
    }
    const size_t nb = (size_t)lead->req.sp.n_logit_bias * sizeof *j->req.bias;
    if (nb && (j->req.bias = malloc(nb)) != NULL)
        memcpy(j->req.bias, lead->req.bias, nb);
    ok &= !nb || j->req.bias;
    j->req.sp.logit_bias = j->req.bias;
    j->req.sp.seed = lead->req.sp.seed + (uint64_t)i;
    j->n_prompt = lead->n_prompt;
    j->prompt = malloc((size_t)j->n_prompt * sizeof *j->prompt);
    if (j->prompt)
        memcpy(j->prompt, lead->prompt, (size_t)j->n_prompt * sizeof *j->prompt);
    if (lead->n_echo && (j->echo = malloc(lead->n_echo)) != NULL) {
        memcpy(j->echo, lead->echo, lead->n_echo);
        j->n_echo = lead->n_echo;
    }
    j->n_predict = lead->n_predict;
    memcpy(j->id, lead->id, sizeof j->id);
    j->created = lead->created;
    j->t_submit = lead->t_submit;
    j->tok_cap = lead->tok_cap;
    j->tok_buf = malloc(j->tok_cap);
    j->stopper.stops = (const char *const *)j->req.stops;
    j->stopper.n_stops = j->req.n_stops;
    j->index = i;
    j->lead = lead;
    j->collect_lp = lead->collect_lp;
    st_detok_init(&j->detok, s->tok);
    st_detok_set_prev(&j->detok, j->prompt ? j->prompt[j->n_prompt - 1] : 0);
    j->last_tok = j->prompt ? j->prompt[j->n_prompt - 1] : 0;
    if (!ok || !j->prompt || !j->tok_buf || (lead->n_echo && !j->echo)) {
        pthread_mutex_lock(&s->mu);
        srv_job_release(s, j);
        pthread_mutex_unlock(&s->mu);
        return NULL;
    }
    return j;
}

/* The request's tools on this server's template; with tool_choice required or a named
 * function, the grammar that forces a call. 0, or an HTTP status with err and param. */
static unsigned tools_grammar(srv *s, srv_request *r, char *err, char *param) {
    if (!r->n_tools)
        return 0;
    if (s->tmpl != SRV_TMPL_LLAMA3 && s->tmpl != SRV_TMPL_CHATML && s->tmpl != SRV_TMPL_MISTRAL) {
        snprintf(err, SRV_ERR_CAP,
                 "'tools': this model's chat template (%s) has no tool calling (llama-3, chatml "
                 "and mistral have; choose one with --chat-template)",
                 srv_tmpl_name(s->tmpl));
        snprintf(param, SRV_ERR_CAP, "tools");
        return 400;
    }
    if (r->tool_choice != SRV_TOOLS_REQUIRED && r->tool_choice != SRV_TOOLS_NAMED)
        return 0;
    if (r->grammar) {
        snprintf(err, SRV_ERR_CAP, "give one of '%s' and 'tool_choice' (a forced call), not both",
                 r->grammar_from);
        snprintf(param, SRV_ERR_CAP, "tool_choice");
        return 400;
    }
    char *gbnf = NULL;
    st_grammar *g = NULL;
    if (srv_tools_grammar(s->tmpl, r, &gbnf, err) || st_grammar_parse(gbnf, strlen(gbnf), &g)) {
        if (gbnf)
            snprintf(err, SRV_ERR_CAP, "tool_choice: %s", st_last_error());
        free(gbnf);
        snprintf(param, SRV_ERR_CAP, "tools");
        return !strcmp(err, "out of memory") ? 500 : 400;
    }
    st_grammar_free(g);
    r->grammar = gbnf;
    r->sp.grammar = gbnf;
    snprintf(r->grammar_from, sizeof r->grammar_from, "tool_choice");
    return 0;
}

/* Creates a job from a checked request (moved into it); 0, or an HTTP status with err. */
unsigned srv_job_create(srv *s, srv_request *req, srv_job **out, char *err, char *param) {
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
    snprintf(j->id, sizeof j->id, "%s-%08" PRIx64 "-%" PRIu64, j->req.chat ? "chatcmpl" : "cmpl",
             s->id_nonce, seq);
    /* sampling: the request's fields, else the server's flags, else OpenAI's defaults */
    unsigned code = j->tok_buf ? tools_grammar(s, &j->req, err, param) : 500;
    if (!code)
        code = build_prompt(s, j, err, param);
    if (code == 500 && !err[0])
        snprintf(err, SRV_ERR_CAP, "out of memory");
    for (int32_t i = 0; !code && i < j->req.sp.n_logit_bias; i++)
        if (j->req.bias[i].token >= st_tokenizer_n_vocab(s->tok)) {
            const char *lf = j->req.sglang ? "sampling_params.logit_bias" : "logit_bias";
            snprintf(err, SRV_ERR_CAP, "'%s' has token %d, not a token id (< %d)", lf,
                     j->req.bias[i].token, st_tokenizer_n_vocab(s->tok));
            snprintf(param, SRV_ERR_CAP, "%s", lf);
            code = 400;
        }
    if (!code) {
        st_detok_init(&j->detok, s->tok);
        st_detok_set_prev(&j->detok, j->prompt[j->n_prompt - 1]);
        j->last_tok = j->prompt[j->n_prompt - 1];
        if (!j->req.seed_set) { /* a fresh seed per request */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            j->req.sp.seed = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
                             (seq * 0x9E3779B97F4A7C15ull);
        }
        j->collect_lp = j->req.logprobs || j->req.best_of > j->req.n;
        if (j->req.echo && echo_text(s, j))
            code = 500;
        for (int i = 1; !code && i < j->req.best_of; i++) {
            j->more[j->n_more] = job_sibling(s, j, i);
            if (!j->more[j->n_more])
                code = 500;
            else
                j->n_more++;
        }
        if (code == 500)
            snprintf(err, SRV_ERR_CAP, "out of memory");
    }
    *out = j;
    return code;
}
