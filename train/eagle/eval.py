#!/usr/bin/python3
"""Evaluates an EAGLE-1 head (a directory with config.json and model.safetensors in the published
layout) for a GGUF target: simulated chain drafting (K = 1, S drafts per cycle) under greedy
verification on held-out prompts, as EAGLE drafts: step 1 reads the target's feature, later steps
the head's own output. Prints the mean accepted length tau (accepted drafts + 1 bonus token)."""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import eagle_lib as el  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(prog="eval.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--target", required=True,
                    help="the target model: a llama GGUF of any type the engine loads, or a "
                    "Hugging Face checkpoint directory (converted by the engine, see --build)")
    ap.add_argument("--build", default=os.path.join(el.ROOT, "build"),
                    help="the engine's build directory (spectree convert and tokenize)")
    ap.add_argument("--head", required=True, help="the head's directory")
    ap.add_argument("--prompts", default=os.path.join(HERE, "heldout.txt"),
                    help="held-out prompts, one per line")
    ap.add_argument("--gen-tokens", type=int, default=160, help="greedy tokens after each prompt")
    ap.add_argument("--depth", type=int, default=4, help="drafts per cycle (S)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args()
    if args.gen_tokens < 1 or args.depth < 1 or args.threads < 1:
        el.die("--gen-tokens, --depth and --threads must be positive")
    torch.set_num_threads(args.threads)
    try:
        t0 = time.time()
        target = el.Target(el.engine_target(args.target, args.build), args.build)
        head, _ = el.load_head(args.head, target)
        _, prompts = el.read_prompts(args.prompts, target.tok)
        if max(len(p) for p in prompts) + args.gen_tokens > target.n_ctx:
            raise el.InputError("--gen-tokens %d plus the longest prompt exceed the target's "
                                "context of %d" % (args.gen_tokens, target.n_ctx))
        tau, cycles, hist = el.chain_tau(head, target, prompts, args.gen_tokens, args.depth)
    except el.InputError as e:
        el.die(str(e))
    print("eval: %d prompts, %d cycles, accepted drafts per cycle %s, %.1f s" %
          (len(prompts), cycles, hist, time.time() - t0), file=sys.stderr)
    print("tau %.4f" % tau)


if __name__ == "__main__":
    main()
