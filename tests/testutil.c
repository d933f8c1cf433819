/* testutil.c: helpers shared by the test programs. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>

const char *tu_shared(const char *rel) {
    static char bufs[4][4096];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, 4096, "%s/%s", ST_SHARED_DIR, rel);
    return b;
}

char *tu_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (size)
            *size = (size_t)n;
    }
    return buf;
}
