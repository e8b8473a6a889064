#!/usr/bin/env bash
# Issue #19 item 4, measured in this invocation: pipeline parallelism's bubble (the idle share of
# each stage during a batch's pipelined passes, from the stages' own clocks) against the
# theoretical (S-1)/(M+S-1), for M = 1, 4, 16 micro-batches and both schedules, on 2 stages
# (2 ranks, 1 thread each) of a 784-1024-2048-1400-10 MLP on Fashion-MNIST (two stages of equal time), global batch
# 512; and samples/s against one process with 2 threads on the same model and batch.
#   bash scripts/bench/pipeline.sh [STEPS]     (default 40 optimizer steps per run)
set -euo pipefail
source "$(dirname "$0")/prelude.sh"
STEPS=${1:-40}
COMMON=(configs/fashion_mnist_mlp.yaml model.hidden=[1024,2048,1400] model.dropout=0
  data.batch_size=512 data.limit_train=16384 train.duration=${STEPS}u train.eval_every=1000u
  checkpoint.every=never run.dir="$D")
rate() {  # samples/s of the run whose --jsonl summary is the last JSON line of $1
  .venv/bin/python -c "import json
rows = [json.loads(l.split('] ', 1)[-1]) for l in open('$1') if '\"event\":\"summary\"' in l]
print(f'{rows[-1][\"step\"] * 512 / rows[-1][\"train_seconds\"]:.0f}')"
}
$M train "${COMMON[@]}" runtime.threads=2 run.name=single --jsonl >"$D/single.out" 2>"$D/single.err"
base=$(rate "$D/single.out")
echo "one process, 2 threads: $base samples/s"
printf '%-8s %4s  %9s  %11s  %12s  %s\n' schedule M measured theoretical samples/s "vs one process"
for schedule in gpipe 1f1b; do
  for m in 1 4 16; do
    name=${schedule}_$m
    $M launch --nproc-per-node 2 -- mltrain train "${COMMON[@]}" runtime.threads=1 \
      distributed.pipeline.stages=2 distributed.pipeline.microbatches=$m \
      distributed.pipeline.schedule=$schedule run.name=$name --jsonl >"$D/$name.out" 2>&1
    line=$(grep -o 'bubble [0-9.]* % measured.*' "$D/$name.out" | head -1)
    measured=$(echo "$line" | awk '{print $2}')
    theory=$(echo "$line" | grep -o '[0-9.]* % theoretical' | awk '{print $1}')
    r=$(rate "$D/$name.out")
    printf '%-8s %4s  %7s %%  %9s %%  %12s  %.2fx\n' $schedule $m "$measured" "$theory" "$r" \
      "$(echo "$r / $base" | bc -l)"
  done
done
grep -h 'units cut by' "$D/gpipe_4.out" | sed 's/^.*\[pipeline\]/cut:/' | head -1
