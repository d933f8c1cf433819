/*
 * pool.c: the thread pool. A job is published by bumping a generation counter; workers spin on
 * it for a short while (a decode step issues hundreds of jobs back to back), then sleep on a
 * condition variable. Completion is a countdown the caller spins on.
 */
#define _GNU_SOURCE
#include "core.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ST_PAUSE() _mm_pause()
#else
#define ST_PAUSE() ((void)0)
#endif

/* Spins before a worker parks (~50 us); the caller yields its core after as many spins when a
 * worker is late (an oversubscribed machine), instead of burning its time slice. */
enum { ST_SPIN_ITERS = 1 << 13 };

typedef struct worker_arg {
    struct st_pool *p;
    int ith;
} worker_arg;

/* The job (written by the caller, read by every worker) and the countdown (written by every
 * worker, read by the caller) sit on separate cache lines, so a worker's decrement does not
 * take the job's line away from the other workers. */
struct st_pool {
    _Alignas(64) atomic_uint gen; /* bumped per job */
    st_task_fn fn;
    void *ctx;
    atomic_int sleepers;
    atomic_bool stop;
    _Alignas(64) atomic_int remaining; /* workers still running the current job */
    _Alignas(64) int n;
    worker_arg *args;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

int st_n_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    st_pool *p = wa->p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < ST_SPIN_ITERS) {
                ST_PAUSE();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        p->fn(p->ctx, wa->ith, p->n);
        atomic_fetch_sub_explicit(&p->remaining, 1, memory_order_release);
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
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
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
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->remaining, p->n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: pairs with the sleepers check */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n);
    for (int spins = 0; atomic_load_explicit(&p->remaining, memory_order_acquire) > 0;) {
        ST_PAUSE();
        if (++spins == ST_SPIN_ITERS) {
            sched_yield();
            spins = 0;
        }
    }
}

void st_pool_free(st_pool *p) {
    if (!p)
        return;
    if (p->threads) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, true);
        atomic_fetch_add(&p->gen, 1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i < p->n; i++)
            pthread_join(p->threads[i], NULL);
    }
    st_free(p->args);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    st_free(p->threads);
    st_free_aligned(p);
}
