#!/usr/bin/env bash
# Configures build/ against the venv's LibTorch (third_party/torch.cmake) and builds the targets
# named in $MLTRAIN_TARGETS (default: the mltrain binary; scripts/test.sh builds everything).
# Extra arguments go to cmake. Safe to re-run: incremental.
#
#   scripts/build.sh                               # build/apps/mltrain/mltrain
#   MLTRAIN_TARGETS=all scripts/build.sh           # and the tests, benches
#   scripts/build.sh -DMLTRAIN_WITH_CUDA=OFF       # the CPU-only binary
#   MLTRAIN_BUILD_DIR=build-cpu scripts/build.sh   # another build folder
#   MLTRAIN_WERROR=1 scripts/build.sh              # warnings are errors (what CI builds with)
#
# A bad environment (no venv, torch of another version, nvcc that does not match the wheel)
# prints one "mltrain: error:" line naming the fix and exits 2.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
dir=${MLTRAIN_BUILD_DIR:-build}
werror=()
[ "${MLTRAIN_WERROR:-0}" = 1 ] && werror=(-DMLTRAIN_WERROR=ON)  # .ci/run: any warning fails
if ! cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${werror[@]}" "$@" >"$log" 2>&1; then
  line=$(grep -m1 "^mltrain: error: " "$log" || true)
  if [ -n "$line" ]; then
    echo "$line" >&2
    exit 2
  fi
  cat "$log" >&2
  exit 1
fi
grep "^mltrain: " "$log" >&2 || true  # notices (e.g. no nvcc: CPU-only binary)
# shellcheck disable=SC2086
cmake --build "$dir" -j "$jobs" --target ${MLTRAIN_TARGETS:-mltrain}
