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

An EAGLE-3 head (midlayer.*) widens the same way: fc [D, 3D] takes each of its three d-wide input
blocks at 0, D and 2D; q/k/v read [input_layernorm(embedding) (D); hidden_norm(state) (D)], so
their columns take the original's at 0..d-1 and D..D+d-1; input_layernorm, hidden_norm,
post_attention_layernorm and the final norm are scaled by sqrt(d/D); lm_head [V', D] gets zero
columns past d; d2t and t2d are kept. The layers it reads are kept too: the inflated target's
extra layers pass the residual stream through unchanged, so the output of layer l < L_src is the
same in its first d dims.

  python3 train/eagle/inflate_head.py SRC_DIR OUT_DIR --dim D
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
        w, dtypes = eagle_lib.read_safetensors(os.path.join(a.src, "model.safetensors"),
                                               maps=True)
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

    if "midlayer.self_attn.q_proj.weight" in w:
        return inflate3(a, cfg, w, dtypes, d, D, hd, NH, NKV, ff, corner)
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
    dtype = dtypes.get("fc.weight", "F32")
    write(a, cfg, {k: (torch.from_numpy(v), dtype) for k, v in o.items()}, d, D, NH, NKV)


def write(a, cfg, tensors, d, D, NH, NKV):
    """The widened head's config.json (sizes, heads, epsilon, where it came from) and tensors."""
    nh, nkv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    cfg = dict(cfg)
    cfg.update(hidden_size=D, num_attention_heads=NH, num_key_value_heads=NKV,
               rms_norm_eps=float(cfg["rms_norm_eps"]) * d / D)
    if "target_hidden_size" in cfg:
        cfg["target_hidden_size"] = D
    info = dict(cfg.get("spectree", {}))
    info["inflated_from"] = eagle_lib.portable_path(a.src)
    info["inflate_command"] = eagle_lib.portable_command("inflate_head.py",
                                                         [a.src, a.out, "--dim", str(D)])
    cfg["spectree"] = info
    os.makedirs(a.out, exist_ok=True)
    eagle_lib.write_safetensors_maps(os.path.join(a.out, "model.safetensors"), tensors)
    eagle_lib.write_json(os.path.join(a.out, "config.json"), cfg)
    print("inflate_head: wrote %s: hidden %d -> %d, heads %d/%d -> %d/%d" % (a.out, d, D, nh, nkv,
                                                                            NH, NKV),
          file=sys.stderr)


def inflate3(a, cfg, w, dtypes, d, D, hd, NH, NKV, ff, corner):
    """EAGLE-3 (see the module's text)."""
    th = int(cfg.get("target_hidden_size", d))
    if th != d:
        sys.exit("inflate_head: %s: target_hidden_size %d differs from hidden_size %d" %
                 (a.src, th, d))
    scale = math.sqrt(d / D)
    z = np.zeros(D - d, np.float32)
    o = {}
    fc = w["fc.weight"]  # [d, 3d]: three target layers' states
    nfc = np.zeros((D, 3 * D), np.float32)
    for j in range(3):
        nfc[:d, j * D:j * D + d] = fc[:, j * d:(j + 1) * d]
    o["fc.weight"] = nfc
    m = "midlayer."
    for name in ("input_layernorm.weight", "hidden_norm.weight",
                 "post_attention_layernorm.weight"):
        o[m + name] = np.concatenate([w[m + name] * scale, z])

    def two(src, rows):  # [rows_src, 2d] -> [rows, 2D]: [embedding | state] columns
        out = np.zeros((rows, 2 * D), np.float32)
        out[:src.shape[0], :d] = src[:, :d]
        out[:src.shape[0], D:D + d] = src[:, d:]
        return out

    p = m + "self_attn."
    o[p + "q_proj.weight"] = two(w[p + "q_proj.weight"], NH * hd)
    o[p + "k_proj.weight"] = two(w[p + "k_proj.weight"], NKV * hd)
    o[p + "v_proj.weight"] = two(w[p + "v_proj.weight"], NKV * hd)
    o[p + "o_proj.weight"] = corner(w[p + "o_proj.weight"], D, NH * hd)
    p = m + "mlp."
    o[p + "gate_proj.weight"] = corner(w[p + "gate_proj.weight"], ff, D)
    o[p + "up_proj.weight"] = corner(w[p + "up_proj.weight"], ff, D)
    o[p + "down_proj.weight"] = corner(w[p + "down_proj.weight"], D, ff)
    o["norm.weight"] = np.concatenate([w["norm.weight"] * scale, z])
    o["lm_head.weight"] = corner(w["lm_head.weight"], w["lm_head.weight"].shape[0], D)
    extra = sorted(set(w) - set(o) - {"d2t", "t2d", "embed_tokens.weight"})
    if extra:
        sys.exit("inflate_head: %s: unexpected tensor %s" % (a.src, extra[0]))
    dtype = dtypes.get("fc.weight", "F32")
    t = {k: (torch.from_numpy(v), dtype) for k, v in o.items()}
    t["d2t"] = (torch.from_numpy(w["d2t"].astype(np.int64)), "I64")
    t["t2d"] = (torch.from_numpy(w["t2d"].astype(np.bool_)), "BOOL")
    write(a, cfg, t, d, D, NH, NKV)


if __name__ == "__main__":
    main()
