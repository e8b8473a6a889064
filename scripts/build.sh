#!/usr/bin/env bash
# Configures and builds mltrain (and its tests) into build/. Safe to re-run: incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs"
