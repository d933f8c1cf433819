/*
 * test_attn.c: target-verify attention on the real stories260K model.
 * - For random trees and contexts, `cascade` and `dense` give bitwise the same logits, and each
 *   tree node's logits are bitwise those of decoding its path one token at a time.
 * - With fill_prefix off and the prefix cells poisoned, cascade is unchanged while dense (which
 *   reads those cells) differs: the capability answer matters.
 * - Commit moves the accepted path into place: decoding continues exactly as sequentially.
 * - No allocation in build + verify forward + greedy verify + commit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "spectree.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static st_model *model;
static int32_t V;

static int setup(void **state) {
    (void)state;
    if (st_model_load(tu_data("models/stories260K.gguf"), &model) != ST_OK)
        return -1;
    V = st_model_get_hparams(model)->n_vocab;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    st_model_free(model);
    return 0;
}

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}
static float frnd(void) { return (float)(rnd() >> 8) / 16777216.0f; }

/* A random draft of K candidates per node over S levels for one request, organised into N
 * nodes (EAGLE-2 selection: cumulative scores, top-K of each level expanded). */
typedef struct draft {
    st_tree_shape shape;
    int64_t M, PW, LPW;
    float *scores;
    int32_t *tokens;
    int64_t *level_parents, *sel, *parent_list;
    int32_t *drafts;
} draft;

static void make_draft(draft *d, int64_t K, int64_t S, int64_t N) {
    d->shape = (st_tree_shape){1, K, S, N};
    d->M = st_tree_n_candidates(K, S);
    d->PW = st_tree_parent_width(K, S);
    d->LPW = st_tree_level_parents_width(K, S);
    d->scores = malloc((size_t)d->M * 4);
    d->tokens = malloc((size_t)d->M * 4);
    d->level_parents = malloc((size_t)d->LPW * 8);
    d->sel = malloc((size_t)(N > 1 ? N - 1 : 1) * 8);
    d->drafts = malloc((size_t)(N > 1 ? N - 1 : 1) * 4);
    d->parent_list = malloc((size_t)(d->PW ? d->PW : 1) * 8);
    float *lvl = malloc((size_t)K * 4); /* scores of the K expanded nodes of the last level */
    d->level_parents[0] = -1;
    for (int64_t c = 0; c < K; c++) {
        d->scores[c] = 1.0f / (float)(c + 1) * (0.5f + 0.5f * frnd());
        d->tokens[c] = (int32_t)(rnd() % (uint32_t)V);
        d->level_parents[1 + c] = c;
        lvl[c] = d->scores[c];
    }
    int64_t lp = K + 1;
    for (int64_t i = 1; i < S; i++) {
        int64_t base = K + (i - 1) * K * K;
        for (int64_t p = 0; p < K; p++)
            for (int64_t c = 0; c < K; c++) {
                d->scores[base + p * K + c] = lvl[p] * (0.9f / (float)(c + 1)) * frnd();
                d->tokens[base + p * K + c] = (int32_t)(rnd() % (uint32_t)V);
            }
        /* the K best of this level are expanded next (ties: lower index) */
        for (int64_t k = 0; k < K && i < S - 1 + 1; k++) {
            int64_t best = -1;
            for (int64_t g = base; g < base + K * K; g++) {
                int taken = 0;
                for (int64_t q = 0; q < k; q++)
                    taken |= d->level_parents[lp + q] == g;
                if (!taken && (best < 0 || d->scores[g] > d->scores[best]))
                    best = g;
            }
            if (lp + k < d->LPW)
                d->level_parents[lp + k] = best;
            lvl[k] = d->scores[best];
        }
        lp += K;
    }
    free(lvl);
    assert_int_equal(st_tree_organize(&d->shape, d->scores, d->tokens, d->level_parents, d->sel,
                                      d->drafts, d->parent_list),
                     ST_OK);
}

static void free_draft(draft *d) {
    free(d->scores), free(d->tokens), free(d->level_parents), free(d->sel), free(d->drafts);
    free(d->parent_list);
}

typedef struct built {
    int32_t tokens[64], positions[64];
    int64_t ri[64], nt[64], ns[64];
    st_tree tree;
} built;

static void build(const draft *d, int32_t root, int64_t L, const st_tree_mask *mask, built *b) {
    b->tree = (st_tree){b->tokens, b->positions, b->ri, b->nt, b->ns};
    st_tree_input in = {&root, d->PW ? d->parent_list : NULL, d->sel, d->drafts, &L};
    assert_int_equal(st_tree_build(&d->shape, &in, &b->tree, mask), ST_OK);
}

static st_session *new_session(int threads) {
    st_session_params p = st_session_default_params();
    p.n_threads = threads;
    p.n_ctx = 256;
    p.n_batch = 64;
    st_session *s = NULL;
    assert_int_equal(st_session_create(model, &p, &s), ST_OK);
    return s;
}

/* Logits of the last token of prefix + path, decoded one token at a time after the prefix. */
static void sequential(st_session *s, const int32_t *prefix, int32_t L, const int32_t *path,
                       int32_t np, float *out) {
    assert_int_equal(st_session_seq_reset(s, 0), ST_OK);
    assert_int_equal(st_session_eval(s, 0, prefix, L, NULL, 0), ST_OK);
    for (int32_t i = 0; i < np; i++)
        assert_int_equal(st_session_eval(s, 0, &path[i], 1, out, 1), ST_OK);
}

static void test_tree_attention(void **state) {
    (void)state;
    st_session *sv = new_session(2), *sq = new_session(1);
    float *lc = malloc(64 * (size_t)V * 4), *ld = malloc(64 * (size_t)V * 4);
    float *ref = malloc((size_t)V * 4);
    int32_t prefix[200];
    for (int trial = 0; trial < 24; trial++) {
        int64_t K = 1 + rnd() % 4, S = 1 + rnd() % 5;
        int64_t M = st_tree_n_candidates(K, S);
        int64_t N = 1 + (int64_t)(rnd() % (uint32_t)(M < 20 ? M : 20));
        if (K == 1)
            N = S + 1;
        int32_t L = 1 + (int32_t)(rnd() % 150);
        prefix[0] = 1;
        for (int32_t i = 1; i < L; i++)
            prefix[i] = (int32_t)(rnd() % (uint32_t)V);
        int32_t root = (int32_t)(rnd() % (uint32_t)V);
        draft d;
        make_draft(&d, K, S, N);
        /* cascade: the mask owner's choice (bits, or nothing for a chain) */
        st_verify_mask *vc, *vd;
        assert_int_equal(st_verify_mask_create(ST_ATTN_CASCADE, 1, 64, 256, &vc), ST_OK);
        assert_int_equal(st_verify_mask_create(ST_ATTN_DENSE, 1, 64, 256, &vd), ST_OK);
        st_tree_mask mc, md;
        assert_int_equal(st_verify_mask_prepare(vc, K, 1, N, L, &mc), ST_OK);
        assert_int_equal(st_verify_mask_prepare(vd, K, 1, N, L, &md), ST_OK);
        assert_int_equal(mc.layout, K == 1 ? ST_MASK_NONE : ST_MASK_BITS);
        assert_int_equal(md.layout, ST_MASK_FULL);
        assert_true(md.fill_prefix);
        built bc, bd;
        build(&d, root, L, &mc, &bc);
        build(&d, root, L, &md, &bd);
        int32_t seq = 0;
        assert_int_equal(st_session_seq_reset(sv, 0), ST_OK);
        assert_int_equal(st_session_eval(sv, 0, prefix, L, NULL, 0), ST_OK);
        assert_int_equal(st_session_verify(sv, vc, 1, N, &seq, &bc.tree, lc), ST_OK);
        assert_int_equal(st_session_verify(sv, vd, 1, N, &seq, &bd.tree, ld), ST_OK);
        assert_memory_equal(lc, ld, (size_t)N * V * 4);
        /* deferred logits: the same forward without the output layer, then node by node (in
         * reverse order) on demand: bitwise the rows written above */
        for (int be = 0; be < 2; be++) {
            assert_int_equal(
                st_session_verify(sv, be ? vd : vc, 1, N, &seq, be ? &bd.tree : &bc.tree, NULL),
                ST_OK);
            float *one = malloc((size_t)V * sizeof *one);
            for (int64_t t = N - 1; t >= 0; t--) {
                assert_int_equal(st_session_logits(sv, t, one), ST_OK);
                assert_memory_equal(one, lc + t * V, (size_t)V * 4);
            }
            assert_int_equal(st_session_logits(sv, N, one), ST_ERR_INVALID);
            assert_int_equal(st_session_logits(sv, -1, one), ST_ERR_INVALID);
            /* another forward pass ends them */
            assert_int_equal(st_session_verify(sv, vc, 1, N, &seq, &bc.tree, lc), ST_OK);
            assert_int_equal(st_session_logits(sv, 0, one), ST_ERR_INVALID);
            free(one);
        }
        /* every node equals sequential decoding of root .. node */
        for (int64_t t = 0; t < N; t++) {
            int32_t path[64], np = 0;
            /* walk up via positions: collect ancestors from the mask rows (cascade bits) */
            int64_t chain[64], nc = 0;
            for (int64_t j = 0; j <= t; j++) {
                int vis;
                if (mc.layout == ST_MASK_NONE) {
                    vis = 1;
                } else {
                    size_t w = st_tree_mask_word_bytes(N);
                    vis =
                        (((const uint8_t *)mc.data)[(size_t)t * w + (size_t)(j >> 3)] >> (j & 7)) &
                        1;
                }
                if (vis)
                    chain[nc++] = j;
            }
            for (int64_t c = 0; c < nc; c++)
                path[np++] = bc.tokens[chain[c]];
            assert_int_equal(bc.positions[t], L + np - 1);
            sequential(sq, prefix, L, path, np, ref);
            assert_memory_equal(ref, lc + (size_t)t * V, (size_t)V * 4);
        }
        /* poisoned prefix without fill: cascade unchanged, dense differs */
        if (K > 1) {
            st_tree_mask mp = md;
            mp.fill_prefix = 0;
            for (size_t i = 0; i < md.bytes; i++)
                ((uint8_t *)md.data)[i] = (uint8_t)(rnd() & 1 ? rnd() : 0);
            build(&d, root, L, &mp, &bd);
            assert_int_equal(st_session_verify(sv, vd, 1, N, &seq, &bd.tree, ld), ST_OK);
            assert_int_equal(st_session_verify(sv, vc, 1, N, &seq, &bc.tree, lc), ST_OK);
            assert_memory_not_equal(lc, ld, (size_t)N * V * 4);
            sequential(sq, prefix, L, &root, 1, ref);
            assert_memory_equal(ref, lc, (size_t)V * 4);
        }
        st_verify_mask_free(vc);
        st_verify_mask_free(vd);
        free_draft(&d);
    }
    free(lc), free(ld), free(ref);
    st_session_free(sv);
    st_session_free(sq);
}

/* Greedy speculation with a tree whose first branch is the model's own greedy path: after
 * verify + commit, the committed tokens and the next logits equal sequential decoding. */
static void test_commit(void **state) {
    (void)state;
    st_session *sv = new_session(2), *sq = new_session(2);
    float *lg = malloc(64 * (size_t)V * 4), *ref = malloc((size_t)V * 4);
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    /* greedy path of 4 tokens from the plain decoder */
    int32_t greedy_toks[8];
    assert_int_equal(st_session_eval(sq, 0, prompt, 5, ref, 1), ST_OK);
    for (int i = 0; i < 8; i++) {
        int32_t b = 0;
        for (int32_t j = 1; j < V; j++)
            if (ref[j] > ref[b])
                b = j;
        greedy_toks[i] = b;
        assert_int_equal(st_session_eval(sq, 0, &b, 1, ref, 1), ST_OK);
    }
    /* prefix = prompt + first greedy token (committed), root = second greedy token */
    int32_t pre[6];
    memcpy(pre, prompt, sizeof prompt);
    pre[5] = greedy_toks[0];
    assert_int_equal(st_session_eval(sv, 0, pre, 6, NULL, 0), ST_OK);
    /* K=2, S=3 tree: branch 0 follows greedy, branch 1 random */
    draft d;
    make_draft(&d, 2, 3, 7);
    /* force tokens: level-0 best candidate = greedy[2], its best child = greedy[3], ... */
    d.tokens[0] = greedy_toks[2];
    int64_t best1 = 2 + 0 * 2 + 0; /* level 1, parent slot 0 (node g=0 is the best of level 0) */
    d.tokens[best1] = greedy_toks[3];
    assert_int_equal(st_tree_organize(&d.shape, d.scores, d.tokens, d.level_parents, d.sel,
                                      d.drafts, d.parent_list),
                     ST_OK);
    st_verify_mask *vm;
    assert_int_equal(st_verify_mask_create(ST_ATTN_CASCADE, 1, 64, 256, &vm), ST_OK);
    st_tree_mask mk;
    assert_int_equal(st_verify_mask_prepare(vm, 2, 1, 7, 6, &mk), ST_OK);
    built b;
    int64_t acc[4], nacc;
    int32_t pred[7], tp[7];
    int64_t before = st_alloc_count();
    build(&d, greedy_toks[1], 6, &mk, &b);
    int32_t seq = 0;
    assert_int_equal(st_session_verify(sv, vm, 1, 7, &seq, &b.tree, lg), ST_OK);
    for (int t = 0; t < 7; t++) {
        int32_t bi = 0;
        for (int32_t j = 1; j < V; j++)
            if (lg[(size_t)t * V + j] > lg[(size_t)t * V + bi])
                bi = j;
        tp[t] = bi;
    }
    assert_int_equal(st_verify_tree_greedy(1, 7, 3, &b.tree, tp, pred, acc, &nacc), ST_OK);
    assert_true(nacc >= 2); /* greedy[2], greedy[3] are in the tree */
    assert_int_equal(st_session_commit(sv, 0, 7, acc, nacc + 1), ST_OK);
    assert_int_equal(st_alloc_count(), before);
    assert_int_equal(st_session_seq_len(sv, 0), 6 + nacc + 1);
    /* the accepted tokens and the bonus are the greedy ones */
    for (int64_t i = 1; i <= nacc; i++)
        assert_int_equal(b.tokens[acc[i]], greedy_toks[1 + i]);
    int32_t bonus = pred[acc[nacc]];
    assert_int_equal(bonus, greedy_toks[2 + nacc]);
    /* continue: next logits equal sequential decoding */
    assert_int_equal(st_session_eval(sv, 0, &bonus, 1, lg, 1), ST_OK);
    sequential(sq, prompt, 5, greedy_toks, (int32_t)(3 + nacc), ref);
    assert_memory_equal(ref, lg, (size_t)V * 4);
    /* bad commits are rejected */
    int64_t badn[2] = {1, 2};
    assert_int_equal(st_session_commit(sv, 0, 7, badn, 2), ST_ERR_INVALID);
    assert_int_equal(st_session_commit(sv, 9, 7, acc, 1), ST_ERR_INVALID);
    st_verify_mask_free(vm);
    free_draft(&d);
    free(lg), free(ref);
    st_session_free(sv);
    st_session_free(sq);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_attention),
        cmocka_unit_test(test_commit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
