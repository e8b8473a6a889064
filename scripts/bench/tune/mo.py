"""The multi-objective part of cluster.py: ZDT1 and ZDT2 (5 variables, both objectives minimised),
100 trials, hypervolume of the final front against the reference point (1.1, 11) (f1 <= 1 and
f2 <= g <= 10 on these problems, plus 10 %), median over the seeds: mltrain's multi-objective TPE
and random sampler against Optuna 3.1's TPESampler (MOTPE) and NSGAIISampler (population 50)."""
import json
import math
import statistics
from pathlib import Path

import optuna

REF = (1.1, 11.0)


def zdt(x, kind):
    g = 1 + 9 * sum(x[1:]) / (len(x) - 1)
    f1 = x[0]
    f2 = g * (1 - math.sqrt(f1 / g)) if kind == "zdt1" else g * (1 - (f1 / g) ** 2)
    return f1, f2


def hypervolume(points):
    pts = sorted(p for p in points if p[0] < REF[0] and p[1] < REF[1])
    hv, best2 = 0.0, REF[1]
    for f1, f2 in pts:
        if f2 < best2:
            hv += (REF[0] - f1) * (best2 - f2)
            best2 = f2
    return hv


def optuna_hv(kind, sampler, seed, trials):
    s = (optuna.samplers.TPESampler(seed=seed) if sampler == "tpe"
         else optuna.samplers.NSGAIISampler(seed=seed, population_size=50))
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=s)
    study.optimize(lambda t: zdt([t.suggest_float(f"x{i + 1}", 0, 1) for i in range(5)], kind), n_trials=trials)
    return hypervolume([t.values for t in study.trials if t.values])


def mltrain_hv(m, scratch, tune, kind, sampler, seed, trials):
    name = f"mo_{kind}_{sampler}_{seed}"
    tune(m, scratch, name, f"objective.function={kind}", f"sampler.name={sampler}", f"study.seed={seed}",
         f"study.n_trials={trials}")
    rows = [json.loads(l) for l in open(Path(scratch) / name / "trials.jsonl")]
    return hypervolume([tuple(r["values"]) for r in rows if r.get("values")])


def run(m, scratch, seeds, quick, tune, trials=100):
    print(f"## several objectives: hypervolume after {trials} trials, reference {REF}, median over {seeds} seeds")
    print("(higher is better; the true front's: zdt1 11 - 1/3 + 1.1 = 11.767, zdt2 11 - 2/3 + 1.1 = 11.433)")
    print(f"{'problem':<6} {'tuner':<8} {'sampler':<8} {'hypervolume':>12} {'p25':>8} {'p75':>8}")
    verdicts = []
    for kind in ("zdt1", "zdt2"):
        res = {}
        for tuner, sampler in (("mltrain", "tpe"), ("mltrain", "random"), ("optuna", "tpe"), ("optuna", "nsga2")):
            if quick and tuner == "optuna":
                continue
            if tuner == "mltrain":
                v = [mltrain_hv(m, scratch, tune, kind, sampler, s, trials) for s in range(seeds)]
            else:
                v = [optuna_hv(kind, sampler, s, trials) for s in range(seeds)]
            q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
            res[(tuner, sampler)] = statistics.median(v)
            print(f"{kind:<6} {tuner:<8} {sampler:<8} {statistics.median(v):>12.3f} {q[0]:>8.3f} {q[2]:>8.3f}")
        if not quick:
            verdicts.append((kind, res))
    print()
    for kind, res in verdicts:
        a = res[("mltrain", "tpe")]
        for other in (("optuna", "tpe"), ("optuna", "nsga2")):
            b = res[other]
            print(f"{'PASS' if a >= b else 'FAIL'}  {kind}: mltrain MOTPE hypervolume {a:.3f} >= {other[0]} {other[1]} {b:.3f}")
    print()
