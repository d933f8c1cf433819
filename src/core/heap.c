/*
 * heap.c: the one binary heap of the library, over elements of any size (up to 64 bytes) and
 * any order: the merge queues of both BPE tokenizers, the top-k of st_sample and the N-1 best
 * candidates of st_tree_organize. `above(a, b)` says a must sit above b; with a total order
 * (every user breaks ties by an index) the results do not depend on how the heap is built.
 */
#include "core/core.h"

#include <string.h>

enum { ST_HEAP_MAX_ELEM = 64 };

#define AT(i) (h + (size_t)(i)*size)

/* Moves x down from slot i into its place in h[0..n) (the hole method: children move up). */
static void sift_down(char *h, size_t size, int64_t n, int64_t i, const void *x,
                      st_heap_above_fn above, const void *ctx) {
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && above(AT(c + 1), AT(c), ctx))
            c++;
        if (!above(AT(c), x, ctx))
            break;
        memcpy(AT(i), AT(c), size);
        i = c;
    }
    memcpy(AT(i), x, size);
}

void st_heap_push(void *heap, size_t size, int64_t *n, const void *x, st_heap_above_fn above,
                  const void *ctx) {
    char *h = heap;
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t up = (i - 1) / 2;
        if (!above(x, AT(up), ctx))
            break;
        memcpy(AT(i), AT(up), size);
        i = up;
    }
    memcpy(AT(i), x, size);
}

void st_heap_pop(void *heap, size_t size, int64_t *n, void *top, st_heap_above_fn above,
                 const void *ctx) {
    char *h = heap, last[ST_HEAP_MAX_ELEM];
    memcpy(top, h, size);
    memcpy(last, AT(--(*n)), size);
    if (*n > 0)
        sift_down(h, size, *n, 0, last, above, ctx);
}

void st_heap_replace_top(void *heap, size_t size, int64_t n, const void *x, st_heap_above_fn above,
                         const void *ctx) {
    char tmp[ST_HEAP_MAX_ELEM];
    memcpy(tmp, x, size);
    sift_down(heap, size, n, 0, tmp, above, ctx);
}
