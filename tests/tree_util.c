/*
 * tree_util.c: helpers the tree test programs share (test_tree_build, test_tree_verify): output
 * buffers, value and status checks, mask cells in any layout, a seeded RNG and a drafter in the
 * shape of SGLang's select_top_k_tokens.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "spectree.h"
#include "testutil.h"
#include "tree_util.h"

bufs bufs_new(int64_t bs, int64_t n) {
    bufs b = {bs, n, {0}};
    size_t cnt = (size_t)(bs * n);
    b.tree.tokens = malloc(cnt * sizeof(int32_t));
    b.tree.positions = malloc(cnt * sizeof(int32_t));
    b.tree.retrieve_index = malloc(cnt * sizeof(int64_t));
    b.tree.next_token = malloc(cnt * sizeof(int64_t));
    b.tree.next_sibling = malloc(cnt * sizeof(int64_t));
    assert_non_null(b.tree.tokens);
    assert_non_null(b.tree.positions);
    assert_non_null(b.tree.retrieve_index);
    assert_non_null(b.tree.next_token);
    assert_non_null(b.tree.next_sibling);
    return b;
}

void bufs_free(bufs *b) {
    free(b->tree.tokens);
    free(b->tree.positions);
    free(b->tree.retrieve_index);
    free(b->tree.next_token);
    free(b->tree.next_sibling);
}

void check_i64(const char *what, int ctx, const int64_t *got, const int64_t *want, int64_t cnt) {
    for (int64_t i = 0; i < cnt; i++)
        if (got[i] != want[i])
            fail_msg("case %d: %s[%lld] = %lld, want %lld", ctx, what, (long long)i,
                     (long long)got[i], (long long)want[i]);
}

void check_i32(const char *what, int ctx, const int32_t *got, const int64_t *want, int64_t cnt) {
    for (int64_t i = 0; i < cnt; i++)
        if (got[i] != want[i])
            fail_msg("case %d: %s[%lld] = %d, want %lld", ctx, what, (long long)i, (int)got[i],
                     (long long)want[i]);
}

void check_status(st_status got, st_status want, const char *needle) {
    if (got != want)
        fail_msg("status %d, want %d (%s)", (int)got, (int)want, st_last_error());
    if (want != ST_OK && needle && !strstr(st_last_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\"", st_last_error(), needle);
}

/* Tree cell (b, t, j) of a mask in any layout (N <= 64 for BITS). */
int mask_cell(const uint8_t *mask, st_mask_layout layout, const int64_t *seq_lens, int64_t n,
              int64_t b, int64_t t, int64_t j) {
    switch (layout) {
    case ST_MASK_FULL: {
        size_t base = 0;
        for (int64_t i = 0; i < b; i++)
            base += (size_t)(n * (seq_lens[i] + n));
        return mask[base + (size_t)(t * (seq_lens[b] + n) + seq_lens[b] + j)];
    }
    case ST_MASK_QLEN:
        return mask[(b * n + t) * n + j];
    case ST_MASK_BITS: {
        size_t w = st_tree_mask_word_bytes(n);
        return (mask[(size_t)(b * n + t) * w + (size_t)j / 8] >> (j % 8)) & 1;
    }
    case ST_MASK_NONE:
        break;
    }
    fail_msg("no mask");
    return -1;
}

/* xorshift64* for test data. */
uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dULL;
}

int64_t rng_below(uint64_t *s, int64_t n) { return (int64_t)(rng_next(s) % (uint64_t)n); }

/* A drafter in the shape of SGLang's select_top_k_tokens (TREE_SPEC §1.2): scores (bs, M),
 * tokens (bs, M), level parents (bs, level_parents_width). */
void simulate_draft(uint64_t *rng, int64_t bs, int64_t k, int64_t s, int64_t vocab, float *scores,
                    int32_t *tokens, int64_t *lparents) {
    const int64_t m = st_tree_n_candidates(k, s);
    const int64_t lw = st_tree_level_parents_width(k, s);
    float prev[ST_TREE_MAX_TOPK], expand[64 * 64];
    int64_t order[64 * 64];
    assert_true(k <= 64);
    for (int64_t b = 0; b < bs; b++) {
        float *sc = scores + b * m;
        int32_t *tk = tokens + b * m;
        int64_t *lp = lparents + b * lw;
        for (int64_t c = 0; c < k; c++)
            prev[c] = (float)(rng_below(rng, 8) + 1) / 8.0f;
        for (int64_t c = 1; c < k; c++) /* descending, as fast_topk returns them */
            for (int64_t j = c; j > 0 && prev[j - 1] < prev[j]; j--) {
                float t = prev[j];
                prev[j] = prev[j - 1];
                prev[j - 1] = t;
            }
        for (int64_t c = 0; c < k; c++) {
            sc[c] = prev[c];
            tk[c] = (int32_t)rng_below(rng, vocab);
        }
        lp[0] = -1;
        for (int64_t c = 0; c < k; c++)
            lp[1 + c] = c;
        for (int64_t i = 1; i < s; i++) {
            int64_t base = k + (i - 1) * k * k;
            for (int64_t g = 0; g < k * k; g++) {
                expand[g] = prev[g / k] * (float)(rng_below(rng, 8) + 1) / 8.0f;
                sc[base + g] = expand[g];
                tk[base + g] = (int32_t)rng_below(rng, vocab);
                order[g] = g;
            }
            for (int64_t a = 1; a < k * k; a++) /* stable sort by descending score */
                for (int64_t j = a; j > 0 && expand[order[j - 1]] < expand[order[j]]; j--) {
                    int64_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
            for (int64_t c = 0; c < k; c++) {
                prev[c] = expand[order[c]];
                lp[(k + 1) + (i - 1) * k + c] = base + order[c];
            }
        }
    }
}
