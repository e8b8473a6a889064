"""The pruning benchmark of cluster.py: synthetic learning curves (the formulas of mltrain's
curves_parallel and curves_crossing test functions, lib/src/tune/functions.cpp), 100 TPE trials of
27 steps each, sequential and with 4 trials running at once (every running trial takes a step in
turn), each pruner against Optuna 3.1's counterpart on the same curves and seeds. Quality = the
best complete trial's final value (lower is better), cost = total steps (reports) over the study.
With TPE the pruned trials steer the sampler; run_same_stream takes the sampler out: the same random
trials, in the same order, through both pruners."""
import json
import math
import statistics
from pathlib import Path

import numpy as np
import optuna

STEPS = 27


def noise(x, t):
    return 0.01 * math.sin(1000.0 * sum((i + 1) * v for i, v in enumerate(x)) + 7.3 * t)


def parallel_curve(x, t):
    c = (0.2, 0.7, 0.4, 0.6)
    final = 0.1 + sum((x[i] - c[i]) ** 2 for i in range(4))
    return final + math.exp(-t / 6.0) + noise(x, t)


def crossing_curve(x, t):
    lr = x[0]
    e = math.log10(lr) + 3.0
    floor = 0.1 + 0.15 * e * e + (x[1] - 0.3) ** 2 + (x[2] - 0.6) ** 2
    return floor + (2.5 - floor) * math.exp(-10.0 * lr * t) + noise(x, t)


CURVES = {
    "curves_parallel": (parallel_curve, [("x1", 0, 1, False), ("x2", 0, 1, False), ("x3", 0, 1, False), ("x4", 0, 1, False)]),
    "curves_crossing": (crossing_curve, [("lr", 1e-4, 1, True), ("x1", 0, 1, False), ("x2", 0, 1, False)]),
}

# mltrain pruner settings -> Optuna's counterpart
PRUNERS = {
    "none": ([], lambda: optuna.pruners.NopPruner()),
    "median": (["pruner.name=median"], lambda: optuna.pruners.MedianPruner()),
    "percentile": (["pruner.name=percentile", "pruner.percentile=25"], lambda: optuna.pruners.PercentilePruner(25.0)),
    "asha": (["pruner.name=asha", "pruner.min_resource=1", "pruner.reduction_factor=3"],
             lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)),
    "hyperband": (["pruner.name=hyperband", "pruner.min_resource=1", "pruner.max_resource=27", "pruner.reduction_factor=3"],
                  lambda: optuna.pruners.HyperbandPruner(min_resource=1, max_resource=27, reduction_factor=3)),
}


def optuna_round_robin(pruner, seed, trials, concurrent, start, defaults=False):
    """Optuna's TPE and `pruner`; start(trial) suggests the parameters and returns the trial's
    curve (step 1.. -> value). Running trials take a step in turn. (best final value, total steps)
    defaults: TPESampler(seed) as Optuna's defaults have it (5.0: multivariate, constant liar)."""
    # A fixed study name: Optuna's Hyperband puts trial n in the bracket crc32("<study name>_<n>")
    # picks, and the default name is a fresh UUID, so its rows changed from run to run.
    sampler = (optuna.samplers.TPESampler(seed=seed) if defaults
               else optuna.samplers.TPESampler(seed=seed, constant_liar=concurrent > 1))
    study = optuna.create_study(study_name=f"bench-{seed}", sampler=sampler, pruner=PRUNERS[pruner][1]())
    running, started, steps, best = [], 0, 0, math.inf
    while running or started < trials:
        while len(running) < concurrent and started < trials:
            t = study.ask()
            running.append([t, start(t), 0])
            started += 1
        for r in list(running):
            t, curve, k = r
            k += 1
            r[2] = k
            v = curve(k)
            steps += 1
            t.report(v, k - 1)  # Optuna's steps start at 0
            if t.should_prune():
                study.tell(t, state=optuna.trial.TrialState.PRUNED)
                running.remove(r)
            elif k == STEPS:
                study.tell(t, v)
                best = min(best, v)
                running.remove(r)
    return best, steps


def optuna_study(fn, pruner, seed, trials, concurrent, defaults=False):
    f, space = CURVES[fn]

    def start(t):
        x = [t.suggest_float(n, lo, hi, log=lg) for n, lo, hi, lg in space]
        return lambda k: f(x, k)

    return optuna_round_robin(pruner, seed, trials, concurrent, start, defaults)


def reports(journal):
    """Total steps of a study: its journal's intermediate reports."""
    return sum(1 for line in open(journal) if '"report"' in line)


def study_name(fn, pruner, concurrent, seed, sampler):
    return f"prune_{fn}_{pruner}_{concurrent}_{seed}_{sampler}"


def mltrain_study(m, scratch, tune, fn, pruner, seed, trials, concurrent, sampler="tpe", extra=()):
    name = study_name(fn, pruner, concurrent, seed, sampler)
    s = tune(m, scratch, name, f"objective.function={fn}", f"sampler.name={sampler}", f"study.seed={seed}",
             f"study.n_trials={trials}", f"study.max_concurrent={concurrent}", *PRUNERS[pruner][0], *extra)
    return s["best"]["value"], reports(Path(scratch) / name / "journal.jsonl")


def journal_params(journal):
    """The trials' parameters in trial order."""
    params = {}
    for line in open(journal):
        r = json.loads(line)
        if r["op"] == "create":
            params[r["trial"]] = r["params"]
    return [params[k] for k in sorted(params)]


def same_stream(m, scratch, tune, fn, pruner, seed, trials, concurrent):
    """The pruners alone: mltrain's random-sampler trials, then the same parameters in the same
    order through Optuna's pruner (the sampler never sees the pruner's decisions, so both prune
    the same trial stream). ((mltrain best, steps), (optuna best, steps))"""
    a = mltrain_study(m, scratch, tune, fn, pruner, seed, trials, concurrent, sampler="random")
    params = journal_params(Path(scratch) / study_name(fn, pruner, concurrent, seed, "random") / "journal.jsonl")
    f, space = CURVES[fn]

    def start(t):
        x = [params[t.number][n] for n, *_ in space]
        return lambda k: f(x, k)

    return a, optuna_round_robin(pruner, seed, trials, concurrent, start)


HEADER = (f"{'curves':<16} {'running':>7} {'pruner':<10} {'mltrain best':>12} {'optuna best':>12} "
          f"{'mltrain steps':>13} {'optuna steps':>12}")


def row(fn, conc, p, a, b):
    """One table row: the median best and steps of each side; a, b: (best, steps) per seed."""
    ma, mb = statistics.median(x for x, _ in a), statistics.median(x for x, _ in b)
    sa, sb = statistics.median(x for _, x in a), statistics.median(x for _, x in b)
    print(f"{fn:<16} {conc:>7} {p:<10} {ma:>12.4f} {mb:>12.4f} {sa:>13.0f} {sb:>12.0f}")


def run_same_stream(m, scratch, seeds, tune, trials=100):
    print(f"## pruning, the pruners alone: the same {trials} random trials through both, median over {seeds} seeds (100..{99 + seeds})")
    print("(mltrain's random sampler draws the trials; Optuna's pruner sees the same parameters in the same order)")
    print(HEADER)
    verdicts = []
    for fn in CURVES:
        for conc in (1, 4):
            for p in PRUNERS:
                if p == "none":
                    continue
                r = [same_stream(m, scratch, tune, fn, p, s, trials, conc) for s in range(100, 100 + seeds)]
                a, b = [x for x, _ in r], [y for _, y in r]
                row(fn, conc, p, a, b)
                verdicts.append((f"same stream {fn} x{conc} {p}", a, b))
    print()
    for label, a, b in verdicts:
        verdict(label, a, b, paired=True)
    print()


def verdict(label, a, b, n=2000, paired=False):
    """PASS when mltrain's median best is at least Optuna's at no more median steps; a, b: (best,
    steps) per seed. With 90 % bootstrap intervals (seeds resampled, each side on its own, or
    together where both sides ran the same trials: paired) of the best's difference and the steps'
    ratio: where the best's interval spans 0, ten seeds cannot tell the two apart."""
    ma, mb = statistics.median(x for x, _ in a), statistics.median(x for x, _ in b)
    sa, sb = statistics.median(x for _, x in a), statistics.median(x for _, x in b)
    rng = np.random.default_rng(0)
    A, B = np.array(a, dtype=float), np.array(b, dtype=float)
    ia = rng.integers(0, len(A), size=(n, len(A)))
    ib = ia if paired else rng.integers(0, len(B), size=(n, len(B)))
    diff = np.median(A[ia, 0], axis=1) - np.median(B[ib, 0], axis=1)
    ratio = np.median(A[ia, 1], axis=1) / np.median(B[ib, 1], axis=1)
    ok = ma <= mb and sa <= sb
    print(f"{'PASS' if ok else 'FAIL'}  {label}: best {ma:.4f} vs optuna {mb:.4f} (difference 90 % CI "
          f"{np.percentile(diff, 5):+.4f} to {np.percentile(diff, 95):+.4f}), steps {sa:.0f} vs {sb:.0f} "
          f"(ratio CI {np.percentile(ratio, 5):.2f}-{np.percentile(ratio, 95):.2f})")


def run(m, scratch, seeds, quick, tune, trials=100, extra=(), pruners=tuple(PRUNERS)):
    """extra: overrides for mltrain's studies (e.g. sampler.multivariate=false)."""
    print(f"## pruning: {trials} TPE trials of {STEPS} steps, median over {seeds} seeds (100..{99 + seeds})")
    print("best = the best complete trial's final value (lower is better); steps = reports over the study")
    if extra:
        print("mltrain's studies with " + " ".join(extra))
    print(HEADER)
    verdicts = []
    for fn in CURVES:
        for conc in (1, 4):
            for p in pruners:
                if quick and p in ("percentile", "hyperband"):
                    continue
                # Seeds from 100: the pruning rules were designed on seeds 0-19.
                a = [mltrain_study(m, scratch, tune, fn, p, s, trials, conc, extra=extra)
                     for s in range(100, 100 + seeds)]
                b = [optuna_study(fn, p, s, trials, conc) for s in range(100, 100 + seeds)]
                row(fn, conc, p, a, b)
                if p != "none":
                    verdicts.append((f"{fn} x{conc} {p}", a, b))
    print()
    for label, a, b in verdicts:
        verdict(label, a, b)
    print()
