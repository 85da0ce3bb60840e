#!/usr/bin/env python3
"""hf_golden.py - golden logits of tiny DeepSeek V4 models (Flash-shaped, Pro-patterned
and of shapes no published model has) from
HF transformers' DeepseekV4ForCausalLM, for the ds4 CPU reference forward pass.

For each tiny config below this script
  1. builds DeepseekV4ForCausalLM (eager attention, float32, on the CPU) with
     seeded random weights of sensible scale; every weight is rounded to an
     f16-representable value, so an F16 GGUF holds exactly the same model as
     an F32 one;
  2. exports the weights to GGUF with ds4 tensor names and deepseek4.*
     metadata (docs/MODEL.md 1.1, 2.3, 2.4) through gguf-py's GGUFWriter:
     NAME.f16.gguf (F16 matrices, F32 vectors; committed) and, with --f32,
     NAME.f32.gguf (every float tensor F32);
  3. runs a seeded random prompt as one prefill (logits of every position)
     and token by token through the HF cache (logits of every step), and
     writes both to NAME.golden:

        char[4] "DS4G", u32 version 1, u32 n_tokens, u32 n_vocab,
        u32 tokens[n_tokens],
        f32 prefill[n_tokens][n_vocab], f32 decode[n_tokens][n_vocab]

     all little-endian.

The engine compares against these with its low-precision simulations off
(tests/unit/test_cpu_golden.c).  transformers implements none of them.

Usage: python tests/reference/hf_golden.py OUTDIR [--f32] [--only NAME]
  (the committed files: OUTDIR = tests/golden/cpu; deterministic, ~15 s)
Pinned versions: tests/reference/requirements.txt and requirements-hf.txt
(numpy, gguf 0.19, torch 2.11, transformers 5.17); runs on the CPU.
"""
import argparse
import os
import struct
import sys

import numpy as np
import torch

import gguf
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

# Two Flash-shaped configs: ratios 0,0,4,128,4,...; 3 hash layers; YaRN on the
# compressed layers; 32 indexer heads with a top-k well below the number of
# ratio-4 rows of the prompt (400 tokens -> 100 rows), and >= 3 ratio-128 rows.
CONFIGS = {
    "tiny-a": dict(
        seed=1234, n_tokens=400,
        n_layer=6, ratios=[0, 0, 4, 128, 4, 128], n_hash=3,
        n_embd=64, n_vocab=256, n_head=4, head_dim=128, rope_dim=64,
        q_lora=32, o_groups=2, o_lora=32,
        n_expert=8, n_used=3, n_ff=32,
        window=128, idx_heads=32, idx_dim=128, top_k=16, n_hc=4),
    "tiny-b": dict(
        seed=99, n_tokens=392,
        n_layer=5, ratios=[0, 0, 4, 128, 4], n_hash=3,
        n_embd=64, n_vocab=200, n_head=4, head_dim=192, rope_dim=64,
        q_lora=32, o_groups=4, o_lora=32,
        n_expert=6, n_used=2, n_ff=32,
        window=40, idx_heads=32, idx_dim=128, top_k=8, n_hc=4),
    # Shapes no published model has, that the kernels must still run exactly:
    # a width of 80, output rank 16 in 3 groups, q rank 48, experts 40 wide.
    "odd-a": dict(
        seed=7, n_tokens=200,
        n_layer=5, ratios=[0, 0, 4, 128, 4], n_hash=2,
        n_embd=80, n_vocab=160, n_head=6, head_dim=128, rope_dim=64,
        q_lora=48, o_groups=3, o_lora=16,
        n_expert=10, n_used=3, n_ff=40,
        window=24, idx_heads=8, idx_dim=128, top_k=12, n_hc=4),
    # Width 112, two heads of 192 in one output group of rank 24, 16 indexer
    # heads choosing 7, a window of 17, experts 24 wide.
    "odd-b": dict(
        seed=8, n_tokens=180,
        n_layer=4, ratios=[0, 4, 128, 4], n_hash=1,
        n_embd=112, n_vocab=144, n_head=2, head_dim=192, rope_dim=64,
        q_lora=40, o_groups=1, o_lora=24,
        n_expert=5, n_used=2, n_ff=24,
        window=17, idx_heads=16, idx_dim=128, top_k=7, n_hc=4),
    # DeepSeek V4 Pro's pattern, scaled down: ratio 128 from layer 0 (no
    # raw-only layers), 16 output groups (one head each), 384 experts / 16
    # choosing 6, routed scale 2.5, and an indexer top-k (96) above the
    # number of ratio-4 rows the prompt makes (300 tokens -> 75).
    "pro-a": dict(
        seed=52, n_tokens=300,
        n_layer=5, ratios=[128, 128, 4, 128, 4], n_hash=3,
        n_embd=48, n_vocab=128, n_head=16, head_dim=128, rope_dim=64,
        q_lora=32, o_groups=16, o_lora=16,
        n_expert=24, n_used=6, n_ff=24,
        window=32, idx_heads=16, idx_dim=128, top_k=96, n_hc=4, route_scale=2.5),
}

ROPE_BASE, COMPRESS_ROPE_BASE = 10000.0, 160000.0
YARN = dict(factor=16.0, orig=65536, beta_fast=32.0, beta_slow=1.0)
SWIGLU_LIMIT, ROUTE_SCALE, EPS, SINKHORN = 10.0, 1.5, 1e-6, 20
LAYER_TYPE = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def hf_config(c):
    return DeepseekV4Config(
        vocab_size=c["n_vocab"], hidden_size=c["n_embd"], moe_intermediate_size=c["n_ff"],
        num_hidden_layers=c["n_layer"], num_attention_heads=c["n_head"], num_key_value_heads=1,
        head_dim=c["head_dim"], q_lora_rank=c["q_lora"], num_experts_per_tok=c["n_used"],
        n_routed_experts=c["n_expert"], n_shared_experts=1, scoring_func="sqrtsoftplus",
        norm_topk_prob=True, routed_scaling_factor=c.get("route_scale", ROUTE_SCALE), rope_theta=ROPE_BASE,
        compress_rope_theta=COMPRESS_ROPE_BASE,
        layer_types=[LAYER_TYPE[r] for r in c["ratios"]],
        mlp_layer_types=["hash_moe"] * c["n_hash"] + ["moe"] * (c["n_layer"] - c["n_hash"]),
        hc_mult=c["n_hc"], hc_sinkhorn_iters=SINKHORN, hc_eps=EPS, swiglu_limit=SWIGLU_LIMIT,
        sliding_window=c["window"], o_groups=c["o_groups"], o_lora_rank=c["o_lora"],
        index_n_heads=c["idx_heads"], index_head_dim=c["idx_dim"], index_topk=c["top_k"],
        partial_rotary_factor=c["rope_dim"] / c["head_dim"], rms_norm_eps=EPS,
        rope_parameters={"rope_type": "yarn", "factor": YARN["factor"],
                         "original_max_position_embeddings": YARN["orig"],
                         "beta_fast": YARN["beta_fast"], "beta_slow": YARN["beta_slow"]},
        attn_implementation="eager", tie_word_embeddings=False,
    )


def f16(a):
    """Round to the nearest f16-representable value, kept as float32."""
    return a.astype(np.float16).astype(np.float32)


def random_weights(model, c, rng):
    """A value for every state-dict entry.  Scales keep activations O(1):
    matrices ~ N(0, 1/fan_in), norm weights near 1, mixer biases and scales
    of order 1, so softmaxes, routers and the indexer are far from uniform."""
    out = {}
    for name, t in model.state_dict().items():
        shape = tuple(t.shape)
        n = lambda s=1.0: rng.standard_normal(shape) * s
        if name.endswith("tid2eid"):
            v = np.stack([rng.permutation(c["n_expert"])[: c["n_used"]] for _ in range(shape[0])])
            out[name] = torch.from_numpy(v.astype(np.int64))
            continue
        if "norm" in name:                       # RMSNorm weights
            v = 1.0 + n(0.1)
        elif name.endswith((".base", "hc_base")):
            v = n(0.5)
        elif name.endswith((".scale", "hc_scale")):
            v = 0.5 + rng.random(shape)
        elif name.endswith(".fn") or name.endswith("hc_fn"):
            v = n(1.0 / np.sqrt(shape[1]))
        elif name.endswith("sinks"):
            v = n(1.0)
        elif name.endswith("position_bias"):
            v = n(0.5)
        elif name.endswith("e_score_correction_bias"):
            v = n(0.1)
        elif name.endswith("embed_tokens.weight"):
            v = n(1.0)
        elif name.endswith("experts.gate_up_proj"):
            v = n(1.0 / np.sqrt(shape[2]))
        elif name.endswith("experts.down_proj"):
            v = n(1.0 / np.sqrt(shape[2]))
        elif len(shape) == 2:                    # nn.Linear [out, in]
            v = n(1.0 / np.sqrt(shape[1]))
        else:
            raise SystemExit(f"no initialiser for {name} {shape}")
        out[name] = torch.from_numpy(f16(v.astype(np.float32)))
    return out


def gguf_tensors(sd, c):
    """(name, array, is_matrix) in ds4 names; arrays in numpy (HF) shape, which
    gguf-py reverses into GGUF dims."""
    g = lambda k: sd[k].numpy()
    ts = [
        ("token_embd.weight", g("model.embed_tokens.weight"), True),
        ("output_hc_base.weight", g("model.hc_head.hc_base"), False),
        ("output_hc_fn.weight", g("model.hc_head.hc_fn"), True),
        ("output_hc_scale.weight", g("model.hc_head.hc_scale"), False),
        ("output_norm.weight", g("model.norm.weight"), False),
        ("output.weight", g("lm_head.weight"), True),
    ]
    F = c["n_ff"]
    for il in range(c["n_layer"]):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        a = p + "self_attn."
        ts += [
            (b + "hc_attn_fn.weight", g(p + "attn_hc.fn"), True),
            (b + "hc_attn_scale.weight", g(p + "attn_hc.scale"), False),
            (b + "hc_attn_base.weight", g(p + "attn_hc.base"), False),
            (b + "attn_norm.weight", g(p + "input_layernorm.weight"), False),
            (b + "attn_q_a.weight", g(a + "q_a_proj.weight"), True),
            (b + "attn_q_a_norm.weight", g(a + "q_a_norm.weight"), False),
            (b + "attn_q_b.weight", g(a + "q_b_proj.weight"), True),
            (b + "attn_kv.weight", g(a + "kv_proj.weight"), True),
            (b + "attn_kv_a_norm.weight", g(a + "kv_norm.weight"), False),
            (b + "attn_sinks.weight", g(a + "sinks"), False),
            (b + "attn_output_a.weight", g(a + "o_a_proj.weight"), True),
            (b + "attn_output_b.weight", g(a + "o_b_proj.weight"), True),
        ]
        ratio = c["ratios"][il]
        if ratio:
            cp = a + "compressor."
            ts += [
                (b + "attn_compressor_ape.weight", g(cp + "position_bias"), True),
                (b + "attn_compressor_kv.weight", g(cp + "kv_proj.weight"), True),
                (b + "attn_compressor_gate.weight", g(cp + "gate_proj.weight"), True),
                (b + "attn_compressor_norm.weight", g(cp + "kv_norm.weight"), False),
            ]
        if ratio == 4:
            ix = a + "compressor.indexer."
            ts += [
                (b + "indexer.attn_q_b.weight", g(ix + "q_b_proj.weight"), True),
                (b + "indexer.proj.weight", g(ix + "scorer.weights_proj.weight"), True),
                (b + "indexer_compressor_ape.weight", g(ix + "position_bias"), True),
                (b + "indexer_compressor_kv.weight", g(ix + "kv_proj.weight"), True),
                (b + "indexer_compressor_gate.weight", g(ix + "gate_proj.weight"), True),
                (b + "indexer_compressor_norm.weight", g(ix + "kv_norm.weight"), False),
            ]
        m = p + "mlp."
        gate_up = g(m + "experts.gate_up_proj")   # [E, 2F, D]: gate rows first
        ts += [
            (b + "hc_ffn_fn.weight", g(p + "ffn_hc.fn"), True),
            (b + "hc_ffn_scale.weight", g(p + "ffn_hc.scale"), False),
            (b + "hc_ffn_base.weight", g(p + "ffn_hc.base"), False),
            (b + "ffn_norm.weight", g(p + "post_attention_layernorm.weight"), False),
            (b + "ffn_gate_inp.weight", g(m + "gate.weight"), True),
        ]
        if il < c["n_hash"]:
            ts.append((b + "ffn_gate_tid2eid.weight", g(m + "gate.tid2eid").astype(np.int32), False))
        else:
            ts.append((b + "exp_probs_b.bias", g(m + "gate.e_score_correction_bias"), False))
        ts += [
            (b + "ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, :F, :]), True),
            (b + "ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, F:, :]), True),
            (b + "ffn_down_exps.weight", g(m + "experts.down_proj"), True),
            (b + "ffn_gate_shexp.weight", g(m + "shared_experts.gate_proj.weight"), True),
            (b + "ffn_up_shexp.weight", g(m + "shared_experts.up_proj.weight"), True),
            (b + "ffn_down_shexp.weight", g(m + "shared_experts.down_proj.weight"), True),
        ]
    return ts


def write_gguf(path, c, tensors, matrix_dtype):
    w = gguf.GGUFWriter(path, "deepseek4")
    K = lambda k: "deepseek4." + k
    u32 = {
        "block_count": c["n_layer"], "embedding_length": c["n_embd"], "vocab_size": c["n_vocab"],
        "attention.head_count": c["n_head"], "attention.head_count_kv": 1,
        "attention.key_length": c["head_dim"], "attention.value_length": c["head_dim"],
        "rope.dimension_count": c["rope_dim"], "attention.q_lora_rank": c["q_lora"],
        "attention.output_lora_rank": c["o_lora"], "attention.output_group_count": c["o_groups"],
        "expert_count": c["n_expert"], "expert_used_count": c["n_used"], "expert_shared_count": 1,
        "expert_feed_forward_length": c["n_ff"], "hash_layer_count": c["n_hash"],
        "expert_group_count": 0, "expert_group_used_count": 0,
        "attention.sliding_window": c["window"], "attention.indexer.head_count": c["idx_heads"],
        "attention.indexer.key_length": c["idx_dim"], "attention.indexer.top_k": c["top_k"],
        "hyper_connection.count": c["n_hc"], "hyper_connection.sinkhorn_iterations": SINKHORN,
        "rope.scaling.original_context_length": YARN["orig"],
    }
    for k, v in u32.items():
        w.add_uint32(K(k), v)
    w.add_uint64(K("context_length"), 4096)
    f32 = {
        "hyper_connection.epsilon": EPS, "attention.layer_norm_rms_epsilon": EPS,
        "rope.freq_base": ROPE_BASE, "attention.compress_rope_freq_base": COMPRESS_ROPE_BASE,
        "rope.scaling.factor": YARN["factor"], "rope.scaling.yarn_beta_fast": YARN["beta_fast"],
        "rope.scaling.yarn_beta_slow": YARN["beta_slow"],
        "expert_weights_scale": c.get("route_scale", ROUTE_SCALE),
    }
    for k, v in f32.items():
        w.add_float32(K(k), v)
    w.add_bool(K("expert_weights_norm"), True)
    w.add_key_value(K("attention.compress_ratios"), list(c["ratios"]), gguf.GGUFValueType.ARRAY,
                    sub_type=gguf.GGUFValueType.UINT32)
    w.add_key_value(K("swiglu_clamp_exp"), [SWIGLU_LIMIT] * c["n_layer"], gguf.GGUFValueType.ARRAY,
                    sub_type=gguf.GGUFValueType.FLOAT32)
    w.add_name(os.path.basename(path))
    # A minimal tokenizer section: the forward pass needs none; the token
    # strings let tools that list tokens work on these files.
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<t{i}>" for i in range(c["n_vocab"])])
    for name, arr, is_matrix in tensors:
        if arr.dtype == np.int32:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr.astype(matrix_dtype if is_matrix else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@torch.no_grad()
def run(model, tokens):
    ids = torch.tensor([tokens], dtype=torch.long)
    prefill = model(input_ids=ids, use_cache=False).logits[0].float().numpy()
    decode = []
    past = None
    for i, t in enumerate(tokens):
        out = model(input_ids=ids[:, i:i + 1], position_ids=torch.tensor([[i]]),
                    past_key_values=past, use_cache=True)
        past = out.past_key_values
        decode.append(out.logits[0, -1].float().numpy())
    return prefill, np.stack(decode)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--f32", action="store_true", help="also write NAME.f32.gguf")
    ap.add_argument("--only")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, c in CONFIGS.items():
        if args.only and name != args.only:
            continue
        rng = np.random.default_rng(c["seed"])
        torch.manual_seed(c["seed"])
        model = DeepseekV4ForCausalLM(hf_config(c)).float().eval()
        sd = random_weights(model, c, rng)
        missing, unexpected = model.load_state_dict(sd, strict=True), None
        tokens = [int(t) for t in rng.integers(0, c["n_vocab"], c["n_tokens"])]

        tensors = gguf_tensors(model.state_dict(), c)
        write_gguf(os.path.join(args.outdir, f"{name}.f16.gguf"), c, tensors, np.float16)
        if args.f32:
            write_gguf(os.path.join(args.outdir, f"{name}.f32.gguf"), c, tensors, np.float32)

        prefill, decode = run(model, tokens)
        d = np.abs(prefill - decode).max()
        print(f"{name}: {len(tokens)} tokens, max|logit| {np.abs(prefill).max():.3f}, "
              f"HF prefill vs decode max|d| {d:.3g}", file=sys.stderr)
        with open(os.path.join(args.outdir, f"{name}.golden"), "wb") as f:
            f.write(b"DS4G")
            f.write(struct.pack("<3I", 1, len(tokens), c["n_vocab"]))
            f.write(np.asarray(tokens, dtype="<u4").tobytes())
            f.write(prefill.astype("<f4").tobytes())
            f.write(decode.astype("<f4").tobytes())


if __name__ == "__main__":
    main()
