"""The pruning benchmark on real learning curves (cluster.py's part `real`).

1. Trains a grid of Fashion-MNIST MLPs with `mltrain train` (learning rate x batch size x width x
   dropout, 108 configurations, each 27 evaluations of 40 steps on a 10 % validation split of the
   first 12,000 training images, seed 0) and records each validation-error curve: a table of real
   curves, crossing where they do in real training (a large learning rate leads early and ends
   worse, dropout starts slower).
2. Tunes over that grid with TPE and each pruner, 100 trials a study: mltrain with the curves
   replayed by real trial processes (replay_curve.py, which reports one evaluation at a time),
   Optuna 3.1 with the same curves and its counterpart pruner. A tabular benchmark, as LCBench or
   NAS-Bench-201: the trainings are real, each configuration is trained once, and the studies
   differ only in the tuner. Quality = the best complete trial's final error, cost = total
   evaluations (steps) over the study; median over seeds."""
import json
import math
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


import curves

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
REPORTS, EVERY = curves.STEPS, 40  # the round robin (curves.py) runs STEPS reports
GRID = [
    ("lr", [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2]),
    ("batch", [16, 64, 256]),
    ("width", ["32", "128", "256x128"]),
    ("dropout", [0.0, 0.3]),
]
CHANCE = 0.9  # the error of a guess among 10 classes: a diverged training's value


def configs():
    out = [[]]
    for name, choices in GRID:
        out = [c + [(name, v)] for c in out for v in choices]
    return out


def key(cfg):
    return ",".join(f"{n}={v}" for n, v in cfg)


def eval_accuracies(cmd):
    """Runs an `mltrain train ... --jsonl` command: (exit status, each evaluation's accuracy in
    order, None where it was not finite, the tail of stderr)."""
    out = subprocess.run(cmd, capture_output=True, text=True)
    acc = []
    for line in out.stdout.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and r.get("event") == "eval":
            a = r.get("accuracy")
            acc.append(a if a is not None and math.isfinite(a) else None)
    return out.returncode, acc, out.stderr[-2000:]


def train_one(m, scratch, cfg):
    p = dict(cfg)
    hidden = "[" + p["width"].replace("x", ",") + "]"
    cmd = [m, "train", str(ROOT / "configs/fashion_mnist_mlp.yaml"), "data.limit_train=12000",
           "data.val_fraction=0.1", f"train.duration={REPORTS * EVERY}u", f"train.eval_every={EVERY}u",
           f"checkpoint.every={REPORTS * EVERY}u", "train.target_accuracy=0", f"optim.lr={p['lr']}",
           f"data.batch_size={p['batch']}", f"model.hidden={hidden}", f"model.dropout={p['dropout']}",
           f"run.dir={scratch}/real_runs", f"run.name=r{configs().index(cfg)}", "runtime.threads=1", "--jsonl"]
    rc, acc, err = eval_accuracies(cmd)
    curve = [CHANCE if a is None else 1.0 - a for a in acc]
    if rc != 0 and len(curve) < REPORTS:  # diverged (exit 4) or failed: chance from there
        curve += [CHANCE] * (REPORTS - len(curve))
    if len(curve) != REPORTS:
        sys.exit(f"real_curves: {key(cfg)} gave {len(curve)} evaluations, not {REPORTS}:\n{err}")
    return key(cfg), curve


def make_table(m, scratch, jobs=2):
    with ThreadPoolExecutor(jobs) as pool:
        curves_ = dict(pool.map(lambda c: train_one(m, scratch, c), configs()))
    table = {"grid": GRID, "curves": curves_}
    path = Path(scratch) / "real_curves.json"
    path.write_text(json.dumps(table))
    return table, path


def study_yaml(scratch, table_path, name, seed, trials, concurrent, pruner_overrides):
    space = "\n".join(f"  {n}: {{type: categorical, choices: {json.dumps(c)}}}" for n, c in GRID)
    pruner = {"name": "none"}
    for o in pruner_overrides:
        k, v = o.split("=", 1)
        pruner[k.split(".", 1)[1]] = v
    text = f"""study: {{name: {name}, dir: {scratch}, seed: {seed}, n_trials: {trials}, max_concurrent: {concurrent}}}
sampler: {{name: tpe}}
pruner: {{{", ".join(f"{k}: {v}" for k, v in pruner.items())}}}
objective: {{metric: error, direction: minimize}}
trial:
  command: [{sys.executable}, -S, {HERE / "replay_curve.py"}, {table_path}]
  threads: 1
space:
{space}
"""
    path = Path(scratch) / f"{name}.yaml"
    path.write_text(text)
    return path


def mltrain_study(m, scratch, table_path, pruner, seed, trials, concurrent):
    name = f"real_{pruner}_{concurrent}_{seed}"
    y = study_yaml(scratch, table_path, name, seed, trials, concurrent, curves.PRUNERS[pruner][0])
    out = subprocess.run([m, "tune", str(y), "-q", "--json"], check=True, capture_output=True, text=True).stdout
    s = json.loads(out)
    return s["best"]["value"], curves.reports(Path(scratch) / name / "journal.jsonl")


def optuna_study(table, pruner, seed, trials, concurrent):
    def start(t):
        curve = table["curves"][key([(n, t.suggest_categorical(n, c)) for n, c in GRID])]
        return lambda k: curve[k - 1]

    return curves.optuna_round_robin(pruner, seed, trials, concurrent, start)


def run(m, scratch, seeds, quick, trials=100):
    table, path = make_table(m, scratch)
    cs = list(table["curves"].values())
    finals = sorted(c[-1] for c in cs)
    # how much the curves cross: pairs whose order after 3 evaluations differs from their final order
    pairs = [(x, y) for i, x in enumerate(cs) for y in cs[i + 1:] if x[2] != y[2] and x[-1] != y[-1]]
    crossed = sum((x[2] < y[2]) != (x[-1] < y[-1]) for x, y in pairs) / max(len(pairs), 1)
    print(f"## pruning on real curves: {len(cs)} Fashion-MNIST MLP trainings ({REPORTS} evaluations of {EVERY} steps),"
          f" {trials} TPE trials, median over {seeds} seeds (100..{99 + seeds})")
    print(f"the grid's best final error {finals[0]:.4f}, median {statistics.median(finals):.4f};"
          f" {crossed:.0%} of pairs of curves change order between evaluation 3 and the end")
    print(f"{'running':>7} {'pruner':<10} {'mltrain best':>12} {'optuna best':>12} {'mltrain steps':>13} {'optuna steps':>12}")
    verdicts = []
    for conc in ((1,) if quick else (1, 4)):
        for p in curves.PRUNERS:
            if quick and p in ("percentile", "hyperband"):
                continue
            a = [mltrain_study(m, scratch, path, p, s, trials, conc) for s in range(100, 100 + seeds)]
            b = [optuna_study(table, p, s, trials, conc) for s in range(100, 100 + seeds)]
            ma, mb = statistics.median(x for x, _ in a), statistics.median(x for x, _ in b)
            sa, sb = statistics.median(x for _, x in a), statistics.median(x for _, x in b)
            print(f"{conc:>7} {p:<10} {ma:>12.4f} {mb:>12.4f} {sa:>13.0f} {sb:>12.0f}")
            if p != "none":
                verdicts.append((f"real curves x{conc} {p}", a, b))
    print()
    for label, a, b in verdicts:
        curves.verdict(label, a, b)
    print()
