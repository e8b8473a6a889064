#!/usr/bin/env bash
# Issue #7 (quantize) figures: int8 accuracy change, weight size ratio and batch-128 speed ratio
# against fp32, measured in this invocation for every observer, dynamic mode, and the sensitivity
# pass's proposal.
#   bash scripts/bench/quantize_speed.sh                  # trains a CNN (3 epochs) and the small ResNet (2 epochs) first
#   bash scripts/bench/quantize_speed.sh RUN_DIR...       # or quantizes finished runs, e.g. the main job's
set -euo pipefail
source "$(dirname "$0")/prelude.sh"
runs=("$@")
if [ ${#runs[@]} -eq 0 ]; then
  echo "training a CNN (3 epochs) and the small ResNet (2 epochs) on Fashion-MNIST ..." >&2
  $M train configs/fashion_mnist_cnn.yaml train.duration=3ep checkpoint.every=3ep run.dir="$D" run.name=cnn >/dev/null 2>&1
  $M train configs/fashion_mnist_resnet_recipe.yaml train.duration=2ep train.eval_every=1ep checkpoint.every=2ep \
    run.dir="$D" run.name=resnet >/dev/null 2>&1
  runs=("$D/cnn/v0" "$D/resnet/v0")
fi
summary=".venv/bin/python scripts/bench/quantize_summary.py"
for run in "${runs[@]}"; do
  echo "== $run"
  for obs in minmax moving_average_minmax percentile entropy; do
    $M quantize "$run" -o "$D/q" --calib-cache off --observer $obs --json 2>/dev/null | $summary "static $obs"
  done
  $M quantize "$run" -o "$D/q" --mode dynamic --json 2>/dev/null | $summary "dynamic (linear layers only)"
  $M quantize "$run" -o "$D/q" --sensitivity --json 2>/dev/null | $summary "static minmax + sensitivity"
done
