#!/usr/bin/env python3
"""pro_config.py - DeepSeek V4 Pro's shapes as the deepseek4.* GGUF keys
(docs/MODEL.md 1.1), taken from PyPI nano-deepseek-v4 0.2.0's
DeepSeekV4Config.pro() (an independent public reference; no official Pro
config.json was at hand): the golden tests/suite/pro_shapes.sh holds the
metadata of `ds4-mkmodel --preset pro` to.

Usage: .venv/bin/python tests/reference/pro_config.py [--out PATH]
  (default tests/golden/tools/pro_config.json; pinned in requirements-hf.txt)
"""
import argparse
import json
import os

from nano_deepseek_v4.config import DeepSeekV4Config

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def keys(c):
    ratios = list(c.compress_ratios)
    if len(ratios) == c.num_hidden_layers + 1:  # the MTP layer's trailing 0
        ratios = ratios[:-1]
    return {
        "deepseek4.block_count": c.num_hidden_layers,
        "deepseek4.embedding_length": c.hidden_size,
        "deepseek4.vocab_size": c.vocab_size,
        "deepseek4.attention.head_count": c.num_attention_heads,
        "deepseek4.attention.head_count_kv": c.num_key_value_heads,
        "deepseek4.attention.key_length": c.head_dim,
        "deepseek4.attention.value_length": c.head_dim,
        "deepseek4.rope.dimension_count": c.qk_rope_head_dim,
        "deepseek4.attention.q_lora_rank": c.q_lora_rank,
        "deepseek4.attention.output_lora_rank": c.o_lora_rank,
        "deepseek4.attention.output_group_count": c.o_groups,
        "deepseek4.expert_count": c.n_routed_experts,
        "deepseek4.expert_used_count": c.num_experts_per_tok,
        "deepseek4.expert_shared_count": c.n_shared_experts,
        "deepseek4.expert_feed_forward_length": c.moe_intermediate_size,
        "deepseek4.expert_weights_scale": c.routed_scaling_factor,
        "deepseek4.hash_layer_count": c.num_hash_layers,
        "deepseek4.attention.sliding_window": c.sliding_window,
        "deepseek4.attention.indexer.head_count": c.index_n_heads,
        "deepseek4.attention.indexer.key_length": c.index_head_dim,
        "deepseek4.attention.indexer.top_k": c.index_topk,
        "deepseek4.hyper_connection.count": c.hc_mult,
        "deepseek4.hyper_connection.sinkhorn_iterations": c.hc_sinkhorn_iters,
        "deepseek4.rope.freq_base": c.rope_theta,
        "deepseek4.attention.compress_rope_freq_base": c.compress_rope_theta,
        "deepseek4.context_length": c.max_position_embeddings,
        "deepseek4.attention.compress_ratios": ratios,
        "deepseek4.swiglu_clamp_exp": [c.swiglu_limit] * c.num_hidden_layers,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "tools", "pro_config.json"))
    args = ap.parse_args()
    with open(args.out, "w") as f:
        json.dump(keys(DeepSeekV4Config.pro()), f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
