/*
 * load.c: st_model_load and st_model_load_ex: where a model's weights live. MMAP leaves them in
 * the read-only file mapping; COPY reads the file into 2 MB-aligned anonymous memory advised
 * MADV_HUGEPAGE (st_huge_alloc) and releases the page cache's copy: a multi-GB file mapped in
 * 4 KB pages streamed at a fraction of the copy bandwidth (docs/BENCHMARKS.md, "Big models"). The
 * bytes are the same either way, so is every result. The checks of the model itself are in llama.c.
 */
#define _GNU_SOURCE
#include "model/model.h"

#include "io/gguf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { ST_LOAD_CHUNK = 64 << 20 };

/* Defined in llama.c (takes ownership of g). */
st_status st_model_from_gguf(st_gguf *g, st_model **out);
/* Defined in llama.c: a Hugging Face checkpoint directory. */
st_status st_model_load_hf(const char *dir, st_model **out);

st_load_params st_load_default_params(void) {
    st_load_params p = {.mode = ST_LOAD_AUTO};
    return p;
}

const char *st_load_mode_name(st_load_mode mode) {
    switch (mode) {
    case ST_LOAD_AUTO:
        return "auto";
    case ST_LOAD_MMAP:
        return "mmap";
    case ST_LOAD_COPY:
        return "copy";
    case ST_LOAD_BUFFER:
        return "buffer";
    }
    return "unknown";
}

st_load_mode st_load_choose(st_load_mode requested, st_load_mode env, size_t file_bytes,
                            size_t avail, const char **reason) {
    if (requested == ST_LOAD_MMAP || requested == ST_LOAD_COPY) {
        *reason = "requested";
        return requested;
    }
    if (env == ST_LOAD_MMAP || env == ST_LOAD_COPY) {
        *reason = "ST_LOAD";
        return env;
    }
    if (file_bytes < ST_LOAD_COPY_MIN_BYTES) {
        *reason = "file under 256 MB";
        return ST_LOAD_MMAP;
    }
    /* room for the copy and then some: the KV cache, scratch, the rest of the machine */
    const size_t reserve =
        file_bytes / 4 > ((size_t)512 << 20) ? file_bytes / 4 : (size_t)512 << 20;
    if (avail < reserve || avail - reserve < file_bytes) {
        *reason = "not enough available memory";
        return ST_LOAD_MMAP;
    }
    *reason = "big file";
    return ST_LOAD_COPY;
}

/* One reader's part of the file: [off, end) of the copy, read in chunks. */
typedef struct {
    int fd;
    uint8_t *dst;
    size_t off, end;
    _Atomic size_t done; /* bytes read so far, for the progress line */
    int err;             /* errno of a failed read; -1: the file ended early */
} st_load_part;

static void read_part(st_load_part *r) {
    size_t at = r->off;
    while (at < r->end) {
        const size_t want = r->end - at < ST_LOAD_CHUNK ? r->end - at : ST_LOAD_CHUNK;
        const ssize_t n = pread(r->fd, r->dst + at, want, (off_t)at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            r->err = n == 0 ? -1 : errno;
            return;
        }
        at += (size_t)n;
        atomic_store(&r->done, at - r->off);
    }
}

static void *read_part_thread(void *arg) {
    read_part(arg);
    return NULL;
}

/* Reads the file g was opened from into a huge-page region and moves g onto it. Two threads
 * read the two halves: most of the time is the kernel committing and zeroing the pages and
 * copying from the page cache, work one core does at a fraction of the memory bandwidth. */
static st_status load_copy(st_gguf *g, const char *path, const st_load_params *p, double t0) {
    size_t size;
    const uint8_t *mapped = st_gguf_bytes(g, &size);
    uint8_t *copy = st_huge_alloc(size); /* committed page by page as the read fills it */
    if (!copy)
        return st_fail(ST_ERR_NOMEM,
                       "%s: cannot allocate %.1f MB to copy the weights into (load "
                       "with --mmap to use the file mapping)",
                       path, (double)size / 1e6);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        st_huge_free(copy, size);
        return st_fail(ST_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    /* files of 8 MB and more: the halves split at a huge page (no page faulted by both) */
    const size_t half = size >= 4 * ST_HUGE_PAGE ? (size / 2) & ~(ST_HUGE_PAGE - 1) : size;
    st_load_part part[2] = {{.fd = fd, .dst = copy, .off = 0, .end = half},
                            {.fd = fd, .dst = copy, .off = half, .end = size}};
    pthread_t th;
    const int two = half < size && pthread_create(&th, NULL, read_part_thread, &part[1]) == 0;
    size_t reported = 0;
    for (size_t at = 0; at < half && !part[0].err;) { /* the first half here, with progress */
        st_load_part r = {.fd = fd,
                          .dst = copy,
                          .off = at,
                          .end = half - at < ST_LOAD_CHUNK ? half : at + ST_LOAD_CHUNK};
        read_part(&r);
        part[0].err = r.err;
        at = r.off + atomic_load(&r.done);
        const size_t done = at + atomic_load(&part[1].done);
        if (p->progress && done - reported >= ST_LOAD_CHUNK) {
            p->progress(p->progress_user, done, size, st_time_now() - t0);
            reported = done;
        }
    }
    if (two)
        pthread_join(th, NULL);
    else if (half < size) /* no thread: read the second half here */
        read_part(&part[1]);
    for (int i = 0; i < 2; i++)
        if (part[i].err) {
            const int e = part[i].err;
            close(fd);
            st_huge_free(copy, size);
            return e < 0 ? st_fail(ST_ERR_IO, "%s: the file shrank while it was read", path)
                         : st_fail(ST_ERR_IO, "%s: cannot read: %s", path, strerror(e));
        }
    if (p->progress)
        p->progress(p->progress_user, size, size, st_time_now() - t0);
    /* the reader validated the mapping's header; the copy must hold that header */
    if (memcmp(copy, mapped, st_gguf_data_offset(g)) != 0) {
        close(fd);
        st_huge_free(copy, size);
        return st_fail(ST_ERR_IO, "%s: the file changed while it was read", path);
    }
    st_gguf_adopt_copy(g, copy); /* closes the mapping */
    /* the weights are held once: the page cache's pages of the file go (pages that another
     * process maps stay; this is advice, a failure changes nothing) */
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return ST_OK;
}

/* CPU seconds of the calling thread. */
static double thread_cpu(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0.0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

st_status st_model_load_ex(const char *path, const st_load_params *params, st_model **out) {
    if (!out || !path)
        return st_fail(ST_ERR_INVALID, "st_model_load_ex: NULL argument");
    *out = NULL;
    const st_load_params p = params ? *params : st_load_default_params();
    if (p.mode != ST_LOAD_AUTO && p.mode != ST_LOAD_MMAP && p.mode != ST_LOAD_COPY)
        return st_fail(ST_ERR_INVALID, "%s: load mode %d is not auto, mmap or copy", path,
                       (int)p.mode);
    const double t0 = st_time_now(), c0 = thread_cpu();
    struct stat sb;
    st_status s;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) { /* a Hugging Face checkpoint */
        if ((s = st_model_load_hf(path, out)))
            return s;
        (*out)->load.mode = ST_LOAD_BUFFER; /* converted into a buffer of the model's */
        (*out)->load.reason = "Hugging Face checkpoint converted in memory";
        st_gguf_bytes((*out)->gguf, &(*out)->load.file_bytes);
        (*out)->load.seconds = st_time_now() - t0;
        (*out)->load.cpu_seconds = thread_cpu() - c0;
        return ST_OK;
    }
    st_gguf *g;
    if ((s = st_gguf_open(path, &g)))
        return s;
    st_load_info info = {0};
    const void *bytes = st_gguf_bytes(g, &info.file_bytes);
    const size_t avail = p.mode == ST_LOAD_AUTO ? st_mem_available() : 0;
    info.mode = st_load_choose(p.mode, st_env_get().load, info.file_bytes, avail, &info.reason);
    if (info.mode == ST_LOAD_COPY) {
        if ((s = load_copy(g, path, &p, t0))) {
            st_gguf_free(g);
            return s;
        }
        bytes = st_gguf_bytes(g, &info.file_bytes);
    }
    if (p.mlock) {
        if (mlock(bytes, info.file_bytes) != 0) {
            int e = errno;
            st_gguf_free(g);
            return st_fail(ST_ERR_NOMEM,
                           "%s: cannot lock %.1f MB of weights in memory: %s (see ulimit -l)", path,
                           (double)info.file_bytes / 1e6, strerror(e));
        }
        info.locked = 1;
    }
    st_model *m;
    if ((s = st_model_from_gguf(g, &m)))
        return s;
    if (info.mode == ST_LOAD_COPY)
        info.huge_bytes = st_huge_bytes(bytes);
    info.seconds = st_time_now() - t0;
    info.cpu_seconds = thread_cpu() - c0;
    m->load = info;
    if (info.mode == ST_LOAD_MMAP && p.progress)
        p.progress(p.progress_user, info.file_bytes, info.file_bytes, info.seconds);
    *out = m;
    return ST_OK;
}

st_status st_model_load(const char *path, st_model **out) {
    if (!out || !path)
        return st_fail(ST_ERR_INVALID, "st_model_load: NULL argument");
    return st_model_load_ex(path, NULL, out);
}

const st_load_info *st_model_get_load_info(const st_model *m) { return &m->load; }
