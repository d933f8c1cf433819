/*
 * test_serve_tools.c: tool calling in `spectree serve` without sockets (tools/serve/tools.c,
 * tmpl.c):
 * - the call parser of each template (Qwen 2.5's <tool_call>, Llama 3.1's JSON with or without
 *   <|python_tag|>, Mistral's [TOOL_CALLS]): good calls, several, text before them, malformed
 *   JSON, unknown names, trailing text; the streamed safe prefix;
 * - tools, tool calls and tool results rendered as each template writes them (exact text);
 * - the grammar of a forced call accepts the template's call syntax with valid arguments only;
 * - bad tools, tool_choice and tool messages refused with the field named.
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

static const char *const weather =
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
    "\"Weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
    "{\"type\": \"string\"}, \"unit\": {\"enum\": [\"c\", \"f\"]}}, \"required\": [\"city\", "
    "\"unit\"], \"additionalProperties\": false}}}";
static const char *const clock_tool =
    "{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {}}}}";

/* A chat request with the two tools and fields extra (", ..." or ""); asserts it parses. */
static void request(srv_request *r, const char *messages, const char *extra) {
    char body[4096], err[SRV_ERR_CAP], param[SRV_ERR_CAP];
    snprintf(body, sizeof body, "{\"messages\": %s, \"tools\": [%s, %s]%s}", messages, weather,
             clock_tool, extra);
    if (srv_request_parse(body, strlen(body), 1, r, err, param)) {
        fprintf(stderr, "%s: %s (%s)\n", body, err, param);
        fail();
    }
}

static const char *const user_msg = "[{\"role\": \"user\", \"content\": \"Weather?\"}]";

/* Parses text with template t and the request's tools: the number of calls, and writes the
 * content length and the first call's name and arguments. */
static int calls_of(srv_tmpl t, const srv_request *r, const char *text, size_t *content, char *name,
                    char *args) {
    srv_call *c = NULL;
    int n = srv_tools_parse(t, r->tools, r->n_tools, text, strlen(text), content, &c);
    name[0] = args[0] = 0;
    if (n > 0) {
        snprintf(name, 64, "%s", c[0].name);
        snprintf(args, 256, "%s", c[0].args);
    }
    srv_calls_free(c, n);
    return n;
}

static void test_parse_calls(void **state) {
    (void)state;
    srv_request r;
    request(&r, user_msg, "");
    static const struct {
        srv_tmpl t;
        const char *text;
        int n;          /* calls */
        size_t content; /* bytes of content before them */
        const char *name, *args;
    } cases[] = {
        /* Qwen 2.5 / ChatML */
        {SRV_TMPL_CHATML,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
         "\"unit\": \"c\"}}\n</tool_call>",
         1, 0, "get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}"},
        {SRV_TMPL_CHATML,
         "Let me look.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n"
         "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\",\"unit\":"
         "\"f\"}}\n</tool_call>\n",
         2, 12, "get_time", "{}"},
        {SRV_TMPL_CHATML,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
         "}\n</tool_call>",
         0, 0, "", ""}, /* malformed JSON */
        {SRV_TMPL_CHATML, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}", 0, 0, "",
         ""}, /* not closed */
        {SRV_TMPL_CHATML, "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>", 0,
         0, "", ""}, /* a name not in tools */
        {SRV_TMPL_CHATML, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": 3}\n</tool_call>",
         0, 0, "", ""}, /* arguments not an object */
        {SRV_TMPL_CHATML,
         "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call> and more", 0, 0,
         "", ""}, /* text after the calls */
        {SRV_TMPL_CHATML, "Once upon a time {\"name\": \"get_time\"}", 0, 0, "", ""},
        /* Llama 3.1 */
        {SRV_TMPL_LLAMA3,
         " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", "
         "\"unit\": \"c\"}}",
         1, 0, "get_weather", "{\"city\": \"Oslo\", \"unit\": \"c\"}"},
        {SRV_TMPL_LLAMA3, "<|python_tag|>{\"name\": \"get_time\", \"arguments\": {}}", 1, 0,
         "get_time", "{}"},
        {SRV_TMPL_LLAMA3,
         "Sure. <|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}; {\"name\": "
         "\"get_weather\", \"parameters\": {\"city\": \"A\", \"unit\": \"f\"}}",
         2, 5, "get_time", "{}"},
        {SRV_TMPL_LLAMA3, "{\"name\": \"get_time\", \"parameters\": {}", 0, 0, "", ""},
        {SRV_TMPL_LLAMA3, "The cat said {\"name\": \"get_time\", \"parameters\": {}}", 0, 0, "",
         ""}, /* JSON inside the text is no call */
        {SRV_TMPL_LLAMA3, "{\"name\": \"get_time\", \"parameters\": {}} bye", 0, 0, "", ""},
        /* Mistral */
        {SRV_TMPL_MISTRAL,
         "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Nice\", "
         "\"unit\": \"c\"}}, {\"name\": \"get_time\", \"arguments\": {}}]",
         2, 0, "get_weather", "{\"city\": \"Nice\", \"unit\": \"c\"}"},
        {SRV_TMPL_MISTRAL, "Checking. [TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}]", 1,
         9, "get_time", "{}"},
        {SRV_TMPL_MISTRAL, "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}]", 0, 0, "",
         ""},
        {SRV_TMPL_MISTRAL, "[TOOL_CALLS] []", 0, 0, "", ""},
        {SRV_TMPL_MISTRAL, " [{\"name\": \"get_time\", \"arguments\": {}}]", 1, 0, "get_time",
         "{}"}, /* [TOOL_CALLS] as a control token, which decodes to no text */
        {SRV_TMPL_MISTRAL, "[1, 2]", 0, 0, "", ""},
        {SRV_TMPL_MISTRAL, "[TOOL_CALLS] {\"name\": \"get_time\", \"arguments\": {}}", 0, 0, "",
         ""},
        /* templates without tool calling parse nothing */
        {SRV_TMPL_LLAMA2, "{\"name\": \"get_time\", \"parameters\": {}}", 0, 0, "", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t content;
        char name[64], args[256];
        int n = calls_of(cases[i].t, &r, cases[i].text, &content, name, args);
        size_t want_content = cases[i].n ? cases[i].content : strlen(cases[i].text);
        if (n != cases[i].n || content != want_content || strcmp(name, cases[i].name) ||
            strcmp(args, cases[i].args)) {
            fprintf(stderr, "case %zu (%s): %d calls, content %zu, name '%s', args '%s'\n", i,
                    cases[i].text, n, content, name, args);
            fail();
        }
    }
    srv_request_free(&r);
}

static void test_safe_prefix(void **state) {
    (void)state;
    static const struct {
        srv_tmpl t;
        const char *text;
        size_t safe;
    } cases[] = {
        {SRV_TMPL_CHATML, "Hello there", 11},
        {SRV_TMPL_CHATML, "Hello <tool", 5}, /* may begin <tool_call> */
        {SRV_TMPL_CHATML, "Hello <toy", 10}, /* cannot */
        {SRV_TMPL_CHATML, "Hi\n<tool_call>\n{", 2},
        {SRV_TMPL_MISTRAL, "Ok [TOOL_", 2},
        {SRV_TMPL_MISTRAL, " [{", 0},
        {SRV_TMPL_CHATML, " [{", 3},
        {SRV_TMPL_LLAMA3, "  ", 0}, /* may still become a JSON call */
        {SRV_TMPL_LLAMA3, " {\"name", 0},
        {SRV_TMPL_LLAMA3, "Once <|python", 4},
        {SRV_TMPL_LLAMA3, "Once upon", 9},
        {SRV_TMPL_ZEPHYR, "<tool_call>", 11},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t got = srv_tools_safe_prefix(cases[i].t, cases[i].text, strlen(cases[i].text));
        if (got != cases[i].safe) {
            fprintf(stderr, "case %zu (%s): %zu, want %zu\n", i, cases[i].text, got, cases[i].safe);
            fail();
        }
    }
}

/* The rendered text, special tokens as {id}. */
static const char *show(const srv_rendered *r) {
    static char buf[8192];
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

static const char *const round_trip =
    "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
    "\"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
    "[{\"id\": "
    "\"abcDEF123\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
    "\"arguments\": \"{\\\"city\\\":\\\"Paris\\\",\\\"unit\\\":\\\"c\\\"}\"}}]}, {\"role\": "
    "\"tool\", \"tool_call_id\": \"abcDEF123\", \"content\": \"{\\\"temp\\\": 21}\"}]";

static void render(srv_tmpl t, const srv_request *r, const srv_specials *sp, const char *want) {
    srv_rendered out;
    char err[SRV_ERR_CAP] = "";
    if (srv_chat_render_tools(t, r->msgs, r->n_msgs, r->tools, r->n_tools, sp, &out, err)) {
        fprintf(stderr, "%s: %s\n", srv_tmpl_name(t), err);
        fail();
    }
    if (strcmp(show(&out), want)) {
        fprintf(stderr, "%s:\n%s\nwant:\n%s\n", srv_tmpl_name(t), show(&out), want);
        fail();
    }
    srv_rendered_free(&out);
}

static void test_render_tools(void **state) {
    (void)state;
    const srv_specials qwen = {-1, 151643, 151644, 151645, -1, -1, -1};
    const srv_specials l3 = {128000, 128001, -1, -1, 128006, 128007, 128009};
    const srv_specials mis = {1, 2, -1, -1, -1, -1, -1};
    srv_request r;
    request(&r, round_trip, "");
    render(SRV_TMPL_CHATML, &r, &qwen,
           "{151644}system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
           "with the user query.\n\nYou are provided with function signatures within "
           "<tools></tools> XML tags:\n<tools>\n"
           "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
           "\"Weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": "
           "{\"city\": {\"type\": \"string\"}, \"unit\": {\"enum\": [\"c\", \"f\"]}}, "
           "\"required\": [\"city\", \"unit\"], \"additionalProperties\": false}}}\n"
           "{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": "
           "{\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, "
           "return a json object with function name and arguments within <tool_call></tool_call> "
           "XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
           "<args-json-object>}\n</tool_call>{151645}\n"
           "{151644}user\nWeather in Paris?{151645}\n"
           "{151644}assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
           "\"Paris\", \"unit\": \"c\"}}\n</tool_call>{151645}\n"
           "{151644}user\n<tool_response>\n{\"temp\": 21}\n</tool_response>{151645}\n"
           "{151644}assistant\n");
    render(SRV_TMPL_LLAMA3, &r, &l3,
           "{128000}{128006}system{128007}\n\nEnvironment: ipython\nCutting Knowledge Date: "
           "December 2023\nToday Date: 26 Jul 2024\n\nBe brief.{128009}"
           "{128006}user{128007}\n\nGiven the following functions, please respond with a JSON "
           "for a function call with its proper arguments that best answers the given prompt.\n\n"
           "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
           "argument name and its value}.Do not use variables.\n\n"
           "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": "
           "\"get_weather\",\n        \"description\": \"Weather in a city\",\n        "
           "\"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n"
           "                \"city\": {\n                    \"type\": \"string\"\n           "
           "     },\n                \"unit\": {\n                    \"enum\": [\n           "
           "             \"c\",\n                        \"f\"\n                    ]\n       "
           "         }\n            },\n            \"required\": [\n                \"city\",\n"
           "                \"unit\"\n            ],\n            \"additionalProperties\": "
           "false\n        }\n    }\n}\n\n"
           "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_time\",\n"
           "        \"parameters\": {\n            \"type\": \"object\",\n            "
           "\"properties\": {}\n        }\n    }\n}\n\n"
           "Weather in Paris?{128009}"
           "{128006}assistant{128007}\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": "
           "\"Paris\", \"unit\": \"c\"}}{128009}"
           "{128006}ipython{128007}\n\n{\"temp\": 21}{128009}"
           "{128006}assistant{128007}\n\n");
    render(SRV_TMPL_MISTRAL, &r, &mis,
           "{1}[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": "
           "\"get_weather\", \"description\": \"Weather in a city\", \"parameters\": {\"type\": "
           "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"enum\": "
           "[\"c\", \"f\"]}}, \"required\": [\"city\", \"unit\"], \"additionalProperties\": "
           "false}}}, {\"type\": \"function\", \"function\": {\"name\": \"get_time\", "
           "\"parameters\": {\"type\": \"object\", \"properties\": {}}}}][/AVAILABLE_TOOLS]"
           "[INST] Be brief.\n\nWeather in Paris? [/INST]"
           "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
           "\"unit\": \"c\"}, \"id\": \"abcDEF123\"}]{2}"
           "[TOOL_RESULTS] {\"content\": {\"temp\": 21}, \"call_id\": \"abcDEF123\"}"
           "[/TOOL_RESULTS]");
    /* llama-2 and zephyr have no tool calling */
    srv_rendered out;
    char err[SRV_ERR_CAP] = "";
    assert_int_equal(srv_chat_render_tools(SRV_TMPL_ZEPHYR, r.msgs, r.n_msgs, r.tools, r.n_tools,
                                           &qwen, &out, err),
                     -1);
    assert_non_null(strstr(err, "no tool calling"));
    srv_request_free(&r);
    /* Llama 3.1's template takes one call per assistant message */
    const char *two =
        "[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"tool_calls\": "
        "[{\"id\": \"a\", \"type\": \"function\", \"function\": {\"name\": \"get_time\", "
        "\"arguments\": \"{}\"}}, {\"id\": \"b\", \"type\": \"function\", \"function\": "
        "{\"name\": \"get_time\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", "
        "\"tool_call_id\": \"a\", \"content\": \"1\"}]";
    request(&r, two, "");
    err[0] = 0;
    assert_int_equal(srv_chat_render_tools(SRV_TMPL_LLAMA3, r.msgs, r.n_msgs, r.tools, r.n_tools,
                                           &l3, &out, err),
                     -1);
    assert_non_null(strstr(err, "one tool call per assistant message"));
    srv_request_free(&r);
}

/* Matches text against the forced-call grammar of template t for the request: 1, 0, -1. */
static int grammar_match(srv_tmpl t, const srv_request *r, const char *text) {
    char *gbnf = NULL, err[SRV_ERR_CAP] = "";
    st_grammar *g = NULL;
    if (srv_tools_grammar(t, r, &gbnf, err) || st_grammar_parse(gbnf, strlen(gbnf), &g)) {
        fprintf(stderr, "%s: %s %s\n%s\n", srv_tmpl_name(t), err, st_last_error(),
                gbnf ? gbnf : "");
        fail();
    }
    int res = 9;
    assert_int_equal(st_grammar_match(g, text, strlen(text), &res), ST_OK);
    st_grammar_free(g);
    free(gbnf);
    return res;
}

static void test_grammar(void **state) {
    (void)state;
    srv_request req, named, single;
    request(&req, user_msg, ", \"tool_choice\": \"required\"");
    request(&named, user_msg,
            ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}");
    request(&single, user_msg, ", \"tool_choice\": \"required\", \"parallel_tool_calls\": false");
    assert_int_equal(named.tool_choice, SRV_TOOLS_NAMED);
    assert_int_equal(named.tool_named, 1);
    const char *w = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                    "\"unit\": \"c\"}}\n</tool_call>";
    const char *tm = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    char two[512];
    snprintf(two, sizeof two, "%s\n%s", w, tm);
    assert_int_equal(grammar_match(SRV_TMPL_CHATML, &req, w), 1);
    assert_int_equal(grammar_match(SRV_TMPL_CHATML, &req, tm), 1);
    assert_int_equal(grammar_match(SRV_TMPL_CHATML, &req, two), 1);
    assert_int_equal(grammar_match(SRV_TMPL_CHATML, &single, two), -1);
    assert_int_equal(grammar_match(SRV_TMPL_CHATML, &req, "<tool_call>\n{\"name\": \"get_"), 0);
    assert_int_equal(grammar_match(SRV_TMPL_CHATML, &req, "Hello"), -1);
    /* arguments against the schema: an enum value outside it, a missing required key */
    assert_int_equal(grammar_match(SRV_TMPL_CHATML, &req,
                                   "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                   "{\"city\": \"Paris\", \"unit\": \"k\"}}\n</tool_call>"),
                     -1);
    assert_int_equal(grammar_match(SRV_TMPL_CHATML, &req,
                                   "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                   "{\"city\": \"Paris\"}}\n</tool_call>"),
                     -1);
    assert_int_equal(grammar_match(SRV_TMPL_CHATML, &named, w), -1);
    assert_int_equal(grammar_match(SRV_TMPL_CHATML, &named, tm), 1);
    assert_int_equal(grammar_match(SRV_TMPL_LLAMA3, &req,
                                   "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"x\", "
                                   "\"unit\": \"f\"}}"),
                     1);
    assert_int_equal(grammar_match(SRV_TMPL_LLAMA3, &named,
                                   "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"x\", "
                                   "\"unit\": \"f\"}}"),
                     -1);
    assert_int_equal(grammar_match(SRV_TMPL_MISTRAL, &req,
                                   "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}}, "
                                   "{\"name\": \"get_time\", \"arguments\": {}}]"),
                     1);
    assert_int_equal(grammar_match(SRV_TMPL_MISTRAL, &single,
                                   "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}}, "),
                     -1);
    /* a grammar's text parses back as its calls */
    size_t content;
    char name[64], args[256];
    assert_int_equal(calls_of(SRV_TMPL_CHATML, &req, two, &content, name, args), 2);
    char *gbnf = NULL, err[SRV_ERR_CAP] = "";
    assert_int_equal(srv_tools_grammar(SRV_TMPL_ZEPHYR, &req, &gbnf, err), -1);
    assert_non_null(strstr(err, "no tool calling"));
    srv_request_free(&req);
    srv_request_free(&named);
    srv_request_free(&single);
    /* a parameters schema the converter refuses names the tool */
    srv_request bad;
    char body[1024], param[SRV_ERR_CAP];
    snprintf(body, sizeof body,
             "{\"messages\": %s, \"tool_choice\": \"required\", \"tools\": [{\"type\": "
             "\"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
             "\"object\", \"properties\": {\"n\": {\"type\": \"number\", \"minimum\": 1}}}}}]}",
             user_msg);
    assert_int_equal(srv_request_parse(body, strlen(body), 1, &bad, err, param), 0);
    assert_int_equal(srv_tools_grammar(SRV_TMPL_CHATML, &bad, &gbnf, err), -1);
    assert_non_null(
        strstr(err, "'tools[0].function.parameters': json schema: 'minimum' at /properties/n"));
    srv_request_free(&bad);
}

static void test_bad_requests(void **state) {
    (void)state;
    static const struct {
        const char *fields, *want, *param;
    } cases[] = {
        {"\"tools\": {}", "must be an array", "tools"},
        {"\"tools\": [3]", "'tools[0]' must be an object", "tools[0]"},
        {"\"tools\": [{\"type\": \"code\", \"function\": {\"name\": \"f\"}}]",
         "must be \"function\"", "tools[0].type"},
        {"\"tools\": [{\"function\": {\"name\": \"f\"}}]", "is required", "tools[0].type"},
        {"\"tools\": [{\"type\": \"function\"}]", "must be an object with a 'name'",
         "tools[0].function"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, {\"type\": "
         "\"function\", \"function\": {\"name\": \"\"}}]",
         "'tools[1].function.name' must be", "tools[1].function.name"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, {\"type\": "
         "\"function\", \"function\": {\"name\": \"f\"}}]",
         "tools[0] has the name 'f' too", "tools[1].function.name"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
         "[]}}]",
         "must be a JSON schema object", "tools[0].function.parameters"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"desc\": \"\"}}]",
         "unknown field 'desc'", "tools[0].function"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": "
         "\"always\"",
         "not \"always\"", "tool_choice"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": "
         "{\"type\": \"function\", \"function\": {\"name\": \"g\"}}",
         "names the function 'g', which is not in 'tools'", "tool_choice"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": "
         "{\"type\": \"function\"}",
         "must be \"none\"", "tool_choice"},
        {"\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}}",
         "not in 'tools'", "tool_choice"},
        {"\"parallel_tool_calls\": 1", "must be a boolean", "parallel_tool_calls"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[1024], err[SRV_ERR_CAP], param[SRV_ERR_CAP];
        snprintf(body, sizeof body, "{\"messages\": %s, %s}", user_msg, cases[i].fields);
        srv_request r;
        int rc = srv_request_parse(body, strlen(body), 1, &r, err, param);
        if (rc != -1 || !strstr(err, cases[i].want) || strcmp(param, cases[i].param)) {
            fprintf(stderr, "case %zu (%s): rc %d, err '%s', param '%s'\n", i, body, rc, err,
                    param);
            fail();
        }
    }
    static const struct {
        const char *messages, *want;
    } msgs[] = {
        {"[{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"a\", \"type\": \"function\", "
         "\"function\": {\"name\": \"f\", \"arguments\": \"{\\\"x\\\": \"}}]}]",
         "'messages[0].tool_calls[0].function.arguments' must be a JSON object"},
        {"[{\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"function\", \"function\": "
         "{\"name\": \"f\", \"arguments\": \"{}\"}}]}]",
         "'messages[0].tool_calls[0]' must be {\"id\""},
        {"[{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": [{\"id\": \"a\", \"type\": "
         "\"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}]",
         "'tool_calls' belongs to assistant messages"},
        {"[{\"role\": \"user\", \"content\": \"x\", \"tool_call_id\": \"a\"}]",
         "'tool_call_id' belongs to tool messages"},
        {"[{\"role\": \"tool\", \"content\": \"x\", \"tool_call_id\": 5}]",
         "tool_call_id must be a string"},
        {"[{\"role\": \"assistant\", \"content\": null}]", "must be a string or"},
    };
    for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
        char body[1024], err[SRV_ERR_CAP], param[SRV_ERR_CAP];
        snprintf(body, sizeof body, "{\"messages\": %s}", msgs[i].messages);
        srv_request r;
        int rc = srv_request_parse(body, strlen(body), 1, &r, err, param);
        if (rc != -1 || !strstr(err, msgs[i].want) || strcmp(param, "messages")) {
            fprintf(stderr, "message case %zu (%s): rc %d, err '%s', param '%s'\n", i, body, rc,
                    err, param);
            fail();
        }
    }
    /* tools on a completion are an unknown field */
    srv_request r;
    char err[SRV_ERR_CAP], param[SRV_ERR_CAP];
    const char *c = "{\"prompt\": \"x\", \"tools\": []}";
    assert_int_equal(srv_request_parse(c, strlen(c), 0, &r, err, param), -1);
    assert_string_equal(param, "tools");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_calls),  cmocka_unit_test(test_safe_prefix),
        cmocka_unit_test(test_render_tools), cmocka_unit_test(test_grammar),
        cmocka_unit_test(test_bad_requests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
