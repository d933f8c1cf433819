/* convert.c: `spectree convert`, a Hugging Face checkpoint or a GGUF model written as a GGUF
 * file, with its progress (tensors and MB written) and a summary on stderr. */
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

static const char *convert_help =
    "usage: spectree convert DIR OUT.gguf [--type TYPE]\n"
    "       spectree convert SRC.gguf OUT.gguf [--type TYPE]\n"
    "\n"
    "Writes the GGUF file of a Hugging Face checkpoint directory (config.json, safetensors,\n"
    "tokenizer.json): llama.cpp's llama architecture keys and tensor names. A GGUF model of\n"
    "any type the engine loads is written again with its matrices in TYPE (each row\n"
    "dequantized by the engine, then quantized to TYPE; f32 keeps a quantized model's values\n"
    "exactly), its keys, the tokenizer's among them, copied.\n"
    "\n"
    "  --type TYPE   the matrices' type (default keep: each as stored); norms are always f32:\n"
    "                f32, f16, bf16, q8_0, q4_0 (rows not a multiple of 32 stay f16);\n"
    "                q2_k, q3_k, q4_k, q5_k, q6_k: every matrix in that K-quant;\n"
    "                q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m: llama-quantize's\n"
    "                per-tensor mix (q4_k_m: output, and attn_v and ffn_down of the first and\n"
    "                last eighth of the layers and every third between, in q6_k, the rest\n"
    "                q4_k). K-quant rows that are not whole 256-element super-blocks get q4_0\n"
    "                (q2_k, q3_k) or q8_0 (q4_k .. q6_k), f16 if not even 32 divides them\n"
    "\n"
    "Progress (tensors and MB written) and a summary go to stderr.\n";

/* Progress on stderr: rewritten in place on a terminal, else a line per quarter of the data. */
typedef struct progress {
    int tty, quarter;
    double t0;
    int64_t n_tensors;
} progress;

static void on_progress(void *user, int64_t done, int64_t n, size_t bytes, size_t total) {
    progress *p = user;
    const double mb = (double)bytes / 1e6, total_mb = (double)total / 1e6;
    p->n_tensors = n;
    if (p->tty) {
        fprintf(stderr, "\rconvert: %" PRId64 "/%" PRId64 " tensors, %.1f/%.1f MB%s", done, n, mb,
                total_mb, done == n ? "\n" : "");
        return;
    }
    const int q = total ? (int)(4 * (double)bytes / (double)total) : 4;
    if (q > p->quarter || done == n) {
        p->quarter = q;
        fprintf(stderr, "convert: %" PRId64 "/%" PRId64 " tensors, %.1f/%.1f MB\n", done, n, mb,
                total_mb);
    }
}

int cli_cmd_convert(int argc, char **argv) {
    static const struct option lo[] = {
        {"type", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    static const struct {
        const char *name;
        int type;
    } types[] = {{"keep", -1},
                 {"f32", ST_DTYPE_F32},
                 {"f16", ST_DTYPE_F16},
                 {"bf16", ST_DTYPE_BF16},
                 {"q8_0", ST_DTYPE_Q8_0},
                 {"q4_0", ST_DTYPE_Q4_0},
                 {"q2_k", ST_DTYPE_Q2_K},
                 {"q3_k", ST_DTYPE_Q3_K},
                 {"q4_k", ST_DTYPE_Q4_K},
                 {"q5_k", ST_DTYPE_Q5_K},
                 {"q6_k", ST_DTYPE_Q6_K},
                 {"q3_k_s", ST_CONVERT_Q3_K_S},
                 {"q3_k_m", ST_CONVERT_Q3_K_M},
                 {"q3_k_l", ST_CONVERT_Q3_K_L},
                 {"q4_k_s", ST_CONVERT_Q4_K_S},
                 {"q4_k_m", ST_CONVERT_Q4_K_M},
                 {"q5_k_s", ST_CONVERT_Q5_K_S},
                 {"q5_k_m", ST_CONVERT_Q5_K_M}};
    int type = -1, c;
    const char *type_name = "as stored";
    argc = cli_common_argv("convert", argc, argv, "h", lo);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
        switch (c) {
        case 't': {
            size_t i = 0;
            while (i < sizeof types / sizeof types[0] && strcmp(optarg, types[i].name) != 0)
                i++;
            if (i == sizeof types / sizeof types[0])
                cli_die_usage("convert", "--type must be one of f32, f16, bf16, q8_0, q4_0, q2_k, "
                                         "q3_k, q4_k, q5_k, q6_k, q3_k_s, q3_k_m, q3_k_l, "
                                         "q4_k_s, q4_k_m, q5_k_s, q5_k_m, keep");
            type = types[i].type;
            if (type != -1)
                type_name = types[i].name;
            break;
        }
        case 'h':
            fputs(convert_help, stdout);
            return 0;
        case ':':
            cli_die_option("convert", argv, 1);
            break;
        default:
            cli_die_option("convert", argv, 0);
        }
    }
    if (argc - optind != 2)
        cli_die_usage("convert", "expected DIR (or SRC.gguf) and OUT.gguf");
    const char *src = argv[optind], *out = argv[optind + 1];
    struct stat sb;
    if (stat(src, &sb) != 0) {
        fprintf(stderr, "spectree: %s: %s\n", src, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode)) {
        fprintf(stderr, "spectree: %s: neither a checkpoint directory nor a GGUF file\n", src);
        return 1;
    }
    progress pr = {.tty = isatty(STDERR_FILENO), .t0 = st_time_seconds()};
    const st_status s = S_ISDIR(sb.st_mode) ? st_convert_hf_ex(src, out, type, on_progress, &pr)
                                            : st_convert_gguf(src, out, type, on_progress, &pr);
    if (s != ST_OK) {
        if (pr.tty)
            fputc('\n', stderr);
        fprintf(stderr, "spectree: %s\n", st_last_error());
        return 1;
    }
    struct stat ob;
    const double file_mb = stat(out, &ob) == 0 ? (double)ob.st_size / 1e6 : 0;
    fprintf(stderr, "convert: wrote %s: %" PRId64 " tensors, %.1f MB, matrices %s, in %.2f s\n",
            out, pr.n_tensors, file_mb, type_name, st_time_seconds() - pr.t0);
    return 0;
}
