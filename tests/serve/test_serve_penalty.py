#!/usr/bin/env python3
"""test_serve_penalty.py: the penalties, biases and bans of `spectree serve` end to end on
stories260K, against three servers: plain decoding, NGRAM and STANDALONE (the model as its own
draft) verifying fixed trees:
- presence_penalty, frequency_penalty, logit_bias (a map, and llama.cpp's [[id, bias]] list),
  repetition_penalty / repeat_penalty with repeat_last_n, ignore_eos and min_tokens on
  /v1/completions, /v1/chat/completions and SGLang's /generate, greedy and seeded, streamed
  and not: the speculative servers' text equals the plain server's, token for token (their
  drafts verified and accepted: /metrics), and equals `spectree generate` with the matching
  flags; the penalties change the text (else nothing would be shown); logprobs with
  penalties are the same bits from all three;
- min_tokens holds stop strings back as it does EOS (server and generate alike);
- an invalid value gets a 400 naming the field (curl and the official openai npm client,
  tests/serve/openai_penalty.mjs, which also checks speculation on and off give one text).
Usage: test_serve_penalty.py BUILD_DIR SOURCE_DIR"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Fail, Server, check, curl, metrics, run_tests, sse_events  # noqa

BUILD, SRC = sys.argv[1:3]
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
PROMPT = "Once upon a time"
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "6"]
servers = {}


def post(name, path, body):
    code, text = curl(servers[name].url + path, body)
    check(code == 200, "%s %s %s: %d %s" % (name, path, body, code, text))
    return json.loads(text)


def text_of(path, d):
    if path == "/generate":
        return d["text"]
    if path == "/v1/completions":
        return d["choices"][0]["text"]
    return d["choices"][0]["message"]["content"]


def gen_cli(n, temp, seed, flags):
    cmd = [os.path.join(BUILD, "spectree"), "generate", "-m", MODEL, "-p", PROMPT, "-n", str(n),
           "--temp", str(temp), "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed",
           str(seed)] + flags
    r = subprocess.run(cmd, capture_output=True, timeout=300)
    check(r.returncode == 0, "generate %s: %s" % (flags, r.stderr.decode()))
    return r.stdout.decode()[:-1]


# (request fields, the matching generate flags)
CASES = [
    ({"presence_penalty": 0.8, "frequency_penalty": 0.6},
     ["--presence-penalty", "0.8", "--frequency-penalty", "0.6"]),
    ({"repetition_penalty": 1.5, "repeat_last_n": 16},
     ["--repeat-penalty", "1.5", "--repeat-last-n", "16"]),
    ({"logit_bias": {"261": -100, "300": 3}, "presence_penalty": 0.3},
     ["--logit-bias", "261=-100", "--logit-bias", "300=3", "--presence-penalty", "0.3"]),
    ({"repeat_penalty": 1.3, "repeat_last_n": -1, "logit_bias": [[261, False]],
      "frequency_penalty": 0.4, "ignore_eos": True, "min_tokens": 8},
     ["--repeat-penalty", "1.3", "--repeat-last-n", "-1", "--logit-bias", "261=-100",
      "--frequency-penalty", "0.4", "--ignore-eos", "--min-tokens", "8"]),
]


def test_equal_everywhere():
    before = {k: metrics(s.url) for k, s in servers.items()}
    for temp, seed in [(0, 0), (0.8, 7)]:
        base = {"prompt": PROMPT, "max_tokens": 48, "temperature": temp, "seed": seed,
                "top_p": 1}
        free = text_of("/v1/completions", post("plain", "/v1/completions", base))
        for fields, flags in CASES:
            body = dict(base, **fields)
            want = text_of("/v1/completions", post("plain", "/v1/completions", body))
            check(want != free, "%s at temperature %g does not change the text" % (fields, temp))
            cli = gen_cli(48, temp, seed, flags)
            check(cli == want, "%s: generate %r, server %r" % (fields, cli, want))
            for name in ("ngram", "standalone"):
                got = text_of("/v1/completions", post(name, "/v1/completions", body))
                check(got == want, "%s %s temp %g: %r != plain %r" % (name, fields, temp, got,
                                                                       want))
                code, text = curl(servers[name].url + "/v1/completions", dict(body, stream=True))
                streamed = "".join(e["choices"][0]["text"] for e in sse_events(text)
                                   if e["choices"])
                check(code == 200 and streamed == want, "%s streamed %s" % (name, fields))
            # chat, the same fields
            cbody = {"messages": [{"role": "user", "content": "Tell me a story"}],
                     "max_tokens": 40, "temperature": temp, "seed": seed, **fields}
            cwant = post("plain", "/v1/chat/completions", cbody)["choices"][0]["message"]
            for name in ("ngram", "standalone"):
                got = post(name, "/v1/chat/completions", cbody)["choices"][0]["message"]
                check(got == cwant, "chat %s %s: %r != %r" % (name, fields, got, cwant))
    # SGLang's names on /generate
    sp = {"max_new_tokens": 40, "temperature": 0, "presence_penalty": 0.5,
          "frequency_penalty": 0.5, "repetition_penalty": 1.2, "min_new_tokens": 4,
          "ignore_eos": True, "logit_bias": {"261": -100}}
    want = post("plain", "/generate", {"text": PROMPT, "sampling_params": sp})["text"]
    free = post("plain", "/generate", {"text": PROMPT, "sampling_params": {
        "max_new_tokens": 40, "temperature": 0}})["text"]
    check(want != free, "/generate: the penalties do not change the text")
    for name in ("ngram", "standalone"):
        got = post(name, "/generate", {"text": PROMPT, "sampling_params": sp})["text"]
        check(got == want, "/generate %s: %r != %r" % (name, got, want))
    # the trees were verified and drafts accepted (generated tokens beyond one per step)
    for name in ("ngram", "standalone"):
        m0, m1 = before[name], metrics(servers[name].url)
        d = {k: m1[k] - m0.get(k, 0) for k in ("spectree_spec_steps_total",
                                               "spectree_plain_steps_total",
                                               "spectree_generation_tokens_total")}
        check(d["spectree_spec_steps_total"] > 0, "%s verified no tree: %s" % (name, d))
        check(d["spectree_generation_tokens_total"] >
              d["spectree_spec_steps_total"] + d["spectree_plain_steps_total"],
              "%s accepted no draft: %s" % (name, d))


def test_min_tokens_and_stops():
    # greedy "Once upon a time" names Lily within its first 10 tokens: a stop string there ends
    # the answer early, unless min_tokens holds stop strings (and EOS) back until 20 tokens
    base = {"prompt": PROMPT, "max_tokens": 60, "temperature": 0, "stop": "Lily"}
    early = text_of("/v1/completions", post("plain", "/v1/completions", base))
    held = text_of("/v1/completions", post("plain", "/v1/completions",
                                           dict(base, min_tokens=20)))
    check(len(early) < len(held) and "Lily" in held and held.startswith(early),
          "min_tokens: %r then %r" % (early, held))
    cli = gen_cli(60, 0, 0, ["--stop", "Lily", "--min-tokens", "20"])
    check(cli == held, "min_tokens: generate %r, server %r" % (cli, held))
    for name in ("ngram", "standalone"):
        got = text_of("/v1/completions", post(name, "/v1/completions",
                                              dict(base, min_tokens=20)))
        check(got == held, "min_tokens %s: %r != %r" % (name, got, held))


def test_logprobs():
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "logprobs": 3,
            "presence_penalty": 1.0, "logit_bias": {"261": -100, "300": 2}}
    want = post("plain", "/v1/completions", body)["choices"][0]["logprobs"]
    for name in ("ngram", "standalone"):
        got = post(name, "/v1/completions", body)["choices"][0]["logprobs"]
        check(got == want, "%s: logprobs with penalties differ" % name)


def test_bad_values():
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for path, base in (("/v1/completions", {"prompt": "x", "max_tokens": 4}),
                       ("/v1/chat/completions", chat)):
        for field, value in [("presence_penalty", 2.5), ("frequency_penalty", "0.5"),
                             ("repetition_penalty", 0), ("repeat_penalty", 12),
                             ("repeat_last_n", -5), ("logit_bias", {"300": 101}),
                             ("logit_bias", {"x": 1}), ("logit_bias", {"100000": 1}),
                             ("logit_bias", [[1, 2, 3]]), ("ignore_eos", "yes"),
                             ("min_tokens", -1)]:
            code, text = curl(servers["ngram"].url + path, dict(base, **{field: value}))
            check(code == 400, "%s %s=%r: %d %s" % (path, field, value, code, text))
            e = json.loads(text)["error"]
            check(e["param"] == field and field in e["message"],
                  "%s %s=%r: %s" % (path, field, value, e))
    code, text = curl(servers["ngram"].url + "/generate", {
        "text": "x", "sampling_params": {"presence_penalty": 9}})
    check(code == 400 and json.loads(text)["error"]["param"] ==
          "sampling_params.presence_penalty", "/generate: %d %s" % (code, text))
    # {} stays accepted, and the same as leaving it out
    a = post("ngram", "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    b = post("ngram", "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                          "logit_bias": {}})
    check(text_of("/v1/completions", a) == text_of("/v1/completions", b), "logit_bias {}")


def test_openai_client():
    node_dir = os.path.join(SRC, "tests", "serve")
    if not os.path.isdir(os.path.join(node_dir, "node_modules", "openai")):
        raise Fail("the openai npm package is not installed in tests/serve/node_modules: run "
                   "scripts/deps.sh (it runs npm install there)")
    env = dict(os.environ, SPECTREE_PLAIN_URL=servers["plain"].url + "/v1",
               SPECTREE_SPEC_URL=servers["ngram"].url + "/v1", SPECTREE_MODEL="stories")
    r = subprocess.run(["node", os.path.join(node_dir, "openai_penalty.mjs")], env=env,
                       capture_output=True, timeout=300)
    sys.stdout.write(r.stdout.decode())
    check(r.returncode == 0, "openai client: " + r.stderr.decode()[-3000:])


def main():
    common = ["-c", "1024", "--max-running-requests", "4", "--chat-template", "llama-2"]
    with Server(BUILD, MODEL, *common, name="stories") as plain, \
            Server(BUILD, MODEL, *common, "--speculative-algorithm", "NGRAM",
                   "--ngram-min-match", "1", *TREE, name="stories") as ngram, \
            Server(BUILD, MODEL, *common, "--speculative-algorithm", "STANDALONE",
                   "--speculative-draft-model-path", MODEL, *TREE, name="stories") as sa:
        servers.update(plain=plain, ngram=ngram, standalone=sa)
        run_tests([("penalties: speculation equals plain and generate", test_equal_everywhere),
                   ("penalties: min_tokens holds stop strings back", test_min_tokens_and_stops),
                   ("penalties: logprobs", test_logprobs),
                   ("penalties: bad values are a 400 naming the field", test_bad_values),
                   ("penalties: the openai npm client", test_openai_client)])


if __name__ == "__main__":
    main()
