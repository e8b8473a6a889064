#!/usr/bin/env bash
# The character-level GPT (configs/text_char_gpt.yaml) side by side with the same model in Python
# PyTorch (scripts/bench/py_gpt.py), in one invocation on the same cores: same initial weights
# (written by Python, loaded with model.init_from), same window order (mltrain's, reproduced in
# Python), same AdamW groups, LR and clipping. Prints tokens/s and their ratios against issue #16's
# targets (>= 8x the idiomatic loop, >= 1.3x the expert loop: threads, fused AdamW, SDPA), both loss curves, and
# the validation loss Python computes from mltrain's final safetensors.
#
#   scripts/bench/gpt_speed.sh            # ~6 minutes on 2 cores
#   STEPS=100 IDIOMATIC_STEPS=8 scripts/bench/gpt_speed.sh
#
# Never part of the test suite: timings belong here, not in tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/apps/mltrain/mltrain ] || bash scripts/build.sh >/dev/null
MLTRAIN=$PWD/build/apps/mltrain/mltrain
PY=.venv/bin/python   # the venv's torch 2.15 (scripts/venv.sh), whatever pyenv says
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
STEPS=${STEPS:-200}
IDIOMATIC_STEPS=${IDIOMATIC_STEPS:-12}
EVERY=4
RETAIN_ENV="MALLOC_MMAP_THRESHOLD_=536870912 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=16777216"

[ -f data/fortunes/train.bin ] || bash scripts/data/fortunes.sh "$MLTRAIN" data/fortunes >&2
echo "== initial weights (Python, seed 0) -> $TMP/init.safetensors" >&2
(cd scripts/bench && $PY py_gpt.py init --out "$TMP/init.safetensors" >&2)

echo "== mltrain: $STEPS steps" >&2
"$MLTRAIN" train configs/text_char_gpt.yaml run.dir="$TMP/runs" run.name=gpt \
  model.init_from="$TMP/init.safetensors" schedule.name=constant schedule.warmup=never \
  train.duration=${STEPS}u train.log_every=${EVERY}u train.eval_every=${STEPS}u \
  checkpoint.every=never train.tensorboard=false >"$TMP/mltrain.log" 2>&1 || { cat "$TMP/mltrain.log"; exit 1; }
run=$TMP/runs/gpt/v0
ck=$(ls -d "$run"/checkpoints/step_* | tail -1)

echo "== Python expert: $STEPS steps" >&2
(cd scripts/bench && env $RETAIN_ENV $PY py_gpt.py train --mode expert --tokens "$PWD/../../data/fortunes/train.bin" \
  --init "$TMP/init.safetensors" --steps "$STEPS" --log-every $EVERY --warmup 4 >"$TMP/expert.json")
echo "== Python idiomatic: $IDIOMATIC_STEPS steps" >&2
(cd scripts/bench && $PY py_gpt.py train --mode idiomatic --tokens "$PWD/../../data/fortunes/train.bin" \
  --init "$TMP/init.safetensors" --steps "$IDIOMATIC_STEPS" --log-every $EVERY --warmup 2 >"$TMP/idiomatic.json")
echo "== Python evaluates mltrain's final weights ($ck/model.safetensors) on the validation split" >&2
(cd scripts/bench && $PY py_gpt.py eval --weights "$ck/model.safetensors" --tokens "$PWD/../../data/fortunes/val.bin" >"$TMP/pyeval.json")

$PY - "$run/metrics.jsonl" "$TMP/expert.json" "$TMP/idiomatic.json" "$TMP/pyeval.json" <<'PYEOF'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in recs if r["event"] == "train"]
ev = [r for r in recs if r["event"] == "eval"][-1]
expert, idiomatic, pyeval = (json.loads(open(p).read().splitlines()[-1]) for p in sys.argv[2:5])
ml_tps = statistics.median(r["tokens_per_s"] for r in train[1:])
print(f"tokens/s  mltrain {ml_tps:,.0f}   python expert {expert['tokens_per_s']:,.0f} ({expert['threads']} threads)   "
      f"python idiomatic {idiomatic['tokens_per_s']:,.0f} ({idiomatic['threads']} threads)")
r_id, r_ex = ml_tps / idiomatic["tokens_per_s"], ml_tps / expert["tokens_per_s"]
print(f"ratio     mltrain / idiomatic {r_id:.2f}x (target >= 8)   mltrain / expert {r_ex:.2f}x (target >= 1.3)")
print(f"\nloss every {train[0]['step']} steps (mean of the window's step losses)")
print(f"{'step':>6} {'mltrain':>9} {'py expert':>10} {'py idiomatic':>13}")
worst = 0.0
for i, r in enumerate(train):
    e = expert["losses"][i] if i < len(expert["losses"]) else None
    d = idiomatic["losses"][i] if i < len(idiomatic["losses"]) else None
    for other in (e, d):
        if other is not None:
            worst = max(worst, abs(other - r["loss"]) / r["loss"])
    fmt = lambda v, w: f"{v:>{w}.5f}" if v is not None else " " * w
    print(f"{r['step']:>6} {r['loss']:>9.5f} {fmt(e, 10)} {fmt(d, 13)}")
print(f"largest relative difference from mltrain's curve: {worst:.2e}")
rel = abs(pyeval["eval_loss"] - ev["loss"]) / ev["loss"]
print(f"\nvalidation loss of mltrain's final weights: mltrain {ev['loss']:.6f}, Python from model.safetensors "
      f"{pyeval['eval_loss']:.6f} (relative difference {rel:.1e}, {pyeval['tokens']} tokens); "
      f"bits/char {ev['bits_per_token']:.4f}")
PYEOF
