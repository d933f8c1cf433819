/*
 * drafter.h: the drafter interface. A drafter proposes one step's draft tree in the form of
 * TREE_SPEC §1 draft results (K candidates per node over S levels with cumulative scores, the
 * K best of each level expanded: EAGLE-2's dynamic tree), which st_tree_organize and
 * st_tree_build turn into the verified tree.
 */
#ifndef ST_DRAFTER_H
#define ST_DRAFTER_H

#include "model/model.h"
#include "tree/tree.h"

typedef struct st_drafter st_drafter;

/* Seed-coupled drafting (TREE_SPEC §9): what the target's sampler does at the positions a
 * proposal drafts, so that a drafter with a distribution of its own can pick each node's first
 * candidate with the target's rule (st_sample_penalize, then st_sample with the uniform of the
 * candidate's absolute position) applied to its own logits. */
typedef struct st_draft_coupling {
    const st_sampler_params *sampler; /* the request's (borrowed for the call) */
    const int32_t *eog;               /* (n_eog) end-of-generation ids (ignore_eos, min_tokens) */
    int32_t n_eog;
    int32_t n_tok;    /* the target samples ids [0, n_tok) */
    int64_t n_prompt; /* the history's first n_prompt tokens are the prompt's */
} st_draft_coupling;

struct st_drafter {
    /* Proposes draft results for the step whose root is hist[n_hist-1] at position n_hist-1
     * (all earlier tokens are committed). Writes scores (M), tokens (M) and level_parents
     * (st_tree_level_parents_width(K, S)) for M = st_tree_n_candidates(K, S); candidates that
     * do not exist get score -INFINITY. *n_real: the number of candidates with a finite score
     * (the engine verifies at most that many drafted nodes). */
    st_status (*propose)(st_drafter *d, const int32_t *hist, int64_t n_hist, int64_t K, int64_t S,
                         float *scores, int32_t *tokens, int64_t *level_parents, int64_t *n_real);
    /* Set by the engine for each propose: the request's sampler, to which drafters with a draft
     * distribution couple each node's first candidate (the others stay their top-K); NULL: the
     * draft's own top-K only (drafters without a distribution always ignore it). */
    const st_draft_coupling *coupling;
    /* The target's final-normed state (n_embd) at committed position pos, called by the engine
     * for every committed position in increasing order (the prompt's after prefill, then each
     * step's), before the next target forward pass; NULL for drafters that read no states. */
    st_status (*observe)(st_drafter *d, int64_t pos, const float *state);
    /* The state observe was handed for position pos, NULL when none is kept for it (the prefix
     * cache stores them beside the target's KV rows and hands them back through observe);
     * state_width: its floats. NULL and 0 for drafters that read no states. */
    const float *(*state)(const st_drafter *d, int64_t pos);
    int64_t state_width;
    /* The drafter's own K/V rows (an EAGLE head's), for the prefix cache; 0 and NULL for
     * drafters without. Row t of an EAGLE head reads token t+1 and the target's state at t.
     * own_valid: the rows [0, n) that hold committed tokens now; own_save copies rows
     * [pos, pos + n) of them to dst (n * own_row_bytes); own_load appends n rows saved so after
     * the ones it holds (a fresh sequence: after reset, and after observe has been handed the
     * states of every position the rows read). */
    size_t own_row_bytes;
    int64_t (*own_valid)(const st_drafter *d);
    st_status (*own_save)(st_drafter *d, int64_t pos, int64_t n, void *dst);
    st_status (*own_load)(st_drafter *d, int64_t n, const void *src);
    /* Forgets the history: the next proposal (and observe, from position 0) is for a new
     * sequence (a request joining the engine's slot). ms and evals keep accumulating. */
    void (*reset)(st_drafter *d);
    void (*free)(st_drafter *d);
    double ms;     /* time spent drafting, accumulated by the drafter */
    int64_t evals; /* tokens the drafter's model evaluated (0 for model-free drafters) */
    /* the last proposal's seconds catching up on the committed tokens (level 0 included) and
     * in its level passes (model drafters; the auto controller plans with them) */
    double catch_s, levels_s;
    int64_t catch_rows; /* ... and the rows that catch-up evaluated */
    int32_t conf;       /* confidence class of the last proposal, 0..15 (the auto controller
                         * calibrates acceptance per class; model drafters leave it 0) */
};

/* EAGLE-2 expansion of draft level `level` >= 1 (its K*K candidates start at
 * st_tree_level_base(K, level)): pick[k] (k < K) = the in-level index of the k-th best candidate
 * by st_ranks_before, skipping nonexistent ones (score -INFINITY); -1 when fewer than k+1 exist.
 * parents[k] = its candidate index (the level's part of level_parents), written only for
 * k < n_parents. */
void st_draft_expand_level(const float *scores, int64_t K, int64_t level, int64_t *parents,
                           int64_t n_parents, int64_t *pick);

/* n-gram (prompt lookup) drafter: continuations of the longest matching suffix, merged into a
 * trie, scored by the fraction of matches through each node. No model. An index of the
 * min_match-grams of the history (which must only grow between calls; a shorter one resets the
 * index) makes a step cost independent of the context length; max_hist bounds the history, whose
 * index is committed as it grows (at once with populate). */
st_status st_drafter_ngram_create(int32_t min_match, int32_t max_match, int32_t breadth,
                                  int64_t max_k, int64_t max_s, int64_t max_hist, bool populate,
                                  st_drafter **out);

/* Draft-model drafter (SGLang STANDALONE): a small model with the target's vocabulary, its own
 * KV cache, top-K expansion per level with cumulative probabilities, and draft-tree attention
 * to each node's real ancestors. Model drafters run on the thread pool of `with`, the target's
 * session (st_session_create_shared: a drafter never runs while its target does; NULL: one
 * thread of its own). */
st_status st_drafter_model_create(const st_model *draft, const st_model *target, int32_t n_ctx,
                                  st_session *with, bool populate, int64_t max_k, int64_t max_s,
                                  st_drafter **out);

/* Bytes a model drafter over `draft` (STANDALONE, EAGLE or EAGLE-3) with n_ctx positions beside
 * the target's session `with` commits at most as its positions are used: its session's region
 * (st_session_context_bytes) and an EAGLE head's target states. SIZE_MAX on overflow. The
 * drafters below put both in regions committed as used, or at once with populate (the engine's
 * choice, by the total of its slots). */
size_t st_drafter_model_context_bytes(const st_model *draft, int32_t n_ctx, const st_session *with);

/* EAGLE-1/2 drafter (SGLang EAGLE with EAGLE-2's dynamic tree): the head from
 * st_eagle_head_load for this target, with its own KV cache and the same expansion and
 * real-ancestor attention as the draft-model drafter; it reads the target's states through
 * observe. Keeps one state per position (n_ctx + 1 rows of n_embd floats). */
st_status st_drafter_eagle_create(const st_model *head, const st_model *target, int32_t n_ctx,
                                  st_session *with, bool populate, int64_t max_k, int64_t max_s,
                                  st_drafter **out);

/* EAGLE-3 drafter: the same over an EAGLE-3 head (st_eagle3_head_load). It reads the target's
 * captured layers through observe: the caller sets the target session's capture to the head's
 * n_cap / cap_layer (st_session_set_capture). Keeps n_ctx + 1 rows of n_cap * n_embd floats. */
st_status st_drafter_eagle3_create(const st_model *head, const st_model *target, int32_t n_ctx,
                                   st_session *with, bool populate, int64_t max_k, int64_t max_s,
                                   st_drafter **out);

/* One drafting algorithm (algos.c: the table of them). */
typedef struct st_draft_algo {
    st_spec_algo algo;
    const char *name; /* SGLang's --speculative-algorithm name */
    int needs_model;  /* spec.draft_model: a draft model or an EAGLE head */
    /* Makes one slot's drafter for proposals of at most (K, S), with n_ctx positions, on the
     * pool of `with` (the target's session), its context-sized memory committed at once when
     * populate; NULL for plain decoding. */
    st_status (*create)(const st_spec_params *sp, const st_model *target, int32_t n_ctx,
                        st_session *with, bool populate, int64_t K, int64_t S, st_drafter **out);
    /* Bytes of context-sized memory one slot's drafter commits at most (SIZE_MAX: overflow); NULL
     * for plain decoding. */
    size_t (*context_bytes)(const st_spec_params *sp, int32_t n_ctx, const st_session *with);
    /* Prepares the target's session once for the slots' drafters (NULL: nothing to do). */
    st_status (*attach)(const st_spec_params *sp, st_session *target);
} st_draft_algo;

/* The row of algorithm a (an unknown value reads as NONE's row). */
const st_draft_algo *st_draft_algo_of(st_spec_algo a);

#endif /* ST_DRAFTER_H */
