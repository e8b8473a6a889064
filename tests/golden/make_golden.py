#!/usr/bin/python3
"""Regenerates the golden reference values the C++ tests compare against.

Uses Debian's python3-torch (1.13). Run from the repository root:
    /usr/bin/python3 tests/golden/make_golden.py
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

# CosineAnnealingLR: the closed form PyTorch documents (its recursive step() drifts from it by
# rounding; mltrain matches the closed form, a pure function of the step).
sched_p = torch.nn.Parameter(torch.zeros(1))
sched_opt = torch.optim.SGD([sched_p], lr=0.1)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(sched_opt, T_max=2000, eta_min=0.001)
out["cosine"] = {"lr": 0.1, "eta_min": 0.001, "T_max": 2000, "values": []}
for t in range(2001):
    sched.last_epoch = t
    out["cosine"]["values"].append(sched._get_closed_form_lr()[0])

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
