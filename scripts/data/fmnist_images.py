#!/usr/bin/env python3
"""Exports Fashion-MNIST's real images (Debian's dataset-fashion-mnist) to image folders in
torchvision ImageFolder's layout, once: data/fmnist_png/{train,test}/<id>_<class>/<index>.png and
the same as JPEG (quality 95) under data/fmnist_jpg/. Class folders are prefixed with the label id
so their sorted order is the IDX label order.

  .venv/bin/python scripts/data/fmnist_images.py [--root /usr/share/datasets/fashion-mnist] [--out data]
      [--limit N] [--formats png,jpg]
"""
import argparse
import gzip
import os

import numpy as np
from PIL import Image

CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
           "ankle-boot"]


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def export(images, labels, out, ext):
    for c, name in enumerate(CLASSES):
        os.makedirs(os.path.join(out, f"{c}_{name}"), exist_ok=True)
    for i, (im, y) in enumerate(zip(images, labels)):
        path = os.path.join(out, f"{y}_{CLASSES[y]}", f"{i:05d}.{ext}")
        if ext == "png":
            Image.fromarray(im, "L").save(path)
        else:
            Image.fromarray(im, "L").save(path, quality=95)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", default="data")
    ap.add_argument("--limit", type=int, default=0, help="first N images of each split (tests)")
    ap.add_argument("--formats", default="png,jpg")
    a = ap.parse_args()
    splits = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
              "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
    for ext, folder in (("png", "fmnist_png"), ("jpg", "fmnist_jpg")):
        if ext not in a.formats.split(","):
            continue
        done = os.path.join(a.out, folder, ".complete")
        if os.path.exists(done):
            print(f"{os.path.join(a.out, folder)}: already exported")
            continue
        for split, (im, lb) in splits.items():
            images, labels = idx(os.path.join(a.root, im)), idx(os.path.join(a.root, lb))
            if a.limit:
                images, labels = images[:a.limit], labels[:a.limit]
            export(images, labels, os.path.join(a.out, folder, split), ext)
        open(done, "w").close()
        print(f"wrote {os.path.join(a.out, folder)}: train and test {ext} images")


if __name__ == "__main__":
    main()
