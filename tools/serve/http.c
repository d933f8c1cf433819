/*
 * http.c: the HTTP side of `spectree serve` on libmicrohttpd (one thread per connection):
 * routing, the bearer check, body limits, connection limits, OpenAI responses and the stream
 * of server-sent events (their chunks are sse.c's; prompts, jobs and the answers' JSON are
 * reply.c's; the metrics' text is metrics.c's).
 * A connection thread waits for its job's text with a timed wait and looks at its socket
 * between waits, so a client that goes away cancels its request within a fraction of a second.
 */
#define _GNU_SOURCE
#include "serve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum {
    WAIT_MS = 100,
    SEND_BUFFER_BYTES = 64 << 10,
    FIRST_LINE_S = 2, /* the longest silence before a connection's first request line */
    SPARE_CONNS = 8   /* connections past --max-connections, for /health and /metrics only */
};

/* Per-connection request state (MHD's con_cls). */
typedef struct conn_ctx {
    char *body;
    size_t n_body, cap_body;
    int too_big;
    int http11; /* the request is HTTP/1.1 (not 1.0) */
    double t_start;
} conn_ctx;

/* An open connection, for the watchdog: MHD's idle timeout restarts at every byte, so a client
 * sending a byte a second would never time out; the watchdog closes any connection that has
 * not delivered a whole request within --timeout seconds of starting one. */
typedef struct srv_watch {
    int fd;
    uint32_t addr;  /* the client's IPv4 address */
    double t_begin; /* when the connection opened or its last response ended */
    int spoke;      /* a request line arrived on it */
    int nul_target; /* the last request line's target holds "%00" */
    int busy;       /* a whole request arrived and is being answered */
    int shut;
    int spare; /* opened while --max-connections were open: only /health and /metrics */
    struct srv_watch *prev, *next;
} srv_watch;

/* With s->mu held: 1 when the address holds --max-connections-per-ip connections that have not
 * sent a request line and have no byte waiting to be read (one client holding sockets open; a
 * busy one is not limited). */
static int addr_full(const srv *s, uint32_t addr) {
    long n = 0;
    for (const srv_watch *w = s->watches; w; w = w->next) {
        int pending = 0;
        if (w->addr == addr && !w->spoke && !w->shut &&
            (ioctl(w->fd, FIONREAD, &pending) != 0 || pending == 0))
            n++;
    }
    return n >= s->o.max_conns_per_ip;
}

static void notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                              enum MHD_ConnectionNotificationCode code) {
    srv *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        srv_watch *w = calloc(1, sizeof *w);
        if (!w || !ci || !ai) {
            free(w);
            return;
        }
        w->fd = ci->connect_fd;
        if (ai->client_addr->sa_family == AF_INET)
            w->addr = ((const struct sockaddr_in *)(const void *)ai->client_addr)->sin_addr.s_addr;
        w->t_begin = st_time_seconds();
        /* a bounded send buffer: Linux grows it to megabytes, which a client that stops
         * reading would fill for seconds (its request running all the while) before the writes
         * block and MHD's idle timeout (--timeout) ends the connection and the request */
        int sndbuf = SEND_BUFFER_BYTES;
        setsockopt(w->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        /* a connection silent for FIRST_LINE_S before its first request line is closed (MHD's
         * idle timeout; --timeout from the request line on, see request_line): idle sockets
         * cannot hold the server's connections for --timeout */
        unsigned first = s->o.timeout_s < FIRST_LINE_S ? (unsigned)s->o.timeout_s : FIRST_LINE_S;
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, first);
        pthread_mutex_lock(&s->mu);
        w->spare = ++s->n_conns > s->o.max_conns;
        if (addr_full(s, w->addr)) { /* closed at once: MHD sees the end of the stream */
            shutdown(w->fd, SHUT_RDWR);
            w->shut = 1;
        }
        w->next = s->watches;
        if (s->watches)
            s->watches->prev = w;
        s->watches = w;
        pthread_mutex_unlock(&s->mu);
        *socket_context = w;
    } else if (*socket_context) {
        srv_watch *w = *socket_context;
        if (!w->spoke) {
            static const char m[] =
                "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
            (void)!send(w->fd, m, sizeof m - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        pthread_mutex_lock(&s->mu);
        s->n_conns--;
        if (w->prev)
            w->prev->next = w->next;
        else
            s->watches = w->next;
        if (w->next)
            w->next->prev = w->prev;
        pthread_mutex_unlock(&s->mu);
        free(w);
        *socket_context = NULL;
    }
}

static srv_watch *watch_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* MHD's URI log callback, called with each request line's target as sent (MHD then decodes
 * it, and a %00 would cut it short): --timeout from the first on. */
static void *request_line(void *cls, const char *uri, struct MHD_Connection *c) {
    srv *s = cls;
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o.timeout_s);
    srv_watch *w = watch_of(c);
    if (w) {
        pthread_mutex_lock(&s->mu);
        w->spoke = 1;
        w->nul_target = strstr(uri, "%00") != NULL;
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

static void *watchdog_main(void *arg) {
    srv *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop_watchdog) {
        double now = st_time_seconds();
        for (srv_watch *w = s->watches; w; w = w->next)
            if (!w->busy && !w->shut && now - w->t_begin > (double)s->o.timeout_s) {
                shutdown(w->fd, SHUT_RDWR); /* MHD sees the end of the stream and closes it */
                w->shut = 1;
            }
        pthread_mutex_unlock(&s->mu);
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Responses                                                                                 */

static void count_code(srv *s, unsigned code) {
    pthread_mutex_lock(&s->mu);
    s->metrics.requests_total++;
    int k = code == 200                ? 0
            : code == 400              ? 1
            : code > 400 && code < 500 ? 2
            : code == 500              ? 3
            : code == 503              ? 4
                                       : 5;
    s->metrics.by_code[k]++;
    pthread_mutex_unlock(&s->mu);
}

/* --cors: the Access-Control-Allow-Origin header, for any origin (*) or for a request whose
 * Origin is one of the listed ones (then with Vary: Origin). */
static void add_cors(const srv *s, struct MHD_Connection *c, struct MHD_Response *r) {
    if (!s->o.cors)
        return;
    if (!strcmp(s->o.cors, "*")) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
        return;
    }
    MHD_add_response_header(r, "Vary", "Origin");
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const size_t n = origin ? strlen(origin) : 0;
    for (const char *p = s->o.cors; origin && *p;) {
        const size_t k = strcspn(p, ",");
        if (k == n && !strncmp(p, origin, n)) {
            MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
            return;
        }
        p += k + (p[k] == ',');
    }
}

static enum MHD_Result send_buf(srv *s, struct MHD_Connection *c, unsigned code, const char *type,
                                const char *body, size_t len) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    if (type)
        MHD_add_response_header(r, "Content-Type", type);
    add_cors(s, c, r);
    const srv_watch *w = watch_of(c);
    pthread_mutex_lock(&s->mu);
    /* draining: the client (or nginx) should take its next request elsewhere; a spare
     * connection serves one request */
    if (s->draining || (w && w->spare))
        MHD_add_response_header(r, "Connection", "close");
    pthread_mutex_unlock(&s->mu);
    if (code == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    count_code(s, code);
    return rc;
}

static enum MHD_Result send_json(srv *s, struct MHD_Connection *c, unsigned code, json_t *v) {
    char *txt = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (!txt)
        return send_buf(s, c, 500, "application/json",
                        "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}",
                        62);
    enum MHD_Result rc = send_buf(s, c, code, "application/json", txt, strlen(txt));
    free(txt);
    return rc;
}

static const char *err_type(unsigned code) {
    switch (code) {
    case 400:
    case 413:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 404:
    case 405:
        return "not_found_error";
    case 503:
        return "server_overloaded";
    default:
        return "server_error";
    }
}

/* OpenAI's error object: {"error": {"message", "type", "param", "code"}}. */
json_t *srv_error_obj(unsigned code, const char *msg, const char *param) {
    return json_pack("{s:{s:s,s:s,s:s?,s:i}}", "error", "message", msg, "type", err_type(code),
                     "param", param && param[0] ? param : NULL, "code", (int)code);
}

static enum MHD_Result send_error(srv *s, struct MHD_Connection *c, unsigned code, const char *msg,
                                  const char *param) {
    return send_json(s, c, code, srv_error_obj(code, msg, param));
}

/* ---------------------------------------------------------------------------------------- */
/* Waiting, disconnects, streaming                                                           */

/* 1 when the client has gone: its connection was reset. A client that closed only its write
 * side (nc -N, socat and some proxies do after a whole request) still reads the answer, and a
 * socket's end of stream looks the same whether the client half-closed or closed it: the first
 * time the end is seen, an HTTP/1.1 client is sent "100 Continue" (an interim answer every
 * HTTP/1.1 client skips) or, on a stream, an SSE comment; a closed socket answers it with a
 * reset, which the next look sees. An HTTP/1.0 client's end of stream is not looked into. */
static int peer_gone(srv_job *j, int *probe_stream) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(j->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct tcp_info ti;
    socklen_t n = sizeof ti;
    if (!ci || getsockopt(ci->connect_fd, IPPROTO_TCP, TCP_INFO, &ti, &n) != 0)
        return 1;
    if (ti.tcpi_state == TCP_ESTABLISHED)
        return 0;
    if (ti.tcpi_state != TCP_CLOSE_WAIT) /* reset */
        return 1;
    if (j->probed || !j->http11)
        return 0;
    j->probed = 1;
    if (probe_stream) { /* the stream's reader sends the comment */
        *probe_stream = 1;
        return 0;
    }
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    return send(ci->connect_fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
           errno != EAGAIN && errno != EWOULDBLOCK;
}

/* Restarts the connection's idle clock: time spent waiting for the engine is not the client's
 * idleness (MHD would otherwise drop a connection whose next token took longer than --timeout
 * as soon as it arrived); a client that stops reading still times out. */
static void touch(srv *s, struct MHD_Connection *c) {
    /* MHD restarts the clock only when the timeout goes from 0 (none) to a value */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)s->o.timeout_s);
}

/* Waits (s->mu held) until the job has news or WAIT_MS pass. */
static void wait_news(srv *s, srv_job *j) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WAIT_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&j->cv, &s->mu, &ts);
}

/* With s->mu held: ends a job the drain's end cut, at --drain-timeout or a second signal (its
 * answer: 503, or an SSE error event). */
static void cut_job(srv *s, srv_job *j) {
    j->cut = 1;
    srv_job_cancel(s, j);
    s->metrics.cut++;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_job *j = cls;
    srv *s = j->srv;
    if (j->sse_off < j->n_sse) {
        size_t k = j->n_sse - j->sse_off < max ? j->n_sse - j->sse_off : max;
        memcpy(buf, j->sse + j->sse_off, k);
        j->sse_off += k;
        return (ssize_t)k;
    }
    if (j->sent_final)
        return MHD_CONTENT_READER_END_OF_STREAM;
    j->n_sse = j->sse_off = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->cut && !srv_group_done(j) && !j->cut)
            cut_job(s, j);
        int r = srv_sse_fill(j), probe = 0;
        if (r < 0 || j->n_sse > 0)
            break;
        if (peer_gone(j, &probe)) {
            srv_job_cancel(s, j);
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (probe) {
            pthread_mutex_unlock(&s->mu);
            static const char comment[] = ":\n\n";
            memcpy(buf, comment, sizeof comment - 1);
            return (ssize_t)(sizeof comment - 1);
        }
        wait_news(s, j);
    }
    pthread_mutex_unlock(&s->mu);
    if (j->n_sse == 0)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    touch(s, j->conn);
    size_t k = j->n_sse < max ? j->n_sse : max;
    memcpy(buf, j->sse, k);
    j->sse_off = k;
    return (ssize_t)k;
}

/* The connection is done with the stream (complete, failed or the client left). */
static void stream_free(void *cls) {
    srv_job *j = cls;
    srv *s = j->srv;
    pthread_mutex_lock(&s->mu);
    if (!srv_group_done(j))
        srv_job_cancel(s, j);
    free(j->sse);
    j->sse = NULL;
    srv_job_release(s, j);
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------------------------------- */
/* Endpoints                                                                                 */

/* The key a balancer keeps a conversation on one replica by (tools/serve/nginx.conf hashes on
 * X-Session-Id, else X-User): copied into the job and its choices for their log lines, so the
 * replica that served each turn of a session can be told from its log. Bytes outside printable
 * ASCII become '?' and the key is cut at SRV_SESSION_MAX bytes (a log line stays one line). */
static void session_key(struct MHD_Connection *c, srv_job *j) {
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Session-Id");
    if (!v || !v[0])
        v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-User");
    size_t n = 0;
    for (; v && v[n] && n < SRV_SESSION_MAX; n++)
        j->session[n] = v[n] > ' ' && v[n] < 127 ? v[n] : '?';
    j->session[n] = 0;
    for (int i = 0; i < j->n_more; i++)
        memcpy(j->more[i]->session, j->session, sizeof j->session);
}

/* The generation routes: OpenAI's completions and chat, SGLang's /generate. */
enum { GEN_COMPLETION, GEN_CHAT, GEN_SGLANG };

static enum MHD_Result generate(srv *s, struct MHD_Connection *c, conn_ctx *cc, int kind) {
    char err[SRV_ERR_CAP], param[SRV_ERR_CAP];
    srv_request req;
    const char *body = cc->body ? cc->body : "";
    if (kind == GEN_SGLANG
            ? srv_generate_parse(body, cc->n_body, &req, err, param)
            : srv_request_parse(body, cc->n_body, kind == GEN_CHAT, &req, err, param))
        return send_error(s, c, 400, err, param);
    const int chat = kind == GEN_CHAT;
    /* fields a request leaves out: the server's --temp etc., else OpenAI's defaults */
    unsigned fill = s->o.c.sp_given & ~req.given;
    if (fill & SRV_GIVEN_TEMP)
        req.sp.temp = s->o.c.sp.temp;
    if (fill & SRV_GIVEN_TOPK)
        req.sp.top_k = s->o.c.sp.top_k;
    if (fill & SRV_GIVEN_TOPP)
        req.sp.top_p = s->o.c.sp.top_p;
    if (fill & SRV_GIVEN_MINP)
        req.sp.min_p = s->o.c.sp.min_p;
    srv_job *j = NULL;
    err[0] = 0;
    param[0] = 0;
    unsigned code = srv_job_create(s, &req, &j, err, param);
    pthread_mutex_lock(&s->mu);
    if (!code && s->draining) {
        code = 503;
        snprintf(err, sizeof err, "the server is shutting down");
    }
    if (code) {
        srv_job_release(s, j);
        pthread_mutex_unlock(&s->mu);
        return send_error(s, c, code, err, code == 400 ? param : NULL);
    }
    if (chat)
        s->metrics.chats++;
    else
        s->metrics.completions++;
    j->conn = c;
    j->http11 = cc->http11;
    session_key(c, j);
    srv_job_submit(s, j);
    /* the engine's answer first (a step or so), so that a refusal gets its own status even
     * when the response would be a stream */
    while (!j->engine_id && !j->done && !s->cut) {
        if (peer_gone(j, NULL)) {
            srv_job_cancel(s, j);
            srv_job_release(s, j);
            pthread_mutex_unlock(&s->mu);
            return MHD_NO;
        }
        wait_news(s, j);
    }
    if (!srv_group_done(j) && s->cut)
        cut_job(s, j);
    if (j->req.stream && !j->refused && !j->cut) {
        j->refs++; /* the response's, released by stream_free */
        pthread_mutex_unlock(&s->mu);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096,
                                                                   stream_reader, j, stream_free);
        pthread_mutex_lock(&s->mu);
        srv_job_release(s, j); /* the handler's */
        pthread_mutex_unlock(&s->mu);
        if (!r)
            return MHD_NO;
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        add_cors(s, c, r);
        touch(s, c);
        enum MHD_Result rc = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        count_code(s, 200);
        return rc;
    }
    while (!srv_group_done(j) && !j->cut) {
        if (s->cut) {
            cut_job(s, j);
            break;
        }
        if (peer_gone(j, NULL)) {
            srv_job_cancel(s, j);
            srv_job_release(s, j);
            pthread_mutex_unlock(&s->mu);
            return MHD_NO;
        }
        wait_news(s, j);
    }
    json_t *v = NULL;
    code = 200;
    srv_job *e = j; /* the choice whose failure answers (the lead's first) */
    for (int i = j->n_more; i >= 0; i--) {
        srv_job *ch = srv_choice(j, i);
        if (ch->status != ST_OK || ch->oom)
            e = ch;
    }
    if (j->cut) {
        code = 503;
        v = srv_cut_error(s);
    } else if (e->status == ST_ERR_BUSY) {
        code = 503;
        v = srv_error_obj(code, e->error, NULL);
    } else if (e->refused && e->status == ST_ERR_RANGE) {
        /* it fits the context (checked above) but not the KV budget (--max-total-tokens) */
        code = 503;
        v = srv_error_obj(code, e->error, NULL);
    } else if (e->refused && e->status == ST_ERR_INVALID) {
        code = 400;
        v = srv_error_obj(code, e->error, NULL);
    } else if (e->status != ST_OK || e->oom) {
        code = 500;
        v = srv_error_obj(code, e->oom ? "out of memory" : e->error, NULL);
    } else {
        v = srv_full_response(j);
    }
    srv_job_release(s, j);
    pthread_mutex_unlock(&s->mu);
    touch(s, c);
    return send_json(s, c, code, v);
}

static enum MHD_Result models(srv *s, struct MHD_Connection *c) {
    return send_json(s, c, 200,
                     json_pack("{s:s,s:[o]}", "object", "list", "data", srv_model_obj(s)));
}

/* The routes. Generation, tokenizing and the server's information take the --api-key bearer
 * (open: the page, /health and /metrics); OpenAI's routes answer with and without /v1, as
 * llama-server's do. */
typedef enum route {
    R_NONE,
    R_COMPLETIONS,
    R_CHAT,
    R_GENERATE,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_MODELS,
    R_MODEL, /* /v1/models/ID */
    R_PROPS,
    R_SERVER_INFO,
    R_MODEL_INFO,
    R_HEALTH,
    R_METRICS,
    R_PAGE,
} route;

static const struct {
    const char *path;
    route r;
    int post; /* 1: POST with a body; 0: GET (and HEAD) */
    int open; /* no bearer needed */
} routes[] = {
    {"/v1/completions", R_COMPLETIONS, 1, 0},
    {"/completions", R_COMPLETIONS, 1, 0},
    {"/v1/chat/completions", R_CHAT, 1, 0},
    {"/chat/completions", R_CHAT, 1, 0},
    {"/generate", R_GENERATE, 1, 0},
    {"/tokenize", R_TOKENIZE, 1, 0},
    {"/detokenize", R_DETOKENIZE, 1, 0},
    {"/v1/models", R_MODELS, 0, 0},
    {"/models", R_MODELS, 0, 0},
    {"/props", R_PROPS, 0, 0},
    {"/server_info", R_SERVER_INFO, 0, 0},
    {"/get_server_info", R_SERVER_INFO, 0, 0},
    {"/get_model_info", R_MODEL_INFO, 0, 0},
    {"/health", R_HEALTH, 0, 1},
    {"/metrics", R_METRICS, 0, 1},
    {"/", R_PAGE, 0, 1},
    {"/index.html", R_PAGE, 0, 1},
};

/* The route of url (R_NONE: none), whether it is a POST route and whether it is open; *id: the
 * model id of /v1/models/ID. */
static route find_route(const char *url, int *post, int *open, const char **id) {
    *id = NULL;
    *post = *open = 0;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) {
            *post = routes[i].post;
            *open = routes[i].open;
            return routes[i].r;
        }
    static const char *const pre[] = {"/v1/models/", "/models/"};
    for (int i = 0; i < 2; i++)
        if (!strncmp(url, pre[i], strlen(pre[i])) && url[strlen(pre[i])]) {
            *id = url + strlen(pre[i]);
            return R_MODEL;
        }
    return R_NONE;
}

/* A CORS preflight (OPTIONS with --cors): 204 with the route's method and the headers asked
 * for; no bearer needed (browsers send none with it). */
static enum MHD_Result preflight(srv *s, struct MHD_Connection *c, int post_route) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    add_cors(s, c, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods",
                            post_route ? "POST, OPTIONS" : "GET, HEAD, OPTIONS");
    const char *h =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            h && strlen(h) < 512 ? h : "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    enum MHD_Result rc = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    count_code(s, 204);
    return rc;
}

static int authorized(srv *s, struct MHD_Connection *c) {
    if (!s->o.api_key)
        return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) /* the scheme is case-insensitive */
        return 0;
    const char *k = h + 7, *want = s->o.api_key;
    while (*k == ' ')
        k++;
    size_t n = strlen(k), m = strlen(want);
    unsigned diff = (unsigned)(n ^ m); /* compare in time independent of where they differ */
    for (size_t i = 0; i < m; i++)
        diff |= (unsigned)(unsigned char)want[i] ^ (unsigned char)(i < n ? k[i] : 0);
    return diff == 0;
}

/* MHD_get_connection_values iterator: keeps the first Content-Length header's value in cls[0]
 * and one that differs from it in cls[1]. */
static enum MHD_Result content_lengths(void *cls, enum MHD_ValueKind kind, const char *key,
                                       const char *value) {
    (void)kind;
    const char **first = cls;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) != 0)
        return MHD_YES;
    if (!first[0])
        first[0] = value;
    else if (strcmp(first[0], value) != 0)
        first[1] = value;
    return MHD_YES;
}

/* What MHD lets through and HTTP refuses (RFC 9110, 9112): NULL, or the 400's message. */
static const char *bad_request(struct MHD_Connection *c, const char *url, const char *method,
                               int http11) {
    static const char tchar[] = "!#$%&'*+-.^_`|~";
    for (const char *m = method; *m; m++)
        if (!((*m >= 'a' && *m <= 'z') || (*m >= 'A' && *m <= 'Z') || (*m >= '0' && *m <= '9') ||
              strchr(tchar, *m)))
            return "the request line is malformed: the method is not a token";
    if (url[0] != '/' && strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
        return "the request line is malformed: the target is neither a path nor a URL";
    const srv_watch *w = watch_of(c);
    if (w && w->nul_target)
        return "the request target holds a NUL byte (%00)";
    if (http11 && !MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST))
        return "an HTTP/1.1 request needs a Host header";
    const char *cl[2] = {NULL, NULL};
    MHD_get_connection_values(c, MHD_HEADER_KIND, content_lengths, cl);
    if (cl[1])
        return "the request has two different Content-Length headers";
    return NULL;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload_data,
                               size_t *upload_size, void **con_cls) {
    srv *s = cls;
    conn_ctx *cc = *con_cls;
    const int post = !strcmp(method, "POST");
    int post_route, open;
    const char *model_id;
    const route rt = find_route(url, &post_route, &open, &model_id);
    if (!cc) { /* first call: headers only */
        cc = calloc(1, sizeof *cc);
        if (!cc)
            return MHD_NO;
        cc->t_start = st_time_seconds();
        cc->http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
        *con_cls = cc;
        pthread_mutex_lock(&s->mu);
        s->active_requests++;
        pthread_mutex_unlock(&s->mu);
        const char *bad = bad_request(c, url, method, cc->http11);
        if (bad) { /* answered now: MHD closes the connection, whose framing is in doubt */
            cc->too_big = 2;
            return send_error(s, c, 400, bad, NULL);
        }
        if (post && post_route) {
            const char *cl =
                MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (cl && strtoull(cl, NULL, 10) > (unsigned long long)s->o.max_body) {
                char msg[96];
                snprintf(msg, sizeof msg, "the request body exceeds %ld bytes", s->o.max_body);
                cc->too_big = 2;
                return send_error(s, c, 413, msg, NULL);
            }
        }
        /* answered on a later call, once MHD has read the whole request (a response queued
         * with the headers closes the connection, dropping the requests pipelined after it) */
        return MHD_YES;
    }
    if (cc->too_big == 2)
        return MHD_YES; /* answered already (413, 400); MHD discards the rest */
    if (*upload_size) {
        if (st_time_seconds() - cc->t_start > (double)s->o.timeout_s)
            return MHD_NO; /* a client too slow to send its request: dropped */
        if (cc->n_body + *upload_size > (size_t)s->o.max_body)
            cc->too_big = 1;
        if (!cc->too_big) {
            if (cc->n_body + *upload_size + 1 > cc->cap_body) {
                size_t cap = (cc->n_body + *upload_size + 1) * 2;
                if (cap > (size_t)s->o.max_body + 1)
                    cap = (size_t)s->o.max_body + 1;
                char *b = realloc(cc->body, cap);
                if (!b)
                    return MHD_NO;
                cc->body = b;
                cc->cap_body = cap;
            }
            memcpy(cc->body + cc->n_body, upload_data, *upload_size);
            cc->n_body += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    /* the whole request is here */
    srv_watch *w = watch_of(c);
    if (w) {
        pthread_mutex_lock(&s->mu);
        w->busy = 1;
        pthread_mutex_unlock(&s->mu);
    }
    const int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    const int probe = get && (!strcmp(url, "/health") || !strcmp(url, "/metrics"));
    if (w && w->spare && !probe) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "the server has --max-connections (%ld) connections open; this spare one "
                 "answers only GET /health and /metrics",
                 s->o.max_conns);
        return send_error(s, c, 503, msg, NULL);
    }
    if (s->o.cors && !strcmp(method, "OPTIONS") && rt != R_NONE)
        return preflight(s, c, post_route);
    if (rt == R_NONE) {
        char msg[160];
        snprintf(msg, sizeof msg, "no such endpoint: %s %.100s", method, url);
        return send_error(s, c, 404, msg, NULL);
    }
    if (!open && !authorized(s, c))
        return send_error(s, c, 401, "invalid or missing API key (Authorization: Bearer KEY)",
                          NULL);
    if (post_route ? !post : !get)
        return send_error(s, c, 405, post_route ? "use POST" : "use GET", NULL);
    if (cc->too_big) {
        char msg[96];
        snprintf(msg, sizeof msg, "the request body exceeds %ld bytes", s->o.max_body);
        return send_error(s, c, 413, msg, NULL);
    }
    const char *body = cc->body ? cc->body : "";
    unsigned code = 200;
    switch (rt) {
    case R_COMPLETIONS:
        return generate(s, c, cc, GEN_COMPLETION);
    case R_CHAT:
        return generate(s, c, cc, GEN_CHAT);
    case R_GENERATE:
        return generate(s, c, cc, GEN_SGLANG);
    case R_TOKENIZE: {
        json_t *v = srv_tokenize(s, body, cc->n_body, &code);
        return send_json(s, c, code, v);
    }
    case R_DETOKENIZE: {
        json_t *v = srv_detokenize(s, body, cc->n_body, &code);
        return send_json(s, c, code, v);
    }
    case R_MODELS:
        return models(s, c);
    case R_MODEL: {
        json_t *v = srv_model_by_id(s, model_id, &code);
        return send_json(s, c, code, v);
    }
    case R_PROPS:
        return send_json(s, c, 200, srv_props(s));
    case R_SERVER_INFO:
        return send_json(s, c, 200, srv_server_info(s));
    case R_MODEL_INFO:
        return send_json(s, c, 200, srv_model_info(s));
    case R_PAGE:
        return send_buf(s, c, 200, "text/html; charset=utf-8", (const char *)srv_page_html,
                        srv_page_html_len);
    case R_HEALTH: {
        pthread_mutex_lock(&s->mu);
        int draining = s->draining;
        pthread_mutex_unlock(&s->mu);
        return draining ? send_buf(s, c, 503, "application/json", "{\"status\":\"draining\"}", 21)
                        : send_buf(s, c, 200, "application/json", "{\"status\":\"ok\"}", 15);
    }
    default: { /* R_METRICS */
        size_t n = 0;
        char *txt = srv_metrics_text(s, &n);
        if (!txt)
            return send_error(s, c, 500, "out of memory", NULL);
        enum MHD_Result rc = send_buf(s, c, 200, "text/plain; version=0.0.4", txt, n);
        free(txt);
        return rc;
    }
    }
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)toe;
    srv *s = cls;
    conn_ctx *cc = *con_cls;
    srv_watch *w = watch_of(c);
    if (w) {
        pthread_mutex_lock(&s->mu);
        w->busy = 0;
        w->t_begin = st_time_seconds(); /* the next request's clock */
        pthread_mutex_unlock(&s->mu);
    }
    if (cc) {
        free(cc->body);
        free(cc);
        *con_cls = NULL;
        pthread_mutex_lock(&s->mu);
        s->active_requests--;
        pthread_cond_broadcast(&s->drain_cv);
        pthread_mutex_unlock(&s->mu);
    }
}

int srv_http_start(srv *s) {
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)s->o.port);
    if (inet_pton(AF_INET, s->o.host, &addr.sin_addr) != 1) {
        srv_log(s, SRV_LOG_ERROR, "--host %s is not an IPv4 address", s->o.host);
        return -1;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
            MHD_USE_ERROR_LOG,
        (uint16_t)s->o.port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, &addr,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->o.max_conns + SPARE_CONNS),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->o.timeout_s, MHD_OPTION_URI_LOG_CALLBACK,
        request_line, s, MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_NOTIFY_CONNECTION,
        notify_connection, s, MHD_OPTION_LISTEN_BACKLOG_SIZE, 256u, MHD_OPTION_END);
    if (!d) {
        srv_log(s, SRV_LOG_ERROR, "cannot listen on %s:%ld: %s", s->o.host, s->o.port,
                strerror(errno));
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : (int)s->o.port;
    s->daemon = d;
    s->watchdog_on = pthread_create(&s->watchdog, NULL, watchdog_main, s) == 0;
    return 0;
}

void srv_http_quiesce(srv *s) {
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
}

void srv_http_stop(srv *s) {
    if (s->watchdog_on) {
        pthread_mutex_lock(&s->mu);
        s->stop_watchdog = 1;
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->watchdog, NULL);
    }
    MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}
