#!/usr/bin/env python3
"""Issue #20's benchmark: mltrain tune against Debian's Optuna 3.1, both run in this invocation.
    .venv/bin/python scripts/bench/tune/cluster.py MLTRAIN SCRATCH [--parts parallel,gpcost,pruning,real,mo] [--quick]
        [--seeds 10] [--parallel-seeds 100] [--samplers tpe,gp]
        [--functions branin,hartmann6,rosenbrock4,styblinski_tang4] [--override key=value] [--pruners asha,hyperband]
Tables:
  parallel  median regret (over --parallel-seeds) after 100 trials (GP: 60) with 4 trials running at
            once (each suggestion sees 3 pending) against the sequential study, pending=liar vs ignore, and Optuna's TPE
            with and without constant_liar; duplicate rate = share of suggestions closer than
            0.01*sqrt(D) (unit cube) to a running trial
  gpcost    the GP sampler's milliseconds per suggestion at 100 and 500 trials (the slowest one judged), and
            its median regret on Branin @50 and Hartmann-6 @100 against the first tuning issue's bounds
  pruning   see curves.py: TPE studies, then (not with --quick) the pruners alone on identical
            random trial streams
  mo        see mo.py
"""
import argparse
import json
import math
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).parent))
from optuna_baseline import FUNCTIONS  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
ROOT = Path(__file__).resolve().parents[3]
STUDY = str(ROOT / "configs/tune/branin.yaml")


def tune(m, scratch, name, *overrides):
    out = subprocess.run([m, "tune", STUDY, "-q", "--json", f"study.dir={scratch}", f"study.name={name}", *overrides],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def unit(x, bounds):
    return np.array([(v - lo) / (hi - lo) for v, (lo, hi) in zip(x, bounds)])


def journal_trials(path, bounds):
    """(values in trial order, nearest running distance per suggestion)"""
    running, values, near = {}, {}, []
    for line in open(path):
        r = json.loads(line)
        if r["op"] == "create":
            x = unit([r["params"][f"x{i + 1}"] for i in range(len(bounds))], bounds)
            near.append(min((float(np.linalg.norm(x - y)) for y in running.values()), default=math.inf))
            running[r["trial"]] = x
        elif r["op"] == "finish":
            running.pop(r["trial"], None)
            if "value" in r:
                values[r["trial"]] = r["value"]
    return [values[k] for k in sorted(values)], near


def optuna_parallel(fn, seed, trials, concurrent, liar):
    f, bounds, _ = FUNCTIONS[fn]
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed, constant_liar=liar))
    pending, values, near = [], [], []
    asked = 0
    while len(values) < trials:
        while len(pending) < concurrent and asked < trials:
            t = study.ask()
            x = [t.suggest_float(f"x{i + 1}", lo, hi) for i, (lo, hi) in enumerate(bounds)]
            u = unit(x, bounds)
            near.append(min((float(np.linalg.norm(u - unit(y, bounds))) for _, y in pending), default=math.inf))
            pending.append((t, x))
            asked += 1
        t, x = pending.pop(0)
        v = f(x)
        study.tell(t, v)
        values.append(v)
    return values, near


def ratio_ci(par_rows, seq_rows, fmin, trials, n=2000):
    """90 % interval of median(parallel regret) / median(sequential regret) by a paired bootstrap
    over seeds (the same seed index in both)."""
    par = np.array([min(v[:trials]) - fmin for v, _ in par_rows])
    seq = np.array([min(v[:trials]) - fmin for v, _ in seq_rows])
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(par), size=(n, len(par)))
    r = np.median(par[idx], axis=1) / np.maximum(np.median(seq[idx], axis=1), 1e-300)
    return float(np.percentile(r, 5)), float(np.percentile(r, 95))


def median_regret(rows, fmin, k):
    """The median over seeds of the best regret within the first k trials (a study per seed)."""
    return statistics.median(min(v[:k]) - fmin for v, _ in rows)


def lag_ratio(seq_rows, fmin, trials, lag=3):
    """The sequential study's median regret `lag` trials before the end over its final one: what
    it had with the results the parallel study's last suggestions saw (3 fewer, 4 running)."""
    end = median_regret(seq_rows, fmin, trials)
    return median_regret(seq_rows, fmin, trials - lag) / end if end > 0 else math.nan


def trials_behind(par_rows, seq_rows, fmin, trials, points=(0.25, 0.5, 0.75, 1.0)):
    """How many trials the parallel study is behind the sequential one after each fraction of
    the study: k minus the fewest trials after which the sequential median regret is at most the
    parallel one's after k; negative where the parallel study leads, 'ahead' where the sequential
    study never gets there. Where the gap opens tells a lag of the last suggestions (a constant 3)
    from progress lost all along."""
    out = []
    for f in points:
        k = max(1, round(f * trials))
        j = trials_to_match(seq_rows, fmin, median_regret(par_rows, fmin, k))
        out.append("ahead" if j is None else str(k - j))
    return "/".join(out)


def trials_to_match(rows, fmin, regret):
    """The fewest trials after which the median regret of `rows` (a study per seed) is at most
    `regret`, or None if it never is."""
    for k in range(1, min(len(v) for v, _ in rows) + 1):
        if median_regret(rows, fmin, k) <= regret:
            return k
    return None


def summarise(rows, fmin, trials, dim):
    regrets = [min(v[:trials]) - fmin for v, _ in rows]
    tol = 0.01 * math.sqrt(dim)
    near = [d for _, n in rows for d in n if math.isfinite(d)]
    dup = sum(d < tol for d in near) / max(len(near), 1)
    return statistics.median(regrets), dup, statistics.median(near) if near else math.nan


def part_parallel(m, scratch, seeds, quick, samplers=("tpe", "gp"),
                  fns=("branin", "hartmann6", "rosenbrock4", "styblinski_tang4")):
    print("## parallel suggestions: 4 trials at once vs sequential")
    print(f"median regret over {seeds} seeds; dup = suggestions within 0.01*sqrt(D) of a running trial;"
          " near = median distance to the nearest running trial (unit cube)")
    print("seq@ = the trials the sequential study needs to reach that median regret (the cost of running 4 at once,"
          " in trials; '>N' never within N)")
    print(f"{'function':<17} {'tuner':<8} {'sampler':<5} {'mode':<16} {'regret':>10} {'vs seq':>7} {'seq@':>5} {'dup':>6} {'near':>6}")
    verdicts = []
    pool = ThreadPoolExecutor(2)  # studies are deterministic: two at a time changes no number
    for fn in fns:
        _, bounds, fmin = FUNCTIONS[fn]
        for sampler, trials in (("tpe", 100), ("gp", 60)):
            if sampler not in samplers:
                continue
            if quick and sampler == "gp" and fn != "branin":
                continue
            res, seq_rows, all_rows = {}, None, {}
            for mode, conc, pend in (("sequential", 1, "liar"), ("4 running, liar", 4, "liar"), ("4 running, ignore", 4, "ignore")):
                def study(s, conc=conc, pend=pend, sampler=sampler, trials=trials):
                    name = f"par_{fn}_{sampler}_{conc}_{pend}_{s}"
                    tune(m, scratch, name, f"objective.function={fn}", f"sampler.name={sampler}", f"study.seed={s}",
                         f"study.n_trials={trials}", f"study.max_concurrent={conc}", f"sampler.pending={pend}")
                    return journal_trials(Path(scratch) / name / "journal.jsonl", bounds)
                rows = list(pool.map(study, range(seeds)))
                seq_rows = seq_rows or rows
                all_rows[mode] = rows
                res[mode] = summarise(rows, fmin, trials, len(bounds))
            seq = res["sequential"][0]
            for mode, (reg, dup, near) in res.items():
                rel = reg / seq if seq > 0 else math.nan
                k = trials_to_match(seq_rows, fmin, reg)
                at = "" if mode == "sequential" else f">{trials}" if k is None else str(k)
                print(f"{fn:<17} {'mltrain':<8} {sampler:<5} {mode:<16} {reg:>10.4g} {rel:>7.2f} {at:>5} {dup:>6.1%} {near:>6.3f}")
            verdicts.append((fn, sampler, res["4 running, liar"][0], seq, res["4 running, liar"][1], res["4 running, ignore"][1],
                             ratio_ci(all_rows["4 running, liar"], seq_rows, fmin, trials), lag_ratio(seq_rows, fmin, trials),
                             trials_behind(all_rows["4 running, liar"], seq_rows, fmin, trials)))
        if quick or "tpe" not in samplers:
            continue
        oseeds = max(1, min(seeds // 2, 5))  # context only: Optuna has no bound to meet here
        for mode, conc, liar in (("sequential", 1, False), ("4 running, liar", 4, True), ("4 running, plain", 4, False)):
            rows = [optuna_parallel(fn, s, 100, conc, liar) for s in range(oseeds)]
            reg, dup, near = summarise(rows, fmin, 100, len(bounds))
            print(f"{fn:<17} {'optuna':<8} {'tpe':<5} {mode:<16} {reg:>10.4g} {'':>7} {'':>5} {dup:>6.1%} {near:>6.3f}  ({oseeds} seeds)")
    print()
    print("(CI: 90 % paired bootstrap over seeds; 'sequential 3 earlier': the sequential study's own regret 3 trials\n"
          " before the end over its final one, i.e. with the results the parallel study's last suggestions saw;\n"
          " 'behind': trials the parallel study is behind the sequential one after 25/50/75/100 % of the trials)")
    for fn, sampler, par, seq, dup_liar, dup_naive, (lo, hi), lag, behind in verdicts:
        ok = par <= 1.10 * seq
        print(f"{'PASS' if ok else 'FAIL'}  {fn} {sampler}: regret with 4 running {par:.4g} <= 1.10 x sequential {seq:.4g}"
              f" ({par / seq if seq > 0 else math.nan:.2f}x, CI {lo:.2f}-{hi:.2f}; sequential 3 earlier {lag:.2f}x;"
              f" behind {behind});"
              f" duplicates {dup_liar:.1%} vs naive {dup_naive:.1%}")
    print()


def part_gpcost(m, scratch, quick):
    print("## GP sampler cost: ms per suggestion (journal's sample_ms), hartmann6 and branin")
    print("(the 10 suggestions after N trials, at 100 trials for seeds 0-4; each the fastest of 3 runs of the same")
    print(" study; the bound must hold for every suggestion)")
    print(f"{'function':<10} {'trials':>6} {'mean':>8} {'median':>8} {'p90':>8} {'max':>8}")
    sizes = (100,) if quick else (100, 500)
    ok = True
    for fn in ("branin", "hartmann6"):
        for n in sizes:
            # At 100 the studies are real; at 500 the first 480 come from the Latin hypercube, to keep
            # the benchmark short.
            ms = []
            for seed in (range(5) if n == 100 else range(1)):
                # Each study three times: a GP study's suggestions are a pure function of its seed, so
                # the fastest of three timings of one suggestion drops the shared machine's hiccups.
                runs = []
                for rep in range(3):
                    name = f"gpcost_{fn}_{n}_{seed}_{rep}"
                    extra = [] if n == 100 else [f"sampler.n_startup={n - 20}"]
                    tune(m, scratch, name, f"objective.function={fn}", "sampler.name=gp", f"study.seed={seed}",
                         f"study.n_trials={n + 10}", *extra)
                    runs.append([json.loads(l)["sample_ms"] for l in open(Path(scratch) / name / "journal.jsonl")
                                 if '"create"' in l][n:n + 10])
                ms += [min(t) for t in zip(*runs)]
            p90 = sorted(ms)[int(0.9 * len(ms))]
            print(f"{fn:<10} {n:>6} {statistics.mean(ms):>8.1f} {statistics.median(ms):>8.1f} {p90:>8.1f} "
                  f"{max(ms):>8.1f}")
            limit = 20 if n == 100 else 1000
            ok &= max(ms) <= limit
            print(f"{'PASS' if max(ms) <= limit else 'FAIL'}  GP at {n} trials ({fn}): "
                  f"slowest suggestion {max(ms):.1f} ms <= {limit} ms")
    # The cost must not buy regret: the first tuning issue's bounds (scripts/bench/tune/compare.py),
    # median over 20 seeds (10 with --quick).
    seeds = range(10 if quick else 20)
    print(f"GP regret, median of best - minimum over seeds 0-{len(seeds) - 1}")
    pool = ThreadPoolExecutor(2)
    for fn, trials, bound in (("branin", 50, 1e-3), ("hartmann6", 100, 0.15)):
        fmin = FUNCTIONS[fn][2]
        best = pool.map(lambda s: tune(m, scratch, f"gpregret_{fn}_{s}", f"objective.function={fn}", "sampler.name=gp",
                                       f"study.seed={s}", f"study.n_trials={trials}")["best"]["value"], seeds)
        regret = statistics.median(b - fmin for b in best)
        ok &= regret <= bound
        print(f"{'PASS' if regret <= bound else 'FAIL'}  GP regret {fn} @{trials}: {regret:.3g} <= {bound:g}")
    print()
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mltrain")
    ap.add_argument("scratch")
    ap.add_argument("--parts", default="parallel,gpcost,pruning,real,mo")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--samplers", default="tpe,gp", help="parallel part: mltrain samplers to run")
    ap.add_argument("--functions", default="branin,hartmann6,rosenbrock4,styblinski_tang4",
                    help="parallel part: test functions to run")
    ap.add_argument("--override", action="append", default=[],
                    help="pruning part: an override for mltrain's TPE studies (repeatable), e.g. sampler.multivariate=false")
    ap.add_argument("--pruners", default="none,median,percentile,asha,hyperband", help="pruning part: pruners to run")
    # Medians of regret over 10 seeds moved by up to 70 % between seed sets (rosenbrock4 TPE, 4
    # running against sequential: 0.76x on seeds 0-9, 1.31x on 0-19), too much to judge a 10 % bound.
    ap.add_argument("--parallel-seeds", type=int, default=100, help="parallel part: seeds per study")
    a = ap.parse_args()
    parts = a.parts.split(",")
    import curves
    for flag, given, known in (("--parts", parts, ("parallel", "gpcost", "pruning", "real", "mo")),
                               ("--samplers", a.samplers.split(","), ("tpe", "gp")),
                               ("--functions", a.functions.split(","), tuple(FUNCTIONS)),
                               ("--pruners", a.pruners.split(","), tuple(curves.PRUNERS))):
        if any(g not in known for g in given):
            ap.error(f"{flag} {','.join(given)}: use a comma-separated list of {', '.join(known)}")
    if "gpcost" in parts:  # first, while nothing else runs
        part_gpcost(a.mltrain, a.scratch, a.quick)
    if "parallel" in parts:
        part_parallel(a.mltrain, a.scratch, a.seeds if a.quick else a.parallel_seeds, a.quick, a.samplers.split(","),
                      a.functions.split(","))
    if "pruning" in parts:
        curves.run(a.mltrain, a.scratch, a.seeds, a.quick, tune, extra=a.override, pruners=a.pruners.split(","))
        if not a.quick and not a.override:  # the random sampler's streams: no override changes them
            curves.run_same_stream(a.mltrain, a.scratch, a.seeds, tune)
    if "real" in parts:
        import real_curves
        real_curves.run(a.mltrain, a.scratch, a.seeds, a.quick)
    if "mo" in parts:
        import mo
        mo.run(a.mltrain, a.scratch, a.seeds, a.quick, tune)


if __name__ == "__main__":
    main()
