/*
 * engine.c: `spectree-bench engine`: the continuous-batching engine under a closed-loop
 * load, without HTTP: at each concurrency C, C requests are kept in flight (a new one is
 * submitted as soon as one finishes) until R have run; throughput and latencies with plain
 * decoding and with speculation, runs interleaved, medians of repeats after a warm-up. Greedy,
 * so both emit the same tokens.
 */
#include "bench.h"
#include "spectree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_CONC = 16, MAX_REPS = 64 };

static const char *prompts[] = {
    "Once upon a time",
    "The sun was shining and the birds were singing",
    "Tom had a red ball. He liked to play with it every day",
    "Molly the cow lived on a green hill",
    "One day, a big dog saw a cat. The dog said",
    "Sam and Sue went to the park to play on the swings",
    "The little bird wanted to fly high in the sky",
    "Lily found a shiny stone in the garden",
};
enum { N_PROMPTS = sizeof prompts / sizeof prompts[0] };

typedef struct load {
    int done;                /* finished requests */
    int64_t tokens;          /* generated */
    double ttft_ms, tpot_ms; /* sums over requests: time to first token, per later token */
    int64_t spec, plain;     /* decoding steps of the requests */
    int64_t n_tpot;
    st_status status;
} load;

static void on_finish(void *user, const st_request_stats *st) {
    load *l = user;
    l->done++;
    l->tokens += st->gen_tokens;
    l->spec += st->spec_steps;
    l->plain += st->plain_steps;
    if (st->status != ST_OK)
        l->status = st->status;
    l->ttft_ms += st->ttft_ms;
    if (st->gen_tokens > 1) {
        l->tpot_ms += (st->total_ms - st->ttft_ms) / (double)(st->gen_tokens - 1);
        l->n_tpot++;
    }
}

typedef struct run_result {
    double tok_s, cpu_tok_s, ttft_ms, tpot_ms, spec_share;
} run_result;

/* R requests of n tokens at concurrency conc through one engine with parameters ep. */
static int run_load(const st_model *m, st_engine_params ep, int conc, int R, int64_t n,
                    int32_t (*ids)[128], const int64_t *n_ids, run_result *out) {
    ep.max_running = conc;
    ep.max_queued = conc;
    st_engine *e;
    if (st_engine_create(m, &ep, &e) != ST_OK)
        return -1;
    load l = {0};
    st_request_params rp = st_engine_request_defaults(e);
    rp.n_predict = n;
    rp.sampler.temp = 0.0f;
    int submitted = 0;
    st_status rc = ST_OK;
    const double t0 = st_time_seconds();
    const clock_t c0 = clock();
    while (l.done < R && rc == ST_OK) {
        while (submitted < R && st_engine_running(e) + st_engine_queued(e) < conc && rc == ST_OK) {
            const int p = submitted % N_PROMPTS;
            rc = st_engine_submit(e, ids[p], n_ids[p], &rp, NULL, on_finish, &l, NULL);
            submitted++;
        }
        if (rc == ST_OK)
            rc = st_engine_step(e);
    }
    const double t1 = st_time_seconds();
    const clock_t c1 = clock();
    st_engine_free(e);
    if (rc != ST_OK || l.status != ST_OK)
        return -1;
    out->tok_s = (double)l.tokens / (t1 - t0);
    out->cpu_tok_s = (double)l.tokens / ((double)(c1 - c0) / CLOCKS_PER_SEC);
    out->ttft_ms = l.ttft_ms / (double)R;
    out->tpot_ms = l.n_tpot ? l.tpot_ms / (double)l.n_tpot : 0.0;
    out->spec_share = l.spec + l.plain ? (double)l.spec / (double)(l.spec + l.plain) : 0.0;
    return 0;
}

static const char *help =
    "usage: spectree-bench engine [-m MODEL] [--algo NGRAM|EAGLE|STANDALONE] [--draft PATH]\n"
    "                             [-n N] [--requests R] [--conc C,C,...] [--reps R] [--json]\n"
    "\n"
    "The continuous-batching engine (st_engine) under a closed-loop load: at each concurrency\n"
    "C, C requests stay in flight (a new one joins as one finishes) until R have run; greedy,\n"
    "auto tree shapes. Each repetition runs plain and speculative back to back; the speed-up\n"
    "is the median of the per-repetition throughput ratios, the rest are medians. The CPU-time\n"
    "speed-up (tokens per second of process CPU time) is robust to a machine shared with other\n"
    "work when the engine runs one thread (a small model).\n"
    "\n"
    "  -m, --model PATH   target model (default models/stories260K.gguf)\n"
    "      --algo NAME    NGRAM (default), EAGLE (needs --draft DIR: a head), STANDALONE\n"
    "                     (--draft PATH: a draft model; default the model itself)\n"
    "      --draft PATH   the EAGLE head directory or the STANDALONE draft model\n"
    "  -n N               tokens per request (default 128)\n"
    "      --requests R   requests per run (default 4 x C, at least 16)\n"
    "      --conc LIST    concurrencies (default 1,2,4,8,16,32)\n"
    "      --reps R       timed repetitions (default 5), after one warm-up\n"
    "      --threads N    threads (default: the engine's choice)\n"
    "      --json         one JSON object per concurrency on stdout\n";

typedef struct engine_opts {
    const char *algo, *draft, *conc;
    long n, requests;
} engine_opts;

static int engine_extra(void *ctx, int argc, char **argv) {
    engine_opts *o = ctx;
    if (argc < 2)
        return 0;
    if (!strcmp(argv[0], "--algo"))
        o->algo = argv[1];
    else if (!strcmp(argv[0], "--draft"))
        o->draft = argv[1];
    else if (!strcmp(argv[0], "--conc"))
        o->conc = argv[1];
    else if (!strcmp(argv[0], "-n"))
        o->n = strtol(argv[1], NULL, 10);
    else if (!strcmp(argv[0], "--requests"))
        o->requests = strtol(argv[1], NULL, 10);
    else
        return 0;
    return 2;
}

int st_bench_engine_main(int argc, char **argv) {
    st_bench_opts o = {.model = "models/stories260K.gguf", .reps = 5};
    engine_opts eo = {.algo = "NGRAM", .conc = "1,2,4,8,16,32", .n = 128};
    int pr = st_bench_parse("spectree-bench engine", help, argc, argv, &o, engine_extra, &eo);
    if (pr >= 0)
        return pr;
    int conc[MAX_CONC], n_conc = 0;
    for (const char *p = eo.conc; *p && n_conc < MAX_CONC;) {
        char *end;
        const long c = strtol(p, &end, 10);
        if (end == p || c < 1 || c > ST_GEN_MAX_BATCH) {
            fprintf(stderr, "spectree-bench engine: --conc takes 1..%d, comma-separated\n",
                    ST_GEN_MAX_BATCH);
            return 2;
        }
        conc[n_conc++] = (int)c;
        p = *end == ',' ? end + 1 : end;
    }
    st_spec_algo algo;
    if (st_spec_algo_parse(eo.algo, &algo) != ST_OK || algo == ST_SPEC_NONE) {
        fprintf(stderr, "spectree-bench engine: --algo NGRAM, EAGLE, EAGLE3 or STANDALONE\n");
        return 2;
    }
    if (eo.n < 1 || eo.n > 4096 || eo.requests < 0 || eo.requests > 100000 || o.reps > MAX_REPS ||
        ((algo == ST_SPEC_EAGLE || algo == ST_SPEC_EAGLE3) && !eo.draft)) {
        fprintf(stderr,
                "spectree-bench engine: -n 1..4096, --requests 0..100000, --reps 1..%d; "
                "EAGLE and EAGLE3 need --draft DIR\n",
                MAX_REPS);
        return 2;
    }
    st_model *m = NULL, *dm = NULL;
    int rc = 1;
    if (st_model_load(o.model, &m) != ST_OK ||
        (eo.draft && (algo == ST_SPEC_EAGLE || algo == ST_SPEC_EAGLE3
                          ? st_eagle_head_load(eo.draft, m, &dm) ||
                                st_eagle_head_set_type(dm, -1) /* as the CLI's default */
                          : st_model_load(eo.draft, &dm)) != ST_OK)) {
        fprintf(stderr, "spectree-bench engine: %s\n", st_last_error());
        goto done;
    }
    const st_tokenizer *tok = st_model_tokenizer(m);
    int32_t ids[N_PROMPTS][128];
    int64_t n_ids[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++)
        if (st_tokenize(tok, prompts[i], strlen(prompts[i]), st_tokenizer_add_bos_default(tok),
                        ids[i], 128, &n_ids[i]) != ST_OK) {
            fprintf(stderr, "spectree-bench engine: %s\n", st_last_error());
            goto done;
        }
    st_engine_params plain = st_engine_default_params();
    plain.gen.n_threads = o.threads;
    plain.gen.n_ctx = (int32_t)(eo.n + 160);
    st_engine_params spec = plain;
    spec.gen.spec.algo = algo;
    spec.gen.spec.draft_model = dm ? dm : m;
    if (!o.json)
        printf("%s, %s, %ld tokens per request, %d repetitions\n", o.model, st_spec_algo_name(algo),
               eo.n, o.reps);
    for (int ci = 0; ci < n_conc; ci++) {
        const int C = conc[ci];
        const int R = eo.requests ? (int)eo.requests : (4 * C > 16 ? 4 * C : 16);
        double tp[MAX_REPS], ts[MAX_REPS], ratio[MAX_REPS], ttp[MAX_REPS], tts[MAX_REPS],
            lp[MAX_REPS], ls[MAX_REPS], share[MAX_REPS], cratio[MAX_REPS];
        for (int r = -1; r < o.reps; r++) { /* r = -1: warm-up */
            run_result a, b;
            if (run_load(m, plain, C, R, eo.n, ids, n_ids, &a) ||
                run_load(m, spec, C, R, eo.n, ids, n_ids, &b)) {
                fprintf(stderr, "spectree-bench engine: %s\n", st_last_error());
                goto done;
            }
            if (r < 0)
                continue;
            tp[r] = a.tok_s, ts[r] = b.tok_s, ratio[r] = b.tok_s / a.tok_s;
            ttp[r] = a.ttft_ms, tts[r] = b.ttft_ms, lp[r] = a.tpot_ms, ls[r] = b.tpot_ms;
            share[r] = b.spec_share;
            cratio[r] = b.cpu_tok_s / a.cpu_tok_s;
        }
        const double mp = st_bench_median(tp, o.reps), ms = st_bench_median(ts, o.reps),
                     mr = st_bench_median(ratio, o.reps), mtp = st_bench_median(ttp, o.reps),
                     mts = st_bench_median(tts, o.reps), mlp = st_bench_median(lp, o.reps),
                     mls = st_bench_median(ls, o.reps), msh = st_bench_median(share, o.reps),
                     mcr = st_bench_median(cratio, o.reps);
        if (o.json)
            printf("{\"model\": \"%s\", \"algo\": \"%s\", \"concurrency\": %d, \"requests\": %d, "
                   "\"gen_tokens\": %ld, \"plain_tok_s\": %.1f, \"spec_tok_s\": %.1f, "
                   "\"speedup\": %.3f, \"cpu_speedup\": %.3f, \"plain_ttft_ms\": %.3f, "
                   "\"spec_ttft_ms\": %.3f, "
                   "\"plain_tpot_ms\": %.4f, \"spec_tpot_ms\": %.4f, \"spec_step_share\": %.3f, "
                   "\"reps\": %d}\n",
                   o.model, st_spec_algo_name(algo), C, R, eo.n, mp, ms, mr, mcr, mtp, mts, mlp,
                   mls, msh, o.reps);
        else
            printf("concurrency %2d (%3d requests): plain %9.1f tok/s  speculative %9.1f tok/s  "
                   "speed-up %.3fx (CPU time %.3fx) | ttft %.2f / %.2f ms | per token %.3f / %.3f "
                   "ms | speculative steps %.0f%%\n",
                   C, R, mp, ms, mr, mcr, mtp, mts, mlp, mls, 100.0 * msh);
        fflush(stdout);
    }
    rc = 0;
done:
    st_model_free(dm);
    st_model_free(m);
    return rc;
}
