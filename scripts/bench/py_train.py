#!/usr/bin/env python3
"""Python baselines for scripts/bench/train_speed.sh and scripts/bench/modern_speed.sh (the venv's
PyTorch 2.15: MKL, oneDNN, inductor). Three ways of writing the same training loop:

--mode idiomatic: what a PyTorch tutorial writes. The model as is, a Dataset (a numpy memmap with
    per-sample normalisation, or torchvision's ImageFolder with transforms) and
    DataLoader(batch_size=128, shuffle=True), the optimizer, default threads.
--mode expert: the same model given what an experienced user does: torch.set_num_threads(cores),
    glibc's allocator told to keep memory (the bench sets MALLOC_*_ env vars for this process),
    data decoded and normalised once into one tensor and batched with index_select,
    zero_grad(set_to_none=True), channels-last activations and weights for the convolutional
    models where it is faster (--channels-last auto), foreach/fused optimizer kernels.
--mode compiled: the expert loop with the model through torch.compile (inductor, CPU); the
    first steps' compile time is reported apart from the steady state.

Workloads: the mltrain registry's MLP, CNN and ResNet (py_models.py, same layers and op order),
pytorch/examples' MNIST Net (trained by mltrain as TorchScript), and torchvision's ResNet-18 and
MobileNetV3-small (trained by mltrain as TorchScript from an image folder at 32 x 32 RGB).
--save-script writes the model as TorchScript (what mltrain trains) and exits; --save-export writes
it as a torch.export program (.pt2, training mode, dynamic batch) for model.name: exported.

Prints one JSON line: steady-state samples/s over the timed steps, the seconds from this
process's exec to the end of its first optimizer step (the same /proc clock as mltrain's
first_step_s), the compiled mode's warm-up time, and peak RSS.
"""
import argparse
import json
import os
import resource
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from py_clock import seconds_since_exec
from py_models import CNN, MLP, ExamplesCNN, ResNet  # the same models and op order as mltrain

CONV = {"cnn", "examples_cnn", "resnet", "tv_resnet18", "tv_mobilenet_v3_small", "tv_efficientnet_b0"}
p = argparse.ArgumentParser()
p.add_argument("--model", required=True,
               choices=["mlp", "cnn", "examples_cnn", "resnet", "tv_resnet18", "tv_mobilenet_v3_small",
                        "tv_efficientnet_b0"])
p.add_argument("--save-script", help="write the model as TorchScript here and exit")
p.add_argument("--save-export", help="write the model as a torch.export .pt2 here and exit")
p.add_argument("--mode", choices=["idiomatic", "expert", "compiled"], default="idiomatic")
p.add_argument("--images", help=".npy of uint8 [N,28,28] (Fashion-MNIST)")
p.add_argument("--labels", help=".npy of int64 [N]")
p.add_argument("--folder", help="an image folder (ImageFolder layout), read at 32 x 32 RGB")
p.add_argument("--steps", type=int, default=300)
p.add_argument("--warmup", type=int, default=20)
p.add_argument("--channels-last", choices=["auto", "on", "off"], default="auto",
               help="expert/compiled: auto is on for the convolutional models")
p.add_argument("--amp", choices=["fp32", "bf16"], default="fp32", help="bf16: torch.autocast on CPU")
# Time to accuracy (scripts/bench/time_to_accuracy.sh): train --epochs with a cosine schedule from
# --lr to 0, evaluate on the test split after every epoch, report when --target was first reached.
p.add_argument("--epochs", type=int, default=0, help="train whole epochs (overrides --steps)")
p.add_argument("--test-images", help=".npy of the test split's uint8 images")
p.add_argument("--test-labels", help=".npy of the test split's labels")
p.add_argument("--target", type=float, default=0.916)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()
torch.manual_seed(args.seed)
MEAN, STD = 0.2860, 0.3530


def make_model():
    if args.model == "tv_resnet18":
        import torchvision
        return torchvision.models.resnet18(num_classes=10)
    if args.model == "tv_mobilenet_v3_small":
        import torchvision
        return torchvision.models.mobilenet_v3_small(num_classes=10)
    if args.model == "tv_efficientnet_b0":  # conv, BatchNorm, SiLU; stochastic depth
        import torchvision
        return torchvision.models.efficientnet_b0(num_classes=10)
    return {"mlp": MLP, "cnn": CNN, "examples_cnn": ExamplesCNN, "resnet": ResNet}[args.model]()


model = make_model()
if args.save_script:
    torch.jit.script(model).save(args.save_script)
    raise SystemExit(0)
if args.save_export:
    shape = (2, 3, 32, 32) if args.model.startswith("tv_") else (2, 1, 28, 28)
    ep = torch.export.export(model.train(), (torch.randn(*shape),),
                             dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(ep, args.save_export)
    raise SystemExit(0)

expert = args.mode != "idiomatic"
if not expert:
    channels_last = False
elif args.channels_last == "auto":
    channels_last = args.model in CONV
else:
    channels_last = args.channels_last == "on"
if expert:
    torch.set_num_threads(os.cpu_count())
    if channels_last:
        model = model.to(memory_format=torch.channels_last)

# The optimizer of mltrain's config for the workload: Adam, or the ResNet recipe's SGD with Nesterov
# momentum, weight decay off BatchNorm and biases, label smoothing and a weight EMA.
recipe = args.model == "resnet"
if recipe:
    decay = [q for n, q in model.named_parameters() if q.dim() > 1]
    rest = [q for n, q in model.named_parameters() if q.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}],
                          lr=0.1, momentum=0.9, nesterov=True, foreach=expert)
    if expert:
        ema = [q.detach().clone() for q in model.parameters()]
    else:
        ema_model = torch.optim.swa_utils.AveragedModel(
            model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.999))
else:
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True) if expert else \
        torch.optim.Adam(model.parameters(), lr=args.lr)
smoothing = 0.1 if recipe else 0.0
step_model = torch.compile(model) if args.mode == "compiled" else model


def folder_batches():
    import torchvision
    import torchvision.transforms as T
    tf = T.Compose([T.Resize(32), T.Grayscale(3), T.ToTensor(), T.Normalize((0.5,) * 3, (0.5,) * 3)])
    ds = torchvision.datasets.ImageFolder(args.folder, transform=tf)
    if not expert:
        loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, drop_last=True, num_workers=2)
        while True:
            yield from loader
    # Expert: decoded once into one tensor (what users with a small image set do).
    x_all = torch.stack([ds[i][0] for i in range(len(ds))])
    y_all = torch.tensor(ds.targets)
    yield from tensor_batches(x_all, y_all)


def tensor_batches(x_all, y_all):
    if channels_last and x_all.dim() == 4:
        x_all = x_all.contiguous(memory_format=torch.channels_last)
    while True:
        perm = torch.randperm(len(y_all))
        for s in range(0, len(perm) - args.batch + 1, args.batch):
            idx = perm[s:s + args.batch]
            yield x_all.index_select(0, idx), y_all.index_select(0, idx)


def normalised(images):
    x = (torch.from_numpy(np.array(images)).float() / 255.0 - MEAN) / STD
    return x.unsqueeze(1).contiguous(memory_format=torch.channels_last) if channels_last else x.unsqueeze(1)


def npy_batches():
    images = np.load(args.images, mmap_mode="r")
    labels = np.load(args.labels, mmap_mode="r")

    class MemmapDataset(torch.utils.data.Dataset):
        def __len__(self):
            return len(labels)

        def __getitem__(self, i):
            x = torch.from_numpy(np.asarray(images[i], dtype=np.float32) / 255.0)
            return ((x - MEAN) / STD).unsqueeze(0), int(labels[i])

    if not expert:
        loader = torch.utils.data.DataLoader(MemmapDataset(), batch_size=args.batch, shuffle=True, drop_last=True)
        while True:
            yield from loader
    yield from tensor_batches(normalised(images), torch.from_numpy(np.array(labels)).long())


def time_to_accuracy():
    """Whole epochs (the last batch partial, as mltrain's loader), cosine LR per step to 0, the test
    split evaluated after each epoch; the clock runs over training and evaluations, as mltrain's
    time_to_target_s."""
    x_all, y_all = normalised(np.load(args.images)), torch.from_numpy(np.load(args.labels)).long()
    x_test, y_test = normalised(np.load(args.test_images)), torch.from_numpy(np.load(args.test_labels)).long()
    per_epoch = (len(y_all) + args.batch - 1) // args.batch
    total = args.epochs * per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 * (1 + np.cos(np.pi * min(k, total) / total)))
    hit, accs, t0 = None, [], time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(y_all))
        for s in range(0, len(perm), args.batch):
            idx = perm[s:s + args.batch]
            x, y = x_all.index_select(0, idx), y_all.index_select(0, idx)
            loss = F.cross_entropy(step_model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for s in range(0, len(y_test), 1000):
                correct += (step_model(x_test[s:s + 1000]).argmax(1) == y_test[s:s + 1000]).sum().item()
        accs.append(correct / len(y_test))
        if hit is None and accs[-1] >= args.target:
            hit = time.perf_counter() - t0
            break  # what comes after does not change the time to the target
    print(json.dumps({"mode": args.mode, "model": args.model, "seed": args.seed, "batch": args.batch, "lr": args.lr,
                      "epochs": args.epochs, "time_to_target_s": hit, "accuracy": accs,
                      "train_seconds": time.perf_counter() - t0}))


if args.epochs > 0:
    time_to_accuracy()
    raise SystemExit(0)
model.train()
it = folder_batches() if args.folder else npy_batches()
autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16")
first_step_s = None
t_begin = time.perf_counter()
t0 = t_begin
for step in range(args.steps):
    if step == args.warmup:
        t0 = time.perf_counter()
        warmup_s = t0 - t_begin
    x, y = next(it)
    with autocast:
        loss = F.cross_entropy(step_model(x), y, label_smoothing=smoothing)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if recipe:
        with torch.no_grad():
            if expert:
                torch._foreach_lerp_(ema, [q.detach() for q in model.parameters()], 1 - 0.999)
            else:
                ema_model.update_parameters(model)
    if first_step_s is None:
        first_step_s = seconds_since_exec()
dt = time.perf_counter() - t0
print(json.dumps({"mode": args.mode, "model": args.model, "threads": torch.get_num_threads(),
                  "channels_last": bool(channels_last), "amp": args.amp,
                  "samples_per_s": (args.steps - args.warmup) * args.batch / dt,
                  "first_step_s": first_step_s, "warmup_s": warmup_s,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))
