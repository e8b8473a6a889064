#!/usr/bin/env bash
# Decode + augment + batch throughput from an image folder: mltrain's loader (TurboJPEG/libspng in
# its worker threads) against torchvision's ImageFolder + DataLoader with 0, 1 and 2 workers, in
# one invocation on the same files and cores. Target (issue #17): >= 3x the best DataLoader.
#
#   scripts/bench/loader_speed.sh              # PNG and JPEG folders of Fashion-MNIST, ~4 minutes
#
# Work per sample on both sides: decode, grayscale, random resized crop (scale 0.7-1), horizontal
# flip (p 0.5), normalise, batch of 128. Never part of the test suite.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/mltrain_bench ] || bash scripts/build.sh >/dev/null
PY=.venv/bin/python
$PY scripts/data/fmnist_images.py >/dev/null
jget() { $PY -c "import json,sys; print(json.loads(sys.stdin.readlines()[-1])['$1'])"; }
ratio() { $PY -c "print(f'{$1/$2:.2f}')"; }
AUG="data.augment.crop.p=1 data.augment.crop_scale=[0.7,1.0] data.augment.flip.p=0.5"
printf "%-10s %-26s %12s\n" "folder" "loader" "samples/s"
for fmt in png jpg; do
  root=data/fmnist_$fmt/train
  best_py=0
  for w in 0 1 2; do
    v=$($PY scripts/bench/py_loader.py --root $root --workers $w --batches 120 | jget samples_per_s)
    printf "%-10s %-26s %12.0f\n" "$fmt" "torchvision workers=$w" "$v"
    best_py=$($PY -c "print(max($best_py, $v))")
  done
  best_ml=0
  for w in 1 2 auto; do
    v=$(build/mltrain_bench loader configs/fmnist_png_folder.yaml data.train_images=$root \
          data.test_images=data/fmnist_$fmt/test data.workers=$w train.duration=300u $AUG \
          | jget samples_per_s)
    printf "%-10s %-26s %12.0f\n" "$fmt" "mltrain workers=$w" "$v"
    best_ml=$($PY -c "print(max($best_ml, $v))")
  done
  printf "%-10s %-26s %12s   target >= 3x\n" "$fmt" "mltrain best / torchvision best" "$(ratio $best_ml $best_py)x"
done
