#!/usr/bin/env bash
# Trains candidate EAGLE-3 heads for stories260K on one GPU in one run (docs/EAGLE.md,
# "EAGLE-3"): the data is generated once per data size on the CPU (train3.py --data-cache), then
# the candidates train side by side on the GPU (--device cuda), the main one twice to show that
# its bytes are reproducible, and the main command also 20 steps on the CPU and on the GPU to
# show that the two devices give different bytes. Writes WORK/NAME/{config.json,
# model.safetensors}, WORK/NAME.log and WORK/summary.txt, and, if OUTDIR is given, one archive
# OUTDIR/heads.tgz of them (data caches left out).
#
# usage: gpu_train3.sh TARGET.gguf WORK [OUTDIR]   (from the repository root)
# Environment (a dry run on the CPU sets them small): DEVICE (cuda), BUDGET (seconds after which
# the training runs still going are stopped, keeping their last --save-every checkpoint; 330),
# EPOCHS_MAIN (60), EPOCHS_BIG (30), SAMPLES_MAIN (8), SAMPLES_BIG (16), CMP_STEPS (20),
# PROMPTS (a prompts file; default train3.py's), PYTHON (python3).
set -uo pipefail
target=$1 work=$2 outdir=${3:-}
dev=${DEVICE:-cuda} budget=${BUDGET:-330} py=${PYTHON:-python3}
ep_main=${EPOCHS_MAIN:-60} ep_big=${EPOCHS_BIG:-30}
s_main=${SAMPLES_MAIN:-8} s_big=${SAMPLES_BIG:-16} cmp=${CMP_STEPS:-20}
export PYTHONUNBUFFERED=1
mkdir -p "$work"
start=$(date +%s)
pargs=()
[ -n "${PROMPTS:-}" ] && pargs=(--prompts "$PROMPTS")
common=(--target "$target" "${pargs[@]}" --draft-vocab 256 --ttt-steps 4 --seed 1 --threads 1)
main=(--layers 1,3,5 --samples "$s_main" --data-cache "$work/s$s_main.pt" --intermediate-size 688
      --batch 64 --epochs "$ep_main" --warmup 100 --log-every 100 --save-every 200)

t3() { # NAME ARGS...: one train3.py run, stopped at the budget's end
    local name=$1 left
    shift
    left=$((budget - ($(date +%s) - start)))
    [ "$left" -lt 5 ] && left=5
    timeout "$left" "$py" train/eagle/train3.py --out "$work/$name" "${common[@]}" "$@" \
        >"$work/$name.log" 2>&1
    echo "$name: exit $? after $(($(date +%s) - start)) s: $(tail -n 1 "$work/$name.log")"
}

echo "device $dev; $("$py" -c 'import torch; print("torch", torch.__version__, "cuda",
      torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else "")')"
# the committed command (docs/EAGLE.md, "EAGLE-3") run to its full schedule; it makes its own data
t3 A --layers 1,3,5 --samples 2 --epochs 15 --batch 64 --warmup 10 --save-every 10 \
    --log-every 10 --device "$dev" &
# the data, once per size (one step trained on the CPU, thrown away)
t3 gen_main --layers 1,3,5 --samples "$s_main" --data-cache "$work/s$s_main.pt" --stop-after 1 &
g1=$!
t3 gen_big --layers 1,3,5 --samples "$s_big" --data-cache "$work/s$s_big.pt" --stop-after 1 &
g2=$!
wait $g1
t3 B "${main[@]}" --device "$dev" &                 # the main candidate
t3 B2 "${main[@]}" --device "$dev" &                # the same command again: same bytes?
t3 C "${main[@]/1,3,5/3,4,5}" --device "$dev" &     # the top three layers' inputs instead
t3 cmp_cpu "${main[@]}" --stop-after "$cmp" &       # the main command on the CPU ...
t3 cmp_dev "${main[@]}" --stop-after "$cmp" --device "$dev" & # ... and on the device
wait $g2
big=("${main[@]}")
big[3]=$s_big big[5]=$work/s$s_big.pt big[11]=$ep_big
t3 D "${big[@]}" --device "$dev" &                  # twice the data, the same number of steps
wait

{
    echo "after $(($(date +%s) - start)) s"
    for n in A B B2 C D cmp_cpu cmp_dev; do
        [ -f "$work/$n/model.safetensors" ] || { echo "$n: no head"; continue; }
        echo "$n: $(sha256sum <"$work/$n/model.safetensors" | cut -c1-64) $("$py" -c '
import json, sys
s = json.load(open(sys.argv[1]))["spectree"]
print("steps", s["steps"], "loss", s["loss_first"], "->", s["loss_last"])' "$work/$n/config.json")"
        grep -h "acc per step" "$work/$n.log" | tail -n 1
    done
} | tee "$work/summary.txt"
if [ -n "$outdir" ]; then
    (cd "$work" && tar czf "$outdir/heads.tgz" --exclude='*.pt' --exclude='*.tmp' ./*)
fi
