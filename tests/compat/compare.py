#!/usr/bin/env python3
"""compare.py - next-token logits of two engines, step by step (docs/COMPAT.md).

    compare.py VOCAB A.f32 A_FIRST B.f32 B_FIRST STEPS [--names A,B]
               [--min-overlap N] [--max-rms R] [--margin M]

A.f32 and B.f32 hold rows of VOCAB little-endian f32 logits; row A_FIRST + i
of A and row B_FIRST + i of B are the logits before step i.  Per step: the
two argmaxes and A's margin (its best logit less its second), the overlap
of the top-20 sets, max |A - B| over the whole vocabulary, max |A| and
their ratio, the RMS of A - B over the RMS of A, and the largest
log-probability difference among A's top 20.  With the options, exit
status 1 unless every step has a top-20 overlap of at least N and an RMS
ratio of at most R, and the argmaxes agree wherever A's margin exceeds M.
Standard library only.
"""
import array
import math
import sys


def rows(path, vocab, first, n):
    a = array.array("f")
    with open(path, "rb") as f:
        f.seek(first * vocab * 4)
        a.fromfile(f, n * vocab)
    if sys.byteorder != "little":
        a.byteswap()
    return [a[i * vocab:(i + 1) * vocab] for i in range(n)]


def logsumexp(x):
    m = max(x)
    return m + math.log(sum(math.exp(v - m) for v in x))


def top(x, k):
    return sorted(range(len(x)), key=lambda i: (-x[i], i))[:k]


def main():
    args = sys.argv[1:]
    opt = {"--names": "A,B", "--min-overlap": "0", "--max-rms": "inf", "--margin": "inf"}
    for k in opt:
        if k in args:
            i = args.index(k)
            opt[k] = args[i + 1]
            del args[i:i + 2]
    names = opt["--names"].split(",")
    min_overlap, max_rms, margin = int(opt["--min-overlap"]), float(opt["--max-rms"]), float(opt["--margin"])
    vocab, a_path, a_first, b_path, b_first, steps = args
    vocab, a_first, b_first, steps = int(vocab), int(a_first), int(b_first), int(steps)
    ra, rb = rows(a_path, vocab, a_first, steps), rows(b_path, vocab, b_first, steps)
    same, ok = True, True
    worst = 0.0
    print("step  argmax %-8s argmax %-8s margin  top20  max|diff|  max|logit|  ratio     rms ratio  "
          "max dlogprob(top20)" % tuple(names))
    for s in range(steps):
        a, b = ra[s], rb[s]
        ta, tb = top(a, 20), top(b, 20)
        diff = max(abs(x - y) for x, y in zip(a, b))
        mx = max(abs(x) for x in a)
        rms = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)) / sum(x * x for x in a))
        la, lb = logsumexp(a), logsumexp(b)
        dlp = max(abs((a[i] - la) - (b[i] - lb)) for i in ta)
        worst = max(worst, diff / mx)
        same &= ta[0] == tb[0]
        overlap, gap = len(set(ta) & set(tb)), a[ta[0]] - a[ta[1]]
        ok &= overlap >= min_overlap and rms <= max_rms and (ta[0] == tb[0] or gap <= margin)
        print("%4d  %15d %15d  %6.4f  %5d  %9.5f  %10.5f  %.2e  %.2e   %.5f" %
              (s, ta[0], tb[0], gap, overlap, diff, mx, diff / mx, rms, dlp))
    print("greedy tokens %s; worst max|diff|/max|logit| %.2e%s" %
          ("identical" if same else "differ", worst, "" if ok else "; CHECKS FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
