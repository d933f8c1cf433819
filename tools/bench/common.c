/* common.c: what the benchmarks of spectree-bench share: medians, the common flags, loading a
 * model with progress, the copy bandwidth, and the descriptions of a load and a weight type for
 * the report lines. */
#include "bench.h"

/* The thread pool is internal; the copy runs on it. */
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double st_bench_median(double *v, int n) {
    if (n < 1)
        return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int parse_int(const char *name, const char *flag, const char *v, int lo, int hi, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "%s: %s must be an integer in %d..%d\n", name, flag, lo, hi);
        return 0;
    }
    *out = (int)x;
    return 1;
}

int st_bench_parse(const char *name, const char *usage, int argc, char **argv, st_bench_opts *o,
                   int (*extra)(void *ctx, int argc, char **argv), void *ctx) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) {
            o->model = argv[++i];
        } else if (!strcmp(a, "--threads") && has) {
            if (!parse_int(name, a, argv[++i], 0, 1024, &o->threads))
                return 2;
        } else if (!strcmp(a, "--mmap")) {
            o->load = ST_LOAD_MMAP;
        } else if (!strcmp(a, "--no-mmap")) {
            o->load = ST_LOAD_COPY;
        } else if (!strcmp(a, "--mlock")) {
            o->mlock = 1;
        } else if (!strcmp(a, "--reps") && has) {
            if (!parse_int(name, a, argv[++i], 1, 1000, &o->reps))
                return 2;
        } else {
            int used = extra ? extra(ctx, argc - i, argv + i) : 0;
            if (used < 0)
                return 2;
            if (used == 0) {
                fprintf(stderr, "%s: unknown option or missing value: %s\n%s", name, a, usage);
                return 2;
            }
            i += used - 1;
        }
    }
    if (!o->model) {
        fprintf(stderr, "%s: -m MODEL is required\n%s", name, usage);
        return 2;
    }
    return -1;
}

int st_bench_open(const char *name, const st_bench_opts *o, int32_t n_ctx, st_model **m,
                  st_session **s) {
    *s = NULL;
    st_load_params lp = st_load_default_params();
    lp.mode = o->load;
    lp.mlock = o->mlock;
    lp.progress = st_bench_load_progress;
    lp.progress_user = (void *)name;
    if (st_model_load_ex(o->model, &lp, m) != ST_OK) {
        fprintf(stderr, "%s: %s\n", name, st_last_error());
        return 1;
    }
    st_session_params p = st_session_default_params();
    p.n_ctx = n_ctx;
    p.n_batch = 64;
    p.n_threads = o->threads;
    if (st_session_create(*m, &p, s) != ST_OK) {
        fprintf(stderr, "%s: %s\n", name, st_last_error());
        st_model_free(*m);
        *m = NULL;
        return 1;
    }
    return 0;
}

typedef struct copy_job {
    char *dst;
    const char *src;
    size_t bytes;
} copy_job;

static void copy_task(void *ctx, int ith, int nth) {
    const copy_job *j = ctx;
    int64_t b, e;
    st_split((int64_t)(j->bytes / 64), ith, nth, &b, &e);
    memcpy(j->dst + b * 64, j->src + b * 64, (size_t)(e - b) * 64);
}

double st_bench_copy_gbps(struct st_pool *pool, char *dst, const char *src, size_t bytes,
                          int reps) {
    copy_job j = {dst, src, bytes};
    st_pool_run(pool, copy_task, &j); /* warm-up */
    double t[64];
    const int n = reps < 64 ? reps : 64;
    for (int r = 0; r < n; r++) {
        double t0 = st_time_seconds();
        st_pool_run(pool, copy_task, &j);
        t[r] = st_time_seconds() - t0;
    }
    return (double)bytes / st_bench_median(t, n) / 1e9;
}

void st_bench_load_progress(void *user, size_t done, size_t total, double seconds) {
    if (total < ((size_t)1 << 30))
        return;
    fprintf(stderr, "%s: loading %.0f / %.0f MB (%.1f s)%s", (const char *)user, (double)done / 1e6,
            (double)total / 1e6, seconds, done == total ? "\n" : "\r");
}

const char *st_bench_load_desc(const st_model *m, char *buf, size_t cap) {
    const st_load_info *li = st_model_get_load_info(m);
    snprintf(buf, cap, "%s (%s), %.2f s (%.2f s CPU), %.0f of %.0f MB in huge pages%s",
             st_load_mode_name(li->mode), li->reason, li->seconds, li->cpu_seconds,
             (double)li->huge_bytes / 1e6, (double)li->file_bytes / 1e6,
             li->locked ? ", locked" : "");
    return buf;
}

const char *st_bench_wtype(const st_model *m) {
    return st_dtype_name(st_model_get_hparams(m)->wtype);
}
