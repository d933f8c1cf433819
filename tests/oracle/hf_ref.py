#!/usr/bin/env python3
"""Synthetic Hugging Face checkpoints and an independent numpy forward pass over them.

Shares no code with spectree: its own safetensors reader and writer, and the transformer as
transformers' modeling_llama / modeling_qwen2 write it (RMSNorm, rotate_half RoPE on the
half-split q/k layout, Llama 3 rope scaling as _compute_llama3_parameters, q/k/v biases for
Qwen2, GQA, SwiGLU), in float64.

usage:
  hf_ref.py mk DIR ARCH SEED [DTYPE [SHARDS]]  writes a small random checkpoint: ARCH llama,
        llama3 (rope_scaling llama3), qwen2 (biases, tied), mistral (head_dim != hidden/heads,
        sliding window), smollm (tied); DTYPE F32 (default), F16 or BF16; SHARDS > 1 splits the
        tensors into model-0000N-of-0000M.safetensors files with the index. The tokenizer files
        are TinyStories-656K's (vocabulary 2048), copied from TOKDIR (env HF_REF_TOKDIR).
  hf_ref.py logits DIR TOKEN...  prints the logits of every position, one row a line
"""
import json
import math
import os
import shutil
import struct
import sys

import numpy as np

DT = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (None, 2)}


def to_bytes(a, dtype):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.tobytes()
    if dtype == "F16":
        return a.astype(np.float16).tobytes()
    u = a.view(np.uint32).astype(np.uint64)  # BF16: round to nearest even
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return u.tobytes()


def from_bytes(b, dtype, shape):
    if dtype == "F32":
        a = np.frombuffer(b, dtype="<f4")
    elif dtype == "F16":
        a = np.frombuffer(b, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":
        a = (np.frombuffer(b, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise ValueError(dtype)
    return a.astype(np.float64).reshape(shape)


def write_st(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        b = to_bytes(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_st(d):
    files = ["model.safetensors"]
    if not os.path.exists(os.path.join(d, files[0])):
        idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
        files = sorted(set(idx["weight_map"].values()))
    out = {}
    for fn in files:
        buf = open(os.path.join(d, fn), "rb").read()
        n = struct.unpack_from("<Q", buf)[0]
        h = json.loads(buf[8:8 + n])
        for name, e in h.items():
            if name == "__metadata__":
                continue
            a, b = e["data_offsets"]
            out[name] = from_bytes(buf[8 + n + a:8 + n + b], e["dtype"], e["shape"])
    return out


def make(d, arch, seed, dtype="F32", shards=1):
    rng = np.random.default_rng(seed)
    V, E, L, H, KVH, F = 2048, 64, 2, 4, 2, 96
    if arch == "wide":  # rows of whole 256-element super-blocks, for the K-quant conversions
        E, F = 256, 512
    hd = E // H
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "hidden_size": E, "intermediate_size": F, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": KVH, "vocab_size": V,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
           "torch_dtype": "float32"}
    if arch == "llama3":
        cfg.update(rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    elif arch == "qwen2":
        cfg.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_theta=1e6,
                   tie_word_embeddings=True, rms_norm_eps=1e-6, sliding_window=32,
                   use_sliding_window=False)
    elif arch == "mistral":
        hd = 24  # head_dim != hidden_size / num_attention_heads, as Mistral-Nemo
        cfg.update(architectures=["MistralForCausalLM"], model_type="mistral", head_dim=hd,
                   sliding_window=128, rope_theta=1e6)
    elif arch == "smollm":
        cfg.update(tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5)
    elif arch not in ("llama", "wide"):
        raise ValueError(arch)

    def w(*shape):
        return (rng.uniform(-1, 1, size=shape) / math.sqrt(shape[-1])).astype(np.float32)

    t = {"model.embed_tokens.weight": w(V, E), "model.norm.weight": 1 + 0.1 * w(E, 1)[:, 0]}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = w(V, E)
    for i in range(L):
        p = "model.layers.%d." % i
        t[p + "input_layernorm.weight"] = 1 + 0.1 * w(E, 1)[:, 0]
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * w(E, 1)[:, 0]
        t[p + "self_attn.q_proj.weight"] = w(H * hd, E)
        t[p + "self_attn.k_proj.weight"] = w(KVH * hd, E)
        t[p + "self_attn.v_proj.weight"] = w(KVH * hd, E)
        t[p + "self_attn.o_proj.weight"] = w(E, H * hd)
        t[p + "mlp.gate_proj.weight"] = w(F, E)
        t[p + "mlp.up_proj.weight"] = w(F, E)
        t[p + "mlp.down_proj.weight"] = w(E, F)
        if arch == "qwen2":
            t[p + "self_attn.q_proj.bias"] = 0.5 * w(H * hd, 1)[:, 0]
            t[p + "self_attn.k_proj.bias"] = 0.5 * w(KVH * hd, 1)[:, 0]
            t[p + "self_attn.v_proj.bias"] = 0.5 * w(KVH * hd, 1)[:, 0]
    os.makedirs(d, exist_ok=True)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
    names = sorted(t)
    if shards <= 1:
        write_st(os.path.join(d, "model.safetensors"), t, dtype)
    else:
        wm = {}
        for k in range(shards):
            fn = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
            part = {n: t[n] for n in names[k::shards]}
            write_st(os.path.join(d, fn), part, dtype)
            wm.update({n: fn for n in part})
        json.dump({"metadata": {}, "weight_map": wm},
                  open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=1)
    src = os.environ["HF_REF_TOKDIR"]
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, fn), os.path.join(d, fn))


def rms(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def inv_freq(cfg, hd):
    base = cfg.get("rope_theta", 10000.0)
    f = 1.0 / (base ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wl = 2 * math.pi / f
        scaled = np.where(wl > old / lo, f / factor, f)
        smooth = (old / wl - lo) / (hi - lo)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wl >= old / hi) & (wl <= old / lo)
        f = np.where(medium, mid, scaled)
    return f


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def forward(d, toks):
    cfg = json.load(open(os.path.join(d, "config.json")))
    t = read_st(d)
    E, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KVH = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim", E // H)
    eps = cfg.get("rms_norm_eps", 1e-6)
    emb = t.get("model.embed_tokens.weight", t.get("lm_head.weight"))
    head = emb if cfg.get("tie_word_embeddings") else t["lm_head.weight"]
    n = len(toks)
    x = emb[toks]
    f = inv_freq(cfg, hd)
    ang = np.arange(n)[:, None] * f[None, :]
    cos = np.cos(np.concatenate([ang, ang], axis=-1))
    sin = np.sin(np.concatenate([ang, ang], axis=-1))
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rms(x, t[p + "input_layernorm.weight"], eps)
        q = h @ t[p + "self_attn.q_proj.weight"].T
        k = h @ t[p + "self_attn.k_proj.weight"].T
        v = h @ t[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in t:
            q += t[p + "self_attn.q_proj.bias"]
            k += t[p + "self_attn.k_proj.bias"]
            v += t[p + "self_attn.v_proj.bias"]
        q = q.reshape(n, H, hd).transpose(1, 0, 2)
        k = k.reshape(n, KVH, hd).transpose(1, 0, 2)
        v = v.reshape(n, KVH, hd).transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, H // KVH, axis=0)
        v = np.repeat(v, H // KVH, axis=0)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = (s @ v).transpose(1, 0, 2).reshape(n, H * hd)
        x = x + o @ t[p + "self_attn.o_proj.weight"].T
        h = rms(x, t[p + "post_attention_layernorm.weight"], eps)
        g = h @ t[p + "mlp.gate_proj.weight"].T
        u = h @ t[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ t[p + "mlp.down_proj.weight"].T
    return rms(x, t["model.norm.weight"], eps) @ head.T


def main():
    if sys.argv[1] == "mk":
        a = sys.argv[2:]
        make(a[0], a[1], int(a[2]), a[3] if len(a) > 3 else "F32", int(a[4]) if len(a) > 4 else 1)
    elif sys.argv[1] == "logits":
        for row in forward(sys.argv[2], [int(x) for x in sys.argv[3:]]):
            print(" ".join("%.9g" % v for v in row))
    else:
        sys.exit("unknown command")


if __name__ == "__main__":
    main()
