/*
 * test_backend.c: the backend seam (src/model/backend.h) on the real stories260K model.
 * - The CPU backend's attention reads what st_attn_backend_reads says, and the verify-mask owner
 *   lays every step out for that answer.
 * - A recording backend (every operation counted, then done by the CPU backend) sees the
 *   session's buffers, every layer of every forward pass (prompt, plain steps, verify), the
 *   deferred logits and the commit go through the seam, also for a session sharing its pool;
 *   its logits are bitwise the CPU backend's, and the tree's bitwise sequential decoding's.
 * - A backend whose attention reads something else refuses masks laid out for the CPU's answer,
 *   and verifies those laid out for its own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "model/backend.h"
#include "spectree.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static st_model *model;
static int32_t V, n_layer;

static int setup(void **state) {
    (void)state;
    if (st_model_load(tu_data("models/stories260K.gguf"), &model) != ST_OK)
        return -1;
    V = st_model_get_hparams(model)->n_vocab;
    n_layer = st_model_get_hparams(model)->n_layer;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    st_model_free(model);
    return 0;
}

/* ---- a recording backend: counts each operation, then runs the CPU backend's ---- */

enum {
    OP_BUF_ALLOC,
    OP_BUF_FREE,
    OP_GET_ROWS,
    OP_COPY_ROWS,
    OP_ADD_ROWS,
    OP_KV_STORE,
    OP_KV_MOVE,
    OP_MATMUL,
    OP_NORM,
    OP_ROPE_ANGLES,
    OP_ROPE,
    OP_SWIGLU,
    OP_ATTN_READS,
    OP_ATTN,
    OP_COUNT
};
static int64_t calls[OP_COUNT];
static int64_t matmul_rows; /* tokens times matrices multiplied */
static int64_t moved[4];    /* the last kv_move's seq, pos, n, n_accept */
/* what the recording backend's attention answers it reads, or -1: the CPU's answer */
static int reads_override = -1;

static const st_backend *cpu(void) { return st_backend_cpu(); }

static void *rec_buf_alloc(size_t bytes, bool populate) {
    calls[OP_BUF_ALLOC]++;
    return cpu()->buf_alloc(bytes, populate);
}
static void rec_buf_free(void *buf, size_t bytes) {
    calls[OP_BUF_FREE]++;
    cpu()->buf_free(buf, bytes);
}
static void rec_get_rows(st_session *s, const st_wt *w, const int32_t *ids, int64_t n, float *y,
                         int64_t ldy) {
    calls[OP_GET_ROWS]++;
    cpu()->get_rows(s, w, ids, n, y, ldy);
}
static void rec_copy_rows(st_session *s, float *y, int64_t ldy, const float *x, int64_t ldx,
                          int64_t rows, int64_t n) {
    calls[OP_COPY_ROWS]++;
    cpu()->copy_rows(s, y, ldy, x, ldx, rows, n);
}
static void rec_add_rows(st_session *s, float *y, const float *x, int64_t ldx, int64_t rows,
                         int64_t n) {
    calls[OP_ADD_ROWS]++;
    cpu()->add_rows(s, y, x, ldx, rows, n);
}
static void rec_kv_store(st_session *s, const st_fwd *f, int32_t layer) {
    calls[OP_KV_STORE]++;
    cpu()->kv_store(s, f, layer);
}
static st_status rec_kv_move(st_session *s, int32_t seq, int64_t pos, int64_t n,
                             const int64_t *accept_nodes, int64_t n_accept) {
    calls[OP_KV_MOVE]++;
    moved[0] = seq, moved[1] = pos, moved[2] = n, moved[3] = n_accept;
    return cpu()->kv_move(s, seq, pos, n, accept_nodes, n_accept);
}
static void rec_matmul(st_session *s, int n_mat, const st_wt *const *w, float *const *y,
                       const float *x, int64_t M) {
    calls[OP_MATMUL]++;
    matmul_rows += n_mat * M;
    cpu()->matmul(s, n_mat, w, y, x, M);
}
static void rec_norm(st_session *s, float *y, int64_t ldy, const float *x, int64_t ldx,
                     const float *w, int64_t rows, int64_t n, float eps) {
    calls[OP_NORM]++;
    cpu()->norm(s, y, ldy, x, ldx, w, rows, n, eps);
}
static void rec_rope_angles(st_session *s, const int32_t *pos, int64_t n) {
    calls[OP_ROPE_ANGLES]++;
    cpu()->rope_angles(s, pos, n);
}
static void rec_rope(st_session *s, float *v, int32_t n_heads, int64_t n) {
    calls[OP_ROPE]++;
    cpu()->rope(s, v, n_heads, n);
}
static void rec_swiglu(st_session *s, float *g, const float *u, int64_t n) {
    calls[OP_SWIGLU]++;
    cpu()->swiglu(s, g, u, n);
}
static st_attn_reads rec_attn_reads(st_attn_backend attn, int64_t topk) {
    calls[OP_ATTN_READS]++;
    return reads_override >= 0 ? (st_attn_reads)reads_override : cpu()->attn_reads(attn, topk);
}
static void rec_attn(st_session *s, const st_fwd *f, int32_t layer) {
    calls[OP_ATTN]++;
    cpu()->attn(s, f, layer);
}

static const st_backend rec = {
    .name = "recording",
    .buf_alloc = rec_buf_alloc,
    .buf_free = rec_buf_free,
    .get_rows = rec_get_rows,
    .copy_rows = rec_copy_rows,
    .add_rows = rec_add_rows,
    .kv_store = rec_kv_store,
    .kv_move = rec_kv_move,
    .matmul = rec_matmul,
    .norm = rec_norm,
    .rope_angles = rec_rope_angles,
    .rope = rec_rope,
    .swiglu = rec_swiglu,
    .attn_reads = rec_attn_reads,
    .attn = rec_attn,
};

static void reset_calls(void) {
    memset(calls, 0, sizeof calls);
    matmul_rows = 0;
}

/* One forward pass of a plain Llama model through the seam: per layer one norm before the
 * projections, a q/k/v matmul, two ropes, the KV store, attention, the output projection, the
 * residual adds, one norm before the FFN, gate/up, SwiGLU, down; once the embedding and angles. */
static void assert_forwards(int64_t n_fwd) {
    assert_int_equal(calls[OP_GET_ROWS], n_fwd);
    assert_int_equal(calls[OP_ROPE_ANGLES], n_fwd);
    assert_int_equal(calls[OP_ATTN], n_fwd * n_layer);
    assert_int_equal(calls[OP_KV_STORE], n_fwd * n_layer);
    assert_int_equal(calls[OP_ROPE], 2 * n_fwd * n_layer);
    assert_int_equal(calls[OP_SWIGLU], n_fwd * n_layer);
    assert_int_equal(calls[OP_ADD_ROWS], 2 * n_fwd * n_layer);
    assert_true(calls[OP_NORM] >= 2 * n_fwd * n_layer);
    assert_true(calls[OP_MATMUL] >= 4 * n_fwd * n_layer);
}

static st_session_params params(void) {
    st_session_params p = st_session_default_params();
    p.n_threads = 1;
    p.n_ctx = 128;
    p.n_batch = 16;
    return p;
}

/* ---- a small tree: K = 2, S = 2, the root and four drafts ---- */

typedef struct tree5 {
    int32_t tokens[8], positions[8];
    int64_t ri[8], nt[8], ns[8];
    st_tree tree;
    int64_t sel[4];
    int32_t drafts[4];
    int64_t parents[8];
    /* each node's path from the root (tokens), and its length */
    int32_t path[8][4];
    int32_t n_path[8];
} tree5;

/* Candidates 0, 1: children of the root; 2 + 2p + c: child c of candidate p. The four best
 * (0: 0.6, 1: 0.3, 2: 0.3, 4: 0.2) are kept: nodes 1, 2 under the root, 3 under node 1, 4
 * under node 2. A chain (topk 1) keeps candidates 0, 1 as nodes 1, 2. */
static void make_tree(tree5 *t, int64_t topk, int32_t root, int64_t L, const st_tree_mask *mk) {
    const int64_t S = 2, N = topk == 1 ? 3 : 5;
    const float sc2[6] = {0.6f, 0.3f, 0.3f, 0.1f, 0.2f, 0.05f}, sc1[2] = {0.6f, 0.3f};
    const int32_t tok2[6] = {400, 401, 402, 403, 404, 405}, tok1[2] = {410, 411};
    int64_t lp[8] = {-1, 0, 1, 2, 4};
    st_tree_shape shape = {1, topk, S, N};
    assert_int_equal(st_tree_organize(&shape, topk == 1 ? sc1 : sc2, topk == 1 ? tok1 : tok2, lp,
                                      t->sel, t->drafts, t->parents),
                     ST_OK);
    t->tree = (st_tree){t->tokens, t->positions, t->ri, t->nt, t->ns};
    st_tree_input in = {&root, t->parents, t->sel, t->drafts, &L};
    assert_int_equal(st_tree_build(&shape, &in, &t->tree, mk), ST_OK);
    /* the paths, from the positions and the known shape */
    const int64_t parent2[5] = {-1, 0, 0, 1, 2}, parent1[3] = {-1, 0, 1};
    for (int64_t i = 0; i < N; i++) {
        int32_t rev[4], n = 0;
        for (int64_t j = i; j >= 0; j = topk == 1 ? parent1[j] : parent2[j])
            rev[n++] = t->tokens[j];
        for (int32_t k = 0; k < n; k++)
            t->path[i][k] = rev[n - 1 - k];
        t->n_path[i] = n;
        assert_int_equal(t->positions[i], L + n - 1);
    }
}

/* Logits after prefix + path, decoded one token at a time after the prefix. */
static void sequential(st_session *s, const int32_t *prefix, int32_t L, const int32_t *path,
                       int32_t np, float *out) {
    assert_int_equal(st_session_seq_reset(s, 0), ST_OK);
    assert_int_equal(st_session_eval(s, 0, prefix, L, NULL, 0), ST_OK);
    for (int32_t i = 0; i < np; i++)
        assert_int_equal(st_session_eval(s, 0, &path[i], 1, out, 1), ST_OK);
}

static void test_cpu_reads(void **state) {
    (void)state;
    const st_backend *be = st_backend_cpu();
    assert_non_null(be->name);
    for (int a = 0; a < 2; a++) {
        const st_attn_backend attn = a ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
        st_verify_mask *vm;
        assert_int_equal(st_verify_mask_create(attn, 2, 64, 256, &vm), ST_OK);
        for (int64_t topk = 1; topk <= 8; topk++) {
            const st_attn_reads r = be->attn_reads(attn, topk);
            assert_int_equal(r, st_attn_backend_reads(attn, topk));
            assert_int_equal(r, a           ? ST_READS_FULL_ROWS
                                : topk == 1 ? ST_READS_NOTHING
                                            : ST_READS_TREE_BLOCK);
            /* the mask owner lays the step out for exactly that */
            st_tree_mask mk;
            assert_int_equal(st_verify_mask_prepare(vm, topk, 2, 9, 100, &mk), ST_OK);
            assert_int_equal(mk.layout, r == ST_READS_NOTHING     ? ST_MASK_NONE
                                        : r == ST_READS_FULL_ROWS ? ST_MASK_FULL
                                                                  : ST_MASK_BITS);
            assert_int_equal(mk.fill_prefix, r == ST_READS_FULL_ROWS);
        }
        st_verify_mask_free(vm);
    }
}

static void test_recording(void **state) {
    (void)state;
    st_session_params p = params();
    st_session *sr = NULL, *sc = NULL, *sq = NULL;
    reset_calls();
    assert_int_equal(st_session_create_backend(model, &p, NULL, &sr), ST_ERR_INVALID);
    assert_int_equal(st_session_create_backend(model, &p, &rec, &sr), ST_OK);
    assert_int_equal(calls[OP_BUF_ALLOC], 1);
    assert_int_equal(st_session_create(model, &p, &sc), ST_OK);
    assert_int_equal(st_session_create(model, &p, &sq), ST_OK);
    assert_int_equal(calls[OP_BUF_ALLOC], 1); /* the CPU sessions do not use it */
    float *lr = malloc((size_t)8 * V * sizeof *lr), *lc = malloc((size_t)8 * V * sizeof *lc);
    float *ref = malloc((size_t)V * sizeof *ref);

    /* a prompt in one forward pass, then two plain steps */
    const int32_t prompt[] = {1, 403, 407, 261, 378, 290, 262, 345};
    const int32_t L = 8;
    reset_calls();
    assert_int_equal(st_session_eval(sr, 0, prompt, L, lr, 1), ST_OK);
    assert_int_equal(st_session_eval(sc, 0, prompt, L, lc, 1), ST_OK);
    assert_forwards(1);
    assert_memory_equal(lr, lc, (size_t)V * sizeof *lr);
    assert_int_equal(calls[OP_ATTN_READS], 0); /* no mask to read */
    const int32_t seq0 = 0;
    for (int32_t step = 0; step < 2; step++) {
        int32_t t = 300 + step;
        assert_int_equal(st_session_decode_batch(sr, 1, &seq0, &t, lr), ST_OK);
        assert_int_equal(st_session_decode_batch(sc, 1, &seq0, &t, lc), ST_OK);
        assert_memory_equal(lr, lc, (size_t)V * sizeof *lr);
    }
    assert_forwards(3);
    assert_int_equal(calls[OP_KV_MOVE], 0);
    assert_int_equal(st_session_seq_truncate(sr, 0, L), ST_OK);
    assert_int_equal(st_session_seq_truncate(sc, 0, L), ST_OK);

    /* verify: cascade (tree block, and a chain with no mask) and dense, logits now and
     * deferred, bitwise the CPU session's and sequential decoding's */
    for (int cfg = 0; cfg < 3; cfg++) {
        const st_attn_backend attn = cfg == 2 ? ST_ATTN_DENSE : ST_ATTN_CASCADE;
        const int64_t topk = cfg == 1 ? 1 : 2, N = topk == 1 ? 3 : 5;
        st_verify_mask *vr, *vc;
        assert_int_equal(st_verify_mask_create(attn, 1, 8, 64, &vr), ST_OK);
        assert_int_equal(st_verify_mask_create(attn, 1, 8, 64, &vc), ST_OK);
        st_tree_mask mr, mc;
        assert_int_equal(st_verify_mask_prepare(vr, topk, 1, N, L, &mr), ST_OK);
        assert_int_equal(st_verify_mask_prepare(vc, topk, 1, N, L, &mc), ST_OK);
        tree5 tr, tc;
        make_tree(&tr, topk, 500, L, &mr);
        make_tree(&tc, topk, 500, L, &mc);
        reset_calls();
        assert_int_equal(st_session_verify(sr, vr, 1, N, &seq0, &tr.tree, lr), ST_OK);
        assert_int_equal(st_session_verify(sc, vc, 1, N, &seq0, &tc.tree, lc), ST_OK);
        assert_forwards(1);
        assert_int_equal(calls[OP_ATTN_READS], 1);
        assert_int_equal(matmul_rows, (3 + 1 + 2 + 1) * N * n_layer + N); /* and the logits */
        assert_memory_equal(lr, lc, (size_t)N * V * sizeof *lr);
        for (int64_t i = 0; i < N; i++) {
            sequential(sq, prompt, L, tr.path[i], tr.n_path[i], ref);
            assert_memory_equal(ref, lr + i * V, (size_t)V * sizeof *ref);
        }
        /* deferred: the output layer one node at a time through the seam */
        assert_int_equal(st_session_verify(sr, vr, 1, N, &seq0, &tr.tree, NULL), ST_OK);
        for (int64_t i = N - 1; i >= 0; i--) {
            const int64_t before = calls[OP_MATMUL];
            assert_int_equal(st_session_logits(sr, i, ref), ST_OK);
            assert_int_equal(calls[OP_MATMUL], before + 1);
            assert_memory_equal(ref, lr + i * V, (size_t)V * sizeof *ref);
        }
        /* commit the path root -> node 1 -> its first child (the chain: nodes 0, 1, 2; the tree:
         * 0, 1, 3), then one more token: bitwise the CPU session, and sequential decoding */
        const int64_t acc[3] = {0, 1, topk == 1 ? 2 : 3};
        assert_int_equal(st_session_commit(sr, 0, N, acc, 3), ST_OK);
        assert_int_equal(st_session_commit(sc, 0, N, acc, 3), ST_OK);
        assert_int_equal(calls[OP_KV_MOVE], 1);
        assert_int_equal(moved[0], 0);
        assert_int_equal(moved[1], L);
        assert_int_equal(moved[2], N);
        assert_int_equal(moved[3], 3);
        const int32_t next = 333;
        assert_int_equal(st_session_eval(sr, 0, &next, 1, lr, 1), ST_OK);
        assert_int_equal(st_session_eval(sc, 0, &next, 1, lc, 1), ST_OK);
        assert_memory_equal(lr, lc, (size_t)V * sizeof *lr);
        int32_t path[5];
        memcpy(path, tr.path[acc[2]], 3 * sizeof *path);
        path[3] = next;
        sequential(sq, prompt, L, path, 4, ref);
        assert_memory_equal(ref, lr, (size_t)V * sizeof *ref);
        /* a bad commit is refused by the backend's row mover, nothing moved */
        const int64_t bad[2] = {1, 2};
        assert_int_equal(st_session_commit(sr, 0, N, bad, 2), ST_ERR_INVALID);
        assert_int_equal(st_session_seq_len(sr, 0), L + 4);
        assert_int_equal(st_session_seq_truncate(sr, 0, L), ST_OK);
        assert_int_equal(st_session_seq_truncate(sc, 0, L), ST_OK);
        st_verify_mask_free(vr);
        st_verify_mask_free(vc);
    }

    /* a session on the recording session's pool runs on its backend too */
    st_session *sh = NULL;
    reset_calls();
    assert_int_equal(st_session_create_shared(model, &p, sr, false, &sh), ST_OK);
    assert_int_equal(calls[OP_BUF_ALLOC], 1);
    assert_int_equal(st_session_eval(sh, 0, prompt, L, lr, 1), ST_OK);
    assert_forwards(1);
    sequential(sq, prompt, L - 1, prompt + L - 1, 1, ref);
    assert_memory_equal(ref, lr, (size_t)V * sizeof *ref);
    st_session_free(sh);
    assert_int_equal(calls[OP_BUF_FREE], 1);

    st_session_free(sr);
    assert_int_equal(calls[OP_BUF_FREE], 2);
    st_session_free(sc);
    st_session_free(sq);
    assert_int_equal(calls[OP_BUF_FREE], 2);
    free(lr), free(lc), free(ref);
}

/* A backend whose verify attention reads other cells than the CPU's: the session refuses a mask
 * the owner laid out for the CPU's answer, and verifies one laid out for its own. */
static void test_reads_refused(void **state) {
    (void)state;
    st_session_params p = params();
    st_session *sr = NULL, *sc = NULL;
    assert_int_equal(st_session_create_backend(model, &p, &rec, &sr), ST_OK);
    assert_int_equal(st_session_create(model, &p, &sc), ST_OK);
    const int32_t prompt[] = {1, 403, 407, 261};
    const int32_t L = 4, seq0 = 0;
    assert_int_equal(st_session_eval(sr, 0, prompt, L, NULL, 0), ST_OK);
    assert_int_equal(st_session_eval(sc, 0, prompt, L, NULL, 0), ST_OK);
    float *lr = malloc((size_t)8 * V * sizeof *lr), *lc = malloc((size_t)8 * V * sizeof *lc);
    /* a backend that reads full rows whatever the shape (FlashInfer's): cascade's tree block
     * and its mask-free chain are refused */
    reads_override = ST_READS_FULL_ROWS;
    for (int64_t topk = 1; topk <= 2; topk++) {
        const int64_t N = topk == 1 ? 3 : 5;
        st_verify_mask *vm;
        assert_int_equal(st_verify_mask_create(ST_ATTN_CASCADE, 1, 8, 64, &vm), ST_OK);
        st_tree_mask mk;
        assert_int_equal(st_verify_mask_prepare(vm, topk, 1, N, L, &mk), ST_OK);
        tree5 t;
        make_tree(&t, topk, 500, L, &mk);
        assert_int_equal(st_session_verify(sr, vm, 1, N, &seq0, &t.tree, lr), ST_ERR_INVALID);
        assert_non_null(strstr(st_last_error(), "recording"));
        st_verify_mask_free(vm);
    }
    /* ... and dense, laid out as it reads, verifies bitwise as the CPU */
    {
        st_verify_mask *vm;
        assert_int_equal(st_verify_mask_create(ST_ATTN_DENSE, 1, 8, 64, &vm), ST_OK);
        st_tree_mask mk;
        assert_int_equal(st_verify_mask_prepare(vm, 2, 1, 5, L, &mk), ST_OK);
        tree5 t;
        make_tree(&t, 2, 500, L, &mk);
        assert_int_equal(st_session_verify(sr, vm, 1, 5, &seq0, &t.tree, lr), ST_OK);
        assert_int_equal(st_session_verify(sc, vm, 1, 5, &seq0, &t.tree, lc), ST_OK);
        assert_memory_equal(lr, lc, (size_t)5 * V * sizeof *lr);
        st_verify_mask_free(vm);
    }
    /* a backend that always reads the tree block: a chain laid out with no mask is refused */
    reads_override = ST_READS_TREE_BLOCK;
    {
        st_verify_mask *vm;
        assert_int_equal(st_verify_mask_create(ST_ATTN_CASCADE, 1, 8, 64, &vm), ST_OK);
        st_tree_mask mk;
        assert_int_equal(st_verify_mask_prepare(vm, 1, 1, 3, L, &mk), ST_OK);
        assert_int_equal(mk.layout, ST_MASK_NONE);
        tree5 t;
        make_tree(&t, 1, 500, L, &mk);
        assert_int_equal(st_session_verify(sr, vm, 1, 3, &seq0, &t.tree, lr), ST_ERR_INVALID);
        assert_int_equal(st_session_verify(sc, vm, 1, 3, &seq0, &t.tree, lc), ST_OK);
        st_verify_mask_free(vm);
    }
    reads_override = -1;
    assert_int_equal(st_session_seq_len(sr, 0), L); /* nothing verified changed the length */
    free(lr), free(lc);
    st_session_free(sr);
    st_session_free(sc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_reads),
        cmocka_unit_test(test_recording),
        cmocka_unit_test(test_reads_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
