/*
 * hf.h: Hugging Face checkpoints as GGUF. A checkpoint directory (config.json, safetensors
 * shards, tokenizer.json, tokenizer_config.json) is turned into a GGUF writer holding what
 * llama.cpp's convert_hf_to_gguf.py would write for it: the llama architecture's keys, its
 * tensor names (token_embd, blk.N.attn_q, ...), q/k rows permuted from Hugging Face's
 * half-split rotary layout to the adjacent pairs GGUF files hold, and the tokenizer.ggml.* keys.
 * `spectree convert` writes it to a file; st_model_load of a directory loads it from memory, so
 * both go through the one GGUF loader. Files: hf_gguf.c (config and tensors), hf_tok.c
 * (tokenizer.json).
 */
#ifndef ST_HF_H
#define ST_HF_H

#include "core/core.h"
#include "io/gguf_write.h"

/* The matrices' type for st_hf_to_gguf: as stored (F32, F16 or BF16, each matrix its own); a
 * K-quant file type of llama-quantize's is ST_HF_MIX + its llama_ftype (ST_FTYPE_Q4_K_M ...,
 * the public ST_CONVERT_Q4_K_M ...). */
enum { ST_HF_KEEP = -1, ST_HF_MIX = 0x100 };

/* The type a matrix `name` (GGUF names; rows of n_in elements, stored as src) gets for wtype:
 * src for ST_HF_KEEP, llama-quantize's choice for a mix (n_layer blocks, n_gqa query heads per
 * KV head, tied: no output.weight), else wtype with the fallbacks described below. Shared by
 * st_hf_to_gguf and st_convert_gguf. */
uint32_t st_convert_matrix_type(int wtype, const char *name, int64_t n_in, int64_t n_layer,
                                int64_t n_gqa, int tied, uint32_t src);
/* Whether wtype is one of the types below; general.file_type (llama_ftype: ALL_F32 0,
 * MOSTLY_F16 1, Q4_0 2, Q8_0 7, BF16 32, the K-quant mixes 10 .. 18) of a file of that type. */
int st_convert_type_valid(int wtype);
uint32_t st_convert_file_type(int wtype);

/* Builds the GGUF of checkpoint `dir` in a new writer (*out, freed with st_gguf_writer_free),
 * holding copies of every tensor (the safetensors files are closed on return). wtype: the type
 * of the 2-D weights (ST_HF_KEEP, or ST_DTYPE_F32, F16, BF16, Q8_0, Q4_0; a quantized type
 * falls back to F16 for a matrix whose rows are not a multiple of 32; a K-quant type Q2_K ..
 * Q6_K for every matrix, or ST_HF_MIX + a K-quant llama_ftype for llama-quantize's per-tensor
 * choice, st_kquant_tensor_type; rows that are not whole 256-element super-blocks take
 * st_kquant_fit_type's fallback). Norms stay F32. Errors
 * name the file and the field or tensor: a config.json field missing or out of range, an
 * unsupported model_type, hidden_act or rope_scaling, a missing shard or tensor, a tensor
 * whose shape disagrees with config.json, an unknown dtype, an unexpected tensor, a
 * tokenizer.json of another kind. */
st_status st_hf_to_gguf(const char *dir, int wtype, st_gguf_writer **out);

/* Adds the tokenizer.ggml.* keys (and tokenizer.chat_template) of dir/tokenizer.json and
 * dir/tokenizer_config.json to w (hf_tok.c). config_bos / config_eos: config.json's ids (-1
 * when absent), used when tokenizer_config.json names no bos or eos token. */
st_status st_hf_tokenizer_to_gguf(const char *dir, st_gguf_writer *w, int64_t config_bos,
                                  int64_t config_eos);

/* The same for a tokenizer.json held in memory (len bytes; `name` stands for the path in
 * errors), without tokenizer_config.json: for the fuzz target. */
st_status st_hf_tokenizer_to_gguf_memory(const char *json, size_t len, const char *name,
                                         st_gguf_writer *w);

#endif /* ST_HF_H */
