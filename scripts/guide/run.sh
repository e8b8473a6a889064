#!/usr/bin/env bash
# The field guide's claims measured here (docs/FIELD_GUIDE.md): every row in one command.
#   bash scripts/guide/run.sh [--rows init,momentum,smoothing] [--seeds 3]   # all rows: ~40 min
#   bash scripts/guide/run.sh --quick                                         # CI: ~25 s
# The fuse and onebit rows run the project's benchmarks (scripts/bench/fuse_speed.sh, section 3
# of scripts/bench/ddp.sh); --quick leaves them to their ctest tests.
set -euo pipefail
source "$(dirname "$0")/../bench/prelude.sh"
# ctest passes the binary it built; a copy, so a rebuild during a long run cannot swap it
cp "${MLTRAIN_BIN:-$M}" "$D/mltrain"
.venv/bin/python scripts/guide/verdicts.py "$D/mltrain" "$D" "$@"
