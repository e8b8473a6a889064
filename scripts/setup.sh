#!/usr/bin/env bash
# One step from a fresh Debian 12 to a built mltrain binary: Debian packages, the venv with the
# torch 2.15 wheel whose LibTorch the build links (PyPI), then build/apps/mltrain/mltrain only
# (scripts/test.sh builds the tests). Each step is idempotent, so re-running is cheap.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/venv.sh
bash scripts/build.sh
