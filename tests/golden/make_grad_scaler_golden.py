#!/usr/bin/env python3
"""Records PyTorch's GradScaler scale sequence on a scripted overflow pattern (needs CUDA: in
PyTorch the scale update only has a CUDA kernel). Run on a GPU machine:
    python3 tests/golden/make_grad_scaler_golden.py tests/golden/grad_scaler_cuda.json
(scripts/device/gpu_check.sh does this and returns the file.)
tests/unit/test_engine.cpp replays the same pattern through mltrain's LossScaler.
"""
import json, sys
import torch

cases = []
for init, growth, backoff, interval, overflow, steps in [
    (2.0 ** 16, 2.0, 0.5, 3, {1, 2, 7, 8, 9, 10, 20, 21, 22, 23, 24, 25}, 40),
    (1024.0, 4.0, 0.25, 2, {0, 5, 6, 30}, 36),
    (8.0, 2.0, 0.5, 1, {3, 4, 5, 6, 7, 8, 9, 10}, 20),
]:
    p = torch.nn.Parameter(torch.ones(4, device="cuda"))
    opt = torch.optim.SGD([p], lr=1e-3)
    scaler = torch.cuda.amp.GradScaler(init_scale=init, growth_factor=growth, backoff_factor=backoff,
                                       growth_interval=interval)
    scales, stepped = [], []
    for t in range(steps):
        opt.zero_grad()
        scaler.scale((p * 1.0).sum()).backward()
        if t in overflow:
            p.grad.fill_(float("inf"))
        before = p.detach().clone()
        scaler.step(opt)
        scaler.update()
        stepped.append(bool(not torch.equal(before, p.detach())))
        scales.append(scaler.get_scale())
    cases.append({"init_scale": init, "growth_factor": growth, "backoff_factor": backoff,
                  "growth_interval": interval, "overflow": sorted(overflow), "steps": steps,
                  "scale_after_update": scales, "stepped": stepped})
json.dump({"torch_version": torch.__version__, "device": torch.cuda.get_device_name(0), "cases": cases},
          open(sys.argv[1], "w"), indent=1)
print("ok", torch.__version__, torch.cuda.get_device_name(0))
