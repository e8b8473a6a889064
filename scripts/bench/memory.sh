#!/usr/bin/env bash
# Activation checkpointing (memory.checkpoint) against the same run without it, in one invocation on
# the same cores: peak activation memory of a training step (tensor memory above what is live
# before the step: the counting allocator on the CPU, max_memory_allocated on CUDA) and the median
# step time, for the char-GPT (4 blocks) and the ResNet recipe at ResNet-20 depth (9 blocks). Rounds interleave the settings so drift hits all of
# them; the table prints the median of the rounds and the ratios against issue #18's targets
# (>= 40 % less activation memory at <= 35 % more step time).
#
#   scripts/bench/memory.sh                 # ~4 minutes on 2 cores
#   ROUNDS=1 STEPS=12 scripts/bench/memory.sh
#
# Never part of the test suite: timings belong here, not in tests.
set -euo pipefail
source "$(dirname "$0")/prelude.sh"
[ -x build/mltrain_bench ] || bash scripts/build.sh >/dev/null
BENCH=build/mltrain_bench
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-20}
[ -f data/fortunes/train.bin ] || bash scripts/data/fortunes.sh "$M" data/fortunes >&2

declare -A ARGS
ARGS[gpt]="configs/text_char_gpt.yaml data.batch_size=32"
ARGS[resnet]="configs/fashion_mnist_resnet_recipe.yaml data.batch_size=128 data.workers=1 model.depths=[3,3,3]"
SETTINGS="none blocks every_n"
for r in $(seq "$ROUNDS"); do
  for model in gpt resnet; do
    for s in $SETTINGS; do
      echo "== round $r: $model, memory.checkpoint=$s" >&2
      # shellcheck disable=SC2086
      $BENCH memory ${ARGS[$model]} memory.checkpoint=$s memory.checkpoint_every=2 \
        train.duration=${STEPS}u | grep "^{" | sed "s/^/$model /" >>"$D/results"
    done
  done
done

python3 - "$D/results" <<'PYEOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    model, js = line.split(" ", 1)
    r = json.loads(js)
    rows.setdefault((model, r["checkpoint"]), []).append(r)
print("| model | memory.checkpoint | activation peak MiB | vs none | step ms (median of rounds) | vs none | target |")
print("|---|---|---|---|---|---|---|")
for model in ("gpt", "resnet"):
    base = rows[(model, "none")]
    bm = statistics.median(r["activation_peak_mib"] for r in base)
    bt = statistics.median(r["step_ms_median"] for r in base)
    for s in ("none", "blocks", "every_n"):
        rs = rows[(model, s)]
        m = statistics.median(r["activation_peak_mib"] for r in rs)
        t = statistics.median(r["step_ms_median"] for r in rs)
        spread = max(r["step_ms_median"] for r in rs) - min(r["step_ms_median"] for r in rs)
        ok = "" if s == "none" else ("met" if m <= 0.6 * bm and t <= 1.35 * bt else "missed")
        print(f"| {model} | {s} | {m:.1f} | {m / bm:.2f}x | {t:.1f} (spread {spread:.1f}) | {t / bt:.2f}x | {ok} |")
print(f"\n{len(next(iter(rows.values())))} rounds, device {base[0]['device']}, batch gpt 32 x 128 tokens (4 blocks), resnet 128 (depths [3,3,3]: 9 blocks, the CIFAR ResNet-20 layout; the recipe config has 3)")
PYEOF
