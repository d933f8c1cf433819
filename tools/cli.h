/*
 * cli.h: the argument helpers the `spectree` subcommands share (cli.c, cli_model.c, cli_serve.c):
 * each bad value ends the program with a one-line message naming the flag and exit status 2.
 */
#ifndef ST_CLI_H
#define ST_CLI_H

#include "spectree.h"

#include <stddef.h>
#include <stdint.h>

void cli_die_usage(const char *cmd, const char *msg);
/* Names the option getopt_long just refused (missing value, or unknown). */
void cli_die_option(const char *cmd, char **argv, int missing_value);
int cli_parse_int(const char *cmd, const char *flag, const char *v, long lo, long hi, long *out);
float cli_parse_float(const char *cmd, const char *flag, const char *v, double lo, double hi);
uint64_t cli_parse_u64(const char *cmd, const char *flag, const char *v);
/* "auto" (0) or an integer in [lo, hi]. */
int32_t cli_parse_auto(const char *cmd, const char *flag, const char *v, long lo, long hi);
/* --speculative-draft-type: "auto" (-1), "f32", "f16", "bf16" or "q8_0" (st_dtype). */
int cli_parse_draft_type(const char *cmd, const char *v);
/* A model path worth opening (dir_ok: an EAGLE head directory); prints why not and returns 0. */
int cli_model_path_ok(const char *path, int dir_ok);
/* Tokenizes text into *out (malloc'd; free it even on failure); 0 on success. */
int cli_tokenize_all(const st_tokenizer *tok, const char *text, size_t len, int add_bos,
                     int32_t **out, int64_t *n);

/* `spectree tokenize`, `info` and `convert` (cli_model.c). */
int cli_cmd_tokenize(int argc, char **argv);
int cli_cmd_info(int argc, char **argv);
int cli_cmd_convert(int argc, char **argv);

/* `spectree serve` (cli_serve.c). */
int cli_cmd_serve(int argc, char **argv);

#endif
