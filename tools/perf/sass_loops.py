#!/usr/bin/env python3
"""sass_loops.py - find loops that wait a memory round trip per iteration.

Reads the text `cuobjdump -sass` prints for a cubin (a file, or standard
input) and lists, per kernel, every loop - a backward branch and the
instructions from its target to it - whose body issues exactly one global
load (LDG; cp.async's LDGSTS does not count) in at most --max-len
instructions.  Such a loop almost always loads, uses the value and goes
round again: every iteration waits for the L2 or DRAM, where loading all of
a thread's values first (an unrolled batch into registers, or cp.async)
waits once.  That pattern cost the prefill attention a fifth of its time
and the indexer scores a tenth of a 64k prefill (fixed by 9ae8bd9: prefill
+2.2 % at 4k, docs/PERFORMANCE.md).  Rarely taken loops show up too (sinf /
cosf's reduction of large arguments is one), so each hit is a place to
look, not a verdict.

    nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -cubin src/model/cuda/cuda_attn.cu -o /tmp/attn.cubin
    cuobjdump -sass /tmp/attn.cubin | python3 tools/perf/sass_loops.py | c++filt

cuobjdump comes with the CUDA toolkit (PyPI: nvidia-cuda-cuobjdump==13.5.37
where the toolkit lacks it).  Output: one line a loop, "KERNEL LO-HI
N instructions: LOAD", addresses in hex as cuobjdump prints them.
"""
import argparse
import re
import sys

FUNC = re.compile(r"Function : (\S+)")
INSN = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\s+(?:`?\(?)0x([0-9a-f]+)")
GLOBAL_LOAD = re.compile(r"\bLDG(?:\.|\s)")


def parse(lines):
    """[(kernel, [(address, instruction text)])] in the order of the listing."""
    funcs = []
    for line in lines:
        m = FUNC.search(line)
        if m:
            funcs.append((m.group(1), []))
            continue
        m = INSN.match(line)
        if m and funcs:
            funcs[-1][1].append((int(m.group(1), 16), m.group(2)))
    return funcs


def serial_loops(insns, max_len):
    """The loops of one kernel with a single global load: (lo, hi, length, load)."""
    found = []
    for addr, text in insns:
        m = BRANCH.search(text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        body = [t for a, t in insns if target <= a <= addr]
        loads = [t for t in body if GLOBAL_LOAD.search(t)]
        if len(loads) == 1 and len(body) <= max_len:
            found.append((target, addr, len(body), loads[0]))
    return found


def main():
    ap = argparse.ArgumentParser(description="loops of a SASS listing that wait a round trip per iteration")
    ap.add_argument("listing", nargs="?", help="cuobjdump -sass output (default: standard input)")
    ap.add_argument("--max-len", type=int, default=40, help="longest loop body reported, in instructions")
    args = ap.parse_args()
    try:
        src = open(args.listing) if args.listing else sys.stdin
        funcs = parse(src)
    except OSError as e:
        print(f"sass_loops: {e}", file=sys.stderr)
        return 2
    if not funcs:
        print("sass_loops: no 'Function :' line: not the output of cuobjdump -sass", file=sys.stderr)
        return 2
    for name, insns in funcs:
        for lo, hi, n, load in serial_loops(insns, args.max_len):
            print(f"{name} {lo:#x}-{hi:#x} {n} instructions: {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
