/*
 * main.c: `spectree serve`, an OpenAI-compatible HTTP server over the continuous-batching engine
 * (st_engine_*): its flags, start-up and drain. The engine thread and the jobs are jobs.c's;
 * the HTTP endpoints http.c's, the metrics metrics.c's; request checking and stop strings
 * api.c's, chat templates tmpl.c's (no sockets: unit-tested and fuzzed).
 */
#define _GNU_SOURCE
#include "serve.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

enum { CUT_GRACE_S = 2 }; /* after the drain timeout, for the cut requests' answers */

/* ---------------------------------------------------------------------------------------- */
/* Flags                                                                                     */

static const char *serve_help =
    "usage: spectree serve -m MODEL [options]\n"
    "\n"
    "An OpenAI-compatible HTTP server: POST /v1/completions, POST /v1/chat/completions (with\n"
    "\"stream\": true: server-sent events ending with [DONE]), GET /v1/models[/ID] (also without\n"
    "/v1), GET /health, GET /metrics (Prometheus text); llama-server's POST /tokenize,\n"
    "/detokenize and GET /props, SGLang's POST /generate, GET /server_info and /get_model_info.\n"
    "Requests run together, joining and leaving between steps\n"
    "(continuous batching); a seeded request returns what `spectree generate` prints for the\n"
    "same prompt and parameters, whatever else runs. SIGTERM, SIGINT or SIGHUP stops\n"
    "accepting, finishes the running requests and exits; a second signal, or --drain-timeout,\n"
    "cuts what still runs (answered 503, a stream with an error event).\n"
    "\n"
    "  -m, --model, --model-path PATH   GGUF Llama model (required)\n"
    "      --host ADDR      IPv4 address to listen on (default 127.0.0.1)\n"
    "      --port N         TCP port (default 8080; 0: any free port, printed on stderr)\n"
    "      --served-model-name NAME     the model id of the API (default: the file name)\n"
    "      --api-key KEY    require 'Authorization: Bearer KEY' on /v1/* (401 otherwise)\n"
    "      --chat-template NAME   llama-2, llama-3, chatml, zephyr or mistral (default: detected\n"
    "                       from the GGUF's tokenizer.chat_template; chatml, with a warning,\n"
    "                       for a model without one; tools: llama-3, chatml, mistral)\n"
    "      --max-running-requests N, -np, --parallel N   sequences decoded together (default 8,\n"
    "                       <= 64)\n"
    "      --max-queued-requests N    requests waiting for a slot; beyond: 503 (default 256)\n"
    "      --context-length N, -c N   positions per sequence (default: the model's, <= 4096)\n"
    "      --chunked-prefill-size N   prompt tokens prefilled per step (default 256)\n"
    "      --max-total-tokens N       KV positions all running requests may reserve together\n"
    "                       (default: every slot a full context)\n"
    "      --prefix-cache-mb N        MB of past prompts' KV rows kept for requests that\n"
    "                       start the same way (default 256, or one full context's KV\n"
    "                       rows and a quarter more where that is bigger; at most a\n"
    "                       quarter of the available memory; 0: off)\n";
static const char *serve_help_conns =
    "      --max-connections N        open connections at once (default 256); 8 more answer\n"
    "                       only GET /health and /metrics (others: 503)\n"
    "      --max-connections-per-ip N connections one address may hold open before their\n"
    "                       first request line; more are closed at once (default: a quarter\n"
    "                       of --max-connections, at least 8 or all of them)\n"
    "      --max-body-bytes N         largest request body (default 1048576; beyond: 413)\n"
    "      --max-prompt-tokens N      longest prompt (default: the context length - 1)\n"
    "      --max-tokens-limit N       largest max_tokens (default: the context length)\n"
    "      --timeout S      drop a connection idle for S seconds or whose request takes longer\n"
    "                       than S seconds to arrive (default 10); one silent for 2 s before\n"
    "                       its first request line is dropped then\n"
    "      --drain-timeout S          on SIGTERM, wait at most S seconds for running requests,\n"
    "                       then answer them 503 (default 60)\n"
    "  -n, --n-predict N    max_tokens when a completion request gives none (default 16; -1:\n"
    "                       the rest of the context, as chat requests always get)\n"
    "      --log-level L    error, warn, info (default: the start-up lines and one line per\n"
    "                       request, with its X-Session-Id or X-User value) or debug (each\n"
    "                       request's queue time and accepted drafts)\n"
    "      --log-format F   text (default: 'spectree serve: ...' lines) or json (one object a\n"
    "                       line: time, level, msg; a request's line its fields by name)\n"
    "      --cors ORIGIN    answer browsers from ORIGIN (a comma-separated list, or *): CORS\n"
    "                       headers on every answer and OPTIONS preflights answered 204\n"
    "      --temp T, --top-k K, --top-p P, --min-p P   sampling defaults of requests that give\n"
    "                       none (default OpenAI's: 1, off, 1, off)\n"
    "  -h, --help           this help\n";

/* printed after serve_help: one string literal would pass the 4095 bytes C99 promises */
static const char *serve_help_env =
    "\n"
    "Every flag can come from the environment instead: SPECTREE_ARG_<FLAG>, the long name in\n"
    "upper case with '_' for '-' (SPECTREE_ARG_PORT=8081, SPECTREE_ARG_CTX_SIZE=2048; a flag\n"
    "without a value is set by any value but 0, false, off or empty); the command line wins.\n"
    "\n"
    "as `spectree generate` (--no-bos: completion prompts; chat prompts follow the template):\n";

static void die(const char *msg) { cli_die_usage("serve", msg); }

/* llama-server's LLAMA_ARG_*: the arguments with "--flag value" put first for each
 * SPECTREE_ARG_<FLAG> set (the long name upper-cased, '-' as '_') whose flag the command line
 * does not give (the command line wins; it is parsed after, and a bad value in a variable it
 * overrides is never read). A flag without a value is given for any value but "", "0", "false" or
 * "off". The values stay the environment's; the array and the flag names are malloc'd. */
typedef struct env_argv {
    char **argv;
    int argc;
    char **names; /* the "--flag" strings made here */
    int n_names;
} env_argv;

static void *env_alloc(size_t n) {
    void *p = calloc(1, n);
    if (!p) {
        fprintf(stderr, "spectree serve: out of memory\n");
        exit(1);
    }
    return p;
}

/* Whether the command line gives the flag whose getopt value is val (by any of its names). */
static int given(int argc, char **argv, const struct option *lo, int val) {
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *a = argv[i];
        if (a[0] == '-' && a[1] == val && val < 128)
            return 1;
        if (a[0] != '-' || a[1] != '-')
            continue;
        const size_t len = strcspn(a + 2, "=");
        for (const struct option *o = lo; o->name; o++)
            if (o->val == val && strlen(o->name) == len && !strncmp(o->name, a + 2, len))
                return 1;
    }
    return 0;
}

static void env_args(int argc, char **argv, const struct option *lo, env_argv *e) {
    int n_lo = 0;
    while (lo[n_lo].name)
        n_lo++;
    e->argv = env_alloc((size_t)(2 * n_lo + argc + 1) * sizeof *e->argv);
    e->names = env_alloc((size_t)(n_lo + 1) * sizeof *e->names);
    e->n_names = 0;
    int n = 0;
    e->argv[n++] = argv[0];
    for (int i = 0; i < n_lo; i++) {
        char var[96] = "SPECTREE_ARG_";
        size_t k = strlen(var), len = strlen(lo[i].name);
        if (!strcmp(lo[i].name, "help") || k + len >= sizeof var)
            continue;
        for (size_t j = 0; j < len; j++)
            var[k + j] = lo[i].name[j] == '-' ? '_' : (char)toupper((unsigned char)lo[i].name[j]);
        var[k + len] = 0;
        const char *v = getenv(var);
        if (!v || given(argc, argv, lo, lo[i].val) ||
            (lo[i].has_arg != required_argument &&
             (!v[0] || !strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "off"))))
            continue;
        char *flag = env_alloc(len + 3);
        snprintf(flag, len + 3, "--%s", lo[i].name);
        e->names[e->n_names++] = flag;
        e->argv[n++] = flag;
        if (lo[i].has_arg == required_argument)
            e->argv[n++] = (char *)v;
    }
    for (int i = 1; i < argc; i++)
        e->argv[n++] = argv[i];
    e->argc = n;
}

static void env_args_free(env_argv *e) {
    for (int i = 0; i < e->n_names; i++)
        free(e->names[i]);
    free(e->names);
    free(e->argv);
}

static void parse_flags(int argc, char **argv, srv_opts *o) {
    enum {
        O_HOST = 1000,
        O_PORT,
        O_NAME,
        O_KEY,
        O_TMPL,
        O_RUNNING,
        O_QUEUED,
        O_CHUNK,
        O_TOTAL,
        O_CONNS,
        O_PER_IP,
        O_BODY,
        O_PROMPT,
        O_MAXTOK,
        O_TIMEOUT,
        O_DRAIN,
        O_PARALLEL,
        O_LOG_LEVEL,
        O_LOG_FORMAT,
        O_CORS,
        O_PFX
    };
    static const struct option own[] = {{"model", required_argument, 0, 'm'},
                                        {"model-path", required_argument, 0, 'm'},
                                        {"host", required_argument, 0, O_HOST},
                                        {"port", required_argument, 0, O_PORT},
                                        {"served-model-name", required_argument, 0, O_NAME},
                                        {"api-key", required_argument, 0, O_KEY},
                                        {"chat-template", required_argument, 0, O_TMPL},
                                        {"max-running-requests", required_argument, 0, O_RUNNING},
                                        {"parallel", required_argument, 0, O_PARALLEL},
                                        {"log-level", required_argument, 0, O_LOG_LEVEL},
                                        {"log-format", required_argument, 0, O_LOG_FORMAT},
                                        {"cors", required_argument, 0, O_CORS},
                                        {"max-queued-requests", required_argument, 0, O_QUEUED},
                                        {"context-length", required_argument, 0, 'c'},
                                        {"ctx-size", required_argument, 0, 'c'},
                                        {"chunked-prefill-size", required_argument, 0, O_CHUNK},
                                        {"max-total-tokens", required_argument, 0, O_TOTAL},
                                        {"prefix-cache-mb", required_argument, 0, O_PFX},
                                        {"max-connections", required_argument, 0, O_CONNS},
                                        {"max-connections-per-ip", required_argument, 0, O_PER_IP},
                                        {"max-body-bytes", required_argument, 0, O_BODY},
                                        {"max-prompt-tokens", required_argument, 0, O_PROMPT},
                                        {"max-tokens-limit", required_argument, 0, O_MAXTOK},
                                        {"timeout", required_argument, 0, O_TIMEOUT},
                                        {"drain-timeout", required_argument, 0, O_DRAIN},
                                        {"n-predict", required_argument, 0, 'n'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
    struct option *lo = cli_common_options(own);
    const char *cmd = "serve";
    int c;
    long v;
    env_argv ea;
    argc = cli_common_argv(cmd, argc, argv, "m:c:n:t:h", lo);
    env_args(argc, argv, lo, &ea);
    argv = ea.argv;
    argc = ea.argc;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:c:n:t:h", lo, NULL)) != -1) {
        if (cli_common_parse(cmd, c, optarg, &o->c))
            continue;
        switch (c) {
        case 'm':
            o->model = optarg;
            break;
        case O_HOST:
            o->host = optarg;
            break;
        case O_PORT:
            cli_parse_int(cmd, "--port", optarg, 0, 65535, &o->port);
            break;
        case O_NAME:
            if (!optarg[0] || strlen(optarg) > 256)
                die("--served-model-name needs 1..256 bytes");
            o->model_name = optarg;
            break;
        case O_KEY:
            if (!optarg[0])
                die("--api-key needs a non-empty key");
            o->api_key = optarg;
            break;
        case O_TMPL:
            if (srv_tmpl_parse(optarg, &o->tmpl) != 0)
                die("--chat-template expects llama-2, llama-3, chatml, zephyr or mistral");
            break;
        case O_RUNNING:
        case O_PARALLEL:
            cli_parse_int(cmd, c == O_RUNNING ? "--max-running-requests" : "--parallel", optarg, 1,
                          ST_GEN_MAX_BATCH, &v);
            o->ep.max_running = (int32_t)v;
            break;
        case O_LOG_LEVEL: {
            static const char *const levels[] = {"error", "warn", "info", "debug"};
            int l = 0;
            while (l < 4 && strcmp(optarg, levels[l]) != 0)
                l++;
            if (l == 4)
                die("--log-level takes error, warn, info or debug");
            o->log_level = l;
            break;
        }
        case O_LOG_FORMAT:
            if (strcmp(optarg, "text") != 0 && strcmp(optarg, "json") != 0)
                die("--log-format takes text or json");
            o->log_json = !strcmp(optarg, "json");
            break;
        case O_CORS:
            if (!optarg[0] || strlen(optarg) > 1024 || strpbrk(optarg, " \t\r\n"))
                die("--cors takes an origin (https://example.com), a comma-separated list of "
                    "them, or *");
            o->cors = optarg;
            break;
        case O_QUEUED:
            cli_parse_int(cmd, "--max-queued-requests", optarg, 1, 1 << 20, &v);
            o->ep.max_queued = (int32_t)v;
            break;
        case 'c':
            cli_parse_int(cmd, "--context-length", optarg, 2, 1 << 24, &v);
            o->ep.gen.n_ctx = (int32_t)v;
            break;
        case O_CHUNK:
            cli_parse_int(cmd, "--chunked-prefill-size", optarg, 1, 1 << 20, &v);
            o->ep.prefill_chunk = (int32_t)v;
            break;
        case O_TOTAL:
            cli_parse_int(cmd, "--max-total-tokens", optarg, 1, 1L << 40, &v);
            o->ep.kv_budget = v;
            break;
        case O_PFX:
            cli_parse_int(cmd, "--prefix-cache-mb", optarg, 0, 1L << 24, &v);
            o->ep.prefix_cache_bytes = (size_t)v << 20;
            break;
        case O_CONNS:
            cli_parse_int(cmd, "--max-connections", optarg, 1, 65536, &o->max_conns);
            break;
        case O_PER_IP:
            cli_parse_int(cmd, "--max-connections-per-ip", optarg, 1, 65536, &o->max_conns_per_ip);
            break;
        case O_BODY:
            cli_parse_int(cmd, "--max-body-bytes", optarg, 64, 1L << 30, &o->max_body);
            break;
        case O_PROMPT:
            cli_parse_int(cmd, "--max-prompt-tokens", optarg, 1, 1 << 24, &o->max_prompt);
            break;
        case O_MAXTOK:
            cli_parse_int(cmd, "--max-tokens-limit", optarg, 1, 1 << 24, &o->max_tokens_limit);
            break;
        case O_TIMEOUT:
            cli_parse_int(cmd, "--timeout", optarg, 1, 86400, &o->timeout_s);
            break;
        case O_DRAIN:
            cli_parse_int(cmd, "--drain-timeout", optarg, 0, 86400, &o->drain_s);
            break;
        case 'n':
            if (!strcmp(optarg, "-1")) /* llama.cpp's "until the end": the rest of the context */
                o->default_max_tokens = 1L << 30;
            else
                cli_parse_int(cmd, "-n", optarg, 1, 1 << 24, &o->default_max_tokens);
            break;
        case 'h':
            fputs(serve_help, stdout);
            fputs(serve_help_conns, stdout);
            fputs(serve_help_env, stdout);
            fputs(cli_common_help, stdout);
            exit(0);
        case ':':
            cli_die_option(cmd, argv, 1);
            break;
        default:
            cli_die_option(cmd, argv, 0);
        }
    }
    free(lo);
    if (optind < argc) {
        char msg[300];
        snprintf(msg, sizeof msg, "unexpected argument '%.256s'", argv[optind]);
        die(msg);
    }
    env_args_free(&ea);
    if (!o->model)
        die("-m MODEL is required");
    if (!o->max_conns_per_ip) {
        long floor = o->max_conns < 8 ? o->max_conns : 8;
        o->max_conns_per_ip = o->max_conns / 4 > floor ? o->max_conns / 4 : floor;
    }
    cli_common_check(cmd, &o->c);
}

/* ---------------------------------------------------------------------------------------- */

double srv_unix_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void srv_log(const srv *s, int level, const char *fmt, ...) {
    if (level > s->o.log_level)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    static const char *const names[] = {"error", "warn", "info", "debug"};
    const char *name = level < 0 ? "info" : names[level];
    if (!s->o.log_json) {
        fprintf(stderr, "spectree serve: %s%s\n", level == SRV_LOG_WARN ? "warning: " : "", msg);
        return;
    }
    srv_log_json(json_pack("{s:f,s:s,s:s}", "time", srv_unix_time(), "level", name, "msg", msg));
}

void srv_log_json(json_t *v) {
    char *txt = v ? json_dumps(v, JSON_COMPACT) : NULL;
    json_decref(v);
    if (txt)
        fprintf(stderr, "%s\n", txt);
    free(txt);
}

/* The last component of path, trailing slashes dropped (a directory given as "dir/"), into buf. */
static const char *base_name(const char *path, char *buf, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/')
        b--;
    snprintf(buf, cap, "%.*s", (int)(n - b), path + b);
    return buf;
}

/* The chat template: --chat-template, else detected from the model's tokenizer.chat_template
 * (for a Hugging Face directory, tokenizer_config.json's chat_template, which the in-memory
 * conversion copies there), else ChatML (llama-server's default) with a warning. 0, or -1 with
 * a message printed. */
static int find_template(srv *s) {
    if (s->o.tmpl != SRV_TMPL_NONE) {
        s->tmpl = s->o.tmpl;
        snprintf(s->tmpl_source, sizeof s->tmpl_source, "--chat-template");
        return 0;
    }
    const st_gguf *g = st_model_gguf(s->model);
    st_gguf_str str = {0};
    int have = g && st_gguf_find(g, "tokenizer.chat_template") >= 0 &&
               st_gguf_get_str(g, "tokenizer.chat_template", &str) == ST_OK;
    if (!have) {
        s->tmpl = SRV_TMPL_CHATML;
        snprintf(s->tmpl_source, sizeof s->tmpl_source, "the default");
        srv_log(s, SRV_LOG_WARN,
                "%s has no chat template (tokenizer.chat_template): "
                "chat requests use ChatML; choose another with --chat-template NAME",
                s->o.model);
        return 0;
    }
    s->tmpl = srv_tmpl_detect(str.ptr, (size_t)str.len);
    if (s->tmpl == SRV_TMPL_NONE) {
        srv_log(s, SRV_LOG_ERROR,
                "%s: tokenizer.chat_template is none of the templates this "
                "server renders (llama-2, llama-3, chatml, zephyr, mistral); choose one with "
                "--chat-template NAME",
                s->o.model);
        return -1;
    }
    snprintf(s->tmpl_source, sizeof s->tmpl_source, "tokenizer.chat_template");
    return 0;
}

static const char *sig_name(int sig) {
    return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "SIGHUP";
}

/* The start-up lines of --log-level info: the drafter and its head or draft model, the tree
 * bounds, the kernels and threads, and the memory plan (weights, the target's KV cache, the
 * drafters' context). */
/* Bytes of the target's K and V rows per position. */
static double kv_bytes_per_pos(const st_model_hparams *hp, const st_gen_params *g) {
    return (double)hp->n_layer * hp->n_head_kv * hp->head_dim *
           ((g->type_k == ST_DTYPE_F16 ? 2 : 4) + (g->type_v == ST_DTYPE_F16 ? 2 : 4));
}

static void log_startup(const srv *s) {
    const srv_opts *o = &s->o;
    const st_engine_stats *es = &s->engine_stats;
    const st_spec_algo algo = o->ep.gen.spec.algo;
    if (algo == ST_SPEC_NONE)
        srv_log(s, SRV_LOG_INFO, "drafter NONE (plain decoding)");
    else if (algo == ST_SPEC_NGRAM)
        srv_log(s, SRV_LOG_INFO, "drafter NGRAM (suffixes of %d..%d tokens, %d matches)",
                o->ep.gen.spec.ngram_min_match, o->ep.gen.spec.ngram_max_match,
                o->ep.gen.spec.ngram_breadth);
    else
        srv_log(s, SRV_LOG_INFO, "drafter %s, %s %s", st_spec_algo_name(algo),
                algo == ST_SPEC_STANDALONE ? "draft model" : "head", o->c.draft_path);
    if (algo != ST_SPEC_NONE) {
        const st_spec_params *sp = &o->ep.gen.spec;
        srv_log(s, SRV_LOG_INFO, "tree: top-k %d, depth %d, at most %d nodes with the root (%s)",
                es->topk, es->num_steps, es->num_draft_tokens,
                sp->topk && sp->num_steps && sp->num_draft_tokens
                    ? "fixed"
                    : "auto: each step verifies the nodes that pay, or none");
    }
    char threads[32] = "all cores";
    if (o->c.threads > 0)
        snprintf(threads, sizeof threads, "%ld", o->c.threads);
    srv_log(s, SRV_LOG_INFO, "kernels %s, threads %s", st_kernels_name(), threads);
    const st_load_info *li = st_model_get_load_info(s->model);
    const st_model_hparams *hp = st_model_get_hparams(s->model);
    const double per_pos = kv_bytes_per_pos(hp, &o->ep.gen);
    char drafters[160] = "";
    if (es->draft_bytes)
        snprintf(drafters, sizeof drafters, ", drafters at most %.1f MB (committed as used)",
                 (double)es->draft_bytes / 1e6);
    srv_log(s, SRV_LOG_INFO,
            "memory: weights %.1f MB (%s), KV cache at most %.1f MB (%" PRId64
            " positions: %d slots of %d; committed as used)%s",
            (double)li->file_bytes / 1e6, st_load_mode_name(li->mode),
            per_pos * (double)es->kv_budget / 1e6, es->kv_budget, es->max_running, es->n_ctx,
            drafters);
    if (es->prefix_budget)
        srv_log(s, SRV_LOG_INFO, "prefix cache: at most %.1f MB (blocks of %d tokens)",
                (double)es->prefix_budget / 1e6,
                o->ep.prefix_cache_block ? o->ep.prefix_cache_block : 32);
    else
        srv_log(s, SRV_LOG_INFO, "prefix cache: off");
}

/* --prefix-cache-mb's default: 256 MB, or more where one full context's target KV rows (plus a
 * quarter for a drafter's rows) need more, so a long prompt is cached whole; the engine caps it
 * at a quarter of the available memory. */
static size_t default_prefix_cache(const st_model *m, const st_engine_params *ep) {
    const st_model_hparams *hp = st_model_get_hparams(m);
    int64_t n_ctx = ep->gen.n_ctx ? ep->gen.n_ctx : hp->n_ctx_train;
    if (!ep->gen.n_ctx && n_ctx > ST_DEFAULT_N_CTX)
        n_ctx = ST_DEFAULT_N_CTX;
    const double ctx_bytes = 1.25 * kv_bytes_per_pos(hp, &ep->gen) * (double)n_ctx;
    const size_t floor = (size_t)256 << 20;
    return ctx_bytes > (double)floor ? (size_t)ctx_bytes : floor;
}

/* 32 random bits for request ids (getrandom); without them, the time and the process id. */
static uint64_t id_nonce(int64_t now) {
    uint32_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
        r = (uint32_t)now ^ ((uint32_t)getpid() << 16) ^ (uint32_t)getpid();
    return r;
}

int serve_cmd(int argc, char **argv) {
    static srv s; /* one server per process; the signal thread finds it here */
    memset(&s, 0, sizeof s);
    srv_opts *o = &s.o;
    o->host = "127.0.0.1";
    o->port = 8080;
    o->ep = st_engine_default_params();
    o->ep.prefix_cache_bytes = SIZE_MAX; /* not given: default_prefix_cache below */
    cli_common_init(&o->c);
    o->max_conns = 256;
    o->max_body = 1 << 20;
    o->timeout_s = 10;
    o->drain_s = 60;
    o->default_max_tokens = 16;
    o->log_level = SRV_LOG_INFO;
    parse_flags(argc, argv, o);

    if (!cli_common_paths_ok(&o->c, o->model))
        return 1;
    st_model *dm = NULL;
    int rc = 1;
    if (cli_common_load("serve", &o->c, o->model, &s.model, &dm) != 0 || find_template(&s))
        goto done;
    cli_common_apply(&o->c, &o->ep.gen);
    if (o->ep.prefix_cache_bytes == SIZE_MAX)
        o->ep.prefix_cache_bytes = default_prefix_cache(s.model, &o->ep);
    s.tok = st_model_tokenizer(s.model);
    srv_specials_find(s.tok, &s.specials);
    if (st_engine_create(s.model, &o->ep, &s.engine) != ST_OK) {
        srv_log(&s, SRV_LOG_ERROR, "%s", st_last_error());
        goto done;
    }
    st_engine_get_stats(s.engine, &s.engine_stats);
    s.ol_logged = -1;
    srv_metrics_init(&s.metrics);
    s.n_ctx = s.engine_stats.n_ctx;
    if (o->max_prompt <= 0 || o->max_prompt > s.n_ctx - 1)
        o->max_prompt = s.n_ctx - 1;
    if (o->max_tokens_limit <= 0 || o->max_tokens_limit > s.n_ctx)
        o->max_tokens_limit = s.n_ctx;
    if (o->log_level >= SRV_LOG_INFO)
        log_startup(&s);
    static char name_buf[256];
    s.model_name = o->model_name ? o->model_name : base_name(o->model, name_buf, sizeof name_buf);
    s.created = (int64_t)time(NULL);
    s.t_start = st_time_seconds();
    s.id_nonce = id_nonce(s.created);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.engine_cv, NULL);
    pthread_cond_init(&s.drain_cv, NULL);

    /* SIGTERM/SIGINT/SIGHUP reach this thread only (sigwait below); SIGPIPE is ignored (a
     * client that goes away makes a write fail, not the process die) */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    pthread_t engine_thread;
    if (pthread_create(&engine_thread, NULL, srv_engine_main, &s) != 0) {
        srv_log(&s, SRV_LOG_ERROR, "cannot start the engine thread");
        goto done;
    }
    if (srv_http_start(&s) != 0) {
        pthread_mutex_lock(&s.mu);
        s.stop_engine = 1;
        pthread_cond_signal(&s.engine_cv);
        pthread_mutex_unlock(&s.mu);
        pthread_join(engine_thread, NULL);
        goto done;
    }
    srv_log(&s, SRV_LOG_ALWAYS,
            "%s as '%s' on http://%s:%d (context %d, %d slots, chat template "
            "%s from %s, speculative %s)",
            o->model, s.model_name, o->host, s.port, s.n_ctx, s.engine_stats.max_running,
            srv_tmpl_name(s.tmpl), s.tmpl_source, st_spec_algo_name(o->ep.gen.spec.algo));
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    srv_log(&s, SRV_LOG_ALWAYS, "%s: draining (no new requests; %d in flight)", sig_name(sig),
            s.live_jobs);
    srv_http_quiesce(&s);
    pthread_mutex_lock(&s.mu);
    s.draining = 1;
    /* until the running requests finish, --drain-timeout passes or a second signal comes */
    const double t_end = st_time_seconds() + (double)o->drain_s;
    int again = 0;
    while ((s.live_jobs > 0 || s.active_requests > 0) && st_time_seconds() < t_end && !again) {
        pthread_mutex_unlock(&s.mu);
        const struct timespec tick = {0, 100 * 1000000L};
        again = sigtimedwait(&sigs, NULL, &tick) > 0 ? 1 : 0;
        pthread_mutex_lock(&s.mu);
    }
    int left = s.live_jobs > s.active_requests ? s.live_jobs : s.active_requests;
    struct timespec until;
    if (left) {
        /* the connections answer what is left with 503 (a stream: an error event and [DONE])
         * within a wait or two; a client that does not read its answer is not waited for */
        srv_log(&s, SRV_LOG_ALWAYS, "%s: %d requests cut",
                again ? "a second signal" : "drain timeout", left);
        s.cut = again ? SRV_CUT_SIGNAL : SRV_CUT_TIMEOUT;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += CUT_GRACE_S;
        while (s.active_requests > 0)
            if (pthread_cond_timedwait(&s.drain_cv, &s.mu, &until) == ETIMEDOUT)
                break;
    }
    pthread_mutex_unlock(&s.mu);
    srv_http_stop(&s);
    pthread_mutex_lock(&s.mu);
    s.stop_engine = 1;
    pthread_cond_signal(&s.engine_cv);
    pthread_mutex_unlock(&s.mu);
    pthread_join(engine_thread, NULL);
    pthread_mutex_lock(&s.mu);
    while (s.pending) { /* never reached the engine */
        srv_job *j = s.pending;
        s.pending = j->next;
        srv_job_refuse(&s, j, ST_ERR_BUSY, "the server is shutting down");
    }
    pthread_mutex_unlock(&s.mu);
    srv_log(&s, SRV_LOG_ALWAYS, "stopped after %" PRId64 " requests (%" PRId64 " cut)",
            s.metrics.requests_total, s.metrics.cut);
    rc = 0;
done:
    st_engine_free(s.engine);
    st_model_free(dm);
    st_model_free(s.model);
    return rc;
}
