#!/usr/bin/env bash
# The main job on a fresh machine: installs missing Debian packages (as root), builds spectree,
# and generates text from stories260K.gguf, first with plain decoding, then with n-gram tree
# speculation (auto tree shapes), checks that the two outputs are identical, prints tau and the
# speed-up measured by spectree-bench e2e (plain and speculative runs interleaved).
# Usage: scripts/demo.sh [MODEL] [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/stories260K.gguf}
prompt=${2:-Once upon a time}
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
common=(-m "$model" -p "$prompt" -n 256 --temp 0 --json)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== plain decoding"
./build/spectree generate "${common[@]}" --speculative-algorithm NONE >"$tmp/plain.txt" \
    2>"$tmp/plain.err"
cat "$tmp/plain.txt"
tail -n 4 "$tmp/plain.err"
echo "== n-gram tree speculation (auto tree shapes)"
./build/spectree generate "${common[@]}" --speculative-algorithm NGRAM >"$tmp/spec.txt" \
    2>"$tmp/spec.err"
cat "$tmp/spec.txt"
tail -n 4 "$tmp/spec.err"
if cmp -s "$tmp/plain.txt" "$tmp/spec.txt"; then
    echo "== outputs identical"
else
    echo "== OUTPUTS DIFFER (a bug: speculation must not change the output)" >&2
    exit 1
fi
# One run of each is at the mercy of a shared machine's noise: the speed-up is measured by
# spectree-bench e2e, plain and speculative runs back to back, median of 15 ratios.
echo "== speed-up, plain vs NGRAM (spectree-bench e2e, median of 15 interleaved pairs)"
./build/spectree-bench e2e -m "$model" -p "$prompt" -n 256 --reps 15 --no-self
