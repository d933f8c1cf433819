/* bench.h: the subcommands of spectree-bench, one file each (tools/bench/<name>.c), and the
 * helpers they share (common.c). */
#ifndef ST_BENCH_H
#define ST_BENCH_H

#include "spectree.h"

int st_bench_tree_main(int argc, char **argv);
int st_bench_e2e_main(int argc, char **argv);
int st_bench_decode_main(int argc, char **argv);
int st_bench_verify_main(int argc, char **argv);
int st_bench_threads_main(int argc, char **argv);
int st_bench_gguf_main(int argc, char **argv);
int st_bench_engine_main(int argc, char **argv);
int st_bench_peak_main(int argc, char **argv);

/* Median of n values (sorts v in place). */
double st_bench_median(double *v, int n);

/* Options shared by the model benchmarks. */
typedef struct st_bench_opts {
    const char *model; /* -m PATH */
    int json;          /* --json */
    int threads;       /* --threads N, 0 = the session default (all cores) */
    int reps;          /* --reps R */
    st_load_mode load; /* --mmap, --no-mmap: MMAP, COPY; default AUTO */
    int mlock;         /* --mlock */
} st_bench_opts;

/* Parses -m, --json, --threads, --reps, --mmap, --no-mmap, --mlock and --help for subcommand
 * `name`; extra options are passed to `extra` (returns the number of arguments it consumed, 0 if
 * unknown). Returns -1 to continue, else the exit code (0 after --help, 2 on a usage error). */
int st_bench_parse(const char *name, const char *usage, int argc, char **argv, st_bench_opts *o,
                   int (*extra)(void *ctx, int argc, char **argv), void *ctx);

/* Loads the model as o says (progress on stderr for files over 1 GB) and creates a session of
 * n_ctx positions and o->threads threads; prints the error and returns nonzero on failure. */
int st_bench_open(const char *name, const st_bench_opts *o, int32_t n_ctx, st_model **m,
                  st_session **s);

/* Seconds for n greedy decode steps of sequence 0 after a fresh one-token prompt; logits holds
 * n_vocab floats. Nonzero on an engine error (st_last_error says which). */
int st_bench_decode_run(st_session *s, float *logits, int32_t n_vocab, int32_t n, double *sec);

/* GB/s of bytes read by a memcpy of `bytes` from src to dst (as many written), split by
 * 64-byte lines over the pool's threads: the median of reps after one untimed copy. */
struct st_pool;
double st_bench_copy_gbps(struct st_pool *pool, char *dst, const char *src, size_t bytes, int reps);

/* The usage lines of the load options, for each subcommand's --help. */
#define ST_BENCH_LOAD_USAGE                                                                        \
    "  --mmap / --no-mmap: keep the weights in the file mapping / copy them into huge pages\n"     \
    "  (default: copy files of 256 MB and more when the memory is there); --mlock: lock them\n"

/* Prints a progress line for files over 1 GB (an st_load_progress_fn; user = the subcommand). */
void st_bench_load_progress(void *user, size_t done, size_t total, double seconds);

/* "mode (reason, load s, huge MB)" of the model's load, for the report lines. */
const char *st_bench_load_desc(const st_model *m, char *buf, size_t cap);

/* Weight type of the model's blocks, e.g. "q8_0". */
const char *st_bench_wtype(const st_model *m);

#endif
