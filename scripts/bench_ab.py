#!/usr/bin/env python3
"""Before/after benchmark of two builds in one run: alternates the two builds' `spectree-bench`
(e2e and decode) round by round, so that a machine whose speed drifts affects both alike, and
prints the median of the per-round ratios after/before.

    scripts/bench_ab.py BEFORE_BUILD_DIR AFTER_BUILD_DIR [-m MODEL] [--rounds R] [--prompt P]
        [--only e2e|decode] [--tokens T] [--decode-reps R] [--before-args A] [--after-args A]

--before-args/--after-args add options to one side's commands (e.g. the same build twice with
--before-args=--mmap --after-args=--no-mmap). Decode rows also give the weight bandwidth as a
fraction of the copy bandwidth measured in the same run ("of copy"), and the load mode that ran.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
ap.add_argument("before")
ap.add_argument("after")
ap.add_argument("-m", "--model", default=os.path.join(here, "..", "models", "stories260K.gguf"))
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--prompt", default="Once upon a time")
ap.add_argument("-n", type=int, default=256)
ap.add_argument("--reps", type=int, default=5, help="repetitions inside each e2e run")
ap.add_argument("--only", choices=["e2e", "decode"], help="run one benchmark only")
ap.add_argument("--tokens", type=int, default=128, help="decode: tokens per run")
ap.add_argument("--decode-reps", type=int, default=5, help="decode: runs per round (median)")
ap.add_argument("--before-args", default="", help="extra options for the before side")
ap.add_argument("--after-args", default="", help="extra options for the after side")
a = ap.parse_args()
extra = {"before": a.before_args.split(), "after": a.after_args.split()}


def run(build, args):
    exe = os.path.join(build, "spectree-bench")
    out = subprocess.run([exe] + args + ["--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{exe} {' '.join(args)} failed: {out.stderr.strip()}")
    return [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]


rows = {}  # metric -> {"before": [...], "after": [...]}
modes = {}  # side -> load modes its decode runs reported
loads = []  # the 1-minute load average after each round


def add(key, side, value):
    rows.setdefault(key, {"before": [], "after": []})[side].append(value)


for r in range(a.rounds):
    order = [("before", a.before), ("after", a.after)]
    if r % 2:
        order.reverse()
    for side, build in order:
        if a.only != "decode":
            for rec in run(build, ["e2e", "-m", a.model, "-p", a.prompt, "-n", str(a.n), "--reps",
                                   str(a.reps), "--no-self"] + extra[side]):
                name = rec.get("drafter", rec.get("name", "?"))
                add(f"e2e {name} plain tok/s", side, rec["plain_tok_s"])
                add(f"e2e {name} spec tok/s", side, rec["spec_tok_s"])
                add(f"e2e {name} speed-up", side, rec["speedup"])
        if a.only != "e2e":
            for rec in run(build, ["decode", "-m", a.model, "--reps", str(a.decode_reps),
                                   "--tokens", str(a.tokens)] + extra[side]):
                add("decode tok/s", side, rec["tok_s"])
                add("decode copy GB/s", side, rec["copy_gbps"])
                add("decode of copy (%)", side, 100.0 * rec["frac_copy"])
                modes.setdefault(side, set()).add(rec.get("load_mode", "mmap (no load modes)"))
    if os.path.exists("/proc/loadavg"):
        loads.append(float(open("/proc/loadavg").read().split()[0]))
    print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)

if loads:
    print(f"load average (1 min) after each round: {' '.join(f'{x:.2f}' for x in loads)}")
for side in ("before", "after"):
    if side in modes:
        print(f"{side}: decode load mode {', '.join(sorted(modes[side]))}")
print(f"{'metric':40s} {'before':>10s} {'after':>10s} {'after/before (median of rounds)':>32s}")
for key, v in rows.items():
    ratios = [x / y for x, y in zip(v["after"], v["before"]) if y > 0]
    print(f"{key:40s} {statistics.median(v['before']):10.1f} {statistics.median(v['after']):10.1f}"
          f" {statistics.median(ratios):32.3f}")
