#!/usr/bin/env python3
"""The Python side of scripts/bench/loader_speed.sh: torchvision's ImageFolder + DataLoader over
the same image folder, with the same work per sample as the mltrain side: decode (PIL), grayscale,
RandomResizedCrop(28, scale=(0.7, 1.0)), RandomHorizontalFlip, ToTensor, Normalize, batches of 128.
Prints one JSON line: samples/s over the timed batches.
"""
import argparse
import json
import time

import torch
from PIL import Image
from torchvision import datasets, transforms as T

p = argparse.ArgumentParser()
p.add_argument("--root", required=True)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--batches", type=int, default=100)
p.add_argument("--warmup", type=int, default=10)
a = p.parse_args()
torch.set_num_threads(1)


def gray(path):
    with open(path, "rb") as f:
        return Image.open(f).convert("L")


tf = T.Compose([T.RandomResizedCrop(28, scale=(0.7, 1.0)), T.RandomHorizontalFlip(), T.ToTensor(),
                T.Normalize((0.2860,), (0.3530,))])
ds = datasets.ImageFolder(a.root, transform=tf, loader=gray)
dl = torch.utils.data.DataLoader(ds, batch_size=128, shuffle=True, num_workers=a.workers,
                                 drop_last=True, persistent_workers=a.workers > 0)
n, sink = 0, 0.0
t0 = time.perf_counter()
while n < a.batches:
    for x, y in dl:
        sink += float(x[0, 0, 0, 0])
        n += 1
        if n == a.warmup:
            t0 = time.perf_counter()
        if n == a.batches:
            break
print(json.dumps({"side": "torchvision", "workers": a.workers,
                  "samples_per_s": (a.batches - a.warmup) * 128 / (time.perf_counter() - t0)}))
