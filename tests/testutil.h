/* testutil.h: small helpers shared by the test programs (paths to the repository's test data,
 * file reading). */
#ifndef ST_TESTUTIL_H
#define ST_TESTUTIL_H
#include <stddef.h>
#include <stdint.h>

#include "spectree.h"

/* Path of the repository's own data ("models/stories260K.gguf", "tests/data/tokenizer/..."),
 * in a static rotating buffer. */
const char *tu_data(const char *rel);
/* Reads a whole file; returns a malloc'd buffer (NUL-terminated) or NULL. */
char *tu_read_file(const char *path, size_t *size);

/* A synthetic EAGLE-1/2 head in the published layout (FORMATS.md §d.1), random weights. */
typedef struct tu_head {
    int32_t n_embd, n_vocab, n_head, n_head_kv, n_ff;
    int dtype;      /* st_sf_dtype of every tensor: ST_SF_F32, ST_SF_F16 or ST_SF_BF16 */
    uint64_t seed;  /* of the weights */
    float scale;    /* weights uniform in [-scale, scale] / sqrt(n_in) */
    int no_bias;    /* no fc.bias and "bias": false in config.json */
    int input_norm; /* with layers.0.input_layernorm.weight */
    int embed;      /* with embed_tokens.weight */
    /* a "bigram" head: embed_tokens = embed_values (n_vocab, n_embd), fc = [I | 0.1 I], no
     * bias, o_proj and down_proj zero, so its output is the token's row plus a tenth of the
     * feature (a head that drafts what embed_values' rows predict) */
    const float *embed_values;
    /* malformed heads: a tensor left out, one not in the layout added, one with a wrong shape,
     * one stored as I32 (names, or NULL) */
    const char *skip, *extra, *bad_shape, *bad_dtype;
} tu_head;

/* Creates directory dir (if needed) with config.json and model.safetensors of head h; returns 0
 * on success. */
int tu_write_eagle_head(const char *dir, const tu_head *h);

/* Overwrites element i (C order) of F32 tensor `name` in dir/model.safetensors with v (the data
 * offsets read from the file's header); 0 on success. */
int tu_poke_head_f32(const char *dir, const char *name, int64_t i, float v);

/* A synthetic EAGLE-3 head in the published layout (FORMATS.md §d.2), random weights. */
typedef struct tu_head3 {
    int32_t n_embd, n_vocab, n_draft, n_head, n_head_kv, n_ff;
    int32_t target_layers; /* the target's layer count (for the layer ids) */
    int32_t layer_ids[3];  /* eagle_aux_hidden_state_layer_ids written to config.json */
    int no_layer_ids;      /* leave them out (the loader's default) */
    int dtype;             /* ST_SF_F32, ST_SF_F16 or ST_SF_BF16 */
    uint64_t seed;
    float scale; /* weights uniform in [-scale, scale] / sqrt(n_in) */
    int embed;   /* with embed_tokens.weight */
    int no_t2d;  /* without t2d */
    /* the draft vocabulary: target id (i * n_vocab) / n_draft for draft id i, unless d2t (the
     * raw offsets, n_draft of them) or t2d (n_vocab bytes) are given */
    const int64_t *d2t;
    const uint8_t *t2d;
    const char *skip, *extra, *bad_shape, *bad_dtype; /* malformed heads, as tu_head */
    const char *config_extra; /* appended to config.json's object (", \"key\": value") */
} tu_head3;

/* Creates directory dir with config.json and model.safetensors of EAGLE-3 head h; 0 on
 * success. */
int tu_write_eagle3_head(const char *dir, const tu_head3 *h);

/* The result of running one of the project's programs. */
/* Generated tokens kept by tu_keep, an st_generate callback (the first 256). */
typedef struct tu_toks {
    int32_t t[256];
    int n;
} tu_toks;
int tu_keep(void *user, int32_t t);

/* train/eagle/inflate_head.py widens the committed head ST_SOURCE_DIR/head_rel as
 * spectree-mkmodel --inflate widens stories260K (128 x 384, 7 layers, F32; files in dir): on the
 * widened target the widened head must draft what the committed head drafts on target
 * (stories260K), greedy at K=1 S=4: the same text, speculative steps and accept histogram, with
 * more than 10 speculative steps. algo: ST_SPEC_EAGLE or ST_SPEC_EAGLE3. 0 if so, else -1
 * after a line on stderr saying what differed. */
int tu_inflated_head_drafts_alike(const st_model *target, const char *dir, const char *head_rel,
                                  int algo);

typedef struct tu_result {
    int code;        /* exit status; 128 + signal when killed */
    char *out, *err; /* what it printed (malloc'd; NULL if the capture could not be read) */
} tu_result;
/* Runs `BUILD_DIR/PROG ARGS` through the shell with standard input from the file `in`,
 * capturing stdout and stderr (in files of the build folder named after this process). */
tu_result tu_run(const char *prog, const char *args, const char *in);
void tu_result_free(tu_result *r);
#endif
