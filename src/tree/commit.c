/*
 * commit.c: after verification, moves the accepted tree nodes' KV rows from the scratch rows
 * [L, L+N) to [L, L+k+1) in every K/V plane, so the cache stays contiguous by position for CPU
 * attention (DESIGN.md "KV cache"; SGLang's move_kv_cache for topk > 1, TREE_SPEC.md §4.3).
 * At most S+1 rows move per plane: the cost does not depend on the context length.
 */
#include "core/core.h"

#include <string.h>

st_status st_tree_commit_rows(void *kv, size_t kv_bytes, size_t row_bytes, int64_t n_planes,
                              size_t plane_stride, int64_t pos, int64_t n,
                              const int64_t *accept_nodes, int64_t n_accept) {
    const char *fn = "st_tree_commit_rows";
    if (!kv || !accept_nodes)
        return st_fail(ST_ERR_INVALID, "%s: kv or accept_nodes is NULL", fn);
    if (row_bytes == 0 || n_planes < 1)
        return st_fail(ST_ERR_INVALID, "%s: row_bytes = %zu and n_planes = %lld must be >= 1", fn,
                       row_bytes, (long long)n_planes);
    if (n < 1 || n > ST_TREE_MAX_N)
        return st_fail(ST_ERR_INVALID, "%s: n = %lld tree nodes, must be in 1..%d", fn,
                       (long long)n, ST_TREE_MAX_N);
    if (pos < 0)
        return st_fail(ST_ERR_RANGE, "%s: pos = %lld is negative", fn, (long long)pos);
    if (n_accept < 1 || n_accept > n)
        return st_fail(ST_ERR_RANGE, "%s: n_accept = %lld, must be in 1..%lld", fn,
                       (long long)n_accept, (long long)n);
    if (accept_nodes[0] != 0)
        return st_fail(ST_ERR_INVALID, "%s: accept_nodes[0] = %lld, must be the root (0)", fn,
                       (long long)accept_nodes[0]);
    for (int64_t i = 1; i < n_accept; i++) {
        if (accept_nodes[i] <= accept_nodes[i - 1])
            return st_fail(ST_ERR_INVALID,
                           "%s: accept_nodes[%lld] = %lld does not follow %lld: the accepted "
                           "nodes must be strictly increasing",
                           fn, (long long)i, (long long)accept_nodes[i],
                           (long long)accept_nodes[i - 1]);
        if (accept_nodes[i] >= n)
            return st_fail(ST_ERR_RANGE,
                           "%s: accept_nodes[%lld] = %lld is not a node of a tree "
                           "of %lld",
                           fn, (long long)i, (long long)accept_nodes[i], (long long)n);
    }
    /* Bytes spanned by rows [0, pos+n) of one plane, then by all planes. */
    size_t plane_span, span, last_plane;
    if (!st_mul_size((size_t)pos + (size_t)n, row_bytes, &plane_span) ||
        !st_mul_size((size_t)(n_planes - 1), plane_stride, &last_plane) ||
        !st_add_size(last_plane, plane_span, &span))
        return st_fail(ST_ERR_RANGE, "%s: the rows of %lld planes overflow size_t", fn,
                       (long long)n_planes);
    if (n_planes > 1 && plane_stride < plane_span)
        return st_fail(ST_ERR_RANGE,
                       "%s: plane_stride = %zu is smaller than the %zu bytes of rows [0, %lld) "
                       "of a plane",
                       fn, plane_stride, plane_span, (long long)(pos + n));
    if (span > kv_bytes)
        return st_fail(ST_ERR_RANGE,
                       "%s: rows [%lld, %lld) of %lld planes need %zu bytes, kv has "
                       "%zu",
                       fn, (long long)pos, (long long)(pos + n), (long long)n_planes, span,
                       kv_bytes);

    /* accept_nodes[i] >= i and increasing, so moving in increasing i never overwrites a row
     * that a later move still reads. */
    uint8_t *base = kv;
    for (int64_t p = 0; p < n_planes; p++) {
        uint8_t *plane = base + (size_t)p * plane_stride + (size_t)pos * row_bytes;
        for (int64_t i = 1; i < n_accept; i++)
            if (accept_nodes[i] != i)
                memmove(plane + (size_t)i * row_bytes, plane + (size_t)accept_nodes[i] * row_bytes,
                        row_bytes);
    }
    return ST_OK;
}
