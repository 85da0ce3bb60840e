#!/usr/bin/env python3
"""make_official_ckpt.py - a tiny DeepSeek V4 Flash checkpoint in the official
Hugging Face format, and its all-F32 GGUF reference decoded independently in
numpy.

The checkpoint has the official tensor names and encodings (FP8 E4M3 weights
with an E8M0 scale per 128x128 block, FP4 E2M1 routed experts packed two per
byte with an E8M0 scale per 32 inputs, BF16 and F32 tensors, I64 tid2eid,
three shards and model.safetensors.index.json, config.json with tiny
Flash-shaped values).  Its bytes come from a counter-based generator that
tests/unit/common/official_ckpt.c implements identically, so the C tests can
rebuild the same checkpoint without Python; the goldens written here prove
the two agree:

  tests/golden/tools/tiny_ckpt.tsv     HF name, dtype, shape, sha256 of bytes
  tests/golden/tools/tiny_ref_f32.tsv  GGUF name, ggml type, dims, sha256 of
                                       the reference tensor data (read back
                                       from the GGUFWriter file by GGUFReader)
  tests/golden/tools/tiny_ref_logits.f32
                                       the engine's logits (./ds4-forward, CPU
                                       backend, simulations on) on the reference
                                       GGUF after each of LOGIT_TOKENS, when
                                       ./ds4-forward has been built
  tests/golden/tools/st_library.safetensors
                                       a small file written by the safetensors
                                       library itself, for the reader test

Generator (version 1).  mix() is splitmix64's finaliser; tensor k (in the
order of tensor_list()) element i draws
    z = mix(SEED + GAMMA * ((k << 32) + i + 1))  (mod 2^64)
and turns it into bytes by kind:
    f32 / bf16 weight: sign z>>63, exponent 119 + ((z>>56) & 7), mantissa
                       z & 0x7fffff (f32) or z & 0x7f (bf16)
    norm (bf16):       sign 0, exponent 126 + ((z>>56) & 1), mantissa z & 0x7f
    fp8 / fp4 bytes:   z >> 56
    fp8 scale:         115 + ((z>>56) & 7)      (E8M0)
    fp4 scale:         118 + ((z>>56) & 7)      (E8M0)
    tid2eid (row t):   b = (z>>32) % n_expert, entry j = (b + j) % n_expert

Usage: .venv/bin/python tests/reference/make_official_ckpt.py [--out DIR]
(DIR gets the checkpoint and ref_f32.gguf; default build/tiny-official).
With --bench, a larger checkpoint of the same kind (hidden 1024, 16 experts
of width 1024, vocab 8192) is written to DIR for quantizer throughput
measurements, without reference or goldens.
"""
import argparse
import hashlib
import json
import os
import struct
import subprocess

import numpy as np
import gguf
from safetensors.numpy import save_file

SEED = 0x5EED0D54
LOGIT_TOKENS = "1,5,9,200,33,7,100,511"
GAMMA = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1

CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "num_hidden_layers": 4,
    "compress_ratios": [0, 0, 4, 128, 0],
    "hidden_size": 256,
    "vocab_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 128,
    "o_lora_rank": 64,
    "o_groups": 2,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 256,
    "num_hash_layers": 3,
    "sliding_window": 16,
    "index_n_heads": 4,
    "index_head_dim": 128,
    "index_topk": 512,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-06,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "routed_scaling_factor": 1.5,
    "norm_topk_prob": True,
    "max_position_embeddings": 1048576,
    "swiglu_limit": 10.0,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "num_nextn_predict_layers": 1,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
}


def mix(x):
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def draws(k, n):
    i = np.arange(n, dtype=np.uint64)
    ctr = (np.uint64(k) << np.uint64(32)) + i + np.uint64(1)
    with np.errstate(over="ignore"):
        return mix(np.uint64(SEED) + np.uint64(GAMMA) * ctr)


def top8(z):
    return (z >> np.uint64(56)).astype(np.uint8)


def tensor_list(c):
    """(HF name, dtype, shape, kind) in generation order; shard = 1..3."""
    L, d, v = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
    hc, nh, hd = c["hc_mult"], c["num_attention_heads"], c["head_dim"]
    ql, og, ol = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    ne, nu, ff = c["n_routed_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
    inh, ihd = c["index_n_heads"], c["index_head_dim"]
    mix_hc = (2 + hc) * hc
    out = []

    def add(shard, name, dtype, shape, kind):
        out.append((shard, name, dtype, list(shape), kind))

    def fp8(shard, name, o, i):
        add(shard, name + ".weight", "F8_E4M3", [o, i], "fp8")
        add(shard, name + ".scale", "F8_E8M0", [-(-o // 128), -(-i // 128)], "fp8scale")

    def fp4(shard, name, o, i):
        add(shard, name + ".weight", "I8", [o, i // 2], "fp4")
        add(shard, name + ".scale", "F8_E8M0", [o, i // 32], "fp4scale")

    add(1, "embed.weight", "BF16", [v, d], "w")
    add(1, "head.weight", "BF16", [v, d], "w")
    add(1, "norm.weight", "BF16", [d], "norm")
    add(1, "hc_head_fn", "F32", [hc, hc * d], "w")
    add(1, "hc_head_base", "F32", [hc], "w")
    add(1, "hc_head_scale", "F32", [1], "w")
    for il in range(L):
        s = 1 if il == 0 else (2 if il < 3 else 3)
        p = f"layers.{il}."
        ratio = c["compress_ratios"][il]
        for sub in ("attn", "ffn"):
            add(s, p + f"hc_{sub}_fn", "F32", [mix_hc, hc * d], "w")
            add(s, p + f"hc_{sub}_base", "F32", [mix_hc], "w")
            add(s, p + f"hc_{sub}_scale", "F32", [3], "w")
        add(s, p + "attn_norm.weight", "BF16", [d], "norm")
        add(s, p + "ffn_norm.weight", "BF16", [d], "norm")
        add(s, p + "attn.attn_sink", "F32", [nh], "w")
        fp8(s, p + "attn.wq_a", ql, d)
        add(s, p + "attn.q_norm.weight", "BF16", [ql], "norm")
        fp8(s, p + "attn.wq_b", nh * hd, ql)
        fp8(s, p + "attn.wkv", hd, d)
        add(s, p + "attn.kv_norm.weight", "BF16", [hd], "norm")
        fp8(s, p + "attn.wo_a", og * ol, nh * hd // og)
        fp8(s, p + "attn.wo_b", d, og * ol)
        if ratio:
            coff = 2 if ratio == 4 else 1
            add(s, p + "attn.compressor.ape", "F32", [ratio, coff * hd], "w")
            add(s, p + "attn.compressor.wkv.weight", "BF16", [coff * hd, d], "w")
            add(s, p + "attn.compressor.wgate.weight", "BF16", [coff * hd, d], "w")
            add(s, p + "attn.compressor.norm.weight", "BF16", [hd], "norm")
        if ratio == 4:
            fp8(s, p + "attn.indexer.wq_b", inh * ihd, ql)
            add(s, p + "attn.indexer.weights_proj.weight", "BF16", [inh, d], "w")
            add(s, p + "attn.indexer.compressor.ape", "F32", [4, 2 * ihd], "w")
            add(s, p + "attn.indexer.compressor.wkv.weight", "BF16", [2 * ihd, d], "w")
            add(s, p + "attn.indexer.compressor.wgate.weight", "BF16", [2 * ihd, d], "w")
            add(s, p + "attn.indexer.compressor.norm.weight", "BF16", [ihd], "norm")
        add(s, p + "ffn.gate.weight", "BF16", [ne, d], "w")
        if il < c["num_hash_layers"]:
            add(s, p + "ffn.gate.tid2eid", "I64", [v, nu], "tid2eid")
        else:
            add(s, p + "ffn.gate.bias", "F32", [ne], "w")
        for e in range(ne):
            fp4(s, p + f"ffn.experts.{e}.w1", ff, d)
            fp4(s, p + f"ffn.experts.{e}.w2", d, ff)
            fp4(s, p + f"ffn.experts.{e}.w3", ff, d)
        fp8(s, p + "ffn.shared_experts.w1", ff, d)
        fp8(s, p + "ffn.shared_experts.w2", d, ff)
        fp8(s, p + "ffn.shared_experts.w3", ff, d)
    add(3, "mtp.0.enorm.weight", "BF16", [d], "norm")
    return out


def generate(k, dtype, shape, kind, n_expert):
    """Raw little-endian bytes of tensor k, as a numpy array of its storage type."""
    n = int(np.prod(shape)) if shape else 1
    if kind == "tid2eid":
        rows, cols = shape
        b = (draws(k, rows) >> np.uint64(32)) % np.uint64(n_expert)
        j = np.arange(cols, dtype=np.uint64)
        return ((b[:, None] + j[None, :]) % np.uint64(n_expert)).astype(np.int64)
    z = draws(k, n).reshape(shape)
    if kind in ("fp8", "fp4"):
        return top8(z)
    if kind == "fp8scale":
        return np.uint8(115) + (top8(z) & np.uint8(7))
    if kind == "fp4scale":
        return np.uint8(118) + (top8(z) & np.uint8(7))
    if kind == "norm":
        exp = np.uint16(126) + (top8(z) & np.uint8(1)).astype(np.uint16)
        return (exp << np.uint16(7)) | (z & np.uint64(0x7F)).astype(np.uint16)
    sign = (z >> np.uint64(63)).astype(np.uint32)
    exp = np.uint32(119) + (top8(z) & np.uint8(7)).astype(np.uint32)
    if dtype == "F32":
        return (sign << np.uint32(31)) | (exp << np.uint32(23)) | (z & np.uint64(0x7FFFFF)).astype(np.uint32)
    bits = (sign << np.uint32(15)) | (exp << np.uint32(7)) | (z & np.uint64(0x7F)).astype(np.uint32)
    return bits.astype(np.uint16)


# ------------------------------------------------------------- decoding

def fp8_e4m3_to_f64(b):
    b = b.astype(np.int64)
    e, m, neg = (b >> 3) & 15, b & 7, (b & 0x80) != 0
    v = np.where(e == 0, m * 2.0 ** -9, (1.0 + m / 8.0) * np.exp2(e - 7.0))
    v = np.where(neg, -v, v)
    return np.where((b & 0x7F) == 0x7F, 0.0, v)  # both NaN codes decode to +0 (ds4's rule)


def e8m0_to_f64(b):
    return np.exp2(b.astype(np.float64) - 127.0)


FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def decode_fp8(w, s):
    rows, cols = w.shape
    scale = np.repeat(np.repeat(e8m0_to_f64(s), 128, axis=0), 128, axis=1)[:rows, :cols]
    return (fp8_e4m3_to_f64(w) * scale).astype(np.float32)


def decode_fp4(w, s):
    rows = w.shape[0]
    vals = np.empty((rows, w.shape[1] * 2))
    vals[:, 0::2] = FP4[w & 15]
    vals[:, 1::2] = FP4[w >> 4]
    return (vals * np.repeat(e8m0_to_f64(s), 32, axis=1)).astype(np.float32)


def decode_plain(a, dtype):
    if dtype == "F32":
        return a.view(np.float32)
    return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)  # BF16


# ------------------------------------------------------------- GGUF map

GLOBAL = {"embed.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
          "head.weight": "output.weight", "hc_head_base": "output_hc_base.weight",
          "hc_head_fn": "output_hc_fn.weight", "hc_head_scale": "output_hc_scale.weight"}
LAYER = {
    "hc_attn_base": "hc_attn_base.weight", "hc_attn_fn": "hc_attn_fn.weight",
    "hc_attn_scale": "hc_attn_scale.weight", "hc_ffn_base": "hc_ffn_base.weight",
    "hc_ffn_fn": "hc_ffn_fn.weight", "hc_ffn_scale": "hc_ffn_scale.weight",
    "attn_norm.weight": "attn_norm.weight", "ffn_norm.weight": "ffn_norm.weight",
    "attn.attn_sink": "attn_sinks.weight", "attn.wq_a": "attn_q_a.weight",
    "attn.q_norm.weight": "attn_q_a_norm.weight", "attn.wq_b": "attn_q_b.weight",
    "attn.wkv": "attn_kv.weight", "attn.kv_norm.weight": "attn_kv_a_norm.weight",
    "attn.wo_a": "attn_output_a.weight", "attn.wo_b": "attn_output_b.weight",
    "attn.compressor.ape": "attn_compressor_ape.weight",
    "attn.compressor.wkv.weight": "attn_compressor_kv.weight",
    "attn.compressor.wgate.weight": "attn_compressor_gate.weight",
    "attn.compressor.norm.weight": "attn_compressor_norm.weight",
    "attn.indexer.wq_b": "indexer.attn_q_b.weight",
    "attn.indexer.weights_proj.weight": "indexer.proj.weight",
    "attn.indexer.compressor.ape": "indexer_compressor_ape.weight",
    "attn.indexer.compressor.wkv.weight": "indexer_compressor_kv.weight",
    "attn.indexer.compressor.wgate.weight": "indexer_compressor_gate.weight",
    "attn.indexer.compressor.norm.weight": "indexer_compressor_norm.weight",
    "ffn.gate.weight": "ffn_gate_inp.weight", "ffn.gate.bias": "exp_probs_b.bias",
    "ffn.gate.tid2eid": "ffn_gate_tid2eid.weight",
    "ffn.shared_experts.w1": "ffn_gate_shexp.weight", "ffn.shared_experts.w3": "ffn_up_shexp.weight",
    "ffn.shared_experts.w2": "ffn_down_shexp.weight",
}
EXPERT = {"w1": "ffn_gate_exps.weight", "w3": "ffn_up_exps.weight", "w2": "ffn_down_exps.weight"}
# ds4 tensor order inside a layer (layout.c): attention, compressor, indexer, ffn.
LAYER_ORDER = ["hc_attn_fn.weight", "hc_attn_scale.weight", "hc_attn_base.weight", "attn_norm.weight",
               "attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight", "attn_kv.weight",
               "attn_kv_a_norm.weight", "attn_sinks.weight", "attn_output_a.weight", "attn_output_b.weight",
               "attn_compressor_ape.weight", "attn_compressor_kv.weight", "attn_compressor_gate.weight",
               "attn_compressor_norm.weight", "indexer.attn_q_b.weight", "indexer.proj.weight",
               "indexer_compressor_ape.weight", "indexer_compressor_kv.weight",
               "indexer_compressor_gate.weight", "indexer_compressor_norm.weight", "hc_ffn_fn.weight",
               "hc_ffn_scale.weight", "hc_ffn_base.weight", "ffn_norm.weight", "ffn_gate_inp.weight",
               "exp_probs_b.bias", "ffn_gate_tid2eid.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
               "ffn_down_exps.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
               "ffn_down_shexp.weight"]
GLOBAL_ORDER = ["token_embd.weight", "output_hc_base.weight", "output_hc_fn.weight",
                "output_hc_scale.weight", "output_norm.weight", "output.weight"]


def decode_all(c, raw):
    """GGUF name -> numpy array (row-major, HF orientation) decoded from raw."""
    out, experts = {}, {}
    for name, (dtype, arr) in raw.items():
        if name.endswith(".scale") or name.startswith("mtp."):
            continue
        base = name[:-len(".weight")] if dtype in ("F8_E4M3", "I8") else name
        if dtype == "F8_E4M3":
            val = decode_fp8(arr, raw[base + ".scale"][1])
        elif dtype == "I8":
            val = decode_fp4(arr, raw[base + ".scale"][1])
        elif dtype == "I64":
            val = arr.astype(np.int32)
        else:
            val = decode_plain(arr, dtype)
        if not name.startswith("layers."):
            out[GLOBAL[name]] = val
            continue
        _, il, rest = base.split(".", 2)
        if rest.startswith("ffn.experts."):
            _, _, e, part = rest.split(".")
            experts.setdefault((int(il), part), {})[int(e)] = val
            continue
        out[f"blk.{il}.{LAYER[rest]}"] = val
    for (il, part), per in experts.items():
        out[f"blk.{il}.{EXPERT[part]}"] = np.stack([per[e] for e in range(len(per))])
    return out


def write_reference(c, decoded, path):
    w = gguf.GGUFWriter(path, "deepseek4")
    w.add_name("tiny official reference")
    k = "deepseek4."
    u32 = {"block_count": c["num_hidden_layers"], "embedding_length": c["hidden_size"],
           "vocab_size": c["vocab_size"], "attention.head_count": c["num_attention_heads"],
           "attention.head_count_kv": c["num_key_value_heads"], "attention.key_length": c["head_dim"],
           "attention.value_length": c["head_dim"], "rope.dimension_count": c["qk_rope_head_dim"],
           "attention.q_lora_rank": c["q_lora_rank"], "attention.output_lora_rank": c["o_lora_rank"],
           "attention.output_group_count": c["o_groups"], "expert_count": c["n_routed_experts"],
           "expert_used_count": c["num_experts_per_tok"], "expert_shared_count": c["n_shared_experts"],
           "expert_feed_forward_length": c["moe_intermediate_size"], "hash_layer_count": c["num_hash_layers"],
           "attention.sliding_window": c["sliding_window"], "attention.indexer.head_count": c["index_n_heads"],
           "attention.indexer.key_length": c["index_head_dim"], "attention.indexer.top_k": c["index_topk"],
           "hyper_connection.count": c["hc_mult"], "hyper_connection.sinkhorn_iterations": c["hc_sinkhorn_iters"],
           "rope.scaling.original_context_length": c["rope_scaling"]["original_max_position_embeddings"]}
    for key, val in u32.items():
        w.add_uint32(k + key, val)
    f32 = {"hyper_connection.epsilon": c["hc_eps"], "attention.layer_norm_rms_epsilon": c["rms_norm_eps"],
           "rope.freq_base": c["rope_theta"], "attention.compress_rope_freq_base": c["compress_rope_theta"],
           "rope.scaling.factor": c["rope_scaling"]["factor"],
           "rope.scaling.yarn_beta_fast": c["rope_scaling"]["beta_fast"],
           "rope.scaling.yarn_beta_slow": c["rope_scaling"]["beta_slow"],
           "expert_weights_scale": c["routed_scaling_factor"]}
    for key, val in f32.items():
        w.add_float32(k + key, float(val))
    w.add_uint64(k + "context_length", c["max_position_embeddings"])
    w.add_bool(k + "expert_weights_norm", c["norm_topk_prob"])
    L = c["num_hidden_layers"]
    w.add_array(k + "attention.compress_ratios", [int(r) for r in c["compress_ratios"][:L]])
    w.add_array(k + "swiglu_clamp_exp", [float(c["swiglu_limit"])] * L)
    names = list(GLOBAL_ORDER)
    for il in range(L):
        names += [f"blk.{il}.{n}" for n in LAYER_ORDER if f"blk.{il}.{n}" in decoded]
    assert sorted(names) == sorted(decoded), set(decoded) ^ set(names)
    for n in names:
        w.add_tensor(n, decoded[n])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha(b):
    return hashlib.sha256(b).hexdigest()


def write_checkpoint(c, raw, shards, out):
    files = {s: f"model-{s:05d}-of-00003.safetensors" for s in (1, 2, 3)}
    for s in (1, 2, 3):
        names = [n for n in raw if shards[n] == s]
        header, blob = {"__metadata__": {"format": "pt"}}, b""
        for n in names:
            dtype, arr = raw[n]
            data = arr.tobytes()
            header[n] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [len(blob), len(blob) + len(data)]}
            blob += data
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        with open(os.path.join(out, files[s]), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + blob)
    index = {"metadata": {"total_size": sum(raw[n][1].nbytes for n in raw)},
             "weight_map": {n: files[shards[n]] for n in raw}}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)


def write_library_sample(path):
    """A file from the safetensors library itself (numpy dtypes only)."""
    save_file({"a.f32": np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5,
               "b.f16": np.array([1.5, -2.0, 65504.0], dtype=np.float16),
               "c.i64": np.array([[-1, 7], [1 << 40, 0]], dtype=np.int64),
               "d.i8": np.array([-128, 0, 127, 5], dtype=np.int8)},
              path, metadata={"format": "pt"})
    os.chmod(path, 0o644)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/tiny-official")
    ap.add_argument("--golden", default="tests/golden/tools")
    ap.add_argument("--bench", action="store_true")
    a = ap.parse_args()
    if a.bench:
        CONFIG.update(hidden_size=1024, vocab_size=8192, n_routed_experts=16, moe_intermediate_size=1024)
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.golden, exist_ok=True)
    raw, shards = {}, {}
    for k, (s, name, dtype, shape, kind) in enumerate(tensor_list(CONFIG)):
        arr = generate(k, dtype, shape, kind, CONFIG["n_routed_experts"])
        assert list(arr.shape) == shape, (name, arr.shape, shape)
        raw[name], shards[name] = (dtype, arr), s
    write_checkpoint(CONFIG, raw, shards, a.out)
    if a.bench:
        print(f"{len(raw)} checkpoint tensors -> {a.out}")
        return
    with open(os.path.join(a.golden, "tiny_ckpt.tsv"), "w") as f:
        for n, (dtype, arr) in raw.items():
            f.write(f"{n}\t{dtype}\t{','.join(map(str, arr.shape))}\t{sha(arr.tobytes())}\n")

    ref = os.path.join(a.out, "ref_f32.gguf")
    write_reference(CONFIG, decode_all(CONFIG, raw), ref)
    r = gguf.GGUFReader(ref)
    with open(os.path.join(a.golden, "tiny_ref_f32.tsv"), "w") as f:
        for t in r.tensors:
            dims = ",".join(str(int(x)) for x in t.shape)
            f.write(f"{t.name}\t{int(t.tensor_type)}\t{dims}\t{sha(t.data.tobytes())}\n")
    write_library_sample(os.path.join(a.golden, "st_library.safetensors"))
    if os.path.exists("./ds4-forward"):
        out = os.path.join(a.golden, "tiny_ref_logits.f32")
        subprocess.run(["./ds4-forward", ref, "--tokens", LOGIT_TOKENS, "--logits-out", out, "-t", "1"],
                       check=True, stdout=subprocess.DEVNULL)
    print(f"{len(raw)} checkpoint tensors, {len(r.tensors)} reference tensors -> {a.out}, {a.golden}")


if __name__ == "__main__":
    main()
