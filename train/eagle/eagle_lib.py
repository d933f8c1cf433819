"""Shared pieces of the EAGLE-1 trainer and evaluator (train/eagle/train.py, eval.py).

A GGUF reader (F32, F16, BF16 and Q8_0 tensors; llama architecture), the target's SentencePiece
tokenizer, the target's forward pass in torch, the EAGLE-1 head, and a safetensors writer and
reader. Everything is written here from the format descriptions in FORMATS.md; the only
dependencies are python3-torch and python3-numpy. Other targets go through the engine's own
tools (engine_target): a Hugging Face checkpoint directory or a GGUF with other tensor types
(K-quants, Q4_0) is first written as an f32 GGUF by `spectree convert`, and a vocabulary that is
not SentencePiece is tokenized by `spectree tokenize`.

Layout: the target's q/k projections are permuted on load from GGUF's adjacent-pair RoPE order to
Hugging Face's half-split order (FORMATS.md b.6), so the target and the head both use the
half-split ("rotate_half") RoPE and the head's q/k weights are written in the published HF/EAGLE
layout. A C loader that uses adjacent-pair RoPE must permute the head's q_proj/k_proj rows:
GGUF row h*hd + 2j + t = HF row h*hd + t*hd/2 + j.
"""
import argparse
import hashlib
import json
import math
import os
import atexit
import mmap
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

PROG = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "eagle"
# The repository's root (this file is train/eagle/eagle_lib.py).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def portable_path(p):
    """A path as a committed file may record it: relative to the repository when it lies inside
    it, else only its file name (where it sat on the machine that ran the command is not
    recorded)."""
    a = os.path.abspath(p)
    if a == ROOT or a.startswith(ROOT + os.sep):
        return os.path.relpath(a, ROOT)
    return os.path.basename(a.rstrip(os.sep)) or p


def portable_command(script, argv):
    """The command line that made a file, as run from the repository's root, with every path
    made portable (portable_path): an absolute path, or one that names an existing file."""
    out = []
    for arg in argv:
        flag, eq, val = arg.partition("=") if arg.startswith("--") and "=" in arg else ("", "", arg)
        if val and (os.path.isabs(val) or (os.sep in val and os.path.exists(val))):
            val = portable_path(val)
        out.append(flag + eq + val if eq else val)
    return "python3 train/eagle/%s %s" % (script, " ".join(shlex.quote(a) for a in out))


class InputError(Exception):
    """Bad input: a file, a field or an option. The message names them; callers print it."""


# Command lines of the trainers

def positive(kind):
    def parse(s):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a %s" % (s, kind.__name__))
        if not v > 0 or (kind is float and not math.isfinite(v)):
            raise argparse.ArgumentTypeError("%r must be positive" % s)
        return v
    return parse


def non_negative_float(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % s)
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError("%r must be >= 0" % s)
    return v


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def add_data_args(ap, here):
    """The options of the training data both trainers share: the target and its continuations."""
    ap.add_argument("--target", required=True,
                    help="the target model: a llama GGUF of any type the engine loads, or a "
                    "Hugging Face checkpoint directory (other than F32/F16/BF16/Q8_0 GGUF files "
                    "are first converted to f32 by the engine, see --build)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="the engine's build directory: its spectree converts targets the "
                    "trainer does not read itself and tokenizes vocabularies that are not "
                    "SentencePiece")
    ap.add_argument("--out", required=True, help="output directory (created if missing)")
    ap.add_argument("--prompts", default=os.path.join(here, "prompts.txt"),
                    help="training prompts, one per line")
    ap.add_argument("--gen-tokens", type=positive(int), default=160,
                    help="tokens the target writes after the longest prompt")
    ap.add_argument("--samples", type=positive(int), default=4,
                    help="continuations per prompt: the first greedy, the others sampled at --temp")
    ap.add_argument("--temp", type=non_negative_float, default=0.8,
                    help="sampling temperature of the sampled continuations")


def add_train_args(ap, epochs, warmup):
    """The optimizer, schedule and output options both trainers share."""
    ap.add_argument("--epochs", type=positive(int), default=epochs, help="passes over the data")
    ap.add_argument("--batch", type=positive(int), default=32, help="sequences per step")
    ap.add_argument("--lr", type=positive(float), default=3e-3,
                    help="peak learning rate (linear warm-up, cosine decay to 10%%)")
    ap.add_argument("--warmup", type=int, default=warmup, help="warm-up steps")
    ap.add_argument("--seed", type=int, default=0, help="seed of data sampling and training")
    ap.add_argument("--steps", type=positive(int), default=None,
                    help="stop after this many optimizer steps (the schedule ends there)")
    ap.add_argument("--threads", type=positive(int), default=1, help="torch CPU threads")
    ap.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32",
                    help="storage type of the weights in model.safetensors")
    ap.add_argument("--log-every", type=positive(int), default=50, help="steps between progress lines")
    ap.add_argument("--stop-after", type=positive(int), default=None,
                    help="stop after this many steps without changing the schedule (a run cut "
                         "short, reproducibly; with --checkpoint, resumable)")
    ap.add_argument("--checkpoint", default=None,
                    help="a file the run's whole state (head, optimizer, random generators, place "
                    "in the data) is written to every --checkpoint-every steps, and read by "
                    "--resume")
    ap.add_argument("--checkpoint-every", type=positive(int), default=100,
                    help="steps between --checkpoint writes")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run saved in --checkpoint (if the file exists; the same "
                    "options): it ends with the bytes the uninterrupted run writes")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the head trains (the data is always generated on the CPU; on "
                    "cuda deterministic, with other bytes than on the CPU)")


def add_gen_prompt_args(ap):
    """--gen-prompts and --gen-prompt-len (sampled_prompts)."""
    ap.add_argument("--gen-prompts", type=int, default=0,
                    help="also this many prompts the target writes itself: openings of "
                    "--gen-prompt-len tokens at most (4 at least) sampled at temperature 1 from "
                    "the start of text, then continued like the listed prompts")
    ap.add_argument("--gen-prompt-len", type=positive(int), default=16,
                    help="the longest --gen-prompts opening, in tokens")


# Options that do not change what a run computes: a resumed run may differ in them.
RUN_NEUTRAL = ("out", "log_every", "checkpoint", "checkpoint_every", "resume", "save_every",
               "stop_after", "data_cache", "build")


def run_key(args):
    """The options a checkpoint is valid for (every one but RUN_NEUTRAL), as a sorted list."""
    return sorted((k, v) for k, v in vars(args).items() if k not in RUN_NEUTRAL)


def save_checkpoint(args, state):
    """Writes --checkpoint whole (write_whole): state plus the options and every random
    generator's state."""
    state = dict(state, key=run_key(args), torch_rng=torch.get_rng_state())
    write_whole(args.checkpoint, lambda f: torch.save(state, f))
    log("checkpoint: step %d written to %s" % (state["step"], args.checkpoint))


def load_checkpoint(args):
    """--resume: the state save_checkpoint wrote, or None when there is no checkpoint yet (a
    first run); the options must be those of the saved run."""
    if not (args.resume and os.path.exists(args.checkpoint)):
        return None
    try:
        state = torch.load(args.checkpoint)
    except Exception as e:  # torch raises many kinds on a bad file
        raise InputError("%s: not a checkpoint the trainers wrote: %s" % (args.checkpoint, e))
    if not isinstance(state, dict) or "key" not in state:
        raise InputError("%s: not a checkpoint the trainers wrote" % args.checkpoint)
    if state["key"] != run_key(args):
        mine, theirs = dict(run_key(args)), dict(state["key"])
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise InputError("%s: written by a run with other options (%s); --resume needs the "
                         "same ones" % (args.checkpoint, ", ".join("--" + k.replace("_", "-")
                                                                   for k in diff)))
    torch.set_rng_state(state["torch_rng"])
    log("resuming at step %d from %s" % (state["step"], args.checkpoint))
    return state


def eta(t_start, done, todo):
    """'ETA 3m07s': the time left for todo more units at the rate of the done ones since
    t_start."""
    if done <= 0:
        return "ETA ?"
    left = int(round((time.time() - t_start) / done * todo))
    return "ETA %dh%02dm" % (left // 3600, left % 3600 // 60) if left >= 3600 else \
        "ETA %dm%02ds" % (left // 60, left % 60)


def setup_device(name):
    """--device: returns the torch.device and what the head's config records of it. For cuda,
    the cuBLAS workspace setting that deterministic matrix products need is made before CUDA
    starts (with torch.use_deterministic_algorithms(True), which the trainers set)."""
    if name == "cpu":
        return torch.device("cpu"), {"device": "cpu"}
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if not torch.cuda.is_available():
        raise InputError("--device cuda: torch %s finds no CUDA device" % torch.__version__)
    if torch.backends.cuda.matmul.allow_tf32:  # full float32 products (torch's default)
        torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    return dev, {"device": "cuda", "gpu": torch.cuda.get_device_name(dev),
                 "cuda": torch.version.cuda}


def die(msg):
    print("%s: error: %s" % (PROG, msg), file=sys.stderr)
    sys.exit(1)


# ------------------------------------------------------------------------------------------------
# GGUF (FORMATS.md b)

_KV_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q",
           11: "<q", 12: "<d"}
_GGML_F32, _GGML_F16, _GGML_Q8_0, _GGML_BF16 = 0, 1, 8, 30
_TYPE_NAMES = {_GGML_F32: "F32", _GGML_F16: "F16", _GGML_Q8_0: "Q8_0", _GGML_BF16: "BF16"}


def _tensor_bytes(typ, n):
    if typ == _GGML_F32:
        return 4 * n
    if typ in (_GGML_F16, _GGML_BF16):
        return 2 * n
    return n // 32 * 34  # Q8_0


def _decode(buf, typ, ne, off):
    n = int(np.prod(ne)) if ne else 1
    if typ == _GGML_F32:
        a = np.frombuffer(buf, np.float32, n, off)
    elif typ == _GGML_F16:
        a = np.frombuffer(buf, np.float16, n, off).astype(np.float32)
    elif typ == _GGML_BF16:
        a = (np.frombuffer(buf, np.uint16, n, off).astype(np.uint32) << 16).view(np.float32)
    else:  # Q8_0: per block of 32, an fp16 scale then 32 int8
        blk = np.frombuffer(buf, np.uint8, n // 32 * 34, off).reshape(-1, 34)
        d = blk[:, :2].copy().view(np.float16).astype(np.float32)
        q = blk[:, 2:].copy().view(np.int8).astype(np.float32)
        a = (q * d).reshape(-1)
    return a.reshape(list(reversed(ne))).astype(np.float32)


def read_gguf(path):
    """Returns (metadata dict, {name: float32 numpy array in PyTorch shape order})."""
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        raise InputError("%s: cannot read: %s" % (path, e.strerror))
    kv, infos, data = _parse_gguf(buf, path)
    tensors = {}
    for name, ne, typ, o in infos:
        if typ not in _TYPE_NAMES:
            raise InputError("%s: tensor %s: ggml type %d is not supported (F32, F16, BF16, Q8_0)"
                             % (path, name, typ))
        n = int(np.prod(ne)) if ne else 1
        if typ == _GGML_Q8_0 and (not ne or ne[0] % 32):
            raise InputError("%s: tensor %s: Q8_0 rows of %s elements" % (path, name, ne[:1]))
        end = data + o + _tensor_bytes(typ, n)
        if end > len(buf):
            raise InputError("%s: tensor %s: data [%d, %d) past the end of the file (%d bytes)" %
                             (path, name, data + o, end, len(buf)))
        tensors[name] = _decode(buf, typ, ne, data + o)
    return kv, tensors


def gguf_header(path):
    """(metadata dict, [(name, ne, ggml type, offset)]) of a GGUF file, read from a mapping
    without its tensor data (a target of any size)."""
    try:
        with open(path, "rb") as f:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                kv, infos, _ = _parse_gguf(buf, path)
    except (OSError, ValueError) as e:  # mmap of an empty file is a ValueError
        raise InputError("%s: cannot read: %s" % (path, getattr(e, "strerror", None) or e))
    return kv, infos


def _parse_gguf(buf, path):
    """The header of a GGUF file in buf: (metadata, tensor infos, offset of the data)."""
    off = 0
    what = "header"

    def rd(fmt):
        nonlocal off
        size = struct.calcsize(fmt)
        if off + size > len(buf):
            raise InputError("%s: truncated in the %s (byte %d of %d)" % (path, what, off, len(buf)))
        v = struct.unpack_from(fmt, buf, off)[0]
        off += size
        return v

    def rstr():
        nonlocal off
        n = rd("<Q")
        if off + n > len(buf):
            raise InputError("%s: truncated in the %s (a string of %d bytes at byte %d)" %
                             (path, what, n, off))
        s = buf[off:off + n].decode("utf-8", "replace")
        off += n
        return s

    def rval(t, depth=0):
        nonlocal off
        if t == 8:
            return rstr()
        if t == 9 and depth == 0:
            at, n = rd("<I"), rd("<Q")
            if n > len(buf):
                raise InputError("%s: %s: array of %d elements is longer than the file" %
                                 (path, what, n))
            if at in _KV_FMT and at != 7:  # fast path for numeric arrays
                size = struct.calcsize(_KV_FMT[at])
                if off + n * size > len(buf):
                    raise InputError("%s: truncated in the %s" % (path, what))
                a = np.frombuffer(buf, np.dtype(_KV_FMT[at]), n, off).tolist()
                off += n * size
                return a
            return [rval(at, 1) for _ in range(n)]
        if t not in _KV_FMT:
            raise InputError("%s: %s: unknown metadata value type %d" % (path, what, t))
        return rd(_KV_FMT[t])

    if buf[:4] != b"GGUF":
        raise InputError("%s: not a GGUF file (magic %r)" % (path, buf[:4]))
    off = 4
    version = rd("<I")
    if version not in (2, 3):
        raise InputError("%s: GGUF version %d is not supported (2 or 3)" % (path, version))
    nt, nkv = rd("<q"), rd("<q")
    if nt < 0 or nkv < 0 or nt > len(buf) or nkv > len(buf):
        raise InputError("%s: bad tensor count %d or metadata count %d" % (path, nt, nkv))
    kv = {}
    for i in range(nkv):
        what = "metadata entry %d" % i
        k = rstr()
        what = "metadata %s" % k
        if k in kv:
            raise InputError("%s: duplicate metadata key %s" % (path, k))
        kv[k] = rval(rd("<I"))
    infos = []
    for i in range(nt):
        what = "tensor info %d" % i
        name = rstr()
        what = "tensor info %s" % name
        nd = rd("<I")
        if nd > 4:
            raise InputError("%s: tensor %s: %d dimensions (at most 4)" % (path, name, nd))
        ne = [rd("<q") for _ in range(nd)]
        if any(d < 0 for d in ne):
            raise InputError("%s: tensor %s: negative dimension %s" % (path, name, ne))
        infos.append((name, ne, rd("<I"), rd("<Q")))
    align = kv.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise InputError("%s: general.alignment %r is not a power of two" % (path, align))
    return kv, infos, (off + align - 1) // align * align


def _sha256_source(path):
    """sha256 of a target as given: the file, or a directory's regular files (names and bytes,
    sorted by name)."""
    if not os.path.isdir(path):
        return sha256_file(path)
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):
            h.update(name.encode("utf-8") + b"\0" + sha256_file(full).encode("ascii"))
    return h.hexdigest()


def _engine_tool(build):
    """build/spectree, which must exist."""
    exe = os.path.join(build, "spectree")
    if not os.access(exe, os.X_OK):
        raise InputError("%s: not found; build the engine (cmake -S . -B build && cmake --build "
                         "build) or name its build directory with --build" % exe)
    return exe


def engine_target(target, build, cache_dir=None):
    """The GGUF the torch reader reads for --target: the file itself when it is a GGUF whose
    tensors are all F32/F16/BF16/Q8_0, else an f32 GGUF the engine writes (`spectree convert
    --type f32`: its own loader and dequantizer, the tokenizer's keys copied) into cache_dir,
    named by the source's sha256 and reused when there, or into a temporary directory removed
    at exit. Prints what it does."""
    if os.path.isdir(target):
        why = "a Hugging Face checkpoint directory"
    else:
        _, infos = gguf_header(target)
        other = sorted({typ for _, _, typ, _ in infos if typ not in _TYPE_NAMES})
        if not other:
            return target
        why = "tensors of ggml type %s, which the trainer does not read" % \
            ", ".join(str(t) for t in other)
    exe = _engine_tool(build)
    base = os.path.basename(os.path.abspath(target))
    if cache_dir is None:
        cache_dir = tempfile.mkdtemp(prefix="eagle-target-")
        atexit.register(shutil.rmtree, cache_dir, True)
    out = os.path.join(cache_dir, "%s-%s.f32.gguf" % (base, _sha256_source(target)[:16]))
    if os.path.exists(out):
        log("target %s: %s; using its f32 conversion %s" % (target, why, out))
        return out
    log("target %s: %s; converting it to f32: %s convert %s %s --type f32" %
        (target, why, exe, target, out))
    r = subprocess.run([exe, "convert", target, out, "--type", "f32"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        last = r.stderr.strip().splitlines()
        raise InputError("%s: spectree convert failed: %s" % (target, last[-1] if last else
                                                               "exit %d" % r.returncode))
    return out


def target_info(source, target):
    """What a head's config records of its target: the sha256 of --target as given (a
    directory's: _sha256_source), and of the f32 conversion the trainer read, if any."""
    info = {"target_sha256": _sha256_source(source)}
    if os.path.abspath(target.path) != os.path.abspath(source):
        info["target_f32_sha256"] = sha256_file(target.path)
        info["target_f32_by"] = "spectree convert --type f32"
    return info


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------
# The target's SentencePiece tokenizer (llama.cpp's SPM: the best-scoring adjacent merge first,
# ties to the left; byte fallback)


class Tokenizer:
    def __init__(self, kv, path):
        if kv.get("tokenizer.ggml.model") != "llama":
            raise InputError("%s: tokenizer.ggml.model is %r; the trainer reads SentencePiece "
                             "(\"llama\") vocabularies only" % (path, kv.get("tokenizer.ggml.model")))
        self.pieces = kv.get("tokenizer.ggml.tokens")
        self.scores = kv.get("tokenizer.ggml.scores")
        if not isinstance(self.pieces, list) or not isinstance(self.scores, list) or \
                len(self.pieces) != len(self.scores):
            raise InputError("%s: tokenizer.ggml.tokens / scores missing or of different lengths"
                             % path)
        self.ids = {}
        for i, p in enumerate(self.pieces):
            self.ids.setdefault(p, i)
        self.byte_ids = {}
        for b in range(256):
            i = self.ids.get("<0x%02X>" % b)
            if i is not None:
                self.byte_ids[b] = i
        self.bos = kv.get("tokenizer.ggml.bos_token_id", 1)
        self.eos = kv.get("tokenizer.ggml.eos_token_id", 2)
        self.add_bos = kv.get("tokenizer.ggml.add_bos_token", 1) != 0
        self.prefix = kv.get("tokenizer.ggml.add_space_prefix", 1) != 0

    def encode(self, text):
        s = ("\u2581" if self.prefix else "") + text.replace(" ", "\u2581")
        sym = list(s)
        while len(sym) > 1:
            best, at = None, -1
            for i in range(len(sym) - 1):
                j = self.ids.get(sym[i] + sym[i + 1])
                if j is not None and (best is None or self.scores[j] > best):
                    best, at = self.scores[j], i
            if at < 0:
                break
            sym[at:at + 2] = [sym[at] + sym[at + 1]]
        out = [self.bos] if self.add_bos else []
        for p in sym:
            if p in self.ids:
                out.append(self.ids[p])
            else:
                out.extend(self.byte_ids[b] for b in p.encode("utf-8") if b in self.byte_ids)
        return out

    def encode_all(self, lines):
        return [self.encode(ln) for ln in lines]

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            p = self.pieces[i]
            if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
                out.append(int(p[3:5], 16))
            elif not (p.startswith("<") and p.endswith(">")):
                out += p.replace("\u2581", " ").encode("utf-8")
        return out.decode("utf-8", "replace")


class EngineTokenizer:
    """A vocabulary that is not SentencePiece (byte-level BPE ...), tokenized by the engine:
    `spectree tokenize --model-bos --file`, BOS as `spectree generate` adds it, so the trainer's
    prompts are the engine's."""

    def __init__(self, kv, path, build):
        self.exe, self.path = _engine_tool(build), path
        self.pieces = kv.get("tokenizer.ggml.tokens")
        if not isinstance(self.pieces, list):
            raise InputError("%s: tokenizer.ggml.tokens is missing" % path)
        self.bos = kv.get("tokenizer.ggml.bos_token_id", -1)
        self.eos = kv.get("tokenizer.ggml.eos_token_id", -1)

    def encode_all(self, lines):
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt") as f:
            f.write("".join(ln + "\n" for ln in lines))
            f.flush()
            r = subprocess.run([self.exe, "tokenize", "-m", self.path, "--model-bos", "--file",
                                f.name], capture_output=True, text=True)
        out = r.stdout.splitlines()
        if r.returncode != 0 or len(out) != len(lines):
            raise InputError("%s: spectree tokenize failed: %s" %
                             (self.path, r.stderr.strip() or "%d lines of ids for %d prompts" %
                              (len(out), len(lines))))
        return [[int(t) for t in ln.split()] for ln in out]


def read_prompts(path, tok):
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f]
    except (OSError, UnicodeDecodeError) as e:
        raise InputError("%s: cannot read the prompts: %s" % (path, e))
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if not lines:
        raise InputError("%s: no prompts (one per line; empty lines and # comments are skipped)"
                         % path)
    return lines, tok.encode_all(lines)


# ------------------------------------------------------------------------------------------------
# The target (a llama-architecture GGUF) in torch


def hf_from_gguf_rows(w, n_head):
    """q/k rows from GGUF's adjacent-pair order to HF's half-split order (FORMATS.md b.6)."""
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(pos, hd, theta):
    """cos, sin of shape (len(pos), hd) for half-split RoPE at the positions pos (a 1-D tensor)."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64, device=pos.device) / hd))
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


def apply_rope(x, cos, sin):
    """x (..., T, hd) in half-split order; cos/sin (T, hd)."""
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


def attention(q, k, v, q_pos, k_pos):
    """q (B, nh, Tq, hd), k/v (B, nkv, Tk, hd); causal by position: query i sees keys with
    k_pos <= q_pos[i]; query head h reads kv head h // (nh / nkv). Returns (B, Tq, nh*hd)."""
    Tq, Tk = q.shape[2], k.shape[2]
    bias = torch.zeros(Tq, Tk, device=q.device).masked_fill(k_pos[None, :] > q_pos[:, None],
                                                            float("-inf"))
    return attention_bias(q, k, v, bias)


def attention_bias(q, k, v, bias):
    """attention() with an explicit additive mask bias (Tq, Tk): 0 where query i sees key j,
    -inf elsewhere (every row needs one 0)."""
    B, nh, Tq, hd = q.shape
    nkv, Tk = k.shape[1], k.shape[2]
    g = nh // nkv
    # the g query heads of one kv head as one (g*Tq)-row block: no copies of k and v
    qg = (q * (1.0 / math.sqrt(hd))).reshape(B * nkv, g * Tq, hd)
    s = torch.baddbmm(bias.repeat(g, 1), qg, k.reshape(B * nkv, Tk, hd).transpose(1, 2))
    o = torch.bmm(torch.softmax(s, dim=-1), v.reshape(B * nkv, Tk, hd))  # (B*nkv, g*Tq, hd)
    return o.view(B, nh, Tq, hd).transpose(1, 2).reshape(B, Tq, nh * hd)


def _get(kv, path, key, types, default=None):
    v = kv.get(key, default)
    if v is None:
        raise InputError("%s: metadata %s is missing" % (path, key))
    if not isinstance(v, types):
        raise InputError("%s: metadata %s is %r, not a number" % (path, key, v))
    return v


class Target:
    def __init__(self, path, build=None):
        """path: a GGUF the reader reads (engine_target); build: the engine's build directory,
        for a vocabulary that is not SentencePiece (None: such a vocabulary is an error)."""
        kv, t = read_gguf(path)
        self.path = path
        arch = kv.get("general.architecture")
        if arch != "llama":
            raise InputError("%s: general.architecture is %r; only \"llama\" targets" % (path, arch))
        self.dim = _get(kv, path, "llama.embedding_length", int)
        self.n_layer = _get(kv, path, "llama.block_count", int)
        self.n_head = _get(kv, path, "llama.attention.head_count", int)
        self.n_kv = _get(kv, path, "llama.attention.head_count_kv", int, self.n_head)
        self.n_ff = _get(kv, path, "llama.feed_forward_length", int)
        self.eps = float(_get(kv, path, "llama.attention.layer_norm_rms_epsilon", (int, float)))
        self.theta = float(_get(kv, path, "llama.rope.freq_base", (int, float), 10000.0))
        self.n_ctx = _get(kv, path, "llama.context_length", int)
        if self.dim <= 0 or self.n_head <= 0 or self.n_kv <= 0 or self.dim % self.n_head or \
                self.n_head % self.n_kv or (self.dim // self.n_head) % 2:
            raise InputError("%s: llama.embedding_length %d, head_count %d, head_count_kv %d do not "
                             "fit together" % (path, self.dim, self.n_head, self.n_kv))
        self.hd = self.dim // self.n_head
        if "llama.rope.scaling.type" in kv or "rope_freqs.weight" in t:
            raise InputError("%s: RoPE scaling is not supported by the trainer" % path)
        if kv.get("tokenizer.ggml.model") != "llama" and build is not None:
            self.tok = EngineTokenizer(kv, path, build)
        else:
            self.tok = Tokenizer(kv, path)
        H, kvd = self.dim, self.n_kv * self.hd

        def w(name, shape):
            if name not in t:
                raise InputError("%s: tensor %s is missing" % (path, name))
            a = t[name]
            if tuple(a.shape) != tuple(shape):
                raise InputError("%s: tensor %s has shape %s, expected %s" %
                                 (path, name, list(a.shape), list(shape)))
            return a

        emb = w("token_embd.weight", (t.get("token_embd.weight", np.zeros((0, 0))).shape[0], H))
        self.vocab = emb.shape[0]
        if self.vocab != len(self.tok.pieces):
            raise InputError("%s: token_embd.weight has %d rows but the vocabulary %d pieces" %
                             (path, self.vocab, len(self.tok.pieces)))
        self.tied = "output.weight" not in t
        self.emb = torch.from_numpy(emb.copy())
        self.out = self.emb if self.tied else torch.from_numpy(w("output.weight",
                                                                  (self.vocab, H)).copy())
        self.out_norm = torch.from_numpy(w("output_norm.weight", (H,)).copy())
        self.layers = []
        for i in range(self.n_layer):
            p = "blk.%d." % i
            q = hf_from_gguf_rows(w(p + "attn_q.weight", (H, H)), self.n_head)
            k = hf_from_gguf_rows(w(p + "attn_k.weight", (kvd, H)), self.n_kv)
            L = {
                "attn_norm": w(p + "attn_norm.weight", (H,)),
                "q": q, "k": k,
                "v": w(p + "attn_v.weight", (kvd, H)),
                "o": w(p + "attn_output.weight", (H, H)),
                "ffn_norm": w(p + "ffn_norm.weight", (H,)),
                "gate": w(p + "ffn_gate.weight", (self.n_ff, H)),
                "up": w(p + "ffn_up.weight", (self.n_ff, H)),
                "down": w(p + "ffn_down.weight", (H, self.n_ff)),
            }
            self.layers.append({k_: torch.from_numpy(np.ascontiguousarray(v_))
                                for k_, v_ in L.items()})

    @torch.no_grad()
    def generate(self, prompts, total, temp, gen):
        """Runs every prompt (a list of token lists) for `total` positions in one batch: prompt
        tokens while there are any, then the target's own tokens (greedy when temp == 0, else
        sampled at temp with the torch.Generator gen). Returns tokens (B, total) int64 and the
        post-final-norm hidden states (B, total, H) float32 of every position."""
        B, H = len(prompts), self.dim
        toks = torch.zeros(B, total, dtype=torch.int64)
        feats = torch.zeros(B, total, H)
        plen = torch.tensor([len(p) for p in prompts])
        for b, p in enumerate(prompts):
            toks[b, :len(p)] = torch.tensor(p)
        kc = [torch.zeros(B, self.n_kv, total, self.hd) for _ in self.layers]
        vc = [torch.zeros(B, self.n_kv, total, self.hd) for _ in self.layers]
        cos, sin = rope_tables(torch.arange(total), self.hd, self.theta)
        kpos = torch.arange(total)
        for t in range(total):
            x = self.emb[toks[:, t]]  # (B, H)
            for li, L in enumerate(self.layers):
                xn = rms_norm(x, L["attn_norm"], self.eps)
                q = (xn @ L["q"].T).view(B, self.n_head, 1, self.hd)
                k = (xn @ L["k"].T).view(B, self.n_kv, 1, self.hd)
                v = (xn @ L["v"].T).view(B, self.n_kv, 1, self.hd)
                q = apply_rope(q, cos[t:t + 1], sin[t:t + 1])
                kc[li][:, :, t:t + 1] = apply_rope(k, cos[t:t + 1], sin[t:t + 1])
                vc[li][:, :, t:t + 1] = v
                a = attention(q, kc[li][:, :, :t + 1], vc[li][:, :, :t + 1], kpos[t:t + 1],
                              kpos[:t + 1])
                x = x + a.view(B, H) @ L["o"].T
                xn = rms_norm(x, L["ffn_norm"], self.eps)
                x = x + (torch.nn.functional.silu(xn @ L["gate"].T) * (xn @ L["up"].T)) @ L["down"].T
            f = rms_norm(x, self.out_norm, self.eps)
            feats[:, t] = f
            if t + 1 < total:
                logits = f @ self.out.T
                if temp > 0:
                    nxt = torch.multinomial(torch.softmax(logits / temp, -1), 1, generator=gen)[:, 0]
                else:
                    nxt = logits.argmax(-1)
                own = plen <= t + 1  # position t+1 is past the prompt
                toks[:, t + 1] = torch.where(own, nxt, toks[:, t + 1])
        return toks, feats


# ------------------------------------------------------------------------------------------------
# The EAGLE-1 head (EAGLE's cnets.py Model with one layer): h = fc([emb(x_{t+1}); f_t]),
# layer 0 without an input norm: h = h + Attn(h); h = h + MLP(RMSNorm_post(h)).

HEAD_KEYS = [  # FORMATS.md d.1, in the order written
    "embed_tokens.weight", "fc.weight", "fc.bias",
    "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
]


def head_shapes(cfg):
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = H // nh
    return {
        "embed_tokens.weight": (cfg["vocab_size"], H), "fc.weight": (H, 2 * H), "fc.bias": (H,),
        "layers.0.self_attn.q_proj.weight": (nh * hd, H),
        "layers.0.self_attn.k_proj.weight": (nkv * hd, H),
        "layers.0.self_attn.v_proj.weight": (nkv * hd, H),
        "layers.0.self_attn.o_proj.weight": (H, nh * hd),
        "layers.0.post_attention_layernorm.weight": (H,),
        "layers.0.mlp.gate_proj.weight": (I, H), "layers.0.mlp.up_proj.weight": (I, H),
        "layers.0.mlp.down_proj.weight": (H, I),
    }


def _shift(x, n):
    """x (B, heads, T, hd) moved n positions later along T (zeros in front)."""
    if n == 0:
        return x
    return torch.cat([x.new_zeros(x.shape[0], x.shape[1], n, x.shape[3]), x[:, :, :-n]], dim=2)


def _unrolled_attention(q, ks, vs):
    """Attention of unrolled step j = len(ks) - 1 (Head.unrolled): query t sees ks[0] at positions
    <= t - j and ks[i] at position t - j + i alone (i = 1..j). That key is one per query, so its
    score is a row-wise dot product: O(T^2 + j T) rather than a (T, (j+1) T) masked matrix."""
    B, nh, T, hd = q.shape
    j, g, scale = len(ks) - 1, nh // ks[0].shape[1], 1.0 / math.sqrt(hd)
    pos = torch.arange(T, device=q.device)
    bias = torch.zeros(T, T, device=q.device).masked_fill(pos[None, :] > pos[:, None] - j,
                                                          float("-inf"))
    s = [torch.matmul(q, ks[0].repeat_interleave(g, 1).transpose(-1, -2)) * scale + bias]
    v_diag = []
    for i in range(1, j + 1):
        s.append((q * _shift(ks[i], j - i).repeat_interleave(g, 1)).sum(-1, keepdim=True) * scale)
        v_diag.append(_shift(vs[i], j - i).repeat_interleave(g, 1))
    p = torch.softmax(torch.cat(s, dim=-1), dim=-1)
    o = torch.matmul(p[..., :T], vs[0].repeat_interleave(g, 1))
    for i, v in enumerate(v_diag):
        o = o + p[..., T + i:T + i + 1] * v
    return o.transpose(1, 2).reshape(B, T, nh * hd)


class Head(torch.nn.Module):
    def __init__(self, cfg, embed):
        super().__init__()
        H, I = cfg["hidden_size"], cfg["intermediate_size"]
        self.nh, self.nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = H // self.nh
        self.eps, self.theta = cfg["rms_norm_eps"], cfg["rope_theta"]
        lin = torch.nn.Linear
        self.register_buffer("embed", embed.clone())  # the target's, frozen
        self.fc = lin(2 * H, H, bias=True)
        self.q_proj = lin(H, self.nh * self.hd, bias=False)
        self.k_proj = lin(H, self.nkv * self.hd, bias=False)
        self.v_proj = lin(H, self.nkv * self.hd, bias=False)
        self.o_proj = lin(self.nh * self.hd, H, bias=False)
        self.post_norm = torch.nn.Parameter(torch.ones(H))
        self.gate_proj = lin(H, I, bias=False)
        self.up_proj = lin(H, I, bias=False)
        self.down_proj = lin(I, H, bias=False)

    def forward(self, feat, tok, pos, past=None):
        """feat (B, T, H): the feature of each element (the target's f_t, or the head's own
        output on later draft steps); tok (B, T): the token that follows it; pos (T,) positions.
        past: (k, v, k_pos) from earlier elements or None. Returns (h (B, T, H), (k, v, k_pos))."""
        B, T, _ = feat.shape
        h = self.fc(torch.cat([self.embed[tok], feat], dim=-1))
        q = self.q_proj(h).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        cos, sin = rope_tables(pos, self.hd, self.theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_pos = pos
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
            k_pos = torch.cat([past[2], pos])
        h = h + self.o_proj(attention(q, k, v, pos, k_pos))
        hn = rms_norm(h, self.post_norm, self.eps)
        h = h + self.down_proj(torch.nn.functional.silu(self.gate_proj(hn)) * self.up_proj(hn))
        return h, (k, v, k_pos)

    def unrolled(self, feat, tok, depth):
        """Training-time test (HASS; EAGLE-3's TTT): the head run as it drafts, `depth` steps deep,
        for every position at once. feat (B, T, H): the target's features f_t; tok (B, T): x_{t+1}.
        Step 0 is forward(): element t reads (f_t, x_{t+1}). Step j >= 1 is the j-th draft step
        of a cycle that started at t - j: element t reads the head's own step j-1 output at t-1
        (in place of f_t) with x_{t+1}, and attends as the drafting head's cache holds it: step 0's
        keys at positions <= t - j (the committed prefix, the target's features) and step i's key
        at position t - j + i for i = 1..j (the cycle's earlier drafts). Element t of step j is
        meaningful for t >= j. Returns the list of the depth steps' outputs, each (B, T, H); every
        one predicts f_{t+1}."""
        B, T, H = feat.shape
        pos = torch.arange(T, device=feat.device)
        cos, sin = rope_tables(pos, self.hd, self.theta)
        ks, vs, outs, f = [], [], [], feat
        for j in range(depth):
            if j > 0:
                f = torch.cat([feat.new_zeros(B, 1, H), outs[-1][:, :-1]], dim=1)
            h = self.fc(torch.cat([self.embed[tok], f], dim=-1))
            q = self.q_proj(h).view(B, T, self.nh, self.hd).transpose(1, 2)
            k = self.k_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
            v = self.v_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            ks.append(k)
            vs.append(v)
            h = h + self.o_proj(_unrolled_attention(q, ks, vs))
            hn = rms_norm(h, self.post_norm, self.eps)
            h = h + self.down_proj(torch.nn.functional.silu(self.gate_proj(hn)) * self.up_proj(hn))
            outs.append(h)
        return outs

    def state(self):
        """The weights under their published names (FORMATS.md d.1)."""
        return {
            "embed_tokens.weight": self.embed, "fc.weight": self.fc.weight,
            "fc.bias": self.fc.bias,
            "layers.0.self_attn.q_proj.weight": self.q_proj.weight,
            "layers.0.self_attn.k_proj.weight": self.k_proj.weight,
            "layers.0.self_attn.v_proj.weight": self.v_proj.weight,
            "layers.0.self_attn.o_proj.weight": self.o_proj.weight,
            "layers.0.post_attention_layernorm.weight": self.post_norm,
            "layers.0.mlp.gate_proj.weight": self.gate_proj.weight,
            "layers.0.mlp.up_proj.weight": self.up_proj.weight,
            "layers.0.mlp.down_proj.weight": self.down_proj.weight,
        }

    @torch.no_grad()
    def load(self, tensors):
        for name, p in self.state().items():
            p.copy_(torch.from_numpy(tensors[name].astype(np.float32)))


def head_config(target):
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": target.dim, "intermediate_size": target.n_ff,
        "num_attention_heads": target.n_head, "num_key_value_heads": target.n_kv,
        "num_hidden_layers": 1, "vocab_size": target.vocab, "rms_norm_eps": target.eps,
        "rope_theta": target.theta, "max_position_embeddings": target.n_ctx,
        "hidden_act": "silu", "bias": True, "tie_word_embeddings": False,
        "bos_token_id": target.tok.bos, "eos_token_id": target.tok.eos,
    }


# ------------------------------------------------------------------------------------------------
# safetensors (FORMATS.md c.1)

ST_DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2)}


def write_safetensors(path, tensors, dtype):
    """tensors: an ordered {name: torch tensor}; dtype one of ST_DTYPES. Data in the given order,
    header padded with spaces so the data starts 8-byte aligned."""
    write_safetensors_maps(path, {name: (t, dtype) for name, t in tensors.items()})


INT_DTYPES = {"I64": (np.int64, 8), "BOOL": (np.bool_, 1)}


def write_safetensors_maps(path, tensors):
    """write_safetensors with a dtype per tensor, integer maps too (EAGLE-3's d2t, t2d): tensors
    is an ordered {name: (torch tensor, dtype)}, dtype F32/F16/BF16, I64 or BOOL."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (t, dt) in tensors.items():
        if dt == "I64":
            raw = t.detach().cpu().to(torch.int64).contiguous().numpy().tobytes()
        elif dt == "BOOL":
            raw = t.detach().cpu().to(torch.uint8).contiguous().numpy().tobytes()
        else:
            a = t.detach().cpu().to(ST_DTYPES[dt][0]).contiguous()
            raw = a.view(torch.int16).numpy().tobytes() if ST_DTYPES[dt][1] == 2 else \
                a.numpy().tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)

    def fill(f):
        f.write(struct.pack("<Q", len(h)) + h)
        for raw in blobs:
            f.write(raw)
    write_whole(path, fill)


def write_whole(path, fill):
    """Writes path whole or not at all: fill(f) writes a temporary file (binary) in path's folder,
    which replaces path once it is on the disk; on any error it is removed, path untouched."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp's 0600 otherwise
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path, obj):
    """obj as indented JSON and a newline (a config.json), written whole (write_whole)."""
    write_whole(path, lambda f: f.write((json.dumps(obj, indent=2) + "\n").encode("utf-8")))


def read_safetensors(path, maps=False):
    """Returns ({name: float32 numpy array}, {name: dtype string}); checks the header against the
    file: offsets inside the data, tiling it exactly, sizes matching shape and dtype. With maps,
    I64 and BOOL tensors (EAGLE-3's d2t, t2d) are read too, as int64 and bool arrays."""
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        raise InputError("%s: cannot read: %s" % (path, e.strerror))
    if len(buf) < 8:
        raise InputError("%s: %d bytes, shorter than the 8-byte header length" % (path, len(buf)))
    n = struct.unpack_from("<Q", buf, 0)[0]
    if n > len(buf) - 8:
        raise InputError("%s: header length %d runs past the end of the file" % (path, n))
    try:
        header = json.loads(buf[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise InputError("%s: header is not JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise InputError("%s: header is not a JSON object" % path)
    header.pop("__metadata__", None)
    data = buf[8 + n:]
    out, dtypes, spans = {}, {}, []
    for name, info in header.items():
        try:
            dt, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise InputError("%s: tensor %s: needs dtype, shape and data_offsets [begin, end]" %
                             (path, name))
        if dt not in ST_DTYPES and not (maps and dt in INT_DTYPES):
            raise InputError("%s: tensor %s: dtype %r (F32, F16 or BF16 expected)" % (path, name, dt))
        count = int(np.prod(shape)) if shape else 1
        size = ST_DTYPES[dt][1] if dt in ST_DTYPES else INT_DTYPES[dt][1]
        if not (0 <= b <= e <= len(data)) or e - b != count * size:
            raise InputError("%s: tensor %s: data_offsets [%d, %d] do not hold shape %s of %s in "
                             "%d data bytes" % (path, name, b, e, shape, dt, len(data)))
        raw = data[b:e]
        if dt in INT_DTYPES:
            a = np.frombuffer(raw, np.int64) if dt == "I64" else np.frombuffer(raw, np.uint8) != 0
        elif dt == "F32":
            a = np.frombuffer(raw, np.float32)
        elif dt == "F16":
            a = np.frombuffer(raw, np.float16).astype(np.float32)
        else:
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        out[name] = a.reshape(shape)
        dtypes[name] = dt
        spans.append((b, e))
    pos = 0
    for b, e in sorted(spans):
        if b != pos:
            raise InputError("%s: tensor data has a hole or overlap at byte %d" % (path, pos))
        pos = e
    if pos != len(data):
        raise InputError("%s: %d data bytes after the last tensor" % (path, len(data) - pos))
    return out, dtypes


def load_head(dirpath, target):
    """Reads DIR/config.json and DIR/model.safetensors and checks them against the target."""
    cpath = os.path.join(dirpath, "config.json")
    try:
        with open(cpath, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError("%s: cannot read: %s" % (cpath, e))
    want = head_config(target)
    for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "vocab_size"):
        if k not in cfg:
            raise InputError("%s: %s is missing" % (cpath, k))
    if cfg["hidden_size"] != want["hidden_size"] or cfg["vocab_size"] != want["vocab_size"]:
        raise InputError("%s: hidden_size %s / vocab_size %s do not match the target's %d / %d" %
                         (cpath, cfg["hidden_size"], cfg["vocab_size"], want["hidden_size"],
                          want["vocab_size"]))
    cfg.setdefault("rms_norm_eps", 1e-6)
    cfg.setdefault("rope_theta", 10000.0)
    spath = os.path.join(dirpath, "model.safetensors")
    tensors, _ = read_safetensors(spath)
    shapes = head_shapes(cfg)
    for k in HEAD_KEYS:
        if k not in tensors:
            raise InputError("%s: tensor %s is missing" % (spath, k))
        if tuple(tensors[k].shape) != shapes[k]:
            raise InputError("%s: tensor %s has shape %s, expected %s" %
                             (spath, k, list(tensors[k].shape), list(shapes[k])))
    extra = sorted(set(tensors) - set(HEAD_KEYS))
    if extra:
        raise InputError("%s: unexpected tensor %s" % (spath, extra[0]))
    head = Head(cfg, target.emb)
    head.load(tensors)
    return head, cfg


# ------------------------------------------------------------------------------------------------
# Chain drafting, simulated (K = 1): the acceptance the head reaches under greedy verification


def end_of_text(toks, start, tok):
    """Index of the first EOS/BOS the target produced at or after start, or len(toks)."""
    for i in range(start, len(toks)):
        if toks[i] in (tok.eos, tok.bos):
            return i
    return len(toks)


@torch.no_grad()
def sampled_prompts(target, n, top_len, gen):
    """n openings written by the target (--gen-prompts): sampled at temperature 1 from BOS, each
    cut at a random length in [4, top_len] tokens (or at its end of text)."""
    top = max(4, top_len)
    toks, _ = target.generate([[target.tok.bos]] * n, top, 1.0, gen)
    lens = torch.randint(4, top + 1, (n,), generator=gen)
    out = []
    for b in range(n):
        t = toks[b, :int(lens[b])].tolist()
        out.append(t[:max(2, end_of_text(t, 1, target.tok))])
    return out


def chain_tau(head, target, prompts, gen_tokens, depth):
    """For each prompt: the target's greedy text (its output under lossless speculation), then
    cycles as EAGLE runs them: the head's cache holds (f_t, x_{t+1}) for the committed prefix,
    draft step 1 reads the target's feature of the newest committed token's predecessor, later
    steps the head's own output; the drafts accepted are the leading ones equal to the target's
    greedy tokens, plus one bonus token. Returns (tau, cycles, accepted-per-depth histogram)."""
    head.eval()
    total = max(len(p) for p in prompts) + gen_tokens
    toks, feats = target.generate(prompts, total, 0.0, None)
    emitted, cycles, hist = 0, 0, [0] * (depth + 1)
    for b, p in enumerate(prompts):
        n = len(p)
        T = min(end_of_text(toks[b].tolist(), n, target.tok), n + gen_tokens)
        x, f = toks[b:b + 1, :T], feats[b:b + 1, :T]
        if T - 1 <= n:
            continue
        # the head's cache over the true pairs (f_t, x_{t+1}), t = 0 .. T-2
        _, (kc, vc, kp) = head(f[:, :T - 1], x[:, 1:T], torch.arange(T - 1))
        p_new = n  # the newest committed token: x_p (the target's first token after the prompt)
        while p_new + depth <= T - 1:
            past = (kc[:, :, :p_new - 1], vc[:, :, :p_new - 1], kp[:p_new - 1])
            feat, tokin, a = f[:, p_new - 1:p_new], x[:, p_new:p_new + 1], 0
            for s in range(depth):
                pos = torch.tensor([p_new - 1 + s])
                h, past = head(feat, tokin, pos, past)
                d = int((h[0, -1] @ target.out.T).argmax())
                if d != int(x[0, p_new + 1 + s]):
                    break
                a += 1
                feat, tokin = h[:, -1:], torch.tensor([[d]])
            hist[a] += 1
            emitted += a + 1
            cycles += 1
            p_new += a + 1
    return (emitted / cycles if cycles else 0.0), cycles, hist
