#!/usr/bin/env bash
# The MLflow sink, measured (#44 item 1) against a real `mlflow server` (the venv's MLflow, SQLite
# store, its default 4 workers, its job runner off) on a free loopback port:
#   1. overhead: the Fashion-MNIST MLP with and without MLFLOW_TRACKING_URI, at the default
#      log_every (100u) and with a record every step (the worst case), interleaved rounds, the
#      summary's train_seconds (a ratio; the target is <= 1.005x);
#   2. history: 100 finished run folders (a real 200-step run, copied) pushed by
#      `mltrain track push -j 4` (target <= 10 s), against MLflow's own Python client sending the
#      same params, metrics, status and config.yaml with log_batch, 4 threads.
# Usage: bash scripts/bench/mlflow.sh [OUT]   (ROUNDS=8 STEPS=1500 SERVER_NICE=19 by default)
set -euo pipefail
source "$(dirname "$0")/prelude.sh"
OUT=${1:-docs/measurements/bench_mlflow_$(date +%F).txt}
ROUNDS=${ROUNDS:-8}
STEPS=${STEPS:-1500}
SERVER_NICE=${SERVER_NICE:-19}
PY=.venv/bin/python
exec > >(tee "$OUT") 2>&1
echo "# scripts/bench/mlflow.sh, $(date -Is), $(nproc) cores, $(git rev-parse --short HEAD)," \
  "MLflow $($PY -c 'import mlflow; print(mlflow.__version__)'), server at nice $SERVER_NICE"

PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URI=http://127.0.0.1:$PORT
mkdir -p "$D/server"
# The server's GenAI job runner (seven idle Python processes, unrelated to tracking) is off, so it
# adds no noise to the step times. The server runs at nice $SERVER_NICE (default 19), standing in
# for a tracking server on another machine: on this 2-core VM a server at equal priority takes
# CPU from the training threads (SERVER_NICE=0 measures that).
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid nice -n "$SERVER_NICE" "$PWD/.venv/bin/mlflow" server --backend-store-uri "sqlite:///$D/server/mlflow.db" \
  --artifacts-destination "$D/server/artifacts" --host 127.0.0.1 --port "$PORT" \
  >"$D/server/log" 2>&1 &
SERVER=$!
trap 'kill -- -$SERVER 2>/dev/null; rm -rf "$D"' EXIT
until curl -sf -o /dev/null "$URI/health"; do
  kill -0 $SERVER 2>/dev/null || { cat "$D/server/log"; exit 1; }
  sleep 0.2
done
echo "server up at $URI"

echo "## 1. overhead: MLP, $STEPS steps, 2 threads; train_seconds of the summary, rounds interleaved"
train_seconds() {
  $PY -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][-1]["train_seconds"])' "$1"
}
for every in 100u 1u; do
  on=(); off=()
  for r in $(seq "$ROUNDS"); do
    for mode in on off; do
      d=$D/cost_${every}_${mode}_$r
      if [ $mode = on ]; then export MLFLOW_TRACKING_URI=$URI; else unset MLFLOW_TRACKING_URI; fi
      $M train configs/fashion_mnist_mlp.yaml train.duration=${STEPS}u train.log_every=$every \
        train.eval_every=never train.tensorboard=false run.dir="$d" run.name=r >/dev/null 2>&1
      s=$(train_seconds "$d/r/v0/metrics.jsonl")
      if [ $mode = on ]; then on+=("$s"); else off+=("$s"); fi
      echo "log_every $every round $r mlflow=$mode: $s s"
    done
  done
  unset MLFLOW_TRACKING_URI
  $PY - "$every" "${on[*]}" "${off[*]}" <<'PYEOF'
import statistics, sys
on = [float(v) for v in sys.argv[2].split()]
off = [float(v) for v in sys.argv[3].split()]
pairs = sorted(a / b for a, b in zip(on, off))
print(f"log_every {sys.argv[1]}: train time with MLflow {statistics.median(on):.3f} s, without "
      f"{statistics.median(off):.3f} s, ratio {statistics.median(on) / statistics.median(off):.4f}x; "
      f"per round: median {statistics.median(pairs):.4f}x, range {pairs[0]:.4f}-{pairs[-1]:.4f}x")
PYEOF
done

echo "## 2. history: 100 finished run folders (200 steps, 43 records, ~240 params each) pushed"
$M train configs/fashion_mnist_mlp.yaml train.duration=200u train.log_every=5u \
  train.eval_every=100u data.limit_train=4096 run.dir="$D/hist" run.name=seed >/dev/null 2>&1
for k in $(seq -w 1 100); do
  mkdir -p "$D/hist/h$k" && cp -r "$D/hist/seed/v0" "$D/hist/h$k/v0" && rm -rf "$D/hist/h$k/v0/checkpoints"
done
start=$(date +%s.%N)
$M track push -j 4 --uri "$URI" --experiment history "$D"/hist/h* | tail -1
echo "mltrain track push -j 4: $(echo "$(date +%s.%N) - $start" | bc) s"
for k in $(seq -w 1 100); do rm -f "$D/hist/h$k/v0/mlflow.json"; done
$PY - "$URI" "$D/hist" <<'PYEOF'
# MLflow's own client, the way a script would send the same folders: one run each, params and
# metrics with log_batch (its limits), status, config.yaml as an artifact; 4 threads.
import json, pathlib, sys, time
from concurrent.futures import ThreadPoolExecutor
import yaml
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
uri, root = sys.argv[1], pathlib.Path(sys.argv[2])
client = MlflowClient(uri)
exp = client.create_experiment("history_python")
def flat(d, p=""):
    for k, v in d.items():
        if isinstance(v, dict) and v: yield from flat(v, f"{p}{k}.")
        else: yield f"{p}{k}", json.dumps(v) if isinstance(v, (list, dict)) else str(v)
def push(run_dir):
    run = client.create_run(exp, run_name=run_dir.parent.name, tags={"mltrain.run_dir": str(run_dir)})
    rid = run.info.run_id
    params = [Param(k, v) for k, v in flat(yaml.safe_load((run_dir / "config.yaml").read_text()))]
    for i in range(0, len(params), 100): client.log_batch(rid, params=params[i:i + 100])
    ms = int(time.time() * 1000)
    metrics = [Metric(f"{r['event']}/{k}", float(v), ms, r["step"])
               for r in map(json.loads, open(run_dir / "metrics.jsonl"))
               for k, v in r.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)]
    for i in range(0, len(metrics), 1000): client.log_batch(rid, metrics=metrics[i:i + 1000])
    client.log_artifact(rid, str(run_dir / "config.yaml"))
    client.set_terminated(rid, "FINISHED")
import contextlib, io
t = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()), ThreadPoolExecutor(4) as ex:  # its "View run" lines
    list(ex.map(push, sorted(root.glob("h*/v0"))))
print(f"MLflow Python client ({__import__('mlflow').__version__}), 4 threads: {time.perf_counter() - t:.2f} s")
PYEOF
