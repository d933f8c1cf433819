/*
 * name_index.c: a hash index over strings the caller owns (GGUF keys and tensor names), so that
 * duplicate checks and lookups take constant time per name instead of a scan. Open addressing
 * with linear probing, at most 3/4 full. The hash is SipHash-1-3 (Aumasson and Bernstein,
 * "SipHash: a fast short-input PRF", 2012) under a random key drawn per table: a file cannot be
 * crafted so that its names collide, which would make the table quadratic again.
 */
#define _GNU_SOURCE
#include "core.h"

#include <inttypes.h>
#include <string.h>
#include <sys/random.h>

static inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

static inline void sip_round(uint64_t v[4]) {
    v[0] += v[1];
    v[1] = rotl(v[1], 13);
    v[1] ^= v[0];
    v[0] = rotl(v[0], 32);
    v[2] += v[3];
    v[3] = rotl(v[3], 16);
    v[3] ^= v[2];
    v[0] += v[3];
    v[3] = rotl(v[3], 21);
    v[3] ^= v[0];
    v[2] += v[1];
    v[1] = rotl(v[1], 17);
    v[1] ^= v[2];
    v[2] = rotl(v[2], 32);
}

uint64_t st_siphash(uint64_t k0, uint64_t k1, const void *data, size_t len, int c_rounds,
                    int d_rounds) {
    const uint8_t *p = data;
    uint64_t v[4] = {k0 ^ 0x736f6d6570736575ULL, k1 ^ 0x646f72616e646f6dULL,
                     k0 ^ 0x6c7967656e657261ULL, k1 ^ 0x7465646279746573ULL};
    size_t n8 = len / 8;
    for (size_t i = 0; i < n8; i++, p += 8) {
        uint64_t m = 0;
        for (int b = 0; b < 8; b++) /* little-endian words whatever the host */
            m |= (uint64_t)p[b] << (8 * b);
        v[3] ^= m;
        for (int r = 0; r < c_rounds; r++)
            sip_round(v);
        v[0] ^= m;
    }
    uint64_t last = (uint64_t)(len & 0xff) << 56;
    for (size_t b = 0; b < len % 8; b++)
        last |= (uint64_t)p[b] << (8 * b);
    v[3] ^= last;
    for (int r = 0; r < c_rounds; r++)
        sip_round(v);
    v[0] ^= last;
    v[2] ^= 0xff;
    for (int r = 0; r < d_rounds; r++)
        sip_round(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

static void random_key(uint64_t k[2]) {
    if (getrandom(k, 2 * sizeof *k, GRND_NONBLOCK) == (ssize_t)(2 * sizeof *k))
        return;
    /* No entropy yet (early boot): the clock and an address still differ from run to run. */
    double t = st_time_now();
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);
    k[0] = st_rng_u64(bits, (uint64_t)(uintptr_t)k);
    k[1] = st_rng_u64(k[0], bits);
}

static uint64_t name_hash(const st_name_index *t, const char *name) {
    return st_siphash(t->key[0], t->key[1], name, strlen(name), 1, 3);
}

/* The slot holding `name` (hash h), or the empty slot where it would go. */
static st_name_slot *probe(const st_name_index *t, const char *name, uint64_t h) {
    for (size_t i = (size_t)h & t->mask;; i = (i + 1) & t->mask) {
        st_name_slot *s = &t->slots[i];
        if (s->idx1 == 0 ||
            (s->tag == (uint32_t)(h >> 32) && strcmp(t->name(t->ctx, s->idx1 - 1), name) == 0))
            return s;
    }
}

st_status st_name_index_build(st_name_index *t, int64_t n, st_name_fn name, const void *ctx,
                              int64_t *dup) {
    memset(t, 0, sizeof *t);
    *dup = -1;
    if (n >= UINT32_MAX)
        return st_fail(ST_ERR_NOMEM, "name index: %" PRId64 " names is too many", n);
    size_t cap = 16;
    while ((int64_t)(cap / 4 * 3) < n) {
        if (cap > SIZE_MAX / 2 / sizeof *t->slots)
            return st_fail(ST_ERR_NOMEM, "name index: %" PRId64 " names is too many", n);
        cap *= 2;
    }
    t->slots = st_calloc(cap, sizeof *t->slots);
    if (!t->slots)
        return st_fail(ST_ERR_NOMEM, "name index: out of memory for %zu slots", cap);
    t->mask = cap - 1;
    t->name = name;
    t->ctx = ctx;
    random_key(t->key);
    /* Millions of names make a table far larger than the caches: hash AHEAD names in front of
     * the one inserted and prefetch their home slots, so the misses overlap. */
    enum { AHEAD = 16 };
    uint64_t ring[AHEAD];
    for (int64_t i = 0; i < n + AHEAD; i++) {
        int64_t j = i - AHEAD; /* inserted now; its hash sits where name i's goes */
        if (j >= 0) {
            uint64_t h = ring[j % AHEAD];
            st_name_slot *s = probe(t, name(ctx, j), h);
            if (s->idx1 != 0) {
                *dup = j;
                return ST_OK;
            }
            s->tag = (uint32_t)(h >> 32);
            s->idx1 = (uint32_t)(j + 1);
        }
        if (i < n) {
            uint64_t h = name_hash(t, name(ctx, i));
            ring[i % AHEAD] = h;
            __builtin_prefetch(&t->slots[(size_t)h & t->mask], 1);
        }
    }
    return ST_OK;
}

void st_name_index_free(st_name_index *t) {
    if (!t)
        return;
    st_free(t->slots);
    memset(t, 0, sizeof *t);
}

int64_t st_name_index_find(const st_name_index *t, const char *name) {
    if (!t->slots)
        return -1;
    return (int64_t)probe(t, name, name_hash(t, name))->idx1 - 1;
}
