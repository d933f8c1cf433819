/* bench.h: the subcommands of spectree-bench, one file each (tools/bench_<name>.c). */
#ifndef ST_BENCH_H
#define ST_BENCH_H
int st_bench_tree_main(int argc, char **argv);
int st_bench_e2e_main(int argc, char **argv);
#endif
