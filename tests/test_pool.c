/*
 * test_pool.c: the thread pool. Every part of every job runs exactly once, whichever thread
 * claims it: back-to-back jobs (workers spinning), jobs after a pause (workers asleep), parts
 * that take long (the caller sleeps waiting for them), and with more busy threads than cores
 * (competing threads started here, so workers are often descheduled).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

enum { MAX_PARTS = 64 };

typedef struct job {
    atomic_int runs[MAX_PARTS]; /* times part ith ran */
    atomic_int bad_nth;
    int nth_want;
    long sleep_ns; /* per part */
} job;

static void task(void *ctx, int ith, int nth) {
    job *j = ctx;
    if (nth != j->nth_want || ith < 0 || ith >= nth)
        atomic_fetch_add(&j->bad_nth, 1);
    else
        atomic_fetch_add(&j->runs[ith], 1);
    if (j->sleep_ns) {
        struct timespec ts = {0, j->sleep_ns};
        nanosleep(&ts, NULL);
    }
}

/* Runs n jobs, pausing pause_ns between them; each part must run exactly once per job. */
static void run_jobs(st_pool *p, int n, long pause_ns, long sleep_ns) {
    for (int k = 0; k < n; k++) {
        job j;
        memset(&j, 0, sizeof j);
        j.nth_want = st_pool_size(p);
        j.sleep_ns = sleep_ns;
        st_pool_run(p, task, &j);
        assert_int_equal(atomic_load(&j.bad_nth), 0);
        for (int i = 0; i < j.nth_want; i++)
            if (atomic_load(&j.runs[i]) != 1)
                fail_msg("job %d: part %d of %d ran %d times", k, i, j.nth_want,
                         atomic_load(&j.runs[i]));
        if (pause_ns) {
            struct timespec ts = {0, pause_ns};
            nanosleep(&ts, NULL);
        }
    }
}

static void test_every_part_once(void **state) {
    (void)state;
    const int cores = st_n_cores();
    for (int t = 1; t <= cores && t <= 8; t++) {
        st_pool *p = NULL;
        assert_int_equal(st_pool_create(t, &p), ST_OK);
        assert_int_equal(st_pool_size(p), t);
        run_jobs(p, 20000, 0, 0);        /* back to back */
        run_jobs(p, 20, 2000000, 0);     /* workers park between jobs */
        run_jobs(p, 20, 0, 300000);      /* the caller waits for slow parts */
        run_jobs(p, 5, 1000000, 200000); /* both */
        st_pool_free(p);
    }
    st_pool *p = NULL;
    assert_int_equal(st_pool_create(100000, &p), ST_OK); /* clamped to the cores */
    assert_int_equal(st_pool_size(p), cores > 256 ? 256 : cores);
    st_pool_free(p);
    assert_int_equal(st_pool_create(0, &p), ST_OK);
    assert_int_equal(st_pool_size(p), 1);
    st_pool_free(p);
    st_pool_free(NULL);
    assert_int_equal(st_pool_size(NULL), 1);
}

static atomic_bool hog_stop;

static void *hog(void *arg) {
    (void)arg;
    volatile uint64_t x = 0;
    while (!atomic_load_explicit(&hog_stop, memory_order_relaxed))
        x++;
    return NULL;
}

static void test_busy_machine(void **state) {
    (void)state;
    const int cores = st_n_cores();
    int n_hogs = cores < 8 ? cores : 8;
    pthread_t hogs[8];
    atomic_store(&hog_stop, false);
    for (int i = 0; i < n_hogs; i++)
        assert_int_equal(pthread_create(&hogs[i], NULL, hog, NULL), 0);
    st_pool *p = NULL;
    assert_int_equal(st_pool_create(cores < 4 ? cores : 4, &p), ST_OK);
    run_jobs(p, 20000, 0, 0);
    run_jobs(p, 10, 0, 100000);
    st_pool_free(p);
    atomic_store(&hog_stop, true);
    for (int i = 0; i < n_hogs; i++)
        pthread_join(hogs[i], NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_part_once),
        cmocka_unit_test(test_busy_machine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
