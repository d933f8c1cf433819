#!/usr/bin/python3
"""Trains an EAGLE-1 draft head for a llama GGUF target by self-distillation.

The target continues each prompt (greedy for the first sample of a prompt, sampled at --temp for
the others); its post-final-norm hidden states f_t and its distributions are the training data.
The head reads (f_t, token x_{t+1}) and predicts f_{t+1}: loss = SmoothL1(pred, f_{t+1}) +
0.1 * cross-entropy of lm_head(pred) against softmax(lm_head(f_{t+1})) (EAGLE's train/main.py:
v_w 1.0, p_w 0.1, AdamW betas (0.9, 0.95), gradient values clipped at 0.5, optional uniform noise
on the input features). Writes DIR/config.json and DIR/model.safetensors in EAGLE's published
layout (FORMATS.md d.1; q/k rows in Hugging Face's half-split RoPE order).

Deterministic for a given --seed and --threads.
"""
import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import eagle_lib as el  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="train.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    el.add_data_args(ap, HERE)
    el.add_train_args(ap, epochs=40, warmup=200)
    el.add_gen_prompt_args(ap)
    ap.add_argument("--noise", type=el.non_negative_float, default=0.0,
                    help="uniform noise of this width added to the input features (EAGLE: 0.2)")
    ap.add_argument("--w-cls", type=el.non_negative_float, default=0.1,
                    help="weight of the classification (soft cross-entropy) loss")
    ap.add_argument("--unroll", type=el.positive(int), default=1,
                    help="training-time test (HASS): train the head on its own outputs this many "
                    "draft steps deep (1: on the target's features only, as EAGLE-1)")
    ap.add_argument("--unroll-decay", type=el.non_negative_float, default=1.0,
                    help="loss weight of unrolled step j is this to the power j")
    ap.add_argument("--intermediate-size", type=el.positive(int), default=None,
                    help="the head's MLP width (default: the target's feed_forward_length)")
    ap.add_argument("--init", default=None,
                    help="start from this head (a directory in the published layout, for the same "
                    "target) instead of random weights: fine-tuning, e.g. with --unroll")
    ap.add_argument("--data-cache", default=None,
                    help="a file to keep the generated training data in: read if it exists "
                    "(made by the same --target, --prompts, --gen-tokens, --samples, --temp and "
                    "--seed), else written")
    ap.add_argument("--eval", action="store_true",
                    help="after training, report tau for chain drafting on --heldout prompts")
    ap.add_argument("--heldout", default=os.path.join(HERE, "heldout.txt"),
                    help="held-out prompts for --eval")
    ap.add_argument("--eval-depth", type=el.positive(int), default=4, help="chain length S for --eval")
    return ap.parse_args(argv)



def build_data(target, prompts, args, gen):
    """Returns feats (N, T, H), toks (N, T), valid (N, T) bool: one row per continuation."""
    total = max(len(p) for p in prompts) + args.gen_tokens
    if total > target.n_ctx:
        raise el.InputError("--gen-tokens %d plus the longest prompt (%d tokens) exceed the "
                            "target's context of %d" % (args.gen_tokens, total - args.gen_tokens,
                                                        target.n_ctx))
    fs, ts, vs = [], [], []
    for s in range(args.samples):
        temp = 0.0 if s == 0 else args.temp
        toks, feats = target.generate(prompts, total, temp, gen)
        valid = torch.ones(len(prompts), total, dtype=torch.bool)
        for b, p in enumerate(prompts):
            end = el.end_of_text(toks[b].tolist(), len(p), target.tok)
            valid[b, end:] = False  # nothing after the end of the story
        fs.append(feats)
        ts.append(toks)
        vs.append(valid)
    return torch.cat(fs), torch.cat(ts), torch.cat(vs)


def lr_at(step, total, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, total - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


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
    texts, prompts = el.read_prompts(args.prompts, target.tok)
    if args.eval:
        _, heldout = el.read_prompts(args.heldout, target.tok)
    cfg = el.head_config(target)
    init = None
    if args.init:
        init, icfg = el.load_head(args.init, target)
        for k in ("num_attention_heads", "num_key_value_heads"):
            if icfg[k] != cfg[k]:
                raise el.InputError("%s: %s %d differs from the target's %d" %
                                    (args.init, k, icfg[k], cfg[k]))
        if args.intermediate_size not in (None, icfg["intermediate_size"]):
            raise el.InputError("--intermediate-size %d differs from the --init head's %d" %
                                (args.intermediate_size, icfg["intermediate_size"]))
        cfg["intermediate_size"] = icfg["intermediate_size"]
    elif args.intermediate_size is not None:
        cfg["intermediate_size"] = args.intermediate_size
    el.log("target %s: dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, rope theta %g, lm_head %s" %
        (args.target, target.dim, target.n_layer, target.n_head, target.n_kv, target.n_ff,
         target.vocab, target.theta, "tied to token_embd" if target.tied else "output.weight"))

    key = [el.sha256_file(target.path), prompts, args.gen_tokens, args.samples, args.temp,
           args.seed, args.gen_prompts, args.gen_prompt_len]
    cached = None
    if args.data_cache and os.path.exists(args.data_cache):
        cached = torch.load(args.data_cache)
        if cached.get("key") != key:
            raise el.InputError("%s: the cached data was made with other data options; remove it "
                                "or name another file" % args.data_cache)
        feats, toks, valid = cached["feats"], cached["toks"], cached["valid"]
        gen.set_state(cached["gen_state"])
    else:
        if args.gen_prompts > 0:
            prompts = prompts + el.sampled_prompts(target, args.gen_prompts, args.gen_prompt_len,
                                                   gen)
        feats, toks, valid = build_data(target, prompts, args, gen)
        if args.data_cache:
            data = {"key": key, "feats": feats, "toks": toks, "valid": valid,
                    "gen_state": gen.get_state()}
            el.write_whole(args.data_cache, lambda f: torch.save(data, f))
    # element t: input (f_t, x_{t+1}) at position t; target f_{t+1} and softmax(lm_head(f_{t+1}))
    x_in, f_in, f_next = toks[:, 1:].to(dev), feats[:, :-1].to(dev), feats[:, 1:].to(dev)
    mask = valid[:, 1:].float().to(dev)
    N, T = x_in.shape
    n_tok = int(mask.sum())
    el.log("data: %d prompts x %d samples = %d sequences of %d positions, %d training pairs "
        "(%.1f s%s)" % (N // args.samples, args.samples, N, T + 1, n_tok, time.time() - t0,
                        ", from %s" % args.data_cache if cached else ""))
    # step j of the unrolled head is meaningful at elements t >= j
    step_mask = [(torch.arange(T) >= j).float()[None, :, None].to(dev) for j in range(args.unroll)]
    step_w = [args.unroll_decay ** j for j in range(args.unroll)]

    head = el.Head(cfg, target.emb)
    if init is not None:
        head.load({k: v.detach().numpy() for k, v in init.state().items()})
    head.to(dev)
    lm = target.out.to(dev)  # (V, H), frozen
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95))
    steps_per_epoch = (N + args.batch - 1) // args.batch
    total = args.epochs * steps_per_epoch
    if args.steps is not None:
        total = min(total, args.steps)
    step, first_loss, last_loss = 0, None, None
    acc_sum = loss_sum = cnt = 0.0
    order, i = None, N  # this epoch's order of the sequences and the place in it
    state = el.load_checkpoint(args)
    if state is not None:
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        step, first_loss, last_loss, order, i = (state[k] for k in (
            "step", "first_loss", "last_loss", "order", "i"))
        acc_sum, loss_sum, cnt = state["sums"]
    t1, step0 = time.time(), step
    stop = min(total, args.stop_after) if args.stop_after else total
    while step < stop:
        if i >= N:
            order, i = torch.randperm(N, generator=gen), 0
        idx = order[i:i + args.batch].to(dev)
        i += args.batch
        m = mask[idx][:, :, None]
        fi = f_in[idx]
        if args.noise > 0:
            fi = fi + ((torch.rand(fi.shape, generator=gen) - 0.5) * args.noise).to(dev)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, args)
        preds = head.unrolled(fi, x_in[idx], args.unroll)
        with torch.no_grad():
            tgt_logits = f_next[idx] @ lm.T
            tgt_p = torch.softmax(tgt_logits, -1)
        loss = 0.0
        for j, pred in enumerate(preds):
            mj = m * step_mask[j]
            out_logits = pred @ lm.T
            denom = mj.sum() + 1e-5
            ploss = -(mj * tgt_p * torch.log_softmax(out_logits, -1)).sum() / denom
            vloss = (mj * torch.nn.functional.smooth_l1_loss(pred, f_next[idx],
                                                             reduction="none")
                     .mean(-1, keepdim=True)).sum() / denom
            loss = loss + step_w[j] * (vloss + args.w_cls * ploss)
            if j == 0:
                m0, logits0, vloss0, ploss0 = mj, out_logits, vloss, ploss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(head.parameters(), 0.5)
        opt.step()
        step += 1
        with torch.no_grad():
            hit = (logits0.argmax(-1) == tgt_logits.argmax(-1)).float()
            acc_sum += float((hit * m0[:, :, 0]).sum())
            cnt += float(m0.sum())
            loss_sum += float(loss)
        if first_loss is None:
            first_loss = float(loss)
        if step % args.log_every == 0 or step in (stop, total):
            avg = loss_sum / ((step - 1) % args.log_every + 1)
            el.log("step %d/%d epoch %d loss %.5f (step 0: vloss %.5f ploss %.4f) acc %.4f "
                "lr %.2e %.1f s %s" % (step, total, (step - 1) // steps_per_epoch + 1, avg,
                                    float(vloss0), float(ploss0), acc_sum / max(cnt, 1),
                                    lr_at(step - 1, total, args), time.time() - t1,
                                    el.eta(t1, step - step0, stop - step)))
            if step % args.log_every == 0 or step == total:  # (--stop-after: the sums go on)
                last_loss = avg
                acc_sum = loss_sum = cnt = 0.0
        if args.checkpoint and (step % args.checkpoint_every == 0 or step == stop) and \
                step < total:
            el.save_checkpoint(args, {
                "step": step, "head": head.state_dict(), "opt": opt.state_dict(),
                "gen": gen.get_state(), "order": order, "i": i, "first_loss": first_loss,
                "last_loss": last_loss, "sums": (acc_sum, loss_sum, cnt)})
    if last_loss is None:
        last_loss = loss_sum / max(1, (step - 1) % args.log_every + 1)
    train_s = time.time() - t1
    el.log("trained %d steps in %.1f s; loss %.5f at step 1, %.5f at the end" %
        (step, train_s, first_loss, last_loss))
    head.cpu()

    os.makedirs(args.out, exist_ok=True)
    dtype = {"f32": "F32", "f16": "F16", "bf16": "BF16"}[args.dtype]
    el.write_safetensors(os.path.join(args.out, "model.safetensors"),
                         {k: head.state()[k] for k in el.HEAD_KEYS}, dtype)
    cfg["torch_dtype"] = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[args.dtype]
    cfg["spectree"] = {
        "target": os.path.basename(args.target),
        **el.target_info(args.target, target),
        "command": el.portable_command("train.py", [a for a in sys.argv[1:] if a != "--resume"]),
        "seed": args.seed,
        "threads": args.threads,
        "init": None if init is None else {
            "dir": el.portable_path(args.init),
            "model_sha256": el.sha256_file(os.path.join(args.init, "model.safetensors"))},
        "torch": torch.__version__,
        **dev_info,
        "rope_layout": "q_proj/k_proj rows in Hugging Face half-split order",
        "training_pairs": n_tok,
        "steps": step,
        "loss_first": round(first_loss, 6),
        "loss_last": round(last_loss, 6),
    }
    el.write_json(os.path.join(args.out, "config.json"), cfg)
    el.log("wrote %s/config.json and %s/model.safetensors (%s)" % (args.out, args.out, dtype))

    if args.eval:
        t2 = time.time()
        tau, cycles, hist = el.chain_tau(head, target, heldout, args.gen_tokens, args.eval_depth)
        el.log("eval: tau %.3f at K=1 S=%d greedy over %d cycles on %d held-out prompts "
            "(accepted drafts per cycle: %s) %.1f s" %
            (tau, args.eval_depth, cycles, len(heldout), hist, time.time() - t2))
        print("tau %.4f" % tau)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.warmup < 0 or args.gen_prompts < 0:
        el.die("--warmup and --gen-prompts must be >= 0")
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
