#!/usr/bin/env bash
# The sanitizer build: mltrain's own code under AddressSanitizer + UndefinedBehaviorSanitizer
# (clang; LibTorch and the system libraries uninstrumented), in build-san/, with the libFuzzer
# targets. Runs the unit tests of the rooms that read users' files and settings (test_config,
# test_data with the image, CSV and chunk readers, test_dist), then every fuzzer for FUZZ_SECONDS
# (30). test_engine and test_tune are not run here: they need the whole engine and the binary
# compiled a second time with instrumentation (~20 more minutes on 2 cores).
#
#   scripts/sanitize.sh                   # configure, build, run the sanitized tests and fuzzers
#   scripts/sanitize.sh --configure-only  # what scripts/fuzz.sh calls first
#   FUZZ_SECONDS=0 scripts/sanitize.sh    # the tests only
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build-san/build.ninja ]; then
  CC=clang CXX=clang++ cmake -S . -B build-san -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMLTRAIN_FUZZ=ON -DMLTRAIN_BUILD_BENCH=OFF -DMLTRAIN_WITH_CUDA=OFF > /dev/null
fi
[ "${1:-}" = "--configure-only" ] && exit 0
tests=(test_config test_data test_dist)
cmake --build build-san --target "${tests[@]}" fuzzers -j "$(nproc)"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
for t in "${tests[@]}"; do
  echo "sanitize: $t (ASan + UBSan)"
  build-san/tests/$t | tail -2
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "sanitize: $t FAILED"; exit 1; }
done
seconds=${FUZZ_SECONDS:-30}
if [ "$seconds" -gt 0 ]; then
  FUZZ_SEED=${FUZZ_SEED:-1} bash scripts/fuzz.sh -t "$seconds" -j "$(nproc)"
fi
