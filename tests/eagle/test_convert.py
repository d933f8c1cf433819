#!/usr/bin/python3
"""ctest test_eagle_convert: train/eagle/convert_published.py on heads in the EAGLE authors'
layout. The committed stories260K heads (written by train.py and train3.py) are saved as the
authors publish theirs (export_published.py: pytorch_model.bin with their key names, the rotary
inv_freq buffer older transformers stored, a plain config.json), converted back, and checked:
every tensor equal to the directly written head's with the same dtype, the config's fields
spectree reads equal, and `spectree generate` with the converted head drafting exactly as with
the original (the same accepted-drafts histogram, greedy and sampled, tree and chain) and
printing the same text. A conversion to F16 loads and generates plain decoding's text. Missing,
misshapen and unexpected keys, a second layer and a config contradicting the weights each get a
one-line error naming the key, and write nothing.

usage: test_convert.py BUILD_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "train", "eagle")
sys.path.insert(0, TRAIN)
import eagle_lib as el  # noqa: E402

PY = sys.executable or "/usr/bin/python3"
TARGET = os.path.join(ROOT, "models", "stories260K.gguf")
HEADS = [("EAGLE", os.path.join(ROOT, "models", "eagle-stories260K")),
         ("EAGLE3", os.path.join(ROOT, "models", "eagle3-stories260K"))]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(args):
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def script(name, *args):
    return run([PY, os.path.join(TRAIN, name)] + list(args))


def generate(build, algo, head, temp, shape):
    k, s, n = shape
    r = run([os.path.join(build, "spectree"), "generate", "-m", TARGET, "-p",
             "Grandma baked cookies for the whole family", "-n", "96", "--temp", str(temp),
             "-s", "5", "-t", "1", "--speculative-algorithm", algo,
             "--speculative-draft-model-path", head, "--speculative-eagle-topk", str(k),
             "--speculative-num-steps", str(s), "--speculative-num-draft-tokens", str(n),
             "--json"])
    if r.returncode != 0:
        return None, r.stderr.strip()[-300:]
    rec = json.loads([l for l in r.stderr.splitlines() if l.startswith("{")][-1])
    return (r.stdout, rec["accept_hist"], rec["spec_steps"]), ""


def bad_case(tmp, pub, name, edit_sd=None, edit_cfg=None):
    """A copy of the published head pub with its state_dict or config edited; the converter's
    (returncode, stderr, whether it wrote anything)."""
    d = os.path.join(tmp, "bad_" + name)
    os.makedirs(d)
    sd = torch.load(os.path.join(pub, "pytorch_model.bin"))
    with open(os.path.join(pub, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    if edit_sd:
        edit_sd(sd)
    if edit_cfg:
        edit_cfg(cfg)
    torch.save(sd, os.path.join(d, "pytorch_model.bin"))
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    out = os.path.join(tmp, "out_" + name)
    r = script("convert_published.py", d, out)
    return r.returncode, r.stderr.strip(), os.path.exists(os.path.join(out, "model.safetensors"))


def main():
    build = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        for algo, head in HEADS:
            pub, conv = os.path.join(tmp, "pub_" + algo), os.path.join(tmp, "conv_" + algo)
            r = script("export_published.py", head, pub, "--inv-freq")
            check(r.returncode == 0, "%s: export_published.py writes the authors' layout %s" %
                  (algo, r.stderr.strip()[-200:]))
            sd = torch.load(os.path.join(pub, "pytorch_model.bin"))
            check(any(k.endswith("rotary_emb.inv_freq") for k in sd) and "fc.weight" in sd,
                  "%s: the state_dict has the authors' names and an inv_freq buffer" % algo)
            r = script("convert_published.py", pub, conv)
            check(r.returncode == 0 and ("--speculative-algorithm %s)" % algo) in r.stderr,
                  "%s: convert_published.py converts it: %s" % (algo, r.stderr.strip()[-200:]))
            a, da = el.read_safetensors(os.path.join(head, "model.safetensors"), maps=True)
            b, db = el.read_safetensors(os.path.join(conv, "model.safetensors"), maps=True)
            check(sorted(a) == sorted(b) and da == db and
                  all(a[k].shape == b[k].shape and (a[k] == b[k]).all() for k in a),
                  "%s: the converted tensors equal the directly written head's (%d, same dtypes)"
                  % (algo, len(a)))
            with open(os.path.join(head, "config.json"), encoding="utf-8") as f:
                ca = json.load(f)
            with open(os.path.join(conv, "config.json"), encoding="utf-8") as f:
                cb = json.load(f)
            ca.pop("spectree", None)
            check(all(cb.get(k) == v for k, v in ca.items()),
                  "%s: the converted config keeps every field of the original's" % algo)
            for temp in (0, 0.8):
                for shape in ((4, 4, 12), (1, 4, 5)):
                    want, err = generate(build, algo, head, temp, shape)
                    got, err2 = generate(build, algo, conv, temp, shape)
                    check(want is not None and got == want and want[2] > 0,
                          "%s temp %g K/S/N %s: the converted head drafts as the original "
                          "(accepted drafts per step %s) %s%s" %
                          (algo, temp, "/".join(map(str, shape)), got and got[1], err, err2))
            f16 = os.path.join(tmp, "f16_" + algo)
            r = script("convert_published.py", pub, f16, "--dtype", "f16")
            got, err = generate(build, algo, f16, 0.8, (4, 4, 12))
            plain = run([os.path.join(build, "spectree"), "generate", "-m", TARGET, "-p",
                         "Grandma baked cookies for the whole family", "-n", "96", "--temp",
                         "0.8", "-s", "5", "-t", "1"])
            check(r.returncode == 0 and got is not None and got[0] == plain.stdout,
                  "%s: --dtype f16 converts to a head that loads and keeps plain decoding's text "
                  "%s" % (algo, err))

        pub1, pub3 = os.path.join(tmp, "pub_EAGLE"), os.path.join(tmp, "pub_EAGLE3")
        cases = [
            ("missing", pub1, lambda sd: sd.pop("layers.0.mlp.up_proj.weight"), None,
             "missing layers.0.mlp.up_proj.weight"),
            ("shape", pub1, lambda sd: sd.update({"layers.0.self_attn.o_proj.weight":
                                                  sd["layers.0.self_attn.o_proj.weight"][:, :32]}),
             None, "layers.0.self_attn.o_proj.weight has shape [64, 32]"),
            ("unexpected", pub1, lambda sd: sd.update({"lm_head.weight": torch.zeros(512, 64)}),
             None, "unexpected lm_head.weight"),
            ("two_layers", pub1, lambda sd: sd.update({"layers.1.mlp.up_proj.weight":
                                                       sd["layers.0.mlp.up_proj.weight"]}),
             None, "more than one layer is not supported"),
            ("bias", pub1, None, lambda c: c.update({"bias": False}), "fc.bias"),
            ("layers", pub1, None, lambda c: c.update({"num_hidden_layers": 2}),
             "num_hidden_layers is 2"),
            ("d2t", pub3, lambda sd: sd.pop("d2t"), None, "missing d2t"),
            ("t2d_type", pub3, lambda sd: sd.update({"t2d": sd["t2d"].to(torch.int64)}), None,
             "t2d is torch.int64"),
            ("lm_head", pub3, lambda sd: sd.update({"lm_head.weight": sd["lm_head.weight"][:10]}),
             None, "lm_head.weight has shape [10, 64]"),
            ("dtype", pub3, lambda sd: sd.update({"norm.weight": sd["norm.weight"].double()}),
             None, "norm.weight is torch.float64"),
        ]
        for name, pub, esd, ecfg, want in cases:
            rc, err, wrote = bad_case(tmp, pub, name, esd, ecfg)
            check(rc != 0 and want in err and len(err.splitlines()) == 1 and not wrote,
                  "%s: refused with one line naming it: %s" % (name, err))
        r = script("convert_published.py", os.path.join(tmp, "nothing"), os.path.join(tmp, "o"))
        check(r.returncode != 0 and "no such file or directory" in r.stderr and
              len(r.stderr.strip().splitlines()) == 1,
              "a directory without the files: one line: %s" % r.stderr.strip())
    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
