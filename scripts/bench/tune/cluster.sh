#!/usr/bin/env bash
# Issue #20: tuning on a cluster. Parallel suggestions, GP cost, pruning and several objectives,
# mltrain tune against Debian's Optuna 3.1 in one invocation (see cluster.py for each table).
#   bash scripts/bench/tune/cluster.sh [--parts parallel,gpcost,pruning,real,mo] [--seeds 10] [--quick]
set -euo pipefail
source "$(dirname "$0")/../prelude.sh"
# A copy of the binary: a rebuild during the (long) run cannot swap it under the studies.
cp "$M" "$D/mltrain"
.venv/bin/python scripts/bench/tune/cluster.py "$D/mltrain" "$D" "$@"
