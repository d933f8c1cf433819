#!/usr/bin/env python3
"""ttft.py: what the prefix cache saves. Starts `spectree serve` on a model (the extra server
flags given with --args), then for each of --reps rounds sends a streamed completion whose
prompt is a new prefix of about --prefix-tokens tokens (the round's number first, so no two
rounds share it) and then the same prefix with another tail. Prints the time to the first
token of both (medians over the rounds), their ratio, and the cached tokens the second
reported (usage.prompt_tokens_details.cached_tokens). Greedy, --max-tokens tokens each.

    python3 tools/serve/ttft.py -m models/stories260K.gguf [--args "-c 4096 -t 2"] \\
        [--prefix-tokens 2000] [--reps 5] [--max-tokens 8] [--json]

Python 3 standard library only."""
import argparse
import http.client
import json
import os
import shlex
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import Srv  # noqa: E402

SENTENCE = ("Once upon a time, there was a little girl named Lily. She liked to play with her "
            "red ball in the park. ")


def post(port, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            sys.exit("ttft: %s: status %d: %s" % (path, r.status, data[:300].decode()))
        return json.loads(data)
    finally:
        conn.close()


def streamed(port, prompt, max_tokens):
    """(seconds to the first token's event, cached tokens, prompt tokens) of one request."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            sys.exit("ttft: status %d: %s" % (r.status, r.read()[:300].decode()))
        first, usage = None, None
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            d = json.loads(line[6:])
            if first is None and any(c.get("text") for c in d.get("choices", [])):
                first = time.perf_counter() - t0
            if d.get("usage"):
                usage = d["usage"]
        if first is None or usage is None:
            sys.exit("ttft: a stream ended without a token or without usage")
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return first, cached, usage["prompt_tokens"]
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser(prog="ttft.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                    "build"))
    ap.add_argument("--args", default="-c 4096", help="flags for `spectree serve`")
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    a = ap.parse_args()
    if a.prefix_tokens < 64 or a.reps < 1 or a.max_tokens < 1:
        ap.error("--prefix-tokens must be >= 64, --reps and --max-tokens >= 1")
    srv = Srv(a.build, a.model, shlex.split(a.args), 0)
    try:
        n = len(post(srv.port, "/tokenize", {"content": SENTENCE})["tokens"])
        prefix = SENTENCE * max(1, -(-a.prefix_tokens // n))
        t1, t2, cached, n_prompt = [], [], [], 0
        for r in range(a.reps):
            p = "The big dog %d ran. " % r + prefix
            s, _, n_prompt = streamed(srv.port, p, a.max_tokens)
            t1.append(s)
            s, c, _ = streamed(srv.port, p + "Lily smiled.", a.max_tokens)
            t2.append(s)
            cached.append(c)
            print("ttft: round %d/%d: %.1f ms, then %.1f ms (%d cached)" %
                  (r + 1, a.reps, t1[-1] * 1e3, t2[-1] * 1e3, c), file=sys.stderr, flush=True)
    finally:
        srv.stop()
    m1, m2 = statistics.median(t1), statistics.median(t2)
    out = {"model": os.path.basename(a.model), "args": a.args, "prompt_tokens": n_prompt,
           "reps": a.reps, "ttft_first_ms": m1 * 1e3, "ttft_second_ms": m2 * 1e3,
           "ratio": m2 / m1, "cached_tokens": min(cached)}
    if a.json:
        print(json.dumps(out))
    else:
        print("| model | prompt tokens | TTFT, new prefix | TTFT, cached prefix | ratio | "
              "cached tokens |")
        print("| --- | --- | --- | --- | --- | --- |")
        print("| %s (%s) | %d | %.1f ms | %.1f ms | %.1f%% | %d |" %
              (out["model"], a.args, n_prompt, out["ttft_first_ms"], out["ttft_second_ms"],
               100 * out["ratio"], out["cached_tokens"]))


if __name__ == "__main__":
    main()
