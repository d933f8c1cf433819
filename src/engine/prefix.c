/*
 * prefix.c: the engine's prefix cache. Prompts are cut into blocks of `block` tokens; a block is
 * cached under the hash of (the block before it, its tokens), so a block stands for the whole
 * prefix that ends with it and prompts that share a start share its blocks (a chain of blocks per
 * prompt, a tree over all of them: vLLM's automatic prefix caching). The longest cached prefix of
 * a prompt is found block by block, one hash probe each, so a lookup costs O(prompt) whatever the
 * number of entries. Each block holds an opaque payload the engine fills (the target's K/V rows
 * of its positions, the drafter's target states). Blocks are evicted least recently used first
 * under a byte budget; a chain is touched from its last block to its first, so a block is never
 * more recent than the one before it and the oldest block is always a leaf: evicting it never
 * strands a descendant. Every block has the same size, so the blocks are carved from one region
 * of budget bytes reserved at creation and committed by the OS as blocks are first used (a free
 * list reuses evicted ones): the cache allocates nothing after its creation.
 */
#include "engine/engine.h"

#include <string.h>

struct st_pfx_block {
    st_pfx_block *parent;        /* the block before it (NULL: the prompt's first) */
    st_pfx_block *hnext;         /* the next block of its hash bucket */
    st_pfx_block *newer, *older; /* the LRU list; older: the free list's next when free */
    uint64_t hash;
    int32_t n_children; /* cached blocks whose parent it is (evictable only at 0) */
    int32_t pinned;     /* part of the chain being inserted: never evicted meanwhile */
    /* followed by int32_t tokens[block], then the payload (ST_PFX_ALIGN-aligned) */
};

enum { ST_PFX_ALIGN = 64 };

struct st_prefix_cache {
    int32_t block;
    size_t payload_bytes, node_bytes, tok_off, pay_off;
    size_t budget, used;
    char *region; /* (cap, node_bytes) the blocks, committed as used */
    size_t region_bytes;
    int64_t cap, n_carved;  /* blocks the region holds, and carved from it so far */
    st_pfx_block *free;     /* evicted blocks, for reuse */
    st_pfx_block **buckets; /* (mask + 1) */
    uint64_t mask;
    st_pfx_block *newest, *oldest;
    st_prefix_stats st;
};

static int32_t *blk_tokens(const st_prefix_cache *c, const st_pfx_block *b) {
    return (int32_t *)((char *)b + c->tok_off);
}

void *st_prefix_payload(const st_prefix_cache *c, const st_pfx_block *b) {
    return (char *)b + c->pay_off;
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

st_status st_prefix_create(int32_t block, size_t payload_bytes, size_t budget,
                           st_prefix_cache **out) {
    *out = NULL;
    if (block < 1 || block > 4096)
        return st_fail(ST_ERR_INVALID, "prefix cache: block of %d tokens outside 1..4096", block);
    if (payload_bytes > ((size_t)1 << 40))
        return st_fail(ST_ERR_INVALID, "prefix cache: %zu bytes per block", payload_bytes);
    st_prefix_cache *c = st_calloc(1, sizeof *c);
    if (!c)
        return st_fail(ST_ERR_NOMEM, "prefix cache: out of memory");
    c->block = block;
    c->payload_bytes = payload_bytes;
    c->tok_off = sizeof(st_pfx_block);
    c->pay_off = round_up(c->tok_off + (size_t)block * sizeof(int32_t), ST_PFX_ALIGN);
    c->node_bytes = round_up(c->pay_off + payload_bytes, ST_PFX_ALIGN);
    c->cap = (int64_t)(budget / c->node_bytes);
    c->budget = (size_t)c->cap * c->node_bytes;
    c->region_bytes = c->budget;
    if (c->cap > 0 && !(c->region = st_lazy_alloc(c->region_bytes, false))) {
        st_free(c);
        return st_fail(ST_ERR_NOMEM, "prefix cache: cannot reserve %zu MB", budget >> 20);
    }
    /* about one bucket per block the budget holds */
    uint64_t nb = 16;
    while (nb < ((uint64_t)1 << 22) && (int64_t)nb < c->cap)
        nb <<= 1;
    c->mask = nb - 1;
    c->buckets = st_calloc((size_t)nb, sizeof *c->buckets);
    if (!c->buckets) {
        st_lazy_free(c->region, c->region_bytes);
        st_free(c);
        return st_fail(ST_ERR_NOMEM, "prefix cache: out of memory for %llu buckets",
                       (unsigned long long)nb);
    }
    c->st.budget_bytes = c->budget;
    *out = c;
    return ST_OK;
}

void st_prefix_free(st_prefix_cache *c) {
    if (!c)
        return;
    if (c->region)
        st_lazy_free(c->region, c->region_bytes);
    st_free(c->buckets);
    st_free(c);
}

int32_t st_prefix_block(const st_prefix_cache *c) { return c->block; }

void st_prefix_get_stats(const st_prefix_cache *c, st_prefix_stats *out) { *out = c->st; }

/* The key of the block after `parent` with tokens t[0..block): FNV-1a over the parent's hash
 * and the tokens. */
static uint64_t block_hash(const st_prefix_cache *c, const st_pfx_block *parent, const int32_t *t) {
    uint64_t h = parent ? parent->hash : 0xcbf29ce484222325ull;
    for (int32_t i = 0; i < c->block; i++) {
        uint32_t v = (uint32_t)t[i];
        for (int k = 0; k < 4; k++, v >>= 8)
            h = (h ^ (v & 0xffu)) * 0x100000001b3ull;
    }
    return h;
}

static st_pfx_block *find(const st_prefix_cache *c, const st_pfx_block *parent, const int32_t *t,
                          uint64_t h) {
    for (st_pfx_block *b = c->buckets[h & c->mask]; b; b = b->hnext)
        if (b->hash == h && b->parent == parent &&
            !memcmp(blk_tokens(c, b), t, (size_t)c->block * sizeof(int32_t)))
            return b;
    return NULL;
}

static void lru_unlink(st_prefix_cache *c, st_pfx_block *b) {
    if (b->newer)
        b->newer->older = b->older;
    else
        c->newest = b->older;
    if (b->older)
        b->older->newer = b->newer;
    else
        c->oldest = b->newer;
    b->newer = b->older = NULL;
}

static void lru_push(st_prefix_cache *c, st_pfx_block *b) {
    b->older = c->newest;
    b->newer = NULL;
    if (c->newest)
        c->newest->newer = b;
    else
        c->oldest = b;
    c->newest = b;
}

/* Marks the chain ending at b most recently used, its first block the most recent of all. */
static void touch_chain(st_prefix_cache *c, st_pfx_block *b) {
    for (; b; b = b->parent) {
        lru_unlink(c, b);
        lru_push(c, b);
    }
}

/* The cached blocks of the longest cached prefix of t[0..n), at most max of them, into chain. */
static int64_t walk(const st_prefix_cache *c, const int32_t *t, int64_t n, st_pfx_block **chain,
                    int64_t max) {
    int64_t k = 0;
    st_pfx_block *parent = NULL;
    while (k < max && (k + 1) * c->block <= n) {
        const int32_t *bt = t + k * c->block;
        st_pfx_block *b = find(c, parent, bt, block_hash(c, parent, bt));
        if (!b)
            break;
        chain[k++] = parent = b;
    }
    return k;
}

int64_t st_prefix_lookup(st_prefix_cache *c, const int32_t *tokens, int64_t n,
                         const st_pfx_block **chain, int64_t max_blocks) {
    const int64_t k = walk(c, tokens, n, (st_pfx_block **)chain, max_blocks);
    if (k > 0) {
        touch_chain(c, (st_pfx_block *)chain[k - 1]);
        c->st.hits++;
        c->st.hit_tokens += k * c->block;
    } else {
        c->st.misses++;
    }
    return k;
}

/* A block for a new entry (the cache has room for one): a freed one, else the next uncarved. */
static st_pfx_block *take_block(st_prefix_cache *c) {
    st_pfx_block *b = c->free;
    if (b)
        c->free = b->older;
    else if (c->n_carved < c->cap)
        b = (st_pfx_block *)(c->region + (size_t)c->n_carved++ * c->node_bytes);
    return b;
}

/* Evicts the least recently used block (a leaf, see the file's head); false when it is pinned
 * or there is none. */
static bool evict_one(st_prefix_cache *c) {
    st_pfx_block *b = c->oldest;
    if (!b || b->pinned || b->n_children > 0)
        return false;
    lru_unlink(c, b);
    st_pfx_block **link = &c->buckets[b->hash & c->mask];
    while (*link != b)
        link = &(*link)->hnext;
    *link = b->hnext;
    if (b->parent)
        b->parent->n_children--;
    c->used -= c->node_bytes;
    c->st.blocks--;
    c->st.evictions++;
    b->older = c->free;
    c->free = b;
    return true;
}

st_status st_prefix_insert(st_prefix_cache *c, const int32_t *tokens, int64_t n,
                           st_prefix_fill_fn fill, void *user, int64_t *n_cached) {
    int64_t k = 0;
    st_pfx_block *parent = NULL;
    /* the blocks already cached, then the new ones, each pinned until the chain is complete */
    for (; (k + 1) * c->block <= n; k++) {
        const int32_t *bt = tokens + k * c->block;
        const uint64_t h = block_hash(c, parent, bt);
        st_pfx_block *b = find(c, parent, bt, h);
        if (!b) {
            if (c->node_bytes > c->budget)
                break;
            while (c->used + c->node_bytes > c->budget && evict_one(c))
                ;
            if (c->used + c->node_bytes > c->budget)
                break;
            if (!(b = take_block(c)))
                break;
            memset(b, 0, sizeof *b);
            memcpy(blk_tokens(c, b), bt, (size_t)c->block * sizeof(int32_t));
            if (fill(user, k, st_prefix_payload(c, b), 1) != ST_OK) {
                b->older = c->free; /* back to the free list, unused */
                c->free = b;
                break;
            }
            b->parent = parent;
            b->hash = h;
            b->hnext = c->buckets[h & c->mask];
            c->buckets[h & c->mask] = b;
            if (parent)
                parent->n_children++;
            lru_push(c, b);
            c->used += c->node_bytes;
            c->st.blocks++;
            c->st.inserted++;
        } else {
            fill(user, k, st_prefix_payload(c, b), 0);
        }
        b->pinned = 1;
        lru_unlink(c, b); /* pinned blocks the newest: the oldest is evictable if any is */
        lru_push(c, b);
        parent = b;
    }
    if (parent)
        touch_chain(c, parent);
    for (st_pfx_block *b = parent; b; b = b->parent)
        b->pinned = 0;
    c->st.bytes = c->used;
    if (n_cached)
        *n_cached = k;
    return ST_OK;
}
