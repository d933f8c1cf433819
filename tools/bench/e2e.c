/*
 * e2e.c: `spectree-bench e2e`: end-to-end generation speed, plain decoding against speculative
 * decoding with each drafter, measured side by side in one run (runs interleaved, medians of
 * paired ratios after a warm-up). Speculative decoding is lossless, so every speculative run must
 * emit exactly the plain run's tokens: each run's tokens are checked against the plain reference,
 * and a difference is a failure, never a figure.
 */
#include "bench.h"
#include "spectree.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_DRAFTS = 8, MAX_REPS = 64, MAX_PROMPTS = 16, MAX_SHAPES = 16, MIN_SWEEP_REPS = 3 };

/* The default fixed (K, S, N) shapes of --sweep: chains and SGLang-like trees. */
static const int default_shapes[][3] = {{1, 2, 3}, {1, 3, 4}, {1, 4, 5},  {1, 6, 7},
                                        {2, 3, 6}, {2, 4, 8}, {2, 6, 12}, {4, 4, 12}};

typedef struct e2e_result {
    /* medians over the prompts of each prompt's median over the repetitions; tau, the steps
     * and the mean pool (K, S) of the speculative steps: the last repetition's, summed over
     * the prompts */
    double plain, spec, ratio, tau, mean_k, mean_s;
    double draft; /* drafting time per verified tree in plain-token times */
    double
        level; /* auto's measured draft level pass (a model drafter), plain-token times; 0: none */
    int64_t steps, plain_steps;
    int checked; /* speculative runs whose tokens were compared with plain decoding's */
} e2e_result;

/* The tokens one run emitted, recorded by its emit callback. */
typedef struct tokens {
    int32_t *t;     /* (cap) */
    int64_t n, cap; /* n counts every emitted token (st_generate emits at most n_predict = cap) */
    int64_t corrupt_at; /* --debug-corrupt-spec: this position is recorded off by one; -1 none */
    int32_t n_vocab;
} tokens;

static int record(void *user, int32_t token) {
    tokens *r = user;
    if (r->n < r->cap)
        r->t[r->n] = r->n == r->corrupt_at ? (token + 1) % r->n_vocab : token;
    r->n++;
    return 0;
}

/* The prompts, tokenized, and the tokens plain decoding emits after each: the reference every
 * run is checked against. */
typedef struct prompts {
    int n;
    const char *text[MAX_PROMPTS];
    int32_t ids[MAX_PROMPTS][512];
    int64_t n_ids[MAX_PROMPTS];
    tokens ref[MAX_PROMPTS];
} prompts;

/* What a measurement runs and what a failure message names. */
typedef struct e2e_case {
    const st_model *m;
    const prompts *pr;
    const st_gen_params *plain, *spec;
    const char *name, *shape;
    tokens *run;        /* scratch for the run being checked */
    int64_t corrupt_at; /* --debug-corrupt-spec, for the speculative runs; -1 none */
} e2e_case;

/* Runs generation with gp on prompt i, recording its tokens in c->run; nonzero on an engine
 * error (after a message). */
static int run_one(const e2e_case *c, int i, const st_gen_params *gp, int64_t corrupt_at,
                   st_gen_stats *st) {
    c->run->n = 0;
    c->run->corrupt_at = corrupt_at;
    if (st_generate(c->m, c->pr->ids[i], c->pr->n_ids[i], gp, record, c->run, st) != ST_OK) {
        fprintf(stderr, "spectree-bench: %s\n", st_last_error());
        return 1;
    }
    return 0;
}

/* Checks c->run against prompt i's plain reference; nonzero after a loud message naming the
 * configuration, the prompt, the repetition, the first differing position and both tokens. */
static int check(const e2e_case *c, int i, int rep, const char *what) {
    const tokens *a = &c->pr->ref[i], *b = c->run;
    const int64_t na = a->n < a->cap ? a->n : a->cap, nb = b->n < b->cap ? b->n : b->cap;
    int64_t p = 0;
    while (p < na && p < nb && a->t[p] == b->t[p])
        p++;
    if (p == na && p == nb && a->n == b->n)
        return 0;
    char ta[32] = "the end of generation", tb[32] = "the end of generation", rs[32] = "warm-up";
    if (p < na)
        snprintf(ta, sizeof ta, "token %d", a->t[p]);
    if (p < nb)
        snprintf(tb, sizeof tb, "token %d", b->t[p]);
    if (rep >= 0)
        snprintf(rs, sizeof rs, "repetition %d", rep + 1);
    const int altered = b->corrupt_at >= 0 && b->corrupt_at < b->n;
    fprintf(stderr,
            "spectree-bench e2e: MISMATCH: %s, shape %s, prompt %d (\"%s\"), %s: the %s run "
            "emitted %s at generated position %lld (0-based; %lld tokens in all) where the "
            "reference plain run emitted %s (%lld tokens in all); no figure for this "
            "configuration%s\n",
            c->name, c->shape, i + 1, c->pr->text[i], rs, what, tb, (long long)p, (long long)b->n,
            ta, (long long)a->n,
            altered ? " [the self-test --debug-corrupt-spec altered this run's record]" : "");
    return 1;
}

/* Runs plain and speculative generation back to back for each prompt, reps times after a
 * warm-up round, checking every run's tokens against the plain reference. 0 ok, 1 when a run's
 * tokens differ (after the message), -1 on an engine error. */
static int measure(const e2e_case *c, int reps, e2e_result *out) {
    const prompts *pr = c->pr;
    double plain[MAX_PROMPTS][MAX_REPS], specr[MAX_PROMPTS][MAX_REPS], ratio[MAX_PROMPTS][MAX_REPS];
    double draft[MAX_PROMPTS][MAX_REPS], level[MAX_PROMPTS][MAX_REPS], mp[MAX_PROMPTS],
        ms[MAX_PROMPTS], mr[MAX_PROMPTS], md[MAX_PROMPTS], ml[MAX_PROMPTS];
    int64_t emitted = 0, ksum = 0, ssum = 0;
    memset(out, 0, sizeof *out);
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        for (int i = 0; i < pr->n; i++) {
            st_gen_stats a, b;
            if (run_one(c, i, c->plain, -1, &a))
                return -1;
            if (check(c, i, r, "plain"))
                return 1;
            if (run_one(c, i, c->spec, c->corrupt_at, &b))
                return -1;
            if (check(c, i, r, "speculative"))
                return 1;
            out->checked++;
            if (r < 0)
                continue;
            plain[i][r] = a.gen_tok_s;
            specr[i][r] = b.gen_tok_s;
            ratio[i][r] = b.gen_tok_s / a.gen_tok_s;
            /* drafting time per verified tree (with drafts that were not verified, under auto)
             * in plain-token times */
            draft[i][r] =
                b.spec_steps ? b.draft_ms / (double)b.spec_steps * a.gen_tok_s / 1e3 : 0.0;
            /* one level pass of a draft model, in plain-token times */
            level[i][r] =
                b.level_passes ? b.level_ms / (double)b.level_passes * a.gen_tok_s / 1e3 : 0.0;
            if (r == reps - 1) {
                emitted += (int64_t)(b.tau * (double)b.spec_steps + 0.5);
                out->steps += b.spec_steps;
                out->plain_steps += b.plain_steps;
                ksum += b.topk_sum;
                ssum += b.steps_sum;
            }
        }
    }
    for (int i = 0; i < pr->n; i++) {
        mp[i] = st_bench_median(plain[i], reps);
        ms[i] = st_bench_median(specr[i], reps);
        mr[i] = st_bench_median(ratio[i], reps);
        md[i] = st_bench_median(draft[i], reps);
        ml[i] = st_bench_median(level[i], reps);
    }
    out->level = st_bench_median(ml, pr->n);
    out->draft = st_bench_median(md, pr->n);
    out->plain = st_bench_median(mp, pr->n);
    out->spec = st_bench_median(ms, pr->n);
    out->ratio = st_bench_median(mr, pr->n);
    if (out->steps) {
        out->tau = (double)emitted / (double)out->steps;
        out->mean_k = (double)ksum / (double)out->steps;
        out->mean_s = (double)ssum / (double)out->steps;
    }
    return 0;
}

static void report(int json, const char *model_path, const char *name, const char *shape,
                   long n_gen, int reps, const e2e_result *e) {
    if (json)
        printf("{\"model\": \"%s\", \"drafter\": \"%s\", \"shape\": \"%s\", \"gen_tokens\": %ld, "
               "\"plain_tok_s\": %.1f, \"spec_tok_s\": %.1f, \"speedup\": %.3f, \"tau\": %.3f, "
               "\"spec_steps\": %lld, \"plain_steps\": %lld, \"mean_topk\": %.2f, "
               "\"mean_steps\": %.2f, \"draft_per_tree\": %.3f, \"draft_level\": %.4f, "
               "\"reps\": %d, \"spec_runs_checked\": %d}\n",
               model_path, name, shape, n_gen, e->plain, e->spec, e->ratio, e->tau,
               (long long)e->steps, (long long)e->plain_steps, e->mean_k, e->mean_s, e->draft,
               e->level, reps, e->checked);
    else {
        char lv[64] = "";
        if (e->level > 0.0)
            snprintf(lv, sizeof lv, "; a draft level %.3f plain tokens", e->level);
        printf("%-28s %-10s plain %9.1f tok/s  speculative %9.1f tok/s  speed-up %.3fx  tau %.2f "
               "(%lld speculative + %lld plain steps; mean pool K %.1f S %.1f; drafting %.3f "
               "plain tokens per tree%s; reps %d; %d speculative runs token-identical to plain)\n",
               name, shape, e->plain, e->spec, e->ratio, e->tau, (long long)e->steps,
               (long long)e->plain_steps, e->mean_k, e->mean_s, e->draft, lv, reps, e->checked);
    }
    fflush(stdout);
}

static const char *help =
    "usage: spectree-bench e2e [-m MODEL] [-p PROMPT] [-n N] [--reps R] [--draft PATH]... "
    "[--sweep] [--json]\n"
    "\n"
    "Plain vs speculative tokens/s in the same run for NGRAM, STANDALONE with the model as its\n"
    "own draft, STANDALONE with each --draft model and EAGLE or EAGLE3 (by the head's kind)\n"
    "with each --eagle head, all with\n"
    "auto tree shapes (and fixed ones with --sweep). Greedy unless --temp.\n"
    "Each repetition runs plain and speculative back to back for each prompt; a prompt's\n"
    "speed-up is the median of its per-repetition ratios (robust to a machine whose speed\n"
    "drifts), the result the median over the prompts; tok/s likewise.\n"
    "Speculative decoding is lossless: every run's tokens (warm-up included) are compared\n"
    "with plain decoding's for the same prompt. A run that differs is a failure: a MISMATCH\n"
    "line on stderr names the drafter, shape, prompt, repetition, the first differing\n"
    "position and both tokens, that configuration prints no figure, the others still run,\n"
    "and the exit status is 3.\n"
    "\n"
    "  -m, --model PATH   target model (default models/stories260K.gguf)\n"
    "  -p, --prompt TEXT  prompt (default \"Once upon a time\"; repeatable, up to 16)\n"
    "      --temp T       sampling temperature (default 0: greedy; otherwise the\n"
    "                     sampler's defaults, seed 1234)\n"
    "  -n N               tokens per run (default 256)\n"
    "      --reps R       timed repetitions per configuration (default 7), after one warm-up\n"
    "      --draft PATH   an extra STANDALONE draft model (repeatable)\n"
    "      --eagle DIR    an EAGLE-1/2 or EAGLE-3 head for the model (repeatable)\n"
    "      --draft-type T[,T]...  the heads' matrices in each of these types, one run per\n"
    "                     head and type (auto, f32, f16, bf16, q8_0; default auto: as\n"
    "                     `spectree generate --speculative-draft-type`)\n"
    "      --no-ngram     skip NGRAM\n"
    "      --sweep        also run each drafter with fixed (K, S, N) shapes and print the best\n"
    "                     fixed shape against auto (tok/s and speed-up of both)\n"
    "      --sweep-reps R repetitions per fixed shape, each a plain and a speculative run\n"
    "                     (3..64; default --reps; --sweep raises --reps to at least 3)\n"
    "      --shapes K/S/N[,K/S/N]...  the fixed shapes of --sweep, up to 16 (implies --sweep;\n"
    "                     default 1/2/3,1/3/4,1/4/5,1/6/7,2/3/6,2/4/8,2/6/12,4/4/12)\n"
    "      --ngram-min-match N, --ngram-max-match N  NGRAM's suffix match lengths (default:\n"
    "                     the engine's)\n"
    "      --no-self      skip STANDALONE with the model as its own draft\n"
    "      --topk K, --steps S  the drafters' (K, S) pool (default: auto)\n"
    "  -t N               threads (default: the engine's choice)\n"
    "      --json         one JSON object per drafter on stdout\n"
    "      --debug-corrupt-spec P  a self-test of the token check: record every speculative\n"
    "                     run's token at generated position P (0-based) off by one, so every\n"
    "                     configuration whose runs reach P must fail with a MISMATCH\n";

static const char *type_name(int t) { return t < 0 ? "auto" : st_dtype_name((uint32_t)t); }

/* --draft-type's comma-separated list into types; its length, or 0 (after a message). */
static int parse_types(const char *v, int *types) {
    static const char *const nm[] = {"auto", "f32", "f16", "bf16", "q8_0"};
    static const int id[] = {-1, ST_DTYPE_F32, ST_DTYPE_F16, ST_DTYPE_BF16, ST_DTYPE_Q8_0};
    int n = 0;
    for (const char *p = v; *p;) {
        const size_t len = strcspn(p, ",");
        int found = -2;
        for (size_t k = 0; k < sizeof nm / sizeof nm[0]; k++)
            if (strlen(nm[k]) == len && !strncmp(p, nm[k], len))
                found = id[k];
        if (found == -2 || n == MAX_DRAFTS) {
            fprintf(stderr,
                    "spectree-bench e2e: --draft-type takes up to %d of auto, f32, f16, bf16, "
                    "q8_0, comma-separated; got '%s'\n",
                    MAX_DRAFTS, v);
            return 0;
        }
        types[n++] = found;
        p += len + (p[len] == ',');
    }
    if (n == 0)
        fprintf(stderr, "spectree-bench e2e: --draft-type needs a type\n");
    return n;
}

/* --shapes' comma-separated K/S/N list into shapes; its length, or 0 (after a message). */
static int parse_shapes(const char *v, int (*shapes)[3]) {
    int n = 0;
    for (const char *p = v; *p;) {
        int k, st, nt, used = 0;
        if (n == MAX_SHAPES || sscanf(p, "%d/%d/%d%n", &k, &st, &nt, &used) != 3 ||
            (p[used] != ',' && p[used] != '\0') || k < 1 || k > ST_SPEC_MAX_K || st < 1 ||
            st > ST_SPEC_MAX_S || nt < 2 || nt > ST_SPEC_MAX_N) {
            fprintf(stderr,
                    "spectree-bench e2e: --shapes takes up to %d K/S/N, comma-separated, with K "
                    "1..%d, S 1..%d, N 2..%d; got '%s'\n",
                    MAX_SHAPES, ST_SPEC_MAX_K, ST_SPEC_MAX_S, ST_SPEC_MAX_N, v);
            return 0;
        }
        shapes[n][0] = k;
        shapes[n][1] = st;
        shapes[n][2] = nt;
        n++;
        p += used + (p[used] == ',');
    }
    if (n == 0)
        fprintf(stderr, "spectree-bench e2e: --shapes needs a shape\n");
    return n;
}

/* A whole decimal integer in lo..hi, or 0 after a message naming the flag. */
static int parse_num(const char *flag, const char *v, long lo, long hi, long *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "spectree-bench e2e: %s must be an integer in %ld..%ld; got '%s'\n", flag,
                lo, hi, v);
        return 0;
    }
    *out = x;
    return 1;
}

/* The command line. */
typedef struct e2e_opts {
    const char *model_path, *ptext[MAX_PROMPTS];
    int n_ptext;
    double temp;
    const char *drafts[MAX_DRAFTS];
    int n_drafts, json, reps, threads, ng_min, ng_max, no_self, topk, nsteps, no_ngram, sweep,
        sweep_reps, n_shapes;
    int shapes[MAX_SHAPES][3];
    long corrupt_at, n_gen;
    int is_eagle[MAX_DRAFTS], dtype[MAX_DRAFTS], types[MAX_DRAFTS], n_types;
    char names[MAX_DRAFTS][600];
} e2e_opts;

static int bad_ngram(const char *flag, int v) {
    if (v >= 1 && v <= ST_NGRAM_MAX_MATCH)
        return 0;
    fprintf(stderr, "spectree-bench e2e: %s must be 1..%d\n", flag, ST_NGRAM_MAX_MATCH);
    return 1;
}

/* Parses argv into o; -1 to go on, else the exit status (0 after --help, 2 on a usage error). */
static int parse_opts(int argc, char **argv, e2e_opts *o) {
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"prompt", required_argument, 0, 'p'},
                                       {"reps", required_argument, 0, 'r'},
                                       {"draft", required_argument, 0, 'd'},
                                       {"json", no_argument, 0, 'j'},
                                       {"ngram-min-match", required_argument, 0, 'g'},
                                       {"ngram-max-match", required_argument, 0, 'G'},
                                       {"no-self", no_argument, 0, 's'},
                                       {"topk", required_argument, 0, 'k'},
                                       {"steps", required_argument, 0, 'S'},
                                       {"eagle", required_argument, 0, 'E'},
                                       {"no-ngram", no_argument, 0, 'N'},
                                       {"sweep", no_argument, 0, 'W'},
                                       {"temp", required_argument, 0, 'T'},
                                       {"draft-type", required_argument, 0, 'D'},
                                       {"sweep-reps", required_argument, 0, 'R'},
                                       {"shapes", required_argument, 0, 'H'},
                                       {"debug-corrupt-spec", required_argument, 0, 'X'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    long num;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:h", lo, NULL)) != -1) {
        switch (c) {
        case 'm':
            o->model_path = optarg;
            break;
        case 'p':
            if (o->n_ptext == MAX_PROMPTS) {
                fprintf(stderr, "spectree-bench e2e: at most %d prompts\n", MAX_PROMPTS);
                return 2;
            }
            o->ptext[o->n_ptext++] = optarg;
            break;
        case 'T':
            o->temp = atof(optarg);
            break;
        case 'n':
            o->n_gen = strtol(optarg, NULL, 10);
            break;
        case 't':
            o->threads = atoi(optarg);
            break;
        case 'r':
            o->reps = atoi(optarg);
            break;
        case 'd':
        case 'E':
            if (o->n_drafts == MAX_DRAFTS) {
                fprintf(stderr, "spectree-bench e2e: at most %d --draft models and --eagle heads\n",
                        MAX_DRAFTS);
                return 2;
            }
            o->is_eagle[o->n_drafts] = c == 'E';
            o->drafts[o->n_drafts++] = optarg;
            break;
        case 'D':
            if ((o->n_types = parse_types(optarg, o->types)) < 1)
                return 2;
            break;
        case 'N':
            o->no_ngram = 1;
            break;
        case 'W':
            o->sweep = 1;
            break;
        case 'R':
            if (!parse_num("--sweep-reps", optarg, MIN_SWEEP_REPS, MAX_REPS, &num))
                return 2;
            o->sweep_reps = (int)num;
            break;
        case 'H':
            if ((o->n_shapes = parse_shapes(optarg, o->shapes)) < 1)
                return 2;
            o->sweep = 1;
            break;
        case 'X':
            if (!parse_num("--debug-corrupt-spec", optarg, 0, 99999, &o->corrupt_at))
                return 2;
            break;
        case 'j':
            o->json = 1;
            break;
        case 'g':
            if (bad_ngram("--ngram-min-match", o->ng_min = atoi(optarg)))
                return 2;
            break;
        case 'G':
            if (bad_ngram("--ngram-max-match", o->ng_max = atoi(optarg)))
                return 2;
            break;
        case 's':
            o->no_self = 1;
            break;
        case 'k':
            o->topk = atoi(optarg);
            break;
        case 'S':
            o->nsteps = atoi(optarg);
            break;
        case 'h':
            fputs(help, stdout);
            return 0;
        default:
            fputs(help, stderr);
            return 2;
        }
    }
    if (o->n_gen < 1 || o->n_gen > 100000 || o->reps < 1 || o->reps > MAX_REPS || o->threads < 0 ||
        o->topk < 0 || o->topk > ST_SPEC_MAX_K || o->nsteps < 0 || o->nsteps > ST_SPEC_MAX_S ||
        !(o->temp >= 0.0)) {
        fprintf(stderr,
                "spectree-bench e2e: -n must be 1..100000, --reps 1..%d, --topk 0..%d, --steps "
                "0..%d, --temp >= 0\n",
                MAX_REPS, ST_SPEC_MAX_K, ST_SPEC_MAX_S);
        return 2;
    }
    if (o->n_ptext == 0)
        o->ptext[o->n_ptext++] = "Once upon a time";
    /* one repetition per shape lets a machine whose speed flips between configurations pick
     * the best shape by accident */
    if (o->sweep && o->reps < MIN_SWEEP_REPS)
        o->reps = MIN_SWEEP_REPS;
    if (!o->sweep_reps)
        o->sweep_reps = o->reps;
    if (!o->n_shapes) {
        o->n_shapes = (int)(sizeof default_shapes / sizeof default_shapes[0]);
        memcpy(o->shapes, default_shapes, sizeof default_shapes);
    }
    return -1;
}

/* Each head once per --draft-type; 0, or 2 past MAX_DRAFTS. */
static int expand_drafts(e2e_opts *o) {
    int n = 0;
    const char *path[MAX_DRAFTS];
    int eg[MAX_DRAFTS];
    for (int i = 0; i < o->n_drafts; i++)
        for (int t = 0; t < (o->is_eagle[i] ? o->n_types : 1); t++) {
            if (n == MAX_DRAFTS) {
                fprintf(stderr, "spectree-bench e2e: at most %d heads and types\n", MAX_DRAFTS);
                return 2;
            }
            const int many = o->n_types > 1;
            path[n] = o->drafts[i];
            eg[n] = o->is_eagle[i];
            o->dtype[n] = o->is_eagle[i] ? o->types[t] : -1;
            snprintf(o->names[n], sizeof o->names[n], "%s%s%s%s", o->drafts[i], many ? " [" : "",
                     many ? type_name(o->types[t]) : "", many ? "]" : "");
            n++;
        }
    for (int i = 0; i < n; i++) {
        o->drafts[i] = path[i];
        o->is_eagle[i] = eg[i];
    }
    o->n_drafts = n;
    return 0;
}

/* Tokenizes the prompts and records plain decoding's tokens after each (the reference every
 * run is checked against); 0, or 1 with the message printed. */
static int make_references(const e2e_opts *o, const st_model *m, const st_gen_params *gp_plain,
                           prompts *pr, tokens *run) {
    const st_tokenizer *tok = st_model_tokenizer(m);
    const int32_t n_vocab = st_model_get_hparams(m)->n_vocab;
    pr->n = o->n_ptext;
    run->cap = o->n_gen;
    run->n_vocab = n_vocab;
    run->t = malloc((size_t)o->n_gen * sizeof *run->t);
    for (int i = 0; i < pr->n; i++) {
        pr->text[i] = o->ptext[i];
        if (st_tokenize(tok, o->ptext[i], strlen(o->ptext[i]), st_tokenizer_add_bos_default(tok),
                        pr->ids[i], 512, &pr->n_ids[i]) != ST_OK ||
            pr->n_ids[i] < 1) {
            fprintf(stderr, "spectree-bench: prompt %d: %s\n", i + 1, st_last_error());
            return 1;
        }
        tokens *ref = &pr->ref[i];
        ref->cap = o->n_gen;
        ref->corrupt_at = -1;
        ref->n_vocab = n_vocab;
        ref->t = malloc((size_t)o->n_gen * sizeof *ref->t);
        if (!ref->t || !run->t) {
            fprintf(stderr, "spectree-bench e2e: out of memory for %ld tokens\n", o->n_gen);
            return 1;
        }
        if (st_generate(m, pr->ids[i], pr->n_ids[i], gp_plain, record, ref, NULL) != ST_OK) {
            fprintf(stderr, "spectree-bench: %s\n", st_last_error());
            return 1;
        }
    }
    return 0;
}

/* --sweep for one drafter: every fixed shape, then the best of them against auto's result e
 * (auto_got: auto's mismatches). The number of mismatching shapes, or -1 on an engine error. */
static int sweep_shapes(const e2e_opts *o, e2e_case *ec, st_gen_params *gp_spec,
                        const e2e_result *e, int auto_got) {
    e2e_result best = {0};
    char best_shape[32] = "", shape[32];
    int mismatches = 0;
    ec->shape = shape;
    for (int k = 0; k < o->n_shapes; k++) {
        gp_spec->spec.topk = o->shapes[k][0];
        gp_spec->spec.num_steps = o->shapes[k][1];
        gp_spec->spec.num_draft_tokens = o->shapes[k][2];
        snprintf(shape, sizeof shape, "%d/%d/%d", o->shapes[k][0], o->shapes[k][1],
                 o->shapes[k][2]);
        e2e_result f;
        const int got = measure(ec, o->sweep_reps, &f);
        if (got < 0)
            return -1;
        mismatches += got;
        if (got)
            continue;
        report(o->json, o->model_path, ec->name, shape, o->n_gen, o->sweep_reps, &f);
        if (f.ratio > best.ratio) {
            best = f;
            snprintf(best_shape, sizeof best_shape, "%s", shape);
        }
    }
    /* the summary compares auto with shapes whose tokens all matched */
    if (auto_got || !best_shape[0])
        return mismatches;
    if (!o->json)
        printf("%-28s best fixed K/S/N %s: speculative %.1f tok/s (plain %.1f), speed-up "
               "%.3fx; auto %.1f tok/s (plain %.1f), %.3fx = %.1f%% of it (%d reps auto, %d "
               "per shape)\n",
               ec->name, best_shape, best.spec, best.plain, best.ratio, e->spec, e->plain, e->ratio,
               100.0 * e->ratio / best.ratio, o->reps, o->sweep_reps);
    else
        printf("{\"model\": \"%s\", \"drafter\": \"%s\", \"best_fixed\": \"%s\", "
               "\"best_fixed_speedup\": %.3f, \"best_fixed_spec_tok_s\": %.1f, "
               "\"best_fixed_plain_tok_s\": %.1f, \"auto_speedup\": %.3f, "
               "\"auto_spec_tok_s\": %.1f, \"auto_plain_tok_s\": %.1f, \"reps\": %d, "
               "\"sweep_reps\": %d}\n",
               o->model_path, ec->name, best_shape, best.ratio, best.spec, best.plain, e->ratio,
               e->spec, e->plain, o->reps, o->sweep_reps);
    fflush(stdout);
    return mismatches;
}

/* One drafter, configuration cfg (0 NGRAM, 1 the target drafting for itself, 2.. the --draft
 * models): auto (or the given shape), then --sweep. Mismatching measurements, or -1. */
static int run_config(const e2e_opts *o, int cfg, st_model *m, st_model *const *dm,
                      const prompts *pr, const st_gen_params *gp_plain, tokens *run) {
    st_spec_params spec = st_spec_default_params();
    if (o->ng_min)
        spec.ngram_min_match = o->ng_min;
    if (o->ng_max)
        spec.ngram_max_match = o->ng_max;
    spec.topk = o->topk;
    spec.num_steps = o->nsteps;
    if (spec.ngram_max_match < spec.ngram_min_match)
        spec.ngram_max_match = spec.ngram_min_match;
    st_eagle_info ei = {0};
    if (cfg >= 2)
        st_eagle_head_info(dm[cfg - 2], &ei);
    spec.algo = cfg == 0                           ? ST_SPEC_NGRAM
                : cfg >= 2 && ei.version == 3      ? ST_SPEC_EAGLE3
                : cfg >= 2 && o->is_eagle[cfg - 2] ? ST_SPEC_EAGLE
                                                   : ST_SPEC_STANDALONE;
    spec.draft_model = cfg == 0 ? NULL : cfg == 1 ? m : dm[cfg - 2];
    st_gen_params gp_spec = *gp_plain;
    gp_spec.spec = spec;
    e2e_case ec = {.m = m,
                   .pr = pr,
                   .plain = gp_plain,
                   .spec = &gp_spec,
                   .name = cfg == 0   ? "NGRAM"
                           : cfg == 1 ? "STANDALONE(self)"
                                      : o->names[cfg - 2],
                   .shape = o->topk || o->nsteps ? "given" : "auto",
                   .run = run,
                   .corrupt_at = o->corrupt_at};
    e2e_result e;
    const int got = measure(&ec, o->reps, &e);
    if (got < 0)
        return -1;
    if (!got)
        report(o->json, o->model_path, ec.name, ec.shape, o->n_gen, o->reps, &e);
    if (!o->sweep)
        return got;
    const int swept = sweep_shapes(o, &ec, &gp_spec, &e, got);
    return swept < 0 ? -1 : got + swept;
}

int st_bench_e2e_main(int argc, char **argv) {
    static e2e_opts o; /* static: about 6 KB */
    memset(&o, 0, sizeof o);
    o.model_path = "models/stories260K.gguf";
    o.reps = 7;
    o.corrupt_at = -1;
    o.n_gen = 256;
    o.types[0] = -1;
    o.n_types = 1;
    int rc = parse_opts(argc, argv, &o);
    if (rc >= 0 || (rc = expand_drafts(&o)))
        return rc;
    st_model *m = NULL, *dm[MAX_DRAFTS] = {0};
    static prompts pr; /* static: about 40 KB */
    tokens run = {0};
    rc = 1;
    memset(&pr, 0, sizeof pr);
    if (st_model_load(o.model_path, &m) != ST_OK) {
        fprintf(stderr, "spectree-bench: %s\n", st_last_error());
        return 1;
    }
    for (int i = 0; i < o.n_drafts; i++)
        if ((o.is_eagle[i] ? st_eagle_head_load(o.drafts[i], m, &dm[i]) ||
                                 st_eagle_head_set_type(dm[i], o.dtype[i])
                           : st_model_load(o.drafts[i], &dm[i])) != ST_OK) {
            fprintf(stderr, "spectree-bench: %s\n", st_last_error());
            goto done;
        }
    st_gen_params gp_plain = st_gen_default_params();
    gp_plain.n_predict = o.n_gen;
    gp_plain.sampler = st_sampler_default_params();
    gp_plain.sampler.temp = (float)o.temp;
    gp_plain.sampler.seed = 1234;
    gp_plain.n_threads = o.threads;
    if (make_references(&o, m, &gp_plain, &pr, &run))
        goto done;
    int mismatches = 0;
    for (int cfg = 0; cfg < 2 + o.n_drafts; cfg++) {
        if ((cfg == 1 && o.no_self) || (cfg == 0 && o.no_ngram))
            continue;
        const int got = run_config(&o, cfg, m, dm, &pr, &gp_plain, &run);
        if (got < 0)
            goto done;
        mismatches += got;
    }
    if (mismatches) {
        fprintf(stderr,
                "spectree-bench e2e: FAILED: %d configuration%s emitted tokens that differ from "
                "plain decoding (see the MISMATCH lines above)\n",
                mismatches, mismatches == 1 ? "" : "s");
        rc = 3;
    } else {
        rc = 0;
    }
done:
    for (int i = 0; i < MAX_PROMPTS; i++)
        free(pr.ref[i].t);
    free(run.t);
    for (int i = 0; i < o.n_drafts; i++)
        st_model_free(dm[i]);
    st_model_free(m);
    return rc;
}
