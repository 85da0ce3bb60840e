#!/usr/bin/env python3
"""ds4-bench-plot - draw a ds4-bench CSV as an SVG chart (Python standard
library only).

    tools/ds4-bench-plot.py CSV [-o SVG] [--title T] [--width 960] [--height 540]

Two panels side by side, context tokens on the x axis: incremental prefill
tokens/s and generation tokens/s per frontier.  Default output: CSV with
"_ts.svg" in place of ".csv".
"""
import argparse
import csv
import sys
from xml.sax.saxutils import escape


def nice_max(v):
    """A round number >= v for the top of an axis."""
    if v <= 0:
        return 1.0
    p = 10 ** (len(str(int(v))) - 1)
    for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * p >= v:
            return m * p
    return 10 * p


def panel(x0, y0, w, h, xs, ys, title, color):
    """SVG elements of one line chart in the box (x0, y0, w, h)."""
    out = []
    left, bottom, top, right = 64, 40, 28, 16
    pw, ph = w - left - right, h - top - bottom
    xmax, ymax = max(xs), nice_max(max(ys))
    xmin = min(xs)
    span = (xmax - xmin) or 1

    def px(x):
        return x0 + left + (x - xmin) / span * pw

    def py(y):
        return y0 + top + ph - y / ymax * ph

    out.append(f'<text x="{x0 + left + pw / 2}" y="{y0 + 18}" text-anchor="middle" '
               f'font-size="14" font-weight="bold">{escape(title)}</text>')
    for i in range(6):
        yv = ymax * i / 5
        y = py(yv)
        out.append(f'<line x1="{x0 + left}" y1="{y}" x2="{x0 + left + pw}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 + left - 6}" y="{y + 4}" text-anchor="end" font-size="11">{yv:g}</text>')
    for x in xs:
        out.append(f'<text x="{px(x)}" y="{y0 + top + ph + 16}" text-anchor="middle" font-size="11">{x}</text>')
    out.append(f'<text x="{x0 + left + pw / 2}" y="{y0 + h - 6}" text-anchor="middle" font-size="11">'
               f'context tokens</text>')
    pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys))
    out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
    for x, y in zip(xs, ys):
        out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        out.append(f'<text x="{px(x):.1f}" y="{py(y) - 7:.1f}" text-anchor="middle" font-size="10">{y:.0f}</text>')
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("-o", "--output")
    ap.add_argument("--title", default="ds4-bench")
    ap.add_argument("--width", type=int, default=960)
    ap.add_argument("--height", type=int, default=540)
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{a.csv}: no rows")
    xs = [int(r["ctx_tokens"]) for r in rows]
    pre = [float(r["prefill_tps"]) for r in rows]
    gen = [float(r["gen_tps"]) for r in rows]
    w, h = a.width, a.height
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="16">{escape(a.title)}</text>']
    svg += panel(0, 30, w / 2, h - 30, xs, pre, "prefill tokens/s", "#1f77b4")
    svg += panel(w / 2, 30, w / 2, h - 30, xs, gen, "generation tokens/s", "#d62728")
    svg.append("</svg>")
    out = a.output or (a.csv[:-4] if a.csv.endswith(".csv") else a.csv) + "_ts.svg"
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")
    print(out)


if __name__ == "__main__":
    main()
