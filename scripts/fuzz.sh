#!/usr/bin/env bash
# Fuzzes mltrain's parsers of users' files with libFuzzer (tests/fuzz/, clang, ASan + UBSan).
#
#   scripts/fuzz.sh [-t SECONDS] [-j JOBS] [TARGET ...]   # default: every target, 60 s each
#   scripts/fuzz.sh -t 600 config npy                     # 10 minutes each for two of them
#   FUZZ_SEED=1 scripts/fuzz.sh -t 30                      # CI: the same mutations every run
#
# Builds build-san/ (clang, MLTRAIN_FUZZ=ON) if needed, runs each target on a copy of its committed
# seed corpus (tests/fuzz/corpus/<target>/) for SECONDS, JOBS targets at once, and prints one row
# per target: executions, executions/s, coverage, corpus size, findings. A crash, a sanitizer
# report, a leak, an input slower than 10 s or an allocation over 1 GiB is a finding: its input is
# kept under fuzz-findings/<target>/ and the script exits 1. New inputs that add coverage are kept
# under fuzz-corpus/<target>/ (copy them into tests/fuzz/corpus/ to keep them for good).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60
jobs=1
while getopts "t:j:" opt; do
  case $opt in
    t) seconds=$OPTARG ;;
    j) jobs=$OPTARG ;;
    *) echo "usage: scripts/fuzz.sh [-t SECONDS] [-j JOBS] [TARGET ...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
all=(config period npy idx shard chunk_index safetensors manifest journal hostlist tensorboard zip pt2)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz.sh: no target '$t' (targets: ${all[*]})" >&2; exit 2; }
done

bash scripts/sanitize.sh --configure-only
cmake --build build-san --target fuzzers -j "$(nproc)" > /dev/null

# LibTorch is not instrumented; suppressions for it are in tests/fuzz/lsan.supp (each justified).
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=0}"
export LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Each target's scratch files go in a folder of this run's, removed at the end (they piled up in
# /dev/shm, one folder per fuzzer process, from every run before).
export MLTRAIN_FUZZ_TMP="$(mktemp -d "${MLTRAIN_FUZZ_TMP:-/dev/shm}/mltrain_fuzz.XXXXXX")"
trap 'rm -rf "$MLTRAIN_FUZZ_TMP"' EXIT
mkdir -p fuzz-findings fuzz-logs

run_one() {
  local t=$1 work=fuzz-corpus/$1
  mkdir -p "$work" "fuzz-findings/$t"
  cp -n tests/fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  build-san/tests/fuzz/fuzz_"$t" "$work" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="fuzz-findings/$t/" ${FUZZ_SEED:+-seed=$FUZZ_SEED} > "fuzz-logs/$t.log" 2>&1 || true
}
export -f run_one
export seconds FUZZ_SEED
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}'

failed=0
printf '%-12s %12s %9s %6s %7s %s\n' target executions exec/s cov corpus findings
for t in "${targets[@]}"; do
  log=fuzz-logs/$t.log
  # -a: a target's log may hold raw input bytes
  execs=$(grep -ao 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1 || true)
  rate=$(( ${execs:-0} / seconds ))
  cov=$(grep -ao 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}' || true)
  corpus=$(find "fuzz-corpus/$t" -type f | wc -l)
  found=$(find "fuzz-findings/$t" -type f | wc -l)
  printf '%-12s %12s %9s %6s %7s %s\n' "$t" "${execs:-none}" "${rate:--}" "${cov:--}" "$corpus" "$found"
  if [ -z "$execs" ] || [ "$found" -gt 0 ]; then
    failed=1
    grep -a -m1 -E 'ERROR: |runtime error|deadly signal|out-of-memory|timeout|property failed|terminate called' "$log" | sed 's/^/    /' || true
  fi
done
[ $failed -eq 0 ] && echo "fuzz: no findings in ${#targets[@]} targets x ${seconds}s" || echo "fuzz: FINDINGS (fuzz-findings/, logs in fuzz-logs/)"
exit $failed
