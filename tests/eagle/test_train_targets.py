#!/usr/bin/python3
"""ctest test_eagle_train_targets: the trainers on targets their own GGUF reader does not read,
through the engine (train/eagle/eagle_lib.py engine_target, EngineTokenizer):
- train3.py for TinyStories-656K, a Hugging Face checkpoint directory with a byte-level BPE
  vocabulary: converted to f32 by `spectree convert`, its prompts tokenized by `spectree
  tokenize`; the head it writes drafts for that directory in `spectree generate` (EAGLE3), which
  prints plain decoding's text with drafts accepted.
- train.py for a Q4_K_M widening of stories260K (spectree-mkmodel --inflate): converted to f32
  into a file beside --data-cache, which a second run reuses and which leaves the bytes written
  alike; the head drafts for the Q4_K_M file (EAGLE) as above.
- Bad input: a --build without spectree and a directory that is no checkpoint, one line each.

usage: test_train_targets.py BUILD_DIR
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "train", "eagle", "train.py")
TRAIN3 = os.path.join(ROOT, "train", "eagle", "train3.py")
PY = sys.executable or "/usr/bin/python3"
PROMPTS = ["Once upon a time", "The little dog", "Tom and Sue went to the"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(args, cwd):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=400)


def last_line(r):
    lines = r.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def check_drafts(build, target, head, algo, tmp):
    """generate with the head on a fixed chain (K = 1, S = 4) prints plain decoding's text for
    every prompt, and drafts are accepted."""
    spectree = os.path.join(build, "spectree")
    accepted = 0
    for p in PROMPTS:
        plain = run([spectree, "generate", "-m", target, "-p", p, "-n", "64", "--temp", "0"], tmp)
        spec = run([spectree, "generate", "-m", target, "-p", p, "-n", "64", "--temp", "0",
                    "--speculative-algorithm", algo, "--speculative-draft-model-path", head,
                    "--speculative-eagle-topk", "1", "--speculative-num-steps", "4",
                    "--speculative-num-draft-tokens", "5"], tmp)
        check(plain.returncode == 0 and spec.returncode == 0 and spec.stdout == plain.stdout and
              len(plain.stdout) > 40, "%s on %s, %r: plain decoding's text (%s)" %
              (algo, os.path.basename(target), p, last_line(spec)))
        m = re.search(r"accepted drafts per step: ([0-9: ]+)", spec.stderr)
        if m:
            accepted += sum(int(a) * int(n) for a, n in (x.split(":") for x in m.group(1).split()))
    check(accepted > 0, "%s on %s: %d drafts accepted over %d prompts" %
          (algo, os.path.basename(target), accepted, len(PROMPTS)))


def main():
    build = os.path.abspath(sys.argv[1])
    ts = os.path.join(ROOT, "models", "TinyStories-656K")
    with open(os.path.join(ROOT, "train", "eagle", "prompts.txt"), encoding="utf-8") as f:
        prompts = f.read().splitlines()[:24]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "prompts.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(prompts) + "\n")
        common = ["--prompts", "prompts.txt", "--samples", "2", "--gen-tokens", "32", "--batch",
                  "8", "--steps", "20", "--warmup", "2", "--lr", "1e-2", "--seed", "7",
                  "--threads", "1", "--log-every", "10", "--build", build]

        # EAGLE-3 for a Hugging Face checkpoint with a byte-level BPE vocabulary
        r = run([PY, TRAIN3, "--target", ts, "--out", "ts3", "--layers", "0,1,2",
                 "--draft-vocab", "512", "--ttt-steps", "1"] + common, tmp)
        check(r.returncode == 0, "train3.py for TinyStories-656K exits 0 (%s)" % last_line(r))
        if r.returncode:
            print(r.stderr)
            sys.exit(1)
        check("a Hugging Face checkpoint directory; converting it to f32" in r.stderr and
              "convert: wrote" in r.stderr, "it says it converts the checkpoint, and does")
        cfg = json.load(open(os.path.join(tmp, "ts3", "config.json")))
        sp = cfg["spectree"]
        check(sp["target"] == "TinyStories-656K" and len(sp.get("target_f32_sha256", "")) == 64
              and cfg["vocab_size"] == 2048 and cfg["bos_token_id"] == 1,
              "config.json names the checkpoint and the f32 file read: %s" %
              {k: sp.get(k) for k in ("target", "target_f32_sha256", "target_f32_by")})
        check_drafts(build, ts, os.path.join(tmp, "ts3"), "EAGLE3", tmp)

        # EAGLE-1 for a K-quant GGUF, its conversion beside --data-cache
        q = os.path.join(tmp, "q4km.gguf")
        r = run([os.path.join(build, "spectree-mkmodel"), q, "--inflate",
                 os.path.join(ROOT, "models", "stories260K.gguf"), "--dim", "256", "--ff", "512",
                 "--layers", "5", "--type", "q4_k_m"], tmp)
        check(r.returncode == 0, "spectree-mkmodel writes the Q4_K_M widening (%s)" % last_line(r))
        cache = os.path.join(tmp, "cache")
        os.makedirs(cache)
        runs = []
        for name in ("k1", "k2"):
            r = run([PY, TRAIN, "--target", q, "--out", name, "--data-cache",
                     os.path.join(cache, "data.pt")] + common, tmp)
            check(r.returncode == 0, "train.py run %s for q4km.gguf exits 0 (%s)" %
                  (name, last_line(r)))
            runs.append(r.stderr)
        conv = [f for f in os.listdir(cache) if f.endswith(".f32.gguf")]
        check(len(conv) == 1 and conv[0].startswith("q4km.gguf-"),
              "one f32 conversion beside the data cache: %s" % conv)
        check("which the trainer does not read; converting it to f32" in runs[0] and
              "using its f32 conversion" in runs[1] and "convert: wrote" not in runs[1],
              "the first run converts the target, the second reuses the file")
        for fn in ("model.safetensors", "config.json"):
            with open(os.path.join(tmp, "k1", fn), "rb") as a, \
                    open(os.path.join(tmp, "k2", fn), "rb") as b:
                ba, bb = a.read(), b.read()
            if fn == "config.json":  # the command names its --out
                ba, bb = ba.replace(b"--out k1", b"--out k2"), bb
            check(ba == bb, "%s alike across the two runs" % fn)
        check_drafts(build, q, os.path.join(tmp, "k1"), "EAGLE", tmp)

        # bad input: one line each
        r = run([PY, TRAIN, "--target", ts, "--out", "x"] + common[:-1] + [tmp], tmp)
        check(r.returncode != 0 and "spectree: not found" in last_line(r) and "--build" in
              last_line(r), "--build without spectree: one-line error %r" % last_line(r))
        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        r = run([PY, TRAIN3, "--target", empty, "--out", "x", "--layers", "0,1,2"] + common, tmp)
        check(r.returncode != 0 and "spectree convert failed" in last_line(r) and
              "config.json" in last_line(r),
              "a directory that is no checkpoint: one-line error %r" % last_line(r))
    if failures:
        print("%d checks failed" % len(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
