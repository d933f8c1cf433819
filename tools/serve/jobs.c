/*
 * jobs.c: a request's life between its connection and the engine. One engine thread owns the
 * engine and makes every st_engine_* call (submissions and cancellations reach it through a
 * list), so the engine needs no lock. A job is shared by its connection and the engine,
 * reference-counted, its text guarded by the server mutex.
 */
#define _GNU_SOURCE
#include "serve.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------- */
/* Jobs                                                                                      */

void srv_job_release(srv *s, srv_job *j) {
    /* called with s->mu held */
    if (--j->refs > 0)
        return;
    for (int i = 0; j->wake_pending && i < s->n_wake; i++) /* a sibling's news, due to it */
        if (s->wake[i] == j)
            s->wake[i] = s->wake[--s->n_wake];
    for (int i = 0; i < j->n_more; i++) {
        j->more[i]->lead = NULL;
        srv_job_release(s, j->more[i]);
    }
    free(j->echo);
    free(j->plps);
    free(j->ptext);
    free(j->prompt);
    free(j->text);
    free(j->lps);
    srv_calls_free(j->calls, j->n_calls);
    srv_stopper_free(&j->stopper);
    srv_request_free(&j->req);
    pthread_cond_destroy(&j->cv);
    free(j->tok_buf);
    s->live_jobs--;
    pthread_cond_broadcast(&s->drain_cv);
    free(j);
}

static int job_append(srv_job *j, const char *t, size_t n) {
    if (n == 0)
        return 0;
    if (j->n_text + n + 1 > j->cap_text) {
        size_t cap = (j->n_text + n + 1) * 2 + 256;
        char *b = realloc(j->text, cap);
        if (!b)
            return -1;
        j->text = b;
        j->cap_text = cap;
    }
    memcpy(j->text + j->n_text, t, n);
    j->n_text += n;
    j->text[j->n_text] = 0;
    return 0;
}

/* The job whose connection waits for a choice's news: its lead's. */
static srv_job *waiter(srv_job *j) { return j->lead ? j->lead : j; }

/* Text through the stop-string matcher into the job's text; 1 when a stop string matched. */
static int job_text(srv_job *j, const char *t, size_t n, int final) {
    const char *out;
    size_t n_out;
    if (j->n_gen < j->req.sp.min_tokens) /* min_tokens: no stop string ends in this text */
        j->stopper.min_end = j->stopper.n_in + n;
    if (srv_stop_add(&j->stopper, t, n, final, &out, &n_out) || job_append(j, out, n_out)) {
        j->oom = 1;
        return 1;
    }
    return j->stopper.stopped;
}

_Static_assert(SRV_MAX_WAKE >= ST_GEN_MAX_BATCH, "a step's emitting jobs fit the wake list");

/* Engine thread, just before on_emit of the same token: its log-probabilities (its text's place
 * is filled in by on_emit). */
static void on_logprobs(void *user, const st_token_logprobs *lp) {
    srv_job *j = user;
    srv *s = j->srv;
    pthread_mutex_lock(&s->mu);
    if (j->n_lps == j->cap_lps) {
        int64_t cap = j->cap_lps ? j->cap_lps * 2 : 64;
        srv_lp *b = realloc(j->lps, (size_t)cap * sizeof *b);
        if (!b) {
            j->oom = 1;
            pthread_mutex_unlock(&s->mu);
            return;
        }
        j->lps = b;
        j->cap_lps = cap;
    }
    j->lps[j->n_lps++] = (srv_lp){*lp, j->last_tok, j->n_raw, 0};
    pthread_mutex_unlock(&s->mu);
}

/* Engine thread, during the prefill of an echo with logprobs: prompt token n_plps's. */
static void on_prompt_logprobs(void *user, const st_token_logprobs *lp) {
    srv_job *j = user;
    pthread_mutex_lock(&j->srv->mu);
    if (j->n_plps < j->n_prompt)
        j->plps[j->n_plps++].lp = *lp;
    pthread_mutex_unlock(&j->srv->mu);
}

/* Engine thread, inside st_engine_step. */
static int on_emit(void *user, int32_t token) {
    srv_job *j = user;
    srv *s = j->srv;
    pthread_mutex_lock(&s->mu);
    int stop = j->cancelled;
    if (!stop) {
        double now = st_time_seconds();
        if (j->n_gen == 0)
            j->t_first = now;
        j->n_gen++;
        size_t nb = 0;
        if (st_detok_push(&j->detok, token, j->tok_buf, j->tok_cap, &nb) != ST_OK) {
            nb = 3;
            stop = job_text(j, "\xEF\xBF\xBD", 3, 0);
        } else if (nb) {
            stop = job_text(j, j->tok_buf, nb, 0);
        }
        if (j->collect_lp && j->n_lps == j->n_gen)
            j->lps[j->n_lps - 1].len = nb;
        j->n_raw += nb;
        j->last_tok = token;
        srv_job *w = waiter(j);
        if (!w->wake_pending && s->n_wake < SRV_MAX_WAKE) { /* woken after the step */
            s->wake[s->n_wake++] = w;
            w->wake_pending = 1;
        } else if (!w->wake_pending) {
            pthread_cond_broadcast(&w->cv);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return stop;
}

/* --log-level info: one line per finished request: its id, prompt and generated tokens, time to
 * first token, decoding tokens/s, tau, finish reason and session key if it came with one (debug:
 * its queue time and accepted drafts per step too); --log-format json: those fields by name.
 * With s->mu held. */
static void log_request(const srv *s, const srv_job *j) {
    const st_request_stats *st = &j->stats;
    const double decode_s = (st->total_ms - st->ttft_ms) / 1e3;
    const char *why = st->status != ST_OK ? "error"
                      : j->cancelled      ? "cancelled"
                                          : st_stop_reason_name(st->stop_reason);
    const double ttft = st->ttft_ms < 0 ? 0.0 : st->ttft_ms;
    const double tok_s =
        st->gen_tokens > 1 && decode_s > 0 ? (double)(st->gen_tokens - 1) / decode_s : 0.0;
    const int debug = s->o.log_level >= SRV_LOG_DEBUG;
    if (s->o.log_json) {
        json_t *v =
            json_pack("{s:f,s:s,s:s,s:s,s:I,s:I,s:I,s:f,s:f,s:f,s:s}", "time", srv_unix_time(),
                      "level", "info", "msg", "request", "id", j->id, "prompt_tokens",
                      (json_int_t)st->prompt_tokens, "cached_tokens", (json_int_t)st->reused_tokens,
                      "gen_tokens", (json_int_t)st->gen_tokens, "ttft_ms", ttft, "tok_s", tok_s,
                      "tau", st->tau, "finish", why);
        if (v && j->session[0])
            json_object_set_new(v, "session", json_string(j->session));
        if (v && debug) {
            json_t *h = json_array();
            for (int a = 0; a <= ST_SPEC_MAX_S; a++)
                json_array_append_new(h, json_integer(st->accept_hist[a]));
            json_object_update_new(v, json_pack("{s:f,s:I,s:I,s:o}", "queue_ms", st->queue_ms,
                                                "spec_steps", (json_int_t)st->spec_steps,
                                                "plain_steps", (json_int_t)st->plain_steps,
                                                "accept_hist", h));
        }
        srv_log_json(v);
        return;
    }
    char hist[256] = "";
    if (debug) {
        size_t n = (size_t)snprintf(hist, sizeof hist,
                                    ", queue %.1f ms, %" PRId64 " speculative + %" PRId64
                                    " plain steps, accepted",
                                    st->queue_ms, st->spec_steps, st->plain_steps);
        for (int a = 0; a <= ST_SPEC_MAX_S && n < sizeof hist; a++)
            if (st->accept_hist[a])
                n += (size_t)snprintf(hist + n, sizeof hist - n, " %d:%" PRId64, a,
                                      st->accept_hist[a]);
    }
    srv_log(s, SRV_LOG_INFO,
            "%s: prompt %" PRId64 " tokens (%" PRId64 " cached), gen %" PRId64
            " tokens, ttft %.1f ms, %.1f tok/s, tau %.2f, finish %s%s%s%s",
            j->id, st->prompt_tokens, st->reused_tokens, st->gen_tokens, ttft, tok_s, st->tau, why,
            j->session[0] ? ", session " : "", j->session, hist);
}

static void on_finish(void *user, const st_request_stats *st) {
    srv_job *j = user;
    srv *s = j->srv;
    const char *msg = st->status != ST_OK ? st_last_error() : "";
    pthread_mutex_lock(&s->mu);
    j->stats = *st;
    j->status = st->status;
    snprintf(j->error, sizeof j->error, "%s", msg);
    if (st->status == ST_OK && !j->stopper.stopped && !j->cancelled) {
        size_t nb = 0;
        if (st_detok_flush(&j->detok, j->tok_buf, j->tok_cap, &nb) == ST_OK) {
            job_text(j, j->tok_buf, nb, 1);
            if (j->n_lps > 0 && j->lps[j->n_lps - 1].off + j->lps[j->n_lps - 1].len == j->n_raw)
                j->lps[j->n_lps - 1].len += nb; /* the held bytes of the last token */
            j->n_raw += nb;
        } else
            job_text(j, "", 0, 1);
    }
    j->t_done = st_time_seconds();
    srv_job_calls(j);
    j->done = 1;
    if (j->wake_pending) /* woken now; it may be freed below */
        for (int i = 0; i < s->n_wake; i++)
            if (s->wake[i] == j) {
                s->wake[i] = s->wake[--s->n_wake];
                j->wake_pending = 0;
                break;
            }
    srv_metrics_finish(s, j);
    if (s->o.log_level >= SRV_LOG_INFO)
        log_request(s, j);
    srv_job *lead = j->lead;
    pthread_cond_broadcast(&waiter(j)->cv);
    s->n_in_engine--;
    srv_job_release(s, j);
    if (lead) /* the sibling's hold on it */
        srv_job_release(s, lead);
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------------------------------- */
/* The engine thread                                                                         */

void srv_job_refuse(srv *s, srv_job *j, st_status rc, const char *msg) {
    /* with s->mu held: the engine refused the job (no callback will come) */
    j->status = rc;
    snprintf(j->error, sizeof j->error, "%s", msg);
    j->done = 1;
    j->refused = 1;
    srv_job *lead = j->lead;
    pthread_cond_broadcast(&waiter(j)->cv);
    s->n_in_engine--;
    srv_job_release(s, j);
    if (lead)
        srv_job_release(s, lead);
}

/* With s->mu held, after a step: the held siblings whose lead has its first token (its prompt
 * is then in the prefix cache) or has ended go to the pending list; those of a lead that
 * failed end with its error. */
static void release_held(srv *s) {
    srv_job **link = &s->held;
    while (*link) {
        srv_job *j = *link, *l = j->lead;
        if (!(l->n_gen > 0 || l->done || j->cancelled)) {
            link = &j->next;
            continue;
        }
        *link = j->next;
        j->next = NULL;
        if (l->done && l->status != ST_OK) {
            srv_job_refuse(s, j, l->status, l->error);
            continue;
        }
        j->next = s->pending;
        s->pending = j;
        if (!s->pending_tail)
            s->pending_tail = j;
        s->n_pending++;
    }
}

/* With s->mu held, after a step: auto's drafting state when it changes (once known), with the
 * estimates behind it. */
static void log_outlook(srv *s) {
    const st_spec_outlook *ol = &s->engine_stats.outlook;
    if (!ol->known || ol->drafting == s->ol_logged)
        return;
    s->ol_logged = ol->drafting;
    if (s->o.log_level >= SRV_LOG_INFO) {
        char line[512];
        cli_outlook_line(ol, s->o.ep.gen.spec.algo, line, sizeof line);
        srv_log(s, SRV_LOG_INFO, "%s", line);
    }
}

void *srv_engine_main(void *arg) {
    srv *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->pending && !s->n_cancels && s->engine_busy == 0 && !s->stop_engine)
            pthread_cond_wait(&s->engine_cv, &s->mu);
        if (s->stop_engine) { /* what is left is cancelled by st_engine_free */
            while (s->held) {
                srv_job *j = s->held;
                s->held = j->next;
                srv_job_refuse(s, j, ST_ERR_BUSY, "the server shut down");
            }
            break;
        }
        srv_job *pend = s->pending;
        s->pending = s->pending_tail = NULL;
        s->n_pending = 0;
        uint64_t cancels[SRV_MAX_CANCELS];
        int n_cancels = s->n_cancels;
        memcpy(cancels, s->cancels, (size_t)n_cancels * sizeof *cancels);
        s->n_cancels = 0;
        pthread_mutex_unlock(&s->mu);

        while (pend) {
            srv_job *j = pend;
            pend = j->next;
            st_request_params rp = {.n_predict = j->n_predict,
                                    .sampler = j->req.sp,
                                    .on_logprobs = j->collect_lp ? on_logprobs : NULL,
                                    .top_logprobs = j->req.top_logprobs,
                                    .on_prompt_logprobs = j->plps ? on_prompt_logprobs : NULL,
                                    .spec_max_tree = j->req.spec_max_tree};
            uint64_t id = 0;
            st_status rc = st_engine_submit(s->engine, j->prompt, j->n_prompt, &rp, on_emit,
                                            on_finish, j, &id);
            const char *msg = rc != ST_OK ? st_last_error() : "";
            pthread_mutex_lock(&s->mu);
            for (int i = 0; i < j->n_more; i++) { /* its siblings wait for its prefill */
                srv_job *m = j->more[i];
                if (rc != ST_OK)
                    srv_job_refuse(s, m, rc, msg);
                else
                    m->next = s->held, s->held = m;
            }
            if (rc != ST_OK)
                srv_job_refuse(s, j, rc, msg);
            else {
                j->engine_id = id;
                pthread_cond_broadcast(&waiter(j)->cv);
                if (j->cancelled && !j->done) /* cancelled before it reached the engine */
                    st_engine_cancel(s->engine, id);
            }
            pthread_mutex_unlock(&s->mu);
        }
        for (int i = 0; i < n_cancels; i++)
            st_engine_cancel(s->engine, cancels[i]); /* ST_ERR_RANGE: it already finished */

        if (st_engine_running(s->engine) + st_engine_queued(s->engine) > 0) {
            st_status rc = st_engine_step(s->engine);
            if (rc != ST_OK)
                srv_log(s, SRV_LOG_ERROR, "engine step: %s", st_last_error());
        }
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < s->n_wake; i++) {
            s->wake[i]->wake_pending = 0;
            pthread_cond_broadcast(&s->wake[i]->cv);
        }
        s->n_wake = 0;
        release_held(s);
        s->engine_busy = st_engine_running(s->engine) + st_engine_queued(s->engine);
        s->gauge_running = st_engine_running(s->engine);
        s->gauge_queued = st_engine_queued(s->engine);
        s->gauge_kv_used = st_engine_kv_used(s->engine);
        st_engine_get_stats(s->engine, &s->engine_stats);
        log_outlook(s);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Hands a job (and its siblings) to the engine thread. With s->mu held. */
void srv_job_submit(srv *s, srv_job *j) {
    j->refs++; /* the engine's */
    s->n_in_engine++;
    for (int i = 0; i < j->n_more; i++) {
        j->more[i]->refs++;
        j->refs++; /* the sibling's hold on its lead */
        s->n_in_engine++;
    }
    if (s->pending_tail)
        s->pending_tail->next = j;
    else
        s->pending = j;
    s->pending_tail = j;
    s->n_pending++;
    pthread_cond_signal(&s->engine_cv);
}

static void cancel_one(srv *s, srv_job *j) {
    if (j->done || j->cancelled)
        return;
    j->cancelled = 1;
    if (j->engine_id && s->n_cancels < SRV_MAX_CANCELS) {
        s->cancels[s->n_cancels++] = j->engine_id;
        pthread_cond_signal(&s->engine_cv);
    }
    /* else: still pending or held (the engine thread cancels it once submitted), or the list
     * is full (on_emit stops it at its next token) */
}

/* Asks the engine to drop a job and its siblings (its client went away, or the drain timed
 * out). With s->mu held. */
void srv_job_cancel(srv *s, srv_job *j) {
    if (srv_group_done(j) || j->cancelled)
        return;
    if (!j->cut)
        s->metrics.cancelled++;
    for (int i = 0; i <= j->n_more; i++)
        cancel_one(s, srv_choice(j, i));
    j->cancelled = 1;
}
