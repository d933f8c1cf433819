/*
 * test_serve.c: the socket-free side of `spectree serve` (tools/serve/api.c, tmpl.c):
 * - request checking: every field's type and range, unknown fields, malformed JSON, invalid
 *   UTF-8, NUL in strings, duplicate keys, huge numbers each refused with a message naming the
 *   field; a full valid request read back;
 * - chat templates detected from the published Jinja texts, rendered exactly as those
 *   templates render (special tokens as ids where the vocabulary has them), bad role orders
 *   refused;
 * - the stop-string matcher over text arriving in pieces, and the UTF-8 prefix check.
 * The HTTP server itself is tested end to end by tests/serve/test_serve.sh.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "serve/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse(const char *body, int chat, srv_request *r, char *err, char *param) {
    return srv_request_parse(body, strlen(body), chat, r, err, param);
}

static void test_parse_full(void **state) {
    (void)state;
    srv_request r;
    char err[SRV_ERR_CAP], param[SRV_ERR_CAP];
    const char *body =
        "{\"model\": \"m\", \"prompt\": \"Once upon\", \"max_tokens\": 7, \"temperature\": 0.5,"
        " \"top_p\": 0.9, \"top_k\": 20, \"min_p\": 0.1, \"seed\": 42, \"stop\": [\"a\", \"bc\"],"
        " \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"n\": 1,"
        " \"user\": \"u\", \"echo\": false, \"logprobs\": null, \"presence_penalty\": 0}";
    assert_int_equal(parse(body, 0, &r, err, param), 0);
    assert_string_equal(r.prompt, "Once upon");
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.sp.temp == 0.5f && r.sp.top_p == 0.9f && r.sp.min_p == 0.1f);
    assert_int_equal(r.sp.top_k, 20);
    assert_true(r.seed_set && r.sp.seed == 42);
    assert_int_equal(r.n_stops, 2);
    assert_string_equal(r.stops[1], "bc");
    assert_true(r.stream && r.include_usage);
    assert_int_equal(r.given, SRV_GIVEN_TEMP | SRV_GIVEN_TOPK | SRV_GIVEN_TOPP | SRV_GIVEN_MINP);
    srv_request_free(&r);

    /* defaults: OpenAI's sampling, no max_tokens */
    assert_int_equal(parse("{\"prompt\": \"x\"}", 0, &r, err, param), 0);
    assert_true(r.sp.temp == 1.0f && r.sp.top_p == 1.0f && r.sp.top_k == 0 && r.sp.min_p == 0);
    assert_int_equal(r.max_tokens, -1);
    assert_int_equal(r.given, 0);
    srv_request_free(&r);

    /* token ids, a one-string array, top_k -1 */
    assert_int_equal(parse("{\"prompt\": [1, 2, 3], \"top_k\": -1}", 0, &r, err, param), 0);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 3);
    assert_int_equal(r.sp.top_k, 0);
    srv_request_free(&r);
    assert_int_equal(parse("{\"prompt\": [\"abc\"]}", 0, &r, err, param), 0);
    assert_string_equal(r.prompt, "abc");
    srv_request_free(&r);

    /* choices and echo: n alone (best_of follows it), best_of above it, max_tokens 0 with echo */
    assert_int_equal(parse("{\"prompt\": \"x\", \"n\": 3}", 0, &r, err, param), 0);
    assert_true(r.n == 3 && r.best_of == 3 && !r.echo);
    srv_request_free(&r);
    assert_int_equal(parse("{\"prompt\": \"x\", \"best_of\": 5, \"n\": 2, \"echo\": true, "
                           "\"max_tokens\": 0}",
                           0, &r, err, param),
                     0);
    assert_true(r.n == 2 && r.best_of == 5 && r.echo && r.max_tokens == 0);
    srv_request_free(&r);
    assert_int_equal(parse("{\"prompt\": \"x\"}", 0, &r, err, param), 0);
    assert_true(r.n == 1 && r.best_of == 1);
    srv_request_free(&r);

    /* logprobs: completions' N alternatives, chat's boolean and top_logprobs */
    assert_int_equal(parse("{\"prompt\": \"x\", \"logprobs\": 3}", 0, &r, err, param), 0);
    assert_true(r.logprobs && r.top_logprobs == 3);
    srv_request_free(&r);
    assert_int_equal(parse("{\"prompt\": \"x\", \"logprobs\": 0}", 0, &r, err, param), 0);
    assert_true(r.logprobs && r.top_logprobs == 0);
    srv_request_free(&r);
    assert_int_equal(parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                           "\"top_logprobs\": 20, \"logprobs\": true}",
                           1, &r, err, param),
                     0);
    assert_true(r.logprobs && r.top_logprobs == 20);
    srv_request_free(&r);
    assert_int_equal(parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                           "\"logprobs\": false, \"top_logprobs\": 0}",
                           1, &r, err, param),
                     0);
    assert_true(!r.logprobs && r.top_logprobs == 0);
    srv_request_free(&r);

    /* chat: string and text-part contents */
    assert_int_equal(parse("{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\":"
                           " \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, "
                           "{\"type\": \"text\", \"text\": \"b\"}], \"name\": \"n\"}], "
                           "\"max_completion_tokens\": 3}",
                           1, &r, err, param),
                     0);
    assert_int_equal(r.n_msgs, 2);
    assert_int_equal(r.msgs[0].role, SRV_ROLE_SYSTEM);
    assert_string_equal(r.msgs[1].content, "ab");
    assert_int_equal(r.max_tokens, 3);
    srv_request_free(&r);
}

static void test_parse_errors(void **state) {
    (void)state;
    static const struct {
        int chat;
        const char *body, *want, *param;
    } cases[] = {
        {0, "", "malformed JSON", ""},
        {0, "{\"prompt\": \"x\",", "malformed JSON", ""},
        {0, "{\"prompt\": \"x\"} trailing", "malformed JSON", ""},
        {0, "[1, 2]", "must be a JSON object", ""},
        {0, "{\"prompt\": \"\xff\"}", "malformed JSON", ""},                 /* invalid UTF-8 */
        {0, "{\"prompt\": \"\xc0\x80\"}", "malformed JSON", ""},             /* overlong NUL */
        {0, "{\"prompt\": \"a\\u0000b\"}", "malformed JSON", ""},            /* NUL in a string */
        {0, "{\"prompt\": \"\\ud800\"}", "malformed JSON", ""},              /* lone surrogate */
        {0, "{\"prompt\": \"x\", \"prompt\": \"y\"}", "malformed JSON", ""}, /* duplicate */
        {0, "{\"max_tokens\": 5}", "'prompt' is required", "prompt"},
        {0, "{\"prompt\": 5}", "'prompt' must be a string", "prompt"},
        {0, "{\"prompt\": []}", "empty array", "prompt"},
        {0, "{\"prompt\": [\"a\", \"b\"]}", "one prompt per request", "prompt"},
        {0, "{\"prompt\": [1, -2]}", "token id", "prompt"},
        {0, "{\"prompt\": [1, 1.5]}", "token id", "prompt"},
        {0, "{\"prompt\": \"x\", \"bogus\": 1}", "unknown field 'bogus'", "bogus"},
        {0, "{\"prompt\": \"x\", \"messages\": []}", "unknown field 'messages'", "messages"},
        {0, "{\"prompt\": \"x\", \"max_tokens\": -1}", "'max_tokens' must be in", "max_tokens"},
        {0, "{\"prompt\": \"x\", \"max_tokens\": 0}", "only with \"echo\"", "max_tokens"},
        {0, "{\"prompt\": \"x\", \"max_tokens\": -1}", "'max_tokens' must be in", "max_tokens"},
        {1,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"max_completion_tokens\": 0}",
         "'max_completion_tokens' must be at least 1", "max_completion_tokens"},
        {0, "{\"prompt\": \"x\", \"max_tokens\": 1.5}", "must be an integer", "max_tokens"},
        {0, "{\"prompt\": \"x\", \"max_tokens\": \"5\"}", "must be an integer", "max_tokens"},
        {0, "{\"prompt\": \"x\", \"max_tokens\": 99999999999}", "must be in", "max_tokens"},
        {0, "{\"prompt\": \"x\", \"max_tokens\": 1e999}", "malformed JSON", ""},
        {0, "{\"prompt\": \"x\", \"max_tokens\": 123456789012345678901234567890}", "malformed JSON",
         ""},
        {0, "{\"prompt\": \"x\", \"temperature\": -0.1}", "'temperature' must be in",
         "temperature"},
        {0, "{\"prompt\": \"x\", \"temperature\": \"hot\"}", "must be a number", "temperature"},
        {0, "{\"prompt\": \"x\", \"temperature\": 1e300}", "must be in", "temperature"},
        {0, "{\"prompt\": \"x\", \"top_p\": 0}", "'top_p' must be in", "top_p"},
        {0, "{\"prompt\": \"x\", \"top_p\": 1.5}", "'top_p' must be in", "top_p"},
        {0, "{\"prompt\": \"x\", \"temperature\": 100.0001}", "got 100.0001", "temperature"},
        {0, "{\"prompt\": \"x\", \"top_p\": 1.0000001}", "got 1.0000001", "top_p"},
        {0, "{\"prompt\": \"x\", \"min_p\": -0.000001}", "got -1e-06", "min_p"},
        {0, "{\"prompt\": \"x\", \"min_p\": 2}", "'min_p' must be in", "min_p"},
        {0, "{\"prompt\": \"x\", \"top_k\": -2}", "'top_k' must be in", "top_k"},
        {0, "{\"prompt\": \"x\", \"seed\": -1}", "'seed' must be in", "seed"},
        {0, "{\"prompt\": \"x\", \"seed\": 1.0}", "must be an integer", "seed"},
        {0, "{\"prompt\": \"x\", \"stop\": 3}", "'stop' must be a string", "stop"},
        {0, "{\"prompt\": \"x\", \"stop\": [\"\"]}", "1..256 bytes", "stop"},
        {0, "{\"prompt\": \"x\", \"stop\": [1]}", "must be strings", "stop"},
        {0,
         "{\"prompt\": \"x\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\","
         "\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
         "at most 16", "stop"},
        {0, "{\"prompt\": \"x\", \"stream\": \"yes\"}", "must be a boolean", "stream"},
        {0, "{\"prompt\": \"x\", \"stream_options\": {\"include_usage\": true}}",
         "only allowed with", "stream_options"},
        {0, "{\"prompt\": \"x\", \"stream\": true, \"stream_options\": {\"x\": 1}}",
         "unknown field 'stream_options.x'", "stream_options"},
        {0, "{\"prompt\": \"x\", \"n\": 17}", "'n' must be in [1, 16]", "n"},
        {0, "{\"prompt\": \"x\", \"n\": 0}", "'n' must be in", "n"},
        {0, "{\"prompt\": \"x\", \"best_of\": 3, \"n\": 4}", "at least 'n'", "best_of"},
        {0, "{\"prompt\": \"x\", \"best_of\": 3, \"stream\": true}", "cannot be streamed",
         "best_of"},
        {1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"best_of\": 2}",
         "unknown field 'best_of'", "best_of"},
        {0, "{\"prompt\": \"x\", \"echo\": 1}", "must be a boolean", "echo"},
        {0, "{\"prompt\": \"x\", \"suffix\": \"end\"}", "not supported", "suffix"},
        {0, "{\"prompt\": \"x\", \"presence_penalty\": 2.5}", "must be in", "presence_penalty"},
        {0, "{\"prompt\": \"x\", \"presence_penalty\": \"1\"}", "must be a number",
         "presence_penalty"},
        {0, "{\"prompt\": \"x\", \"frequency_penalty\": 3}", "must be in", "frequency_penalty"},
        {0, "{\"prompt\": \"x\", \"repetition_penalty\": 0}", "must be > 0", "repetition_penalty"},
        {0, "{\"prompt\": \"x\", \"repeat_penalty\": 11}", "must be in", "repeat_penalty"},
        {0, "{\"prompt\": \"x\", \"repeat_last_n\": -2}", "must be in", "repeat_last_n"},
        {0, "{\"prompt\": \"x\", \"min_tokens\": -1}", "must be in", "min_tokens"},
        {0, "{\"prompt\": \"x\", \"ignore_eos\": 1}", "must be a boolean", "ignore_eos"},
        {0, "{\"prompt\": \"x\", \"logit_bias\": {\"50\": -101}}", "[-100, 100]", "logit_bias"},
        {0, "{\"prompt\": \"x\", \"logit_bias\": {\"a\": 1}}", "must be token ids", "logit_bias"},
        {0, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": \"x\"}}", "must be a number",
         "logit_bias"},
        {0, "{\"prompt\": \"x\", \"logit_bias\": [[5]]}", "pairs", "logit_bias"},
        {0, "{\"prompt\": \"x\", \"logit_bias\": 3}", "must be an object", "logit_bias"},
        {0, "{\"prompt\": \"x\", \"user\": 5}", "must be a string", "user"},
        {0, "{\"prompt\": \"x\", \"metadata\": {\"a\": 1}}", "must be strings", "metadata"},
        {0, "{\"prompt\": \"x\", \"store\": \"yes\"}", "must be a boolean", "store"},
        {0, "{\"prompt\": \"x\", \"tools\": []}", "unknown field 'tools'", "tools"},
        {0, "{\"prompt\": \"x\", \"logprobs\": 21}", "'logprobs' must be in", "logprobs"},
        {0, "{\"prompt\": \"x\", \"logprobs\": true}", "must be an integer", "logprobs"},
        {0, "{\"prompt\": \"x\", \"top_logprobs\": 1}", "unknown field", "top_logprobs"},
        {1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}",
         "needs \"logprobs\": true", "top_logprobs"},
        {1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 1}",
         "must be a boolean", "logprobs"},
        {1,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, "
         "\"top_logprobs\": 21}",
         "must be in", "top_logprobs"},
        {1,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
         "\"function\", \"function\": {\"name\": \"f g\"}}]}",
         "must be a string of 1 to 64", "tools[0].function.name"},
        {1,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": "
         "\"required\"}",
         "needs 'tools'", "tool_choice"},
        {1,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
         "{\"type\": \"xml\"}}",
         "type 'xml' is not supported", "response_format"},
        {1,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
         "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"n\", \"schema\": "
         "{\"type\": \"object\", \"properties\": {\"age\": {\"type\": \"integer\", "
         "\"minimum\": 0}}}}}}",
         "'minimum' at /properties/age is not supported", "response_format.json_schema.schema"},
        {1,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
         "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"n\"}}}",
         "is required", "response_format.json_schema.schema"},
        {0, "{\"prompt\": \"x\", \"grammar\": \"root ::= item\"}", "undefined rule 'item'",
         "grammar"},
        {0,
         "{\"prompt\": \"x\", \"grammar\": \"root ::= \\\"a\\\"\", \"response_format\": "
         "{\"type\": \"json_object\"}}",
         "give one of 'grammar' and 'response_format'", "response_format"},
        {0, "{\"prompt\": \"x\", \"regex\": \"a+\"}", "'regex' is not supported", "regex"},
        {1,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
         "\"text\"}",
         "must be an object", "response_format"},
        {1,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"modalities\": "
         "[\"text\", \"audio\"]}",
         "must be [\"text\"]", "modalities"},
        {1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"echo\": false}",
         "unknown field 'echo'", "echo"},
        {1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 40}",
         "must be in [1, 16]", "n"},
        {0, "{\"prompt\": \"x\", \"model\": 1}", "'model' must be a string", "model"},
        {1, "{\"prompt\": \"x\"}", "unknown field 'prompt'", "prompt"},
        {1, "{\"messages\": []}", "must not be empty", "messages"},
        {1, "{\"messages\": {}}", "must be an array", "messages"},
        {1, "{\"messages\": [1]}", "must be an object", "messages"},
        {1, "{\"messages\": [{\"content\": \"x\"}]}", "needs a string 'role'", "messages"},
        {1, "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", "needs 'tool_call_id'",
         "messages"},
        {1, "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", "must be system",
         "messages"},
        {1, "{\"messages\": [{\"role\": \"user\"}]}", "needs 'content'", "messages"},
        {1, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "must be a string or",
         "messages"},
        {1, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
         "only text", "messages"},
        {1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"extra\": 1}]}",
         "unknown field 'extra'", "messages"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_request r;
        char err[SRV_ERR_CAP], param[SRV_ERR_CAP];
        int rc = parse(cases[i].body, cases[i].chat, &r, err, param);
        if (rc != -1 || !strstr(err, cases[i].want) || strcmp(param, cases[i].param) != 0) {
            fprintf(stderr, "case %zu (%s): rc %d, err '%s', param '%s'\n", i, cases[i].body, rc,
                    err, param);
            fail();
        }
        assert_null(r.prompt);
        assert_null(r.msgs);
    }
}

/* Fields that leave the answer as it is are accepted at those values (and the request reads
 * as it would without them). */
static void test_parse_neutral(void **state) {
    (void)state;
    static const struct {
        int chat;
        const char *fields;
    } cases[] = {
        {0, "\"user\": \"u-1\""},
        {0, "\"metadata\": {\"k\": \"v\"}"},
        {0, "\"store\": true"},
        {0, "\"service_tier\": \"auto\""},
        {0, "\"logit_bias\": {}"},
        {0, "\"n\": 1"},
        {0, "\"best_of\": 1"},
        {0, "\"presence_penalty\": 0"},
        {0, "\"frequency_penalty\": 0.0"},
        {0, "\"logit_bias\": []"},
        {0, "\"repetition_penalty\": 1, \"ignore_eos\": false, \"min_tokens\": 0"},
        {0, "\"echo\": false"},
        {0, "\"suffix\": \"\""},
        {0, "\"suffix\": null"},
        {0, "\"logprobs\": null"},
        {0, "\"stream\": true, \"stream_options\": {\"include_usage\": false, "
            "\"include_obfuscation\": true}"},
        {1, "\"parallel_tool_calls\": false"},
        {1, "\"response_format\": {\"type\": \"text\"}"},
        {1, "\"tools\": []"},
        {1, "\"tool_choice\": \"none\""},
        {1, "\"tools\": [], \"tool_choice\": \"auto\""},
        {1, "\"modalities\": [\"text\"]"},
        {1, "\"logprobs\": false"},
        {1, "\"user\": \"u\", \"metadata\": {}, \"store\": false, \"service_tier\": "
            "\"default\", \"logit_bias\": {}, \"n\": 1, \"presence_penalty\": 0, "
            "\"frequency_penalty\": 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{%s, %s, \"max_tokens\": 3}",
                 cases[i].chat ? "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]"
                               : "\"prompt\": \"hi\"",
                 cases[i].fields);
        srv_request r;
        char err[SRV_ERR_CAP], param[SRV_ERR_CAP];
        if (parse(body, cases[i].chat, &r, err, param) != 0) {
            fprintf(stderr, "case %zu (%s): %s (param '%s')\n", i, body, err, param);
            fail();
        }
        assert_int_equal(r.max_tokens, 3);
        assert_int_equal(r.given, 0);
        assert_int_equal(r.n_stops, 0);
        assert_int_equal(r.include_usage, 0);
        srv_request_free(&r);
    }
}

/* The penalties, biases and bans reach the sampler parameters: OpenAI's, vLLM's and
 * llama.cpp's names, logit_bias as a map and as [[id, bias]] pairs (false bans). */
static void test_parse_penalties(void **state) {
    (void)state;
    srv_request r;
    char err[SRV_ERR_CAP], param[SRV_ERR_CAP];
    const char *body = "{\"prompt\": \"hi\", \"presence_penalty\": 0.5, \"frequency_penalty\": "
                       "-0.25, \"repetition_penalty\": 1.2, \"repeat_last_n\": 32, "
                       "\"logit_bias\": {\"7\": -100, \"300\": 2.5}, \"ignore_eos\": true, "
                       "\"min_tokens\": 4}";
    if (parse(body, 0, &r, err, param) != 0)
        fail_msg("%s (param '%s')", err, param);
    assert_true(r.sp.presence_penalty == 0.5f && r.sp.frequency_penalty == -0.25f);
    assert_true(r.sp.repeat_penalty == 1.2f && r.sp.repeat_last_n == 32);
    assert_int_equal(r.sp.n_logit_bias, 2);
    assert_ptr_equal(r.sp.logit_bias, r.bias);
    assert_int_equal(r.bias[0].token, 7);
    assert_true(r.bias[0].bias == -100.0f);
    assert_int_equal(r.bias[1].token, 300);
    assert_true(r.bias[1].bias == 2.5f);
    assert_int_equal(r.sp.ignore_eos, 1);
    assert_int_equal(r.sp.min_tokens, 4);
    assert_int_equal(st_sampler_check(&r.sp, 512), ST_OK);
    srv_request_free(&r);
    /* llama.cpp: repeat_penalty with repeat_last_n 0 is off; the list form, false bans */
    body = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"repeat_penalty\": 1.5, "
           "\"repeat_last_n\": 0, \"logit_bias\": [[3, false], [9, 1]]}";
    if (parse(body, 1, &r, err, param) != 0)
        fail_msg("%s (param '%s')", err, param);
    assert_true(r.sp.repeat_penalty == 1.0f);
    assert_int_equal(r.sp.n_logit_bias, 2);
    assert_true(r.bias[0].token == 3 && r.bias[0].bias == -100.0f);
    assert_true(r.bias[1].token == 9 && r.bias[1].bias == 1.0f);
    srv_request_free(&r);
    /* none given: every penalty off */
    if (parse("{\"prompt\": \"hi\", \"logit_bias\": {}}", 0, &r, err, param) != 0)
        fail_msg("%s", err);
    assert_false(st_sampler_penalized(&r.sp));
    srv_request_free(&r);
}

/* The chat templates as published (tokenizer_config.json of each model family). */
static const char *llama2_jinja =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
    "system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] "
    "== 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message "
    "!= false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
    "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% "
    "elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif "
    "%}{% endfor %}";
static const char *llama3_jinja =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
    "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
static const char *chatml_jinja =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";
static const char *zephyr_jinja =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ "
    "'<|system|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == "
    "'assistant' %}\n{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n{% "
    "if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";
static const char *mistral_jinja =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
    "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";

static void test_detect(void **state) {
    (void)state;
    assert_int_equal(srv_tmpl_detect(llama2_jinja, strlen(llama2_jinja)), SRV_TMPL_LLAMA2);
    assert_int_equal(srv_tmpl_detect(llama3_jinja, strlen(llama3_jinja)), SRV_TMPL_LLAMA3);
    assert_int_equal(srv_tmpl_detect(chatml_jinja, strlen(chatml_jinja)), SRV_TMPL_CHATML);
    assert_int_equal(srv_tmpl_detect(zephyr_jinja, strlen(zephyr_jinja)), SRV_TMPL_ZEPHYR);
    assert_int_equal(srv_tmpl_detect(mistral_jinja, strlen(mistral_jinja)), SRV_TMPL_MISTRAL);
    const char *other = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}{% endfor %}";
    assert_int_equal(srv_tmpl_detect(other, strlen(other)), SRV_TMPL_NONE);
    assert_int_equal(srv_tmpl_detect(NULL, 0), SRV_TMPL_NONE);
    srv_tmpl t;
    assert_int_equal(srv_tmpl_parse("llama-3", &t), 0);
    assert_int_equal(t, SRV_TMPL_LLAMA3);
    assert_int_equal(srv_tmpl_parse("llama2", &t), 0);
    assert_int_equal(t, SRV_TMPL_LLAMA2);
    assert_int_equal(srv_tmpl_parse("vicuna", &t), -1);
}

/* The rendering with special tokens shown as {id}. */
static char *show(const srv_rendered *r) {
    static char buf[4096];
    size_t n = 0;
    for (int i = 0; i < r->n_segs; i++) {
        if (r->segs[i].special >= 0)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "{%d}", r->segs[i].special);
        else
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%.*s", (int)r->segs[i].len,
                                  r->text + r->segs[i].off);
    }
    return buf;
}

static void check_render(srv_tmpl t, const srv_msg *m, int n, const srv_specials *sp,
                         const char *want, int want_bos) {
    srv_rendered r;
    char err[SRV_ERR_CAP] = "";
    assert_int_equal(srv_chat_render(t, m, n, sp, &r, err), 0);
    assert_string_equal(show(&r), want);
    assert_int_equal(r.has_bos, want_bos);
    srv_rendered_free(&r);
}

#define MSG(who, text)                                                                             \
    { .role = who, .content = (char *)text, .len = sizeof text - 1 }

static void test_render(void **state) {
    (void)state;
    const srv_specials llama = {1, 2, -1, -1, -1, -1, -1};
    const srv_specials l3 = {128000, 128001, -1, -1, 128006, 128007, 128009};
    const srv_specials qwen = {-1, 151643, 151644, 151645, -1, -1, -1};
    const srv_msg conv[] = {MSG(SRV_ROLE_SYSTEM, " Be brief. "), MSG(SRV_ROLE_USER, " Hi "),
                            MSG(SRV_ROLE_ASSISTANT, " Hello! "), MSG(SRV_ROLE_USER, "Bye")};
    check_render(SRV_TMPL_LLAMA2, conv, 4, &llama,
                 "{1}[INST] <<SYS>>\n Be brief. \n<</SYS>>\n\n Hi [/INST] Hello! {2}{1}[INST] Bye "
                 "[/INST]",
                 1);
    check_render(SRV_TMPL_LLAMA2, conv + 1, 1, &llama, "{1}[INST] Hi [/INST]", 1);
    check_render(SRV_TMPL_MISTRAL, conv, 4, &llama,
                 "{1}[INST]  Be brief. \n\n Hi  [/INST] Hello! {2}[INST] Bye [/INST]", 1);
    check_render(SRV_TMPL_LLAMA3, conv, 4, &l3,
                 "{128000}{128006}system{128007}\n\nBe brief.{128009}{128006}user{128007}\n\nHi{"
                 "128009}{128006}assistant{128007}\n\nHello!{128009}{128006}user{128007}\n\nBye{"
                 "128009}{128006}assistant{128007}\n\n",
                 1);
    check_render(SRV_TMPL_CHATML, conv + 3, 1, &qwen,
                 "{151644}user\nBye{151645}\n{151644}assistant\n", 0);
    /* a vocabulary without the ChatML tokens: their text, tokenized as text */
    check_render(SRV_TMPL_CHATML, conv + 3, 1, &llama,
                 "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", 0);
    check_render(SRV_TMPL_ZEPHYR, conv, 2, &llama,
                 "<|system|>\n Be brief. {2}\n<|user|>\n Hi {2}\n<|assistant|>\n", 0);

    /* Llama 2 and Mistral refuse what their templates refuse */
    srv_rendered r;
    char err[SRV_ERR_CAP] = "";
    const srv_msg bad[] = {MSG(SRV_ROLE_USER, "a"), MSG(SRV_ROLE_USER, "b")};
    assert_int_equal(srv_chat_render(SRV_TMPL_LLAMA2, bad, 2, &llama, &r, err), -1);
    assert_non_null(strstr(err, "alternating"));
    err[0] = 0;
    assert_int_equal(srv_chat_render(SRV_TMPL_MISTRAL, conv, 3, &llama, &r, err), -1);
    assert_non_null(strstr(err, "last message must be a user"));
    err[0] = 0;
    assert_int_equal(srv_chat_render(SRV_TMPL_LLAMA2, conv, 1, &llama, &r, err), -1);
    assert_non_null(strstr(err, "needs a user message"));
    err[0] = 0;
    assert_int_equal(srv_chat_render(SRV_TMPL_NONE, conv, 1, &llama, &r, err), -1);
}

/* Feeds text in pieces of k bytes; returns what the matcher released. */
static char *run_stops(const char *const *stops, int n_stops, const char *text, size_t k,
                       int *stopped) {
    static char out[1024];
    size_t n_out = 0, n = strlen(text);
    srv_stopper s = {.stops = stops, .n_stops = n_stops};
    for (size_t i = 0; i < n && !s.stopped; i += k) {
        const char *p;
        size_t len;
        size_t take = n - i < k ? n - i : k;
        assert_int_equal(srv_stop_add(&s, text + i, take, 0, &p, &len), 0);
        memcpy(out + n_out, p, len);
        n_out += len;
    }
    const char *p;
    size_t len;
    assert_int_equal(srv_stop_add(&s, "", 0, 1, &p, &len), 0);
    memcpy(out + n_out, p, len);
    n_out += len;
    out[n_out] = 0;
    *stopped = s.stopped;
    srv_stopper_free(&s);
    return out;
}

static void test_stops(void **state) {
    (void)state;
    const char *stops[] = {"Lily", "the end", "\n\n"};
    for (size_t k = 1; k <= 8; k++) {
        int st;
        assert_string_equal(run_stops(stops, 3, "Once there was Lily who", k, &st),
                            "Once there was ");
        assert_true(st);
        assert_string_equal(run_stops(stops, 3, "and the en", k, &st), "and the en");
        assert_false(st);
        assert_string_equal(run_stops(stops, 3, "a\n\nb the end", k, &st), "a");
        assert_true(st);
        assert_string_equal(run_stops(stops, 3, "no stop at all", k, &st), "no stop at all");
        assert_false(st);
        assert_string_equal(run_stops(NULL, 0, "plain", k, &st), "plain");
    }
    /* text held back only while it may begin a stop string */
    srv_stopper s = {.stops = stops, .n_stops = 3};
    const char *p;
    size_t len;
    assert_int_equal(srv_stop_add(&s, "say Li", 6, 0, &p, &len), 0);
    assert_int_equal(len, 4);
    assert_int_equal(srv_stop_add(&s, "ke", 2, 0, &p, &len), 0);
    assert_int_equal(len, 4);
    assert_memory_equal(p, "Like", 4);
    srv_stopper_free(&s);
    /* min_tokens: a stop string that ends within the first min_end bytes does not stop; one
     * that ends past them does, even if it began before */
    srv_stopper m = {.stops = stops, .n_stops = 3, .min_end = 9};
    char got[64] = "";
    assert_int_equal(srv_stop_add(&m, "Lily and ", 9, 0, &p, &len), 0);
    assert_false(m.stopped);
    strncat(got, p, len);
    m.min_end = 11;
    assert_int_equal(srv_stop_add(&m, "Li", 2, 0, &p, &len), 0);
    strncat(got, p, len);
    assert_int_equal(srv_stop_add(&m, "ly ran", 6, 0, &p, &len), 0);
    strncat(got, p, len);
    assert_true(m.stopped);
    assert_string_equal(got, "Lily and ");
    srv_stopper_free(&m);
}

static void test_utf8(void **state) {
    (void)state;
    assert_int_equal(srv_utf8_valid_prefix("abc", 3), 3);
    assert_int_equal(srv_utf8_valid_prefix("a\xc3\xa9", 3), 3);
    assert_int_equal(srv_utf8_valid_prefix("a\xc3", 2), 1);
    assert_int_equal(srv_utf8_valid_prefix("a\xe2\x82\xac!", 5), 5);
    assert_int_equal(srv_utf8_valid_prefix("a\xe2\x82", 3), 1);
    assert_int_equal(srv_utf8_valid_prefix("\xed\xa0\x80", 3), 0); /* surrogate */
    assert_int_equal(srv_utf8_valid_prefix("\xc0\x80", 2), 0);     /* overlong */
    assert_int_equal(srv_utf8_valid_prefix("\xf4\x90\x80\x80", 4), 0);
    assert_int_equal(srv_utf8_valid_prefix("\xf0\x9f\x98\x80", 4), 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_full),    cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_parse_neutral), cmocka_unit_test(test_parse_penalties),
        cmocka_unit_test(test_detect),        cmocka_unit_test(test_render),
        cmocka_unit_test(test_stops),         cmocka_unit_test(test_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
