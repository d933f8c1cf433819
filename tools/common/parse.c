/*
 * parse.c: the argument helpers every `spectree` subcommand shares (a bad value ends the program
 * with a one-line message naming the flag and exit status 2), the model path check, the
 * tokenizer loop that sizes its output from what the tokenizer reports, the check that what a
 * command printed reached its file, and how an EAGLE head's directory is told from a model's.
 */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void cli_die_usage(const char *cmd, const char *msg) {
    fprintf(stderr, "spectree %s: %s (see 'spectree %s --help')\n", cmd, msg, cmd);
    exit(2);
}

/* Names the option getopt_long just refused: a missing value's option as typed, an unknown
 * short option as "-x" (it may sit in a group like -hx), an unknown long one as typed. */
void cli_die_option(const char *cmd, char **argv, int missing_value) {
    char shortopt[3] = {'-', (char)optopt, 0};
    const char *name = !missing_value && optopt > 0 && optopt < 128 ? shortopt : argv[optind - 1];
    fprintf(stderr, "spectree %s: %s '%s' (see 'spectree %s --help')\n", cmd,
            missing_value ? "missing value for option" : "unknown option", name, cmd);
    exit(2);
}

void cli_die_unknown(const char *cmd, const char *typed) {
    fprintf(stderr, "spectree %s: unknown option '%s' (see 'spectree %s --help')\n", cmd, typed,
            cmd);
    exit(2);
}

/* strtol/strtod skip leading blanks and take a sign: " -1" would pass as a number (and as
 * 2^64-1 through strtoull), and strtod takes hex, "inf" and "nan". A number starts with a
 * digit, or '-' or '.' then a digit; a real number has only decimal digits, '.', exponent. */
static int number_start(const char *v) {
    const char *p = v[0] == '-' ? v + 1 : v;
    if (*p == '.')
        p++;
    return *p >= '0' && *p <= '9';
}

int cli_parse_int(const char *cmd, const char *flag, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!number_start(v) || v[0] == '.' || errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "spectree %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, flag,
                lo, hi, v);
        exit(2);
    }
    *out = x;
    return 0;
}

float cli_parse_float(const char *cmd, const char *flag, const char *v, double lo, double hi) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!number_start(v) || v[strspn(v, "0123456789.eE+-")] || errno || end == v || *end ||
        !(x >= lo && x <= hi)) {
        fprintf(stderr, "spectree %s: %s expects a number in [%g, %g], got '%s'\n", cmd, flag, lo,
                hi, v);
        exit(2);
    }
    return (float)x;
}

uint64_t cli_parse_u64(const char *cmd, const char *flag, const char *v) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (v[0] < '0' || v[0] > '9' || errno || end == v || *end) {
        fprintf(stderr, "spectree %s: %s expects a non-negative integer, got '%s'\n", cmd, flag, v);
        exit(2);
    }
    return (uint64_t)x;
}

/* A model path worth opening: an EAGLE head is a directory (dir_ok); a model a GGUF file or a
 * Hugging Face checkpoint directory. Other kinds of file (a FIFO, a device) are refused by the
 * library, which names the kind. */
int cli_model_path_ok(const char *path, int dir_ok) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "spectree: %s: cannot open: %s\n", path, strerror(errno));
        return 0;
    }
    if (dir_ok && !S_ISDIR(st.st_mode)) {
        fprintf(stderr,
                "spectree: %s: not a directory; an EAGLE head is a checkpoint directory "
                "(config.json, model.safetensors)\n",
                path);
        return 0;
    }
    return 1;
}

/* Tokenizes text into *out (malloc'd, sized from what the tokenizer reports); 0 on success. */
int cli_tokenize_all(const st_tokenizer *tok, const char *text, size_t len, int add_bos,
                     int32_t **out, int64_t *n) {
    int64_t cap = (int64_t)len + 8;
    for (int tries = 0; tries < 2; tries++) {
        free(*out);
        *out = malloc((size_t)(cap > 0 ? cap : 1) * sizeof **out);
        if (!*out)
            return -1;
        st_status s = st_tokenize(tok, text, len, add_bos, *out, cap, n);
        if (s == ST_OK)
            return 0;
        if (s != ST_ERR_RANGE)
            return -1;
        cap = *n; /* a vocabulary that splits a byte into several tokens */
    }
    return -1;
}

int cli_tokenize_max(const st_tokenizer *tok, const char *text, size_t len, int add_bos,
                     int64_t max, int32_t **out, int64_t *n) {
    int64_t cap = (int64_t)len + 8 < max ? (int64_t)len + 8 : max;
    for (int tries = 0; tries < 2; tries++) {
        free(*out);
        *out = malloc((size_t)(cap > 0 ? cap : 1) * sizeof **out);
        if (!*out)
            return -1;
        st_status s = st_tokenize_max(tok, text, len, add_bos, max, *out, cap, n);
        if (s == ST_OK)
            return 0;
        if (s != ST_ERR_RANGE)
            return -1;
        if (*n > max)
            return 1;
        cap = *n; /* a vocabulary that splits a byte into several tokens */
    }
    return -1;
}

int32_t cli_parse_auto(const char *cmd, const char *flag, const char *v, long lo, long hi) {
    if (!strcmp(v, "auto"))
        return 0;
    long x;
    cli_parse_int(cmd, flag, v, lo, hi, &x);
    return (int32_t)x;
}

int cli_parse_draft_type(const char *cmd, const char *v) {
    static const struct {
        const char *name;
        int type;
    } t[] = {{"auto", -1},
             {"f32", ST_DTYPE_F32},
             {"f16", ST_DTYPE_F16},
             {"bf16", ST_DTYPE_BF16},
             {"q8_0", ST_DTYPE_Q8_0}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(v, t[i].name))
            return t[i].type;
    fprintf(stderr,
            "spectree %s: --speculative-draft-type must be auto, f32, f16, bf16 or q8_0, got "
            "'%s'\n",
            cmd, v);
    exit(2);
}

int cli_close_stdout(const char *cmd) {
    errno = 0;
    int bad = fflush(stdout) != 0 || ferror(stdout);
    int e = errno;
    if (fclose(stdout) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad)
        fprintf(stderr, "spectree %s: standard output: %s\n", cmd,
                e ? strerror(e) : "a write failed");
    if (fflush(stderr) != 0 || ferror(stderr))
        bad = 1;
    return bad ? -1 : 0;
}

/* The JSON at the start of path: a safetensors header (after its 8-byte length) or, with
 * header 0, a whole index file. NULL when unreadable. */
static json_t *json_at(const char *path, int header) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    json_t *v = NULL;
    unsigned char le[8];
    uint64_t n = 0;
    if (header && fread(le, 1, 8, f) == 8)
        for (int i = 7; i >= 0; i--)
            n = n << 8 | le[i];
    if (!header && fseek(f, 0, SEEK_END) == 0 && ftell(f) > 0) {
        n = (uint64_t)ftell(f);
        rewind(f);
    }
    char *b = n && n <= (100u << 20) ? malloc((size_t)n) : NULL;
    if (b && fread(b, 1, (size_t)n, f) == n)
        v = json_loadb(b, (size_t)n, 0, NULL);
    free(b);
    fclose(f);
    return v;
}

int cli_is_eagle_head(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    json_t *h = json_at(path, 1), *names = h;
    if (!h) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        h = json_at(path, 0);
        names = json_object_get(h, "weight_map");
    }
    int head = json_object_get(names, "fc.weight") != NULL;
    json_decref(h);
    return head;
}
