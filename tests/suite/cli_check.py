#!/usr/bin/env python3
"""cli_check.py - independent checks of ds4's diagnostics output against raw
logits written by ds4-forward (stdlib only; called by cli.sh).

    cli_check.py greedy LOGPROBS.json LOGITS.bin N_PROMPT N_VOCAB TEXT_FILE EOS_ID
        Every step of `ds4 --dump-logprobs` against the logits ds4-forward
        computed for prompt + generated tokens in one prefill: the chosen
        token is the argmax, logits are the same float32 values, log-probs
        are log-softmax (to 1e-9), the alternatives are the top-k in order;
        the one-shot greedy text (TEXT_FILE, with its final newline) is the
        steps' bytes; the layout is ds4's (key order, token objects, the
        spelling of bytes that are not UTF-8).

    cli_check.py ppl LOGITS.bin IDS_FILE N_VOCAB CONTEXT PPL_OUTPUT
        `ds4 --perplexity-file` output against the NLL computed here from
        ds4-forward's all-position logits of the same token ids.
"""
import array
import heapq
import json
import math
import re
import sys


def fail(msg):
    print("cli_check: FAIL: " + msg)
    sys.exit(1)


def rows(path, n_vocab):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if len(a) % n_vocab:
        fail("%s: %d floats is not a whole number of rows of %d" % (path, len(a), n_vocab))
    return [a[i * n_vocab:(i + 1) * n_vocab] for i in range(len(a) // n_vocab)]


def log_sum_exp(row):
    m = max(row)
    return m + math.log(math.fsum(math.exp(x - m) for x in row))


def check_text(i, tok):
    """ds4's rule: the token's bytes as text when they are valid UTF-8, else
    every byte >= 0x80 escaped on its own (read back as U+0080..U+00FF)."""
    b = bytes(tok["bytes"])
    try:
        want = b.decode("utf-8")
    except UnicodeDecodeError:
        want = "".join(chr(c) for c in b)
    if tok["text"] != want:
        fail("step %d: text %r is not ds4's spelling of the bytes %r" % (i, tok["text"], b))


def check_greedy(lp_path, logits_path, n_prompt, n_vocab, text_path, eos):
    with open(lp_path) as f:
        d = json.load(f)
    steps = d["steps"]
    if d["prompt_tokens"] != n_prompt:
        fail("prompt_tokens %d, want %d" % (d["prompt_tokens"], n_prompt))
    lg = rows(logits_path, n_vocab)
    if len(lg) != n_prompt + len(steps) - 1:
        fail("ds4-forward wrote %d rows for %d prompt tokens and %d steps" % (len(lg), n_prompt, len(steps)))
    k = d["top_k"]
    if d["source"] != "ds4" or list(d) != ["source", "prompt_tokens", "ctx", "top_k", "steps"]:
        fail("the header is not ds4's: %r" % list(d))
    text = b""
    for i, s in enumerate(steps):
        row = lg[n_prompt - 1 + i]
        best = max(range(n_vocab), key=lambda j: (row[j], -j))
        tok = s["selected"]
        if s["step"] != i or tok["id"] != best:
            fail("step %d: token %d, argmax of the logits is %d" % (i, tok["id"], best))
        lse = log_sum_exp(row)
        check_text(i, tok)
        for e in s["top_logprobs"]:
            t = e["token"]["id"]
            check_text(i, e["token"])
            if array.array("f", [e["logit"]])[0] != row[t]:  # 9 digits: the float exactly
                fail("step %d: token %d logit %r, ds4-forward %r" % (i, t, e["logit"], row[t]))
            want = array.array("f", [row[t] - lse])[0]  # ds4 rounds log-probs to float
            if abs(e["logprob"] - want) > 1e-7 * max(1.0, abs(want)):
                fail("step %d: token %d logprob %r, want %r" % (i, t, e["logprob"], want))
        want = heapq.nsmallest(k, range(n_vocab), key=lambda j: (-row[j], j))
        if [e["token"]["id"] for e in s["top_logprobs"]] != want:
            fail("step %d: alternatives %r, want %r" % (i, [e["token"]["id"] for e in s["top_logprobs"]], want))
        if tok["id"] != eos:
            text += bytes(tok["bytes"])
    with open(text_path, "rb") as f:
        printed = f.read()
    if not text.endswith(b"\n"):
        text += b"\n"
    if printed != text:
        fail("one-shot greedy text %r differs from the dump's tokens %r" % (printed, text))
    print("cli_check: greedy: %d steps agree with ds4-forward" % len(steps))


def check_ppl(logits_path, ids_path, n_vocab, context, out_path):
    with open(ids_path) as f:
        ids = [int(x) for x in f.read().replace(",", " ").split()]
    lg = rows(logits_path, n_vocab)
    with open(out_path) as f:
        line = f.read()
    if not re.fullmatch(r"tokens=\d+ scored=\d+ nll=[-0-9.]+ avg_nll=[-0-9.]+ ppl=[0-9.]+\n", line):
        fail("not ds4's perplexity line: %r" % line)
    got = {k: float(v) for k, v in (kv.split("=") for kv in line.split())}
    scored = int(got["scored"])
    if int(got["tokens"]) != len(ids) or len(lg) < context + scored - 1:
        fail("tokens %d scored %d with %d ids and %d logit rows" % (got["tokens"], scored, len(ids), len(lg)))
    nll = 0.0
    for t in range(context, context + scored):
        row = lg[t - 1]
        nll -= row[ids[t]] - log_sum_exp(row)
    for key, want in (("nll", nll), ("avg_nll", nll / scored), ("ppl", math.exp(nll / scored))):
        if abs(got[key] - want) > 1e-6 * max(1.0, abs(want)):
            fail("%s %r, independent %r" % (key, got[key], want))
    print("cli_check: ppl: %d scored tokens, nll %.6f agrees" % (scored, nll))


if sys.argv[1] == "greedy":
    check_greedy(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], int(sys.argv[7]))
elif sys.argv[1] == "ppl":
    check_ppl(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
else:
    fail("unknown check " + sys.argv[1])
