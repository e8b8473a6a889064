#!/usr/bin/env python3
"""Python PyTorch baseline on a CUDA GPU, for scripts/device/gpu_check.sh.

The same two models as mltrain's configs (the 2-conv CNN of configs/fashion_mnist_cnn.yaml and the
small ResNet of configs/fashion_mnist_resnet_recipe.yaml without augmentation), batch 128, Adam,
on the real Fashion-MNIST IDX files.

--mode idiomatic: a Dataset with per-sample normalisation, DataLoader(num_workers=4,
    pin_memory=True), .to(device, non_blocking=True): what a tutorial writes.
--mode expert: the whole training set normalised once and kept on the GPU, batches by index,
    channels_last, cudnn.benchmark. An upper bound no host-side loader can beat.
--amp none|bf16|fp16 (fp16 with torch.amp.GradScaler).
Prints one JSON line: samples/s over the timed steps.
"""
import argparse, gzip, json, time
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--model", choices=["cnn", "resnet"], required=True)
p.add_argument("--mode", choices=["idiomatic", "expert"], required=True)
p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
p.add_argument("--data", required=True, help="folder with the Fashion-MNIST .gz IDX files")
p.add_argument("--steps", type=int, default=400)
p.add_argument("--warmup", type=int, default=50)
args = p.parse_args()
torch.manual_seed(0)
MEAN, STD, B = 0.2860, 0.3530, 128
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


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 256)
        self.fc2 = nn.Linear(256, 10)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.bn1(self.conv1(x)), 2))
        x = F.relu(F.max_pool2d(self.bn2(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(self.drop(x))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.short(x) if self.short is not None else x))


class ResNet(nn.Module):  # widths [32, 64, 128], depths [1, 1, 1]
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(32)
        self.stages = nn.Sequential(Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2))
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.stem_bn(self.stem(x)))
        x = self.stages(x)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


model = (CNN() if args.model == "cnn" else ResNet()).to(dev)
if args.mode == "expert":
    model = model.to(memory_format=torch.channels_last)
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
        logits = model(x)
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
print(json.dumps({"impl": "pytorch", "mode": args.mode, "model": args.model, "amp": args.amp,
                  "samples_per_s": round((args.steps - args.warmup) * B / dt, 1), "torch": torch.__version__,
                  "gpu": torch.cuda.get_device_name(0)}))
