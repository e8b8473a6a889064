#!/usr/bin/env python3
"""Lists C++ function bodies longer than a limit (default 100 lines) under the given folders.

A heuristic reader, not a parser: comments and string literals are blanked, then a body is a
`{` that follows a `)` (optionally `const`, `noexcept`, `override`, a trailing return type or a
constructor's initialiser list) opened in namespace or class scope. Lambdas and nested blocks
count towards the function that holds them. Used for the 'functions a reader can hold' figure.

  python3 scripts/dev/long_functions.py lib apps [--limit 100]
"""
import argparse
import pathlib
import re
import sys


def blank(text):
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c); i = j + 1
        else:
            out.append(c); i += 1
    return "".join(out)


HEAD = re.compile(r"\)\s*(const\s*)?(noexcept\s*)?(override\s*)?(->\s*[\w:<>,\s*&]+)?$|\)\s*:\s*[\w:]+[({].*$")


def functions(path):
    text = blank(path.read_text(errors="replace"))
    depth_kind = []  # 'ns', 'class', 'fn', 'block'
    start_line = {}
    line = 1
    last = ""
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        if c == "{":
            in_fn = any(k == "fn" for k in depth_kind)
            before = text[max(0, i - 400):i].rstrip()
            stmt = re.split(r"[;{}]", before)[-1]
            if in_fn:
                kind = "block"
            elif re.search(r"\b(namespace|extern\s+\"C\")\b", stmt) or re.search(r"\bnamespace\b[\w:\s]*$", stmt):
                kind = "ns"
            elif re.search(r"\b(class|struct|union|enum)\b[^()]*$", stmt):
                kind = "class"
            elif HEAD.search(stmt.replace("\n", " ").strip()) or re.search(r"\)\s*(const|noexcept|override|\s)*$", stmt):
                kind = "fn"
                name = re.findall(r"([~\w:]+(?:operator\S*)?)\s*\(", stmt)
                start_line[len(depth_kind)] = (line, name[0] if name else "?")
            else:
                kind = "block"
            depth_kind.append(kind)
        elif c == "}" and depth_kind:
            kind = depth_kind.pop()
            if kind == "fn":
                first, name = start_line.pop(len(depth_kind))
                yield name, first, line - first + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("roots", nargs="+")
    ap.add_argument("--limit", type=int, default=100)
    args = ap.parse_args()
    rows = []
    for root in args.roots:
        for p in sorted(pathlib.Path(root).rglob("*")):
            if p.suffix in (".cpp", ".hpp", ".h", ".cc"):
                for name, first, n in functions(p):
                    if n > args.limit:
                        rows.append((n, f"{p}:{first}", name))
    for n, where, name in sorted(rows, reverse=True):
        print(f"{n:5d}  {name}  {where}")
    print(f"{len(rows)} functions over {args.limit} lines", file=sys.stderr)


if __name__ == "__main__":
    main()
