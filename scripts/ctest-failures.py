#!/usr/bin/env python3
"""Prints the end of the output of every test that failed in a CTest run, read from
BUILD_DIR/Testing/Temporary/LastTest.log. scripts/test.sh calls it when a ctest step fails, so
that the last lines of a CI log (all a CI report may keep) say why, not only which test.

usage: ctest-failures.py BUILD_DIR [LINES]   (LINES of output per failed test, 60 by default)
"""
import os
import re
import sys


# What CTest writes after the output of a test that passed, or was skipped (a test's own skip,
# matched by SKIP_REGULAR_EXPRESSION or SKIP_RETURN_CODE: "Test Pass Reason:" and the rule).
PASSED = ("\nTest Passed.", "\nTest Pass Reason:", "\nTest Skipped")


def failures(log_text):
    """(name, output lines) of each failed test in a LastTest.log."""
    out = []
    # Each test: "N/M Testing: NAME", ..., "Output:", a rule, the output, "<end of output>",
    # ..., then "Test Passed." or what else became of it (failed, a timeout, a signal).
    for block in re.split(r"^\d+/\d+ Testing: ", log_text, flags=re.M)[1:]:
        name = block.split("\n", 1)[0].strip()
        if any(mark in block for mark in PASSED):
            continue
        m = re.search(r"^Output:\n-+\n(.*?)^<end of output>", block, flags=re.M | re.S)
        out.append((name, (m.group(1) if m else "").splitlines()))
    return out


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    lines = int(sys.argv[2]) if len(sys.argv) == 3 else 60
    path = os.path.join(sys.argv[1], "Testing", "Temporary", "LastTest.log")
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as e:
        print(f"ctest-failures: {e}")
        return
    for name, output in failures(text):
        print(f"\n--- the last {min(lines, len(output))} of {len(output)} output lines of "
              f"the failed test {name}:")
        for line in output[-lines:]:
            print(f"    {line[:400]}")


if __name__ == "__main__":
    main()
