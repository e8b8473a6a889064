#!/usr/bin/env bash
# Two builds of mltrain_bench side by side: interleaved rounds (A, B, A, B, ...) of the same
# training loop on the same config, data and cores, printing each round and the median samples/s
# of both with B/A. For "is the new binary slower than the previous one": build the previous commit
# in a worktree (its own engine, e.g. Debian's LibTorch 1.13 before the 2.15 move) and pass both.
#
#   scripts/bench/ab_binaries.sh OLD/mltrain_bench build/mltrain_bench [ROUNDS]     # default 5
#   MODELS="mlp cnn gpt" scripts/bench/ab_binaries.sh ...
#
# Each side runs its own repository's configs (the folder two levels above its binary, or
# $A_ROOT / $B_ROOT), so a config key one side lacks is not passed to it. Never part of the tests.
set -euo pipefail
A=$(realpath "$1")
B=$(realpath "$2")
rounds=${3:-5}
cd "$(dirname "$0")/../.."
A_ROOT=${A_ROOT:-$(dirname "$(dirname "$A")")}
B_ROOT=${B_ROOT:-$(dirname "$(dirname "$B")")}
PY=$PWD/.venv/bin/python
declare -A args=(
  [mlp]="configs/fashion_mnist_mlp.yaml train.duration=600u"
  [cnn]="configs/fashion_mnist_cnn.yaml train.duration=200u"
  [gpt]="configs/text_char_gpt.yaml train.duration=60u"
)
median() { $PY -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
rate() { $PY -c "import json,sys; print(json.loads(sys.stdin.readlines()[-1])['samples_per_s'])"; }
printf "%-5s %-6s %s\n" model round "A samples/s   B samples/s"
for model in ${MODELS:-mlp cnn}; do
  read -r cfg rest <<<"${args[$model]}"
  a=() b=()
  for r in $(seq "$rounds"); do
    a+=("$(cd "$A_ROOT" && "$A" train "$cfg" $rest | rate)")
    b+=("$(cd "$B_ROOT" && "$B" train "$cfg" $rest | rate)")
    printf "%-5s %-6s %12.0f %12.0f\n" "$model" "$r" "${a[-1]}" "${b[-1]}"
  done
  ma=$(median "${a[@]}") mb=$(median "${b[@]}")
  printf "%-5s median %12.0f %12.0f   B/A %.3f\n" "$model" "$ma" "$mb" "$($PY -c "print($mb/$ma)")"
  # Per round: this VM switches between speed states for minutes at a time, so a round's own pair
  # (run back to back) is the fairer comparison when the medians straddle a switch.
  $PY -c "import statistics,sys; n=len(sys.argv)//2; a=[float(x) for x in sys.argv[1:n+1]]; b=[float(x) for x in sys.argv[n+1:]]
r=[y/x for x,y in zip(a,b)]
print(f'{sys.argv[0]:5s} per-round B/A median {statistics.median(r):.3f}, B faster in {sum(x>1 for x in r)} of {len(r)}')" "${a[@]}" "${b[@]}" | sed "s/^-c   /$model/"
done
