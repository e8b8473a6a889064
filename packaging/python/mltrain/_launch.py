"""Runs bin/mltrain in place of this Python process (os.execve: same pid, signals and exit code, so
Slurm, torchrun and preemption see the binary itself, not a wrapper)."""

import importlib.util
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def binary() -> Path:
    return HERE / "bin" / "mltrain"


def _torch_lib() -> Path | None:
    """torch/lib of this environment, found without importing torch (~1 s saved per call)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def _fail(message: str) -> None:
    sys.stderr.write(f"mltrain: error: {message}\n")
    sys.exit(2)


def main() -> None:
    exe = binary()
    if not os.access(exe, os.X_OK):
        _fail(f"{exe} is missing or not executable: the wheel is incomplete "
              "(fix: pip install --force-reinstall mltrain-*.whl)")
    lib = _torch_lib()
    if lib is None or not (lib / "libtorch_cpu.so").exists():
        _fail(f"no torch with LibTorch in this Python environment ({sys.prefix}); mltrain needs "
              "the torch 2.15 wheel beside it (fix: pip install 'torch==2.15.*')")
    env = os.environ
    # The binary's RUNPATH expects torch in the same site-packages; elsewhere (a venv made with
    # --system-site-packages, a user site) the loader is told where it is.
    if lib.resolve() != (HERE.parent / "torch" / "lib").resolve():
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(lib), os.environ.get("LD_LIBRARY_PATH", "")) if p)
    os.execve(exe, ["mltrain", *sys.argv[1:]], env)
