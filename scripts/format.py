#!/usr/bin/env python3
"""format.py - formats the C and CUDA sources with clang-format (.clang-format).

Multi-line macros (the tensor table, the option rows, kernels' launch macros)
are laid out by hand as tables, which clang-format would reflow: each run of
them, with the comments between, goes inside /* clang-format off */ ...
/* clang-format on */ first.  Generated files (src/text/unicode_delta.h) and
the golden data are left alone.

    scripts/format.py            format the tree in place
    scripts/format.py --check    exit 1 and list the files that would change
"""
import re
import subprocess
import sys

OFF, ON = "/* clang-format off */", "/* clang-format on */"


def sources():
    out = subprocess.run(["git", "ls-files", "*.c", "*.h", "*.cu", "*.cuh"], capture_output=True, text=True,
                         check=True).stdout.split()
    return [p for p in out if not p.startswith("tests/golden/") and not p.endswith("unicode_delta.h")]


def filler(line):
    t = line.strip()
    return t == "" or t.startswith(("/*", "*", "//")) or t.endswith("*/")


def protect(text):
    """Every run of multi-line macros, with only blank and comment lines
    between them, inside one off/on region (markers from an earlier run are
    dropped first, so the result does not depend on them)."""
    lines = [l for l in text.split("\n") if l.strip() not in (OFF, ON)]
    out, i, open_at = [], 0, None  # open_at: len(out) after the last region's macro
    while i < len(lines):
        if re.match(r"\s*#\s*define\b", lines[i]) and lines[i].rstrip().endswith("\\"):
            j = i
            while j < len(lines) and lines[j].rstrip().endswith("\\"):
                j += 1
            if open_at is not None and all(filler(l) for l in out[open_at:]):
                out.pop(open_at - 1)  # the region goes on: drop its "on"
            else:
                out.append(OFF)
            out.extend(lines[i:j + 1])
            out.append(ON)
            open_at = len(out)
            i = j + 1
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def main():
    check = "--check" in sys.argv[1:]
    changed = []
    for p in sources():
        old = open(p, encoding="utf-8").read()
        new = subprocess.run(["clang-format", "--assume-filename=" + p], input=protect(old), capture_output=True,
                             text=True, check=True).stdout
        if new != old:
            changed.append(p)
            if not check:
                open(p, "w", encoding="utf-8").write(new)
    for p in changed:
        print(("would change " if check else "formatted ") + p)
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
