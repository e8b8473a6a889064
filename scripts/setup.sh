#!/usr/bin/env bash
# One step from a fresh Debian 12 to a built mltrain: system packages, then the build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
