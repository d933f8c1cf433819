/* tokenize.c: `spectree tokenize`, the token ids of a text, or of each line of a file (a
 * vocabulary-only GGUF will do). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *tokenize_help =
    "usage: spectree tokenize -m MODEL [--add-bos | --model-bos] TEXT\n"
    "       spectree tokenize -m MODEL [--add-bos | --model-bos] --file FILE\n"
    "\n"
    "Prints the token ids of TEXT, space separated. With --file, each line of FILE ('-':\n"
    "standard input) is tokenized on its own (without its newline) and gives one line of ids,\n"
    "in order (an empty line for an empty one without BOS). MODEL may be a vocabulary-only\n"
    "GGUF file or a Hugging Face checkpoint directory.\n"
    "\n"
    "  -m, --model PATH   GGUF file with a tokenizer (required)\n"
    "      --add-bos      prepend the BOS token\n"
    "      --model-bos    prepend it when the vocabulary asks for it, as generate does\n"
    "      --file FILE    tokenize each line of FILE\n"
    "  -h, --help         this help\n";

/* Prints the ids of each line of f, one line each. 0, or -1 with the error printed. */
static int tokenize_lines(const st_tokenizer *tok, FILE *f, const char *name, int add_bos) {
    char *line = NULL;
    size_t cap = 0;
    int32_t *ids = NULL;
    int rc = 0;
    for (ssize_t len; (len = getline(&line, &cap, f)) >= 0;) {
        if (len > 0 && line[len - 1] == '\n')
            len--;
        int64_t n = 0;
        if (cli_tokenize_all(tok, line, (size_t)len, add_bos, &ids, &n) != 0) {
            fprintf(stderr, "spectree: %s: %s\n", name, ids ? st_last_error() : "out of memory");
            rc = -1;
            break;
        }
        for (int64_t i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    }
    if (!rc && ferror(f)) {
        fprintf(stderr, "spectree: %s: %s\n", name, strerror(errno));
        rc = -1;
    }
    free(ids);
    free(line);
    return rc;
}

int cli_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    int add_bos = 0, model_bos = 0;
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'}, {"add-bos", no_argument, 0, 'b'},
        {"model-bos", no_argument, 0, 'B'},   {"file", required_argument, 0, 'f'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    int c;
    argc = cli_common_argv("tokenize", argc, argv, "m:h", lo);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:h", lo, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'b':
            add_bos = 1;
            break;
        case 'B':
            model_bos = 1;
            break;
        case 'f':
            file = optarg;
            break;
        case 'h':
            fputs(tokenize_help, stdout);
            return 0;
        case ':':
            cli_die_option("tokenize", argv, 1);
            break;
        default:
            cli_die_option("tokenize", argv, 0);
        }
    }
    if (!model)
        cli_die_usage("tokenize", "-m MODEL is required");
    if (add_bos && model_bos)
        cli_die_usage("tokenize", "--add-bos and --model-bos do not go together");
    if (argc - optind != (file ? 0 : 1))
        cli_die_usage("tokenize", file ? "--file takes no TEXT argument"
                                       : "expected exactly one TEXT argument");
    if (!cli_model_path_ok(model, 0))
        return 1;
    FILE *in = NULL;
    if (file && !(in = strcmp(file, "-") == 0 ? stdin : fopen(file, "r"))) {
        fprintf(stderr, "spectree: %s: %s\n", file, strerror(errno));
        return 1;
    }
    st_gguf *g = NULL;
    st_tokenizer *tok = NULL;
    const st_tokenizer *ctok = NULL;
    st_model *hf = NULL;
    int32_t *ids = NULL;
    int rc = 1;
    struct stat sb;
    if (stat(model, &sb) == 0 && S_ISDIR(sb.st_mode)) { /* a Hugging Face checkpoint */
        if (st_model_load(model, &hf) != ST_OK) {
            fprintf(stderr, "spectree: %s\n", st_last_error());
            goto done;
        }
        ctok = st_model_tokenizer(hf);
    } else if (st_gguf_open(model, &g) != ST_OK || st_tokenizer_load(g, &tok) != ST_OK) {
        fprintf(stderr, "spectree: %s\n", st_last_error());
        goto done;
    } else {
        ctok = tok;
    }
    if (model_bos)
        add_bos = st_tokenizer_add_bos_default(ctok);
    if (file) {
        rc = tokenize_lines(ctok, in, file, add_bos) == 0 ? 0 : 1;
        goto done;
    }
    const char *text = argv[optind];
    int64_t n = 0;
    if (cli_tokenize_all(ctok, text, strlen(text), add_bos, &ids, &n) != 0) {
        fprintf(stderr, "spectree: %s\n", ids ? st_last_error() : "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < n; i++)
        printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    rc = 0;
done:
    if (in && in != stdin)
        fclose(in);
    free(ids);
    st_tokenizer_free(tok);
    st_gguf_free(g);
    st_model_free(hf);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
