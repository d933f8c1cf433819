/*
 * threads.c: `spectree-bench threads -m MODEL`: decode tokens/s with 1 thread and with N
 * (default 2), first as the machine is, then with a busy loop on every core: the benchmark starts
 * one busy process per online core itself, and kills them when done (they also die with it and
 * after 10 minutes at most). Runs of the two thread counts alternate, so both see the same
 * load; medians of R runs. On a machine other jobs keep busy, a pool whose workers wait for
 * each other can make N threads many times slower than one; the goal is at most 1.5x.
 */
#define _GNU_SOURCE
#include "bench.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAX_LOAD = 1024 };

static const char *usage =
    "usage: spectree-bench threads -m MODEL [--json] [--threads N] [--reps R] [--tokens T]\n"
    "                              [--load P]\n"
    "  decode tokens/s over T tokens (default 256) with 1 and N threads (default 2), median of\n"
    "  R alternating runs (default 9), without added load and with P busy-loop processes "
    "(default:\n"
    "  one per online core) that the benchmark starts and stops itself\n";

typedef struct threads_opts {
    int tokens, load;
} threads_opts;

static int extra_opt(void *ctx, int argc, char **argv) {
    threads_opts *t = ctx;
    const int is_tok = !strcmp(argv[0], "--tokens"), is_load = !strcmp(argv[0], "--load");
    if ((!is_tok && !is_load) || argc < 2)
        return 0;
    char *end;
    long v = strtol(argv[1], &end, 10);
    if (end == argv[1] || *end || argv[1][0] < '0' || argv[1][0] > '9' || v < (is_tok ? 1 : 0) ||
        v > (is_tok ? 100000 : MAX_LOAD)) {
        fprintf(stderr, "threads: %s expects an integer in %d..%d, got '%s'\n", argv[0],
                is_tok ? 1 : 0, is_tok ? 100000 : MAX_LOAD, argv[1]);
        return -1;
    }
    *(is_tok ? &t->tokens : &t->load) = (int)v;
    return 2;
}

/* Starts n busy-loop children; returns how many started. */
static int load_start(pid_t *pids, int n) {
    const pid_t parent = getpid();
    int k = 0;
    for (; k < n; k++) {
        pid_t c = fork();
        if (c < 0)
            break;
        if (c == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(0);
            alarm(600);
            volatile unsigned long x = 0;
            for (;;)
                x++;
        }
        pids[k] = c;
    }
    struct timespec ramp = {0, 200 * 1000 * 1000}; /* let the scheduler spread them */
    nanosleep(&ramp, NULL);
    return k;
}

static void load_stop(const pid_t *pids, int n) {
    for (int i = 0; i < n; i++)
        kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++)
        waitpid(pids[i], NULL, 0);
}

/* Median tokens/s of each session over reps runs, alternating; t holds 2 * reps. */
static int measure(st_session *const s[2], float *logits, int32_t n_vocab, int n_tok, int reps,
                   double *t, double tok_s[2]) {
    double warm;
    for (int k = 0; k < 2; k++)
        if (st_bench_decode_run(s[k], logits, n_vocab, n_tok < 16 ? n_tok : 16, &warm))
            return 1;
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 2; k++)
            if (st_bench_decode_run(s[k], logits, n_vocab, n_tok, &t[k * reps + r]))
                return 1;
    for (int k = 0; k < 2; k++)
        tok_s[k] = n_tok / st_bench_median(t + k * reps, reps);
    return 0;
}

int st_bench_threads_main(int argc, char **argv) {
    st_bench_opts o = {.reps = 9, .threads = 2};
    threads_opts to = {.tokens = 256, .load = -1};
    int rc = st_bench_parse("threads", usage, argc, argv, &o, extra_opt, &to);
    if (rc >= 0)
        return rc;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (to.load < 0)
        to.load = cores < 1 ? 1 : cores > MAX_LOAD ? MAX_LOAD : (int)cores;
    if (o.threads < 2)
        o.threads = 2;
    st_model *m = NULL;
    st_session *s[2] = {NULL, NULL};
    st_bench_opts o1 = o;
    o1.threads = 1;
    if (st_bench_open("threads", &o1, to.tokens + 2, &m, &s[0]))
        return 1;
    st_session_params p = *st_session_get_params(s[0]);
    p.n_threads = o.threads;
    if (st_session_create(m, &p, &s[1]) != ST_OK) {
        fprintf(stderr, "threads: %s\n", st_last_error());
        st_session_free(s[0]);
        st_model_free(m);
        return 1;
    }
    const int nth = st_session_get_params(s[1])->n_threads;
    const int32_t n_vocab = st_model_get_hparams(m)->n_vocab;
    float *logits = malloc((size_t)n_vocab * sizeof(float));
    double *t = malloc(2 * (size_t)o.reps * sizeof(double));
    pid_t *pids = malloc((size_t)(to.load ? to.load : 1) * sizeof(pid_t));
    double idle[2], busy[2];
    int n_load = 0;
    rc = 1;
    if (!logits || !t || !pids) {
        fprintf(stderr, "threads: out of memory\n");
        goto done;
    }
    if (measure(s, logits, n_vocab, to.tokens, o.reps, t, idle))
        goto fail;
    n_load = load_start(pids, to.load);
    int err = measure(s, logits, n_vocab, to.tokens, o.reps, t, busy);
    load_stop(pids, n_load);
    if (err)
        goto fail;
    const double slow = busy[0] / busy[1];
    if (o.json)
        printf("{\"bench\":\"threads\",\"model\":\"%s\",\"wtype\":\"%s\",\"cores\":%ld,"
               "\"threads\":%d,\"tokens\":%d,\"reps\":%d,\"load_procs\":%d,"
               "\"idle_tok_s_1\":%.2f,\"idle_tok_s_n\":%.2f,\"busy_tok_s_1\":%.2f,"
               "\"busy_tok_s_n\":%.2f,\"busy_slowdown_n_vs_1\":%.3f}\n",
               o.model, st_bench_wtype(m), cores, nth, to.tokens, o.reps, n_load, idle[0], idle[1],
               busy[0], busy[1], slow);
    else
        printf("threads %s (%s, %ld cores, median of %d runs of %d tokens)\n"
               "  without added load:        -t 1 %10.1f tok/s, -t %d %10.1f tok/s (x%.2f)\n"
               "  %3d busy-loop processes:   -t 1 %10.1f tok/s, -t %d %10.1f tok/s (x%.2f): "
               "-t %d is %.2fx slower than -t 1\n",
               o.model, st_bench_wtype(m), cores, o.reps, to.tokens, idle[0], nth, idle[1],
               idle[1] / idle[0], n_load, busy[0], nth, busy[1], busy[1] / busy[0], nth, slow);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "threads: %s\n", st_last_error());
done:
    free(pids);
    free(t);
    free(logits);
    st_session_free(s[1]);
    st_session_free(s[0]);
    st_model_free(m);
    return rc;
}
