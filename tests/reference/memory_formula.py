#!/usr/bin/env python3
"""memory_formula.py - what a DeepSeek V4 model of the published shapes holds in
memory, from the architecture's tensor list (docs/MODEL.md 1-2) and the GGML
block sizes, written independently of the engine's tensor table: the
independent side of tests/suite/pro_shapes.sh, which compares it with what
`ds4 --inspect` says of a header-only file written by `ds4-mkmodel`.

  weights_bytes: every tensor of the model file (no MTP block) in the recipe's
                 storage types (the published files' split: experts quantized,
                 the rest F16 / Q8_0 / F32 vectors)
  kv_bytes:      a session of CTX tokens: raw window rows, compressed rows,
                 compressor frontiers (kv and score), indexer rows and
                 frontiers, plus the token ids and one row of logits

Usage: memory_formula.py flash|pro q2|q4|q8_0 CTX   (prints the two lines)
Python standard library only.
"""
import sys

SHAPES = {
    # third-party figures (nano-deepseek-v4 0.2.0's DeepSeekV4Config.flash()/pro())
    "flash": dict(layers=43, d=4096, vocab=129280, heads=64, hd=512, q_lora=1024, groups=8, o_lora=1024,
                  experts=256, used=6, ff=2048, hash=3, window=128, idx_heads=64, idx_hd=128, hc=4, first=0),
    "pro": dict(layers=61, d=7168, vocab=129280, heads=128, hd=512, q_lora=1536, groups=16, o_lora=1024,
                experts=384, used=6, ff=3072, hash=3, window=128, idx_heads=64, idx_hd=128, hc=4, first=128),
}

# bytes per block, values per block
TYPES = {"f32": (4, 1), "f16": (2, 1), "i32": (4, 1), "q8_0": (34, 32), "q2_k": (84, 256),
         "q4_k": (144, 256), "iq2_xxs": (66, 256)}
EXPERTS = {"q2": ("iq2_xxs", "iq2_xxs", "q2_k"), "q4": ("q4_k", "q4_k", "q4_k"),
           "q8_0": ("q8_0", "q8_0", "q8_0")}


def nbytes(typ, row, rows):
    b, n = TYPES[typ]
    assert row % n == 0, (typ, row)
    return row // n * b * rows


def ratio(s, il):
    return s["first"] if il < 2 else (4 if il % 2 == 0 else 128)


def weights(s, recipe):
    d, v, hc = s["d"], s["vocab"], s["hc"]
    mix = (2 + hc) * hc
    q_out = s["heads"] * s["hd"]
    total = nbytes("f16", d, v) + nbytes("q8_0", d, v)          # embedding, output head
    total += nbytes("f32", hc, 1) + nbytes("f16", hc * d, hc)    # output HC base, mixer
    total += nbytes("f32", 1, 1) + nbytes("f32", d, 1)           # output HC scale, final norm
    gate_t, up_t, down_t = EXPERTS[recipe]
    for il in range(s["layers"]):
        t = 0
        for _site in ("attn", "ffn"):                            # HC mixer, scales, bases; the RMSNorm
            t += nbytes("f16", hc * d, mix) + nbytes("f32", 3, 1) + nbytes("f32", mix, 1) + nbytes("f32", d, 1)
        t += nbytes("q8_0", d, s["q_lora"]) + nbytes("f32", s["q_lora"], 1)      # q_a, its norm
        t += nbytes("q8_0", s["q_lora"], q_out)                                  # q_b
        t += nbytes("q8_0", d, s["hd"]) + nbytes("f32", s["hd"], 1)              # kv, its norm
        t += nbytes("f32", s["heads"], 1)                                        # sinks
        t += nbytes("q8_0", q_out // s["groups"], s["groups"] * s["o_lora"])     # output LoRA a
        t += nbytes("q8_0", s["groups"] * s["o_lora"], d)                        # output LoRA b
        r = ratio(s, il)
        if r:
            coff = 2 if r == 4 else 1
            t += nbytes("f16", coff * s["hd"], r)                                # compressor position bias
            t += 2 * nbytes("f16", d, coff * s["hd"]) + nbytes("f32", s["hd"], 1)  # kv, gate, norm
        if r == 4:
            iw = 2 * s["idx_hd"]
            t += nbytes("f16", s["q_lora"], s["idx_heads"] * s["idx_hd"])        # indexer q_b
            t += nbytes("f16", d, s["idx_heads"])                                # head weights
            t += nbytes("f16", iw, 4) + 2 * nbytes("f16", d, iw) + nbytes("f32", s["idx_hd"], 1)
        t += nbytes("f16", d, s["experts"])                                      # router
        if il < s["hash"]:
            t += nbytes("i32", s["used"], v)                                     # token -> experts table
        else:
            t += nbytes("f32", s["experts"], 1)                                  # selection bias
        t += nbytes(gate_t, d, s["ff"] * s["experts"]) + nbytes(up_t, d, s["ff"] * s["experts"])
        t += nbytes(down_t, s["ff"], d * s["experts"])
        t += 2 * nbytes("q8_0", d, s["ff"]) + nbytes("q8_0", s["ff"], d)         # shared expert
        total += t
    return total


def kv(s, ctx):
    floats = ctx + s["vocab"]                    # token ids (4 bytes each) and one row of logits
    raw = min(s["window"], ctx)
    for il in range(s["layers"]):
        r = ratio(s, il)
        floats += raw * s["hd"]
        if not r:
            continue
        coff = 2 if r == 4 else 1
        floats += (ctx // r + 2) * s["hd"]       # compressed rows
        floats += 2 * (coff * r) * (coff * s["hd"])  # frontier: values and scores
        if r == 4:
            floats += (ctx // 4 + 2) * s["idx_hd"]
            floats += 2 * (coff * r) * (coff * s["idx_hd"])
    return floats * 4


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in SHAPES or sys.argv[2] not in EXPERTS:
        sys.exit(__doc__)
    s = SHAPES[sys.argv[1]]
    print(f"weights_bytes: {weights(s, sys.argv[2])}")
    print(f"kv_bytes: {kv(s, int(sys.argv[3]))}")


if __name__ == "__main__":
    main()
