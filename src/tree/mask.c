/*
 * mask.c: target-verify attention backends and the verify-mask owner. A backend declares what it
 * reads in target-verify (the generalisation of SGLang's target_verify_reads_custom_mask(), PR
 * #32886): `dense` reads whole FULL_MASK rows, prefix columns included, so the prefix must be
 * filled; `cascade` attends to the committed prefix without a mask and reads only the N x N tree
 * block (bit-packed), and for a K = 1 chain uses causal attention and no mask at all. The mask
 * owner picks the layout from that answer, sizes its buffer once and fills only what is read
 * (DESIGN.md invariant 2).
 */
#include "tree/tree.h"

#include <string.h>

const char *st_attn_backend_name(st_attn_backend b) {
    return b == ST_ATTN_DENSE ? "dense" : b == ST_ATTN_CASCADE ? "cascade" : "?";
}

st_status st_attn_backend_parse(const char *name, st_attn_backend *out) {
    if (name && strcmp(name, "cascade") == 0)
        *out = ST_ATTN_CASCADE;
    else if (name && strcmp(name, "dense") == 0)
        *out = ST_ATTN_DENSE;
    else
        return st_fail(ST_ERR_INVALID, "unknown attention backend '%s' (cascade, dense)",
                       name ? name : "(null)");
    return ST_OK;
}

/* What the CPU backend's attention reads (its attn_reads, src/model/backend.h); a session on
 * another backend verifies a mask only where that backend gives the same answer. */
st_attn_reads st_attn_backend_reads(st_attn_backend b, int64_t topk) {
    if (b == ST_ATTN_DENSE)
        return ST_READS_FULL_ROWS;
    return topk == 1 ? ST_READS_NOTHING : ST_READS_TREE_BLOCK;
}

struct st_verify_mask {
    st_attn_backend backend;
    int64_t max_bs, max_n, max_ctx_sum;
    void *buf;
    size_t cap;
    /* the step of the last st_verify_mask_prepare, which st_session_verify reads */
    st_tree_mask cur;
    int64_t cur_bs, cur_n; /* 0 until prepared; cur_n: the largest request's nodes */
    int64_t cur_topk;
    int64_t *cur_nb; /* (max_bs) each request's nodes (all cur_n unless ragged) */
};

st_status st_verify_mask_create(st_attn_backend backend, int64_t max_bs, int64_t max_n,
                                int64_t max_ctx_sum, st_verify_mask **out) {
    if (!out)
        return st_fail(ST_ERR_INVALID, "verify mask: out is NULL");
    *out = NULL;
    if (backend != ST_ATTN_CASCADE && backend != ST_ATTN_DENSE)
        return st_fail(ST_ERR_INVALID, "verify mask: unknown backend %d", (int)backend);
    if (max_bs < 1 || max_n < 1 || max_n > ST_TREE_MAX_N || max_ctx_sum < 0)
        return st_fail(ST_ERR_INVALID, "verify mask: bad sizes (bs %lld, n %lld, context %lld)",
                       (long long)max_bs, (long long)max_n, (long long)max_ctx_sum);
    size_t need = 0;
    st_status s;
    if (backend == ST_ATTN_DENSE)
        s = st_tree_mask_bytes(ST_MASK_FULL, max_bs, max_n, max_ctx_sum, &need);
    else if (max_n <= ST_TREE_MAX_N_BITS)
        s = st_tree_mask_bytes(ST_MASK_BITS, max_bs, max_n, 0, &need);
    else
        s = st_tree_mask_bytes(ST_MASK_QLEN, max_bs, max_n, 0, &need);
    if (s)
        return s;
    /* one block: the owner, then its buffer */
    st_plan pl = {0};
    st_plan_take(&pl, 1, sizeof(st_verify_mask));
    st_plan_take(&pl, need, 1);
    st_plan_take(&pl, (size_t)max_bs, sizeof(int64_t));
    st_verify_mask *vm = st_plan_alloc(&pl);
    if (!vm)
        return st_fail(ST_ERR_NOMEM, "verify mask: cannot allocate %zu bytes", pl.off);
    st_plan_take(&pl, 1, sizeof *vm);
    vm->buf = st_plan_take(&pl, need, 1);
    vm->cur_nb = st_plan_take(&pl, (size_t)max_bs, sizeof(int64_t));
    vm->backend = backend;
    vm->max_bs = max_bs;
    vm->max_n = max_n;
    vm->max_ctx_sum = max_ctx_sum;
    vm->cap = need;
    *out = vm;
    return ST_OK;
}

void st_verify_mask_free(st_verify_mask *vm) { st_free_aligned(vm); }

/* The layout vm's backend reads at this topk for trees of at most n nodes. */
static st_mask_layout layout_for(const st_verify_mask *vm, int64_t topk, int64_t n) {
    switch (st_attn_backend_reads(vm->backend, topk)) {
    case ST_READS_NOTHING:
        return ST_MASK_NONE;
    case ST_READS_TREE_BLOCK:
        return n <= ST_TREE_MAX_N_BITS ? ST_MASK_BITS : ST_MASK_QLEN;
    default:
        return ST_MASK_FULL;
    }
}

static st_status step_fits(const st_verify_mask *vm, int64_t topk, int64_t bs, int64_t n,
                           int64_t seq_lens_sum) {
    if (bs < 1 || bs > vm->max_bs || n < 1 || n > vm->max_n || seq_lens_sum < 0 ||
        seq_lens_sum > vm->max_ctx_sum || topk < 1)
        return st_fail(ST_ERR_RANGE,
                       "verify mask: step (bs %lld, n %lld, context %lld) exceeds the sizes it "
                       "was made for (%lld, %lld, %lld)",
                       (long long)bs, (long long)n, (long long)seq_lens_sum, (long long)vm->max_bs,
                       (long long)vm->max_n, (long long)vm->max_ctx_sum);
    return ST_OK;
}

/* Remembers the step for st_session_verify. */
static void remember(st_verify_mask *vm, const st_tree_mask *m, int64_t topk, int64_t bs,
                     int64_t n_max) {
    vm->cur = *m;
    vm->cur_bs = bs;
    vm->cur_n = n_max;
    vm->cur_topk = topk;
}

st_status st_verify_mask_prepare(st_verify_mask *vm, int64_t topk, int64_t bs, int64_t n,
                                 int64_t seq_lens_sum, st_tree_mask *out) {
    if (!vm || !out)
        return st_fail(ST_ERR_INVALID, "verify mask: NULL argument");
    st_status rc = step_fits(vm, topk, bs, n, seq_lens_sum);
    if (rc)
        return rc;
    memset(out, 0, sizeof *out);
    out->layout = layout_for(vm, topk, n);
    out->fill_prefix = out->layout == ST_MASK_FULL;
    out->data = vm->buf;
    out->bytes = vm->cap;
    for (int64_t b = 0; b < bs; b++)
        vm->cur_nb[b] = n;
    remember(vm, out, topk, bs, n);
    return ST_OK;
}

st_status st_verify_mask_prepare_ragged(st_verify_mask *vm, int64_t topk, int64_t bs,
                                        const int64_t *n, const int64_t *seq_lens,
                                        st_tree_mask *out) {
    if (!vm || !n || !seq_lens || !out)
        return st_fail(ST_ERR_INVALID, "verify mask: NULL argument");
    int64_t n_max = 1, sum = 0;
    for (int64_t b = 0; b < bs && b < vm->max_bs; b++) {
        if (n[b] < 1 || n[b] > vm->max_n)
            return st_fail(ST_ERR_RANGE, "verify mask: request %lld has %lld nodes (1..%lld)",
                           (long long)b, (long long)n[b], (long long)vm->max_n);
        if (seq_lens[b] < 0 || seq_lens[b] > vm->max_ctx_sum)
            return st_fail(ST_ERR_RANGE, "verify mask: request %lld has length %lld", (long long)b,
                           (long long)seq_lens[b]);
        n_max = n[b] > n_max ? n[b] : n_max;
        sum += seq_lens[b];
    }
    st_status rc = step_fits(vm, topk, bs, n_max, sum);
    if (rc)
        return rc;
    /* request b's block is its own single-request mask; the blocks follow in request order */
    const st_mask_layout layout = layout_for(vm, topk, n_max);
    size_t base = 0;
    for (int64_t b = 0; b < bs; b++) {
        size_t bytes = 0;
        if ((rc = st_tree_mask_bytes(layout, 1, n[b], seq_lens[b], &bytes)))
            return rc;
        out[b] = (st_tree_mask){layout, layout == ST_MASK_FULL,
                                layout == ST_MASK_NONE ? NULL : (char *)vm->buf + base, bytes};
        base += bytes;
        vm->cur_nb[b] = n[b];
    }
    if (base > vm->cap) /* (unreachable: each block is at most a uniform one's) */
        return st_fail(ST_ERR_RANGE, "verify mask: %zu bytes needed, %zu held", base, vm->cap);
    const st_tree_mask all = {layout, layout == ST_MASK_FULL, vm->buf, vm->cap};
    remember(vm, &all, topk, bs, n_max);
    return ST_OK;
}

const int64_t *st_verify_mask_nodes(const st_verify_mask *vm) {
    return vm && vm->cur_bs ? vm->cur_nb : NULL;
}

const st_tree_mask *st_verify_mask_view(const st_verify_mask *vm, int64_t *bs, int64_t *n,
                                        st_attn_backend *attn, int64_t *topk) {
    if (!vm || vm->cur_bs == 0)
        return NULL;
    *bs = vm->cur_bs;
    *n = vm->cur_n;
    *attn = vm->backend;
    *topk = vm->cur_topk;
    return &vm->cur;
}

int st_tree_mask_cell(const st_tree_mask *mk, int64_t b, int64_t n, int64_t t, int64_t j,
                      const uint8_t *full_row_tree) {
    const uint8_t *m = mk->data;
    switch (mk->layout) {
    case ST_MASK_FULL:
        return full_row_tree[j] != 0;
    case ST_MASK_QLEN:
        return m[(b * n + t) * n + j] != 0;
    case ST_MASK_BITS: {
        size_t w = st_tree_mask_word_bytes(n);
        return (m[(size_t)(b * n + t) * w + (size_t)(j >> 3)] >> (j & 7)) & 1;
    }
    default:
        return j <= t;
    }
}
