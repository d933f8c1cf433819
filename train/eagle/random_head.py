#!/usr/bin/env python3
"""Writes an EAGLE head with random weights in the layout of another head: the same
config.json and the same tensor names, shapes and dtype, every weight drawn from a normal
distribution with standard deviation 1/sqrt(fan-in) (norm weights 1, fc bias 0). Its drafts
are as good as guesses: the head that `auto` must recognize as never paying (the bar asks
that auto then lose at most 3% against plain decoding).

  python3 train/eagle/random_head.py LIKE_DIR OUT_DIR [--seed N]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eagle_lib  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("like", help="a head directory (config.json + model.safetensors)")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    try:
        src = os.path.join(a.like, "model.safetensors")
        tensors, dtypes = eagle_lib.read_safetensors(src)
        with open(os.path.join(a.like, "config.json"), encoding="utf-8") as f:
            json.load(f)  # a readable config, copied as it is
    except (eagle_lib.InputError, OSError, ValueError) as e:
        eagle_lib.die(str(e))
    dts = set(dtypes.values())
    if len(dts) != 1:
        eagle_lib.die("%s: tensors of several dtypes (%s)" % (src, ", ".join(sorted(dts))))
    rng = np.random.default_rng(a.seed)
    out = {}
    for name, t in tensors.items():
        if name.endswith("norm.weight"):
            r = np.ones(t.shape, np.float32)
        elif name == "fc.bias":
            r = np.zeros(t.shape, np.float32)
        else:
            r = rng.standard_normal(t.shape).astype(np.float32) / np.sqrt(t.shape[-1])
        out[name] = torch.from_numpy(r)
    os.makedirs(a.out, exist_ok=True)
    eagle_lib.write_safetensors(os.path.join(a.out, "model.safetensors"), out, dts.pop())
    with open(os.path.join(a.like, "config.json"), "rb") as f:
        cfg = f.read()
    eagle_lib.write_whole(os.path.join(a.out, "config.json"), lambda f: f.write(cfg))
    print("random_head: wrote %s: %d random tensors in the layout of %s" % (a.out, len(out),
                                                                          a.like))


if __name__ == "__main__":
    main()
