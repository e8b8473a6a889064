"""Golden values for model.name: exported (lib/src/model/exported.cpp): ten models exported with
torch.export from the venv's PyTorch 2.15, torchvision, timm and transformers (random weights from
fixed seeds, tiny configs, nothing downloaded), each trained 10 steps in eager PyTorch with SGD
and with AdamW on fixed batches, plus the archives the bad-input table feeds mltrain.

Run with the project's venv; ctest runs it into the build folder before test_exported:
    .venv/bin/python tests/golden/make_export_golden.py OUT_DIR [NAME ...]

Per model NAME it writes OUT_DIR/NAME.pt2 (exported in training mode, dynamic batch) and
OUT_DIR/NAME.safetensors holding the batches (x<k>, y<k>), the train-mode output and loss of step
1 with every parameter's gradient (grad/<param>; program_grad/<param> from ep.module()), the
eval-mode output (model.eval()), and the
parameters and buffers after 10 steps of each optimizer (sgd/<name>, adamw/<name>) with their
per-step losses. Step k runs under torch.manual_seed(1000 + k), so dropout draws the same masks
on both sides. One thread, so the kernels' sums run in one order. AdamW is fused=True, the kernel
mltrain's AdamW calls (lib/src/optim/optimizer.cpp).
"""
import io
import json
import sys
import zipfile
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file
from torch.export import Dim

torch.set_num_threads(1)
STEPS = 10
SGD = dict(lr=0.01, momentum=0.9)
ADAMW = dict(lr=1e-3, weight_decay=0.01)


class Small(nn.Module):
    """A module with every training-mode behaviour mltrain must turn off for evaluation."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(torch.flatten(self.drop(x), 1))


class PoolRelu(nn.Module):
    """Both orders of ReLU and a 2 x 2 max-pool, one ReLU in place, and no dropout: what
    model.script_kernels=mltrain rewrites to mltrain.relu_max_pool2d, trained bit for bit against
    the same graph on ATen's operators (tests/unit/test_exported.cpp)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.act = nn.ReLU(inplace=True)
        self.fc = nn.Linear(8 * 2 * 2, 10)

    def forward(self, x):
        x = self.act(F.max_pool2d(self.bn(self.conv1(x)), 2))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


class BnSilu(nn.Module):
    """EfficientNet's "conv, BatchNorm, SiLU" (in place and not), with a stride-2 convolution:
    what model.fused_batchnorm rewrites to mltrain.batch_norm_silu."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.act1 = nn.SiLU(inplace=True)
        self.conv2 = nn.Conv2d(16, 24, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(24, momentum=0.01, eps=1e-3)
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        x = self.act1(self.bn1(self.conv1(x)))
        x = F.silu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Symbolic(nn.Module):
    """Shape arithmetic on the dynamic dimensions: the graph holds _operator.mul, floordiv and sub
    nodes on SymInts, and the batches change their second dimension."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        b, t = x.shape[0], x.shape[1]
        h = self.fc(x.reshape(b * t, 6)).reshape(b, t * 4)
        half = (t * 4) // 2
        return h[:, :half] + h[:, half:] * (t - 1)


class Logits(nn.Module):
    """transformers' CausalLM without the ModelOutput wrapper, as a user might export it."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(ids).logits


def models():
    import torchvision
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              ViTConfig, ViTForImageClassification)

    def image(shape):
        return lambda g, b: (torch.randn(b, *shape, generator=g), torch.randint(0, 10, (b,), generator=g))

    def tokens(vocab, t):
        def make(g, b):
            ids = torch.randint(0, vocab, (b, t + 1), generator=g)
            return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
        return make

    yield "small", lambda: Small(), image((3, 8, 8)), 6
    yield "pool_relu", lambda: PoolRelu(), image((3, 8, 8)), 6
    yield "bn_silu", lambda: BnSilu(), image((3, 16, 16)), 6

    def varying(g, b):  # t = 4 or 5: outputs 8 or 10 wide; targets < 8 fit both
        t = 4 + int(torch.randint(0, 2, (1,), generator=g))
        return torch.randn(b, t, 6, generator=g), torch.randint(0, 8, (b,), generator=g)
    yield "symbolic", lambda: Symbolic(), varying, 5
    yield "resnet18", lambda: torchvision.models.resnet18(num_classes=10), image((3, 32, 32)), 4
    yield "mobilenet_v3_small", lambda: torchvision.models.mobilenet_v3_small(num_classes=10), image((3, 32, 32)), 4
    # timm: ConvNeXt's LayerNorm over permuted NHWC activations, GELU, layer scale.
    import timm
    yield "convnext_atto", lambda: timm.create_model("convnext_atto", pretrained=False, num_classes=10), image((3, 32, 32)), 4
    llama = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        use_cache=False)
    yield "llama", lambda: Logits(LlamaForCausalLM(llama)), tokens(96, 12), 3
    gpt2 = GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4, use_cache=False,
                      bos_token_id=0, eos_token_id=0)
    # Bare: the graph returns the CausalLMOutputWithPast pytree, mltrain picks its 'logits' leaf.
    yield "gpt2", lambda: GPT2LMHeadModel(gpt2), tokens(96, 12), 3
    vit = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=64, num_labels=10)
    yield "vit", lambda: ViTForImageClassification(vit), image((3, 16, 16)), 4


def logits(out):
    return out if isinstance(out, torch.Tensor) else out.logits


def loss_of(out, y):
    out = logits(out)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def make(out_dir, name, build, batch, size):
    torch.manual_seed(7)
    model = build().train()
    g = torch.Generator().manual_seed(11)
    batches = [batch(g, size) for _ in range(STEPS)]
    start = {k: v.clone() for k, v in model.state_dict().items()}
    x0 = batches[0][0]
    dims = {0: Dim("batch", min=1, max=1024)}
    if x0.dtype == torch.long or name == "symbolic":
        dims[1] = Dim("seq", min=2, max=64)
    ep = torch.export.export(model, (x0,), dynamic_shapes=(dims,))
    torch.export.save(ep, str(out_dir / f"{name}.pt2"))
    t = {}
    for k, (x, y) in enumerate(batches):
        t[f"x{k}"], t[f"y{k}"] = x, y
    # Step 1's output, loss and gradients in training mode.
    model.load_state_dict(start)
    torch.manual_seed(1000)
    out = logits(model(x0))
    loss = loss_of(out, batches[0][1])
    loss.backward()
    t["train_out"], t["loss"] = out.detach(), loss.detach().reshape(1)
    for n, p in model.named_parameters():
        t[f"grad/{n}"] = p.grad.detach().clone()
    model.zero_grad(set_to_none=True)
    # The same step through the exported program run by PyTorch itself (ep.module()): where the
    # program is not the eager module's computation (transformers' Llama materialises its causal
    # mask under export, where eager SDPA runs is_causal=True without one), mltrain must still
    # match the program bit for bit.
    program = torch.export.load(str(out_dir / f"{name}.pt2")).module()
    program.load_state_dict(start, strict=False)
    torch.manual_seed(1000)
    loss_of(program(x0), batches[0][1]).backward()
    for n, p in program.named_parameters():
        if p.grad is not None:  # ep.module() unties GPT-2's wte/lm_head: one of them has none
            t[f"program_grad/{n}"] = p.grad.detach().clone()
    # Evaluation mode, from the starting weights.
    model.load_state_dict(start)
    model.eval()
    with torch.no_grad():
        t["eval_out"] = logits(model(x0)).clone()
    model.train()
    for opt_name, make_opt in (("sgd", lambda ps: torch.optim.SGD(ps, foreach=False, **SGD)),
                               ("adamw", lambda ps: torch.optim.AdamW(ps, fused=True, **ADAMW))):
        model.load_state_dict(start)
        opt = make_opt(model.parameters())
        losses = []
        for k, (x, y) in enumerate(batches):
            torch.manual_seed(1000 + k)
            loss = loss_of(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        t[f"{opt_name}_loss"] = torch.tensor(losses, dtype=torch.float64)
        for n, v in model.state_dict().items():
            t[f"{opt_name}/{n}"] = v.clone()
    save_file({k: v.contiguous() for k, v in t.items()}, str(out_dir / f"{name}.safetensors"))
    (out_dir / f"{name}.json").write_text(json.dumps({
        "steps": STEPS, "sgd": SGD, "adamw": ADAMW, "batch": size,
        "params": [n for n, _ in model.named_parameters()],
        "state": list(model.state_dict().keys())}))


def rewrite(src, dst, edit):
    """Copies a zip, letting edit(name, bytes) change (return bytes) or drop (return None) entries."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = edit(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)


def bad_inputs(out_dir):
    """The archives of the bad-input table (tests/unit/test_exported.cpp), from small.pt2."""
    small = out_dir / "small.pt2"
    (out_dir / "bad_not_zip.pt2").write_text("this is not a zip archive\n")
    data = small.read_bytes()
    (out_dir / "bad_truncated.pt2").write_bytes(data[: len(data) * 2 // 3])

    def program(edit):
        def f(name, b):
            if name.endswith("models/model.json"):
                j = json.loads(b)
                edit(j)
                return json.dumps(j).encode()
            return b
        return f

    rewrite(small, out_dir / "bad_schema9.pt2",
            program(lambda j: j["schema_version"].update(major=9, minor=0)))

    def custom_op(j):
        for n in j["graph_module"]["graph"]["nodes"]:
            if n["target"] == "torch.ops.aten.relu.default":
                n["target"] = "torch.ops.mylib.fancy_relu.default"
    rewrite(small, out_dir / "bad_custom_op.pt2", program(custom_op))
    rewrite(small, out_dir / "bad_missing_weight.pt2",
            lambda name, b: None if name.endswith("data/weights/weight_0") else b)
    with zipfile.ZipFile(small) as zin, zipfile.ZipFile(out_dir / "deflated.pt2", "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    # zip64 records for every entry (what an archive past 4 GiB has), written by Python's zipfile.
    with zipfile.ZipFile(small) as zin, zipfile.ZipFile(out_dir / "zip64.pt2", "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            with zout.open(info.filename, "w", force_zip64=True) as f:
                f.write(zin.read(info.filename))
    with zipfile.ZipFile(out_dir / "bad_aoti.pt2", "w") as z:
        z.writestr("pkg/archive_format", "pt2")
        z.writestr("pkg/data/aotinductor/model/model.wrapper.so", b"\x7fELF")
    torch.manual_seed(7)
    m = Small()
    x = torch.randn(4, 3, 8, 8)
    torch.export.save(torch.export.export(m.eval(), (x,), dynamic_shapes=({0: Dim("batch")},)),
                      str(out_dir / "bad_eval_mode.pt2"))
    torch.export.save(torch.export.export(m.train(), (x,)), str(out_dir / "static_batch.pt2"))


def main():
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    only = set(sys.argv[2:])
    for name, build, batch, size in models():
        if not only or name in only:
            make(out_dir, name, build, batch, size)
            print(f"exported {name}")
    if not only or "bad" in only:
        bad_inputs(out_dir)
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    main()
