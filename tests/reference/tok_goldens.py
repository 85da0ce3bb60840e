#!/usr/bin/env python3
"""tok_goldens.py - token-id goldens for the tokenizer tests, from HF `tokenizers`
(pinned in requirements.txt) on the official DeepSeek V4 tokenizer.json.

Reads the corpus written by tok_corpus.py and writes tests/golden/text/tok_goldens.txt:

  doc NAME N_PLAIN SHA_PLAIN N_TRANSCRIPT SHA_TRANSCRIPT FIRST_IDS
      plain      = pre_tokenizer + BPE model only (no added-token matching),
                   what ds4_tokenize_text must give;
      transcript = Tokenizer.encode(add_special_tokens=False), which matches
                   every added token in the text: ds4_tokenize_transcript;
      SHA = sha256 of the ids as little-endian int32; FIRST_IDS = the first 48
      ids (plain), comma-separated, to make a mismatch easy to locate.
      Documents with invalid UTF-8 follow ds4's definition (each byte outside
      a valid character is a piece of its own, the valid runs are tokenized
      independently); they have no transcript digest ("-").
  probe BLOCK SHA
      every code point c of [BLOCK*4096, BLOCK*4096+4096) except surrogates,
      in the probe string PROBE(c) below, each probe encoded on its own; SHA
      over all ids with -1 after each probe.  Exhaustive check that the
      pre-tokenizer classifies every code point as Oniguruma does.
  decode IDS SHA
      sha256 of Tokenizer.decode(IDS) (UTF-8, lossy, as HF returns it).
  chat N COUNT SHA
      Tokenizer.encode of the official chat fixture test_output_N.txt
      (tests/golden/text/dsv4-encoding/): the ids the rendered prompt must
      tokenize to.
  gguf tokens|types|merges COUNT SHA
      the GGUF tokenizer arrays llama.cpp's converter (get_vocab_base, here
      re-derived from tokenizer.json and tokenizer_config.json) writes:
      sha256 of the strings joined by NUL, or of the types as int32.

--check-gguf FILE also reads FILE (e.g. written by `ds4-tokenizer import`)
with gguf-py's GGUFReader and checks every tokenizer.ggml.* key against
that layout.

Usage: tests/reference/tok_goldens.py [--tokenizer PATH] [--corpus PATH] [--out PATH]
"""
import argparse
import hashlib
import json
import lzma
import os
import random
import struct

from tokenizers import Tokenizer

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIRST_IDS = 48


def probe(c):
    return "a" + c + c + "." + c + " x" + c + "1" + c + "\n" + c + " " + c + "A" + c + "一" + c


def read_corpus(path):
    data = lzma.open(path).read()
    docs = []
    pos = 0
    while pos < len(data):
        nl = data.index(b"\n", pos)
        tag, name, size = data[pos:nl].decode().split(" ")
        assert tag == "#doc"
        size = int(size)
        docs.append((name, data[nl + 1: nl + 1 + size]))
        pos = nl + 1 + size + 1
    return docs


def digest(ids):
    return hashlib.sha256(struct.pack(f"<{len(ids)}i", *ids)).hexdigest()


class Reference:
    def __init__(self, path):
        self.tok = Tokenizer.from_file(path)
        self.vocab = self.tok.get_vocab()
        bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        self.byte_char = dict(zip(bs, map(chr, cs)))

    def plain(self, text):
        ids = []
        for piece, _ in self.tok.pre_tokenizer.pre_tokenize_str(text):
            ids.extend(t.id for t in self.tok.model.tokenize(piece))
        return ids

    def plain_bytes(self, data):
        """ds4's rule for any bytes: invalid bytes alone, valid runs independently."""
        s = data.decode("utf-8", "surrogateescape")
        ids, run = [], []
        for ch in s:
            if 0xDC80 <= ord(ch) <= 0xDCFF:
                if run:
                    ids.extend(self.plain("".join(run)))
                    run = []
                ids.append(self.vocab[self.byte_char[ord(ch) - 0xDC00]])
            else:
                run.append(ch)
        if run:
            ids.extend(self.plain("".join(run)))
        return ids


def llama_cpp_layout(tokenizer_path, config_path):
    """tokens, types, merges, bos, eos, pad as convert_hf_to_gguf.py writes them."""
    t = json.load(open(tokenizer_path, encoding="utf-8"))
    cfg = json.load(open(config_path, encoding="utf-8"))
    rev = {i: s for s, i in t["model"]["vocab"].items()}
    added = {a["id"]: a for a in t["added_tokens"]}
    size = max(list(rev) + list(added)) + 1

    def looks_special(s):
        return (s in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (s.startswith("<|") and s.endswith("|>"))
                or (s.startswith("<｜") and s.endswith("｜>")) or (s.startswith("<unused") and s.endswith(">")))

    tokens, types = [], []
    for i in range(size):
        if i in added:
            a = added[i]
            if a["special"] or looks_special(a["content"]):
                tokens.append(a["content"])
                types.append(3)
            else:
                tokens.append(a["content"].replace("\u2581", " "))
                types.append(4)
        elif i in rev:
            tokens.append(rev[i])
            types.append(1)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(5)
    merges = [m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]]

    def tok(key):
        v = cfg[key]
        return tokens.index(v["content"] if isinstance(v, dict) else v)

    return tokens, types, merges, tok("bos_token"), tok("eos_token"), tok("pad_token")


def check_gguf(path, layout):
    from gguf import GGUFReader
    tokens, types, merges, bos, eos, pad = layout
    r = GGUFReader(path)
    f = r.fields

    def strings(key):
        fl = f[key]
        return [bytes(fl.parts[i]).decode("utf-8") for i in fl.data]

    def scalar(key):
        fl = f[key]
        return fl.parts[fl.data[0]][0]

    assert bytes(f["tokenizer.ggml.model"].parts[-1]).decode() == "gpt2"
    assert bytes(f["tokenizer.ggml.pre"].parts[-1]).decode() == "joyai-llm"
    assert strings("tokenizer.ggml.tokens") == tokens, "tokens differ"
    fl = f["tokenizer.ggml.token_type"]
    assert [int(fl.parts[i][0]) for i in fl.data] == types, "token types differ"
    assert strings("tokenizer.ggml.merges") == merges, "merges differ"
    assert (scalar("tokenizer.ggml.bos_token_id"), scalar("tokenizer.ggml.eos_token_id"),
            scalar("tokenizer.ggml.padding_token_id")) == (bos, eos, pad)
    assert not scalar("tokenizer.ggml.add_bos_token") and not scalar("tokenizer.ggml.add_eos_token")
    print(f"{path}: tokenizer metadata matches llama.cpp's layout ({len(tokens)} tokens, {len(merges)} merges)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="/tmp/ref/tokenizer.json")
    ap.add_argument("--corpus", default=os.path.join(ROOT, "tests", "golden", "text", "tok_corpus.bin.xz"))
    ap.add_argument("--config", default=os.path.join(ROOT, "data", "tokenizer", "deepseek-v4-tokenizer_config.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "text", "tok_goldens.txt"))
    ap.add_argument("--check-gguf", help="verify this GGUF's tokenizer metadata with gguf-py, then exit")
    args = ap.parse_args()
    layout = llama_cpp_layout(args.tokenizer, args.config)
    if args.check_gguf:
        check_gguf(args.check_gguf, layout)
        return
    ref = Reference(args.tokenizer)
    lines = ["# tokenizer goldens, written by tests/reference/tok_goldens.py - do not edit"]

    total = 0
    for name, data in read_corpus(args.corpus):
        total += len(data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None:
            plain = ref.plain_bytes(data)
            tline = "- -"
        else:
            plain = ref.plain(text)
            trans = ref.tok.encode(text, add_special_tokens=False).ids
            tline = f"{len(trans)} {digest(trans)}"
        first = ",".join(map(str, plain[:FIRST_IDS])) or "-"
        lines.append(f"doc {name} {len(plain)} {digest(plain)} {tline} {first}")

    for block in range(0x110000 // 4096):
        cps = [c for c in range(block * 4096, block * 4096 + 4096) if not 0xD800 <= c <= 0xDFFF]
        if not cps:
            continue
        encs = ref.tok.encode_batch([probe(chr(c)) for c in cps], add_special_tokens=False)
        ids = []
        for e in encs:
            ids.extend(e.ids)
            ids.append(-1)
        lines.append(f"probe {block} {digest(ids)}")

    rng = random.Random(7)
    n_vocab = ref.tok.get_vocab_size(with_added_tokens=True)
    for i in range(48):
        if i < 16:
            ids = [rng.randrange(n_vocab) for _ in range(rng.randint(1, 40))]
        else:
            # Mostly single-byte and short tokens, so characters split across tokens.
            ids = [rng.randrange(300) if rng.random() < 0.7 else rng.randrange(n_vocab)
                   for _ in range(rng.randint(1, 40))]
        out = ref.tok.decode(ids, skip_special_tokens=False).encode("utf-8")
        lines.append(f"decode {','.join(map(str, ids))} {hashlib.sha256(out).hexdigest()}")

    fixtures = os.path.join(ROOT, "tests", "golden", "text", "dsv4-encoding")
    for n in range(1, 5):
        text = open(os.path.join(fixtures, f"test_output_{n}.txt"), encoding="utf-8").read()
        ids = ref.tok.encode(text, add_special_tokens=False).ids
        lines.append(f"chat {n} {len(ids)} {digest(ids)}")

    tokens, types, merges = layout[:3]
    lines.append(f"gguf tokens {len(tokens)} {hashlib.sha256(chr(0).join(tokens).encode()).hexdigest()}")
    lines.append(f"gguf types {len(types)} {digest(types)}")
    lines.append(f"gguf merges {len(merges)} {hashlib.sha256(chr(0).join(merges).encode()).hexdigest()}")

    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{args.out}: {total} corpus bytes, {len(lines)} lines")


if __name__ == "__main__":
    main()
