/*
 * ctl.h: the `auto` controller. It picks, step by step, how many drafted nodes to verify (the
 * tree of N nodes is the N-1 best-scored candidates of the drafter's (K, S) pool, as
 * st_tree_organize selects them, plus the root), or none, by maximizing the expected tokens per
 * second:
 *
 *   speed-up(N) = (tokens emitted, expected) * t1 / t(N tokens),   plain: 1
 *
 * - t1 is the measured time of a plain step per token; t(T) / t1 the measured cost of a verify
 *   step over T tree tokens (all sequences) in plain-token times, interpolated where not yet
 *   measured. Both are moving averages with preempted steps clipped, and a size that
 *   nearly pays is re-measured now and then.
 * - The expected tokens of a sequence are 1 (the bonus) plus the sum, over the selected nodes,
 *   of the probability that the node's whole path is accepted. That probability is calibrated
 *   online per bucket of (drafter confidence class, depth, drafter score): each proposal is
 *   kept as a "shadow" and scored against the tokens the sequence really emits next, whether
 *   it was verified or not, so the calibration keeps learning while speculation is off.
 *
 * It also owns the drafting policy: when to draft at all (a plain step now and then to keep t1
 * fresh; a draft model only once t1 is known, paused while its realized gain is negative, never
 * one that reads more than half the target's weight bytes). With a fixed shape (all of K, S, N
 * given) it does none of this: every step drafts and verifies what was drafted, up to N.
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

/* Whether this step of na sequences drafts at all (the engine also checks that the trees fit
 * the context). Under `auto`, proposals that keep ending in a plain step at this batch size are
 * made only one step in k, k such that they cost about 2% of the time (at most 16). */
int st_ctl_want_draft(const st_ctl *c, int32_t na);
void st_ctl_free(st_ctl *c);

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

/* Timing of a plain step (seconds per token) and of a verify step over T tree tokens. */
void st_ctl_time_plain(st_ctl *c, double per_token);
/* A plain step of na sequences that took `seconds`: t1, and the per-token time at that batch
 * size, which scales the expected speed-up of a tree for a batch of na (st_ctl_choose). */
void st_ctl_time_plain_batch(st_ctl *c, int32_t na, double seconds);
void st_ctl_time_verify(st_ctl *c, int64_t T, double seconds);
double st_ctl_t1(const st_ctl *c);

/* The end of a step: drafted (the drafters proposed), n its tree size (1: plain), na sequences,
 * emitted tokens, t_step its seconds from before proposing, t_fwd from after the choice, and
 * the draft model's mean seconds per evaluated token so far (<= 0: none yet). Records the
 * timing and runs the draft model's back-off. */
void st_ctl_step_end(st_ctl *c, int drafted, int32_t n, int32_t na, int64_t emitted, double t_step,
                     double t_fwd, double draft_s_per_token);

/* Scores sequence b's pending shadows against its history (call after tokens were appended);
 * done: the sequence has ended (pending shadows are dropped). */
void st_ctl_observe(st_ctl *c, int32_t b, const int32_t *hist, int64_t n_hist, int done);

#endif /* ST_CTL_H */
