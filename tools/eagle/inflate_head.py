#!/usr/bin/env python3
"""Widens an EAGLE-1 head the way `spectree-mkmodel --inflate` widens its target: the head's
weights go in the top-left corner of wider matrices, so that on the inflated target it computes
exactly what it computed on the original (up to float rounding) while its matrices stream like
a head of the wider model. The target's inflation keeps the head size and puts the real dims
first, so the widened head gets:

  fc       [D, 2D]: rows 0..d-1 take fc's embedding columns at 0..d-1 and its feature columns
           at D..D+d-1 (the input is [embedding (D); feature (D)]); everything else 0; bias 0
           past d. The head's state then has zeros past d, as the target's has.
  q, k, v  real heads first (head size kept, so D/head_dim heads and the same GQA ratio),
           columns past d zero, extra heads' rows zero;
  o        the real block, zero elsewhere (extra heads never reach the state);
  mlp      gate/up rows of the real units with columns past d zero; down rows past d zero; the
           intermediate size is kept;
  norm     post_attention_layernorm (and input_layernorm if present) scaled by sqrt(d/D) with
           rms_norm_eps scaled by d/D, so RMSNorm over D equals RMSNorm over d on the real dims;
  embed    dropped when present (the loader then uses the inflated target's embedding, which
           holds the same values in its first d columns).

  python3 tools/eagle/inflate_head.py SRC_DIR OUT_DIR --dim D
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eagle_lib  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--dim", type=int, required=True, help="the inflated target's width D")
    a = ap.parse_args()
    try:
        with open(os.path.join(a.src, "config.json")) as f:
            cfg = json.load(f)
        w, dtypes = eagle_lib.read_safetensors(os.path.join(a.src, "model.safetensors"))
    except (OSError, ValueError, eagle_lib.InputError) as e:
        sys.exit("inflate_head: %s" % e)
    d, D = int(cfg["hidden_size"]), a.dim
    nh, nkv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    hd = d // nh
    if D < d or D % hd or (D // hd) % (nh // nkv):
        sys.exit("inflate_head: --dim %d must be >= %d, a multiple of the head size %d, and give "
                 "a head count divisible by the GQA ratio %d" % (D, d, hd, nh // nkv))
    NH = D // hd
    NKV = NH // (nh // nkv)
    ff = int(cfg["intermediate_size"])

    def corner(src, rows, cols):
        out = np.zeros((rows, cols), np.float32)
        out[:src.shape[0], :src.shape[1]] = src
        return out

    o = {}
    fc = w["fc.weight"]  # [d, 2d]: columns [embedding | feature]
    nfc = np.zeros((D, 2 * D), np.float32)
    nfc[:d, :d] = fc[:, :d]
    nfc[:d, D:D + d] = fc[:, d:]
    o["fc.weight"] = nfc
    if "fc.bias" in w:
        o["fc.bias"] = np.concatenate([w["fc.bias"], np.zeros(D - d, np.float32)])
    scale = math.sqrt(d / D)
    for name in ("layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight"):
        if name in w:
            o[name] = np.concatenate([w[name] * scale, np.zeros(D - d, np.float32)])
    p = "layers.0.self_attn."
    o[p + "q_proj.weight"] = corner(w[p + "q_proj.weight"], NH * hd, D)
    o[p + "k_proj.weight"] = corner(w[p + "k_proj.weight"], NKV * hd, D)
    o[p + "v_proj.weight"] = corner(w[p + "v_proj.weight"], NKV * hd, D)
    o[p + "o_proj.weight"] = corner(w[p + "o_proj.weight"], D, NH * hd)
    m = "layers.0.mlp."
    o[m + "gate_proj.weight"] = corner(w[m + "gate_proj.weight"], ff, D)
    o[m + "up_proj.weight"] = corner(w[m + "up_proj.weight"], ff, D)
    o[m + "down_proj.weight"] = corner(w[m + "down_proj.weight"], D, ff)
    known = set(o) | {"embed_tokens.weight"}
    extra = sorted(set(w) - known)
    if extra:
        sys.exit("inflate_head: %s: unexpected tensor %s" % (a.src, extra[0]))
    cfg = dict(cfg)
    cfg.update(hidden_size=D, num_attention_heads=NH, num_key_value_heads=NKV,
               rms_norm_eps=float(cfg["rms_norm_eps"]) * d / D)
    info = dict(cfg.get("spectree", {}))
    info["inflated_from"] = os.path.abspath(a.src)
    info["inflate_command"] = "python3 tools/eagle/inflate_head.py %s %s --dim %d" % (a.src, a.out, D)
    cfg["spectree"] = info
    os.makedirs(a.out, exist_ok=True)
    dtype = dtypes.get("fc.weight", "F32")
    eagle_lib.write_safetensors(os.path.join(a.out, "model.safetensors"),
                                {k: torch.from_numpy(v) for k, v in o.items()}, dtype)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    print("inflate_head: wrote %s: hidden %d -> %d, heads %d/%d -> %d/%d" % (a.out, d, D, nh, nkv,
                                                                            NH, NKV),
          file=sys.stderr)


if __name__ == "__main__":
    main()
