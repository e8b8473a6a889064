#!/usr/bin/env python3
"""Python baselines for scripts/bench/train_speed.sh (the venv's PyTorch 2.15: MKL, oneDNN).

--mode idiomatic: what a PyTorch tutorial writes. nn.Linear/nn.Conv2d, a Dataset over a numpy
    memmap with per-sample normalisation, DataLoader(batch_size=128, shuffle=True), Adam.
--mode expert: the same model given mltrain's runtime fixes: glibc's allocator told to keep
    memory (the bench sets MALLOC_*_ env vars for this process),
    and torch.set_num_threads(cores); plus a preloaded, pre-normalised tensor with index_select
    batches instead of a DataLoader.
Prints one JSON line: samples/s over the timed steps and peak RSS.
"""
import argparse, json, os, resource, time
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from py_models import CNN, MLP, ExamplesCNN  # the same models and op order as mltrain

p = argparse.ArgumentParser()
p.add_argument("--model", choices=["mlp", "cnn", "examples_cnn"], required=True)
p.add_argument("--save-script", help="examples_cnn: write the model as TorchScript here and exit")
p.add_argument("--mode", choices=["idiomatic", "expert"], required=True)
p.add_argument("--images", required=True, help=".npy of uint8 [N,28,28]")
p.add_argument("--labels", required=True, help=".npy of int64 [N]")
p.add_argument("--steps", type=int, default=300)
p.add_argument("--warmup", type=int, default=20)
args = p.parse_args()
torch.manual_seed(0)
MEAN, STD = 0.2860, 0.3530

Linear = nn.Linear


model = {"mlp": MLP, "cnn": CNN, "examples_cnn": ExamplesCNN}[args.model](Linear)
if args.save_script:
    torch.jit.script(ExamplesCNN()).save(args.save_script)
    raise SystemExit(0)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
images = np.load(args.images, mmap_mode="r")
labels = np.load(args.labels, mmap_mode="r")


class MemmapDataset(torch.utils.data.Dataset):
    def __len__(self):
        return len(labels)

    def __getitem__(self, i):
        x = torch.from_numpy(np.asarray(images[i], dtype=np.float32) / 255.0)
        return ((x - MEAN) / STD).unsqueeze(0), int(labels[i])


def batches():
    if args.mode == "idiomatic":
        loader = torch.utils.data.DataLoader(MemmapDataset(), batch_size=128, shuffle=True, drop_last=True)
        while True:
            yield from loader
    else:
        torch.set_num_threads(os.cpu_count())
        x_all = ((torch.from_numpy(np.ascontiguousarray(images)).float() / 255.0 - MEAN) / STD).unsqueeze(1)
        y_all = torch.from_numpy(np.ascontiguousarray(labels)).long()
        while True:
            perm = torch.randperm(len(y_all))
            for s in range(0, len(perm) - 127, 128):
                idx = perm[s:s + 128]
                yield x_all.index_select(0, idx), y_all.index_select(0, idx)


model.train()
it = batches()
t0 = time.perf_counter()
for step in range(args.steps):
    if step == args.warmup:
        t0 = time.perf_counter()
    x, y = next(it)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
dt = time.perf_counter() - t0
print(json.dumps({"mode": args.mode, "model": args.model, "threads": torch.get_num_threads(),
                  "samples_per_s": (args.steps - args.warmup) * 128 / dt,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))
