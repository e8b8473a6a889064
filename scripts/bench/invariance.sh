#!/usr/bin/env bash
# Issue #42's cost figures, measured in this invocation on Fashion-MNIST: distributed.invariance
# bitwise against the default path, same model, data, global batch and cores, rounds interleaved.
#   world 2 (2 Gloo ranks, 1 thread each): default DDP (bucketed fp32 all-reduce overlapping the
#            backward) vs bitwise (12 virtual shards: 6 forward/backward passes per rank, exact
#            int64 sum) and bitwise with 2 shards (one per rank: the cost of the exact sum alone)
#   world 1: default (2 threads) vs bitwise (invariance_threads 1, the default) and 2 threads
#   larger shards: the MLP at a global batch of 1536 and the CNN at 768 (128 and 64 samples per
#            shard), world 2 only
#   the floor: what one Gloo all-reduce of the MLP's gradient costs in fp32 and in fp64, and the
#            maxima's all-gather, in PyTorch alone (gloo_floor.py)
# Prints seconds per optimizer step (median of ROUNDS) and rank 0's peak RSS, as ratios to default.
#   ROUNDS=3 bash scripts/bench/invariance.sh [mlp:192] [cnn:96] [mlp:1536] [cnn:768]
set -euo pipefail
source "$(dirname "$0")/prelude.sh"
ROUNDS=${ROUNDS:-3}
RUNS=${*:-mlp:192 cnn:96 mlp:1536 cnn:768}
# summary FILE: the last JSON summary line of a run's output (rank 0's, prefixed or not).
summary() {
  .venv/bin/python - "$1" <<'PY'
import json, sys
lines = [l.split('] ', 1)[-1] for l in open(sys.argv[1]) if '"event":"summary"' in l]
s = json.loads(lines[-1])
print(f'{s["train_seconds"] / s["step"]:.6f} {s["peak_rss_mib"]:.1f}')
PY
}
for run in $RUNS; do
  model=${run%%:*} G=${run##*:}
  # About 57,600 MLP or 11,520 CNN samples a run, at least 24 steps.
  if [ "$model" = mlp ]; then steps=$((57600 / G)); else steps=$((11520 / G)); fi
  steps=$((steps < 24 ? 24 : steps))u
  common=(configs/fashion_mnist_$model.yaml train.global_batch=$G data.batch_size=auto train.duration=$steps
          train.eval_every=never train.final_eval=none checkpoint.every=never run.dir="$D")
  declare -A variants=(
    [w2_default]="2 distributed.invariance=none"
    [w2_bitwise12]="2 distributed.invariance=bitwise"
    [w2_bitwise2]="2 distributed.invariance=bitwise distributed.virtual_shards=2"
    [w1_default]="1 distributed.invariance=none"
    [w1_bitwise12]="1 distributed.invariance=bitwise"
    [w1_bitwise12_t2]="1 distributed.invariance=bitwise distributed.invariance_threads=2"
  )
  order=(w2_default w2_bitwise12 w2_bitwise2 w1_default w1_bitwise12 w1_bitwise12_t2)
  [ "$G" -le 192 ] || order=(w2_default w2_bitwise12 w2_bitwise2)  # larger shards: world 2 only
  for r in $(seq 1 "$ROUNDS"); do
    for v in "${order[@]}"; do
      read -r world args <<<"${variants[$v]}"
      out="$D/${model}${G}_${v}_$r.out"
      # shellcheck disable=SC2086
      if [ "$world" = 1 ]; then
        $M train "${common[@]}" run.name=${model}${G}_${v}_$r $args --jsonl >"$out" 2>&1
      else
        $M launch --nproc-per-node "$world" -- mltrain train "${common[@]}" run.name=${model}${G}_${v}_$r $args --jsonl >"$out" 2>&1
      fi
      echo "$v $(summary "$out")" >>"$D/${model}$G.txt"
    done
  done
  .venv/bin/python - "$D/${model}$G.txt" "$model" "$G" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    v, s, rss = line.split()
    rows.setdefault(v, []).append((float(s), float(rss)))
model, G = sys.argv[2], int(sys.argv[3])
med = {v: (statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)) for v, r in rows.items()}
print(f'== {model}, global batch {G} ({G // 12} samples per shard of 12), {len(rows["w2_default"])} rounds (median s/step, rank 0 peak RSS)')
for world in ('w2', 'w1'):
    if f'{world}_default' not in med:
        continue
    base = med[f'{world}_default']
    for v in sorted(k for k in med if k.startswith(world)):
        s, rss = med[v]
        print(f'  {v:<17} {1e3 * s:8.2f} ms/step {G / s:9.0f} samples/s  {rss:7.1f} MiB   '
              f'time {s / base[0]:.2f}x  RSS {rss / base[1]:.2f}x')
PY
done
.venv/bin/python scripts/bench/gloo_floor.py
