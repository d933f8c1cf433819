#!/usr/bin/env bash
# The main job on a fresh machine: installs missing Debian packages (as root), builds spectree,
# and generates text from stories260K.gguf, first with plain decoding, then with n-gram tree
# speculation, printing speed, tau and the speed-up measured in this same run.
# Usage: scripts/demo.sh [MODEL] [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-../shared/models/stories260K.gguf}
prompt=${2:-Once upon a time}
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
common=(-m "$model" -p "$prompt" -n 256 --temp 0 --json)
echo "== plain decoding"
./build/spectree generate "${common[@]}" --speculative-algorithm NONE 2> >(tee /tmp/spectree-plain.$$ >&2)
echo "== n-gram tree speculation (output must be identical)"
./build/spectree generate "${common[@]}" --speculative-algorithm NGRAM \
    2> >(tee /tmp/spectree-spec.$$ >&2)
sleep 0.2
plain=$(grep -o '"gen_tok_s": [0-9.]*' /tmp/spectree-plain.$$ | awk '{print $2}')
spec=$(grep -o '"gen_tok_s": [0-9.]*' /tmp/spectree-spec.$$ | awk '{print $2}')
tau=$(grep -o '"tau": [0-9.]*' /tmp/spectree-spec.$$ | awk '{print $2}')
rm -f /tmp/spectree-plain.$$ /tmp/spectree-spec.$$
awk -v p="$plain" -v s="$spec" -v t="$tau" 'BEGIN {
    printf "summary: plain %.0f tok/s, speculative %.0f tok/s (tau %.2f), speed-up %.2fx\n", p, s, t, s / p }'
