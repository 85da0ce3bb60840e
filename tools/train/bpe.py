"""bpe.py - the small model's own byte-level BPE tokenizer, trained with HF
`tokenizers` on the training split: the DeepSeek V4 pre-tokenizer (the three
regex splits and ByteLevel of the official tokenizer.json, docs/MODEL.md
10.3), the special tokens the chat template and the engine use (ids 0..8,
BOS = 0 and EOS = 1 as in the official vocabulary), and the tokenizer.ggml.*
arrays the engine reads (docs/MODEL.md 10.1).
"""
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = {
    "bos": "<｜begin▁of▁sentence｜>",
    "eos": "<｜end▁of▁sentence｜>",
    "pad": "<｜▁pad▁｜>",
    "user": "<｜User｜>",
    "assistant": "<｜Assistant｜>",
    "think": "<think>",
    "think_end": "</think>",
    "dsml": "｜DSML｜",
    "latest_reminder": "<｜latest_reminder｜>",
}

# The official tokenizer.json's pre-tokenizer, verbatim.
SPLITS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

TOKEN_NORMAL, TOKEN_CONTROL = 1, 3


def train(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in SPLITS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2,
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def special_ids(tok):
    ids = {k: tok.token_to_id(v) for k, v in SPECIALS.items()}
    assert all(i is not None for i in ids.values()), ids
    return ids


def encode_doc(tok, doc, ids):
    """Token ids of a document after BOS: plain text without special-token
    recognition (as the engine's plain text), or chat parts."""
    out = [ids["bos"]]
    parts = [("text", doc)] if isinstance(doc, str) else doc
    for kind, val in parts:
        if kind == "special":
            out.append(ids[val])
        else:
            out += tok.encode(val, add_special_tokens=False).ids
    return out


def gguf_arrays(tok):
    """tokens, token types and merges as the engine reads them."""
    import json
    model = json.loads(tok.to_str())
    vocab = model["model"]["vocab"]
    n = max(vocab.values()) + 1
    tokens = [None] * n
    types = [TOKEN_NORMAL] * n
    for s, i in vocab.items():
        tokens[i] = s
    for a in model["added_tokens"]:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = TOKEN_CONTROL
    assert all(t is not None for t in tokens)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["model"]["merges"]]
    return tokens, types, merges
