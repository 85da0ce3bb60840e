#!/usr/bin/env python3
"""ncu_stalls.py SOURCE_CSV [TOP] - where one kernel's warps wait, from Nsight
Compute's warp-state sampling by instruction: the CSV that

    ncu --import REPORT --page source --csv --print-source sass

writes for a report collected with `--section SourceCounters` (made by
tools/perf/gpu_session.sh, part `ncusrc`).  Prints three tables, each in
percent of all samples: the stall reasons; the SASS opcodes (their first
word, predicate and modifiers dropped) with their count and main reasons;
and the TOP (default 20) instructions that hold the most samples.

A sample of a warp that waits is charged to the instruction it waits to
issue, so "IMMA: short scoreboard" reads "the MMAs wait for the shared-
memory loads that feed them"."""
import csv
import re
import sys
from collections import Counter, defaultdict

ALL = "Warp Stall Sampling (All Samples)"


def opcode(src):
    """The instruction's opcode without its predicate and modifiers."""
    s = re.sub(r"^@!?U?P\w+\s+", "", src.strip())
    return s.split()[0].split(".")[0] if s else "?"


def num(s):
    return float(s.replace(",", "")) if s.strip() else 0.0


def read(path):
    """The header row and the instruction rows (the first line names the kernel)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    for i, r in enumerate(rows):
        if "Address" in r and "Source" in r:
            return rows[0], r, rows[i + 1:]
    sys.exit(f"ncu_stalls.py: {path}: no header row with Address and Source")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: ncu_stalls.py SOURCE_CSV [TOP]")
    top = int(sys.argv[2]) if len(sys.argv) == 3 else 20
    title, hdr, data = read(sys.argv[1])
    if ALL not in hdr:
        sys.exit(f"ncu_stalls.py: {sys.argv[1]}: no '{ALL}' column (collect with --section SourceCounters)")
    col = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "(Not Issued)" not in h]
    total = sum(num(r[col[ALL]]) for r in data)
    if total <= 0:
        sys.exit(f"ncu_stalls.py: {sys.argv[1]}: no samples")
    name = title[1] if len(title) > 1 else "?"
    print(f"{name}: {len(data)} instructions, {total:.0f} samples")

    by_reason = Counter()
    by_op = defaultdict(Counter)
    for r in data:
        op = opcode(r[col["Source"]])
        by_op[op]["all"] += num(r[col[ALL]])
        by_op[op]["n"] += 1
        for h in reasons:
            v = num(r[col[h]])
            by_reason[h] += v
            by_op[op][h] += v

    def pct(v):
        return 100.0 * v / total

    print("\n| stall reason | % of samples |\n|---|---|")
    for h, v in by_reason.most_common():
        if pct(v) >= 0.05:
            print(f"| {h[len('stall_'):]} | {pct(v):.1f} |")

    print("\n| opcode | instructions | % of samples | main reasons |\n|---|---|---|---|")
    for op, c in sorted(by_op.items(), key=lambda x: -x[1]["all"]):
        if pct(c["all"]) < 0.5:
            continue
        main_r = sorted(((c[h], h) for h in reasons if pct(c[h]) >= 0.3), reverse=True)[:4]
        why = ", ".join(f"{h[len('stall_'):]} {pct(v):.1f}" for v, h in main_r)
        print(f"| {op} | {int(c['n'])} | {pct(c['all']):.1f} | {why} |")

    print("\n| address | % of samples | instruction |\n|---|---|---|")
    for r in sorted(data, key=lambda r: -num(r[col[ALL]]))[:top]:
        print(f"| {r[col['Address']]} | {pct(num(r[col[ALL]])):.1f} | `{r[col['Source']].strip()}` |")


if __name__ == "__main__":
    main()
