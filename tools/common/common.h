/*
 * common.h: what the `spectree` subcommands and the server share (tools/cli/, tools/serve/): the
 * argument helpers (parse.c: each bad value ends the program with a one-line message naming the
 * flag and exit status 2) and the flags of generate and serve (opts.c).
 */
#ifndef ST_TOOLS_COMMON_H
#define ST_TOOLS_COMMON_H

#include "spectree.h"

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>

void cli_die_usage(const char *cmd, const char *msg);
/* Names the option getopt_long just refused (missing value, or unknown). */
void cli_die_option(const char *cmd, char **argv, int missing_value);
/* "unknown option 'typed'" (exit 2). */
void cli_die_unknown(const char *cmd, const char *typed);
int cli_parse_int(const char *cmd, const char *flag, const char *v, long lo, long hi, long *out);
float cli_parse_float(const char *cmd, const char *flag, const char *v, double lo, double hi);
uint64_t cli_parse_u64(const char *cmd, const char *flag, const char *v);
/* "auto" (0) or an integer in [lo, hi]. */
int32_t cli_parse_auto(const char *cmd, const char *flag, const char *v, long lo, long hi);
/* --speculative-draft-type: "auto" (-1), "f32", "f16", "bf16" or "q8_0" (st_dtype). */
int cli_parse_draft_type(const char *cmd, const char *v);
/* A model path worth opening (dir_ok: an EAGLE head directory); prints why not and returns 0. */
int cli_model_path_ok(const char *path, int dir_ok);
/* The last call of a command that prints: flushes and closes stdout, flushes stderr. 0, or -1
 * when something printed did not reach its file (a full disk, a closed descriptor), with the
 * system's message on stderr (when stderr is the one that failed, only the status says so). */
int cli_close_stdout(const char *cmd);
/* 1 when the directory holds an EAGLE head (its safetensors name fc.weight, which EAGLE-1/2 and
 * EAGLE-3 heads have and a model has not), 0 otherwise (a model's checkpoint, or unreadable). */
int cli_is_eagle_head(const char *dir);
/* Tokenizes text into *out (malloc'd; free it even on failure); 0 on success. */
int cli_tokenize_all(const st_tokenizer *tok, const char *text, size_t len, int add_bos,
                     int32_t **out, int64_t *n);
/* The same for a text that may give at most max ids (st_tokenize_max: a longer one is refused
 * without being tokenized whole): 0 on success, 1 when it gives more (*n: their count, or max + 1
 * when it was refused unread), -1 on another error (st_last_error). */
int cli_tokenize_max(const st_tokenizer *tok, const char *text, size_t len, int add_bos,
                     int64_t max, int32_t **out, int64_t *n);

/* The flags `generate` and `serve` share (opts.c): sampling, threads, KV cache types, how
 * the weights load, and every speculation flag. Their getopt values start at CLI_OPT_BASE; -t
 * is among them (put 't:' in the short options). */
enum { CLI_OPT_BASE = 2000 };
enum { CLI_GIVEN_TEMP = 1, CLI_GIVEN_TOPK = 2, CLI_GIVEN_TOPP = 4, CLI_GIVEN_MINP = 8 };
typedef struct cli_common {
    st_sampler_params sp;
    unsigned sp_given; /* CLI_GIVEN_*: the sampling flags given */
    long threads;      /* 0: the library's default */
    uint32_t type_k, type_v;
    int no_bos, match_ggml, mlock;
    st_load_mode load;
    st_spec_params spec; /* spec.draft_model: set by cli_common_load */
    const char *draft_path;
    int draft_type;  /* --speculative-draft-type (-1: auto) */
    int spec_flags;  /* a speculative flag other than the algorithm and the path was given */
    int model_draft; /* the draft came with llama.cpp's -md (STANDALONE unless chosen) */
    int draft_min, draft_min_given; /* llama.cpp's --draft-min (checked, then ignored) */
    int threads_batch;              /* -tb was given (ignored) */
    unsigned gpu_given;             /* GPU-only flags given (one warning names them) */
} cli_common;
extern const char cli_common_help[];
void cli_common_init(cli_common *o);
/* A malloc'd option table: own's entries (up to its zero entry), then the shared ones. */
struct option *cli_common_options(const struct option *own);
/* Before getopt_long: rewrites llama.cpp's single-dash names of several letters (-ngl, -fa,
 * -ctk, -md, -np, ...) to the long names in lo, and ends the program (exit 2) naming as typed
 * any other -xyz that getopt would split into short options (-ngl as -n "gl"); a value glued
 * to a short option must not start with a letter (-n16, not -pHello). Options' values are
 * skipped (-p -x is the prompt "-x"). Drops the value word of "--flash-attn on". Returns the
 * new argc. shortopts: getopt's string without the leading ':'. */
int cli_common_argv(const char *cmd, int argc, char **argv, const char *shortopts,
                    const struct option *lo);
/* 1 when getopt_long's c is a shared flag (parsed into o; a bad value exits with status 2). */
int cli_common_parse(const char *cmd, int c, const char *arg, cli_common *o);
/* After parsing: -md's draft makes the algorithm STANDALONE when none was chosen; the draft
 * path against the algorithm (exit 2), warnings for flags that do nothing (one for all the
 * GPU-only flags). */
void cli_common_check(const char *cmd, cli_common *o);
/* cli_model_path_ok for the model and the draft path; 0 (message printed) if one is not. */
int cli_common_paths_ok(const cli_common *o, const char *model);
/* Loads the target and the drafter (a draft model or an EAGLE head) as the flags say, progress
 * of big files on stderr, and sets o->spec.draft_model; 0, or -1 with the message printed. */
int cli_common_load(const char *cmd, cli_common *o, const char *model, st_model **m, st_model **dm);
/* The speculation, threads, KV cache types and match_ggml into gp (not the sampler). */
void cli_common_apply(const cli_common *o, st_gen_params *gp);
/* The one line (no newline) that says whether `auto` drafts with algorithm algo and why, from
 * its estimates: "EAGLE: not drafting, a draft level costs 0.21 plain tokens and the best tree
 * accepts 0.40 drafts for a verify of 1.90: speculation would be 0.62x here". generate prints
 * it when auto backed off, the server logs it when that changes. */
void cli_outlook_line(const st_spec_outlook *ol, st_spec_algo algo, char *buf, size_t cap);

#endif
