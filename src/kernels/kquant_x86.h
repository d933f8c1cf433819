/*
 * kquant_x86.h: K-quant super-blocks unpacked into AVX2 registers (shared by kquant_avx2.c and
 * kquant_avx512.c, each compiled for its own ISA): the quants as unsigned bytes in element
 * order (eight vectors of 32), the per-16 scales and the per-16 multipliers of the activation
 * sums, the values st_kq_unpack gives. Everything inlines, so a block stays in registers while
 * it meets each token; each file supplies the integer dot product with an activation block.
 */
#ifndef ST_KQUANT_X86_H
#define ST_KQUANT_X86_H

#include "kernels/kernels.h"
#include "kernels/kernels_x86.h"

#include <string.h>

typedef struct kq_regs {
    __m256i q[8];   /* elements 32i .. 32i+31 */
    __m256i sc, bz; /* 16 x int16 */
    float d, dmin;
} kq_regs;

static inline float kq_h2f(const uint16_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

ST_INLINE __m256i kq_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Bytes of v with bit `bit` set -> `val`, else 0. */
ST_INLINE __m256i kq_bit(__m256i v, int bit, int val) {
    const __m256i m = _mm256_set1_epi8((char)(1 << bit));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, m), m),
                            _mm256_set1_epi8((char)val));
}

/* (v >> 2s) & 3 of every byte (16-bit shifts: the mask keeps each byte's own bits). */
ST_INLINE __m256i kq_crumb(__m256i v, int s) {
    return _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), _mm256_set1_epi8(3));
}

ST_INLINE void kq_unpack_q2_k(const st_block_q2_k *b, kq_regs *u) {
    ST_UNROLL
    for (int h = 0; h < 2; h++) {
        const __m256i v = kq_load(b->qs + 32 * h);
        ST_UNROLL
        for (int s = 0; s < 4; s++)
            u->q[4 * h + s] = kq_crumb(v, s);
    }
    const __m256i s = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    u->sc = _mm256_and_si256(s, _mm256_set1_epi16(0xf));
    u->bz = _mm256_srli_epi16(s, 4);
    u->d = kq_h2f(&b->d);
    u->dmin = kq_h2f(&b->dmin);
}

ST_INLINE void kq_unpack_q3_k(const st_block_q3_k *b, kq_regs *u) {
    const __m256i hm = kq_load(b->hmask);
    ST_UNROLL
    for (int h = 0; h < 2; h++) {
        const __m256i v = kq_load(b->qs + 32 * h);
        ST_UNROLL
        for (int s = 0; s < 4; s++)
            u->q[4 * h + s] = _mm256_or_si256(kq_crumb(v, s), kq_bit(hm, 4 * h + s, 4));
    }
    /* scale j: low nibble of byte j (j < 8) or high nibble of byte j - 8, with bits
     * 2(j/4), 2(j/4)+1 of byte 8 + j%4 on top, minus 32 */
    uint32_t w[3], sc[4];
    memcpy(w, b->scales, 12);
    const uint32_t m2 = 0x03030303u, m4 = 0x0f0f0f0fu;
    sc[0] = (w[0] & m4) | (w[2] & m2) << 4;
    sc[1] = (w[1] & m4) | (w[2] >> 2 & m2) << 4;
    sc[2] = (w[0] >> 4 & m4) | (w[2] >> 4 & m2) << 4;
    sc[3] = (w[1] >> 4 & m4) | (w[2] >> 6 & m2) << 4;
    u->sc =
        _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)sc)),
                         _mm256_set1_epi16(32));
    u->bz = _mm256_slli_epi16(u->sc, 2);
    u->d = kq_h2f(&b->d);
    u->dmin = 0.0f;
}

/* Q4_K / Q5_K scales and mins, each repeated for the two halves of its 32 elements: bytes
 * 0..3 hold scales 0..3 and bytes 4..7 mins 0..3 in their low six bits, bytes 8..11 the low
 * four bits of scales and mins 4..7, whose top two bits are those of bytes 0..7. */
ST_INLINE void kq_scales_k4(const uint8_t s[12], kq_regs *u) {
    uint32_t w[3], v[4];
    memcpy(w, s, 12);
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m30 = 0x30303030u;
    v[0] = w[0] & m6;                            /* scales 0..3 */
    v[1] = (w[2] & m4) | (w[0] >> 2 & m30);      /* scales 4..7 */
    v[2] = w[1] & m6;                            /* mins 0..3 */
    v[3] = (w[2] >> 4 & m4) | (w[1] >> 2 & m30); /* mins 4..7 */
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)v);
    const __m128i z = _mm_setzero_si128();
    const __m128i sc = _mm_unpacklo_epi8(b, z), mn = _mm_unpackhi_epi8(b, z); /* 8 x int16 */
    u->sc = _mm256_set_m128i(_mm_unpackhi_epi16(sc, sc), _mm_unpacklo_epi16(sc, sc));
    u->bz = _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn), _mm_unpacklo_epi16(mn, mn));
}

ST_INLINE void kq_nibbles(const uint8_t *qs, kq_regs *u) {
    const __m256i m4 = _mm256_set1_epi8(0xf);
    ST_UNROLL
    for (int c = 0; c < 4; c++) {
        const __m256i v = kq_load(qs + 32 * c);
        u->q[2 * c] = _mm256_and_si256(v, m4);
        u->q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
}

ST_INLINE void kq_unpack_q4_k(const st_block_q4_k *b, kq_regs *u) {
    kq_nibbles(b->qs, u);
    kq_scales_k4(b->scales, u);
    u->d = kq_h2f(&b->d);
    u->dmin = kq_h2f(&b->dmin);
}

ST_INLINE void kq_unpack_q5_k(const st_block_q5_k *b, kq_regs *u) {
    kq_nibbles(b->qs, u);
    const __m256i qh = kq_load(b->qh);
    ST_UNROLL
    for (int i = 0; i < 8; i++)
        u->q[i] = _mm256_or_si256(u->q[i], kq_bit(qh, i, 16));
    kq_scales_k4(b->scales, u);
    u->d = kq_h2f(&b->d);
    u->dmin = kq_h2f(&b->dmin);
}

ST_INLINE void kq_unpack_q6_k(const st_block_q6_k *b, kq_regs *u) {
    const __m256i m4 = _mm256_set1_epi8(0xf), m30 = _mm256_set1_epi8(0x30);
    ST_UNROLL
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = kq_load(b->ql + 64 * h), l1 = kq_load(b->ql + 64 * h + 32);
        const __m256i qh = kq_load(b->qh + 32 * h);
        /* bits 2s, 2s+1 of qh moved to 4, 5 */
        const __m256i h0 = _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30);
        const __m256i h1 = _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30);
        const __m256i h2 = _mm256_and_si256(qh, m30);
        const __m256i h3 = _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30);
        u->q[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m4), h0);
        u->q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), h1);
        u->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), h2);
        u->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), h3);
    }
    u->sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    u->bz = _mm256_slli_epi16(u->sc, 5);
    u->d = kq_h2f(&b->d);
    u->dmin = 0.0f;
}

ST_INLINE size_t kq_block_bytes(uint32_t type) {
    return type == ST_DTYPE_Q2_K   ? sizeof(st_block_q2_k)
           : type == ST_DTYPE_Q3_K ? sizeof(st_block_q3_k)
           : type == ST_DTYPE_Q4_K ? sizeof(st_block_q4_k)
           : type == ST_DTYPE_Q5_K ? sizeof(st_block_q5_k)
                                   : sizeof(st_block_q6_k);
}

ST_INLINE void kq_unpack(uint32_t type, const uint8_t *blk, kq_regs *u) {
    switch (type) {
    case ST_DTYPE_Q2_K:
        kq_unpack_q2_k((const st_block_q2_k *)(const void *)blk, u);
        break;
    case ST_DTYPE_Q3_K:
        kq_unpack_q3_k((const st_block_q3_k *)(const void *)blk, u);
        break;
    case ST_DTYPE_Q4_K:
        kq_unpack_q4_k((const st_block_q4_k *)(const void *)blk, u);
        break;
    case ST_DTYPE_Q5_K:
        kq_unpack_q5_k((const st_block_q5_k *)(const void *)blk, u);
        break;
    default:
        kq_unpack_q6_k((const st_block_q6_k *)(const void *)blk, u);
        break;
    }
}

/* The sc_j-weighted integer dot products of a block with an activation block in eight int32
 * lanes (their sum is idot), 256-bit: the AVX2 kernels, and the AVX-512 ones for one token
 * (measured faster there than widening to 512 bits). */
ST_INLINE __m256i kq_idot(uint32_t type, const kq_regs *u, const st_block_q8k *xb) {
    /* low lane: scale 2i in every word, high lane: scale 2i + 1; Q4_K and Q5_K have one scale
     * per 32 elements (sc[2i] = sc[2i+1]), so the broadcast pair is that already */
    const int per32 = type == ST_DTYPE_Q4_K || type == ST_DTYPE_Q5_K;
    const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2,
                                          3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    __m256i acc = _mm256_setzero_si256();
    ST_UNROLL
    for (int i = 0; i < 8; i++) {
        __m256i sc = _mm256_permutevar8x32_epi32(u->sc, _mm256_set1_epi32(i));
        if (!per32)
            sc = _mm256_shuffle_epi8(sc, pick);
        const __m256i p = _mm256_maddubs_epi16(u->q[i], kq_load((const uint8_t *)xb->q + 32 * i));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
    }
    return acc;
}

/* idot and t (kquant.h) in one reduction: idot is the sum of the eight int32 lanes of acc,
 * t = sum_j bz_j bsum_j (exact: |bz| <= 4096, |bsum| <= 2032). */
ST_INLINE void kq_sums(__m256i acc, const kq_regs *u, const st_block_q8k *xb, int32_t *idot,
                       int32_t *t) {
    const __m256i tv = _mm256_madd_epi16(u->bz, _mm256_loadu_si256((const __m256i *)xb->bsums));
    const __m256i h = _mm256_hadd_epi32(acc, tv); /* per lane: a01 a23 t01 t23 */
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_hadd_epi32(s, s); /* idot, t, idot, t */
    *idot = _mm_cvtsi128_si32(s);
    *t = _mm_extract_epi32(s, 1);
}

#endif /* ST_KQUANT_X86_H */
