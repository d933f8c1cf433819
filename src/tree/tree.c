/*
 * tree.c: the draft tree of EAGLE-2-style tree speculative decoding (Li et al., EAGLE-2, 2024),
 * as SGLang builds it: organize_draft_results (best N-1 candidates by cumulative score) and
 * build_tree_kernel_efficient (positions, retrieve lists, verify mask in every layout), with
 * the hardened handling of malformed trees (TREE_SPEC.md §1.4, §2). Written from the spec;
 * caller-owned arrays, no allocation, O(bs*N*N) per step whatever the context length.
 */
#include "core/core.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

int64_t st_tree_level_base(int64_t topk, int64_t level) {
    if (topk < 1 || topk > ST_TREE_MAX_TOPK || level < 0 || level > ST_TREE_MAX_DEPTH)
        return -1;
    return level == 0 ? 0 : topk + (level - 1) * topk * topk;
}

int64_t st_tree_candidate_level(int64_t topk, int64_t cand) {
    if (topk < 1 || topk > ST_TREE_MAX_TOPK || cand < 0)
        return -1;
    return cand < topk ? 0 : 1 + (cand - topk) / (topk * topk);
}

int64_t st_tree_n_candidates(int64_t topk, int64_t depth) {
    if (depth < 1)
        return -1;
    return st_tree_level_base(topk, depth);
}

int64_t st_tree_parent_width(int64_t topk, int64_t depth) {
    if (topk < 1 || topk > ST_TREE_MAX_TOPK || depth < 1 || depth > ST_TREE_MAX_DEPTH)
        return -1;
    return depth == 1 ? 0 : topk * (depth - 1) + 1;
}

int64_t st_tree_level_parents_width(int64_t topk, int64_t depth) {
    if (topk < 1 || topk > ST_TREE_MAX_TOPK || depth < 1 || depth > ST_TREE_MAX_DEPTH)
        return -1;
    return (topk + 1) + (depth - 1) * topk;
}

size_t st_tree_mask_word_bytes(int64_t n) {
    if (n < 1 || n > ST_TREE_MAX_N_BITS)
        return 0;
    return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8;
}

/* Size of a mask in bytes; `fn` names the public caller in messages. */
static st_status mask_bytes(const char *fn, st_mask_layout layout, int64_t bs, int64_t n,
                            int64_t seq_lens_sum, size_t *bytes) {
    if (bs < 1)
        return st_fail(ST_ERR_INVALID, "%s: bs = %lld, must be >= 1", fn, (long long)bs);
    if (n < 1 || n > ST_TREE_MAX_N)
        return st_fail(ST_ERR_INVALID, "%s: n = %lld tree nodes, must be in 1..%d", fn,
                       (long long)n, ST_TREE_MAX_N);
    if (seq_lens_sum < 0)
        return st_fail(ST_ERR_INVALID, "%s: sum of seq_lens = %lld is negative", fn,
                       (long long)seq_lens_sum);
    size_t rows, cells = 0;
    if (!st_mul_size((size_t)bs, (size_t)n, &rows))
        return st_fail(ST_ERR_RANGE, "%s: bs*n overflows", fn);
    switch (layout) {
    case ST_MASK_FULL: {
        size_t prefix;
        if (!st_mul_size(rows, (size_t)n, &cells) ||
            !st_mul_size((size_t)n, (size_t)seq_lens_sum, &prefix) ||
            !st_add_size(cells, prefix, &cells))
            return st_fail(ST_ERR_RANGE, "%s: full mask of n*%lld + %lld*n*n cells overflows", fn,
                           (long long)seq_lens_sum, (long long)bs);
        *bytes = cells;
        return ST_OK;
    }
    case ST_MASK_QLEN:
        if (!st_mul_size(rows, (size_t)n, &cells))
            return st_fail(ST_ERR_RANGE, "%s: bs*n*n overflows", fn);
        *bytes = cells;
        return ST_OK;
    case ST_MASK_BITS: {
        size_t w = st_tree_mask_word_bytes(n);
        if (w == 0)
            return st_fail(ST_ERR_INVALID, "%s: n = %lld tree nodes, the bit-packed mask holds %d",
                           fn, (long long)n, ST_TREE_MAX_N_BITS);
        if (!st_mul_size(rows, w, &cells))
            return st_fail(ST_ERR_RANGE, "%s: bs*n*%zu overflows", fn, w);
        *bytes = cells;
        return ST_OK;
    }
    case ST_MASK_NONE:
        *bytes = 0;
        return ST_OK;
    }
    return st_fail(ST_ERR_INVALID, "%s: unknown mask layout %d", fn, (int)layout);
}

st_status st_tree_mask_bytes(st_mask_layout layout, int64_t bs, int64_t n, int64_t seq_lens_sum,
                             size_t *bytes) {
    if (!bytes)
        return st_fail(ST_ERR_INVALID, "st_tree_mask_bytes: bytes is NULL");
    return mask_bytes("st_tree_mask_bytes", layout, bs, n, seq_lens_sum, bytes);
}

static st_status check_shape(const char *fn, const st_tree_shape *s) {
    if (!s)
        return st_fail(ST_ERR_INVALID, "%s: shape is NULL", fn);
    if (s->bs < 1)
        return st_fail(ST_ERR_INVALID, "%s: bs = %lld, must be >= 1", fn, (long long)s->bs);
    if (s->topk < 1 || s->topk > ST_TREE_MAX_TOPK)
        return st_fail(ST_ERR_INVALID, "%s: topk = %lld, must be in 1..%d", fn, (long long)s->topk,
                       ST_TREE_MAX_TOPK);
    if (s->depth < 1 || s->depth > ST_TREE_MAX_DEPTH)
        return st_fail(ST_ERR_INVALID, "%s: depth = %lld, must be in 1..%d", fn,
                       (long long)s->depth, ST_TREE_MAX_DEPTH);
    if (s->n < 1 || s->n > ST_TREE_MAX_N)
        return st_fail(ST_ERR_INVALID, "%s: n = %lld tree nodes, must be in 1..%d", fn,
                       (long long)s->n, ST_TREE_MAX_N);
    size_t rows;
    if (!st_mul_size((size_t)s->bs, (size_t)s->n, &rows) || rows > (size_t)INT64_MAX / 2)
        return st_fail(ST_ERR_RANGE, "%s: bs*n overflows", fn);
    return ST_OK;
}

/* ---------------------------------------------------------------- organize_draft_results */

/* The selection order of st_tree_organize: true when candidate a ranks before candidate b. */
static bool ranks_before(const float *score, int64_t a, int64_t b) {
    return st_ranks_before(score[a], a, score[b], b);
}

/* The organize heap keeps the worst-ranked kept candidate on top. */
static bool worse_above(const void *a, const void *b, const void *score) {
    return ranks_before(score, *(const int64_t *)b, *(const int64_t *)a);
}

static bool larger_above(const void *a, const void *b, const void *ctx) {
    (void)ctx;
    return *(const int64_t *)a > *(const int64_t *)b;
}

/* Heapsort of v[0..len) ascending, in place: each popped maximum goes to the slot it frees. */
static void sort_ascending(int64_t *v, int64_t len) {
    int64_t n = 0;
    while (n < len) {
        const int64_t x = v[n]; /* its slot is the heap's next one */
        st_heap_push(v, sizeof *v, &n, &x, larger_above, NULL);
    }
    while (n > 1) {
        int64_t top;
        st_heap_pop(v, sizeof *v, &n, &top, larger_above, NULL);
        v[n] = top;
    }
}

st_status st_tree_organize(const st_tree_shape *shape, const float *scores, const int32_t *tokens,
                           const int64_t *level_parents, int64_t *top_scores_index,
                           int32_t *draft_tokens, int64_t *parent_list) {
    const char *fn = "st_tree_organize";
    st_status s = check_shape(fn, shape);
    if (s != ST_OK)
        return s;
    const int64_t bs = shape->bs, n = shape->n;
    const int64_t m = st_tree_n_candidates(shape->topk, shape->depth);
    const int64_t keep = n - 1;
    if (keep > m)
        return st_fail(ST_ERR_INVALID,
                       "%s: n - 1 = %lld tree nodes but only %lld candidates (topk %lld, depth "
                       "%lld)",
                       fn, (long long)keep, (long long)m, (long long)shape->topk,
                       (long long)shape->depth);
    if (!scores || !tokens || (keep > 0 && (!top_scores_index || !draft_tokens)))
        return st_fail(ST_ERR_INVALID,
                       "%s: scores, tokens, top_scores_index or draft_tokens is "
                       "NULL",
                       fn);
    if (!level_parents != !parent_list)
        return st_fail(ST_ERR_INVALID,
                       "%s: level_parents and parent_list must both be given or "
                       "both be NULL",
                       fn);

    for (int64_t b = 0; b < bs && keep > 0; b++) {
        const float *score = scores + b * m;
        int64_t *heap = top_scores_index + b * keep;
        int64_t len = 0;
        for (int64_t g = 0; g < m; g++) {
            if (len < keep)
                st_heap_push(heap, sizeof *heap, &len, &g, worse_above, score);
            else if (ranks_before(score, g, heap[0]))
                st_heap_replace_top(heap, sizeof *heap, len, &g, worse_above, score);
        }
        sort_ascending(heap, keep);
        for (int64_t j = 0; j < keep; j++)
            draft_tokens[b * keep + j] = tokens[b * m + heap[j]];
    }
    if (parent_list) {
        const int64_t w = st_tree_parent_width(shape->topk, shape->depth);
        const int64_t lw = st_tree_level_parents_width(shape->topk, shape->depth);
        for (int64_t b = 0; b < bs && w > 0; b++)
            memcpy(parent_list + b * w, level_parents + b * lw, (size_t)w * sizeof *parent_list);
    }
    return ST_OK;
}

/* ---------------------------------------------------------------- build_tree */

/* Index k in [0, len) of the first sel[k] == value, or -1. `ascending` says sel is strictly
 * increasing (every well-formed tree), which allows a binary search with the same answer. */
static int64_t find_candidate(const int64_t *sel, int64_t len, bool ascending, int64_t value) {
    if (ascending) {
        int64_t lo = 0, hi = len;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (sel[mid] < value)
                lo = mid + 1;
            else
                hi = mid;
        }
        return lo < len && sel[lo] == value ? lo : -1;
    }
    for (int64_t k = 0; k < len; k++)
        if (sel[k] == value)
            return k;
    return -1;
}

static void store_word_le(uint8_t *dst, uint64_t word, size_t w) {
    for (size_t i = 0; i < w; i++)
        dst[i] = (uint8_t)(word >> (8 * i));
}

static st_status check_build_args(const char *fn, const st_tree_shape *shape,
                                  const st_tree_input *in, const st_tree *out,
                                  const st_tree_mask *mask) {
    st_status s = check_shape(fn, shape);
    if (s != ST_OK)
        return s;
    const int64_t bs = shape->bs, n = shape->n, keep = n - 1;
    const int64_t m = st_tree_n_candidates(shape->topk, shape->depth);
    const int64_t pw = st_tree_parent_width(shape->topk, shape->depth);
    if (!in || !out || !mask)
        return st_fail(ST_ERR_INVALID, "%s: in, out or mask is NULL", fn);
    if (!in->root_tokens || !in->seq_lens ||
        (keep > 0 && (!in->top_scores_index || !in->draft_tokens)) ||
        (keep > 0 && pw > 0 && !in->parent_list))
        return st_fail(ST_ERR_INVALID,
                       "%s: an input array (root_tokens, seq_lens, top_scores_index, "
                       "draft_tokens, parent_list) is NULL",
                       fn);
    if (!out->tokens || !out->positions || !out->retrieve_index || !out->next_token ||
        !out->next_sibling)
        return st_fail(ST_ERR_INVALID,
                       "%s: an output array (tokens, positions, retrieve_index, "
                       "next_token, next_sibling) is NULL",
                       fn);
    int64_t sum = 0;
    for (int64_t b = 0; b < bs; b++) {
        int64_t len = in->seq_lens[b];
        if (len < 0 || len > INT32_MAX - shape->depth)
            return st_fail(ST_ERR_RANGE,
                           "%s: seq_lens[%lld] = %lld, must be in 0..%lld so that positions fit "
                           "int32",
                           fn, (long long)b, (long long)len, (long long)(INT32_MAX - shape->depth));
        if (__builtin_add_overflow(sum, len, &sum))
            return st_fail(ST_ERR_RANGE, "%s: the sum of seq_lens overflows", fn);
    }
    for (int64_t b = 0; b < bs; b++)
        for (int64_t j = 0; j < keep; j++) {
            int64_t g = in->top_scores_index[b * keep + j];
            if (g < 0 || g >= m)
                return st_fail(ST_ERR_RANGE,
                               "%s: top_scores_index[%lld][%lld] = %lld is outside the %lld "
                               "candidates of topk %lld, depth %lld",
                               fn, (long long)b, (long long)j, (long long)g, (long long)m,
                               (long long)shape->topk, (long long)shape->depth);
        }
    if (mask->layout == ST_MASK_NONE)
        return ST_OK;
    size_t need = 0;
    s = mask_bytes(fn, mask->layout, bs, n, sum, &need);
    if (s != ST_OK)
        return s;
    if (!mask->data)
        return st_fail(ST_ERR_INVALID, "%s: mask data is NULL", fn);
    if (mask->bytes < need)
        return st_fail(ST_ERR_RANGE, "%s: mask buffer of %zu bytes, layout %d needs %zu", fn,
                       mask->bytes, (int)mask->layout, need);
    return ST_OK;
}

st_status st_tree_build(const st_tree_shape *shape, const st_tree_input *in, const st_tree *out,
                        const st_tree_mask *mask) {
    st_status s = check_build_args("st_tree_build", shape, in, out, mask);
    if (s != ST_OK)
        return s;
    const int64_t bs = shape->bs, k_top = shape->topk, depth = shape->depth, n = shape->n;
    const int64_t keep = n - 1;
    const int64_t pw = st_tree_parent_width(k_top, depth);
    const st_mask_layout layout = mask->layout;
    uint8_t *cells = mask->data;
    const size_t word = layout == ST_MASK_BITS ? st_tree_mask_word_bytes(n) : 0;
    /* par[i]: parent node of node i, 0 for the root, -1 when its parent was not found. */
    int32_t par[ST_TREE_MAX_N];
    size_t full_base = 0; /* ST_MASK_FULL: N*sum(L_i, i<b) + b*N*N */

    for (int64_t b = 0; b < bs; b++) {
        const int64_t *sel = keep > 0 ? in->top_scores_index + b * keep : NULL;
        const int64_t *plist = pw > 0 && keep > 0 ? in->parent_list + b * pw : NULL;
        const int64_t len = in->seq_lens[b];
        int32_t *tok = out->tokens + b * n;
        int32_t *pos = out->positions + b * n;
        int64_t *ri = out->retrieve_index + b * n;
        int64_t *nt = out->next_token + b * n;
        int64_t *ns = out->next_sibling + b * n;

        tok[0] = in->root_tokens[b];
        if (keep > 0)
            memcpy(tok + 1, in->draft_tokens + b * keep, (size_t)keep * sizeof *tok);

        bool ascending = true;
        for (int64_t k = 1; k < keep; k++)
            ascending = ascending && sel[k - 1] < sel[k];
        par[0] = 0;
        for (int64_t i = 1; i < n; i++) {
            int64_t slot = sel[i - 1] / k_top; /* < pw since sel[i-1] < M was checked */
            if (slot == 0) {
                par[i] = 0;
            } else {
                int64_t k = find_candidate(sel, keep, ascending, plist[slot]);
                par[i] = k < 0 ? -1 : (int32_t)(k + 1);
            }
        }

        /* Linked lists: head insertion from the largest node down, so siblings ascend. */
        for (int64_t i = 0; i < n; i++) {
            ri[i] = b * n + i;
            nt[i] = -1;
            ns[i] = -1;
        }
        for (int64_t i = n - 1; i >= 1; i--) {
            int32_t p = par[i];
            if (p < 0)
                continue;
            ns[i] = nt[p];
            nt[p] = i;
        }

        /* Rows and positions: the root, the node itself, then ancestors for at most S steps. */
        for (int64_t t = 0; t < n; t++) {
            uint8_t *row = NULL;
            if (layout == ST_MASK_FULL) {
                uint8_t *full_row = cells + full_base + (size_t)t * (size_t)(len + n);
                if (mask->fill_prefix)
                    memset(full_row, 1, (size_t)len);
                row = full_row + len;
            } else if (layout == ST_MASK_QLEN) {
                row = cells + (size_t)(b * n + t) * (size_t)n;
            }
            if (row) {
                memset(row, 0, (size_t)n);
                row[0] = 1;
            }
            uint64_t bits = 1;
            int64_t d = 0;
            if (t > 0) {
                int64_t cur = t;
                while (d < depth) {
                    d++;
                    if (row)
                        row[cur] = 1;
                    bits |= (uint64_t)1 << (cur & 63); /* read only for BITS: N <= 64 */
                    int32_t p = par[cur];
                    if (p <= 0)
                        break;
                    cur = p;
                }
            }
            pos[t] = (int32_t)(len + d);
            if (layout == ST_MASK_BITS)
                store_word_le(cells + (size_t)(b * n + t) * word, bits, word);
        }
        if (layout == ST_MASK_FULL)
            full_base += (size_t)n * (size_t)(len + n);
    }
    return ST_OK;
}
