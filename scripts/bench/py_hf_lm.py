#!/usr/bin/env python3
"""transformers' causal LMs for scripts/bench/exported_lm.sh: a model from a config (random
weights, nothing downloaded), exported to .pt2 for `model.name: exported`, and the eager PyTorch
loop a transformers user writes for the same training (AdamW fused, set_to_none, threads = cores).

  py_hf_lm.py export --model gpt2_124m|gpt2_tiny|llama_tiny --out M.pt2 --block 64
  py_hf_lm.py train  --model ... --tokens train.bin --block 64 --batch 4 --steps N --warmup K

train prints one JSON line: tokens/s over the steps after the warm-up, seconds from exec to the
end of the first optimizer step (import and model build included), peak RSS.
"""
import argparse
import json
import resource
import time

import numpy as np
import torch
import torch.nn.functional as F

from py_clock import seconds_since_exec

p = argparse.ArgumentParser()
p.add_argument("cmd", choices=["export", "train"])
p.add_argument("--model", required=True, choices=["gpt2_124m", "gpt2_tiny", "llama_tiny"])
p.add_argument("--out")
p.add_argument("--tokens")
p.add_argument("--block", type=int, default=64)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--warmup", type=int, default=4)
p.add_argument("--lr", type=float, default=1e-4)
args = p.parse_args()


def build():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    if args.model == "gpt2_124m":
        return GPT2LMHeadModel(GPT2Config(n_positions=max(args.block, 64), use_cache=False))
    if args.model == "gpt2_tiny":
        return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=args.block, n_embd=128, n_layer=4,
                                          n_head=4, use_cache=False, bos_token_id=0, eos_token_id=0))
    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=344,
                                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=args.block, use_cache=False,
                                        bos_token_id=0, eos_token_id=0, pad_token_id=None))


torch.set_num_threads(torch.get_num_threads())
model = build().train()
if args.cmd == "export":
    from torch.export import Dim
    ids = torch.randint(0, 256, (2, 16))
    ep = torch.export.export(model, (ids,), dynamic_shapes=({0: Dim("batch"), 1: Dim("seq", min=2, max=args.block)},))
    torch.export.save(ep, args.out)
    raise SystemExit(0)

tokens = np.fromfile(args.tokens, dtype=np.uint16).astype(np.int64)
rng = np.random.default_rng(0)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=True)
first = None
t0 = None
for step in range(args.steps):
    if step == args.warmup:
        t0 = time.perf_counter()
    starts = rng.integers(0, len(tokens) - args.block - 1, args.batch)
    w = torch.from_numpy(np.stack([tokens[s:s + args.block + 1] for s in starts]))
    x, y = w[:, :-1], w[:, 1:]
    logits = model(x).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if first is None:
        first = seconds_since_exec()
secs = time.perf_counter() - t0
print(json.dumps({"tokens_per_s": (args.steps - args.warmup) * args.batch * args.block / secs,
                  "first_step_s": first, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
