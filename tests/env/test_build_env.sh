#!/usr/bin/env bash
# Bad build environments stop configure with one "mltrain: error:" line naming what was found,
# what is needed and the fix, exit 2 (scripts/build.sh); a machine without nvcc configures the
# CPU-only binary with a one-line notice. Each case configures a scratch build folder against a
# fake torch folder or a fake nvcc; nothing is compiled.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
real_root=$(ls -d "$src"/.venv/lib/python3*/site-packages/torch | head -1)
fails=0 passes=0
# expect NAME CODE PATTERN -- build.sh arguments: the exit code, exactly one stderr line, the pattern.
expect() {
  local name=$1 code=$2 pattern=$3
  shift 4
  local err rc
  err=$(cd "$src" && MLTRAIN_BUILD_DIR="$tmp/b-$name" MLTRAIN_TARGETS=help bash scripts/build.sh "$@" 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" -eq "$code" ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] && [[ "$err" == *$pattern* ]]; then
    passes=$((passes + 1))
  else
    fails=$((fails + 1))
    printf 'FAIL %s: exit %s (want %s), stderr:\n%s\n' "$name" "$rc" "$code" "$err"
  fi
}
# 1. No torch where the build looks.
expect missing 2 "mltrain: error: $tmp/none is not a torch wheel with LibTorch" -- -DMLTRAIN_TORCH_ROOT="$tmp/none"
# 2. A torch of another series (its version.py says so).
mkdir -p "$tmp/old/share/cmake/Torch"
touch "$tmp/old/share/cmake/Torch/TorchConfig.cmake"
printf "__version__ = '2.9.1+cu128'\ncuda = '12.8'\n" >"$tmp/old/version.py"
expect old 2 "mltrain: error: torch 2.9.1+cu128 in $tmp/old; need 2.15.x (fix: bash scripts/venv.sh" -- -DMLTRAIN_TORCH_ROOT="$tmp/old"
# 3. An nvcc whose major version is not the wheel's.
printf '#!/bin/sh\necho "Cuda compilation tools, release 12.4, V12.4.131"\n' >"$tmp/nvcc"
chmod +x "$tmp/nvcc"
expect nvcc 2 "mltrain: error: nvcc 12.4 ($tmp/nvcc) does not match the torch wheel's CUDA 13." -- \
  -DMLTRAIN_TORCH_ROOT="$real_root" -DMLTRAIN_NVCC="$tmp/nvcc"
# 4. CUDA demanded from a machine without nvcc.
expect cuda_on 2 "mltrain: error: no nvcc found, and MLTRAIN_WITH_CUDA=ON" -- \
  -DMLTRAIN_TORCH_ROOT="$real_root" -DMLTRAIN_NVCC="$tmp/no-nvcc" -DMLTRAIN_WITH_CUDA=ON
# 5. No nvcc: the CPU-only binary, configured, with one notice line.
expect no_nvcc 0 "mltrain: no nvcc found: building the CPU-only binary" -- \
  -DMLTRAIN_TORCH_ROOT="$real_root" -DMLTRAIN_NVCC="$tmp/no-nvcc"
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
