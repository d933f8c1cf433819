/* tokenize.c: `spectree tokenize`, the token ids of a text (a vocabulary-only GGUF will do). */
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
    "usage: spectree tokenize -m MODEL [--add-bos] TEXT\n"
    "\n"
    "Prints the token ids of TEXT, space separated. MODEL may be a vocabulary-only GGUF file.\n"
    "\n"
    "  -m, --model PATH   GGUF file with a tokenizer (required)\n"
    "      --add-bos      prepend the BOS token\n"
    "  -h, --help         this help\n";

int cli_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL;
    int add_bos = 0;
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"add-bos", no_argument, 0, 'b'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
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
    if (argc - optind != 1)
        cli_die_usage("tokenize", "expected exactly one TEXT argument");
    const char *text = argv[optind];
    if (!cli_model_path_ok(model, 0))
        return 1;
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
    free(ids);
    st_tokenizer_free(tok);
    st_gguf_free(g);
    st_model_free(hf);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
