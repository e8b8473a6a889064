"""A trial of real_curves.py's study: prints one recorded learning curve (validation error of a real
Fashion-MNIST training, one value per evaluation) as the JSON lines `mltrain tune` reads from a
trial.command, one report at a time.

    python3 replay_curve.py TABLE.json --lr=0.001 --batch=128 --width=256 --dropout=0.3

After each line it waits until the driver has read it (the pipe is empty): a real trial reports
every few seconds, so its pruner judges each report before the next one. Without the wait the
whole curve would reach the driver at once, after the process had exited, and nothing would be
pruned. A pruned trial gets SIGTERM, which ends this process."""
import array
import fcntl
import json
import sys
import termios
import time


def main():
    table = json.load(open(sys.argv[1]))
    args = dict(a[2:].split("=", 1) for a in sys.argv[2:] if a.startswith("--"))
    key = []
    for name, choices in table["grid"]:
        v = args[name]
        # the driver prints numbers its own way (1e-04 / 0.0001): match by value
        pick = [c for c in choices if (str(c) == v if isinstance(c, str) else abs(float(v) - c) <= 1e-9 * abs(c) + 1e-12)]
        if len(pick) != 1:
            sys.exit(f"replay_curve: --{name}={v} is not one of {choices}")
        key.append(f"{name}={pick[0]}")
    curve = table["curves"][",".join(key)]
    unread = array.array("i", [0])
    for step, error in enumerate(curve, 1):
        sys.stdout.write(json.dumps({"step": step, "error": error}) + "\n")
        sys.stdout.flush()
        while True:
            fcntl.ioctl(1, termios.FIONREAD, unread)
            if unread[0] == 0:
                break
            time.sleep(0.0005)


if __name__ == "__main__":
    main()
