/* tree_util.h: helpers the tree test programs share (tree_util.c). Include after cmocka.h. */
#ifndef ST_TREE_UTIL_H
#define ST_TREE_UTIL_H
#include "spectree.h"

#include <stdint.h>

/* Output arrays of one tree batch (bs*n entries each), malloc'd by the test. */
typedef struct bufs {
    int64_t bs, n;
    st_tree tree;
} bufs;
bufs bufs_new(int64_t bs, int64_t n);
void bufs_free(bufs *b);

/* got[0..cnt) equals want[0..cnt), else fails naming case ctx, what and the index. */
void check_i64(const char *what, int ctx, const int64_t *got, const int64_t *want, int64_t cnt);
void check_i32(const char *what, int ctx, const int32_t *got, const int64_t *want, int64_t cnt);
/* got == want, and a failing status's error mentions needle (when not NULL). */
void check_status(st_status got, st_status want, const char *needle);

/* Tree cell (b, t, j) of a mask in any layout (N <= 64 for BITS). */
int mask_cell(const uint8_t *mask, st_mask_layout layout, const int64_t *seq_lens, int64_t n,
              int64_t b, int64_t t, int64_t j);

/* xorshift64* for test data; rng_below: in [0, n). */
uint64_t rng_next(uint64_t *s);
int64_t rng_below(uint64_t *s, int64_t n);

/* A drafter in the shape of SGLang's select_top_k_tokens (TREE_SPEC §1.2): scores (bs, M),
 * tokens (bs, M), level parents (bs, level_parents_width). */
void simulate_draft(uint64_t *rng, int64_t bs, int64_t k, int64_t s, int64_t vocab, float *scores,
                    int32_t *tokens, int64_t *lparents);
#endif
