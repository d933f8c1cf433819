/*
 * metrics.c: the server's counters and histograms, updated as requests finish, and /metrics in
 * the Prometheus text exposition format.
 */
#define _GNU_SOURCE
#include "serve.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hist_init(srv_hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->n = n;
    memcpy(h->le, le, (size_t)n * sizeof *le);
}

static void hist_add(srv_hist *h, double x, int64_t times) {
    int b = 0;
    while (b < h->n && x > h->le[b])
        b++;
    h->count[b] += times;
    h->sum += x * (double)times;
    h->total += times;
}

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    static const double ttft[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    static const double tpot[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};
    static const double e2e[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
    static const double acc[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    hist_init(&m->ttft, ttft, sizeof ttft / sizeof ttft[0]);
    hist_init(&m->tpot, tpot, sizeof tpot / sizeof tpot[0]);
    hist_init(&m->e2e, e2e, sizeof e2e / sizeof e2e[0]);
    hist_init(&m->accept_len, acc, sizeof acc / sizeof acc[0]);
}

/* With s->mu held, when a job the engine accepted finishes. */
void srv_metrics_finish(srv *s, const srv_job *j) {
    srv_metrics *m = &s->metrics;
    const st_request_stats *st = &j->stats;
    if (j->index == 0) /* a request's prompt counts once, whatever its choices */
        m->prompt_tokens += st->prompt_tokens;
    m->gen_tokens += st->gen_tokens;
    int k = st->status != ST_OK                  ? 3
            : st->stop_reason == ST_STOP_CANCEL  ? 2
            : j->cancelled                       ? 2
            : st->stop_reason == ST_STOP_LENGTH  ? 1
            : st->stop_reason == ST_STOP_CONTEXT ? 1
                                                 : 0;
    m->finished[k]++;
    m->spec_verify_steps += st->verify_ct;
    if (j->n_gen > 0) {
        hist_add(&m->ttft, j->t_first - j->t_submit, 1);
        if (j->n_gen > 1)
            hist_add(&m->tpot, (j->t_done - j->t_first) / (double)(j->n_gen - 1), 1);
    }
    hist_add(&m->e2e, j->t_done - j->t_submit, 1);
    for (int a = 0; a <= ST_SPEC_MAX_S; a++) /* tokens per speculative step: a drafts + bonus */
        if (st->accept_hist[a])
            hist_add(&m->accept_len, a + 1, st->accept_hist[a]);
}

static void put_hist(FILE *f, const char *name, const char *help, const srv_hist *h) {
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    int64_t cum = 0;
    for (int b = 0; b < h->n; b++) {
        cum += h->count[b];
        fprintf(f, "%s_bucket{le=\"%g\"} %" PRId64 "\n", name, h->le[b], cum);
    }
    cum += h->count[h->n];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRId64 "\n%s_sum %.6f\n%s_count %" PRId64 "\n", name, cum,
            name, h->sum, name, h->total);
}

static void put_metric(FILE *f, const char *name, const char *type, const char *help, double v) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* The Prometheus text exposition (version 0.0.4); malloc'd. */
char *srv_metrics_text(srv *s, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        return NULL;
    pthread_mutex_lock(&s->mu);
    const srv_metrics *m = &s->metrics;
    const st_engine_stats *es = &s->engine_stats;
    fprintf(f, "# HELP spectree_http_requests_total HTTP requests answered, by status class\n"
               "# TYPE spectree_http_requests_total counter\n");
    static const char *codes[] = {"200", "400", "4xx", "500", "503", "other"};
    for (int i = 0; i < 6; i++)
        fprintf(f, "spectree_http_requests_total{code=\"%s\"} %" PRId64 "\n", codes[i],
                m->by_code[i]);
    fprintf(f,
            "# HELP spectree_requests_total generation requests accepted, by endpoint\n"
            "# TYPE spectree_requests_total counter\n"
            "spectree_requests_total{endpoint=\"completions\"} %" PRId64 "\n"
            "spectree_requests_total{endpoint=\"chat\"} %" PRId64 "\n",
            m->completions, m->chats);
    fprintf(f, "# HELP spectree_requests_finished_total generation requests finished, by reason\n"
               "# TYPE spectree_requests_finished_total counter\n");
    static const char *why[] = {"stop", "length", "cancelled", "error"};
    for (int i = 0; i < 4; i++)
        fprintf(f, "spectree_requests_finished_total{reason=\"%s\"} %" PRId64 "\n", why[i],
                m->finished[i]);
    put_metric(f, "spectree_requests_cut_total", "counter",
               "requests cut at the drain timeout (answered 503 or with an SSE error event)",
               (double)m->cut);
    put_metric(f, "spectree_prompt_tokens_total", "counter", "prompt tokens of finished requests",
               (double)m->prompt_tokens);
    put_metric(f, "spectree_generation_tokens_total", "counter",
               "tokens generated by finished requests", (double)m->gen_tokens);
    put_metric(f, "spectree_queue_depth", "gauge", "requests waiting for a slot",
               (double)(s->gauge_queued + s->n_pending));
    put_metric(f, "spectree_running_sequences", "gauge", "requests holding a slot",
               (double)s->gauge_running);
    put_metric(f, "spectree_engine_steps_total", "counter", "engine forward passes",
               (double)es->steps);
    put_metric(f, "spectree_spec_steps_total", "counter", "speculative (verify) steps",
               (double)es->spec_steps);
    put_metric(f, "spectree_plain_steps_total", "counter", "plain decoding steps",
               (double)es->plain_steps);
    put_metric(f, "spectree_draft_seconds_total", "counter", "time spent drafting",
               es->draft_ms / 1e3);
    put_metric(f, "spectree_verify_seconds_total", "counter",
               "time spent in target forward passes of decoding steps", es->verify_ms / 1e3);
    put_metric(f, "spectree_prefill_seconds_total", "counter", "time spent prefilling prompts",
               es->prefill_ms / 1e3);
    put_metric(f, "spectree_kv_positions_used", "gauge", "KV positions committed",
               (double)s->gauge_kv_used);
    put_metric(f, "spectree_prefix_cache_hits_total", "counter",
               "admissions that copied a cached prompt prefix", (double)es->prefix_hits);
    put_metric(f, "spectree_prefix_cache_misses_total", "counter",
               "admissions that found no cached prefix", (double)es->prefix_misses);
    const int64_t admissions = es->prefix_hits + es->prefix_misses;
    put_metric(f, "spectree_prefix_cache_hit_ratio", "gauge",
               "hits / (hits + misses) since the start (0 before any admission)",
               admissions ? (double)es->prefix_hits / (double)admissions : 0.0);
    put_metric(f, "spectree_prefix_cache_hit_tokens_total", "counter",
               "prompt tokens served from the prefix cache", (double)es->prefix_hit_tokens);
    put_metric(f, "spectree_prefix_cache_bytes", "gauge", "bytes the prefix cache holds",
               (double)es->prefix_bytes);
    put_metric(f, "spectree_prefix_cache_budget_bytes", "gauge", "the prefix cache's budget",
               (double)es->prefix_budget);
    put_metric(f, "spectree_prefix_cache_entries", "gauge", "blocks the prefix cache holds",
               (double)es->prefix_blocks);
    put_metric(f, "spectree_prefix_cache_evictions_total", "counter",
               "blocks evicted from the prefix cache", (double)es->prefix_evictions);
    if (es->outlook.known) { /* auto's view of drafting, once it has one */
        const char *algo = st_spec_algo_name(s->o.ep.gen.spec.algo);
        fprintf(f,
                "# HELP spectree_spec_drafting 1 while auto drafts, 0 where it backed off "
                "(drafting does not pay)\n# TYPE spectree_spec_drafting gauge\n"
                "spectree_spec_drafting{algorithm=\"%s\"} %d\n"
                "# HELP spectree_spec_speedup_estimate auto's expected speed-up of its best "
                "shape over plain decoding (0: none, a draft model too dear to draft)\n"
                "# TYPE spectree_spec_speedup_estimate gauge\n"
                "spectree_spec_speedup_estimate{algorithm=\"%s\"} %.6g\n",
                algo, es->outlook.drafting, algo, es->outlook.speedup);
    }
    put_hist(f, "spectree_time_to_first_token_seconds", "from arrival to the first token",
             &m->ttft);
    put_hist(f, "spectree_time_per_output_token_seconds",
             "mean time per generated token after the first, per request", &m->tpot);
    put_hist(f, "spectree_e2e_request_latency_seconds", "from arrival to the last token", &m->e2e);
    put_hist(f, "spectree_spec_accept_length", "tokens per speculative step (accepted drafts + 1)",
             &m->accept_len);
    put_metric(f, "spectree_uptime_seconds", "gauge", "since the server started",
               st_time_seconds() - s->t_start);
    pthread_mutex_unlock(&s->mu);
    fclose(f);
    return buf;
}
