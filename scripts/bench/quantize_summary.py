#!/usr/bin/env python3
"""One line per `mltrain quantize --json` report (stdin); used by quantize_speed.sh."""
import json
import sys

r = json.load(sys.stdin)
print(f"{sys.argv[1]:<30} fp32 {100 * r['fp32_accuracy']:6.2f} %  int8 {100 * r['int8_accuracy']:6.2f} %  "
      f"drop {r['accuracy_drop_points']:+5.2f}  size {r['size_ratio']:.2f}x smaller  "
      f"batch 128 {r['fp32_samples_per_s_batch128']:.0f} -> {r['int8_samples_per_s_batch128']:.0f} samples/s "
      f"({r['speedup_batch128']:.2f}x)")
s = r.get("sensitivity")
if s:
    top = ", ".join(f"{l['layer']} {l['drop_points']:+.2f}" for l in s["layers"][:4])
    print(f"   sensitivity ({s['samples']} {s['split']} samples): {top} ...  proposed exclude: "
          f"{','.join(s['proposed_exclude']) or 'nothing'}")
