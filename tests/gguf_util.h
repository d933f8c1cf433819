/* gguf_util.h: helpers the GGUF test programs share (gguf_util.c). Include after cmocka.h. */
#ifndef ST_GGUF_UTIL_H
#define ST_GGUF_UTIL_H
#include "io/gguf_write.h"
#include "spectree.h"

#include <stddef.h>
#include <stdint.h>

/* Paths of stories260K.gguf and the two vocab-only files under the shared folder. */
const char *stories(void);
const char *spm(void);
const char *gpt2(void);

/* splitmix64: the next value, one below n (0 when n is 0), one in [-1, 1). */
uint64_t rng_next(uint64_t *s);
uint64_t rng_below(uint64_t *s, uint64_t n);
float rng_float(uint64_t *s);

/* s holds exactly the bytes of want. */
void assert_str_eq_n(st_gguf_str s, const char *want);
/* The u32 value of key (which must read). */
uint32_t get_u32(const st_gguf *g, const char *key);
/* The error of the last failing call names `name`. */
void assert_error_names(st_status s, const char *name);
/* A new writer (which must be created). */
st_gguf_writer *new_writer(void);

/* How build_small changes one metadata key. */
typedef enum {
    KEY_OK,
    KEY_MISSING,
    KEY_STRING,
    KEY_F32,
    KEY_ARRAY,
    KEY_BOOL,
    KEY_NEG,
    KEY_HUGE,
    KEY_ZERO,
    KEY_N
} key_mode;

typedef struct hparam {
    const char *key;
    uint32_t value; /* 0: a float key (value in fval) */
    float fval;
    const char *word; /* what an error about the key says at least */
} hparam;

enum { SM_DIM = 32, SM_FF = 64, SM_LAYERS = 2, SM_HEADS = 4, SM_KV = 2 };

enum { N_SMALL_HPARAMS = 9 };
/* The hyperparameter keys of build_small's model, in the order it writes them. */
extern const hparam small_hparams[N_SMALL_HPARAMS];

/* A 2-layer model with stories260K's tokenizer and every weight type (token_embd q8_0,
 * output q4_0, layer 0 f16, layer 1 bf16, norms f32) and general.alignment 64. Key `bad`
 * (or -1) gets `mode`. Returns a malloc'd image. */
void *build_small(const st_gguf *vocab, int bad, key_mode mode, size_t *size);
/* Logits of tokens {1, 5, 9} in a fresh session (n_vocab floats, malloc'd). */
float *eval_logits(const st_model *m);
#endif
