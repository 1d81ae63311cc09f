#!/usr/bin/env python3
"""Checks that ForwardingBackend (src/backends/forwarding_backend.h) overrides every virtual
method of Backend (src/backends/backend.h), facets() included, and that Backend keeps to at most
10 virtual methods, its destructor counted (the grant core; the rest are facets, in
src/backends/facets/). A method with a default body that ForwardingBackend drops still compiles,
but then every decorator answers that default instead of the real store's: DataKeyPrefix was
dropped once, and Store::DataKey over a decorated redis:// named the bare key.
Usage: forwarding_backend_check.py SOURCE_ROOT"""

import re
import sys
from pathlib import Path


def class_body(text, name):
    """The text between the braces of `class NAME ... {`, matched by brace depth."""
    m = re.search(r"\bclass\s+" + name + r"\b[^;{]*\{", text)
    if not m:
        sys.exit(f"forwarding_backend_check: class {name} not found")
    depth, i = 1, m.end()
    while depth:
        if i >= len(text):
            sys.exit(f"forwarding_backend_check: class {name} is not closed")
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[m.end():i - 1]


def without_comments(text):
    return re.sub(r"//[^\n]*", "", text)


def method_names(body, marker):
    """Names of the methods whose declaration (up to its first `{` or `;`) matches `marker`."""
    names = set()
    for decl in re.split(r"[;{}]", body):
        decl = " ".join(decl.split())
        if not re.search(marker, decl) or "~" in decl:
            continue
        m = re.search(r"(\w+)\s*\(", decl)
        if m:
            names.add(m.group(1))
    return names


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    backend = without_comments((root / "src/backends/backend.h").read_text())
    forwarding = without_comments((root / "src/backends/forwarding_backend.h").read_text())
    virtuals = method_names(class_body(backend, "Backend"), r"^\[*[\w:\[\] ]*\bvirtual\b")
    overrides = method_names(class_body(forwarding, "ForwardingBackend"), r"\boverride\b")
    if len(virtuals) < 5 or "facets" not in virtuals:
        sys.exit(f"forwarding_backend_check: read only {sorted(virtuals)} from backend.h")
    if len(virtuals) + 1 > 10:
        print(f"Backend has {len(virtuals) + 1} virtual methods (its destructor counted), at most "
              f"10: put what a store may lack in a facet (src/backends/facets/)")
        return 1
    missing = sorted(virtuals - overrides)
    extra = sorted(overrides - virtuals)
    if missing or extra:
        if missing:
            print("ForwardingBackend does not forward: " + ", ".join(missing))
        if extra:
            print("ForwardingBackend overrides what Backend does not declare: " + ", ".join(extra))
        return 1
    print(f"ForwardingBackend forwards all {len(virtuals)} virtual methods of Backend "
          f"(at most 10 with the destructor): {', '.join(sorted(virtuals))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
