/* testutil.h: small helpers shared by the test programs (paths to shared data, file reading). */
#ifndef ST_TESTUTIL_H
#define ST_TESTUTIL_H
#include <stddef.h>
#include <stdint.h>

/* Path under the shared folder ("models/stories260K.gguf" -> ".../shared/models/..."), in a
 * static rotating buffer. */
const char *tu_shared(const char *rel);
/* Reads a whole file; returns a malloc'd buffer (NUL-terminated) or NULL. */
char *tu_read_file(const char *path, size_t *size);
#endif
