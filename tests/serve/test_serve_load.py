#!/usr/bin/env python3
"""test_serve_load.py: a bounded load test of `spectree serve` on loopback. 64 client threads
send 384 requests (half streamed, half not; greedy and seeded sampling; 8 distinct prompts and
parameter sets) to a server with 16 slots and NGRAM speculation, so requests queue, join and
leave between steps all the time. Every response must be complete and equal to what
`spectree generate` prints for its parameters alone; no request may be lost; the server must
still answer and its RSS after a second identical round must stay within 2 MiB of the first
(16 MiB under ASan, whose allocator grows in steps; nothing leaks per request). Stops by itself: every client call has a timeout.
Usage: test_serve_load.py BUILD_DIR SOURCE_DIR"""
import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Fail, Server, check, generate, metrics, run_tests  # noqa: E402

BUILD, SRC = sys.argv[1:3]
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
CLIENTS, PER_ROUND = 64, 384

PROMPTS = ["Once upon a time", "The little dog", "Tom and Sue went to the park",
           "One day, a big bird", "Lily had a red ball", "The sun was hot",
           "Max wanted to play", "In the forest there was"]
CASES = [dict(prompt=p, temp=(0.0 if i % 3 == 0 else 0.6 + 0.1 * i), seed=100 + i,
              n=24 + 8 * (i % 5)) for i, p in enumerate(PROMPTS)]


def request(port, case, stream):
    body = {"prompt": case["prompt"], "max_tokens": case["n"], "temperature": case["temp"],
            "seed": case["seed"], "top_k": 0, "top_p": 1.0, "min_p": 0.0, "stream": stream}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read().decode()
        if r.status != 200:
            return "status %d: %s" % (r.status, data[:200])
        if not stream:
            d = json.loads(data)
            return d["choices"][0]["text"], d["choices"][0]["finish_reason"]
        events = [ln[6:] for ln in data.split("\n") if ln.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return "stream without [DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        fin = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]]
        if len(fin) != 1:
            return "stream without one final chunk"
        return "".join(c["choices"][0]["text"] for c in chunks), fin[0]
    except Exception as e:  # noqa: BLE001 (any client failure is a lost request)
        return "%s: %s" % (type(e).__name__, e)
    finally:
        conn.close()


def round_(port, want, n):
    results = [None] * n
    nxt = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n:
                return
            results[i] = request(port, CASES[i % len(CASES)], stream=(i // len(CASES)) % 2 == 1)

    threads = [threading.Thread(target=worker) for _ in range(CLIENTS)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
        check(not t.is_alive(), "a client thread is stuck after 600 s")
    secs = time.time() - t0
    bad = []
    for i, r in enumerate(results):
        c = CASES[i % len(CASES)]
        if not isinstance(r, tuple):
            bad.append("request %d: %s" % (i, r))
        elif r[0] != want[i % len(CASES)]:
            bad.append("request %d (%s): text differs from generate: %r vs %r" %
                       (i, c["prompt"], r[0][:60], want[i % len(CASES)][:60]))
    check(not bad, "%d of %d requests failed; first: %s" % (len(bad), n, bad[:3]))
    return secs


def main():
    want = [generate(BUILD, MODEL, c["prompt"], c["n"], temp=c["temp"], seed=c["seed"])
            for c in CASES]
    env_asan = "ASAN_OPTIONS" in os.environ
    if env_asan:  # ASan's quarantine holds freed memory back: keep it small for the RSS check
        os.environ["ASAN_OPTIONS"] += ":quarantine_size_mb=4:thread_local_quarantine_size_kb=64"
    with Server(BUILD, MODEL, "--speculative-algorithm", "NGRAM", "--max-running-requests", "16",
                "--max-queued-requests", "256", "--max-connections", "128") as srv:
        def load():
            round_(srv.port, want, PER_ROUND // 2)  # warm-up: every size the run reaches
            rss0 = srv.rss_kb()
            secs = round_(srv.port, want, PER_ROUND)
            rss1 = srv.rss_kb()
            secs2 = round_(srv.port, want, PER_ROUND)
            rss2 = srv.rss_kb()
            m = metrics(srv.url)
            total = PER_ROUND // 2 + 2 * PER_ROUND
            print("  %d requests x2 in %.1f s, %.1f s; RSS %d -> %d -> %d KiB; %d spec steps, "
                  "%d plain" % (PER_ROUND, secs, secs2, rss0, rss1, rss2,
                                m["spectree_spec_steps_total"], m["spectree_plain_steps_total"]))
            check(m['spectree_requests_total{endpoint="completions"}'] == total,
                  "requests counted %s" % m['spectree_requests_total{endpoint="completions"}'])
            fin = sum(v for k, v in m.items() if k.startswith("spectree_requests_finished_total"))
            check(fin == total, "finished %d of %d" % (fin, total))
            check(m["spectree_running_sequences"] == 0 and m["spectree_queue_depth"] == 0,
                  "requests left running or queued")
            # release builds grow by 50-90 KiB a round here; under ASan its allocator's regions
            # and shadow come in steps of megabytes in whichever round first needs them (+0.4 to
            # +8.3 MiB a round measured), and LeakSanitizer checks for leaks at the exit
            limit = 16 * 1024 if env_asan else 2 * 1024
            check(rss2 - rss1 <= limit, "RSS grew by %d KiB in the second round (limit %d)" %
                  (rss2 - rss1, limit))
            check(srv.stop() == 0, "exit status after SIGTERM")

        try:
            run_tests([("load: %d clients, %d requests a round" % (CLIENTS, PER_ROUND), load)])
        except SystemExit:
            sys.stdout.write("--- server log ---\n" + srv.log_text()[-3000:])
            raise
    print("load test passed")


if __name__ == "__main__":
    main()
