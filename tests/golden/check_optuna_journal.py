"""Loads the journal `mltrain tune export --optuna-journal` wrote with Optuna's own
JournalStorage and compares every trial with the study folder: number, state, value(s), params
(categorical choices as chosen), distributions (kind, bounds, log) and intermediate values, and
the study's directions. With --dashboard, also starts optuna-dashboard on that file (a free
loopback port), asks its API for the study and checks it lists every trial.

  python check_optuna_journal.py STUDY_DIR JOURNAL [--dashboard]

Prints one JSON line with what it compared; exits 1 naming every difference.
"""
import argparse
import json
import math
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import optuna
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from golden_report import finish


def same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def dashboard_trials(journal, name):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    exe = pathlib.Path(sys.executable).parent / "optuna-dashboard"
    proc = subprocess.Popen([str(exe), str(journal), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while True:
            try:
                studies = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies"))
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    return None
                time.sleep(0.2)
        sid = next(s["study_id"] for s in studies["study_summaries"] if s["study_name"] == name)
        detail = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{sid}"))
        return len(detail["trials"])
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("study_dir")
    ap.add_argument("journal")
    ap.add_argument("--dashboard", action="store_true")
    a = ap.parse_args()
    d = pathlib.Path(a.study_dir)
    cfg = yaml.safe_load((d / "study.yaml").read_text())
    name = cfg["study"]["name"]
    space = cfg["space"]
    objective = cfg["objective"]  # one objective (the tests' studies)
    rows = [json.loads(l) for l in (d / "trials.jsonl").read_text().splitlines()]
    reports = {}
    for line in (d / "journal.jsonl").read_text().splitlines():
        try:
            op = json.loads(line)
        except ValueError:
            continue
        if op.get("op") == "report":
            reports.setdefault(op["trial"], {})[op["step"]] = op["value"]

    study = optuna.load_study(study_name=name,
                              storage=JournalStorage(JournalFileBackend(a.journal)))
    problems, compared = [], 0
    want_dirs = [optuna.study.StudyDirection.MAXIMIZE if objective["direction"] == "maximize"
                 else optuna.study.StudyDirection.MINIMIZE]
    if study.directions != want_dirs:
        problems.append(f"directions {study.directions}, expected {want_dirs}")
    trials = {t.user_attrs.get("mltrain_number"): t for t in study.trials}
    if len(study.trials) != len(rows):
        problems.append(f"{len(study.trials)} trials in Optuna, {len(rows)} in trials.jsonl")
    for row in rows:
        t = trials.get(row["number"])
        where = f"trial {row['number']}"
        if t is None:
            problems.append(f"{where}: missing")
            continue
        if t.state.name != row["state"]:
            problems.append(f"{where}: state {t.state.name}, expected {row['state']}")
        if row["state"] in ("COMPLETE", "PRUNED") and "values" not in row:
            if not same(t.value, row["value"]):
                problems.append(f"{where}: value {t.value!r}, expected {row['value']!r}")
        if "values" in row and t.values != row["values"]:
            problems.append(f"{where}: values {t.values!r}, expected {row['values']!r}")
        for k, v in row["params"].items():
            if not same(t.params.get(k), v):
                problems.append(f"{where}: param {k} = {t.params.get(k)!r}, expected {v!r}")
            dist = t.distributions.get(k)
            spec = space[k]
            kind = {"float": optuna.distributions.FloatDistribution,
                    "int": optuna.distributions.IntDistribution,
                    "categorical": optuna.distributions.CategoricalDistribution}[spec["type"]]
            if not isinstance(dist, kind):
                problems.append(f"{where}: {k} is a {type(dist).__name__}, expected {kind.__name__}")
            elif spec["type"] == "categorical":
                if list(dist.choices) != spec["choices"]:
                    problems.append(f"{where}: {k} choices {dist.choices}, expected {spec['choices']}")
            elif (dist.low, dist.high, dist.log) != (float(spec["low"]), float(spec["high"]),
                                                     spec["log"]):
                problems.append(f"{where}: {k} is [{dist.low}, {dist.high}] log={dist.log}, "
                                f"expected {spec}")
            compared += 1
        want_iv = {int(s): v for s, v in reports.get(row["number"], {}).items()}
        if t.intermediate_values != want_iv:
            problems.append(f"{where}: intermediate values {t.intermediate_values}, expected {want_iv}")
    shown = dashboard_trials(a.journal, name) if a.dashboard else None
    if a.dashboard and shown != len(rows):
        problems.append(f"optuna-dashboard lists {shown} trials, expected {len(rows)}")
    return finish({"study": name, "trials": len(study.trials), "params_compared": compared,
                   "dashboard_trials": shown, "optuna": optuna.__version__}, problems)


if __name__ == "__main__":
    sys.exit(main())
