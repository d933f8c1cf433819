#!/usr/bin/env python3
"""test_serve.py: `spectree serve` end to end on stories260K, driven with curl and with the
official `openai` npm package (tests/serve/openai_client.mjs under Debian's nodejs):
- the endpoints: /health, /v1/models, /metrics (Prometheus names), the bearer check; keep-alive
  and pipelining after every kind of answer;
- completions and chat, greedy and seeded sampling, stop strings, token-id prompts: the text
  equals `spectree generate` with the same parameters (the server speculates with NGRAM);
- streaming: the deltas add up to the non-streamed text, usage chunk, [DONE];
- the routes users script against: /completions and /chat/completions without /v1,
  /v1/models/ID (404 in OpenAI's shape), llama-server's /tokenize, /detokenize and /props,
  SGLang's /generate, /server_info and /get_model_info, each with its bad input refused;
- the neutral fields (user, metadata, store, tools: [], n: 1, logit_bias: {}, penalties at 0,
  ...) are accepted and change nothing; values that would change the answer and are not
  implemented (n: 2, an unknown response_format, a tool), and penalties or biases out of range, are refused
  with a 400 naming the field (curl and the openai npm client; the penalties themselves are
  test_serve_penalty.py's);
- errors: malformed bodies, wrong types, unknown fields, invalid UTF-8, bad numbers, oversized
  bodies and prompts each get their status and an OpenAI error object; so do malformed request
  lines, a %00 in the path, a missing Host and two different Content-Length headers (400);
- faults: a client that disconnects mid-stream frees its sequence, one that only half-closes
  after its request gets its answer; a client that sends its
  request a byte at a time is dropped without taking a slot; a client that stops reading a
  stream has its request cancelled --timeout after the socket buffers fill, while other streams
  run; SIGTERM lets running requests finish, then the server exits 0; requests still running at
  --drain-timeout or at a second signal are answered 503 (a stream: an error event and
  [DONE]); SIGHUP drains as SIGTERM does;
- logprobs (chat's logprobs/top_logprobs, completions' logprobs N), streamed and not: the
  tokens make the text, the values sorted and <= 0, the same bits from a plain server and
  from NGRAM and EAGLE servers verifying fixed trees;
- chat templates from a GGUF and from a Hugging Face directory's tokenizer_config.json (its
  list-of-templates form too); an unknown one is a startup error; none: ChatML, with a warning;
- logging: the start-up lines, one line per request, auto's drafting state when it changes (and
  its gauges in /metrics), --log-level, --log-format json (every line an object, the request's
  fields by name); --cors (the origin on answers and streams, preflights answered 204, other
  origins not); llama.cpp's flags (-np,
  -n -1, GPU-only flags) and SPECTREE_ARG_<FLAG> variables on a running server;
- memory: a server with a drafter idles near the plain one's memory, and one whose drafters do
  not fit beside the target is refused at start;
- limits: a full queue or a request over the KV budget answers 503, connections past
  --max-connections are closed; one address cannot fill them (--max-connections-per-ip),
  silent sockets are closed after 2 s, a spare connection answers /health on a full server.
Usage: test_serve.py BUILD_DIR SOURCE_DIR"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import (Conn, Fail, Server, check, curl, generate, gguf_with_template,  # noqa
                        http_request, metrics, run_tests, sse_events)

BUILD, SRC = sys.argv[1:3]
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
KEY = "sekrit-key"
PROMPT = "Once upon a time"

srv = None


def post(path, body, key=KEY, **kw):
    return curl(srv.url + path, body, key=key, **kw)


def completion(body):
    code, text = post("/v1/completions", body)
    check(code == 200, "completions: %d %s" % (code, text))
    return json.loads(text)


def test_endpoints():
    code, text = curl(srv.url + "/health")
    check(code == 200 and json.loads(text)["status"] == "ok", "/health: %d %s" % (code, text))
    code, text = curl(srv.url + "/v1/models", key=KEY)
    check(code == 200, "/v1/models: %d" % code)
    d = json.loads(text)
    check(d["object"] == "list" and d["data"][0]["id"] == "stories", "/v1/models: %s" % text)
    m = metrics(srv.url)
    for name in ["spectree_queue_depth", "spectree_running_sequences",
                 "spectree_prompt_tokens_total", "spectree_generation_tokens_total",
                 "spectree_time_to_first_token_seconds_count",
                 "spectree_time_per_output_token_seconds_count",
                 'spectree_spec_accept_length_bucket{le="+Inf"}', "spectree_verify_seconds_total",
                 "spectree_draft_seconds_total"]:
        check(name in m, "/metrics lacks " + name)
    code, text = curl(srv.url + "/nowhere")
    check(code == 404 and "no such endpoint" in text, "404: %d %s" % (code, text))
    code, text = curl(srv.url + "/v1/completions", key=KEY)  # GET
    check(code == 405, "GET /v1/completions: %d" % code)
    code, text = curl(srv.url + "/health", method="POST", raw=b"{}")
    check(code == 405, "POST /health: %d" % code)


def test_keep_alive():
    # every answer keeps the connection open: 1,000 GETs on one connection, then a GET with
    # three requests pipelined after it (a GET, a completion and a 404) are all answered
    c = Conn(srv.port)
    paths = ["/health", "/metrics", "/v1/models", "/nowhere"]
    for i in range(1000):
        path = paths[i % 4]
        c.send(http_request("GET", path, key=KEY))
        code, h, _ = c.response()
        check(code == (404 if path == "/nowhere" else 200), "GET %s #%d: %d" % (path, i, code))
        check(h.get("connection", "").lower() != "close", "GET %s #%d closes" % (path, i))
    c.send(http_request("POST", "/health", {}))  # 405
    check(c.response()[0] == 405, "POST /health on a kept connection")
    c.send(http_request("GET", "/health") + http_request("GET", "/v1/models", key=KEY) +
           http_request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 4,
                                                    "temperature": 0}, key=KEY) +
           http_request("GET", "/nowhere"))
    codes = [c.response()[0] for _ in range(4)]
    check(codes == [200, 200, 200, 404], "pipelined after a GET: %s" % codes)
    check(not c.closed(0.3), "the connection closed after the pipelined requests")
    c.close()


def test_auth():
    for key in [None, "wrong", KEY + "x", KEY[:-1]]:
        code, text = post("/v1/completions", {"prompt": "x", "max_tokens": 1}, key=key)
        check(code == 401, "key %r: %d" % (key, code))
        e = json.loads(text)["error"]
        check(e["type"] == "authentication_error" and "API key" in e["message"], text)
    code, _ = curl(srv.url + "/v1/models")
    check(code == 401, "/v1/models without a key: %d" % code)
    for scheme in ("bearer", "BEARER", "Bearer "):  # the scheme is case-insensitive
        code, text = curl(srv.url + "/v1/models", headers=["Authorization: %s %s" % (scheme, KEY)])
        check(code == 200, "Authorization: %s KEY: %d %s" % (scheme, code, text))


def test_bad_requests():
    # what HTTP refuses and MHD lets through: 400 with an error object, the connection closed
    body = b'{"prompt": "x", "max_tokens": 1}'
    auth = b"Authorization: Bearer " + KEY.encode() + b"\r\n"
    cases = [
        ("two different Content-Length headers",
         b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: 32\r\n"
         b"Content-Length: 30\r\n\r\n" + body, "Content-Length"),
        ("a method that is not a token", b"G@T /health HTTP/1.1\r\nHost: x\r\n\r\n", "method"),
        ("control bytes for a method", b"\x01\x02 /health HTTP/1.1\r\nHost: x\r\n\r\n",
         "method"),
        ("a target that is not a path", b"GET health HTTP/1.1\r\nHost: x\r\n\r\n", "target"),
        ("%00 in the path", b"GET /health%00 HTTP/1.1\r\nHost: x\r\n\r\n", "NUL"),
        ("%00 inside the path", b"GET /v1/mo%00dels HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n",
         "NUL"),
        ("HTTP/1.1 without Host", b"GET /health HTTP/1.1\r\n\r\n", "Host"),
    ]
    for what, raw, word in cases:
        c = Conn(srv.port, timeout=10)
        c.send(raw)
        try:
            code, _, text = c.response()
        except (EOFError, OSError) as e:
            raise Fail("%s: no answer (%s)" % (what, e))
        check(code == 400, "%s: %d %s" % (what, code, text[:200]))
        e = json.loads(text)["error"]
        check(e["type"] == "invalid_request_error" and word in e["message"], "%s: %s" % (what, e))
        check(c.closed(5), "%s: the connection stays open" % what)
        c.close()
    # the same Content-Length twice, HTTP/1.0 without Host: served
    c = Conn(srv.port)
    c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: 32\r\n"
           b"Content-Length: 32\r\n\r\n" + body)
    check(c.response()[0] == 200, "the same Content-Length twice")
    c.close()
    c = Conn(srv.port)
    c.send(b"GET /health HTTP/1.0\r\n\r\n")
    check(c.response()[0] == 200, "HTTP/1.0 without Host")
    c.close()


def test_completions_equal_generate():
    cases = [dict(temp=0.0), dict(temp=0.8, seed=1), dict(temp=1.0, seed=99, top_k=40),
             dict(temp=0.7, seed=5, top_p=0.9, min_p=0.05)]
    for c in cases:
        want = generate(BUILD, MODEL, PROMPT, 64, **c)
        body = {"model": "stories", "prompt": PROMPT, "max_tokens": 64,
                "temperature": c["temp"], "top_k": c.get("top_k", 0),
                "top_p": c.get("top_p", 1.0), "min_p": c.get("min_p", 0.0)}
        if "seed" in c:
            body["seed"] = c["seed"]
        d = completion(body)
        ch = d["choices"][0]
        check(ch["text"] == want, "%s: server %r != generate %r" % (c, ch["text"], want))
        check(d["object"] == "text_completion" and d["id"].startswith("cmpl-"), str(d))
        u = d["usage"]
        check(u["prompt_tokens"] == 5 and u["total_tokens"] ==
              u["prompt_tokens"] + u["completion_tokens"], "usage %s" % u)
        check(ch["finish_reason"] in ("length", "stop"), str(ch))
        mi = d["meta_info"]
        check(mi["spec_verify_ct"] >= 1 and mi["spec_accept_length"] >= 1, "meta_info %s" % mi)
        if ch["finish_reason"] == "length":
            check(u["completion_tokens"] == 64, "length with %d tokens" % u["completion_tokens"])


def test_stop_and_ids():
    want = generate(BUILD, MODEL, PROMPT, 100, stops=["Lily", "park"])
    d = completion({"prompt": PROMPT, "max_tokens": 100, "temperature": 0,
                    "stop": ["Lily", "park"]})
    check(d["choices"][0]["text"] == want, "stop: %r != %r" % (d["choices"][0]["text"], want))
    check(d["choices"][0]["finish_reason"] == "stop", "finish_reason with a stop string")
    ids = subprocess.run([os.path.join(BUILD, "spectree"), "tokenize", "-m", MODEL, "--add-bos",
                          PROMPT], capture_output=True, check=True).stdout.split()
    d2 = completion({"prompt": [int(i) for i in ids], "max_tokens": 30, "temperature": 0})
    d1 = completion({"prompt": PROMPT, "max_tokens": 30, "temperature": 0})
    check(d1["choices"][0]["text"] == d2["choices"][0]["text"], "token-id prompt differs")


def test_chat():
    # Llama 2's template on a vocabulary without chat tokens: BOS + "[INST] ... [/INST]"
    want = generate(BUILD, MODEL, "[INST] Tell me a story [/INST]", 48, temp=0.9, seed=3)
    code, text = post("/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "Tell me a story"}],
                       "max_tokens": 48, "temperature": 0.9, "seed": 3})
    check(code == 200, "chat: %d %s" % (code, text))
    d = json.loads(text)
    msg = d["choices"][0]["message"]
    check(msg["role"] == "assistant" and msg["content"] == want,
          "chat %r != generate %r" % (msg["content"], want))
    check(d["object"] == "chat.completion", str(d))
    code, text = post("/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "a"},
                                    {"role": "user", "content": "b"}]})
    check(code == 400 and "alternating" in text, "bad role order: %d %s" % (code, text))


def test_streaming():
    for path, body in [("/v1/completions", {"prompt": PROMPT}),
                       ("/v1/chat/completions", {"messages": [{"role": "user",
                                                               "content": "Hi"}]})]:
        body = dict(body, max_tokens=40, temperature=0.8, seed=11)
        code, text = post(path, body)
        check(code == 200, "%s: %d" % (path, code))
        whole = json.loads(text)
        code, text = post(path, dict(body, stream=True, stream_options={"include_usage": True}))
        check(code == 200, "%s stream: %d" % (path, code))
        ev = sse_events(text)
        chat = "chat" in path
        pieces = []
        for e in ev[:-1]:
            check(len(e["choices"]) == 1, "chunk %s" % e)
            c = e["choices"][0]
            pieces.append(c["delta"].get("content", "") if chat else c["text"])
        got = "".join(pieces)
        want = whole["choices"][0]["message"]["content" ] if chat else whole["choices"][0]["text"]
        check(got == want, "%s: stream %r != whole %r" % (path, got, want))
        if chat:
            check(ev[0]["choices"][0]["delta"].get("role") == "assistant", "first delta")
        fin = [e for e in ev if e["choices"] and e["choices"][0]["finish_reason"]]
        check(len(fin) == 1 and fin[0]["choices"][0]["finish_reason"] ==
              whole["choices"][0]["finish_reason"], "finish chunk")
        check("meta_info" in fin[0], "meta_info in the final chunk")
        check(ev[-1]["choices"] == [] and ev[-1]["usage"] == whole["usage"],
              "usage chunk %s vs %s" % (ev[-1], whole["usage"]))
        code, text = post(path, dict(body, stream=True))
        check(all("usage" not in e for e in sse_events(text)), "usage without include_usage")


def test_errors():
    cases = [
        (b'{"prompt": "x",', 400, "malformed JSON"),
        (b"", 400, "malformed JSON"),
        (b'{"prompt": "\xff\xfe"}', 400, "malformed JSON"),
        (b'{"prompt": "x", "prompt": "y"}', 400, "malformed JSON"),
        (b'{"prompt": ["a", "b"]}', 400, "one prompt"),
        (b'{"prompt": 12}', 400, "must be a string"),
        (b'{"prompt": "x", "max_tokens": "9"}', 400, "must be an integer"),
        (b'{"prompt": "x", "max_tokens": -5}', 400, "must be in"),
        (b'{"prompt": "x", "max_tokens": 1e999}', 400, "malformed JSON"),
        (b'{"prompt": "x", "max_tokens": 100000}', 400, "at most"),
        (b'{"prompt": "x", "max_tokens": 2047}', 400, "maximum context length"),
        (b'{"prompt": "x", "temperature": -1}', 400, "must be in"),
        (b'{"prompt": "x", "seed": -1}', 400, "must be in"),
        (b'{"prompt": "x", "frobnicate": true}', 400, "unknown field"),
        (b'{"prompt": [1, 99999]}', 400, "not a token id"),
        (b'{"prompt": "' + b"word " * 3000 + b'"}', 400, "at most"),
        # too long to be worth tokenizing: refused by its length
        (b'{"prompt": "' + b"word " * 12000 + b'"}', 400,
         "the prompt has more than 1024 tokens; this server takes at most 1024"),
        (b'{"prompt": "' + b"x" * 70000 + b'"}', 413, "exceeds"),
        (b'{"prompt": "x", "max_tokens": 99999999999999999999}', 400, "too big integer"),
        (b'{"prompt": "x", "seed": 1e300}', 400, "must be an integer"),
        (b'{"prompt": "x", "top_p": NaN}', 400, "malformed JSON"),
        (b'{"prompt": "x", "top_p": 1.5}', 400, "must be in"),
        (b'{"prompt": "x\\u0000y"}', 400, "malformed JSON"),
        (b'{"prompt": "\\ud800"}', 400, "malformed JSON"),
        (b'[1, 2]', 400, "must be a JSON object"),
    ]
    chat = [
        (b'{"messages": "hi"}', 400, "must be an array"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', 400, "must be system"),
        (b'{"messages": [{"role": "user", "content": 5}]}', 400, "content"),
        (b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', 400, "malformed JSON"),
        (b'{"messages": [{"role": "user", "content": "' + b"word " * 12000 + b'"}]}', 400,
         "the prompt has more than 1024 tokens; this server takes at most 1024"),
    ]
    for raw, want_code, want, path in [(r, c, w, "completions") for r, c, w in cases] + \
            [(r, c, w, "chat/completions") for r, c, w in chat]:
        code, text = post("/v1/" + path, None, raw=raw)
        check(code == want_code, "%r: %d (want %d) %s" % (raw[:40], code, want_code, text))
        e = json.loads(text)["error"]
        check(want in e["message"] and e["type"], "%r: %s" % (raw[:40], e))
    m = metrics(srv.url)
    check(m['spectree_http_requests_total{code="400"}'] >= len(cases) - 1, "400s counted")


# Fields that do not change the answer at these values, accepted; each changes nothing
NEUTRAL_BOTH = [("user", "u-1"), ("metadata", {"team": "a"}), ("store", True),
                ("store", False), ("service_tier", "auto"), ("logit_bias", {}), ("n", 1),
                ("presence_penalty", 0), ("frequency_penalty", 0.0), ("logprobs", None)]
NEUTRAL_COMPLETION = [("echo", False), ("suffix", None), ("suffix", ""), ("best_of", 1),
                      ("logprobs", None)]
NEUTRAL_CHAT = [("parallel_tool_calls", True), ("response_format", {"type": "text"}),
                ("tools", []), ("tool_choice", "none"), ("tool_choice", "auto"),
                ("modalities", ["text"]), ("logprobs", False)]
# Values that would change the answer and are not implemented: 400 naming the field
REFUSED_BOTH = [("n", 17), ("n", 0), ("max_tokens", 0), ("presence_penalty", 2.5), ("frequency_penalty", -3),
                ("logit_bias", {"42": 500}), ("logit_bias", {"999999": 1}), ("min_tokens", -1)]
REFUSED_COMPLETION = [("echo", 1), ("suffix", " The end."), ("best_of", 17)]
REFUSED_CHAT = [("response_format", {"type": "xml"}),
                ("response_format", {"type": "json_object", "strict": True}),
                ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
                ("tool_choice", "required"), ("modalities", ["text", "audio"])]


def test_neutral_fields():
    base = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    cbase = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 12,
             "temperature": 0}
    want = completion(base)["choices"][0]["text"]
    code, text = post("/v1/chat/completions", cbase)
    check(code == 200, "chat: %d %s" % (code, text))
    cwant = json.loads(text)["choices"][0]["message"]["content"]
    for path, b, fields, refused, get in [
            ("/v1/completions", base, NEUTRAL_BOTH + NEUTRAL_COMPLETION,
             REFUSED_BOTH + REFUSED_COMPLETION, lambda d: d["choices"][0]["text"]),
            ("/v1/chat/completions", cbase, NEUTRAL_BOTH + NEUTRAL_CHAT,
             REFUSED_BOTH + REFUSED_CHAT, lambda d: d["choices"][0]["message"]["content"])]:
        w = want if "chat" not in path else cwant
        for k, v in fields:
            code, text = post(path, dict(b, **{k: v}))
            check(code == 200, "%s %s=%r: %d %s" % (path, k, v, code, text))
            check(get(json.loads(text)) == w, "%s %s=%r changed the answer" % (path, k, v))
        # all of them at once, and streamed with stream_options
        allf = dict(b, **{k: v for k, v in fields})
        code, text = post(path, allf)
        check(code == 200 and get(json.loads(text)) == w, "%s all neutral: %s" % (path, text))
        code, text = post(path, dict(allf, stream=True, stream_options={
            "include_usage": True, "include_obfuscation": False}))
        ev = sse_events(text)
        check(code == 200 and ev[-1]["usage"]["completion_tokens"] == 12,
              "%s streamed with every neutral field: %s" % (path, ev[-1]))
        for k, v in refused:
            code, text = post(path, dict(b, **{k: v}))
            check(code == 400, "%s %s=%r: %d, want 400" % (path, k, v, code))
            e = json.loads(text)["error"]
            check(e["param"] == k and k in e["message"] and e["type"] == "invalid_request_error",
                  "%s %s=%r: %s" % (path, k, v, e))
    # a chat field on completions (and back) stays an unknown field
    for path, b, k, v in [("/v1/completions", base, "tools", []),
                          ("/v1/chat/completions", cbase, "echo", False)]:
        code, text = post(path, dict(b, **{k: v}))
        check(code == 400 and "unknown field" in text and json.loads(text)["error"]["param"] == k,
              "%s %s: %d %s" % (path, k, code, text))


def test_routes():
    # OpenAI's routes without /v1 (llama-server's), a model by id, 404 in OpenAI's shape
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0}
    want = completion(body)["choices"][0]["text"]
    code, text = post("/completions", body)
    check(code == 200 and json.loads(text)["choices"][0]["text"] == want, "/completions: %s" % text)
    cbody = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0}
    code, text = post("/chat/completions", cbody)
    code1, text1 = post("/v1/chat/completions", cbody)
    check(code == code1 == 200 and json.loads(text)["choices"][0]["message"] ==
          json.loads(text1)["choices"][0]["message"], "/chat/completions: %s" % text)
    for path in ("/v1/models/stories", "/models/stories"):
        code, text = curl(srv.url + path, key=KEY)
        d = json.loads(text)
        check(code == 200 and d["id"] == "stories" and d["object"] == "model", "%s: %s" % (path, text))
    code, text = curl(srv.url + "/v1/models/gpt-4o", key=KEY)
    e = json.loads(text)["error"]
    check(code == 404 and e["code"] == "model_not_found" and e["param"] == "model" and
          "gpt-4o" in e["message"] and e["type"] == "invalid_request_error", "unknown model: %s" % text)
    code, text = curl(srv.url + "/models")
    check(code == 401, "/models without the key: %d" % code)
    # llama-server's /tokenize and /detokenize
    ids = [int(i) for i in subprocess.run(
        [os.path.join(BUILD, "spectree"), "tokenize", "-m", MODEL, PROMPT],
        capture_output=True, check=True).stdout.split()]
    code, text = post("/tokenize", {"content": PROMPT})
    check(code == 200 and json.loads(text) == {"tokens": ids}, "/tokenize: %s vs %s" % (text, ids))
    code, text = post("/tokenize", {"content": PROMPT, "add_special": True})
    check(code == 200 and json.loads(text)["tokens"] == [1] + ids, "/tokenize add_special: %s" % text)
    code, text = post("/tokenize", {"content": PROMPT, "with_pieces": True})
    pieces = json.loads(text)["tokens"]
    check([p["id"] for p in pieces] == ids and "".join(p["piece"] for p in pieces) == " " + PROMPT,
          "/tokenize with_pieces: %s" % text)
    code, text = post("/tokenize", {"content": ""})
    check(code == 200 and json.loads(text) == {"tokens": []}, "/tokenize of nothing: %s" % text)
    code, text = post("/detokenize", {"tokens": [1] + ids})
    check(code == 200 and json.loads(text) == {"content": PROMPT}, "/detokenize: %s" % text)
    code, text = post("/detokenize", {"tokens": []})
    check(code == 200 and json.loads(text) == {"content": ""}, "/detokenize of nothing: %s" % text)
    for path, b, field in [("/tokenize", {}, "content"), ("/tokenize", {"content": 5}, "content"),
                           ("/tokenize", {"content": "x", "add_special": "yes"}, "add_special"),
                           ("/tokenize", {"content": "x", "frob": 1}, "frob"),
                           ("/detokenize", {"tokens": [1, 512]}, "tokens"),
                           ("/detokenize", {"tokens": [-1]}, "tokens"),
                           ("/detokenize", {"tokens": [1.5]}, "tokens"),
                           ("/detokenize", {"tokens": "abc"}, "tokens"),
                           ("/detokenize", {}, "tokens")]:
        code, text = post(path, b)
        check(code == 400 and json.loads(text)["error"]["param"] == field,
              "%s %s: %d %s" % (path, b, code, text))
    code, text = post("/tokenize", None, raw=b'{"content": "x",')
    check(code == 400 and "malformed JSON" in text, "/tokenize malformed: %s" % text)
    code, text = curl(srv.url + "/tokenize", key=KEY)
    check(code == 405, "GET /tokenize: %d" % code)
    code, _ = curl(srv.url + "/tokenize", {"content": "x"})
    check(code == 401, "/tokenize without the key: %d" % code)
    # /props (llama-server) and /server_info (SGLang)
    code, text = curl(srv.url + "/props", key=KEY)
    p = json.loads(text)
    check(code == 200 and p["total_slots"] == 4 and p["n_ctx"] == 2048 and
          p["chat_template"] == "llama-2" and p["model_alias"] == "stories" and
          p["speculative"]["algorithm"] == "NGRAM" and p["speculative"]["tree"] == "auto" and
          p["default_generation_settings"]["params"]["temperature"] == 1.0 and
          p["steps"]["speculative"] + p["steps"]["plain"] > 0, "/props: %s" % text)
    for path in ("/server_info", "/get_server_info"):
        code, text = curl(srv.url + path, key=KEY)
        i = json.loads(text)
        check(code == 200 and i["context_length"] == 2048 and i["max_running_requests"] == 4 and
              i["speculative_algorithm"] == "NGRAM" and i["served_model_name"] == "stories" and
              i["internal_states"][0]["avg_spec_accept_length"] >= 1, "%s: %s" % (path, text))
    code, text = curl(srv.url + "/get_model_info", key=KEY)
    check(code == 200 and json.loads(text)["is_generation"] is True, "/get_model_info: %s" % text)
    # SGLang's /generate: the completion's text, meta_info with the counts and spec fields
    code, text = post("/generate", {"text": PROMPT, "sampling_params": {
        "max_new_tokens": 10, "temperature": 0, "n": 1, "repetition_penalty": 1.0}})
    d = json.loads(text)
    mi = d.get("meta_info", {})
    check(code == 200 and d["text"] == want and mi["prompt_tokens"] == 5 and
          mi["completion_tokens"] == 10 and mi["finish_reason"] == {"type": "length", "length": 10}
          and mi["spec_verify_ct"] >= 1 and "spec_accept_length" in mi and
          "spec_accept_histogram" in mi, "/generate: %s" % text)
    code, text = post("/generate", {"input_ids": [1] + ids,
                                    "sampling_params": {"max_new_tokens": 10, "temperature": 0}})
    check(code == 200 and json.loads(text)["text"] == want, "/generate input_ids: %s" % text)
    # return_logprob: SGLang's [logprob, id, text] triples, the values of /v1/completions'
    code, text = post("/generate", {"text": PROMPT, "return_logprob": True, "top_logprobs_num": 2,
                                    "return_text_in_logprobs": True,
                                    "sampling_params": {"max_new_tokens": 10, "temperature": 0}})
    mi = json.loads(text)["meta_info"]
    lp = completion(dict(body, logprobs=2))["choices"][0]["logprobs"]
    out, tops = mi["output_token_logprobs"], mi["output_top_logprobs"]
    check(code == 200 and [o[0] for o in out] == lp["token_logprobs"] and
          [o[2] for o in out] == lp["tokens"] and all(len(t) == 2 and t[0][1] == o[1] and
                                                      t[0][0] == o[0] for t, o in zip(tops, out))
          and [{t[2]: t[0] for t in tt} for tt in tops] == lp["top_logprobs"],
          "/generate return_logprob: %s vs %s" % (mi, lp))
    code, text = post("/generate", {"text": PROMPT, "return_logprob": True,
                                    "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    mi = json.loads(text)["meta_info"]
    check(code == 200 and [o[2] for o in mi["output_token_logprobs"]] == [None] * 3 and
          mi["output_top_logprobs"] == [None] * 3, "/generate return_logprob, no text: %s" % mi)
    stop_want = generate(BUILD, MODEL, PROMPT, 100, stops=["Lily"])
    code, text = post("/generate", {"text": PROMPT, "sampling_params": {
        "max_new_tokens": 100, "temperature": 0, "stop": ["Lily"]}})
    d = json.loads(text)
    check(code == 200 and d["text"] == stop_want and
          d["meta_info"]["finish_reason"] == {"type": "stop", "matched": "Lily"},
          "/generate stop: %s" % text)
    code, text = post("/generate", {"text": PROMPT})
    mi = json.loads(text)["meta_info"]
    check(code == 200 and (mi["completion_tokens"] == 128 or mi["finish_reason"]["type"] == "stop"),
          "/generate default max_new_tokens: %s" % text[:300])
    for b, field in [({"sampling_params": {}}, "text"), ({"text": ["a", "b"]}, "text"),
                     ({"text": "x", "input_ids": [1]}, "input_ids"),
                     ({"input_ids": [1, 99999]}, "input_ids"),
                     ({"text": "x", "sampling_params": {"max_new_tokens": 2047}},
                      "sampling_params.max_new_tokens"),
                     ({"text": "x", "stream": True}, "stream"),
                     ({"text": "x", "logprob_start_len": 0}, "logprob_start_len"),
                     ({"text": "x", "top_logprobs_num": 21}, "top_logprobs_num"),
                     ({"text": "x", "sampling_params": {"temperature": -1}},
                      "sampling_params.temperature"),
                     ({"text": "x", "sampling_params": {"max_new_tokens": 0}},
                      "sampling_params.max_new_tokens"),
                     ({"text": "x", "sampling_params": {"frequency_penalty": 3}},
                      "sampling_params.frequency_penalty"),
                     ({"text": "x", "sampling_params": {"ignore_eos": "yes"}},
                      "sampling_params.ignore_eos"),
                     ({"text": "x", "sampling_params": {"repeat_last_n": 3}},
                      "sampling_params.repeat_last_n"),
                     ({"text": "x", "sampling_params": {"max_tokens": 3}},
                      "sampling_params.max_tokens"),
                     ({"text": "x", "sampling_params": 3}, "sampling_params"),
                     ({"text": "x", "prompt": "y"}, "prompt")]:
        code, text = post("/generate", b)
        e = json.loads(text)["error"]
        check(code == 400 and e["param"] == field, "/generate %s: %d %s" % (b, code, text))


def test_openai_client():
    node_dir = os.path.join(SRC, "tests", "serve")
    if not os.path.isdir(os.path.join(node_dir, "node_modules", "openai")):
        raise Fail("the openai npm package is not installed in tests/serve/node_modules: run "
                   "scripts/deps.sh (it runs npm install there)")
    want = generate(BUILD, MODEL, PROMPT, 32)
    env = dict(os.environ, SPECTREE_URL=srv.url + "/v1", SPECTREE_KEY=KEY,
               SPECTREE_WANT=want, SPECTREE_MODEL="stories")
    r = subprocess.run(["node", os.path.join(node_dir, "openai_client.mjs")], env=env,
                       capture_output=True, timeout=300)
    sys.stdout.write(r.stdout.decode())
    check(r.returncode == 0, "openai client: " + r.stderr.decode()[-3000:])


def raw_request(body, stream_first=False):
    """A socket speaking HTTP/1.1 by hand (for the fault tests)."""
    s = socket.create_connection(("127.0.0.1", srv.port))
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
              KEY.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: " +
              str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def wait_metric(name, pred, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        v = metrics(srv.url).get(name, 0)
        if pred(v):
            return v
        time.sleep(0.05)
    raise Fail("%s did not reach the expected value in %d s (now %s)" % (name, seconds, v))


def test_disconnect():
    key = 'spectree_requests_finished_total{reason="cancelled"}'
    before = metrics(srv.url).get(key, 0)
    s = raw_request({"prompt": PROMPT, "max_tokens": 2000, "temperature": 0.9, "seed": 1,
                     "stream": True})
    got = s.recv(4096)
    check(b"200 OK" in got, "stream start: %r" % got[:100])
    s.close()
    wait_metric(key, lambda v: v >= before + 1, 10)
    wait_metric("spectree_running_sequences", lambda v: v == 0, 10)
    # a non-streamed request whose client leaves is cancelled too
    s = raw_request({"prompt": PROMPT, "max_tokens": 2000, "temperature": 0.9, "seed": 2})
    wait_metric("spectree_running_sequences", lambda v: v >= 1, 10)
    s.close()
    wait_metric(key, lambda v: v >= before + 2, 10)
    wait_metric("spectree_running_sequences", lambda v: v == 0, 10)


def test_half_close():
    # a client that closes its write side after a whole request (nc -N, socat, some proxies)
    # still reads: it gets its answer, streamed or not, and its request is not cancelled
    key = 'spectree_requests_finished_total{reason="cancelled"}'
    before = metrics(srv.url).get(key, 0)
    want = generate(BUILD, MODEL, PROMPT, 200)
    for stream in (False, True):
        c = Conn(srv.port)
        c.send(http_request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 200,
                                                        "temperature": 0, "stream": stream},
                            key=KEY))
        c.sock.shutdown(socket.SHUT_WR)
        try:
            code, _, body = c.response()
        except (EOFError, OSError) as e:
            raise Fail("half-closed client, stream %s: no answer (%s)" % (stream, e))
        c.close()
        check(code == 200, "half-closed client, stream %s: %d" % (stream, code))
        text = body.decode()
        got = ("".join(e["choices"][0]["text"] for e in sse_events(text)) if stream
               else json.loads(text)["choices"][0]["text"])
        check(got == want, "half-closed client, stream %s: the text differs" % stream)
    check(metrics(srv.url).get(key, 0) == before, "a half-closed client's request was cancelled")


def test_slow_client():
    # headers, then the body a byte every 0.3 s: the server drops it after --timeout (3 s)
    # without giving it a slot, and serves others meanwhile
    for phase in ("body", "headers"):
        s = socket.create_connection(("127.0.0.1", srv.port))
        body = json.dumps({"prompt": PROMPT, "max_tokens": 4}).encode()
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        trickle = body if phase == "body" else head + body
        if phase == "body":
            s.sendall(head)
        t0 = time.time()
        dropped = False
        for b in trickle:
            try:
                s.sendall(bytes([b]))
            except OSError:
                dropped = True
                break
            if time.time() - t0 > 1 and time.time() - t0 < 1.5:
                d = completion({"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
                check(d["choices"][0]["finish_reason"] == "length", "served meanwhile")
                check(metrics(srv.url)["spectree_running_sequences"] == 0, "slow client slot")
            time.sleep(0.3)
            s.settimeout(0.01)
            try:
                if s.recv(1) == b"":
                    dropped = True
                    break
            except socket.timeout:
                pass
            except OSError:
                dropped = True
                break
        elapsed = time.time() - t0
        s.close()
        check(dropped, "a client trickling its %s was not dropped" % phase)
        check(2.5 < elapsed < 8, "dropped after %.1f s (timeout 3 s)" % elapsed)


def test_sigterm_drain():
    global srv
    results = {}

    # (long answers, EOS ignored: a story that ended early finished before the signal, and
    # nothing was left to drain)
    def run(i):
        code, text = post("/v1/completions", {"prompt": PROMPT, "max_tokens": 1900,
                                              "ignore_eos": True, "temperature": 0.8, "seed": i,
                                              "stream": True})
        results[i] = (code, text)

    key = 'spectree_requests_total{endpoint="completions"}'
    accepted = metrics(srv.url)[key]
    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    wait_metric(key, lambda v: v >= accepted + 3, 30)  # all three accepted, the last just now
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    code, text = post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    check(code in (0, 503) or "Connection refused" in text or code >= 500,
          "a request after SIGTERM: %d %s" % (code, text))
    for t in threads:
        t.join(120)
    rc = srv.stop(timeout=60)
    check(rc == 0, "exit status %d after SIGTERM" % rc)
    for i, (code, text) in results.items():
        check(code == 200, "drained request %d: %d" % (i, code))
        ev = sse_events(text)
        fin = [e for e in ev if e["choices"] and e["choices"][0]["finish_reason"]]
        check(len(fin) == 1, "drained request %d has no final chunk" % i)
        want = generate(BUILD, MODEL, PROMPT, 1900, temp=0.8, seed=i, extra=["--ignore-eos"])
        got = "".join(e["choices"][0]["text"] for e in ev)
        check(got == want, "drained request %d: text differs from generate" % i)
    m = re.search(r"draining \(no new requests; (\d+) in flight\)", srv.log_text())
    check(m and int(m.group(1)) >= 1, "nothing was in flight at SIGTERM: %s" % srv.log_text())


def test_drain_cut():
    # requests still running at --drain-timeout are answered: 503 with an error object, or a
    # stream's error event and [DONE]; /metrics and the last log line count them
    with Server(BUILD, MODEL, "--drain-timeout", "1", "--max-running-requests", "2", "-c",
                "32768") as s:
        results = {}

        def run(i):
            results[i] = curl(s.url + "/v1/completions",
                              {"prompt": PROMPT, "max_tokens": 30000, "temperature": 0.9,
                               "seed": i, "stream": i == 0})

        check(metrics(s.url).get("spectree_requests_cut_total", 0) == 0, "cut before the drain")
        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.time() + 30
        while time.time() < deadline:
            m = metrics(s.url)
            if (m["spectree_running_sequences"] == 2 and
                    m['spectree_requests_total{endpoint="completions"}'] == 3):
                break
            time.sleep(0.05)
        s.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        check(s.stop(timeout=30) == 0, "exit status after the drain timeout")
        code, text = results[0]
        check(code == 200, "the cut stream: %d" % code)
        ev = sse_events(text)
        check(ev[-1].get("error", {}).get("code") == 503 and ev[-1]["error"]["message"],
              "the cut stream's last event: %r" % ev[-1])
        for i in (1, 2):
            code, text = results[i]
            check(code == 503, "cut request %d: %d %s" % (i, code, text[:200]))
            e = json.loads(text)["error"]
            check(e["type"] == "server_overloaded" and "drain timeout" in e["message"],
                  "cut request %d: %s" % (i, text))
        log = s.log_text()
        check("drain timeout: 3 requests cut" in log and "requests (3 cut)" in log, log)


def test_signals():
    # a second SIGTERM or SIGINT during a drain cuts it: the stream still running ends with an
    # error event and [DONE], the server exits 0 at once; SIGHUP drains as SIGTERM does
    for first, second in ((signal.SIGTERM, signal.SIGTERM), (signal.SIGTERM, signal.SIGINT)):
        with Server(BUILD, MODEL, "-c", "32768") as s:
            result = {}

            def run():
                result[0] = curl(s.url + "/v1/completions",
                                 {"prompt": PROMPT, "max_tokens": 30000, "temperature": 0.9,
                                  "seed": 3, "stream": True})

            t = threading.Thread(target=run)
            t.start()
            wait_until(lambda: metrics(s.url)["spectree_running_sequences"] == 1, 30)
            s.proc.send_signal(first)
            time.sleep(0.3)
            t0 = time.time()
            s.proc.send_signal(second)
            t.join(60)
            check(s.stop(timeout=30) == 0, "exit status after a second signal")
            check(time.time() - t0 < 5, "the second signal took %.1f s" % (time.time() - t0))
            code, text = result[0]
            ev = sse_events(text)
            check(code == 200 and ev[-1].get("error", {}).get("code") == 503,
                  "the stream cut by a second signal: %d %r" % (code, ev[-1]))
            check("a second signal: 1 requests cut" in s.log_text(), s.log_text())
    with Server(BUILD, MODEL) as s:
        result = {}

        def run():
            result[0] = curl(s.url + "/v1/completions",
                             {"prompt": PROMPT, "max_tokens": 300, "temperature": 0, "stream": True})

        t = threading.Thread(target=run)
        t.start()
        wait_until(lambda: metrics(s.url)['spectree_requests_total{endpoint="completions"}'] == 1,
                   30)
        s.proc.send_signal(signal.SIGHUP)
        t.join(60)
        rc = s.stop(timeout=30)
        check(rc == 0, "exit status after SIGHUP: %d" % rc)
        code, text = result[0]
        got = "".join(e["choices"][0]["text"] for e in sse_events(text))
        check(code == 200 and got == generate(BUILD, MODEL, PROMPT, 300),
              "the stream drained at SIGHUP")
        check("SIGHUP: draining" in s.log_text(), s.log_text())


def wait_until(pred, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise Fail("a condition not met in %d s" % seconds)


def test_startup_errors():
    r = subprocess.run([os.path.join(BUILD, "spectree"), "serve", "-m", MODEL, "--chat-template",
                        "vicuna"], capture_output=True, timeout=60)
    check(r.returncode == 2 and b"--chat-template expects" in r.stderr, r.stderr.decode())
    r = subprocess.run([os.path.join(BUILD, "spectree"), "serve", "--help"], capture_output=True,
                       timeout=60)
    check(r.returncode == 0 and b"--max-running-requests" in r.stdout, "serve --help")
    r = subprocess.run([os.path.join(BUILD, "spectree"), "serve", "-m", MODEL, "--port", "x"],
                       capture_output=True, timeout=60)
    check(r.returncode == 2 and b"--port" in r.stderr, r.stderr.decode())
    r = subprocess.run([os.path.join(BUILD, "spectree"), "serve", "-m", MODEL, "--port", "0",
                        "--max-queued-requests", "0"], capture_output=True, timeout=60)
    check(r.returncode == 2 and b"--max-queued-requests expects an integer in [1," in r.stderr,
          "--max-queued-requests 0: %d %s" % (r.returncode, r.stderr.decode()))
    # templates from the GGUF: a known one is used, an unknown one stops the server at start
    tmp = os.path.join(BUILD, "serve_tmpl_%d.gguf" % os.getpid())
    try:
        gguf_with_template(MODEL, tmp, "{% for message in messages %}{{'<|im_start|>' + "
                           "message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
                           "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
                           "'<|im_start|>assistant\\n' }}{% endif %}")
        with Server(BUILD, tmp) as s3:
            check("chat template chatml from tokenizer.chat_template" in s3.log_text(),
                  s3.log_text())
            # ChatML on a vocabulary without its tokens: the markers are text
            want = generate(BUILD, tmp, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                            20)
            code, text = curl(s3.url + "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "Hi"}],
                               "max_tokens": 20, "temperature": 0})
            check(code == 200, "chatml chat: %d %s" % (code, text))
            got = json.loads(text)["choices"][0]["message"]["content"]
            check(got == want, "chatml chat %r != generate %r" % (got, want))
            check(s3.stop() == 0, "exit status")
        gguf_with_template(MODEL, tmp, "{% for m in messages %}{{ m.role }}: {{ m.content }}\n"
                           "{% endfor %}")
        r = subprocess.run([os.path.join(BUILD, "spectree"), "serve", "-m", tmp, "--port", "0"],
                           capture_output=True, timeout=60)
        check(r.returncode == 1 and b"--chat-template NAME" in r.stderr, r.stderr.decode())
        r = subprocess.run([os.path.join(BUILD, "spectree"), "serve", "-m", tmp, "--port", "0",
                            "--chat-template", "zephyr", "--help"], capture_output=True,
                           timeout=60)
        check(r.returncode == 0, "--help")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    # no chat template: ChatML, as llama-server does, with a warning that names the flag
    with Server(BUILD, MODEL) as s2:
        want = generate(BUILD, MODEL, "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n",
                        20)
        code, text = curl(s2.url + "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "x"}], "max_tokens": 20,
                           "temperature": 0})
        check(code == 200, "chat without a template: %d %s" % (code, text))
        got = json.loads(text)["choices"][0]["message"]["content"]
        check(got == want, "default chatml chat %r != generate %r" % (got, want))
        log = s2.log_text()
        check("chat template chatml from the default" in log, log)
        check("warning: %s has no chat template (tokenizer.chat_template): chat requests use "
              "ChatML; choose another with --chat-template NAME" % MODEL in log, log)
        check(s2.stop() == 0, "exit status")


def test_logging_and_llama_flags():
    # start-up lines (drafter, tree bounds, kernels, memory), a line per request at the default
    # level; llama.cpp's -np, -n -1, -ngl and -fa; variables for flags the command line lacks
    env = {"SPECTREE_ARG_SERVED_MODEL_NAME": "from-env", "SPECTREE_ARG_CTX_SIZE": "300",
           "SPECTREE_ARG_PORT": "not-a-port"}  # the command line's --port 0 wins
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        s = Server(BUILD, MODEL, "-np", "2", "-n", "-1", "-ngl", "99", "-fa", "on",
                   "--speculative-algorithm", "NGRAM")
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    with s:
        log = s.log_text()
        for want in ["warning: this build runs on the CPU; --n-gpu-layers, --flash-attn ignored",
                     "drafter NGRAM", "tree: top-k ", "kernels ", "memory: weights ",
                     "KV cache at most ", "(600 positions: 2 slots of 300;",
                     "as 'from-env' on http://127.0.0.1:%d (context 300, 2 slots," % s.port]:
            check(want in log, "start-up lines lack %r: %s" % (want, log))
        check(log.count("warning") == 2, "warnings: GPU flags and the template: %s" % log)
        code, text = curl(s.url + "/v1/completions", {"prompt": PROMPT, "temperature": 0})
        check(code == 200, "completion: %d %s" % (code, text))
        d = json.loads(text)
        # -n -1: the rest of the context (or the end of text)
        u = d["usage"]
        check(u["prompt_tokens"] + u["completion_tokens"] == 300 or
              d["choices"][0]["finish_reason"] == "stop", "-n -1: %s" % u)
        deadline = time.time() + 10
        while d["id"] not in s.log_text() and time.time() < deadline:
            time.sleep(0.05)
        line = [l for l in s.log_text().splitlines() if d["id"] + ":" in l]
        check(len(line) == 1, "one log line per request: %s" % s.log_text())
        check(re.search(r"prompt 5 tokens \(0 cached\), gen %d tokens, ttft [0-9.]+ ms, [0-9.]+ tok/s, tau "
                        r"[0-9.]+, finish %s$" % (u["completion_tokens"],
                                                  d["choices"][0]["finish_reason"]), line[0]),
              line[0])
        check(s.stop() == 0, "exit status")
    # --log-level warn: no request lines; debug: the queue time and accepted drafts too
    for level, want in [("warn", None), ("debug", "queue ")]:
        with Server(BUILD, MODEL, "--log-level", level, "--speculative-algorithm", "NGRAM") as s:
            code, text = curl(s.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 8})
            check(code == 200, "completion: %d" % code)
            rid = json.loads(text)["id"]
            check(s.stop() == 0, "exit status")
            log = s.log_text()
            lines = [l for l in log.splitlines() if rid + ":" in l]
            if want is None:
                check(not lines and "drafter" not in log and "warning" in log,
                      "--log-level warn: %s" % log)
            else:
                check(len(lines) == 1 and want in lines[0] and "speculative +" in lines[0],
                      "--log-level debug: %s" % log)


def test_outlook():
    # auto's drafting state: one log line when it changes (not one per step) and two gauges.
    # The committed EAGLE head reads 0.71 of stories260K's weight bytes: auto never drafts it.
    head = os.path.join(SRC, "models", "eagle-stories260K")
    with Server(BUILD, MODEL, "--speculative-algorithm", "EAGLE",
                "--speculative-draft-model-path", head) as s:
        for _ in range(2):
            code, text = curl(s.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 30})
            check(code == 200, "completion: %d %s" % (code, text))
        m = metrics(s.url)
        check(m.get('spectree_spec_drafting{algorithm="EAGLE"}') == 0, "drafting gauge: %s" % m)
        check(m.get('spectree_spec_speedup_estimate{algorithm="EAGLE"}') == 0, "speed-up: %s" % m)
        check(m["spectree_spec_steps_total"] == 0, "speculative steps: %s" % m)
        check(s.stop() == 0, "exit status")
        log = s.log_text()
        lines = [l for l in log.splitlines() if "drafting" in l]
        check(lines == ["spectree serve: EAGLE: not drafting, the draft model reads 0.71 of the "
                        "target's weight bytes per token: speculation cannot pay here (auto "
                        "drafts only with a model below half)"], log)
    # NGRAM: its state from measured costs; the last line logged is the gauge's state, with the
    # gauge's speed-up, and the lines alternate (one per change)
    with Server(BUILD, MODEL, "--speculative-algorithm", "NGRAM") as s:
        for _ in range(3):
            code, text = curl(s.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 60})
            check(code == 200, "completion: %d %s" % (code, text))
        m = metrics(s.url)
        drafting = m.get('spectree_spec_drafting{algorithm="NGRAM"}')
        check(drafting in (0, 1), "drafting gauge: %s" % m)
        speedup = m['spectree_spec_speedup_estimate{algorithm="NGRAM"}']
        check(s.stop() == 0, "exit status")
        log = s.log_text()
        lines = [l for l in log.splitlines() if re.search(r"NGRAM: (not )?drafting", l)]
        check(lines, "no drafting state logged: %s" % log)
        for a, b in zip(lines, lines[1:]):
            check(("not drafting" in a) != ("not drafting" in b), "a line per change: %s" % log)
        want = (r"spectree serve: NGRAM: %s, the best tree \((\d+) tokens\) accepts ([0-9.]+) "
                r"drafts for a verify of ([0-9.]+) plain tokens: speculation %s ([0-9.]+)x here$"
                % (("drafting", "expected") if drafting else ("not drafting", "would be")))
        g = re.match(want, lines[-1])
        check(g, "the last state logged is not the gauge's (%s): %s" % (drafting, lines[-1]))
        check(drafting or speedup < 1.03, "backed off at an expected %.3fx" % speedup)


def test_log_format_and_cors():
    # --log-format json: every line of the server an object (time, level, msg), the request's
    # line its fields by name; --cors: the allowed origin on answers and streams, preflights
    with Server(BUILD, MODEL, "--log-format", "json", "--log-level", "debug", "--cors",
                "https://a.example,https://b.example", "--speculative-algorithm", "NGRAM",
                api_key=KEY) as s:
        code, text = curl(s.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 9,
                                                      "temperature": 0}, key=KEY)
        check(code == 200, "completion: %d %s" % (code, text))
        d = json.loads(text)
        c = Conn(s.port)
        for origin, want in [("https://b.example", "https://b.example"),
                             ("https://evil.example", None), (None, None)]:
            extra = b"Origin: " + origin.encode() + b"\r\n" if origin else b""
            c.send(http_request("GET", "/health", extra=extra))
            code, h, _ = c.response()
            check(code == 200 and h.get("access-control-allow-origin") == want and
                  h.get("vary") == "Origin", "Origin %s: %s" % (origin, h))
        # a preflight needs no key; the request after it gets the header, streamed too
        c.send(http_request("OPTIONS", "/v1/chat/completions", extra=(
            b"Origin: https://a.example\r\nAccess-Control-Request-Method: POST\r\n"
            b"Access-Control-Request-Headers: authorization, content-type\r\n")))
        code, h, body = c.response()
        check(code == 204 and h.get("access-control-allow-origin") == "https://a.example" and
              "POST" in h.get("access-control-allow-methods", "") and
              h.get("access-control-allow-headers") == "authorization, content-type" and
              body == b"", "preflight: %d %s" % (code, h))
        c.send(http_request("OPTIONS", "/nowhere", extra=b"Origin: https://a.example\r\n"))
        check(c.response()[0] == 404, "a preflight of no route")
        c.send(http_request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True},
            key=KEY, extra=b"Origin: https://a.example\r\n"))
        code, h, body = c.response()
        check(code == 200 and h.get("access-control-allow-origin") == "https://a.example" and
              body.endswith(b"data: [DONE]\n\n"), "a stream's CORS header: %s" % h)
        c.close()
        check(s.stop() == 0, "exit status")
        lines = [l for l in s.log_text().splitlines() if l.strip()]
        objs = []
        for l in lines:
            if l.startswith("{"):
                objs.append(json.loads(l))
        check(len(objs) == len(lines), "lines that are not JSON: %s" %
              [l for l in lines if not l.startswith("{")])
        check(all(isinstance(o["time"], float) and o["level"] in ("info", "warn", "debug") and
                  o["msg"] for o in objs), "the objects' fields: %s" % objs)
        check(any("on http://127.0.0.1:%d" % s.port in o["msg"] for o in objs), "address line")
        check(any(o["level"] == "warn" and "no chat template" in o["msg"] for o in objs),
              "the template warning: %s" % objs)
        req = [o for o in objs if o.get("id") == d["id"]]
        check(len(req) == 1, "one line per request: %s" % objs)
        r = req[0]
        check(r["msg"] == "request" and r["prompt_tokens"] == 5 and r["gen_tokens"] == 9 and
              r["ttft_ms"] > 0 and r["tok_s"] > 0 and r["tau"] >= 0 and r["finish"] == "length"
              and r["spec_steps"] + r["plain_steps"] >= 1 and len(r["accept_hist"]) == 17 and
              r["queue_ms"] >= 0, "the request's line: %s" % r)
    # without --cors: no header, OPTIONS is a 405
    with Server(BUILD, MODEL, "--log-level", "warn") as s:
        c = Conn(s.port)
        c.send(http_request("GET", "/health", extra=b"Origin: https://a.example\r\n"))
        code, h, _ = c.response()
        check(code == 200 and "access-control-allow-origin" not in h, "no --cors: %s" % h)
        c.send(http_request("OPTIONS", "/v1/completions"))
        check(c.response()[0] == 405, "OPTIONS without --cors")
        c.close()
    with Server(BUILD, MODEL, "--log-level", "warn", "--cors", "*") as s:
        c = Conn(s.port)
        c.send(http_request("GET", "/health", extra=b"Origin: https://x.example\r\n"))
        code, h, _ = c.response()
        check(h.get("access-control-allow-origin") == "*", "--cors '*': %s" % h)
        c.close()


def lp_requests(url):
    """The answers with logprobs that test_logprobs compares between servers: completions
    (greedy, seeded, a stop string, streamed) and chat (greedy, streamed)."""
    rep = "Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had a"
    out = []
    for body in [{"prompt": rep, "max_tokens": 48, "temperature": 0, "logprobs": 5},
                 {"prompt": PROMPT, "max_tokens": 48, "temperature": 0.8, "seed": 7,
                  "logprobs": 3},
                 {"prompt": PROMPT, "max_tokens": 100, "temperature": 0, "logprobs": 0,
                  "stop": ["Lily"]},
                 {"messages": [{"role": "user", "content": rep}], "max_tokens": 40,
                  "temperature": 0, "logprobs": True, "top_logprobs": 4},
                 {"messages": [{"role": "user", "content": "Tell me a story"}],
                  "max_tokens": 40, "temperature": 0.9, "seed": 3, "logprobs": True}]:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        code, text = curl(url + path, body)
        check(code == 200, "%s %s: %d %s" % (path, body, code, text))
        d = json.loads(text)
        code, text = curl(url + path, dict(body, stream=True))
        check(code == 200, "stream: %d" % code)
        out.append((body, d, sse_events(text)))
    return out


def streamed_logprobs(events, chat):
    """The logprobs of a stream's chunks, one entry per token, in order."""
    got = []
    for e in events:
        if e["choices"] and e["choices"][0]["logprobs"]:
            l = e["choices"][0]["logprobs"]
            got += l["content"] if chat else list(zip(l["tokens"], l["token_logprobs"],
                                                      l["top_logprobs"], l["text_offset"]))
    return got


def test_logprobs():
    # logprobs of each completion token (the target's log-softmax at its position): the same
    # bits from a plain server and from NGRAM, EAGLE and EAGLE-3 servers verifying fixed trees
    fixed = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
             "--speculative-num-draft-tokens", "6"]
    runs = {}
    for name, args in [("plain", []),
                       ("NGRAM", ["--speculative-algorithm", "NGRAM"] + fixed),
                       ("EAGLE", ["--speculative-algorithm", "EAGLE",
                                  "--speculative-draft-model-path",
                                  os.path.join(SRC, "models", "eagle-stories260K")] + fixed),
                       ("EAGLE3", ["--speculative-algorithm", "EAGLE3",
                                   "--speculative-draft-model-path",
                                   os.path.join(SRC, "models", "eagle3-stories260K")] + fixed)]:
        with Server(BUILD, MODEL, "--chat-template", "llama-2", "--log-level", "warn",
                    *args) as s:
            runs[name] = lp_requests(s.url)
    for body, d, ev in runs["plain"]:
        chat = "messages" in body
        ch = d["choices"][0]
        lp = ch["logprobs"]
        text = ch["message"]["content"] if chat else ch["text"]
        n = d["usage"]["completion_tokens"]
        top = body.get("top_logprobs", 0) if chat else body["logprobs"]
        if chat:
            toks = [e["token"] for e in lp["content"]]
            vals = [e["logprob"] for e in lp["content"]]
            tops = [[(t["token"], t["logprob"]) for t in e["top_logprobs"]] for e in lp["content"]]
            check(all(bytes(e["bytes"]) == e["token"].encode() for e in lp["content"]), "bytes")
        else:
            toks, vals = lp["tokens"], lp["token_logprobs"]
            tops = [list(t.items()) for t in lp["top_logprobs"]]
            check(lp["text_offset"] == [len("".join(toks[:i]).encode()) for i in range(len(toks))],
                  "text_offset: %s" % lp["text_offset"])
        check("".join(toks) == text, "%s: the tokens %r do not make the text %r" % (body, toks, text))
        check(len(toks) == n or body.get("stop"), "%s: %d tokens for %d" % (body, len(toks), n))
        check(all(v <= 0 for v in vals) and all(len(t) <= top for t in tops), "values %s" % vals)
        for v, t in zip(vals, tops):
            check(all(t[i][1] >= t[i + 1][1] for i in range(len(t) - 1)), "top order: %s" % t)
            check(not t or t[0][1] >= v, "the best is at least the token: %s %s" % (v, t))
            if body["temperature"] == 0 and t:
                check(t[0][1] == v, "greedy: the token is the most likely: %s %s" % (v, t))
            check(sum(2.718281828459045 ** x for _, x in t) <= 1 + 1e-6, "mass of %s" % t)
        if top:
            check(any(len(t) == top for t in tops), "%s: top lists of %d" % (body, top))
        # streamed: the chunks' logprobs add up to the whole answer's
        want = lp["content"] if chat else list(zip(lp["tokens"], lp["token_logprobs"],
                                                   lp["top_logprobs"], lp["text_offset"]))
        got = streamed_logprobs(ev, chat)
        check(got == want, "%s: streamed logprobs differ:\n%s\n%s" % (body, got, want))
    for name in ("NGRAM", "EAGLE", "EAGLE3"):
        spec = 0
        for (body, d0, ev0), (_, d1, ev1) in zip(runs["plain"], runs[name]):
            c0, c1 = d0["choices"][0], d1["choices"][0]
            check(c0["logprobs"] == c1["logprobs"] and c0.get("text") == c1.get("text") and
                  c0.get("message") == c1.get("message"),
                  "%s: %s logprobs differ from plain decoding's" % (name, body))
            check(streamed_logprobs(ev0, "messages" in body) ==
                  streamed_logprobs(ev1, "messages" in body),
                  "%s: %s streamed logprobs differ from plain decoding's" % (name, body))
            mi = d1["meta_info"]
            spec += sum(mi["spec_accept_histogram"][1:])
            check(mi["spec_steps"] > 0, "%s: no tree verified for %s" % (name, body))
        check(spec > 0, "%s accepted no draft token" % name)
    # refused: the field named
    with Server(BUILD, MODEL, "--log-level", "warn") as s:
        for path, b, field in [
                ("/v1/chat/completions", {"logprobs": "yes"}, "logprobs"),
                ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
                ("/v1/chat/completions", {"logprobs": False, "top_logprobs": -1}, "top_logprobs"),
                ("/v1/completions", {"logprobs": 21}, "logprobs"),
                ("/v1/completions", {"logprobs": True}, "logprobs"),
                ("/v1/completions", {"top_logprobs": 2}, "top_logprobs")]:
            b = dict(b, max_tokens=2)
            b.update({"messages": [{"role": "user", "content": "x"}]} if "chat" in path
                     else {"prompt": "x"})
            code, text = curl(s.url + path, b)
            check(code == 400 and json.loads(text)["error"]["param"] == field,
                  "%s %s: %d %s" % (path, b, code, text))
        code, text = curl(s.url + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "logprobs": False,
            "top_logprobs": 0})
        check(code == 200 and json.loads(text)["choices"][0]["logprobs"] is None, text)


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_hf_dir_templates():
    # -m DIR (a Hugging Face checkpoint): the template comes from tokenizer_config.json, in its
    # list-of-templates form too; an unknown one stops the server at start
    src = os.path.join(SRC, "models", "TinyStories-656K")
    with tempfile.TemporaryDirectory() as d:
        for f in os.listdir(src):
            shutil.copy(os.path.join(src, f), d)
        cfg_path = os.path.join(d, "tokenizer_config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        check("chat_template" not in cfg, "TinyStories-656K has a chat template already")
        cfg["chat_template"] = [{"name": "tool_use", "template": "{{ messages }}"},
                                {"name": "default", "template": CHATML}]
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        with Server(BUILD, d + "/") as s:
            check("chat template chatml from tokenizer.chat_template" in s.log_text(),
                  s.log_text())
            code, text = curl(s.url + "/v1/models")
            name = json.loads(text)["data"][0]["id"]
            check(code == 200 and name == os.path.basename(d), "the model's name: %r" % name)
            want = generate(BUILD, d, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                            20)
            code, text = curl(s.url + "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "Hi"}],
                               "max_tokens": 20, "temperature": 0})
            check(code == 200, "chatml chat: %d %s" % (code, text))
            got = json.loads(text)["choices"][0]["message"]["content"]
            check(got == want, "chatml chat %r != generate %r" % (got, want))
            check(s.stop() == 0, "exit status")
        cfg["chat_template"] = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        r = subprocess.run([os.path.join(BUILD, "spectree"), "serve", "-m", d, "--port", "0"],
                           capture_output=True, timeout=60)
        err = r.stderr.decode()
        check(r.returncode == 1 and "--chat-template NAME" in err and err.count("\n") == 1,
              "an unknown template in tokenizer_config.json: %d %r" % (r.returncode, err))


def test_stalled_reader():
    # a client that opens a long stream and never reads (a small receive buffer): the server's
    # writes block once the socket buffers fill; its request is cancelled (the slot freed)
    # --timeout (2 s) after that, and other streams run meanwhile. With the kernel's
    # auto-grown send buffer (megabytes) it ran on for seconds more, writing MiBs.
    with Server(BUILD, MODEL, "--max-running-requests", "4", "--timeout", "2", "-c",
                "32768") as s:
        key = 'spectree_requests_finished_total{reason="cancelled"}'
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.connect(("127.0.0.1", s.port))
        data = json.dumps({"prompt": PROMPT, "max_tokens": 30000, "temperature": 0.9,
                           "seed": 5, "stream": True}).encode()
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: " + str(len(data)).encode() +
                  b"\r\n\r\n" + data)
        t0 = time.time()

        def running():
            return metrics(s.url).get("spectree_running_sequences", 0)

        deadline = t0 + 30
        while running() < 1 and time.time() < deadline:
            time.sleep(0.05)
        results = {}

        def other(i):
            results[i] = curl(s.url + "/v1/completions",
                              {"prompt": PROMPT, "max_tokens": 100, "temperature": 0,
                               "stream": True})

        th = [threading.Thread(target=other, args=(i,)) for i in range(3)]
        for t in th:
            t.start()
        for t in th:
            t.join(60)
        want = generate(BUILD, MODEL, PROMPT, 100)
        for i in range(3):
            code, text = results.get(i, (0, ""))
            check(code == 200, "a stream beside the stalled one: %d" % code)
            got = "".join(e["choices"][0]["text"] for e in sse_events(text))
            check(got == want, "a stream beside the stalled one differs from generate")
        while metrics(s.url).get(key, 0) < 1 and time.time() - t0 < 60:
            time.sleep(0.1)
        freed = time.time() - t0
        check(metrics(s.url).get(key, 0) == 1 and running() == 0,
              "the stalled stream was not cancelled")
        # what reached the client: the socket buffers' worth, not the generation's
        c.settimeout(10)
        n = 0
        while True:
            try:
                b = c.recv(65536)
            except OSError:
                break
            if not b:
                break
            n += len(b)
        c.close()
        print("     stalled stream: cancelled after %.1f s, %d bytes delivered" % (freed, n))
        check(n < 512 * 1024, "the stalled stream was sent %d bytes before its end" % n)
        check(freed < 2 + 6, "the stalled stream held its slot %.1f s (timeout 2 s)" % freed)
        check(s.stop() == 0, "exit status")


def test_long_waits():
    # requests that wait longer than --timeout for their tokens (queued behind others) are
    # not mistaken for idle clients: every stream and answer arrives whole
    with Server(BUILD, MODEL, "--max-running-requests", "1", "--timeout", "1") as s2:
        results = {}

        def run(i):
            results[i] = curl(s2.url + "/v1/completions",
                              {"prompt": PROMPT, "max_tokens": 1500, "temperature": 0.9,
                               "seed": i, "stream": i % 2 == 0}, timeout=900)

        # 16 requests of 1500 tokens through one slot: on a quiet machine (about 10,000 tokens/s
        # on stories260K) the last ones still wait over a second, past --timeout
        threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:  # a loaded machine with the scalar kernels takes minutes
            t.join(960)
        secs = time.time() - t0
        for i, (code, text) in sorted(results.items()):
            check(code == 200, "request %d: %d %s" % (i, code, text[-200:]))
            if i % 2 == 0:
                fin = [e for e in sse_events(text) if e["choices"] and
                       e["choices"][0]["finish_reason"]]
                check(len(fin) == 1, "stream %d incomplete" % i)
            else:
                check(json.loads(text)["usage"]["completion_tokens"] > 0, "answer %d" % i)
        check(secs > 1.5, "the requests took %.1f s: too fast to wait past the timeout" % secs)
        check(s2.stop() == 0, "exit status")


def test_limits():
    # one slot, one queue place, four connections
    with Server(BUILD, MODEL, "--max-running-requests", "1", "--max-queued-requests", "1",
                "--max-connections", "4", "--max-total-tokens", "500") as s2:
        # a request larger than the KV budget can never run: 503, not a silent wait
        code, text = curl(s2.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 600})
        check(code == 503 and json.loads(text)["error"]["message"], "over budget: %d %s" %
              (code, text))
        results = []

        def run(i):
            results.append(curl(s2.url + "/v1/completions",
                                {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True,
                                 "temperature": 0.5, "seed": i}))

        # 16 requests of 400 tokens (EOS ignored: a story that ended early freed the slot
        # before the next request came, on a busy machine) through one slot and one queue
        # place: those that find both taken are refused at once (503)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        codes = sorted(c for c, _ in results)
        check(codes[0] == 200 and codes[-1] == 503, "codes %s" % codes)
        for c, text in results:
            if c == 503:
                e = json.loads(text)["error"]
                check(e["type"] == "server_overloaded" and e["message"], "503 body %s" % text)
            else:
                u = json.loads(text)
                check(u["usage"]["completion_tokens"] == 400 or
                      u["choices"][0]["finish_reason"] == "stop", "complete: %s" % u["usage"])
        # connections beyond the limit are closed at once; the server goes on serving
        idle = [socket.create_connection(("127.0.0.1", s2.port)) for _ in range(4)]
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", s2.port))
        extra.settimeout(5)
        try:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            got = extra.recv(100)
        except OSError:
            got = b""
        check(got == b"", "a connection past --max-connections was served: %r" % got)
        for sck in idle + [extra]:
            sck.close()
        time.sleep(0.3)
        code, _ = curl(s2.url + "/health")
        check(code == 200, "served after the idle connections left: %d" % code)
        check(s2.stop() == 0, "exit status")


def test_connection_limits():
    # one address cannot fill --max-connections (256): of 256 silent sockets from 127.0.0.1,
    # those past --max-connections-per-ip (default 64) are closed at once, the others 2 s after
    # they opened, though --timeout is 30 s; another address is served meanwhile
    with Server(BUILD, MODEL, "--timeout", "30") as s:
        idle = []
        for _ in range(256):
            k = socket.socket()
            k.bind(("127.0.0.1", 0))
            k.connect(("127.0.0.1", s.port))
            idle.append(k)
        t0 = time.time()
        time.sleep(0.3)
        shut = 0
        for k in idle:
            k.settimeout(0.001)
            try:
                shut += k.recv(1) == b""
            except socket.timeout:
                pass
            except OSError:
                shut += 1
        check(shut == 256 - 64, "%d of 256 silent sockets from one address closed at once" % shut)
        c = Conn(s.port, source="127.0.0.2", timeout=5)
        c.send(http_request("GET", "/health"))
        try:
            code = c.response()[0]
        except (EOFError, OSError) as e:
            raise Fail("/health from another address beside 256 idle sockets: %s" % e)
        check(code == 200, "/health beside 256 idle sockets: %d" % code)
        c.close()
        for k in idle:
            k.settimeout(max(0.1, t0 + 6 - time.time()))
            try:
                gone = k.recv(1) == b""
            except socket.timeout:
                gone = False
            except OSError:
                gone = True
            check(gone, "a silent socket still open %.1f s after it opened" % (time.time() - t0))
            k.close()
        check(time.time() - t0 < 6, "the silent sockets took %.1f s to close" % (time.time() - t0))
        check(s.stop() == 0, "exit status")
    # with --max-connections open (4 from each of two addresses, past their first request),
    # a spare connection answers /health and /metrics, other requests 503
    with Server(BUILD, MODEL, "--timeout", "30", "--max-connections", "8",
                "--max-connections-per-ip", "4") as s:
        held = []
        for src in ("127.0.0.2", "127.0.0.3"):
            for _ in range(4):
                c = Conn(s.port, source=src)
                c.send(http_request("GET", "/health"))
                check(c.response()[0] == 200, "a connection below the limits")
                held.append(c)
        for path, want in (("/health", 200), ("/metrics", 200), ("/v1/models", 503)):
            c = Conn(s.port, source="127.0.0.4", timeout=5)
            c.send(http_request("GET", path))
            try:
                code, h, body = c.response()
            except (EOFError, OSError) as e:
                raise Fail("GET %s on a full server: %s" % (path, e))
            check(code == want, "GET %s on a full server: %d %s" % (path, code, body[:200]))
            check(h.get("connection") == "close", "a spare connection kept open")
            if want == 503:
                check(b"--max-connections" in body, "the 503's message: %s" % body)
            c.close()
        for c in held:
            c.close()
        check(s.stop() == 0, "exit status")


DRAFTERS = [("EAGLE", os.path.join(SRC, "models", "eagle-stories260K")),
            ("EAGLE3", os.path.join(SRC, "models", "eagle3-stories260K")),
            ("STANDALONE", MODEL)]


def started(*args):
    """A server with these flags once /health answers: (server, seconds it took, VmRSS in kB)."""
    t0 = time.time()
    s = Server(BUILD, MODEL, *args)
    while curl(s.url + "/health")[0] != 200:
        time.sleep(0.02)
    return s, time.time() - t0, s.rss_kb()


def test_drafter_memory():
    # the drafters' context-sized memory (a head's target states and KV cache, a draft model's
    # KV cache) is committed as it is used, as the target's is: 16 slots of 65536 positions idle
    # within 50 MB of the plain server (they took 40 MB a slot when committed at start)
    flags = ("-c", "65536", "--max-running-requests", "16")
    s, secs, plain = started(*flags)
    with s:
        check(s.stop() == 0, "exit status")
    want = generate(BUILD, MODEL, PROMPT, 24)
    for algo, draft in DRAFTERS:
        s, secs, rss = started(*flags, "--speculative-algorithm", algo,
                               "--speculative-draft-model-path", draft)
        with s:
            check(rss < plain + 50 * 1024, "%s: idle VmRSS %d kB, plain %d kB" % (algo, rss, plain))
            check(secs < 10, "%s: %.1f s to start" % (algo, secs))
            check("drafters at most " in s.log_text(), s.log_text())
            code, text = curl(s.url + "/v1/completions",
                              {"prompt": PROMPT, "max_tokens": 24, "temperature": 0})
            check(code == 200, "%s: %d %s" % (algo, code, text))
            got = json.loads(text)["choices"][0]["text"]
            check(got == want, "%s: %r != generate %r" % (algo, got, want))
            check(s.stop() == 0, "exit status")
    # the start-up check counts the drafters: a context the target alone fits in this machine's
    # memory (0.7 of it) but not with a draft model (as large again) or an EAGLE-3 head (3
    # captured layers and a KV layer: 0.8 of the target's 5 layers) is refused at start
    phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    per_pos = 5 * 4 * 8 * 4 * 2  # stories260K: layers x KV heads x head_dim x f32 x (K, V)
    slots = 8
    while 0.7 * phys / (slots * per_pos) > (1 << 24):
        slots *= 2
    ctx = str(int(0.7 * phys / (slots * per_pos)))
    big = ("-c", ctx, "--max-running-requests", str(slots))
    s, secs, rss = started(*big)
    with s:
        check(s.stop() == 0, "exit status")
    for algo, draft in DRAFTERS[1:]:
        r = subprocess.run([os.path.join(BUILD, "spectree"), "serve", "-m", MODEL, "--port", "0",
                            *big, "--speculative-algorithm", algo,
                            "--speculative-draft-model-path", draft],
                           capture_output=True, timeout=60)
        err = r.stderr.decode()
        check(r.returncode == 1 and re.search(
            r"a context of %s positions x %d slots with %s drafters needs [0-9.]+ GB: [0-9.]+ GB "
            r"of the target's KV cache and scores and [0-9.]+ GB of the drafters' \([0-9.]+ MB a "
            r"slot\); this machine has [0-9.]+ GB \(use a smaller -c or fewer slots\)"
            % (ctx, slots, algo), err), "%s -c %s x %d: %d %s" % (algo, ctx, slots,
                                                                  r.returncode, err))


def main():
    global srv
    with Server(BUILD, MODEL, "--chat-template", "llama-2", "--speculative-algorithm", "NGRAM",
                "--max-running-requests", "4", "--timeout", "3", "--max-body-bytes", "65536",
                "--max-prompt-tokens", "1024", "-c", "2048", api_key=KEY,
                name="stories") as s:
        srv = s
        try:
            run_tests([("endpoints", test_endpoints), ("keep-alive and pipelining", test_keep_alive),
                       ("auth", test_auth), ("malformed requests", test_bad_requests),
                       ("completions equal generate", test_completions_equal_generate),
                       ("stop strings and token ids", test_stop_and_ids), ("chat", test_chat),
                       ("streaming", test_streaming), ("errors", test_errors),
                       ("neutral fields", test_neutral_fields),
                       ("llama.cpp's and SGLang's routes", test_routes),
                       ("openai npm client", test_openai_client),
                       ("disconnect cancels", test_disconnect),
                       ("a client that half-closes", test_half_close),
                       ("slow client", test_slow_client),
                       ("SIGTERM drains", test_sigterm_drain)])
        finally:
            if s.proc.poll() is None or s.proc.returncode not in (0, None):
                sys.stdout.write("--- server log ---\n" + s.log_text()[-4000:])
    run_tests([("startup errors", test_startup_errors),
               ("logging and llama.cpp's flags", test_logging_and_llama_flags),
               ("auto's drafting state", test_outlook),
               ("--log-format json, --cors", test_log_format_and_cors),
               ("logprobs, with and without speculation", test_logprobs),
               ("limits", test_limits),
               ("requests cut at the drain timeout", test_drain_cut),
               ("a second signal, SIGHUP", test_signals),
               ("connection limits", test_connection_limits),
               ("waits longer than --timeout", test_long_waits),
               ("a client that stops reading", test_stalled_reader),
               ("templates from a Hugging Face directory", test_hf_dir_templates),
               ("drafters' memory", test_drafter_memory)])
    print("all serve tests passed")


if __name__ == "__main__":
    main()
