#!/usr/bin/env bash
# Issue #7 (fuse) figures: trains the CNN and the small ResNet briefly on Fashion-MNIST, folds
# their BatchNorms with `mltrain fuse`, and prints the output difference and the inference speed
# ratios (batch 1 latency, batch 128 throughput) measured in this invocation.
#   bash scripts/bench/fuse_speed.sh
set -euo pipefail
source "$(dirname "$0")/prelude.sh"
common="data.limit_train=8192 train.duration=1ep checkpoint.every=1ep run.dir=$D"
$M train configs/fashion_mnist_cnn.yaml $common run.name=cnn >/dev/null 2>&1
$M train configs/fashion_mnist_resnet_recipe.yaml $common run.name=resnet amp.enabled=false >/dev/null 2>&1
for m in cnn resnet; do
  $M fuse "$D/$m/v0" --json 2>/dev/null | .venv/bin/python -c "
import json, sys
r = json.load(sys.stdin)
print(f\"$m: {r['folded_batchnorms']} BN folded; max |diff| {r['max_abs_diff']:.2e} (allowed {r['tolerance']:.1e}); \"
      f\"batch 1 {r['before']['latency_ms_batch1']:.3f} -> {r['after']['latency_ms_batch1']:.3f} ms ({r['speedup_batch1']:.2f}x); \"
      f\"batch 128 {r['before']['samples_per_s_batch128']:.0f} -> {r['after']['samples_per_s_batch128']:.0f} samples/s ({r['speedup_batch128']:.2f}x)\")"
done
