#!/usr/bin/python3
"""Trains an EAGLE-3 draft head for a llama GGUF target by self-distillation.

EAGLE-3 (Li et al., 2025; SafeAILab/EAGLE traineagle3/cnets.py and main.py): the head reads the
residual streams entering three of the target's layers, fused by fc (3H -> H, no bias); its one
layer attends over q/k/v of [input_layernorm(embedding); hidden_norm(state)] with the state as the
residual; its own norm and lm_head predict over a reduced draft vocabulary: the --draft-vocab most
frequent tokens of the training text (the target's own continuations of --prompts), mapped back
by d2t (target id = draft id + d2t[draft id]) with t2d marking them. Training-time test: each
batch is unrolled for --ttt-steps draft steps; step j reads the head's own output of step j-1 in
place of the target's layers, the tokens j further on, RoPE positions j further on, and attends
to the step-0 keys of its prefix plus its own earlier steps' keys at the same position (the
published attention). The loss of step j is the soft cross-entropy against the target's
distribution restricted to the draft vocabulary, at positions whose target token is in it,
weighted 0.8^j (main.py). Writes DIR/config.json and DIR/model.safetensors in the published
layout (FORMATS.md d.2; q/k rows in Hugging Face's half-split RoPE order; no embed_tokens: the
target's is used), with the layers read recorded as SGLang's eagle_aux_hidden_state_layer_ids.

Deterministic for a given --seed and --threads.
"""
import argparse
import json
import math
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import eagle_lib as el  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def layer_list(s):
    try:
        v = [int(x) for x in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not three comma-separated integers" % s)
    if len(v) != 3:
        raise argparse.ArgumentTypeError("%r: exactly three layers" % s)
    return v


def default_layers(L):
    """The layers read when --layers is not given: EAGLE-3's, the inputs of layers 2, L/2 and
    L-3, where those are three distinct layers of the target (L >= 7); on a shallower one three
    spread to its top, the inputs of L-2s, L-s and L (s = 2; 1 below 4 layers)."""
    d = [2, L // 2, L - 3]
    if 0 <= d[0] < d[1] < d[2] <= L:
        return d
    s = 2 if L >= 4 else 1
    if L - 2 * s < 0:
        raise el.InputError("the target has %d layer: an EAGLE-3 head reads the inputs of three "
                            "distinct layers (0..L, L the last one's output), so it needs 2 or "
                            "more" % L)
    return [L - 2 * s, L - s, L]


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="train3.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    el.add_data_args(ap, HERE)
    el.add_train_args(ap, epochs=20, warmup=100)
    ap.add_argument("--layers", type=layer_list, default=None,
                    help="the three target layers whose input the head reads, 0-based, as "
                         "EAGLE-3 counts (L: the last layer's output); default 2,L/2,L-3, or on a "
                         "target of fewer than 7 layers, where those repeat, L-4,L-2,L "
                         "(L-2,L-1,L below 4 layers)")
    ap.add_argument("--draft-vocab", type=el.positive(int), default=None,
                    help="draft vocabulary size (at most the target's; default 32000, or the "
                    "--init head's)")
    ap.add_argument("--ttt-steps", type=el.positive(int), default=7,
                    help="draft steps unrolled per batch (training-time test; EAGLE-3: 7)")
    ap.add_argument("--save-every", type=el.positive(int), default=None,
                    help="also write the head every this many steps (overwritten)")
    ap.add_argument("--intermediate-size", type=el.positive(int), default=None,
                    help="the head's MLP width (default: the target's feed_forward_length)")
    ap.add_argument("--init", default=None,
                    help="start from this EAGLE-3 head (a directory in the published layout, for "
                    "the same target) instead of random weights: fine-tuning, e.g. with more "
                    "--ttt-steps; its layers, draft vocabulary and MLP width are kept")
    el.add_gen_prompt_args(ap)
    ap.add_argument("--data-cache", default=None,
                    help="a file to keep the generated training data in (every layer's input, so "
                    "any --layers and --draft-vocab can use it): read if it exists (made by the "
                    "same --target, --prompts, --gen-tokens, --samples, --temp, --seed and "
                    "--gen-prompts options), else written")
    return ap.parse_args(argv)



@torch.no_grad()
def generate3(target, prompts, total, temp, gen):
    """Target.generate that also keeps the residual stream entering every layer (and, as layer
    n_layer, the last layer's output before the final norm). Returns tokens (B, total), the
    final-normed states (B, total, H) and the layers' inputs (B, total, n_layer + 1, H)."""
    B, H = len(prompts), target.dim
    toks = torch.zeros(B, total, dtype=torch.int64)
    feats = torch.zeros(B, total, H)
    aux = torch.zeros(B, total, target.n_layer + 1, H)
    plen = torch.tensor([len(p) for p in prompts])
    for b, p in enumerate(prompts):
        toks[b, :len(p)] = torch.tensor(p)
    kc = [torch.zeros(B, target.n_kv, total, target.hd) for _ in target.layers]
    vc = [torch.zeros(B, target.n_kv, total, target.hd) for _ in target.layers]
    cos, sin = el.rope_tables(torch.arange(total), target.hd, target.theta)
    kpos = torch.arange(total)
    for t in range(total):
        x = target.emb[toks[:, t]]
        seen = {}
        for li, L in enumerate(target.layers):
            seen[li] = x
            xn = el.rms_norm(x, L["attn_norm"], target.eps)
            q = (xn @ L["q"].T).view(B, target.n_head, 1, target.hd)
            k = (xn @ L["k"].T).view(B, target.n_kv, 1, target.hd)
            v = (xn @ L["v"].T).view(B, target.n_kv, 1, target.hd)
            q = el.apply_rope(q, cos[t:t + 1], sin[t:t + 1])
            kc[li][:, :, t:t + 1] = el.apply_rope(k, cos[t:t + 1], sin[t:t + 1])
            vc[li][:, :, t:t + 1] = v
            a = el.attention(q, kc[li][:, :, :t + 1], vc[li][:, :, :t + 1], kpos[t:t + 1],
                             kpos[:t + 1])
            x = x + a.view(B, H) @ L["o"].T
            xn = el.rms_norm(x, L["ffn_norm"], target.eps)
            x = x + (torch.nn.functional.silu(xn @ L["gate"].T) * (xn @ L["up"].T)) @ L["down"].T
        seen[target.n_layer] = x
        aux[:, t] = torch.stack([seen[c] for c in range(target.n_layer + 1)], dim=1)
        f = el.rms_norm(x, target.out_norm, target.eps)
        feats[:, t] = f
        if t + 1 < total:
            logits = f @ target.out.T
            if temp > 0:
                nxt = torch.multinomial(torch.softmax(logits / temp, -1), 1, generator=gen)[:, 0]
            else:
                nxt = logits.argmax(-1)
            own = plen <= t + 1
            toks[:, t + 1] = torch.where(own, nxt, toks[:, t + 1])
    return toks, feats, aux


class Head3(torch.nn.Module):
    """The EAGLE-3 head (traineagle3/cnets.py: fc, midlayer, norm, lm_head)."""

    def __init__(self, cfg, embed):
        super().__init__()
        H, I = cfg["hidden_size"], cfg["intermediate_size"]
        self.nh, self.nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = H // self.nh
        self.eps, self.theta = cfg["rms_norm_eps"], cfg["rope_theta"]
        lin = torch.nn.Linear
        self.register_buffer("embed", embed.clone())  # the target's, frozen, not written
        self.fc = lin(3 * cfg["target_hidden_size"], H, bias=False)
        self.in_norm = torch.nn.Parameter(torch.ones(H))
        self.hid_norm = torch.nn.Parameter(torch.ones(H))
        self.q_proj = lin(2 * H, self.nh * self.hd, bias=False)
        self.k_proj = lin(2 * H, self.nkv * self.hd, bias=False)
        self.v_proj = lin(2 * H, self.nkv * self.hd, bias=False)
        self.o_proj = lin(self.nh * self.hd, H, bias=False)
        self.post_norm = torch.nn.Parameter(torch.ones(H))
        self.gate_proj = lin(H, I, bias=False)
        self.up_proj = lin(H, I, bias=False)
        self.down_proj = lin(I, H, bias=False)
        self.norm = torch.nn.Parameter(torch.ones(H))
        self.lm_head = lin(H, cfg["draft_vocab_size"], bias=False)

    def step(self, tok, g, pos, cache):
        """One unrolled draft step over every element: tok (B, T) the input tokens, g (B, T, H)
        the state (fc of the target's layers at step 0, then the previous step's output), pos
        (T,) RoPE positions. cache: lists of the earlier steps' keys and values; element t
        attends to step 0's keys at elements <= t and to each later step's key at t. Returns
        (h before the final norm, draft logits)."""
        B, T, _ = g.shape
        a = torch.cat([el.rms_norm(self.embed[tok], self.in_norm, self.eps),
                       el.rms_norm(g, self.hid_norm, self.eps)], dim=-1)
        q = self.q_proj(a).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(a).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(a).view(B, T, self.nkv, self.hd).transpose(1, 2)
        cos, sin = el.rope_tables(pos, self.hd, self.theta)
        q, k = el.apply_rope(q, cos, sin), el.apply_rope(k, cos, sin)
        rep = self.nh // self.nkv
        cache[0].append(k.repeat_interleave(rep, dim=1))
        cache[1].append(v.repeat_interleave(rep, dim=1))
        scale = 1.0 / math.sqrt(self.hd)
        causal = torch.full((T, T), float("-inf"), device=g.device).triu(1)
        s = [q @ cache[0][0].transpose(2, 3) * scale + causal]
        s += [((q * ki).sum(-1) * scale)[..., None] for ki in cache[0][1:]]
        p = torch.softmax(torch.cat(s, dim=-1), dim=-1)
        o = p[..., :T] @ cache[1][0]
        for i, vi in enumerate(cache[1][1:]):
            o = o + p[..., T + i:T + i + 1] * vi
        h = g + self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.hd))
        hn = el.rms_norm(h, self.post_norm, self.eps)
        h = h + self.down_proj(torch.nn.functional.silu(self.gate_proj(hn)) * self.up_proj(hn))
        return h, self.lm_head(el.rms_norm(h, self.norm, self.eps))

    def state(self):
        """The weights under their published names (FORMATS.md d.2), in the order written."""
        return {
            "fc.weight": self.fc.weight,
            "midlayer.input_layernorm.weight": self.in_norm,
            "midlayer.hidden_norm.weight": self.hid_norm,
            "midlayer.self_attn.q_proj.weight": self.q_proj.weight,
            "midlayer.self_attn.k_proj.weight": self.k_proj.weight,
            "midlayer.self_attn.v_proj.weight": self.v_proj.weight,
            "midlayer.self_attn.o_proj.weight": self.o_proj.weight,
            "midlayer.post_attention_layernorm.weight": self.post_norm,
            "midlayer.mlp.gate_proj.weight": self.gate_proj.weight,
            "midlayer.mlp.up_proj.weight": self.up_proj.weight,
            "midlayer.mlp.down_proj.weight": self.down_proj.weight,
            "norm.weight": self.norm,
            "lm_head.weight": self.lm_head.weight,
        }


def load_head3(dirpath, target):
    """Reads an EAGLE-3 head (DIR/config.json, DIR/model.safetensors) for --init and checks it
    against the target: returns {"cfg", "layers" (as --layers counts), "used" (the target ids of
    the draft vocabulary, ascending), "tensors" (numpy arrays by published name)}."""
    cpath, spath = os.path.join(dirpath, "config.json"), os.path.join(dirpath, "model.safetensors")
    try:
        with open(cpath, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise el.InputError("%s: cannot read: %s" % (cpath, e))
    try:
        ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        H, I, D = cfg["hidden_size"], cfg["intermediate_size"], cfg["draft_vocab_size"]
        nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    except (KeyError, TypeError) as e:
        raise el.InputError("%s: not an EAGLE-3 head config (%s missing)" % (cpath, e))
    if (H, nh, nkv, cfg.get("vocab_size")) != (target.dim, target.n_head, target.n_kv,
                                               target.vocab):
        raise el.InputError("%s: hidden_size %s, heads %s/%s, vocab_size %s do not match the "
                            "target's %d, %d/%d, %d" % (cpath, H, nh, nkv, cfg.get("vocab_size"),
                                                        target.dim, target.n_head, target.n_kv,
                                                        target.vocab))
    tensors, _ = el.read_safetensors(spath, maps=True)
    hd = H // nh
    want = {"fc.weight": (H, 3 * H), "midlayer.input_layernorm.weight": (H,),
            "midlayer.hidden_norm.weight": (H,), "midlayer.self_attn.q_proj.weight": (nh * hd, 2 * H),
            "midlayer.self_attn.k_proj.weight": (nkv * hd, 2 * H),
            "midlayer.self_attn.v_proj.weight": (nkv * hd, 2 * H),
            "midlayer.self_attn.o_proj.weight": (H, nh * hd),
            "midlayer.post_attention_layernorm.weight": (H,), "midlayer.mlp.gate_proj.weight": (I, H),
            "midlayer.mlp.up_proj.weight": (I, H), "midlayer.mlp.down_proj.weight": (H, I),
            "norm.weight": (H,), "lm_head.weight": (D, H), "d2t": (D,), "t2d": (target.vocab,)}
    for k, shape in want.items():
        if k not in tensors:
            raise el.InputError("%s: tensor %s is missing" % (spath, k))
        if tuple(tensors[k].shape) != shape:
            raise el.InputError("%s: tensor %s has shape %s, expected %s" %
                                (spath, k, list(tensors[k].shape), list(shape)))
    used = [i + int(d) for i, d in enumerate(tensors["d2t"])]
    if used != sorted(set(used)) or not 0 <= used[0] <= used[-1] < target.vocab or \
            sorted(used) != [int(t) for t in tensors["t2d"].nonzero()[0]]:
        raise el.InputError("%s: d2t and t2d do not describe one ascending draft vocabulary" %
                            spath)
    return {"cfg": cfg, "layers": [c + 1 for c in ids], "used": used, "tensors": tensors}


def lr_at(step, total, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, total - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def shift(x, j, fill):
    """x (B, T, ...) moved j elements to the left, the tail filled with `fill`."""
    if j == 0:
        return x
    pad = torch.full_like(x[:, :j], fill)
    return torch.cat([x[:, j:], pad], dim=1)


def train(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    dev, dev_info = el.setup_device(args.device)
    gen = torch.Generator().manual_seed(args.seed)  # on the CPU on every device: same batches

    t0 = time.time()
    target = el.Target(el.engine_target(args.target, args.build, args.data_cache and
                                        os.path.dirname(os.path.abspath(args.data_cache))),
                       args.build)
    L = target.n_layer
    init = load_head3(args.init, target) if args.init else None
    if init is not None:
        for opt, val, have in (("--layers", args.layers, init["layers"]),
                               ("--intermediate-size", args.intermediate_size,
                                init["cfg"]["intermediate_size"]),
                               ("--draft-vocab", args.draft_vocab, len(init["used"]))):
            if val is not None and val != have:
                raise el.InputError("%s %s differs from the --init head's %s" % (opt, val, have))
        args.layers, args.intermediate_size = init["layers"], init["cfg"]["intermediate_size"]
        args.draft_vocab = len(init["used"])
    layers = args.layers if args.layers is not None else default_layers(L)
    if args.draft_vocab is None:
        args.draft_vocab = 32000
    for c in layers:
        if not 0 <= c <= L:
            raise el.InputError("--layers %s: layer %d outside 0..%d (%d: the last layer's "
                                "output)" % (",".join(map(str, layers)), c, L, L))
    if args.draft_vocab > target.vocab:
        el.log("--draft-vocab %d is above the target's vocabulary: using %d" %
            (args.draft_vocab, target.vocab))
    D = min(args.draft_vocab, target.vocab)
    texts, prompts = el.read_prompts(args.prompts, target.tok)
    el.log("target %s: dim %d, %d layers, vocab %d; the head reads the inputs of layers %s" %
        (args.target, target.dim, L, target.vocab, layers))

    # the data: the target's own continuations (greedy, then sampled)
    total = max(len(p) for p in prompts) + args.gen_tokens
    if total > target.n_ctx:
        raise el.InputError("--gen-tokens %d plus the longest prompt (%d tokens) exceed the "
                            "target's context of %d" % (args.gen_tokens, total - args.gen_tokens,
                                                        target.n_ctx))
    key = ["train3", el.sha256_file(target.path), prompts, args.gen_tokens, args.samples,
           args.temp, args.seed, args.gen_prompts, args.gen_prompt_len]
    cached = None
    if args.data_cache and os.path.exists(args.data_cache):
        cached = torch.load(args.data_cache)
        if not isinstance(cached, dict) or cached.get("key") != key:
            raise el.InputError("%s: the cached data was made with other data options; remove it "
                                "or name another file" % args.data_cache)
        toks, feats, states, valid = (cached[k] for k in ("toks", "feats", "states", "valid"))
        freq = Counter(dict(cached["freq"]))
        gen.set_state(cached["gen_state"])
    else:
        if args.gen_prompts > 0:
            prompts = prompts + el.sampled_prompts(target, args.gen_prompts, args.gen_prompt_len,
                                                   gen)
            total = max(total, max(len(p) for p in prompts) + args.gen_tokens)
            if total > target.n_ctx:
                raise el.InputError("--gen-prompt-len %d plus --gen-tokens %d exceed the target's "
                                    "context of %d" % (args.gen_prompt_len, args.gen_tokens,
                                                       target.n_ctx))
        ts, fs, xs, vs = [], [], [], []
        freq = Counter()
        for s in range(args.samples):
            toks, feats, states = generate3(target, prompts, total,
                                            0.0 if s == 0 else args.temp, gen)
            valid = torch.ones(len(prompts), total, dtype=torch.bool)
            for b, p in enumerate(prompts):
                end = el.end_of_text(toks[b].tolist(), len(p), target.tok)
                valid[b, end:] = False
                freq.update(toks[b, len(p):end].tolist())  # the generated text
            ts.append(toks)
            fs.append(feats)
            xs.append(states)
            vs.append(valid)
        toks, feats, states, valid = torch.cat(ts), torch.cat(fs), torch.cat(xs), torch.cat(vs)
        if args.data_cache:
            data = {"key": key, "toks": toks, "feats": feats, "states": states, "valid": valid,
                    "freq": sorted(freq.items()), "gen_state": gen.get_state()}
            el.write_whole(args.data_cache, lambda f: torch.save(data, f))
    # the three layers read, low to high as given: (N, total, 3H)
    aux = states[:, :, layers].reshape(states.shape[0], states.shape[1], 3 * target.dim)
    # the draft vocabulary: the D most frequent generated tokens (ties: lower id), sorted
    ranked = sorted(range(target.vocab), key=lambda t: (-freq.get(t, 0), t))
    used = sorted(ranked[:D]) if init is None else init["used"]
    n_gen = sum(freq.values())
    coverage = sum(freq.get(t, 0) for t in used) / max(1, n_gen)
    d2t = torch.tensor([u - i for i, u in enumerate(used)], dtype=torch.int64)
    t2d = torch.zeros(target.vocab, dtype=torch.bool)
    t2d[used] = True
    used_t = torch.tensor(used)

    # element t (t = 0..T-2): token x_{t+1}, the target's layers of position t; target: the
    # target's distribution at position t+1 (over x_{t+2})
    x_in, a_in = toks[:, 1:].to(dev), aux[:, :-1].to(dev)
    f_next, m_next = feats[:, 1:].to(dev), valid[:, 1:].to(dev)
    N, T = x_in.shape
    el.log("data: %d prompts x %d samples = %d sequences of %d positions, %d valid pairs; draft "
        "vocabulary %d of %d covers %.2f%% of the %d generated tokens (%.1f s%s)" %
        (N // args.samples, args.samples, N, T + 1, int(m_next.sum()), D, target.vocab,
         100 * coverage, n_gen, time.time() - t0,
         ", from %s" % args.data_cache if cached else ""))

    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": target.dim,
        "intermediate_size": args.intermediate_size or target.n_ff,
        "num_attention_heads": target.n_head, "num_key_value_heads": target.n_kv,
        "num_hidden_layers": 1, "vocab_size": target.vocab, "draft_vocab_size": D,
        "target_hidden_size": target.dim, "rms_norm_eps": target.eps,
        "rope_theta": target.theta, "max_position_embeddings": target.n_ctx,
        "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": target.tok.bos, "eos_token_id": target.tok.eos,
        # SGLang's convention: the layer whose output is read (the input of the next)
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [c - 1 for c in layers]},
    }
    head = Head3(cfg, target.emb)
    with torch.no_grad():  # start the draft lm_head from the target's rows of its tokens
        head.lm_head.weight.copy_(target.out[used_t])
        if init is not None:
            for k, v in head.state().items():
                v.copy_(torch.from_numpy(init["tensors"][k].copy()))
    head.to(dev)
    out_w, t2d_d, used_d = target.out.to(dev), t2d.to(dev), used_t.to(dev)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95))
    steps_per_epoch = (N + args.batch - 1) // args.batch
    n_steps = args.epochs * steps_per_epoch
    if args.steps is not None:
        n_steps = min(n_steps, args.steps)
    pos = torch.arange(T, device=dev)
    J = args.ttt_steps
    info = {
        "target": os.path.basename(args.target),
        **el.target_info(args.target, target),
        "command": el.portable_command("train3.py", [a for a in sys.argv[1:] if a != "--resume"]),
        "seed": args.seed,
        "threads": args.threads,
        "torch": torch.__version__,
        **dev_info,
        "rope_layout": "q_proj/k_proj rows in Hugging Face half-split order",
        "layers_read": layers,
        "draft_vocab_coverage": round(coverage, 6),
        "ttt_steps": J,
        "training_pairs": int(m_next.sum()),
    }
    if init is not None:
        info["init"] = {"dir": el.portable_path(args.init),
                        "model_sha256": el.sha256_file(os.path.join(args.init,
                                                                    "model.safetensors"))}
    step, first_loss, last_loss = 0, None, None
    loss_sum, acc = 0.0, [[0.0, 0.0] for _ in range(J)]
    order, i = None, N  # this epoch's order of the sequences and the place in it
    state = el.load_checkpoint(args)
    if state is not None:
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        step, first_loss, last_loss, order, i, loss_sum, acc = (state[k] for k in (
            "step", "first_loss", "last_loss", "order", "i", "loss_sum", "acc"))
    t1, step0 = time.time(), step
    stop = min(n_steps, args.stop_after) if args.stop_after else n_steps
    while step < stop:
        if i >= N:
            order, i = torch.randperm(N, generator=gen), 0
        idx = order[i:i + args.batch].to(dev)
        i += args.batch
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, n_steps, args)
        g = head.fc(a_in[idx])
        cache = [[], []]
        loss = 0.0
        with torch.no_grad():  # the target's distributions, restricted to the draft vocabulary
            tl = f_next[idx] @ out_w.T
            in_d = t2d_d[tl.argmax(-1)]
            tp0 = torch.softmax(tl[..., used_d], -1)
        for j in range(J):
            xj = shift(x_in[idx], j, 0)
            mj = shift(m_next[idx], j, False)
            pm = (mj & shift(in_d, j, False)).float()
            tp = shift(tp0, j, 0.0)
            g, logits = head.step(xj, g, pos + j, cache)
            lj = -(pm * (tp * torch.log_softmax(logits, -1)).sum(-1)).sum() / \
                (mj.float().sum() + 1e-5)
            loss = loss + (0.8 ** j) * lj
            with torch.no_grad():  # whole numbers: tensor sums are exact (no sync here)
                hit = (logits.argmax(-1) == tp.argmax(-1)).float() * pm
                acc[j][0] += hit.sum()
                acc[j][1] += mj.float().sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(head.parameters(), 0.5)
        opt.step()
        step += 1
        loss_sum += float(loss)
        if first_loss is None:
            first_loss = float(loss)
        if step % args.log_every == 0 or step == n_steps:
            last_loss = loss_sum / ((step - 1) % args.log_every + 1)
            el.log("step %d/%d epoch %d loss %.5f acc per step %s lr %.2e %.1f s %s" %
                (step, n_steps, (step - 1) // steps_per_epoch + 1, last_loss,
                 " ".join("%.3f" % (float(a) / max(float(c), 1)) for a, c in acc),
                 lr_at(step - 1, n_steps, args), time.time() - t1,
                 el.eta(t1, step - step0, stop - step)))
            loss_sum, acc = 0.0, [[0.0, 0.0] for _ in range(J)]
        if args.checkpoint and (step % args.checkpoint_every == 0 or step == stop) and \
                step < n_steps:
            el.save_checkpoint(args, {
                "step": step, "head": head.state_dict(), "opt": opt.state_dict(),
                "gen": gen.get_state(), "order": order, "i": i, "first_loss": first_loss,
                "last_loss": last_loss, "loss_sum": loss_sum, "acc": acc})
        if args.save_every and step % args.save_every == 0 and step < stop:
            save(args, cfg, head, d2t, t2d, dict(info, steps=step, loss_first=round(
                first_loss, 6), loss_last=round(last_loss or first_loss, 6),
                command=info["command"] + " --stop-after %d" % step))
    if last_loss is None:
        last_loss = loss_sum / max(1, step % args.log_every)
    el.log("trained %d steps in %.1f s; loss %.5f at step 1, %.5f at the end" %
        (step, time.time() - t1, first_loss, last_loss))

    save(args, cfg, head, d2t, t2d, dict(info, steps=step, loss_first=round(first_loss, 6),
                                         loss_last=round(last_loss, 6)))


def save(args, cfg, head, d2t, t2d, info):
    """Writes the head (the published layout) and its config with `info` as "spectree"."""
    os.makedirs(args.out, exist_ok=True)
    dtype = {"f32": "F32", "f16": "F16", "bf16": "BF16"}[args.dtype]
    tensors = {k: (v, dtype) for k, v in head.state().items()}
    tensors["d2t"] = (d2t, "I64")
    tensors["t2d"] = (t2d, "BOOL")
    el.write_safetensors_maps(os.path.join(args.out, "model.safetensors"), tensors)
    cfg = dict(cfg, torch_dtype={"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[args.dtype],
               spectree=info)
    el.write_json(os.path.join(args.out, "config.json"), cfg)
    el.log("wrote %s/config.json and %s/model.safetensors (%s)" % (args.out, args.out, dtype))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.warmup < 0:
        el.die("--warmup must be >= 0")
    if args.resume and not args.checkpoint:
        el.die("--resume needs --checkpoint FILE")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        el.die("--out %s exists and is not a directory" % args.out)
    try:
        train(args)
    except el.InputError as e:
        el.die(str(e))


if __name__ == "__main__":
    main()
