/*
 * gguf.c: `spectree-bench gguf`: how long st_gguf_open takes on hostile headers of about
 * M megabytes (default 100), the kind built to make a loader slow: millions of one-byte metadata
 * values under unique keys, the same with a duplicate of the first key at the very end (refused
 * only after every key is in the index), millions of empty tensor infos, and those with a
 * duplicate name at the end. The benchmark writes the four files itself (in --dir, default
 * /tmp), opens each R times in alternation and reports the median wall and CPU seconds, then
 * deletes them. The goal (the hardening issue): under a second of parsing for 100 MB.
 */
#define _GNU_SOURCE
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static const char *usage =
    "usage: spectree-bench gguf [--mb M] [--reps R] [--dir DIR] [--json]\n"
    "  writes four hostile GGUF headers of about M MB (default 100: 5 million metadata keys, the\n"
    "  same with a duplicate key at the end, 2.5 million empty tensor infos, the same with a\n"
    "  duplicate name at the end) into DIR (default /tmp), times st_gguf_open on each, median\n"
    "  of R alternating runs (default 5), and deletes them\n";

typedef struct gguf_opts {
    long mb;
    const char *dir;
} gguf_opts;

static int extra_opt(void *ctx, int argc, char **argv) {
    gguf_opts *g = ctx;
    if (!strcmp(argv[0], "--dir") && argc >= 2) {
        g->dir = argv[1];
        return 2;
    }
    if (strcmp(argv[0], "--mb") || argc < 2)
        return 0;
    char *end;
    long v = strtol(argv[1], &end, 10);
    if (end == argv[1] || *end || argv[1][0] < '0' || argv[1][0] > '9' || v < 1 || v > 4096) {
        fprintf(stderr, "gguf: --mb expects an integer in 1..4096, got '%s'\n", argv[1]);
        return -1;
    }
    g->mb = v;
    return 2;
}

enum { KIND_KEYS, KIND_KEYS_DUP, KIND_TENSORS, KIND_TENSORS_DUP, N_KINDS };
static const char *kind_name[N_KINDS] = {"keys", "keys+dup", "tensors", "tensors+dup"};

static void put(FILE *f, const void *p, size_t n) { fwrite(p, 1, n, f); }

/* Entry i of a kind: a key "k%07d" with a u8 value, or a tensor "t%07d" [0] f32 at offset 0. */
static void put_entry(FILE *f, int tensors, long i) {
    char name[16];
    const uint64_t len = (uint64_t)snprintf(name, sizeof name, "%c%07ld", tensors ? 't' : 'k', i);
    put(f, &len, 8);
    put(f, name, len);
    if (tensors) {
        const uint32_t n_dims = 1, type = 0;
        const int64_t ne = 0;
        const uint64_t off = 0;
        put(f, &n_dims, 4), put(f, &ne, 8), put(f, &type, 4), put(f, &off, 8);
    } else {
        const uint32_t type = 0; /* u8 */
        const uint8_t v = 1;
        put(f, &type, 4), put(f, &v, 1);
    }
}

static int write_kind(const char *path, int kind, long mb) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "gguf: cannot write %s\n", path);
        return -1;
    }
    const int tensors = kind >= KIND_TENSORS,
              dup = kind == KIND_KEYS_DUP || kind == KIND_TENSORS_DUP;
    const long n = mb * 1000000 / (tensors ? 40 : 21); /* bytes per entry */
    const uint32_t version = 3;
    const uint64_t nt = tensors ? (uint64_t)(n + dup) : 0, nkv = tensors ? 0 : (uint64_t)(n + dup);
    put(f, "GGUF", 4), put(f, &version, 4), put(f, &nt, 8), put(f, &nkv, 8);
    for (long i = 0; i < n; i++)
        put_entry(f, tensors, i);
    if (dup)
        put_entry(f, tensors, 0);
    long end = ftell(f); /* the (empty) tensor data starts at the next multiple of 32 */
    for (; end % 32; end++)
        put(f, "", 1);
    const int bad = ferror(f);
    if (fclose(f) || bad) {
        fprintf(stderr, "gguf: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

static double wall_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double cpu_seconds(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return (double)r.ru_utime.tv_sec + (double)r.ru_utime.tv_usec * 1e-6 +
           (double)r.ru_stime.tv_sec + (double)r.ru_stime.tv_usec * 1e-6;
}

int st_bench_gguf_main(int argc, char **argv) {
    st_bench_opts o = {.reps = 5, .model = ""}; /* no -m: the benchmark writes its files */
    gguf_opts go = {.mb = 100, .dir = "/tmp"};
    int rc = st_bench_parse("gguf", usage, argc, argv, &o, extra_opt, &go);
    if (rc >= 0)
        return rc;
    char path[N_KINDS][4096];
    for (int k = 0; k < N_KINDS; k++) {
        snprintf(path[k], sizeof path[k], "%s/spectree-bench-hostile-%d-%d.gguf", go.dir,
                 (int)getpid(), k);
        if (write_kind(path[k], k, go.mb)) {
            for (int j = 0; j <= k; j++)
                remove(path[j]);
            return 1;
        }
    }
    double wall[N_KINDS][64], cpu[N_KINDS][64];
    const int reps = o.reps < 64 ? o.reps : 64;
    char msg[N_KINDS][160];
    int ok = 1;
    for (int r = 0; r < reps && ok; r++)
        for (int k = 0; k < N_KINDS; k++) {
            const double t0 = wall_seconds(), c0 = cpu_seconds();
            st_gguf *g = NULL;
            const st_status s = st_gguf_open(path[k], &g);
            wall[k][r] = wall_seconds() - t0, cpu[k][r] = cpu_seconds() - c0;
            snprintf(msg[k], sizeof msg[k], "%s", s ? st_last_error() : "loaded");
            st_gguf_free(g);
            /* the files without a duplicate must load, the others be refused */
            const int want_ok = k == KIND_KEYS || k == KIND_TENSORS;
            if ((s == ST_OK) != want_ok) {
                fprintf(stderr, "gguf: %s: unexpected result: %s\n", kind_name[k], msg[k]);
                ok = 0;
                break;
            }
        }
    for (int k = 0; k < N_KINDS; k++)
        remove(path[k]);
    if (!ok)
        return 1;
    if (o.json)
        printf("[");
    for (int k = 0; k < N_KINDS; k++) {
        const double w = st_bench_median(wall[k], reps), c = st_bench_median(cpu[k], reps);
        if (o.json)
            printf("%s{\"kind\": \"%s\", \"mb\": %ld, \"wall_s\": %.4f, \"cpu_s\": %.4f}",
                   k ? ", " : "", kind_name[k], go.mb, w, c);
        else
            printf("%-12s %4ld MB: st_gguf_open median %.3f s wall, %.3f s CPU (%d runs): %s\n",
                   kind_name[k], go.mb, w, c, reps, msg[k]);
    }
    if (o.json)
        printf("]\n");
    return 0;
}
