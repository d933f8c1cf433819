#!/usr/bin/env python3
"""Independent numpy reference for an EAGLE-1/2 head (FORMATS.md d.1) over a GGUF target.

Reads the head's config.json and model.safetensors with its own parser (F32/F16/BF16) and runs
it as the published code does, in float64 and in the Hugging Face layout (half-split RoPE,
rotate_half): head position t reads (embedding of token x_{t+1}, the target's final-normed state
f_t); h = fc([e; f]) (+ bias); h += Attn(input_norm?(h)); h += MLP(post_norm(h)); logits = the
target's output layer applied to h. The target's states come from llama_ref.Model.

usage: eagle_ref.py TARGET.gguf HEAD_DIR DRAFT_TOKEN TOKEN...
prints one line of logits per head position 0 .. n-2 (the catch-up over TOKEN...), then one
more: the draft step at position n-1 with DRAFT_TOKEN and, as its feature, the head's output at
position n-2.
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import Model  # noqa: E402


def read_safetensors(path):
    buf = open(path, "rb").read()
    n = struct.unpack_from("<Q", buf, 0)[0]
    header = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = buf[base + a:base + b]
        dt = info["dtype"]
        if dt == "F32":
            v = np.frombuffer(raw, np.float32)
        elif dt == "F16":
            v = np.frombuffer(raw, np.float16).astype(np.float32)
        elif dt == "BF16":
            v = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit("oracle: dtype %s" % dt)
        out[name] = v.reshape(info["shape"]).astype(np.float64)
    return out


class Head:
    def __init__(self, d, target):
        cfg = json.load(open(os.path.join(d, "config.json")))
        self.w = read_safetensors(os.path.join(d, "model.safetensors"))
        self.dim = cfg["hidden_size"]
        self.nh = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads", self.nh)
        self.hd = cfg.get("head_dim", self.dim // self.nh)
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.theta = cfg.get("rope_theta", 10000.0)
        self.emb = self.w.get("embed_tokens.weight", target.t["token_embd.weight"])
        self.lm = target.out
        self.keys, self.vals = [], []

    def norm(self, x, w):
        return x / np.sqrt(np.mean(x * x) + self.eps) * w

    def rope(self, v, pos, nh):
        v = v.reshape(nh, self.hd)
        half = self.hd // 2
        f = self.theta ** (-2.0 * np.arange(half) / self.hd)
        c, s = np.cos(pos * f), np.sin(pos * f)
        x1, x2 = v[:, :half], v[:, half:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=1).reshape(-1)

    def step(self, tok, feat, pos):
        w = self.w
        p = "layers.0."
        x = w["fc.weight"] @ np.concatenate([self.emb[tok], feat])
        if "fc.bias" in w:
            x = x + w["fc.bias"]
        xn = self.norm(x, w[p + "input_layernorm.weight"]) if p + "input_layernorm.weight" in w \
            else x
        q = self.rope(w[p + "self_attn.q_proj.weight"] @ xn, pos, self.nh)
        k = self.rope(w[p + "self_attn.k_proj.weight"] @ xn, pos, self.nkv)
        v = w[p + "self_attn.v_proj.weight"] @ xn
        self.keys.append(k.reshape(self.nkv, self.hd))
        self.vals.append(v.reshape(self.nkv, self.hd))
        K, V = np.array(self.keys), np.array(self.vals)
        g = self.nh // self.nkv
        att = np.zeros(self.nh * self.hd)
        for h in range(self.nh):
            sc = K[:, h // g, :] @ q[h * self.hd:(h + 1) * self.hd] / np.sqrt(self.hd)
            sc = np.exp(sc - sc.max())
            att[h * self.hd:(h + 1) * self.hd] = (sc / sc.sum()) @ V[:, h // g, :]
        x = x + w[p + "self_attn.o_proj.weight"] @ att
        xn = self.norm(x, w[p + "post_attention_layernorm.weight"])
        a = w[p + "mlp.gate_proj.weight"] @ xn
        b = w[p + "mlp.up_proj.weight"] @ xn
        x = x + w[p + "mlp.down_proj.weight"] @ (a / (1 + np.exp(-a)) * b)
        return x, self.lm @ x


def main():
    target = Model(sys.argv[1])
    head = Head(sys.argv[2], target)
    draft = int(sys.argv[3])
    toks = [int(v) for v in sys.argv[4:]]
    feats = [target.hidden(t, i) for i, t in enumerate(toks)]
    h = None
    for t in range(len(toks) - 1):
        h, lg = head.step(toks[t + 1], feats[t], t)
        print(" ".join("%.9g" % v for v in lg))
    _, lg = head.step(draft, h, len(toks) - 1)
    print(" ".join("%.9g" % v for v in lg))


if __name__ == "__main__":
    main()
