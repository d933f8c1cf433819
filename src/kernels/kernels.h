/*
 * kernels.h: the kernel table. Every hot loop goes through one table chosen once at run time
 * (AVX-512 or AVX2+FMA+F16C when the CPU has them, else the scalar `_ref` twins; ST_KERNELS=ref
 * forces the scalar table, ST_KERNELS=avx2 the AVX2 one). All kernels share one reduction order per
 * output element, independent of the number of tokens, rows or threads (DESIGN.md invariant 1), and
 * each optimized kernel gives bitwise the results of its `_ref` twin.
 *
 * Canonical float dot product of length n: eight lane accumulators, lane l takes elements
 * i = l (mod 8) in increasing i with a fused multiply-add (missing tail elements count as
 * 0*0), then reduce8 = ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
 * Quantized weights (Q8_0, Q4_0; K-quants: kquant.h) multiply activations quantized per block of 32
 * to int8 with a float scale (st_block_q8x); d_b = fp16_to_f32(w scale) * x scale rounded to
 * float. Canonical Q8_0 dot product (per block): isum[b] is the exact integer sum of w_j * x_j
 * over the 32 elements of block b (|isum| < 2^20, so (float)isum is exact); one float chain
 * acc = fma((float)isum[b], d_b, acc) from acc = +0 takes the blocks in increasing b, and the
 * result is acc. One float operation per block lets a matrix unit (AMX) compute the integer
 * sums of a whole tile. Canonical Q4_0 dot product (per lane): in block b, lane l in [0, 8)
 * holds the exact integer sum isum[b][l] over the elements j = 4l .. 4l+3 (weights count as
 * nibble - 8); eight float accumulators take, block by block in increasing b,
 * acc_l = fma((float)isum[b][l], d_b, acc_l); the result is reduce8(acc).
 * Attention (DESIGN.md invariant 1: the same arithmetic for a key whatever the batch): a score
 * is dot(q, k_row, head_dim) / div (canonical dot, one IEEE division); the probabilities of a
 * head are softmax(scores): exp_sum(x - max) with its eight lanes, then one IEEE division by
 * the sum per score; the output is, per element d, the fma chain out_d = fma(p_r, v_r[d], out_d)
 * over the visible rows in visit order.
 */
#ifndef ST_KERNELS_H
#define ST_KERNELS_H

#include "core/core.h"
#include "kernels/kquant.h"

enum { ST_QK = 32 };

typedef struct st_block_q8_0 {
    uint16_t d; /* fp16 scale */
    int8_t q[ST_QK];
} st_block_q8_0;
_Static_assert(sizeof(st_block_q8_0) == 34, "q8_0 block is 34 bytes");

typedef struct st_block_q4_0 {
    uint16_t d;            /* fp16 scale */
    uint8_t qs[ST_QK / 2]; /* element j in the low nibble of byte j, j+16 in the high nibble */
} st_block_q4_0;
_Static_assert(sizeof(st_block_q4_0) == 18, "q4_0 block is 18 bytes");

/* The 32 signed values (nibble - 8) of a Q4_0 block, in element order (convert.c). */
void st_q4_0_unpack(const st_block_q4_0 *b, int8_t q[ST_QK]);

/* Activation-side block: float scale, 32 int8 values. */
typedef struct st_block_q8x {
    float d;
    int8_t q[ST_QK];
} st_block_q8x;
_Static_assert(sizeof(st_block_q8x) == 36, "q8x block is 36 bytes");

/* Matrix-times-tokens: for rows r in [r0, r1) of W (each row K elements of W's type, rows
 * row_bytes apart) and tokens m in [0, M): y[m*ldy + r] = dot(W_r, x_m).
 * For float weights x is float (x_m = x + m*ldx); for quantized weights x is st_block_q8x
 * (x_m = x + m*ldx blocks, K/32 of them). W rows are streamed once for all M tokens. */
typedef void (*st_matmul_fn)(float *y, int64_t ldy, const void *w, size_t row_bytes, const void *x,
                             int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1);

/* Float weights packed for small models (st_pack_f32): blocks of ST_PACK_ROWS = 16 rows, each
 * block K8 = K rounded up to 8 columns long, in steps of four columns q; step q of block b holds
 * four 16-float vectors g = 0..3, vector g the columns 4q .. 4q+3 of rows 4c + g for c = 0..3:
 * wp[(((b*K8/4 + q)*4 + g)*4 + c)*4 + e] = W[16b + 4c + g][4q + e], zero past the last row or
 * column. For rows r in [r0, r1) (any range) and tokens m in [0, M):
 * y[m*ldy + r] = dot(W_r, x_m) with x_m = x + m*ldx, the canonical float dot product, bitwise
 * what matmul_f32 gives on the unpacked rows. A vector times the four values x_m[4q .. 4q+3]
 * (one 128-bit broadcast) advances lanes 4(q mod 2) .. 4(q mod 2)+3 of four rows x four groups;
 * reduce8 needs one vertical addition and a few in-lane shuffles per 16 outputs. */
enum { ST_PACK_ROWS = 16 };
typedef void (*st_matmul_packed_fn)(float *y, int64_t ldy, const float *wp, const float *x,
                                    int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1);

/* Q8_0 weights packed for matrix units (st_pack_q8_0), in place and the same size: each full
 * group of ST_PACK_ROWS = 16 rows (rows 16g .. 16g+15) becomes, block by block, the 16 rows'
 * fp16 scales (32 bytes) then eight 64-byte rows k = 0 .. 7 of quants, row k holding bytes
 * 4k .. 4k+3 of rows 16g .. 16g+15 in turn (AMX's B-tile layout):
 * P[g][b] = {d[n] = W[16g+n].d_b; q[k][4n+i] = W[16g+n].q_b[4k+i]}, 544 bytes per group and
 * block; rows past the last full group stay row-major after the groups. The packed matmul takes
 * the matrix's row count and computes rows [r0, r1) (r0 a multiple of 16), bitwise the per-block
 * canonical Q8_0 dot product of the row-major kernel. */
enum { ST_Q8P_GROUP_BYTES = ST_PACK_ROWS * (int)sizeof(st_block_q8_0) };
typedef void (*st_matmul_q8p_fn)(float *y, int64_t ldy, const void *wp, size_t row_bytes,
                                 int64_t rows, const void *x, int64_t ldx, int64_t K, int64_t M,
                                 int64_t r0, int64_t r1);
/* Packs rows x K Q8_0 weights (rows row_bytes apart) as above; dst may be src (in place, with
 * a scratch of 16 rows: -1, nothing changed, if it cannot be allocated), else 0. */
int st_pack_q8_0(void *dst, const void *src, size_t row_bytes, int64_t rows, int64_t K);

/* Q4_0 weights packed for batches (st_pack_q4_0), in place and the same size: each full group of
 * 16 rows becomes, block by block, the 16 rows' fp16 scales (32 bytes) then four 64-byte rows
 * k = 0 .. 3 of quant bytes, row k holding bytes 4k .. 4k+3 of qs of rows 16g .. 16g+15 in turn:
 * P[g][b] = {d[n] = W[16g+n].d_b; q[k][4n+i] = W[16g+n].qs_b[4k+i]}, 288 bytes per group and
 * block; rows past the last full group stay row-major after the groups. The low nibbles of row k
 * are the elements of lane k of the per-lane canonical Q4_0 product, the high nibbles those of
 * lane k + 4, so a 32-bit broadcast of four activation bytes against row k gives 16 rows'
 * canonical lanes in one vector (no horizontal sums). st_matmul_q8p_fn contract, bitwise the
 * row-major kernel's results. */
enum { ST_Q4P_GROUP_BYTES = ST_PACK_ROWS * (int)sizeof(st_block_q4_0) };
int st_pack_q4_0(void *dst, const void *src, size_t row_bytes, int64_t rows, int64_t K);

typedef struct st_kernels {
    const char *name;
    st_matmul_fn matmul_f32;
    st_matmul_fn matmul_f16;
    st_matmul_fn matmul_bf16;
    st_matmul_fn matmul_q8_0;
    st_matmul_fn matmul_q4_0;
    /* K-quant weights (kquant.h) times activations quantized by st_quantize_q8k. */
    st_matmul_fn matmul_q2_k, matmul_q3_k, matmul_q4_k, matmul_q5_k, matmul_q6_k;
    /* NULL where packing does not pay (the AVX2 table: measured slower than its row-major
     * kernel with 16 registers); then weights stay unpacked. */
    st_matmul_packed_fn matmul_f32_packed;
    /* Q8_0 weights packed by st_pack_q8_0 (every table has it). */
    st_matmul_q8p_fn matmul_q8_0_packed;
    /* Q4_0 weights packed by st_pack_q4_0 (every table has it). */
    st_matmul_q8p_fn matmul_q4_0_packed;
    /* Q4_K / Q5_K / Q6_K weights packed by st_pack_kq (kquant.h; the AVX2 and AVX-512 tables
     * have them, kqp_avx2.c, kqp_avx512.c); NULL would keep them row-major. */
    st_matmul_q8p_fn matmul_q4_k_packed, matmul_q5_k_packed, matmul_q6_k_packed;
    /* Canonical dot product (see above). */
    float (*dot)(const float *a, const float *b, int64_t n);
    /* Attention scores of nq queries against n key rows:
     * sc[j][r] = dot(q[j], k + r*ldk, hd) / div for j < nq, r < n. Each key row is read once for
     * all the queries (the query heads of a KV group, of every token that sees the row). */
    void (*attn_scores)(float *const *sc, const float *const *q, int64_t nq, const float *k,
                        int64_t ldk, int64_t n, int64_t hd, float div);
    /* Weighted sum of n value rows for nq queries, continuing the fma chains in out:
     * out[j][d] = fma(p[j][r], v[r*ldv + d], out[j][d]) for r = 0 .. n-1 in order, j < nq,
     * d < hd. */
    void (*attn_wsum)(float *const *out, const float *const *p, int64_t nq, const float *v,
                      int64_t ldv, int64_t n, int64_t hd);
    /* Softmax numerator: x[i] = exp(x[i] - mx) for i < n (x[i] = -inf gives 0), returning the
     * sum with eight lanes (lane = i mod 8) and the canonical final reduction. exp is the
     * project's own polynomial (st_expf_ref), identical in every table. */
    float (*exp_sum)(float *x, int64_t n, float mx);
    /* Softmax of the scores of `rows` heads, in place, n scores per head, head r at x + r*ld:
     * per head, mx = max x[i] (NaNs never count; -inf if none; the sign of a zero max cannot
     * change the results), sum = mx == -inf ? 0 : exp_sum(x, n, mx), then if sum > 0,
     * x[i] = x[i] / sum (one IEEE division) for i < n; sum[r] = sum. !(sum[r] > 0) means head
     * r has no usable key (all -inf, or NaN). The heads are independent (their chains are
     * interleaved for speed). */
    void (*softmax)(float *x, int64_t n, int64_t rows, int64_t ld, float *sum);
    /* SwiGLU: g[i] = (g[i] / (1 + exp(-g[i]))) * u[i] for i < n, exp = st_expf_ref. */
    void (*silu_mul)(float *g, const float *u, int64_t n);
    /* Quantizes K floats (K a multiple of 32) into K/32 blocks: d = max|x|/127, q = round(x/d). */
    void (*quantize_q8x)(st_block_q8x *y, const float *x, int64_t K);
    /* st_quantize_q8k (kquant.h), bitwise: the K-quants' activations. */
    void (*quantize_q8k)(st_block_q8k *y, const float *x, int64_t K);
    /* y[i] = x[i] as float for i < n (exact; an f16 KV cache's rows for the attention kernels). */
    void (*f16_to_f32)(float *y, const uint16_t *x, int64_t n);
} st_kernels;

/* The table in use (chosen once, thread-safe). */
const st_kernels *st_kernels_get(void);
/* The scalar reference table and, if this CPU supports them, the AVX2 and AVX-512 tables (else
 * NULL). The AVX-512 table differs from the AVX2 one in its batch matmuls, packed float matmul
 * (which the AVX2 table lacks), exp_sum, softmax and small-head attn_scores. */
const st_kernels *st_kernels_ref(void);
/* k's row-major matmul for weights of a type (ST_DTYPE_*; any other type: the Q6_K kernel, as
 * the loader admits no other). */
st_matmul_fn st_kernels_matmul(const st_kernels *k, uint32_t type);
const st_kernels *st_kernels_avx2(void);
const st_kernels *st_kernels_avx512(void);

/* exp(x) as every kernel table computes it: range reduction by ln 2 and a degree-6 polynomial
 * with explicit fma, so scalar and vector versions agree bit for bit (relative error < 3e-7). */
float st_expf_ref(float x);

/* exp(x) as ggml's AVX-512 build computes it for softmax and SiLU (ggml_v_expf, after ARM's
 * optimized-routines expf: n = round(x / ln 2) by the 1.5 * 2^23 shift, a two-constant
 * reduction and a degree-5 polynomial, scaled by 2^n; 0 below about -104, inf above 88.4).
 * Used by the sessions that match ggml's arithmetic (st_session_params.match_ggml). */
float st_expf_ggml(float x);

/* The per-block Q8_0 matmul of the AVX2 table on row-major weights (also the AVX-512 table's),
 * and the AVX-512 table's on packed weights (kernels_amx.c: AMX-INT8 for batches of 3 or more
 * tokens where st_amx_ready(), else VNNI). st_amx_set(0) keeps the AVX-512 table off AMX,
 * st_amx_set(1) allows it again where available (tests); both return whether it is now used.
 * ST_AMX=0 in the environment is st_amx_set(0). */
void st_matmul_q8_0_avx2(float *y, int64_t ldy, const void *w, size_t rb, const void *x,
                         int64_t ldx, int64_t K, int64_t M, int64_t r0, int64_t r1);
void st_matmul_q8_0_packed_avx512(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                                  const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                  int64_t r1);
/* The AVX2 table's Q8_0 matmul on packed weights (q8p_avx2.c), which hands the work to the
 * AVX-VNNI kernel (q8p_avxvnni.c) where st_avxvnni_ready(). st_avxvnni_set(0) keeps it on plain
 * AVX2, st_avxvnni_set(1) allows AVX-VNNI again where the CPU has it (tests); both return whether
 * it is now used. ST_AVXVNNI=0 in the environment is st_avxvnni_set(0). */
void st_matmul_q8_0_packed_avx2(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                                const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                int64_t r1);
void st_matmul_q8_0_packed_avxvnni(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                                   const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                   int64_t r1);
/* The Q4_0 matmuls on packed weights (st_pack_q4_0): AVX-512 VNNI (q4p_avx512.c), AVX2
 * (q4p_avx2.c), which hands the work to the AVX-VNNI kernel (q4p_avxvnni.c) where
 * st_avxvnni_ready(). */
void st_matmul_q4_0_packed_avx512(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                                  const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                  int64_t r1);
void st_matmul_q4_0_packed_avx2(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                                const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                int64_t r1);
void st_matmul_q4_0_packed_avxvnni(float *y, int64_t ldy, const void *wp, size_t rb, int64_t rows,
                                   const void *x, int64_t ldx, int64_t K, int64_t M, int64_t r0,
                                   int64_t r1);
int st_avxvnni_ready(void);
int st_avxvnni_set(int on);
int st_amx_ready(void);
int st_amx_set(int on);

/* Conversions shared by kernels and loaders. */
float st_fp16_to_f32(uint16_t h);
uint16_t st_f32_to_fp16(float f);
static inline float st_bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h << 16};
    return v.f;
}
uint16_t st_f32_to_bf16(float f);

/* Floats of the packed copy of a rows x K float matrix (rows rounded up to ST_PACK_ROWS), and
 * the packing itself (rows row_bytes apart); wp should be 64-byte aligned. */
size_t st_pack_f32_floats(int64_t rows, int64_t K);
void st_pack_f32(float *wp, const float *w, size_t row_bytes, int64_t rows, int64_t K);

/* Dequantizes one row of n elements of any supported type into float. */
void st_dequant_row(uint32_t type, const void *row, float *out, int64_t n);
/* Bytes of one row of n elements of a type (n a multiple of the block size); 0 if unknown. */
size_t st_row_bytes(uint32_t type, int64_t n);

#endif /* ST_KERNELS_H */
