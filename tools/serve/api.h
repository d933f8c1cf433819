/*
 * api.h: the request side of `spectree serve` that needs no socket: parsing and checking
 * an OpenAI request body (jansson), chat templates (detection and renderers written here, no
 * Jinja engine), streamed stop-string matching and UTF-8 checks. Pure functions over caller
 * memory, shared by the server (tools/serve/), its unit test and its fuzz target.
 */
#ifndef ST_SERVE_API_H
#define ST_SERVE_API_H

#include "spectree.h"

#include <stddef.h>
#include <stdint.h>

enum {
    SRV_MAX_STOPS = 16,      /* stop strings per request */
    SRV_MAX_STOP_LEN = 256,  /* bytes per stop string */
    SRV_MAX_MESSAGES = 1024, /* chat messages per request */
    SRV_ERR_CAP = 256,       /* bytes of an error message */
    SRV_MAX_CHOICES = 16,    /* n and best_of */
};

/* srv_request.given: the sampling fields a request set. */
enum { SRV_GIVEN_TEMP = 1, SRV_GIVEN_TOPK = 2, SRV_GIVEN_TOPP = 4, SRV_GIVEN_MINP = 8 };

/* Chat templates the server can render (each as its Hugging Face Jinja template renders it). */
typedef enum srv_tmpl {
    SRV_TMPL_NONE = 0,
    SRV_TMPL_LLAMA2,  /* <s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A </s> */
    SRV_TMPL_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\nC<|eot_id|> */
    SRV_TMPL_CHATML,  /* <|im_start|>role\nC<|im_end|>\n */
    SRV_TMPL_ZEPHYR,  /* <|user|>\nC</s>\n */
    SRV_TMPL_MISTRAL, /* <s>[INST] U [/INST]A</s> */
} srv_tmpl;

/* "llama-2", "llama-3", "chatml", "zephyr", "mistral" (also "llama2", "llama3"); -1 otherwise. */
int srv_tmpl_parse(const char *name, srv_tmpl *out);
const char *srv_tmpl_name(srv_tmpl t);
/* The template a Jinja chat template text is, from substrings only that template family has;
 * SRV_TMPL_NONE when none matches. */
srv_tmpl srv_tmpl_detect(const char *jinja, size_t len);

typedef enum srv_role {
    SRV_ROLE_SYSTEM,
    SRV_ROLE_USER,
    SRV_ROLE_ASSISTANT,
    SRV_ROLE_TOOL /* a tool's result ("tool", or Llama 3's "ipython") */
} srv_role;

/* A function call: an assistant message's tool_calls entry, or one parsed from an answer. */
typedef struct srv_call {
    char *id;   /* NULL in a parsed call (the server names it) */
    char *name; /* NUL-terminated */
    char *args; /* the arguments: a JSON object's text, ", " and ": " between its tokens (as the
                 * templates' tojson writes it) */
} srv_call;

typedef struct srv_msg {
    srv_role role;
    char *content; /* NUL-terminated, valid UTF-8 ("" for an assistant's null content) */
    size_t len;
    srv_call *calls; /* (n_calls) an assistant's tool_calls, owned */
    int n_calls;
    char *call_id; /* a tool message's tool_call_id, owned */
} srv_msg;

/* tool_choice: what the model may do with the request's tools. */
typedef enum srv_choice_mode {
    SRV_TOOLS_AUTO = 0, /* call or answer, as the model writes (no constraint) */
    SRV_TOOLS_NONE,     /* tools rendered into the prompt, no call parsed */
    SRV_TOOLS_REQUIRED, /* at least one call, forced by a grammar */
    SRV_TOOLS_NAMED,    /* one call of tool_named, forced by a grammar */
} srv_choice_mode;

/* One entry of a request's tools, pre-rendered in the forms the templates write it. */
typedef struct srv_tool {
    char *name;
    char *json;  /* the whole entry as tojson writes it: {"type": "function", "function": {...}} */
    char *json4; /* the same with indent=4 (Llama 3.1) */
    char *mistral; /* Mistral v0.3's {"type": "function", "function": {"name": "...", ...}} */
    char *params;  /* the function's parameters schema (compact JSON), NULL when not given */
} srv_tool;

/* One checked request. Strings are owned (srv_request_free). */
typedef struct srv_request {
    int chat;
    char *prompt; /* completions: the prompt text (or NULL when given as token ids) */
    size_t prompt_len;
    int32_t *prompt_ids; /* completions: the prompt as token ids (not yet checked against the
                          * vocabulary) */
    int64_t n_prompt_ids;
    srv_msg *msgs; /* chat */
    int n_msgs;
    int64_t max_tokens;    /* -1: not given */
    st_sampler_params sp;  /* sp.logit_bias points at bias */
    st_logit_bias *bias;   /* (sp.n_logit_bias) logit_bias, owned */
    char *grammar;         /* GBNF of grammar / response_format / json_schema / ebnf, owned
                            * (malloc); sp.grammar points at it (NULL: unconstrained) */
    char grammar_from[96]; /* the field it came from, for "give only one" */
    int repeat_off;        /* repeat_last_n 0 (llama.cpp: the repetition penalty off) */
    unsigned given;        /* SRV_GIVEN_* */
    int seed_set;
    char *stops[SRV_MAX_STOPS];
    int n_stops;
    int stream, include_usage;
    int logprobs;          /* each completion token's log-probability (chat: "logprobs": true;
                            * completions: "logprobs": N) */
    int top_logprobs;      /* with it the N most likely tokens (0..ST_MAX_TOP_LOGPROBS) */
    int lp_text;           /* SGLang's return_text_in_logprobs */
    int sglang;            /* SGLang's /generate (srv_generate_parse): its answer's shape */
    int n;                 /* choices answered (1..SRV_MAX_CHOICES) */
    int best_of;           /* completions: choices generated (n..SRV_MAX_CHOICES), the n with the
                            * highest cumulative log-probability answered */
    int echo;              /* completions: the prompt before each choice's text */
    char zero_max[48];     /* the field that set max_tokens to 0 (as named in errors) */
    int32_t spec_max_tree; /* "speculative": st_request_params.spec_max_tree (0: the server's,
                            * 1: none, n: at most n tree nodes) */
    srv_tool *tools;       /* (n_tools) chat's tools, owned */
    int n_tools;
    srv_choice_mode tool_choice;
    int tool_named;         /* SRV_TOOLS_NAMED: the index of the named tool */
    char *tool_choice_name; /* SRV_TOOLS_NAMED: its name as given, owned */
    int parallel_calls;     /* parallel_tool_calls (default 1); 0: at most one call parsed */
} srv_request;

/* Parses and checks a request body for /v1/completions (chat 0) or /v1/chat/completions
 * (chat 1): a JSON object (no duplicate keys, valid UTF-8, no NUL in strings) with known fields
 * of the right types and ranges. Sampling defaults are OpenAI's (temperature 1, top_p 1, top_k
 * and min_p off). Returns 0, or -1 with a one-line message in err and the offending field in
 * param ("" when none); r is then empty. */
int srv_request_parse(const char *body, size_t len, int chat, srv_request *r, char *err,
                      char *param);
void srv_request_free(srv_request *r);

/* Parses and checks a body for SGLang's /generate: {"text": STRING} or {"input_ids": [ids]},
 * "sampling_params" (max_new_tokens, temperature, top_p, top_k, min_p, stop, sampling_seed,
 * presence_penalty, frequency_penalty, repetition_penalty, min_new_tokens, ignore_eos,
 * logit_bias; n and the token options only at their defaults), "rid", "return_logprob" with
 * "top_logprobs_num" and "return_text_in_logprobs" ("logprob_start_len" only -1: no prompt
 * logprobs); "stream" only false. Into a completion request (sglang set); errors as
 * srv_request_parse's, param naming sampling fields as "sampling_params.NAME". */
int srv_generate_parse(const char *body, size_t len, srv_request *r, char *err, char *param);

/* A rendered chat prompt: text pieces and special tokens in order. */
typedef struct srv_seg {
    int32_t special; /* >= 0: this token id; -1: text[off, off+len) */
    size_t off, len;
} srv_seg;

typedef struct srv_rendered {
    char *text;
    size_t n_text, cap_text;
    srv_seg *segs;
    int n_segs, cap_segs;
    int has_bos; /* the template wrote BOS itself */
} srv_rendered;

/* Ids of the special tokens the templates use, -1 where the vocabulary has none (the template's
 * text for it is then tokenized as plain text; a missing BOS is left out). */
typedef struct srv_specials {
    int32_t bos, eos, im_start, im_end, start_header, end_header, eot;
} srv_specials;

/* Looks the special tokens up by their pieces. */
void srv_specials_find(const st_tokenizer *tok, srv_specials *out);

/* Renders messages with template t, ending with the assistant's generation prompt. Returns 0,
 * or -1 with a message in err (roles that the template cannot render, out of memory). */
int srv_chat_render(srv_tmpl t, const srv_msg *msgs, int n, const srv_specials *sp,
                    srv_rendered *out, char *err);
/* The same with the request's tools rendered as the template writes them (docs/SERVING.md);
 * llama-2 and zephyr have no tool calling: tools, tool calls and tool messages are an error. */
int srv_chat_render_tools(srv_tmpl t, const srv_msg *msgs, int n, const srv_tool *tools,
                          int n_tools, const srv_specials *sp, srv_rendered *out, char *err);
void srv_rendered_free(srv_rendered *r);

/* tools.c: the request side of tool calling. srv_tools_field reads k = "tools", "tool_choice"
 * or "parallel_tool_calls" (returns 1 for any other key, 0 when read, -1 refused with the
 * message and param as srv_request_parse's); srv_tools_check runs once the body is read (a
 * tool_choice naming no tool, tool_choice without tools). srv_msg_tool_field reads message i's
 * "tool_calls" and "tool_call_id" (returns as srv_tools_field). */
int srv_tools_field(const char *k, const void *v, srv_request *r, char *err, char *param);
int srv_tools_check(srv_request *r, char *err, char *param);
int srv_msg_tool_field(const char *k, const void *v, size_t i, srv_msg *m, char *err, char *param);
void srv_tools_free(srv_request *r);
void srv_msg_free(srv_msg *m);

/* The GBNF that forces template t's call syntax around arguments valid against the chosen
 * tool's parameters (tool_choice required: any tool; named: that one), up to
 * SRV_MAX_CALLS calls with parallel_calls, else one. *out malloc'd. 0, or -1 with err. */
enum { SRV_MAX_CALLS = 4 };
int srv_tools_grammar(srv_tmpl t, const srv_request *r, char **out, char *err);

/* The calls in a generated answer text[0..n) as template t writes them (a call of a name not
 * in tools is no call). *content_len: the bytes of text before the first call (trailing
 * blanks dropped), all of n when none parsed. Returns the number of calls written to
 * *calls (malloc'd; srv_calls_free), 0 when the text is no valid call, -1 out of memory. */
int srv_tools_parse(srv_tmpl t, const srv_tool *tools, int n_tools, const char *text, size_t n,
                    size_t *content_len, srv_call **calls);
void srv_calls_free(srv_call *calls, int n);
/* Streaming: how many bytes of text[0..n) are content for sure (no call can start in them). */
size_t srv_tools_safe_prefix(srv_tmpl t, const char *text, size_t n);

/* Length of the longest valid UTF-8 prefix of s[0..n) that ends on a character boundary. */
size_t srv_utf8_valid_prefix(const char *s, size_t n);

/* Stop-string matcher over streamed text: text enters with srv_stop_add; what can no longer
 * start a stop string is released. */
typedef struct srv_stopper {
    const char *const *stops;
    int n_stops;
    char *hold; /* (cap) text that may begin a stop string */
    size_t n_hold, cap;
    size_t n_drop; /* bytes at the start of hold released by the last call */
    int stopped;
    int matched;    /* with stopped: the index of the stop string that matched */
    size_t n_in;    /* bytes added so far */
    size_t min_end; /* a stop string matches only where it ends past this many bytes of the
                     * text (min_tokens: the text of the tokens before the min_tokens-th) */
} srv_stopper;

/* Adds n bytes. Writes the bytes now safe to emit to *out_len bytes at *out_ptr (pointing into
 * the hold, valid until the next call). When a stop string completes, the text before it is
 * released, the rest dropped and stopped set. final: release everything held. Returns -1 when
 * out of memory. */
int srv_stop_add(srv_stopper *s, const char *txt, size_t n, int final, const char **out_ptr,
                 size_t *out_len);
void srv_stopper_free(srv_stopper *s);

#endif
