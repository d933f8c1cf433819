/*
 * hf_tok.c: a Hugging Face tokenizer.json (with tokenizer_config.json) as GGUF tokenizer keys,
 * the way llama.cpp's converter writes them:
 * - a BPE with byte fallback and the SentencePiece-style normalizer (prepend "▁", spaces to
 *   "▁"; or the equivalent Metaspace pre-tokenizer that does not split) becomes
 *   tokenizer.ggml.model "llama", with each piece's score minus the rank of the merge that
 *   makes it (plus one) and also the merges themselves, which spectree's tokenizer then applies
 *   by rank exactly as Hugging Face's BPE does (tok_spm.c);
 * - a byte-level BPE (a ByteLevel pre-tokenizer, alone or after the Split regex of Llama 3 or
 *   Qwen2) becomes "gpt2" with tokenizer.ggml.pre "gpt2", "llama-bpe" or "qwen2".
 * Added tokens are pieces of type CONTROL (special) or USER_DEFINED; ids no piece has become
 * "[PAD<id>]" pieces of type UNUSED. Anything else (another model type, normalizer, pre-tokenizer)
 * is refused with an error naming the file and the field.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/hf.h"

#include "core/core.h"

#include <jansson.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* Token types of tokenizer.ggml.token_type (FORMATS.md b.4). */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

static const char *const sp_mark = "\xE2\x96\x81"; /* U+2581 */

/* The Split regexes of Llama 3's and Qwen2's tokenizer.json (as JSON decodes them). */
static const char *const re_llama3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const re_qwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* optional: a missing file is no error (NULL, ST_OK); tokenizer_config.json is read so (its
 * integers as reals: model_max_length is often 1e30, past jansson's integers, and no integer
 * of it is used). */
static json_t *load_json(const char *path, int optional, st_status *s) {
    *s = ST_OK;
    struct stat st;
    if (stat(path, &st) != 0) {
        if (!optional)
            *s = st_fail(ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    json_error_t err;
    json_t *j = json_load_file(
        path, JSON_REJECT_DUPLICATES | (optional ? JSON_DECODE_INT_AS_REAL : 0), &err);
    if (!j) {
        for (char *c = err.text; *c; c++)
            if ((unsigned char)*c < 0x20)
                *c = '?';
        *s = st_fail(ST_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", path, err.text,
                     err.line, err.column);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        *s = st_fail(ST_ERR_FORMAT, "%s: not a JSON object", path);
        return NULL;
    }
    return j;
}

static int str_eq(const json_t *v, const char *lit) {
    return json_is_string(v) && strcmp(json_string_value(v), lit) == 0;
}

/* The type name of a tokenizer.json component object, or "null". */
static const char *comp_type(const json_t *v) {
    const json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
    return json_is_string(t) ? json_string_value(t) : json_is_null(v) || !v ? "null" : "?";
}

/* The SentencePiece-style text handling: *prefix = 1 when a "▁" is prepended. Accepted: the
 * normalizer Sequence [Prepend "▁", Replace " " -> "▁"] (or Replace alone) with no
 * pre-tokenizer, or no normalizer and a Metaspace pre-tokenizer with replacement "▁" that
 * does not split. */
static st_status spm_text(const char *path, const json_t *root, int *prefix) {
    const json_t *norm = json_object_get(root, "normalizer"),
                 *pre = json_object_get(root, "pre_tokenizer");
    *prefix = 0;
    if (norm && !json_is_null(norm)) {
        if (pre && !json_is_null(pre))
            return st_fail(ST_ERR_UNSUPPORTED,
                           "%s: field \"pre_tokenizer\" (%s) with a byte-fallback BPE is not "
                           "supported",
                           path, comp_type(pre));
        const json_t *list = json_object_get(norm, "normalizers");
        size_t n = str_eq(json_object_get(norm, "type"), "Sequence") ? json_array_size(list) : 1;
        int replaced = 0;
        for (size_t i = 0; i < n; i++) {
            const json_t *c = json_is_array(list) ? json_array_get(list, i) : norm;
            const char *ty = comp_type(c);
            if (strcmp(ty, "Prepend") == 0 && str_eq(json_object_get(c, "prepend"), sp_mark) &&
                !replaced && !*prefix) {
                *prefix = 1;
            } else if (strcmp(ty, "Replace") == 0 &&
                       str_eq(json_object_get(json_object_get(c, "pattern"), "String"), " ") &&
                       str_eq(json_object_get(c, "content"), sp_mark)) {
                replaced = 1;
            } else {
                return st_fail(ST_ERR_UNSUPPORTED,
                               "%s: field \"normalizer\": a %s normalizer is not supported "
                               "(Prepend \"\xE2\x96\x81\", Replace \" \")",
                               path, ty);
            }
        }
        if (!replaced)
            return st_fail(ST_ERR_UNSUPPORTED,
                           "%s: field \"normalizer\" does not replace spaces by "
                           "\"\xE2\x96\x81\" (not a SentencePiece-style BPE)",
                           path);
        return ST_OK;
    }
    if (strcmp(comp_type(pre), "Metaspace") == 0 &&
        str_eq(json_object_get(pre, "replacement"), sp_mark) &&
        !json_is_true(json_object_get(pre, "split"))) {
        const json_t *scheme = json_object_get(pre, "prepend_scheme");
        *prefix = scheme ? !str_eq(scheme, "never")
                         : !json_is_false(json_object_get(pre, "add_prefix_space"));
        return ST_OK;
    }
    return st_fail(ST_ERR_UNSUPPORTED,
                   "%s: field \"pre_tokenizer\" (%s) with a byte-fallback BPE is not supported "
                   "(expected the SentencePiece-style normalizer or a non-splitting Metaspace)",
                   path, comp_type(pre));
}

/* The byte-level pre-tokenizer's name in GGUF (tokenizer.ggml.pre). */
static st_status byte_level_pre(const char *path, const json_t *root, const char **pre_name) {
    /* Qwen2's NFC normalizer is accepted and not applied: text already in NFC (nearly all text)
     * tokenizes the same */
    const char *nt = comp_type(json_object_get(root, "normalizer"));
    if (strcmp(nt, "null") != 0 && strcmp(nt, "NFC") != 0)
        return st_fail(ST_ERR_UNSUPPORTED,
                       "%s: field \"normalizer\": a %s normalizer is not supported with a "
                       "byte-level BPE (none, NFC)",
                       path, nt);
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    const char *ty = comp_type(pre);
    if (json_is_true(json_object_get(pre, "add_prefix_space")))
        return st_fail(ST_ERR_UNSUPPORTED,
                       "%s: field \"pre_tokenizer.add_prefix_space\" = true is not supported",
                       path);
    if (strcmp(ty, "ByteLevel") == 0 && !json_is_false(json_object_get(pre, "use_regex"))) {
        *pre_name = "gpt2";
        return ST_OK;
    }
    const json_t *list = json_object_get(pre, "pretokenizers");
    if (strcmp(ty, "Sequence") == 0 && json_array_size(list) == 2) {
        const json_t *split = json_array_get(list, 0), *bl = json_array_get(list, 1);
        if (strcmp(comp_type(split), "Digits") == 0 &&
            json_is_true(json_object_get(split, "individual_digits")) &&
            strcmp(comp_type(bl), "ByteLevel") == 0 &&
            !json_is_false(json_object_get(bl, "use_regex"))) {
            *pre_name = "smollm"; /* SmolLM's: each digit, then GPT-2's regex */
            return ST_OK;
        }
        const json_t *re = json_object_get(json_object_get(split, "pattern"), "Regex");
        if (strcmp(comp_type(split), "Split") == 0 && strcmp(comp_type(bl), "ByteLevel") == 0 &&
            json_is_false(json_object_get(bl, "use_regex")) && json_is_string(re)) {
            if (strcmp(json_string_value(re), re_llama3) == 0) {
                *pre_name = "llama-bpe";
                return ST_OK;
            }
            if (strcmp(json_string_value(re), re_qwen2) == 0) {
                *pre_name = "qwen2";
                return ST_OK;
            }
            return st_fail(ST_ERR_UNSUPPORTED,
                           "%s: field \"pre_tokenizer\": the Split regex \"%.80s\" is not one "
                           "supported (Llama 3's, Qwen2's)",
                           path, json_string_value(re));
        }
    }
    return st_fail(ST_ERR_UNSUPPORTED,
                   "%s: field \"pre_tokenizer\" (%s) is not supported for a byte-level BPE "
                   "(ByteLevel; Split with Llama 3's or Qwen2's regex, or Digits, then ByteLevel)",
                   path, ty);
}

/* A token named by tokenizer_config.json's field (a string or {"content": ...}), or -1. */
static int64_t config_token(const json_t *cfg, const char *key, const json_t *vocab,
                            const json_t *added) {
    const json_t *v = cfg ? json_object_get(cfg, key) : NULL;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return -1;
    const char *s = json_string_value(v);
    size_t i;
    const json_t *a;
    json_array_foreach(added, i, a) {
        if (str_eq(json_object_get(a, "content"), s) && json_is_integer(json_object_get(a, "id")))
            return json_integer_value(json_object_get(a, "id"));
    }
    const json_t *id = json_object_get(vocab, s);
    return json_is_integer(id) ? json_integer_value(id) : -1;
}

/* The two pieces of merge i (a "left right" string or a [left, right] pair). */
static int merge_parts(const json_t *m, const char **l, size_t *nl, const char **r, size_t *nr) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
        if (!sp)
            return 0;
        *l = s;
        *nl = (size_t)(sp - s);
        *r = sp + 1;
        *nr = n - *nl - 1;
        return 1;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *l = json_string_value(json_array_get(m, 0));
        *nl = json_string_length(json_array_get(m, 0));
        *r = json_string_value(json_array_get(m, 1));
        *nr = json_string_length(json_array_get(m, 1));
        return 1;
    }
    return 0;
}

static const char *merge_name(const void *ctx, int64_t i) {
    return ((const st_gguf_str *)ctx)[i].ptr;
}

/* The conversion of parsed files (root: tokenizer.json, named path; cfg: tokenizer_config.json
 * or NULL). Takes both references. */
static st_status convert(const char *path, json_t *root, json_t *cfg, st_gguf_writer *w,
                         int64_t config_bos, int64_t config_eos) {
    st_status s = ST_OK;
    st_gguf_str *pieces = NULL;
    char **owned = NULL; /* "[PAD<id>]" pieces and merge strings built here */
    float *scores = NULL;
    int32_t *types = NULL;
    st_gguf_str *merges = NULL;
    int64_t n_vocab = 0, n_owned = 0, n_merges = 0;

    const json_t *model = json_object_get(root, "model");
    const json_t *vocab = json_object_get(model, "vocab"),
                 *mlist = json_object_get(model, "merges");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(model) || !str_eq(json_object_get(model, "type"), "BPE")) {
        s = st_fail(ST_ERR_UNSUPPORTED,
                    "%s: field \"model.type\" is \"%.32s\"; only BPE tokenizers are supported",
                    path, comp_type(model));
        goto done;
    }
    if (!json_is_object(vocab) || !json_is_array(mlist) ||
        (added && !json_is_array(added) && !json_is_null(added))) {
        s = st_fail(ST_ERR_FORMAT,
                    "%s: field \"model.vocab\" must be an object, \"model.merges\" and "
                    "\"added_tokens\" arrays",
                    path);
        goto done;
    }
    const int spm = json_is_true(json_object_get(model, "byte_fallback"));
    int prefix = 0;
    const char *pre_name = NULL;
    if (spm ? (s = spm_text(path, root, &prefix)) : (s = byte_level_pre(path, root, &pre_name)))
        goto done;
    if (!spm && strcmp(comp_type(json_object_get(root, "decoder")), "ByteLevel") != 0) {
        s = st_fail(ST_ERR_UNSUPPORTED,
                    "%s: field \"decoder\" (%s): a BPE without byte fallback must be byte-level "
                    "(ByteLevel decoder)",
                    path, comp_type(json_object_get(root, "decoder")));
        goto done;
    }
    /* ids: the vocabulary's and the added tokens' */
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= (1 << 24)) {
            s = st_fail(ST_ERR_FORMAT, "%s: field \"model.vocab\": \"%.32s\" has a bad id", path,
                        key);
            goto done;
        }
        if (json_integer_value(val) >= n_vocab)
            n_vocab = json_integer_value(val) + 1;
    }
    size_t ai;
    const json_t *a;
    json_array_foreach(added, ai, a) {
        const json_t *id = json_object_get(a, "id"), *c = json_object_get(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (1 << 24) || !json_is_string(c)) {
            s = st_fail(ST_ERR_FORMAT, "%s: field \"added_tokens\"[%zu] lacks an id or content",
                        path, ai);
            goto done;
        }
        if (json_integer_value(id) >= n_vocab)
            n_vocab = json_integer_value(id) + 1;
    }
    if (json_object_size(vocab) == 0) { /* added tokens alone cannot spell any text */
        s = st_fail(ST_ERR_FORMAT, "%s: field \"model.vocab\" is empty%s", path,
                    n_vocab ? " (there are only added tokens)" : "");
        goto done;
    }
    /* ids left unused become placeholder tokens: a few are seen (reserved ids), but an 85 KB
     * file whose one id of 10531111 asked for ten million of them took 1 GB and 3 s to convert */
    const int64_t defined = (int64_t)json_object_size(vocab) + (int64_t)json_array_size(added);
    if (n_vocab - defined > (defined > 1024 ? defined : 1024)) {
        s = st_fail(ST_ERR_FORMAT,
                    "%s: ids up to %" PRId64 " for %" PRId64
                    " tokens: more than half the ids would be unused",
                    path, n_vocab - 1, defined);
        goto done;
    }
    pieces = st_calloc((size_t)n_vocab, sizeof *pieces);
    scores = st_calloc((size_t)n_vocab, sizeof *scores);
    types = st_calloc((size_t)n_vocab, sizeof *types);
    owned = st_calloc((size_t)n_vocab + json_array_size(mlist), sizeof *owned);
    merges = st_calloc(json_array_size(mlist) + 1, sizeof *merges);
    if (!pieces || !scores || !types || !owned || !merges) {
        s = st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    json_object_foreach((json_t *)vocab, key, val) {
        int64_t id = json_integer_value(val);
        if (pieces[id].ptr) {
            s = st_fail(ST_ERR_FORMAT, "%s: field \"model.vocab\": id %" PRId64 " is used twice",
                        path, id);
            goto done;
        }
        pieces[id] = (st_gguf_str){key, strlen(key)};
        unsigned hex;
        char tail;
        types[id] =
            spm && strlen(key) == 6 && sscanf(key, "<0x%2X%c", &hex, &tail) == 2 && tail == '>'
                ? TT_BYTE
                : TT_NORMAL;
    }
    json_array_foreach(added, ai, a) {
        int64_t id = json_integer_value(json_object_get(a, "id"));
        const json_t *c = json_object_get(a, "content");
        if (pieces[id].ptr && (pieces[id].len != json_string_length(c) ||
                               memcmp(pieces[id].ptr, json_string_value(c), pieces[id].len))) {
            s = st_fail(ST_ERR_FORMAT,
                        "%s: field \"added_tokens\"[%zu]: id %" PRId64
                        " is \"%.32s\" in the vocabulary",
                        path, ai, id, pieces[id].ptr);
            goto done;
        }
        pieces[id] = (st_gguf_str){json_string_value(c), json_string_length(c)};
        types[id] = json_is_true(json_object_get(a, "special")) ? TT_CONTROL : TT_USER;
    }
    for (int64_t id = 0; id < n_vocab; id++) {
        if (pieces[id].ptr)
            continue;
        char buf[32];
        snprintf(buf, sizeof buf, "[PAD%" PRId64 "]", id);
        if (!(owned[n_owned++] = st_strdup(buf))) {
            s = st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        pieces[id] = (st_gguf_str){owned[n_owned - 1], strlen(buf)};
        types[id] = TT_UNUSED;
    }
    const int64_t unk = config_token(model, "unk_token", vocab, added);
    if (unk >= 0 && unk < n_vocab)
        types[unk] = TT_UNKNOWN;
    /* merges, as "left right"; an SPM piece's score is minus its merge's rank + 1 */
    size_t mi;
    const json_t *m;
    json_array_foreach(mlist, mi, m) {
        const char *l, *r;
        size_t nl, nr;
        if (!merge_parts(m, &l, &nl, &r, &nr)) {
            s = st_fail(ST_ERR_FORMAT,
                        "%s: field \"model.merges\"[%zu] is not two pieces (\"a b\" or [a, b])",
                        path, mi);
            goto done;
        }
        char *str = st_malloc(nl + nr + 2);
        if (!str) {
            s = st_fail(ST_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        memcpy(str, l, nl);
        str[nl] = 0;
        memcpy(str + nl + 1, r, nr);
        str[nl + 1 + nr] = 0;
        owned[n_owned++] = str;
        merges[n_merges++] = (st_gguf_str){str, nl + nr + 1};
        /* both pieces and their product are in the vocabulary, as Hugging Face's BPE requires
         * (a merge that can never apply would leave text only <unk> can spell) */
        const char *missing = !json_object_get(vocab, str)            ? "the left piece"
                              : !json_object_get(vocab, str + nl + 1) ? "the right piece"
                                                                      : NULL;
        memmove(str + nl, str + nl + 1, nr + 1); /* the product's text, temporarily */
        const json_t *id = json_object_get(vocab, str);
        if (!missing && !id)
            missing = "the merged piece";
        if (missing) {
            s = st_fail(ST_ERR_FORMAT,
                        "%s: field \"model.merges\"[%zu] (\"%.*s %.*s\"): %s is not in "
                        "\"model.vocab\"",
                        path, mi, (int)(nl > 32 ? 32 : nl), l, (int)(nr > 32 ? 32 : nr), r,
                        missing);
            goto done;
        }
        if (spm && scores[json_integer_value(id)] == 0.0f)
            scores[json_integer_value(id)] = -(float)(mi + 1);
        memmove(str + nl + 1, str + nl, nr + 1);
        str[nl] = ' ';
    }
    /* a pair merged twice has two ranks (Hugging Face keeps the last, llama.cpp the first) */
    st_name_index ix = {0};
    int64_t dup = -1;
    if ((s = st_name_index_build(&ix, n_merges, merge_name, merges, &dup)))
        goto done;
    if (dup >= 0)
        s = st_fail(ST_ERR_FORMAT,
                    "%s: field \"model.merges\"[%" PRId64 "] (\"%.64s\") repeats merges[%" PRId64
                    "]",
                    path, dup, merges[dup].ptr, st_name_index_find(&ix, merges[dup].ptr));
    st_name_index_free(&ix);
    if (s)
        goto done;
    int64_t bos = config_token(cfg, "bos_token", vocab, added),
            eos = config_token(cfg, "eos_token", vocab, added),
            pad = config_token(cfg, "pad_token", vocab, added);
    if (bos < 0)
        bos = config_bos;
    if (eos < 0)
        eos = config_eos;
    /* BOS is added when tokenizer_config.json says so, else when the post-processor's
     * single-sequence template starts with a special token (Llama 3) */
    int add_bos = 0;
    const json_t *ab = cfg ? json_object_get(cfg, "add_bos_token") : NULL;
    if (json_is_boolean(ab)) {
        add_bos = json_is_true(ab);
    } else {
        const json_t *pp = json_object_get(root, "post_processor"), *single = NULL;
        if (strcmp(comp_type(pp), "Sequence") == 0) {
            size_t k;
            const json_t *p;
            json_array_foreach(json_object_get(pp, "processors"), k, p) {
                if (strcmp(comp_type(p), "TemplateProcessing") == 0)
                    single = json_object_get(p, "single");
            }
        } else if (strcmp(comp_type(pp), "TemplateProcessing") == 0) {
            single = json_object_get(pp, "single");
        }
        add_bos = json_object_get(json_array_get(single, 0), "SpecialToken") != NULL;
    }
    const json_t *tmpl = cfg ? json_object_get(cfg, "chat_template") : NULL;
    if (json_is_array(tmpl)) { /* [{"name": ..., "template": ...}]: the default one */
        size_t k;
        const json_t *t, *found = NULL;
        json_array_foreach(tmpl, k, t) {
            if (str_eq(json_object_get(t, "name"), "default"))
                found = json_object_get(t, "template");
        }
        tmpl = found;
    }
    if ((s = st_gguf_writer_add_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2")) ||
        (s = st_gguf_writer_add_str(w, "tokenizer.ggml.pre", spm ? "default" : pre_name)) ||
        (s = st_gguf_writer_add_arr_strn(w, "tokenizer.ggml.tokens", pieces, n_vocab)) ||
        (spm && (s = st_gguf_writer_add_arr(w, "tokenizer.ggml.scores", ST_GGUF_FLOAT32, scores,
                                            n_vocab))) ||
        (s = st_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", ST_GGUF_INT32, types,
                                    n_vocab)) ||
        (s = st_gguf_writer_add_arr_strn(w, "tokenizer.ggml.merges", merges, n_merges)) ||
        (bos >= 0 && bos < n_vocab &&
         (s = st_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos))) ||
        (eos >= 0 && eos < n_vocab &&
         (s = st_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos))) ||
        (unk >= 0 && unk < n_vocab &&
         (s = st_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)unk))) ||
        (pad >= 0 && pad < n_vocab &&
         (s = st_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad))) ||
        (s = st_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", add_bos)) ||
        (spm && (s = st_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", prefix))) ||
        (json_is_string(tmpl) &&
         (s = st_gguf_writer_add_str(w, "tokenizer.chat_template", json_string_value(tmpl)))))
        goto done;
done:
    for (int64_t i = 0; i < n_owned; i++)
        st_free(owned[i]);
    st_free(owned);
    st_free(pieces);
    st_free(scores);
    st_free(types);
    st_free(merges);
    json_decref(cfg);
    json_decref(root);
    return s;
}

st_status st_hf_tokenizer_to_gguf(const char *dir, st_gguf_writer *w, int64_t config_bos,
                                  int64_t config_eos) {
    char path[4096], cpath[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    st_status s;
    json_t *root = load_json(path, 0, &s), *cfg = NULL;
    if (!root)
        return s;
    cfg = load_json(cpath, 1, &s);
    if (s) {
        json_decref(root);
        return s;
    }
    return convert(path, root, cfg, w, config_bos, config_eos);
}

st_status st_hf_tokenizer_to_gguf_memory(const char *json, size_t len, const char *name,
                                         st_gguf_writer *w) {
    json_error_t err;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        for (char *c = err.text; *c; c++)
            if ((unsigned char)*c < 0x20)
                *c = '?';
        return st_fail(ST_ERR_FORMAT, "%s: not valid JSON: %s (line %d, column %d)", name, err.text,
                       err.line, err.column);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return st_fail(ST_ERR_FORMAT, "%s: not a JSON object", name);
    }
    return convert(name, root, NULL, w, -1, -1);
}
