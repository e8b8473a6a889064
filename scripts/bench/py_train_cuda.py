#!/usr/bin/env python3
"""Python PyTorch baseline on a CUDA GPU, for scripts/device/gpu_check.sh.

The same two models as mltrain's configs (the 2-conv CNN of configs/fashion_mnist_cnn.yaml and the
small ResNet of configs/fashion_mnist_resnet_recipe.yaml without augmentation), batch 128, Adam,
on the real Fashion-MNIST IDX files.

--mode idiomatic: a Dataset with per-sample normalisation, DataLoader(num_workers=4,
    pin_memory=True), .to(device, non_blocking=True): what a tutorial writes.
--mode expert: the whole training set normalised once and kept on the GPU, batches by index,
    channels_last, cudnn.benchmark. An upper bound no host-side loader can beat.
--mode compile: the expert loop with torch.compile(model) (default mode); the compilation happens in
    the warm-up steps, so the figure is the compiled steady state.
--amp none|bf16|fp16 (fp16 with torch.amp.GradScaler).
Prints one JSON line: samples/s over the timed steps.
"""
import argparse, gzip, json, time
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from py_models import CNN, ResNet  # the same models and op order as mltrain

p = argparse.ArgumentParser()
p.add_argument("--model", choices=["cnn", "resnet"], required=True)
p.add_argument("--mode", choices=["idiomatic", "expert", "compile"], required=True)
p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
p.add_argument("--data", required=True, help="folder with the Fashion-MNIST .gz IDX files")
p.add_argument("--steps", type=int, default=400)
p.add_argument("--warmup", type=int, default=50)
p.add_argument("--batch", type=int, default=128)
args = p.parse_args()
torch.manual_seed(0)
MEAN, STD, B = 0.2860, 0.3530, args.batch
dev = torch.device("cuda")
torch.backends.cudnn.benchmark = True


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


images = idx(f"{args.data}/train-images-idx3-ubyte.gz")
labels = idx(f"{args.data}/train-labels-idx1-ubyte.gz").astype(np.int64)


model = (CNN() if args.model == "cnn" else ResNet()).to(dev)
if args.mode != "idiomatic":
    model = model.to(memory_format=torch.channels_last)
step_model = torch.compile(model) if args.mode == "compile" else model
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
scaler = torch.amp.GradScaler("cuda") if args.amp == "fp16" else None


class DS(torch.utils.data.Dataset):
    def __len__(self):
        return len(labels)

    def __getitem__(self, i):
        x = torch.from_numpy(images[i].astype(np.float32) / 255.0)
        return ((x - MEAN) / STD).unsqueeze(0), int(labels[i])


def batches():
    if args.mode == "idiomatic":
        loader = torch.utils.data.DataLoader(DS(), batch_size=B, shuffle=True, drop_last=True, num_workers=4,
                                             pin_memory=True, persistent_workers=True)
        while True:
            for x, y in loader:
                yield x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    else:
        x_all = ((torch.from_numpy(images.copy()).to(dev).float() / 255.0 - MEAN) / STD).unsqueeze(1)
        x_all = x_all.contiguous(memory_format=torch.channels_last)
        y_all = torch.from_numpy(labels.copy()).to(dev)
        while True:
            perm = torch.randperm(len(y_all), device=dev)
            for s in range(0, len(perm) - B + 1, B):
                i = perm[s:s + B]
                yield x_all[i], y_all[i]


model.train()
it = batches()
for step in range(args.steps):
    if step == args.warmup:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
    x, y = next(it)
    with torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None):
        logits = step_model(x)
    loss = F.cross_entropy(logits.float(), y)
    opt.zero_grad(set_to_none=True)
    if scaler:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(json.dumps({"impl": "pytorch", "mode": args.mode, "model": args.model, "amp": args.amp, "batch": B,
                  "samples_per_s": round((args.steps - args.warmup) * B / dt, 1), "torch": torch.__version__,
                  "gpu": torch.cuda.get_device_name(0)}))
