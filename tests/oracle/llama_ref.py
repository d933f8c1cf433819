#!/usr/bin/env python3
"""Independent numpy reference for the Llama forward pass of spectree's tests.

Reads a GGUF file (its own minimal parser; F32/F16 weights), runs the transformer the way
llama2.c's run.c does (RMSNorm, adjacent-pair RoPE, GQA, SwiGLU) in float64, and prints greedy
continuations or logits. Used by the e2e tests as an oracle that shares no code with the engine.

usage: llama_ref.py MODEL.gguf greedy N TOKEN...      -> prints N greedy token ids
       llama_ref.py MODEL.gguf logits TOKEN...        -> prints the last token's logits
"""
import struct
import sys

import numpy as np

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
       11: "<q", 12: "<d"}


def read_gguf(path):
    buf = open(path, "rb").read()
    off = 0

    def rd(fmt):
        nonlocal off
        v = struct.unpack_from(fmt, buf, off)
        off += struct.calcsize(fmt)
        return v[0]

    def rstr():
        nonlocal off
        n = rd("<Q")
        s = buf[off:off + n].decode("utf-8", "replace")
        off += n
        return s

    def rval(t):
        if t == 8:
            return rstr()
        if t == 9:
            at = rd("<I")
            n = rd("<Q")
            return [rval(at) for _ in range(n)]
        return rd(FMT[t])

    assert buf[:4] == b"GGUF"
    off = 4
    rd("<I")
    nt = rd("<q")
    nkv = rd("<q")
    kv = {}
    for _ in range(nkv):
        k = rstr()
        kv[k] = rval(rd("<I"))
    infos = []
    for _ in range(nt):
        name = rstr()
        nd = rd("<I")
        ne = [rd("<q") for _ in range(nd)]
        typ = rd("<I")
        o = rd("<Q")
        infos.append((name, ne, typ, o))
    align = kv.get("general.alignment", 32)
    data = (off + align - 1) // align * align
    tensors = {}
    for name, ne, typ, o in infos:
        n = int(np.prod(ne))
        if typ == 0:
            a = np.frombuffer(buf, np.float32, n, data + o)
        elif typ == 1:
            a = np.frombuffer(buf, np.float16, n, data + o).astype(np.float32)
        else:
            raise SystemExit("oracle supports only f32/f16 tensors")
        tensors[name] = a.reshape(list(reversed(ne))).astype(np.float64)
    return kv, tensors


class Model:
    def __init__(self, path):
        kv, t = read_gguf(path)
        self.t = t
        self.n_layer = kv["llama.block_count"]
        self.n_head = kv["llama.attention.head_count"]
        self.n_kv = kv.get("llama.attention.head_count_kv", self.n_head)
        self.dim = kv["llama.embedding_length"]
        self.hd = self.dim // self.n_head
        self.eps = kv["llama.attention.layer_norm_rms_epsilon"]
        self.base = kv.get("llama.rope.freq_base", 10000.0)
        self.out = t.get("output.weight", t["token_embd.weight"])
        self.kc = [[] for _ in range(self.n_layer)]
        self.vc = [[] for _ in range(self.n_layer)]

    def norm(self, x, w):
        return x / np.sqrt(np.mean(x * x) + self.eps) * w

    def rope(self, v, pos, nh):
        v = v.reshape(nh, self.hd).copy()
        j = np.arange(self.hd // 2)
        a = pos * self.base ** (-2.0 * j / self.hd)
        c, s = np.cos(a), np.sin(a)
        x0, x1 = v[:, 0::2].copy(), v[:, 1::2].copy()
        v[:, 0::2] = x0 * c - x1 * s
        v[:, 1::2] = x0 * s + x1 * c
        return v.reshape(-1)

    def step(self, tok, pos):
        return self.out @ self.hidden(tok, pos)

    def hidden(self, tok, pos):
        """The final-normed state of token tok at position pos (what EAGLE heads read)."""
        t = self.t
        x = t["token_embd.weight"][tok].copy()
        g = self.n_head // self.n_kv
        for l in range(self.n_layer):
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
                qh = q[h * self.hd:(h + 1) * self.hd]
                sc = K[:, h // g, :] @ qh / np.sqrt(self.hd)
                sc = np.exp(sc - sc.max())
                sc /= sc.sum()
                out[h * self.hd:(h + 1) * self.hd] = sc @ V[:, h // g, :]
            x = x + t[p + "attn_output.weight"] @ out
            xb = self.norm(x, t[p + "ffn_norm.weight"])
            a = t[p + "ffn_gate.weight"] @ xb
            b = t[p + "ffn_up.weight"] @ xb
            x = x + t[p + "ffn_down.weight"] @ (a / (1 + np.exp(-a)) * b)
        return self.norm(x, t["output_norm.weight"])


def main():
    m = Model(sys.argv[1])
    mode = sys.argv[2]
    if mode == "greedy":
        n = int(sys.argv[3])
        toks = [int(v) for v in sys.argv[4:]]
        for i, tk in enumerate(toks):
            lg = m.step(tk, i)
        out = []
        pos = len(toks)
        for _ in range(n):
            nxt = int(np.argmax(lg))
            out.append(nxt)
            lg = m.step(nxt, pos)
            pos += 1
        print(" ".join(map(str, out)))
    else:
        toks = [int(v) for v in sys.argv[3:]]
        for i, tk in enumerate(toks):
            lg = m.step(tk, i)
        print(" ".join("%.9g" % v for v in lg))


if __name__ == "__main__":
    main()
