#!/usr/bin/env bash
# transformers' causal LMs exported to .pt2 and trained by mltrain (`model.name: exported`)
# against transformers' own eager loop in PyTorch 2.15 (scripts/bench/py_hf_lm.py), one
# invocation, same model config, batch, window, optimizer (AdamW, lr 1e-4, no decay) and
# threads, on the fortunes byte tokens. A third side is mltrain with model.script_kernels=aten
# (the graph's dropout on ATen's kernel instead of mltrain's). Rounds interleave the sides; the
# table shows medians.
#
#   bash scripts/bench/exported_lm.sh                      # gpt2_tiny llama_tiny gpt2_124m, 2 rounds
#   MODELS="llama_tiny" ROUNDS=1 bash scripts/bench/exported_lm.sh
# Never part of the test suite.
set -euo pipefail
source "$(dirname "$0")/prelude.sh"  # repository root, $M built, scratch $D
ML=$PWD/$M
PY=$PWD/.venv/bin/python
TMP=$D
ROUNDS=${ROUNDS:-2}
MODELS=${MODELS:-"gpt2_tiny llama_tiny gpt2_124m"}
BLOCK=64
[ -f data/fortunes/train.bin ] || bash scripts/data/fortunes.sh "$ML" data/fortunes >&2
steps_of() { case $1 in gpt2_124m) echo 16 ;; *) echo 60 ;; esac; }
batch_of() { case $1 in gpt2_124m) echo 4 ;; *) echo 16 ;; esac; }
: >"$TMP/results.jsonl"
for m in $MODELS; do
  (cd scripts/bench && $PY py_hf_lm.py export --model "$m" --out "$TMP/$m.pt2" --block $BLOCK 2>/dev/null)
done
for r in $(seq "$ROUNDS"); do
  for m in $MODELS; do
    s=$(steps_of "$m"); b=$(batch_of "$m"); warm=$((s / 4))
    for k in 0 1 2; do
      side=$(( (k + r) % 3 ))
      if [ $side != 1 ]; then
        kernels=mltrain; [ $side = 2 ] && kernels=aten
        rm -rf "$TMP/runs"
        $PY -c "import resource,subprocess,sys
r = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=open(sys.argv[1], 'w'))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
sys.exit(r.returncode)" "$TMP/ml.log" "$ML" train configs/text_char_gpt.yaml model.name=exported \
          model.path="$TMP/$m.pt2" model.script_kernels=$kernels model.block_size=$BLOCK data.batch_size="$b" optim.lr=1e-4 \
          optim.weight_decay=0 optim.beta2=0.999 'optim.param_groups=[]' schedule.name=constant schedule.warmup=0u clip.mode=none \
          run.dir="$TMP/runs" run.name=w train.duration="${s}u" train.log_every="${warm}u" train.eval_every=never \
          checkpoint.every=never train.final_eval=none train.tensorboard=false >"$TMP/rss" ||
          { cat "$TMP/ml.log" >&2; exit 1; }
        $PY - "$TMP/runs/w/v0/metrics.jsonl" $((b * BLOCK)) "$(cat "$TMP/rss")" "$m" "$kernels" >>"$TMP/results.jsonl" <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = [x for x in recs if x["event"] == "train"]
summ = [x for x in recs if x["event"] == "summary"][-1]
a, b = train[0], train[-1]
rate = (b["step"] - a["step"]) * int(sys.argv[2]) / (b["time_s"] - a["time_s"])
print(json.dumps({"model": sys.argv[4], "side": "mltrain" if sys.argv[5] == "mltrain" else "aten", "rate": rate, "first_step_s": summ.get("first_step_s"), "rss_mib": float(sys.argv[3])}))
PYEOF
      else
        out=$(cd scripts/bench && MALLOC_MMAP_THRESHOLD_=536870912 MALLOC_TRIM_THRESHOLD_=1073741824 \
          $PY py_hf_lm.py train --model "$m" --tokens "$PWD/../../data/fortunes/train.bin" --block $BLOCK \
          --batch "$b" --steps "$s" --warmup "$warm" 2>/dev/null | tail -1)
        $PY -c "import json,sys; o=json.loads(sys.argv[1]); print(json.dumps({'model': sys.argv[2], 'side': 'eager', 'rate': o['tokens_per_s'], 'first_step_s': o['first_step_s'], 'rss_mib': o['peak_rss_mib']}))" "$out" "$m" >>"$TMP/results.jsonl"
      fi
      tail -1 "$TMP/results.jsonl" >&2
    done
  done
done
$PY - "$TMP/results.jsonl" "$(nproc)" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs)
print(f"transformers LMs as .pt2 in mltrain vs transformers' eager loop, {sys.argv[2]} threads, medians; tokens/s")
print(f"{'model':<12}{'mltrain':>10}{'eager':>10}{'ratio':>8}   {'first step s (ml / eager)':>26}   {'peak RSS MiB (ml / eager)':>26}"
      f"   {'script_kernels=aten':>20}{'ml / aten':>10}")
for m in dict.fromkeys(x["model"] for x in rows):
    g = {s: [x for x in rows if x["model"] == m and x["side"] == s] for s in ("mltrain", "eager", "aten")}
    r = {s: med([x["rate"] for x in g[s]]) for s in g}
    f = {s: med([x["first_step_s"] for x in g[s]]) for s in g}
    rss = {s: med([x["rss_mib"] for x in g[s]]) for s in g}
    print(f"{m:<12}{r['mltrain']:>10.0f}{r['eager']:>10.0f}{r['mltrain'] / r['eager']:>8.2f}   {f['mltrain']:>12.2f} / {f['eager']:<11.2f}   {rss['mltrain']:>12.0f} / {rss['eager']:<11.0f}"
          f"   {r['aten']:>20.0f}{r['mltrain'] / r['aten']:>10.2f}")
PYEOF
