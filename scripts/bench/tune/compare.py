#!/usr/bin/env python3
"""Table of scripts/bench/tune/run.sh: median regret (20 seeds) per function, tuner and sampler after
25/50/100 trials, and sampler milliseconds per trial; then the issue's pass/fail lines."""
import json
import math
import statistics
import sys
from pathlib import Path

MINIMA = {"branin": 0.397887357729739, "hartmann6": -3.32236801141551, "rosenbrock4": 0.0}
d, seeds, trials = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
marks = [m for m in (25, 50, 100) if m <= trials]
res = {}  # (fn, tuner, sampler) -> {"regret": {m: [..]}, "ms": [..]}
for fn in MINIMA:
    for s in ("random", "tpe", "gp"):
        r = res.setdefault((fn, "mltrain", s), {"regret": {m: [] for m in marks}, "ms": []})
        for seed in range(seeds):
            rows = [json.loads(l) for l in open(d / f"{fn}_{s}_{seed}" / "trials.jsonl")]
            rows.sort(key=lambda x: x["number"])
            best = math.inf
            for i, row in enumerate(rows, 1):
                if row["state"] == "COMPLETE":
                    best = min(best, row["value"])
                if i in marks:
                    r["regret"][i].append(best - MINIMA[fn])
            r["ms"].append(json.load(open(d / f"{fn}_{s}_{seed}.summary.json"))["sampler_ms_per_trial_this_run"])
for line in open(d / "optuna.jsonl"):
    x = json.loads(line)
    r = res.setdefault((x["function"], "optuna", x["sampler"]), {"regret": {m: [] for m in marks}, "ms": []})
    for m in marks:
        r["regret"][m].append(x["regret"][str(m)])
    r["ms"].append(x["sampler_ms_per_trial"])

med = lambda v: statistics.median(v) if v else float("nan")
print(f"median regret over {seeds} seeds (lower is better); sampler ms/trial averaged over the study")
print(f"{'function':<12} {'tuner':<8} {'sampler':<7} " + " ".join(f"{'@' + str(m):>10}" for m in marks) + f" {'ms/trial':>9}")
for fn in MINIMA:
    for tuner, s in (("mltrain", "random"), ("optuna", "random"), ("mltrain", "tpe"), ("optuna", "tpe"), ("mltrain", "gp")):
        r = res.get((fn, tuner, s))
        if not r:
            continue
        print(f"{fn:<12} {tuner:<8} {s:<7} " + " ".join(f"{med(r['regret'][m]):>10.4g}" for m in marks)
              + f" {statistics.mean(r['ms']):>9.3f}")
print()
ok = True
for fn in MINIMA:
    for m in (50, 100):
        if m not in marks:
            continue
        a, b = med(res[(fn, "mltrain", "tpe")]["regret"][m]), med(res[(fn, "optuna", "tpe")]["regret"][m])
        ok &= a <= b
        print(f"{'PASS' if a <= b else 'FAIL'}  TPE {fn} @{m}: mltrain {a:.4g} <= optuna {b:.4g}")
    ta, tb = statistics.mean(res[(fn, "mltrain", "tpe")]["ms"]), statistics.mean(res[(fn, "optuna", "tpe")]["ms"])
    ok &= ta <= tb / 10
    print(f"{'PASS' if ta <= tb / 10 else 'FAIL'}  TPE sampler time {fn}: mltrain {ta:.3f} ms <= optuna {tb:.3f} ms / 10 ({tb / ta:.0f}x faster)")
if 50 in marks:
    g = med(res[("branin", "mltrain", "gp")]["regret"][50])
    ok &= g <= 1e-3
    print(f"{'PASS' if g <= 1e-3 else 'FAIL'}  GP-EI branin @50: {g:.3g} <= 1e-3")
if 100 in marks:
    g = med(res[("hartmann6", "mltrain", "gp")]["regret"][100])
    ok &= g <= 0.15
    print(f"{'PASS' if g <= 0.15 else 'FAIL'}  GP-EI hartmann6 @100: {g:.3g} <= 0.15")
sys.exit(0 if ok else 1)
