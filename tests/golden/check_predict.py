"""Golden check for `mltrain predict`: PyTorch loads the run's model.safetensors, runs the registry
MLP (body.<i> Linear layers with ReLU between them, dropout off) on the same .npy images normalised
as the run's config says, and compares its softmax with predict's CSV (columns id, prediction,
p_<class>...). Prints the largest difference; exits 1 when it is above the tolerance.

  python tests/golden/check_predict.py MODEL.safetensors INPUTS.npy PREDS.csv MEAN STD [TOL]
"""
import csv
import json
import struct
import sys

import numpy as np
import torch


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": np.float32, "F64": np.float64, "I64": np.int64}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=dtypes[e["dtype"]]).reshape(e["shape"]).copy())
    return out


def main():
    weights, inputs, preds, mean, std = sys.argv[1:6]
    tol = float(sys.argv[6]) if len(sys.argv) > 6 else 1e-6
    w = load_safetensors(weights)
    layers = sorted({int(k.split(".")[1]) for k in w if k.startswith("body.")})
    x = torch.from_numpy(np.load(inputs)).float().div(255).sub(float(mean)).div(float(std)).flatten(1)
    with torch.no_grad():
        for i, layer in enumerate(layers):
            x = x @ w[f"body.{layer}.weight"].T + w[f"body.{layer}.bias"]
            if i + 1 < len(layers):
                x = torch.relu(x)
        p = torch.softmax(x.double(), 1)
    with open(preds) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == p.shape[0], f"{len(rows)} rows for {p.shape[0]} inputs"
    got = torch.tensor([[float(r[f"p_{c}"]) for c in range(p.shape[1])] for r in rows], dtype=torch.float64)
    agree = all(int(r["prediction"]) == int(k) for r, k in zip(rows, p.argmax(1)))
    diff = (got - p).abs().max().item()
    print(f"max_abs_diff {diff:.3e} argmax_agree {agree}")
    sys.exit(0 if diff <= tol and agree else 1)


if __name__ == "__main__":
    main()
