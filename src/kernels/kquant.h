/*
 * kquant.h: the K-quant weight formats of GGUF (Q2_K .. Q6_K: super-blocks of 256 elements with
 * per-sub-block scales, as llama.cpp's ggml-quants lays them out) and the 8-bit activation
 * blocks they multiply. Included by kernels.h.
 *
 * Canonical K-quant dot product of a weight row and an activation row quantized to
 * st_block_q8k: per super-block b (in increasing b), two exact integers
 *   S_b = sum_e s_e * q_e * x_e   (q_e the element's quant, s_e its sub-block scale; Q3_K and
 *                                  Q6_K quants signed (q - 4, q - 32), Q3_K scales minus 32)
 *   M_b = sum_e m_e * x_e         (m_e the sub-block min, Q2_K / Q4_K / Q5_K only; else 0)
 * then acc = fma(d * xd, (float)S_b, acc) and, for the types with mins,
 * acc = fma(-(dmin * xd), (float)M_b, acc), where d and dmin are the block's fp16 scales as
 * float and xd the activation block's scale (each product rounded to float). acc starts at 0
 * and is the result. The integers are exact, so any ISA may compute them in any order; only
 * the float chain is fixed, and it is per output, so batch size and threads cannot change it.
 */
#ifndef ST_KQUANT_H
#define ST_KQUANT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

enum { ST_QK_K = 256 };

typedef struct st_block_q2_k {
    uint8_t scales[16]; /* sub-block j of 16: scale low nibble, min high nibble */
    uint8_t qs[64];     /* element 128h + 32s + l: bits 2s..2s+1 of qs[32h + l] */
    uint16_t d, dmin;   /* fp16 */
} st_block_q2_k;
_Static_assert(sizeof(st_block_q2_k) == 84, "q2_k block is 84 bytes");

typedef struct st_block_q3_k {
    uint8_t hmask[32];  /* element 32i + l: bit i of hmask[l]; quant - 4 when the bit is 0 */
    uint8_t qs[64];     /* low two bits, as Q2_K */
    uint8_t scales[12]; /* 16 six-bit scales (minus 32): low nibbles in 0..7, high pairs 8..11 */
    uint16_t d;
} st_block_q3_k;
_Static_assert(sizeof(st_block_q3_k) == 110, "q3_k block is 110 bytes");

typedef struct st_block_q4_k {
    uint16_t d, dmin;
    uint8_t scales[12]; /* 8 six-bit scales and 8 six-bit mins, one pair per 32 elements */
    uint8_t qs[128];    /* element 64c + l: low nibble of qs[32c + l], 64c + 32 + l: high */
} st_block_q4_k;
_Static_assert(sizeof(st_block_q4_k) == 144, "q4_k block is 144 bytes");

typedef struct st_block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[12]; /* as Q4_K */
    uint8_t qh[32];     /* element 32i + l: bit i of qh[l] is the quant's bit 4 */
    uint8_t qs[128];    /* low four bits, as Q4_K */
} st_block_q5_k;
_Static_assert(sizeof(st_block_q5_k) == 176, "q5_k block is 176 bytes");

typedef struct st_block_q6_k {
    uint8_t ql[128]; /* element 128h + 32s + l: nibble s/2 of ql[64h + 32(s%2) + l] */
    uint8_t qh[64];  /* bits 2s..2s+1 of qh[32h + l] are the quant's bits 4..5 */
    int8_t scales[16];
    uint16_t d;
} st_block_q6_k;
_Static_assert(sizeof(st_block_q6_k) == 210, "q6_k block is 210 bytes");

/* Activation-side super-block: float scale, 256 int8 values in [-127, 127], and the sums of
 * each 16 of them. */
typedef struct st_block_q8k {
    float d;
    int8_t q[ST_QK_K];
    int16_t bsums[ST_QK_K / 16];
} st_block_q8k;
_Static_assert(sizeof(st_block_q8k) == 292, "q8k block is 292 bytes");

/* One super-block unpacked for the integer dot products: unsigned quants in element order
 * (Q3_K as q + 4, Q6_K as q + 32), a scale per 16 elements, and the integer per 16 elements
 * that multiplies the sums of x: the min (Q2_K, Q4_K, Q5_K, giving M_b) or the offset times
 * the scale (Q3_K 4 s, Q6_K 32 s, subtracted from the scaled sum to give S_b). */
typedef struct st_kq_unpacked {
    uint8_t q[ST_QK_K];
    int16_t sc[16];
    int16_t bz[16];
    float d, dmin; /* dmin is 0 for the types without mins */
} st_kq_unpacked;

/* The canonical float step of one super-block (above), shared by every table so that all of them
 * round alike; d, dmin: the block's scales, xd the activation's; idot = sum_j sc_j sum_e q_e x_e
 * and t = sum_j bz_j bsum_j over the unpacked block; S_b = idot - t for the types without mins,
 * else S_b = idot and M_b = t. */
static inline float st_kq_step(float acc, float d, float dmin, float xd, int32_t idot, int32_t t,
                               int has_min) {
    if (!has_min)
        return fmaf(d * xd, (float)(idot - t), acc);
    acc = fmaf(d * xd, (float)idot, acc);
    return fmaf(-(dmin * xd), (float)t, acc);
}

/* The K-quant dot products in the float order of ggml's AVX2 kernels (ggml_vec_dot_q*_K_q8_K at
 * llama.cpp c392e509, which its AVX-512 builds use too), for the sessions that match ggml's
 * arithmetic (st_session_params.match_ggml): per super-block, eight integer lanes, lane k the
 * scaled products of the elements e with e mod 32 in [4k, 4k + 4), each accumulated with
 * acc_k = fma(d * xd, lane_k, acc_k); the mins (Q2_K: eight lanes of 32 elements, added to the
 * same accumulators before the scales; Q4_K: four lanes of 64 elements in accumulators of their
 * own; Q5_K: one scalar sum) with fma(-xd * dmin, ., .); the result
 * ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) plus the Q4_K mins
 * (m0 + m2) + (m1 + m3) or the Q5_K sum. Scalar; the same st_matmul_fn contract. */
void st_matmul_kq_ggml(uint32_t type, float *y, int64_t ldy, const void *w, size_t row_bytes,
                       const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1);

/* Quantizes K floats (K a multiple of 256) into K/256 blocks: the element of largest magnitude
 * maps to -127 (llama.cpp's Q8_K rule: iscale = -127 / max, q = round(x * iscale) capped at
 * 127, d = 1 / iscale). Every kernel table uses this one function. */
void st_quantize_q8k(st_block_q8k *y, const float *x, int64_t K);
/* The same, eight elements per step (the AVX2 and AVX-512 tables' quantize_q8k). */
void st_quantize_q8k_avx2(st_block_q8k *y, const float *x, int64_t K);

/* Dequantizes n elements (a multiple of 256) of a K-quant row (gguf-py's arithmetic, so the
 * values match its float32 results bit for bit). Returns 0 if type is not a K-quant. */
int st_dequant_row_kquant(uint32_t type, const void *row, float *out, int64_t n);

/* Quantizes k floats (k a multiple of 256, finite) into k/256 blocks of the type at dst: the
 * scale search of llama.cpp's reference quantizers (quantize_row_q*_K_ref, no importance
 * matrix) in its float order, so the bytes equal llama-quantize's for the same row
 * (kquant_quantize.c). st_quantize_row_kquant returns 0 if type is not a K-quant. */
void st_quantize_row_q2_k(const float *x, void *dst, int64_t k);
void st_quantize_row_q3_k(const float *x, void *dst, int64_t k);
void st_quantize_row_q4_k(const float *x, void *dst, int64_t k);
void st_quantize_row_q5_k(const float *x, void *dst, int64_t k);
void st_quantize_row_q6_k(const float *x, void *dst, int64_t k);
int st_quantize_row_kquant(uint32_t type, const float *x, void *dst, int64_t n);

/* Bytes per 256-element block of a K-quant type; 0 for other types. */
size_t st_kquant_block_bytes(uint32_t type);

/* Unpacks one block of a K-quant type (scalar; the SIMD files have their own). */
void st_kq_unpack(uint32_t type, const void *blk, st_kq_unpacked *u);

/* K-quant weights packed for batches (kqp.c, Q4_K, Q5_K and Q6_K): each full group of ST_KQP_ROWS =
 * 8 rows becomes, super-block by super-block, one group-block of the 8 rows' blocks (8 x 144 or 8 x
 * 210 bytes, so a packed matrix is as big as a row-major one and packs in place), laid out so that
 * one 32-byte load holds four bytes of quants of each row, byte 4r + e of a vector from row r:
 * - Q4_K: d[8], dmin[8] (fp16, row r at 2r), the 12 scale bytes as planes (byte i of row r's
 *   scales at 32 + 8i + r), then 32 vectors of quants at 128 + 32(8c + k): row r's
 *   qs[32c + 4k + e].
 * - Q5_K: as Q4_K up to the quants, then qh as 8 vectors at 128 + 32k: row r's qh[4k + e], then
 *   qs as Q4_K's at 384 + 32(8c + k).
 * - Q6_K: d[8] (fp16), the scales at 16 + 8j + r, ql as 32 vectors at 144 + 32(16h + 8s + k):
 *   row r's ql[64h + 32s + 4k + e], then qh as 16 vectors at 1168 + 32(8h + k): row r's
 *   qh[32h + 4k + e].
 * Rows past the last full group stay row-major after the groups. The packed matmuls have the
 * st_matmul_q8p_fn contract (kernels.h) and give bitwise the row-major kernels' results. */
enum { ST_KQP_ROWS = 8 };
int st_kq_packable(uint32_t type);
/* Packs rows x K weights of a packable type (rows row_bytes apart); dst may be src. 0, or -1
 * (nothing changed) for a type it does not pack or when a scratch of 8 rows is not there. */
int st_pack_kq(uint32_t type, void *dst, const void *src, size_t row_bytes, int64_t rows,
               int64_t K);
/* Row r of a packed matrix, row-major, into out (row_bytes). */
void st_kq_packed_row(uint32_t type, const void *wp, size_t row_bytes, int64_t rows, int64_t K,
                      int64_t r, void *out);
/* Rows [r0, r1) of a packed matrix, each read back into row-major blocks and multiplied by the
 * reference kernel or, with ggml set, by st_matmul_kq_ggml. */
void st_matmul_kq_packed_rows(uint32_t type, int ggml, float *y, int64_t ldy, const void *wp,
                              size_t row_bytes, int64_t rows, const void *x, int64_t ldx, int64_t K,
                              int64_t M, int64_t r0, int64_t r1);
#define ST_KQP_DECLARE(isa)                                                                        \
    void st_matmul_q4_k_packed_##isa(float *, int64_t, const void *, size_t, int64_t,              \
                                     const void *, int64_t, int64_t, int64_t, int64_t, int64_t);   \
    void st_matmul_q5_k_packed_##isa(float *, int64_t, const void *, size_t, int64_t,              \
                                     const void *, int64_t, int64_t, int64_t, int64_t, int64_t);   \
    void st_matmul_q6_k_packed_##isa(float *, int64_t, const void *, size_t, int64_t,              \
                                     const void *, int64_t, int64_t, int64_t, int64_t, int64_t);
ST_KQP_DECLARE(ref)
ST_KQP_DECLARE(avx2)
ST_KQP_DECLARE(avx512)
#undef ST_KQP_DECLARE

/* The matmuls of each table (st_matmul_fn, kernels.h; x is st_block_q8k, ldx in blocks). */
#define ST_KQ_DECLARE(isa)                                                                         \
    void st_matmul_q2_k_##isa(float *, int64_t, const void *, size_t, const void *, int64_t,       \
                              int64_t, int64_t, int64_t, int64_t);                                 \
    void st_matmul_q3_k_##isa(float *, int64_t, const void *, size_t, const void *, int64_t,       \
                              int64_t, int64_t, int64_t, int64_t);                                 \
    void st_matmul_q4_k_##isa(float *, int64_t, const void *, size_t, const void *, int64_t,       \
                              int64_t, int64_t, int64_t, int64_t);                                 \
    void st_matmul_q5_k_##isa(float *, int64_t, const void *, size_t, const void *, int64_t,       \
                              int64_t, int64_t, int64_t, int64_t);                                 \
    void st_matmul_q6_k_##isa(float *, int64_t, const void *, size_t, const void *, int64_t,       \
                              int64_t, int64_t, int64_t, int64_t);
ST_KQ_DECLARE(ref)
ST_KQ_DECLARE(avx2)
ST_KQ_DECLARE(avx512)
#undef ST_KQ_DECLARE

#endif /* ST_KQUANT_H */
