#!/usr/bin/env python3
"""Prints the longest C++ functions of src/ and tools/ and holds them to a ceiling.

A function here is a definition that starts at column 0 of a .cc or .h file (clang-format puts
every namespace-level definition there, an internal header's inline ones included) and ends at
the next `}` at column 0; its length counts every line from its signature's first line to that
brace. In-class bodies are not counted.

  scripts/long-functions.py               the 20 longest, then the check against the ceiling
  scripts/long-functions.py --top N       the N longest
  scripts/long-functions.py --max L       the ceiling (default 120 lines)
  scripts/long-functions.py --max-file F  the ceiling of a file of src/ or tools/ (default 900)

A function over the ceiling fails the check unless tests/long-functions.txt lists it ("FILE
NAME LINES") at no fewer lines than it has now: the list is the debt to pay down (issue 36), and
it may only shrink. Exits 1 on a function over the ceiling that is new or longer than listed, on
a listed one that no longer exceeds it (remove it from the list), or on a file over 900 lines."""

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOW = ROOT / "tests" / "long-functions.txt"
NOT_A_FUNCTION = re.compile(r"^(namespace|class|struct|enum|union|extern|template\s*<[^>]*>\s*$|#|//|/\*|using\b|typedef\b)")


def functions(path):
    """(name, first line, length) of the column-0 definitions of one file."""
    text = path.read_text(errors="replace")
    # Raw strings (SQL, Lua) blanked, their line count kept: their lines are not code.
    text = re.sub(r'R"(\w*)\((.*?)\)\1"', lambda m: 'R""' + "\n" * m.group(2).count("\n"), text,
                  flags=re.S)
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        # A '=' before the first '(' is a variable (a constexpr string of SQL), not a function.
        if line and not line[0].isspace() and not NOT_A_FUNCTION.match(line) and "(" in line \
                and "=" not in line.split("(")[0] and not line.rstrip().endswith(";"):
            # The signature may wrap: it ends at the first line that opens the body.
            j = i
            while j < len(lines) and "{" not in lines[j] and not lines[j].rstrip().endswith(";"):
                j += 1
            if j < len(lines) and "{" in lines[j]:
                k = j
                if not lines[j].rstrip().endswith("}"):  # a one-line body ends where it starts
                    k = j + 1
                    while k < len(lines) and not lines[k].startswith("}"):
                        k += 1
                m = re.search(r"([\w:~]+(?:operator\S*)?)\s*\(", line)
                name = m.group(1) if m else line.strip()
                out.append((name, i + 1, k - i + 1))
                i = k + 1
                continue
        i += 1
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--max", type=int, default=120)
    p.add_argument("--max-file", type=int, default=900)
    args = p.parse_args()
    files = subprocess.run(["git", "ls-files", "--", "src/*.cc", "tools/*.cc", "src/*.h",
                            "tools/*.h"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    found = []  # (length, file, name, line)
    for f in files:
        for name, line, length in functions(ROOT / f):
            found.append((length, f, name, line))
    found.sort(reverse=True)
    # Files are held to a ceiling too: a store's or a command's code is cut by concern.
    long_files = []
    for f in files:
        n = (ROOT / f).read_text(errors="replace").count("\n")
        if n > args.max_file:
            long_files.append((n, f))
    print(f"The {args.top} longest functions of src/ and tools/ (lines):")
    for length, f, name, line in found[:args.top]:
        print(f"{length:5}  {f}:{line}  {name}")
    allowed = {}
    if ALLOW.exists():
        for row in ALLOW.read_text().splitlines():
            if row.strip() and not row.startswith("#"):
                f, name, length = row.split()
                allowed[(f, name)] = max(allowed.get((f, name), 0), int(length))
    over = [(length, f, name, line) for length, f, name, line in found if length > args.max]
    print(f"{len(over)} over {args.max} lines ({len(allowed)} listed in "
          f"{ALLOW.relative_to(ROOT)})")
    failed = False
    for n, f in sorted(long_files, reverse=True):
        print(f"long-functions: {f} has {n} lines, over {args.max_file}: cut it by concern",
              file=sys.stderr)
        failed = True
    seen = set()
    for length, f, name, line in over:
        seen.add((f, name))
        limit = allowed.get((f, name))
        if limit is None:
            print(f"long-functions: {f}:{line} {name} has {length} lines, over {args.max}: "
                  f"cut it", file=sys.stderr)
            failed = True
        elif length > limit:
            print(f"long-functions: {f}:{line} {name} grew to {length} lines (listed at "
                  f"{limit}): cut it", file=sys.stderr)
            failed = True
    for (f, name), limit in sorted(allowed.items()):
        if (f, name) not in seen:
            print(f"long-functions: {f} {name} is listed but no longer over {args.max} lines: "
                  f"remove it from {ALLOW.relative_to(ROOT)}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
