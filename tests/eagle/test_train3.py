#!/usr/bin/python3
"""ctest test_eagle3_train: retrains a tiny EAGLE-3 head for stories260K for a few steps, twice
with the same seed, and checks what train/eagle/train3.py wrote: model.safetensors parsed here
with its own reader (keys and shapes of the published layout, F32 weights, d2t I64 and t2d BOOL
consistent: every draft id on a distinct target id, t2d marking exactly those, the most frequent
tokens of the training text chosen), config.json's fields (draft_vocab_size, the layers read as
eagle_aux_hidden_state_layer_ids), that the loss fell, that the two runs wrote byte-identical
files, that the C engine loads the head for the target (`spectree info --target`) and generates
with it, and that bad options get a one-line error.

usage: test_train3.py STORIES260K.gguf BUILD_DIR
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "train", "eagle", "train3.py")
PY = sys.executable or "/usr/bin/python3"
H, I, NH, NKV, V, D = 64, 172, 8, 4, 512, 96
WANT = {
    "fc.weight": [H, 3 * H],
    "midlayer.input_layernorm.weight": [H], "midlayer.hidden_norm.weight": [H],
    "midlayer.self_attn.q_proj.weight": [NH * 8, 2 * H],
    "midlayer.self_attn.k_proj.weight": [NKV * 8, 2 * H],
    "midlayer.self_attn.v_proj.weight": [NKV * 8, 2 * H],
    "midlayer.self_attn.o_proj.weight": [H, NH * 8],
    "midlayer.post_attention_layernorm.weight": [H],
    "midlayer.mlp.gate_proj.weight": [I, H], "midlayer.mlp.up_proj.weight": [I, H],
    "midlayer.mlp.down_proj.weight": [H, I],
    "norm.weight": [H], "lm_head.weight": [D, H], "d2t": [D], "t2d": [V],
}
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(args, cwd):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)


def parse_safetensors(path):
    """Own reader: 8-byte header length, JSON header, data tiled exactly by the tensors."""
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack_from("<Q", buf, 0)[0]
    assert 8 + n <= len(buf), "header length past the end"
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    pos = 0
    for b, e in spans:
        assert b == pos, "hole or overlap at %d" % pos
        pos = e
    assert pos == len(buf) - 8 - n, "data size mismatch"
    return header, buf[8 + n:]


def check_default_layers():
    """train3.py's default layers: EAGLE-3's 2, L/2, L-3 where those are three distinct layers,
    else three distinct ones spread to a shallow target's top; a 1-layer target refused."""
    sys.path.insert(0, os.path.dirname(TRAIN))
    import train3  # noqa: E402
    import eagle_lib  # noqa: E402
    got = {L: train3.default_layers(L) for L in range(2, 41)}
    check(all(0 <= v[0] < v[1] < v[2] <= L for L, v in got.items()),
          "default layers: three distinct layers in 0..L for L = 2..40")
    check(all(got[L] == [2, L // 2, L - 3] for L in range(7, 41)),
          "default layers: EAGLE-3's 2, L/2, L-3 from 7 layers on (22: %s)" % got[22])
    check(got[5] == [1, 3, 5] and got[2] == [0, 1, 2] and got[6] == [2, 4, 6],
          "default layers of shallow targets: 5 -> %s, 2 -> %s, 6 -> %s" % (got[5], got[2], got[6]))
    try:
        train3.default_layers(1)
        check(False, "a 1-layer target is refused")
    except eagle_lib.InputError as e:
        check("needs 2 or more" in str(e), "a 1-layer target is refused (%s)" % e)


def main():
    target = os.path.abspath(sys.argv[1])
    build = os.path.abspath(sys.argv[2])
    check_default_layers()
    with open(os.path.join(ROOT, "train", "eagle", "prompts.txt"), encoding="utf-8") as f:
        prompts = f.read().splitlines()[:16]
    common = ["--target", target, "--out", "head", "--prompts", "prompts.txt", "--samples", "2",
              "--gen-tokens", "24", "--batch", "8", "--steps", "12", "--warmup", "2",
              "--lr", "5e-3", "--seed", "7", "--threads", "1", "--log-every", "4",
              "--layers", "1,3,5", "--draft-vocab", str(D), "--ttt-steps", "3"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("a", "b"):
            d = os.path.join(tmp, name)
            os.makedirs(d)
            with open(os.path.join(d, "prompts.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(prompts) + "\n")
            # run a generates the data and writes --data-cache, run b reads it
            r = run([PY, TRAIN] + common + ["--data-cache", os.path.join(tmp, "data.pt")], d)
            check(r.returncode == 0, "train3.py run %s exits 0 (stderr tail: %s)" %
                  (name, r.stderr.strip().splitlines()[-1:] if r.stderr else ""))
            if r.returncode:
                print(r.stderr)
                sys.exit(1)
            check(("from %s" % os.path.join(tmp, "data.pt") in r.stderr) == (name == "b"),
                  "run %s %s the data cache" % (name, "reads" if name == "b" else "writes"))
        a, b = os.path.join(tmp, "a", "head"), os.path.join(tmp, "b", "head")
        for fn in ("model.safetensors", "config.json"):
            with open(os.path.join(a, fn), "rb") as fa, open(os.path.join(b, fn), "rb") as fb:
                check(fa.read() == fb.read(), "%s identical across two runs with one seed (the "
                      "second reading the first's --data-cache)" % fn)
        header, data = parse_safetensors(os.path.join(a, "model.safetensors"))
        check(set(header) == set(WANT), "tensor names are the published EAGLE-3 layout: %s" %
              sorted(set(header) ^ set(WANT)))
        for k, shape in WANT.items():
            if k in header:
                check(header[k]["shape"] == shape, "%s shape %s" % (k, header[k]["shape"]))
                want_dt = "I64" if k == "d2t" else "BOOL" if k == "t2d" else "F32"
                check(header[k]["dtype"] == want_dt, "%s dtype %s" % (k, header[k]["dtype"]))
        if "d2t" in header and "t2d" in header:
            b0, e0 = header["d2t"]["data_offsets"]
            d2t = struct.unpack("<%dq" % D, data[b0:e0])
            b1, e1 = header["t2d"]["data_offsets"]
            t2d = list(data[b1:e1])
            ids = [i + o for i, o in enumerate(d2t)]
            check(all(0 <= t < V for t in ids) and len(set(ids)) == D and ids == sorted(ids),
                  "d2t maps the draft ids to distinct target ids, in order")
            check(t2d == [1 if t in set(ids) else 0 for t in range(V)], "t2d marks exactly them")
        cfg = json.load(open(os.path.join(a, "config.json")))
        check(cfg.get("draft_vocab_size") == D and cfg.get("vocab_size") == V,
              "config.json vocab_size %s, draft_vocab_size %s" %
              (cfg.get("vocab_size"), cfg.get("draft_vocab_size")))
        check(cfg.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids") == [0, 2, 4],
              "layers 1,3,5 recorded as eagle_aux_hidden_state_layer_ids [0, 2, 4]")
        sp = cfg.get("spectree", {})
        check(sp.get("steps") == 12 and sp.get("loss_last", 1e9) < sp.get("loss_first", 0),
              "12 steps, loss fell: %s -> %s" % (sp.get("loss_first"), sp.get("loss_last")))
        r = run([os.path.join(build, "spectree"), "info", "-m", a, "--target", target], tmp)
        check(r.returncode == 0 and "EAGLE-3" in r.stdout and "drafts over %d" % D in r.stdout
              and "inputs of layers 1, 3, 5" in r.stdout,
              "spectree info loads it for the target: %s" % (r.stdout + r.stderr).strip()[-200:])
        r = run([os.path.join(build, "spectree"), "generate", "-m", target, "-p", "Once upon",
                 "-n", "24", "--temp", "0", "--speculative-algorithm", "EAGLE3",
                 "--speculative-draft-model-path", a, "--speculative-eagle-topk", "2",
                 "--speculative-num-steps", "3"], tmp)
        p = run([os.path.join(build, "spectree"), "generate", "-m", target, "-p", "Once upon",
                 "-n", "24", "--temp", "0"], tmp)
        check(r.returncode == 0 and r.stdout == p.stdout and len(p.stdout) > 20,
              "spectree generate with it prints plain decoding's text")
        # bad options: one line each
        for bad, want in ((["--layers", "1,3"], "exactly three layers"),
                          (["--layers", "1,3,9"], "layer 9 outside 0..5")):
            r = run([PY, TRAIN] + common[:-6] + bad + ["--draft-vocab", "8"],
                    os.path.join(tmp, "a"))
            last = r.stderr.strip().splitlines()[-1:] if r.stderr else [""]
            check(r.returncode != 0 and want in last[0], "%s: one-line error %r" % (bad, last))
        # --device cuda: trains where torch sees a GPU, else a one-line error
        r = run([PY, TRAIN] + common + ["--device", "cuda", "--out", "cuda"],
                os.path.join(tmp, "a"))
        last = r.stderr.strip().splitlines()[-1:] if r.stderr else [""]
        if "finds no CUDA device" in last[0]:
            check(r.returncode != 0 and last[0].startswith("train3.py: error: --device cuda"),
                  "--device cuda without a GPU: one-line error %r" % last)
        else:
            cfg = json.load(open(os.path.join(tmp, "a", "cuda", "config.json")))
            check(r.returncode == 0 and cfg["spectree"]["device"] == "cuda",
                  "--device cuda trains on the GPU and records it: %r" % last)
    if failures:
        print("%d checks failed" % len(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
