"""The Fashion-MNIST MLP cell of vs_optuna.py (issue #46): a tabular benchmark over the space of
configs/tune/fashion_mnist_mlp.yaml, trained for real once per grid point.

    python3 fmnist_surface.py build MLTRAIN SCRATCH [--jobs 2]    # trains the grid, writes the table
    python3 -S fmnist_surface.py trial TABLE.json --lr=.. --weight_decay=.. --batch=.. --smoothing=..

The study tunes the learning rate (log, 1e-4..1e-2), weight decay (log, 1e-7..1e-3), batch size
(64, 128, 256, 512) and label smoothing (0..0.2) of the 784-512-256-10 MLP. Tuning it 40-100 times
per cell with real trainings is days of CPU here, so the trainings are done once, on a grid
(7 learning rates a third of a decade apart x 5 weight decays a decade apart x 4 batches x 3
smoothings = 420 `mltrain train` runs: 3 epochs on the first 20,000 training images, validation
error on the 10 % held out, seed 0), and a suggestion's value is the grid's multilinear
interpolation in (log lr, log weight decay, smoothing) within its batch size: the surrogate of
tabular benchmarks such as HPOBench, continuous so that GP and TPE see a function of every
parameter, with its minimum at a trained grid point (so regret = value - the grid's best error).
Both tuners get the same function; only the tuner differs. The `trial` mode is what
`mltrain tune`'s trial.command runs; pure Python, so it starts in milliseconds under `-S`."""
import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LR = [10 ** (-4 + i / 3) for i in range(7)]
WD = [10.0 ** e for e in range(-7, -2)]
BATCH = [64, 128, 256, 512]
SMOOTHING = [0.0, 0.1, 0.2]
EPOCHS, LIMIT = 3, 20000


def grid():
    return [(lr, wd, b, s) for b in BATCH for lr in LR for wd in WD for s in SMOOTHING]


def key(lr_i, wd_i, b, s_i):
    return f"{lr_i},{wd_i},{b},{s_i}"


def train_one(m, scratch, point):
    lr, wd, b, s = point
    name = "fm_" + key(LR.index(lr), WD.index(wd), b, SMOOTHING.index(s)).replace(",", "_")
    cmd = [m, "train", str(ROOT / "configs/fashion_mnist_mlp.yaml"), f"data.limit_train={LIMIT}",
           "data.val_fraction=0.1", f"train.duration={EPOCHS}ep", f"train.eval_every={EPOCHS}ep",
           f"checkpoint.every={EPOCHS}ep", "train.target_accuracy=0", f"optim.lr={lr!r}",
           f"optim.weight_decay={wd!r}", f"data.batch_size={b}", f"label_smoothing.value={s}",
           f"run.dir={scratch}/fmnist_runs", f"run.name={name}", "runtime.threads=1", "--jsonl"]
    from real_curves import eval_accuracies  # not at the top: the trial mode runs under -S
    rc, evals, err = eval_accuracies(cmd)
    if rc not in (0, 4) or not evals:  # 4: diverged, the error of a guess
        sys.exit(f"fmnist_surface: {' '.join(cmd)} exited {rc}:\n{err}")
    a = evals[-1]
    return key(LR.index(lr), WD.index(wd), b, SMOOTHING.index(s)), 0.9 if a is None else 1 - a


def build(m, scratch, jobs=2):
    """Trains the grid (or reuses SCRATCH/fmnist_surface.json) and returns (table, path)."""
    path = Path(scratch) / "fmnist_surface.json"
    if path.exists():
        return json.loads(path.read_text()), path
    with ThreadPoolExecutor(jobs) as pool:
        errors = dict(pool.map(lambda p: train_one(m, scratch, p), grid()))
    table = {"lr": LR, "weight_decay": WD, "batch": BATCH, "smoothing": SMOOTHING, "epochs": EPOCHS,
             "limit_train": LIMIT, "error": errors}
    path.write_text(json.dumps(table, indent=0))
    return table, path


def _bracket(axis, x):
    """(i, t): x lies between axis[i] and axis[i + 1] at fraction t (clamped to the axis)."""
    if x <= axis[0]:
        return 0, 0.0
    if x >= axis[-1]:
        return len(axis) - 2, 1.0
    i = max(j for j in range(len(axis) - 1) if axis[j] <= x)
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


def value(table, lr, weight_decay, batch, smoothing):
    """The multilinear interpolation of the table's validation error at one suggestion."""
    axes = ([math.log10(v) for v in table["lr"]], [math.log10(v) for v in table["weight_decay"]],
            table["smoothing"])
    xs = (math.log10(lr), math.log10(weight_decay), smoothing)
    (i, ti), (j, tj), (k, tk) = (_bracket(a, x) for a, x in zip(axes, xs))
    b = int(batch)
    total = 0.0
    for di, wi in ((0, 1 - ti), (1, ti)):
        for dj, wj in ((0, 1 - tj), (1, tj)):
            for dk, wk in ((0, 1 - tk), (1, tk)):
                w = wi * wj * wk
                if w:
                    total += w * table["error"][key(i + di, j + dj, b, k + dk)]
    return total


def minimum(table):
    return min(table["error"].values())


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "build":
        jobs = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 2
        table, path = build(sys.argv[2], sys.argv[3], jobs)
        print(f"{path}: {len(table['error'])} trainings, best validation error {minimum(table):.4f}")
        return
    if len(sys.argv) >= 3 and sys.argv[1] == "trial":
        table = json.load(open(sys.argv[2]))
        args = dict(a[2:].split("=", 1) for a in sys.argv[3:] if a.startswith("--"))
        v = value(table, float(args["lr"]), float(args["weight_decay"]), int(args["batch"]), float(args["smoothing"]))
        print(json.dumps({"error": v}))
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
