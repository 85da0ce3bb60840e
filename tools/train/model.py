"""model.py - the small DeepSeek V4 model: its config, the main model
(HF transformers' DeepseekV4ForCausalLM, whose forward pass the engine
matches: tests/reference/hf_golden.py) and the MTP block (the official
MTPBlock from transformers' own modules, as tests/reference/mtp_golden.py
builds it: docs/MODEL.md 9).
"""
import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf_v4

# Flash's architecture at a small size: two window-only layers, then ratio 4
# (with the indexer) and ratio 128 alternating; three hash-routed layers; a
# shared expert; YaRN on the compressed layers; four HC streams.
SMALL = dict(
    n_layer=6, ratios=[0, 0, 4, 128, 4, 128], n_hash=3,
    n_embd=256, n_vocab=4096, n_head=4, head_dim=128, rope_dim=64,
    q_lora=128, o_groups=2, o_lora=128,
    n_expert=8, n_used=2, n_ff=256,
    window=128, idx_heads=4, idx_dim=128, top_k=32, n_hc=4,
)

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
        norm_topk_prob=True, routed_scaling_factor=ROUTE_SCALE, rope_theta=ROPE_BASE,
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
        attn_implementation="eager", tie_word_embeddings=False, initializer_range=0.02,
    )


class MTP(torch.nn.Module):
    """The MTP block: e = enorm(embed(t)) through e_proj plus each stream of
    the main model's final residual through hnorm and h_proj, one dense
    sliding-window layer with biased top-k routing, its own HC head and norm,
    then the main model's lm_head."""

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
    return hf_config(dict(c, n_layer=1, ratios=[0], n_hash=0))


class Small(torch.nn.Module):
    """The main model and its MTP block, with the main model's final residual
    (the input of its HC head) and layer arguments captured for the block."""

    def __init__(self, c, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.c = c
        self.main = DeepseekV4ForCausalLM(hf_config(c))
        mcfg = mtp_config(c)
        mcfg._experts_implementation = self.main.config._experts_implementation
        self.mtp = MTP(mcfg)
        self.main.model.layers[0].register_forward_pre_hook(self._grab_kwargs, with_kwargs=True)
        self.main.model.hc_head.register_forward_pre_hook(self._grab_residual)
        self._cap = {}
        self.indexers = [IndexerDistill(layer.self_attn, self._cap) for layer, r in
                         zip(self.main.model.layers, c["ratios"]) if r == 4]
        init_mtp(self.mtp)
        with torch.no_grad():   # hash routing: n_used distinct experts per token id
            for layer in self.main.model.layers[: c["n_hash"]]:
                t = torch.stack([torch.randperm(c["n_expert"], generator=g)[: c["n_used"]]
                                 for _ in range(c["n_vocab"])])
                layer.mlp.gate.tid2eid.copy_(t)

    def _grab_kwargs(self, mod, args, kwargs):
        self._cap["kw"] = kwargs

    def _grab_residual(self, mod, args):
        self._cap["h"] = args[0]

    def forward(self, ids):
        """Logits of the main model for ids[:, :-1], of the MTP block for
        its pairing (residual at i, token i + 1 -> token i + 2), and the
        indexers' distillation loss (IndexerDistill)."""
        x = ids[:, :-1]
        self._cap["idx_losses"] = []
        logits = self.main(input_ids=x, use_cache=False).logits
        h, kw = self._cap.pop("h"), self._cap.pop("kw")
        idx = self._cap.pop("idx_losses")
        idx_loss = torch.stack(idx).mean() if idx else logits.new_zeros(())
        m = self.mtp
        nxt = ids[:, 1:]
        e = m.e_proj(m.enorm(self.main.model.embed_tokens(nxt))).unsqueeze(2)
        y = m.block(e + m.h_proj(m.hnorm(h)), position_embeddings=kw["position_embeddings"],
                    position_ids=kw["position_ids"], attention_mask=kw["attention_mask"], input_ids=nxt,
                    past_key_values=None)
        mtp_logits = self.main.lm_head(m.norm(m.hc_head(y)))
        return logits, mtp_logits, idx_loss


class IndexerDistill:
    """The lightning indexer's training signal.  Its top-k selection has no
    gradient, so, as DeepSeek trains it, its scores learn from the main
    attention: the loss is KL(p || softmax(index scores)) over the visible
    compressed rows, p the attention's softmax over those rows (queries
    after RoPE against the compressed KV, averaged over heads, no gradient).
    The indexer sees its inputs detached, so this loss trains the indexer
    alone, and the language-model loss never reaches it."""

    def __init__(self, attn, cap):
        self.attn, self.cap, self.q = attn, cap, None
        comp = attn.compressor
        self.ratio = comp.compress_rate
        attn.q_b_norm.register_forward_hook(self._grab_q)
        comp.indexer.register_forward_pre_hook(self._detach_inputs)
        comp.indexer.scorer.register_forward_hook(self._grab_scores)
        comp.register_forward_hook(self._loss)

    def _grab_q(self, mod, args, out):
        self.q = out                                  # [B, H, S, D] before RoPE

    @staticmethod
    def _detach_inputs(mod, args):
        return tuple(a.detach() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    def _grab_scores(self, mod, args, out):
        self.scores = out                             # [B, S, T]

    def _loss(self, mod, args, out):
        if "idx_losses" not in self.cap or "kw" not in self.cap:
            return
        ckv = out[0].detach()[:, 0].float()            # [B, T, D]
        t = ckv.shape[1]
        if t == 0:
            return
        cos, sin = self.cap["kw"]["position_embeddings"]["compress"]
        pos = args[2]                                 # position_ids [1 or B, S]
        with torch.no_grad():
            q = hf_v4.apply_rotary_pos_emb(self.q.detach(), cos, sin).float()
            logits = torch.einsum("bhsd,btd->bhst", q, ckv) * self.attn.scaling
            future = torch.arange(t, device=ckv.device)[None, :] >= ((pos + 1) // self.ratio)[..., None]  # [.,S,T]
            logits = logits.masked_fill(future[:, None], float("-inf"))
            seen = ~future.all(-1)                    # queries with a visible row
            p = torch.softmax(logits, dim=-1).nan_to_num(0.0).mean(1)       # [B, S, T]
        # a finite fill: a query with no visible row gets a uniform (unused)
        # distribution instead of NaN gradients
        logq = torch.log_softmax(self.scores.float().masked_fill(future, -1e9), dim=-1)
        kl = (p * (torch.log(p.clamp_min(1e-20)) - logq.masked_fill(future, 0.0))).sum(-1)  # [B, S]
        seen = seen.expand_as(kl)
        self.cap["idx_losses"].append(kl[seen].mean())
        self.q = self.scores = None


def init_mtp(m):
    """The block's parameters as the main model's _init_weights sets them."""
    std = 0.02
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name.endswith(("sinks", "position_bias", ".base", "hc_base")):
                p.zero_()
            elif name.endswith((".scale", "hc_scale")):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)
        m.block.mlp.gate.e_score_correction_bias.zero_()


def routers(model):
    """The learned-routing gates (with a selection bias) of the main model and
    the block, for the auxiliary-loss-free balancing update."""
    return [mod for mod in model.modules() if isinstance(mod, hf_v4.DeepseekV4TopKRouter)]
