#!/usr/bin/env python3
"""ncu_table.py NCU_CSV - per-kernel table of one decode step from an Nsight
Compute CSV (tools/perf/gpu_session.sh, part `ncustep`: every kernel of a short
ds4-bench run, metrics gpu__time_duration.sum and dram__bytes_read.sum).

The decode step measured is the one between the last two launches of
step_end_kernel but one (the last step of a run can be a partial one).
Kernels run one at a time under ncu, so the times carry no overlap between
kernels and each includes its own launch ramp: their sum is an upper bound
of a step's time in the graph."""
import csv
import sys

UNIT = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


def num(s):
    return float(s.replace(",", ""))


def main():
    kernels, hdr = {}, None
    with open(sys.argv[1], newline="") as f:
        for row in csv.reader(f):
            if hdr is None:
                hdr = row if "Kernel Name" in row else None
                continue
            d = dict(zip(hdr, row))
            k = kernels.setdefault(int(d["ID"]), {"name": d["Kernel Name"].split("(")[0], "grid": d["Grid Size"]})
            k[d["Metric Name"]] = (num(d["Metric Value"]), d["Metric Unit"])
    ids = sorted(kernels)
    ends = [i for i in ids if "step_end" in kernels[i]["name"]]
    if len(ends) < 3:
        sys.exit("ncu_table.py: fewer than three decode steps in the profile")
    a, b = ends[-3], ends[-2]
    agg, total_us, total_b = {}, 0.0, 0.0
    for i in ids:
        if not a < i <= b:
            continue
        k = kernels[i]
        t = k["gpu__time_duration.sum"][0] * UNIT[k["gpu__time_duration.sum"][1]]
        by = k["dram__bytes_read.sum"][0] * BYTES[k["dram__bytes_read.sum"][1]]
        key = (k["name"], k["grid"]) if "gemv" in k["name"] else (k["name"], "")
        s = agg.setdefault(key, [0, 0.0, 0.0])
        s[0] += 1
        s[1] += t
        s[2] += by
        total_us += t
        total_b += by
    print(f"one decode step: {b - a} launches, {total_us:.0f} us of kernels, {total_b / 1e6:.0f} MB read from DRAM")
    print("| kernel | grid | launches | total us | mean us | MB read | GB/s |")
    print("|---|---|---|---|---|---|---|")
    for (name, grid), (n, t, by) in sorted(agg.items(), key=lambda x: -x[1][1]):
        print(f"| {name} | {grid} | {n} | {t:.0f} | {t / n:.1f} | {by / n / 1e6:.1f} | {by / t / 1e3:.0f} |")


if __name__ == "__main__":
    main()
