#!/usr/bin/env bash
# Mean tau (accepted drafts + 1 per speculative step) through the engine over held-out prompts:
# `spectree generate` greedy, -n 128, a fixed chain (K=1, S=4 unless given), one line per prompt.
# usage: engine_tau.sh SPECTREE TARGET.gguf ALGO HEAD_DIR [PROMPTS] [K] [S]
set -euo pipefail
bin=$1 target=$2 algo=$3 head=$4
prompts=${5:-$(dirname "$0")/heldout.txt} k=${6:-1} s=${7:-4}
sum=0 n=0
while IFS= read -r p; do
    [ -z "$p" ] && continue
    tau=$("$bin" generate -m "$target" -p "$p" -n 128 --temp 0 -t 1 --speculative-algorithm "$algo" \
        --speculative-draft-model-path "$head" --speculative-eagle-topk "$k" \
        --speculative-num-steps "$s" 2>&1 >/dev/null | sed -n 's/.* tau \([0-9.]*\) tokens.*/\1/p')
    sum=$(echo "$sum + $tau" | bc -l)
    n=$((n + 1))
done <"$prompts"
printf '%s %s K=%s S=%s: mean tau %.3f over %d prompts\n' "$algo" "$head" "$k" "$s" \
    "$(echo "$sum / $n" | bc -l)" "$n"
