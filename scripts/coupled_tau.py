#!/usr/bin/env python3
"""Acceptance (tau: tokens per speculative step, pooled over every step of every run) of
seed-coupled drafting against the drafters' own top-K (`--draft-coupled on|off`), through
`spectree generate --json` over held-out prompts, several seeds and temperatures; prints a
Markdown table. Also checks that each pair of runs printed the same text (lossless).

usage: coupled_tau.py [--bin build/spectree] [--target MODEL] [--drafter ALGO:PATH]...
                      [--prompts train/eagle/heldout.txt] [--temps 0.3,0.8,1.2]
                      [--seeds 1,2,3] [--shape K/S/N] [-n 128]
Default drafters: stories260K's EAGLE and EAGLE-3 heads and stories260K drafting for itself.
"""
import argparse
import json
import subprocess
import sys

DRAFTERS = [
    ("EAGLE", "models/eagle-stories260K"),
    ("EAGLE3", "models/eagle3-stories260K"),
    ("STANDALONE", "models/stories260K.gguf"),
]


def run(a, algo, head, prompt, temp, seed, coupled):
    k, s, n = a.shape.split("/")
    cmd = [a.bin, "generate", "-m", a.target, "-p", prompt, "-n", str(a.n), "--temp", str(temp),
           "-s", str(seed), "-t", "1", "--speculative-algorithm", algo,
           "--speculative-draft-model-path", head, "--speculative-eagle-topk", k,
           "--speculative-num-steps", s, "--speculative-num-draft-tokens", n,
           "--draft-coupled", coupled, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rec = json.loads([l for l in p.stderr.splitlines() if l.startswith("{")][-1])
    emitted = sum((i + 1) * c for i, c in enumerate(rec["accept_hist"]))
    return p.stdout, rec["spec_steps"], emitted


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/spectree")
    ap.add_argument("--target", default="models/stories260K.gguf")
    ap.add_argument("--prompts", default="train/eagle/heldout.txt")
    ap.add_argument("--temps", default="0.3,0.8,1.2")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--shape", default="4/6/16")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--drafter", action="append", help="ALGO:PATH (repeatable)")
    a = ap.parse_args()
    drafters = [tuple(d.split(":", 1)) for d in a.drafter] if a.drafter else DRAFTERS
    prompts = [l.strip() for l in open(a.prompts) if l.strip()]
    temps = [float(t) for t in a.temps.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    print(f"target {a.target}, K/S/N {a.shape}, {len(prompts)} prompts x seeds {a.seeds}, "
          f"-n {a.n}\n")
    print("| drafter | draft | temp | tau off | tau on | on/off |")
    print("| --- | --- | --- | --- | --- | --- |")
    bad = 0
    for algo, head in drafters:
        for t in temps:
            tot = {"off": [0, 0], "on": [0, 0]}
            for p in prompts:
                for sd in seeds:
                    outs = {}
                    for c in ("off", "on"):
                        outs[c], steps, em = run(a, algo, head, p, t, sd, c)
                        tot[c][0] += steps
                        tot[c][1] += em
                    if outs["off"] != outs["on"]:
                        bad += 1
                        print(f"MISMATCH {algo} temp {t} seed {sd}: {p}", file=sys.stderr)
            off = tot["off"][1] / max(tot["off"][0], 1)
            on = tot["on"][1] / max(tot["on"][0], 1)
            print(f"| {algo} | {head} | {t} | {off:.3f} | {on:.3f} | {on / off:.3f} |", flush=True)
    if bad:
        print(f"{bad} pairs of runs differ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
