/*
 * spectree_tree.h: the tree core of the public API (TREE_SPEC §1-4): draft trees, the verify
 * mask layouts, verification, the KV commit, the target-verify attention backends and the
 * verify-mask owner. Included by spectree.h; include that instead.
 */
#ifndef SPECTREE_TREE_H
#define SPECTREE_TREE_H
#ifndef SPECTREE_H
#error "include spectree.h, not spectree_tree.h"
#endif

/* ---------------------------------------------------------------------------------------------
 * Tree speculative decoding: draft tree, verify mask, verification, KV commit (TREE_SPEC §1-4)
 *
 * One step for a batch of bs requests (K = topk, S = depth, N = tree nodes incl. the root):
 *
 *     st_tree_organize(&shape, scores, tokens, level_parents, sel, drafts, parent_list);
 *     st_tree_build(&shape, &in, &tree, &mask);            // positions, lists, verify mask
 *     ... target forward over tree.tokens at tree.positions with the mask ...
 *     st_verify_tree_greedy(bs, N, S, &tree, target_argmax, predicts, accept_index, n_accepted);
 *     st_tree_commit_rows(kv, ..., nodes_of(accept_index[b]), n_accepted[b] + 1);  // per request
 *
 * Every function works on caller-owned flat arrays (row-major, shapes given per parameter),
 * allocates nothing, keeps no state and is safe to call from several threads on disjoint
 * outputs. Global node index: node i of request b is b*N + i. On any error the function returns
 * a negative st_status with the detail in st_last_error(); st_tree_build writes nothing on error,
 * the other functions may have written part of their outputs, which are then unspecified.
 * ------------------------------------------------------------------------------------------- */

#define ST_TREE_MAX_N 1024     /* most tree nodes per request (SGLang's JIT host check) */
#define ST_TREE_MAX_N_BITS 64  /* most tree nodes per request for ST_MASK_BITS */
#define ST_TREE_MAX_TOPK 1024  /* most candidates per node */
#define ST_TREE_MAX_DEPTH 1024 /* most draft levels */

/* Verify-mask layouts (TREE_SPEC §2.2). The values of the first three are SGLang's. */
typedef enum st_mask_layout {
    /* Bytes (0/1), per request N rows of L_b + N cells: cells [0, L_b) are the committed-prefix
     * columns, cell L_b + j is tree node j. Request b starts at byte N*sum(L_i, i<b) + b*N*N;
     * total N*sum(L_b) + bs*N*N bytes. The layout a dense (FlashInfer-style) backend reads. */
    ST_MASK_FULL = 0,
    /* Bytes (0/1), cell (b*N + t)*N + j; bs*N*N bytes. Only the N x N tree block. */
    ST_MASK_QLEN = 1,
    /* One little-endian word of W bytes per row (b, t) at byte (b*N + t)*W, bit j = column j;
     * W = st_tree_mask_word_bytes(N) = 1, 2, 4, 8 for N <= 8, 16, 32, 64. bs*N*W bytes. */
    ST_MASK_BITS = 2,
    /* No mask (a chain verified with causal attention, or a backend that derives visibility). */
    ST_MASK_NONE = 3,
} st_mask_layout;

/* Dimensions of a draft tree batch. */
typedef struct st_tree_shape {
    int64_t bs;    /* requests, >= 1 */
    int64_t topk;  /* K: candidates per node, 1..ST_TREE_MAX_TOPK */
    int64_t depth; /* S: draft levels, 1..ST_TREE_MAX_DEPTH */
    int64_t n;     /* N: tree nodes per request including the root, 1..ST_TREE_MAX_N */
} st_tree_shape;

/* Draft results (TREE_SPEC §1) hold K candidates at level 0, then K*K per level (K children of
 * each of the K nodes expanded at the level above). st_tree_level_base: index of level `level`'s
 * first candidate (0, K, K + K*K, ...); st_tree_candidate_level: the level of candidate cand
 * (its K*K block's parent slot is (cand - base) / K). -1 for arguments out of range. */
int64_t st_tree_level_base(int64_t topk, int64_t level);
int64_t st_tree_candidate_level(int64_t topk, int64_t cand);

/* M = K + (S-1)*K*K, the candidates per request the drafter scores (TREE_SPEC §1.3); -1 when K
 * or S is out of range. Candidate g of level 0 is g in [0, K); of level i >= 1 it is
 * K + (i-1)*K*K + p*K + c (p: the p-th kept node of level i-1, c: child rank). */
int64_t st_tree_n_candidates(int64_t topk, int64_t depth);

/* Width of parent_list: K*(S-1) + 1, or 0 when S == 1 (TREE_SPEC §1.4); -1 when out of range. */
int64_t st_tree_parent_width(int64_t topk, int64_t depth);

/* Width of the per-level parents that st_tree_organize concatenates: (K+1) + (S-1)*K, i.e.
 * level 0's [-1, 0, 1, ..., K-1] followed by the K kept global indices of each level 1..S-1;
 * -1 when out of range. */
int64_t st_tree_level_parents_width(int64_t topk, int64_t depth);

/* Bytes per ST_MASK_BITS word for N tree nodes: 1, 2, 4 or 8; 0 when N is outside 1..64. */
size_t st_tree_mask_word_bytes(int64_t n);

/* Bytes of a verify mask in `layout` for bs requests of n nodes whose committed lengths sum to
 * seq_lens_sum (only ST_MASK_FULL uses it): FULL N*sum + bs*N*N, QLEN bs*N*N, BITS bs*N*W,
 * NONE 0. Size a buffer once for the largest batch and context and reuse it.
 * Returns ST_ERR_INVALID for a bad layout or dimension (n > 64 for BITS), ST_ERR_RANGE when the
 * size overflows size_t. */
st_status st_tree_mask_bytes(st_mask_layout layout, int64_t bs, int64_t n, int64_t seq_lens_sum,
                             size_t *bytes);

/* organize_draft_results (TREE_SPEC §1.4): per request, keeps the N-1 candidates with the
 * largest cumulative score and returns them sorted by ascending candidate index, so that a
 * parent always precedes its children.
 *
 *   scores           (bs, M) in: cumulative path scores, levels concatenated (0: K, i: K*K)
 *   tokens           (bs, M) in: the candidates' token ids, same layout
 *   level_parents    (bs, st_tree_level_parents_width) in, or NULL: per-level parents
 *   top_scores_index (bs, N-1) out: kept candidate indices, ascending
 *   draft_tokens     (bs, N-1) out: tokens[b][top_scores_index[b][j]]
 *   parent_list      (bs, st_tree_parent_width) out, or NULL (NULL iff level_parents is NULL):
 *                    the first parent_width entries of each level_parents row (the last
 *                    level's parents are never needed)
 *
 * Order: a higher score ranks first; equal scores (-0.0 == 0.0) rank the lower index first;
 * NaN ranks below every number (NaNs among themselves by lower index). This is a total order,
 * so the selection is deterministic and equals a stable descending sort (torch.topk leaves ties
 * implementation-defined). O(M log N) per request with a heap kept in the output row: no
 * scratch. Requires N-1 <= M (ST_ERR_INVALID otherwise). */
st_status st_tree_organize(const st_tree_shape *shape, const float *scores, const int32_t *tokens,
                           const int64_t *level_parents, int64_t *top_scores_index,
                           int32_t *draft_tokens, int64_t *parent_list);

/* Inputs of st_tree_build (the outputs of st_tree_organize plus the roots and lengths). */
typedef struct st_tree_input {
    const int32_t *root_tokens;      /* (bs): node 0 of each request, the last bonus token */
    const int64_t *parent_list;      /* (bs, st_tree_parent_width); may be NULL if that is 0 */
    const int64_t *top_scores_index; /* (bs, N-1): each entry in [0, M); may be NULL if N == 1 */
    const int32_t *draft_tokens;     /* (bs, N-1); may be NULL if N == 1 */
    const int64_t *seq_lens;         /* (bs): committed KV length L_b, 0 <= L_b <= INT32_MAX-S */
} st_tree_input;

/* A built tree: caller-owned arrays of bs*N entries each (row b = request b), written by
 * st_tree_build and read by the verifiers. */
typedef struct st_tree {
    int32_t *tokens;         /* (bs, N): root then the drafts: the target's input ids */
    int32_t *positions;      /* (bs, N): L_b + depth of the node (root depth 0) */
    int64_t *retrieve_index; /* (bs, N): global index b*N + i */
    int64_t *next_token;     /* (bs, N): first (smallest) child of node i, or -1 */
    int64_t *next_sibling;   /* (bs, N): next larger sibling of node i, or -1 */
} st_tree;

/* Where and how st_tree_build writes the verify mask. */
typedef struct st_tree_mask {
    st_mask_layout layout;
    /* ST_MASK_FULL only: nonzero sets every prefix cell to 1 each call (what a backend that
     * reads whole rows needs: SGLang before PR #32886); zero never writes a prefix cell (they
     * keep whatever the buffer held, which may be uninitialised memory). */
    int fill_prefix;
    void *data;   /* the mask buffer; may be NULL for ST_MASK_NONE */
    size_t bytes; /* its size, at least st_tree_mask_bytes(layout, bs, N, sum L_b) */
} st_tree_mask;

/* build_tree_kernel_efficient with SGLang's hardened semantics (TREE_SPEC §2.3-2.4).
 *
 * Writes, per request b: out->tokens = [root_b, drafts...]; out->positions = L_b + depth;
 * out->retrieve_index[b][i] = b*N + i; next_token / next_sibling as linked lists of children
 * in ascending node index (every entry written: no -1 pre-fill needed); and the mask rows:
 * row t = {root} U {t} U {ancestors of t}. Every cell of a QLEN or BITS mask and every tree
 * cell [L_b, L_b+N) of a FULL row is written on every call, so those buffers need no
 * initialisation; FULL prefix cells are written (to 1) only with fill_prefix. ST_MASK_NONE
 * writes no mask. The cost is O(bs*N*N) plus, with fill_prefix, the N*sum(L_b) prefix bytes.
 *
 * Node j+1 is candidate g = top_scores_index[b][j]; its parent is the root when g/K == 0, else
 * the node whose candidate equals parent_list[b][g/K], searched among this request's N-1
 * entries only. Malformed trees (missing parent, cycle) are truncated safely: a node whose
 * parent is not found is left out of the lists, the mask/position walk toward the root stops
 * there and after S steps at most, and nothing is read outside the arrays.
 *
 * Returns ST_ERR_INVALID for a bad shape (K, S, N, bs out of range; N > 64 with BITS), a NULL
 * array or a bad layout; ST_ERR_RANGE for a top_scores_index entry outside [0, M) (which is
 * also what keeps every parent_list index g/K inside its row), an L_b outside
 * [0, INT32_MAX - S], or a mask buffer smaller than needed. Nothing is written on error. */
st_status st_tree_build(const st_tree_shape *shape, const st_tree_input *in, const st_tree *out,
                        const st_tree_mask *mask);

/* verify_tree_greedy (TREE_SPEC §3.1): walks each request's tree from the root, at every level
 * accepting the first child (in list order) whose token equals the target's prediction at the
 * last accepted node, for at most `steps` levels.
 *
 *   tree             reads tokens (the candidates), retrieve_index (values in [0, bs*N)),
 *                    next_token, next_sibling (values -1 or in [0, N)); positions unused
 *   target_predict   (bs*N) in, indexed by global node index: the target's token after node x
 *   predicts         (bs*N) out: predicts[x] = target_predict[x] for x on the accepted path
 *                    (the last one is the bonus token); -1 everywhere else
 *   accept_index     (bs, steps+1) out: global indices of root, accepted nodes; then -1
 *   accept_token_num (bs) out: k, the accepted draft tokens (bonus not counted)
 *
 * Position-coupled sampling (DESIGN.md invariant 1) is this same function: pass as
 * target_predict[x] the target's own sample at node x, drawn with the uniform for absolute
 * position positions[x] + 1 (a pure function of (seed, position)). A child is then accepted
 * iff its token equals that sample, otherwise the sample itself is emitted, so the emitted
 * tokens equal those of plain sequential sampling.
 *
 * Returns ST_ERR_INVALID for bad dimensions (bs >= 1, 1 <= N <= ST_TREE_MAX_N,
 * 0 <= steps <= ST_TREE_MAX_DEPTH), a NULL array or a cycle in a sibling list; ST_ERR_RANGE
 * for a list or retrieve_index value outside its array. */
st_status st_verify_tree_greedy(int64_t bs, int64_t n, int64_t steps, const st_tree *tree,
                                const int32_t *target_predict, int32_t *predicts,
                                int64_t *accept_index, int64_t *accept_token_num);

/* The target's token after global node x (the logits of node x, argmax or sampled): computed on
 * demand, so that a verify forward can defer its output layer to the nodes that matter. */
typedef st_status (*st_target_fn)(void *user, int64_t x, int32_t *token);

/* st_verify_tree_greedy with the target's tokens computed on demand: target(user, x, &tok) is
 * called once for each node x the walk visits (the root, then each accepted node, in path
 * order) and for no other node. Outputs and errors are exactly those of st_verify_tree_greedy
 * given target_predict[x] = that token (which is how st_verify_tree_greedy is implemented); an
 * error returned by target is returned as is. */
st_status st_verify_tree_walk(int64_t bs, int64_t n, int64_t steps, const st_tree *tree,
                              st_target_fn target, void *user, int32_t *predicts,
                              int64_t *accept_index, int64_t *accept_token_num);

/* tree_speculative_sampling_target_only, legacy AOT form (TREE_SPEC §3.2): one coin per sibling
 * group, child accepted iff coin <= prob_acc / max(threshold_acc, 1e-9) or its target probability
 * >= threshold_single; the final token is sampled from the residual at the last accepted node.
 *
 *   tree          as for st_verify_tree_greedy; tokens of tested children must be in [0, V)
 *   target_probs  (bs, N, V) in: the target distribution at each node
 *   coins         (bs, N) in: uniform coins; coins[b][x] is used for the children of node x
 *   coins_final   (bs) in: the coin of the final (bonus) sample
 *   predicts, accept_index, accept_token_num: as for st_verify_tree_greedy, except the last
 *                 accepted node's predicts entry holds the sampled token
 *
 * SGLang passes a zeroed draft_probs (bs, N, V) that the kernel marks with the rejected
 * children's target probabilities and reads back only at the last accepted node and only when
 * the walk stopped early. Since a node's coin, children and distribution are fixed, the walk
 * from a node always rejects the same children, so the marked cells read back are exactly the
 * tokens of all children of that node: this function excludes those directly and gives
 * bitwise the same result with no (bs, N, V) scratch and no per-step zeroing. Accumulations
 * (prob_acc, the residual sum and its prefix sums) are in double; the residual is
 * max(q - p, 0) in float as upstream (NaN counts as 0). Rows with no positive residual fall
 * back to the last token with positive residual, else V-1. O(bs*(N + V)).
 *
 * Returns what st_verify_tree_greedy returns, and ST_ERR_INVALID for V < 1 or a threshold
 * outside [0, 1]; ST_ERR_RANGE for a tested child token outside [0, V). */
st_status st_verify_tree_target_only(int64_t bs, int64_t n, int64_t steps, int64_t n_vocab,
                                     const st_tree *tree, const float *target_probs,
                                     const float *coins, const float *coins_final,
                                     float threshold_single, float threshold_acc, int32_t *predicts,
                                     int64_t *accept_index, int64_t *accept_token_num);

/* Moves the accepted tree nodes' KV rows into place for one request (DESIGN.md "KV cache",
 * TREE_SPEC §4.3 move_kv_cache). The KV cache holds n_planes planes (e.g. 2*n_layer for K and
 * V); row r of plane p is the row_bytes bytes at kv + p*plane_stride + r*row_bytes. The N tree
 * nodes were written to rows [pos, pos+N); accepted node accept_nodes[i] is moved to row pos+i
 * in every plane (memmove; rows already in place are skipped, so at most n_accept-1 rows move
 * per plane and a chain costs nothing).
 *
 *   kv, kv_bytes  the buffer and its size: (n_planes-1)*plane_stride + (pos+N)*row_bytes at least
 *   plane_stride  bytes between planes; >= (pos+N)*row_bytes when n_planes > 1
 *   accept_nodes  (n_accept) node-in-request indices: root (0) first, strictly increasing, < N
 *                 (accept_index[b][i] - b*N for trees from st_tree_build); 1 <= n_accept <= N
 *
 * Returns ST_ERR_INVALID for NULL pointers, row_bytes == 0, n_planes < 1, N outside
 * 1..ST_TREE_MAX_N, accept_nodes not starting at 0 or not increasing; ST_ERR_RANGE for pos < 0,
 * an accepted node >= N, an n_accept outside [1, N], or rows beyond kv_bytes. Nothing is moved
 * on error. */
st_status st_tree_commit_rows(void *kv, size_t kv_bytes, size_t row_bytes, int64_t n_planes,
                              size_t plane_stride, int64_t pos, int64_t n,
                              const int64_t *accept_nodes, int64_t n_accept);

/* ---------------------------------------------------------------------------------------------
 * Target-verify attention backends, the verify-mask owner, verify forward and commit
 * ------------------------------------------------------------------------------------------- */

/* Target-verify attention backends (DESIGN.md "Attention backends"). */
typedef enum st_attn_backend {
    ST_ATTN_CASCADE = 0, /* prefix without a mask, then the tree block; a chain: causal, no mask */
    ST_ATTN_DENSE = 1,   /* full rows: prefix columns and tree block (FlashInfer's shape) */
} st_attn_backend;

/* What a backend reads in target-verify (the generalisation of SGLang's
 * target_verify_reads_custom_mask()). */
typedef enum st_attn_reads {
    ST_READS_NOTHING = 0,    /* chains (topk 1) with causal attention */
    ST_READS_TREE_BLOCK = 1, /* only the N x N tree block */
    ST_READS_FULL_ROWS = 2,  /* whole rows with the prefix columns: needs the prefix fill */
} st_attn_reads;

/* What backend b reads when verifying trees of branching factor topk (topk 1 = a chain). */
st_attn_reads st_attn_backend_reads(st_attn_backend b, int64_t topk);
const char *st_attn_backend_name(st_attn_backend b);
/* "cascade" or "dense"; ST_ERR_INVALID otherwise. */
st_status st_attn_backend_parse(const char *name, st_attn_backend *out);

/* The verify-mask owner: one buffer, sized once for the largest batch, tree and context, reused
 * every step. For `dense` it holds FULL_MASK rows (filled prefix); for `cascade` the bit-packed
 * tree block (bytes when N > 64); for cascade chains nothing is written at all. */
typedef struct st_verify_mask st_verify_mask;

/* max_ctx_sum: the largest sum of committed lengths of a batch (only dense uses it). */
st_status st_verify_mask_create(st_attn_backend backend, int64_t max_bs, int64_t max_n,
                                int64_t max_ctx_sum, st_verify_mask **out);
void st_verify_mask_free(st_verify_mask *vm);
/* Fills *out (layout, fill_prefix, buffer) for one step's st_tree_build from what the backend
 * reads for this topk, and remembers the step (bs, n) for st_session_verify. ST_ERR_RANGE when
 * the step exceeds the sizes given at creation. */
st_status st_verify_mask_prepare(st_verify_mask *vm, int64_t topk, int64_t bs, int64_t n,
                                 int64_t seq_lens_sum, st_tree_mask *out);

/* A ragged step (TREE_SPEC §2.5): request b has n[b] nodes (1..max_n, root included; 1 is a
 * plain step inside the same forward) and committed length seq_lens[b]. Request b's mask is its
 * own single-request mask of n[b] nodes, the requests' blocks one after another; out[b] (bs
 * entries) describes block b for st_tree_build with shape {1, K, S, n[b]}. The layout is the
 * one st_verify_mask_prepare picks for the largest n[b]; with every n[b] equal the bytes are
 * exactly its. Remembers the step for st_session_verify_ragged. ST_ERR_RANGE when the step
 * exceeds the sizes given at creation. */
st_status st_verify_mask_prepare_ragged(st_verify_mask *vm, int64_t topk, int64_t bs,
                                        const int64_t *n, const int64_t *seq_lens,
                                        st_tree_mask *out);

/* Target-verify forward: scores the bs trees of n nodes (tree->tokens at tree->positions) of
 * sequences seqs[0..bs) in one forward pass, with the attention of vm's backend over the mask
 * that vm's last st_verify_mask_prepare laid out and st_tree_build filled (bs and n must be that
 * step's). Node i of request b attends to the committed prefix [0, L_b) of its sequence and to
 * the tree nodes its mask row marks; its K/V are written to row L_b + i. The sequence lengths do
 * not change (st_session_commit does that). logits: (bs*n, n_vocab). Each node's logits are
 * bitwise those of decoding its path one token at a time. logits may be NULL: the output layer
 * is then deferred, and st_session_logits computes the logits of just the nodes a caller needs
 * (verification walks one path). Requires bs*n <= n_batch and L_b + n <= n_ctx. */
st_status st_session_verify(st_session *s, const st_verify_mask *vm, int64_t bs, int64_t n,
                            const int32_t *seqs, const st_tree *tree, float *logits);

/* st_session_verify for a ragged step prepared by st_verify_mask_prepare_ragged with the same
 * n[0..bs): request b's nodes are tree entries [o_b, o_b + n[b]), o_b = n[0] + ... + n[b-1],
 * built by st_tree_build as a single request (its list entries are indices within the request,
 * 0..n[b]-1); the forward runs sum n[b] tokens (no padding; at most n_batch). Node i of request
 * b writes K/V row L_b + i; logits (or st_session_logits) row o_b + i. */
st_status st_session_verify_ragged(st_session *s, const st_verify_mask *vm, int64_t bs,
                                   const int64_t *n, const int32_t *seqs, const st_tree *tree,
                                   float *logits);

/* The logits (n_vocab floats) of node i (0 <= i < bs*n) of the last st_session_verify called
 * with logits NULL, bitwise equal to what that call would have written in row i. Valid until
 * the next forward pass of the session (ST_ERR_INVALID after it). */
st_status st_session_logits(st_session *s, int64_t i, float *logits);

/* Commits one request after verification: the accepted nodes (root first, node-in-request
 * indices, increasing; accept_index[b][i] - b*n) move from rows [L, L+n) to [L, L+n_accept) in
 * every layer's K and V, the rest is released, and the sequence length grows by n_accept. */
st_status st_session_commit(st_session *s, int32_t seq, int64_t n, const int64_t *accept_nodes,
                            int64_t n_accept);

#endif /* SPECTREE_TREE_H */
