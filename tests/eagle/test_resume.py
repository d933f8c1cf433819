#!/usr/bin/python3
"""ctest test_eagle_resume: both trainers (train/eagle/train.py, train3.py) cut short and resumed.

For each trainer, on a tiny stories260K run: an uninterrupted run (with --checkpoint, written
every 3 steps), a run stopped by --stop-after 5 (it writes its checkpoint at step 5), and the
same command as the first with --resume reading that checkpoint: the resumed run must write the
uninterrupted run's model.safetensors and config.json byte for byte (the recorded command drops
--resume), and its progress lines must carry an ETA. train3.py --init also starts from a head:
its first step's loss is below that of a run from random weights. Bad input: --resume without
--checkpoint, and a checkpoint read by a run with other options, get one-line errors naming the
option.

usage: test_resume.py STORIES260K.gguf
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable or "/usr/bin/python3"
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(args, cwd):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)


def last_line(r):
    lines = r.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def trainer(name, extra, target, tmp, prompts):
    script = os.path.join(ROOT, "train", "eagle", name)
    common = ["--target", target, "--out", "head", "--prompts", "prompts.txt", "--samples", "2",
              "--gen-tokens", "16", "--batch", "8", "--steps", "9", "--warmup", "2",
              "--lr", "5e-3", "--seed", "3", "--threads", "1", "--log-every", "2",
              "--data-cache", os.path.join(tmp, name + ".pt"), "--checkpoint", "ckpt.pt",
              "--checkpoint-every", "3"] + extra
    dirs = {}
    for run_name in ("whole", "cut"):
        d = os.path.join(tmp, name + "-" + run_name)
        os.makedirs(d)
        with open(os.path.join(d, "prompts.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(prompts) + "\n")
        dirs[run_name] = d
    r = run([PY, script] + common, dirs["whole"])
    check(r.returncode == 0, "%s: the uninterrupted run exits 0 (%s)" % (name, last_line(r)))
    check(" ETA " in r.stderr and "checkpoint: step 3 written" in r.stderr,
          "%s: progress lines carry an ETA; checkpoints are written" % name)
    r = run([PY, script] + common + ["--stop-after", "5"], dirs["cut"])
    check(r.returncode == 0 and "checkpoint: step 5 written" in r.stderr,
          "%s: --stop-after 5 writes its checkpoint at step 5 (%s)" % (name, last_line(r)))
    cut = {}
    with open(os.path.join(dirs["cut"], "head", "model.safetensors"), "rb") as f:
        cut["model.safetensors"] = f.read()
    r = run([PY, script] + common + ["--resume"], dirs["cut"])
    check(r.returncode == 0 and "resuming at step 5" in r.stderr,
          "%s: --resume continues at step 5 (%s)" % (name, last_line(r)))
    for fn in ("model.safetensors", "config.json"):
        with open(os.path.join(dirs["whole"], "head", fn), "rb") as fa, \
                open(os.path.join(dirs["cut"], "head", fn), "rb") as fb:
            a, b = fa.read(), fb.read()
        check(a == b, "%s: the resumed run writes the uninterrupted run's %s" % (name, fn))
        if fn == "model.safetensors":
            check(cut[fn] != a, "%s: (the head after 5 steps differs from the one after 9)" % name)
    # a checkpoint read with other options: refused, naming the option
    other = list(common)
    other[other.index("--lr") + 1] = "1e-3"
    r = run([PY, script] + other + ["--resume"], dirs["cut"])
    check(r.returncode != 0 and "--lr" in last_line(r) and "other options" in last_line(r),
          "%s: a checkpoint of other options: one-line error %r" % (name, last_line(r)))
    r = run([PY, script] + [a for a in common if a not in ("ckpt.pt", "--checkpoint")] +
            ["--resume"], dirs["cut"])
    check(r.returncode != 0 and "--resume needs --checkpoint" in last_line(r),
          "%s: --resume without --checkpoint: one-line error %r" % (name, last_line(r)))
    return common, dirs


def main():
    target = os.path.abspath(sys.argv[1])
    with open(os.path.join(ROOT, "train", "eagle", "prompts.txt"), encoding="utf-8") as f:
        prompts = f.read().splitlines()[:12]
    with tempfile.TemporaryDirectory() as tmp:
        trainer("train.py", ["--unroll", "2", "--noise", "0.2"], target, tmp, prompts)
        e3 = ["--layers", "1,3,5", "--draft-vocab", "64", "--ttt-steps", "2"]
        common, dirs = trainer("train3.py", e3, target, tmp, prompts)
        # --init: fine-tune the uninterrupted run's head; it starts where that one ended
        head = os.path.join(dirs["whole"], "head")
        first = json.load(open(os.path.join(head, "config.json")))["spectree"]["loss_first"]
        r = run([PY, os.path.join(ROOT, "train", "eagle", "train3.py")] +
                common[:-len(e3)] + ["--layers", "1,3,5", "--ttt-steps", "3", "--init", head,
                                                      "--out", "ft", "--stop-after", "1"],
                dirs["whole"])
        cfg = json.load(open(os.path.join(dirs["whole"], "ft", "config.json"))) \
            if r.returncode == 0 else {}
        sp = cfg.get("spectree", {})
        check(r.returncode == 0 and sp.get("loss_first", 1e9) < first and
              sp.get("init", {}).get("dir") == "head" and cfg.get("draft_vocab_size") == 64 and
              sp.get("layers_read") == [1, 3, 5],
              "train3.py --init: keeps the head's vocabulary and layers, its first loss %s is "
              "below a fresh head's %s (%s)" % (sp.get("loss_first"), first, last_line(r)))
        r = run([PY, os.path.join(ROOT, "train", "eagle", "train3.py")] +
                common[:-len(e3)] + ["--init", head, "--draft-vocab", "32",
                                                      "--out", "ft2"], dirs["whole"])
        check(r.returncode != 0 and "--draft-vocab 32 differs from the --init head's 64" in
              last_line(r), "train3.py --init with another --draft-vocab: one-line error %r" %
              last_line(r))
    if failures:
        print("%d checks failed" % len(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
