/*
 * core.h: internal services every module uses: status helpers with a thread-local error detail,
 * counted allocation, file mapping, a deterministic counter-based RNG, and the thread pool.
 * Nothing here exits or aborts; callers get a status and a message.
 */
#ifndef ST_CORE_H
#define ST_CORE_H

#include "spectree.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#if defined(__GNUC__)
#define ST_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ST_PRINTF(a, b)
#endif

/* Records the detail of an error for st_last_error() on this thread and returns `s`, so callers
 * can write `return st_fail(ST_ERR_FORMAT, "%s: bad magic", path);`. */
st_status st_fail(st_status s, const char *fmt, ...) ST_PRINTF(2, 3);

/* Prefixes the current error detail with "prefix: " (for adding context, e.g. a file name). */
void st_error_prefix(const char *fmt, ...) ST_PRINTF(1, 2);

/* Counted allocation: all library heap memory goes through these (see st_alloc_count). They
 * return NULL on failure (and on a zero size for st_malloc/st_calloc, which never happens in
 * practice since callers plan sizes). Sizes are multiplied with st_mul_size first. */
void *st_malloc(size_t size);
void *st_calloc(size_t n, size_t size);
void *st_realloc(void *p, size_t size);
void st_free(void *p);
char *st_strdup(const char *s);
char *st_strndup(const char *s, size_t n);
/* Memory committed as it is used: an anonymous mapping whose pages the OS provides (zeroed) on
 * first touch, so a buffer sized for a whole context costs only what the tokens use. populate:
 * commit every page now instead, for a region small enough (ST_LAZY_POPULATE_MAX, counted over
 * every region that a process's slots hold, not one by one) that its page faults would cost more
 * in the first tokens' time than its memory. Page aligned; NULL on failure; free with
 * st_lazy_free and the same size. */
#define ST_LAZY_POPULATE_MAX ((size_t)64 << 20)
void *st_lazy_alloc(size_t size, bool populate);
void st_lazy_free(void *p, size_t size);
/* The first of the n values (floats from a tensor) that is not finite, or -1: the weight check
 * of the model loaders. */
int64_t st_first_non_finite(const float *v, int64_t n);
/* Bytes of physical memory of the machine (0 if unknown). */
size_t st_phys_mem(void);
/* MemAvailable of /proc/meminfo in bytes: what can be allocated without swapping, page cache
 * that can be dropped included (0 if unknown). */
size_t st_mem_available(void);
/* Memory for a model's weights: an anonymous region aligned to ST_HUGE_PAGE, advised
 * MADV_HUGEPAGE (transparent huge pages in `madvise` mode back it with 2 MB pages: one TLB entry
 * where a file mapping needs 512). Each page is committed (zeroed) on its first write: the model
 * loader fills the whole region at once, so every page is in place before a forward pass reads
 * it (faulting a huge page in and filling it costs 10-35% less CPU than committing the region
 * with MADV_POPULATE_WRITE and then copying, measured on 1.1 GB). NULL on failure. Free with
 * st_huge_free and the same size. */
#define ST_HUGE_PAGE ((size_t)2 << 20)
void *st_huge_alloc(size_t size);
void st_huge_free(void *p, size_t size);
/* Bytes of the mapping that holds p backed by transparent huge pages (AnonHugePages of
 * /proc/self/smaps; 0 if none or unknown). Reads a file: not for hot paths. */
size_t st_huge_bytes(const void *p);
/* Aligned allocation (alignment a power of two >= sizeof(void*)); free with st_free_aligned. */
void *st_malloc_aligned(size_t size, size_t align);
void st_free_aligned(void *p);

/* Checked size arithmetic: false on overflow. */
static inline bool st_mul_size(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool st_add_size(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* One allocation per object, planned once (llm.c style). An object's layout function calls
 * st_plan_take for the object itself and then for each of its buffers, in a fixed order: once
 * on a fresh plan (base NULL: only sizes are summed, the pointers it returns are NULL), then
 * again after st_plan_alloc, which allocates the whole block and rewinds, so the same calls
 * carve the pointers. Every piece starts 64-byte aligned; the block is zeroed; one
 * st_free_aligned of the first piece frees it all. */
typedef struct st_plan {
    char *base; /* NULL while sizing */
    size_t off; /* bytes planned so far */
    bool overflow;
} st_plan;
/* The next n elements of elem bytes (n == 0 gives a valid, empty piece). */
void *st_plan_take(st_plan *p, size_t n, size_t elem);
/* Allocates the planned bytes, zeroed, and rewinds for the carving pass; NULL when a size
 * overflowed (p->overflow) or memory ran out (p->off still holds the total). */
void *st_plan_alloc(st_plan *p);

/* A read-only file mapping (the whole file). */
typedef struct st_mmap {
    const void *data;
    size_t size;
} st_mmap;
st_status st_mmap_open(const char *path, st_mmap *out);
void st_mmap_close(st_mmap *m);
/* Drops this process's pages of the whole pages inside [p, p + n) of a read-only file mapping
 * (MADV_DONTNEED): they leave the resident set and are read again from the file if touched. */
void st_mmap_drop(const void *p, size_t n);

/* A file written whole or not at all: st_outfile_open creates a temporary file beside path
 * (in its folder, so that the rename stays on one file system; the umask applies), and
 * st_outfile_close closes it and, when ok is set and every write reached it, renames it over
 * path, else removes it. A path that exists as anything but a regular file (a device, a FIFO,
 * a directory) is refused. The error names path. */
typedef struct st_outfile {
    FILE *f;
    char *tmp;  /* the temporary file's path */
    char *path; /* the file it becomes */
} st_outfile;
st_status st_outfile_open(const char *path, st_outfile *out);
st_status st_outfile_close(st_outfile *o, int ok);

/* Monotonic time in seconds. */
double st_time_now(void);

/* Counter-based random numbers: a pure function of (seed, counter), so that the uniform draw for
 * absolute position p depends only on (seed, p) (DESIGN.md invariant 1). */
uint64_t st_rng_u64(uint64_t seed, uint64_t counter);
/* Uniform in [0, 1) with 24 bits of resolution (exactly representable as float). */
float st_rng_uniform(uint64_t seed, uint64_t counter);

/* Thread pool: persistent workers; the caller is worker 0. st_pool_run runs fn(ctx, ith, nth)
 * on every thread (ith in [0, nth)) and returns when all are done. Workers spin briefly on the
 * next job, then park on a condition variable, so a decode step with hundreds of parallel
 * regions pays little for each. n_threads is clamped to [1, online cores]. */
typedef struct st_pool st_pool;
typedef void (*st_task_fn)(void *ctx, int ith, int nth);
st_status st_pool_create(int n_threads, st_pool **out);
void st_pool_free(st_pool *p);
int st_pool_size(const st_pool *p);
void st_pool_run(st_pool *p, st_task_fn fn, void *ctx);
/* Number of online cores. */
int st_n_cores(void);

/* The binary heap (heap.c) over elements of `size` bytes (at most 64): above(a, b, ctx) is true
 * when a must sit above b (a max-heap of that order). push needs room for one more element; pop
 * (*n > 0) copies the top to *top and removes it; replace_top (n > 0) puts x in the top's place
 * and restores the order. x must not point into the heap. */
typedef bool (*st_heap_above_fn)(const void *a, const void *b, const void *ctx);
void st_heap_push(void *heap, size_t size, int64_t *n, const void *x, st_heap_above_fn above,
                  const void *ctx);
void st_heap_pop(void *heap, size_t size, int64_t *n, void *top, st_heap_above_fn above,
                 const void *ctx);
void st_heap_replace_top(void *heap, size_t size, int64_t n, const void *x, st_heap_above_fn above,
                         const void *ctx);

/* The one ranking rule of scores, logits and candidates everywhere (tree selection, the
 * controller, top-k sampling, greedy argmax): a higher value first, equal values by lower index,
 * NaN after every number. True when (x at index ix) ranks before (y at index iy). */
static inline bool st_ranks_before(float x, int64_t ix, float y, int64_t iy) {
    const bool xn = x != x, yn = y != y;
    if (xn || yn)
        return xn == yn ? ix < iy : yn;
    if (x != y)
        return x > y;
    return ix < iy;
}

/* The environment variables the library reads (env.c, the only reader; see spectree.h). */
typedef enum st_env_kernels {
    ST_ENV_KERNELS_AUTO = 0, /* the best table the CPU supports */
    ST_ENV_KERNELS_REF = 1,  /* ST_KERNELS=ref: the scalar reference table */
    ST_ENV_KERNELS_AVX2 = 2, /* ST_KERNELS=avx2: AVX2 even on AVX-512 machines */
} st_env_kernels;
typedef struct st_env {
    st_env_kernels kernels;
    int pack;          /* 0 when ST_PACK=0 */
    st_load_mode load; /* ST_LOAD=mmap|copy: MMAP or COPY, else AUTO */
    int cpu_clock;     /* 1 when ST_CLOCK=cpu */
    int amx;           /* 0 when ST_AMX=0 */
    int avxvnni;       /* 0 when ST_AVXVNNI=0 */
} st_env;
st_env st_env_get(void);

/* A hash index over n names the caller owns and keeps alive, name(ctx, i) for i in [0, n) (GGUF
 * keys, tensor names): a linear-time duplicate check and constant-time lookups. Open addressing,
 * at most 3/4 full, hashed with SipHash-1-3 under a random per-table key so that a crafted file
 * cannot make its names collide. build sets *dup to the first i whose name equals an earlier
 * one (the index is then partial), else -1; st_name_index_free accepts a zeroed table. */
typedef const char *(*st_name_fn)(const void *ctx, int64_t i);
typedef struct st_name_slot {
    uint32_t tag;  /* the hash's high half (its low bits choose the home slot) */
    uint32_t idx1; /* index + 1; 0: empty */
} st_name_slot;
typedef struct st_name_index {
    st_name_slot *slots; /* (mask + 1) */
    size_t mask;
    st_name_fn name;
    const void *ctx;
    uint64_t key[2];
} st_name_index;
st_status st_name_index_build(st_name_index *t, int64_t n, st_name_fn name, const void *ctx,
                              int64_t *dup);
void st_name_index_free(st_name_index *t);
/* The index of `name`, or -1 (also for a zeroed table). */
int64_t st_name_index_find(const st_name_index *t, const char *name);
/* SipHash with c_rounds compression and d_rounds finalization rounds (2, 4: SipHash-2-4). */
uint64_t st_siphash(uint64_t k0, uint64_t k1, const void *data, size_t len, int c_rounds,
                    int d_rounds);

/* Splits [0, n) into nth near-equal contiguous parts; part ith is [*b, *e). */
static inline void st_split(int64_t n, int ith, int nth, int64_t *b, int64_t *e) {
    int64_t q = n / nth, r = n % nth;
    *b = ith * q + (ith < r ? ith : r);
    *e = *b + q + (ith < r ? 1 : 0);
}
#endif /* ST_CORE_H */
