#!/usr/bin/env python3
"""Summarises scripts/device/gpu_check.sh: per mltrain run (metrics.jsonl) the median samples/s
after the first epoch, the data-wait share, test accuracy and skipped (fp16 overflow) steps; the
Python baselines' JSON lines from the log; and each step's exit status."""
import json, statistics, sys
from pathlib import Path

runs, log, steps = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
out = {"mltrain": {}, "pytorch": [], "steps": {}}
for line in steps.read_text().splitlines():
    name, rc, secs = line.split("\t")
    out["steps"][name] = {"exit": rc if rc == "skip" else int(rc), "seconds": float(secs)}
for m in sorted(runs.glob("*/v*/metrics.jsonl")):
    ev = [json.loads(l) for l in m.read_text().splitlines() if l.strip()]
    train = [e for e in ev if e.get("event") == "train"]
    later = [e for e in train if e.get("epoch", 0) > 1.0] or train[len(train) // 3:]
    summ = next((e for e in ev if e.get("event") == "summary"), {})
    out["mltrain"][m.parent.parent.name] = {
        "samples_per_s": round(statistics.median(e["samples_per_s"] for e in later), 1) if later else None,
        "tokens_per_s": round(statistics.median(e["tokens_per_s"] for e in later), 1)
        if later and "tokens_per_s" in later[0] else None,
        "data_wait_share": round(statistics.mean(e.get("data_wait", 0) for e in later), 4) if later else None,
        "test_accuracy": summ.get("test_accuracy"),
        "train_seconds": summ.get("train_seconds"),
        "skipped_steps": train[-1].get("skipped_steps") if train else None,
        "loss_scale": train[-1].get("loss_scale") if train else None,
    }
for line in log.read_text(errors="replace").splitlines():
    if line.startswith("{") and '"impl": "pytorch"' in line:
        out["pytorch"].append(json.loads(line))
outdir = steps.parent
for f in sorted(outdir.glob("profile_*.json")):
    p = json.loads(f.read_text())
    out.setdefault("profile", {})[f.stem] = {
        "verdict": p["diagnosis"]["verdict"], "step_ms": p["measure"]["step_ms"],
        "samples_per_s": p["measure"]["samples_per_s"], "phase_share": p["measure"]["phase_share"],
        "profiler_overhead": p.get("profiler_overhead", {}).get("ratio"),
        "top_ops": [o["name"] for o in p.get("operators", [])[:5]]}
cl = outdir / "checklist_full.json"
if cl.exists():
    try:
        t = cl.read_text()
        c = json.loads(t if t.startswith("{") else t[t.index("\n{\n") + 1:])
        out["checklist_full"] = {"counts": c["counts"], "seconds": c["seconds"],
                                 "items": {i["id"]: i["status"] + ": " + (i["measured"] or i["fix"]) for i in c["items"]}}
    except Exception as e:  # noqa: BLE001
        out["checklist_full"] = {"error": str(e)}
json.dump(out, sys.stdout, indent=1)
print()
