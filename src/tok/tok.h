/*
 * tok.h: internal header of the tokenizer module: the tokenizer struct, the hash tables built
 * at load time, the code point classes used by the pre-tokenizers, and the per-algorithm entry
 * points (SentencePiece BPE in tok_spm.c, byte-level BPE in tok_bpe.c, splits in tok_pre.c,
 * the merge queue both BPEs share in tok_heap.c).
 */
#ifndef ST_TOK_H
#define ST_TOK_H

#include "core/core.h"
#include "spectree.h"

/* Token types of tokenizer.ggml.token_type (FORMATS.md b.4); other values read as UNDEFINED. */
enum {
    ST_TT_UNDEFINED = 0,
    ST_TT_NORMAL = 1,
    ST_TT_UNKNOWN = 2,
    ST_TT_CONTROL = 3,
    ST_TT_USER = 4,
    ST_TT_UNUSED = 5,
    ST_TT_BYTE = 6,
};

typedef enum st_tok_kind { ST_TOK_SPM = 0, ST_TOK_BPE = 1 } st_tok_kind;

typedef enum st_pre_kind {
    ST_PRE_GPT2 =
        0, /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    ST_PRE_LLAMA3 =
        1, /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|... */
    ST_PRE_QWEN2 = 2,    /* the Llama 3 pattern with \p{N} instead of \p{N}{1,3} */
    ST_PRE_DEEPSEEK = 3, /* six Split patterns applied in sequence (tok_pre.c) */
    ST_PRE_SMOLLM = 4,   /* each \p{N} isolated (Hugging Face's Digits), then the GPT-2 pattern */
} st_pre_kind;

/* A merge: (left, right) -> result, applied in rank order. One slot of an open-addressing
 * table keyed on (left, right); left < 0 marks an empty slot. */
typedef struct st_tok_merge {
    int32_t left, right;
    int32_t rank;
    int32_t result;
} st_tok_merge;

struct st_tokenizer {
    st_tok_kind kind;
    st_pre_kind pre;
    int32_t n_vocab;
    int has_types;   /* tokenizer.ggml.token_type was present */
    char *text;      /* every piece, each followed by a NUL */
    size_t *off;     /* (n_vocab + 1) piece i is text[off[i] .. off[i+1]-1) minus the NUL */
    float *score;    /* (n_vocab) SentencePiece scores; 0 when absent */
    uint8_t *type;   /* (n_vocab) ST_TT_* */
    uint8_t *eog;    /* (n_vocab) 1 if the token ends generation */
    char *dec;       /* decoded bytes of every token (what detok writes) */
    size_t *dec_off; /* (n_vocab + 1) */
    size_t max_dec;  /* longest decoded token, bytes */
    int32_t *map;    /* (map_mask + 1) piece -> id table, -1 empty */
    uint64_t map_mask;
    st_tok_merge *merges; /* (merge_mask + 1) gpt2, and llama when the file has merges (a
                           * Hugging Face BPE: SPM merges by rank, see tok_spm.c); else NULL */
    uint64_t merge_mask;
    int32_t byte_tok[256]; /* SPM: byte-fallback id of each byte; BPE: id of its alphabet char */
    int32_t *user;         /* (n_user) user-defined token ids, longest piece first */
    int32_t n_user;
    int32_t bos, eos, unk;
    int add_bos, add_space_prefix, ignore_merges;
};

/* Emits ids into a caller buffer while counting all of them. */
typedef struct st_tok_out {
    int32_t *ids;
    int64_t cap;
    int64_t n;
} st_tok_out;

static inline void st_tok_emit(st_tok_out *o, int32_t id) {
    if (o->n < o->cap)
        o->ids[o->n] = id;
    o->n++;
}

/* Fills t->map from t's pieces (tok_vocab.c); a repeated piece maps to its last id. */
void st_tok_build_map(st_tokenizer *t);
/* Id of the piece with these bytes, or -1. */
int32_t st_tok_find(const st_tokenizer *t, const char *s, size_t n);

static inline const char *st_tok_text(const st_tokenizer *t, int32_t id, size_t *len) {
    *len = t->off[id + 1] - t->off[id] - 1;
    return t->text + t->off[id];
}

/* SentencePiece BPE of one text fragment; prefix: prepend "▁" (add_space_prefix). */
st_status st_tok_spm(const st_tokenizer *t, const char *text, size_t len, int prefix,
                     st_tok_out *o);
/* Byte-level BPE of one text fragment: pre-tokenize, then merge each part. */
st_status st_tok_bpe(const st_tokenizer *t, const char *text, size_t len, st_tok_out *o);
/* Checks tokenizer.ggml.merges (kv index) and gives the mask of the merge table that holds it
 * (a power of two at least twice the count, minus one). */
st_status st_tok_merges_mask(const st_gguf *g, int64_t kv, const char *name, uint64_t *mask);
/* The merge of pieces (l, r), or NULL (t->merges must exist). */
const st_tok_merge *st_tok_merge_find(const st_tokenizer *t, int32_t l, int32_t r);
/* Fills the merge table (t->merges, merge_mask + 1 slots, already allocated) from
 * tokenizer.ggml.merges once the piece map exists. */
st_status st_tok_load_merges(st_tokenizer *t, const st_gguf *g, int64_t kv, const char *name);

/* A candidate merge of adjacent symbols left and right. The queue pops the lowest key first,
 * ties going to the lowest left: SPM keys on -score, BPE on the merge rank (both exact in a
 * double). a, b: the two symbols as they were when queued (BPE: their ids; SPM: their byte
 * lengths), so a pop whose symbols have changed since is recognised as stale. res: BPE's merged
 * id. */
typedef struct st_tok_pair {
    double key;
    int32_t left, right;
    int32_t a, b;
    int32_t res;
} st_tok_pair;

/* The merge queue both BPEs share (tok_heap.c): a min-heap of pairs by (key, left) over the core
 * heap; push needs capacity for one more, pop needs *n > 0. */
void st_tok_heap_push(st_tok_pair *h, int64_t *n, st_tok_pair x);
st_tok_pair st_tok_heap_pop(st_tok_pair *h, int64_t *n);

/* GPT-2 byte alphabet: the code point standing for each byte, and back (-1 if none). */
uint32_t st_tok_byte_cp(uint8_t b);
int st_tok_cp_byte(uint32_t cp);

/* ---- UTF-8 and code point classes (tok_pre.c, unicode_tables.c) ---- */

enum { ST_UC_OTHER = 0, ST_UC_LETTER = 1, ST_UC_NUMBER = 2, ST_UC_SPACE = 3 };

/* A byte that is not part of valid UTF-8 decodes to ST_CP_BAD + byte: classed OTHER, in no
 * character class of any pattern. */
#define ST_CP_BAD 0x110000u

/* Decodes one code point at s[0..n) (n > 0), strictly (no overlongs, surrogates or values past
 * U+10FFFF). Returns its length in bytes (1..4); an invalid byte gives ST_CP_BAD + byte and 1. */
int st_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);
/* Class of a code point (ST_UC_*). */
int st_uni_class(uint32_t cp);
/* In the deepseek-llm cased-letter class. */
int st_uni_deepseek_letter(uint32_t cp);

extern const uint32_t st_uni_class_runs[];
extern const int32_t st_uni_n_class_runs;
extern const uint8_t st_uni_ascii_class[128];
extern const uint32_t st_uni_deepseek_letters[][2];
extern const int32_t st_uni_n_deepseek_letters;

/* Splits code points cps[0..n) with classes cls[0..n) (st_uni_class) into pre-tokens. Writes the
 * end index of each pre-token, in order, to ends (capacity n) and returns their count.
 * scratch: n entries (at least 1). */
int64_t st_pre_split(st_pre_kind pre, const uint32_t *cps, const uint8_t *cls, int64_t n,
                     int64_t *ends, int64_t *scratch);

#endif /* ST_TOK_H */
