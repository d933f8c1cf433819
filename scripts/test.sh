#!/usr/bin/env bash
# The whole test suite: builds with -Werror and runs every test plain, with every model's weights
# copied into huge pages (ST_LOAD=copy; plain runs keep small models mmap'd), with the scalar
# kernels (ST_KERNELS=ref), and under AddressSanitizer + UndefinedBehaviorSanitizer; builds the
# prototypes of dev/; runs the fuzz targets for a minute each (scripts/fuzz.sh; ST_FUZZ_SECONDS=N
# to change); checks formatting. It needs nothing outside the repository but Debian's packages
# and the npm registry (scripts/deps.sh).
# Usage: scripts/test.sh [--quick]   (--quick: the plain run only)
# Tests labelled `slow` (the Python EAGLE trainer, which uses no C kernel) run in the first pass
# only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)
quick=0
[ "${1:-}" = "--quick" ] && quick=1

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs," \
    "$(grep -o -w -E 'avx512f|avx512_vnni|avx_vnni|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "== build (Release, -Werror)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DST_WERROR=ON >/dev/null
cmake --build build -j"$jobs" >/dev/null
echo "== the kernel prototypes of dev/ (built, not run: they cannot rot)"
cmake --build build -j"$jobs" --target dev >/dev/null
echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs"
[ $quick -eq 1 ] && exit 0

echo "== tests with the weights copied into huge pages (ST_LOAD=copy)"
ST_LOAD=copy ctest --test-dir build --output-on-failure -j"$jobs" -LE slow

echo "== tests with the scalar reference kernels (ST_KERNELS=ref)"
ST_KERNELS=ref ctest --test-dir build --output-on-failure -j"$jobs" -LE slow

if grep -q avx512 /proc/cpuinfo 2>/dev/null; then
    echo "== tests with the AVX2 kernels on an AVX-512 machine (ST_KERNELS=avx2)"
    ST_KERNELS=avx2 ctest --test-dir build --output-on-failure -j"$jobs" -LE slow
fi

echo "== build with ASan+UBSan"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DST_SANITIZE=ON -DST_WERROR=ON >/dev/null
cmake --build build-asan -j"$jobs" >/dev/null
echo "== tests under ASan+UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE slow

echo "== fuzz targets, ${ST_FUZZ_SECONDS:-60} s each (clang, libFuzzer, ASan+UBSan)"
bash scripts/fuzz.sh

echo "== clang-format"
files=$(git ls-files '*.c' '*.h' | grep -v '^src/tok/unicode_tables.c$' || true)
clang-format --dry-run -Werror $files
echo "all checks passed"
