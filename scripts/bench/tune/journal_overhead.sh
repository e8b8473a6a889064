#!/usr/bin/env bash
# What the study driver costs per intermediate report. Trials are a shell loop printing R reports
# each, 10 ms apart (no training; a report from a trial that has already exited is not judged),
# one trial at a time; the same study runs twice in this invocation:
#   baseline  pruner none: reports are appended to the journal, nobody reads them back
#   pruned    median pruner that never prunes (n_warmup_steps above R): every report also makes the
#             driver read the journal and judge the trial, as a real pruned study does
# Prints the CPU seconds of each study (driver plus trial shells; the trials are the same in both)
# and their ratio.
#   bash scripts/bench/tune/journal_overhead.sh [TRIALS] [REPORTS]
set -euo pipefail
source "$(dirname "$0")/../prelude.sh"
T=${1:-40}
R=${2:-50}
trial='i=1; while [ $i -le '$R' ]; do echo "{\"step\": $i, \"loss\": $(( (i * 7919 + MLTRAIN_TRIAL_NUMBER * 104729) % 1000 ))}"; sleep 0.01; i=$((i+1)); done'
study() {  # study NAME PRUNER-BLOCK
  cat >"$D/$1.yaml" <<YAML
study: {name: $1, dir: $D, seed: 0, n_trials: $T, max_concurrent: 1}
sampler: {name: random}
$2
objective: {metric: loss, direction: minimize}
trial:
  command: [sh, -c, '$trial']
space:
  x: {type: float, low: 0, high: 1}
YAML
  # CPU of the study (the driver and the trial shells it reaped), from bash's `times` in a subshell
  ( "$M" tune "$D/$1.yaml" --quiet >/dev/null 2>"$D/$1.log" || { cat "$D/$1.log" >&2; exit 1; }; times ) | tail -1 |
    awk '{ split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.2f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' 
}
base=$(study baseline "pruner: {name: none}")
pruned=$(study pruned "pruner: {name: median, n_startup_trials: 1, n_warmup_steps: 1000000}")
records=$(wc -l <"$D/pruned/journal.jsonl")
echo "trials $T x $R reports ($records journal records): CPU baseline ${base} s, with the pruner reading the journal ${pruned} s"
python3 -c "b, p = $base, $pruned; print(f'ratio pruned/baseline: {p / max(b, 0.01):.2f}x; per report: {(p - b) / ($T * $R) * 1e3:.3f} ms')"
