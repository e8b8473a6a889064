#!/usr/bin/env python3
"""The registry's GPT in PyTorch, for scripts/bench/gpt_speed.sh and the logits golden
(tests/golden/make_gpt_golden.py). Same layers, parameter names and init as
lib/src/model/gpt.cpp; the same window order as mltrain's loader (SplitMix64 Fisher-Yates,
data::epoch_order); weights exchanged as safetensors.

  py_gpt.py init  --out init.safetensors [--n-layer 4 ...]            fresh weights (seed 0)
  py_gpt.py train --mode idiomatic|expert|compiled --tokens train.bin --init init.safetensors --steps N
  py_gpt.py eval  --weights model.safetensors --tokens val.bin         loss per token

--mode idiomatic: what nanoGPT-style code does on PyTorch 2.x: nn.Linear,
    F.scaled_dot_product_attention(is_causal=True), torch.optim.AdamW, default threads.
--mode expert: the same with torch.set_num_threads(cores), glibc told to keep memory (the bench
    sets MALLOC_* for this process), AdamW(fused=True), zero_grad(set_to_none=True).
--mode compiled: the expert loop with the model through torch.compile (inductor, CPU).
--amp bf16: torch.autocast on CPU (on CPUs with AVX512-BF16 or AMX).
All run the venv's PyTorch 2.15 (MKL, oneDNN).
Prints one JSON line.
"""
import argparse
import json
import math
import os
import resource
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from py_clock import seconds_since_exec

M64 = (1 << 64) - 1


# ---- mltrain's sample order (lib/include/mltrain/core/rng.hpp, lib/src/data/loader.cpp) ----
class SplitMix:
    def __init__(self, seed):
        self.s = seed & M64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def below(self, n):  # Lemire's unbiased multiply-shift
        m = self.next() * n
        if (m & M64) < n:
            t = ((1 << 64) - n) % n
            while (m & M64) < t:
                m = self.next() * n
        return m >> 64


def epoch_order(n, seed, epoch):
    perm = list(range(n))
    rng = SplitMix(((seed * 0x100000001B3) & M64) ^ ((epoch + 0x51ED270B27) & M64))
    for i in range(n - 1, 0, -1):
        j = rng.below(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


# ---- safetensors (https://huggingface.co/docs/safetensors: 8-byte header size, JSON, data) ----
def save_safetensors(path, tensors):
    header, chunks, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().contiguous().to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        chunks.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def load_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        a, b = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(raw, np.float32, (b - a) // 4, 8 + n + a).copy()).reshape(e["shape"])
    return out


# ---- the model ----
class Norm(nn.Module):
    def __init__(self, n, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Attention(nn.Module):
    def __init__(self, a, Linear):
        super().__init__()
        self.c_attn = Linear(a.n_embd, 3 * a.n_embd, bias=a.bias)
        self.c_proj = Linear(a.n_embd, a.n_embd, bias=a.bias)
        self.heads, self.width = a.n_head, a.n_embd

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, hs).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Mlp(nn.Module):
    def __init__(self, a, Linear):
        super().__init__()
        self.c_fc = Linear(a.n_embd, 4 * a.n_embd, bias=a.bias)
        self.c_proj = Linear(4 * a.n_embd, a.n_embd, bias=a.bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, a, Linear):
        super().__init__()
        self.ln_1 = Norm(a.n_embd, a.bias)
        self.attn = Attention(a, Linear)
        self.ln_2 = Norm(a.n_embd, a.bias)
        self.mlp = Mlp(a, Linear)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, a, Linear=nn.Linear):
        super().__init__()
        self.wte = nn.Embedding(a.vocab, a.n_embd)
        self.wpe = nn.Embedding(a.block_size, a.n_embd)
        self.h = nn.ModuleList([Block(a, Linear) for _ in range(a.n_layer)])
        self.ln_f = Norm(a.n_embd, a.bias)
        for name, p in self.named_parameters():  # GPT-2 init, as gpt.cpp
            if "ln_" in name:
                continue
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * a.n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            else:
                nn.init.zeros_(p)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied output layer


def model_args(p):
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--no-bias", dest="bias", action="store_false")


def windows(path, block):
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    return tokens, (len(tokens) - 1) // block


def batch(tokens, ids, block):
    w = np.stack([np.asarray(tokens[i * block:i * block + block + 1], dtype=np.int64) for i in ids])
    w = torch.from_numpy(w)
    return w[:, :-1], w[:, 1:]


def cmd_train(a):
    expert = a.mode != "idiomatic"
    if expert:
        torch.set_num_threads(os.cpu_count())
    model = GPT(a, nn.Linear)
    model.load_state_dict(load_safetensors(a.init), strict=True)
    # AdamW with no weight decay on norms, biases and embeddings (configs/text_char_gpt.yaml).
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.startswith("w")]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and not n.startswith("w"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, a.beta2), eps=1e-8, fused=True if expert else None)
    step_model = torch.compile(model) if a.mode == "compiled" else model
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp == "bf16")
    tokens, count = windows(a.tokens, a.block_size)
    order = epoch_order(count, a.seed, 0)
    model.train()
    losses, window, step_losses, first_step_s = [], [], [], None
    t_begin = t0 = time.perf_counter()
    warmup_s = 0.0
    for step in range(a.steps):
        if step == a.warmup:
            t0 = time.perf_counter()
            warmup_s = t0 - t_begin
        x, y = batch(tokens, order[step * a.batch:(step + 1) * a.batch], a.block_size)
        with autocast:
            logits = step_model(x)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip, foreach=True if expert else None)
        opt.step()
        if first_step_s is None:
            first_step_s = seconds_since_exec()
        window.append(loss.item())
        step_losses.append(window[-1])
        if len(window) == a.log_every:
            losses.append(sum(window) / len(window))
            window = []
    dt = time.perf_counter() - t0
    print(json.dumps({"mode": a.mode, "amp": a.amp, "threads": torch.get_num_threads(), "steps": a.steps,
                      "tokens_per_s": (a.steps - a.warmup) * a.batch * a.block_size / dt,
                      "first_step_s": first_step_s, "warmup_s": warmup_s,
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                      "loss_every": a.log_every, "losses": losses, "step_losses": step_losses}))


def cmd_eval(a):
    torch.set_num_threads(os.cpu_count())
    model = GPT(a, nn.Linear)
    model.load_state_dict(load_safetensors(a.weights), strict=True)
    model.eval()
    tokens, count = windows(a.tokens, a.block_size)
    total, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, count, 64):
            x, y = batch(tokens, range(s, min(count, s + 64)), a.block_size)
            logits = model(x)
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
            n += y.numel()
    print(json.dumps({"eval_loss": total / n, "tokens": n}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init")
    i.add_argument("--out", required=True)
    i.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train")
    t.add_argument("--mode", choices=["idiomatic", "expert", "compiled"], required=True)
    t.add_argument("--amp", choices=["fp32", "bf16"], default="fp32")
    t.add_argument("--tokens", required=True)
    t.add_argument("--init", required=True)
    t.add_argument("--steps", type=int, default=100)
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--beta2", type=float, default=0.99)
    t.add_argument("--clip", type=float, default=1.0, help="0: no clipping")
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("eval")
    e.add_argument("--weights", required=True)
    e.add_argument("--tokens", required=True)
    for s in (i, t, e):
        model_args(s)
    a = p.parse_args()
    if a.cmd == "init":
        torch.manual_seed(a.seed)
        save_safetensors(a.out, GPT(a).state_dict())
        print(json.dumps({"wrote": a.out}))
    elif a.cmd == "train":
        cmd_train(a)
    else:
        cmd_eval(a)


if __name__ == "__main__":
    main()
