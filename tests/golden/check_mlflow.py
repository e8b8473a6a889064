"""Checks run folders against what an MLflow server holds, through MLflow's own Python client:
every metrics.jsonl record is in MLflow exactly once (each numeric field as "<event>/<field>" at
the record's step; values equal for the fields a resumed run reproduces bit for bit), and no
other point is there; the run's status, params and tags as asked.

  python check_mlflow.py URI RUN_DIR [--status FINISHED] [--param optim.lr=0.001]
      [--tag mltrain.run_dir] [--tag-value KEY=VALUE] [--extra summary] [--parent STUDY_RUN_DIR]

Prints one JSON line with what it counted; exits 1 naming every difference.
"""
import argparse
import json
import math
import pathlib
import sys

from mlflow.tracking import MlflowClient

from golden_report import finish

# Fields a killed and resumed run writes again with the same value (timings are not among them).
EXACT = {"loss", "accuracy", "lr", "epoch", "grad_norm", "grad_norm_max", "top5_accuracy",
         "skipped_steps", "samples", "test_accuracy", "test_loss", "test_samples",
         "test_top5_accuracy"}


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("uri")
    ap.add_argument("run_dir")
    ap.add_argument("--status")
    ap.add_argument("--param", action="append", default=[])
    ap.add_argument("--tag", action="append", default=[])
    ap.add_argument("--tag-value", action="append", default=[])
    ap.add_argument("--extra", action="append", default=[],
                    help="an event whose points MLflow may hold beyond metrics.jsonl's")
    ap.add_argument("--parent", help="run folder (or study folder) of the parent run")
    a = ap.parse_args()
    run_dir = pathlib.Path(a.run_dir)
    cursor = json.loads((run_dir / "mlflow.json").read_text())[a.uri]
    client = MlflowClient(a.uri)
    run = client.get_run(cursor["run_id"])
    problems = []

    expected = {}  # key -> {step: value}
    records = 0
    path = run_dir / "metrics.jsonl"
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        records += 1
        for k, v in rec.items():
            if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            key = f"{rec['event']}/{k}"
            if rec["step"] in expected.setdefault(key, {}):
                problems.append(f"metrics.jsonl itself has {key} at step {rec['step']} twice")
            expected[key][rec["step"]] = float(v)

    points = 0
    for key in sorted(set(expected) | set(run.data.metrics)):
        hist = client.get_metric_history(run.info.run_id, key)
        points += len(hist)
        seen = {}
        for m in hist:
            seen.setdefault(m.step, []).append(m.value)
        want = expected.get(key, {})
        event, field = key.split("/", 1)
        for step, v in want.items():
            got = seen.get(step, [])
            if len(got) != 1:
                problems.append(f"{key} at step {step}: {len(got)} points in MLflow, expected 1")
            elif field in EXACT and not same(got[0], v):
                problems.append(f"{key} at step {step}: MLflow has {got[0]!r}, metrics.jsonl {v!r}")
        if event not in a.extra:
            for step in seen:
                if step not in want:
                    problems.append(f"{key} at step {step}: in MLflow, not in metrics.jsonl")

    if a.status and run.info.status != a.status:
        problems.append(f"status {run.info.status}, expected {a.status}")
    for kv in a.param:
        k, v = kv.split("=", 1)
        if run.data.params.get(k) != v:
            problems.append(f"param {k} = {run.data.params.get(k)!r}, expected {v!r}")
    for k in a.tag:
        if not run.data.tags.get(k):
            problems.append(f"tag {k} missing")
    for kv in a.tag_value:
        k, v = kv.split("=", 1)
        if run.data.tags.get(k) != v:
            problems.append(f"tag {k} = {run.data.tags.get(k)!r}, expected {v!r}")
    if a.parent:
        parent = json.loads((pathlib.Path(a.parent) / "mlflow.json").read_text())[a.uri]["run_id"]
        if run.data.tags.get("mlflow.parentRunId") != parent:
            problems.append(f"parent {run.data.tags.get('mlflow.parentRunId')!r}, expected {parent}")

    return finish({"run_id": run.info.run_id, "records": records, "points": points,
                   "keys": len(expected), "status": run.info.status,
                   "params": len(run.data.params)}, problems)


if __name__ == "__main__":
    sys.exit(main())
