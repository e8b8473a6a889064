#!/usr/bin/env python3
"""Runs every mltrain command line shown in README.md and docs/guide/*.md through the real
binary's argument parser, so a renamed flag or subcommand breaks the build, not the user.

A command line is a line of a fenced code block that starts with `mltrain ` or
`build/apps/mltrain/mltrain ` (a leading `$ ` and `scripts/setup.sh && ` are dropped; a trailing
`# comment` and `2>&1 | ...`, `> file`, `&` are cut); in README.md also an inline `mltrain ...`
span without placeholders (no upper-case NAMES, `[optional]`, `a|b`, `...` or `<x>`: those are
synopses), which is how its "what you can do" table shows commands. The guide's prose names
commands in passing (`mltrain report`); its runnable examples are its code blocks. Each is parsed with MLTRAIN_PARSE_ONLY=1,
which makes `mltrain` check its flags and arguments and exit before running anything; the
command after `launch ... --` is checked the same way. Lines whose config file exists in the
repository (`train`, `profile`, `schedule`, `slurm`, `checklist` with configs/*.yaml) are also put
through `mltrain config check CONFIG key=value ...`, so their overrides must be real keys.

  python3 scripts/dev/check_docs.py MLTRAIN_BIN [REPO_ROOT] [--list]
Exits 1 naming the file, line and error of every command that fails, and when README.md has more
than 200 lines.
"""
import os
import pathlib
import re
import shlex
import subprocess
import sys

PREFIXES = ("build/apps/mltrain/mltrain ", "mltrain ")
CONFIG_COMMANDS = {"train", "profile", "schedule", "slurm", "checklist"}
README_MAX_LINES = 200


INLINE = re.compile(r"`((?:build/apps/mltrain/)?mltrain [^`]+)`")
PLACEHOLDER = re.compile(r"\[|\||\.\.\.|\b[A-Z][A-Z_]+[A-Z]\b|<")


def commands(path, inline):
    fence = False
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:  # README.md: a concrete command in a table or text (not a synopsis)
            for m in INLINE.finditer(line if inline else ""):
                if not PLACEHOLDER.search(m.group(1)):
                    yield no, m.group(1).strip()
            continue
        text = line.strip()
        if text.startswith("$ "):
            text = text[2:]
        text = re.sub(r"^scripts/setup\.sh && ", "", text)
        if not text.startswith(PREFIXES):
            continue
        text = re.split(r"\s+#\s", text, maxsplit=1)[0]
        text = re.split(r"\s(?:2>&1|\||>|&$|&&)", text, maxsplit=1)[0].strip()
        yield no, text


def argv_of(text):
    words = shlex.split(text)
    return words[1:]  # drop the program


def check(binary, root, argv, env):
    problems = []
    r = subprocess.run([binary] + argv, cwd=root, env=env, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        problems.append((r.stdout + r.stderr).strip().splitlines()[-1:] or ["exit %d" % r.returncode])
    if argv and argv[0] in CONFIG_COMMANDS and len(argv) > 1 and argv[1].endswith(".yaml") \
            and (root / argv[1]).exists():
        overrides = [a for a in argv[2:] if "=" in a and not a.startswith("-")]
        c = subprocess.run([binary, "config", "check", argv[1]] + overrides, cwd=root, env=env,
                           capture_output=True, text=True, timeout=60)
        if c.returncode != 0:
            problems.append(["config check: " + (c.stdout + c.stderr).strip().replace("\n", " | ")])
    return [p[0] for p in problems]


def main():
    args = [a for a in sys.argv[1:] if a != "--list"]
    binary = os.path.abspath(args[0])
    root = pathlib.Path(args[1] if len(args) > 1 else pathlib.Path(__file__).resolve().parents[2])
    docs = [root / "README.md"] + sorted((root / "docs" / "guide").glob("*.md"))
    env = dict(os.environ, MLTRAIN_PARSE_ONLY="1")
    failed, checked = [], 0
    for doc in docs:
        for no, text in commands(doc, inline=doc.name == "README.md"):
            argv = argv_of(text)
            parts = [argv]
            if argv and argv[0] == "launch" and "--" in argv:
                at = argv.index("--")
                parts = [argv, argv_of(" ".join(argv[at + 1:]))]
            for part in parts:
                checked += 1
                if "--list" in sys.argv:
                    print(f"{doc.relative_to(root)}:{no}: {' '.join(part)}")
                    continue
                for p in check(binary, root, part, env):
                    failed.append(f"{doc.relative_to(root)}:{no}: `{text}`: {p}")
    # The README is the front door: at most README_MAX_LINES lines; measurement tables live in
    # docs/PERFORMANCE.md and the guide pages, the README keeps a sentence and a link each.
    readme_lines = len((root / "README.md").read_text().splitlines())
    if readme_lines > README_MAX_LINES:
        failed.append(f"README.md: {readme_lines} lines, more than {README_MAX_LINES}: move tables "
                      "to docs/PERFORMANCE.md or a guide page and keep one sentence and a link")
    # docs/measurements/ holds the logs a page cites; the rest go under an archive-<date>/ folder.
    pages = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    pages = [p for p in pages if "measurements" not in p.parts]
    cited = "\n".join(p.read_text() for p in pages)
    for log in sorted((root / "docs" / "measurements").glob("*")):
        if log.is_file() and log.name not in cited:
            failed.append(f"docs/measurements/{log.name}: no page cites it: cite it where its "
                          "figures are quoted, or move it to docs/measurements/archive-<date>/")
    for f in failed:
        print(f)
    print(f"check_docs: {checked} command lines, {len(failed)} failing")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
