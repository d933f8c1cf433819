/* cli.h: the subcommands of `spectree`, one file each in tools/cli/ (serve: tools/serve/). */
#ifndef ST_CLI_H
#define ST_CLI_H

#include "common/common.h"
#ifdef ST_HAVE_SERVE
#include "serve/serve_cmd.h"
#endif

int cli_cmd_generate(int argc, char **argv);
int cli_cmd_tokenize(int argc, char **argv);
int cli_cmd_info(int argc, char **argv);
int cli_cmd_convert(int argc, char **argv);
int cli_cmd_chat(int argc, char **argv);

#endif
