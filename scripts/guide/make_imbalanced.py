#!/usr/bin/env python3
"""An imbalanced binary task from Fashion-MNIST for the oversampling row of scripts/guide/verdicts.py:
T-shirt/top (class 0 of Fashion-MNIST) against shirt (class 6), the pair its classifiers confuse
most. Label 0 (the negatives) = shirt, the minority: every 10th shirt of the training set (600)
against all 6000 T-shirts; the test set keeps both classes whole (1000 each).
    .venv/bin/python scripts/guide/make_imbalanced.py OUT_DIR
writes OUT_DIR/{train,test}_{images,labels}.npy (uint8 [N, 28, 28], int64 [N])."""
import gzip
import sys
from pathlib import Path

import numpy as np

SRC = Path("/usr/share/datasets/fashion-mnist")


def idx(name, offset):
    with gzip.open(SRC / name) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def split(kind, keep_every):
    x = idx(f"{kind}-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    y = idx(f"{kind}-labels-idx1-ubyte.gz", 8)
    shirt, tee = np.flatnonzero(y == 6)[::keep_every], np.flatnonzero(y == 0)
    take = np.sort(np.concatenate([shirt, tee]))
    return np.ascontiguousarray(x[take]), (y[take] == 0).astype(np.int64)  # 1: T-shirt, 0: shirt


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for kind, name, every in (("train", "train", 10), ("t10k", "test", 1)):
        x, y = split(kind, every)
        np.save(out / f"{name}_images.npy", x)
        np.save(out / f"{name}_labels.npy", y)
        print(f"{name}: {len(y)} images, {int((y == 0).sum())} of label 0 (shirt)")


if __name__ == "__main__":
    main()
