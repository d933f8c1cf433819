#!/usr/bin/env python3
"""bench.py: throughput and latency of `spectree serve` at concurrency 1, 2, 4, ... with
and without speculation, measured in one run: two servers on the same model (plain, and with
the speculative flags given), idle but for the round being measured, the rounds interleaved
(plain, speculative, plain, ...) and each figure the median over --reps rounds; the speed-up
is the median of the ratios of adjacent rounds, so that load from elsewhere on the machine hits
both alike. Each round sends `clients` streamed requests
at a time, --per-client x clients in all (4 by default; at least --min-round, 16 by default),
greedy, max_tokens tokens each. With --pin the servers share the first CPU and the client runs
on the others, so that on a small machine the client's work does not land on the server's core
(on 2 cores, unpinned rounds of stories260K varied by 3-5%).

    python3 tools/serve/bench.py -m models/stories260K.gguf \\
        [--spec "--speculative-algorithm NGRAM"] [--concurrency 1,2,4,8,16,32] [--reps 3] \\
        [--max-tokens 128] [--threads N] [--per-client 4] [--min-round 16] [--pin] [--fresh] \\
        [--trace] [--json] [--extra JSON]

Prints a table: completion tokens/s of all requests together, the median request latency and
time to first token, tau (tokens per speculative step), the share of steps that speculated,
and the speed-up by wall time and by the server's CPU time (user + system; less disturbed by
other jobs on a shared machine), with a 95% confidence interval for the median wall speed-up
from 6 pairs of rounds on (distribution-free: order statistics of the pairs' ratios; with
--fresh each pair is a new pair of processes, so the interval covers their differences too).
Python 3 standard library only."""
import argparse
import http.client
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time

PROMPTS = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside. One day",
    "Tom had a big red ball. He liked to throw the ball to his dog. The dog",
    "The sun was hot and the sky was blue. Sue went to the park with her mom. At the park",
    "There was a little bird who lived in a tree. Every morning the bird",
    "Max and Mia were best friends. They played together every day. One day Max said",
    "In a small house lived an old man and his cat. The cat was very",
    "Lily found a shiny stone in the garden. She showed it to her brother and",
    "The little dog was sad because he lost his bone. He looked everywhere, but",
]


class Srv:
    def __init__(self, build, model, extra, threads, cpus=None):
        cmd = [os.path.join(build, "spectree"), "serve", "-m", model, "--port", "0",
               "--max-running-requests", "32", "--max-queued-requests", "1024"] + extra
        if threads:
            cmd += ["-t", str(threads)]
        self.log = open("/tmp/serve_bench_%d_%d.log" % (os.getpid(), time.time_ns()), "w+b")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=self.log,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        self.port = None
        for _ in range(1200):
            self.log.seek(0)
            m = re.search(rb"on http://127\.0\.0\.1:(\d+) ", self.log.read())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.log.seek(0)
        sys.exit("serve_bench: the server did not start: " + self.log.read().decode())

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()
        if os.environ.get("SERVE_BENCH_KEEP_LOG"):
            print("serve_bench: server log kept: " + self.log.name, file=sys.stderr)
        else:
            os.unlink(self.log.name)


STREAM = [True]
EXTRA = {}


def one(port, i, max_tokens):
    body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 0}
    body.update(EXTRA)
    if STREAM[0]:
        body.update({"stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError("status %d: %s" % (r.status, r.read()[:200]))
    ttft, tokens, meta, buf = None, 0, {}, b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        if ttft is None:
            ttft = time.perf_counter() - t0
        buf += chunk
    conn.close()
    if not STREAM[0]:  # one JSON object: the time to the first token is the whole request's
        d = json.loads(buf)
        return (time.perf_counter() - t0, time.perf_counter() - t0,
                d["usage"]["completion_tokens"], d.get("meta_info", {}))
    for line in buf.decode().split("\n"):
        if line.startswith("data: {"):
            d = json.loads(line[6:])
            if d.get("usage"):
                tokens = d["usage"]["completion_tokens"]
            if d.get("meta_info"):
                meta = d["meta_info"]
    return time.perf_counter() - t0, ttft or 0.0, tokens, meta


def median_ci(xs, conf=0.95):
    """A distribution-free confidence interval for the median of xs: the order statistics
    x_(k) and x_(n+1-k) with the largest k for which P(Binomial(n, 1/2) < k) <= (1 - conf) / 2,
    so that the interval holds the true median with probability at least conf whatever the
    distribution of the ratios. None when n is too small (under 6 for 95%)."""
    xs = sorted(xs)
    n = len(xs)
    tail, k = 0.0, 0
    while True:  # tail = P(B < k + 1)
        tail += math.comb(n, k) / 2.0 ** n
        if tail > (1.0 - conf) / 2.0:
            break
        k += 1
    return None if k == 0 else (xs[k - 1], xs[n - k])


def cpu_seconds(pid):
    """User + system CPU time of a process so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metrics(port):
    """The server's counters from /metrics (name -> value; histograms' buckets left out)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    out = {}
    for line in conn.getresponse().read().decode().split("\n"):
        if line and not line.startswith("#") and "_bucket" not in line:
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    conn.close()
    return out


TRACE_KEYS = [("steps", "spectree_engine_steps_total"), ("spec", "spectree_spec_steps_total"),
              ("plain", "spectree_plain_steps_total"), ("draft_s", "spectree_draft_seconds_total"),
              ("verify_s", "spectree_verify_seconds_total"),
              ("prefill_s", "spectree_prefill_seconds_total"),
              ("gen", "spectree_generation_tokens_total")]


def round_(srv, clients, max_tokens, trace=None, per_client=4, min_round=16):
    port = srv.port
    m0 = metrics(port) if trace else None
    c0 = cpu_seconds(srv.proc.pid)
    n = max(min_round, per_client * clients)
    res = [None] * n
    nxt = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n:
                return
            res[i] = one(port, i, max_tokens)

    th = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(srv.proc.pid) - c0
    if trace:
        m1 = metrics(port)
        d = {k: m1.get(n, 0.0) - m0.get(n, 0.0) for k, n in TRACE_KEYS}
        print("  trace %-5s c=%-3d wall %6.3f s cpu %6.3f s | steps %5d (spec %5d plain %5d) "
              "tok/step %5.2f | draft %6.3f verify %6.3f prefill %6.3f s | other %6.3f s" %
              (trace, clients, wall, cpu, d["steps"], d["spec"], d["plain"],
               d["gen"] / d["steps"] if d["steps"] else 0.0, d["draft_s"], d["verify_s"],
               d["prefill_s"], wall - d["draft_s"] - d["verify_s"] - d["prefill_s"]),
              file=sys.stderr, flush=True)
    toks = sum(r[2] for r in res)
    spec = sum(r[3].get("spec_steps", 0) for r in res)
    plain = sum(r[3].get("plain_steps", 0) for r in res)
    tau_tok = sum(r[3].get("spec_tau", 0) * r[3].get("spec_steps", 0) for r in res)
    return dict(tok_s=toks / wall, tok_cpu_s=toks / cpu if cpu > 0 else 0.0,
                lat=statistics.median(r[0] for r in res),
                ttft=statistics.median(r[1] for r in res),
                tau=tau_tok / spec if spec else 0.0,
                spec_share=spec / (spec + plain) if spec + plain else 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                    "build"))
    ap.add_argument("--extra", default=None, metavar="JSON",
                    help="a JSON object merged into every request's body, e.g. "
                         "'{\"response_format\": {\"type\": \"json_object\"}}' or a "
                         "json_schema: the constrained workload")
    ap.add_argument("--spec", default="--speculative-algorithm NGRAM",
                    help="the speculative server's flags (default: NGRAM, auto shape)")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--per-client", type=int, default=4,
                    help="requests per client in a round (at least 16 a round; default 4): "
                         "longer rounds for a small model, whose rounds last a fraction of a "
                         "second")
    ap.add_argument("--min-round", type=int, default=16,
                    help="requests in a round at least (default 16): longer rounds at low "
                         "concurrency, whose rounds are otherwise the shortest and noisiest")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-stream", action="store_true",
                    help="whole responses instead of streams (the client parses one object a "
                         "request, not an event a token: on a small model a Python client that "
                         "streams is a bottleneck)")
    ap.add_argument("--pin", action="store_true",
                    help="the servers on the first CPU and this client on the others (with "
                         "-t 1 unless --threads is given): on a 2-core machine the client and "
                         "the server then no longer take each other's core")
    ap.add_argument("--fresh", action="store_true",
                    help="a new pair of servers (warmed up) for every pair of rounds: two "
                         "processes of the same server differ by several percent on a small "
                         "model (an A/A run, --spec '--speculative-algorithm NONE', read "
                         "0.92x-1.06x at concurrency 1 on stories260K), so the pairs are "
                         "drawn anew and the median is over them")
    ap.add_argument("--trace", action="store_true",
                    help="print each round's engine counters from /metrics on stderr")
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",")]
    STREAM[0] = not a.no_stream
    if a.extra:
        try:
            EXTRA.update(json.loads(a.extra))
        except (ValueError, TypeError, AttributeError) as e:
            sys.exit("serve_bench: --extra is not a JSON object: %s" % e)
        if not isinstance(json.loads(a.extra), dict):
            sys.exit("serve_bench: --extra must be a JSON object")
    cpus = None
    if a.pin:
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) < 2:
            sys.exit("serve_bench: --pin needs at least 2 CPUs")
        cpus = {allowed[0]}
        os.sched_setaffinity(0, set(allowed[1:]))
        a.threads = a.threads or 1
    srv = []

    def start():  # a pair of servers, warmed up (first-touch memory, the controller's first steps)
        for s in srv:
            s.stop()
        srv[:] = [Srv(a.build, a.model, [], a.threads, cpus),
                  Srv(a.build, a.model, shlex.split(a.spec), a.threads, cpus)]
        for s in srv:
            round_(s, 4, a.max_tokens)

    rows = []
    try:
        start()
        for c in levels:
            runs = {"plain": [], "spec": []}
            for r in range(a.reps):
                if a.fresh and (r > 0 or c != levels[0]):
                    start()
                plain, spec = srv
                runs["plain"].append(round_(plain, c, a.max_tokens, a.trace and "plain",
                                            a.per_client, a.min_round))
                runs["spec"].append(round_(spec, c, a.max_tokens, a.trace and "spec",
                                           a.per_client, a.min_round))
            med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]}
                   for k, v in runs.items()}
            # the speed-up: the median of each adjacent pair's ratio (both rounds saw about the
            # same load from elsewhere)
            ratios = [sp["tok_s"] / pl["tok_s"] for pl, sp in zip(runs["plain"], runs["spec"])]
            ratio = statistics.median(ratios)
            ci = median_ci(ratios)
            cpu_ratio = statistics.median(sp["tok_cpu_s"] / pl["tok_cpu_s"]
                                          for pl, sp in zip(runs["plain"], runs["spec"])
                                          if pl["tok_cpu_s"] > 0)
            rows.append(dict(concurrency=c, plain=med["plain"], spec=med["spec"], speedup=ratio,
                             cpu_speedup=cpu_ratio, speedup_ci95=ci, ratios=ratios))
            if not a.json:
                p, s = med["plain"], med["spec"]
                print("c=%-3d plain %8.1f tok/s  lat %6.2f s  ttft %6.3f s | spec %8.1f tok/s  "
                      "lat %6.2f s  ttft %6.3f s  tau %.2f  spec steps %3.0f%% | %.2fx wall, "
                      "%.2fx per CPU second%s" %
                      (c, p["tok_s"], p["lat"], p["ttft"], s["tok_s"], s["lat"], s["ttft"],
                       s["tau"], 100 * s["spec_share"], rows[-1]["speedup"],
                       rows[-1]["cpu_speedup"],
                       " | 95%% CI of the wall speed-up %.3f-%.3f (%d pairs)" %
                       (ci[0], ci[1], len(ratios)) if ci else ""), flush=True)
    finally:
        for s in srv:
            s.stop()
    if a.json:
        print(json.dumps(dict(model=a.model, spec=a.spec, max_tokens=a.max_tokens, reps=a.reps,
                              extra=EXTRA, rows=rows)))


if __name__ == "__main__":
    main()
