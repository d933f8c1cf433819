/*
 * bench.c: `spectree-bench`, the benchmark programs: one line per case on stdout, one JSON
 * object per line with --json; medians of repeats after a warm-up, ratios measured in the same
 * run.
 */
#include "bench.h"

#include <stdio.h>
#include <string.h>

static const char *help = "usage: spectree-bench COMMAND [options]\n"
                          "\n"
                          "commands:\n"
                          "  tree    per-step mask building + verification + commit against\n"
                          "          context length, for every mask layout (--json, --reps R)\n"
                          "  e2e     plain vs speculative generation speed per drafter\n"
                          "\n"
                          "'spectree-bench COMMAND --help' describes each command.\n";

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(help, stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(help, stdout);
        return 0;
    }
    if (!strcmp(argv[1], "tree"))
        return st_bench_tree_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "e2e"))
        return st_bench_e2e_main(argc - 1, argv + 1);
    fprintf(stderr, "spectree-bench: unknown command '%s' (see --help)\n", argv[1]);
    return 2;
}
