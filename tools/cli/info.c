/*
 * info.c: `spectree info`, what a file holds without generating: a GGUF file's metadata and
 * tensors, a Hugging Face checkpoint, or an EAGLE head.
 */
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

static const char *info_help =
    "usage: spectree info -m MODEL\n"
    "       spectree info -m HEAD_DIR [--target MODEL]\n"
    "\n"
    "Prints a GGUF file's metadata, its tensor table and, for a Llama model, the\n"
    "hyper-parameters the engine derives; for a Hugging Face checkpoint (refused as generate\n"
    "refuses it) the hyper-parameters. For an EAGLE head directory: its kind (EAGLE-1/2 or\n"
    "EAGLE-3), the target layers it reads, its vocabulary sizes and the target it fits; with\n"
    "--target, whether it loads for that model.\n"
    "\n"
    "  -m, --model PATH   GGUF file, Hugging Face checkpoint or EAGLE head directory\n"
    "                     (required)\n"
    "      --target PATH  a head's target model (GGUF)\n"
    "  -h, --help         this help\n";

/* `spectree info` on a head directory (with its target, when given). */
static int info_head(const char *dir, const char *target_path) {
    st_eagle_info in;
    if (st_eagle_head_describe(dir, &in) != ST_OK) {
        fprintf(stderr, "spectree: %s\n", st_last_error());
        return 1;
    }
    printf("EAGLE head: %s\nkind: %s\nwidth %d, MLP %d, %s embedding\n", dir,
           in.version == 3 ? "EAGLE-3" : "EAGLE-1/2", in.n_embd, in.n_ff,
           in.own_embedding ? "its own" : "the target's");
    printf("vocabulary: %d target tokens, drafts over %d%s\n", in.n_vocab, in.n_draft_vocab,
           in.n_draft_vocab < in.n_vocab ? " (reduced; d2t maps them)" : "");
    if (in.version == 3 && in.layers_default)
        printf("reads the residual stream entering target layers 2, L/2 and L-3 (the default)\n");
    else if (in.version == 3)
        printf("reads the residual stream entering target layers %d, %d and %d\n",
               in.layers_read[0], in.layers_read[1], in.layers_read[2]);
    else
        printf("reads the target's final-normed state\n");
    int32_t need = in.version == 3 && in.layers_default ? 3 : 0;
    for (int32_t i = 0; in.version == 3 && i < in.n_layers_read; i++)
        need = in.layers_read[i] > need ? in.layers_read[i] : need;
    printf("fits: a target of width %d with a vocabulary of %d", in.target_n_embd, in.n_vocab);
    if (need)
        printf(" and at least %d layers", need);
    printf("\n");
    if (!target_path)
        return 0;
    st_model *t = NULL, *h = NULL;
    if (!cli_model_path_ok(target_path, 0))
        return 1;
    if (st_model_load(target_path, &t) != ST_OK || st_eagle_head_load(dir, t, &h) != ST_OK) {
        fprintf(stderr, "spectree: %s\n", st_last_error());
        st_model_free(t);
        return 1;
    }
    st_eagle_head_info(h, &in);
    printf("loads for %s (%d layers)", target_path, in.target_layers);
    for (int32_t i = 0; in.version == 3 && i < in.n_layers_read; i++)
        printf("%s%d", i ? ", " : ": reads the inputs of layers ", in.layers_read[i]);
    if (in.version == 3)
        printf(" (%d: the last layer's output)", in.target_layers);
    printf("; %.2f MB of matrices; use --speculative-algorithm %s\n",
           (double)st_model_weight_bytes(h) / 1e6, in.version == 3 ? "EAGLE3" : "EAGLE");
    st_model_free(h);
    st_model_free(t);
    return 0;
}

int cli_cmd_info(int argc, char **argv) {
    const char *model = NULL, *target = NULL;
    static const struct option lo[] = {{"model", required_argument, 0, 'm'},
                                       {"target", required_argument, 0, 'T'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    int c;
    argc = cli_common_argv("info", argc, argv, "m:h", lo);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:h", lo, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 'T':
            target = optarg;
            break;
        case 'h':
            fputs(info_help, stdout);
            return 0;
        case ':':
            cli_die_option("info", argv, 1);
            break;
        default:
            cli_die_option("info", argv, 0);
        }
    }
    if (!model)
        cli_die_usage("info", "-m MODEL is required");
    if (optind < argc)
        cli_die_usage("info", "unexpected argument");
    struct stat mst;
    const int is_dir = stat(model, &mst) == 0 && S_ISDIR(mst.st_mode);
    if (is_dir && cli_is_eagle_head(model))
        return info_head(model, target);
    if (target)
        cli_die_usage("info", "--target goes with an EAGLE head directory");
    if (!cli_model_path_ok(model, 0))
        return 1;
    st_model *m = NULL;
    st_load_params lp = st_load_default_params();
    lp.mode = ST_LOAD_MMAP; /* the checks only: no copy of the weights */
    if (is_dir) {           /* a checkpoint is described once it loads, as generate loads it */
        if (st_model_load_ex(model, &lp, &m) != ST_OK) {
            fprintf(stderr, "spectree: %s\n", st_last_error());
            return 1;
        }
        printf("checkpoint: %s (Hugging Face; 'spectree convert' writes the GGUF file this "
               "command would list)\n",
               model);
    } else {
        st_gguf *g = NULL;
        if (st_gguf_open(model, &g) != ST_OK) {
            fprintf(stderr, "spectree: %s\n", st_last_error());
            return 1;
        }
        printf("file: %s\nGGUF version %u, %" PRId64 " metadata keys, %" PRId64
               " tensors, alignment %u\n\n",
               model, st_gguf_version(g), st_gguf_n_kv(g), st_gguf_n_tensors(g),
               st_gguf_alignment(g));
        char buf[1024];
        for (int64_t i = 0; i < st_gguf_n_kv(g); i++) {
            st_gguf_format_value(g, i, buf, sizeof buf);
            printf("  %-44s %s\n", st_gguf_key(g, i), buf);
        }
        if (st_gguf_n_tensors(g) > 0) {
            printf("\n  %-32s %-6s %-24s %12s %10s\n", "tensor", "type", "shape (ne)", "offset",
                   "bytes");
            for (int64_t i = 0; i < st_gguf_n_tensors(g); i++) {
                const st_gguf_tensor *t = st_gguf_tensor_at(g, i);
                char shape[64];
                int n = snprintf(shape, sizeof shape, "[%" PRId64, t->ne[0]);
                for (uint32_t d = 1; d < t->n_dims && n > 0 && (size_t)n < sizeof shape; d++)
                    n += snprintf(shape + n, sizeof shape - (size_t)n, ", %" PRId64, t->ne[d]);
                snprintf(shape + n, sizeof shape - (size_t)n, "]");
                printf("  %-32s %-6s %-24s %12" PRIu64 " %10zu\n", t->name, st_dtype_name(t->type),
                       shape, t->offset, t->size);
            }
        }
        st_gguf_free(g);
    }
    if (m || st_model_load_ex(model, &lp, &m) == ST_OK) {
        const st_model_hparams *hp = st_model_get_hparams(m);
        printf("\nllama: n_vocab %d, n_embd %d, n_layer %d, n_head %d, n_head_kv %d, head_dim %d, "
               "n_ff %d, n_ctx_train %d, rope base %g, rms eps %g, %s output, weights %s, "
               "%.2f MB of matrices\n",
               hp->n_vocab, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim,
               hp->n_ff, hp->n_ctx_train, (double)hp->rope_base, (double)hp->rms_eps,
               hp->tied_output ? "tied" : "separate", st_dtype_name(hp->wtype),
               (double)st_model_weight_bytes(m) / 1e6);
        st_model_free(m);
    } else {
        printf("\n(not loadable as a Llama model: %s)\n", st_last_error());
    }
    return 0;
}
