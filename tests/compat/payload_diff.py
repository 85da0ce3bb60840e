#!/usr/bin/env python3
"""payload_diff.py - two DSV4 session payloads (docs/MODEL.md 8.3), layer by layer.

    payload_diff.py RATIOS A.payload B.payload

RATIOS is the model's compression ratio per layer, comma-separated
(deepseek4.attention.compress_ratios).  The headers, token ids and row
counts must be equal (exit status 1 otherwise); then, per layer and per
section (raw rows, compressed rows, compressor states, indexer rows and
states), the share of values that are bit-identical and the largest
difference relative to the section's largest value, and the same for the
logits.  Where two engines compute the same model with different float
rounding, the first layers agree to the bit or to one rounding step of the
simulated formats, and the difference grows with depth as each layer's
quantized activations round the earlier differences up to whole steps.
Standard library only.
"""
import array
import struct
import sys

HEAD_U32 = 13


class Reader:
    def __init__(self, data):
        self.data, self.off = data, 0

    def u32(self, n):
        v = struct.unpack_from("<%dI" % n, self.data, self.off)
        self.off += 4 * n
        return v

    def f32(self, n):
        a = array.array("f")
        a.frombytes(self.data[self.off:self.off + 4 * n])
        if sys.byteorder != "little":
            a.byteswap()
        self.off += 4 * n
        return a

    def raw(self, n):
        v = self.data[self.off:self.off + 4 * n]
        self.off += 4 * n
        return v


def sections(data, ratios):
    r = Reader(data)
    h = r.u32(HEAD_U32)
    n_tok, n_layer, head_dim, idx_dim, vocab, raw_live = h[7], h[8], h[9], h[10], h[11], h[12]
    out = {"header": h, "tokens": r.u32(n_tok), "logits": r.raw(vocab)}
    comp, icomp = r.u32(n_layer), r.u32(n_layer)
    out["counts"] = comp + icomp
    layers = []
    for il in range(n_layer):
        ratio = ratios[il]
        s = [("raw", r.raw(raw_live * head_dim))]
        if ratio:
            coff = 2 if ratio == 4 else 1
            state = coff * ratio * coff * head_dim
            s += [("comp", r.raw(comp[il] * head_dim)), ("comp_state_kv", r.raw(state)),
                  ("comp_state_score", r.raw(state))]
            if ratio == 4:
                istate = 2 * 4 * 2 * idx_dim
                s += [("index", r.raw(icomp[il] * idx_dim)), ("index_state_kv", r.raw(istate)),
                      ("index_state_score", r.raw(istate))]
        layers.append(s)
    if r.off != len(data):
        raise SystemExit("payload of %d bytes, %d parsed" % (len(data), r.off))
    return out, layers


def compare(a, b):
    """(values, bit-identical share, max |a-b| / max |a| over finite values)."""
    fa, fb = array.array("f"), array.array("f")
    fa.frombytes(a)
    fb.frombytes(b)
    ua, ub = array.array("I"), array.array("I")
    ua.frombytes(a)
    ub.frombytes(b)
    n = len(fa)
    if n == 0:
        return 0, 1.0, 0.0
    same = sum(1 for x, y in zip(ua, ub) if x == y)
    finite = [(x, y) for x, y in zip(fa, fb) if abs(x) < 1e30 and abs(y) < 1e30]
    mx = max((abs(x) for x, _ in finite), default=0.0)
    diff = max((abs(x - y) for x, y in finite), default=0.0)
    return n, same / n, diff / mx if mx else 0.0


def main():
    ratios = [int(x) for x in sys.argv[1].split(",")]
    pa, la = sections(open(sys.argv[2], "rb").read(), ratios)
    pb, lb = sections(open(sys.argv[3], "rb").read(), ratios)
    for k in ("header", "tokens", "counts"):
        if pa[k] != pb[k]:
            print("%s differ: %s / %s" % (k, pa[k], pb[k]))
            return 1
    print("headers, %d token ids and row counts equal" % len(pa["tokens"]))
    print("layer ratio  section             values  identical  max|diff|/max")
    for il, (sa, sb) in enumerate(zip(la, lb)):
        for (name, a), (_, b) in zip(sa, sb):
            n, same, rel = compare(a, b)
            if n:
                print("%5d %5d  %-18s %7d  %8.4f  %.2e" % (il, ratios[il], name, n, same, rel))
    n, same, rel = compare(pa["logits"], pb["logits"])
    print("logits             %7d  %8.4f  %.2e" % (n, same, rel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
