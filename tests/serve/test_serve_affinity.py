#!/usr/bin/env python3
"""test_serve_affinity.py: session affinity across two `spectree serve` replicas behind nginx
(Debian's nginx-light) with tools/serve/nginx.conf as shipped: a request with a session key
(X-Session-Id, or X-User carrying the chat request's `user` field) goes to the replica its key
hashes to, so a conversation's turns find their prefix in that replica's cache.
1. 16 chat sessions x 4 streamed turns at once, each turn resending the whole history: every
   session's turns land on one replica (from each replica's log lines, which name the session,
   and from the answers' `model`), both replicas serve sessions, every later turn has cached
   prompt tokens, and each replica's /metrics counts those hits.
2. One replica killed (SIGKILL) mid-run: only the turns it was running fail (streams cut), at
   most one per session it held; every turn started after the kill completes on the survivor,
   where the moved sessions' turns after their first there hit its cache again; the survivor's
   own sessions lose nothing.
3. One replica stopped with SIGTERM mid-run: it drains, its sessions move to the other, and no
   turn fails.
And the log lines' session key alone (one replica, --log-format json): the header's value, X-User
without X-Session-Id, sanitised and cut at 64 bytes, on every choice's line.
Usage: test_serve_affinity.py BUILD_DIR SOURCE_DIR"""
import http.client
import json
import os
import re
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Fail, Nginx, Server, check, metrics, run_tests  # noqa: E402

BUILD, SRC = sys.argv[1:3]
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
SESSIONS = 16
STORY = ("Once upon a time, there was a little girl named Lily. She liked to play with her red "
         "ball in the park with her friend Tom. ")
LOG_LINE = re.compile(r"^spectree serve: (\S+): prompt (\d+) tokens \((\d+) cached\), .*"
                      r"finish \w+, session (\S+)$")


def key_of(s):
    """Even sessions send X-Session-Id; odd ones a chat `user` copied into X-User (nginx.conf)."""
    return ("sess-%d" % s) if s % 2 == 0 else ("user-%d" % s)


def turn(port, s, messages):
    """One streamed chat turn through nginx: a dict with ok, the replica (`model`), the answer's
    text, cached tokens, id, the error and when it started and ended."""
    body = {"messages": messages, "max_tokens": 24, "temperature": 0.8, "seed": s,
            "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"}
    if s % 2 == 0:
        headers["X-Session-Id"] = key_of(s)
    else:
        body["user"] = key_of(s)
        headers["X-User"] = body["user"]
    out = dict(ok=False, session=s, t0=time.time(), model=None, error=None)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        r = conn.getresponse()
        data = r.read().decode()
        if r.status != 200:
            out["error"] = "status %d: %s" % (r.status, data[:200])
            return out
        ev = [ln[6:] for ln in data.split("\n") if ln.startswith("data: ")]
        if not ev or ev[-1] != "[DONE]":
            out["error"] = "the stream was cut"
            return out
        chunks = [json.loads(e) for e in ev[:-1]]
        if any("error" in c for c in chunks):
            out["error"] = "an error event"
            return out
        fin = [c["choices"][0]["finish_reason"] for c in chunks
               if c.get("choices") and c["choices"][0].get("finish_reason")]
        usage = [c["usage"] for c in chunks if c.get("usage")]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                       if c.get("choices"))
        if fin not in (["stop"], ["length"]) or len(usage) != 1 or \
           usage[0]["completion_tokens"] < 1:
            out["error"] = "incomplete answer: finish %s, usage %s" % (fin, usage)
            return out
        out.update(ok=True, model=chunks[0]["model"], text=text, id=chunks[0]["id"],
                   cached=usage[0]["prompt_tokens_details"]["cached_tokens"])
        return out
    except Exception as e:  # noqa: BLE001 (a broken connection is a failed turn)
        out["error"] = "%s: %s" % (type(e).__name__, e)
        return out
    finally:
        out["t1"] = time.time()
        conn.close()


def conversations(port, turns, event_at=None, event=None):
    """SESSIONS conversations at once, `turns` answered turns each; a failed turn is recorded
    and sent again (once: a second failure ends the session). After event_at answered turns in
    all, event() is called once. Returns (every attempt in order per session, event time)."""
    attempts = [[] for _ in range(SESSIONS)]
    lock = threading.Lock()
    done, when, fired = [0], [None], [False]

    def talk(s):
        messages = [{"role": "system", "content": "Session %d. %s" % (s, STORY * 2)}]
        answered, failed = 0, 0
        while answered < turns and failed < 2:
            messages.append({"role": "user", "content": "Tell me more, part %d." % answered})
            r = turn(port, s, messages)
            attempts[s].append(r)
            if not r["ok"]:
                messages.pop()
                failed += 1
                continue
            messages.append({"role": "assistant", "content": r["text"]})
            answered, failed = answered + 1, 0
            with lock:
                done[0] += 1
                fire = event and not fired[0] and done[0] >= event_at
                fired[0] |= bool(fire)
            if fire:
                event()
                when[0] = time.time()  # turns that start later meet a stopped replica

    ths = [threading.Thread(target=talk, args=(s,)) for s in range(SESSIONS)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(300)
        check(not th.is_alive(), "a session is stuck after 300 s")
    return attempts, when[0]


def log_turns(srv):
    """{session key: [(id, prompt tokens, cached tokens)]} from a replica's request log lines."""
    out = {}
    for line in srv.log_text().splitlines():
        m = LOG_LINE.match(line)
        if m:
            out.setdefault(m.group(4), []).append((m.group(1), int(m.group(2)), int(m.group(3))))
    return out


def wait_logged(servers, n, timeout=10):
    """Waits until the replicas' logs hold n session lines in all (a line follows its answer)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if sum(len(v) for srv in servers for v in log_turns(srv).values()) >= n:
            return
        time.sleep(0.05)


def setup():
    a = Server(BUILD, MODEL, "--max-running-requests", "8", name="replica-a")
    b = Server(BUILD, MODEL, "--max-running-requests", "8", name="replica-b")
    return {"replica-a": a, "replica-b": b}, Nginx(SRC, [a.port, b.port])


def close(reps, ng):
    ng.close()
    for r in reps.values():
        r.__exit__()


def test_sticky():
    reps, ng = setup()
    try:
        turns = 4
        attempts, _ = conversations(ng.port, turns)
        bad = [r for att in attempts for r in att if not r["ok"]]
        check(not bad, "%d turns failed: %s" % (len(bad), [r["error"] for r in bad[:3]]))
        wait_logged(reps.values(), SESSIONS * turns)
        logs = {name: log_turns(srv) for name, srv in reps.items()}
        home = {}
        for s, att in enumerate(attempts):
            check(len(att) == turns, "session %d: %d turns" % (s, len(att)))
            served = {r["model"] for r in att}
            check(len(served) == 1, "session %d's turns went to %s" % (s, served))
            home[s] = served.pop()
            where = {name for name, lg in logs.items() if key_of(s) in lg}
            check(where == {home[s]}, "session %d in the logs of %s, answered by %s" %
                  (s, where, home[s]))
            ids = [t[0] for t in logs[home[s]][key_of(s)]]
            check(sorted(ids) == sorted(r["id"] for r in att),
                  "session %d: logged ids %s, answered %s" % (s, ids, [r["id"] for r in att]))
            cold = [i for i, r in enumerate(att[1:], 1) if r["cached"] <= 0]
            check(not cold, "session %d: turns %s found nothing cached" % (s, cold))
        per = {name: sorted(s for s in home if home[s] == name) for name in reps}
        check(all(per.values()), "every session on one replica: %s" % per)
        # request ids are unique across the replicas (started in the same second, each counts
        # its requests from 1: the ids' random per-process part keeps them apart)
        ids = [r["id"] for att in attempts for r in att]
        check(len(set(ids)) == len(ids), "request ids repeat across replicas: %s" %
              sorted(i for i in set(ids) if ids.count(i) > 1)[:4])
        for name, srv in reps.items():
            m = metrics(srv.url)
            want = len(per[name]) * (turns - 1)
            check(m["spectree_prefix_cache_hits_total"] >= want,
                  "%s: %d cache hits, %d later turns" %
                  (name, m["spectree_prefix_cache_hits_total"], want))
        print("  %d sessions x %d turns: replica-a %d sessions, replica-b %d; every later turn "
              "cached (mean %.0f tokens)" %
              (SESSIONS, turns, len(per["replica-a"]), len(per["replica-b"]),
               sum(r["cached"] for att in attempts for r in att[1:]) /
               (SESSIONS * (turns - 1))), flush=True)
        for srv in reps.values():
            check(srv.stop() == 0, "a replica's exit status")
    finally:
        close(reps, ng)


def stopped(srv, sig):
    """Sends sig and returns once the replica runs no new request: SIGKILL, once it is gone;
    SIGTERM, once it drains (its /health answers 503, or it takes no connection)."""
    srv.proc.send_signal(sig)
    if sig == signal.SIGKILL:
        srv.proc.wait(10)
        return
    deadline = time.time() + 10
    while time.time() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=0.5)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 503:
                return
        except OSError:  # refused, or accepted no more
            return
        finally:
            conn.close()
        time.sleep(0.005)
    raise Fail("the replica still serves 10 s after signal %d" % sig)


def stop_one(sig):
    """16 sessions x 6 turns; replica-a gets sig after 32 answered turns."""
    reps, ng = setup()
    try:
        turns = 6
        a, b = reps["replica-a"], reps["replica-b"]
        attempts, t_stop = conversations(ng.port, turns, 32, lambda: stopped(a, sig))
        check(t_stop is not None, "the signal was not sent")
        before = {s: {r["model"] for r in att if r["ok"] and r["t1"] < t_stop}
                  for s, att in enumerate(attempts)}
        check(all(len(v) <= 1 for v in before.values()), "sessions split before the stop: %s" %
              before)
        on_a = {s for s, v in before.items() if v == {"replica-a"}}
        on_b = {s for s, v in before.items() if v == {"replica-b"}}
        check(on_a and on_b, "sessions on replica-a %s, replica-b %s" % (on_a, on_b))
        failed = [r for att in attempts for r in att if not r["ok"]]
        if sig == signal.SIGTERM:
            check(not failed, "%d turns failed in the drain: %s" %
                  (len(failed), [r["error"] for r in failed[:3]]))
        late = [r for r in failed if r["t0"] >= t_stop]
        check(not late, "%d turns started after the stop failed: %s" %
              (len(late), [r["error"] for r in late[:3]]))
        # a session with no answered turn yet may be on either replica
        check(not any(r["session"] in on_b for r in failed),
              "a session of replica-b lost a turn: %s" % [r["session"] for r in failed])
        check(len(failed) <= SESSIONS - len(on_b), "%d turns failed for %d sessions" %
              (len(failed), SESSIONS - len(on_b)))
        for s, att in enumerate(attempts):
            ok = [r for r in att if r["ok"]]
            check(len(ok) == turns, "session %d: %d of %d turns answered" % (s, len(ok), turns))
            after = [r for r in ok if r["t0"] >= t_stop]
            check(all(r["model"] == "replica-b" for r in after),
                  "session %d: turns after the stop on %s" % (s, {r["model"] for r in after}))
            if s in on_b:
                check({r["model"] for r in ok} == {"replica-b"}, "session %d moved" % s)
            moved = [r for r in ok if r["model"] == "replica-b"]
            cold = [r for r in moved[1:] if r["cached"] <= 0]
            check(not cold, "session %d: %d turns on replica-b after its first found nothing "
                  "cached" % (s, len(cold)))
        wait_logged([b], sum(1 for att in attempts for r in att
                             if r["ok"] and r["model"] == "replica-b"))
        blog = log_turns(b)
        for s in range(SESSIONS):
            n = sum(1 for r in attempts[s] if r["ok"] and r["model"] == "replica-b")
            check(len(blog.get(key_of(s), [])) == n, "session %d: replica-b logged %d turns, "
                  "answered %d" % (s, len(blog.get(key_of(s), [])), n))
        print("  %s to replica-a after 32 of %d turns: %d of its %d sessions lost the turn it "
              "was running; all %d sessions finished, later turns on replica-b" %
              (signal.Signals(sig).name, SESSIONS * turns, len(failed), len(on_a), SESSIONS),
              flush=True)
        if sig == signal.SIGTERM:
            check(a.proc.wait(60) == 0, "replica-a's exit status after SIGTERM")
        check(b.stop() == 0, "replica-b's exit status")
    finally:
        close(reps, ng)


def test_log_key():
    # straight to one replica, JSON log lines: the key as sent, X-User when there is no
    # X-Session-Id, bytes outside printable ASCII as '?', cut at 64 bytes, every choice's line
    # with it, and no "session" field without a key
    with Server(BUILD, MODEL, "--log-format", "json") as srv:
        sent = [({"X-Session-Id": "conv-7", "X-User": "u"}, 1, "conv-7"),
                ({"X-User": "alice"}, 1, "alice"),
                ({"X-Session-Id": "caf\u00e9 " + "k" * 80}, 2, "caf??" + "?" + "k" * 58),
                ({}, 1, None)]
        ids = []
        for headers, n, _ in sent:
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
            h = {k: v.encode() for k, v in headers.items()}  # UTF-8 bytes on the wire
            conn.request("POST", "/v1/completions", json.dumps(
                {"prompt": "Once upon a time", "max_tokens": 4, "n": n}),
                dict(h, **{"Content-Type": "application/json"}))
            r = conn.getresponse()
            d = json.loads(r.read())
            check(r.status == 200, "status %d: %s" % (r.status, d))
            ids.append(d["id"])
            conn.close()
        deadline = time.time() + 10
        while time.time() < deadline:
            lines = [json.loads(ln) for ln in srv.log_text().splitlines() if ln.startswith("{")]
            reqs = [v for v in lines if v.get("msg") == "request"]
            if len(reqs) >= 5:
                break
            time.sleep(0.05)
        for i, (_, n, want) in enumerate(sent):
            got = [v.get("session") for v in reqs if v["id"] == ids[i]]
            check(got == [want] * n, "request %d: logged sessions %s, want %s" % (i, got, want))


def main():
    run_tests([("the session key in the request log", test_log_key),
               ("sessions stay on one replica, and hit its cache", test_sticky),
               ("one replica killed mid-run", lambda: stop_one(signal.SIGKILL)),
               ("one replica drained mid-run", lambda: stop_one(signal.SIGTERM))])
    print("session affinity test passed")


if __name__ == "__main__":
    main()
