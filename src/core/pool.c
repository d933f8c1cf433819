/*
 * pool.c: the thread pool. A job is split into nth parts (fn(ctx, ith, nth) for each ith) that
 * any thread may claim, the caller included: when a worker is late (its core taken by another
 * process) the caller runs the worker's part itself instead of waiting for it to be scheduled,
 * so a busy machine costs -t 2 about what it costs -t 1. Which thread runs a part changes
 * nothing in the results. Idle workers spin briefly on the next job (a decode step issues
 * hundreds back to back), then sleep on a futex; the caller, waiting for a part a worker is
 * still running, also spins briefly, then sleeps.
 */
#define _GNU_SOURCE
#include "core.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ST_PAUSE() _mm_pause()
#else
#define ST_PAUSE() ((void)0)
#endif

/* How long an idle worker spins on the next job before sleeping, and how long the caller spins
 * on a worker's unfinished part; the clock is read every ST_SPIN_CHECK pauses. */
#define ST_WORKER_SPIN_S 100e-6
#define ST_CALLER_SPIN_S 30e-6
enum { ST_SPIN_CHECK = 64 };

typedef struct worker_arg {
    struct st_pool *p;
    int ith;
} worker_arg;

/* The job (written by the caller, read by every worker) and the completion count (written by
 * every thread) sit on separate cache lines. claim packs the job's generation (high 32 bits)
 * with the next unclaimed part (low 32 bits), so a worker that wakes up late cannot claim a
 * part of a newer job while it thinks it is in an older one. */
struct st_pool {
    _Alignas(64) atomic_uint gen; /* bumped per job; workers wait (futex) on it */
    _Atomic uint64_t claim;       /* gen << 32 | next part */
    st_task_fn fn;                /* valid while gen's parts are unfinished */
    void *ctx;
    atomic_uint parked; /* a worker is (about to be) asleep on gen */
    atomic_bool stop;
    _Alignas(64) atomic_uint done; /* parts finished; the caller waits (futex) on it */
    atomic_uint caller_asleep;
    _Alignas(64) int n;
    worker_arg *args;
    pthread_t *threads;
};

int st_n_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

static void futex_wait(atomic_uint *word, unsigned expected) {
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(atomic_uint *word) {
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

/* Claims and runs parts of job g until none is left. */
static void run_parts(st_pool *p, unsigned g) {
    const uint64_t tag = (uint64_t)g << 32;
    uint64_t v = atomic_load_explicit(&p->claim, memory_order_acquire);
    while ((v & ~(uint64_t)0xffffffffu) == tag && (uint32_t)v < (uint32_t)p->n) {
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &v, v + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        p->fn(p->ctx, (int)(uint32_t)v, p->n);
        unsigned d = atomic_fetch_add(&p->done, 1) + 1; /* seq_cst: pairs with caller_asleep */
        if (d == (unsigned)p->n && atomic_load(&p->caller_asleep))
            futex_wake_all(&p->done);
        v = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

/* One turn of a wait loop: a pause, and every ST_SPIN_CHECK turns a look at the clock. True
 * once the wait (which started at *t0, set on the first look) has spun longer than limit
 * seconds: the caller then sleeps on a futex. */
static bool spun_out(int *spins, double *t0, double limit) {
    ST_PAUSE();
    if (++*spins % ST_SPIN_CHECK)
        return false;
    const double t = st_time_now();
    if (*t0 == 0.0) {
        *t0 = t;
        return false;
    }
    return t - *t0 > limit;
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    st_pool *p = wa->p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        double t0 = 0.0;
        for (int spins = 0; (g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen;) {
            if (!spun_out(&spins, &t0, ST_WORKER_SPIN_S))
                continue;
            /* seq_cst store then the futex's own check of gen: either the caller sees parked
             * and wakes us, or the kernel sees the new gen and returns at once. */
            atomic_store(&p->parked, 1);
            if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                futex_wait(&p->gen, seen);
            t0 = 0.0;
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        run_parts(p, g);
    }
}

st_status st_pool_create(int n_threads, st_pool **out) {
    *out = NULL;
    int cores = st_n_cores();
    if (n_threads < 1)
        n_threads = 1;
    if (n_threads > cores)
        n_threads = cores;
    if (n_threads > 256)
        n_threads = 256;
    st_pool *p = st_malloc_aligned(sizeof *p, 64);
    if (!p)
        return st_fail(ST_ERR_NOMEM, "thread pool: out of memory");
    memset(p, 0, sizeof *p);
    p->n = n_threads;
    if (n_threads > 1) {
        p->threads = st_calloc((size_t)n_threads, sizeof *p->threads);
        p->args = st_calloc((size_t)n_threads, sizeof *p->args);
        if (!p->threads || !p->args) {
            p->n = 1;
            st_pool_free(p);
            return st_fail(ST_ERR_NOMEM, "thread pool: out of memory");
        }
        for (int i = 1; i < n_threads; i++) {
            p->args[i].p = p;
            p->args[i].ith = i;
            if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
                p->n = i;
                st_pool_free(p);
                return st_fail(ST_ERR_NOMEM, "thread pool: cannot start thread %d", i);
            }
        }
    }
    *out = p;
    return ST_OK;
}

int st_pool_size(const st_pool *p) { return p ? p->n : 1; }

void st_pool_run(st_pool *p, st_task_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    /* Every part of the previous job is finished (we waited for it), so no thread reads fn. */
    const unsigned g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (uint64_t)g << 32, memory_order_release);
    atomic_store(&p->gen, g); /* seq_cst: pairs with parked */
    if (atomic_load_explicit(&p->parked, memory_order_relaxed) && atomic_exchange(&p->parked, 0))
        futex_wake_all(&p->gen);
    run_parts(p, g);
    /* Parts claimed by workers may still be running. */
    double t0 = 0.0;
    for (int spins = 0;;) {
        unsigned d = atomic_load_explicit(&p->done, memory_order_acquire);
        if (d == (unsigned)p->n)
            break;
        if (!spun_out(&spins, &t0, ST_CALLER_SPIN_S))
            continue;
        atomic_store(&p->caller_asleep, 1);
        if (atomic_load(&p->done) == d)
            futex_wait(&p->done, d);
        atomic_store(&p->caller_asleep, 0);
    }
}

void st_pool_free(st_pool *p) {
    if (!p)
        return;
    if (p->threads) {
        atomic_store(&p->stop, true);
        atomic_fetch_add(&p->gen, 1);
        futex_wake_all(&p->gen);
        for (int i = 1; i < p->n; i++)
            pthread_join(p->threads[i], NULL);
    }
    st_free(p->args);
    st_free(p->threads);
    st_free_aligned(p);
}
