#!/usr/bin/env python3
"""Checks that the installed headers (include/leasehold/) bring their users nothing but the C++
standard library and each other: no POSIX or other C header (<unistd.h>, <sys/stat.h>...),
no third-party header, no header of src/. A body that needs one lives in src/ (the fencing
helpers did: src/core/fencing.cc). Usage: public_headers_check.py SOURCE_ROOT"""

import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def problems(header, text):
    for m in INCLUDE.finditer(text):
        kind, name = m.groups()
        line = text.count("\n", 0, m.start()) + 1
        where = f"{header}:{line}: #include {kind}{name}{'>' if kind == '<' else kind}"
        if kind == '"':
            if not name.startswith("leasehold/"):
                yield f"{where}: only other public headers (\"leasehold/...\") may be included"
        elif "/" in name or "." in name:
            yield f"{where}: not a C++ standard library header; move the code that needs it to src/"


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    headers = sorted((root / "include" / "leasehold").rglob("*.h"))
    if not headers:
        sys.exit(f"public_headers_check: no headers under {root}/include/leasehold")
    found = [p for h in headers for p in problems(h.relative_to(root), h.read_text())]
    for p in found:
        print(p)
    print(f"public_headers_check: {len(headers)} headers, {len(found)} problem(s)")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
