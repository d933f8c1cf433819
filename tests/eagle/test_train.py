#!/usr/bin/python3
"""ctest test_eagle_train: retrains a tiny EAGLE-1 head for stories260K for a few steps, twice with
the same seed, and checks what train/eagle/train.py wrote: model.safetensors parsed here with its
own reader (header, keys, shapes, dtypes, data size), config.json's fields, that the loss fell,
that the two runs wrote byte-identical files, that train/eagle/eval.py loads the head, that
bad input gets a one-line error naming the file or field, and that a write failing midway leaves
the old file whole and no temporary file.

usage: test_train.py STORIES260K.gguf
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "train", "eagle", "train.py")
EVAL = os.path.join(ROOT, "train", "eagle", "eval.py")
PY = sys.executable or "/usr/bin/python3"
H, I, NH, NKV, V = 64, 172, 8, 4, 512
WANT = {
    "embed_tokens.weight": [V, H], "fc.weight": [H, 2 * H], "fc.bias": [H],
    "layers.0.self_attn.q_proj.weight": [NH * 8, H],
    "layers.0.self_attn.k_proj.weight": [NKV * 8, H],
    "layers.0.self_attn.v_proj.weight": [NKV * 8, H],
    "layers.0.self_attn.o_proj.weight": [H, NH * 8],
    "layers.0.post_attention_layernorm.weight": [H],
    "layers.0.mlp.gate_proj.weight": [I, H], "layers.0.mlp.up_proj.weight": [I, H],
    "layers.0.mlp.down_proj.weight": [H, I],
}
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(args, cwd):
    return subprocess.run([PY] + args, cwd=cwd, capture_output=True, text=True, timeout=300)


def parse_safetensors(path):
    """Own reader: 8-byte header length, JSON header, data tiled exactly by the tensors."""
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack_from("<Q", buf, 0)[0]
    assert 8 + n <= len(buf), "header length past the end"
    assert (8 + n) % 8 == 0, "data not 8-byte aligned"
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data_len = len(buf) - 8 - n
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    pos = 0
    for b, e in spans:
        assert b == pos, "hole or overlap at %d" % pos
        pos = e
    assert pos == data_len, "data size %d, tensors end at %d" % (data_len, pos)
    return header, meta, buf[8 + n:]


def main():
    target = os.path.abspath(sys.argv[1])
    with open(os.path.join(ROOT, "train", "eagle", "prompts.txt"), encoding="utf-8") as f:
        prompts = f.read().splitlines()[:24]
    common = ["--target", target, "--out", "head", "--prompts", "prompts.txt", "--samples", "2",
              "--gen-tokens", "24", "--batch", "8", "--steps", "40", "--warmup", "4", "--lr", "5e-3",
              "--seed", "7", "--threads", "1", "--log-every", "10"]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = []
        for name in ("a", "b"):
            d = os.path.join(tmp, name)
            os.makedirs(d)
            with open(os.path.join(d, "prompts.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(prompts) + "\n")
            r = run([TRAIN] + common, d)
            check(r.returncode == 0, "train.py run %s exits 0 (stderr tail: %s)" %
                  (name, r.stderr.strip().splitlines()[-1:] if r.stderr else ""))
            if r.returncode != 0:
                print(r.stderr)
                return
            dirs.append(os.path.join(d, "head"))
        check("step 40/40" in r.stderr and " acc " in r.stderr, "progress lines with step and acc")

        st = os.path.join(dirs[0], "model.safetensors")
        header, meta, data = parse_safetensors(st)
        check(sorted(header) == sorted(WANT), "exactly the EAGLE-1 keys: %s" % sorted(header))
        for k, shape in WANT.items():
            info = header.get(k, {})
            check(info.get("shape") == shape and info.get("dtype") == "F32",
                  "%s is F32 %s (got %s %s)" % (k, shape, info.get("dtype"), info.get("shape")))
            b, e = info.get("data_offsets", [0, -1])
            n = 1
            for s in shape:
                n *= s
            check(e - b == 4 * n, "%s holds %d bytes" % (k, 4 * n))
        check(meta == {"format": "pt"}, "__metadata__ is {format: pt}")

        # embed_tokens is the target's embedding, byte for byte (GGUF F32 rows are C-order)
        sys.path.insert(0, os.path.join(ROOT, "train", "eagle"))
        import eagle_lib as el
        _, tensors = el.read_gguf(target)
        b, e = header["embed_tokens.weight"]["data_offsets"]
        check(data[b:e] == tensors["token_embd.weight"].tobytes(),
              "embed_tokens.weight equals the target's token_embd.weight")

        with open(os.path.join(dirs[0], "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        for k, v in (("hidden_size", H), ("intermediate_size", I), ("num_attention_heads", NH),
                     ("num_key_value_heads", NKV), ("num_hidden_layers", 1), ("vocab_size", V),
                     ("rope_theta", 10000.0), ("bias", True), ("max_position_embeddings", 2048),
                     ("architectures", ["LlamaForCausalLM"])):
            check(cfg.get(k) == v, "config.json %s = %r (got %r)" % (k, v, cfg.get(k)))
        check(abs(cfg.get("rms_norm_eps", 0) - 1e-5) < 1e-9, "config.json rms_norm_eps 1e-5")
        sp = cfg.get("spectree", {})
        check(sp.get("target") == "stories260K.gguf" and len(sp.get("target_sha256", "")) == 64 and
              sp.get("seed") == 7 and "--seed 7" in sp.get("command", ""),
              "config.json spectree: target, sha256, seed, command")
        check(sp.get("loss_last", 1e9) < 0.8 * sp.get("loss_first", 0),
              "the loss fell: %s -> %s" % (sp.get("loss_first"), sp.get("loss_last")))

        for fn in ("model.safetensors", "config.json"):
            with open(os.path.join(dirs[0], fn), "rb") as f1, \
                    open(os.path.join(dirs[1], fn), "rb") as f2:
                check(f1.read() == f2.read(), "same seed, byte-identical %s" % fn)

        # training-time test and a wider MLP, with --gen-prompts and --data-cache: the run that
        # reads the cache writes the same bytes as the run that generated (and wrote) it
        base = [x for x in common if x not in ("--out", "head")]
        ext = base + ["--unroll", "3", "--unroll-decay", "0.8", "--intermediate-size", "96",
                      "--gen-prompts", "6", "--steps", "6"]
        for name, out in (("a", "tt1"), ("a", "tt2")):
            r = run([TRAIN] + ext + ["--out", out, "--data-cache", "data.pt"],
                    os.path.join(tmp, name))
            check(r.returncode == 0 and "loss" in r.stderr,
                  "train.py --unroll 3 --intermediate-size 96 --data-cache (%s) exits 0: %s" %
                  (out, r.stderr.strip().splitlines()[-1:]))
        check("30 prompts" in r.stderr and "from data.pt" in r.stderr,
              "the second run read the cached data of 24 + 6 prompts")
        tt = [os.path.join(tmp, "a", o, "model.safetensors") for o in ("tt1", "tt2")]
        if all(os.path.exists(p) for p in tt):
            with open(tt[0], "rb") as f1, open(tt[1], "rb") as f2:
                check(f1.read() == f2.read(), "the cached data gives byte-identical heads")
            h2, _, _ = parse_safetensors(tt[0])
            check(h2["layers.0.mlp.gate_proj.weight"]["shape"] == [96, H] and
                  h2["layers.0.mlp.down_proj.weight"]["shape"] == [H, 96],
                  "--intermediate-size 96 widens gate/up/down")
        r = run([TRAIN] + base + ["--out", "ft", "--init", dirs[0], "--unroll", "2", "--steps", "3"],
                os.path.join(tmp, "b"))
        ft = {}
        if r.returncode == 0:
            with open(os.path.join(tmp, "b", "ft", "config.json"), encoding="utf-8") as f:
                ft = json.load(f).get("spectree", {}).get("init") or {}
        check(ft.get("model_sha256") == el.sha256_file(st),
              "--init fine-tunes the given head and records its sha256 (%s)" % ft)

        r = run([EVAL, "--target", target, "--head", dirs[0], "--gen-tokens", "24"], tmp)
        tau = float(r.stdout.split()[1]) if r.returncode == 0 and r.stdout.startswith("tau") else -1
        check(1.0 <= tau <= 5.0, "eval.py loads the head: tau %.3f in [1, 5]" % tau)

        # bad input: one line naming the file or field, exit status 1
        def bad(args, words, what):
            r = run(args, tmp)
            lines = r.stderr.strip().splitlines()
            check(r.returncode == 1 and len(lines) == 1 and all(w in lines[0] for w in words),
                  "%s: %s" % (what, lines))

        bad([TRAIN, "--target", os.path.join(tmp, "none.gguf"), "--out", "x"],
            ["none.gguf", "cannot read"], "missing target")
        trunc = os.path.join(tmp, "trunc.gguf")
        with open(target, "rb") as f, open(trunc, "wb") as g:
            g.write(f.read()[:5000])
        bad([TRAIN, "--target", trunc, "--out", "x"], ["trunc.gguf", "truncated"], "truncated GGUF")
        empty = os.path.join(tmp, "empty.txt")
        open(empty, "w").close()
        bad([TRAIN, "--target", target, "--out", "x", "--prompts", empty],
            ["empty.txt", "no prompts"], "empty prompts file")
        header.pop("fc.bias")
        hb = json.dumps(header).encode()
        hb += b" " * (-len(hb) % 8)
        broken = os.path.join(tmp, "broken")
        os.makedirs(broken)
        with open(os.path.join(broken, "config.json"), "w") as f:
            json.dump(cfg, f)
        with open(os.path.join(broken, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb + data)
        bad([EVAL, "--target", target, "--head", broken],
            ["model.safetensors", "data"], "a head whose tensors do not tile the data")
        import torch
        loaded, _ = el.read_safetensors(st)
        del loaded["fc.bias"]
        el.write_safetensors(os.path.join(broken, "model.safetensors"),
                             {k: torch.from_numpy(v.copy()) for k, v in loaded.items()}, "F32")
        bad([EVAL, "--target", target, "--head", broken],
            ["model.safetensors", "fc.bias", "missing"], "a head without fc.bias")

        # every file the trainers write appears whole or not at all: a write that fails midway
        # leaves the old file as it was and no temporary file beside it
        check(sorted(os.listdir(dirs[0])) == ["config.json", "model.safetensors"],
              "a head directory holds its two files only: %s" % sorted(os.listdir(dirs[0])))
        with open(st, "rb") as f:
            before = f.read()

        def fails(f):
            f.write(b"half a file")
            raise OSError("the disk is full")
        try:
            el.write_whole(st, fails)
            check(False, "write_whole passes its writer's error on")
        except OSError:
            pass
        with open(st, "rb") as f:
            check(f.read() == before, "a failed write leaves model.safetensors as it was")
        check(sorted(os.listdir(dirs[0])) == ["config.json", "model.safetensors"],
              "a failed write leaves no temporary file: %s" % sorted(os.listdir(dirs[0])))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: test_train.py STORIES260K.gguf")
    main()
    print("%d failures" % len(failures))
    sys.exit(1 if failures else 0)
