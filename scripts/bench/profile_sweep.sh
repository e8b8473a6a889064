#!/usr/bin/env bash
# Issue #6 figures: `mltrain profile` on the deliberately starved loader (data-bound) and on the
# plain CNN (compute-bound), the sweeps that find a faster setting, the profiler's overhead, and
# how long `mltrain checklist --level quick` takes. Prints ratios measured in this invocation.
#   bash scripts/bench/profile_sweep.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/apps/mltrain/mltrain ] || bash scripts/build.sh >/dev/null
M=build/apps/mltrain/mltrain
OUT=$(mktemp -d)
py() { .venv/bin/python -c "$@"; }

$M profile configs/starved_loader.yaml --no-ops --sweep OMP_WAIT_POLICY=active,passive --out "$OUT/omp" >/dev/null 2>&1
$M profile configs/starved_loader.yaml --no-ops --sweep data.workers=0,1,2 --out "$OUT/workers" >/dev/null 2>&1
$M profile configs/fashion_mnist_cnn.yaml --out "$OUT/cnn" >/dev/null 2>&1
t0=$(date +%s.%N); $M checklist configs/fashion_mnist_cnn.yaml --level quick >/dev/null 2>&1 || true; t1=$(date +%s.%N)

py "
import json
def load(n): return json.load(open('$OUT/' + n + '/profile.json'))
for n in ('omp', 'workers'):
    p = load(n); s = p['sweep']
    print(f\"starved_loader: verdict {p['diagnosis']['verdict']}, data wait {100*p['measure']['phase_share']['data']:.1f}% of the step\")
    for r in s['rows']:
        m = r['measure']
        print(f\"  {s['key']}={r['value']:8s} {m['samples_per_s']:9.0f} samples/s  data wait {100*m['phase_share']['data']:5.1f}%  loader alone {m['loader']['supply_samples_per_s']:9.0f}/s\")
    print(f\"  best {s['key']}={s['best']}: {s['speedup_vs_first']:.2f}x the first value\")
c = load('cnn')
print(f\"cnn: verdict {c['diagnosis']['verdict']}, compute {100*(1-c['measure']['phase_share']['data']-c['measure']['phase_share']['other']):.1f}% of the step, {c['measure']['samples_per_s']:.0f} samples/s\")
o = c['profiler_overhead']
print(f\"cnn: operator profiler overhead {100*(o['ratio']-1):+.1f}% ({o['step_ms_with']:.2f} vs {o['step_ms_without']:.2f} ms/step)\")
print(f\"checklist --level quick on the CNN config: {$t1-$t0:.1f} s\")
"
rm -rf "$OUT"
