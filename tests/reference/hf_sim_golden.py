#!/usr/bin/env python3
"""hf_sim_golden.py - golden logits of the tiny DeepSeek V4 models of
hf_golden.py with the official graph's low-precision simulations
(docs/MODEL.md 4.3, 4.4, 12.1) applied to HF transformers'
DeepseekV4ForCausalLM, for the engine with its simulations on
(tests/unit/test_cpu_sim_golden.c).

transformers implements none of the simulations; this script adds them with
forward hooks and two wrapped functions, at the points of MODEL.md 6.1-6.3:
  * attention KV rows (A4) and attention compressor rows (A6): FP8 E4M3 round
    trip of the non-RoPE dims, in blocks of 64 with a power-of-two scale.
    RoPE touches only the last rope_dim dims, so the round trip is applied
    to the output of the row's RMSNorm (kv_norm), before RoPE: the same
    values as after it;
  * raw rows (A5): rounded to f16 (all dims, after RoPE and FP8) where
    attention reads them, the current token's row included; compressed rows
    are not;
  * indexer rows (A7) and indexer queries (6.3 step 1): Hadamard transform
    then FP4 E2M1 round trip in blocks of 32, after RoPE, where the scorer
    reads them.
Rounding a row where it is read instead of where it is stored gives the same
values: each round trip is a function of the row alone.

FP8 uses torch's own float8_e4m3fn cast (round to nearest even), f16 torch's
float16 cast; FP4 and the Hadamard butterfly follow MODEL.md 4.4, and all
three are checked against the numpy definitions' outputs
(tests/golden/cpu/lowprec.bin, tests/reference/lowprec_golden.py) first.

Output: OUTDIR/NAME.sim.golden in hf_golden.py's NAME.golden layout, for the
committed NAME.f16.gguf (the same seeded weights and prompt).

Usage: python tests/reference/hf_sim_golden.py OUTDIR [--only NAME]
  (committed: OUTDIR = tests/golden/cpu, tiny-a and tiny-b; deterministic)
"""
import argparse
import os
import struct
import sys

import numpy as np
import torch

import hf_golden
import transformers.models.deepseek_v4.modeling_deepseek_v4 as dsv4

SIM_CONFIGS = ("tiny-a", "tiny-b")
F32 = torch.float32


def pow2_ceil(r):
    """2^ceil(log2 r) for float32 r > 0, exactly (from the binary exponent)."""
    m, e = torch.frexp(r)
    return torch.ldexp(torch.ones_like(r), torch.where(m == 0.5, e - 1, e))


def fp8_roundtrip(x):
    """MODEL.md 4.3 on the last dim of x (a multiple of 64)."""
    shp = x.shape
    b = x.reshape(*shp[:-1], shp[-1] // 64, 64)
    amax = b.abs().amax(-1, keepdim=True).clamp_min(torch.tensor(1e-4, dtype=F32))
    scale = pow2_ceil(amax / torch.tensor(448.0, dtype=F32))
    v = (b / scale).clamp(-448.0, 448.0)
    return (v.to(torch.float8_e4m3fn).to(F32) * scale).reshape(shp)


FP4_MAG = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=F32)


def fp4_roundtrip(x):
    """MODEL.md 4.4 step 2 on the last dim of x (a multiple of 32)."""
    shp = x.shape
    b = x.reshape(*shp[:-1], shp[-1] // 32, 32)
    amax = b.abs().amax(-1, keepdim=True).clamp_min(torch.tensor(7.052966104933725e-38, dtype=F32))
    scale = pow2_ceil(amax / torch.tensor(6.0, dtype=F32))
    v = (b / scale).clamp(-6.0, 6.0)
    a = v.abs()
    lo = (torch.searchsorted(FP4_MAG, a, right=True) - 1).clamp(0, 7)
    hi = (lo + 1).clamp(max=7)
    dlo, dhi = a - FP4_MAG[lo], FP4_MAG[hi] - a
    up = (hi != lo) & ((dhi < dlo) | ((dhi == dlo) & (lo % 2 == 1)))
    r = torch.where(up, FP4_MAG[hi], FP4_MAG[lo])
    return (torch.where(v < 0, -r, r) * scale).reshape(shp)


def hadamard128(x):
    """MODEL.md 4.4 step 1 on the last dim (128): the float32 butterfly with
    strides 1, 2, ..., 64, then times 1/sqrt(128)."""
    shp = x.shape
    s = 1
    while s < 128:
        y = x.reshape(*shp[:-1], 128 // (2 * s), 2, s)
        a, b = y[..., 0, :], y[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(shp)
        s *= 2
    return x * torch.tensor(0.08838834764831845, dtype=F32)


def indexer_qat(x):
    return fp4_roundtrip(hadamard128(x))


def check_against_numpy(path):
    """The three round trips reproduce the numpy definitions bit for bit."""
    data = open(path, "rb").read()
    off = 0
    for name, fn in (("fp8", fp8_roundtrip), ("fp4", fp4_roundtrip), ("qat", indexer_qat)):
        n, L = struct.unpack_from("<2I", data, off)
        off += 8
        rows = np.frombuffer(data, "<f4", n * L, off).reshape(n, L)
        off += 4 * n * L
        want = np.frombuffer(data, "<f4", n * L, off).reshape(n, L)
        off += 4 * n * L
        got = fn(torch.from_numpy(rows.copy())).numpy()
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            raise SystemExit(f"{name} round trip differs from {path}")


def install_simulations(model):
    """Hooks on every layer of model (see the module docstring)."""
    rope = model.config.head_dim - int(model.config.head_dim * model.config.partial_rotary_factor)

    def fp8_nope(module, args, out):
        return torch.cat([fp8_roundtrip(out[..., :rope]), out[..., rope:]], dim=-1)

    for layer in model.model.layers:
        attn = layer.self_attn
        attn.kv_norm.register_forward_hook(fp8_nope)
        attn.sim_n_comp = 0
        if attn.compressor is not None:
            attn.compressor.kv_norm.register_forward_hook(fp8_nope)

            def count(module, args, out, attn=attn):
                attn.sim_n_comp = out[0].shape[2]

            attn.compressor.register_forward_hook(count)
            if hasattr(attn.compressor, "indexer"):
                scorer = attn.compressor.indexer.scorer
                plain = scorer.forward
                scorer.forward = lambda q, ckv, h, plain=plain: plain(indexer_qat(q.float()), indexer_qat(ckv.float()), h)

    plain_attention = dsv4.eager_attention_forward

    def attention_f16_raw(module, query, key, value, attention_mask, scaling, **kw):
        # key is value (K = V); the first rows are the raw window, the last
        # sim_n_comp the compressed rows.
        n_raw = key.shape[2] - (module.sim_n_comp if module.compressor is not None else 0)
        kv = torch.cat([key[:, :, :n_raw].half().float(), key[:, :, n_raw:]], dim=2)
        return plain_attention(module, query, kv, kv, attention_mask, scaling, **kw)

    if model.config._attn_implementation != "eager":
        raise SystemExit("the simulations need eager attention")
    dsv4.eager_attention_forward = attention_f16_raw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--only")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    check_against_numpy(os.path.join(here, "..", "golden", "cpu", "lowprec.bin"))
    os.makedirs(args.outdir, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for name in SIM_CONFIGS:
        if args.only and name != args.only:
            continue
        c = hf_golden.CONFIGS[name]
        model, tokens = hf_golden.build_model(c)
        install_simulations(model)
        prefill, decode = hf_golden.run(model, tokens)
        d = np.abs(prefill - decode).max()
        print(f"{name} (simulations on): {len(tokens)} tokens, max|logit| {np.abs(prefill).max():.3f}, "
              f"HF prefill vs decode max|d| {d:.3g}", file=sys.stderr)
        hf_golden.write_golden(os.path.join(args.outdir, f"{name}.sim.golden"), tokens, prefill, decode)


if __name__ == "__main__":
    main()
