/*
 * engine_api.h: public API fragment (pasted into include/spectree.h): speculative generation.
 */
#ifndef ST_ENGINE_API_H
#define ST_ENGINE_API_H

#include "../spec/attn_api.h"

/* Drafting algorithms (SGLang's --speculative-algorithm names). */
typedef enum st_spec_algo {
    ST_SPEC_NONE = 0,       /* plain decoding */
    ST_SPEC_STANDALONE = 1, /* a draft model with the target's vocabulary */
    ST_SPEC_NGRAM = 2,      /* n-gram lookup in the prompt and the generated text */
} st_spec_algo;

/* "NONE", "STANDALONE", "NGRAM" (case-insensitive); ST_ERR_INVALID otherwise. */
st_status st_spec_algo_parse(const char *name, st_spec_algo *out);
const char *st_spec_algo_name(st_spec_algo a);

typedef struct st_spec_params {
    st_spec_algo algo;
    const st_model *draft_model; /* STANDALONE: borrowed, must outlive the call */
    int32_t num_steps;           /* S: draft depth; 0 = auto */
    int32_t topk;                /* K: branching; 0 = auto; K = 1 forces N = S + 1 */
    int32_t num_draft_tokens;    /* N: verified nodes incl. the root (<= 64); 0 = auto */
    st_attn_backend backend;     /* target-verify attention (default cascade) */
    int32_t ngram_min_match;     /* NGRAM: shortest suffix matched (default 1) */
    int32_t ngram_max_match;     /* NGRAM: longest suffix matched (default 4) */
    int32_t ngram_breadth;       /* NGRAM: most matches merged (default 8) */
} st_spec_params;

st_spec_params st_spec_default_params(void);

/* Statistics of one st_generate call. Times in milliseconds. */
typedef struct st_gen_stats {
    int64_t prompt_tokens, gen_tokens;
    int64_t spec_steps;         /* steps that verified a drafted tree */
    int64_t plain_steps;        /* steps decoded without drafts (speculation off or no draft) */
    double tau;                 /* mean tokens per speculative step (accepted + bonus) */
    int64_t accept_hist[65];    /* accept_hist[k]: speculative steps accepting k drafts */
    double prompt_ms, gen_ms;   /* prefill; everything after it */
    double draft_ms, verify_ms; /* drafting; target verify forward passes */
    double overhead_ms;         /* gen_ms - draft_ms - verify_ms: tree, mask, sampling, commit */
    double prompt_tok_s, gen_tok_s;
    int32_t num_steps, topk, num_draft_tokens; /* the tree shape used last */
} st_gen_stats;

/* Called for each generated token in order; return nonzero to stop generation there. */
typedef int (*st_emit_fn)(void *user, int32_t token);

/* Generates up to n_predict tokens after the prompt (n_prompt >= 1 tokens) with the target
 * model m, drafting with `spec` and verifying trees, and calls emit for each token. Stops at an
 * end-of-generation token (not emitted), after n_predict tokens, when emit returns nonzero, or
 * when the context (n_ctx; 0 = the model's) is full. Whatever the drafter and tree shape, the
 * emitted tokens equal plain decoding with the same sampler parameters (greedy, or seeded
 * sampling with the position-coupled draw of st_sample). stats may be NULL. */
st_status st_generate(const st_model *m, const int32_t *prompt, int64_t n_prompt, int64_t n_predict,
                      const st_sampler_params *sampler, const st_spec_params *spec,
                      int32_t n_threads, int32_t n_ctx, st_emit_fn emit, void *user,
                      st_gen_stats *stats);

#endif /* ST_ENGINE_API_H */
