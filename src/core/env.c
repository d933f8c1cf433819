/*
 * env.c: the library's only reading of the environment. Five variables change how spectree runs
 * (never what it computes): ST_KERNELS picks the kernel table (read once, when the table is
 * chosen), ST_PACK=0 turns off the packed copy of small F32 models and ST_LOAD=mmap|copy
 * decides how ST_LOAD_AUTO places the weights (both read at each model load), and
 * ST_CLOCK=cpu makes the clock count the process's CPU time (read once, at the first
 * reading of the clock), ST_AMX=0 keeps the AVX-512 table off the AMX unit (read once). All are
 * documented in spectree.h.
 */
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

st_env st_env_get(void) {
    st_env e;
    const char *k = getenv("ST_KERNELS");
    e.kernels = !k                       ? ST_ENV_KERNELS_AUTO
                : strcmp(k, "ref") == 0  ? ST_ENV_KERNELS_REF
                : strcmp(k, "avx2") == 0 ? ST_ENV_KERNELS_AVX2
                                         : ST_ENV_KERNELS_AUTO;
    const char *p = getenv("ST_PACK");
    e.pack = !(p && strcmp(p, "0") == 0);
    const char *l = getenv("ST_LOAD");
    e.load = !l                       ? ST_LOAD_AUTO
             : strcmp(l, "mmap") == 0 ? ST_LOAD_MMAP
             : strcmp(l, "copy") == 0 ? ST_LOAD_COPY
                                      : ST_LOAD_AUTO;
    const char *a = getenv("ST_AMX");
    e.amx = !(a && strcmp(a, "0") == 0);
    const char *v = getenv("ST_AVXVNNI");
    e.avxvnni = !(v && strcmp(v, "0") == 0);
    const char *c = getenv("ST_CLOCK");
    e.cpu_clock = c && strcmp(c, "cpu") == 0;
    return e;
}
