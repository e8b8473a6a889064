#!/usr/bin/env bash
# Issue #17's figures in one invocation: image-folder loader throughput against torchvision's
# ImageFolder + DataLoader, peak RSS of `mltrain train` against the idiomatic PyTorch script (MLP,
# registry CNN, pytorch/examples' CNN as TorchScript), and a chunk set 11x the memory budget
# streamed with flat RSS.
#
#   scripts/bench/users_data.sh     # ~12 minutes on 2 cores; run on an otherwise idle machine
set -euo pipefail
cd "$(dirname "$0")/../.."
echo "=== image folders: decode + augment + batch (scripts/bench/loader_speed.sh)"
bash scripts/bench/loader_speed.sh
echo "=== memory (MEMORY_ONLY=1 scripts/bench/train_speed.sh)"
MEMORY_ONLY=1 bash scripts/bench/train_speed.sh 2>/dev/null
echo "=== a chunk set larger than the memory budget (scripts/bench/chunk_stream.sh)"
bash scripts/bench/chunk_stream.sh
