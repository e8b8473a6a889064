#!/usr/bin/env bash
# The field guide's claims measured here (docs/FIELD_GUIDE.md): every row in one command.
#   bash scripts/guide/run.sh [--rows init,momentum,smoothing] [--seeds 3]   # ~6 min on 2 cores
#   bash scripts/guide/run.sh --quick                                         # CI: ~15 s
# Rows measured by the project's benchmarks (conv-BN fusion: scripts/bench/fuse_speed.sh; 1-bit
# Adam: scripts/bench/ddp.sh) are run by those scripts, cited in docs/FIELD_GUIDE.md.
set -euo pipefail
source "$(dirname "$0")/../bench/prelude.sh"
# ctest passes the binary it built; a copy, so a rebuild during a long run cannot swap it
cp "${MLTRAIN_BIN:-$M}" "$D/mltrain"
/usr/bin/python3 scripts/guide/verdicts.py "$D/mltrain" "$D" "$@"
