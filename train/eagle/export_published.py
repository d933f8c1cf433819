#!/usr/bin/python3
"""Writes a head in spectree's layout (what train.py and train3.py write: model.safetensors and
config.json) the way the EAGLE authors publish theirs: the state_dict of their model, with their
key names (the same names, torch tensors: float weights, EAGLE-3's d2t int64 and t2d bool), as
`pytorch_model.bin` beside a plain Llama `config.json` (the "spectree" provenance dropped). The
test of convert_published.py round-trips the committed heads through it.

usage: export_published.py HEAD_DIR OUT_DIR [--inv-freq]
  --inv-freq  also store layers.0.self_attn.rotary_emb.inv_freq (or midlayer's), the buffer
              older transformers saved in every Llama state_dict
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eagle_lib as el  # noqa: E402

TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def export(head, out, inv_freq=False):
    cpath = os.path.join(head, "config.json")
    try:
        with open(cpath, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise el.InputError("%s: cannot read: %s" % (cpath, e))
    tensors, dtypes = el.read_safetensors(os.path.join(head, "model.safetensors"), maps=True)
    sd = {}
    for k, a in tensors.items():
        dt = dtypes[k]
        if dt == "I64":
            sd[k] = torch.from_numpy(np.array(a, dtype=np.int64))
        elif dt == "BOOL":
            sd[k] = torch.from_numpy(np.array(a, dtype=np.bool_))
        else:  # read as float32, exact for F16 and BF16
            sd[k] = torch.from_numpy(np.array(a, dtype=np.float32)).to(TORCH[dt])
    if inv_freq:
        hd = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        theta = cfg.get("rope_theta", 10000.0)
        p = "midlayer." if any(k.startswith("midlayer.") for k in sd) else "layers.0."
        sd[p + "self_attn.rotary_emb.inv_freq"] = 1.0 / (
            theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    cfg.pop("spectree", None)
    os.makedirs(out, exist_ok=True)
    el.write_whole(os.path.join(out, "pytorch_model.bin"), lambda f: torch.save(sd, f))
    el.write_json(os.path.join(out, "config.json"), cfg)
    return list(sd)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Writes a spectree-layout EAGLE head as the EAGLE "
                                 "authors publish theirs (pytorch_model.bin + config.json).")
    ap.add_argument("head", help="a head directory: model.safetensors and config.json")
    ap.add_argument("out", help="the directory to write pytorch_model.bin and config.json into")
    ap.add_argument("--inv-freq", action="store_true",
                    help="also store the rotary inv_freq buffer older transformers saved")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        names = export(args.head, args.out, args.inv_freq)
    except el.InputError as e:
        el.die(str(e))
    el.log("wrote %s/pytorch_model.bin (%d tensors) and %s/config.json" %
           (args.out, len(names), args.out))


if __name__ == "__main__":
    main()
