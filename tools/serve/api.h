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

typedef enum srv_role { SRV_ROLE_SYSTEM, SRV_ROLE_USER, SRV_ROLE_ASSISTANT } srv_role;

typedef struct srv_msg {
    srv_role role;
    char *content; /* NUL-terminated, valid UTF-8 */
    size_t len;
} srv_msg;

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
void srv_rendered_free(srv_rendered *r);

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
