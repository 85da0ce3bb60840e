#!/usr/bin/env python3
"""small_tok_golden.py - goldens for a model's own tokenizer (not the
official DeepSeek V4 one): a 600-token byte-level BPE trained by
tools/train/bpe.py (the DeepSeek V4 pre-tokenizer and special tokens) on
the project's own docs/MODEL.md, and the ids HF `tokenizers` gives a test
text with it.  tests/suite/own_tokenizer.sh checks that the engine,
reading that tokenizer from a GGUF, gives the same ids and runs a model of
that vocabulary.

Writes OUTDIR/small-bpe.json (the tokenizer), OUTDIR/small-bpe.txt (the
text: README.md's first 6000 bytes and a line of digits, accents, CJK,
kana, an emoji, CR LF and tabs) and OUTDIR/small-bpe.ids (its ids, one
line).

Usage: python tests/reference/small_tok_golden.py OUTDIR
  (the committed files: OUTDIR = tests/golden/text; deterministic)
Pinned versions: tests/reference/requirements.txt (tokenizers).
"""
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
import bpe  # noqa: E402

EXTRA = "Ünïcödé 1234567 x=3.14159 数字と かな カナ 🙂 done\r\n\ttab\t\tend  \n"


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(ROOT, "docs", "MODEL.md"), encoding="utf-8") as f:
        corpus = f.read()
    tok = bpe.train([corpus], 600)
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()[:6000]
    text += "\n" + EXTRA
    ids = tok.encode(text, add_special_tokens=False).ids
    tok.save(os.path.join(out, "small-bpe.json"))
    with open(os.path.join(out, "small-bpe.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(text)
    with open(os.path.join(out, "small-bpe.ids"), "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    print(f"{tok.get_vocab_size()} tokens, {len(ids)} ids of {len(text.encode())} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
