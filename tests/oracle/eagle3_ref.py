#!/usr/bin/env python3
"""Independent numpy reference for an EAGLE-3 head (FORMATS.md d.2) over a GGUF target.

Runs the head as SafeAILab/EAGLE's EAGLE-3 code does, in float64 and in the Hugging Face layout
(half-split RoPE): the target's features are the residual streams entering three of its layers
(config eagle_config.eagle_aux_hidden_state_layer_ids + 1, else 2, L//2, L-3), concatenated low
to high; head position t reads (embedding of x_{t+1}, g = fc(features of t)); its layer attends
over q/k/v of [input_layernorm(e); hidden_norm(g)] with g as the residual; its output h (before
the final norm) is the next draft step's g; logits = lm_head(norm(h)) over the draft vocabulary.

usage: eagle3_ref.py TARGET.gguf HEAD_DIR DRAFT_TOKEN TOKEN...
prints one line of draft-vocabulary logits per head position 0 .. n-2 (the catch-up over
TOKEN...), then one more: the draft step at position n-1 with DRAFT_TOKEN and the head's output
at position n-2 as its state; then a line with the target id of each draft id (d2t applied).
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import Model  # noqa: E402


class Target(Model):
    def layer_inputs(self, tok, pos, layers):
        """The residual stream entering each of `layers` (n_layer: the last output, pre-norm)."""
        t = self.t
        x = t["token_embd.weight"][tok].copy()
        g = self.n_head // self.n_kv
        seen = {}
        for l in range(self.n_layer):
            seen[l] = x.copy()
            p = "blk.%d." % l
            xb = self.norm(x, t[p + "attn_norm.weight"])
            q = self.rope(t[p + "attn_q.weight"] @ xb, pos, self.n_head)
            k = self.rope(t[p + "attn_k.weight"] @ xb, pos, self.n_kv)
            v = t[p + "attn_v.weight"] @ xb
            self.kc[l].append(k)
            self.vc[l].append(v)
            K = np.array(self.kc[l]).reshape(len(self.kc[l]), self.n_kv, self.hd)
            V = np.array(self.vc[l]).reshape(len(self.vc[l]), self.n_kv, self.hd)
            out = np.zeros(self.dim)
            for h in range(self.n_head):
                sc = K[:, h // g, :] @ q[h * self.hd:(h + 1) * self.hd] / np.sqrt(self.hd)
                sc = np.exp(sc - sc.max())
                out[h * self.hd:(h + 1) * self.hd] = (sc / sc.sum()) @ V[:, h // g, :]
            x = x + t[p + "attn_output.weight"] @ out
            xb = self.norm(x, t[p + "ffn_norm.weight"])
            a = t[p + "ffn_gate.weight"] @ xb
            b = t[p + "ffn_up.weight"] @ xb
            x = x + t[p + "ffn_down.weight"] @ (a / (1 + np.exp(-a)) * b)
        seen[self.n_layer] = x.copy()
        return np.concatenate([seen[l] for l in layers])


class Head3:
    def __init__(self, d, target):
        cfg = json.load(open(os.path.join(d, "config.json")))
        self.w = read_safetensors_raw(os.path.join(d, "model.safetensors"))
        self.dim = cfg["hidden_size"]
        self.nh = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads", self.nh)
        self.hd = cfg.get("head_dim", self.dim // self.nh)
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.theta = cfg.get("rope_theta", 10000.0)
        L = target.n_layer
        ids = cfg.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids")
        self.layers = [i + 1 for i in ids] if ids is not None else [2, L // 2, L - 3]
        self.emb = self.w.get("embed_tokens.weight", target.t["token_embd.weight"])
        nd = cfg.get("draft_vocab_size", cfg["vocab_size"])
        d2t = self.w.get("d2t")
        self.d2t = np.arange(nd) + (d2t.astype(np.int64) if d2t is not None else 0)
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

    def step(self, tok, g, pos):
        w = self.w
        p = "midlayer."
        a = np.concatenate([self.norm(self.emb[tok], w[p + "input_layernorm.weight"]),
                            self.norm(g, w[p + "hidden_norm.weight"])])
        q = self.rope(w[p + "self_attn.q_proj.weight"] @ a, pos, self.nh)
        k = self.rope(w[p + "self_attn.k_proj.weight"] @ a, pos, self.nkv)
        v = w[p + "self_attn.v_proj.weight"] @ a
        self.keys.append(k.reshape(self.nkv, self.hd))
        self.vals.append(v.reshape(self.nkv, self.hd))
        K, V = np.array(self.keys), np.array(self.vals)
        gq = self.nh // self.nkv
        att = np.zeros(self.nh * self.hd)
        for h in range(self.nh):
            sc = K[:, h // gq, :] @ q[h * self.hd:(h + 1) * self.hd] / np.sqrt(self.hd)
            sc = np.exp(sc - sc.max())
            att[h * self.hd:(h + 1) * self.hd] = (sc / sc.sum()) @ V[:, h // gq, :]
        x = g + w[p + "self_attn.o_proj.weight"] @ att
        xn = self.norm(x, w[p + "post_attention_layernorm.weight"])
        a1 = w[p + "mlp.gate_proj.weight"] @ xn
        b1 = w[p + "mlp.up_proj.weight"] @ xn
        x = x + w[p + "mlp.down_proj.weight"] @ (a1 / (1 + np.exp(-a1)) * b1)
        return x, w["lm_head.weight"] @ self.norm(x, w["norm.weight"])


def read_safetensors_raw(path):
    """Every tensor of a safetensors file: floats (F32/F16/BF16) as float64, the d2t / t2d maps
    (I64 / BOOL) as integers."""
    buf = open(path, "rb").read()
    n = struct.unpack_from("<Q", buf, 0)[0]
    header = json.loads(buf[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = buf[8 + n + a:8 + n + b]
        dt = info["dtype"]
        if dt == "F32":
            v = np.frombuffer(raw, np.float32).astype(np.float64)
        elif dt == "F16":
            v = np.frombuffer(raw, np.float16).astype(np.float64)
        elif dt == "BF16":
            v = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
            v = v.astype(np.float64)
        elif dt == "I64":
            v = np.frombuffer(raw, np.int64)
        elif dt == "BOOL":
            v = np.frombuffer(raw, np.uint8)
        else:
            raise SystemExit("oracle: dtype %s" % dt)
        out[name] = v.reshape(info["shape"])
    return out


def main():
    target = Target(sys.argv[1])
    head = Head3(sys.argv[2], target)
    draft = int(sys.argv[3])
    toks = [int(v) for v in sys.argv[4:]]
    feats = [target.layer_inputs(t, i, head.layers) for i, t in enumerate(toks)]
    h = None
    for t in range(len(toks) - 1):
        h, lg = head.step(toks[t + 1], head.w["fc.weight"] @ feats[t], t)
        print(" ".join("%.9g" % v for v in lg))
    _, lg = head.step(draft, h, len(toks) - 1)
    print(" ".join("%.9g" % v for v in lg))
    print(" ".join("%d" % v for v in head.d2t))


if __name__ == "__main__":
    main()
