#!/usr/bin/env bash
# What SHA-256 costs mltrain where it hashes: `mltrain data verify` over a chunk set (every chunk
# read and hashed) against coreutils' sha256sum and Python's hashlib (OpenSSL) over the same files,
# and the time one checkpoint adds to a step (weights + Adam state written, fsync'd and hashed for
# the manifest), from runs with checkpoint.every=1u against checkpoint.every=never.
#
#   bash scripts/bench/sha256.sh            # MB=512 ROUNDS=3 STEPS=8
set -euo pipefail
source "$(dirname "$0")/prelude.sh"
MB=${MB:-512}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-8}
PY=.venv/bin/python

# A chunk set of MB MiB of random 28x28 images.
$PY - "$D/x.npy" "$D/y.npy" "$MB" <<'PY'
import sys, numpy as np
n = int(sys.argv[3]) * (1 << 20) // 784
np.save(sys.argv[1], np.random.default_rng(0).integers(0, 256, (n, 28, 28), dtype=np.uint8))
np.save(sys.argv[2], np.random.default_rng(1).integers(0, 10, n, dtype=np.int64))
PY
$M data convert --images "$D/x.npy" --labels "$D/y.npy" -o "$D/set" --chunk-mb 64 >/dev/null
rm -f "$D/x.npy"
cat "$D"/set/chunk-*.bin >/dev/null  # in the page cache for every side

TIMEFORMAT=%R
secs() { { time "$@" >/dev/null 2>&1; } 2>&1 | tail -1; }  # wall seconds of "$@"
best() {  # best of ROUNDS
  local b=999999 t
  for _ in $(seq "$ROUNDS"); do
    t=$(secs "$@")
    b=$(echo "$t $b" | awk '{print ($1 < $2) ? $1 : $2}')
  done
  echo "$b"
}
verify=$(best "$M" data verify "$D/set")
coreutils=$(best sh -c "sha256sum $D/set/chunk-*.bin")
hashlib=$(best "$PY" -c "
import glob, hashlib
for f in sorted(glob.glob('$D/set/chunk-*.bin')):
    h = hashlib.sha256()
    with open(f, 'rb') as r:
        while b := r.read(1 << 20): h.update(b)
")
echo "chunk set: $MB MiB in $(ls "$D"/set/chunk-*.bin | wc -l) chunks, best of $ROUNDS (page cache warm)"
awk -v v="$verify" -v c="$coreutils" -v h="$hashlib" -v mb="$MB" 'BEGIN {
  printf "  mltrain data verify  %6.2f s  %7.0f MB/s\n", v, mb / v
  printf "  sha256sum            %6.2f s  %7.0f MB/s   mltrain / sha256sum: %.2fx the time\n", c, mb / c, v / c
  printf "  python hashlib       %6.2f s  %7.0f MB/s   mltrain / hashlib:   %.2fx the time\n", h, mb / h, v / h }'

# One checkpoint of a 784-4096-4096-10 MLP (20.0 M parameters: 80 MB weights, 160 MB Adam state).
train() {  # run name, checkpoint.every
  "$M" train configs/fashion_mnist_mlp.yaml run.dir="$D/runs" run.name="$1" model.hidden=[4096,4096] \
    data.limit_train=4096 train.duration="${STEPS}u" train.eval_every=never train.final_eval=none \
    checkpoint.every="$2" checkpoint.keep_last=1 runtime.threads=2 train.tensorboard=false
}
with=999999 without=999999
for r in $(seq "$ROUNDS"); do  # interleaved
  a=$(secs train "ck$r" 1u)
  b=$(secs train "no$r" never)
  with=$(echo "$a $with" | awk '{print ($1 < $2) ? $1 : $2}')
  without=$(echo "$b $without" | awk '{print ($1 < $2) ? $1 : $2}')
done
awk -v a="$with" -v b="$without" -v s="$STEPS" 'BEGIN {
  printf "checkpoint of 20.0 M parameters + Adam state: %.3f s each (%d steps: %.2f s with a checkpoint every step, %.2f s without; best of rounds)\n", (a - b) / s, s, a, b }'
