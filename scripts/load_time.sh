#!/bin/bash
# Load time of a model from a warm page cache, builds alternated:
#   scripts/load_time.sh MODEL ROUNDS BUILD_DIR...
# Each run reads the file into the page cache (cat), then loads it with --no-mmap (weights
# copied into huge pages) and prints load_s and load_cpu_s (the loading thread's CPU seconds)
# from `spectree generate --json`, the MB in huge pages and the 1-minute load average.
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 MODEL ROUNDS BUILD_DIR..." >&2
    exit 2
fi
model=$1
rounds=$2
shift 2
for _ in $(seq "$rounds"); do
    for b in "$@"; do
        cat "$model" >/dev/null
        out=$("$b/spectree" generate -m "$model" -p Once -n 1 --temp 0 --no-mmap --json 2>&1 \
            >/dev/null | grep '^{' | tail -1)
        echo "$b $(echo "$out" | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print("load_s", d["load_s"], "cpu_s", d["load_cpu_s"], "huge_mb", d["load_huge_mb"])') load $(cut -d' ' -f1 /proc/loadavg)"
    done
done
