/*
 * generate.c: `spectree generate`, streamed text on stdout and its speed on stderr. Built only on
 * the public header. Every bad argument or file ends in a one-line message and a non-zero exit.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "spectree.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX_PROMPT_BYTES = 256 << 20 };

/* Reads all of f (a prompt file or standard input) into a malloc'd buffer; NULL with a message
 * naming `what` on error or past MAX_PROMPT_BYTES. */
static char *read_all(FILE *f, const char *what, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            if (cap >= MAX_PROMPT_BYTES) {
                fprintf(stderr, "spectree: %s: the prompt exceeds %d MiB\n", what,
                        MAX_PROMPT_BYTES >> 20);
                free(buf);
                return NULL;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) {
            if (ferror(f)) {
                fprintf(stderr, "spectree: %s: cannot read: %s\n", what, strerror(errno));
                free(buf);
                return NULL;
            }
            *len = n;
            return buf;
        }
    }
    free(buf);
    fprintf(stderr, "spectree: %s: out of memory\n", what);
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */

static const char *generate_help =
    "usage: spectree generate -m MODEL (-p PROMPT | -f FILE) [options]\n"
    "\n"
    "Generates a continuation of PROMPT and streams it (not the prompt) to stdout.\n"
    "Prompt and generation speed go to stderr. Ctrl-C stops the generation: the statistics\n"
    "of what was generated are printed and the exit status is 130.\n"
    "\n"
    "  -m, --model PATH     GGUF Llama model (required)\n"
    "  -p, --prompt TEXT    prompt text (may be empty); '-p -' reads it from standard input\n"
    "  -f, --file FILE      read the prompt from FILE (one of -p and -f is required)\n"
    "  -n, --n-predict N    tokens to generate (default 256; -1: until the end of text or of\n"
    "                       the context; stops early at end of text)\n"
    "      --temp T         temperature, 0 = greedy (default 0.8)\n"
    "      --top-k K        keep the K most likely tokens, 0 = off (default 40)\n"
    "      --top-p P        nucleus sampling, 1 = off (default 0.95)\n"
    "      --min-p P        drop tokens below P x the top probability, 0 = off (default 0.05)\n"
    "  -s, --seed S         sampling seed (default or -1: from the clock, printed to stderr)\n"
    "      --presence-penalty P   subtract P from the logit of every token already generated\n"
    "                       (OpenAI's presence_penalty, -2..2; default 0 = off)\n"
    "      --frequency-penalty F  subtract F x its count from a generated token's logit\n"
    "                       (OpenAI's frequency_penalty, -2..2; default 0 = off)\n"
    "      --repeat-penalty R     divide a positive logit (multiply a negative one) by R for\n"
    "                       the tokens of the last --repeat-last-n of prompt and output\n"
    "                       (llama.cpp's; 0..10, default 1 = off)\n"
    "      --repeat-last-n N      that window: N tokens, 0 = off, -1 = the whole context\n"
    "                       (default 64)\n"
    "      --logit-bias ID=BIAS   add BIAS (-100..100; -100 bans) to token ID's logit\n"
    "                       (repeatable)\n"
    "      --ignore-eos     never end at the end-of-text token (it is never sampled)\n"
    "      --min-tokens N   neither the end-of-text token nor a --stop string ends the\n"
    "                       output before N tokens\n"
    "  -c, --ctx-size N     context length (default: the model's)\n"
    "      --stop TEXT      stop when TEXT is generated (repeatable; TEXT is not printed)\n"
    "      --json           print a final one-line JSON object with the statistics on stderr\n"
    "  -h, --help           this help\n";

enum { MAX_STOPS = 16 };

typedef struct gen_opts {
    const char *model, *prompt, *prompt_file;
    long n_predict, ctx;
    cli_common c; /* the flags shared with `serve` */
    int seed_set, json;
    const char *stops[MAX_STOPS];
    int n_stops;
    st_logit_bias bias[ST_MAX_LOGIT_BIAS]; /* --logit-bias, in c.sp.logit_bias */
    int repeat_off;                        /* --repeat-last-n 0 */
} gen_opts;

/* Streams detokenized text, holding back a tail that could begin a stop string. */
typedef struct printer {
    st_detok dt;
    const gen_opts *o;
    char pend[4096];
    size_t n_pend;
    int stopped;
    int any;       /* text was written to stdout */
    char *tok_buf; /* (st_detok_max_bytes) one token's text */
    size_t tok_cap;
    size_t n_in;    /* bytes added so far */
    size_t min_end; /* --min-tokens: a stop string must end past this many bytes */
    int64_t n_tok;  /* tokens emitted */
    int werr;       /* errno of a write to stdout that failed */
} printer;

static void printer_add(printer *p, const char *txt, size_t n, int final) {
    p->n_in += n;
    if (n > sizeof p->pend - p->n_pend) { /* no stop string is that long: flush the hold */
        fwrite(p->pend, 1, p->n_pend, stdout);
        p->n_pend = 0;
        if (n > sizeof p->pend) {
            fwrite(txt, 1, n, stdout);
            return;
        }
    }
    p->any = 1;
    memcpy(p->pend + p->n_pend, txt, n);
    p->n_pend += n;
    size_t cut = p->n_pend; /* bytes safe to print */
    for (int i = 0; i < p->o->n_stops; i++) {
        const char *st = p->o->stops[i];
        size_t ls = strlen(st);
        for (size_t j = 0; j + ls <= p->n_pend; j++)
            if (memcmp(p->pend + j, st, ls) == 0 && p->n_in - p->n_pend + j + ls > p->min_end) {
                fwrite(p->pend, 1, j, stdout);
                p->n_pend = 0;
                p->stopped = 1;
                return;
            }
        if (!final)
            for (size_t k = ls - 1; k > 0; k--) /* longest suffix that starts the stop string */
                if (k <= p->n_pend && memcmp(p->pend + p->n_pend - k, st, k) == 0) {
                    if (p->n_pend - k < cut)
                        cut = p->n_pend - k;
                    break;
                }
    }
    fwrite(p->pend, 1, cut, stdout);
    memmove(p->pend, p->pend + cut, p->n_pend - cut);
    p->n_pend -= cut;
    if (fflush(stdout) != 0 || ferror(stdout)) { /* nothing more can be printed: stop */
        p->werr = errno ? errno : EIO;
        p->stopped = 1;
    }
}

/* Ctrl-C: the generation stops at its next token and its statistics are printed; a second
 * Ctrl-C ends the process at once (the default action, restored by the first). */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
    signal(SIGINT, SIG_DFL);
}

static int on_token(void *user, int32_t tok) {
    printer *p = user;
    if (interrupted)
        return 1;
    size_t nb = 0;
    p->n_tok++;
    /* --min-tokens: no stop string ends in the text of a token before the min_tokens-th */
    const int protect = p->n_tok < p->o->c.sp.min_tokens;
    /* the engine emits only ids the tokenizer has (st_generate: an output layer padded past
     * them is never sampled there), so the push cannot fail; if it did, U+FFFD shows it */
    if (st_detok_push(&p->dt, tok, p->tok_buf, p->tok_cap, &nb) != ST_OK) {
        if (protect)
            p->min_end = p->n_in + 3;
        printer_add(p, "\xEF\xBF\xBD", 3, 0);
    } else if (nb) {
        if (protect)
            p->min_end = p->n_in + nb;
        printer_add(p, p->tok_buf, nb, 0);
    }
    return p->stopped || interrupted;
}

/* Parses generate's command line into o (a bad flag ends the program with status 2); 1 when
 * --help was printed. A seed not given comes from the clock. */
static int parse_generate(int argc, char **argv, gen_opts *o) {
    cli_common_init(&o->c);
    enum { O_JSON = 1000, O_STOP, O_PRES, O_FREQ, O_REP, O_REP_N, O_BIAS, O_NO_EOS, O_MIN_TOK };
    static const struct option own[] = {{"model", required_argument, 0, 'm'},
                                        {"prompt", required_argument, 0, 'p'},
                                        {"file", required_argument, 0, 'f'},
                                        {"n-predict", required_argument, 0, 'n'},
                                        {"seed", required_argument, 0, 's'},
                                        {"ctx-size", required_argument, 0, 'c'},
                                        {"json", no_argument, 0, O_JSON},
                                        {"stop", required_argument, 0, O_STOP},
                                        {"presence-penalty", required_argument, 0, O_PRES},
                                        {"frequency-penalty", required_argument, 0, O_FREQ},
                                        {"repeat-penalty", required_argument, 0, O_REP},
                                        {"repeat-last-n", required_argument, 0, O_REP_N},
                                        {"logit-bias", required_argument, 0, O_BIAS},
                                        {"ignore-eos", no_argument, 0, O_NO_EOS},
                                        {"min-tokens", required_argument, 0, O_MIN_TOK},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
    long v;
    struct option *lo = cli_common_options(own);
    int c;
    argc = cli_common_argv("generate", argc, argv, "m:p:f:n:t:c:s:h", lo);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:p:f:n:t:c:s:h", lo, NULL)) != -1) {
        if (cli_common_parse("generate", c, optarg, &o->c))
            continue;
        switch (c) {
        case 'm':
            o->model = optarg;
            break;
        case 'p':
            o->prompt = optarg;
            break;
        case 'f':
            o->prompt_file = optarg;
            break;
        case 'n':
            cli_parse_int("generate", "-n", optarg, -1, 1 << 24, &o->n_predict);
            break;
        case 'c':
            cli_parse_int("generate", "-c", optarg, 1, 1 << 24, &o->ctx);
            break;
        case 's':
            if (strcmp(optarg, "-1") != 0) { /* -1: llama.cpp's random seed */
                o->c.sp.seed = cli_parse_u64("generate", "--seed", optarg);
                o->seed_set = 1;
            }
            break;
        case O_JSON:
            o->json = 1;
            break;
        case O_STOP:
            if (o->n_stops == MAX_STOPS)
                cli_die_usage("generate", "at most 16 --stop strings");
            if (!optarg[0] || strlen(optarg) > 1024)
                cli_die_usage("generate", "--stop needs a text of 1..1024 bytes");
            o->stops[o->n_stops++] = optarg;
            break;
        case O_PRES:
            o->c.sp.presence_penalty =
                cli_parse_float("generate", "--presence-penalty", optarg, -2, 2);
            break;
        case O_FREQ:
            o->c.sp.frequency_penalty =
                cli_parse_float("generate", "--frequency-penalty", optarg, -2, 2);
            break;
        case O_REP:
            o->c.sp.repeat_penalty = cli_parse_float("generate", "--repeat-penalty", optarg, 0, 10);
            break;
        case O_REP_N:
            cli_parse_int("generate", "--repeat-last-n", optarg, -1, INT32_MAX, &v);
            o->c.sp.repeat_last_n = (int32_t)v;
            o->repeat_off = v == 0;
            break;
        case O_BIAS: {
            const char *eq = strchr(optarg, '=');
            char id[32];
            if (!eq || eq == optarg || (size_t)(eq - optarg) >= sizeof id)
                cli_die_usage("generate", "--logit-bias needs ID=BIAS (a token id and a bias)");
            memcpy(id, optarg, (size_t)(eq - optarg));
            id[eq - optarg] = 0;
            if (o->c.sp.n_logit_bias == ST_MAX_LOGIT_BIAS)
                cli_die_usage("generate", "too many --logit-bias flags");
            cli_parse_int("generate", "--logit-bias", id, 0, INT32_MAX, &v);
            o->bias[o->c.sp.n_logit_bias] = (st_logit_bias){
                (int32_t)v, cli_parse_float("generate", "--logit-bias", eq + 1, -100, 100)};
            o->c.sp.n_logit_bias++;
            o->c.sp.logit_bias = o->bias;
            break;
        }
        case O_NO_EOS:
            o->c.sp.ignore_eos = 1;
            break;
        case O_MIN_TOK:
            cli_parse_int("generate", "--min-tokens", optarg, 0, INT32_MAX, &v);
            o->c.sp.min_tokens = (int32_t)v;
            break;
        case 'h':
            fputs(generate_help, stdout);
            fputs(cli_common_help, stdout);
            free(lo);
            return 1;
        case ':':
            cli_die_option("generate", argv, 1);
            break;
        default:
            cli_die_option("generate", argv, 0);
        }
    }
    free(lo);
    if (optind < argc) {
        char msg[300];
        snprintf(msg, sizeof msg, "unexpected argument '%.256s'", argv[optind]);
        cli_die_usage("generate", msg);
    }
    if (!o->model)
        cli_die_usage("generate", "-m MODEL is required");
    if (!o->prompt && !o->prompt_file)
        cli_die_usage("generate", "-p PROMPT or -f FILE is required");
    if (o->prompt && o->prompt_file)
        cli_die_usage("generate", "give the prompt with -p or with -f, not both");
    cli_common_check("generate", &o->c);
    if (o->repeat_off)
        o->c.sp.repeat_penalty = 1.0f;
    if (!o->seed_set) { /* nanoseconds and the process id: two runs never share a seed */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        o->c.sp.seed =
            ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32);
    }
    return 0;
}

int cli_cmd_generate(int argc, char **argv) {
    gen_opts o = {.n_predict = 256};
    if (parse_generate(argc, argv, &o))
        return 0;

    st_model *m = NULL, *dm = NULL;
    int32_t *toks = NULL;
    char *prompt_buf = NULL;
    size_t plen = 0;
    int rc = 1;
    if (!cli_common_paths_ok(&o.c, o.model))
        return 1;
    if (o.prompt_file) {
        FILE *f = fopen(o.prompt_file, "rb");
        if (!f) {
            fprintf(stderr, "spectree: %s: cannot open: %s\n", o.prompt_file, strerror(errno));
            return 1;
        }
        prompt_buf = read_all(f, o.prompt_file, &plen);
        fclose(f);
    } else if (!strcmp(o.prompt, "-")) {
        prompt_buf = read_all(stdin, "standard input", &plen);
    } else {
        plen = strlen(o.prompt);
    }
    if ((o.prompt_file || !strcmp(o.prompt, "-")) && !prompt_buf)
        return 1;
    const char *prompt = prompt_buf ? prompt_buf : o.prompt;
    if (cli_common_load("generate", &o.c, o.model, &m, &dm) != 0)
        goto done;
    const st_tokenizer *tok = st_model_tokenizer(m);
    int64_t n_prompt = 0;
    int add_bos = !o.c.no_bos && st_tokenizer_add_bos_default(tok);
    /* the engine takes prompts shorter than the context: a longer one is refused here, without
     * tokenizing the whole of a huge one, with st_generate's message */
    const int32_t n_ctx = o.ctx > 0 ? (int32_t)o.ctx : st_model_default_ctx(m);
    const int tr = cli_tokenize_max(tok, prompt, plen, add_bos, n_ctx - 1, &toks, &n_prompt);
    if (tr == 1) {
        /* n_ctx: a lower bound when the text was too long to tokenize */
        fprintf(stderr,
                "spectree: generate: the prompt (%s%" PRId64 " tokens) does not fit the "
                "context of %d\n",
                n_prompt == n_ctx ? "more than " : "", n_prompt == n_ctx ? n_prompt - 1 : n_prompt,
                n_ctx);
        goto done;
    }
    if (tr != 0) {
        fprintf(stderr, "spectree: prompt: %s\n", toks ? st_last_error() : "out of memory");
        goto done;
    }
    /* room for one more token (an empty prompt starts from BOS) */
    int32_t *grown = realloc(toks, (size_t)(n_prompt + 1) * sizeof *toks);
    if (!grown) {
        fprintf(stderr, "spectree: out of memory\n");
        goto done;
    }
    toks = grown;
    if (o.ctx > 0 && o.ctx > st_model_get_hparams(m)->n_ctx_train)
        fprintf(stderr,
                "spectree: warning: -c %ld is above the model's trained context (%d): quality "
                "may degrade past it\n",
                o.ctx, st_model_get_hparams(m)->n_ctx_train);
    if (n_prompt == 0) { /* an empty prompt without BOS: start from BOS anyway */
        int32_t bos = st_tokenizer_bos(tok);
        if (bos < 0) {
            fprintf(stderr, "spectree: the prompt is empty and the model has no BOS token\n");
            goto done;
        }
        toks[n_prompt++] = bos;
    }
    printer pr = {.o = &o, .tok_cap = st_detok_max_bytes(tok)};
    pr.tok_buf = malloc(pr.tok_cap);
    if (!pr.tok_buf) {
        fprintf(stderr, "spectree: out of memory\n");
        goto done;
    }
    st_detok_init(&pr.dt, tok);
    st_detok_set_prev(&pr.dt, toks[n_prompt - 1]);
    st_gen_stats gs;
    st_gen_params gp = st_gen_default_params();
    gp.n_predict = o.n_predict < 0 ? (int64_t)1 << 40 : o.n_predict; /* -1: the context */
    gp.sampler = o.c.sp;
    cli_common_apply(&o.c, &gp);
    gp.n_ctx = (int32_t)o.ctx;
    struct sigaction sa = {.sa_handler = on_sigint}, old_sa;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    st_status gst = st_generate(m, toks, n_prompt, &gp, on_token, &pr, &gs);
    sigaction(SIGINT, &old_sa, NULL);
    if (gst != ST_OK) {
        if (pr.any)
            fputc('\n', stdout);
        fprintf(stderr, "spectree: %s\n", st_last_error());
        free(pr.tok_buf);
        goto done;
    }
    size_t nb = 0;
    if (!pr.stopped && st_detok_flush(&pr.dt, pr.tok_buf, pr.tok_cap, &nb) == ST_OK && nb)
        printer_add(&pr, pr.tok_buf, nb, 1);
    free(pr.tok_buf);
    if (!pr.stopped)
        printer_add(&pr, "", 0, 1);
    if (pr.werr) { /* reported here, with its errno (stdio keeps only the flag); stdout then
                    * leads nowhere, so that main's close does not report it again */
        fprintf(stderr, "spectree generate: standard output: %s\n", strerror(pr.werr));
        FILE *sink = freopen("/dev/null", "w", stdout);
        (void)sink;
        goto done;
    }
    fputc('\n', stdout);
    fflush(stdout);
    if (!o.seed_set && o.c.sp.temp > 0)
        fprintf(stderr, "seed: %" PRIu64 "\n", o.c.sp.seed);
    const st_load_info *li = st_model_get_load_info(m);
    fprintf(
        stderr, "load: %.2f s (%.2f s CPU), weights %s (%s), %.0f MB, %.0f MB in huge pages%s\n",
        li->seconds, li->cpu_seconds, st_load_mode_name(li->mode), li->reason,
        (double)li->file_bytes / 1e6, (double)li->huge_bytes / 1e6, li->locked ? ", locked" : "");
    fprintf(stderr, "prompt: %" PRId64 " tokens in %.2f ms (%.1f tok/s)\n", gs.prompt_tokens,
            gs.prompt_ms, gs.prompt_tok_s);
    const char *why = interrupted ? "interrupted" : st_stop_reason_name(gs.stop_reason[0]);
    fprintf(stderr, "generation: %" PRId64 " tokens in %.2f ms (%.1f tok/s), stopped: %s\n",
            gs.gen_tokens, gs.gen_ms, gs.gen_tok_s, why);
    if (gs.stop_reason[0] == ST_STOP_CONTEXT && o.n_predict >= 0)
        fprintf(stderr,
                "spectree: warning: the context (%ld positions) is full; generation stopped "
                "after %" PRId64 " of %ld tokens (use -c)\n",
                (long)gs.n_ctx, gs.gen_tokens, o.n_predict);
    if (o.c.spec.algo != ST_SPEC_NONE) {
        const double ns = gs.spec_steps ? (double)gs.spec_steps : 1.0;
        fprintf(stderr,
                "speculative: %s, %sK=%d S=%d N=%d (mean pool K %.1f S %.1f, mean tree %.1f "
                "tokens), %s attention: %" PRId64 " speculative steps (+%" PRId64
                " plain), tau %.2f tokens/step; draft %.1f ms, verify %.1f ms, overhead %.1f "
                "ms\n",
                st_spec_algo_name(o.c.spec.algo), gs.auto_shape ? "auto, " : "", gs.topk,
                gs.num_steps, gs.num_draft_tokens, (double)gs.topk_sum / ns,
                (double)gs.steps_sum / ns, (double)gs.tree_tokens / ns,
                st_attn_backend_name(o.c.spec.backend), gs.spec_steps, gs.plain_steps, gs.tau,
                gs.draft_ms, gs.verify_ms, gs.overhead_ms);
        fprintf(stderr, "accepted drafts per step:");
        for (int k = 0; k <= gs.num_steps && k < 65; k++)
            fprintf(stderr, " %d:%" PRId64, k, gs.accept_hist[k]);
        fprintf(stderr, "\n");
        if (gs.auto_shape && gs.outlook.known && !gs.outlook.drafting) { /* why not */
            char line[512];
            cli_outlook_line(&gs.outlook, o.c.spec.algo, line, sizeof line);
            fprintf(stderr, "%s\n", line);
        }
    }
    if (o.json) {
        fprintf(stderr,
                "{\"prompt_tokens\": %" PRId64 ", \"gen_tokens\": %" PRId64
                ", \"prompt_ms\": %.3f, \"gen_ms\": %.3f, \"prompt_tok_s\": %.2f, "
                "\"gen_tok_s\": %.2f, \"algorithm\": \"%s\", \"spec_steps\": %" PRId64
                ", \"plain_steps\": %" PRId64 ", \"tau\": %.4f, \"accept_hist\": [",
                gs.prompt_tokens, gs.gen_tokens, gs.prompt_ms, gs.gen_ms, gs.prompt_tok_s,
                gs.gen_tok_s, st_spec_algo_name(o.c.spec.algo), gs.spec_steps, gs.plain_steps,
                gs.tau);
        int top = o.c.spec.algo != ST_SPEC_NONE ? gs.num_steps : 0;
        for (int k = 0; k <= top && k < 65; k++)
            fprintf(stderr, k ? ", %" PRId64 : "%" PRId64, gs.accept_hist[k]);
        fprintf(
            stderr,
            "], \"draft_ms\": %.3f, \"verify_ms\": %.3f, \"overhead_ms\": %.3f, \"topk\": %d, "
            "\"num_steps\": %d, \"num_draft_tokens\": %d, \"auto\": %s, \"tree_tokens\": %" PRId64
            ", \"attention_backend\": \"%s\", \"stop_reason\": \"%s\", \"load_s\": %.3f, "
            "\"load_cpu_s\": %.3f, \"load_mode\": \"%s\", \"load_huge_mb\": %.1f}\n",
            gs.draft_ms, gs.verify_ms, gs.overhead_ms, gs.topk, gs.num_steps, gs.num_draft_tokens,
            gs.auto_shape ? "true" : "false", gs.tree_tokens,
            st_attn_backend_name(o.c.spec.backend), why, li->seconds, li->cpu_seconds,
            st_load_mode_name(li->mode), (double)li->huge_bytes / 1e6);
    }
    rc = interrupted ? 130 : 0; /* the shell's status of a process ended by SIGINT */
done:
    free(prompt_buf);
    free(toks);
    st_model_free(dm);
    st_model_free(m);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
