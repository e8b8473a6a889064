#!/usr/bin/env bash
# Issue #5's real study: tunes the Fashion-MNIST MLP (configs/tune/fashion_mnist_mlp.yaml: lr, weight
# decay, batch size, label smoothing; 24 trials; ASHA), then trains the default config and the
# study's best.yaml with the same budget (9 epochs, same validation hold-out) and prints both test
# accuracies.
#   bash scripts/bench/tune/fashion_mnist_study.sh [OUT_DIR]
set -euo pipefail
source "$(dirname "$0")/../prelude.sh"
# A copy of the binary: a rebuild during the study (5-20 min) cannot swap it under the trials.
cp "$M" "$D/mltrain"
M=$D/mltrain
OUT=${1:-runs/tune_study}
rm -rf "$OUT/fashion_mnist_mlp" "$OUT/compare"
start=$(date +%s)
$M tune configs/tune/fashion_mnist_mlp.yaml study.dir="$OUT"
echo "study wall time: $(( $(date +%s) - start )) s"
common="train.duration=9ep train.eval_every=1ep data.val_fraction=0.1 checkpoint.every=9ep run.dir=$OUT/compare"
$M train configs/fashion_mnist_mlp.yaml $common run.name=default 2>/dev/null | tee "$OUT/default.txt"
$M train "$OUT/fashion_mnist_mlp/best.yaml" $common run.name=best 2>/dev/null | tee "$OUT/best.txt"
d=$(grep -o '^test accuracy: [0-9.]*' "$OUT/default.txt" | awk '{print $3}')
b=$(grep -o '^test accuracy: [0-9.]*' "$OUT/best.txt" | awk '{print $3}')
echo "test accuracy, 9 epochs: default config $d, study's best config $b"
awk -v d="$d" -v b="$b" 'BEGIN { if (b > d) { print "PASS best config beats the default"; exit 0 } print "FAIL best config does not beat the default"; exit 1 }'
