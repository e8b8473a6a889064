"""The user's side of `model.name: exported` (tests/cli/test_cli_exported.cpp): a PyTorch class
nobody wrote for mltrain, exported to .pt2 the way the guide shows; after mltrain trains it, its
model.safetensors loads back into the same class with load_state_dict(strict=True) and the class's
eval-mode softmax equals what `mltrain predict` wrote.

  python tests/golden/check_exported.py export OUT.pt2
  python tests/golden/check_exported.py export-gpt2 OUT.pt2       # bytes (vocab 256), windows <= 64
  python tests/golden/check_exported.py check-gpt2 MODEL.safetensors
  python tests/golden/check_exported.py check MODEL.safetensors INPUTS.npy PREDS.csv MEAN STD [TOL]
"""
import csv
import json
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.export import Dim


class UserNet(nn.Module):
    """A Fashion-MNIST classifier with BatchNorm, Dropout and a residual add."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(8 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.stem(x))), 2)
        x = F.relu(x + self.bn2(self.conv(x)))
        x = F.max_pool2d(x, 2)
        return self.head(self.drop(torch.flatten(x, 1)))


def export(path):
    torch.manual_seed(0)
    model = UserNet().train()
    example = torch.randn(4, 1, 28, 28)
    ep = torch.export.export(model, (example,), dynamic_shapes=({0: Dim("batch")},))
    torch.export.save(ep, path)
    print(f"exported {path}")


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                      use_cache=False, bos_token_id=0, eos_token_id=0))


def export_gpt2(path):
    """transformers' GPT-2 exported bare: its output is the CausalLMOutputWithPast pytree."""
    model = gpt2().train()
    ids = torch.randint(0, 256, (2, 16))
    ep = torch.export.export(model, (ids,), dynamic_shapes=({0: Dim("batch"), 1: Dim("seq", min=2, max=64)},))
    torch.export.save(ep, path)
    print(f"exported {path}")


def check_gpt2(weights):
    """The trained weights load into GPT2LMHeadModel, tied embedding and all, and stay tied."""
    model = gpt2()
    state = load_file(weights)
    model.load_state_dict(state, strict=True)
    tied = model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    same = torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    moved = not torch.equal(gpt2().transformer.wte.weight, model.transformer.wte.weight)
    print(f"keys {len(state)} tied {tied} same {same} trained {moved}")
    return 0 if tied and same and moved else 1


def check_generate(weights, prompt, out_jsonl, block=64):
    """predict --generate's greedy tokens equal GPT2LMHeadModel's from the same weights, and the
    next-token log-probabilities agree."""
    model = gpt2()
    model.load_state_dict(load_file(weights), strict=True)
    model.eval()
    got = json.loads(open(out_jsonl).read().splitlines()[0])
    ids = list(open(prompt, "rb").read())
    want = []
    with torch.no_grad():
        first = None
        for _ in range(len(got["generated_tokens"])):
            x = torch.tensor([ids[-block:]])
            logits = model(x).logits[0, -1].double()
            if first is None:
                first = torch.log_softmax(logits, 0)
            t = int(logits.argmax())
            ids.append(t)
            want.append(t)
    lp = max(abs(first[e["token"]].item() - e["logprob"]) for e in got["next_token"])
    equal = want == got["generated_tokens"]
    print(f"generated {len(want)} equal {equal} next-token logprob max diff {lp:.2e}")
    return 0 if equal and lp < 1e-4 else 1


def check(weights, inputs, preds, mean, std, tol=1e-5):
    model = UserNet()
    model.load_state_dict(load_file(weights), strict=True)  # the user's names, every key
    model.eval()
    x = torch.from_numpy(np.load(inputs).astype(np.float32) / 255.0)
    x = ((x - mean) / std).unsqueeze(1)
    with torch.no_grad():
        p = torch.softmax(model(x), dim=1).numpy()
    with open(preds) as f:
        rows = list(csv.DictReader(f))
    got = np.array([[float(r[f"p_{c}"]) for c in range(10)] for r in rows])
    diff = float(np.abs(got - p).max())
    agree = all(int(r["prediction"]) == int(np.argmax(q)) for r, q in zip(rows, p))
    print(f"rows {len(rows)} max_abs_diff {diff:.3g} argmax_agree {agree}")
    return 0 if len(rows) == len(p) and diff <= tol and agree else 1


if __name__ == "__main__":
    if sys.argv[1] == "export":
        export(sys.argv[2])
    elif sys.argv[1] == "export-gpt2":
        export_gpt2(sys.argv[2])
    elif sys.argv[1] == "check-gpt2":
        sys.exit(check_gpt2(sys.argv[2]))
    elif sys.argv[1] == "check-generate":
        sys.exit(check_generate(*sys.argv[2:5]))
    else:
        a = sys.argv[2:]
        sys.exit(check(a[0], a[1], a[2], float(a[3]), float(a[4]), *(float(t) for t in a[5:6])))
