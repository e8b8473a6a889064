"""Reads a run folder's event file with TensorBoard's own reader (PyPI tensorboard's
EventAccumulator) and compares every scalar with metrics.jsonl: each train and eval record's
numeric fields as "<event>/<field>" at its step, equal as float32, and no other scalar point.

  python check_tensorboard.py RUN_DIR [--histograms N]

Prints one JSON line with what it compared; exits 1 naming every difference.
"""
import argparse
import json
import math
import pathlib
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from golden_report import finish


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--histograms", type=int, default=0, help="at least this many histograms")
    a = ap.parse_args()
    run = pathlib.Path(a.run_dir)
    ea = EventAccumulator(str(run), size_guidance={"scalars": 0, "histograms": 0})
    ea.Reload()
    tags = ea.Tags()
    tb = {t: {e.step: e.value for e in ea.Scalars(t)} for t in tags["scalars"]}
    counts = {t: len(ea.Scalars(t)) for t in tags["scalars"]}
    problems, compared, expected = [], 0, {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["event"] not in ("train", "eval"):
            continue
        for k, v in rec.items():
            if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            tag = f"{rec['event']}/{k}"
            expected[tag] = expected.get(tag, 0) + 1
            got = tb.get(tag, {}).get(rec["step"])
            want = float(np.float32(v))
            if got is None:
                problems.append(f"{tag} at step {rec['step']}: not in the event file")
            elif not (got == want or (math.isnan(got) and math.isnan(want))):
                problems.append(f"{tag} at step {rec['step']}: TensorBoard {got!r}, metrics.jsonl {want!r}")
            else:
                compared += 1
    for tag, n in counts.items():
        if n != expected.get(tag, 0):
            problems.append(f"{tag}: {n} points in the event file, {expected.get(tag, 0)} records")
    histograms = sum(len(ea.Histograms(t)) for t in tags["histograms"])
    if histograms < a.histograms:
        problems.append(f"{histograms} histograms, expected at least {a.histograms}")
    return finish({"scalars": compared, "tags": len(tb), "histograms": histograms}, problems)


if __name__ == "__main__":
    sys.exit(main())
