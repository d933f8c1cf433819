#!/usr/bin/env python3
"""test_serve_spec.py: the per-request `speculative` field of `spectree serve`. A server with
NGRAM speculation and a fixed tree (K 2, S 3, N 8) takes a busy batch of 12 concurrent
requests: some with speculation off ({"enabled": false}, and `false` on SGLang's /generate),
some capped ({"num_draft_tokens": 2} or 3), the rest the server's. Every text equals what
`spectree generate` prints (plain decoding) for its parameters; the "off" requests' meta_info
shows no speculative step while the others speculate in the same batch; a cap of n nodes never
accepts more than n - 1 drafts a step. Bad values are refused with a 400 naming the field.
Usage: test_serve_spec.py BUILD_DIR SOURCE_DIR"""
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server, check, curl, generate, run_tests  # noqa: E402

BUILD, SRC = sys.argv[1:3]
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
N_GEN = 64
PROMPTS = ["Once upon a time", "The little dog", "Lily had a red ball", "Tom and Sue went"]
# (prompt index, temperature, seed, speculative field or None, endpoint)
CASES = [(i % 4, 0.0 if i % 2 == 0 else 0.8, 7 + i,
          [None, {"enabled": False}, {"num_draft_tokens": 2}, {"num_draft_tokens": 3},
           None, {"enabled": True}][i % 6], "/v1/completions") for i in range(10)] + \
        [(0, 0.0, 0, False, "/generate"), (2, 0.0, 0, None, "/generate")]


def body(case):
    p, temp, seed, spec, path = case
    if path == "/generate":
        b = {"text": PROMPTS[p], "sampling_params": {
            "max_new_tokens": N_GEN, "temperature": temp, "sampling_seed": seed, "top_k": -1}}
    else:
        b = {"prompt": PROMPTS[p], "max_tokens": N_GEN, "temperature": temp, "seed": seed,
             "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    if spec is not None:
        b["speculative"] = spec
    return b


def main():
    want = {}
    for p, temp, seed, _, _ in CASES:
        if (p, temp, seed) not in want:
            want[(p, temp, seed)] = generate(BUILD, MODEL, PROMPTS[p], N_GEN, temp=temp, seed=seed)
    with Server(BUILD, MODEL, "--speculative-algorithm", "NGRAM", "--speculative-eagle-topk", "2",
                "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8",
                "--max-running-requests", "16") as srv:
        def busy_batch():
            results = [None] * len(CASES)

            def one(i):
                results[i] = curl(srv.url + CASES[i][4], body(CASES[i]), timeout=300)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(CASES))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            spec_others = 0
            for i, (case, res) in enumerate(zip(CASES, results)):
                p, temp, seed, spec, path = case
                check(res and res[0] == 200, "request %d: %s" % (i, res))
                d = json.loads(res[1])
                text = d["text"] if path == "/generate" else d["choices"][0]["text"]
                check(text == want[(p, temp, seed)], "request %d (%s) differs from plain: %r vs %r"
                      % (i, spec, text[:60], want[(p, temp, seed)][:60]))
                mi = d["meta_info"]
                off = spec is False or (isinstance(spec, dict) and spec.get("enabled") is False)
                if off:
                    check(mi["spec_steps"] == 0 and mi["plain_steps"] > 0,
                          "request %d is off but %s" % (i, mi))
                else:
                    spec_others += mi["spec_steps"]
                cap = spec.get("num_draft_tokens") if isinstance(spec, dict) else None
                if cap:
                    check(len(mi["spec_accept_histogram"]) <= cap,
                          "request %d (cap %d) accepted more: %s" % (i, cap, mi))
            check(spec_others > 0, "no request speculated")
            print("  %d requests, the others' speculative steps %d" % (len(CASES), spec_others))

        def bad_values():
            for spec, field, msg in [
                    ({"num_draft_tokens": 0}, "speculative.num_draft_tokens", "must be in"),
                    ({"num_draft_tokens": 65}, "speculative.num_draft_tokens", "must be in"),
                    ({"num_draft_tokens": "4"}, "speculative.num_draft_tokens", "integer"),
                    ({"enabled": 0}, "speculative.enabled", "boolean"),
                    ({"max_tree": 4}, "speculative", "unknown field 'speculative.max_tree'"),
                    ("off", "speculative", "a boolean or an object")]:
                for path in ("/v1/completions", "/generate"):
                    b = {"prompt": "x", "max_tokens": 4} if path != "/generate" else \
                        {"text": "x", "sampling_params": {"max_new_tokens": 4}}
                    b["speculative"] = spec
                    code, text = curl(srv.url + path, b)
                    check(code == 400, "%s %r: %d %s" % (path, spec, code, text))
                    e = json.loads(text)
                    e = e.get("error", e)
                    check(msg in e["message"] and e.get("param") == field,
                          "%s %r: %s" % (path, spec, e))

        try:
            run_tests([("a busy batch with per-request speculation", busy_batch),
                       ("bad speculative values", bad_values)])
        except SystemExit:
            sys.stdout.write("--- server log ---\n" + srv.log_text()[-3000:])
            raise
    print("speculative field test passed")


if __name__ == "__main__":
    main()
