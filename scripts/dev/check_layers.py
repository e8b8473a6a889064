#!/usr/bin/env python3
"""Checks the engine's include direction: a room includes only itself and the rooms below it.

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
    "core": set(),
    "config": {"core"},
    "formats": {"core"},
    "data": {"core", "config"},
    "model": {"core", "config"},
    "task": {"core", "config", "data", "model"},
    "optim": {"core", "config", "model"},
    "dist": {"core", "config", "model", "optim"},
    "train": {"core", "config", "formats", "data", "model", "task", "optim", "dist"},
    "tune": {"core", "config"},
}
ENGINE = {"core", "config", "formats", "data", "model", "task", "optim", "dist", "train"}
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
}
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
