/*
 * kqp.c: K-quant weights packed for batched matmuls (st_pack_kq, kquant.h): groups of eight
 * rows whose super-blocks are interleaved so that one 32-byte load holds four bytes of quants
 * of each row, and the scalar matmuls on the packed form (the reference table's, and the rows
 * of sessions that follow ggml's float order), which read each row back into row-major blocks
 * and run the row-major kernel: bitwise the same results.
 */
#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

int st_kq_packable(uint32_t type) {
    return type == ST_DTYPE_Q4_K || type == ST_DTYPE_Q5_K || type == ST_DTYPE_Q6_K;
}

/* Where byte `i` of row r's block lands in its group-block (Q4_K: 144 bytes, Q6_K: 210). */
static size_t q4k_at(int r, size_t i) {
    if (i < 4) /* d, dmin */
        return (i / 2) * 16 + 2 * (size_t)r + i % 2;
    if (i < 16) /* scale byte i - 4: plane i - 4 */
        return 32 + 8 * (i - 4) + (size_t)r;
    const size_t q = i - 16, c = q / 32, k = q % 32 / 4; /* qs[32c + 4k + e] */
    return 128 + 32 * (8 * c + k) + 4 * (size_t)r + q % 4;
}

/* Q5_K (176 bytes): d, dmin, scales as Q4_K; qh[32] then qs[128]. */
static size_t q5k_at(int r, size_t i) {
    if (i < 16)
        return q4k_at(r, i);
    if (i < 48) { /* qh[4k + e] */
        const size_t q = i - 16;
        return 128 + 32 * (q / 4) + 4 * (size_t)r + q % 4;
    }
    const size_t q = i - 48, c = q / 32, k = q % 32 / 4; /* qs[32c + 4k + e] */
    return 384 + 32 * (8 * c + k) + 4 * (size_t)r + q % 4;
}

static size_t q6k_at(int r, size_t i) {
    if (i < 128) { /* ql[64h + 32s + 4k + e] */
        const size_t h = i / 64, s = i % 64 / 32, k = i % 32 / 4;
        return 144 + 32 * (16 * h + 8 * s + k) + 4 * (size_t)r + i % 4;
    }
    if (i < 192) { /* qh[32h + 4k + e] */
        const size_t q = i - 128, h = q / 32, k = q % 32 / 4;
        return 1168 + 32 * (8 * h + k) + 4 * (size_t)r + q % 4;
    }
    if (i < 208) /* scales[j] */
        return 16 + 8 * (i - 192) + (size_t)r;
    return 2 * (size_t)r + (i - 208); /* d */
}

static size_t kq_at(uint32_t type, int r, size_t i) {
    return type == ST_DTYPE_Q4_K   ? q4k_at(r, i)
           : type == ST_DTYPE_Q5_K ? q5k_at(r, i)
                                   : q6k_at(r, i);
}

int st_pack_kq(uint32_t type, void *dst, const void *src, size_t row_bytes, int64_t rows,
               int64_t K) {
    if (!st_kq_packable(type))
        return -1;
    const size_t bb = st_kquant_block_bytes(type), G = ST_KQP_ROWS;
    const int64_t nb = K / ST_QK_K, ng = rows / (int64_t)G;
    uint8_t *tmp = malloc(G * row_bytes);
    if (!tmp)
        return -1;
    uint8_t *d = dst;
    const uint8_t *s = src;
    for (int64_t g = 0; g < ng; g++) {
        memcpy(tmp, s + (size_t)g * G * row_bytes, G * row_bytes);
        uint8_t *out = d + (size_t)g * G * row_bytes;
        for (int64_t b = 0; b < nb; b++)
            for (int r = 0; r < (int)G; r++) {
                const uint8_t *in = tmp + (size_t)r * row_bytes + (size_t)b * bb;
                uint8_t *o = out + (size_t)b * G * bb;
                /* the quants move in runs of four bytes, the scales byte by byte */
                for (size_t i = 0; i < bb;)
                    if (type == ST_DTYPE_Q6_K ? i < 192 : i >= 16) {
                        memcpy(o + kq_at(type, r, i), in + i, 4);
                        i += 4;
                    } else {
                        o[kq_at(type, r, i)] = in[i];
                        i++;
                    }
            }
    }
    if (d != s && rows > ng * (int64_t)G) /* rows past the last group: row-major */
        memcpy(d + (size_t)ng * G * row_bytes, s + (size_t)ng * G * row_bytes,
               (size_t)(rows - ng * (int64_t)G) * row_bytes);
    free(tmp);
    return 0;
}

void st_kq_packed_row(uint32_t type, const void *wp, size_t row_bytes, int64_t rows, int64_t K,
                      int64_t r, void *out) {
    const uint8_t *w = wp;
    const size_t bb = st_kquant_block_bytes(type), G = ST_KQP_ROWS;
    if (r >= rows / (int64_t)G * (int64_t)G) {
        memcpy(out, w + (size_t)r * row_bytes, row_bytes);
        return;
    }
    const uint8_t *gp = w + (size_t)(r / (int64_t)G) * G * row_bytes;
    uint8_t *o = out;
    for (int64_t b = 0; b < K / ST_QK_K; b++)
        for (size_t i = 0; i < bb; i++)
            o[(size_t)b * bb + i] = gp[(size_t)b * G * bb + kq_at(type, (int)(r % (int64_t)G), i)];
}

void st_matmul_kq_packed_rows(uint32_t type, int ggml, float *y, int64_t ldy, const void *wp,
                              size_t row_bytes, int64_t rows, const void *x, int64_t ldx, int64_t K,
                              int64_t M, int64_t r0, int64_t r1) {
    _Alignas(64) uint8_t buf[16384];
    uint8_t *row = row_bytes <= sizeof buf ? buf : malloc(row_bytes);
    if (!row) { /* no memory for a row: nothing to compute with; make it visible */
        for (int64_t m = 0; m < M; m++)
            for (int64_t r = r0; r < r1; r++)
                y[m * ldy + r] = __builtin_nanf("");
        return;
    }
    const st_matmul_fn f = type == ST_DTYPE_Q4_K   ? st_matmul_q4_k_ref
                           : type == ST_DTYPE_Q5_K ? st_matmul_q5_k_ref
                                                   : st_matmul_q6_k_ref;
    for (int64_t r = r0; r < r1; r++) {
        st_kq_packed_row(type, wp, row_bytes, rows, K, r, row);
        if (ggml)
            st_matmul_kq_ggml(type, y + r, ldy, row, row_bytes, x, ldx, K, M, 0, 1);
        else
            f(y + r, ldy, row, row_bytes, x, ldx, K, M, 0, 1);
    }
    if (row != buf)
        free(row);
}

void st_matmul_q4_k_packed_ref(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                               const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                               int64_t r1) {
    st_matmul_kq_packed_rows(ST_DTYPE_Q4_K, 0, y, ldy, wp, rb, rows, x, ldx, K, M, r0, r1);
}

void st_matmul_q6_k_packed_ref(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                               const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                               int64_t r1) {
    st_matmul_kq_packed_rows(ST_DTYPE_Q6_K, 0, y, ldy, wp, rb, rows, x, ldx, K, M, r0, r1);
}

void st_matmul_q5_k_packed_ref(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                               const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                               int64_t r1) {
    st_matmul_kq_packed_rows(ST_DTYPE_Q5_K, 0, y, ldy, wp, rb, rows, x, ldx, K, M, r0, r1);
}
