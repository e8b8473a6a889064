#!/usr/bin/env bash
# Issue #5 benchmark: mltrain tune's samplers against Debian's Optuna 3.1 on Branin, Hartmann-6 and
# Rosenbrock-4 (no training: the functions run in-process in both tuners), 20 seeds x 100 trials,
# median regret after 25/50/100 trials, and the sampler's time per trial; both tuners measured in
# this invocation, one after the other (run it on an otherwise idle machine).
#   bash scripts/bench/tune/run.sh [SEEDS] [TRIALS]
set -euo pipefail
source "$(dirname "$0")/../prelude.sh"
SEEDS=${1:-20}
TRIALS=${2:-100}
for fn in branin hartmann6 rosenbrock4; do
  for s in random tpe gp; do
    echo "mltrain: $fn $s ($SEEDS seeds)" >&2
    for ((seed = 0; seed < SEEDS; seed++)); do
      $M tune configs/tune/branin.yaml objective.function=$fn sampler.name=$s study.seed=$seed study.n_trials=$TRIALS \
        study.dir="$D" study.name=${fn}_${s}_${seed} -q --json >"$D/${fn}_${s}_${seed}.summary.json"
    done
  done
done
echo "optuna: tpe, random ($SEEDS seeds)" >&2
.venv/bin/python scripts/bench/tune/optuna_baseline.py --seeds "$SEEDS" --trials "$TRIALS" --samplers tpe,random >"$D/optuna.jsonl"
.venv/bin/python scripts/bench/tune/compare.py "$D" "$SEEDS" "$TRIALS"
