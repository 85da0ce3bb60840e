"""export.py - the trained model as ds4 GGUF files (docs/MODEL.md 2): the
main model with its tokenizer, and the MTP block as a file of its own
(mtp.0.* tensors with the main model's deepseek4.* metadata, docs/MODEL.md
9), written by a small GGUF v3 writer of its own so that training needs no
other package.

Recipes:
  f32   every float tensor F32 (the reference for the NLL check)
  q8_0  matrices Q8_0 (blocks of 32: an f16 scale max|x|/127 and 32 int8);
        the HC mixers, compressor APEs and routers F16; vectors F32; the
        hash table I32
"""
import struct

import numpy as np

from model import COMPRESS_ROPE_BASE, EPS, ROPE_BASE, ROUTE_SCALE, SINKHORN, SWIGLU_LIMIT, YARN

GGML_F32, GGML_F16, GGML_Q8_0, GGML_I32 = 0, 1, 8, 26
V_U8, V_I8, V_U16, V_I16, V_U32, V_I32, V_F32, V_BOOL, V_STR, V_ARR, V_U64 = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
ALIGN = 32
F16_NAMES = ("hc_attn_fn.weight", "hc_ffn_fn.weight", "output_hc_fn.weight", "hc_head_fn.weight",
             "compressor_ape.weight", "ffn_gate_inp.weight")


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype, v):
    if vtype == V_STR:
        return _str(v)
    fmt = {V_U8: "<B", V_I8: "<b", V_U16: "<H", V_I16: "<h", V_U32: "<I", V_I32: "<i", V_F32: "<f",
           V_BOOL: "<?", V_U64: "<Q"}[vtype]
    return struct.pack(fmt, v)


class Writer:
    """Metadata and tensors in declaration order; write() lays them out."""

    def __init__(self):
        self.kv = []
        self.tensors = []

    def add(self, key, vtype, value):
        self.kv.append(_str(key) + struct.pack("<I", vtype) + _value(vtype, value))

    def add_array(self, key, vtype, values):
        body = b"".join(_value(vtype, v) for v in values)
        self.kv.append(_str(key) + struct.pack("<IIQ", V_ARR, vtype, len(values)) + body)

    def add_tensor(self, name, arr, ggml_type):
        """arr in numpy (row-major) shape: GGUF dims are its axes reversed."""
        arr = np.ascontiguousarray(arr)
        if ggml_type == GGML_F32:
            data = arr.astype("<f4").tobytes()
        elif ggml_type == GGML_F16:
            data = arr.astype("<f2").tobytes()
        elif ggml_type == GGML_I32:
            data = arr.astype("<i4").tobytes()
        elif ggml_type == GGML_Q8_0:
            data = q8_0(arr)
        else:
            raise ValueError(f"{name}: type {ggml_type}")
        self.tensors.append((name, list(reversed(arr.shape)), ggml_type, data))

    def write(self, path):
        head = b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)) + b"".join(self.kv)
        infos, off = [], 0
        for name, dims, t, data in self.tensors:
            infos.append(_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
                         + struct.pack("<IQ", t, off))
            off += len(data) + (-len(data) % ALIGN)
        head += b"".join(infos)
        head += b"\0" * (-len(head) % ALIGN)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(head)
            for _, _, _, data in self.tensors:
                f.write(data)
                f.write(b"\0" * (-len(data) % ALIGN))
        import os
        os.replace(tmp, path)


def q8_0(arr):
    x = arr.astype(np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    q = np.clip(np.rint(x * inv[:, None]), -127, 127).astype(np.int8)
    blocks = np.zeros(len(x), dtype=[("d", "<f2"), ("q", "i1", 32)])
    blocks["d"] = d.astype(np.float16)
    blocks["q"] = q
    return blocks.tobytes()


def tensor_type(name, arr, recipe):
    if arr.dtype.kind in "iu":
        return GGML_I32
    if arr.ndim == 1 or recipe == "f32":
        return GGML_F32
    if name.endswith(F16_NAMES):
        return GGML_F16
    if arr.shape[-1] % 32 == 0:
        return GGML_Q8_0
    return GGML_F16


def main_tensors(sd, c):
    """(ds4 name, array in HF shape) of the main model (tests/reference/
    hf_golden.py maps the same names)."""
    g = lambda k: sd[k]
    ts = [
        ("token_embd.weight", g("model.embed_tokens.weight")),
        ("output_hc_base.weight", g("model.hc_head.hc_base")),
        ("output_hc_fn.weight", g("model.hc_head.hc_fn")),
        ("output_hc_scale.weight", g("model.hc_head.hc_scale")),
        ("output_norm.weight", g("model.norm.weight")),
        ("output.weight", g("lm_head.weight")),
    ]
    for il in range(c["n_layer"]):
        ts += layer_tensors(sd, f"model.layers.{il}.", f"blk.{il}.", c, c["ratios"][il], il < c["n_hash"])
    return ts


def layer_tensors(sd, p, b, c, ratio, hashed):
    g = lambda k: sd[k]
    a = p + "self_attn."
    ts = [
        (b + "hc_attn_fn.weight", g(p + "attn_hc.fn")),
        (b + "hc_attn_scale.weight", g(p + "attn_hc.scale")),
        (b + "hc_attn_base.weight", g(p + "attn_hc.base")),
        (b + "attn_norm.weight", g(p + "input_layernorm.weight")),
        (b + "attn_q_a.weight", g(a + "q_a_proj.weight")),
        (b + "attn_q_a_norm.weight", g(a + "q_a_norm.weight")),
        (b + "attn_q_b.weight", g(a + "q_b_proj.weight")),
        (b + "attn_kv.weight", g(a + "kv_proj.weight")),
        (b + "attn_kv_a_norm.weight", g(a + "kv_norm.weight")),
        (b + "attn_sinks.weight", g(a + "sinks")),
        (b + "attn_output_a.weight", g(a + "o_a_proj.weight")),
        (b + "attn_output_b.weight", g(a + "o_b_proj.weight")),
    ]
    if ratio:
        cp = a + "compressor."
        ts += [
            (b + "attn_compressor_ape.weight", g(cp + "position_bias")),
            (b + "attn_compressor_kv.weight", g(cp + "kv_proj.weight")),
            (b + "attn_compressor_gate.weight", g(cp + "gate_proj.weight")),
            (b + "attn_compressor_norm.weight", g(cp + "kv_norm.weight")),
        ]
    if ratio == 4:
        ix = a + "compressor.indexer."
        ts += [
            (b + "indexer.attn_q_b.weight", g(ix + "q_b_proj.weight")),
            (b + "indexer.proj.weight", g(ix + "scorer.weights_proj.weight")),
            (b + "indexer_compressor_ape.weight", g(ix + "position_bias")),
            (b + "indexer_compressor_kv.weight", g(ix + "kv_proj.weight")),
            (b + "indexer_compressor_gate.weight", g(ix + "gate_proj.weight")),
            (b + "indexer_compressor_norm.weight", g(ix + "kv_norm.weight")),
        ]
    m = p + "mlp."
    F = c["n_ff"]
    gate_up = g(m + "experts.gate_up_proj")   # [E, 2F, D]: gate rows first
    ts += [
        (b + "hc_ffn_fn.weight", g(p + "ffn_hc.fn")),
        (b + "hc_ffn_scale.weight", g(p + "ffn_hc.scale")),
        (b + "hc_ffn_base.weight", g(p + "ffn_hc.base")),
        (b + "ffn_norm.weight", g(p + "post_attention_layernorm.weight")),
        (b + "ffn_gate_inp.weight", g(m + "gate.weight")),
    ]
    if hashed:
        ts.append((b + "ffn_gate_tid2eid.weight", g(m + "gate.tid2eid").astype(np.int32)))
    else:
        ts.append((b + "exp_probs_b.bias", g(m + "gate.e_score_correction_bias")))
    ts += [
        (b + "ffn_gate_exps.weight", gate_up[:, :F, :]),
        (b + "ffn_up_exps.weight", gate_up[:, F:, :]),
        (b + "ffn_down_exps.weight", g(m + "experts.down_proj")),
        (b + "ffn_gate_shexp.weight", g(m + "shared_experts.gate_proj.weight")),
        (b + "ffn_up_shexp.weight", g(m + "shared_experts.up_proj.weight")),
        (b + "ffn_down_shexp.weight", g(m + "shared_experts.down_proj.weight")),
    ]
    return ts


def mtp_tensors(sd, c):
    """(name, array) of the MTP block (docs/MODEL.md 2.5)."""
    p = "mtp.0."
    ts = [
        (p + "hc_head_base.weight", sd["hc_head.hc_base"]),
        (p + "hc_head_fn.weight", sd["hc_head.hc_fn"]),
        (p + "hc_head_scale.weight", sd["hc_head.hc_scale"]),
        (p + "e_proj.weight", sd["e_proj.weight"]),
        (p + "h_proj.weight", sd["h_proj.weight"]),
        (p + "enorm.weight", sd["enorm.weight"]),
        (p + "hnorm.weight", sd["hnorm.weight"]),
        (p + "norm.weight", sd["norm.weight"]),
    ]
    return ts + layer_tensors(sd, "block.", p, c, 0, False)


def add_metadata(w, c, name, ctx):
    w.add("general.architecture", V_STR, "deepseek4")
    w.add("general.name", V_STR, name)
    w.add("general.type", V_STR, "model")
    w.add("general.license", V_STR, "MIT")
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
        w.add(K(k), V_U32, v)
    w.add(K("context_length"), V_U64, ctx)
    f32 = {
        "hyper_connection.epsilon": EPS, "attention.layer_norm_rms_epsilon": EPS,
        "rope.freq_base": ROPE_BASE, "attention.compress_rope_freq_base": COMPRESS_ROPE_BASE,
        "rope.scaling.factor": YARN["factor"], "rope.scaling.yarn_beta_fast": YARN["beta_fast"],
        "rope.scaling.yarn_beta_slow": YARN["beta_slow"], "expert_weights_scale": ROUTE_SCALE,
    }
    for k, v in f32.items():
        w.add(K(k), V_F32, v)
    w.add(K("expert_weights_norm"), V_BOOL, True)
    w.add_array(K("attention.compress_ratios"), V_U32, c["ratios"])
    w.add_array(K("swiglu_clamp_exp"), V_F32, [SWIGLU_LIMIT] * c["n_layer"])


def add_tokenizer(w, tokens, types, merges, bos, eos, pad):
    w.add("tokenizer.ggml.model", V_STR, "gpt2")
    w.add("tokenizer.ggml.pre", V_STR, "joyai-llm")
    w.add_array("tokenizer.ggml.tokens", V_STR, tokens)
    w.add_array("tokenizer.ggml.token_type", V_I32, types)
    w.add_array("tokenizer.ggml.merges", V_STR, merges)
    w.add("tokenizer.ggml.bos_token_id", V_U32, bos)
    w.add("tokenizer.ggml.eos_token_id", V_U32, eos)
    w.add("tokenizer.ggml.padding_token_id", V_U32, pad)
    w.add("tokenizer.ggml.add_bos_token", V_BOOL, True)
    w.add("tokenizer.ggml.add_eos_token", V_BOOL, False)


def write_model(path, c, tensors, recipe, name, ctx, tokenizer=None, extra=()):
    """tensors: (name, numpy array); tokenizer: add_tokenizer's arguments;
    extra: (key, vtype, value) records (training provenance)."""
    w = Writer()
    add_metadata(w, c, name, ctx)
    for k, t, v in extra:
        w.add(k, t, v)
    if tokenizer:
        add_tokenizer(w, *tokenizer)
    for n, arr in tensors:
        w.add_tensor(n, arr, tensor_type(n, arr, recipe))
    w.write(path)
