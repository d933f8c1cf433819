/*
 * convert.c: row sizes and row dequantization for every supported weight type (embedding
 * lookups, tools and tests; the 16-bit conversions are half.c's), and the packing of float and
 * Q8_0 matrices for the kernels that read them packed (kernels.h).
 */
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t st_row_bytes(uint32_t type, int64_t n) {
    switch (type) {
    case ST_DTYPE_F32:
        return (size_t)n * 4;
    case ST_DTYPE_F16:
    case ST_DTYPE_BF16:
        return (size_t)n * 2;
    case ST_DTYPE_Q8_0:
        return n % ST_QK ? 0 : (size_t)(n / ST_QK) * sizeof(st_block_q8_0);
    case ST_DTYPE_Q4_0:
        return n % ST_QK ? 0 : (size_t)(n / ST_QK) * sizeof(st_block_q4_0);
    default:
        return n % ST_QK_K ? 0 : (size_t)(n / ST_QK_K) * st_kquant_block_bytes(type);
    }
}

void st_q4_0_unpack(const st_block_q4_0 *b, int8_t q[ST_QK]) {
    for (int j = 0; j < ST_QK / 2; j++) {
        q[j] = (int8_t)((b->qs[j] & 0xf) - 8);
        q[j + ST_QK / 2] = (int8_t)((b->qs[j] >> 4) - 8);
    }
}

void st_dequant_row(uint32_t type, const void *row, float *out, int64_t n) {
    switch (type) {
    case ST_DTYPE_F32:
        memcpy(out, row, (size_t)n * 4);
        break;
    case ST_DTYPE_F16:
    case ST_DTYPE_BF16: {
        const uint8_t *p = row;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = type == ST_DTYPE_BF16 ? st_bf16_to_f32(h) : st_fp16_to_f32(h);
        }
        break;
    }
    case ST_DTYPE_Q8_0:
    case ST_DTYPE_Q4_0:
        for (int64_t i = 0; i < n / ST_QK; i++) {
            int8_t q4[ST_QK];
            const int8_t *q;
            uint16_t d16;
            if (type == ST_DTYPE_Q8_0) {
                const st_block_q8_0 *b = (const st_block_q8_0 *)row + i;
                q = b->q;
                d16 = b->d;
            } else {
                const st_block_q4_0 *b = (const st_block_q4_0 *)row + i;
                st_q4_0_unpack(b, q4);
                q = q4;
                d16 = b->d;
            }
            float d = st_fp16_to_f32(d16);
            for (int j = 0; j < ST_QK; j++)
                out[i * ST_QK + j] = (float)q[j] * d;
        }
        break;
    default:
        if (!st_dequant_row_kquant(type, row, out, n))
            memset(out, 0, (size_t)n * 4);
        break;
    }
}

size_t st_pack_f32_floats(int64_t rows, int64_t K) {
    return (size_t)((rows + ST_PACK_ROWS - 1) / ST_PACK_ROWS) * ST_PACK_ROWS *
           (size_t)((K + 7) & ~7);
}

void st_pack_f32(float *wp, const float *w, size_t row_bytes, int64_t rows, int64_t K) {
    const int64_t K8 = (K + 7) & ~7;
    for (int64_t b = 0; b * ST_PACK_ROWS < rows; b++)
        for (int j = 0; j < ST_PACK_ROWS; j++) {
            const int64_t r = b * ST_PACK_ROWS + j;
            const float *wr =
                r < rows ? (const float *)((const char *)w + (size_t)r * row_bytes) : NULL;
            /* row 4c + g: vector g, chunk c of every step */
            float *dst = wp + (size_t)(b * K8) * ST_PACK_ROWS + (j % 4) * 16 + (j / 4) * 4;
            for (int64_t i = 0; i < K8; i++)
                dst[(size_t)(i / 4) * 64 + i % 4] = wr && i < K ? wr[i] : 0.0f;
        }
}

/* Block b of a row as its group-block: the scale at 2n, then 4-byte pieces of the quants (Q8_0:
 * eight, q[4k ..], Q4_0: four, qs[4k ..]) at 32 + 64k + 4n. */
static void pack_block(uint8_t *o, const uint8_t *row, int64_t b, int n, int q4) {
    const size_t bb = q4 ? sizeof(st_block_q4_0) : sizeof(st_block_q8_0);
    const uint8_t *blk = row + (size_t)b * bb;
    memcpy(o + 2 * n, blk, 2); /* d comes first in both blocks */
    for (int k = 0; k < (q4 ? ST_QK / 8 : ST_QK / 4); k++)
        memcpy(o + 2 * ST_PACK_ROWS + 64 * k + 4 * n, blk + 2 + 4 * k, 4);
}

static int pack_groups(void *dst, const void *src, size_t row_bytes, int64_t rows, int64_t K,
                       int q4) {
    const int64_t nb = K / ST_QK, groups = rows / ST_PACK_ROWS;
    const size_t gbytes = (size_t)ST_PACK_ROWS * row_bytes;
    const size_t gb = q4 ? ST_Q4P_GROUP_BYTES : ST_Q8P_GROUP_BYTES;
    uint8_t *tmp = NULL;
    if (dst == src && groups > 0 && !(tmp = malloc(gbytes)))
        return -1;
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *in = (const uint8_t *)src + (size_t)g * gbytes;
        uint8_t *out = (uint8_t *)dst + (size_t)g * gbytes;
        if (tmp) {
            memcpy(tmp, in, gbytes);
            in = tmp;
        }
        for (int64_t b = 0; b < nb; b++)
            for (int n = 0; n < ST_PACK_ROWS; n++)
                pack_block(out + (size_t)b * gb, in + (size_t)n * row_bytes, b, n, q4);
    }
    free(tmp);
    if (dst != src && rows > groups * ST_PACK_ROWS)
        memcpy((uint8_t *)dst + (size_t)groups * gbytes,
               (const uint8_t *)src + (size_t)groups * gbytes,
               (size_t)(rows - groups * ST_PACK_ROWS) * row_bytes);
    return 0;
}

int st_pack_q8_0(void *dst, const void *src, size_t row_bytes, int64_t rows, int64_t K) {
    return pack_groups(dst, src, row_bytes, rows, K, 0);
}

int st_pack_q4_0(void *dst, const void *src, size_t row_bytes, int64_t rows, int64_t K) {
    return pack_groups(dst, src, row_bytes, rows, K, 1);
}
