#!/usr/bin/env python3
"""train.py - train the small DeepSeek V4 model that `make demo` runs, and
export it as ds4 GGUF files (docs/TRAINING.md).

  python3 tools/train/train.py OUTDIR [--steps N] [--seed S] [--preset small|check]

Steps, all from the seed: the corpus (corpus.py: the running Python's
standard library), a byte-level BPE tokenizer on its training split
(bpe.py), the model (model.py: transformers' DeepseekV4ForCausalLM plus the
MTP block) trained with AdamW on random windows of the token stream, the
main loss plus MTP_WEIGHT times the MTP block's plus the lightning
indexers' distillation loss (model.IndexerDistill), the learned routers' biases
balanced without an auxiliary loss (bias += BIAS_RATE * sign(mean load -
load) after each step); then the held-out evaluation and the export.

OUTDIR receives:
  ds4-small.gguf, ds4-small-mtp.gguf          Q8_0 (what the repository ships)
  ds4-small-f32.gguf, ds4-small-mtp-f32.gguf  F32 (the NLL check's reference)
  tokenizer.json                              the tokenizer (HF format)
  held_out.txt                                held-out text for the NLL check
  summary.json                                config, corpus, losses, the
                                              torch NLL of held_out.txt
  train.log                                   the run's log
The preset "check" is a model of the same architecture small enough for a
CPU pipeline test (tests/suite/train_check.sh) in a few seconds of training.
"""
import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import corpus  # noqa: E402
import export  # noqa: E402
from model import SMALL, Small, routers  # noqa: E402

PRESETS = {
    "small": dict(SMALL),
    # same architecture, every dimension small: a CPU pipeline check
    "check": dict(SMALL, n_embd=64, n_vocab=600, q_lora=32, o_lora=32, n_ff=64, n_expert=4, top_k=8),
}
MTP_WEIGHT = 0.3
BIAS_RATE = 1e-3
HELD_OUT_TEXT_BYTES = 12000   # held_out.txt: the start of the held-out split
PPL_CONTEXT = 32              # ds4 --perplexity-file: tokens before the first scored one


class Log:
    def __init__(self, path):
        self.f = open(path, "w")
        self.t0 = time.time()

    def __call__(self, msg):
        line = f"[{time.time() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def token_stream(tok, docs, ids):
    """One int32 stream of the documents, each after BOS."""
    plain = [d for d in docs if isinstance(d, str)]
    chats = [d for d in docs if not isinstance(d, str)]
    out = []
    for enc in tok.encode_batch(plain, add_special_tokens=False):
        out.append([ids["bos"]] + enc.ids)
    for d in chats:
        out.append(bpe.encode_doc(tok, d, ids))
    return np.concatenate([np.asarray(x, dtype=np.int32) for x in out])


def tokenizer_texts(docs):
    for d in docs:
        if isinstance(d, str):
            yield d
        else:
            yield "".join(v for k, v in d if k == "text")


def batch(stream, rng, bsz, length):
    starts = rng.integers(0, len(stream) - length, bsz)
    return np.stack([stream[s:s + length] for s in starts])


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def param_groups(model, wd):
    decay, plain = [], []
    for n, p in model.named_parameters():
        (decay if p.ndim >= 2 and "hc" not in n and "position_bias" not in n else plain).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": plain, "weight_decay": 0.0}]


class LoadCounter:
    """Per-router expert loads of a step, for the bias update."""

    def __init__(self, gates):
        self.gates = gates
        self.counts = {id(g): torch.zeros(g.num_experts) for g in gates}
        for g in gates:
            g.register_forward_hook(self._hook)

    def _hook(self, mod, args, out):
        if mod.training:
            idx = out[2].detach().reshape(-1)
            self.counts[id(mod)] = self.counts[id(mod)].to(idx.device) + torch.bincount(
                idx, minlength=mod.num_experts).float()

    @torch.no_grad()
    def update(self):
        for g in self.gates:
            c = self.counts[id(g)]
            g.e_score_correction_bias += BIAS_RATE * torch.sign(c.mean() - c)
            self.counts[id(g)] = torch.zeros_like(c)


def losses(model, ids):
    """(main LM loss, MTP loss, indexer distillation loss)."""
    logits, mtp_logits, idx = model(ids)
    v = logits.shape[-1]
    main = F.cross_entropy(logits.float().reshape(-1, v), ids[:, 1:].reshape(-1))
    mtp = F.cross_entropy(mtp_logits[:, :-1].float().reshape(-1, v), ids[:, 2:].reshape(-1))
    return main, mtp, idx


@torch.no_grad()
def evaluate(model, stream, seq, n_batches, bsz, device, amp):
    """Mean held-out losses (main, MTP, indexer) over fixed windows."""
    model.eval()
    rng = np.random.default_rng(12345)
    tot = np.zeros(3)
    for _ in range(n_batches):
        ids = torch.from_numpy(batch(stream, rng, bsz, seq + 2)).long().to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            m, t, i = losses(model, ids)
        tot += [m.item(), t.item(), i.item()]
    model.train()
    return tot / n_batches


@torch.no_grad()
def text_nll(model, tok, text, device):
    """The NLL ds4 --perplexity-file reports: the text's tokens (plain text,
    no BOS, as ds4 scores), the first PPL_CONTEXT tokens context, every
    later one scored (float32)."""
    toks = tok.encode(text, add_special_tokens=False).ids
    x = torch.tensor([toks], device=device)
    logits = model.main(input_ids=x, use_cache=False).logits[0].double().cpu()
    lp = torch.log_softmax(logits, dim=-1)
    tgt = torch.tensor(toks[PPL_CONTEXT:])
    nll = -lp[PPL_CONTEXT - 1:-1].gather(1, tgt[:, None]).sum().item()
    scored_bytes = len(tok.decode(toks[PPL_CONTEXT:], skip_special_tokens=False).encode("utf-8"))
    return {"tokens": len(toks), "scored": len(toks) - PPL_CONTEXT, "nll": nll,
            "avg_nll": nll / (len(toks) - PPL_CONTEXT), "scored_bytes": scored_bytes,
            "bits_per_byte": nll / math.log(2) / scored_bytes, "ids": toks}


def set_experts_path(model, name):
    """transformers' implementation of the routed experts (grouped_mm by
    default: bf16 kernels on the GPU; eager: one matmul per expert)."""
    for m in model.modules():
        if hasattr(getattr(m, "config", None), "_experts_implementation"):
            m.config._experts_implementation = name


def held_out_text(docs):
    """The start of the held-out split, cut at a line end."""
    text = "\n".join(d for d in docs if isinstance(d, str))
    cut = text.rfind("\n", 0, HELD_OUT_TEXT_BYTES)
    return text[: cut + 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512, help="training window (tokens)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--max-minutes", type=float, default=0,
                    help="stop training early after this many minutes (0: never; the run is then not reproducible)")
    ap.add_argument("--corpus-files", type=int, default=0,
                    help="use about this many of the stdlib's source files (0: all; the pipeline check)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()

    os.makedirs(a.outdir, exist_ok=True)
    log = Log(os.path.join(a.outdir, "train.log"))
    c = PRESETS[a.preset]
    device = torch.device(a.device)
    amp = device.type == "cuda"
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    log(f"python {platform.python_version()}, torch {torch.__version__}, device {device}"
        f"{' (' + torch.cuda.get_device_name(device) + ')' if device.type == 'cuda' else ''}, "
        f"preset {a.preset}, seed {a.seed}")

    data = corpus.build(a.seed, a.corpus_files)
    info = data["info"]
    log(f"corpus: {info['files']} files of {info['stdlib']} + {info['topics']} topics, "
        f"{info['chat_turns']} chat turns; {len(data['train'])} training / {len(data['held_out'])} held-out "
        f"documents; sha256 {info['sha256'][:16]}")

    tok = bpe.train(tokenizer_texts(data["train"]), c["n_vocab"])
    assert tok.get_vocab_size() == c["n_vocab"], tok.get_vocab_size()
    ids = bpe.special_ids(tok)
    tok.save(os.path.join(a.outdir, "tokenizer.json"))
    train_stream = token_stream(tok, data["train"], ids)
    held_stream = token_stream(tok, data["held_out"], ids)
    held_bytes = sum(len(d.encode("utf-8")) for d in data["held_out"])
    log(f"tokenizer: {c['n_vocab']} tokens; training stream {len(train_stream)} tokens, "
        f"held-out {len(held_stream)} tokens ({held_bytes / len(held_stream):.3f} bytes/token)")

    model = Small(c, a.seed).to(device)
    if device.type == "cpu":     # grouped_mm has no fast CPU kernel
        set_experts_path(model, "eager")
    n_params = sum(p.numel() for p in model.main.parameters())
    n_mtp = sum(p.numel() for p in model.mtp.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters + MTP block {n_mtp / 1e6:.2f} M; config {json.dumps(c)}")
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=device.type == "cuda")
    loads = LoadCounter(routers(model))
    rng = np.random.default_rng(a.seed)
    model.train()
    t0 = time.time()
    history = []
    step = 0
    for step in range(a.steps):
        if a.max_minutes and time.time() - t0 > 60 * a.max_minutes:
            log(f"stopped after {step} steps: --max-minutes {a.max_minutes}")
            break
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, a.steps, a.lr, a.warmup)
        ids_b = torch.from_numpy(batch(train_stream, rng, a.batch, a.seq + 2)).long().to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            main_loss, mtp_loss, idx_loss = losses(model, ids_b)
        loss = main_loss + MTP_WEIGHT * mtp_loss + idx_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loads.update()
        if step % 50 == 0 or step == a.steps - 1:
            el = time.time() - t0
            log(f"step {step:5d}  loss {main_loss.item():.4f}  mtp {mtp_loss.item():.4f}  "
                f"indexer KL {idx_loss.item():.4f}  "
                f"lr {opt.param_groups[0]['lr']:.2e}  {el:.0f}s  "
                f"{(step + 1) * a.batch * (a.seq + 1) / max(el, 1e-9):.0f} tok/s")
        if (step + 1) % a.eval_every == 0 or step == a.steps - 1:
            ev = evaluate(model, held_stream, a.seq, 8, a.batch, device, amp)
            history.append({"step": step + 1, "held_out_loss": ev[0], "held_out_mtp_loss": ev[1],
                            "held_out_indexer_kl": ev[2]})
            log(f"eval step {step + 1}: held-out loss {ev[0]:.4f} ({ev[0] / math.log(2) * len(held_stream) / held_bytes:.4f} "
                f"bits/byte), MTP {ev[1]:.4f}, indexer KL {ev[2]:.4f}")
    train_secs = time.time() - t0
    log(f"trained {step + 1} steps in {train_secs:.0f} s")

    # Held-out figures in float32 (the export's exact weights): no TF32, and
    # the experts through transformers' plain per-expert path.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    set_experts_path(model, "eager")
    model = model.float().eval()
    ev = evaluate(model, held_stream, a.seq, 4, 8, device, False)
    text = held_out_text(data["held_out"])
    with open(os.path.join(a.outdir, "held_out.txt"), "w") as f:
        f.write(text)
    nll = text_nll(model, tok, text, device)
    log(f"held-out (f32): loss {ev[0]:.4f} nats/token = {ev[0] / math.log(2) * len(held_stream) / held_bytes:.4f} "
        f"bits/byte, MTP {ev[1]:.4f}; held_out.txt: {nll['scored']} tokens scored, avg NLL {nll['avg_nll']:.6f}, "
        f"{nll['bits_per_byte']:.4f} bits/byte")

    model = model.cpu()
    sd_main = {k: v.detach().float().numpy() for k, v in model.main.state_dict().items()}
    sd_mtp = {k: v.detach().float().numpy() for k, v in model.mtp.state_dict().items()}
    tensors, mtensors = export.main_tensors(sd_main, c), export.mtp_tensors(sd_mtp, c)
    tk = bpe.gguf_arrays(tok)
    tokenizer = (tk[0], tk[1], tk[2], ids["bos"], ids["eos"], ids["pad"])
    prov = [("ds4.train.seed", export.V_U32, a.seed), ("ds4.train.steps", export.V_U32, step + 1),
            ("ds4.train.corpus", export.V_STR, f"Python {platform.python_version()} standard library "
                                               f"(PSF-2.0), sha256 {info['sha256']}")]
    files = {}
    for recipe, suffix in (("q8_0", ""), ("f32", "-f32")):
        p = os.path.join(a.outdir, f"ds4-small{suffix}.gguf")
        export.write_model(p, c, tensors, recipe, "ds4-small", 4096, tokenizer, prov)
        pm = os.path.join(a.outdir, f"ds4-small-mtp{suffix}.gguf")
        export.write_model(pm, c, mtensors, recipe, "ds4-small MTP", 4096, None, prov)
        files[recipe] = [os.path.basename(p), os.path.basename(pm)]
        log(f"wrote {p} ({os.path.getsize(p) / 1e6:.2f} MB), {pm} ({os.path.getsize(pm) / 1e6:.2f} MB)")

    summary = {
        "preset": a.preset, "config": c, "seed": a.seed, "steps": step + 1, "batch": a.batch, "seq": a.seq,
        "lr": a.lr, "train_seconds": train_secs, "device": str(device),
        "python": platform.python_version(), "torch": torch.__version__, "corpus": info,
        "train_tokens": int(len(train_stream)), "held_out_tokens": int(len(held_stream)),
        "held_out_bytes": held_bytes, "parameters": n_params, "mtp_parameters": n_mtp,
        "held_out_loss": ev[0], "held_out_mtp_loss": ev[1], "held_out_indexer_kl": ev[2],
        "held_out_bits_per_byte": ev[0] / math.log(2) * len(held_stream) / held_bytes,
        "held_out_text": nll, "history": history, "files": files,
    }
    with open(os.path.join(a.outdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
