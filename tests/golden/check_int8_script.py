"""Loads `mltrain quantize`'s TorchScript int8 model in PyTorch (no mltrain code) and prints its
accuracy on the Fashion-MNIST test split, with the input normalised as the report says.

    python3 check_int8_script.py QUANTIZE_JSON DATA_DIR   ->  {"accuracy": ..., "n": ...}
"""
import gzip
import json
import sys

import numpy as np
import torch

report = json.load(open(sys.argv[1]))
data = sys.argv[2]
torch.backends.quantized.engine = "onednn" if "onednn" in torch.backends.quantized.supported_engines else "qnnpack"
model = torch.jit.load(report["script"]["path"])
model.eval()
inp = report["script"]["input"]
with gzip.open(f"{data}/t10k-images-idx3-ubyte.gz") as f:
    x = np.frombuffer(f.read(), np.uint8, offset=16).astype(np.float32).reshape([-1] + inp["shape"])
with gzip.open(f"{data}/t10k-labels-idx1-ubyte.gz") as f:
    y = torch.from_numpy(np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64))
x = torch.from_numpy((x / 255.0 - inp["mean"]) / inp["std"])
with torch.no_grad():
    pred = torch.cat([model(x[i:i + 500]).argmax(1) for i in range(0, len(x), 500)])
print(json.dumps({"accuracy": (pred == y).double().mean().item(), "n": len(y)}))
