/*
 * ctl.h: the `auto` controller, the interface the engine calls each step. It decides whether to
 * draft, which pool (K, S) a model drafter proposes, and how many ranked candidates to verify
 * (the N-1 best, as st_tree_organize selects them, plus the root; 1: plain), by one value rule:
 * expected emitted tokens per unit of measured step time (docs/AUTO.md; constants: ctl_const.h).
 * With a fixed shape (all of K, S, N given) it does none of this.
 */
#ifndef ST_CTL_H
#define ST_CTL_H

#include "core/core.h"

typedef struct st_ctl st_ctl;

/* bs sequences, a pool (K, S), at most N tree tokens; autotune: 1 for `auto`, 0 for a fixed
 * shape; draft_weight_ratio: a draft model's weight bytes over the target's (0: no model). */
st_status st_ctl_create(int32_t bs, int64_t K, int64_t S, int32_t N, int autotune,
                        double draft_weight_ratio, st_ctl **out);
void st_ctl_free(st_ctl *c);

/* A model drafter's pool under `auto`: K (k_auto) and S (s_auto) chosen each step up to these,
 * else the pool's. Drafters without a model keep their pool. */
#define ST_CTL_AUTO_K 4
#define ST_CTL_AUTO_S 8
#define ST_CTL_AUTO_N 16
void st_ctl_auto_shape(st_ctl *c, int k_auto, int s_auto);

/* Whether this step drafts for na active sequences and, if so, the pool (*K, *S) to propose. */
int st_ctl_want_draft(st_ctl *c, int32_t na, int64_t *K, int64_t *S);

/* A model drafter's measured proposal of pool (K, S): catch_s to catch up on `rows` committed
 * tokens since its last proposal (level 0 included), levels_s for its S-1 level passes. */
void st_ctl_draft_cost(st_ctl *c, int64_t K, int64_t S, double catch_s, int64_t rows,
                       double levels_s);

/* Ranks the candidates of active slot a (sequence b, n_hist tokens of history) as
 * st_tree_organize selects them, estimates each node's acceptance (conf: the drafter's
 * confidence class, 0..15) and keeps the proposal as a shadow. */
void st_ctl_rank(st_ctl *c, int32_t a, int32_t b, int64_t K, int64_t S, const float *scores,
                 const int32_t *tokens, const int64_t *level_parents, int64_t n_hist, int32_t conf);

/* Active slot a (sequence b, n_hist tokens of history) proposes nothing this step (its request
 * speculates not at all): no ranked nodes, and no catch-up is counted for its drafter. */
void st_ctl_skip(st_ctl *c, int32_t a, int32_t b, int64_t n_hist);

/* The tree size for the na slots ranked this step: 1 (plain) or 2..N; *exp_gain its expected
 * speed-up. A fixed shape: n_real_max + 1 (the most candidates a slot drafted), at most N. */
int32_t st_ctl_choose(st_ctl *c, int32_t na, int64_t n_real_max, double *exp_gain);

/* The tree size of each of the na slots ranked this step (a batch's trees may differ: TREE_SPEC
 * §2.5), by the same value rule over the total T of tree tokens: for each T, each node goes to
 * the sequence whose next ranked node adds the most expected tokens (its own acceptance
 * evidence scaling the buckets'), the time is the measured verify of T tokens. cap[a]: slot a's
 * most (0: N; 1: plain); n_real[a] its drafted candidates (a fixed shape verifies them, up to
 * N). Writes n[0..na) (1: that sequence's root only) and returns T (na: a plain step). */
int64_t st_ctl_choose_each(st_ctl *c, int32_t na, const int32_t *cap, const int64_t *n_real,
                           int32_t *n, double *exp_gain);

/* The candidate ranked j-th for slot a (else -1); the deepest of its first n-1 ranked nodes. */
int64_t st_ctl_ranked(const st_ctl *c, int32_t a, int32_t j);
int32_t st_ctl_depth(const st_ctl *c, int32_t a, int32_t n);

/* The end of a step: drafted (the drafters proposed), n its tree size (1: plain), na sequences,
 * emitted tokens, t_step its seconds from before proposing, t_fwd from after the choice of n. */
void st_ctl_step_end(st_ctl *c, int drafted, int32_t n, int32_t na, int64_t emitted, double t_step,
                     double t_fwd);
/* The same for a step whose trees had T tokens in all (na: plain). */
void st_ctl_step_end_ragged(st_ctl *c, int drafted, int64_t T, int32_t na, int64_t emitted,
                            double t_step, double t_fwd);

/* Scores sequence b's pending shadows against its history (done: it ended, they are dropped). */
void st_ctl_observe(st_ctl *c, int32_t b, const int32_t *hist, int64_t n_hist, int done);

/* What the controller makes of drafting now (all zero for a fixed shape). */
void st_ctl_outlook(const st_ctl *c, st_spec_outlook *out);

/* For the tests: plain steps (seconds a token of one sequence; seconds for na), a verify of T tree
 * tokens, t1 (a plain token, all steps), the last plan (N = 0 before one), E[0..nmax]: expected
 * accepted nodes of the n-1 best of pool (K, S)'s EAGLE-2 tree, depth d's r-th child accepted
 * after its parent w.p. q[(d-1)*qk+r] (E[0] = E[1] = 0). */
void st_ctl_time_plain(st_ctl *c, double per_token);
void st_ctl_time_plain_batch(st_ctl *c, int32_t na, double seconds);
void st_ctl_time_verify(st_ctl *c, int64_t T, double seconds);
double st_ctl_t1(const st_ctl *c);
void st_ctl_last_plan(const st_ctl *c, int64_t *K, int64_t *S, int32_t *N, double *gain);
void st_ctl_tree_expect(const double *q, int32_t qk, int64_t K, int64_t S, int32_t nmax, double *E);

#endif /* ST_CTL_H */
