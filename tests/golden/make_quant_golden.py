#!/usr/bin/env python3
"""Reference values for mltrain's quantization observers from torch.ao.quantization (Debian's
python3-torch 1.13). Writes tests/golden/quant.json; tests/unit/test_quant.cpp replays it.
    .venv/bin/python tests/golden/make_quant_golden.py
"""
import json
import numpy as np
import torch
from torch.ao.quantization.observer import (MinMaxObserver, MovingAverageMinMaxObserver,
                                            PerChannelMinMaxObserver)

torch.manual_seed(7)
batches = [torch.randn(64, 16) * s + m for s, m in [(1.0, 0.5), (2.0, -1.0), (0.5, 3.0), (4.0, 0.0)]]
out = {"torch_version": torch.__version__, "batches": [b.flatten().tolist() for b in batches], "shape": [64, 16]}

mm = MinMaxObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine)
ma = MovingAverageMinMaxObserver(averaging_constant=0.01, dtype=torch.quint8, qscheme=torch.per_tensor_affine)
for b in batches:
    mm(b)
    ma(b)
for name, o in [("minmax", mm), ("moving_average_minmax", ma)]:
    s, z = o.calculate_qparams()
    out[name] = {"min": o.min_val.item(), "max": o.max_val.item(), "scale": s.item(), "zero_point": int(z.item())}

# activations that are all positive (after ReLU): zero_point must be 0
relu = MinMaxObserver(dtype=torch.quint8)
relu(torch.relu(batches[0]))
s, z = relu.calculate_qparams()
out["minmax_relu"] = {"min": relu.min_val.item(), "max": relu.max_val.item(), "scale": s.item(), "zero_point": int(z.item())}

# symmetric per-tensor int8 and per-channel int8 weights
sym = MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
sym(batches[1])
s, z = sym.calculate_qparams()
out["symmetric_int8"] = {"min": sym.min_val.item(), "max": sym.max_val.item(), "scale": s.item(), "zero_point": int(z.item())}
w = torch.randn(8, 4, 3, 3)
pc = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
pc(w)
s, z = pc.calculate_qparams()
out["per_channel_weight"] = {"weight": w.flatten().tolist(), "shape": list(w.shape), "scale": s.tolist(),
                             "zero_point": [int(v) for v in z.tolist()]}

allv = torch.cat([b.flatten() for b in batches]).numpy()
out["percentile_99_9"] = {"lo": float(np.percentile(allv, 0.1)), "hi": float(np.percentile(allv, 99.9))}
json.dump(out, open("tests/golden/quant.json", "w"))
print("wrote tests/golden/quant.json")
