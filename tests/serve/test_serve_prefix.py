#!/usr/bin/env python3
"""test_serve_prefix.py: the prefix cache of `spectree serve` on stories260K at -c 4096 (the
model was trained at 512; RoPE runs on past it, which is all exactness needs). Two requests
share a prefix of about 1,900 tokens: the second's usage says its cached tokens, its log line
too, /metrics counts the hit, and its text equals a server's without a cache (plain, NGRAM and
EAGLE; greedy and seeded). The time to the first streamed token of both is printed (not
asserted; medians of 5). Then a load check: 64 concurrent conversations of 4 to 6 turns, every
turn resending the whole history, through a server with the default cache and one with a small
cache: every answer is complete, the cache hits (and with the small one evicts), /metrics polled
during the load never shows the cache over its budget nor the budget over --prefix-cache-mb, its
hit ratio is hits / (hits + misses), and the server's peak RSS stays within the idle server's plus
its KV cache, the cache's budget and a stated slack.
Usage: test_serve_prefix.py BUILD_DIR SOURCE_DIR"""
import http.client
import json
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, check, metrics, run_tests  # noqa: E402

BUILD, SRC = sys.argv[1:3]
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
EAGLE = os.path.join(SRC, "models", "eagle-stories260K")
EAGLE3 = os.path.join(SRC, "models", "eagle3-stories260K")
PREFIX = ("Once upon a time, there was a little girl named Lily. She liked to play with her red "
          "ball in the park. ") * 60  # 1,920 tokens


def post(port, path, body, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read().decode()
        check(r.status == 200, "%s: status %d: %s" % (path, r.status, data[:300]))
        return json.loads(data)
    finally:
        conn.close()


def ttft(port, body):
    """Seconds from sending a streamed request to its first token's event."""
    b = dict(body, stream=True)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", json.dumps(b), {"Content-Type": "application/json"})
        r = conn.getresponse()
        check(r.status == 200, "stream status %d" % r.status)
        while True:
            line = r.readline()
            check(line, "stream ended before a token")
            if line.startswith(b"data: ") and b'"text":"' in line and b'"text":""' not in line:
                t = time.perf_counter() - t0
                break
        r.read()
        return t
    finally:
        conn.close()


SERVERS = [("plain", []), ("NGRAM", ["--speculative-algorithm", "NGRAM"]),
           ("EAGLE", ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", EAGLE,
                      "--speculative-eagle-topk", "2", "--speculative-num-steps", "3",
                      "--speculative-num-draft-tokens", "8"]),
           ("EAGLE-3", ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                        EAGLE3, "--speculative-eagle-topk", "2", "--speculative-num-steps", "3",
                        "--speculative-num-draft-tokens", "8"])]


def shared_prefix():
    bodies = [{"prompt": PREFIX + tail, "max_tokens": 40, "temperature": temp, "seed": 7,
               "top_k": 0, "top_p": 1.0, "min_p": 0.0}
              for tail in ("One day, Lily", "Then her friend Tom") for temp in (0.0, 0.8)]
    for name, args in SERVERS:
        want = []
        with Server(BUILD, MODEL, "-c", "4096", "--prefix-cache-mb", "0", *args) as fresh:
            for b in bodies:
                d = post(fresh.port, "/v1/completions", b)
                check(d["usage"]["prompt_tokens_details"]["cached_tokens"] == 0,
                      "a server without a cache reused tokens")
                want.append(d["choices"][0]["text"])
        with Server(BUILD, MODEL, "-c", "4096", "-t", "2", *args) as srv:
            first = post(srv.port, "/v1/completions", bodies[0])
            n_prompt = first["usage"]["prompt_tokens"]
            check(n_prompt > 1900, "a prefix of %d tokens" % n_prompt)
            check(first["choices"][0]["text"] == want[0], "%s: the first request's text" % name)
            for i, b in enumerate(bodies[1:], 1):
                d = post(srv.port, "/v1/completions", b)
                cached = d["usage"]["prompt_tokens_details"]["cached_tokens"]
                check(cached >= 1888, "%s: request %d reused %d tokens" % (name, i, cached))
                check(d["choices"][0]["text"] == want[i],
                      "%s: request %d: %r != %r" % (name, i, d["choices"][0]["text"], want[i]))
                line = [ln for ln in srv.log_text().splitlines() if d["id"] + ":" in ln]
                deadline = time.time() + 5
                while not line and time.time() < deadline:
                    time.sleep(0.05)
                    line = [ln for ln in srv.log_text().splitlines() if d["id"] + ":" in ln]
                check(line and re.search(r"\(%d cached\)" % cached, line[0]),
                      "log line: %s" % line)
            m = metrics(srv.url)
            check(m["spectree_prefix_cache_hits_total"] == 3, "hits %s" %
                  m["spectree_prefix_cache_hits_total"])
            check(m["spectree_prefix_cache_misses_total"] == 1, "misses")
            check(m["spectree_prefix_cache_hit_tokens_total"] >= 3 * 1888, "hit tokens")
            check(m["spectree_prefix_cache_entries"] >= 60, "entries")
            check(0 < m["spectree_prefix_cache_bytes"] <= m["spectree_prefix_cache_budget_bytes"],
                  "bytes")
        # time to first token: a new prefix, then the same prefix with another tail
        # (medians of 5 pairs, each with a prefix of its own)
        with Server(BUILD, MODEL, "-c", "4096", "-t", "2", *args) as srv:
            t1, t2 = [], []
            for r in range(5):
                b = {"prompt": "The big dog %d ran. " % r + PREFIX, "max_tokens": 8,
                     "temperature": 0}
                t1.append(ttft(srv.port, b))
                t2.append(ttft(srv.port, dict(b, prompt=b["prompt"] + "Lily smiled.")))
            t1, t2 = sorted(t1)[2], sorted(t2)[2]
            print("  %s: TTFT first %.1f ms, second (cached prefix) %.1f ms (%.0f%%)" %
                  (name, t1 * 1e3, t2 * 1e3, 100 * t2 / t1), flush=True)


CONVS = 64


def turns_of(c):
    return 4 + c % 3  # 4 to 6 turns


def conversations(cache_mb):
    """64 conversations at once through 16 slots, 4 to 6 turns each, every turn resending the
    whole history; /metrics and the server's RSS polled throughout."""
    with Server(BUILD, MODEL, "-c", "2048", "-np", "16", "--prefix-cache-mb", str(cache_mb),
                "--speculative-algorithm", "NGRAM") as srv:
        rss0 = srv.rss_kb()
        errors, done = [], [0]
        lock = threading.Lock()
        polls, peak, stop = [0], [rss0], threading.Event()

        def talk(c):
            history = "Story %d. " % c + PREFIX[: 300 + 7 * c]
            try:
                for t in range(turns_of(c)):
                    history += " Then turn %d began." % t
                    d = post(srv.port, "/v1/completions",
                             {"prompt": history, "max_tokens": 24, "temperature": 0.7, "seed": c})
                    ch = d["choices"][0]
                    if ch["finish_reason"] not in ("length", "stop") or not ch["text"] or \
                       d["usage"]["completion_tokens"] < 1:
                        raise RuntimeError("incomplete answer %s" % d)
                    history += ch["text"]
                with lock:
                    done[0] += 1
            except Exception as e:  # noqa: BLE001 (any failure is a lost conversation)
                with lock:
                    errors.append("%d: %s: %s" % (c, type(e).__name__, e))

        def poll():
            # the cache never over its budget, and the budget never over --prefix-cache-mb,
            # at every look, not only at the end
            while not stop.wait(0.2):
                m = metrics(srv.url)
                polls[0] += 1
                peak[0] = max(peak[0], srv.rss_kb())
                if not (m["spectree_prefix_cache_bytes"] <= m["spectree_prefix_cache_budget_bytes"]
                        <= cache_mb << 20):
                    with lock:
                        errors.append("poll %d: %d bytes cached, budget %d, --prefix-cache-mb %d"
                                      % (polls[0], m["spectree_prefix_cache_bytes"],
                                         m["spectree_prefix_cache_budget_bytes"], cache_mb))

        t0 = time.time()
        poller = threading.Thread(target=poll)
        poller.start()
        ths = [threading.Thread(target=talk, args=(c,)) for c in range(CONVS)]
        for th in ths:
            th.start()
        for th in ths:
            th.join(300)
        secs = time.time() - t0
        stop.set()
        poller.join(60)
        check(not errors, "conversations failed: %s" % errors[:3])
        check(done[0] == CONVS, "%d of %d conversations done" % (done[0], CONVS))
        check(polls[0] >= 3, "/metrics polled %d times during the load" % polls[0])
        m = metrics(srv.url)
        rss1 = srv.rss_kb()
        peak[0] = max(peak[0], rss1)
        hits, misses = m["spectree_prefix_cache_hits_total"], m["spectree_prefix_cache_misses_total"]
        turns = sum(turns_of(c) for c in range(CONVS))
        print("  %d MB cache: %d conversations, %d turns in %.1f s: %d hits, %d misses (hit ratio "
              "%.2f), %d tokens served, %d evictions, %d blocks, %d of %d bytes held (%d polls); "
              "RSS %d KiB idle, %d at peak, %d at the end" %
              (cache_mb, CONVS, turns, secs, hits, misses,
               m["spectree_prefix_cache_hit_ratio"], m["spectree_prefix_cache_hit_tokens_total"],
               m["spectree_prefix_cache_evictions_total"], m["spectree_prefix_cache_entries"],
               m["spectree_prefix_cache_bytes"], m["spectree_prefix_cache_budget_bytes"],
               polls[0], rss0, peak[0], rss1), flush=True)
        check(hits + misses == turns, "%d admissions counted, %d turns" % (hits + misses, turns))
        check(abs(m["spectree_prefix_cache_hit_ratio"] - hits / turns) < 1e-5, "hit ratio")
        check(m["spectree_prefix_cache_bytes"] <= m["spectree_prefix_cache_budget_bytes"]
              <= cache_mb << 20, "the cache within its budget")
        # the idle server's RSS (weights, scratch) + the KV cache at most (16 slots of 2048
        # positions of 2560 bytes: 80 MiB) + the cache's budget + 16 MiB of slack (allocator,
        # connections, libmicrohttpd); 64 MiB more under ASan, whose allocator grows in steps
        slack = 16 * 1024 + (64 * 1024 if os.environ.get("ASAN_OPTIONS") else 0)
        limit = 80 * 1024 + m["spectree_prefix_cache_budget_bytes"] // 1024 + slack
        check(peak[0] - rss0 <= limit, "RSS grew by %d KiB at its peak (limit %d)" %
              (peak[0] - rss0, limit))
        return m


def conversations_cached():
    # the default budget holds every turn: each conversation's later turns hit
    m = conversations(256)
    later = sum(turns_of(c) - 1 for c in range(CONVS))
    check(m["spectree_prefix_cache_hits_total"] >= 0.9 * later, "hits")
    check(m["spectree_prefix_cache_evictions_total"] == 0, "evictions")


def conversations_evicting():
    # 16 MB: about 400 blocks of 32 tokens, a third of what the turns hold; LRU under a
    # round-robin of 64 conversations evicts most of a conversation before its next turn
    m = conversations(16)
    check(m["spectree_prefix_cache_hits_total"] > 0, "hits")
    check(m["spectree_prefix_cache_evictions_total"] > 0, "evictions")


if __name__ == "__main__":
    run_tests([("shared prefix: reused, exact, TTFT", shared_prefix),
               ("64 multi-turn conversations, a cache that holds them", conversations_cached),
               ("64 multi-turn conversations, a cache that evicts", conversations_evicting)])
    print("prefix cache test passed")
