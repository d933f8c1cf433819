/*
 * serve.h: what the files of `spectree serve` share: the server, its options and metrics, and
 * the job (one request shared by its connection thread and the engine thread).
 */
#ifndef ST_SERVE_H
#define ST_SERVE_H

#include "api.h"
#include "common/common.h"
#include "serve_cmd.h"
#include "spectree.h"

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum {
    SRV_SGLANG_MAX_NEW_TOKENS = 128, /* SGLang's max_new_tokens when /generate gives none */
    SRV_MAX_CANCELS = 1024,
    SRV_MAX_WAKE = 64,    /* jobs woken after a step (running requests: at most ST_GEN_MAX_BATCH) */
    SRV_SESSION_MAX = 64, /* bytes of a session key kept for the log line */
};

enum { SRV_CUT_TIMEOUT = 1, SRV_CUT_SIGNAL }; /* why a drain was cut: --drain-timeout, signal */

/* --log-level: what stderr gets (SRV_LOG_ALWAYS: the line with the address, the drain's). */
enum { SRV_LOG_ALWAYS = -1, SRV_LOG_ERROR, SRV_LOG_WARN, SRV_LOG_INFO, SRV_LOG_DEBUG };

typedef struct srv_opts {
    const char *model, *host, *model_name, *api_key;
    long port, max_conns, max_conns_per_ip, max_body, max_prompt, max_tokens_limit, timeout_s;
    long drain_s;
    long default_max_tokens;
    int log_level;    /* SRV_LOG_* (default info) */
    int log_json;     /* --log-format json */
    const char *cors; /* --cors: the allowed origins (a comma-separated list, or *); NULL: off */
    st_engine_params ep;
    cli_common c; /* the flags shared with `generate`; c.sp: request defaults from --temp etc.
                   * (those in c.sp_given) */
    srv_tmpl tmpl;
} srv_opts;

/* A Prometheus histogram with fixed upper bounds. */
enum { SRV_HIST_MAX = 20 };
typedef struct srv_hist {
    int n;
    double le[SRV_HIST_MAX];
    int64_t count[SRV_HIST_MAX + 1]; /* per bucket (not cumulative); [n]: +Inf */
    double sum;
    int64_t total;
} srv_hist;

typedef struct srv_metrics {
    int64_t requests_total;     /* every HTTP request answered */
    int64_t by_code[6];         /* 2xx .. per class: [0] 200, [1] 400, [2] 401/404/405/413,
                                   [3] 500, [4] 503, [5] other */
    int64_t completions, chats; /* generation requests accepted */
    int64_t prompt_tokens, gen_tokens;
    int64_t finished[4]; /* stop, length, cancelled (client gone or cut at the
                            drain timeout), error */
    int64_t cancelled;
    int64_t cut;               /* requests cut at the drain timeout */
    int64_t spec_verify_steps; /* decoding passes of finished requests */
    srv_hist ttft, tpot, e2e, accept_len;
} srv_metrics;

typedef struct srv srv;

/* A completion token's log-probabilities, and where its text is in the answer. */
typedef struct srv_lp {
    st_token_logprobs lp;
    int32_t prev;    /* the token before it: the context of the alternatives' text */
    size_t off, len; /* its text: bytes [off, off + len) of the text before stop strings cut it
                      * (0 bytes for a token that only begins a character; the one that
                      * completes it has the whole character) */
} srv_lp;

typedef struct srv_job {
    srv *srv;
    struct srv_job *next; /* pending list */
    int refs;             /* the connection's and the engine's */
    srv_request req;
    int32_t *prompt;
    int64_t n_prompt;
    int64_t n_predict;
    uint64_t engine_id;
    char id[48]; /* "cmpl-..." / "chatcmpl-..." */
    /* the session key a balancer hashed on (X-Session-Id, else X-User), for the log line:
     * printable ASCII, at most SRV_SESSION_MAX bytes ("" without one) */
    char session[SRV_SESSION_MAX + 1];
    int64_t created;
    /* choices: a request with n or best_of > 1 is a lead job (choice 0, the one its connection
     * holds) and siblings (choices 1..), each a sequence of its own in the engine. The lead
     * holds a reference on each sibling; a sibling in the engine holds one on its lead, so the
     * lead outlives every callback of the group. Siblings reach the engine once the lead's
     * prompt is prefilled (and in the prefix cache: they copy its KV rows). */
    int index;                                 /* its choice: 0 .. best_of - 1 */
    int n_more;                                /* lead: siblings */
    struct srv_job *more[SRV_MAX_CHOICES - 1]; /* lead: (n_more) the siblings */
    struct srv_job *lead;                      /* sibling: its lead (NULL for a lead) */
    int collect_lp; /* log-probabilities computed: the request's, or best_of's ranking */
    char *echo;     /* completions' echo: the prompt's text, before each choice's */
    size_t n_echo;
    /* lead, echo with logprobs: the prompt's tokens (n_prompt), their text pieces (off, len in
     * ptext, the prompt detokenized) and, from the engine, the log-probabilities of tokens
     * 1 .. n_plps - 1 (the first has none) */
    srv_lp *plps;
    int64_t n_plps;
    char *ptext;
    /* output, under srv.mu */
    st_detok detok;
    char *tok_buf;
    size_t tok_cap;
    srv_stopper stopper;
    char *text; /* released text (stop strings cut) */
    size_t n_text, cap_text;
    int64_t n_gen;
    srv_lp *lps; /* (n_lps) req.logprobs: one per completion token */
    int64_t n_lps, cap_lps;
    size_t n_raw;     /* bytes the detokenizer has written (before stop strings) */
    int32_t last_tok; /* the last token emitted (or of the prompt) */
    int done, cancelled, refused, oom;
    int cut;          /* cut at the drain timeout (answered 503 or with an SSE error event) */
    int wake_pending; /* text added in this engine step, its connection not yet woken */
    st_status status;
    char error[256];
    st_request_stats stats;
    double t_submit, t_first, t_done;
    pthread_cond_t cv;
    /* streaming state (connection thread only) */
    size_t n_sent;
    int64_t n_lp_sent; /* log-probabilities streamed */
    int sent_role, sent_final, sent_finish, sent_echo;
    char *sse;
    size_t n_sse, sse_off;
    void *conn; /* struct MHD_Connection * */
    int http11; /* the client speaks HTTP/1.1 (its end of stream may be probed) */
    /* tool calls parsed from the text once done (srv_job_calls), under srv.mu */
    srv_call *calls;
    int n_calls;
    size_t content_len; /* with calls: the bytes of text before them (the answer's content) */
    int probed;         /* its end of stream was probed (http.c's peer_gone) */
} srv_job;

struct srv {
    srv_opts o;
    st_model *model;
    const st_tokenizer *tok;
    st_engine *engine;
    srv_specials specials;
    srv_tmpl tmpl;
    char tmpl_source[64];
    const char *model_name;
    int32_t n_ctx;
    int port;
    int64_t created;
    /* the first part of every request id, random per process: replicas behind one balancer,
     * started in the same second, never repeat each other's ids */
    uint64_t id_nonce;
    double t_start;
    void *daemon; /* struct MHD_Daemon * */
    pthread_t watchdog;
    int watchdog_on;

    pthread_mutex_t mu; /* everything below, and every job's output */
    pthread_cond_t engine_cv, drain_cv;
    srv_job *pending, *pending_tail;
    int n_pending;
    srv_job *held; /* engine thread: siblings waiting for their lead's prefill */
    uint64_t cancels[SRV_MAX_CANCELS];
    int n_cancels;
    /* jobs whose text grew in the engine step under way: their connections are woken once,
     * after the step (a speculative step's tokens then go out as one event, not one each) */
    srv_job *wake[SRV_MAX_WAKE];
    int n_wake;
    int engine_busy; /* running + queued in the engine after the last step */
    int gauge_running, gauge_queued;
    int64_t gauge_kv_used; /* KV positions committed, after the last step */
    int n_in_engine;       /* jobs handed to the engine thread and not finished */
    int live_jobs;
    int active_requests;       /* HTTP requests begun and not yet answered in full */
    struct srv_watch *watches; /* open connections (http.c) */
    long n_conns;
    int stop_watchdog;
    int draining, stop_engine;
    int cut; /* SRV_CUT_*: the drain was cut; unfinished requests are answered 503, cancelled */
    uint64_t next_id;
    st_engine_stats engine_stats;
    int ol_logged; /* the drafting state (st_spec_outlook) last logged; -1 none yet */
    srv_metrics metrics;
};

/* main.c: the log. A line at level (SRV_LOG_*) when --log-level lets it through: text
 * ("spectree serve: MSG", "warning: " before a warning's) or, with --log-format json, an object
 * {"time": UNIX SECONDS, "level", "msg"}. srv_log_json writes (and frees) an object as a line. */
void srv_log(const srv *s, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void srv_log_json(json_t *v);
double srv_unix_time(void);

/* jobs.c */
/* The engine thread (pthread entry, arg: the srv): owns the engine until s->stop_engine. */
void *srv_engine_main(void *arg);
void srv_job_release(srv *s, srv_job *j);
void srv_job_submit(srv *s, srv_job *j);
void srv_job_cancel(srv *s, srv_job *j);
/* With s->mu held: ends a job the engine refused or never saw, with rc and msg (no engine
 * callback will come for it). */
void srv_job_refuse(srv *s, srv_job *j, st_status rc, const char *msg);

/* reply.c: a job from a checked request (moved into it; 0, or an HTTP status with a message
 * in err and the field in param, both SRV_ERR_CAP bytes), and the JSON of its answer: the finish
 * reason, SGLang's speculative meta_info, usage, a text (valid UTF-8), the whole non-streamed
 * response. */
unsigned srv_job_create(srv *s, srv_request *req, srv_job **out, char *err, char *param);
const char *srv_finish_reason(const srv_job *j);
/* With s->mu held, as job j finishes: the tool calls in its text (the request's tools with
 * tool_choice other than none), named call_...; and whether j's request parses them. */
void srv_job_calls(srv_job *j);
int srv_tools_active(const srv_job *j);
json_t *srv_spec_info(const srv_job *j);
json_t *srv_usage_obj(const srv_job *j);
json_t *srv_text_str(const char *t, size_t n);
json_t *srv_full_response(const srv_job *j);
/* With s->mu held: the group's choice i (0: the lead itself); 1 when every choice is done. */
srv_job *srv_choice(srv_job *lead, int i);
int srv_group_done(const srv_job *lead);
/* A choice's text (t, n bytes of it) as its answer shows it: with_echo, after the prompt's. */
json_t *srv_choice_text(const srv_job *c, const char *t, size_t n, int with_echo);
/* With s->mu held: the log-probabilities the answer keeps (a stop string drops the tokens whose
 * text starts at or after it), those whose text starts before byte `upto` and ends by it, and
 * the "logprobs" object
 * of records [from, to): chat's {"content": [...]} or completions' {"tokens", "token_logprobs",
 * "top_logprobs", "text_offset"}. */
int64_t srv_logprobs_kept(const srv_job *j);
int64_t srv_logprobs_upto(const srv_job *j, size_t upto);
json_t *srv_logprobs_json(const srv *s, const srv_job *j, int64_t from, int64_t to, int prompt);

/* compat.c: the answers of the routes of other servers (status in *code; 400 names the field) */
json_t *srv_model_obj(const srv *s);
json_t *srv_model_by_id(const srv *s, const char *id, unsigned *code);
json_t *srv_tokenize(srv *s, const char *body, size_t n, unsigned *code);
json_t *srv_detokenize(srv *s, const char *body, size_t n, unsigned *code);
json_t *srv_props(srv *s);
json_t *srv_server_info(srv *s);
json_t *srv_model_info(const srv *s);

/* http.c */
/* OpenAI's error object: {"error": {"message", "type", "param" (NULL or "": null), "code"}}. */
json_t *srv_error_obj(unsigned code, const char *msg, const char *param);
int srv_http_start(srv *s);
void srv_http_quiesce(srv *s);
void srv_http_stop(srv *s);

/* metrics.c */
void srv_metrics_init(srv_metrics *m);
/* With s->mu held, when a job the engine accepted finishes. */
void srv_metrics_finish(srv *s, const srv_job *j);
/* The Prometheus text exposition (version 0.0.4); malloc'd. */
char *srv_metrics_text(srv *s, size_t *len);

/* The chat page of GET / (tools/serve/page.html, compiled in by tools/serve/embed.cmake). */
extern const unsigned char srv_page_html[];
extern const size_t srv_page_html_len;

/* sse.c: the 503 body of a request the server cut short at shutdown; the events of a streamed
 * answer that are due, appended to j->sse (s->mu held): 1 when the stream is complete, 0 when
 * more is to come, -1 when out of memory. */
json_t *srv_cut_error(const srv *s);
int srv_sse_fill(srv_job *j);

#endif
