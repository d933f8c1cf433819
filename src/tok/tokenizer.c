/*
 * tokenizer.c: loading a tokenizer from the tokenizer.ggml.* keys of a GGUF file (FORMATS.md b.4),
 * the piece -> id hash table (tok_vocab.c), special tokens, and st_tokenize, which splits the text
 * around user-defined tokens and hands each text fragment to the SentencePiece (tok_spm.c) or
 * byte-level BPE (tok_bpe.c) algorithm. Every value read from the file is checked; bad data
 * gives an error naming the file and the key.
 */
#include "io/gguf_internal.h"
#include "tok/tok.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Longest text st_tokenize accepts: symbol positions are 32-bit. */
#define ST_TOK_MAX_TEXT ((size_t)1 << 30)

static const char *gguf_type_str(st_gguf_type ty) {
    static const char *names[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                  "int32",  "float32", "bool",   "string", "array",
                                  "uint64", "int64",   "float64"};
    return (unsigned)ty < sizeof names / sizeof names[0] ? names[ty] : "unknown";
}

/* A numeric array of exactly n elements, or an error naming the key. */
static st_status numeric_array(const st_gguf *g, const char *name, const char *key, int64_t n,
                               int64_t *kv) {
    *kv = st_gguf_find(g, key);
    if (*kv < 0)
        return ST_OK;
    st_gguf_type at = st_gguf_arr_type(g, *kv);
    if (st_gguf_kv_type(g, *kv) != ST_GGUF_ARRAY || at == ST_GGUF_STRING || at == ST_GGUF_ARRAY)
        return st_fail(ST_ERR_FORMAT, "%s: %s must be a numeric array, found %s%s%s", name, key,
                       gguf_type_str(st_gguf_kv_type(g, *kv)),
                       st_gguf_kv_type(g, *kv) == ST_GGUF_ARRAY ? " of " : "",
                       st_gguf_kv_type(g, *kv) == ST_GGUF_ARRAY ? gguf_type_str(at) : "");
    if (st_gguf_arr_len(g, *kv) != n)
        return st_fail(ST_ERR_FORMAT,
                       "%s: %s has %" PRId64 " entries, tokenizer.ggml.tokens %" PRId64, name, key,
                       st_gguf_arr_len(g, *kv), n);
    return ST_OK;
}

/* A special token id: absent keeps *id; -1 / 0xFFFFFFFF mean none; otherwise it must be a
 * valid id when `required_in_range`, and is dropped (none) when not. */
static st_status special_id(const st_tokenizer *t, const st_gguf *g, const char *name,
                            const char *key, int required_in_range, int32_t *id) {
    if (st_gguf_find(g, key) < 0)
        return ST_OK;
    int64_t v;
    st_status s = st_gguf_get_i64(g, key, &v);
    if (s)
        return s;
    if (v == -1 || v == (int64_t)UINT32_MAX) {
        *id = -1;
    } else if (v < 0 || v >= t->n_vocab) {
        if (required_in_range)
            return st_fail(ST_ERR_FORMAT,
                           "%s: %s = %" PRId64 " is outside the vocabulary (%d tokens)", name, key,
                           v, t->n_vocab);
        *id = -1;
    } else {
        *id = (int32_t)v;
    }
    return ST_OK;
}

static st_status opt_bool(const st_gguf *g, const char *key, int *out) {
    if (st_gguf_find(g, key) < 0)
        return ST_OK;
    return st_gguf_get_bool(g, key, out);
}

static int str_is(st_gguf_str s, const char *lit) {
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

/* Pre-tokenizer names of llama.cpp that use one of the splits implemented here. */
static st_status pick_pre(st_tokenizer *t, const st_gguf *g, const char *name) {
    st_gguf_str p = {"default", 7};
    if (st_gguf_find(g, "tokenizer.ggml.pre") >= 0) {
        st_status s = st_gguf_get_str(g, "tokenizer.ggml.pre", &p);
        if (s)
            return s;
    }
    static const struct {
        const char *name;
        st_pre_kind pre;
        int ignore_merges, add_bos;
    } names[] = {
        {"default", ST_PRE_GPT2, 0, 0},     {"gpt-2", ST_PRE_GPT2, 0, 0},
        {"gpt2", ST_PRE_GPT2, 0, 0},        {"mpt", ST_PRE_GPT2, 0, 0},
        {"olmo", ST_PRE_GPT2, 0, 0},        {"phi-2", ST_PRE_GPT2, 0, 0},
        {"roberta-bpe", ST_PRE_GPT2, 0, 0}, {"jais", ST_PRE_GPT2, 0, 0},
        {"llama-bpe", ST_PRE_LLAMA3, 1, 1}, {"llama3", ST_PRE_LLAMA3, 1, 1},
        {"llama-v3", ST_PRE_LLAMA3, 1, 1},  {"falcon3", ST_PRE_LLAMA3, 1, 1},
        {"dbrx", ST_PRE_LLAMA3, 0, 0},      {"smaug-bpe", ST_PRE_LLAMA3, 0, 0},
        {"qwen2", ST_PRE_QWEN2, 0, 0},      {"stablelm2", ST_PRE_QWEN2, 0, 0},
        {"megrez", ST_PRE_QWEN2, 0, 0},     {"deepseek-llm", ST_PRE_DEEPSEEK, 0, 0},
        {"smollm", ST_PRE_SMOLLM, 0, 0},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (str_is(p, names[i].name)) {
            t->pre = names[i].pre;
            t->ignore_merges = names[i].ignore_merges;
            t->add_bos = names[i].add_bos;
            return ST_OK;
        }
    }
    return st_fail(ST_ERR_UNSUPPORTED,
                   "%s: unsupported pre-tokenizer tokenizer.ggml.pre = \"%.*s\" (supported: "
                   "gpt-2, llama-bpe, qwen2, deepseek-llm, smollm and their aliases)",
                   name, (int)(p.len > 64 ? 64 : p.len), p.ptr);
}

/* Checks tokenizer.ggml.tokens (kv index): sets t->n_vocab and the bytes of all pieces, each
 * with its NUL. */
static st_status size_pieces(st_tokenizer *t, const st_gguf *g, const char *name, int64_t kv,
                             size_t *text_bytes) {
    const char *key = "tokenizer.ggml.tokens";
    if (st_gguf_kv_type(g, kv) != ST_GGUF_ARRAY || st_gguf_arr_type(g, kv) != ST_GGUF_STRING) {
        st_gguf_type ty = st_gguf_kv_type(g, kv);
        return st_fail(ST_ERR_FORMAT, "%s: %s must be an array of strings, found %s%s%s", name, key,
                       gguf_type_str(ty), ty == ST_GGUF_ARRAY ? " of " : "",
                       ty == ST_GGUF_ARRAY ? gguf_type_str(st_gguf_arr_type(g, kv)) : "");
    }
    int64_t n = st_gguf_arr_len(g, kv);
    if (n <= 0 || n >= INT32_MAX)
        return st_fail(ST_ERR_FORMAT, "%s: %s has %" PRId64 " entries", name, key, n);
    t->n_vocab = (int32_t)n;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        st_gguf_str s;
        st_status st = st_gguf_arr_str(g, kv, i, &s);
        if (st)
            return st;
        if (!st_add_size(total, (size_t)s.len + 1, &total))
            return st_fail(ST_ERR_FORMAT, "%s: %s is too large", name, key);
    }
    *text_bytes = total;
    return ST_OK;
}

static void read_pieces(st_tokenizer *t, const st_gguf *g, int64_t kv) {
    int64_t n = t->n_vocab;
    size_t o = 0;
    for (int64_t i = 0; i < n; i++) {
        st_gguf_str s;
        st_gguf_arr_str(g, kv, i, &s);
        t->off[i] = o;
        memcpy(t->text + o, s.ptr, s.len);
        o += s.len;
        t->text[o++] = 0;
    }
    t->off[n] = o;
}

static st_status read_scores_types(st_tokenizer *t, const st_gguf *g, const char *name) {
    int64_t n = t->n_vocab, kv;
    memset(t->type, ST_TT_NORMAL, (size_t)n);
    st_status s = numeric_array(g, name, "tokenizer.ggml.scores", n, &kv);
    if (s)
        return s;
    for (int64_t i = 0; kv >= 0 && i < n; i++) {
        double d;
        st_gguf_arr_num(g, kv, i, &d);
        t->score[i] = (float)d;
    }
    s = numeric_array(g, name, "tokenizer.ggml.token_type", n, &kv);
    if (s)
        return s;
    t->has_types = kv >= 0;
    for (int64_t i = 0; kv >= 0 && i < n; i++) {
        double d;
        st_gguf_arr_num(g, kv, i, &d);
        t->type[i] = (d >= ST_TT_NORMAL && d <= ST_TT_BYTE) ? (uint8_t)d : ST_TT_UNDEFINED;
    }
    return ST_OK;
}

/* "<0xHH>" -> HH, else -1. */
static int byte_piece(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                         : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Appends the bytes token id decodes to (NULL dst: just counts). */
static size_t decode_piece(const st_tokenizer *t, int32_t id, char *dst) {
    size_t n;
    const char *s = st_tok_text(t, id, &n);
    int ty = t->type[id];
    if (ty == ST_TT_CONTROL || ty == ST_TT_UNKNOWN || ty == ST_TT_UNUSED || ty == ST_TT_UNDEFINED)
        return 0;
    if (ty == ST_TT_USER) {
        if (dst)
            memcpy(dst, s, n);
        return n;
    }
    if (t->kind == ST_TOK_SPM) {
        /* byte pieces; without token types (llama2.c exports) any "<0xHH>" piece is one */
        int b = (ty == ST_TT_BYTE || !t->has_types) ? byte_piece(s, n) : -1;
        if (b >= 0) {
            if (dst)
                dst[0] = (char)b;
            return 1;
        }
        size_t k = 0;
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                if (dst)
                    dst[k] = ' ';
                k++;
                i += 3;
            } else {
                if (dst)
                    dst[k] = s[i];
                k++;
                i++;
            }
        }
        return k;
    }
    /* byte-level BPE: alphabet characters back to bytes; anything else is kept as written */
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = st_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        int b = st_tok_cp_byte(cp);
        if (b >= 0) {
            if (dst)
                dst[k] = (char)b;
            k++;
        } else {
            if (dst)
                memcpy(dst + k, s + i, (size_t)l);
            k += (size_t)l;
        }
        i += (size_t)l;
    }
    return k;
}

/* t->dec has room for off[n_vocab] bytes: a token decodes to at most the bytes of its piece
 * ("<0xHH>", "▁" and alphabet characters shrink, nothing grows), and every piece has a NUL. */
static st_status build_decoded(st_tokenizer *t, const char *name) {
    size_t total = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->dec_off[id] = total;
        size_t n = decode_piece(t, id, NULL);
        total += n;
        if (n > t->max_dec)
            t->max_dec = n;
    }
    t->dec_off[t->n_vocab] = total;
    if (total >= t->off[t->n_vocab])
        return st_fail(ST_ERR_FORMAT, "%s: decoded vocabulary (%zu bytes) outgrows its pieces",
                       name, total);
    for (int32_t id = 0; id < t->n_vocab; id++)
        decode_piece(t, id, t->dec + t->dec_off[id]);
    return ST_OK;
}

/* End-of-generation tokens found by their text, as llama.cpp does; they become control tokens
 * (so they are not partitioned as user-defined text and decode to nothing). */
static void mark_eog(st_tokenizer *t, int32_t eot, int32_t eom) {
    static const char *eog_text[] = {"<|eot_id|>",    "<|im_end|>", "<|end|>", "<end_of_turn>",
                                     "<|endoftext|>", "<|eom_id|>", "<EOT>"};
    for (size_t i = 0; i < sizeof eog_text / sizeof eog_text[0]; i++) {
        int32_t id = st_tok_find(t, eog_text[i], strlen(eog_text[i]));
        if (id >= 0) {
            t->eog[id] = 1;
            t->type[id] = ST_TT_CONTROL;
        }
    }
    if (t->eos >= 0)
        t->eog[t->eos] = 1;
    if (eot >= 0)
        t->eog[eot] = 1;
    if (eom >= 0)
        t->eog[eom] = 1;
}

/* t->user has room for n_vocab ids. */
static void build_user_list(st_tokenizer *t) {
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->type[id] != ST_TT_USER || t->off[id + 1] - t->off[id] <= 1)
            continue;
        /* insertion sort: longest first, then by id */
        size_t len = t->off[id + 1] - t->off[id];
        int32_t j = t->n_user++;
        while (j > 0 && t->off[t->user[j - 1] + 1] - t->off[t->user[j - 1]] < len) {
            t->user[j] = t->user[j - 1];
            j--;
        }
        t->user[j] = id;
    }
}

static void build_byte_table(st_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        int32_t id = -1;
        if (t->kind == ST_TOK_SPM) {
            char s[8];
            snprintf(s, sizeof s, "<0x%02X>", b);
            id = st_tok_find(t, s, 6);
            if (id < 0) {
                char c = (char)b;
                id = st_tok_find(t, &c, 1);
            }
            if (id < 0)
                id = t->unk;
        } else {
            uint32_t cp = st_tok_byte_cp((uint8_t)b);
            char s[2];
            size_t n = 1;
            if (cp < 0x80) {
                s[0] = (char)cp;
            } else {
                s[0] = (char)(0xC0 | (cp >> 6));
                s[1] = (char)(0x80 | (cp & 0x3F));
                n = 2;
            }
            id = st_tok_find(t, s, n);
        }
        t->byte_tok[b] = id;
    }
}

/* tokenizer.ggml.model (and for gpt2 the pre-tokenizer): the kind and its defaults. */
static st_status read_model(st_tokenizer *t, const st_gguf *g, const char *name) {
    st_gguf_str model;
    if (st_gguf_find(g, "tokenizer.ggml.model") < 0)
        return st_fail(ST_ERR_FORMAT, "%s: no tokenizer (key tokenizer.ggml.model is missing)",
                       name);
    st_status s = st_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (s)
        return s;
    if (str_is(model, "llama")) {
        t->kind = ST_TOK_SPM;
        t->add_bos = 1;
        t->add_space_prefix = 1;
        return ST_OK;
    }
    if (str_is(model, "gpt2")) {
        t->kind = ST_TOK_BPE;
        return pick_pre(t, g, name);
    }
    return st_fail(ST_ERR_UNSUPPORTED,
                   "%s: unsupported tokenizer.ggml.model \"%.*s\" (supported: llama, gpt2)", name,
                   (int)(model.len > 64 ? 64 : model.len), model.ptr);
}

/* The tokenizer's one block: the struct, then every table, all sized by the vocabulary (the
 * first pass sizes, the second carves; core.h). text_bytes: all pieces with their NULs. */
static void tok_layout(st_plan *pl, st_tokenizer *t, size_t text_bytes) {
    const size_t n = (size_t)t->n_vocab;
    st_plan_take(pl, 1, sizeof *t);
    t->text = st_plan_take(pl, text_bytes, 1);
    t->off = st_plan_take(pl, n + 1, sizeof *t->off);
    t->score = st_plan_take(pl, n, sizeof *t->score);
    t->type = st_plan_take(pl, n, 1);
    t->eog = st_plan_take(pl, n, 1);
    t->map = st_plan_take(pl, t->map_mask + 1, sizeof *t->map);
    t->merges = t->merge_mask ? st_plan_take(pl, t->merge_mask + 1, sizeof *t->merges) : NULL;
    t->dec_off = st_plan_take(pl, n + 1, sizeof *t->dec_off);
    t->dec = st_plan_take(pl, text_bytes, 1); /* see build_decoded */
    t->user = st_plan_take(pl, n, sizeof *t->user);
}

st_status st_tokenizer_load(const st_gguf *g, st_tokenizer **out) {
    if (!out)
        return st_fail(ST_ERR_INVALID, "st_tokenizer_load: out is NULL");
    *out = NULL;
    if (!g)
        return st_fail(ST_ERR_INVALID, "st_tokenizer_load: no GGUF file");
    const char *name = st_gguf_name(g);
    /* What sizes the tables, read into h before the block exists. */
    st_tokenizer h = {0};
    st_status s = read_model(&h, g, name);
    if (s)
        return s;
    int64_t kv = st_gguf_find(g, "tokenizer.ggml.tokens"), mk = -1;
    if (kv < 0)
        return st_fail(ST_ERR_FORMAT, "%s: key tokenizer.ggml.tokens is missing", name);
    size_t text_bytes = 0;
    if ((s = size_pieces(&h, g, name, kv, &text_bytes)))
        return s;
    uint64_t cap = 16;
    while (cap < (uint64_t)h.n_vocab * 2)
        cap *= 2;
    h.map_mask = cap - 1;
    if (h.kind == ST_TOK_BPE) {
        mk = st_gguf_find(g, "tokenizer.ggml.merges");
        if (mk < 0)
            return st_fail(ST_ERR_FORMAT,
                           "%s: key tokenizer.ggml.merges is missing (needed by a gpt2 tokenizer)",
                           name);
        if ((s = st_tok_merges_mask(g, mk, name, &h.merge_mask)))
            return s;
    } else if ((mk = st_gguf_find(g, "tokenizer.ggml.merges")) >= 0) {
        /* a Hugging Face BPE with byte fallback (hf_gguf.c writes its merges): merged by rank */
        if ((s = st_tok_merges_mask(g, mk, name, &h.merge_mask)))
            return s;
    }
    st_plan pl = {0};
    st_tokenizer sizing = h;
    tok_layout(&pl, &sizing, text_bytes);
    st_tokenizer *t = st_plan_alloc(&pl);
    if (!t)
        return st_fail(ST_ERR_NOMEM, "%s: out of memory for the tokenizer (%d tokens, %zu bytes)",
                       name, h.n_vocab, pl.off);
    *t = h;
    tok_layout(&pl, t, text_bytes);

    read_pieces(t, g, kv);
    if ((s = read_scores_types(t, g, name)))
        goto fail;
    st_tok_build_map(t);

    /* special tokens: llama.cpp's defaults for SPM, none for BPE */
    t->bos = t->kind == ST_TOK_SPM && t->n_vocab > 1 ? 1 : -1;
    t->eos = t->kind == ST_TOK_SPM && t->n_vocab > 2 ? 2 : -1;
    t->unk = t->kind == ST_TOK_SPM ? 0 : -1;
    int32_t eot = -1, eom = -1;
    if ((s = special_id(t, g, name, "tokenizer.ggml.bos_token_id", 1, &t->bos)) ||
        (s = special_id(t, g, name, "tokenizer.ggml.eos_token_id", 1, &t->eos)) ||
        (s = special_id(t, g, name, "tokenizer.ggml.unknown_token_id", 0, &t->unk)) ||
        (s = special_id(t, g, name, "tokenizer.ggml.eot_token_id", 0, &eot)) ||
        (s = special_id(t, g, name, "tokenizer.ggml.eom_token_id", 0, &eom)) ||
        (s = opt_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos)) ||
        (s = opt_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix)))
        goto fail;
    if (t->kind == ST_TOK_BPE)
        t->add_space_prefix = 0; /* only the SentencePiece path prepends a space */
    mark_eog(t, eot, eom);
    if (mk >= 0 && (s = st_tok_load_merges(t, g, mk, name)))
        goto fail;
    build_byte_table(t);
    build_user_list(t);
    if ((s = build_decoded(t, name)))
        goto fail;
    *out = t;
    return ST_OK;
fail:
    st_tokenizer_free(t);
    return s;
}

void st_tokenizer_free(st_tokenizer *t) {
    st_free_aligned(t); /* the struct heads the one block that holds every table */
}

int32_t st_tokenizer_n_vocab(const st_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t st_tokenizer_bos(const st_tokenizer *t) { return t ? t->bos : -1; }
int32_t st_tokenizer_eos(const st_tokenizer *t) { return t ? t->eos : -1; }
int st_tokenizer_add_bos_default(const st_tokenizer *t) { return t ? t->add_bos : 0; }

int st_tokenizer_is_eog(const st_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && t->eog[id];
}

const char *st_tokenizer_piece(const st_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab)
        return NULL;
    size_t n;
    const char *s = st_tok_text(t, id, &n);
    if (len)
        *len = n;
    return s;
}

/* A fragment of the text: bytes [off, off+len), or a user-defined token (id >= 0). */
typedef struct frag {
    size_t off, len;
    int32_t id;
} frag;

/* First occurrence of p[0..n) in s[0..m), or -1. */
static int64_t find_bytes(const char *s, size_t m, const char *p, size_t n) {
    if (n == 0 || n > m)
        return -1;
    for (size_t i = 0; i + n <= m;) {
        const char *c = memchr(s + i, p[0], m - n + 1 - i);
        if (!c)
            return -1;
        i = (size_t)(c - s);
        if (memcmp(c, p, n) == 0)
            return (int64_t)i;
        i++;
    }
    return -1;
}

/* Splits the text around user-defined pieces, longest piece first (llama.cpp's order). */
static st_status partition(const st_tokenizer *t, const char *text, size_t len, frag **out,
                           int64_t *n_out) {
    int64_t n = 1, cap = 8;
    frag *f = st_malloc((size_t)cap * sizeof *f);
    if (!f)
        return st_fail(ST_ERR_NOMEM, "tokenize: out of memory");
    f[0] = (frag){0, len, -1};
    for (int32_t u = 0; u < t->n_user; u++) {
        size_t pn;
        const char *p = st_tok_text(t, t->user[u], &pn);
        for (int64_t i = 0; i < n; i++) {
            if (f[i].id >= 0)
                continue;
            int64_t at = find_bytes(text + f[i].off, f[i].len, p, pn);
            if (at < 0)
                continue;
            if (n + 2 > cap) {
                cap *= 2;
                frag *nf = st_realloc(f, (size_t)cap * sizeof *f);
                if (!nf) {
                    st_free(f);
                    return st_fail(ST_ERR_NOMEM, "tokenize: out of memory");
                }
                f = nf;
            }
            /* [left][token][right]: the right part is examined next in this loop */
            frag left = {f[i].off, (size_t)at, -1};
            frag tok = {f[i].off + (size_t)at, pn, t->user[u]};
            frag right = {tok.off + pn, f[i].len - (size_t)at - pn, -1};
            int64_t add = (left.len > 0) + (right.len > 0);
            memmove(&f[i + 1 + add], &f[i + 1], (size_t)(n - i - 1) * sizeof *f);
            int64_t k = i;
            if (left.len > 0)
                f[k++] = left;
            f[k++] = tok;
            if (right.len > 0)
                f[k] = right;
            n += add;
            i = k - 1; /* continue with the right part (or what follows) */
        }
    }
    *out = f;
    *n_out = n;
    return ST_OK;
}

st_status st_tokenize(const st_tokenizer *t, const char *text, size_t len, int add_bos,
                      int32_t *out, int64_t cap, int64_t *n_out) {
    if (!t || !n_out || (!text && len > 0) || cap < 0 || (!out && cap > 0))
        return st_fail(ST_ERR_INVALID, "st_tokenize: bad argument");
    *n_out = 0;
    if (len > ST_TOK_MAX_TEXT)
        return st_fail(ST_ERR_INVALID,
                       "st_tokenize: text of %zu bytes is longer than the %zu "
                       "supported",
                       len, ST_TOK_MAX_TEXT);
    if (add_bos && t->bos < 0)
        return st_fail(ST_ERR_INVALID, "st_tokenize: BOS requested but the vocabulary has none");
    st_tok_out o = {out, cap, 0};
    if (add_bos)
        st_tok_emit(&o, t->bos);
    st_status s = ST_OK;
    if (len > 0) {
        frag *f = NULL;
        int64_t nf = 0;
        if ((s = partition(t, text, len, &f, &nf)))
            return s;
        int prev_special = 1; /* SPM: a space is prepended after the start and each token */
        for (int64_t i = 0; i < nf && s == ST_OK; i++) {
            if (f[i].id >= 0) {
                st_tok_emit(&o, f[i].id);
                prev_special = 1;
            } else if (t->kind == ST_TOK_SPM) {
                s = st_tok_spm(t, text + f[i].off, f[i].len, t->add_space_prefix && prev_special,
                               &o);
                prev_special = 0;
            } else {
                s = st_tok_bpe(t, text + f[i].off, f[i].len, &o);
            }
        }
        st_free(f);
        if (s)
            return s;
    }
    *n_out = o.n;
    if (o.n > cap)
        return st_fail(ST_ERR_RANGE, "st_tokenize: %" PRId64 " tokens do not fit in %" PRId64, o.n,
                       cap);
    return ST_OK;
}

st_status st_tokenize_max(const st_tokenizer *t, const char *text, size_t len, int add_bos,
                          int64_t max_tokens, int32_t *out, int64_t cap, int64_t *n_out) {
    if (!t || !n_out || max_tokens < 0)
        return st_fail(ST_ERR_INVALID, "st_tokenize_max: bad argument");
    *n_out = 0;
    const size_t per = 2 * (t->max_dec > 4 ? t->max_dec : 4);
    if ((uint64_t)max_tokens < (uint64_t)(len / per)) { /* len > max_tokens * per */
        *n_out = max_tokens + 1;
        return st_fail(ST_ERR_RANGE,
                       "st_tokenize: a text of %zu bytes gives more than %" PRId64 " tokens", len,
                       max_tokens);
    }
    st_status s = st_tokenize(t, text, len, add_bos, out, cap, n_out);
    if (s && s != ST_ERR_RANGE)
        return s;
    if (*n_out > max_tokens)
        return st_fail(ST_ERR_RANGE,
                       "st_tokenize: a text of %zu bytes gives %" PRId64
                       " tokens, more than %" PRId64,
                       len, *n_out, max_tokens);
    return s;
}
