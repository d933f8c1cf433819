#!/usr/bin/env python3
"""test_serve_nbest.py: several choices per request (n, best_of) and echo on stories260K, against
three servers: plain decoding, NGRAM and EAGLE (the committed models/eagle-stories260K head)
verifying fixed trees:
- n=3 with a seed: the same choices from two requests and from all three servers; choice i is
  what `spectree generate --seed SEED+i` prints (the documented rule); the choices differ from
  each other when sampling, and without a seed from request to request; greedy gives n equal
  choices; the prompt is prefilled once: the prompt tokens count once in usage and /metrics,
  and choices 2..n copy the first's cached KV (the log's "cached" and the prefix cache's hits);
- best_of=4, n=2: the two highest cumulative log-probabilities of the four choices n=4 gives
  with the same seed, in that order;
- streamed n=2 (completions and chat): deltas carry each choice's index, each with its own
  finish_reason, and add up to the non-streamed choices;
- echo: the prompt before the text; with logprobs the prompt's tokens too (the first null),
  bitwise the same from the three servers, with and without the prompt in the prefix cache, and
  equal to the log-probabilities a completion gets for the same tokens at the same positions;
  max_tokens 0 with echo scores the prompt alone;
- the limits are a 400 naming the field; the official openai npm client
  (tests/serve/openai_nbest.mjs) sees the same.
Usage: test_serve_nbest.py BUILD_DIR SOURCE_DIR"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Fail, Server, check, curl, generate, metrics, run_tests, sse_events  # noqa

BUILD, SRC = sys.argv[1:3]
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
# 43 tokens: one whole prefix-cache block of 32 (the default) for the later choices to copy
LONG = ("Once upon a time there was a little girl named Lily. She loved to play outside in the "
        "park with her friends. One day she saw a big dog")
PROMPT = "Once upon a time"
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "6"]
EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
         os.path.join(SRC, "models", "eagle-stories260K"), *TREE]
servers = {}


def post(name, path, body):
    code, text = curl(servers[name].url + path, body)
    check(code == 200, "%s %s %s: %d %s" % (name, path, body, code, text))
    return json.loads(text)


def texts(d):
    return [c["text"] if "text" in c else c["message"]["content"] for c in d["choices"]]


def test_seeded_choices():
    body = {"prompt": LONG, "max_tokens": 32, "temperature": 1.0, "seed": 11, "n": 3}
    m0 = {k: metrics(s.url) for k, s in servers.items()}
    first = post("plain", "/v1/completions", body)
    want = texts(first)
    check([c["index"] for c in first["choices"]] == [0, 1, 2], "indices: %s" % first)
    check(len(set(want)) == 3, "sampled choices are not all different: %s" % want)
    check(texts(post("plain", "/v1/completions", body)) == want, "a second request differs")
    for i, t in enumerate(want):
        cli = generate(BUILD, MODEL, LONG, 32, temp=1.0, seed=11 + i)
        check(cli == t, "choice %d: generate --seed %d %r, server %r" % (i, 11 + i, cli, t))
    for name in ("ngram", "eagle"):
        got = texts(post(name, "/v1/completions", body))
        check(got == want, "%s: %s != plain %s" % (name, got, want))
    # usage: the prompt once, every choice's tokens
    u = first["usage"]
    n_prompt = u["prompt_tokens"]
    check(n_prompt == 43, "prompt tokens %d" % n_prompt)
    check(u["completion_tokens"] == 96 and u["total_tokens"] == 43 + 96, "usage: %s" % u)
    for c in first["choices"]:
        check(c["finish_reason"] == "length", "finish_reason: %s" % c)
    # prefilled once: each request's prompt counted once; choices 2 and 3 copy the first's block
    for name, s in servers.items():
        m1 = metrics(s.url)
        reqs = 2 if name == "plain" else 1
        d = m1["spectree_prompt_tokens_total"] - m0[name].get("spectree_prompt_tokens_total", 0)
        check(d == reqs * 43, "%s: prompt tokens counted %g times" % (name, d / 43))
        hits = (m1["spectree_prefix_cache_hit_tokens_total"] -
                m0[name].get("spectree_prefix_cache_hit_tokens_total", 0))
        # the first request's choices 2, 3 (the later requests' first choice hits too)
        check(hits >= 2 * 32, "%s: prefix cache served %g tokens" % (name, hits))
    log = servers["ngram"].log_text()
    lines = re.findall(r"(cmpl-[0-9a-f]+-\d+): prompt 43 tokens \((\d+) cached\)", log)
    by_id = {}
    for rid, cached in lines:
        by_id.setdefault(rid, []).append(int(cached))
    check(len(by_id) == 1, "ngram log: %s" % by_id)
    c = sorted(next(iter(by_id.values())))
    check(c == [0, 32, 32], "ngram: the choices' cached tokens %s (want the first computed, the "
          "others copying its block)" % c)


def test_unseeded_and_greedy():
    body = {"prompt": PROMPT, "max_tokens": 32, "temperature": 1.0, "n": 3}
    a, b = texts(post("plain", "/v1/completions", body)), texts(post("plain", "/v1/completions",
                                                                     body))
    check(len(set(a)) == 3 and a != b, "without a seed: %s then %s" % (a, b))
    g = texts(post("eagle", "/v1/completions", dict(body, temperature=0, n=4)))
    one = texts(post("plain", "/v1/completions", dict(body, temperature=0, n=1)))
    check(g == one * 4, "greedy n=4: %s (want 4 x %s)" % (g, one))
    chat = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 24,
            "temperature": 0.9, "seed": 3, "n": 2}
    want = texts(post("plain", "/v1/chat/completions", chat))
    check(len(set(want)) == 2, "chat choices: %s" % want)
    for name in ("ngram", "eagle"):
        check(texts(post(name, "/v1/chat/completions", chat)) == want, "chat %s differs" % name)


def cumulative(c):
    return sum(c["logprobs"]["token_logprobs"])


def test_best_of():
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "seed": 21}
    four = post("plain", "/v1/completions", dict(body, n=4, logprobs=0))["choices"]
    ranked = sorted(four, key=lambda c: -cumulative(c))
    check(len(set(c["text"] for c in four)) == 4, "n=4: %s" % [c["text"] for c in four])
    for name in ("plain", "ngram", "eagle"):
        d = post(name, "/v1/completions", dict(body, n=2, best_of=4, logprobs=0))
        got = d["choices"]
        check([c["index"] for c in got] == [0, 1], "best_of indices: %s" % got)
        check([c["text"] for c in got] == [c["text"] for c in ranked[:2]],
              "%s best_of=4: %s, want the best two of %s" % (
                  name, [c["text"] for c in got], [(c["text"], cumulative(c)) for c in four]))
        check(cumulative(got[0]) >= cumulative(got[1]), "best_of order: %s" % got)
        check(d["usage"]["completion_tokens"] == 64, "best_of usage: %s" % d["usage"])
    # without logprobs asked for, none are shown (the ranking computes them anyway)
    d = post("plain", "/v1/completions", dict(body, n=1, best_of=4))
    check(d["choices"][0]["logprobs"] is None and
          d["choices"][0]["text"] == ranked[0]["text"], "best_of=4 n=1: %s" % d)


def test_streamed_choices():
    body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0.8, "seed": 4, "n": 2}
    want = texts(post("plain", "/v1/completions", body))
    cbody = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 20,
             "temperature": 0.8, "seed": 4, "n": 2}
    cwant = texts(post("plain", "/v1/chat/completions", cbody))
    for name in ("plain", "eagle"):
        for path, b, w, chat in (("/v1/completions", body, want, False),
                                 ("/v1/chat/completions", cbody, cwant, True)):
            code, text = curl(servers[name].url + path, dict(
                b, stream=True, stream_options={"include_usage": True}))
            check(code == 200, "%s %s stream: %d %s" % (name, path, code, text))
            ev = sse_events(text)
            got, fin = ["", ""], [None, None]
            for e in ev:
                for c in e["choices"]:
                    i = c["index"]
                    got[i] += (c["delta"].get("content") or "") if chat else c["text"]
                    if c["finish_reason"]:
                        check(fin[i] is None, "two finish_reasons for choice %d" % i)
                        fin[i] = c["finish_reason"]
            check(got == w, "%s %s streamed %s, want %s" % (name, path, got, w))
            check(fin == ["length", "length"], "%s %s finish_reasons %s" % (name, path, fin))
            check(ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] == 40,
                  "%s %s usage chunk: %s" % (name, path, ev[-1]))
    # echo streamed: the prompt comes first for each choice
    code, text = curl(servers["ngram"].url + "/v1/completions",
                      dict(body, stream=True, echo=True))
    got = ["", ""]
    for e in sse_events(text):
        for c in e["choices"]:
            got[c["index"]] += c["text"]
    check(got == [PROMPT + t for t in want], "echo streamed: %s" % got)


def test_echo():
    d = post("plain", "/v1/completions", {"prompt": PROMPT, "max_tokens": 10, "temperature": 0,
                                          "echo": True})
    plain = post("plain", "/v1/completions", {"prompt": PROMPT, "max_tokens": 10,
                                              "temperature": 0})
    check(d["choices"][0]["text"] == PROMPT + plain["choices"][0]["text"], "echo: %s" % d)
    # scoring: echo, max_tokens 0, logprobs; the prompt as token ids (the continuation's too)
    ids = json.loads(curl(servers["plain"].url + "/tokenize", {"content": PROMPT,
                                                               "add_special": True})[1])["tokens"]
    g = post("plain", "/generate", {"input_ids": ids, "sampling_params": {
        "max_new_tokens": 12, "temperature": 0}, "return_logprob": True})
    out = g["meta_info"]["output_token_logprobs"]
    gen_ids = [t[1] for t in out]
    score = {"prompt": ids + gen_ids, "max_tokens": 0, "echo": True, "logprobs": 2}
    want = post("plain", "/v1/completions", score)
    c = want["choices"][0]
    lp = c["logprobs"]
    check(c["finish_reason"] == "length" and want["usage"]["completion_tokens"] == 0,
          "scoring: %s" % want)
    check(len(lp["tokens"]) == len(ids) + 12 and lp["token_logprobs"][0] is None and
          lp["top_logprobs"][0] is None, "scoring records: %s" % lp)
    check(all(x is not None and x <= 0 for x in lp["token_logprobs"][1:]), "logprobs: %s" % lp)
    check("".join(lp["tokens"]) == c["text"], "tokens %s vs text %r" % (lp["tokens"], c["text"]))
    # the continuation's positions: the same values the completion got for its tokens
    got = lp["token_logprobs"][len(ids):]
    check(got == [t[0] for t in out], "prompt logprobs %s != the completion's %s" % (
        got, [t[0] for t in out]))
    # bitwise the same from every server, and once the prompt is in the prefix cache
    for name in ("plain", "ngram", "eagle"):
        for _ in range(2):
            d = post(name, "/v1/completions", score)
            check(d["choices"][0]["logprobs"] == lp, "%s: echo logprobs differ" % name)
            check(d["usage"]["prompt_tokens_details"]["cached_tokens"] == 0,
                  "%s: an echo with logprobs reused the cache: %s" % (name, d["usage"]))
    # with a completion after it, and n=2: each choice shows the prompt's records, then its own
    d = post("ngram", "/v1/completions", dict(score, max_tokens=6, n=2, seed=1, temperature=1))
    for ch in d["choices"]:
        r = ch["logprobs"]
        check(r["token_logprobs"][:len(lp["tokens"])] == lp["token_logprobs"] and
              len(r["tokens"]) == len(lp["tokens"]) + 6, "echo n=2: %s" % r)
        check(r["text_offset"][len(lp["tokens"])] == len(c["text"]), "offsets: %s" % r)


def test_limits():
    for body, field in [({"n": 17}, "n"), ({"n": 0}, "n"), ({"n": 3, "best_of": 2}, "best_of"),
                        ({"best_of": 17}, "best_of"), ({"best_of": 3, "stream": True}, "best_of"),
                        ({"max_tokens": 0}, "max_tokens"), ({"echo": "yes"}, "echo")]:
        code, text = curl(servers["plain"].url + "/v1/completions",
                          dict({"prompt": PROMPT, "max_tokens": 4}, **body))
        check(code == 400 and json.loads(text)["error"]["param"] == field,
              "%s: %d %s" % (body, code, text))
    code, text = curl(servers["plain"].url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "best_of": 2})
    check(code == 400 and "unknown field" in text, "chat best_of: %d %s" % (code, text))


def test_openai_client():
    node_dir = os.path.join(SRC, "tests", "serve")
    if not os.path.isdir(os.path.join(node_dir, "node_modules", "openai")):
        raise Fail("the openai npm package is not installed in tests/serve/node_modules: run "
                   "scripts/deps.sh (it runs npm install there)")
    env = dict(os.environ, SPECTREE_PLAIN_URL=servers["plain"].url + "/v1",
               SPECTREE_SPEC_URL=servers["eagle"].url + "/v1", SPECTREE_MODEL="stories")
    r = subprocess.run(["node", os.path.join(node_dir, "openai_nbest.mjs")], env=env,
                       capture_output=True, timeout=300)
    sys.stdout.write(r.stdout.decode())
    check(r.returncode == 0, "openai client: " + r.stderr.decode()[-3000:])


def main():
    # prompts prefilled 16 tokens a step: the later choices wait for the first's whole prompt
    # (they would otherwise join while its first chunk, no whole cache block, is done)
    common = ["-c", "1024", "--max-running-requests", "4", "--chat-template", "llama-2",
              "--chunked-prefill-size", "16"]
    with Server(BUILD, MODEL, *common, name="stories") as plain, \
            Server(BUILD, MODEL, *common, "--speculative-algorithm", "NGRAM",
                   "--ngram-min-match", "1", *TREE, name="stories") as ngram, \
            Server(BUILD, MODEL, *common, *EAGLE, name="stories") as eagle:
        servers.update(plain=plain, ngram=ngram, eagle=eagle)
        run_tests([("n: seeded choices everywhere, prefilled once", test_seeded_choices),
                   ("n: unseeded, greedy and chat", test_unseeded_and_greedy),
                   ("best_of: the best by cumulative logprob", test_best_of),
                   ("n: streamed with indices", test_streamed_choices),
                   ("echo: the prompt and its logprobs", test_echo),
                   ("n, best_of, echo: limits", test_limits),
                   ("n, best_of, echo: the openai npm client", test_openai_client)])
        m = metrics(eagle.url)
        check(m["spectree_spec_steps_total"] > 0, "the EAGLE server verified no tree")


if __name__ == "__main__":
    main()
