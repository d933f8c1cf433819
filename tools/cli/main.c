/*
 * main.c: the `spectree` command's dispatch: generate, chat, tokenize, info and convert (one file
 * each in this folder) and serve (tools/serve/, linked in when the build has libmicrohttpd).
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *main_help =
    "usage: spectree COMMAND [options]\n"
    "\n"
    "spectree: a C inference engine for Llama-family models built for lossless tree\n"
    "speculative decoding.\n"
    "\n"
    "commands:\n"
    "  generate   generate text from a prompt\n"
    "  chat       a conversation in the terminal with the model's chat template\n"
    "  tokenize   print the token ids of a text\n"
    "  info       print a GGUF file's metadata and tensors\n"
    "  convert    write a Hugging Face checkpoint or a GGUF model as a GGUF file\n"
    "  serve      an OpenAI-compatible HTTP server (continuous batching)\n"
    "\n"
    "'spectree COMMAND --help' describes each command; 'spectree --version' prints the version,\n"
    "the commit it was built from and the kernel table this CPU gets.\n";

/* A command's exit status, made 1 when what it printed did not reach its file. */
static int finish(const char *cmd, int rc) {
    return cli_close_stdout(cmd) != 0 && rc == 0 ? 1 : rc;
}

int main(int argc, char **argv) {
    /* stdout in one 64 KiB buffer unless it is a terminal: a command's output (help, info,
     * tokenize) then reaches the final flush, whose failure cli_close_stdout reports with the
     * system's message (a write failing midway leaves stdio's error flag, not its errno) */
    static char out_buf[1 << 16];
    if (!isatty(STDOUT_FILENO))
        setvbuf(stdout, out_buf, _IOFBF, sizeof out_buf);
    if (argc < 2) {
        fputs(main_help, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        fputs(main_help, stdout);
        return finish("help", 0);
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("spectree %s (commit %s), kernels %s\n", ST_VERSION, ST_COMMIT, st_kernels_name());
        return finish("version", 0);
    }
    if (!strcmp(cmd, "generate"))
        return finish(cmd, cli_cmd_generate(argc - 1, argv + 1));
    if (!strcmp(cmd, "chat"))
        return finish(cmd, cli_cmd_chat(argc - 1, argv + 1));
    if (!strcmp(cmd, "tokenize"))
        return finish(cmd, cli_cmd_tokenize(argc - 1, argv + 1));
    if (!strcmp(cmd, "info"))
        return finish(cmd, cli_cmd_info(argc - 1, argv + 1));
    if (!strcmp(cmd, "convert"))
        return finish(cmd, cli_cmd_convert(argc - 1, argv + 1));
    if (!strcmp(cmd, "serve")) {
#ifdef ST_HAVE_SERVE
        return serve_cmd(argc - 1, argv + 1);
#else
        fputs("spectree serve: this build has no server (configure with -DST_SERVE=ON; it needs "
              "libmicrohttpd)\n",
              stderr);
        return 2;
#endif
    }
    fprintf(stderr, "spectree: unknown command '%s' (see 'spectree --help')\n", cmd);
    return 2;
}
