#!/usr/bin/env python3
"""Fashion-MNIST (Debian's dataset-fashion-mnist) as .npy for the Python baselines:
OUT/images.npy, OUT/labels.npy (train) and OUT/test_images.npy, OUT/test_labels.npy.

  .venv/bin/python scripts/bench/fmnist_npy.py OUT
"""
import gzip
import sys

import numpy as np

d = "/usr/share/datasets/fashion-mnist/"
for split, prefix in (("train", ""), ("t10k", "test_")):
    img = np.frombuffer(gzip.open(f"{d}{split}-images-idx3-ubyte.gz").read(), np.uint8, offset=16).reshape(-1, 28, 28)
    lab = np.frombuffer(gzip.open(f"{d}{split}-labels-idx1-ubyte.gz").read(), np.uint8, offset=8).astype(np.int64)
    np.save(f"{sys.argv[1]}/{prefix}images.npy", img)
    np.save(f"{sys.argv[1]}/{prefix}labels.npy", lab)
