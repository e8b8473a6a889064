#!/usr/bin/env bash
# The hang and straggler doctor, measured (#43 item 4):
#   1. the fault matrix: tests/cli/test_cli_doctor.cpp with 5 seeds, 8 faults = 40 runs, each
#      detected within max(3 x median step, 10 s) and named (rank, host, pid, collective, phase);
#   2. its cost: 2 ranks, the doctor on against distributed.doctor=false, the same run, interleaved
#      rounds, median step time from metrics.jsonl (a ratio; the target is <= 1.01x);
#   3. the same faults under torchrun (PyTorch DDP over Gloo, the default 30-minute timeout),
#      each capped at CAP seconds: what it printed first, and when.
# Usage: bash scripts/bench/doctor.sh [OUT]   (ROUNDS=10 SEEDS=5 CAP=120 PARTS="1 2 3" by default;
#        PARTS=3 ONLY_GH=1: torchrun's store-host-frozen and packet-drop cases only)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-docs/measurements/bench_doctor_$(date +%F).txt}
ROUNDS=${ROUNDS:-10}
PARTS=${PARTS:-1 2 3}
SEEDS=${SEEDS:-5}
CAP=${CAP:-120}
M=build/apps/mltrain/mltrain
PY=.venv/bin/python
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
exec > >(tee "$OUT") 2>&1
echo "# scripts/bench/doctor.sh, $(date -Is), $(nproc) cores, $(git rev-parse --short HEAD)"

if [[ " $PARTS " == *" 1 "* ]]; then
  echo "## 1. fault matrix: $SEEDS seeds x 8 faults"
  start=$(date +%s)
  { MLTRAIN_DOCTOR_SEEDS=$SEEDS build/tests/test_cli_doctor 2>&1 || true; } |
    grep -E '^\[doctor-test\]|All tests|test cases|assertions|FAILED' | sed 's/^\[doctor-test\] //'

  echo "($(($(date +%s) - start)) s)"
fi

if [[ " $PARTS " == *" 2 "* ]]; then
echo "## 2. cost: 2 ranks x 1 thread, MLP, global batch 64, 512 steps; median step (ms), rounds interleaved"
median_step() {  # the median of the train records' step times, from their time_s stamps
  $PY - "$1" <<'EOF'
import json, statistics, sys
t = [json.loads(l)["time_s"] for l in open(sys.argv[1]) if '"event":"train"' in l]
d = [b - a for a, b in zip(t[20:], t[21:])]
print(f"{1000 * statistics.median(d):.3f}")
EOF
}
on=(); off=()
for r in $(seq "$ROUNDS"); do
  for mode in true false; do
    d=$TMP/cost_${mode}_$r
    $M launch --nproc-per-node 2 -- mltrain train configs/fashion_mnist_mlp.yaml \
      data.limit_train=4096 data.batch_size=32 train.duration=8ep runtime.threads=1 \
      train.log_every=1u train.eval_every=never distributed.doctor=$mode run.dir="$d" run.name=r \
      >/dev/null 2>&1
    ms=$(median_step "$d/r/v0/metrics.jsonl")
    if [ "$mode" = true ]; then on+=("$ms"); else off+=("$ms"); fi
    echo "round $r doctor=$mode: $ms ms"
  done
done
$PY - "${on[*]}" "${off[*]}" <<'EOF'
import statistics, sys
on = [float(v) for v in sys.argv[1].split()]
off = [float(v) for v in sys.argv[2].split()]
pairs = sorted(a / b for a, b in zip(on, off))
print(f"median step: doctor on {statistics.median(on):.3f} ms, off {statistics.median(off):.3f} ms, "
      f"ratio {statistics.median(on) / statistics.median(off):.3f}x; per round: median "
      f"{statistics.median(pairs):.3f}x, range {pairs[0]:.3f}-{pairs[-1]:.3f}x")
EOF
fi

[[ " $PARTS " == *" 3 "* ]] || exit 0
echo "## 3. the same faults under torchrun (PyTorch $($PY -c 'import torch; print(torch.__version__)'), Gloo, default timeout), cap $CAP s"
faults="silent:1:8 kill:1:8 stop:1:8 mismatch:1:8 slow:1:8 loader_stall:1:8"
[ -z "${ONLY_GH:-}" ] || faults=""  # ONLY_GH=1: the store-host and packet-drop cases alone
for fault in $faults; do
  log=$TMP/tr_${fault%%:*}.log
  start=$(date +%s.%N)
  set +e
  FAULT=$fault timeout -s KILL "$CAP" $PY -m torch.distributed.run --nproc_per_node 2 \
    --master_port "$((29700 + RANDOM % 200))" scripts/bench/doctor_torchrun.py >"$log" 2>&1
  rc=$?
  set -e
  # The first line after the fault that is not a step or the fault itself: what the user sees.
  first=$(awk '/\[fault\]/{f=1; next} f && !/^step / && NF {print; exit}' "$log" | cut -c1-220)
  named=$(grep -m1 -E "exitcode|rank [0-9]+ .*(fail|exited)" "$log" | cut -c1-220 || true)
  struck=$(grep -c '\[fault\]' "$log" || true)
  took=$($PY -c "import time; print(f'{time.time() - $start:.1f}')")
  if [ "$rc" = 137 ]; then
    echo "$fault: no end within $CAP s (killed); first words: ${first:-none}"
  else
    echo "$fault: exit $rc after $took s; first words: ${first:-none}"
  fi
  [ -z "$named" ] || echo "  torchrun's summary: $named"
  [ "$struck" -gt 0 ] || echo "  (the fault line never appeared)"
  pkill -9 -f doctor_torchrun.py 2>/dev/null || true
done

# (g) two torchrun "nodes" (c10d rendezvous: node 0's agent serves the store); node 0 frozen, its
# agent and its rank, as a lost host. What does node 1 say, and when?
port=$((29900 + RANDOM % 50))
tr_node() {  # node rank, log
  FAULT=stop:0:8 timeout -s KILL "$CAP" $PY -m torch.distributed.run --nnodes 2 --node_rank "$1" \
    --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:$port --rdzv_id doctor \
    scripts/bench/doctor_torchrun.py >"$2" 2>&1
}
start=$(date +%s.%N)
tr_node 0 "$TMP/g0.log" &
tr_node 1 "$TMP/g1.log" &
n1=$!
for _ in $(seq 600); do grep -q '\[fault\]' "$TMP/g0.log" 2>/dev/null && break; sleep 0.1; done
pkill -STOP -f -- "--node_rank 0 --nproc_per_node 1" || true
set +e; wait $n1; rc=$?; set -e
took=$($PY -c "import time; print(f'{time.time() - $start:.1f}')")
first=$(awk '/\[fault\]/{f=1; next} f && !/^step / && NF {print; exit}' "$TMP/g1.log" | cut -c1-220)
named=$(grep -m1 -E "exitcode|rank [0-9]+ .*(fail|exited)|timed out|Timeout" "$TMP/g1.log" | cut -c1-220 || true)
echo "store host frozen (2 nodes, node 0's agent and rank 0 stopped): node 1 $([ "$rc" = 137 ] && echo "no end within $CAP s" || echo "exit $rc after $took s"); first words: ${first:-none}"
[ -z "$named" ] || echo "  torchrun's summary: $named"
pkill -KILL -f doctor_torchrun.py 2>/dev/null || true
pkill -KILL -f -- "--rdzv_id doctor" 2>/dev/null || true

# (h) torchrun in a network namespace of its own; at step 15 every TCP packet on lo is dropped
# except the rendezvous port's.
cat >"$TMP/h.sh" <<EOS
ip link set lo up
FAULT=none:-1:-1 timeout -s KILL $CAP $PY -m torch.distributed.run --nproc_per_node 2 --master_port 29601 scripts/bench/doctor_torchrun.py >$TMP/h.log 2>&1 &
for i in \$(seq 600); do grep -q '^step 15 ' $TMP/h.log 2>/dev/null && break; sleep 0.05; done
nft add table inet t; nft add chain inet t out '{ type filter hook output priority 0; }'
nft add rule inet t out tcp dport != 29601 tcp sport != 29601 drop
echo '[fault] packets dropped' >>$TMP/h.log
wait
EOS
start=$(date +%s.%N)
set +e; unshare -n sh "$TMP/h.sh"; set -e
took=$($PY -c "import time; print(f'{time.time() - $start:.1f}')")
last=$(grep '^step ' "$TMP/h.log" | tail -n 1)
first=$(awk '/\[fault\]/{f=1; next} f && !/^step / && NF {print; exit}' "$TMP/h.log" | cut -c1-220)
echo "packets dropped (network namespace): ended after $took s (cap $CAP s; last: ${last:-none}); first words after the drop: ${first:-none}"
pkill -KILL -f doctor_torchrun.py 2>/dev/null || true
