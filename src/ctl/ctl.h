/*
 * ctl.h: the `auto` controller. It picks, step by step, how many drafted nodes to verify (the
 * tree of N nodes is the N-1 best-scored candidates of the drafter's (K, S) pool, as
 * st_tree_organize selects them, plus the root), or none, by maximizing the expected tokens per
 * second:
 *
 *   speed-up(N) = (tokens emitted, expected) / (na * (cv(na, N) + cp)),   plain: 1
 *
 * for a batch of na sequences, weighed against a plain step of the same batch:
 * - cv(na, N): the time of a verify step of na trees of N nodes over that of a plain step of na
 *   sequences, measured at that batch size (moving averages with preempted steps clipped). A
 *   tree is chosen only where it is measured; a size not yet measured at a batch size (its
 *   estimate from the curve of verify cost by total tokens, in plain-token times t1, coming
 *   near paying), or now and then one next to the best that nearly pays, is verified as a
 *   probe, all probes together losing at most 1% of the time (plus 8 plain-token times) against
 *   plain steps emitting the same tokens. A batch size whose plain step was never measured
 *   decodes plainly first. (The larger the batch, the cheaper its plain tokens and the less
 *   free verification is: this is where speculation must back off.)
 * - cp: proposing and ranking (drafting included), per sequence, in plain-token times of that
 *   batch: a tree must pay for its proposals too.
 * - The curve of verify cost by total tokens (in t1 times) is interpolated where not yet
 *   measured, and a size is never estimated below a smaller size measured often enough.
 * - The expected tokens of a sequence are 1 (the bonus) plus the sum, over the selected nodes,
 *   of the probability that the node's whole path is accepted. That probability is calibrated
 *   online per bucket of (drafter confidence class, depth, drafter score): each proposal is
 *   kept as a "shadow" and scored against the tokens the sequence really emits next, whether
 *   it was verified or not, so the calibration keeps learning while speculation is off.
 *
 * It also owns the drafting policy: when to draft at all (a plain step now and then to keep t1
 * fresh; a draft model only once t1 is known, never one that reads more than half the target's
 * weight bytes). With a fixed shape (all of K, S, N given) it does none of this: every step
 * drafts and verifies what was drafted, up to N.
 *
 * A model drafter (STANDALONE, EAGLE) costs time before its drafts can be judged, so under
 * `auto` the controller also plans each step's pool (K, S) before drafting (st_ctl_want_draft),
 * maximizing the predicted speed-up
 *
 *   (1 + E(K, S, N)) * t1 / (draft(K, S) + t(N)),   draft(K, S) = c_catch + (S-1) * c_level(K)
 *
 * over K <= the pool's K, S <= its S and N <= its N:
 * - E(K, S, N): the expected accepted nodes of the N-1 best nodes of an EAGLE-2 tree whose
 *   node at depth d that is its parent's r-th most likely child is accepted, once its parent
 *   is, with probability q(d, r); q is calibrated from the same shadows (per depth and sibling
 *   rank), unseen cells taking their prior from the cell above or beside them.
 * - c_catch, c_level(K): the drafter's measured time per step for catching up on the
 *   committed tokens and per level pass of K nodes (st_ctl_draft_cost), moving averages of
 *   their ratios to one sequence's plain token (as t(N)'s: a machine that slows down slows
 *   both; drafting is per sequence, so at na sequences it costs na times as much, while a
 *   plain token costs less). t1 is the plain token's time now: between plain steps (rare
 *   while drafting) the verify steps of sizes measured often enough track the machine's speed.
 * Where a pool was drafted, its realized speed-up (tokens per plain-token time of its recent
 * steps) is blended into its prediction, so that what the model misses (costs it does not
 * see, acceptance that depends on more than depth and rank) is learned per pool.
 * When no shape pays, it decodes plainly and, if the best comes within 0.8x of plain, drafts a
 * probe now and then (at most every 32 steps) so that the calibration follows the text, all
 * probes together costing at most 1% of the plain decoding time (a probe first catches each
 * running request up on its tokens since its last proposal; it is verified only if its drafts
 * look worth it); now and
 * then it drafts a shape next to the best to measure it.
 * For a batch (2 or more sequences), drafting is also judged by what it realized at that batch
 * size and its neighbours (2, 3-4, 5-8, ..., 33-64): time per token of its drafted steps (the
 * proposals and the verify, and the steps whose proposals were not verified), in plain-token
 * times of recent plain steps at each step's size (a plain step first where none is recent);
 * where it lost, the batch decodes plainly without proposals, drafting again only as a probe
 * once that evidence has faded. All probes together lose at most 1% of the time so far and of
 * the recent time, plus 8 plain-token times.
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
