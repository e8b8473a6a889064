#!/usr/bin/env bash
# Streaming a chunk set several times larger than the memory budget: Fashion-MNIST's PNG folder
# converted once to 64x64 RGB raw records (~740 MB of chunks), then one epoch of the MLP with
# data.memory_budget_mb=64. The train records' rss_mib (VmRSS, mapped chunk pages included) must
# stay flat while the loader walks every chunk; printed beside the set's size and the budget.
#
#   scripts/bench/chunk_stream.sh           # ~4 minutes on 2 cores (conversion included)
#
# Never part of the test suite (the bounded window itself is tested in test_data's RSS case).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/apps/mltrain/mltrain ] || bash scripts/build.sh >/dev/null
ML=build/apps/mltrain/mltrain
PY=.venv/bin/python
TMP=${CHUNK_DIR:-$(mktemp -d)}
[ -n "${CHUNK_DIR:-}" ] || trap 'rm -rf "$TMP"' EXIT
BUDGET=${BUDGET_MB:-64}
$PY scripts/data/fmnist_images.py --formats png >/dev/null
for split in train test; do
  [ -f "$TMP/$split/index.json" ] ||
    $ML data convert data/fmnist_png/$split -o "$TMP/$split" --size 64 --mode rgb --store raw \
      --chunk-mb 16 >/dev/null
done
rm -rf "$TMP/runs"
set_mib=$(du -sm "$TMP/train" | cut -f1)
$ML train configs/fashion_mnist_mlp.yaml data.dataset=files data.train_images="$TMP/train" \
  data.test_images="$TMP/test" data.memory_budget_mb=$BUDGET data.shuffle_window=1 \
  data.workers=2 train.duration=1ep train.log_every=20u train.eval_every=never \
  checkpoint.every=never optim.lr=0.0002 run.dir="$TMP/runs" run.name=stream >/dev/null 2>"$TMP/train.log"
$PY - "$TMP"/runs/stream/v0/metrics.jsonl "$set_mib" "$BUDGET" <<'PYEOF'
import json, sys
recs = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "train"]
rss = [r["rss_mib"] for r in recs]
set_mib, budget = float(sys.argv[2]), float(sys.argv[3])
print(f"chunk set {set_mib:.0f} MiB, data.memory_budget_mb {budget:.0f} ({set_mib / budget:.1f}x the budget)")
print("step   rss_mib")
for r in recs[:: max(1, len(recs) // 8)] + recs[-1:]:
    print(f"{r['step']:5d}  {r['rss_mib']:8.1f}")
first, peak = rss[0], max(rss)
print(f"RSS at step {recs[0]['step']}: {first:.1f} MiB; peak over the epoch {peak:.1f} MiB; "
      f"growth {peak - first:.1f} MiB (budget {budget:.0f} MiB, set {set_mib:.0f} MiB)")
print("verdict:", "flat (growth below the budget)" if peak - first < budget else "GROWS")
PYEOF
