#!/usr/bin/env bash
# Sets up (if needed), builds the tests and runs the whole suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
MLTRAIN_TARGETS=all bash scripts/build.sh
bash scripts/check-format.sh      # unformatted C++ fails the suite (.clang-format)
bash scripts/sanitize.sh          # ASan + UBSan build (clang): unit/data tests, each fuzzer 30 s
ctest --test-dir build --output-on-failure -j 2
