/*
 * spectree_sample.h: sampling in the public API: the sampler's parameters (temperature and the
 * filters, penalties and logit biases, a grammar), the position-coupled sampler and the
 * penalties as pure functions, and the grammars for structured output (GBNF, JSON schemas).
 * Included by spectree.h; include that instead.
 */
#ifndef SPECTREE_SAMPLE_H
#define SPECTREE_SAMPLE_H
#ifndef SPECTREE_H
#error "include spectree.h, not spectree_sample.h"
#endif

/* ---------------------------------------------------------------------------------------------
 * Sampling
 * ------------------------------------------------------------------------------------------- */

/* A bias added to one token's logit (OpenAI's logit_bias). */
typedef struct st_logit_bias {
    int32_t token; /* 0 .. n_vocab-1 */
    float bias;    /* -100 .. 100; -100 all but bans the token */
} st_logit_bias;

#define ST_REPEAT_LAST_N_DEFAULT 64 /* the repetition penalty's window when repeat_last_n is 0 */

typedef struct st_sampler_params {
    float temp;    /* 0 = greedy (argmax, lowest id on ties) */
    int32_t top_k; /* <= 0: off */
    float top_p;   /* >= 1: off */
    float min_p;   /* <= 0: off; keeps tokens with p >= min_p * p_max */
    uint64_t seed;
    /* Penalties, biases and bans: all off when zero (the defaults). They change the logits
     * before any of the filters above (st_sample_penalize, in this order): logit_bias added;
     * the repetition penalty (llama.cpp, HF) divides a positive logit, and multiplies a
     * negative one, by repeat_penalty for each distinct token among the last repeat_last_n of
     * prompt + generated; then logit -= presence_penalty * (c > 0) + frequency_penalty * c,
     * with c the token's count among the generated tokens (OpenAI); then the end-of-generation
     * tokens get -inf when ignore_eos is set or fewer than min_tokens were generated. Greedy
     * decoding takes the argmax of the result. st_sample reads none of these fields: it needs
     * the history, so the engine calls st_sample_penalize before it. */
    float presence_penalty;          /* -2 .. 2 */
    float frequency_penalty;         /* -2 .. 2 */
    float repeat_penalty;            /* 0 .. 10; 0 and 1: off */
    int32_t repeat_last_n;           /* window of repeat_penalty: 0 = ST_REPEAT_LAST_N_DEFAULT, -1 =
                                      * the whole context, else >= 1 tokens */
    const st_logit_bias *logit_bias; /* (n_logit_bias), borrowed (st_engine_submit copies it);
                                      * an id listed twice gets both biases */
    int32_t n_logit_bias;            /* 0 .. ST_MAX_LOGIT_BIAS */
    int32_t ignore_eos;              /* nonzero: never samples (so never stops at) EOS */
    int32_t min_tokens; /* >= 0: EOS is banned until this many tokens were generated (stop
                         * strings are the caller's: the server and generate hold them back
                         * as long) */
    /* Structured output: GBNF text (see "Grammars" below), borrowed, NUL-terminated; NULL or
     * "" (the default): none. st_engine_submit (and st_generate) compile it, ST_ERR_INVALID
     * with the parse error otherwise. Each generated token is then chosen among the tokens
     * whose bytes keep the output a prefix of a sentence of the grammar (the other logits set
     * to -inf after the penalties), end-of-generation only where the output is a whole
     * sentence (or where no other token can follow). Like the penalties, the mask depends only
     * on the tokens along the sequence's own path, so speculative decoding stays exact; the
     * drafted tree nodes the grammar rejects are pruned before verification. n_predict can
     * still cut the output short (ST_STOP_LENGTH). */
    const char *grammar;
} st_sampler_params;

#define ST_MAX_LOGIT_BIAS 1024 /* most entries of st_sampler_params.logit_bias */

/* Greedy choice: the first index of the largest of x[0..n), NaN never winning unless all are NaN
 * (then 0). st_sample at temp 0 returns exactly this; top-k and tree selection rank the same way
 * (higher first, ties by lower index, NaN last). n >= 1. */
int32_t st_argmax(const float *x, int32_t n);

st_sampler_params st_sampler_default_params(void);

/* Bytes of scratch st_sample needs for a vocabulary of n_vocab. */
size_t st_sample_scratch_size(int32_t n_vocab);

/* Samples the token that will occupy absolute position pos from logits (n_vocab floats).
 * Filters apply in this order: top-k, then softmax at temperature temp, top-p, min-p; the kept
 * tokens are ordered by probability (ties by lower id) and the token is found by inverse CDF with
 * the uniform st_sample_uniform(seed, pos). The result is therefore a pure function of (logits,
 * params, pos): speculative decoding reproduces it exactly. scratch: st_sample_scratch_size
 * bytes, caller-owned. */
st_status st_sample(const float *logits, int32_t n_vocab, const st_sampler_params *p, int64_t pos,
                    void *scratch, int32_t *out);

/* The uniform draw in [0, 1) used for position pos. */
float st_sample_uniform(uint64_t seed, int64_t pos);

/* Checks p's fields (temp, top_p, min_p, the penalties, logit_bias against n_vocab when
 * n_vocab > 0); ST_ERR_INVALID with a message naming the field. */
st_status st_sampler_check(const st_sampler_params *p, int32_t n_vocab);

/* 1 when any penalty, bias or ban of p is on (st_sample_penalize would change something). */
int st_sampler_penalized(const st_sampler_params *p);

/* The tokens before the one being sampled along one sequence's path: the committed tokens
 * (tokens[0..n_tokens): the prompt, its first n_prompt, then generated ones), followed by
 * path[0..n_path), generated tokens not yet committed (in tree verification, a node's
 * ancestors below the root and the node itself). */
typedef struct st_sample_history {
    const int32_t *tokens;
    int64_t n_tokens;
    int64_t n_prompt; /* <= n_tokens */
    const int32_t *path;
    int64_t n_path;
} st_sample_history;

/* Bytes of the counting scratch st_sample_penalize needs: n_vocab int32, all zero. */
size_t st_sample_penalty_scratch_size(int32_t n_vocab);

/* Applies p's penalties, biases and bans (see st_sampler_params) to logits (n_vocab floats) in
 * place, for the token after history h; eog[0..n_eog) are the end-of-generation ids banned by
 * ignore_eos and min_tokens. Only the logits of tokens in the history, in logit_bias and in
 * eog change: a pure function of (logits, p, h), so a tree node that sees its own path gets the
 * logits plain decoding gets there. counts: st_sample_penalty_scratch_size bytes, zero on
 * entry and left zero. p must pass st_sampler_check. */
st_status st_sample_penalize(float *logits, int32_t n_vocab, const st_sampler_params *p,
                             const st_sample_history *h, const int32_t *eog, int32_t n_eog,
                             int32_t *counts);

/* ---------------------------------------------------------------------------------------------
 * Grammars (structured output)
 *
 * GBNF as llama.cpp's users write it: rules `name ::= alternatives` (the start rule is `root`),
 * `|` between alternatives, items "literal" (escapes \n \r \t \\ \" \xHH \uHHHH
 * \UHHHHHHHH), [a-z0-9_] and [^"\\] classes over code points, `.` (any code point), rule
 * names and ( groups ), each optionally followed by * + ? {m} {m,} {m,n} (m, n <= 1000);
 * `#` comments to the end of the line; a newline ends a rule except inside parentheses or
 * after `::=` and `|`. Matching is over the output's bytes: the generated tokens' decoded bytes
 * (the pieces with "▁" as a space and <0xHH> as the byte; one exception: after a prompt of BOS
 * alone, the detokenizer drops a leading space of the first token, which the grammar did see).
 * Refused with a message naming line and column: syntax errors, undefined rules, a rule
 * defined twice, no `root`, left recursion (a rule that reaches itself without consuming
 * input, including a repetition of something that can be empty), token references <...>.
 * ------------------------------------------------------------------------------------------- */

typedef struct st_grammar st_grammar;

/* Compiles len bytes of GBNF text. ST_ERR_INVALID with the reason in st_last_error(). */
st_status st_grammar_parse(const char *text, size_t len, st_grammar **out);
void st_grammar_free(st_grammar *g);

/* Matches n bytes against g: *result 1 when they are a sentence of the grammar, 0 when they are
 * a proper prefix of one, -1 when no sentence starts with them. */
st_status st_grammar_match(const st_grammar *g, const char *s, size_t n, int *result);

/* GBNF for any JSON object (OpenAI's response_format json_object), NUL-terminated, static. */
const char *st_grammar_json_object(void);

/* GBNF for the JSON texts valid against a JSON schema (schema: len bytes of JSON). Supported:
 * type (string, number, integer, boolean, null, object, array, or a list of them), properties
 * with required (properties are written in their order, required ones always, the others
 * optionally), additionalProperties (extra keys are never written, except in an object without
 * properties, whose values then follow it), items, prefixItems, minItems, maxItems, enum, const,
 * anyOf, oneOf (as anyOf: a text matching two branches is not excluded), allOf with one member,
 * $ref to "#/$defs/..." or "#/definitions/...", minLength and maxLength (<= 1000), pattern (a
 * regex subset: literals, escapes, ., [classes], \d \w \s, groups, |, * + ? {m,n}; ^ and $
 * only at the ends, an unanchored end matching anything; no backreferences, lookaround or lazy
 * quantifiers), format date, time, date-time, uuid; and the annotations title, description,
 * default, examples, $schema, $id, $comment, strict. Anything else (minimum, multipleOf,
 * patternProperties, not, if/then, ...) is refused with ST_ERR_UNSUPPORTED naming the keyword
 * and where it is ("'minimum' at /properties/age"), never ignored. Whitespace: at most one
 * space between tokens; integers: at most 16 digits. *out: a
 * NUL-terminated string to release with st_grammar_text_free. */
st_status st_json_schema_to_gbnf(const char *schema, size_t len, char **out);
void st_grammar_text_free(char *text);

#endif /* SPECTREE_SAMPLE_H */
