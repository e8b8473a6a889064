#!/usr/bin/env python3
"""Issue #46 item 2: one study journal under 32 drivers of a Slurm array, with drivers and trials
SIGKILLed on a seeded schedule; then Optuna 5.0's JournalFileBackend under the same schedule.

    .venv/bin/python scripts/bench/tune/journal_chaos.py MLTRAIN SCRATCH [--trials 1000] [--drivers 32]
        [--seed 0] [--tuners mltrain,optuna]

The cluster: scripts/slurm/cluster.sh (two slurmd "nodes" on this host) with 16 CPUs declared per
node, so 32 one-CPU tasks run at once. The study folder is on this host's disk (shared by both
"nodes"; `--allow-local-journal`).

A trial is a cheap command (trial.sh): it appends "start N PID" to runs.log, sleeps 0.2 s, prints
{"loss": (x - 0.3)^2}, appends "done N PID". Both tuners run that same script as a child process.

mltrain: `mltrain tune chaos.yaml --slurm-array 32` writes the array script; tasks 0-27 are
submitted as written, tasks 28-31 (drivers / 8) with MLTRAIN_FAULT=journal.write@7 (each dies with
SIGKILL half way through its 7th journal append: a torn line written by a real driver). Random sampler,
n_trials = --trials, stale_after_s 5.
Optuna: the same 32 tasks, each `study.optimize` on JournalStorage(JournalFileBackend(path)) (its
default lock), RandomSampler, MaxTrialsCallback(--trials) counting every state, catch=(Exception,);
the objective runs trial.sh and returns its loss. Run twice: "optuna", the kill schedule alone;
"optuna_torn", the same plus 4 half records the harness appends under Optuna's own lock 2, 4, 6 and
8 s in (Optuna has no fault points: this is what a worker killed mid-write leaves).

Kill schedule (same seed, same ticks for both): every 0.25 s, with probability 0.5 a random
running trial process (its shell and the shell's children) gets SIGKILL, and with probability
0.15 a random driver (an mltrain tune process, not a faulted one; an Optuna worker), at most
drivers / 4 (8 of 32). tests/CMakeLists.txt runs mltrain's part with 8 drivers and 150 trials.

Pass (mltrain): the study ends (every task exits, the journal counts --trials trials), no trial
number started twice, every trial the journal records COMPLETE is complete in `tune report`'s
trials.csv with the same value, torn lines skipped (counted from the journal), and no trial whose
command printed its result was lost without a retry that ran it again.
For Optuna the same counts are printed: trials left RUNNING by dead workers (never retried: lost),
trials whose command printed a result but that are not COMPLETE, workers that died with an error
(JSONDecodeError, Optuna #5138), and whether the study ended within 10 minutes.
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TICK, P_TRIAL, P_DRIVER = 0.25, 0.5, 0.15
DEADLINE_S = 600
TRIAL_SLEEP = 0.2

TRIAL_SH = """#!/bin/sh
echo "start $MLTRAIN_TRIAL_NUMBER $$" >> {log}
sleep {sleep}
awk -v x="$MLTRAIN_PARAM_X" 'BEGIN {{ printf "{{\\"loss\\": %.17g}}\\n", (x - 0.3) ^ 2 }}'
echo "done $MLTRAIN_TRIAL_NUMBER $$" >> {log}
"""

OPTUNA_WORKER = """
import json, os, subprocess, sys
import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.study import MaxTrialsCallback
optuna.logging.set_verbosity(optuna.logging.WARNING)
path, trial_sh, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
storage = JournalStorage(JournalFileBackend(path))
study = optuna.create_study(study_name="chaos", storage=storage, load_if_exists=True,
                            sampler=optuna.samplers.RandomSampler())
def objective(t):
    x = t.suggest_float("x", 0.0, 1.0)
    env = dict(os.environ, MLTRAIN_TRIAL_NUMBER=str(t.number), MLTRAIN_PARAM_X=repr(x))
    out = subprocess.run([trial_sh], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"trial exited {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])["loss"]
study.optimize(objective, callbacks=[MaxTrialsCallback(n, states=None)], catch=(Exception,))
print("worker done")
"""


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, capture_output=True, text=True, **kw)


def pids(pattern):
    out = sh(f"pgrep -f {json.dumps(pattern)}").stdout.split()
    return [int(p) for p in out if int(p) != os.getpid()]


def kill_tree(pid):
    for c in sh(f"pgrep -P {pid}").stdout.split():
        kill_tree(int(c))
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def faulted(pid):
    """A driver started with MLTRAIN_FAULT (it tears a line itself): not the schedule's to kill."""
    try:
        return b"MLTRAIN_FAULT=" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def chaos(seed, running, driver_pattern, trial_pattern, max_driver_kills, on_fault_time=None):
    """Runs the kill schedule until running() is false; returns (driver kills, trial kills, torn
    writes, seconds or None past DEADLINE_S)."""
    rng = random.Random(seed)
    kd = kt = 0
    t0 = time.time()
    fault_times = [2.0 * (i + 1) for i in range(4)]  # the harness's torn writes (Optuna only)
    torn = 0
    while running():
        if time.time() - t0 > DEADLINE_S:
            return kd, kt, torn, None
        time.sleep(TICK)
        r1, r2 = rng.random(), rng.random()
        if r1 < P_TRIAL:
            ts = pids(trial_pattern)
            if ts:
                kill_tree(rng.choice(sorted(ts)))
                kt += 1
        if r2 < P_DRIVER and kd < max_driver_kills:
            ds = [p for p in pids(driver_pattern) if not faulted(p)]
            if ds:
                kill_tree(rng.choice(sorted(ds)))
                kd += 1
        if on_fault_time and fault_times and time.time() - t0 >= fault_times[0]:
            fault_times.pop(0)
            torn += on_fault_time()
    return kd, kt, torn, time.time() - t0


def queue_empty(job_ids):
    out = sh("squeue -h -o %i").stdout
    return not any(j in out for j in job_ids)


def runs_log(path):
    starts, done = {}, set()
    if path.exists():
        for line in path.read_text().splitlines():
            w = line.split()
            if len(w) == 3 and w[0] == "start":
                starts[w[1]] = starts.get(w[1], 0) + 1
            elif len(w) == 3 and w[0] == "done":
                done.add(w[1])
    return starts, done


def run_mltrain(m, d, trials, drivers, seed):
    d.mkdir(parents=True)
    (d / "trial.sh").write_text(TRIAL_SH.format(log=d / "runs.log", sleep=TRIAL_SLEEP))
    (d / "trial.sh").chmod(0o755)
    (d / "chaos.yaml").write_text(
        f"study: {{name: s, dir: {d}, n_trials: {trials}, seed: 1, stale_after_s: 5, heartbeat_s: 1,"
        " max_retry: 3}\nsampler: {name: random}\nobjective: {metric: loss, direction: minimize}\n"
        f"trial: {{command: [{d / 'trial.sh'}]}}\nspace:\n  x: {{type: float, low: 0, high: 1}}\n")
    w = subprocess.run([m, "tune", str(d / "chaos.yaml"), "--slurm-array", str(drivers), "--time", "00:30:00",
                        "--cpus-per-task", "1", "--allow-local-journal"], capture_output=True, text=True)
    if w.returncode != 0:
        sys.exit(f"mltrain tune --slurm-array failed: {w.stdout}{w.stderr}")
    script = d / "s" / "tune-array.sbatch"
    n_faulted = max(1, drivers // 8)
    jobs = [sh(f"sbatch --parsable --array=0-{drivers - n_faulted - 1} {script}").stdout.strip(),
            sh(f"MLTRAIN_FAULT=journal.write@7 sbatch --parsable --export=ALL,MLTRAIN_FAULT=journal.write@7 "
               f"--array={drivers - n_faulted}-{drivers - 1} {script}").stdout.strip()]
    kd, kt, _, secs = chaos(seed, lambda: not queue_empty(jobs), f"tune {d / 'chaos.yaml'}",
                          f"^/bin/sh {d / 'trial.sh'}", drivers // 4)
    if secs is None:
        sh("scancel " + " ".join(jobs))
    recs, torn = [], 0
    for line in (d / "s" / "journal.jsonl").read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:
            torn += 1
    finish = {}
    dup_complete = 0
    created, retried = {}, set()
    for r in recs:
        if r.get("op") == "create":
            created[r["trial"]] = r
            if "retry_of" in r:
                retried.add(r["retry_of"])
        if r.get("op") == "finish":
            if r["trial"] in finish and finish[r["trial"]]["state"] == "COMPLETE" and r["state"] == "COMPLETE":
                dup_complete += 1
            finish.setdefault(r["trial"], r)
    complete = {t: f for t, f in finish.items() if f["state"] == "COMPLETE"}
    starts, done = runs_log(d / "runs.log")
    started_twice = sorted(t for t, n in starts.items() if n > 1)
    lost = sorted(int(t) for t in done if int(t) not in complete and int(t) not in retried)
    rep = subprocess.run([m, "tune", "report", str(d / "s"), "--json"], capture_output=True, text=True)
    csv_ok = rep.returncode == 0
    mismatch = 0
    if csv_ok:
        import csv
        rows = {int(r["number"]): r for r in csv.DictReader(open(d / "s" / "trials.csv"))}
        for t, f in complete.items():
            r = rows.get(t)
            if r is None or r["state"] != "COMPLETE" or abs(float(r["value"]) - f["value"]) > 1e-12 * max(1, abs(f["value"])):
                mismatch += 1
    counted = len([t for t, f in finish.items() if not (f["state"] == "FAIL" and t in retried)])
    return {"tuner": "mltrain", "ended": secs is not None, "seconds": secs, "driver_kills": kd, "trial_kills": kt,
            "faulted_drivers": n_faulted, "trials_created": len(created), "complete": len(complete),
            "counted": counted, "torn_lines": torn, "started_twice": started_twice, "duplicate_complete": dup_complete,
            "printed_but_lost": lost, "report_ok": csv_ok, "report_mismatch": mismatch,
            "states": {s: sum(1 for f in finish.values() if f["state"] == s) for s in ("COMPLETE", "FAIL", "PRUNED")},
            "running_left": len(created) - len(finish)}


def run_optuna(py, d, trials, drivers, seed, torn_writes):
    d.mkdir(parents=True)
    (d / "trial.sh").write_text(TRIAL_SH.format(log=d / "runs.log", sleep=TRIAL_SLEEP))
    (d / "trial.sh").chmod(0o755)
    (d / "worker.py").write_text(OPTUNA_WORKER)
    journal = d / "journal.log"
    # The study first, by one process (as Optuna's docs do before starting workers).
    subprocess.run([py, "-c", "import optuna; from optuna.storages import JournalStorage;"
                    "from optuna.storages.journal import JournalFileBackend;"
                    f"optuna.create_study(study_name='chaos', storage=JournalStorage(JournalFileBackend({str(journal)!r})))"],
                   check=True)
    job = sh(f"sbatch --parsable --array=0-{drivers - 1} --ntasks=1 --cpus-per-task=1 --time=00:30:00 "
             f"--output={d}/slurm-%A_%a.out --wrap '{py} {d / 'worker.py'} {journal} {d / 'trial.sh'} {trials}'"
             ).stdout.strip()

    def torn_write():
        from optuna.storages.journal import JournalFileSymlinkLock
        lock = JournalFileSymlinkLock(str(journal))
        if not torn_writes or not lock.acquire():
            return 0
        try:
            with open(journal, "a") as f:
                f.write('{"op_code": 4, "worker_id": "killed-mid-write", "trial_id": 0, "para')
        finally:
            lock.release()
        return 1

    kd, kt, torn, secs = chaos(seed, lambda: not queue_empty([job]), f"{d / 'worker.py'}",
                          f"^/bin/sh {d / 'trial.sh'}", drivers // 4, torn_write)
    if secs is None:
        sh(f"scancel {job}")
        time.sleep(2)
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    # A worker that did not print "worker done" died: by the schedule's SIGKILL (no traceback), or
    # of an error (its traceback's last line names it).
    errors, load_error = {}, None
    for f in d.glob("slurm-*.out"):
        text = f.read_text(errors="replace")
        if "worker done" in text or "Traceback" not in text:
            continue
        last = [ln for ln in text.splitlines() if ln.strip()][-1]
        name = last.split(":")[0].split(".")[-1]
        errors[name] = errors.get(name, 0) + 1
    try:
        ts = optuna.load_study(study_name="chaos", storage=JournalStorage(JournalFileBackend(str(journal)))).trials
    except Exception as e:  # noqa: BLE001
        ts, load_error = [], f"{type(e).__name__}: {e}"
    states = {}
    for t in ts:
        states[t.state.name] = states.get(t.state.name, 0) + 1
    starts, done = runs_log(d / "runs.log")
    complete = {str(t.number) for t in ts if t.state.name == "COMPLETE"}
    lost = sorted(int(t) for t in done if t not in complete)
    return {"tuner": "optuna_torn" if torn_writes else "optuna", "ended": secs is not None, "seconds": secs, "driver_kills": kd, "trial_kills": kt,
            "torn_lines_injected": torn, "trials_created": len(ts), "complete": states.get("COMPLETE", 0),
            "states": states, "running_left": states.get("RUNNING", 0),
            "started_twice": sorted(t for t, n in starts.items() if n > 1), "printed_but_lost": lost,
            "workers_died_of_errors": errors, "load_error": load_error}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mltrain")
    ap.add_argument("scratch")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--drivers", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tuners", default="mltrain,optuna,optuna_torn",
                    help="optuna: the kill schedule alone; optuna_torn: and 4 torn writes")
    ap.add_argument("--trial-sleep", type=float, default=0.2, help="seconds each trial takes")
    a = ap.parse_args()
    global TRIAL_SLEEP
    TRIAL_SLEEP = a.trial_sleep
    env = dict(os.environ, MLTRAIN_SLURM_CPUS="16")
    out = subprocess.run(["bash", str(ROOT / "scripts/slurm/cluster.sh"), "start"], env=env, capture_output=True, text=True)
    if "export SLURM_CONF=" not in out.stdout:
        sys.exit(f"journal_chaos: the test Slurm did not start: {out.stdout}{out.stderr}")
    os.environ["SLURM_CONF"] = out.stdout.split("export SLURM_CONF=")[1].split()[0]
    scratch = Path(a.scratch).resolve()
    ok = True
    try:
        for tuner in a.tuners.split(","):
            d = scratch / f"chaos_{tuner}"
            if tuner == "mltrain":
                r = run_mltrain(a.mltrain, d, a.trials, a.drivers, a.seed)
                good = (r["ended"] and r["counted"] >= a.trials and not r["started_twice"] and not r["duplicate_complete"]
                        and not r["printed_but_lost"] and r["report_ok"] and r["report_mismatch"] == 0
                        and r["torn_lines"] >= 1)
                ok &= good
            else:
                r = run_optuna(sys.executable, d, a.trials, a.drivers, a.seed, tuner == "optuna_torn")
            print(json.dumps(r))
            if tuner == "mltrain":
                print(f"{'PASS' if good else 'FAIL'}  mltrain: study ended, {r['counted']} trials counted, "
                      f"{len(r['started_twice'])} started twice, {r['duplicate_complete']} duplicate completes, "
                      f"{len(r['printed_but_lost'])} lost, {r['torn_lines']} torn lines skipped, "
                      f"report {'agrees' if r['report_mismatch'] == 0 else 'DISAGREES'}", flush=True)
    finally:
        subprocess.run(["bash", str(ROOT / "scripts/slurm/cluster.sh"), "stop"], capture_output=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
