/*
 * chat.c: `spectree chat`, a conversation in the terminal with the model's chat template (the
 * server's renderers, tools/serve/tmpl.c), answers streamed as they are generated, multi-line
 * input, /clear, /regen and /stats. One engine serves every turn, so the drafter and the `auto`
 * controller keep what they measured. Each turn submits the whole conversation, and the engine
 * (reuse_prefix) keeps the KV cache of the last: only the new turn is prefilled (EAGLE heads,
 * which read every position's state, prefill it whole).
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "serve/api.h"
#include "spectree.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *chat_help =
    "usage: spectree chat -m MODEL [--system TEXT] [--chat-template NAME] [options]\n"
    "\n"
    "A conversation in the terminal: type a message and Enter; end a line with '\\' to go on\n"
    "on the next one. The answer streams to stdout. Ctrl-C stops an answer; Ctrl-D, or Ctrl-C\n"
    "at the prompt, leaves. Commands: /clear (a new conversation), /regen (the last answer\n"
    "again), /stats (the last turn's speed and speculation), /help, /exit.\n"
    "\n"
    "  -m, --model PATH     GGUF Llama model or Hugging Face directory (required)\n"
    "      --system TEXT    the system message of every conversation\n"
    "      --chat-template NAME   llama-2, llama-3, chatml, zephyr or mistral (default: detected\n"
    "                       from tokenizer.chat_template; chatml, with a warning, without one)\n"
    "  -n, --n-predict N    most tokens per answer (default -1: until the end of the answer or\n"
    "                       of the context)\n"
    "  -c, --ctx-size N     context length of the whole conversation (default: the model's,\n"
    "                       <= 4096)\n"
    "  -s, --seed S         sampling seed (default or -1: from the clock)\n"
    "  -h, --help           this help\n"
    "\n"
    "as `spectree generate`:\n";

/* Ctrl-C: counted; the answer under way stops at its next token. */
static volatile sig_atomic_t interrupts;

static void on_sigint(int sig) {
    (void)sig;
    interrupts++;
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "spectree chat: out of memory\n");
        exit(1);
    }
    return q;
}

typedef struct chat {
    st_engine *e;
    const st_tokenizer *tok;
    srv_tmpl tmpl;
    srv_specials specials;
    int add_bos;
    int32_t n_ctx;
    int64_t n_predict;
    st_sampler_params sp;
    const char *system;
    srv_msg *msgs; /* the conversation (a system message first when given) */
    int n_msgs, cap_msgs;
    /* the answer under way */
    st_detok dt;
    char *tok_buf;
    size_t tok_cap;
    char *answer;
    size_t n_answer, cap_answer;
    st_request_stats last; /* the last turn's */
    int64_t last_prompt;
    int have_last;
} chat;

static void add_msg(chat *c, srv_role role, const char *text, size_t len) {
    if (c->n_msgs == c->cap_msgs) {
        c->cap_msgs = c->cap_msgs ? 2 * c->cap_msgs : 16;
        c->msgs = xrealloc(c->msgs, (size_t)c->cap_msgs * sizeof *c->msgs);
    }
    char *t = xrealloc(NULL, len + 1);
    memcpy(t, text, len);
    t[len] = 0;
    c->msgs[c->n_msgs++] = (srv_msg){.role = role, .content = t, .len = len};
}

static void drop_msgs(chat *c, int keep) {
    while (c->n_msgs > keep)
        free(c->msgs[--c->n_msgs].content);
}

static void clear(chat *c) {
    drop_msgs(c, 0);
    if (c->system)
        add_msg(c, SRV_ROLE_SYSTEM, c->system, strlen(c->system));
}

static void put_answer(chat *c, const char *t, size_t n) {
    if (c->n_answer + n + 1 > c->cap_answer) {
        c->cap_answer = 2 * (c->n_answer + n + 1);
        c->answer = xrealloc(c->answer, c->cap_answer);
    }
    memcpy(c->answer + c->n_answer, t, n);
    c->n_answer += n;
    fwrite(t, 1, n, stdout);
    fflush(stdout);
}

static int on_emit(void *user, int32_t token) {
    chat *c = user;
    if (interrupts)
        return 1;
    size_t nb = 0;
    if (st_detok_push(&c->dt, token, c->tok_buf, c->tok_cap, &nb) != ST_OK)
        put_answer(c, "\xEF\xBF\xBD", 3);
    else
        put_answer(c, c->tok_buf, nb);
    return 0;
}

static void on_finish(void *user, const st_request_stats *st) {
    chat *c = user;
    c->last = *st;
    c->have_last = 1;
}

/* The conversation rendered with the template and tokenized (as the server does); NULL with a
 * message printed. */
static int32_t *render(chat *c, int64_t *n) {
    srv_rendered rd;
    char err[SRV_ERR_CAP] = "";
    if (srv_chat_render(c->tmpl, c->msgs, c->n_msgs, &c->specials, &rd, err)) {
        fprintf(stderr, "spectree chat: %s\n", err);
        return NULL;
    }
    int32_t *ids = xrealloc(NULL, sizeof *ids);
    int64_t cap = 1;
    *n = 0;
    if (!rd.has_bos && c->add_bos && st_tokenizer_bos(c->tok) >= 0)
        ids[(*n)++] = st_tokenizer_bos(c->tok);
    for (int i = 0; i < rd.n_segs; i++) {
        int32_t *part = NULL;
        int64_t np = 1;
        if (rd.segs[i].special < 0 &&
            cli_tokenize_all(c->tok, rd.text + rd.segs[i].off, rd.segs[i].len, 0, &part, &np)) {
            fprintf(stderr, "spectree chat: %s\n", part ? st_last_error() : "out of memory");
            free(part);
            free(ids);
            srv_rendered_free(&rd);
            return NULL;
        }
        if (*n + np > cap) {
            cap = 2 * (*n + np);
            ids = xrealloc(ids, (size_t)cap * sizeof *ids);
        }
        if (rd.segs[i].special >= 0)
            ids[(*n)++] = rd.segs[i].special;
        else
            memcpy(ids + *n, part, (size_t)np * sizeof *ids);
        *n += rd.segs[i].special >= 0 ? 0 : np;
        free(part);
    }
    srv_rendered_free(&rd);
    return ids;
}

/* Answers the conversation's last user message, streaming; the answer (cut short by Ctrl-C or
 * not) joins the conversation. 0, or -1 with a message printed (the message is dropped). */
static int answer(chat *c) {
    int64_t n = 0;
    int32_t *ids = render(c, &n);
    if (!ids) {
        drop_msgs(c, c->n_msgs - 1);
        return -1;
    }
    if (n >= c->n_ctx) {
        fprintf(stderr,
                "spectree chat: the conversation (%" PRId64 " tokens) fills the context of %d; "
                "/clear starts a new one (or use -c)\n",
                n, c->n_ctx);
        free(ids);
        drop_msgs(c, c->n_msgs - 1);
        return -1;
    }
    st_request_params rp = {.n_predict = c->n_predict, .sampler = c->sp};
    c->n_answer = 0;
    st_detok_init(&c->dt, c->tok);
    st_detok_set_prev(&c->dt, ids[n - 1]);
    c->have_last = 0;
    st_status rc = st_engine_submit(c->e, ids, n, &rp, on_emit, on_finish, c, NULL);
    free(ids);
    while (rc == ST_OK && st_engine_running(c->e) + st_engine_queued(c->e) > 0)
        rc = st_engine_step(c->e);
    if (rc != ST_OK || (c->have_last && c->last.status != ST_OK)) {
        fprintf(stderr, "\nspectree chat: %s\n", st_last_error());
        drop_msgs(c, c->n_msgs - 1);
        return -1;
    }
    size_t nb = 0;
    if (!interrupts && st_detok_flush(&c->dt, c->tok_buf, c->tok_cap, &nb) == ST_OK)
        put_answer(c, c->tok_buf, nb);
    c->last_prompt = n;
    fputc('\n', stdout);
    fflush(stdout);
    add_msg(c, SRV_ROLE_ASSISTANT, c->answer ? c->answer : "", c->n_answer);
    return 0;
}

static void print_stats(const chat *c, st_spec_algo algo) {
    if (!c->have_last) {
        printf("no turn yet\n");
        return;
    }
    const st_request_stats *st = &c->last;
    const double decode_s = (st->total_ms - st->ttft_ms) / 1e3;
    printf("last turn: prompt %" PRId64 " tokens (%" PRId64 " prefilled, the rest kept from "
           "the last turn), first token after %.1f ms; %" PRId64 " tokens at %.1f tok/s, "
           "stopped: %s; %s: %" PRId64 " speculative steps (+%" PRId64 " plain), tau %.2f\n",
           c->last_prompt, c->last_prompt - st->reused_tokens, st->ttft_ms < 0 ? 0.0 : st->ttft_ms,
           st->gen_tokens,
           st->gen_tokens > 1 && decode_s > 0 ? (double)(st->gen_tokens - 1) / decode_s : 0.0,
           st_stop_reason_name(st->stop_reason), st_spec_algo_name(algo), st->spec_steps,
           st->plain_steps, st->tau);
}

/* One message from the terminal: lines ending with '\' go on. NULL at the end of input or
 * at Ctrl-C (leave). */
static char *read_message(size_t *len) {
    char *msg = NULL;
    size_t n = 0, cap = 0;
    printf("> ");
    fflush(stdout);
    for (;;) {
        char line[4096];
        if (!fgets(line, sizeof line, stdin)) {
            free(msg);
            return NULL;
        }
        size_t k = strlen(line);
        const int more = k >= 2 && line[k - 1] == '\n' && line[k - 2] == '\\';
        if (more)
            line[k - 2] = '\n', k--;
        if (n + k + 1 > cap) {
            cap = 2 * (n + k + 1);
            msg = xrealloc(msg, cap);
        }
        memcpy(msg + n, line, k);
        n += k;
        msg[n] = 0;
        if (more) {
            printf("... ");
            fflush(stdout);
        } else if (k && line[k - 1] == '\n') {
            break;
        }
    }
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    *len = n;
    return msg;
}

/* --chat-template, else the model's tokenizer.chat_template, else ChatML with a warning. */
static int find_template(const st_model *m, const char *model, srv_tmpl *t) {
    if (*t != SRV_TMPL_NONE)
        return 0;
    const st_gguf *g = st_model_gguf(m);
    st_gguf_str str = {0};
    if (!g || st_gguf_find(g, "tokenizer.chat_template") < 0 ||
        st_gguf_get_str(g, "tokenizer.chat_template", &str) != ST_OK) {
        fprintf(stderr,
                "spectree chat: warning: %s has no chat template (tokenizer.chat_template): "
                "using ChatML; choose another with --chat-template NAME\n",
                model);
        *t = SRV_TMPL_CHATML;
        return 0;
    }
    *t = srv_tmpl_detect(str.ptr, (size_t)str.len);
    if (*t == SRV_TMPL_NONE) {
        fprintf(stderr,
                "spectree chat: %s: tokenizer.chat_template is none of the templates spectree "
                "renders (llama-2, llama-3, chatml, zephyr, mistral); choose one with "
                "--chat-template NAME\n",
                model);
        return -1;
    }
    return 0;
}

int cli_cmd_chat(int argc, char **argv) {
    const char *cmd = "chat", *model = NULL, *system = NULL;
    long n_predict = -1, ctx = 0;
    int seed_set = 0;
    srv_tmpl tmpl = SRV_TMPL_NONE;
    cli_common co;
    cli_common_init(&co);
    enum { O_SYSTEM = 1000, O_TMPL };
    static const struct option own[] = {{"model", required_argument, 0, 'm'},
                                        {"system", required_argument, 0, O_SYSTEM},
                                        {"system-prompt", required_argument, 0, O_SYSTEM},
                                        {"chat-template", required_argument, 0, O_TMPL},
                                        {"n-predict", required_argument, 0, 'n'},
                                        {"ctx-size", required_argument, 0, 'c'},
                                        {"seed", required_argument, 0, 's'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
    struct option *lo = cli_common_options(own);
    argc = cli_common_argv(cmd, argc, argv, "m:n:c:s:t:h", lo);
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":m:n:c:s:t:h", lo, NULL)) != -1) {
        if (cli_common_parse(cmd, c, optarg, &co))
            continue;
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case O_SYSTEM:
            system = optarg;
            break;
        case O_TMPL:
            if (srv_tmpl_parse(optarg, &tmpl) != 0)
                cli_die_usage(
                    cmd, "--chat-template expects llama-2, llama-3, chatml, zephyr or mistral");
            break;
        case 'n':
            cli_parse_int(cmd, "-n", optarg, -1, 1 << 24, &n_predict);
            break;
        case 'c':
            cli_parse_int(cmd, "-c", optarg, 2, 1 << 24, &ctx);
            break;
        case 's':
            if (strcmp(optarg, "-1") != 0) {
                co.sp.seed = cli_parse_u64(cmd, "--seed", optarg);
                seed_set = 1;
            }
            break;
        case 'h':
            fputs(chat_help, stdout);
            fputs(cli_common_help, stdout);
            free(lo);
            return 0;
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
        cli_die_usage(cmd, msg);
    }
    if (!model)
        cli_die_usage(cmd, "-m MODEL is required");
    cli_common_check(cmd, &co);
    if (!seed_set) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        co.sp.seed =
            ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32);
    }
    if (!cli_common_paths_ok(&co, model))
        return 1;
    st_model *m = NULL, *dm = NULL;
    chat ch = {.system = system, .sp = co.sp};
    int rc = 1;
    if (cli_common_load(cmd, &co, model, &m, &dm) != 0 || find_template(m, model, &tmpl) != 0)
        goto done;
    ch.tmpl = tmpl;
    ch.tok = st_model_tokenizer(m);
    ch.add_bos = !co.no_bos && st_tokenizer_add_bos_default(ch.tok);
    srv_specials_find(ch.tok, &ch.specials);
    st_engine_params ep = st_engine_default_params();
    cli_common_apply(&co, &ep.gen);
    ep.gen.n_ctx = (int32_t)ctx;
    ep.max_running = 1;
    ep.prefill_chunk = 1 << 20;
    ep.reuse_prefix = 1;
    if (st_engine_create(m, &ep, &ch.e) != ST_OK) {
        fprintf(stderr, "spectree chat: %s\n", st_last_error());
        goto done;
    }
    st_engine_stats es;
    st_engine_get_stats(ch.e, &es);
    ch.n_ctx = es.n_ctx;
    ch.n_predict = n_predict < 0 ? (int64_t)1 << 40 : n_predict;
    ch.tok_cap = st_detok_max_bytes(ch.tok);
    ch.tok_buf = xrealloc(NULL, ch.tok_cap);
    clear(&ch);
    fprintf(stderr,
            "spectree chat: %s, chat template %s, context %d, speculative %s; /help lists the "
            "commands, Ctrl-D leaves\n",
            model, srv_tmpl_name(tmpl), ch.n_ctx, st_spec_algo_name(co.spec.algo));
    /* no SA_RESTART: Ctrl-C at the prompt interrupts the read, and leaves */
    struct sigaction sa = {.sa_handler = on_sigint}, old_sa;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    for (;;) {
        interrupts = 0;
        size_t len = 0;
        char *msg = read_message(&len);
        if (!msg) {
            fputc('\n', stdout);
            break;
        }
        if (!strcmp(msg, "/exit") || !strcmp(msg, "/quit")) {
            free(msg);
            break;
        } else if (!strcmp(msg, "/help")) {
            printf("/clear: a new conversation; /regen: the last answer again; /stats: the last "
                   "turn's speed and speculation; /exit (or Ctrl-D): leave. Ctrl-C stops an "
                   "answer. End a line with '\\' to go on on the next.\n");
        } else if (!strcmp(msg, "/clear")) {
            clear(&ch);
            printf("(a new conversation)\n");
        } else if (!strcmp(msg, "/stats")) {
            print_stats(&ch, co.spec.algo);
        } else if (!strcmp(msg, "/regen")) {
            if (ch.n_msgs > 0 && ch.msgs[ch.n_msgs - 1].role == SRV_ROLE_ASSISTANT) {
                drop_msgs(&ch, ch.n_msgs - 1);
                answer(&ch);
            } else {
                printf("no answer to generate again\n");
            }
        } else if (msg[0] == '/' && !strchr(msg, ' ') && !strchr(msg, '\n')) {
            printf("unknown command %s (/help lists them)\n", msg);
        } else if (len > 0) {
            add_msg(&ch, SRV_ROLE_USER, msg, len);
            answer(&ch);
        }
        free(msg);
        if (interrupts > 1) /* a second Ctrl-C while the answer stopped */
            break;
    }
    sigaction(SIGINT, &old_sa, NULL);
    rc = 0;
done:
    drop_msgs(&ch, 0);
    free(ch.msgs);
    free(ch.answer);
    free(ch.tok_buf);
    st_engine_free(ch.e);
    st_model_free(dm);
    st_model_free(m);
    return rc;
}
