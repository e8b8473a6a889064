#!/usr/bin/env bash
# Issue #4 figures, measured in this invocation on Fashion-MNIST:
#  1. samples/s of one process (2 threads) against 2 Gloo ranks (1 thread each) at the same global batch
#  2. the share of step time spent waiting for the gradient all-reduce, with and without overlap
#  3. 1-bit Adam against Adam on 2 ranks: bytes sent per step after the warm-up, accuracy, time
#  4. gradients sent as fp16 (distributed.compress) against fp32: bytes, wait, samples/s, accuracy
#   bash scripts/bench/ddp.sh [SECTION...]     (default: 1 2 3 4)
set -euo pipefail
source "$(dirname "$0")/prelude.sh"
# Python with launched() at hand: the final JSON summary that rank 0 printed in a launch log.
py() {
  .venv/bin/python -c "import json
def launched(path):
    return [json.loads(l.split('] ', 1)[1]) for l in open(path) if '\"event\":\"summary\"' in l][-1]
$1"
}
# launch2 NAME KEY=VALUE...: the MLP on 2 ranks (64 each, global batch 128), JSON lines in $D/NAME.out
launch2() {
  local name=$1; shift
  $M launch --nproc-per-node 2 -- mltrain train configs/fashion_mnist_mlp.yaml data.batch_size=64 run.dir="$D" run.name="$name" \
    "$@" --jsonl >"$D/$name.out" 2>&1
}
SECTIONS=${*:-1 2 3 4}
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
if want 1; then
echo "== 1. one process vs 2 ranks (global batch 128)"
for model in mlp cnn; do
  dur=$([ $model = mlp ] && echo 3ep || echo 1ep)
  $M train configs/fashion_mnist_$model.yaml train.duration=$dur run.dir="$D" run.name=${model}_1 --jsonl 2>/dev/null >"$D/${model}_1.out"
  $M launch --nproc-per-node 2 -- mltrain train configs/fashion_mnist_$model.yaml train.duration=$dur data.batch_size=64 \
    run.dir="$D" run.name=${model}_2 --jsonl >"$D/${model}_2.out" 2>&1
  py "
a = json.loads(open('$D/${model}_1.out').read().strip().splitlines()[-1])
b = launched('$D/${model}_2.out')
sa, sb = a['step'] * 128 / a['train_seconds'], b['step'] * 128 / b['train_seconds']
print(f'$model: 1 process {sa:.0f} samples/s (acc {a[\"test_accuracy\"]:.4f}); 2 ranks {sb:.0f} samples/s (acc {b[\"test_accuracy\"]:.4f}); ratio {sb / sa:.2f}x; '
      f'all-reduce wait {100 * b[\"allreduce_wait_s\"] / b[\"train_seconds\"]:.1f} % of training')"
done
fi
if want 2; then
echo "== 2. overlap (MLP, 2 ranks, 0.25 MB buckets)"
for ov in true false; do
  launch2 ov_$ov train.duration=3ep distributed.bucket_mb=0.25 distributed.overlap=$ov
  py "
b = launched('$D/ov_$ov.out')
print(f'overlap $ov: all-reduce wait {b[\"allreduce_wait_s\"]:.2f} s of {b[\"train_seconds\"]:.2f} s ({100 * b[\"allreduce_wait_s\"] / b[\"train_seconds\"]:.1f} %), '
      f'{b[\"step\"] * 128 / b[\"train_seconds\"]:.0f} samples/s')"
done
fi
if want 3; then
echo "== 3. 1-bit Adam vs Adam (MLP, 2 ranks, 5 epochs, freeze after 1 epoch = 469 steps)"
for o in adam onebit_adam; do
  launch2 $o train.duration=5ep optim.name=$o optim.freeze_step=469
done
py "
r = {o: launched('$D/' + o + '.out') for o in ('adam', 'onebit_adam')}
a, b = r['adam'], r['onebit_adam']
per_a = a['allreduce_bytes'] / a['step']
after = (b['allreduce_bytes'] - 469 * per_a) / (b['step'] - 469)
print(f'Adam: {per_a / 1e3:.1f} kB per step, test accuracy {a[\"test_accuracy\"]:.4f}, {a[\"train_seconds\"]:.1f} s')
print(f'1-bit Adam after the warm-up: {after / 1e3:.1f} kB per step ({per_a / after:.1f}x fewer), test accuracy {b[\"test_accuracy\"]:.4f} '
      f'({100 * (b[\"test_accuracy\"] - a[\"test_accuracy\"]):+.2f} points), {b[\"train_seconds\"]:.1f} s')"
fi
if want 4; then
echo "== 4. gradient compression (MLP, 2 ranks, 3 epochs): fp32 against fp16 on the wire"
for c in none fp16; do
  launch2 c_$c train.duration=3ep distributed.compress=$c
done
py "
r = {c: launched('$D/c_' + c + '.out') for c in ('none', 'fp16')}
for c, b in r.items():
    print(f'{c:>4}: {b[\"allreduce_bytes\"] / b[\"step\"] / 1e3:.0f} kB per step, all-reduce wait {100 * b[\"allreduce_wait_s\"] / b[\"train_seconds\"]:.1f} % of training, '
          f'{b[\"step\"] * 128 / b[\"train_seconds\"]:.0f} samples/s, test accuracy {b[\"test_accuracy\"]:.4f}')
a, b = r['none'], r['fp16']
print(f'fp16/fp32: bytes {b[\"allreduce_bytes\"] / a[\"allreduce_bytes\"]:.2f}x, samples/s {a[\"train_seconds\"] / b[\"train_seconds\"]:.2f}x')"
fi
