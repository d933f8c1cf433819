#!/usr/bin/python3
"""Converts an EAGLE head as its authors publish it (SafeAILab/EAGLE: a `pytorch_model.bin`
state_dict beside a Llama `config.json`) to the layout spectree's loader reads
(st_eagle_head_load, st_eagle3_head_load; FORMATS.md d): `model.safetensors` and `config.json`.

EAGLE-1/2 (the authors' eagle/model/cnets.py `Model`): fc.weight [H, 2H], fc.bias [H] (unless
built with bias=False), layers.0.self_attn.{q,k,v,o}_proj.weight,
layers.0.post_attention_layernorm.weight, layers.0.mlp.{gate,up,down}_proj.weight, optionally
layers.0.input_layernorm.weight and embed_tokens.weight [V, H].
EAGLE-3 (eagle/traineagle3/cnets.py): fc.weight [H, 3 H_t],
midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight,
midlayer.self_attn.{q,k,v}_proj.weight [*, 2H], midlayer.self_attn.o_proj.weight,
midlayer.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight [V', H] (absent when tied),
d2t [V'] (int64), t2d [V] (bool), optionally embed_tokens.weight.

The names are the same in both layouts; the conversion checks every key and shape against the
config (a missing, misshapen or unexpected key is an error naming it), drops the rotary tables
older transformers saved as buffers (`*.rotary_emb.inv_freq`: spectree computes them from
rope_theta), keeps each tensor's dtype (F32, F16, BF16) unless --dtype says otherwise, and writes
a config with the fields spectree reads made explicit ("bias", "draft_vocab_size"). The q/k rows
stay in Hugging Face's half-split RoPE order, which is the published layout spectree loads.

usage: convert_published.py SRC DST [--dtype keep|f32|f16|bf16]
  SRC: a directory holding pytorch_model.bin and config.json (or the .bin file itself, with its
       config.json beside it); DST: the directory to write (created).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eagle_lib as el  # noqa: E402

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
DERIVED = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def fail(msg):
    raise el.InputError(msg)


def cfg_int(cfg, path, key, default=None):
    v = cfg.get(key, default)
    if v is None:
        fail("%s: %s is missing" % (path, key))
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        fail("%s: %s is %r, not a positive integer" % (path, key, v))
    return v


def expected(cfg, cpath, sd, eagle3):
    """{name: (shape, required)} of the head described by cfg, and the config fields to write."""
    H = cfg_int(cfg, cpath, "hidden_size")
    nh = cfg_int(cfg, cpath, "num_attention_heads")
    nkv = cfg_int(cfg, cpath, "num_key_value_heads", nh)
    hd = cfg_int(cfg, cpath, "head_dim", H // nh)
    F = cfg_int(cfg, cpath, "intermediate_size")
    V = cfg_int(cfg, cpath, "vocab_size")
    n_layer = cfg_int(cfg, cpath, "num_hidden_layers", 1)
    if n_layer != 1:
        fail("%s: num_hidden_layers is %d; spectree's EAGLE heads have one layer" % (cpath, n_layer))
    extra = {}
    if not eagle3:
        w = {"fc.weight": ([H, 2 * H], True), "fc.bias": ([H], False),
             "embed_tokens.weight": ([V, H], False)}
        p, inner = "layers.0.", H
        w[p + "input_layernorm.weight"] = ([H], False)
        bias = cfg.get("bias", "fc.bias" in sd)
        if not isinstance(bias, bool):
            fail("%s: bias is %r, not true or false" % (cpath, bias))
        if bias != ("fc.bias" in sd):
            fail("%s: \"bias\" is %s but the state_dict %s fc.bias" %
                 (cpath, "true" if bias else "false", "lacks" if bias else "has"))
        w["fc.bias"] = ([H], bias)
        extra["bias"] = bias
    else:
        Ht = cfg_int(cfg, cpath, "target_hidden_size", H)
        Vd = cfg_int(cfg, cpath, "draft_vocab_size", V)
        if Vd > V:
            fail("%s: draft_vocab_size %d is above vocab_size %d" % (cpath, Vd, V))
        tie = cfg.get("tie_word_embeddings", False)
        if not isinstance(tie, bool):
            fail("%s: tie_word_embeddings is %r, not true or false" % (cpath, tie))
        w = {"fc.weight": ([H, 3 * Ht], True), "norm.weight": ([H], True),
             "lm_head.weight": ([Vd, H], not tie), "d2t": ([Vd], Vd < V), "t2d": ([V], False),
             "embed_tokens.weight": ([V, H], H != Ht)}
        p, inner = "midlayer.", 2 * H
        w[p + "input_layernorm.weight"] = ([H], True)
        w[p + "hidden_norm.weight"] = ([H], True)
        extra["draft_vocab_size"] = Vd
        extra["target_hidden_size"] = Ht
    w[p + "self_attn.q_proj.weight"] = ([nh * hd, inner], True)
    w[p + "self_attn.k_proj.weight"] = ([nkv * hd, inner], True)
    w[p + "self_attn.v_proj.weight"] = ([nkv * hd, inner], True)
    w[p + "self_attn.o_proj.weight"] = ([H, nh * hd], True)
    w[p + "post_attention_layernorm.weight"] = ([H], True)
    w[p + "mlp.gate_proj.weight"] = ([F, H], True)
    w[p + "mlp.up_proj.weight"] = ([F, H], True)
    w[p + "mlp.down_proj.weight"] = ([H, F], True)
    return w, extra


def load_state_dict(path):
    try:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True)
        except TypeError:  # a torch without weights_only
            sd = torch.load(path, map_location="cpu")
    except FileNotFoundError:
        fail("%s: no such file" % path)
    except Exception as e:  # a truncated or foreign file: torch's own message
        fail("%s: not a torch state_dict: %s" % (path, e))
    if not isinstance(sd, dict) or not all(isinstance(k, str) and torch.is_tensor(v)
                                           for k, v in sd.items()):
        fail("%s: not a state_dict ({name: tensor})" % path)
    return sd


def convert(src, dst, dtype="keep"):
    """Converts the published head at src (directory or .bin) into dst; returns (kind, names)."""
    if not os.path.exists(src):
        fail("%s: no such file or directory" % src)
    if os.path.isdir(src):
        bpath, cpath = os.path.join(src, "pytorch_model.bin"), os.path.join(src, "config.json")
    else:
        bpath, cpath = src, os.path.join(os.path.dirname(os.path.abspath(src)), "config.json")
    try:
        with open(cpath, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        fail("%s: cannot read: %s" % (cpath, e))
    if not isinstance(cfg, dict):
        fail("%s: not a JSON object" % cpath)
    sd = load_state_dict(bpath)
    sd = {k: v for k, v in sd.items() if not k.endswith(DERIVED)}
    eagle3 = any(k.startswith("midlayer.") for k in sd)
    want, extra = expected(cfg, cpath, sd, eagle3)
    missing = [k for k, (_, req) in want.items() if req and k not in sd]
    if missing:
        fail("%s: missing %s (required in an %s head)" %
             (bpath, ", ".join(missing), "EAGLE-3" if eagle3 else "EAGLE-1/2"))
    unexpected = sorted(k for k in sd if k not in want)
    if unexpected:
        fail("%s: unexpected %s (not part of an %s head%s)" %
             (bpath, ", ".join(unexpected), "EAGLE-3" if eagle3 else "EAGLE-1/2",
              "; more than one layer is not supported" if any(
                  k.startswith("layers.") and not k.startswith("layers.0.") for k in unexpected)
              else ""))
    out = {}
    for k, (shape, _) in want.items():
        if k not in sd:
            continue
        t = sd[k]
        if list(t.shape) != shape:
            fail("%s: %s has shape %s, %s expects %s" % (bpath, k, list(t.shape), cpath, shape))
        if k == "d2t":
            if t.dtype not in (torch.int64, torch.int32):
                fail("%s: d2t is %s, not an integer tensor" % (bpath, t.dtype))
            out[k] = (t, "I64")
        elif k == "t2d":
            if t.dtype != torch.bool:
                fail("%s: t2d is %s, not a bool tensor" % (bpath, t.dtype))
            out[k] = (t, "BOOL")
        else:
            if t.dtype not in DTYPES:
                fail("%s: %s is %s (float32, float16 or bfloat16 expected)" % (bpath, k, t.dtype))
            out[k] = (t, DTYPES[t.dtype] if dtype == "keep" else dtype.upper())
    cfg = dict(cfg, num_hidden_layers=1, **extra)
    if dtype != "keep":
        cfg["torch_dtype"] = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype]
    os.makedirs(dst, exist_ok=True)
    el.write_safetensors_maps(os.path.join(dst, "model.safetensors"), out)
    el.write_json(os.path.join(dst, "config.json"), cfg)
    return ("EAGLE3" if eagle3 else "EAGLE"), list(out)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Converts a published EAGLE head (pytorch_model.bin + config.json) to "
        "spectree's safetensors layout.")
    ap.add_argument("src", help="directory with pytorch_model.bin and config.json, or the .bin")
    ap.add_argument("dst", help="directory to write model.safetensors and config.json into")
    ap.add_argument("--dtype", default="keep", choices=["keep", "f32", "f16", "bf16"],
                    help="the weights' type in model.safetensors (default: as stored)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if os.path.exists(args.dst) and not os.path.isdir(args.dst):
        el.die("%s exists and is not a directory" % args.dst)
    try:
        kind, names = convert(args.src, args.dst, args.dtype)
    except el.InputError as e:
        el.die(str(e))
    el.log("wrote %s/model.safetensors (%d tensors) and %s/config.json: an %s head (use "
           "--speculative-algorithm %s)" % (args.dst, len(names), args.dst,
                                            "EAGLE-3" if kind == "EAGLE3" else "EAGLE-1/2", kind))


if __name__ == "__main__":
    main()
