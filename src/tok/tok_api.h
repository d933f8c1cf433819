/*
 * tok_api.h: the tokenizer part of the public API, kept here until it is pasted into
 * include/spectree.h (then this file becomes a plain #include of it). See docs/FORMATS.md in the
 * shared folder, sections (b.4) and (e), for the GGUF keys and the algorithms.
 */
#ifndef ST_TOK_API_H
#define ST_TOK_API_H

#include "spectree.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Tokenizer
 *
 * Two kinds, chosen by tokenizer.ggml.model:
 * - "llama": SentencePiece BPE with byte fallback (Llama 2, TinyLlama, Mistral, stories260K).
 *   One "▁" (U+2581) is prepended when add_space_prefix (default true), every space becomes "▁",
 *   then the adjacent pair whose concatenation is a piece with the highest score merges first
 *   (ties: leftmost); characters left without a piece become their <0xHH> byte pieces.
 * - "gpt2": byte-level BPE (Llama 3, Qwen2, DeepSeek, GPT-2). The text is split by the
 *   pre-tokenizer named by tokenizer.ggml.pre, then each part is merged by the rank order of
 *   tokenizer.ggml.merges. Supported pre-tokenizers: "gpt-2" (also "gpt2", "default", absent,
 *   "mpt", "olmo", "phi-2", "roberta-bpe", "jais"), "llama-bpe" ("llama3", "llama-v3", "falcon3";
 *   a whole part that is a piece is emitted without merging), "dbrx" and "smaug-bpe" (the
 *   Llama 3 split, merges always applied), "qwen2" ("stablelm2", "megrez"), "deepseek-llm".
 *
 * Text is UTF-8. Bytes that are not valid UTF-8 get a defined result: each such byte stands
 * alone (SentencePiece: its <0xHH> piece; byte-level BPE: its byte symbol, classed as
 * punctuation by the pre-tokenizer), so nothing is lost and nothing crashes.
 * Control-token text such as "<s>" in the input is plain text. Pieces of user-defined tokens
 * (token type 4) are matched first, longest first, and emitted as their id, as llama.cpp does.
 *
 * A tokenizer is immutable after loading: any number of threads may use one at once.
 * ------------------------------------------------------------------------------------------- */

typedef struct st_tokenizer st_tokenizer;

/* Builds a tokenizer from the tokenizer.ggml.* keys of g. Everything needed is copied, so the
 * tokenizer outlives g. Errors (st_last_error() names the file and the key):
 * ST_ERR_FORMAT for missing tokenizer.ggml.model/tokens (or merges for gpt2), a key of the wrong
 * type, scores/token_type arrays whose length differs from the token count, a malformed merge
 * (no separating space), a BOS/EOS id outside the vocabulary (an id of 0xFFFFFFFF or -1 means
 * "none"); ST_ERR_UNSUPPORTED for an unknown model or pre-tokenizer name; ST_ERR_NOMEM.
 * A merge naming a piece that is not in the vocabulary can never apply and is ignored.
 * On error *out is NULL. */
st_status st_tokenizer_load(const st_gguf *g, st_tokenizer **out);

/* Frees a tokenizer; accepts NULL. */
void st_tokenizer_free(st_tokenizer *t);

/* Number of tokens (valid ids are 0 .. n_vocab-1). */
int32_t st_tokenizer_n_vocab(const st_tokenizer *t);

/* Special ids, -1 if the vocabulary has none. Defaults when the key is absent: "llama" BOS 1,
 * EOS 2; "gpt2" none. */
int32_t st_tokenizer_bos(const st_tokenizer *t);
int32_t st_tokenizer_eos(const st_tokenizer *t);

/* Whether prompts should start with BOS: tokenizer.ggml.add_bos_token, else true for "llama"
 * and for the Llama 3 pre-tokenizers, false otherwise. */
int st_tokenizer_add_bos_default(const st_tokenizer *t);

/* 1 if id ends generation: EOS, tokenizer.ggml.eot_token_id / eom_token_id, and the pieces
 * "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
 * "<EOT>" (as llama.cpp). 0 otherwise, including ids out of range. */
int st_tokenizer_is_eog(const st_tokenizer *t, int32_t id);

/* Tokenizes len bytes of text (no NUL needed; text may be NULL when len is 0), prepending BOS
 * when add_bos is nonzero. Writes at most cap ids to out (out may be NULL when cap is 0) and
 * sets *n_out to the number of ids the whole result has. Returns ST_OK; ST_ERR_RANGE when
 * cap < *n_out (out then holds the first cap ids: call again with a larger buffer);
 * ST_ERR_INVALID for a bad argument, a text over 1 GiB, or add_bos without a BOS token;
 * ST_ERR_NOMEM. The empty text gives no tokens (just BOS when asked). Scratch memory, about 100
 * bytes per input byte, is allocated per call and freed before returning. */
st_status st_tokenize(const st_tokenizer *t, const char *text, size_t len, int add_bos,
                      int32_t *out, int64_t cap, int64_t *n_out);

/* The raw vocabulary text of token id ("▁the", "Ġthe", "<0x0A>", "<s>"), NUL-terminated and
 * owned by the tokenizer; *len (if len is not NULL) gets its length in bytes. NULL for ids out
 * of range. */
const char *st_tokenizer_piece(const st_tokenizer *t, int32_t id, size_t *len);

/* Streaming detokenizer. The state is caller-owned and fixed-size; nothing is allocated.
 *
 *     st_detok d;
 *     st_detok_init(&d, tok);
 *     for each generated id: st_detok_push(&d, id, buf, sizeof buf, &n); fwrite(buf, 1, n, f);
 *     st_detok_flush(&d, buf, sizeof buf, &n); fwrite(buf, 1, n, f);
 *
 * Each token contributes its bytes: "llama" pieces with "▁" as a space and <0xHH> pieces as the
 * raw byte; "gpt2" pieces mapped back from the byte alphabet ("Ġ" -> space); user-defined
 * pieces as written. Control, unknown and unused tokens (BOS, EOS, <unk>) contribute nothing.
 * Output is always valid UTF-8: the bytes of a character split across tokens are held back
 * until the token that completes it, and a sequence that cannot be completed is written as one
 * U+FFFD per maximal ill-formed subpart as soon as that is certain (or at flush).
 * Leading space: for "llama" vocabularies with add_space_prefix, the first token with text after
 * BOS loses one leading space ("<s> ▁Hello" -> "Hello"), as tokenize added it. */
typedef struct st_detok {
    const st_tokenizer *tok;
    int32_t prev;        /* last id pushed or primed; -1 at the start */
    int32_t strip_space; /* 1: drop one leading space from the next token with text */
    uint8_t pend[4];     /* bytes of an incomplete UTF-8 character held back */
    uint32_t n_pend;     /* 0..3 */
} st_detok;

/* Starts a stream: no previous token, nothing held. */
void st_detok_init(st_detok *d, const st_tokenizer *t);

/* Makes id the previous token without writing anything and without touching held bytes, e.g.
 * the last prompt token before generation so that the first generated token reads as a
 * continuation (its leading space is kept unless id is BOS). ST_ERR_INVALID for an id out of
 * range. */
st_status st_detok_set_prev(st_detok *d, int32_t id);

/* An upper bound on the bytes one st_detok_push or st_detok_flush can write for this tokenizer;
 * a buffer of this size never gives ST_ERR_RANGE. */
size_t st_detok_max_bytes(const st_tokenizer *t);

/* Appends the text of token id. Writes *n_out bytes to out (no NUL). ST_ERR_RANGE if cap is too
 * small: *n_out is then the size needed, the state is unchanged and out's contents are
 * unspecified; ST_ERR_INVALID for an id out of range (state unchanged). */
st_status st_detok_push(st_detok *d, int32_t id, char *out, size_t cap, size_t *n_out);

/* Writes whatever is held (an incomplete character becomes U+FFFD) and empties the hold; the
 * previous token is kept. Same return codes as push. */
st_status st_detok_flush(st_detok *d, char *out, size_t cap, size_t *n_out);

#ifdef __cplusplus
}
#endif

#endif /* ST_TOK_API_H */
