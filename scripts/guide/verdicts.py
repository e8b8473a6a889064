#!/usr/bin/env python3
"""Measures the field guide's claims on real Fashion-MNIST trainings here (docs/FIELD_GUIDE.md).
    .venv/bin/python scripts/guide/verdicts.py MLTRAIN SCRATCH [--rows init,momentum,smoothing] [--quick]
Each row prints the guide's number, what was measured (mean and standard deviation over seeds) and
the command behind it. --quick (CI): one seed, tiny runs; checks that each option runs and changes
what it should, and exits 1 when one does not.
Rows:
  init       initial loss (the first batch's loss before any update, batch 1024) of the MLP and the
             CNN under PyTorch's default init and the guide's two (model.init)
  momentum   SGD (lr 0.05, momentum 0.9) at global batch 256, 1024 and 4096 for the same epochs,
             with and without optim.momentum_reference_batch=256
  smoothing  label smoothing 0.1 fixed and decayed to 0 by a cosine schedule (the guide's dynamic
             label smoothing), against none
  augment    fixed augmentation against the gap rule, the guide's rule and the three-phase
             curriculum: eval accuracy after each of 3 epochs (CNN)
  sampler    the weighted sampler oversampling one class 3x, against uniform (a check that it
             changes training)
  oversample the guide's negative oversampling 3x on an imbalanced binary task from Fashion-MNIST
             (make_imbalanced.py): test ROC AUC, uniform against oversampled
  fuse       conv-BN fusion's inference speed: runs scripts/bench/fuse_speed.sh (not in --quick:
             ctest test_cli_fuse checks the fold)
  onebit     1-bit Adam's bytes per step on 2 ranks: runs section 3 of scripts/bench/ddp.sh (not in
             --quick: ctest test_dist checks its arithmetic)
  share      SmartShare (model.share: gated, a learned scalar gate, and gated_input, the guide's
             gate from the input) on the char-GPT (configs/text_char_gpt.yaml, fortunes text):
             parameters and test loss against the unshared model, and against an unshared model
             with as many parameters (1 block)
  schedules  warm-up, cosine and plateau alone and combined (schedule.plateau: true on a cosine;
             MLP, Adam lr 0.003, 5 epochs)
  adam_wd    Adam's L2 weight decay: none, the guide's 1e-5, SGD's 1e-4 and 1e-3 (MLP)
  crop_flip  crop aspect 0.8-1.2 against 3/4-4/3; flip throughout against the last 10 % only (CNN)
  embed_noise  model.embedding_noise 0.1 against none on the char-GPT
  sensitivity  a random-sampler tune study over lr, hidden width and batch (>= 256): importance and
             Spearman (mltrain tune's importance.json)
  islands    fp32 islands' step-time cost under bf16 autocast (char-GPT; interleaved rounds)
  ckpt_batch activation checkpointing's batch gain: the micro-batch data.batch_size auto fits in a
             fixed runtime.memory_budget with and without memory.checkpoint=blocks
  memmap     memory-mapped and pre-chunked reads against random preads on a cold page cache
  workers    the loader-worker rule against mltrain profile --sweep data.workers
  onebit_time  1-bit Adam's time against Adam on 2 ranks: loopback, and 1 Gbit/s and 100 Mbit/s
             links simulated with tc's token-bucket filter in a private network namespace (root)
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MLP = str(ROOT / "configs/fashion_mnist_mlp.yaml")
CNN = str(ROOT / "configs/fashion_mnist_cnn.yaml")


def train(m, scratch, name, config, *overrides):
    """Runs mltrain train; returns (summary record, metrics records, stderr)."""
    run = Path(scratch) / name
    cmd = [m, "train", config, f"run.dir={scratch}", f"run.name={name}", "train.target_accuracy=0",
           "train.tensorboard=false", *overrides, "--jsonl"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"verdicts: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    summary = [json.loads(line) for line in out.stdout.splitlines() if '"summary"' in line][-1]
    metrics = [json.loads(line) for line in open(run / "v0" / "metrics.jsonl")]
    return summary, metrics, out.stderr


def band(xs):
    return f"{statistics.mean(xs):.4f} +- {statistics.stdev(xs) if len(xs) > 1 else 0:.4f}"


def row_init(m, scratch, seeds, quick):
    print("## initialisation: loss of the initial weights on the first batch of 1024 (the guide: 30-50 % lower)")
    print(f"{'model':<5} {'init':<24} {'initial loss':>18}  vs default")
    ok = True
    for label, config in (("mlp", MLP), ("cnn", CNN)):
        base = None
        for init in ("default", "layer_adaptive_uniform", "lecun_normal"):
            losses = []
            for s in seeds:
                _, metrics, _ = train(m, scratch, f"init_{label}_{init}_{s}", config, f"model.init={init}",
                                      f"run.seed={s}", "data.batch_size=1024", "train.duration=1u",
                                      "train.log_every=1u", "train.eval_every=never", "data.limit_train=4096")
                losses.append(next(r["loss"] for r in metrics if r.get("step") == 1 and "loss" in r))
            mean = statistics.mean(losses)
            base = base or mean
            print(f"{label:<5} {init:<24} {band(losses):>18}  {mean / base - 1:+.1%}")
            if init != "default":
                ok &= mean != base  # the option must change the initial weights
    print()
    return ok


def row_momentum(m, scratch, seeds, quick):
    epochs = "1ep" if quick else "5ep"
    print(f"## momentum compensation: SGD lr 0.05 momentum 0.9, MLP, {epochs} at each batch"
          " (the guide: m x sqrt(B/256) keeps large batches stable; it exceeds 1 above B = 256/m^2)")
    print(f"{'batch':>5} {'momentum':>9} {'test accuracy':>18} {'compensated':>9} {'test accuracy':>18}")
    ok = True
    batches = (1024,) if quick else (256, 1024, 4096)
    for b in batches:
        plain, comp, used = [], [], None
        for s in seeds:
            common = [f"run.seed={s}", "optim.name=sgd", "optim.lr=0.05", "optim.momentum=0.9",
                      f"data.batch_size={b}", f"train.duration={epochs}", f"train.eval_every={epochs}"]
            if quick:
                common.append("data.limit_train=8192")
            sp, _, _ = train(m, scratch, f"mom_{b}_plain_{s}", MLP, *common)
            sc, _, err = train(m, scratch, f"mom_{b}_comp_{s}", MLP, *common, "optim.momentum_reference_batch=256")
            plain.append(sp["test_accuracy"])
            comp.append(sc["test_accuracy"])
            line = [x for x in err.splitlines() if "[optim] momentum" in x]
            used = line[0].split("->")[1].split()[0] if line else None
        print(f"{b:>5} {0.9:>9} {band(plain):>18} {used or '?':>9} {band(comp):>18}")
        ok &= used is not None and (b <= 256 or float(used) > 0.9)  # above the reference: raised
    print()
    return ok


def compare(m, scratch, seeds, tag, variants, common, metric, header, model=MLP):
    """Trains `model` (the MLP) once per (variant, seed) with `common` overrides plus the variant's; prints
    each variant's summary `metric` (mean +- sd) and its difference from the first variant in points.
    Returns the means, in variant order."""
    print(f"{header:<28} {metric.replace('_', ' '):>18}  vs {variants[0][0]}")
    means = []
    for label, ov in variants:
        vals = [train(m, scratch, f"{tag}_{len(means)}_{s}", model, f"run.seed={s}", *common, *ov)[0][metric]
                for s in seeds]
        means.append(statistics.mean(vals))
        print(f"{label:<28} {band(vals):>18}  {100 * (means[-1] - means[0]):+.2f} points")
    print()
    return means


def row_smoothing(m, scratch, seeds, quick):
    epochs = "1ep" if quick else "5ep"
    print(f"## dynamic label smoothing: MLP, {epochs} (the guide: +0.5-1.2 %)")
    extra = ["data.limit_train=8192"] if quick else []
    means = compare(m, scratch, seeds, "ls",
                    (("none", []), ("0.1 fixed", ["label_smoothing.value=0.1"]),
                     ("0.1 -> 0 cosine", ["label_smoothing.value=0.1", "label_smoothing.schedule.name=cosine"])),
                    [f"train.duration={epochs}", f"train.eval_every={epochs}", *extra], "test_accuracy", "smoothing")
    return all(not math.isclose(x, means[0]) for x in means[1:])


OVERSAMPLE = ("oversample [0, 3]", ["data.sampler.name=weighted", "data.sampler.oversample=[0,3]"])


def row_sampler(m, scratch, seeds, quick):
    epochs = "1ep" if quick else "3ep"
    print(f"## weighted sampler: MLP, {epochs}, class 0 (T-shirt) drawn 3x as often (data.sampler.oversample: [0, 3])")
    extra = ["data.limit_train=8192"] if quick else []
    means = compare(m, scratch, seeds, "sampler", (("uniform", []), OVERSAMPLE),
                    [f"train.duration={epochs}", f"train.eval_every={epochs}", *extra], "test_accuracy", "sampler")
    return means[0] != means[1]


def row_augment(m, scratch, seeds, quick):
    model, epochs = (MLP, 2) if quick else (CNN, 3)  # adaptation acts from the second epoch
    ops = ["data.augment.crop.p=0.5", "data.augment.flip.p=0.5", "data.augment.color.p=0.5",
           "data.augment.mixup.p=0.3"]
    print(f"## adaptive augmentation and the curriculum: {Path(model).stem}, {epochs} epochs, crop/flip/colour"
          " 0.5, mixup 0.3 (the guide: faster convergence); eval accuracy after each epoch")
    print(f"{'augmentation':<24} " + " ".join(f"{'epoch ' + str(e + 1):>18}" for e in range(epochs)))
    curves = {}
    for label, ov in (("fixed", []), ("adaptive, gap rule", ["data.augment.adaptive=true"]),
                      ("adaptive, guide rule", ["data.augment.adaptive=true", "data.augment.adaptive_rule=guide"]),
                      ("adaptive, guide (accuracy)", ["data.augment.adaptive=true",
                                                      "data.augment.adaptive_rule=guide_accuracy"]),
                      ("three-phase curriculum", ["data.augment.curriculum=three_phase"])):
        per_epoch = [[] for _ in range(epochs)]
        for s in seeds:
            extra = ["data.limit_train=4096"] if quick else []
            _, metrics, _ = train(m, scratch, f"aug_{len(curves)}_{s}", model, f"run.seed={s}",
                                  f"train.duration={epochs}ep", "train.eval_every=1ep", *ops, *ov, *extra)
            evals = [r["accuracy"] for r in metrics if r.get("event") == "eval"]
            for e in range(epochs):
                per_epoch[e].append(evals[e])
        curves[label] = [statistics.mean(x) for x in per_epoch]
        print(f"{label:<24} " + " ".join(f"{band(x):>18}" for x in per_epoch))
    print()
    return len({tuple(c) for c in curves.values()}) == len(curves)  # every variant trains differently


OVERSAMPLE_EPOCHS = "5ep"


def row_oversample(m, scratch, seeds, quick):
    data = Path(scratch) / "imbalanced"
    subprocess.run([sys.executable, str(ROOT / "scripts/guide/make_imbalanced.py"), str(data)], check=True,
                   capture_output=True)
    files = ["data.dataset=files", "data.num_classes=2"] + [
        f"data.{split}_{kind}={data}/{split}_{kind}.npy" for split in ("train", "test") for kind in ("images", "labels")]
    epochs = "1ep" if quick else OVERSAMPLE_EPOCHS
    print(f"## negative oversampling 3x: T-shirt (6000) vs shirt (600, the negatives), MLP, {epochs};"
          " test ROC AUC on 1000 + 1000 (the guide: +0.8 % AUC)")
    means = compare(m, scratch, seeds, "imb", (("uniform", []), OVERSAMPLE),
                    [*files, f"train.duration={epochs}", f"train.eval_every={epochs}"], "test_roc_auc", "sampler")
    return means[0] != means[1]


GPT = str(ROOT / "configs/text_char_gpt.yaml")


def fortunes(m, scratch):
    """The fortunes text, tokenized once into the scratch folder."""
    data = Path(scratch) / "fortunes"
    if not (data / "train.bin").exists():
        subprocess.run(["bash", str(ROOT / "scripts/data/fortunes.sh"), m, str(data)], check=True,
                       capture_output=True)
    return data


def train_gpt(m, scratch, name, data, steps, seed, *overrides):
    """The char-GPT for `steps` on the fortunes text, evaluated once at the end: (summary, stderr)."""
    summary, _, err = train(m, scratch, name, GPT, f"run.seed={seed}", f"data.root={data}",
                            f"train.duration={steps}", f"train.eval_every={steps}", f"checkpoint.every={steps}",
                            *overrides)
    return summary, err


def row_share(m, scratch, seeds, quick):
    data = fortunes(m, scratch)
    steps = "20u" if quick else "1200u"
    print(f"## SmartShare (model.share: gated, gated_input): char-GPT (4 blocks, width 128) on fortunes text, {steps} steps;"
          " test loss in nats per character (the guide: 70 % fewer parameters, at most 2 % more loss)")
    print(f"{'model':<34} {'parameters':>10} {'test loss':>18}  vs unshared")
    means, params = [], []
    for label, ov in (("unshared, 4 blocks", []), ("share gated, 4 blocks", ["model.share=gated"]),
                      ("unshared, 1 block (as many params)", ["model.n_layer=1"]),
                      ("share gated_input, 4 blocks", ["model.share=gated_input"])):
        losses = []
        for s in seeds:
            summary, err = train_gpt(m, scratch, f"share_{len(means)}_{s}", data, steps, s, *ov)
            losses.append(summary["test_loss"])
        line = next(x for x in err.splitlines() if "[model]" in x)
        params.append(int(line.split(" parameters on ")[0].rsplit(" ", 1)[1]))
        means.append(statistics.mean(losses))
        print(f"{label:<34} {params[-1]:>10} {band(losses):>18}  {means[-1] / means[0] - 1:+.1%}")
    print(f"share gated: {1 - params[1] / params[0]:.1%} fewer parameters than unshared;"
          f" gated_input: {1 - params[3] / params[0]:.1%}")
    print()
    # both options share (under half the parameters) and change training, and differ from each other
    return max(params[1], params[3]) < 0.5 * params[0] and len({means[0], means[1], means[3]}) == 3


def row_schedules(m, scratch, seeds, quick):
    epochs = 1 if quick else 5
    print(f"## LR strategies combined: MLP, Adam lr 0.003, {epochs} epochs, validation (10 % held out) every epoch"
          " (the guide: warm-up + cosine + plateau beats each alone)")
    extra = ["data.limit_train=8192"] if quick else []
    warm = ["schedule.warmup=1ep", "schedule.warmup_start=0.1"]
    plateau = ["schedule.name=plateau", "schedule.patience=0", "schedule.gamma=0.5"]
    means = compare(m, scratch, seeds, "sched",
                    (("constant", []), ("warm-up 1 epoch", warm), ("cosine", ["schedule.name=cosine"]),
                     ("plateau (x0.5, patience 0)", plateau), ("warm-up + cosine", [*warm, "schedule.name=cosine"]),
                     ("warm-up + plateau", [*warm, *plateau]),
                     ("warm-up + cosine + plateau", [*warm, "schedule.name=cosine", "schedule.plateau=true",
                                                     *plateau[1:]])),
                    ["optim.lr=0.003", f"train.duration={epochs}ep", "train.eval_every=1ep", "data.val_fraction=0.1",
                     *extra],
                    "test_accuracy", "schedule")
    # each strategy alone changes training (the combinations may coincide: a plateau rule that never
    # fires under cosine leaves warm-up + cosine as it was)
    return all(x != means[0] for x in means[1:4])


def row_adam_wd(m, scratch, seeds, quick):
    epochs = "1ep" if quick else "5ep"
    print(f"## Adam weight decay: MLP, Adam (L2 decay) lr 0.001, {epochs} (the guide: about 10x smaller than SGD's"
          " 1e-4 to 1e-3, i.e. 1e-5)")
    extra = ["data.limit_train=8192"] if quick else []
    means = compare(m, scratch, seeds, "wd",
                    (("none", []), ("1e-5 (the guide's)", ["optim.weight_decay=1e-5"]),
                     ("1e-4 (SGD's)", ["optim.weight_decay=1e-4"]), ("1e-3 (SGD's)", ["optim.weight_decay=1e-3"])),
                    [f"train.duration={epochs}", f"train.eval_every={epochs}", *extra], "test_accuracy", "weight decay")
    return len(set(means)) == len(means)


def row_crop_flip(m, scratch, seeds, quick):
    model, epochs = (MLP, 1) if quick else (CNN, 2)
    print(f"## crop aspect 0.8-1.2 and flip in the last 10 % only: {Path(model).stem}, {epochs} epochs"
          " (the guide: crop aspect ratio 0.8-1.2 rather than 3/4-4/3; horizontal flip only in the last 10 %"
          " of epochs)")
    extra = ["data.limit_train=4096"] if quick else []
    crop = ["data.augment.crop.p=0.5"]
    means = compare(m, scratch, seeds, "cropflip",
                    (("crop, aspect 3/4-4/3", crop), ("crop, aspect 0.8-1.2", [*crop, "data.augment.crop_ratio=[0.8,1.2]"]),
                     ("no flip", []), ("flip p 0.5 throughout", ["data.augment.flip.p=0.5"]),
                     ("flip p 0.5, last 10 %", ["data.augment.flip.p=0.5", "data.augment.flip.window=[0.9,1.0]"])),
                    [f"train.duration={epochs}ep", f"train.eval_every={epochs}ep", *extra], "test_accuracy",
                    "augmentation", model=model)
    return len(set(means)) == len(means)


def row_embed_noise(m, scratch, seeds, quick):
    data = fortunes(m, scratch)
    steps = "20u" if quick else "1200u"
    print(f"## embedding noise: char-GPT (4 blocks, width 128) on fortunes text, {steps} steps; test loss in nats"
          " per character (the guide: Gaussian noise on the embeddings in training regularises)")
    print(f"{'model.embedding_noise':<28} {'test loss':>18}  vs none")
    means = []
    for sigma in (0, 0.1):
        losses = [train_gpt(m, scratch, f"noise_{sigma}_{s}", data, steps, s,
                            f"model.embedding_noise={sigma}")[0]["test_loss"] for s in seeds]
        means.append(statistics.mean(losses))
        print(f"{sigma:<28} {band(losses):>18}  {means[-1] / means[0] - 1:+.2%}")
    print()
    return len(set(means)) == len(means)


def row_sensitivity(m, scratch, seeds, quick):
    trials, epochs = (6, "1ep") if quick else (40, "2ep")
    study = Path(scratch) / "sensitivity.yaml"
    study.write_text(f"""study: {{name: sensitivity, dir: {scratch}/tune, seed: 0, n_trials: {trials}}}
sampler: {{name: random}}
objective: {{metric: accuracy, direction: maximize}}
trial:
  train: {MLP}
  overrides: [train.duration={epochs}, train.eval_every={epochs}, data.val_fraction=0.1, train.tensorboard=false,
              checkpoint.every={epochs}{', data.limit_train=4096' if quick else ''}]
space:
  optim.lr: {{type: float, low: 1.0e-4, high: 3.0e-2, log: true}}
  model.hidden: {{type: categorical, choices: ["[32]", "[64]", "[128]", "[256]", "[512]", "[1024]"]}}
  data.batch_size: {{type: int, low: 256, high: 2048, log: true}}
""")
    out = subprocess.run([m, "tune", str(study), "--json", "-q"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"verdicts: mltrain tune {study} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    imp = json.load(open(Path(scratch) / "tune" / "sensitivity" / "importance.json"))
    print(f"## sensitivity: a random-sampler study of {trials} MLP trainings ({epochs} each, validation accuracy):"
          " lr 1e-4-3e-2 (log), hidden width 32-1024, batch 256-2048 (log) (the guide: learning rate and"
          " embedding width most sensitive, batch size minor above 256)")
    print(f"{'parameter':<18} {'importance (PED-ANOVA)':>24} {'Spearman':>10}")
    for r in imp:
        rho = "-" if r["spearman"] is None else f"{r['spearman']:+.2f}"
        print(f"{r['param']:<18} {r['importance']:>24.3f} {rho:>10}")
    print()
    return len(imp) == 3


def row_islands(m, scratch, seeds, quick):
    data = fortunes(m, scratch)
    steps = 10 if quick else 60
    rounds = 1 if quick else 2
    print(f"## fp32 islands' cost: char-GPT under bf16 autocast, {steps} steps per run, {rounds} interleaved rounds;"
          " ms per step after the first 20 % (the guide: LayerNorm and the output layer in fp32 cost little)")
    variants = (("fp32 (no autocast)", []), ("bf16", ["amp.enabled=true"]),
                ("bf16, norms + head fp32", ["amp.enabled=true", "amp.fp32_modules=[h.*.ln_*,ln_f,lm_head]"]))
    times = {v[0]: [] for v in variants}
    for r in range(rounds):
        for k, (label, ov) in enumerate(variants):
            _, metrics, _ = train(m, scratch, f"isl_{k}_{r}", GPT, f"data.root={data}",
                                  f"train.duration={steps}u", "train.eval_every=never", f"checkpoint.every={steps}u",
                                  "train.log_every=1u", "train.final_eval=none", *ov)
            stamps = [x["time_s"] for x in metrics if x.get("event") == "train"]
            skip = len(stamps) // 5
            times[label].append(1000 * (stamps[-1] - stamps[skip]) / (len(stamps) - 1 - skip))
    base = statistics.median(times[variants[1][0]])
    print(f"{'precision':<26} {'ms per step':>12}  vs bf16")
    for label, _ in variants:
        t = statistics.median(times[label])
        print(f"{label:<26} {t:>12.1f}  {t / base:.2f}x")
    print()
    return True


def row_ckpt_batch(m, scratch, seeds, quick):
    data = fortunes(m, scratch)
    budget, batch = ("96MiB", 64) if quick else ("160MiB", 256)
    print(f"## activation checkpointing's batch gain: char-GPT, data.batch_size auto for a global batch of {batch} under"
          f" runtime.memory_budget {budget}: the micro-batch the probe fits (the guide: checkpointing buys a larger"
          " batch in the same memory)")
    print(f"{'memory.checkpoint':<20} {'micro-batch':>12}")
    fits, peaks = [], []
    os.environ["XDG_CACHE_HOME"] = str(Path(scratch) / "cache")  # probe afresh, not from an earlier run
    for ck in ("none", "blocks"):
        _, _, err = train(m, scratch, f"ckb_{ck}", GPT, f"data.root={data}", "data.batch_size=auto",
                          f"train.global_batch={batch}", f"runtime.memory_budget={budget}", f"memory.checkpoint={ck}",
                          "train.duration=1u", "train.eval_every=never", "train.final_eval=none", "checkpoint.every=1u")
        line = next(x for x in err.splitlines() if "[memory] micro-batch" in x)
        fits.append(int(line.split("micro-batch ")[1].split()[0]))
        peaks.append({int(k): float(v.split()[0]) for k, v in
                      (x.split(": ") for x in line.split("probed ")[1].rstrip(")").split(", "))})
        print(f"{ck:<20} {fits[-1]:>12}   {line.split('(', 1)[1].rstrip(')')}")
    same = max(b for b in peaks[0] if b in peaks[1])
    print(f"gain: {fits[1] / fits[0]:.1f}x the micro-batch (the probe halves, so the fit moves in powers of two);"
          f" at micro-batch {same} the step peak is {peaks[0][same]:.1f} against {peaks[1][same]:.1f} MiB,"
          f" {peaks[0][same] / peaks[1][same]:.2f}x as many samples per MiB")
    print()
    return fits[1] > fits[0]


def row_memmap(m, scratch, seeds, quick):
    """Reads records from a file on disk, page cache dropped before each pass: one pread per record
    in random order (a per-sample Dataset over a file), numpy's memmap indexed in random order, and
    pre-chunked reads (whole 4 MiB chunks in random chunk order, shuffled within the chunk, as
    mltrain's chunk sets read)."""
    import numpy as np
    rec, size = 3072, (16 << 20) if quick else (1 << 30)  # 32 x 32 x 3 bytes per record
    n, reads = size // rec, 2000 if quick else 20000
    path = Path(scratch) / "records.bin"
    per_block = (64 << 20) // rec
    block = np.random.default_rng(0).integers(0, 255, size=per_block * rec, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        for k in range(0, n, per_block):
            f.write(block[:min(per_block, n - k) * rec])

    def cold():
        os.sync()
        try:
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
        except OSError:
            pass  # not root: the fadvise below still evicts this file's pages
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

    def pread_random(order):
        fd = os.open(path, os.O_RDONLY)
        total = sum(len(os.pread(fd, rec, int(i) * rec)) for i in order)
        os.close(fd)
        return total

    def memmap_random(order):
        a = np.memmap(path, dtype=np.uint8, mode="r").reshape(n, rec)
        return sum(int(a[int(i)].sum() >= 0) * rec for i in order)

    def chunked(order):
        per = (4 << 20) // rec
        a = np.memmap(path, dtype=np.uint8, mode="r").reshape(n, rec)
        rng = np.random.default_rng(1)
        total = 0
        for c in rng.permutation(n // per):
            chunk = np.array(a[c * per:(c + 1) * per])  # one sequential read
            for i in rng.permutation(per):
                total += int(chunk[i].sum() >= 0) * rec
                if total >= reads * rec:
                    return total
        return total

    print(f"## memory-mapped, pre-chunked reads against random reads: {size >> 20} MiB file of {rec}-byte records on"
          f" this VM's disk (/dev/vda), page cache dropped before each pass, {reads} records per pass,"
          f" {len(seeds)} passes (the guide: memory-mapped, pre-chunked data keeps the loader fed)")
    print(f"{'access':<34} {'records/s':>18}  vs pread")
    rates = {}
    order = np.random.default_rng(2).permutation(n)[:reads]
    for _ in seeds:
        for label, f in (("pread, random order", pread_random), ("memmap, random order", memmap_random),
                         ("memmap, 4 MiB chunks shuffled", chunked)):
            cold()
            t = time.perf_counter()
            f(order)
            rates.setdefault(label, []).append(reads / (time.perf_counter() - t))
    base = statistics.mean(rates["pread, random order"])
    for label, r in rates.items():
        print(f"{label:<34} {statistics.mean(r):>10.0f} +- {statistics.stdev(r) if len(r) > 1 else 0:<6.0f}"
              f"  {statistics.mean(r) / base:.2f}x")
    path.unlink()
    print()
    return True


def row_workers(m, scratch, seeds, quick):
    steps = "10u" if quick else "150u"
    aug = ["data.augment.crop.p=1", "data.augment.flip.p=0.5", "data.augment.color.p=1", "data.augment.erase.p=0.5"]
    _, _, err = train(m, scratch, "workers_rule", MLP, "train.duration=1u", "train.eval_every=never",
                      "train.final_eval=none", "checkpoint.every=1u", *aug)
    rule = next(x for x in err.splitlines() if "[model]" in x).rsplit(";", 1)[1].split()[0]
    values = "0,1,2" if quick else "0,1,2,3,4"
    out = Path(scratch) / "workers_sweep"
    cmd = [m, "profile", MLP, "--no-ops", "--sweep", f"data.workers={values}", "--out", str(out),
           f"train.duration={steps}", *aug]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"verdicts: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    sweep = json.load(open(out / "profile.json"))["sweep"]
    print(f"## loader workers: the guide's rule min(cores, 4 x GPUs, chunks) against a measured sweep"
          f" (mltrain profile --sweep data.workers={values}): MLP with crop, flip, colour and erasing in the"
          " loader (loader-heavy), this 2-core VM, no GPU")
    print(f"{'data.workers':<14} {'samples/s':>10} {'data wait':>10}")
    for row in sweep["rows"]:
        mm = row["measure"]
        print(f"{row['value']:<14} {mm['samples_per_s']:>10.0f} {100 * mm['phase_share']['data']:>9.1f}%")
    print(f"the rule picks {rule}; the sweep's best is {sweep['best']}")
    print()
    return True


def row_onebit_time(m, scratch, seeds, quick):
    steps, freeze = (40, 10) if quick else (600, 100)
    links = (("loopback", None),) if quick else (("loopback", None), ("1 Gbit/s (tc tbf)", "1gbit"),
                                                  ("100 Mbit/s (tc tbf)", "100mbit"))
    print(f"## 1-bit Adam's time: MLP on 2 Gloo ranks (batch 64 each), {steps} steps, freeze after {freeze};"
          " the link simulated with a token-bucket filter on the loopback of a private network namespace"
          " (the guide: 94 % less communication, so faster on a slow link)")
    print(f"{'link':<22} {'Adam s':>8} {'1-bit Adam s':>13}  ratio")
    for label, rate in links:
        secs = {}
        for o in ("adam", "onebit_adam"):
            name = f"ob_{o}_{rate or 'lo'}"
            cmd = [m, "launch", "--nproc-per-node", "2", "--", "mltrain", "train", MLP, "data.batch_size=64",
                   f"run.dir={scratch}", f"run.name={name}", f"optim.name={o}", f"optim.freeze_step={freeze}",
                   f"train.duration={steps}u", "train.eval_every=never", "train.final_eval=none",
                   f"checkpoint.every={steps}u", "train.tensorboard=false", "--jsonl"]
            if rate:
                cmd = ["unshare", "-n", "sh", "-c", "ip link set lo up && tc qdisc add dev lo root tbf rate "
                       f"{rate} burst 256kb latency 100ms && exec \"$@\"", "sh", *cmd]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"verdicts: {' '.join(cmd)} failed ({out.returncode}):\n{(out.stdout + out.stderr)[-3000:]}")
            summary = [json.loads(x.split("] ", 1)[1]) for x in (out.stdout + out.stderr).splitlines()
                       if '"event":"summary"' in x][-1]
            secs[o] = summary["train_seconds"]
        print(f"{label:<22} {secs['adam']:>8.1f} {secs['onebit_adam']:>13.1f}  {secs['onebit_adam'] / secs['adam']:.2f}x")
    print()
    return True  # a failed launch has already exited


def bench_row(title, *script):
    """A row measured by one of the project's benchmarks: runs it and prints its output."""
    def row(m, scratch, seeds, quick):
        print(f"## {title}: bash {' '.join(script)}")
        out = subprocess.run(["bash", *script], cwd=ROOT, capture_output=True, text=True)
        print(out.stdout.rstrip() + "\n")
        if out.returncode != 0:
            sys.exit(f"verdicts: bash {' '.join(script)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
        return True
    return row


ROWS = {"init": row_init, "momentum": row_momentum, "smoothing": row_smoothing, "sampler": row_sampler,
        "augment": row_augment, "oversample": row_oversample, "share": row_share,
        "fuse": bench_row("conv-BN fusion (the guide: 15-20 % faster inference)", "scripts/bench/fuse_speed.sh"),
        "onebit": bench_row("1-bit Adam (the guide: 94 % less communication)", "scripts/bench/ddp.sh", "3"),
        "schedules": row_schedules, "adam_wd": row_adam_wd, "crop_flip": row_crop_flip,
        "embed_noise": row_embed_noise, "sensitivity": row_sensitivity, "islands": row_islands,
        "ckpt_batch": row_ckpt_batch, "memmap": row_memmap, "workers": row_workers,
        "onebit_time": row_onebit_time}
# minutes each, or options that have their own ctest tests (test_cli_fuse, test_dist, test_engine's
# [schedule] [amp] [augment], test_tune's importance, test_cli_profile's sweep): --quick stays under a minute
QUICK_SKIP = ("fuse", "onebit", "schedules", "adam_wd", "crop_flip", "embed_noise", "sensitivity", "islands",
              "workers", "onebit_time")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mltrain")
    ap.add_argument("scratch")
    ap.add_argument("--rows", default=None, help="comma-separated (default: all; --quick: all but "
                    + ", ".join(QUICK_SKIP) + ")")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--oversample-epochs", default=OVERSAMPLE_EPOCHS, help="oversample row: training length")
    a = ap.parse_args()
    globals()["OVERSAMPLE_EPOCHS"] = a.oversample_epochs
    seeds = [0] if a.quick else list(range(a.seeds))
    rows = a.rows.split(",") if a.rows else [r for r in ROWS if not (a.quick and r in QUICK_SKIP)]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        sys.exit(f"verdicts: unknown row(s) {', '.join(unknown)}; the rows are {', '.join(ROWS)}")
    failed = [r for r in rows if not ROWS[r](a.mltrain, a.scratch, seeds, a.quick)]
    if failed:
        sys.exit(f"verdicts: option(s) changed nothing: {', '.join(failed)}")


if __name__ == "__main__":
    main()
