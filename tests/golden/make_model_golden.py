#!/usr/bin/env python3
"""Goldens for models that arrive from Python (tests/unit/test_init_from.cpp): written with Debian's
python3-torch 1.13, run from the repository root:
    .venv/bin/python tests/golden/make_model_golden.py

- gpt_tiny.safetensors, gpt_tiny_nobias.safetensors: scripts/bench/py_gpt.py's GPT (the registry's
  layout) with random weights, LayerNorms included; gpt_tiny.json: input tokens and the logits
  Python computes for each, which the registry's gpt must reproduce within 1e-5.
- cnn_whole_module.pt: torch.save(model) of the same CNN, which mltrain refuses (a pickled class).
- cnn_state_dict.pt: torch.save(model.state_dict()) of a user's PyTorch CNN with the registry cnn's
  layers (channels [4, 8], fc 16, BatchNorm with non-trivial running statistics); cnn_tiny.json: an
  input batch and the eval-mode logits.
"""
import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench"))
from py_gpt import GPT, save_safetensors  # noqa: E402

out = {}
for name, bias in (("gpt_tiny", True), ("gpt_tiny_nobias", False)):
    torch.manual_seed(3)
    a = SimpleNamespace(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab=11, bias=bias)
    model = GPT(a).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "ln_" in n:
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if n.endswith("weight") else 0.0))
    idx = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits = model(idx)
    save_safetensors(f"tests/golden/{name}.safetensors", model.state_dict())
    out[name] = {"config": vars(a), "input": idx.tolist(), "logits": logits.flatten().tolist()}
with open("tests/golden/gpt_tiny.json", "w") as f:
    json.dump(out, f)


class Cnn(nn.Module):  # the registry cnn's layers and names (lib/src/model/model.cpp)
    def __init__(self, c1=4, c2=8, fc=16, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, c1, 5, padding=2, bias=False)
        self.bn1 = nn.BatchNorm2d(c1)
        self.conv2 = nn.Conv2d(c1, c2, 5, padding=2, bias=False)
        self.bn2 = nn.BatchNorm2d(c2)
        self.fc1 = nn.Linear(c2 * 7 * 7, fc)
        self.fc2 = nn.Linear(fc, classes)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(self.drop(F.relu(self.fc1(x.flatten(1)))))


torch.manual_seed(5)
cnn = Cnn()
with torch.no_grad():
    for bn in (cnn.bn1, cnn.bn2):
        bn.running_mean.copy_(torch.randn_like(bn.running_mean) * 0.1)
        bn.running_var.copy_(torch.rand_like(bn.running_var) + 0.5)
        bn.weight.copy_(torch.rand_like(bn.weight) + 0.5)
        bn.bias.copy_(torch.randn_like(bn.bias) * 0.1)
        bn.num_batches_tracked.fill_(7)
cnn.eval()
x = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(6))
with torch.no_grad():
    logits = cnn(x)
torch.save(cnn.state_dict(), "tests/golden/cnn_state_dict.pt")
torch.save(cnn, "tests/golden/cnn_whole_module.pt")  # a pickled nn.Module: must be refused
with open("tests/golden/cnn_tiny.json", "w") as f:
    json.dump({"input": x.flatten().tolist(), "logits": logits.flatten().tolist(),
               "keys": list(cnn.state_dict().keys())}, f)
print("wrote tests/golden/gpt_tiny*.safetensors, gpt_tiny.json, cnn_state_dict.pt, cnn_tiny.json")


# Models that compute their own loss (task custom): forward(inputs, targets).
class WithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor):
        logits = self.fc(inputs.flatten(1))
        loss = F.cross_entropy(logits, targets)
        acc = (logits.argmax(1) == targets).float().mean()
        return {"loss": loss, "acc": acc}


class NoLoss(WithLoss):
    def forward(self, inputs: torch.Tensor, targets: torch.Tensor):
        logits = self.fc(inputs.flatten(1))
        return {"acc": (logits.argmax(1) == targets).float().mean()}


torch.manual_seed(7)
torch.jit.save(torch.jit.script(WithLoss()), "tests/golden/custom_loss.pt")
torch.jit.save(torch.jit.script(NoLoss()), "tests/golden/custom_no_loss.pt")
print("wrote tests/golden/custom_loss.pt, custom_no_loss.pt")
