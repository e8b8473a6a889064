"""Golden values for model.script_kernels (lib/src/model/script_kernels.cpp): a small
pytorch/examples-style Net scripted with torch.jit.script, and PyTorch's own logits and parameter
gradients for one fixed batch in evaluation mode (dropout off), so the C++ side can check that the
rewritten graph computes what the saved one does.

Run from the repository root with the project's venv:
    .venv/bin/python tests/golden/make_script_golden.py
Writes tests/golden/script_net.pt and tests/golden/script_net.json.
"""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """pytorch/examples' MNIST Net in small, on 13 x 13 inputs: the "ReLU, 2 x 2 pool" sees a
    9 x 9 map (its last row and column in no window), and a 3 x 3 pool after a ReLU that must stay
    ATen's."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(8 * 2 * 2, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))                      # 11 x 11
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)     # 9 x 9 -> 4 x 4
        x = F.max_pool2d(F.relu(x - 0.1), 3, 1)        # 2 x 2, kernel 3: not rewritten
        x = self.fc1(torch.flatten(self.dropout1(x), 1))
        x = self.fc2(self.dropout2(F.relu(x)))
        return F.log_softmax(x, dim=1)


torch.manual_seed(11)
net = Net()
torch.jit.save(torch.jit.script(net), "tests/golden/script_net.pt")
net.eval()
x = torch.randn(6, 1, 13, 13, generator=torch.Generator().manual_seed(12))
w = torch.randn(6, 10, generator=torch.Generator().manual_seed(13))
out = net(x)
(out * w).sum().backward()
with open("tests/golden/script_net.json", "w") as f:
    json.dump({"input": x.flatten().tolist(), "weights": w.flatten().tolist(),
               "output": out.detach().flatten().tolist(),
               "grads": {n: p.grad.flatten().tolist() for n, p in net.named_parameters()}}, f)
print("wrote tests/golden/script_net.pt and tests/golden/script_net.json")
