/*
 * tok_pre.c: the pre-tokenizers of byte-level BPE vocabularies, i.e. the Split regexes of their
 * tokenizer.json, written out by hand as matchers over code point classes (no regex engine).
 * Each matcher returns the length of the match of the whole alternation at one position, with
 * the regex's leftmost-alternative, greedy-with-backtracking semantics; splitting then follows
 * Hugging Face's "Isolated" behaviour: matches and the gaps between them are the pre-tokens.
 * Also the strict UTF-8 decoder and the code point class lookup.
 */
#include "tok/tok.h"

int st_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int len;
    uint32_t v, lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b >= 0xC2 && b <= 0xDF) {
        len = 2;
        v = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        v = b & 0x0F;
        if (b == 0xE0)
            lo = 0xA0; /* overlong */
        else if (b == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        v = b & 0x07;
        if (b == 0xF0)
            lo = 0x90; /* overlong */
        else if (b == 0xF4)
            hi = 0x8F; /* past U+10FFFF */
    } else {
        *cp = ST_CP_BAD + b;
        return 1;
    }
    if ((size_t)len > n || s[1] < lo || s[1] > hi) {
        *cp = ST_CP_BAD + b;
        return 1;
    }
    v = (v << 6) | (s[1] & 0x3F);
    for (int i = 2; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = ST_CP_BAD + b;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

int st_uni_class(uint32_t cp) {
    if (cp < 128)
        return st_uni_ascii_class[cp];
    if (cp > 0x10FFFF)
        return ST_UC_OTHER;
    int32_t lo = 0, hi = st_uni_n_class_runs - 1; /* last run starting at or before cp */
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if ((st_uni_class_runs[mid] >> 2) <= cp)
            lo = mid;
        else
            hi = mid - 1;
    }
    return (int)(st_uni_class_runs[lo] & 3);
}

int st_uni_deepseek_letter(uint32_t cp) {
    int32_t lo = 0, hi = st_uni_n_deepseek_letters - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (cp < st_uni_deepseek_letters[mid][0])
            hi = mid - 1;
        else if (cp > st_uni_deepseek_letters[mid][1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

/* Code points and their classes over one fragment. */
typedef struct span {
    const uint32_t *c;
    const uint8_t *k;
} span;

/* Returns the match length at p (< e), 0 for no match. */
typedef int64_t (*matcher)(span s, int64_t p, int64_t e);

static int is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* 's|'t|'re|'ve|'m|'ll|'d, case-insensitive when ci. Under (?i) Unicode simple case folding
 * also maps U+017F LATIN SMALL LETTER LONG S to 's' (Oniguruma, which Hugging Face uses). */
static uint32_t fold(uint32_t c, int ci) {
    if (!ci)
        return c;
    if (c >= 'A' && c <= 'Z')
        return c + 32;
    return c == 0x17F ? 's' : c;
}

static int64_t contraction(span s, int64_t p, int64_t e, int ci) {
    if (s.c[p] != '\'' || p + 1 >= e)
        return 0;
    uint32_t a = fold(s.c[p + 1], ci);
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (p + 2 < e) {
        uint32_t b = fold(s.c[p + 2], ci);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return 3;
    }
    return 0;
}

/* A run of whitespace at p: \s+(?!\S) takes all of it at the end of the text and all but the
 * last one before a non-space; a single space before a non-space falls through to \s+. */
static int64_t space_run(span s, int64_t p, int64_t e) {
    int64_t i = p;
    while (i < e && s.k[i] == ST_UC_SPACE)
        i++;
    int64_t run = i - p;
    return (i == e || run == 1) ? run : run - 1;
}

static int64_t class_run(span s, int64_t from, int64_t e, int cls) {
    int64_t i = from;
    while (i < e && s.k[i] == cls)
        i++;
    return i;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static int64_t match_gpt2(span s, int64_t p, int64_t e) {
    int64_t n = contraction(s, p, e, 0);
    if (n)
        return n;
    /* the optional space is taken only when the class run it prefixes follows */
    int64_t q = (s.c[p] == ' ' && p + 1 < e && s.k[p + 1] != ST_UC_SPACE) ? p + 1 : p;
    if (s.k[q] != ST_UC_SPACE)
        return class_run(s, q + 1, e, s.k[q]) - p;
    return space_run(s, p, e);
}

/* Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+ */
static int64_t match_llama3_n(span s, int64_t p, int64_t e, int64_t max_digits) {
    int64_t n = contraction(s, p, e, 1);
    if (n)
        return n;
    int kp = s.k[p];
    if (kp == ST_UC_LETTER)
        return class_run(s, p + 1, e, ST_UC_LETTER) - p;
    if (kp != ST_UC_NUMBER && !is_crlf(s.c[p]) && p + 1 < e && s.k[p + 1] == ST_UC_LETTER)
        return class_run(s, p + 2, e, ST_UC_LETTER) - p;
    if (kp == ST_UC_NUMBER) {
        int64_t i = p;
        while (i < e && s.k[i] == ST_UC_NUMBER && i - p < max_digits)
            i++;
        return i - p;
    }
    int64_t q = (s.c[p] == ' ' && p + 1 < e && s.k[p + 1] == ST_UC_OTHER) ? p + 1 : p;
    if (s.k[q] == ST_UC_OTHER) {
        int64_t i = class_run(s, q + 1, e, ST_UC_OTHER);
        while (i < e && is_crlf(s.c[i]))
            i++;
        return i - p;
    }
    /* whitespace: \s*[\r\n]+ ends after the last CR/LF of the run, if it has one */
    int64_t i = p, last = -1;
    while (i < e && s.k[i] == ST_UC_SPACE) {
        if (is_crlf(s.c[i]))
            last = i;
        i++;
    }
    if (last >= 0)
        return last + 1 - p;
    return space_run(s, p, e);
}

static int64_t match_llama3(span s, int64_t p, int64_t e) { return match_llama3_n(s, p, e, 3); }
static int64_t match_qwen2(span s, int64_t p, int64_t e) { return match_llama3_n(s, p, e, 1); }

/* deepseek-llm, six patterns applied in sequence, each to the pieces the previous one left:
 * [\r\n]; \s?[cased letters]+; \s?[punctuation]+ (ASCII !-/ :-~, U+FF01-FF0F, U+FF1A-FF5E,
 * U+2018-201F, U+3000-3002); \s+$; [CJK]+ (U+4E00-9FA5, U+0800-4E00, U+AC00-D7FF); \p{N}+ */
static int64_t match_ds_crlf(span s, int64_t p, int64_t e) {
    (void)e;
    return is_crlf(s.c[p]) ? 1 : 0;
}

static int ds_punct(uint32_t c) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x7E) || (c >= 0xFF01 && c <= 0xFF0F) ||
           (c >= 0xFF1A && c <= 0xFF5E) || (c >= 0x2018 && c <= 0x201F) ||
           (c >= 0x3000 && c <= 0x3002);
}

static int ds_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x0800 && c <= 0x4E00) ||
           (c >= 0xAC00 && c <= 0xD7FF);
}

/* \s?[set]+ */
static int64_t opt_space_set_run(span s, int64_t p, int64_t e, int (*in)(uint32_t)) {
    int64_t q = (s.k[p] == ST_UC_SPACE && p + 1 < e && in(s.c[p + 1])) ? p + 1 : p;
    if (!in(s.c[q]))
        return 0;
    int64_t i = q + 1;
    while (i < e && in(s.c[i]))
        i++;
    return i - p;
}

static int64_t match_ds_letters(span s, int64_t p, int64_t e) {
    return opt_space_set_run(s, p, e, st_uni_deepseek_letter);
}

static int64_t match_ds_punct(span s, int64_t p, int64_t e) {
    return opt_space_set_run(s, p, e, ds_punct);
}

static int64_t match_ds_cjk(span s, int64_t p, int64_t e) {
    int64_t i = p;
    while (i < e && ds_cjk(s.c[i]))
        i++;
    return i - p;
}

static int64_t match_ds_digits(span s, int64_t p, int64_t e) {
    return class_run(s, p, e, ST_UC_NUMBER) - p;
}

/* \p{N}: one digit (SmolLM's Digits pre-tokenizer with individual_digits). */
static int64_t match_one_digit(span s, int64_t p, int64_t e) {
    (void)e;
    return s.k[p] == ST_UC_NUMBER;
}

/* One Split pass: each input piece (ends in[0..n_in)) is cut into matches and the gaps
 * between them; writes the new ends to out and returns their count. */
static int64_t split_pass(span s, matcher m, const int64_t *in, int64_t n_in, int64_t *out) {
    int64_t n_out = 0, start = 0;
    for (int64_t j = 0; j < n_in; j++) {
        int64_t e = in[j], p = start, gap = start;
        while (p < e) {
            int64_t len = m(s, p, e);
            if (len > 0) {
                if (gap < p)
                    out[n_out++] = p;
                p += len;
                out[n_out++] = p;
                gap = p;
            } else {
                p++;
            }
        }
        if (gap < e)
            out[n_out++] = e;
        start = e;
    }
    return n_out;
}

/* \s+$ on each piece: the trailing whitespace run becomes its own piece. ($ cannot match before
 * an inner newline: the first deepseek pass already isolated every \r and \n.) */
static int64_t split_trailing_space(span s, const int64_t *in, int64_t n_in, int64_t *out) {
    int64_t n_out = 0, start = 0;
    for (int64_t j = 0; j < n_in; j++) {
        int64_t e = in[j], t = e;
        while (t > start && s.k[t - 1] == ST_UC_SPACE)
            t--;
        if (t > start && t < e)
            out[n_out++] = t;
        out[n_out++] = e;
        start = e;
    }
    return n_out;
}

int64_t st_pre_split(st_pre_kind pre, const uint32_t *cps, const uint8_t *cls, int64_t n,
                     int64_t *ends, int64_t *scratch) {
    span s = {cps, cls};
    if (n == 0)
        return 0;
    scratch[0] = n;
    switch (pre) {
    case ST_PRE_LLAMA3:
        return split_pass(s, match_llama3, scratch, 1, ends);
    case ST_PRE_QWEN2:
        return split_pass(s, match_qwen2, scratch, 1, ends);
    case ST_PRE_DEEPSEEK: {
        int64_t k = split_pass(s, match_ds_crlf, scratch, 1, ends);
        k = split_pass(s, match_ds_letters, ends, k, scratch);
        k = split_pass(s, match_ds_punct, scratch, k, ends);
        k = split_trailing_space(s, ends, k, scratch);
        k = split_pass(s, match_ds_cjk, scratch, k, ends);
        k = split_pass(s, match_ds_digits, ends, k, scratch);
        for (int64_t i = 0; i < k; i++)
            ends[i] = scratch[i];
        return k;
    }
    case ST_PRE_SMOLLM: {
        int64_t k = split_pass(s, match_one_digit, scratch, 1, ends);
        for (int64_t i = 0; i < k; i++)
            scratch[i] = ends[i];
        return split_pass(s, match_gpt2, scratch, k, ends);
    }
    case ST_PRE_GPT2:
    default:
        return split_pass(s, match_gpt2, scratch, 1, ends);
    }
}
