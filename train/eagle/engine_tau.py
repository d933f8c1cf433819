#!/usr/bin/python3
"""Measures an EAGLE head's acceptance through the engine: runs `spectree generate` with the head
on every held-out prompt (greedy, chain drafting K=1, S drafts per step, --json) and prints each
prompt's tau (mean accepted length, bonus token included) and their mean: the figure the heads'
tau >= 3.0 is about."""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    ap = argparse.ArgumentParser(prog="engine_tau.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--spectree", default=os.path.join(ROOT, "build", "spectree"),
                    help="the spectree program")
    ap.add_argument("--target", required=True, help="the target model (GGUF)")
    ap.add_argument("--head", required=True, help="the head's directory")
    ap.add_argument("--prompts", default=os.path.join(HERE, "heldout.txt"),
                    help="held-out prompts, one per line")
    ap.add_argument("-n", type=int, default=128, help="tokens per prompt")
    ap.add_argument("--topk", default="1", help="--speculative-eagle-topk")
    ap.add_argument("--steps", default="4", help="--speculative-num-steps")
    ap.add_argument("-v", action="store_true", help="print each prompt's tau")
    args = ap.parse_args()
    try:
        with open(args.prompts, encoding="utf-8") as f:
            prompts = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
    except (OSError, UnicodeDecodeError) as e:
        sys.exit("engine_tau.py: error: %s: %s" % (args.prompts, e))
    taus, hist = [], []
    for p in prompts:
        cmd = [args.spectree, "generate", "-m", args.target, "-p", p, "--temp", "0", "-n",
               str(args.n), "-t", "1", "--speculative-algorithm", "EAGLE",
               "--speculative-draft-model-path", args.head, "--speculative-eagle-topk", args.topk,
               "--speculative-num-steps", args.steps, "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("engine_tau.py: error: %s failed: %s" %
                     (" ".join(cmd), r.stderr.strip().splitlines()[-1:]))
        stats = json.loads(r.stderr.strip().splitlines()[-1])
        taus.append(stats["tau"])
        h = stats.get("accept_hist", [])
        hist = [x + y for x, y in zip(hist + [0] * (len(h) - len(hist)), h + [0] * len(hist))]
        if args.v:
            print("%.4f  %s" % (stats["tau"], p))
    cycles = sum(hist)
    print("accepted drafts per step, all prompts: %s (%d steps; pooled tau %.4f)" %
          (hist, cycles, sum((a + 1) * c for a, c in enumerate(hist)) / max(cycles, 1)))
    print("mean tau %.4f over %d prompts (min %.4f, max %.4f)" %
          (sum(taus) / len(taus), len(taus), min(taus), max(taus)))


if __name__ == "__main__":
    main()
