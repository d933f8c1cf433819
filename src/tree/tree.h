/* tree.h: internal header of the tree module (draft trees, masks, verification, sampling, the
 * verify-mask owner). Its public types and functions are declared in include/spectree.h; the
 * module depends only on core. The session (src/model/kv.c) reads masks through the two
 * functions below. */
#ifndef ST_TREE_H
#define ST_TREE_H
#include "core/core.h"

/* The mask of the step laid out by the last st_verify_mask_prepare of vm, with that step's bs
 * and n, and the attention backend and topk it was laid out for; NULL before the first
 * prepare. */
const st_tree_mask *st_verify_mask_view(const st_verify_mask *vm, int64_t *bs, int64_t *n,
                                        st_attn_backend *attn, int64_t *topk);

/* The nodes of each request of that step ((bs) entries, all n unless it was ragged); NULL
 * before the first prepare. */
const int64_t *st_verify_mask_nodes(const st_verify_mask *vm);

/* Whether node t of request b (of n nodes) sees node j, in any layout; full_row_tree is the tree
 * part of t's FULL_MASK row (used only for ST_MASK_FULL). ST_MASK_NONE: a chain, j <= t. */
int st_tree_mask_cell(const st_tree_mask *mk, int64_t b, int64_t n, int64_t t, int64_t j,
                      const uint8_t *full_row_tree);
#endif
