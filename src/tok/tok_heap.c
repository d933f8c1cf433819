/*
 * tok_heap.c: the merge queue both merge tokenizers share. SentencePiece BPE (tok_spm.c) and
 * byte-level BPE (tok_bpe.c) each repeatedly merge the best adjacent pair of symbols, ties going
 * to the leftmost; they differ only in what "best" means (highest score, lowest rank), which the
 * caller folds into one key, lowest first. The heap itself is the core one (core/heap.c).
 * Stale entries are skipped by the caller on pop.
 */
#include "tok/tok.h"

static bool pair_above(const void *pa, const void *pb, const void *ctx) {
    (void)ctx;
    const st_tok_pair *a = pa, *b = pb;
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

void st_tok_heap_push(st_tok_pair *h, int64_t *n, st_tok_pair x) {
    st_heap_push(h, sizeof *h, n, &x, pair_above, NULL);
}

st_tok_pair st_tok_heap_pop(st_tok_pair *h, int64_t *n) {
    st_tok_pair top;
    st_heap_pop(h, sizeof *h, n, &top, pair_above, NULL);
    return top;
}
