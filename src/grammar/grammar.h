/*
 * grammar.h: internal header of the grammar engine. gbnf.c parses GBNF text into a grammar over
 * bytes (code-point classes become UTF-8 byte sequences, repetitions and groups become rules);
 * match.c runs it as a set of parse stacks, one per way the input so far can continue, and
 * turns a set into the mask of the tokens that keep it alive; schema.c writes GBNF for a JSON
 * schema.
 */
#ifndef ST_GRAMMAR_H
#define ST_GRAMMAR_H

#include "core/core.h"

/* One element of an alternative. */
enum { ST_GEL_END = 0, ST_GEL_SET = 1, ST_GEL_REF = 2 };
typedef struct st_gel {
    int32_t kind; /* ST_GEL_* */
    int32_t arg;  /* SET: index into sets; REF: rule */
} st_gel;

typedef struct st_gset {
    uint32_t bits[8]; /* byte b is in the set when bit b%32 of bits[b/32] is set */
} st_gset;

struct st_grammar {
    st_gel *el; /* (n_el) every rule's alternatives, each ended by ST_GEL_END */
    int32_t n_el;
    st_gset *sets; /* (n_sets) */
    int32_t n_sets;
    int32_t n_rules;
    int32_t *alt_off; /* (n_rules + 1) rule r's alternatives are alts[alt_off[r] .. alt_off[r+1]) */
    int32_t *alts;    /* start positions in el */
    int32_t root;
};

static inline int st_gset_has(const st_gset *s, uint8_t b) {
    return (s->bits[b >> 5] >> (b & 31)) & 1;
}

/* A set of parse stacks: stacks concatenated as [depth, pos_0 .. pos_{depth-1}] (top last). A
 * stack of depth 0 means the input so far is a whole sentence of the grammar. */
typedef struct st_gstate {
    int32_t *buf;
    int64_t n, cap;   /* int32s used, allocated */
    int32_t n_stacks; /* 0: the input so far cannot be continued into a sentence */
} st_gstate;

/* The start state of g (the root's alternatives, expanded). */
st_status st_gstate_start(const st_grammar *g, st_gstate *out);
/* out = st advanced by byte c (out != st). */
st_status st_gstate_advance(const st_grammar *g, const st_gstate *st, uint8_t c, st_gstate *out);
int st_gstate_accepting(const st_gstate *st);
st_status st_gstate_copy(st_gstate *dst, const st_gstate *src);
void st_gstate_free(st_gstate *st);

/* Per-request matcher: the state after the committed tokens, the vocabulary as a byte trie and
 * a cache of masks by state. */
typedef struct st_gmatcher st_gmatcher;

/* m borrows g and t (both must outlive it); tokens are ids [0, n_tok). */
st_status st_gmatcher_create(const st_grammar *g, const st_tokenizer *t, int32_t n_tok,
                             st_gmatcher **out);
void st_gmatcher_free(st_gmatcher *m);
/* Commits token tok (end-of-generation tokens are ignored). */
st_status st_gmatcher_accept(st_gmatcher *m, int32_t tok);
/* Sets to -inf the logits (n_tok) of the tokens the grammar does not allow after the committed
 * tokens followed by path[0..n_path); the end-of-generation tokens are allowed only where the
 * grammar can end (or where no other token is allowed). A pure function of (logits, committed
 * tokens, path). */
st_status st_gmatcher_mask(st_gmatcher *m, const int32_t *path, int64_t n_path, float *logits);
/* 1 when the committed tokens followed by path[0..n_path) can still become a sentence (an
 * end-of-generation token in the path: when the grammar can end before it). */
int st_gmatcher_path_ok(st_gmatcher *m, const int32_t *path, int64_t n_path);

#endif
