#!/usr/bin/env python3
"""test_serve_json.py: structured output of `spectree serve` end to end on stories260K, against
three servers: plain decoding, NGRAM and STANDALONE (the model as its own draft) verifying fixed
trees:
- 50 generated JSON schemas (nested objects, arrays with bounds, enums, integers, numbers,
  booleans, strings with lengths and patterns, anyOf) through response_format json_schema on
  /v1/chat/completions and json_schema on /v1/completions, greedy and seeded: the speculative
  servers' text equals the plain server's, and every answer that finished ("stop") parses as
  JSON valid against its schema (python3-jsonschema);
- response_format json_object gives a JSON object; a GBNF grammar on /v1/completions (curl) and
  SGLang's /generate with sampling_params.ebnf and json_schema keep to their grammar;
- max_tokens too small to finish the JSON ends with finish_reason "length" (a prefix);
- unsupported schema keywords, bad GBNF, two constraints at once and regex are a 400 naming the
  field and the feature;
- the official openai npm client (tests/serve/openai_json.mjs) with response_format json_schema.
Usage: test_serve_json.py BUILD_DIR SOURCE_DIR"""
import json
import os
import random
import re
import subprocess
import sys

import jsonschema

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Fail, Server, check, curl, metrics, run_tests  # noqa

BUILD, SRC = sys.argv[1:3]
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "6"]
servers = {}
WORDS = ["name", "age", "pet", "color", "size", "tags", "kind", "id", "ok", "score", "items",
         "friend", "home", "toy"]


def post(name, path, body):
    code, text = curl(servers[name].url + path, body)
    check(code == 200, "%s %s %s: %d %s" % (name, path, json.dumps(body)[:300], code, text))
    return json.loads(text)


def gen_schema(rng, depth):
    """A random schema the converter supports, with bounded strings and arrays so that a tiny
    model finishes its JSON within max_tokens."""
    kinds = ["string", "integer", "number", "boolean", "enum", "pattern", "null", "anyof"]
    if depth < 2:
        kinds += ["object", "array", "object"]
    k = rng.choice(kinds)
    if k == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(3, 8)}
    if k == "integer" or k == "number" or k == "boolean" or k == "null":
        return {"type": k}
    if k == "enum":
        return {"enum": rng.sample(["red", "blue", "cat", "dog", 3, True, None, "a b"],
                                   rng.randint(1, 4))}
    if k == "pattern":
        return {"type": "string", "pattern": rng.choice(
            ["^[a-z]{1,5}$", "^[A-Z][a-z]{0,4}$", "^\\d{2}-\\d{2}$", "^(yes|no)$",
             "^[a-f0-9]{4}$", "^ab?c{1,3}$"])}
    if k == "anyof":
        return {"anyOf": [gen_schema(rng, 2), gen_schema(rng, 2)]}
    if k == "array":
        lo = rng.randint(0, 1)
        return {"type": "array", "items": gen_schema(rng, depth + 1), "minItems": lo,
                "maxItems": lo + rng.randint(0, 2)}
    keys = rng.sample(WORDS, rng.randint(1, 4))
    props = {key: gen_schema(rng, depth + 1) for key in keys}
    req = [key for key in keys if rng.random() < 0.6]
    return {"type": "object", "properties": props, "required": req,
            "additionalProperties": False}


def schemas():
    rng = random.Random(2024)
    out = []
    while len(out) < 50:
        s = gen_schema(rng, 0)
        if s.get("type") == "object":  # objects at the top, as OpenAI requires
            out.append(s)
    return out


def test_schemas():
    finished = 0
    for i, schema in enumerate(schemas()):
        temp = 0 if i % 2 == 0 else 0.8
        if i % 3 == 2:
            path = "/v1/completions"
            body = {"prompt": "Once upon a time", "json_schema": schema}
        else:
            path = "/v1/chat/completions"
            body = {"messages": [{"role": "user", "content": "Tell me about a cat as JSON."}],
                    "response_format": {"type": "json_schema", "json_schema": {
                        "name": "s%d" % i, "schema": schema, "strict": True}}}
        body.update(max_tokens=400, temperature=temp, seed=i)
        answers = []
        for name in ("plain", "ngram", "standalone"):
            d = post(name, path, body)
            c = d["choices"][0]
            answers.append((c["text"] if "text" in c else c["message"]["content"],
                            c["finish_reason"]))
        check(answers[1] == answers[0] and answers[2] == answers[0],
              "schema %d: speculative answers differ: %r" % (i, answers))
        text, why = answers[0]
        if why == "stop":
            try:
                value = json.loads(text)
            except ValueError as e:
                raise Fail("schema %d: %r is not JSON (%s)\n%s" % (i, text, e, json.dumps(schema)))
            try:
                jsonschema.validate(value, schema)
            except jsonschema.ValidationError as e:
                raise Fail("schema %d: %r is not valid: %s\n%s" % (i, text, e.message,
                                                                    json.dumps(schema)))
            finished += 1
        else:
            check(why == "length", "schema %d: finish_reason %s" % (i, why))
    print("  %d of 50 schemas: JSON finished and valid" % finished)
    check(finished >= 45, "only %d of 50 answers finished within max_tokens" % finished)
    # the trees were verified and drafts accepted (generated tokens beyond one per step)
    for name in ("ngram", "standalone"):
        m = metrics(servers[name].url)
        check(m["spectree_spec_steps_total"] > 0, "%s verified no tree" % name)
        check(m["spectree_generation_tokens_total"] >
              m["spectree_spec_steps_total"] + m["spectree_plain_steps_total"],
              "%s accepted no draft" % name)


def test_json_object_and_gbnf():
    chat = {"messages": [{"role": "user", "content": "A story as JSON"}], "max_tokens": 300,
            "temperature": 0, "response_format": {"type": "json_object"}}
    texts = [post(n, "/v1/chat/completions", chat)["choices"][0] for n in servers]
    check(all(t == texts[0] for t in texts), "json_object: answers differ")
    if texts[0]["finish_reason"] == "stop":
        check(isinstance(json.loads(texts[0]["message"]["content"]), dict), "not an object")
    gbnf = ('root ::= "Once upon a time, " name " was " [a-z]+ (" " [a-z]+){0,6} "."\n'
            'name ::= "Lily" | "Tom" | "Ben"\n')
    body = {"prompt": "Tell me a story.", "grammar": gbnf, "max_tokens": 80, "temperature": 0}
    outs = [post(n, "/v1/completions", body)["choices"][0] for n in servers]
    check(all(o == outs[0] for o in outs), "gbnf: answers differ")
    t = outs[0]["text"]
    check(outs[0]["finish_reason"] == "stop", "gbnf: did not finish: %r" % t)
    check(re.fullmatch(r"Once upon a time, (Lily|Tom|Ben) was [a-z]+( [a-z]+){0,6}\.", t),
          "gbnf: %r" % t)
    # SGLang's /generate: ebnf and json_schema (a string, as SGLang takes it)
    for sp in ({"ebnf": gbnf}, {"json_schema": json.dumps(schemas()[0])}):
        sp.update(max_new_tokens=300, temperature=0)
        outs = [post(n, "/generate", {"text": "Once", "sampling_params": sp})["text"]
                for n in servers]
        check(all(o == outs[0] for o in outs), "/generate %s: answers differ" % list(sp)[0])
        if "ebnf" in sp:
            check(re.fullmatch(r"Once upon a time, (Lily|Tom|Ben) was [a-z]+( [a-z]+){0,6}\.",
                               outs[0]), "/generate ebnf: %r" % outs[0])
        else:
            jsonschema.validate(json.loads(outs[0]), schemas()[0])


def test_length_cut():
    schema = {"type": "object", "properties": {"story": {"type": "string", "maxLength": 200}},
              "required": ["story"], "additionalProperties": False}
    body = {"prompt": "Once", "max_tokens": 6, "temperature": 0, "json_schema": schema}
    c = post("ngram", "/v1/completions", body)["choices"][0]
    check(c["finish_reason"] == "length", "cut: %s" % c)
    check(c["text"].replace(" ", "").startswith('{"sto'), "cut: %r is not the JSON's start" % c["text"])


def test_bad_requests():
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"n": {"type": "number", "minimum": 3}}}}}},
         "response_format.json_schema.schema", "'minimum' at /properties/n"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "string", "pattern": "(a)\\1"}}}},
         "response_format.json_schema.schema", "escape '\\1'"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "patternProperties": {"a": {}}}}}},
         "response_format.json_schema.schema", "'patternProperties'"),
        ({"response_format": {"type": "yaml"}}, "response_format", "'yaml' is not supported"),
        ({"grammar": "root ::= (\"a\""}, "grammar", "not closed with ')'"),
        ({"grammar": "root ::= \"a\"", "json_schema": {"type": "integer"}}, "json_schema",
         "give one of"),
        ({"regex": "[0-9]+"}, "regex", "'regex' is not supported"),
    ]
    for path, base in (("/v1/chat/completions", chat),
                       ("/v1/completions", {"prompt": "x", "max_tokens": 4})):
        for extra, param, msg in cases:
            code, text = curl(servers["ngram"].url + path, dict(base, **extra))
            check(code == 400, "%s %s: %d %s" % (path, extra, code, text))
            e = json.loads(text)["error"]
            check(e["param"] == param and msg in e["message"], "%s %s: %s" % (path, extra, e))
    code, text = curl(servers["ngram"].url + "/generate", {
        "text": "x", "sampling_params": {"json_schema": "{\"type\": \"object\", \"not\": {}}"}})
    check(code == 400 and "'not'" in text and
          json.loads(text)["error"]["param"] == "sampling_params.json_schema",
          "/generate: %d %s" % (code, text))


def test_openai_client():
    node_dir = os.path.join(SRC, "tests", "serve")
    if not os.path.isdir(os.path.join(node_dir, "node_modules", "openai")):
        raise Fail("the openai npm package is not installed in tests/serve/node_modules: run "
                   "scripts/deps.sh (it runs npm install there)")
    env = dict(os.environ, SPECTREE_PLAIN_URL=servers["plain"].url + "/v1",
               SPECTREE_SPEC_URL=servers["standalone"].url + "/v1", SPECTREE_MODEL="stories")
    r = subprocess.run(["node", os.path.join(node_dir, "openai_json.mjs")], env=env,
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
        run_tests([("json: 50 schemas, speculation equals plain, valid JSON", test_schemas),
                   ("json: json_object, GBNF and /generate", test_json_object_and_gbnf),
                   ("json: max_tokens cuts with finish_reason length", test_length_cut),
                   ("json: unsupported features are a 400 naming them", test_bad_requests),
                   ("json: the openai npm client", test_openai_client)])


if __name__ == "__main__":
    main()
