#!/usr/bin/env bash
# mltrain against the PyTorch users pick today (the venv's 2.15: MKL, oneDNN, inductor), in one
# invocation on the same cores: every workload of issue #41 trained by `mltrain train` and by three
# Python loops (scripts/bench/py_train.py, py_gpt.py): idiomatic (Dataset + DataLoader, eager),
# expert eager (preloaded tensors, threads, allocator, channels-last, fused optimizers) and expert
# compiled (torch.compile, inductor). Same model, optimizer, batch, data, threads and precision.
# Rounds are interleaved (the order of the sides rotates each round) and the table shows medians.
#
#   scripts/bench/modern_speed.sh                 # 3 rounds, ~45 minutes on 2 cores
#   ROUNDS=1 QUICK=1 scripts/bench/modern_speed.sh
#   WORKLOADS="cnn gpt2" scripts/bench/modern_speed.sh
#   RESULTS=out.jsonl scripts/bench/modern_speed.sh   # keep every measurement
#   WORKLOADS="tv_resnet18 ex_tv_resnet18" ...      # ex_<w>: <w> as a torch.export .pt2 (mltrain
#                                                   # side only; compared with <w>'s Python sides
#                                                   # and its TorchScript run); exa_<w>: the
#                                                   # same with model.script_kernels=aten (the
#                                                   # graph's operators as exported); exb_<w>:
#                                                   # model.fused_batchnorm=false (mltrain's
#                                                   # dropout and pool, ATen's BatchNorm);
#                                                   # exc_<w>: model.conv1x1_as_linear=false
#
# Columns: steady-state samples/s (tokens/s for the GPTs) of each side and mltrain's ratio to it;
# time from exec to the end of the first optimizer step (mltrain's first_step_s; Python's import,
# data preparation and, compiled, compile time); peak RSS. Then the GEMM ceiling at GPT-2's shapes
# (oneDNN sgemm, the route mltrain takes) against GPT-2's achieved FLOP/s.
# Never part of the test suite: timings belong here, not in tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/apps/mltrain/mltrain ] && [ -x build/mltrain_bench ] || MLTRAIN_TARGETS=all bash scripts/build.sh >/dev/null
ML=$PWD/build/apps/mltrain/mltrain
PY=$PWD/.venv/bin/python   # the venv's torch 2.15 (scripts/venv.sh), whatever pyenv says
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
ROUNDS=${ROUNDS:-3}
Q=${QUICK:-0}
WORKLOADS=${WORKLOADS:-"mlp cnn examples_cnn resnet char_gpt gpt2 tv_resnet18 tv_mobilenet_v3_small"}
RESULTS=${RESULTS:-$TMP/results.jsonl}
: >"$RESULTS"
THREADS=$(nproc)
export OMP_NUM_THREADS=$THREADS
# glibc tunables equivalent to mltrain's "retain" allocator policy, for the expert Python loops.
RETAIN_ENV="MALLOC_MMAP_THRESHOLD_=536870912 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=16777216"

echo "== data and models (once)" >&2
[ -f data/fortunes/train.bin ] || bash scripts/data/fortunes.sh "$ML" data/fortunes >&2
$PY scripts/bench/fmnist_npy.py "$TMP"
# The image folder for the users' models: Fashion-MNIST's PNGs (10,000 of each split's first
# images), read at 32 x 32 RGB by both sides.
$PY scripts/data/fmnist_images.py --out "$TMP" --limit 10000 --formats png >&2
for m in examples_cnn tv_resnet18 tv_mobilenet_v3_small tv_efficientnet_b0; do
  [ $m != tv_efficientnet_b0 ] || [[ " $WORKLOADS " == *"_efficientnet_b0 "* ]] || continue  # on request
  (cd scripts/bench && $PY py_train.py --model $m --save-script "$TMP/$m.pt" 2>/dev/null)
done
for m in examples_cnn tv_resnet18 tv_mobilenet_v3_small tv_efficientnet_b0; do  # the same models as model.name: exported
  if [[ " $WORKLOADS " =~ " "ex[abc]?_$m" " ]]; then
    (cd scripts/bench && $PY py_train.py --model $m --save-export "$TMP/$m.pt2" 2>/dev/null)
    # What a Python user pays before a step of the same program: import torch, torch.export.load.
    $PY -c "import time; t = time.time(); import torch; a = time.time() - t; m = torch.export.load('$TMP/$m.pt2').module(); print(f'python: import torch {a:.2f} s, torch.export.load + module() {time.time() - t - a:.2f} s ($m.pt2)')" 2>/dev/null | tee -a "$TMP/export_load.txt" >&2
  fi
done
(cd scripts/bench && $PY py_gpt.py init --out "$TMP/char_gpt.safetensors" >&2 &&
  $PY py_gpt.py init --out "$TMP/gpt2.safetensors" --n-layer 12 --n-head 12 --n-embd 768 \
    --block-size 64 --vocab 50257 >&2)
GPT2_ARGS="--n-layer 12 --n-head 12 --n-embd 768 --block-size 64 --vocab 50257 --batch 4 --lr 1e-4 --weight-decay 0 --beta2 0.999 --clip 0"

# Per workload: mltrain's config and overrides, the Python script's arguments, steps, units per step.
steps_of() {
  local s
  case $1 in
    mlp) s=600 ;; cnn | *examples_cnn | resnet) s=150 ;; char_gpt) s=60 ;; gpt2) s=24 ;; *) s=60 ;;
  esac
  [ "$Q" = 1 ] && s=$((s / 2))
  echo $s
}
ml_args() {
  # The image folder decoded once at load (data.image.cache=memory), as the expert loop preloads it.
  local folder="data.dataset=files data.format=image_folder data.train_images=$TMP/fmnist_png/train \
    data.test_images=$TMP/fmnist_png/test data.image.size=32 data.image.mode=rgb data.image.cache=memory \
    model.name=torchscript"
  case $1 in
    mlp | cnn) echo "configs/fashion_mnist_$1.yaml" ;;
    examples_cnn) echo "configs/fashion_mnist_cnn.yaml model.name=torchscript model.path=$TMP/examples_cnn.pt" ;;
    resnet) echo "configs/fashion_mnist_resnet_recipe.yaml data.augment.crop.p=0 data.augment.flip.p=0 data.augment.erase.p=0" ;;
    char_gpt) echo "configs/text_char_gpt.yaml model.init_from=$TMP/char_gpt.safetensors" ;;
    gpt2) echo "configs/gpt2_124m.yaml model.init_from=$TMP/gpt2.safetensors" ;;
    tv_*) echo "configs/fmnist_png_folder.yaml $folder model.path=$TMP/$1.pt" ;;
    ex_examples_cnn) echo "configs/fashion_mnist_cnn.yaml model.name=exported model.path=$TMP/examples_cnn.pt2" ;;
    ex_*) echo "configs/fmnist_png_folder.yaml $folder model.name=exported model.path=$TMP/${1#ex_}.pt2" ;;
    exa_*) echo "$(ml_args "ex_${1#exa_}") model.script_kernels=aten" ;;
    exb_*) echo "$(ml_args "ex_${1#exb_}") model.fused_batchnorm=false" ;;
    exc_*) echo "$(ml_args "ex_${1#exc_}") model.conv1x1_as_linear=false" ;;
  esac
}
units_per_step() {
  case $1 in char_gpt) echo $((32 * 128)) ;; gpt2) echo $((4 * 64)) ;; *) echo 128 ;; esac
}


run_mltrain() {  # workload round
  local w=$1 r=$2 s u dir
  s=$(steps_of "$w"); u=$(units_per_step "$w"); dir=$TMP/runs
  rm -rf "$dir"
  # shellcheck disable=SC2046
  $PY -c "import resource,subprocess,sys
r = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=open(sys.argv[1], 'w'))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
sys.exit(r.returncode)" "$TMP/ml.log" "$ML" train $(ml_args "$w") run.dir="$dir" run.name=w \
    train.duration=${s}u train.log_every=$((s / 6))u train.eval_every=never checkpoint.every=never \
    train.final_eval=none train.tensorboard=false >"$TMP/rss" || { cat "$TMP/ml.log" >&2; exit 1; }
  $PY - "$dir/w/v0/metrics.jsonl" "$u" "$(cat "$TMP/rss")" "$w" "$r" >>"$RESULTS" <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = [x for x in recs if x["event"] == "train"]
summ = [x for x in recs if x["event"] == "summary"][-1]
a, b = train[0], train[-1]  # the first window is warm-up
rate = (b["step"] - a["step"]) * int(sys.argv[2]) / (b["time_s"] - a["time_s"])
print(json.dumps({"workload": sys.argv[4], "side": "mltrain", "round": int(sys.argv[5]), "rate": rate,
                  "first_step_s": summ.get("first_step_s"), "warmup_s": a["time_s"], "rss_mib": float(sys.argv[3])}))
PYEOF
}

run_python() {  # workload side round
  local w=$1 side=$2 r=$3 s warm env=""
  s=$(steps_of "$w"); warm=$((s / 6))
  [ "$side" != idiomatic ] && env=$RETAIN_ENV
  # Compiled: a cold inductor cache per run, as a user's first run of a script sees it.
  [ "$side" = compiled ] && warm=$((warm < 5 ? 5 : warm)) && env="$env TORCHINDUCTOR_CACHE_DIR=$TMP/inductor_${w}_$r"
  if [ "$side" = idiomatic ] && [ "$w" != gpt2 ]; then s=$((s / 2)); warm=$((warm / 2)); fi
  [ $((s - warm)) -lt 4 ] && s=$((warm + 4))
  local out
  case $w in
    char_gpt | gpt2)
      local extra=""; [ "$w" = gpt2 ] && extra=$GPT2_ARGS
      # shellcheck disable=SC2086
      out=$(cd scripts/bench && env $env $PY py_gpt.py train --mode "$side" --tokens "$PWD/../../data/fortunes/train.bin" \
        --init "$TMP/$w.safetensors" --steps "$s" --warmup "$warm" $extra 2>"$TMP/py.log" | tail -1) ;;
    tv_*)
      out=$(cd scripts/bench && env $env $PY py_train.py --model "$w" --mode "$side" --folder "$TMP/fmnist_png/train" \
        --steps "$s" --warmup "$warm" 2>"$TMP/py.log" | tail -1) ;;
    *)
      local amp=fp32; [ "$w" = resnet ] && amp=bf16
      # shellcheck disable=SC2086
      out=$(cd scripts/bench && env $env $PY py_train.py --model "$w" --mode "$side" --images "$TMP/images.npy" \
        --labels "$TMP/labels.npy" --amp $amp --steps "$s" --warmup "$warm" 2>"$TMP/py.log" | tail -1) ;;
  esac
  [ -n "$out" ] || { cat "$TMP/py.log" >&2; exit 1; }
  $PY -c "import json,sys
o = json.loads(sys.argv[1])
print(json.dumps({'workload': sys.argv[2], 'side': sys.argv[3], 'round': int(sys.argv[4]),
  'rate': o.get('tokens_per_s', o.get('samples_per_s')), 'first_step_s': o['first_step_s'],
  'warmup_s': o['warmup_s'], 'rss_mib': o['peak_rss_mib']}))" "$out" "$w" "$side" "$r" >>"$RESULTS"
}

SIDES=(mltrain idiomatic expert compiled)
for r in $(seq "$ROUNDS"); do
  for w in $WORKLOADS; do
    for k in 0 1 2 3; do
      side=${SIDES[$(((k + r - 1) % 4))]}
      [[ $w =~ ^ex[abc]?_ ]] && [ $side != mltrain ] && continue  # its Python sides are ${w#ex*_}'s
      echo "== round $r/$ROUNDS: $w, $side" >&2
      if [ "$side" = mltrain ]; then run_mltrain "$w" "$r"; else run_python "$w" "$side" "$r"; fi
      tail -1 "$RESULTS" >&2
    done
  done
done

# GPT-2 124M's first 10 steps from the same weights and batches: mltrain's per-step losses against
# the expert Python loop's (target: within 1e-3).
if [[ " $WORKLOADS " == *" gpt2 "* ]]; then
  echo "== GPT-2 124M: the first 10 losses, mltrain vs PyTorch eager, same weights and batches" >&2
  rm -rf "$TMP/runs"
  # shellcheck disable=SC2046
  "$ML" train $(ml_args gpt2) run.dir="$TMP/runs" run.name=loss train.duration=10u train.log_every=1u \
    train.final_eval=none checkpoint.every=never train.tensorboard=false >"$TMP/ml.log" 2>&1 ||
    { cat "$TMP/ml.log" >&2; exit 1; }
  # shellcheck disable=SC2086
  (cd scripts/bench && env $RETAIN_ENV $PY py_gpt.py train --mode expert --tokens "$PWD/../../data/fortunes/train.bin" \
    --init "$TMP/gpt2.safetensors" --steps 10 --warmup 1 $GPT2_ARGS 2>/dev/null | tail -1) >"$TMP/loss.json"
  $PY - "$TMP/runs/loss/v0/metrics.jsonl" "$TMP/loss.json" >"$TMP/loss.txt" <<'PYEOF'
import json, sys
ml = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"event":"train"' in l]
py = json.load(open(sys.argv[2]))["step_losses"]
worst = max(abs(a - b) for a, b in zip(ml, py))
print("GPT-2 124M first 10 step losses (mltrain / PyTorch eager): " +
      ", ".join(f"{a:.4f}/{b:.4f}" for a, b in zip(ml, py)))
print(f"largest difference {worst:.1e} (target <= 1e-3)")
PYEOF
fi

echo "== GEMM ceiling at GPT-2 124M's shapes (B*T = 256 rows; forward, input-gradient and weight-gradient products)" >&2
shapes=""
for io in 768x2304 768x768 768x3072 3072x768 768x50257; do
  i=${io%x*}; o=${io#*x}
  shapes="$shapes 256x${i}x${o} 256x${o}x${i} ${i}x256x${o}"
done
# shellcheck disable=SC2086
build/mltrain_bench gemm onednn "$THREADS" $shapes >"$TMP/gemm.jsonl"

$PY - "$RESULTS" "$TMP/gemm.jsonl" "$THREADS" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
if not rows:
    sys.exit(0)
gemm = [json.loads(l) for l in open(sys.argv[2])]
med = lambda xs: statistics.median(xs) if xs else float("nan")
by = {}
for x in rows:
    by.setdefault((x["workload"], x["side"]), []).append(x)
# ex_<w>: the exported program's mltrain run against <w>'s Python loops, which trained the same
# model; <w>'s own mltrain run is the TorchScript path.
exported = lambda w: w.startswith(("ex_", "exa_", "exb_", "exc_"))
for (w, s), xs in list(by.items()):
    if exported(w) and s == "mltrain":
        base = w.split("_", 1)[1]
        for side in ("idiomatic", "expert", "compiled"):
            by[(w, side)] = by.get((base, side), [])
        by[(w, "torchscript")] = by.get((base, "mltrain"), [])
work = list(dict.fromkeys(x["workload"] for x in rows))
sides = ["idiomatic", "expert", "compiled"]
rounds = max(x["round"] for x in rows)
print(f"\nmltrain vs PyTorch 2.15, {sys.argv[3]} threads each, medians of {rounds} round(s); rate = samples/s (tokens/s for the GPTs)")
print(f"{'workload':<22}{'mltrain':>9}{'idiomatic':>10}{'expert':>9}{'compiled':>9}  {'x idiom':>7}{'x expert':>9}{'x compiled':>11}  "
      f"{'first step s: ml / idiom / expert / compiled':>46}  {'peak RSS MiB: ml / idiom / expert / compiled':>46}")
for w in work:
    rate = {s: med([x["rate"] for x in by.get((w, s), [])]) for s in ["mltrain"] + sides}
    first = {s: med([x["first_step_s"] for x in by.get((w, s), []) if x["first_step_s"] is not None]) for s in ["mltrain"] + sides}
    rss = {s: med([x["rss_mib"] for x in by.get((w, s), [])]) for s in ["mltrain"] + sides}
    ratios = [rate["mltrain"] / rate[s] for s in sides]
    # Per-round ratios: the same round's runs saw the same machine state.
    lo_hi = []
    for s in sides:
        rr = [m["rate"] / p["rate"] for m in by.get((w, "mltrain"), []) for p in by.get((w, s), []) if m["round"] == p["round"]]
        lo_hi.append(f"{min(rr):.2f}-{max(rr):.2f}" if rr else "-")
    print(f"{w:<22}{rate['mltrain']:>9.0f}{rate['idiomatic']:>10.0f}{rate['expert']:>9.0f}{rate['compiled']:>9.0f}  "
          f"{ratios[0]:>7.2f}{ratios[1]:>9.2f}{ratios[2]:>11.2f}  "
          f"{' / '.join(f'{first[s]:.2f}' for s in ['mltrain'] + sides):>46}  {' / '.join(f'{rss[s]:.0f}' for s in ['mltrain'] + sides):>46}")
    print(f"{'':<22}{'per-round ratio ranges (idiom, expert, compiled):':>49} {', '.join(lo_hi)}")
    if exported(w) and by.get((w, "torchscript")):
        ts = med([x["rate"] for x in by[(w, "torchscript")]])
        print(f"{'':<22}exported .pt2 vs the TorchScript path on the same model: {rate['mltrain']:.0f} / {ts:.0f} = {rate['mltrain'] / ts:.2f}x")
    for other, what in (("exa_", "mltrain's kernels vs the graph's ATen operators (script_kernels=aten)"),
                        ("exb_", "fused BatchNorm vs ATen's BatchNorm (fused_batchnorm=false)"),
                        ("exc_", "1x1 convolutions on 1x1 inputs as linear vs conv2d (conv1x1_as_linear=false)")):
        if w.startswith("ex_") and by.get((other + w[3:], "mltrain")):
            o = by[(other + w[3:], "mltrain")]
            a = med([x["rate"] for x in o])
            rr = [m["rate"] / p["rate"] for m in by[(w, "mltrain")] for p in o if m["round"] == p["round"]]
            print(f"{'':<22}{what}: {rate['mltrain']:.0f} / {a:.0f} = "
                  f"{rate['mltrain'] / a:.2f}x (per round {min(rr):.2f}-{max(rr):.2f})")
import os
load_txt = os.path.join(os.path.dirname(sys.argv[2]), "export_load.txt")  # beside gemm.jsonl, in $TMP
if os.path.exists(load_txt):
    print("\n" + open(load_txt).read().strip())
compile_s = {w: med([x["warmup_s"] for x in by.get((w, "compiled"), [])]) for w in work if not exported(w)}
print("\ncompiled side's warm-up (compile + first steps, s): " + ", ".join(f"{w} {v:.0f}" for w, v in compile_s.items()))
print("targets (issue #41): x expert >= 1.25, x compiled >= 1.0, RSS <= idiomatic, first step <= 0.5 s (MLP, CNN), <= 1 s (GPT-2)")

# GPT-2 124M: achieved FLOP/s against the sgemm ceiling at its shapes (time-weighted over the shapes).
flops = sum(2 * g["m"] * g["k"] * g["n"] for g in gemm)
secs = sum(2 * g["m"] * g["k"] * g["n"] / (g["gflops"] * 1e9) for g in gemm)
ceiling = flops / secs / 1e9
print(f"\nsgemm (oneDNN) at GPT-2's shapes: {ceiling:.0f} GFLOP/s time-weighted; per shape: " +
      ", ".join(f"{g['m']}x{g['k']}x{g['n']} {g['gflops']:.0f}" for g in gemm))
if ("gpt2", "mltrain") in by:
    L, C, T, V = 12, 768, 64, 50257
    params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    per_token = 6 * params + 12 * L * C * T  # training FLOPs per token: 6N plus attention (PaLM's count)
    for s in ["mltrain", "expert", "compiled"]:
        tps = med([x["rate"] for x in by.get(("gpt2", s), [])])
        print(f"GPT-2 124M {s}: {tps:.0f} tokens/s = {tps * per_token / 1e9:.0f} GFLOP/s = "
              f"{100 * tps * per_token / 1e9 / ceiling:.0f} % of the ceiling (target for mltrain: >= 80 %)")
PYEOF
[ -f "$TMP/loss.txt" ] && { echo; cat "$TMP/loss.txt"; }
true
