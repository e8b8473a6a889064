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
"""
import argparse
import json
import math
import statistics
import subprocess
import sys
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


def compare(m, scratch, seeds, tag, variants, common, metric, header):
    """Trains the MLP once per (variant, seed) with `common` overrides plus the variant's; prints
    each variant's summary `metric` (mean +- sd) and its difference from the first variant in points.
    Returns the means, in variant order."""
    print(f"{header:<28} {metric.replace('_', ' '):>18}  vs {variants[0][0]}")
    means = []
    for label, ov in variants:
        vals = [train(m, scratch, f"{tag}_{len(means)}_{s}", MLP, f"run.seed={s}", *common, *ov)[0][metric]
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


def row_share(m, scratch, seeds, quick):
    data = Path(scratch) / "fortunes"
    if not (data / "train.bin").exists():
        subprocess.run(["bash", str(ROOT / "scripts/data/fortunes.sh"), m, str(data)], check=True,
                       capture_output=True)
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
            summary, _, err = train(m, scratch, f"share_{len(means)}_{s}", GPT, f"run.seed={s}",
                                    f"data.root={data}", f"train.duration={steps}", f"train.eval_every={steps}",
                                    f"checkpoint.every={steps}", *ov)
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
        "onebit": bench_row("1-bit Adam (the guide: 94 % less communication)", "scripts/bench/ddp.sh", "3")}
QUICK_SKIP = ("fuse", "onebit")  # minutes each; their options have their own ctest tests


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
