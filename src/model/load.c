/*
 * load.c: st_model_load and st_model_load_ex: where a model's weights live. MMAP leaves them in
 * the read-only file mapping; COPY reads the file into 2 MB-aligned anonymous memory advised
 * MADV_HUGEPAGE (st_huge_alloc) and releases the page cache's copy: a multi-GB file mapped in
 * 4 KB pages streamed at a fraction of the copy bandwidth (README, issue 15). The bytes are the
 * same either way, so is every result. The checks of the model itself are in llama.c.
 */
#define _GNU_SOURCE
#include "model/model.h"

#include "io/gguf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

enum { ST_LOAD_CHUNK = 64 << 20 };

/* Defined in llama.c (takes ownership of g). */
st_status st_model_from_gguf(st_gguf *g, st_model **out);

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

/* Reads the file g was opened from into a huge-page region and moves g onto it. */
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
    size_t done = 0;
    while (done < size) {
        const size_t want = size - done < ST_LOAD_CHUNK ? size - done : ST_LOAD_CHUNK;
        const ssize_t n = pread(fd, copy + done, want, (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = errno;
            close(fd);
            st_huge_free(copy, size);
            return n == 0 ? st_fail(ST_ERR_IO, "%s: the file shrank while it was read", path)
                          : st_fail(ST_ERR_IO, "%s: cannot read: %s", path, strerror(e));
        }
        done += (size_t)n;
        if (p->progress && (done % ST_LOAD_CHUNK == 0 || done == size))
            p->progress(p->progress_user, done, size, st_time_now() - t0);
    }
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
    st_gguf *g;
    st_status s = st_gguf_open(path, &g);
    if (s)
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
