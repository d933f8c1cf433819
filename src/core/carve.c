/*
 * carve.c: one allocation per object (llm.c's pattern): the object lists its buffers with their
 * sizes, st_carve_alloc lays them out at 64-byte boundaries in one zeroed block and sets each
 * pointer; freeing the block frees them all. No hand-kept free lists, and a failed allocation
 * leaves every pointer NULL.
 */
#include "core/core.h"

#include <string.h>

void *st_carve_alloc(const st_carve *items, size_t n, size_t *total) {
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t end;
        if (!st_add_size(off, items[i].bytes, &end) || !st_add_size(end, 63, &end))
            return NULL;
        off = end & ~(size_t)63;
    }
    if (total)
        *total = off;
    char *base = st_malloc_aligned(off ? off : 64, 64);
    if (!base)
        return NULL;
    memset(base, 0, off ? off : 64);
    off = 0;
    for (size_t i = 0; i < n; i++) {
        *items[i].ptr = base + off;
        off = (off + items[i].bytes + 63) & ~(size_t)63;
    }
    return base;
}
