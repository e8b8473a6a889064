#!/usr/bin/env python3
"""Optuna (Debian's python3-optuna 3.1) on the tuner benchmark's functions and seeds, the side-by-side
baseline of scripts/bench/tune/run.sh. Prints one JSON line per (function, sampler, seed): the best
value after 25/50/100 trials and the sampler's time per trial (study.ask(), which samples every
parameter of the define-and-run space, as a tuner driver does).
    .venv/bin/python scripts/bench/tune/optuna_baseline.py --seeds 20 --trials 100 [--samplers tpe,random]
"""
import argparse
import json
import math
import time

import numpy as np
import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)


def branin(x):
    a, b, c, r, s, t = 1, 5.1 / (4 * math.pi ** 2), 5 / math.pi, 6, 10, 1 / (8 * math.pi)
    return a * (x[1] - b * x[0] ** 2 + c * x[0] - r) ** 2 + s * (1 - t) * math.cos(x[0]) + s


ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
A = np.array([[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]])
P = 1e-4 * np.array([[1312, 1696, 5569, 124, 8283, 5886], [2329, 4135, 8307, 3736, 1004, 9991],
                     [2348, 1451, 3522, 2883, 3047, 6650], [4047, 8828, 8732, 5743, 1091, 381]])


def hartmann6(x):
    x = np.asarray(x)
    return float(-np.sum(ALPHA * np.exp(-np.sum(A * (x - P) ** 2, axis=1))))


def rosenbrock(x):
    return sum(100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2 for i in range(len(x) - 1))


def styblinski_tang(x):
    return sum(0.5 * (v ** 4 - 16 * v * v + 5 * v) for v in x)


FUNCTIONS = {
    "branin": (branin, [(-5, 10), (0, 15)], 0.397887357729739),
    "hartmann6": (hartmann6, [(0, 1)] * 6, -3.32236801141551),
    "rosenbrock4": (rosenbrock, [(-5, 10)] * 4, 0.0),
    "styblinski_tang4": (styblinski_tang, [(-5, 5)] * 4, -156.66466281508556),
}


def make_sampler(name, seed):
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "tpe_multivariate":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--samplers", default="tpe,random")
    ap.add_argument("--functions", default="branin,hartmann6,rosenbrock4")
    args = ap.parse_args()
    for fname in args.functions.split(","):
        f, bounds, fmin = FUNCTIONS[fname]
        for sname in args.samplers.split(","):
            for seed in range(args.seeds):
                study = optuna.create_study(sampler=make_sampler(sname, seed))
                best, marks, ask_s = math.inf, {}, 0.0
                for n in range(1, args.trials + 1):
                    t0 = time.perf_counter()
                    trial = study.ask()
                    x = [trial.suggest_float(f"x{i + 1}", lo, hi) for i, (lo, hi) in enumerate(bounds)]
                    ask_s += time.perf_counter() - t0
                    v = f(x)
                    study.tell(trial, v)
                    best = min(best, v)
                    if n in (25, 50, 100):
                        marks[str(n)] = best - fmin
                print(json.dumps({"tuner": "optuna", "function": fname, "sampler": sname, "seed": seed,
                                  "regret": marks, "sampler_ms_per_trial": 1000 * ask_s / args.trials}), flush=True)


if __name__ == "__main__":
    main()
