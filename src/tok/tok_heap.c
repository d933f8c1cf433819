/*
 * tok_heap.c: the priority queue both merge tokenizers share. SentencePiece BPE (tok_spm.c) and
 * byte-level BPE (tok_bpe.c) each repeatedly merge the best adjacent pair of symbols, ties going
 * to the leftmost; they differ only in what "best" means (highest score, lowest rank), which the
 * caller folds into one key, lowest first. Stale entries are skipped by the caller on pop.
 */
#include "tok/tok.h"

static int pair_before(const st_tok_pair *a, const st_tok_pair *b) {
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

void st_tok_heap_push(st_tok_pair *h, int64_t *n, st_tok_pair x) {
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t up = (i - 1) / 2;
        if (!pair_before(&x, &h[up]))
            break;
        h[i] = h[up];
        i = up;
    }
    h[i] = x;
}

st_tok_pair st_tok_heap_pop(st_tok_pair *h, int64_t *n) {
    st_tok_pair top = h[0], x = h[--(*n)];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && pair_before(&h[c + 1], &h[c]))
            c++;
        if (!pair_before(&h[c], &x))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = x;
    return top;
}
