#!/usr/bin/env bash
# The cold build of the mltrain binary (what scripts/setup.sh does on a fresh machine, the bulk of
# its time), one translation unit per source (-DMLTRAIN_UNITY=OFF) against the unity build of the
# engine rooms and the binary (batches of UNITY_BATCH sources compiled as one, the default),
# ccache off, in scratch folders, in one invocation.
#
#   bash scripts/bench/build_time.sh            # UNITY_BATCH=16; two cold builds, ~15 min on 2 cores
set -euo pipefail
cd "$(dirname "$0")/../.."
BATCH=${UNITY_BATCH:-16}
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
export CCACHE_DISABLE=1
TIMEFORMAT=%R
build() {  # folder, extra cmake flags...
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  { time cmake --build "$dir" -j "$(nproc)" --target mltrain >/dev/null; } 2>&1 | tail -1
}
plain=$(build "$D/plain" -DMLTRAIN_UNITY=OFF)
unity=$(build "$D/unity" -DMLTRAIN_UNITY=ON -DMLTRAIN_UNITY_BATCH="$BATCH")
awk -v p="$plain" -v u="$unity" -v b="$BATCH" -v n="$(nproc)" 'BEGIN {
  printf "cold build of build/apps/mltrain/mltrain, %d cores, ccache off\n", n
  printf "  one unit per source      %6.0f s\n", p
  printf "  unity, batches of %-3d   %6.0f s   %.2fx the time\n", b, u, u / p }'
