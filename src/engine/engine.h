/*
 * engine.h: internal header of the engine: the state of the slots of a continuous-batching
 * engine (st_engine; st_generate_batch is a loop over one) and the two kinds of step it runs.
 * setup.c resolves the parameters and sets the state up; sched.c queues, admits, prefills,
 * steps and finishes requests; step.c holds the speculative step (DESIGN.md "One speculative
 * step") and the plain step; generate.c is the engine's first client (st_generate_batch).
 */
#ifndef ST_ENGINE_H
#define ST_ENGINE_H

#include "ctl/ctl.h"
#include "draft/drafter.h"
#include "grammar/grammar.h"

/* One request: queued (slot -1), then holding a slot until it finishes. */
typedef struct st_req st_req;
struct st_req {
    uint64_t id;
    st_request_params rp;
    st_request_emit_fn emit;
    st_request_finish_fn finish;
    void *user;
    st_request_stats st;  /* kept up to date by the steps; st.gen_tokens counts emitted ones */
    double t_submit;      /* st_time_now() at submit */
    int64_t reserve;      /* KV positions reserved while it holds a slot */
    int64_t n_prefilled;  /* prompt tokens evaluated so far */
    int64_t spec_emitted; /* tokens of its speculative steps (accepted drafts + bonus) */
    int32_t slot;         /* -1 while queued */
    int cancelled;        /* st_engine_cancel was called: finishes at the next step */
    st_grammar *grammar;  /* rp.sampler.grammar compiled (NULL: none), and its matcher: the */
    st_gmatcher *gm;      /* state after the committed generated tokens */
    st_req *next;         /* the queue, in submission order */
    int64_t n_prompt;
    int32_t prompt[]; /* (n_prompt) */
};

typedef struct st_gen {
    const st_model *m;
    st_gen_params p; /* as given, with auto K/S/N resolved into K, S, N below; p.sampler and
                      * p.n_predict are only defaults: each slot's request has its own */
    st_session *s;
    st_verify_mask *vm;
    st_ctl *ctl;                      /* NULL for plain decoding */
    st_drafter *dr[ST_GEN_MAX_BATCH]; /* one drafter per sequence (each keeps its state) */
    int32_t V, bs, K, S, N;           /* vocabulary, slots, the tree pool and largest tree */
    int32_t n_tok;      /* the tokenizer's tokens (<= V): the target's tokens are chosen among ids
                         * [0, n_tok), so the rows of a padded output layer past them never are */
    int64_t M, LPW, PW; /* candidates, level_parents and parent_list widths */
    int32_t Kt, St;     /* this speculative step's pool (<= K, S: auto plans it) */
    size_t target_bytes, draft_bytes; /* context-sized memory committed at most: the target's
                                       * KV cache and scores, every slot's drafter together */
    st_gen_stats *stats;  /* totals over every sequence (spec_steps counts each sequence's) */
    double verify_s;      /* seconds in verify forwards and the logits they deferred */
    int64_t spec_emitted; /* tokens emitted by speculative steps (for tau) */
    double t_chosen;      /* when the last speculative step had chosen its tree size */
    int32_t walk_a;       /* the sequence whose tree the verify walk is in */
    /* the slots: their requests (NULL: free), histories (prompt + generated), counts, state */
    st_req *req[ST_GEN_MAX_BATCH];
    int32_t *hist[ST_GEN_MAX_BATCH]; /* (n_ctx + 1) each */
    int64_t n_hist[ST_GEN_MAX_BATCH];
    int64_t n_gen[ST_GEN_MAX_BATCH];
    int done[ST_GEN_MAX_BATCH];
    /* this step: na active sequences seqs[0..na); row a of every array is sequence seqs[a] */
    int32_t na;
    int32_t *seqs;          /* (bs) */
    int32_t *roots;         /* (bs) last token of each history: the tree root */
    int64_t *seq_lens;      /* (bs) committed KV lengths */
    float *scores;          /* (bs, M) the drafters' candidate pools */
    int32_t *cand_tokens;   /* (bs, M) */
    int64_t *level_parents; /* (bs, LPW) */
    int64_t *sel;           /* (bs, N-1) candidates selected by st_tree_organize */
    /* the trees' arrays below hold the ragged step's sum n_a <= bs*N nodes, sequence a's
     * from off[a] (node x of its tree at off[a] + x) */
    int64_t *parent_list;                    /* (bs, PW) + 1 */
    int32_t *drafts;                         /* (bs, N-1) */
    int32_t *tree_tokens, *positions, *pred; /* (bs, N) */
    int64_t *ri, *nt, *ns;                   /* (bs, N) */
    int64_t *acc;   /* (bs, S+1) accepted path: root, accepted nodes (rows of St+1 this step) */
    int64_t *n_acc; /* (bs) accepted drafts */
    int32_t *cap;   /* (bs) each request's speculation cap (st_request_params.spec_max_tree) */
    int32_t *nsz;   /* (bs) the controller's tree sizes */
    int64_t *nb;    /* (bs) each tree's nodes n_a (drafted candidates before the choice) */
    int64_t *off;   /* (bs + 1) where each tree starts in the forward: n_0 + ... + n_(a-1) */
    st_tree_mask *masks;    /* (bs) each tree's block of the verify mask */
    float *logits;          /* (bs, V) a plain step's logits; one row per walked node in verify */
    st_token_logprobs *lps; /* (bs, N) log-probabilities of the requests that ask: row a of a
                             * plain step, node x of a verify walk */
    void *scratch;          /* the sampler's */
    int32_t *counts;        /* (V) st_sample_penalize's counting scratch, kept all zero */
    int32_t *eog;           /* (n_eog) the end-of-generation ids, banned by ignore_eos and
                             * min_tokens */
    int32_t n_eog;
    void *mem; /* the one allocation of every array above */
} st_gen;

/* Resolves `auto` (0) values and SGLang's rules into a valid (K, S, N) for speculation sp. */
st_status st_gen_resolve_shape(const st_spec_params *sp, int32_t *K, int32_t *S, int32_t *N);

/* Checks p (n_predict, sampler, draft model) and resolves the tree shape: K, S, N (1, 0, 1 for
 * plain decoding). who names the caller in messages. */
st_status st_gen_check(const st_gen_params *p, const char *who, int32_t *K, int32_t *S, int32_t *N);

/* Sets g up for g->bs slots (g->m, g->p and g->stats set): the session, one drafter per slot,
 * the step buffers, the verify-mask owner and the controller. st_gen_free releases them. */
st_status st_gen_setup(st_gen *g, int32_t K, int32_t S, int32_t N);
void st_gen_free(st_gen *g);

/* The target's token for slot b at the node whose logits are lg, at absolute position pos,
 * after the slot's history and path[0..n_path) (the tokens of the node's ancestors below the
 * tree root and the node itself; none in a plain step): exactly what plain decoding samples
 * there with the slot's sampler (greedy is st_sample at temp 0). The request's penalties and
 * biases change lg in place. When the request asks for log-probabilities, they are written to
 * *lp (from lg as the penalties left it). */
/* The log-softmax of logits lg over the tokenizer's tokens at token tok, with the n most
 * likely (st_token_logprobs' values; a prompt token's). */
void st_gen_logprobs(const st_gen *g, const float *lg, int32_t tok, int32_t n,
                     st_token_logprobs *lp);
st_status st_gen_target_token(st_gen *g, int32_t b, float *lg, int64_t pos, const int32_t *path,
                              int64_t n_path, int32_t *out, st_token_logprobs *lp);

/* Appends token tok to slot b and emits it (lp: its log-probabilities, handed to the request's
 * on_logprobs first; NULL when it asks for none); returns nonzero when b is finished. */
int st_gen_push(st_gen *g, int32_t b, int32_t tok, const st_token_logprobs *lp);

/* The engine's totals as st_generate_batch reports them (the times of prefill and generation
 * left to the caller), and the milliseconds spent prefilling. */
void st_engine_gen_stats(const st_engine *e, st_gen_stats *out);
double st_engine_prefill_ms(const st_engine *e);

/* One speculative step of the g->na active sequences with pool (K, S) (at most g->K, g->S):
 * propose, choose each sequence's tree size, organize, mask, build, verify forward (the trees
 * ragged), targets along the path and accept, commit. When no drafts are worth verifying (the
 * controller chooses size 1 for every sequence) it runs the plain step instead. *T_out: the
 * tree tokens verified (na: plain); *emitted: tokens appended. The per-candidate arrays
 * (scores, level_parents, ...) are laid out for (K, S). */
st_status st_gen_spec_step(st_gen *g, int32_t K, int32_t S, int64_t *T_out, int64_t *emitted);

/* One plain decoding step of the g->na active sequences in one forward pass. */
st_status st_gen_plain_step(st_gen *g, int64_t *emitted);

/* The prefix cache (prefix.c): blocks of `block` prompt tokens, each keyed by its tokens and the
 * block before it, holding a payload of payload_bytes the engine fills; least recently used
 * blocks evicted under a byte budget. */
typedef struct st_prefix_cache st_prefix_cache;
typedef struct st_pfx_block st_pfx_block;

typedef struct st_prefix_stats {
    int64_t hits, misses; /* lookups that found at least one block, and none */
    int64_t hit_tokens;   /* tokens of the blocks lookups found */
    int64_t blocks;       /* cached now */
    int64_t inserted, evictions;
    size_t bytes, budget_bytes; /* held now (blocks with their payloads), and the budget */
} st_prefix_stats;

/* Writes the payload of block i (tokens [i*block, (i+1)*block)) of the prompt being inserted
 * (fresh: a new block; an error leaves it and the ones after it out), or may complete the
 * payload of block i cached before (!fresh: the return value is ignored). */
typedef st_status (*st_prefix_fill_fn)(void *user, int64_t i, void *payload, int fresh);

/* A cache of blocks of `block` tokens (1..4096) with payloads of payload_bytes bytes holding at
 * most budget bytes (every block counted with its tokens and bookkeeping). */
st_status st_prefix_create(int32_t block, size_t payload_bytes, size_t budget,
                           st_prefix_cache **out);
void st_prefix_free(st_prefix_cache *c);
int32_t st_prefix_block(const st_prefix_cache *c);
void st_prefix_get_stats(const st_prefix_cache *c, st_prefix_stats *out);
/* The longest cached prefix of tokens[0..n) in whole blocks, at most max_blocks: its blocks, in
 * order, into chain; returns their number (a hit when > 0, else a miss) and marks them most
 * recently used. The blocks stay valid until the next st_prefix_insert or st_prefix_free. */
int64_t st_prefix_lookup(st_prefix_cache *c, const int32_t *tokens, int64_t n,
                         const st_pfx_block **chain, int64_t max_blocks);
/* Block b's payload (payload_bytes, 64-byte aligned). */
void *st_prefix_payload(const st_prefix_cache *c, const st_pfx_block *b);
/* Caches the whole blocks of tokens[0..n) that are not yet, filling each new one's payload,
 * evicting least recently used blocks of other prompts to stay within the budget (never one of
 * this prompt's). Stops early, without an error, when the budget or memory runs out or fill
 * fails; *n_cached (may be NULL): the blocks of this prompt cached afterwards. */
st_status st_prefix_insert(st_prefix_cache *c, const int32_t *tokens, int64_t n,
                           st_prefix_fill_fn fill, void *user, int64_t *n_cached);

#endif /* ST_ENGINE_H */
