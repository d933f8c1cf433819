/*
 * kquant_x86.h: K-quant super-blocks unpacked with AVX2 (shared by kquant_avx2.c and
 * kquant_avx512.c, each compiled for its own ISA): the quants as unsigned bytes in element
 * order, the per-16 scales and the per-16 multipliers of the activation sums, exactly what
 * st_kq_unpack gives. Each file supplies the integer dot product of an unpacked block with an
 * activation block.
 */
#ifndef ST_KQUANT_X86_H
#define ST_KQUANT_X86_H

#include "kernels/kernels.h"
#include "kernels/kernels_x86.h"

#include <string.h>

static inline float kq_h2f(const uint16_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Bytes of v with bit `bit` set -> `val`, else 0. */
ST_INLINE __m256i kq_bit(__m256i v, int bit, int val) {
    const __m256i m = _mm256_set1_epi8((char)(1 << bit));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, m), m),
                            _mm256_set1_epi8((char)val));
}

/* Two-bit fields of 32 bytes: (v >> 2s) & 3 for s = 0..3, stored 32 bytes apart. */
ST_INLINE void kq_crumbs(uint8_t *q, __m256i v) {
    const __m256i m3 = _mm256_set1_epi8(3);
    ST_UNROLL
    for (int s = 0; s < 4; s++)
        _mm256_store_si256((__m256i *)(q + 32 * s),
                           _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), m3));
}

ST_INLINE void kq_unpack_q2_k(const st_block_q2_k *b, st_kq_unpacked *u) {
    for (int h = 0; h < 2; h++)
        kq_crumbs(u->q + 128 * h, _mm256_loadu_si256((const __m256i *)(b->qs + 32 * h)));
    const __m256i s = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    _mm256_store_si256((__m256i *)u->sc, _mm256_and_si256(s, _mm256_set1_epi16(0xf)));
    _mm256_store_si256((__m256i *)u->bz, _mm256_srli_epi16(s, 4));
    u->d = kq_h2f(&b->d);
    u->dmin = kq_h2f(&b->dmin);
}

ST_INLINE void kq_unpack_q3_k(const st_block_q3_k *b, st_kq_unpacked *u) {
    const __m256i hm = _mm256_loadu_si256((const __m256i *)b->hmask);
    for (int h = 0; h < 2; h++) {
        kq_crumbs(u->q + 128 * h, _mm256_loadu_si256((const __m256i *)(b->qs + 32 * h)));
        ST_UNROLL
        for (int s = 0; s < 4; s++) {
            __m256i *p = (__m256i *)(u->q + 128 * h + 32 * s);
            _mm256_store_si256(p, _mm256_or_si256(_mm256_load_si256(p), kq_bit(hm, 4 * h + s, 4)));
        }
    }
    const uint8_t *s = b->scales;
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? s[j] & 0xf : s[j - 8] >> 4;
        const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        u->sc[j] = (int16_t)((lo | hi << 4) - 32);
        u->bz[j] = (int16_t)(4 * u->sc[j]);
    }
    u->d = kq_h2f(&b->d);
    u->dmin = 0.0f;
}

/* Q4_K / Q5_K scales and mins, each repeated for the two halves of its 32 elements. */
ST_INLINE void kq_scales_k4(const uint8_t s[12], st_kq_unpacked *u) {
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        if (j < 4) {
            sc = s[j] & 63;
            mn = s[j + 4] & 63;
        } else {
            sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
            mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
        u->sc[2 * j] = u->sc[2 * j + 1] = (int16_t)sc;
        u->bz[2 * j] = u->bz[2 * j + 1] = (int16_t)mn;
    }
}

ST_INLINE void kq_nibbles(const uint8_t *qs, st_kq_unpacked *u) {
    const __m256i m4 = _mm256_set1_epi8(0xf);
    ST_UNROLL
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        _mm256_store_si256((__m256i *)(u->q + 64 * c), _mm256_and_si256(v, m4));
        _mm256_store_si256((__m256i *)(u->q + 64 * c + 32),
                           _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    }
}

ST_INLINE void kq_unpack_q4_k(const st_block_q4_k *b, st_kq_unpacked *u) {
    kq_nibbles(b->qs, u);
    kq_scales_k4(b->scales, u);
    u->d = kq_h2f(&b->d);
    u->dmin = kq_h2f(&b->dmin);
}

ST_INLINE void kq_unpack_q5_k(const st_block_q5_k *b, st_kq_unpacked *u) {
    kq_nibbles(b->qs, u);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
    ST_UNROLL
    for (int i = 0; i < 8; i++) {
        __m256i *p = (__m256i *)(u->q + 32 * i);
        _mm256_store_si256(p, _mm256_or_si256(_mm256_load_si256(p), kq_bit(qh, i, 16)));
    }
    kq_scales_k4(b->scales, u);
    u->d = kq_h2f(&b->d);
    u->dmin = kq_h2f(&b->dmin);
}

ST_INLINE void kq_unpack_q6_k(const st_block_q6_k *b, st_kq_unpacked *u) {
    const __m256i m4 = _mm256_set1_epi8(0xf), m30 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
        /* bits 2s, 2s+1 of qh moved to 4, 5 (16-bit shifts: the mask keeps each byte's own) */
        const __m256i h0 = _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30);
        const __m256i h1 = _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30);
        const __m256i h2 = _mm256_and_si256(qh, m30);
        const __m256i h3 = _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30);
        uint8_t *q = u->q + 128 * h;
        _mm256_store_si256((__m256i *)q, _mm256_or_si256(_mm256_and_si256(l0, m4), h0));
        _mm256_store_si256((__m256i *)(q + 32), _mm256_or_si256(_mm256_and_si256(l1, m4), h1));
        _mm256_store_si256((__m256i *)(q + 64),
                           _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), h2));
        _mm256_store_si256((__m256i *)(q + 96),
                           _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), h3));
    }
    const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    _mm256_store_si256((__m256i *)u->sc, s);
    _mm256_store_si256((__m256i *)u->bz, _mm256_slli_epi16(s, 5));
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

ST_INLINE void kq_unpack(uint32_t type, const uint8_t *blk, st_kq_unpacked *u) {
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

/* t = sum_j bz_j bsum_j (exact: |bz| <= 4096, |bsum| <= 2032). */
ST_INLINE int32_t kq_tsum(const st_kq_unpacked *u, const st_block_q8k *xb) {
    const __m256i p = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)u->bz),
                                        _mm256_loadu_si256((const __m256i *)xb->bsums));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

#endif /* ST_KQUANT_X86_H */
