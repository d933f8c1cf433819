/*
 * quant_mix.c: the per-tensor weight types of llama.cpp's K-quant file types (Q4_K_M and the
 * rest): which tensors of a Llama file get more bits than the base type. The rule is
 * llama-quantize's (llama_tensor_get_type for the llama architecture, without an importance
 * matrix, experts or the 70B special case), so a file written here has its tensor types.
 */
#include "io/gguf_write.h"

#include "kernels/kernels.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    uint32_t ftype, base;
} ftypes[] = {
    {"q2_k", ST_FTYPE_Q2_K, ST_DTYPE_Q2_K},     {"q3_k_s", ST_FTYPE_Q3_K_S, ST_DTYPE_Q3_K},
    {"q3_k_m", ST_FTYPE_Q3_K_M, ST_DTYPE_Q3_K}, {"q3_k_l", ST_FTYPE_Q3_K_L, ST_DTYPE_Q3_K},
    {"q4_k_s", ST_FTYPE_Q4_K_S, ST_DTYPE_Q4_K}, {"q4_k_m", ST_FTYPE_Q4_K_M, ST_DTYPE_Q4_K},
    {"q5_k_s", ST_FTYPE_Q5_K_S, ST_DTYPE_Q5_K}, {"q5_k_m", ST_FTYPE_Q5_K_M, ST_DTYPE_Q5_K},
    {"q6_k", ST_FTYPE_Q6_K, ST_DTYPE_Q6_K},
};
enum { N_FTYPES = sizeof ftypes / sizeof ftypes[0] };

uint32_t st_kquant_ftype_from_name(const char *name) {
    for (int i = 0; i < N_FTYPES; i++)
        if (strcmp(ftypes[i].name, name) == 0)
            return ftypes[i].ftype;
    return 0;
}

const char *st_kquant_ftype_name(uint32_t ftype) {
    for (int i = 0; i < N_FTYPES; i++)
        if (ftypes[i].ftype == ftype)
            return ftypes[i].name;
    return NULL;
}

/* llama.cpp's "more bits" layers: the first and last eighth, and every third one between. */
static int more_bits(int64_t i, int64_t n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static int ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A type for rows of ncols elements when `type` needs whole super-blocks and they are not:
 * llama.cpp's fallbacks where spectree writes them (Q2_K, Q3_K -> Q4_0), Q8_0 for Q4_K .. Q6_K
 * (llama.cpp writes Q5_0 / Q5_1 / Q8_0, and spectree has no Q5_0 / Q5_1), F16 when not even 32
 * divides the row. */
static uint32_t fallback(uint32_t type, int64_t ncols) {
    if (ncols % 256 == 0)
        return type;
    if (ncols % 32 != 0)
        return ST_DTYPE_F16;
    return type == ST_DTYPE_Q2_K || type == ST_DTYPE_Q3_K ? ST_DTYPE_Q4_0 : ST_DTYPE_Q8_0;
}

uint32_t st_kquant_fit_type(uint32_t type, int64_t ncols) { return fallback(type, ncols); }

static uint32_t mix_type(uint32_t ftype, const char *name, int64_t n_layer, int64_t n_gqa,
                         int tied);

uint32_t st_kquant_tensor_type(uint32_t ftype, const char *name, int64_t ncols, int64_t n_layer,
                               int64_t n_gqa, int tied) {
    const uint32_t t = mix_type(ftype, name, n_layer, n_gqa, tied);
    return t ? fallback(t, ncols) : 0;
}

static uint32_t mix_type(uint32_t ftype, const char *name, int64_t n_layer, int64_t n_gqa,
                         int tied) {
    uint32_t base = 0;
    for (int i = 0; i < N_FTYPES; i++)
        if (ftypes[i].ftype == ftype)
            base = ftypes[i].base;
    if (!base || !ends_with(name, ".weight") || strstr(name, "_norm.weight"))
        return 0;
    if (strcmp(name, "output.weight") == 0 || (tied && strcmp(name, "token_embd.weight") == 0))
        return ST_DTYPE_Q6_K;
    long layer = -1;
    if (sscanf(name, "blk.%ld.", &layer) != 1)
        return base; /* token_embd (untied) and anything else outside the blocks */
    const int64_t i = layer;
    if (ends_with(name, ".attn_v.weight")) {
        switch (ftype) {
        case ST_FTYPE_Q2_K:
            return n_gqa >= 4 ? ST_DTYPE_Q4_K : ST_DTYPE_Q3_K;
        case ST_FTYPE_Q3_K_M:
            return i < 2 ? ST_DTYPE_Q5_K : ST_DTYPE_Q4_K;
        case ST_FTYPE_Q3_K_L:
            return ST_DTYPE_Q5_K;
        case ST_FTYPE_Q4_K_S:
            return i < 4 ? ST_DTYPE_Q5_K : base;
        case ST_FTYPE_Q4_K_M:
        case ST_FTYPE_Q5_K_M:
            return more_bits(i, n_layer) ? ST_DTYPE_Q6_K : base;
        default:
            return base;
        }
    }
    if (ends_with(name, ".ffn_down.weight")) {
        switch (ftype) {
        case ST_FTYPE_Q2_K:
            return ST_DTYPE_Q3_K;
        case ST_FTYPE_Q3_K_M:
            return i < n_layer / 16 ? ST_DTYPE_Q5_K : ST_DTYPE_Q4_K;
        case ST_FTYPE_Q3_K_L:
            return ST_DTYPE_Q5_K;
        case ST_FTYPE_Q4_K_S:
            return i < n_layer / 8 ? ST_DTYPE_Q5_K : base;
        case ST_FTYPE_Q4_K_M:
        case ST_FTYPE_Q5_K_M:
            return more_bits(i, n_layer) ? ST_DTYPE_Q6_K : base;
        default:
            return base;
        }
    }
    if (ends_with(name, ".attn_output.weight")) {
        switch (ftype) {
        case ST_FTYPE_Q2_K:
            return ST_DTYPE_Q3_K;
        case ST_FTYPE_Q3_K_M:
            return ST_DTYPE_Q4_K;
        case ST_FTYPE_Q3_K_L:
            return ST_DTYPE_Q5_K;
        default:
            return base;
        }
    }
    return base;
}
