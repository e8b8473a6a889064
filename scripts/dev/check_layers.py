#!/usr/bin/env python3
"""Checks the engine's include direction: a room includes only itself and the rooms below it;
core, config and tune include no LibTorch; the CLI (apps/) includes no LibTorch and reaches the
training room only through its seam.

The rooms and what each may include are the table below (docs/ARCHITECTURE.md, "Rooms", draws the
same order). The command rooms above the trainer reach the training room only through its seam:
train/pipeline.hpp (build_pipeline, load_trained_model), and `report` through train/checkpoint.hpp
(it reads run folders). Also refuses calls that break under some LibTorch builds (FORBIDDEN).
Exits 1 naming every include or call that breaks a rule.

  python3 scripts/dev/check_layers.py [REPO_ROOT]
"""
import pathlib
import re
import sys

BELOW = {
    "core": set(),  # no LibTorch: errors, files, processes, signals, hashing, SVG
    "config": {"core"},
    "runtime": {"core"},  # the LibTorch seam, tensor memory, threads and kernel routes
    "formats": {"core", "runtime"},
    "data": {"core", "config", "runtime"},
    "model": {"core", "config", "runtime", "formats"},  # formats: the .pt2 reader
    "task": {"core", "config", "runtime", "formats", "data", "model"},
    "optim": {"core", "config", "runtime", "formats", "model"},
    "dist": {"core", "config", "runtime", "formats", "model", "optim"},
    "track": {"core", "config"},  # MLflow over libcurl: no LibTorch
    "train": {"core", "config", "runtime", "formats", "data", "model", "task", "optim", "dist", "track"},
    "tune": {"core", "config"},  # trials are processes: no LibTorch
    "init": {"core", "config", "runtime", "formats", "data"},  # `mltrain init`: data (and a .pt2), a config
}
ENGINE = {"core", "config", "runtime", "formats", "data", "model", "task", "optim", "dist", "track", "train"}
for command_room in ("profile", "deploy", "landscape", "report"):
    BELOW[command_room] = set(ENGINE)
BELOW["checklist"] = ENGINE | {"profile"}
# Headers of the training room that a command room may include (everything else is private to it).
SEAM = {
    "profile": {"train/pipeline.hpp"},
    "deploy": {"train/pipeline.hpp"},
    "landscape": {"train/pipeline.hpp"},
    "checklist": {"train/pipeline.hpp"},
    "report": {"train/checkpoint.hpp"},
}
# Calls the product must not make, with the replacement (core/fs.hpp says why for remove_all).
FORBIDDEN = {
    re.compile(r"\bremove_all\s*\("): "std::filesystem::remove_all binds to pip LibTorch 2.x's own "
    "copy, which calls address 0; use mltrain::remove_tree (core/fs.hpp)",
    re.compile(r"\bat::parallel_for\s*\("): "ATen's OpenMP parallel_for is inline and runs on the "
    "calling thread alone in code compiled without OpenMP (all of mltrain); use "
    "mltrain::runtime::parallel_for (runtime/runtime.hpp)",
}
# Rooms that never include LibTorch (tune's tests link no LibTorch), and the CLI's own rules:
# apps/ parses, calls one room and prints; tensors stay in the engine (main.cpp maps LibTorch's
# errors to exit codes; nccl_check_main.cpp is a separate helper binary), and the training room
# is reached only through its seam.
NO_TORCH = {"core", "config", "tune", "track"}
TORCH_INCLUDE = re.compile(r'^\s*#\s*include\s+<(torch|ATen|c10|caffe2)/', re.M)
APPS_TORCH_OK = {"main.cpp", "nccl_check_main.cpp"}
APPS_TRAIN_SEAM = {"train/pipeline.hpp", "train/run.hpp"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"mltrain/([a-z_]+)/([a-z_0-9]+\.hpp)"', re.M)


def room_of(path, lib):
    rel = path.relative_to(lib)
    parts = rel.parts
    if parts[0] == "include":
        return parts[2]
    return parts[1]


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    lib = root / "lib"
    problems, checked = [], 0
    for path in sorted(list((lib / "include" / "mltrain").rglob("*.hpp")) + list((lib / "src").rglob("*.[ch]pp"))):
        room = room_of(path, lib)
        if room not in BELOW:
            problems.append(f"{path.relative_to(root)}: room '{room}' is not in scripts/dev/check_layers.py's table")
            continue
        for m in INCLUDE.finditer(path.read_text()):
            checked += 1
            target, header = m.group(1), m.group(2)
            line = path.read_text()[: m.start()].count("\n") + 1
            where = f"{path.relative_to(root)}:{line}"
            if target == room:
                continue
            if target not in BELOW[room]:
                problems.append(f"{where}: room '{room}' includes mltrain/{target}/{header}, "
                                f"but '{target}' is not below '{room}'")
            elif target == "train" and room in SEAM and f"train/{header}" not in SEAM[room]:
                problems.append(f"{where}: room '{room}' includes mltrain/train/{header}; "
                                f"it may reach the training room only through {sorted(SEAM[room])}")
        if room in NO_TORCH:
            for m in TORCH_INCLUDE.finditer(path.read_text()):
                line = path.read_text()[: m.start()].count("\n") + 1
                problems.append(f"{path.relative_to(root)}:{line}: room '{room}' includes LibTorch "
                                f"({m.group(1)}/...); it must build without it")
    for path in sorted((root / "apps").rglob("*.[ch]pp")):
        text = path.read_text()
        for m in INCLUDE.finditer(text):
            checked += 1
            line = text[: m.start()].count("\n") + 1
            header = f"{m.group(1)}/{m.group(2)}"
            if m.group(1) == "train" and header not in APPS_TRAIN_SEAM:
                problems.append(f"{path.relative_to(root)}:{line}: the CLI includes mltrain/{header}; "
                                f"it may reach the training room only through {sorted(APPS_TRAIN_SEAM)}")
        if path.name not in APPS_TORCH_OK:
            for m in TORCH_INCLUDE.finditer(text):
                line = text[: m.start()].count("\n") + 1
                problems.append(f"{path.relative_to(root)}:{line}: the CLI includes LibTorch "
                                f"({m.group(1)}/...): tensors belong in an engine room")
    for path in sorted(list(lib.rglob("*.[ch]pp")) + list((root / "apps").rglob("*.[ch]pp"))):
        text = path.read_text()
        for pattern, why in FORBIDDEN.items():
            for m in pattern.finditer(text):
                line = text[: m.start()].count("\n") + 1
                problems.append(f"{path.relative_to(root)}:{line}: {why}")
    for p in problems:
        print(p)
    print(f"{checked} includes checked; {len(problems)} against the room order or FORBIDDEN")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
