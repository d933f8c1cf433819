/*
 * main.c: `spectree-bench`, the benchmark programs (one file each in this folder, their shared
 * helpers in common.c): one line per case on stdout, one JSON object per line with --json;
 * medians of repeats after a warm-up, ratios measured in the same run.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *help =
    "usage: spectree-bench COMMAND [options]\n"
    "\n"
    "commands:\n"
    "  tree    per-step mask building + verification + commit against\n"
    "          context length, for every mask layout (--json, --reps R)\n"
    "  e2e     plain vs speculative generation speed per drafter\n"
    "  decode  decode tokens/s of a model and weight bandwidth against the\n"
    "          machine's copy bandwidth (-m MODEL, --json)\n"
    "  verify  the verify-cost curve: one forward over N = 1..64 tokens at a\n"
    "          512-token context, ms and ms(N)/ms(1) (-m MODEL, --json)\n"
    "  threads decode tokens/s with 1 and 2 threads, as the machine is and with a\n"
    "          busy loop it runs on every core (-m MODEL, --json)\n"
    "  gguf    st_gguf_open on hostile 100 MB headers it writes itself (--mb M)\n"
    "  engine  the continuous-batching engine under a closed-loop load at each\n"
    "          concurrency, plain vs speculative (-m MODEL, --algo, --json)\n"
    "  peak    the machine's roofline: copy and read bandwidth, and each kernel\n"
    "          instruction's peak rate, per thread and on all threads (--json)\n"
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
    if (!strcmp(argv[1], "decode"))
        return st_bench_decode_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "verify"))
        return st_bench_verify_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "threads"))
        return st_bench_threads_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "gguf"))
        return st_bench_gguf_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "engine"))
        return st_bench_engine_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "peak"))
        return st_bench_peak_main(argc - 1, argv + 1);
    fprintf(stderr, "spectree-bench: unknown command '%s' (see --help)\n", argv[1]);
    return 2;
}
