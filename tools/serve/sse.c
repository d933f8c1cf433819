/*
 * sse.c: the server-sent events of a streamed answer of `spectree serve` (serve.h): each
 * choice's text, logprobs and finish as OpenAI chunks, the usage chunk and "data: [DONE]";
 * http.c's stream reader hands them to libmicrohttpd.
 */
#define _GNU_SOURCE
#include "serve.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *srv_cut_error(const srv *s) {
    char msg[128];
    if (s->cut == SRV_CUT_SIGNAL)
        snprintf(msg, sizeof msg,
                 "the server shut down before this request finished (a second signal)");
    else
        snprintf(msg, sizeof msg,
                 "the server shut down before this request finished (drain timeout, %ld s)",
                 s->o.drain_s);
    return srv_error_obj(503, msg, NULL);
}

static int sse_add(srv_job *j, json_t *v) {
    char *txt = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    if (!txt)
        return -1;
    size_t n = strlen(txt), need = j->n_sse + n + 8;
    char *b = realloc(j->sse, need);
    if (!b) {
        free(txt);
        return -1;
    }
    j->sse = b;
    memcpy(j->sse + j->n_sse, "data: ", 6);
    memcpy(j->sse + j->n_sse + 6, txt, n);
    memcpy(j->sse + j->n_sse + 6 + n, "\n\n", 2);
    j->n_sse += n + 8;
    free(txt);
    return 0;
}

/* A chunk of a stream: choice c's text, and the log-probabilities of the tokens it completes
 * (with the request's logprobs: records [c->n_lp_sent, lp_to), which it then counts as sent;
 * null when there are none); the echoed prompt's chunk (prompt) carries the prompt's. */
static json_t *chunk_lp(srv_job *c, json_t *delta_or_text, const char *finish, int64_t lp_to,
                        int prompt) {
    srv_job *j = c->lead ? c->lead : c;
    json_t *choice, *lp = json_null();
    if (j->req.logprobs && (lp_to > c->n_lp_sent || (prompt && j->plps))) {
        json_decref(lp);
        lp = srv_logprobs_json(j->srv, c, c->n_lp_sent, lp_to, prompt);
        c->n_lp_sent = lp_to;
    }
    if (j->req.chat)
        choice = json_pack("{s:i,s:o,s:o,s:s?}", "index", c->index, "delta", delta_or_text,
                           "logprobs", lp, "finish_reason", finish);
    else
        choice = json_pack("{s:i,s:o,s:o,s:s?}", "index", c->index, "text", delta_or_text,
                           "logprobs", lp, "finish_reason", finish);
    json_t *v = json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", j->id, "object",
                          j->req.chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)j->created, "model", j->srv->model_name, "choices", choice);
    if (v && j->req.include_usage)
        json_object_set_new(v, "usage", json_null());
    return v;
}

static json_t *chunk(srv_job *c, json_t *delta_or_text, const char *finish, int64_t lp_to) {
    return chunk_lp(c, delta_or_text, finish, lp_to, 0);
}

static json_t *text_piece(const srv_job *j, const char *t, size_t n) {
    return j->req.chat ? json_pack("{s:o}", "content", srv_text_str(t, n)) : srv_text_str(t, n);
}

/* A finished choice's tool calls as OpenAI streams them: per call a delta with its index, id,
 * type and name (arguments ""), then one with its arguments. */
static int sse_calls(srv_job *j, srv_job *c) {
    int rc = 0;
    for (int k = 0; k < c->n_calls; k++) {
        const srv_call *cl = &c->calls[k];
        rc |= sse_add(j, chunk(c,
                               json_pack("{s:[{s:i,s:s?,s:s,s:{s:s,s:s}}]}", "tool_calls", "index",
                                         k, "id", cl->id, "type", "function", "function", "name",
                                         cl->name, "arguments", ""),
                               NULL, c->n_lp_sent));
        rc |= sse_add(j, chunk(c,
                               json_pack("{s:[{s:i,s:{s:s}}]}", "tool_calls", "index", k,
                                         "function", "arguments", cl->args),
                               NULL, c->n_lp_sent));
    }
    return rc;
}

/* Adds choice c's events that are due to the lead j's stream (s->mu held): its role (chat),
 * its echoed prompt, its new text, and once it is done its last chunk (finish_reason). */
static int sse_choice(srv_job *j, srv_job *c) {
    int rc = 0;
    if (j->req.chat && !c->sent_role) {
        rc |= sse_add(j, chunk(c, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL,
                               c->n_lp_sent));
        c->sent_role = 1;
    }
    if (c->n_echo && !c->sent_echo && (!j->plps || j->n_plps == j->n_prompt || j->done)) {
        /* once the prompt's log-probabilities are all in */
        rc |= sse_add(j, chunk_lp(c, srv_text_str(c->echo, c->n_echo), NULL, c->n_lp_sent, 1));
        c->sent_echo = 1;
    }
    if (c->n_echo && !c->sent_echo)
        return rc;
    /* with tools: the text that may be a call is held until the answer is done, then sent as
     * tool_calls deltas if it parses as calls, as content if not */
    size_t limit = c->n_text;
    if (srv_tools_active(c) && c->text)
        limit = c->done ? (c->n_calls ? c->content_len : c->n_text)
                        : srv_tools_safe_prefix(c->srv->tmpl, c->text, c->n_text);
    if (limit < c->n_sent)
        limit = c->n_sent;
    size_t avail =
        c->text ? c->n_sent + srv_utf8_valid_prefix(c->text + c->n_sent, limit - c->n_sent) : 0;
    if (avail > c->n_sent) {
        int64_t to = j->req.logprobs ? srv_logprobs_upto(c, avail) : 0;
        if (c->done && to > srv_logprobs_kept(c))
            to = srv_logprobs_kept(c);
        rc |= sse_add(j, chunk(c, text_piece(j, c->text + c->n_sent, avail - c->n_sent), NULL,
                               to > c->n_lp_sent ? to : c->n_lp_sent));
        c->n_sent = avail;
    }
    if (c->done && !c->sent_finish && c->status == ST_OK && !j->cut)
        rc |= sse_calls(j, c);
    if (c->done && !c->sent_finish && c->status == ST_OK && !j->cut) {
        const int64_t kept = j->req.logprobs ? srv_logprobs_kept(c) : 0;
        json_t *last = chunk(c, j->req.chat ? json_object() : json_string(""), srv_finish_reason(c),
                             kept > c->n_lp_sent ? kept : c->n_lp_sent);
        if (last)
            json_object_set_new(last, "meta_info", srv_spec_info(c));
        rc |= sse_add(j, last);
        c->sent_finish = 1;
    }
    return rc;
}

int srv_sse_fill(srv_job *j) {
    int rc = 0;
    for (int i = 0; i <= j->n_more; i++)
        rc |= sse_choice(j, srv_choice(j, i));
    const srv_job *bad = NULL;
    for (int i = 0; i <= j->n_more; i++)
        if (srv_choice(j, i)->done && srv_choice(j, i)->status != ST_OK && !bad)
            bad = srv_choice(j, i);
    if ((!srv_group_done(j) && !j->cut && !bad) || rc)
        return rc ? -1 : 0;
    if (j->cut) {
        rc |= sse_add(j, srv_cut_error(j->srv));
    } else if (bad) {
        json_t *e = srv_error_obj(bad->status == ST_ERR_BUSY ? 503 : 500, bad->error, NULL);
        rc |= sse_add(j, e);
        srv_job_cancel(j->srv, j);
    } else {
        if (j->req.include_usage) {
            json_t *u = json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", j->id, "object",
                                  j->req.chat ? "chat.completion.chunk" : "text_completion",
                                  "created", (json_int_t)j->created, "model", j->srv->model_name,
                                  "choices", "usage", srv_usage_obj(j));
            rc |= sse_add(j, u);
        }
    }
    static const char done_line[] = "data: [DONE]\n\n";
    char *b = realloc(j->sse, j->n_sse + sizeof done_line);
    if (!b)
        return -1;
    j->sse = b;
    memcpy(j->sse + j->n_sse, done_line, sizeof done_line - 1);
    j->n_sse += sizeof done_line - 1;
    j->sent_final = 1;
    return rc ? -1 : 1;
}
