#!/usr/bin/env python3
"""Real small data sets for the regression and multi-label jobs, exported once to .npy.

  .venv/bin/python scripts/data/export_tabular.py [OUT_DIR]      (default: data/)

- diabetes/: scikit-learn's bundled diabetes data (Efron et al. 2004; 442 patients, 10 baseline
  features already centred and scaled, target: disease progression one year later), split 80/20
  by a seeded permutation: {train,test}_x.npy (float32 [N, 10]), {train,test}_y.npy (float32 [N]).
  The targets are standardised with the training split's mean and std (written to meta.json), so
  MAE/RMSE are in standard deviations of the target and R^2 is unchanged.
- fmnist_attributes/: a multi-label task on Fashion-MNIST's real images: each class mapped to
  six attributes (below); {train,test}_labels.npy (float32 0/1 [N, 6]) to pair with the IDX images.
- breast_cancer/: scikit-learn's Wisconsin diagnostic table as {train,test}.csv (header, text
  classes "malignant"/"benign", a few blank cells in train) for `data.format: csv`.
- fmnist_footwear/: the sandal, sneaker and ankle-boot images relabelled 0..2, for fine-tuning a
  new head on the main job's CNN: {train,test}_images.npy (u8 [N, 28, 28]), _labels.npy (int64).
Needs Debian's python3-sklearn and python3-numpy (installed by scripts/install-deps.sh).
"""
import csv
import gzip
import json
import os
import sys

import numpy as np
from sklearn.datasets import load_breast_cancer, load_diabetes

out = sys.argv[1] if len(sys.argv) > 1 else "data"

# ---- diabetes (regression) ----
x, y = load_diabetes(return_X_y=True)
perm = np.random.default_rng(0).permutation(len(y))
n_train = int(0.8 * len(y))
tr, te = perm[:n_train], perm[n_train:]
mean, std = float(y[tr].mean()), float(y[tr].std())
d = os.path.join(out, "diabetes")
os.makedirs(d, exist_ok=True)
for name, idx in (("train", tr), ("test", te)):
    np.save(os.path.join(d, f"{name}_x.npy"), x[idx].astype(np.float32))
    np.save(os.path.join(d, f"{name}_y.npy"), ((y[idx] - mean) / std).astype(np.float32))
with open(os.path.join(d, "meta.json"), "w") as f:
    json.dump({"source": "sklearn.datasets.load_diabetes", "train": len(tr), "test": len(te),
               "target_mean": mean, "target_std": std}, f, indent=1)

# ---- Fashion-MNIST attributes (multi-label) ----
ATTRIBUTES = ["upper_body", "legs", "footwear", "long_sleeves", "closed_shoe", "carried"]
# classes: 0 T-shirt/top 1 Trouser 2 Pullover 3 Dress 4 Coat 5 Sandal 6 Shirt 7 Sneaker 8 Bag 9 Ankle boot
HAS = {
    "upper_body": [0, 2, 3, 4, 6],
    "legs": [1, 3],
    "footwear": [5, 7, 9],
    "long_sleeves": [2, 4, 6],
    "closed_shoe": [7, 9],
    "carried": [8],
}
table = np.zeros((10, len(ATTRIBUTES)), np.float32)
for j, a in enumerate(ATTRIBUTES):
    table[HAS[a], j] = 1
root = "/usr/share/datasets/fashion-mnist"
d = os.path.join(out, "fmnist_attributes")
os.makedirs(d, exist_ok=True)
for name, f in (("train", "train-labels-idx1-ubyte.gz"), ("test", "t10k-labels-idx1-ubyte.gz")):
    with gzip.open(os.path.join(root, f)) as g:
        labels = np.frombuffer(g.read(), np.uint8, offset=8)
    np.save(os.path.join(d, f"{name}_labels.npy"), table[labels])
with open(os.path.join(d, "meta.json"), "w") as f:
    json.dump({"attributes": ATTRIBUTES, "classes_with_attribute": HAS}, f, indent=1)
# ---- Fashion-MNIST footwear (fine-tuning a head on a subset of classes) ----
# Sandal, Sneaker, Ankle boot -> 0, 1, 2: for configs/fmnist_footwear_finetune.yaml, which starts
# from the main job's 10-class CNN and trains a new 3-class head on top of its frozen layers.
d = os.path.join(out, "fmnist_footwear")
os.makedirs(d, exist_ok=True)
for name, pre in (("train", "train"), ("test", "t10k")):
    with gzip.open(os.path.join(root, f"{pre}-images-idx3-ubyte.gz")) as g:
        images = np.frombuffer(g.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(os.path.join(root, f"{pre}-labels-idx1-ubyte.gz")) as g:
        labels = np.frombuffer(g.read(), np.uint8, offset=8)
    keep = np.isin(labels, [5, 7, 9])
    np.save(os.path.join(d, f"{name}_images.npy"), np.ascontiguousarray(images[keep]))
    np.save(os.path.join(d, f"{name}_labels.npy"), np.searchsorted([5, 7, 9], labels[keep]).astype(np.int64))
# ---- breast cancer (a CSV table: data.format csv) ----
# scikit-learn's bundled Wisconsin diagnostic data (569 tumours, 30 real-valued features), written
# as CSV with a header and text class names, split 80/20 by a seeded permutation; a few cells are
# blanked in the training table (every 97th row's "mean texture") to exercise data.csv.fill.
bc = load_breast_cancer()
perm = np.random.default_rng(1).permutation(len(bc.target))
n_train = int(0.8 * len(perm))
d = os.path.join(out, "breast_cancer")
os.makedirs(d, exist_ok=True)
names = [n.replace(" ", "_") for n in bc.feature_names]
for split, idx in (("train", perm[:n_train]), ("test", perm[n_train:])):
    with open(os.path.join(d, f"{split}.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names + ["diagnosis"])
        for k, i in enumerate(idx):
            row = [f"{v:.6g}" for v in bc.data[i]]
            if split == "train" and k % 97 == 5:
                row[1] = ""
            w.writerow(row + [bc.target_names[bc.target[i]]])
print(f"wrote {out}/breast_cancer/train.csv ({n_train} rows), test.csv ({len(perm) - n_train} rows)")

print(f"wrote {out}/diabetes ({len(tr)} train, {len(te)} test), {out}/fmnist_attributes, {out}/fmnist_footwear")
