#!/usr/bin/env python3
"""lowprec_golden.py - expected values of the low-precision simulations of
docs/MODEL.md 4.3 (FP8 E4M3 KV round trip) and 4.4 (Hadamard + FP4 E2M1
indexer round trip), computed with numpy straight from their definition,
for tests/unit/test_lowprec.c.

Output (little-endian): for each of the three sections FP8 (rows of 448),
FP4 (rows of 128) and QAT = Hadamard then FP4 (rows of 128):
    u32 n_rows, u32 row_len, f32 in[n_rows][row_len], f32 out[n_rows][row_len]

Usage: python tests/reference/lowprec_golden.py OUT.bin
"""
import struct
import sys

import numpy as np

F32 = np.float32

# E4M3FN magnitudes, code i = exp << 3 | mant, 0..126 (126 = 448).
E4M3 = np.array([(m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
                 for e in range(16) for m in range(8)][:127])
FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def nearest_even(table, v):
    """Nearest table entry to |v| (ties to the even index), with v's sign."""
    a = np.abs(v.astype(np.float64))
    d = np.abs(a[:, None] - table[None, :])
    best = d.min(axis=1, keepdims=True)
    cand = d == best
    # among equally near entries prefer an even index
    idx = np.where(cand.any(axis=1), 0, 0)
    for i in range(len(a)):
        c = np.nonzero(cand[i])[0]
        even = c[c % 2 == 0]
        idx[i] = even[0] if len(even) else c[0]
    return np.where(v < 0, -table[idx], table[idx]).astype(F32)


def pow2_ceil(r):
    """2^ceil(log2 r) for the float32 r, exactly (float64 log2 of a float32
    is never rounded onto the wrong integer)."""
    return F32(2.0 ** np.ceil(np.log2(np.float64(r))))


def fp8_roundtrip(x):
    out = x.copy()
    for b in range(0, len(x), 64):
        blk = x[b:b + 64]
        amax = max(F32(np.abs(blk).max()), F32(1e-4))
        scale = pow2_ceil(F32(amax) / F32(448))
        v = np.clip((blk / scale).astype(F32), -448, 448)
        out[b:b + 64] = (nearest_even(E4M3, v) * scale).astype(F32)
    return out


def fp4_roundtrip(x):
    out = x.copy()
    for b in range(0, len(x), 32):
        blk = x[b:b + 32]
        amax = max(F32(np.abs(blk).max()), F32(7.052966104933725e-38))
        scale = pow2_ceil(F32(amax) / F32(6))
        v = np.clip((blk / scale).astype(F32), -6, 6)
        out[b:b + 32] = (nearest_even(FP4, v) * scale).astype(F32)
    return out


def hadamard128(x):
    """Sylvester-order fast Walsh-Hadamard transform in float32, strides
    1, 2, ..., 64, then times 1/sqrt(128) (MODEL.md 4.4 step 1)."""
    x = x.astype(F32).copy()
    s = 1
    while s < 128:
        for i in range(0, 128, 2 * s):
            a, b = x[i:i + s].copy(), x[i + s:i + 2 * s].copy()
            x[i:i + s], x[i + s:i + 2 * s] = a + b, a - b
        s *= 2
    return (x * F32(0.08838834764831845)).astype(F32)


def section(rows, fn):
    rows = [np.asarray(r, dtype=F32) for r in rows]
    out = [fn(r) for r in rows]
    n, L = len(rows), len(rows[0])
    return struct.pack("<2I", n, L) + np.stack(rows).astype("<f4").tobytes() + np.stack(out).astype("<f4").tobytes()


def main():
    rng = np.random.default_rng(7)
    fp8_rows = [rng.standard_normal(448) * s for s in (1e-3, 0.1, 1, 3, 100, 1e4)]
    # ties: amax 448 (scale 1), every midpoint between neighbouring magnitudes
    mids = (E4M3[:-1] + E4M3[1:]) / 2
    tie = np.zeros(448)
    tie[:len(mids)] = mids
    tie[len(mids):len(mids) * 2] = -mids
    tie[63] = tie[127] = tie[191] = tie[255] = tie[319] = tie[383] = tie[447] = 448
    fp8_rows.append(tie)
    fp8_rows.append(np.zeros(448))
    fp4_rows = [rng.standard_normal(128) * s for s in (1e-30, 0.01, 1, 50)]
    t4 = np.tile(np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, -0.25, -1.25, -2.5, -5, 0.1, 5.9, 4.4, -3.1]), 8)
    fp4_rows.append(t4)
    qat_rows = [rng.standard_normal(128) * s for s in (0.01, 1, 7, 300)] + [np.zeros(128)]
    with open(sys.argv[1], "wb") as f:
        f.write(section(fp8_rows, fp8_roundtrip))
        f.write(section(fp4_rows, fp4_roundtrip))
        f.write(section(qat_rows, lambda r: fp4_roundtrip(hadamard128(r))))


if __name__ == "__main__":
    main()
