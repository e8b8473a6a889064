#!/usr/bin/env bash
# Sets up (if needed), builds the tests and runs the whole suite through ctest (both tiers:
# `ctest -L quick` and `-L slow`, docs/guide/install.md). Each stage's end is printed with the
# seconds since the start, so a slow CI run shows where its time went.
set -euo pipefail
cd "$(dirname "$0")/.."
done_at() { echo "test.sh: $1 done at ${SECONDS} s"; }
bash scripts/setup.sh
done_at "set-up"
MLTRAIN_TARGETS=all bash scripts/build.sh
done_at "build of the tests"
bash scripts/check-format.sh      # unformatted C++ fails the suite (.clang-format)
bash scripts/sanitize.sh          # ASan + UBSan build (clang): unit/data tests, each fuzzer 30 s
done_at "format check, sanitizers and fuzzers"
ctest --test-dir build --output-on-failure -j 2
done_at "ctest"
