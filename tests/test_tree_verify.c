/*
 * test_tree_verify.c: verifying and committing a draft tree (src/tree/verify.c, the commit)
 * against the golden vectors of docs/TREE_SPEC.md §6.3, against thousands of random and
 * malformed trees run through the Python oracle tree_ref.py (tests/gen_tree_fixtures.py), and
 * for its contracts: rejected bad input, no allocation, untouched prefix cells, KV commit.
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

/* --------------------------------------------------------------------- golden §6.3 */

static const int32_t v_cand[12] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12};
static int64_t v_ri[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
static int64_t v_nt[12] = {1, 2, -1, 4, 5, -1, 4, 2, 3, -1, 5, -1};
static int64_t v_ns[12] = {-1, 3, -1, -1, -1, -1, -1, -1, -1, -1, 1, -1};

static st_tree golden_verify_tree(void) {
    st_tree t = {(int32_t *)v_cand, NULL, v_ri, v_nt, v_ns};
    return t;
}

/* target_logits of §6.3 as (2, 6, 20). */
static void golden_logits(float logits[2][6][20]) {
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 6; j++)
            for (int v = 0; v < 20; v++)
                logits[b][j][v] = 1.0f;
    logits[0][0][3] = logits[0][3][4] = logits[0][4][5] = 10.0f;
    logits[1][0][11] = logits[1][4][12] = 10.0f;
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 6; j++) {
            float mx = logits[b][j][0];
            for (int v = 1; v < 20; v++)
                mx = logits[b][j][v] > mx ? logits[b][j][v] : mx;
            if (mx < 10.0f)
                logits[b][j][18] = 10.0f;
        }
}

static void test_golden_verify_greedy(void **state) {
    (void)state;
    float logits[2][6][20];
    golden_logits(logits);
    int32_t target[12];
    for (int x = 0; x < 12; x++) {
        int best = 0;
        for (int v = 1; v < 20; v++)
            if (logits[x / 6][x % 6][v] > logits[x / 6][x % 6][best])
                best = v;
        target[x] = best;
    }
    st_tree t = golden_verify_tree();
    int32_t predicts[12];
    int64_t acc[8], num[2];
    check_status(st_verify_tree_greedy(2, 6, 3, &t, target, predicts, acc, num), ST_OK, NULL);
    const int64_t want_p[] = {3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18};
    const int64_t want_a[] = {0, 3, 4, 5, 6, 10, 11, -1};
    const int64_t want_n[] = {3, 2};
    check_i32("predicts", 0, predicts, want_p, 12);
    check_i64("accept_index", 0, acc, want_a, 8);
    check_i64("accept_token_num", 0, num, want_n, 2);
}

static void test_golden_target_only(void **state) {
    (void)state;
    float logits[2][6][20], probs[2][6][20];
    golden_logits(logits);
    for (int b = 0; b < 2; b++) /* softmax(logits / 0.01): one-hot in float */
        for (int j = 0; j < 6; j++) {
            double mx = -INFINITY, sum = 0.0, e[20];
            for (int v = 0; v < 20; v++)
                mx = fmax(mx, logits[b][j][v] / 0.01);
            for (int v = 0; v < 20; v++)
                sum += e[v] = exp(logits[b][j][v] / 0.01 - mx);
            for (int v = 0; v < 20; v++)
                probs[b][j][v] = (float)(e[v] / sum);
        }
    st_tree t = golden_verify_tree();
    const struct {
        float ts, ta;
        int64_t p[12], a[8], n[2];
    } want[] = {
        {1, 1, {3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18}, {0, 3, 4, 5, 6, 10, 11, -1}, {3, 2}},
        {0,
         0,
         {1, 2, 18, -1, -1, -1, 11, -1, -1, -1, 12, 18},
         {0, 1, 2, -1, 6, 10, 11, -1},
         {2, 2}},
    };
    for (uint64_t trial = 0; trial < 200; trial++) {
        float coins[12], cf[2];
        for (int i = 0; i < 12; i++)
            coins[i] = st_rng_uniform(trial, (uint64_t)i);
        cf[0] = st_rng_uniform(trial, 100);
        cf[1] = st_rng_uniform(trial, 101);
        for (int w = 0; w < 2; w++) {
            int32_t predicts[12];
            int64_t acc[8], num[2];
            check_status(st_verify_tree_target_only(2, 6, 3, 20, &t, &probs[0][0][0], coins, cf,
                                                    want[w].ts, want[w].ta, predicts, acc, num),
                         ST_OK, NULL);
            check_i32("predicts", (int)trial, predicts, want[w].p, 12);
            check_i64("accept_index", (int)trial, acc, want[w].a, 8);
            check_i64("accept_token_num", (int)trial, num, want[w].n, 2);
        }
    }
}

/* ------------------------------------------------------- random trees vs tree_ref.py */

typedef struct cursor {
    const char *p;
    int case_id;
} cursor;

static const char *next_word(cursor *c, char *buf, size_t cap) {
    while (*c->p == ' ' || *c->p == '\n')
        c->p++;
    size_t len = strcspn(c->p, " \n");
    if (len == 0 || len >= cap)
        fail_msg("fixture: bad token near case %d", c->case_id);
    memcpy(buf, c->p, len);
    buf[len] = 0;
    c->p += len;
    return buf;
}

static long long next_ll(cursor *c) {
    char buf[64], *end;
    next_word(c, buf, sizeof buf);
    long long v = strtoll(buf, &end, 10);
    if (*end)
        fail_msg("fixture: \"%s\" is not an integer (case %d)", buf, c->case_id);
    return v;
}

/* "name count values..." with count == want (want < 0: any); returns a malloc'd int64 array. */
static int64_t *read_arr(cursor *c, const char *name, int64_t want, int64_t *count) {
    char buf[64];
    if (strcmp(next_word(c, buf, sizeof buf), name) != 0)
        fail_msg("fixture: got \"%s\", want \"%s\" (case %d)", buf, name, c->case_id);
    int64_t cnt = next_ll(c);
    if (want >= 0 && cnt != want)
        fail_msg("fixture: %s has %lld values, want %lld (case %d)", name, (long long)cnt,
                 (long long)want, c->case_id);
    int64_t *v = malloc((size_t)(cnt > 0 ? cnt : 1) * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < cnt; i++) {
        next_word(c, buf, sizeof buf);
        char *end;
        if (strcmp(name, "bits") == 0)
            v[i] = (int64_t)strtoull(buf, &end, 10);
        else if (strcmp(name, "scores") == 0 || strcmp(name, "th") == 0) {
            double d = strtod(buf, &end); /* stored as the bits of the exact float */
            float f = (float)d;
            if ((double)f != d)
                fail_msg("fixture: %s value %s is not exact in float32", name, buf);
            int32_t u;
            memcpy(&u, &f, sizeof u);
            v[i] = u;
        } else
            v[i] = strtoll(buf, &end, 10);
        if (*end)
            fail_msg("fixture: bad %s value \"%s\" (case %d)", name, buf, c->case_id);
    }
    if (count)
        *count = cnt;
    return v;
}

static float as_float(int64_t bits) {
    int32_t u = (int32_t)bits;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int32_t *to_i32(const int64_t *v, int64_t cnt) {
    int32_t *o = malloc((size_t)(cnt > 0 ? cnt : 1) * sizeof *o);
    assert_non_null(o);
    for (int64_t i = 0; i < cnt; i++)
        o[i] = (int32_t)v[i];
    return o;
}

/* Expands run-length pairs (value, count) into bytes; checks the total. */
static uint8_t *unrle(const int64_t *pairs, int64_t n_pairs, size_t total, int cid) {
    uint8_t *o = malloc(total > 0 ? total : 1);
    size_t at = 0;
    assert_non_null(o);
    assert_true(n_pairs % 2 == 0);
    for (int64_t i = 0; i < n_pairs; i += 2) {
        if (at + (size_t)pairs[i + 1] > total)
            fail_msg("case %d: full mask runs exceed %zu cells", cid, total);
        memset(o + at, (int)pairs[i], (size_t)pairs[i + 1]);
        at += (size_t)pairs[i + 1];
    }
    if (at != total)
        fail_msg("case %d: oracle full mask has %zu cells, st_tree_mask_bytes says %zu", cid, at,
                 total);
    return o;
}

/* SGLang's legacy target-only kernel written literally, with a real zeroed draft_probs
 * (bs, N, V) that rejected children mark: the reference for st_verify_tree_target_only's
 * scratch-free equivalent. Sibling lists must be acyclic. */
static void literal_target_only(int64_t bs, int64_t n, int64_t steps, int64_t vocab,
                                const st_tree *t, const float *probs, const float *coins,
                                const float *cfinal, float ts, float ta, int32_t *predicts,
                                int64_t *acc, int64_t *num) {
    float *dp = calloc((size_t)(bs * n * vocab), sizeof *dp);
    assert_non_null(dp);
    const double th_acc = ta > 1e-9 ? (double)ta : 1e-9;
    for (int64_t x = 0; x < bs * n; x++)
        predicts[x] = -1;
    for (int64_t b = 0; b < bs; b++) {
        const int64_t *ri = t->retrieve_index + b * n, *nt = t->next_token + b * n;
        const int64_t *ns = t->next_sibling + b * n;
        const int32_t *cand = t->tokens + b * n;
        int64_t *a = acc + b * (steps + 1);
        for (int64_t i = 0; i <= steps; i++)
            a[i] = -1;
        double prob_acc = 0.0;
        int64_t row = 0, last = ri[0], k = 0, cur = 0;
        float coin = coins[b * n];
        a[0] = last;
        for (int64_t j = 1; j <= steps; j++) {
            cur = nt[cur];
            while (cur != -1) {
                int32_t tok = cand[cur];
                float q = probs[(b * n + row) * vocab + tok];
                prob_acc += q;
                if ((double)coin <= prob_acc / th_acc || q >= ts) {
                    prob_acc = 0.0;
                    row = cur;
                    coin = coins[b * n + cur];
                    predicts[last] = tok;
                    a[++k] = ri[cur];
                    last = ri[cur];
                    break;
                }
                dp[(b * n + row) * vocab + tok] = q;
                cur = ns[cur];
            }
            if (cur == -1)
                break;
        }
        num[b] = k;
        const float *q = probs + (b * n + row) * vocab, *p = dp + (b * n + row) * vocab;
        double total = 0.0, c = 0.0;
        for (int64_t v = 0; v < vocab; v++) {
            float r = q[v] - (k != steps ? p[v] : 0.0f);
            total += r > 0.0f ? r : 0.0f;
        }
        double u = (double)cfinal[b] * total;
        int64_t sampled = -1, last_valid = -1;
        for (int64_t v = 0; v < vocab; v++) {
            float r = q[v] - (k != steps ? p[v] : 0.0f);
            r = r > 0.0f ? r : 0.0f;
            if (r > 0.0f)
                last_valid = v;
            c += r;
            if (sampled < 0 && c > u)
                sampled = v;
        }
        if (sampled < 0)
            sampled = last_valid >= 0 ? last_valid : vocab - 1;
        predicts[last] = (int32_t)sampled;
    }
    free(dp);
}

/* Arrays of one fixture case, freed together. */
typedef struct fx {
    void *p[48];
    int n;
} fx;

static void *fx_keep(fx *f, void *p) {
    assert_true(f->n < 48);
    f->p[f->n++] = p;
    return p;
}

static void fx_free(fx *f) {
    for (int i = 0; i < f->n; i++)
        free(f->p[i]);
}

static int64_t g_fixture_cases, g_fixture_malformed;

static void run_fixture_case(cursor *c) {
    char kind[32], buf[64];
    if (strcmp(next_word(c, buf, sizeof buf), "case") != 0)
        fail_msg("fixture: expected a case after case %d", c->case_id);
    const int cid = (int)next_ll(c);
    c->case_id = cid;
    next_word(c, kind, sizeof kind);
    const int64_t bs = next_ll(c), k = next_ll(c), s = next_ll(c), n = next_ll(c);
    const int64_t vocab = next_ll(c);
    const int malformed = strcmp(kind, "malformed") == 0;
    const st_tree_shape shape = {bs, k, s, n};
    const int64_t m = st_tree_n_candidates(k, s), pw = st_tree_parent_width(k, s);
    const int64_t lw = st_tree_level_parents_width(k, s), rows = bs * n;
    fx f = {{0}, 0};
#define R(name, cnt) ((int64_t *)fx_keep(&f, read_arr(c, name, cnt, NULL)))
#define R32(v, cnt) ((int32_t *)fx_keep(&f, to_i32(v, cnt)))
    g_fixture_cases++;
    g_fixture_malformed += malformed;

    int64_t *L = R("L", bs);
    int32_t *roots = R32(R("root", bs), bs);
    int64_t *scores = NULL, *tokens = NULL, *lpar = NULL;
    if (!malformed) {
        scores = R("scores", bs * m);
        tokens = R("tokens", bs * m);
        lpar = R("lparents", bs * lw);
    }
    int64_t *sel = R("sel", bs * (n - 1));
    int32_t *drafts = R32(R("drafts", bs * (n - 1)), bs * (n - 1));
    int64_t *plist = R("plist", bs * pw);
    int64_t *pos = R("pos", rows), *ri = R("ri", rows), *rnt = R("rnt", rows);
    int64_t *rns = R("rns", rows), *bits = R("bits", rows);
    int64_t n_on, n_off;
    int64_t *fullon = fx_keep(&f, read_arr(c, "fullon", -1, &n_on));
    int64_t *fulloff = fx_keep(&f, read_arr(c, "fulloff", -1, &n_off));
    int32_t *tp = R32(R("tp", rows), rows);
    int64_t *gpred = R("gpred", rows), *gacc = R("gacc", bs * (s + 1)), *gnum = R("gnum", bs);
    int64_t *probs_c = R("probs", rows * vocab), *coins_c = R("coins", rows);
    int64_t *cfinal_c = R("cfinal", bs), *th = R("th", 2);
    int64_t *spred = R("spred", rows), *sacc = R("sacc", bs * (s + 1)), *snum = R("snum", bs);

    if (!malformed) { /* organize against tree_ref.organize */
        float *sc = fx_keep(&f, malloc((size_t)(bs * m) * sizeof *sc));
        int32_t *tk = R32(tokens, bs * m);
        int64_t *osel = fx_keep(&f, malloc((size_t)rows * sizeof *osel));
        int32_t *odr = fx_keep(&f, malloc((size_t)rows * sizeof *odr));
        int64_t *opl = fx_keep(&f, malloc((size_t)(bs * pw + 1) * sizeof *opl));
        for (int64_t i = 0; i < bs * m; i++)
            sc[i] = as_float(scores[i]);
        check_status(st_tree_organize(&shape, sc, tk, lpar, osel, odr, opl), ST_OK, NULL);
        check_i64("top_scores_index", cid, osel, sel, bs * (n - 1));
        for (int64_t i = 0; i < bs * (n - 1); i++)
            assert_int_equal(odr[i], drafts[i]);
        check_i64("parent_list", cid, opl, plist, bs * pw);
    }

    int64_t sum_l = 0;
    for (int64_t b = 0; b < bs; b++)
        sum_l += L[b];
    size_t full_bytes, qlen_bytes, bits_bytes;
    check_status(st_tree_mask_bytes(ST_MASK_FULL, bs, n, sum_l, &full_bytes), ST_OK, NULL);
    check_status(st_tree_mask_bytes(ST_MASK_QLEN, bs, n, sum_l, &qlen_bytes), ST_OK, NULL);
    check_status(st_tree_mask_bytes(ST_MASK_BITS, bs, n, sum_l, &bits_bytes), ST_OK, NULL);
    uint8_t *want_on = fx_keep(&f, unrle(fullon, n_on, full_bytes, cid));
    uint8_t *want_off = fx_keep(&f, unrle(fulloff, n_off, full_bytes, cid));
    uint8_t *mask = fx_keep(&f, malloc(full_bytes));
    const size_t w = st_tree_mask_word_bytes(n);
    bufs o = bufs_new(bs, n);
    const st_tree_input in = {roots, plist, sel, drafts, L};
    /* FULL fill (0xAB pre-fill), FULL no fill (0 pre-fill and 0xAB pre-fill), QLEN, BITS, NONE */
    const struct {
        st_mask_layout layout;
        int fill, prefill;
    } cfg[] = {{ST_MASK_FULL, 1, 0xAB}, {ST_MASK_FULL, 0, 0},    {ST_MASK_FULL, 0, 0xAB},
               {ST_MASK_QLEN, 0, 0xAB}, {ST_MASK_BITS, 0, 0xAB}, {ST_MASK_NONE, 0, 0xAB}};
    for (int ci = 0; ci < 6; ci++) {
        memset(mask, cfg[ci].prefill, full_bytes);
        memset(o.tree.positions, 0xAB, (size_t)rows * sizeof(int32_t));
        memset(o.tree.next_token, 0xAB, (size_t)rows * sizeof(int64_t));
        memset(o.tree.next_sibling, 0xAB, (size_t)rows * sizeof(int64_t));
        st_tree_mask mk = {cfg[ci].layout, cfg[ci].fill, mask,
                           cfg[ci].layout == ST_MASK_FULL   ? full_bytes
                           : cfg[ci].layout == ST_MASK_QLEN ? qlen_bytes
                           : cfg[ci].layout == ST_MASK_BITS ? bits_bytes
                                                            : 0};
        check_status(st_tree_build(&shape, &in, &o.tree, &mk), ST_OK, NULL);
        check_i32("positions", cid, o.tree.positions, pos, rows);
        check_i64("retrieve_index", cid, o.tree.retrieve_index, ri, rows);
        check_i64("next_token", cid, o.tree.next_token, rnt, rows);
        check_i64("next_sibling", cid, o.tree.next_sibling, rns, rows);
        for (int64_t b = 0; b < bs; b++) {
            assert_int_equal(o.tree.tokens[b * n], roots[b]);
            for (int64_t i = 1; i < n; i++)
                assert_int_equal(o.tree.tokens[b * n + i], drafts[b * (n - 1) + i - 1]);
        }
        if (cfg[ci].layout == ST_MASK_FULL && cfg[ci].fill) {
            if (memcmp(mask, want_on, full_bytes) != 0)
                fail_msg("case %d: FULL mask with fill differs from full_mask_flat", cid);
        } else if (cfg[ci].layout == ST_MASK_FULL && cfg[ci].prefill == 0) {
            if (memcmp(mask, want_off, full_bytes) != 0)
                fail_msg("case %d: FULL mask without fill differs from full_mask_flat", cid);
        } else if (cfg[ci].layout == ST_MASK_FULL) { /* prefix cells untouched */
            size_t at = 0;
            for (int64_t b = 0; b < bs; b++)
                for (int64_t t = 0; t < n; t++) {
                    for (int64_t col = 0; col < L[b] + n; col++, at++)
                        if (mask[at] != (col < L[b] ? 0xAB : want_off[at]))
                            fail_msg("case %d: FULL no-fill cell (%lld,%lld,%lld) = %d", cid,
                                     (long long)b, (long long)t, (long long)col, mask[at]);
                }
        } else if (cfg[ci].layout == ST_MASK_QLEN) {
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < n; j++)
                    if (mask[r * n + j] != (((uint64_t)bits[r] >> j) & 1))
                        fail_msg("case %d: QLEN cell (%lld,%lld)", cid, (long long)r, (long long)j);
            for (size_t i = qlen_bytes; i < full_bytes; i++)
                assert_int_equal(mask[i], 0xAB);
        } else if (cfg[ci].layout == ST_MASK_BITS) {
            for (int64_t r = 0; r < rows; r++) {
                uint64_t word = 0;
                for (size_t i = 0; i < w; i++)
                    word |= (uint64_t)mask[(size_t)r * w + i] << (8 * i);
                if (word != (uint64_t)bits[r])
                    fail_msg("case %d: BITS row %lld = %llx, want %llx", cid, (long long)r,
                             (unsigned long long)word, (unsigned long long)bits[r]);
            }
            for (size_t i = bits_bytes; i < full_bytes; i++)
                assert_int_equal(mask[i], 0xAB);
        } else {
            for (size_t i = 0; i < full_bytes; i++)
                assert_int_equal(mask[i], 0xAB);
        }
    }

    /* greedy verify against tree_ref.verify_greedy */
    int32_t *pred = fx_keep(&f, malloc((size_t)rows * sizeof *pred));
    int64_t *acc = fx_keep(&f, malloc((size_t)(bs * (s + 1)) * sizeof *acc));
    int64_t *num = fx_keep(&f, malloc((size_t)bs * sizeof *num));
    check_status(st_verify_tree_greedy(bs, n, s, &o.tree, tp, pred, acc, num), ST_OK, NULL);
    check_i32("greedy predicts", cid, pred, gpred, rows);
    check_i64("greedy accept_index", cid, acc, gacc, bs * (s + 1));
    check_i64("greedy accept_token_num", cid, num, gnum, bs);

    /* target-only sampling against tree_ref's tree_sample and the literal C form */
    float *probs = fx_keep(&f, malloc((size_t)(rows * vocab) * sizeof *probs));
    float *coins = fx_keep(&f, malloc((size_t)rows * sizeof *coins));
    float cfinal[8];
    for (int64_t i = 0; i < rows * vocab; i++)
        probs[i] = (float)probs_c[i] / 1024.0f;
    for (int64_t i = 0; i < rows; i++)
        coins[i] = (float)coins_c[i] / 4096.0f;
    for (int64_t b = 0; b < bs; b++)
        cfinal[b] = (float)cfinal_c[b] / 4096.0f;
    const float ts = as_float(th[0]), ta = as_float(th[1]);
    check_status(st_verify_tree_target_only(bs, n, s, vocab, &o.tree, probs, coins, cfinal, ts, ta,
                                            pred, acc, num),
                 ST_OK, NULL);
    check_i32("sample predicts", cid, pred, spred, rows);
    check_i64("sample accept_index", cid, acc, sacc, bs * (s + 1));
    check_i64("sample accept_token_num", cid, num, snum, bs);
    literal_target_only(bs, n, s, vocab, &o.tree, probs, coins, cfinal, ts, ta, pred, acc, num);
    check_i32("literal predicts", cid, pred, spred, rows);
    check_i64("literal accept_index", cid, acc, sacc, bs * (s + 1));

    bufs_free(&o);
    fx_free(&f);
#undef R
#undef R32
}

static void test_oracle_fixtures(void **state) {
    (void)state;
    char path[4096], cmd[16384];
    snprintf(path, sizeof path, "%s/tree_fixtures.txt", ST_BUILD_DIR);
    remove(path);
    snprintf(cmd, sizeof cmd, "\"%s\" \"%s/tests/gen_tree_fixtures.py\" \"%s\" \"%s\" 1 3000",
             ST_PYTHON3, ST_SOURCE_DIR, ST_SOURCE_DIR "/docs", path);
    int rc = system(cmd);
    if (rc != 0)
        fail_msg("the fixture generator failed (status %d); python3 and "
                 "docs/tree_ref.py are required: %s",
                 rc, cmd);
    char *text = tu_read_file(path, NULL);
    if (!text)
        fail_msg("cannot read %s", path);
    cursor c = {text, -1};
    char buf[64];
    if (strcmp(next_word(&c, buf, sizeof buf), "fixtures") != 0)
        fail_msg("%s: not a fixture file", path);
    const long long count = next_ll(&c);
    g_fixture_cases = g_fixture_malformed = 0;
    for (long long i = 0; i < count; i++)
        run_fixture_case(&c);
    print_message("[          ] %lld random trees matched tree_ref.py (%lld malformed)\n",
                  (long long)g_fixture_cases, (long long)g_fixture_malformed);
    assert_true(g_fixture_cases >= 1000);
    assert_true(g_fixture_malformed >= 300);
    free(text);
}

/* ------------------------------------------------ target-only: scratch-free == literal */

/* Random lists with acyclic sibling chains but arbitrary next_token (cycles through parents,
 * revisited rows), random distributions: the scratch-free sampler must match the literal one. */
static void test_target_only_equals_literal(void **state) {
    (void)state;
    uint64_t rng = 0xfeedbeefu;
    enum { BS = 3, NMAX = 12, VMAX = 9 };
    for (int it = 0; it < 4000; it++) {
        const int64_t n = 1 + rng_below(&rng, NMAX), vocab = 1 + rng_below(&rng, VMAX);
        const int64_t steps = rng_below(&rng, 7);
        int32_t cand[BS * NMAX];
        int64_t ri[BS * NMAX], nt[BS * NMAX], ns[BS * NMAX];
        float probs[BS * NMAX * VMAX], coins[BS * NMAX], cf[BS];
        for (int64_t x = 0; x < BS * n; x++) {
            int64_t i = x % n;
            cand[x] = (int32_t)rng_below(&rng, vocab);
            ri[x] = x;
            nt[x] = rng_below(&rng, 3) == 0 ? -1 : rng_below(&rng, n);
            ns[x] = i + 1 < n && rng_below(&rng, 2) ? i + 1 + rng_below(&rng, n - i - 1) : -1;
            coins[x] = (float)rng_below(&rng, 65) / 64.0f;
        }
        for (int64_t i = 0; i < BS * n * vocab; i++)
            probs[i] = rng_below(&rng, 4) == 0 ? 0.0f : (float)rng_below(&rng, 9) / 16.0f;
        for (int b = 0; b < BS; b++)
            cf[b] = (float)rng_below(&rng, 64) / 64.0f;
        const float th[][2] = {{1, 1}, {0, 0}, {0.5f, 0.25f}, {1, 0.5f}};
        const int ti = (int)rng_below(&rng, 4);
        st_tree t = {cand, NULL, ri, nt, ns};
        int32_t p1[BS * NMAX], p2[BS * NMAX];
        int64_t a1[BS * 8], a2[BS * 8], n1[BS], n2[BS];
        check_status(st_verify_tree_target_only(BS, n, steps, vocab, &t, probs, coins, cf,
                                                th[ti][0], th[ti][1], p1, a1, n1),
                     ST_OK, NULL);
        literal_target_only(BS, n, steps, vocab, &t, probs, coins, cf, th[ti][0], th[ti][1], p2, a2,
                            n2);
        assert_memory_equal(p1, p2, (size_t)(BS * n) * sizeof *p1);
        assert_memory_equal(a1, a2, (size_t)(BS * (steps + 1)) * sizeof *a1);
        assert_memory_equal(n1, n2, sizeof n1);
    }
}

static void test_verify_rejects(void **state) {
    (void)state;
    int32_t cand[4] = {0, 1, 2, 3}, target[4] = {1, 2, 3, 0}, pred[4];
    int64_t ri[4] = {0, 1, 2, 3}, nt[4] = {1, -1, -1, -1}, ns[4] = {-1, 2, 3, -1};
    int64_t acc[8], num[1];
    float probs[4 * 4] = {0}, coins[4] = {0.5f, 0.5f, 0.5f, 0.5f}, cf[1] = {0.5f};
    st_tree t = {cand, NULL, ri, nt, ns};
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_OK, NULL);
    check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, coins, cf, 1, 1, pred, acc, num),
                 ST_OK, NULL);
    check_status(st_verify_tree_greedy(0, 4, 3, &t, target, pred, acc, num), ST_ERR_INVALID, "bs");
    check_status(st_verify_tree_greedy(1, 0, 3, &t, target, pred, acc, num), ST_ERR_INVALID, "n =");
    check_status(st_verify_tree_greedy(1, 4, -1, &t, target, pred, acc, num), ST_ERR_INVALID,
                 "steps");
    check_status(st_verify_tree_greedy(1, 4, 3, NULL, target, pred, acc, num), ST_ERR_INVALID,
                 "NULL");
    check_status(st_verify_tree_greedy(1, 4, 3, &t, NULL, pred, acc, num), ST_ERR_INVALID, "NULL");
    nt[2] = 4;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_ERR_RANGE,
                 "next_token[0][2] = 4");
    nt[2] = -2;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_ERR_RANGE,
                 "next_token[0][2]");
    nt[2] = -1;
    ns[0] = 7;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_ERR_RANGE,
                 "next_sibling[0][0]");
    ns[0] = -1;
    ri[3] = 4;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_ERR_RANGE,
                 "retrieve_index[0][3]");
    ri[3] = 3;
    ns[3] = 1; /* siblings 1 -> 2 -> 3 -> 1: a cycle, found when no child matches */
    target[0] = 9;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_ERR_INVALID,
                 "cycle");
    check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, coins, cf, 1, 1, pred, acc, num),
                 ST_ERR_INVALID, "cycle");
    ns[3] = -1;
    nt[0] = 0; /* the root as its own child: a self loop in next_token is bounded by steps */
    ns[0] = 0;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_ERR_INVALID,
                 "cycle");
    ns[0] = -1;
    target[0] = 0;
    check_status(st_verify_tree_greedy(1, 4, 3, &t, target, pred, acc, num), ST_OK, NULL);
    assert_int_equal(num[0], 3);
    nt[0] = 1;
    cand[2] = 4; /* outside a vocabulary of 4 */
    check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, coins, cf, 1, 1, pred, acc, num),
                 ST_ERR_RANGE, "vocabulary");
    cand[2] = -1;
    check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, coins, cf, 1, 1, pred, acc, num),
                 ST_ERR_RANGE, "vocabulary");
    cand[2] = 2;
    const float bad_th[][2] = {{-0.1f, 1}, {1, 1.5f}, {NAN, 1}, {1, NAN}};
    for (int i = 0; i < 4; i++)
        check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, coins, cf, bad_th[i][0],
                                                bad_th[i][1], pred, acc, num),
                     ST_ERR_INVALID, "threshold");
    check_status(st_verify_tree_target_only(1, 4, 3, 0, &t, probs, coins, cf, 1, 1, pred, acc, num),
                 ST_ERR_INVALID, "n_vocab");
    check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, NULL, cf, 1, 1, pred, acc, num),
                 ST_ERR_INVALID, "coins");
    /* A distribution with no positive mass falls back to V-1; NaN counts as zero. */
    probs[0] = NAN;
    coins[0] = 2.0f; /* reject everything */
    check_status(st_verify_tree_target_only(1, 4, 3, 4, &t, probs, coins, cf, 1, 1, pred, acc, num),
                 ST_OK, NULL);
    assert_int_equal(num[0], 0);
    assert_int_equal(pred[0], 3);
}

/* ------------------------------------------------------------------------- commit */

static uint8_t kv_pattern(int64_t plane, int64_t row, size_t byte) {
    return (uint8_t)(plane * 131 + row * 17 + (int64_t)byte * 7 + 1);
}

static void test_commit(void **state) {
    (void)state;
    const int64_t planes = 3, n = 8, pos = 5;
    const size_t row = 12, stride = (size_t)(pos + n) * row + 7, kv_bytes = 2 * stride + 13 * row;
    uint8_t *kv = malloc(kv_bytes), *orig = malloc(kv_bytes);
    assert_true(kv_bytes == (size_t)(planes - 1) * stride + (size_t)(pos + n) * row);
    for (size_t i = 0; i < kv_bytes; i++) {
        size_t p = i / stride, r = (i % stride) / row;
        orig[i] = (i % stride) >= (size_t)(pos + n) * row
                      ? 0xEE
                      : kv_pattern((int64_t)p, (int64_t)r, (i % stride) % row);
    }
    uint64_t rng = 5;
    for (int it = 0; it < 500; it++) {
        /* a random strictly increasing accepted set starting at the root */
        int64_t acc[8] = {0}, na = 1;
        for (int64_t i = 1; i < n; i++)
            if (rng_below(&rng, 2))
                acc[na++] = i;
        memcpy(kv, orig, kv_bytes);
        check_status(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, n, acc, na), ST_OK,
                     NULL);
        for (size_t i = 0; i < kv_bytes; i++) {
            size_t p = i / stride, off = i % stride, r = off / row;
            uint8_t want = orig[i];
            if (off < (size_t)(pos + n) * row && (int64_t)r >= pos && (int64_t)r < pos + na)
                want = kv_pattern((int64_t)p, pos + acc[(int64_t)r - pos], off % row);
            if (kv[i] != want)
                fail_msg("iteration %d: byte %zu (plane %zu row %zu) = %d, want %d", it, i, p, r,
                         kv[i], want);
        }
    }
    /* rejections leave the cache untouched */
    const int64_t ok[] = {0, 2, 5};
    const int64_t not_root[] = {1, 2}, not_inc[] = {0, 3, 3}, too_big[] = {0, 8};
    memcpy(kv, orig, kv_bytes);
#define REJECT(call, status, needle)                                                               \
    do {                                                                                           \
        check_status(call, status, needle);                                                        \
        assert_memory_equal(kv, orig, kv_bytes);                                                   \
    } while (0)
    REJECT(st_tree_commit_rows(NULL, kv_bytes, row, planes, stride, pos, n, ok, 3), ST_ERR_INVALID,
           "NULL");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, n, NULL, 3), ST_ERR_INVALID,
           "NULL");
    REJECT(st_tree_commit_rows(kv, kv_bytes, 0, planes, stride, pos, n, ok, 3), ST_ERR_INVALID,
           "row_bytes");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, 0, stride, pos, n, ok, 3), ST_ERR_INVALID,
           "n_planes");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, 0, ok, 3), ST_ERR_INVALID,
           "n =");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, 1025, ok, 3), ST_ERR_INVALID,
           "n =");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, -1, n, ok, 3), ST_ERR_RANGE,
           "pos");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, n, ok, 0), ST_ERR_RANGE,
           "n_accept");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, 2, ok, 3), ST_ERR_RANGE,
           "n_accept");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, n, not_root, 2),
           ST_ERR_INVALID, "root");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, n, not_inc, 3),
           ST_ERR_INVALID, "increasing");
    REJECT(st_tree_commit_rows(kv, kv_bytes, row, planes, stride, pos, n, too_big, 2), ST_ERR_RANGE,
           "accept_nodes[1] = 8");
    REJECT(st_tree_commit_rows(kv, kv_bytes - 1, row, planes, stride, pos, n, ok, 3), ST_ERR_RANGE,
           "bytes");
    REJECT(
        st_tree_commit_rows(kv, kv_bytes, row, planes, (size_t)(pos + n) * row - 1, pos, n, ok, 3),
        ST_ERR_RANGE, "plane_stride");
    REJECT(st_tree_commit_rows(kv, kv_bytes, SIZE_MAX / 2, planes, stride, pos, n, ok, 3),
           ST_ERR_RANGE, "overflow");
#undef REJECT
    /* one plane: the stride does not matter */
    check_status(st_tree_commit_rows(kv, (size_t)(pos + n) * row, row, 1, 0, pos, n, ok, 3), ST_OK,
                 NULL);
    free(kv);
    free(orig);
}

/* ---------------------------------------------------------------- no allocation */

static void test_no_allocation(void **state) {
    (void)state;
    uint64_t rng = 77;
    const int64_t bs = 4, k = 4, s = 5, n = 16, vocab = 64;
    const int64_t m = st_tree_n_candidates(k, s), lw = st_tree_level_parents_width(k, s);
    const int64_t pw = st_tree_parent_width(k, s);
    const st_tree_shape shape = {bs, k, s, n};
    float *sc = malloc((size_t)(bs * m) * sizeof *sc);
    int32_t *tk = malloc((size_t)(bs * m) * sizeof *tk), dr[4 * 16], roots[4] = {1, 2, 3, 4};
    int64_t *lp = malloc((size_t)(bs * lw) * sizeof *lp), sel[4 * 16];
    int64_t *pl = malloc((size_t)(bs * pw) * sizeof *pl), L[4] = {100, 0, 7, 3000};
    simulate_draft(&rng, bs, k, s, vocab, sc, tk, lp);
    size_t fb;
    check_status(st_tree_mask_bytes(ST_MASK_FULL, bs, n, 3107, &fb), ST_OK, NULL);
    uint8_t *mask = malloc(fb), *kv = malloc(2 * 64 * (size_t)(3000 + n));
    float *probs = malloc((size_t)(bs * n * vocab) * sizeof *probs), coins[64], cf[4];
    for (int64_t i = 0; i < bs * n * vocab; i++)
        probs[i] = (float)rng_below(&rng, 5) / 32.0f;
    for (int i = 0; i < 64; i++)
        coins[i] = (float)rng_below(&rng, 100) / 100.0f;
    for (int i = 0; i < 4; i++)
        cf[i] = 0.3f;
    int32_t target[64], pred[64];
    int64_t acc[4 * 6], num[4], nodes[6];
    bufs o = bufs_new(bs, n);
    const st_tree_input in = {roots, pl, sel, dr, L};
    const st_mask_layout layouts[] = {ST_MASK_FULL, ST_MASK_QLEN, ST_MASK_BITS, ST_MASK_NONE};
    const int64_t before = st_alloc_count();
    for (int it = 0; it < 200; it++) {
        assert_int_equal(st_tree_organize(&shape, sc, tk, lp, sel, dr, pl), ST_OK);
        st_tree_mask mk = {layouts[it % 4], it % 8 < 4, mask, fb};
        assert_int_equal(st_tree_build(&shape, &in, &o.tree, &mk), ST_OK);
        for (int64_t x = 0; x < bs * n; x++) /* agree with the first child when there is one */
            target[x] = o.tree.next_token[x] >= 0
                            ? o.tree.tokens[(x / n) * n + o.tree.next_token[x]]
                            : (int32_t)rng_below(&rng, vocab);
        assert_int_equal(st_verify_tree_greedy(bs, n, s, &o.tree, target, pred, acc, num), ST_OK);
        for (int64_t b = 0; b < bs; b++) {
            for (int64_t i = 0; i <= num[b]; i++)
                nodes[i] = acc[b * (s + 1) + i] - b * n;
            assert_int_equal(st_tree_commit_rows(kv, 2 * 64 * (size_t)(3000 + n), 64, 2,
                                                 64 * (size_t)(3000 + n), L[b], n, nodes,
                                                 num[b] + 1),
                             ST_OK);
        }
        assert_int_equal(st_verify_tree_target_only(bs, n, s, vocab, &o.tree, probs, coins, cf, 1,
                                                    1, pred, acc, num),
                         ST_OK);
    }
    assert_int_equal(st_alloc_count(), before);
    bufs_free(&o);
    free(sc);
    free(tk);
    free(lp);
    free(pl);
    free(mask);
    free(kv);
    free(probs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_verify_greedy),
        cmocka_unit_test(test_golden_target_only),
        cmocka_unit_test(test_oracle_fixtures),
        cmocka_unit_test(test_target_only_equals_literal),
        cmocka_unit_test(test_verify_rejects),
        cmocka_unit_test(test_commit),
        cmocka_unit_test(test_no_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
