/*
 * core.c: errors (thread-local detail), counted allocation, file mapping, files written whole
 * (a temporary file renamed on success), time and the
 * counter-based RNG. The RNG is SplitMix64's finalizer applied to seed and counter, so a draw
 * is a pure function of (seed, counter) with no state to carry.
 */
#define _GNU_SOURCE
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { ST_ERR_CAP = 1024 };
static _Thread_local char st_err_buf[ST_ERR_CAP];

const char *st_last_error(void) { return st_err_buf; }

const char *st_status_str(st_status s) {
    switch (s) {
    case ST_OK:
        return "ok";
    case ST_ERR_INVALID:
        return "invalid argument";
    case ST_ERR_IO:
        return "i/o error";
    case ST_ERR_FORMAT:
        return "bad format";
    case ST_ERR_NOMEM:
        return "out of memory";
    case ST_ERR_UNSUPPORTED:
        return "unsupported";
    case ST_ERR_RANGE:
        return "out of range";
    case ST_ERR_BUSY:
        return "busy";
    }
    return "unknown status";
}

st_status st_fail(st_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st_err_buf, sizeof st_err_buf, fmt, ap);
    va_end(ap);
    return s;
}

void st_error_prefix(const char *fmt, ...) {
    char pre[ST_ERR_CAP];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    size_t lp = strlen(pre), lo = strlen(st_err_buf);
    if (lp + 2 + lo >= sizeof st_err_buf)
        return; /* keep the original detail rather than a truncated one */
    memmove(st_err_buf + lp + 2, st_err_buf, lo + 1);
    memcpy(st_err_buf, pre, lp);
    memcpy(st_err_buf + lp, ": ", 2);
}

static atomic_llong st_n_allocs;

int64_t st_alloc_count(void) { return (int64_t)atomic_load(&st_n_allocs); }

void *st_malloc(size_t size) {
    atomic_fetch_add(&st_n_allocs, 1);
    return malloc(size ? size : 1);
}

void *st_calloc(size_t n, size_t size) {
    atomic_fetch_add(&st_n_allocs, 1);
    if (n == 0 || size == 0)
        return calloc(1, 1);
    return calloc(n, size);
}

void *st_realloc(void *p, size_t size) {
    atomic_fetch_add(&st_n_allocs, 1);
    return realloc(p, size ? size : 1);
}

void st_free(void *p) { free(p); }

char *st_strndup(const char *s, size_t n) {
    char *d = st_malloc(n + 1);
    if (!d)
        return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

char *st_strdup(const char *s) { return st_strndup(s, strlen(s)); }

void *st_malloc_aligned(size_t size, size_t align) {
    atomic_fetch_add(&st_n_allocs, 1);
    void *p = NULL;
    if (posix_memalign(&p, align, size ? size : 1) != 0)
        return NULL;
    return p;
}

void st_free_aligned(void *p) { free(p); }

enum { ST_PLAN_ALIGN = 64 };

void *st_lazy_alloc(size_t size, bool populate) {
    /* populated: a small region's page faults would otherwise land in the first tokens' time
     * (1.6% of stories260K's generation) */
    const int flags = populate ? MAP_POPULATE : 0;
    void *p = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | flags, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    atomic_fetch_add(&st_n_allocs, 1);
    return p;
}

void st_lazy_free(void *p, size_t size) {
    if (p)
        munmap(p, size ? size : 1);
}

int64_t st_first_non_finite(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return i;
    return -1;
}

size_t st_phys_mem(void) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}

size_t st_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (size_t)kb * 1024;
}

void *st_huge_alloc(size_t size) {
    const size_t huge = ST_HUGE_PAGE;
    size_t len, total;
    if (!st_add_size(size ? size : 1, huge - 1, &len))
        return NULL;
    len &= ~(huge - 1);
    if (!st_add_size(len, huge, &total))
        return NULL;
    char *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    /* keep the 2 MB-aligned len bytes inside, give back the rest */
    char *a = (char *)(((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1));
    if (a > p)
        munmap(p, (size_t)(a - p));
    if (p + total > a + len)
        munmap(a + len, (size_t)(p + total - (a + len)));
    madvise(a, len, MADV_HUGEPAGE); /* a kernel without THP keeps 4 KB pages: still anonymous */
    atomic_fetch_add(&st_n_allocs, 1);
    return a;
}

void st_huge_free(void *p, size_t size) {
    if (!p)
        return;
    const size_t len = ((size ? size : 1) + ST_HUGE_PAGE - 1) & ~(ST_HUGE_PAGE - 1);
    munmap(p, len);
}

size_t st_huge_bytes(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return 0;
    char line[512];
    int in = 0;
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long lo, hi;
        if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2) {
            if (in)
                break;
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        } else if (in && sscanf(line, "AnonHugePages: %llu kB", &kb) == 1) {
            break;
        }
    }
    fclose(f);
    return (size_t)kb * 1024;
}

void *st_plan_take(st_plan *p, size_t n, size_t elem) {
    size_t bytes, start = (p->off + ST_PLAN_ALIGN - 1) & ~(size_t)(ST_PLAN_ALIGN - 1);
    if (start < p->off || !st_mul_size(n, elem, &bytes) || !st_add_size(start, bytes, &p->off)) {
        p->overflow = true;
        p->off = SIZE_MAX;
        return NULL;
    }
    return p->base ? p->base + start : NULL;
}

void *st_plan_alloc(st_plan *p) {
    if (p->overflow)
        return NULL;
    p->base = st_malloc_aligned(p->off ? p->off : ST_PLAN_ALIGN, ST_PLAN_ALIGN);
    if (!p->base)
        return NULL; /* p->off still holds the size, for the message */
    memset(p->base, 0, p->off);
    p->off = 0;
    return p->base;
}

static const char *file_kind(mode_t m) {
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "not a plain file";
}

st_status st_outfile_open(const char *path, st_outfile *out) {
    memset(out, 0, sizeof *out);
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return st_fail(ST_ERR_INVALID, "%s: exists and is not a regular file", path);
    size_t n = strlen(path) + 48;
    out->tmp = st_malloc(n);
    out->path = st_strdup(path);
    if (!out->tmp || !out->path) {
        st_outfile_close(out, 0);
        return st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
    }
    static atomic_uint serial;
    for (int tries = 0; tries < 100; tries++) {
        snprintf(out->tmp, n, "%s.tmp-%ld-%u", path, (long)getpid(), atomic_fetch_add(&serial, 1));
        int fd = open(out->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno == EEXIST)
            continue;
        if (fd < 0 || !(out->f = fdopen(fd, "wb"))) {
            st_status s = st_fail(ST_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
            if (fd >= 0) {
                close(fd);
                unlink(out->tmp);
            }
            st_free(out->tmp);
            out->tmp = NULL;
            st_outfile_close(out, 0);
            return s;
        }
        return ST_OK;
    }
    st_outfile_close(out, 0);
    return st_fail(ST_ERR_IO, "%s: cannot create a temporary file beside it", path);
}

st_status st_outfile_close(st_outfile *o, int ok) {
    st_status s = ST_OK;
    if (o->f) {
        /* every byte on the disk before the rename: the old file, or the whole new one */
        int bad = fflush(o->f) != 0 || ferror(o->f) || fsync(fileno(o->f)) != 0;
        int e = errno;
        if (fclose(o->f) != 0 && !bad) {
            bad = 1;
            e = errno;
        }
        o->f = NULL;
        if (ok && bad)
            s = st_fail(ST_ERR_IO, "%s: write failed: %s", o->path, strerror(e));
        else if (ok && rename(o->tmp, o->path) != 0)
            s = st_fail(ST_ERR_IO, "%s: cannot replace: %s", o->path, strerror(errno));
        if (!ok || s)
            unlink(o->tmp);
    }
    st_free(o->tmp);
    st_free(o->path);
    o->tmp = o->path = NULL;
    return s;
}

st_status st_mmap_open(const char *path, st_mmap *out) {
    out->data = NULL;
    out->size = 0;
    /* Refuse what is not a regular file before opening it: opening a FIFO for reading blocks
     * until a writer comes. O_NONBLOCK covers a path swapped for a FIFO in between. */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return st_fail(ST_ERR_IO, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return st_fail(ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return st_fail(ST_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return st_fail(ST_ERR_IO, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
    }
    if (st.st_size == 0) {
        close(fd);
        return st_fail(ST_ERR_FORMAT, "%s: empty file", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return st_fail(ST_ERR_IO, "%s: cannot map: %s", path, strerror(e));
    out->data = p;
    out->size = (size_t)st.st_size;
    return ST_OK;
}

void st_mmap_drop(const void *p, size_t n) {
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || !p)
        return;
    const uintptr_t a = ((uintptr_t)p + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
    const uintptr_t e = ((uintptr_t)p + n) & ~(uintptr_t)(page - 1);
    if (e > a)
        madvise((void *)a, e - a, MADV_DONTNEED);
}

void st_mmap_close(st_mmap *m) {
    if (m && m->data)
        munmap((void *)m->data, m->size);
    if (m) {
        m->data = NULL;
        m->size = 0;
    }
}

double st_time_now(void) {
    /* ST_CLOCK=cpu: the process's CPU time (-1: not read yet; a benign race sets the same value) */
    static _Atomic int cpu = -1;
    int c = atomic_load_explicit(&cpu, memory_order_relaxed);
    if (c < 0) {
        c = st_env_get().cpu_clock;
        atomic_store_explicit(&cpu, c, memory_order_relaxed);
    }
    struct timespec ts;
    clock_gettime(c ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double st_time_seconds(void) { return st_time_now(); }

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t st_rng_u64(uint64_t seed, uint64_t counter) {
    return mix64(mix64(seed + 0x9e3779b97f4a7c15ULL) ^ (counter * 0xd1b54a32d192ed03ULL + 1));
}

float st_rng_uniform(uint64_t seed, uint64_t counter) {
    return (float)(st_rng_u64(seed, counter) >> 40) * (1.0f / 16777216.0f);
}
