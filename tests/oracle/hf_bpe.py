#!/usr/bin/env python3
"""Independent Python implementation of Hugging Face tokenizer.json BPE, for test_hf.

Shares no code with spectree's C tokenizer. Implements what tokenizers' BPE model does for the
two kinds spectree converts:
- byte-fallback BPE with the SentencePiece-style normalizer (Prepend "\u2581" to a non-empty
  text, Replace " " by "\u2581"), no pre-tokenizer: the whole text is one word; characters not in
  the vocabulary become their <0xHH> pieces when all exist, else the unknown token (consecutive
  unknowns fused);
- byte-level BPE: the Split regex of the pre-tokenizer (the `regex` module, as the Rust crate's
  fancy-regex semantics on these patterns), or SmolLM's Digits (each \p{N} isolated) then
  GPT-2's regex; GPT-2's byte alphabet; ignore_merges (a word that is itself a piece is not
  merged). Qwen2's NFC normalizer is not applied (the test strings are NFC already).
Merging: repeatedly the adjacent pair with the lowest merge rank, leftmost first.

usage:
  hf_bpe.py tokenize DIR STRINGS_FILE   -> for each line of STRINGS_FILE (hex of UTF-8 text),
                                           prints the hex and the ids (add_bos as configured)
  hf_bpe.py strings N SEED             -> N test strings, hex, one a line
  hf_bpe.py mkbytelevel DIR PRE        -> writes a synthetic byte-level tokenizer.json and
                                           tokenizer_config.json (PRE: llama3, qwen2 or smollm)
                                           into DIR
"""
import json
import os
import random
import sys

import regex

SP = "\u2581"
RE_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
             r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
RE_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
            r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_alphabet():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bpe(symbols, ranks):
    """symbols: list of strings; merges the lowest-ranked adjacent pair, leftmost first."""
    while len(symbols) > 1:
        best, at = None, -1
        for i in range(len(symbols) - 1):
            r = ranks.get((symbols[i], symbols[i + 1]))
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        symbols = symbols[:at] + [symbols[at] + symbols[at + 1]] + symbols[at + 2:]
    return symbols


class Tok:
    def __init__(self, d):
        tj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
        m = tj["model"]
        self.vocab = dict(m["vocab"])
        for a in tj.get("added_tokens") or []:
            self.vocab[a["content"]] = a["id"]
        self.ranks = {}
        for i, mg in enumerate(m["merges"]):
            l, r = mg.split(" ", 1) if isinstance(mg, str) else mg
            self.ranks.setdefault((l, r), i)
        self.byte_fallback = bool(m.get("byte_fallback"))
        self.ignore_merges = bool(m.get("ignore_merges"))
        self.unk = m.get("unk_token")
        cfg_path = os.path.join(d, "tokenizer_config.json")
        cfg = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
        self.bos = None
        b = cfg.get("bos_token")
        if isinstance(b, dict):
            b = b.get("content")
        if b is not None:
            self.bos = self.vocab[b]
        self.add_bos = bool(cfg.get("add_bos_token", False))
        pre = tj.get("pre_tokenizer")
        self.regex = None
        self.digits = False
        if pre and pre["type"] == "Sequence":
            first = pre["pretokenizers"][0]
            if first["type"] == "Digits":  # SmolLM: each digit isolated, then GPT-2's regex
                self.digits = True
                self.regex = regex.compile(RE_GPT2)
            else:
                self.regex = regex.compile(first["pattern"]["Regex"])
        elif pre and pre["type"] == "ByteLevel":
            self.regex = regex.compile(RE_GPT2)
        self.prepend = False
        norm = tj.get("normalizer")
        if norm:
            for n in norm.get("normalizers", [norm]):
                if n["type"] == "Prepend":
                    self.prepend = True
        self.alpha = byte_alphabet()

    def encode(self, text):
        ids = [self.bos] if self.add_bos else []
        if self.byte_fallback:
            if not text:
                return ids
            t = (SP if self.prepend else "") + text.replace(" ", SP)
            prev_unk = False
            for s in bpe(list(t), self.ranks):
                if s in self.vocab:
                    ids.append(self.vocab[s])
                    prev_unk = False
                    continue
                bt = ["<0x%02X>" % b for b in s.encode("utf-8")]
                if all(b in self.vocab for b in bt):
                    ids += [self.vocab[b] for b in bt]
                    prev_unk = False
                elif not prev_unk:
                    ids.append(self.vocab[self.unk])
                    prev_unk = True
            return ids
        pieces = [text]
        if self.digits:
            pieces = [p for p in regex.split(r"(\p{N})", text) if p]
        for w in [w for p in pieces for w in self.regex.findall(p)]:
            a = "".join(self.alpha[b] for b in w.encode("utf-8"))
            if self.ignore_merges and a in self.vocab:
                ids.append(self.vocab[a])
                continue
            ids += [self.vocab[s] for s in bpe(list(a), self.ranks)]
        return ids


WORDS = ("once upon a time there was little girl named Lily she loved to play outside park "
         "one day saw big red ball Tom dog cat bird happy sad went home mom dad said \"hello\" "
         "can't won't I'm it's they're we've you'll he'd tree sun fun run jumped ran quickly "
         "because friend friends together smiled laughed").split()
EXTRA = ["123", "4567", "3.14", "2024", ",", ".", "!", "?", ";", ":", "'", "\"", "(", ")", "-",
         "\u00e9t\u00e9", "na\u00efve", "\u6771\u4eac", "\U0001F600", "\u00fc", "\t", "\n",
         "\n\n", "  ", "   ", "\u0394\u03b4", "caf\u00e9", "\u2581", "x\u0301"]


def strings(n, seed):
    rng = random.Random(seed)
    out = ["", " ", "a", "Once upon a time", " Once upon a time", "Once upon a time ",
           "Once  upon   a time", "\n", "hello\nworld", "Lily's dog", "ab" * 20]
    while len(out) < n:
        k = rng.randint(1, 14)
        parts = []
        for _ in range(k):
            if rng.random() < 0.2:
                parts.append(rng.choice(EXTRA))
            else:
                w = rng.choice(WORDS)
                if rng.random() < 0.15:
                    w = w.capitalize()
                if rng.random() < 0.05:
                    w = w.upper()
                parts.append(w)
        sep = [" " if rng.random() < 0.85 else rng.choice(["", "  ", "\n", "\t"]) for _ in parts]
        s = "".join(p + q for p, q in zip(parts, sep))
        if rng.random() < 0.5:
            s = s.rstrip(" ")
        out.append(s)
    return out[:n]


def train_bytelevel(d, pre):
    """A small byte-level BPE trained here on the test words (own trainer), as tokenizer.json."""
    alpha = byte_alphabet()
    rx = regex.compile({"llama3": RE_LLAMA3, "qwen2": RE_QWEN2, "smollm": RE_GPT2}[pre])
    corpus = strings(400, 7)
    words = {}
    for s in corpus:
        parts = [p for p in regex.split(r"(\p{N})", s) if p] if pre == "smollm" else [s]
        for w in [w for p in parts for w in rx.findall(p)]:
            a = tuple(alpha[b] for b in w.encode("utf-8"))
            words[a] = words.get(a, 0) + 1
    vocab = {alpha[b]: i for i, b in enumerate(sorted(alpha))}
    merges = []
    while len(merges) < 300:
        counts = {}
        for w, c in words.items():
            for p in zip(w, w[1:]):
                counts[p] = counts.get(p, 0) + c
        if not counts:
            break
        best = max(sorted(counts), key=lambda p: counts[p])
        merges.append(best)
        vocab.setdefault(best[0] + best[1], len(vocab))
        nw = {}
        for w, c in words.items():
            o, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    o.append(w[i] + w[i + 1])
                    i += 2
                else:
                    o.append(w[i])
                    i += 1
            nw[tuple(o)] = nw.get(tuple(o), 0) + c
        words = nw
    n = len(vocab)
    added = [{"id": n, "content": "<|begin_of_text|>", "special": True},
             {"id": n + 1, "content": "<|end_of_text|>", "special": True},
             {"id": n + 3, "content": "<|eot_id|>", "special": True}]
    for a in added:
        a.update({"single_word": False, "lstrip": False, "rstrip": False, "normalized": False})
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"} if pre == "qwen2" else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": RE_LLAMA3 if pre == "llama3" else RE_QWEN2},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]} if pre != "smollm" else {
            "type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                 "use_regex": True}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": pre == "llama3", "vocab": vocab,
                  "merges": [list(m) if pre == "llama3" else " ".join(m) for m in merges]},
    }
    os.makedirs(d, exist_ok=True)
    json.dump(tj, open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8"),
              ensure_ascii=False)
    json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
               "add_bos_token": True, "chat_template": "{{ messages }}"},
              open(os.path.join(d, "tokenizer_config.json"), "w"))


def main():
    cmd = sys.argv[1]
    if cmd == "strings":
        for s in strings(int(sys.argv[2]), int(sys.argv[3])):
            print(s.encode("utf-8").hex())
    elif cmd == "tokenize":
        tok = Tok(sys.argv[2])
        for line in open(sys.argv[3]):
            h = line.strip()
            text = bytes.fromhex(h).decode("utf-8")
            print(h if h else "-", " ".join(map(str, tok.encode(text))))
    elif cmd == "mkbytelevel":
        train_bytelevel(sys.argv[2], sys.argv[3])
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
