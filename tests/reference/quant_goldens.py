#!/usr/bin/env python3
"""quant_goldens.py - golden outputs of gguf-py for the ds4 block formats.

Writes tests/golden/quants/: for every block type ds4 decodes, the output of
gguf.quants.dequantize on random blocks (random bytes with f16 scale fields
forced to typical, extreme, subnormal, zero, negative, inf and NaN values,
plus all-zero and all-ones payloads), and for Q8_0 the bytes of
gguf.quants.quantize on random f32 blocks (rounding ties, zero blocks, one-hot
blocks, scales with subnormal and overflowing f16).

Inputs are not stored: they come from a splitmix64 stream that
tests/unit/test_quants_golden.c regenerates bit for bit (the manifest records
a SHA-256 of the input bytes so a drift between the two generators fails
loudly).  Outputs are stored as explicit values for the first blocks (to show
where a mismatch is) and as one SHA-256 per chunk of blocks for all of them.
NaN outputs are canonicalised to 0x7fc00000 before either is taken ("both
NaN" is the comparison; payloads are not part of the contract).

Usage (pinned versions in tests/reference/requirements.txt):
    make venv
    .venv/bin/python tests/reference/quant_goldens.py [OUT_DIR]
"""
import hashlib
import importlib.metadata
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

MASK = (1 << 64) - 1
CHUNK = 500          # blocks per digest
EXPLICIT = 128       # blocks stored explicitly
NBLOCKS = 10000


class Rng:
    """splitmix64; test_quants_golden.c has the same generator."""

    def __init__(self, seed):
        self.s = seed & MASK

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def bytes(self, n):
        out = bytearray()
        while len(out) < n:
            out += self.next().to_bytes(8, "little")
        return out[:n]


SPECIAL_F16 = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
               0x7E00, 0xFE00, 0x7C01, 0x7D55, 0xFFFF, 0x3C00, 0xBC00]


def scale_value(rng, case):
    """An f16 scale field for one block case (see gen_blocks)."""
    if case == 1 or case == 6:
        return 0x0400 + rng.next() % (0x3000 - 0x0400)            # typical, positive
    if case == 2:
        return SPECIAL_F16[rng.next() % len(SPECIAL_F16)]
    if case == 3:
        return (0x7800 + rng.next() % 0x400) | (rng.next() & 1) << 15  # near max
    if case == 4:
        return (1 + rng.next() % 0x3FF) | (rng.next() & 1) << 15       # subnormal
    if case == 7:
        return 0x8400 + rng.next() % (0x3000 - 0x0400)            # typical, negative
    raise ValueError(case)


def gen_blocks(seed, nblocks, block_bytes, scale_offsets):
    """Random blocks; cases 0 random, 1 typical scales, 2 special scales,
    3 near-max, 4 subnormal, 5 all zero, 6 payload all 0xff, 7 negative."""
    rng = Rng(seed)
    out = bytearray()
    for _ in range(nblocks):
        blk = rng.bytes(block_bytes)
        case = rng.next() % 8
        if case == 5:
            blk = bytearray(block_bytes)
        elif case != 0:
            if case == 6:
                blk = bytearray(b"\xff" * block_bytes)
            for off in scale_offsets:
                blk[off:off + 2] = scale_value(rng, case).to_bytes(2, "little")
        out += blk
    return bytes(out)


def gen_q8_0_input(seed, nblocks):
    """f32 blocks of 32 for Q8_0 quantization; cases 0 uniform, 1 exact
    rounding ties, 2 zero, 3 one-hot, 4 tiny (subnormal f32 scale), 5 huge."""
    rng = Rng(seed)
    vals = []

    def sint24():
        return int((rng.next() >> 40) % (1 << 24)) - (1 << 23)

    for _ in range(nblocks):
        case = rng.next() % 6
        blk = [0.0] * 32
        if case == 0 or case == 5:
            e = (rng.next() % 41) - 20 if case == 0 else 100 + rng.next() % 28
            blk = [sint24() * 2.0 ** (e - 23) for _ in range(32)]
        elif case == 1:
            e = (rng.next() % 21) - 10
            blk = [(int(rng.next() % 509) - 254) / 2 * 2.0 ** e for _ in range(32)]
            pos = rng.next() % 32
            blk[pos] = (127.0 if rng.next() & 1 else -127.0) * 2.0 ** e
        elif case == 3:
            pos = rng.next() % 32
            v = sint24()
            blk[pos] = v * 2.0 ** ((rng.next() % 41) - 43)
        elif case == 4:
            blk = [sint24() * 2.0 ** (-120 - 23) for _ in range(32)]
            blk[0] = 2.0 ** -120 * (1.0 + (rng.next() % 1000) / 2048)
        vals += blk
    return np.array(vals, dtype=np.float32).tobytes()


def canonical_f32(arr):
    a = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1).view(np.uint32).copy()
    a[np.isnan(arr.reshape(-1))] = 0x7FC00000
    return a.tobytes()


# name, type id, block elements, block bytes, f16 scale offsets, seed
DEQUANT = [
    ("f32", T.F32, 32, 128, [], 0x1001),
    ("q8_0", T.Q8_0, 32, 34, [0], 0x1008),
    ("q2_k", T.Q2_K, 256, 84, [80, 82], 0x100A),
    ("q4_k", T.Q4_K, 256, 144, [0, 2], 0x100C),
    ("iq2_xxs", T.IQ2_XXS, 256, 66, [0], 0x1010),
]


def emit(out_dir, manifest, name, type_id, mode, seed, nblocks, inp, out, out_block_bytes):
    with open(os.path.join(out_dir, f"{name}.{mode}.bin"), "wb") as f:
        f.write(out[:EXPLICIT * out_block_bytes])
    manifest.append(f"set {name} {int(type_id)} {mode} {seed:#x} {nblocks} {CHUNK} {EXPLICIT} "
                    f"{hashlib.sha256(inp).hexdigest()}")
    for c in range(0, nblocks, CHUNK):
        chunk = out[c * out_block_bytes:(c + CHUNK) * out_block_bytes]
        manifest.append(f"chunk {name} {mode} {c // CHUNK} {hashlib.sha256(chunk).hexdigest()}")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "golden", "quants")
    os.makedirs(out_dir, exist_ok=True)
    np.seterr(all="ignore")
    manifest = [
        "# ds4 block-format goldens from gguf-py (tests/reference/quant_goldens.py).",
        f"# gguf {importlib.metadata.version('gguf')}, numpy {np.__version__}",
        "# set NAME TYPE MODE SEED NBLOCKS CHUNK EXPLICIT SHA256(input)",
        "# chunk NAME MODE INDEX SHA256(outputs of blocks INDEX*CHUNK ...)",
    ]
    for name, qt, elems, bbytes, offs, seed in DEQUANT:
        inp = gen_blocks(seed, NBLOCKS, bbytes, offs)
        raw = np.frombuffer(inp, dtype=np.uint8).reshape(NBLOCKS, bbytes)
        out = canonical_f32(quants.dequantize(raw, qt))
        emit(out_dir, manifest, name, qt, "dequant", seed, NBLOCKS, inp, out, elems * 4)
    for name, qt in (("f16", T.F16), ("bf16", T.BF16)):
        inp = np.arange(65536, dtype=np.uint16).tobytes()  # every code, 32 per block
        raw = np.frombuffer(inp, dtype=np.uint8).reshape(2048, 64)
        out = canonical_f32(quants.dequantize(raw, qt))
        emit(out_dir, manifest, name, qt, "dequant", 0, 2048, inp, out, 32 * 4)
    inp = gen_q8_0_input(0x2008, NBLOCKS)
    x = np.frombuffer(inp, dtype=np.float32).reshape(NBLOCKS, 32)
    out = quants.quantize(x, T.Q8_0).tobytes()
    emit(out_dir, manifest, "q8_0", T.Q8_0, "quantize", 0x2008, NBLOCKS, inp, out, 34)
    with open(os.path.join(out_dir, "manifest.txt"), "w") as f:
        f.write("\n".join(manifest) + "\n")


if __name__ == "__main__":
    main()
