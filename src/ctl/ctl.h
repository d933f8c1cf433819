/*
 * ctl.h: the `auto` controller, the interface the engine calls each step. Step by step it picks
 * how many drafted nodes to verify (the N-1 best-scored candidates of the drafter's (K, S) pool,
 * as st_tree_organize selects them, plus the root), or none, maximizing the expected tokens per
 * second against a plain step of the same batch from measured costs in one time unit (one
 * sequence's plain token); for a model drafter it also plans each step's pool before drafting.
 * It owns the drafting policy: when to draft at all, probes within a budget, and for a batch
 * the evidence of what drafting realized at that batch size. With a fixed shape (all of K, S, N
 * given) it does none of this. The rules, the formulas and the measurements behind them:
 * docs/AUTO.md; the constants: ctl_const.h.
 */
#ifndef ST_CTL_H
#define ST_CTL_H

#include "core/core.h"

typedef struct st_ctl st_ctl;

/* bs sequences, drafter pool (K, S) of M candidates, at most N tree tokens. autotune: 1 for
 * `auto`, 0 for a fixed shape. draft_weight_ratio: a draft model's weight bytes over the
 * target's, 0 for drafters without a model. */
st_status st_ctl_create(int32_t bs, int64_t K, int64_t S, int32_t N, int autotune,
                        double draft_weight_ratio, st_ctl **out);

/* The pool of a model drafter under `auto`: K and S are chosen each step (k_auto, s_auto: that
 * dimension is free, else it stays the pool's). Drafters without a model keep their pool. */
#define ST_CTL_AUTO_K 4
#define ST_CTL_AUTO_S 8
#define ST_CTL_AUTO_N 16
void st_ctl_auto_shape(st_ctl *c, int k_auto, int s_auto);

/* Whether this step drafts at all for na active sequences (the engine also checks that the
 * trees fit the context) and, if so, the pool (*K, *S) the drafters propose this step. Under
 * `auto`, a drafter without a model whose proposals keep ending in a plain step at this batch
 * size proposes only one step in k, k such that its proposals cost about 1% of the time (at
 * most 16); a model drafter drafts as its plan says. */
int st_ctl_want_draft(st_ctl *c, int32_t na, int64_t *K, int64_t *S);

/* A model drafter's measured time for one proposal of pool (K, S): catch_s to catch up on the
 * rows committed tokens since its last proposal (level 0 included), levels_s for its S-1
 * level passes. */
void st_ctl_draft_cost(st_ctl *c, int64_t K, int64_t S, double catch_s, int64_t rows,
                       double levels_s);

/* The expected accepted nodes E[n] (n = 0..nmax; E[0] = E[1] = 0) of the n-1 best nodes of an
 * EAGLE-2 tree of pool (K, S) whose node at depth d (1-based), its parent's r-th child, is
 * accepted given its parent with probability q[(d-1) * qk + r]. Exposed for the tests. */
void st_ctl_tree_expect(const double *q, int32_t qk, int64_t K, int64_t S, int32_t nmax, double *E);

/* The controller's current plan (K, S, N and its predicted speed-up; N = 0 before the first
 * plan). Exposed for the tests. */
void st_ctl_last_plan(const st_ctl *c, int64_t *K, int64_t *S, int32_t *N, double *gain);
void st_ctl_free(st_ctl *c);

/* What the controller makes of drafting now (st_spec_outlook; all zero for a fixed shape). */
void st_ctl_outlook(const st_ctl *c, st_spec_outlook *out);

/* Ranks the candidates of active slot a (sequence b, whose history has n_hist tokens) as
 * st_tree_organize would select them, estimates each node's acceptance and records the
 * proposal as a shadow. conf: the drafter's confidence class (0 .. 15). */
void st_ctl_rank(st_ctl *c, int32_t a, int32_t b, int64_t K, int64_t S, const float *scores,
                 const int32_t *tokens, const int64_t *level_parents, int64_t n_hist, int32_t conf);

/* The tree size for the na slots ranked this step: 1 (plain) or 2..N. *exp_gain: the expected
 * speed-up of that choice over plain decoding. A fixed shape: n_real_max + 1 (the most
 * candidates any slot drafted, plus the root), at most N. */
int32_t st_ctl_choose(st_ctl *c, int32_t na, int64_t n_real_max, double *exp_gain);

/* The candidate ranked j-th for slot a (j < the number ranked), else -1. */
int64_t st_ctl_ranked(const st_ctl *c, int32_t a, int32_t j);

/* Deepest level among the first n-1 ranked nodes of slot a. */
int32_t st_ctl_depth(const st_ctl *c, int32_t a, int32_t n);

/* Timing of a plain step (seconds per token) and of a verify step over T tree tokens, both of one
 * sequence (for the tests; the engine reports its steps through st_ctl_step_end). */
void st_ctl_time_plain(st_ctl *c, double per_token);
/* A plain step of na sequences that took `seconds`: t1, and the per-token time at that batch
 * size, which scales the expected speed-up of a tree for a batch of na (st_ctl_choose). */
void st_ctl_time_plain_batch(st_ctl *c, int32_t na, double seconds);
void st_ctl_time_verify(st_ctl *c, int64_t T, double seconds);
double st_ctl_t1(const st_ctl *c);

/* The end of a step: drafted (the drafters proposed), n its tree size (1: plain), na sequences,
 * emitted tokens, t_step its seconds from before proposing, t_fwd from after the choice of n.
 * Records the timing and, for a planned pool, its realized speed-up. */
void st_ctl_step_end(st_ctl *c, int drafted, int32_t n, int32_t na, int64_t emitted, double t_step,
                     double t_fwd);

/* Scores sequence b's pending shadows against its history (call after tokens were appended);
 * done: the sequence has ended (pending shadows are dropped). */
void st_ctl_observe(st_ctl *c, int32_t b, const int32_t *hist, int64_t n_hist, int done);

#endif /* ST_CTL_H */
