/* serve_cmd.h: `spectree serve`, the one entry of tools/serve/ that the `spectree` command calls.
 */
#ifndef ST_SERVE_CMD_H
#define ST_SERVE_CMD_H

/* Runs the server until SIGINT/SIGTERM and its drain; returns the exit status. */
int serve_cmd(int argc, char **argv);

#endif
