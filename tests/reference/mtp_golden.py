#!/usr/bin/env python3
"""mtp_golden.py - golden logits of the MTP block (docs/MODEL.md 9) on the
tiny models of hf_golden.py, from HF transformers' DeepseekV4 modules.

For each tiny config of hf_golden.py this script
  1. rebuilds exactly the main model hf_golden.py builds (same seed, same
     draws, so the committed NAME.f16.gguf is its GGUF) and runs its prompt;
  2. builds the MTP block as the official MTPBlock defines it, from
     transformers' own modules: e = enorm(embed(t)) through e_proj, each of
     the n_hc streams of the main model's final residual (the input of its
     HC head) through hnorm and h_proj, their sum through one
     DeepseekV4DecoderLayer configured as a dense sliding-window layer with
     biased top-k routing, then its own HC head, norm, and the main model's
     lm_head - with seeded random weights of hf_golden.py's scales, rounded
     to f16-representable values;
  3. writes NAME.mtp.gguf (the block under "mtp.0.", docs/MODEL.md 2.5;
     F16 matrices, F32 vectors, the main model's deepseek4.* metadata) and
     NAME.mtp.golden:

        char[4] "DS4M", u32 version 1, u32 n_tokens, u32 n_vocab,
        u32 tokens[n_tokens], f32 logits[n_tokens - 1][n_vocab]

     where row i is the block's prediction of token i + 2 from the main
     model's residual at position i and token i + 1 (the training pairing,
     at position i), teacher-forced over the whole prompt; all
     little-endian.

The engine compares against these with its low-precision simulations off
(tests/unit/test_mtp.c).

Usage: python tests/reference/mtp_golden.py OUTDIR [--only NAME]
  (the committed files: OUTDIR = tests/golden/cpu; deterministic)
Pinned versions: tests/reference/requirements.txt and requirements-hf.txt.
"""
import argparse
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_golden as H  # noqa: E402
from transformers import DeepseekV4ForCausalLM  # noqa: E402
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf_v4  # noqa: E402

MTP_SEED_OFFSET = 7919


class MTP(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.hidden_size
        self.enorm = hf_v4.DeepseekV4RMSNorm(d, eps=cfg.rms_norm_eps)
        self.hnorm = hf_v4.DeepseekV4RMSNorm(d, eps=cfg.rms_norm_eps)
        self.e_proj = torch.nn.Linear(d, d, bias=False)
        self.h_proj = torch.nn.Linear(d, d, bias=False)
        self.block = hf_v4.DeepseekV4DecoderLayer(cfg, 0)
        self.hc_head = hf_v4.DeepseekV4HyperHead(cfg)
        self.norm = hf_v4.DeepseekV4RMSNorm(d, eps=cfg.rms_norm_eps)


def mtp_config(c):
    """The block's layer: dense (sliding window), learned routing with bias."""
    return H.hf_config(dict(c, n_layer=1, ratios=[0], n_hash=0))


def mtp_tensors(m, c):
    """(GGUF name, array in HF shape, is_matrix) of the block."""
    sd = {k: v.detach().float().numpy() for k, v in m.state_dict().items() if "rotary_emb" not in k}
    g = lambda k: sd[k]
    p, b = "mtp.0.", "block."
    a, ml = b + "self_attn.", b + "mlp."
    F = c["n_ff"]
    gate_up = g(ml + "experts.gate_up_proj")
    return [
        (p + "hc_head_base.weight", g("hc_head.hc_base"), False),
        (p + "hc_head_fn.weight", g("hc_head.hc_fn"), True),
        (p + "hc_head_scale.weight", g("hc_head.hc_scale"), False),
        (p + "e_proj.weight", g("e_proj.weight"), True),
        (p + "h_proj.weight", g("h_proj.weight"), True),
        (p + "enorm.weight", g("enorm.weight"), False),
        (p + "hnorm.weight", g("hnorm.weight"), False),
        (p + "norm.weight", g("norm.weight"), False),
        (p + "hc_attn_fn.weight", g(b + "attn_hc.fn"), True),
        (p + "hc_attn_scale.weight", g(b + "attn_hc.scale"), False),
        (p + "hc_attn_base.weight", g(b + "attn_hc.base"), False),
        (p + "attn_norm.weight", g(b + "input_layernorm.weight"), False),
        (p + "attn_q_a.weight", g(a + "q_a_proj.weight"), True),
        (p + "attn_q_a_norm.weight", g(a + "q_a_norm.weight"), False),
        (p + "attn_q_b.weight", g(a + "q_b_proj.weight"), True),
        (p + "attn_kv.weight", g(a + "kv_proj.weight"), True),
        (p + "attn_kv_a_norm.weight", g(a + "kv_norm.weight"), False),
        (p + "attn_sinks.weight", g(a + "sinks"), False),
        (p + "attn_output_a.weight", g(a + "o_a_proj.weight"), True),
        (p + "attn_output_b.weight", g(a + "o_b_proj.weight"), True),
        (p + "hc_ffn_fn.weight", g(b + "ffn_hc.fn"), True),
        (p + "hc_ffn_scale.weight", g(b + "ffn_hc.scale"), False),
        (p + "hc_ffn_base.weight", g(b + "ffn_hc.base"), False),
        (p + "ffn_norm.weight", g(b + "post_attention_layernorm.weight"), False),
        (p + "ffn_gate_inp.weight", g(ml + "gate.weight"), True),
        (p + "exp_probs_b.bias", g(ml + "gate.e_score_correction_bias"), False),
        (p + "ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, :F, :]), True),
        (p + "ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, F:, :]), True),
        (p + "ffn_down_exps.weight", g(ml + "experts.down_proj"), True),
        (p + "ffn_gate_shexp.weight", g(ml + "shared_experts.gate_proj.weight"), True),
        (p + "ffn_up_shexp.weight", g(ml + "shared_experts.up_proj.weight"), True),
        (p + "ffn_down_shexp.weight", g(ml + "shared_experts.down_proj.weight"), True),
    ]


@torch.no_grad()
def mtp_logits(model, m, tokens):
    """Row i: the block's logits from the residual at i and token i + 1."""
    cap = {}
    model.model.layers[0].register_forward_pre_hook(
        lambda mod, args, kwargs: cap.__setitem__("kw", kwargs), with_kwargs=True)
    model.model.hc_head.register_forward_pre_hook(lambda mod, args: cap.__setitem__("hc", args[0]))
    ids = torch.tensor([tokens[:-1]], dtype=torch.long)
    nxt = torch.tensor([tokens[1:]], dtype=torch.long)
    model(input_ids=ids, use_cache=False)
    h, kw = cap["hc"], cap["kw"]
    x = m.e_proj(m.enorm(model.model.embed_tokens(nxt))).unsqueeze(2) + m.h_proj(m.hnorm(h))
    x = m.block(x, position_embeddings=kw["position_embeddings"], position_ids=kw["position_ids"],
                attention_mask=kw["attention_mask"], input_ids=nxt, past_key_values=None)
    return model.lm_head(m.norm(m.hc_head(x)))[0].float().numpy()


@torch.no_grad()
def check_main(model, tokens, golden):
    """The main model is hf_golden.py's: its prefill logits are the
    committed golden's (when the golden is in the output directory)."""
    if not os.path.exists(golden):
        return
    with open(golden, "rb") as f:
        n, v = struct.unpack("<4x3I", f.read(16))[1:]
        f.seek(16 + 4 * n)
        want = np.frombuffer(f.read(4 * n * v), dtype="<f4").reshape(n, v)
    got = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()
    d = np.abs(got - want).max()
    if d > 1e-5 * np.abs(want).max():
        raise SystemExit(f"{golden}: the rebuilt main model differs from hf_golden.py's (max|d| {d:.3g})")


def write_mtp_gguf(path, c, tensors):
    """The block's tensors with the main model's metadata (hf_golden's
    writer: the same deepseek4.* keys, so that the engine can check the
    block belongs to the model)."""
    H.write_gguf(path, c, tensors, np.float16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--only")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for name, c in H.CONFIGS.items():
        if args.only and name != args.only:
            continue
        # the main model and prompt exactly as hf_golden.py draws them
        rng = np.random.default_rng(c["seed"])
        torch.manual_seed(c["seed"])
        model = DeepseekV4ForCausalLM(H.hf_config(c)).float().eval()
        model.load_state_dict(H.random_weights(model, c, rng), strict=True)
        tokens = [int(t) for t in rng.integers(0, c["n_vocab"], c["n_tokens"])]
        # the block, from a seed of its own
        mrng = np.random.default_rng(c["seed"] + MTP_SEED_OFFSET)
        mcfg = mtp_config(c)
        mcfg._experts_implementation = model.config._experts_implementation  # as the main model's layers
        m = MTP(mcfg).float().eval()
        m.load_state_dict(H.random_weights(m, c, mrng), strict=True)
        check_main(model, tokens, os.path.join(args.outdir, f"{name}.golden"))
        logits = mtp_logits(model, m, tokens)
        write_mtp_gguf(os.path.join(args.outdir, f"{name}.mtp.gguf"), c, mtp_tensors(m, c))
        print(f"{name}: MTP block, {len(tokens) - 1} rows, max|logit| {np.abs(logits).max():.3f}", file=sys.stderr)
        with open(os.path.join(args.outdir, f"{name}.mtp.golden"), "wb") as f:
            f.write(b"DS4M")
            f.write(struct.pack("<3I", 1, len(tokens), c["n_vocab"]))
            f.write(np.asarray(tokens, dtype="<u4").tobytes())
            f.write(logits.astype("<f4").tobytes())


if __name__ == "__main__":
    main()
