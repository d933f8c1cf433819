#!/usr/bin/env python3
"""test_serve_tools.py: tool calling in `spectree serve` end to end, through curl and the
official openai npm client, on the bundled models with each template that has tool calling:
ChatML (stories260K has no chat template: the server's default), Llama 3 (--chat-template
llama-3) and Mistral (--chat-template mistral); TinyStories-656K (a Hugging Face directory, Llama
3's template) for the prompt and a free answer only: its 2048 tokens have no '{' and no byte
fallback, so no grammar can make it write JSON:
- a full round trip (a forced call, the tool's result sent back, the final answer), streamed and
  not: finish_reason "tool_calls", content null, the call's id, name and arguments (JSON valid
  against the function's parameters, python3-jsonschema); the streamed deltas assemble to the
  same calls as the plain answer; the final answer is text (tool_choice none parses no call);
- tool_choice naming a function calls that one; "required" with parallel_tool_calls false
  exactly one call, with several allowed each call valid;
- the tools are in the prompt (more prompt tokens with them, as many with "none" as "auto");
- speculation is lossless: NGRAM and STANDALONE servers answer exactly as the plain one;
- bad tools, tool_choice and tool messages are a 400 naming the field; a template without tool
  calling (llama-2) refuses tools.
Usage: test_serve_tools.py BUILD_DIR SOURCE_DIR"""
import json
import os
import subprocess
import sys

import jsonschema

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Fail, Server, check, curl, metrics, run_tests, sse_events  # noqa

BUILD, SRC = sys.argv[1:3]
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
HF_MODEL = os.path.join(SRC, "models", "TinyStories-656K")
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "6"]
servers = {}

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "minLength": 1, "maxLength": 12},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description":
                                           "The weather in a city", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]


def post(name, body, code=200):
    got, text = curl(servers[name].url + "/v1/chat/completions", body)
    check(got == code, "%s %s: %d %s" % (name, json.dumps(body)[:300], got, text))
    return json.loads(text) if not body.get("stream") else text


def check_calls(calls, what):
    """Each call: id call_..., type function, a known name, arguments valid JSON for it."""
    check(calls, what + ": no tool_calls")
    for c in calls:
        check(c["id"].startswith("call_") and c["type"] == "function", what + ": %r" % c)
        name = c["function"]["name"]
        check(name in SCHEMAS, what + ": unknown function %r" % name)
        try:
            jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[name])
        except (ValueError, jsonschema.ValidationError) as e:
            raise Fail("%s: arguments %r: %s" % (what, c["function"]["arguments"], e))


def streamed(name, body):
    """A streamed answer assembled as a client does: content, tool_calls from the deltas (the
    first of each index with id, type and name), finish_reason."""
    content, calls, finish = "", {}, None
    for ev in sse_events(post(name, dict(body, stream=True))):
        for ch in ev["choices"]:
            d = ch["delta"]
            content += d.get("content") or ""
            for tc in d.get("tool_calls", []):
                if tc["index"] not in calls:
                    check("id" in tc and tc["type"] == "function" and "name" in tc["function"],
                          "the first delta of a call lacks id, type or name: %r" % tc)
                    calls[tc["index"]] = {"id": tc["id"], "type": "function", "function": {
                        "name": tc["function"]["name"], "arguments": ""}}
                calls[tc["index"]]["function"]["arguments"] += tc["function"].get(
                    "arguments", "")
            finish = ch["finish_reason"] or finish
    return content, [calls[i] for i in sorted(calls)], finish


def strip_ids(calls):
    return [c["function"] for c in calls or []]


def round_trip(name, stream):
    what = "%s%s" % (name, " streamed" if stream else "")
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required",
            "parallel_tool_calls": False, "max_tokens": 300, "temperature": 0}
    if stream:
        content, calls, finish = streamed(name, body)
        plain = post(name, body)["choices"][0]
        check(strip_ids(calls) == strip_ids(plain["message"]["tool_calls"]),
              what + ": the streamed calls %r differ from the answer's %r" %
              (calls, plain["message"]["tool_calls"]))
        check(content == "", what + ": content %r" % content)
    else:
        c = post(name, body)["choices"][0]
        finish, calls = c["finish_reason"], c["message"].get("tool_calls")
        check(c["message"]["content"] is None, what + ": content %r" % c["message"]["content"])
    check(finish == "tool_calls", what + ": finish_reason %s" % finish)
    check(len(calls) == 1, what + ": %d calls with parallel_tool_calls false" % len(calls))
    check_calls(calls, what)
    # the tool's result back, then the final answer
    call = calls[0]
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": calls},
                  {"role": "tool", "tool_call_id": call["id"],
                   "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    body = {"messages": msgs, "tools": TOOLS, "tool_choice": "none", "max_tokens": 40,
            "min_tokens": 2, "temperature": 0}  # a tiny model may end its answer at once
    if stream:
        content, calls2, finish = streamed(name, body)
    else:
        c = post(name, body)["choices"][0]
        content, calls2, finish = c["message"]["content"], c["message"].get("tool_calls"), \
            c["finish_reason"]
    check(finish in ("stop", "length") and not calls2, what + ": final answer %s %r" %
          (finish, calls2))
    check(isinstance(content, str) and content.strip(), what + ": final content %r" % content)
    # the result was in the prompt: a different result, a different prompt length
    b2 = dict(body, messages=msgs[:-1] + [dict(msgs[-1], content="sunny and warm all week")])
    u1, u2 = (post(name, dict(b, stream=False, max_tokens=1))["usage"]["prompt_tokens"]
              for b in (body, b2))
    check(u1 != u2, what + ": the tool result is not in the prompt (%d tokens both)" % u1)


def test_round_trip():
    for name in ("chatml", "llama3", "mistral"):
        for stream in (False, True):
            round_trip(name, stream)


def test_hf_answer():
    """TinyStories-656K after a tool result, with tool_choice auto: a text answer."""
    call = {"id": "call_1", "type": "function", "function": {
        "name": "get_time", "arguments": "{\"zone\": \"UTC\"}"}}
    body = {"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}],
            "tools": TOOLS, "max_tokens": 40, "min_tokens": 2, "temperature": 0}
    c = post("hf", body)["choices"][0]
    check(c["finish_reason"] in ("stop", "length") and c["message"]["content"].strip() and
          "tool_calls" not in c["message"], "hf: %r" % c)
    content, calls, finish = streamed("hf", body)
    check((content, calls, finish) == (c["message"]["content"], [], c["finish_reason"]),
          "hf streamed: %r, plain %r" % ((content, calls, finish), c))


def test_choices():
    for name in ("chatml", "llama3", "mistral"):
        named = {"messages": ASK, "tools": TOOLS, "max_tokens": 300, "temperature": 0.8,
                 "seed": 5, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
        c = post(name, named)["choices"][0]
        check(c["finish_reason"] == "tool_calls", "%s named: %s" % (name, c))
        check_calls(c["message"]["tool_calls"], name + " named")
        check(all(t["function"]["name"] == "get_time" for t in c["message"]["tool_calls"]),
              "%s named: %r" % (name, c["message"]["tool_calls"]))
        several = {"messages": ASK, "tools": TOOLS, "tool_choice": "required",
                   "max_tokens": 640, "temperature": 1, "seed": 11}
        c = post(name, several)["choices"][0]
        check(c["finish_reason"] == "tool_calls", "%s several: %s" % (name, c))
        check(1 <= len(c["message"]["tool_calls"]) <= (1 if name == "llama3" else 4),
              "%s: %d calls" % (name, len(c["message"]["tool_calls"])))
        check_calls(c["message"]["tool_calls"], name + " several")
        ids = [t["id"] for t in c["message"]["tool_calls"]]
        check(len(set(ids)) == len(ids), "%s: call ids repeat: %r" % (name, ids))
    for name in ("chatml", "llama3", "mistral", "hf"):
        # the tools are rendered into the prompt, with "none" as with "auto"
        n = {}
        for choice in (None, "none", "auto"):
            b = {"messages": ASK, "max_tokens": 1}
            if choice:
                b.update(tools=TOOLS, tool_choice=choice)
            n[choice] = post(name, b)["usage"]["prompt_tokens"]
        check(n["none"] == n["auto"] > n[None] + 40, "%s: prompt tokens %r" % (name, n))


def test_speculation():
    """Forced calls through the grammar, and free answers after a tool result: the speculative
    servers' answers (streamed too) equal the plain server's."""
    bodies = []
    for seed, temp in ((1, 0), (2, 0.7), (3, 1.0)):
        bodies.append({"messages": ASK, "tools": TOOLS, "tool_choice": "required",
                       "max_tokens": 400, "temperature": temp, "seed": seed})
    call = {"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}
    bodies.append({"messages": ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}],
        "tools": TOOLS, "max_tokens": 60, "temperature": 0.5, "seed": 4})
    for i, body in enumerate(bodies):
        want = post("chatml", body)["choices"][0]
        want_s = streamed("chatml", body)
        for name in ("ngram", "standalone"):
            got = post(name, body)["choices"][0]
            check(got["message"]["content"] == want["message"]["content"] and
                  strip_ids(got["message"].get("tool_calls")) ==
                  strip_ids(want["message"].get("tool_calls")) and
                  got["finish_reason"] == want["finish_reason"],
                  "body %d: %s differs from plain:\n%r\n%r" % (i, name, got, want))
            s = streamed(name, body)
            check((s[0], strip_ids(s[1]), s[2]) == (want_s[0], strip_ids(want_s[1]), want_s[2]),
                  "body %d: %s streamed differs: %r %r" % (i, name, s, want_s))
        if i < 3:
            check(want["finish_reason"] == "tool_calls", "body %d: %r" % (i, want))
    for name in ("ngram", "standalone"):  # trees were verified and drafts accepted
        m = metrics(servers[name].url)
        check(m["spectree_spec_steps_total"] > 0, "%s verified no tree" % name)
        check(m["spectree_generation_tokens_total"] >
              m["spectree_spec_steps_total"] + m["spectree_plain_steps_total"],
              "%s accepted no draft" % name)


def test_bad_requests():
    fn = {"type": "function", "function": {"name": "f"}}
    cases = [
        ({"tools": {"a": 1}}, "tools", "must be an array"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
         "tools[0].function.name", "letters, digits"),
        ({"tools": [fn, {"type": "retrieval"}]}, "tools[1].type", "must be \"function\""),
        ({"tools": [fn, fn]}, "tools[1].function.name", "tools[0] has the name 'f' too"),
        ({"tools": [fn], "tool_choice": {"type": "function", "function": {"name": "g"}}},
         "tool_choice", "names the function 'g', which is not in 'tools'"),
        ({"tools": [fn], "tool_choice": "sometimes"}, "tool_choice", "not \"sometimes\""),
        ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}}}],
          "tool_choice": "required"}, "tools",
         "'tools[0].function.parameters': json schema: 'minimum' at /properties/n"),
        ({"tools": [fn], "tool_choice": "required", "response_format": {"type": "json_object"}},
         "tool_choice", "give one of 'response_format' and 'tool_choice'"),
        ({"messages": [{"role": "tool", "content": "1"}]}, "messages", "needs 'tool_call_id'"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "type": "function",
                                                            "function": {"name": "f",
                                                                         "arguments": "{1}"}}]}]},
         "messages", "'messages[0].tool_calls[0].function.arguments' must be a JSON object"),
    ]
    for extra, param, msg in cases:
        body = dict({"messages": ASK, "max_tokens": 4}, **extra)
        code, text = curl(servers["chatml"].url + "/v1/chat/completions", body)
        check(code == 400, "%s: %d %s" % (extra, code, text))
        e = json.loads(text)["error"]
        check(e["param"] == param and msg in e["message"], "%s: %s" % (extra, e))
    # Llama 2's template has no tool calling
    code, text = curl(servers["llama2"].url + "/v1/chat/completions",
                      {"messages": ASK, "tools": TOOLS, "max_tokens": 4})
    check(code == 400 and json.loads(text)["error"]["param"] == "tools" and
          "has no tool calling" in text, "llama-2: %d %s" % (code, text))


def test_openai_client():
    node_dir = os.path.join(SRC, "tests", "serve")
    if not os.path.isdir(os.path.join(node_dir, "node_modules", "openai")):
        raise Fail("the openai npm package is not installed in tests/serve/node_modules: run "
                   "scripts/deps.sh (it runs npm install there)")
    for name in ("chatml", "llama3", "mistral"):
        env = dict(os.environ, SPECTREE_URL=servers[name].url + "/v1",
                   SPECTREE_SPEC_URL=servers["ngram"].url + "/v1", SPECTREE_MODEL="stories",
                   SPECTREE_SPEC=("1" if name == "chatml" else "0"))
        r = subprocess.run(["node", os.path.join(node_dir, "openai_tools.mjs")], env=env,
                           capture_output=True, timeout=300)
        sys.stdout.write(r.stdout.decode())
        check(r.returncode == 0, "openai client on %s: %s" % (name, r.stderr.decode()[-3000:]))


def main():
    common = ["-c", "2048", "--max-running-requests", "4"]
    with Server(BUILD, MODEL, *common, name="stories") as chatml, \
            Server(BUILD, MODEL, *common, "--speculative-algorithm", "NGRAM",
                   "--ngram-min-match", "1", *TREE, name="stories") as ngram, \
            Server(BUILD, MODEL, *common, "--speculative-algorithm", "STANDALONE",
                   "--speculative-draft-model-path", MODEL, *TREE, name="stories") as sa, \
            Server(BUILD, MODEL, *common, "--chat-template", "llama-3", name="stories") as llama3, \
            Server(BUILD, HF_MODEL, *common, "--chat-template", "llama-3", name="stories") as hf, \
            Server(BUILD, MODEL, *common, "--chat-template", "mistral", name="stories") as mis, \
            Server(BUILD, MODEL, *common, "--chat-template", "llama-2", name="stories") as l2:
        check("chat template chatml from the default" in chatml.log_text(),
              "stories260K's template: " + chatml.log_text()[-500:])
        servers.update(chatml=chatml, ngram=ngram, standalone=sa, llama3=llama3, hf=hf,
                       mistral=mis, llama2=l2)
        run_tests([("tools: round trip (call, result, answer), streamed and not", test_round_trip),
                   ("tools: named, required, several calls; tools in the prompt", test_choices),
                   ("tools: TinyStories-656K answers after a tool result", test_hf_answer),
                   ("tools: speculation equals plain decoding", test_speculation),
                   ("tools: bad tools, tool_choice and messages are a 400", test_bad_requests),
                   ("tools: the openai npm client", test_openai_client)])


if __name__ == "__main__":
    main()
