/*
 * test_e2e_peak.c: the roofline of `spectree-bench peak` and `verify`, run as built.
 * - peak --json (short timings) reports both streams and every loop: rates positive and
 *   finite where the CPU has the instruction, null and "available":false where it lacks it
 *   (checked against the CPU's own flags), and AVX2's vfmadd231ps at a plausible rate.
 * - verify --json on stories260K gives, for each N, the new floor fields beside the old ones,
 *   positive, with the fraction of the larger floor achieved in (0, 1.5].
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The line of `out` that contains `key`, copied into buf; NULL if none. */
static const char *line_with(const char *out, const char *key, char *buf, size_t cap) {
    const char *p = strstr(out, key);
    if (!p)
        return NULL;
    const char *b = p, *e = strchr(p, '\n');
    while (b > out && b[-1] != '\n')
        b--;
    const size_t n = (size_t)((e ? e : p + strlen(p)) - b);
    snprintf(buf, cap, "%.*s", (int)n, b);
    return buf;
}

/* The number after "key": in line; NAN if absent or null. */
static double num(const char *line, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    if (!p || !strncmp(p + strlen(k), "null", 4))
        return NAN;
    return strtod(p + strlen(k), NULL);
}

static int positive(double x) { return isfinite(x) && x > 0; }

/* Whether this CPU has the ISA of a loop, as the test sees it (the OS state aside). */
static int cpu_has(const char *name) {
    __builtin_cpu_init();
    if (!strncmp(name, "ref_", 4))
        return 1;
    if (!strncmp(name, "avx2_", 5))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!strncmp(name, "avx512", 6) || !strncmp(name, "amx_", 4))
        return __builtin_cpu_supports("avx512f") ? -1 : 0; /* -1: either */
    return -1;
}

static void test_peak(void **state) {
    (void)state;
    tu_result r = tu_run("spectree-bench", "peak --json --seconds 0.05 --reps 1", "/dev/null");
    assert_non_null(r.out);
    if (r.code != 0)
        fail_msg("exit %d:\n%s", r.code, r.err);
    char line[1024];
    for (int s = 0; s < 2; s++) {
        const char *key = s ? "\"name\":\"read\"" : "\"name\":\"copy\"";
        assert_non_null(line_with(r.out, key, line, sizeof line));
        assert_true(positive(num(line, "gbps_1t")) && positive(num(line, "gbps_all")));
        assert_true(num(line, "gbps_1t") < 10000.0);
    }
    static const char *const loops[] = {"ref_fmaf",       "ref_i8",       "avx2_fma",
                                        "avx2_cvtph",     "avx2_maddubs", "avx2_i8dot",
                                        "avxvnni_dpbusd", "avx512_fma",   "avx512_cvtph",
                                        "avx512_dpbusd",  "avx512_kq",    "avx512bf16_dpbf16",
                                        "amx_tdpbssd"};
    for (size_t i = 0; i < sizeof loops / sizeof loops[0]; i++) {
        char key[64];
        snprintf(key, sizeof key, "\"name\":\"%s\"", loops[i]);
        if (!line_with(r.out, key, line, sizeof line))
            fail_msg("no line for %s:\n%s", loops[i], r.out);
        const int avail = strstr(line, "\"available\":true") != NULL;
        assert_true(avail || strstr(line, "\"available\":false"));
        const int want = cpu_has(loops[i]);
        if (want >= 0 && avail != want)
            fail_msg("%s: available %d, the CPU says %d", loops[i], avail, want);
        if (avail) {
            if (!positive(num(line, "g_1t")) || !positive(num(line, "g_all")))
                fail_msg("%s: rates not positive: %s", loops[i], line);
        } else {
            assert_true(isnan(num(line, "g_1t")) && isnan(num(line, "g_all")));
        }
        if (avail && !strcmp(loops[i], "avx2_fma")) {
            /* 8 lanes x 1-2 per cycle at 1-6 GHz, with room for a busy machine */
            const double g = num(line, "g_1t");
            if (!(g > 1.0 && g < 1000.0))
                fail_msg("avx2_fma: %.3f G multiply-adds/s per thread", g);
        }
    }
    tu_result_free(&r);
}

static void test_verify_floors(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "verify -m %s --reps 1 --json --peak-seconds 0.02",
             tu_data("models/stories260K.gguf"));
    tu_result r = tu_run("spectree-bench", args, "/dev/null");
    assert_non_null(r.out);
    if (r.code != 0)
        fail_msg("exit %d:\n%s", r.code, r.err);
    int lines = 0;
    for (const char *p = r.out; (p = strstr(p, "{\"bench\":\"verify\"")); p++, lines++) {
        char line[1024];
        const char *e = strchr(p, '\n');
        snprintf(line, sizeof line, "%.*s", (int)(e ? e - p : (long)strlen(p)), p);
        /* the old fields, then the new ones */
        assert_true(positive(num(line, "ms")) && positive(num(line, "ratio")));
        assert_non_null(strstr(line, "\"load_mode\":"));
        assert_non_null(strstr(line, "\"kernels\":\""));
        static const char *const keys[] = {"macs_g",      "read_mb",      "read_gbps",
                                           "peak_gmac_s", "floor_mem_ms", "floor_compute_ms",
                                           "frac_floor"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            if (!positive(num(line, keys[k])))
                fail_msg("%s not positive: %s", keys[k], line);
        assert_true(strstr(line, "\"bound\":\"memory\"") || strstr(line, "\"bound\":\"compute\""));
        /* the fraction is max(floors) / ms, as printed (rounding aside); its size depends on the
         * machine's load, so only its inputs are checked, not an upper bound */
        const double f = num(line, "frac_floor"), mem = num(line, "floor_mem_ms"),
                     comp = num(line, "floor_compute_ms"), ms = num(line, "ms");
        const double want = (mem > comp ? mem : comp) / ms;
        if (!(f > 0.0 && fabs(f - want) <= 1e-3 * want + 1e-4))
            fail_msg("fraction of the floor %.4f, max(floors) / ms %.4f: %s", f, want, line);
        assert_true(strstr(line, mem >= comp ? "\"bound\":\"memory\"" : "\"bound\":\"compute\""));
    }
    assert_int_equal(lines, 7);
    tu_result_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peak),
        cmocka_unit_test(test_verify_floors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
