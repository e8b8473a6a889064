#!/usr/bin/env python3
"""Regenerates the golden reference values the C++ tests compare against.

Uses Debian's python3-torch (1.13). Run from the repository root:
    .venv/bin/python tests/golden/make_golden.py
Writes tests/golden/optim.json and tests/golden/tiny_script.pt.
"""
import json
import torch

torch.set_default_dtype(torch.float64)  # references in float64; the C++ test runs float64 too


def trajectory(make_opt, steps=25):
    g = torch.Generator().manual_seed(7)
    p = torch.nn.Parameter(torch.randn(3, 4, generator=g))
    grads = [torch.randn(3, 4, generator=g) for _ in range(steps)]
    start = p.detach().clone()
    opt = make_opt([p])
    for gr in grads:
        opt.zero_grad()
        p.grad = gr.clone()
        opt.step()
    return {"start": start.flatten().tolist(), "grads": [x.flatten().tolist() for x in grads],
            "final": p.detach().flatten().tolist()}


cases = {
    "sgd_plain": ({"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "nesterov": False},
                  lambda ps: torch.optim.SGD(ps, lr=0.1)),
    "sgd_momentum_wd": ({"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-2, "nesterov": False},
                        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-2)),
    "sgd_nesterov": ({"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0, "nesterov": True},
                     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True)),
    "adam": ({"name": "adam", "lr": 1e-2, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
             lambda ps: torch.optim.Adam(ps, lr=1e-2)),
    "adam_wd": ({"name": "adam", "lr": 1e-2, "weight_decay": 0.1, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6},
                lambda ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    "adamw": ({"name": "adamw", "lr": 1e-2, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
              lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)),
}
out = {"torch_version": torch.__version__, "cases": {}}
for name, (cfg, make) in cases.items():
    t = trajectory(make)
    t["config"] = cfg
    out["cases"][name] = t

# Cross-entropy (mean reduction) on fixed logits, the loss the trainer uses.
g = torch.Generator().manual_seed(3)
logits = torch.randn(6, 5, generator=g)
target = torch.tensor([0, 4, 2, 2, 1, 3])
out["cross_entropy"] = {"logits": logits.flatten().tolist(), "target": target.tolist(),
                        "loss": torch.nn.functional.cross_entropy(logits, target).item()}

# LR schedulers: the LR PyTorch's optimizer uses at each of N steps (read before scheduler.step()).
# "recursive" is what PyTorch's step() produces; for CosineAnnealingLR its recursive update drifts
# from its own documented closed form, so "closed" (mltrain's target) is recorded as well.
import math
from torch.optim import lr_scheduler as S


def run_sched(make, n=2001, metrics=None):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    sch = make(opt)
    lrs = []
    for t in range(n):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if metrics is None:
            sch.step()
        elif t in metrics:
            sch.step(metrics[t])
    return lrs


def cos_closed(t, T, base, eta):
    return eta + (base - eta) * (1 + math.cos(math.pi * min(t, T) / T)) / 2


scripted = {}  # plateau: a loss that improves, stalls, improves a little, stalls
v = 1.0
for k, t in enumerate(range(49, 2001, 50)):
    v = v * 0.9 if k < 8 or 14 <= k < 17 else v * 1.00001
    scripted[t] = v
sched = {
    "step": ({"name": "step", "step_size": 300, "gamma": 0.5}, run_sched(lambda o: S.StepLR(o, 300, gamma=0.5))),
    "multistep": ({"name": "multistep", "milestones": [500, 1200, 1700], "gamma": 0.3},
                  run_sched(lambda o: S.MultiStepLR(o, [500, 1200, 1700], gamma=0.3))),
    "exponential": ({"name": "exponential", "gamma": 0.999}, run_sched(lambda o: S.ExponentialLR(o, 0.999))),
    "cosine": ({"name": "cosine", "eta_min": 0.001, "total": 2000},
               [cos_closed(t, 2000, 0.1, 0.001) for t in range(2001)]),
    "cosine_restarts_mult2": ({"name": "cosine_restarts", "t0": 100, "t_mult": 2, "eta_min": 0.001},
                              run_sched(lambda o: S.CosineAnnealingWarmRestarts(o, 100, T_mult=2, eta_min=0.001))),
    "cosine_restarts_mult1": ({"name": "cosine_restarts", "t0": 300, "t_mult": 1, "eta_min": 0.0},
                              run_sched(lambda o: S.CosineAnnealingWarmRestarts(o, 300, T_mult=1))),
    "onecycle_cos": ({"name": "onecycle", "total": 2001, "pct_start": 0.3, "anneal": "cos"},
                     run_sched(lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=2001, pct_start=0.3,
                                                      cycle_momentum=False))),
    "onecycle_linear": ({"name": "onecycle", "total": 2001, "pct_start": 0.25, "anneal": "linear"},
                        run_sched(lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=2001, pct_start=0.25,
                                                         anneal_strategy="linear", cycle_momentum=False))),
    "polynomial": ({"name": "polynomial", "power": 2.0, "total": 2000},
                   run_sched(lambda o: S.PolynomialLR(o, total_iters=2000, power=2.0))),
    "cyclic_triangular": ({"name": "cyclic", "eta_min": 0.001, "step_size": 250, "step_size_down": 150,
                           "cyclic_mode": "triangular"},
                          run_sched(lambda o: S.CyclicLR(o, 0.001, 0.1, step_size_up=250, step_size_down=150,
                                                         cycle_momentum=False))),
    "cyclic_triangular2": ({"name": "cyclic", "eta_min": 0.001, "step_size": 200, "cyclic_mode": "triangular2"},
                           run_sched(lambda o: S.CyclicLR(o, 0.001, 0.1, step_size_up=200, mode="triangular2",
                                                          cycle_momentum=False))),
    "cyclic_exp_range": ({"name": "cyclic", "eta_min": 0.001, "step_size": 300, "cyclic_mode": "exp_range",
                          "gamma": 0.999},
                         run_sched(lambda o: S.CyclicLR(o, 0.001, 0.1, step_size_up=300, mode="exp_range", gamma=0.999,
                                                        cycle_momentum=False))),
    "warmup_step": ({"name": "step", "step_size": 300, "gamma": 0.5, "warmup": 200, "warmup_start": 0.1},
                    run_sched(lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, total_iters=200), S.StepLR(o, 300, 0.5)],
                                                       milestones=[200]))),
    "warmup_cosine": ({"name": "cosine", "eta_min": 0.0, "warmup": 200, "warmup_start": 0.1, "total": 2000},
                      [0.1 * (0.1 + 0.9 * t / 200) if t < 200 else cos_closed(t - 200, 1800, 0.1, 0.0)
                       for t in range(2001)]),
    "plateau": ({"name": "plateau", "gamma": 0.5, "patience": 3, "threshold": 1e-4, "cooldown": 2, "min_lr": 1e-3,
                 "mode": "min", "evals": scripted},
                run_sched(lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=3, threshold=1e-4, cooldown=2,
                                                        min_lr=1e-3), metrics=scripted)),
}
recursive_cos = run_sched(lambda o: S.CosineAnnealingLR(o, 2000, eta_min=0.001))
warm_cos_recursive = run_sched(lambda o: S.SequentialLR(
    o, [S.LinearLR(o, 0.1, total_iters=200), S.CosineAnnealingLR(o, 1800)], milestones=[200]))
out["schedules"] = {k: {"config": c, "lr": 0.1, "values": v} for k, (c, v) in sched.items()}
out["schedules"]["plateau"]["config"]["evals"] = [[t, m] for t, m in scripted.items()]
out["cosine_recursive_drift"] = max(abs(a - b) for a, b in zip(recursive_cos, sched["cosine"][1]))
out["warmup_cosine_recursive_drift"] = max(abs(a - b) for a, b in zip(warm_cos_recursive, sched["warmup_cosine"][1]))

# Cross-entropy with label smoothing (PyTorch's definition: (1-e)*CE + e*mean over classes of -log p).
out["label_smoothing"] = {"logits": logits.flatten().tolist(), "target": target.tolist(), "cases": [
    {"eps": e, "loss": torch.nn.functional.cross_entropy(logits, target, label_smoothing=e).item()}
    for e in (0.0, 0.05, 0.1, 0.3)]}

# clip_grad_norm_ on three gradient tensors, for max_norm below and above the total norm.
g = torch.Generator().manual_seed(11)
grads = [torch.randn(5, 3, generator=g) * 2, torch.randn(7, generator=g), torch.randn(2, 2, 2, generator=g) * 0.1]
clip = {"grads": [x.flatten().tolist() for x in grads], "shapes": [list(x.shape) for x in grads], "cases": []}
for max_norm in (0.5, 3.0, 1000.0):
    ps = [torch.nn.Parameter(torch.zeros_like(x)) for x in grads]
    for p_, x in zip(ps, grads):
        p_.grad = x.clone()
    total = torch.nn.utils.clip_grad_norm_(ps, max_norm).item()
    clip["cases"].append({"max_norm": max_norm, "total_norm": total,
                          "clipped": [p_.grad.flatten().tolist() for p_ in ps]})
out["clip_grad_norm"] = clip

with open("tests/golden/optim.json", "w") as f:
    json.dump(out, f, indent=1)


class Tiny(torch.nn.Module):
    """A model defined only in Python, trained from C++ (model.name: torchscript)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 14 * 14, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.flatten(1))


torch.set_default_dtype(torch.float32)
torch.manual_seed(0)
torch.jit.save(torch.jit.script(Tiny()), "tests/golden/tiny_script.pt")
print("wrote tests/golden/optim.json and tests/golden/tiny_script.pt")
