#!/usr/bin/env python3
"""test_serve_nginx.py: scale-out of `spectree serve` behind nginx (Debian's nginx-light) on
loopback: two replicas and nginx with the upstream configuration docs/SERVING.md documents
(tools/serve/nginx.conf). The requests carry no session key, so nginx balances them by
least_conn (test_serve_affinity.py covers the session-keyed hash).
1. Load through nginx: every response complete and equal to `spectree generate`; both replicas
   serve.
2. One replica killed (SIGKILL) mid-run: only requests that started before the kill may fail
   (those it was running); every request started after it succeeds on the other replica.
3. One replica stopped with SIGTERM mid-run: it drains, nginx sends new requests to the other
   one, and no request fails.
Usage: test_serve_nginx.py BUILD_DIR SOURCE_DIR"""
import http.client
import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Nginx, Server, check, generate, run_tests  # noqa: E402

BUILD, SRC = sys.argv[1:3]
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
PROMPTS = ["Once upon a time", "The little dog", "Lily had a red ball", "The sun was hot"]
CASES = [dict(prompt=p, temp=0.8, seed=7 + i, n=96) for i, p in enumerate(PROMPTS)]
WANT = {}


def request(port, i):
    """One streamed request through nginx: (ok, model or error, t_start, t_end)."""
    c = CASES[i % len(CASES)]
    body = {"prompt": c["prompt"], "max_tokens": c["n"], "temperature": c["temp"],
            "seed": c["seed"], "top_k": 0, "top_p": 1.0, "min_p": 0.0, "stream": True}
    t0 = time.time()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read().decode()
        if r.status != 200:
            return False, "status %d" % r.status, t0, time.time()
        ev = [ln[6:] for ln in data.split("\n") if ln.startswith("data: ")]
        if not ev or ev[-1] != "[DONE]":
            return False, "truncated stream", t0, time.time()
        chunks = [json.loads(e) for e in ev[:-1]]
        text = "".join(ch["choices"][0]["text"] for ch in chunks)
        if text != WANT[i % len(CASES)]:
            return False, "text differs from generate", t0, time.time()
        return True, chunks[0]["model"], t0, time.time()
    except Exception as e:  # noqa: BLE001 (a broken connection is a failed request)
        return False, "%s: %s" % (type(e).__name__, e), t0, time.time()
    finally:
        conn.close()


def run_load(port, n, clients, event_at=None, event=None):
    """n requests from `clients` threads; after event_at completed ones, calls event() once and
    records when. Returns (results, event time)."""
    results = [None] * n
    nxt, done = [0], [0]
    lock = threading.Lock()
    when = [None]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n:
                return
            results[i] = request(port, i)
            with lock:
                done[0] += 1
                fire = event and when[0] is None and done[0] >= event_at
                if fire:
                    when[0] = time.time()
            if fire:
                event()

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
        check(not t.is_alive(), "a client is stuck after 600 s")
    return results, when[0]


def setup():
    a = Server(BUILD, MODEL, "--max-running-requests", "8", name="replica-a")
    b = Server(BUILD, MODEL, "--max-running-requests", "8", name="replica-b")
    return a, b, Nginx(SRC, [a.port, b.port])


def test_balanced():
    a, b, ng = setup()
    try:
        res, _ = run_load(ng.port, 64, 16)
        bad = [r for r in res if not r[0]]
        check(not bad, "%d failed through nginx: %s" % (len(bad), bad[:3]))
        served = {r[1] for r in res}
        check(served == {"replica-a", "replica-b"}, "served by %s" % served)
        check(a.stop() == 0 and b.stop() == 0, "replicas' exit status")
    finally:
        ng.close()
        a.__exit__()
        b.__exit__()


def test_kill_one():
    a, b, ng = setup()
    try:
        res, t_kill = run_load(ng.port, 160, 16, event_at=32,
                               event=lambda: a.proc.send_signal(signal.SIGKILL))
        check(t_kill is not None, "the replica was not killed")
        failed = [r for r in res if not r[0]]
        late = [r for r in failed if r[2] >= t_kill]
        check(not late, "%d requests started after the kill failed: %s" % (len(late), late[:3]))
        after = [r for r in res if r[2] >= t_kill + 0.1]
        check(after and all(r[1] == "replica-b" for r in after),
              "requests after the kill not all on replica-b")
        # at most what replica-a was running or had queued (8 slots) plus its keep-alive
        # connections' requests in flight: every client had at most one request open
        check(len(failed) <= 16, "%d requests failed" % len(failed))
        print("  killed replica-a after 32 of 160 requests: %d in flight on it failed, %d "
              "started later all served by replica-b" % (len(failed), len(after)))
        check(b.stop() == 0, "replica-b exit status")
    finally:
        ng.close()
        a.__exit__()
        b.__exit__()


def test_drain_one():
    a, b, ng = setup()
    try:
        res, t_stop = run_load(ng.port, 160, 16, event_at=32,
                               event=lambda: a.proc.send_signal(signal.SIGTERM))
        failed = [r for r in res if not r[0]]
        check(not failed, "%d requests failed while replica-a drained: %s" %
              (len(failed), failed[:3]))
        check(a.proc.wait(60) == 0, "replica-a exit status after SIGTERM")
        after = [r for r in res if r[2] >= t_stop + 0.5]
        check(after and all(r[1] == "replica-b" for r in after), "requests after the drain")
        print("  SIGTERM to replica-a after 32 of 160 requests: none failed")
        check(b.stop() == 0, "replica-b exit status")
    finally:
        ng.close()
        a.__exit__()
        b.__exit__()


def main():
    for i, c in enumerate(CASES):
        WANT[i] = generate(BUILD, MODEL, c["prompt"], c["n"], temp=c["temp"], seed=c["seed"])
    run_tests([("two replicas behind nginx", test_balanced),
               ("one replica killed mid-run", test_kill_one),
               ("one replica drained mid-run", test_drain_one)])
    print("nginx scale-out test passed")


if __name__ == "__main__":
    main()
