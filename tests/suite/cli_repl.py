#!/usr/bin/env python3
"""cli_repl.py - drives the interactive ds4 through a pseudo-terminal (stdlib
only; called by cli.sh).

    cli_repl.py DS4 MODEL TOKENIZER_TOOL TOKENIZER_GGUF WORKDIR

Checks, from what a user sees on the terminal:
  - multi-turn: the second turn prefills only the new suffix (the token
    counters of the timing line, against token counts computed with
    ds4-tokenizer);
  - Ctrl+C in the middle of a generation returns to the prompt, and the next
    turn reuses everything generated so far (only the suffix is prefilled)
    and answers;
  - Ctrl+C while typing clears the line; /ctx N recreates the session (new
    memory line, the next turn prefills everything again); /read FILE sends
    the file; a Ctrl+C during a multi-chunk prefill takes the turn back;
  - thinking text is coloured on a terminal; /help, unknown commands;
  - the history file is written; Ctrl+D leaves with status 0.
"""
import os
import pty
import re
import select
import subprocess
import sys
import time

DS4, MODEL, TOKTOOL, TOKGGUF, WORK = sys.argv[1:6]
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT, THINK_END = "<｜User｜>", "<｜Assistant｜>", "</think>"
# The progress line erased, then some answer text.
ANSWER_STARTED = rb"processing \d+ input tokens(?s:.)*?\r\x1b\[K(?s:.){40}"
STATS = rb"ds4: prefill: [0-9.]+ t/s, generation: [0-9.]+ t/s; prefill (\d+) tokens? \((\d+) reused\), generation (\d+) tokens?"


def fail(msg):
    print("cli_repl: FAIL: " + msg)
    sys.exit(1)


def n_tokens(text):
    """Token count of a text with special tokens recognised (ds4-tokenizer)."""
    out = subprocess.run([TOKTOOL, "-t", TOKGGUF, "encode", "--specials", text], check=True,
                         capture_output=True).stdout.split()
    return len(out)


class Term:
    """ds4 on the slave side of a pty; we read and type on the master."""

    def __init__(self, args):
        os.makedirs(WORK, exist_ok=True)
        env = dict(os.environ, HOME=WORK, TERM="xterm", LC_ALL="C")
        env.pop("NO_COLOR", None)
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve(DS4, [DS4, "-m", MODEL] + args, env)
        self.buf = b""

    def expect(self, pattern, timeout=60):
        """Consume output up to the first match of a regex; return the match."""
        rx = re.compile(pattern)
        end = time.time() + timeout
        while True:
            m = rx.search(self.buf)
            if m:
                self.seen = self.buf[:m.end()]
                self.buf = self.buf[m.end():]
                return m
            if time.time() > end:
                fail("timeout waiting for %r; output so far: %r" % (pattern, self.buf[-2000:]))
            r, _, _ = select.select([self.fd], [], [], 0.05)
            if r:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    fail("ds4 exited while waiting for %r; output: %r" % (pattern, self.buf[-2000:]))
                self.buf += data

    def send(self, text):
        os.write(self.fd, text.encode() if isinstance(text, str) else text)

    def turn(self, line):
        """Type a message, wait for the answer's timing line and the next
        prompt; return (prefilled, reused, generated)."""
        self.send(line + "\r")
        m = self.expect(STATS)
        self.expect(rb"ds4> ")
        return int(m.group(1)), int(m.group(2)), int(m.group(3))

    def finish(self):
        """Ctrl+D at the prompt (the caller has seen it) leaves with status 0.
        libedit draws the prompt before it puts the terminal in raw mode; a
        Ctrl+D that arrives in between passes through the kernel's canonical
        mode and reaches ds4 as a NUL byte, which ds4 takes as the Ctrl+D it
        was, so one Ctrl+D must always be enough."""
        self.send(b"\x04")
        end = time.time() + 30
        while time.time() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
                    fail("status %d after Ctrl+D" % status)
                return
            r, _, _ = select.select([self.fd], [], [], 0.05)
            try:
                if r:
                    os.read(self.fd, 65536)
            except OSError:
                pass
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)
        fail("ds4 did not leave after Ctrl+D")


def test_multi_turn():
    system = "You are a helpful assistant"
    t = Term(["--nothink", "--temp", "0", "-n", "8", "-c", "4096"])
    t.expect(rb"ds4> ")
    pre1, reused1, gen1 = t.turn("Hello")
    prompt1 = n_tokens(BOS + system + USER + "Hello" + ASSISTANT + THINK_END)
    if (pre1, reused1) != (prompt1, 0):
        fail("turn 1: prefilled %d reused %d, want %d and 0" % (pre1, reused1, prompt1))
    if gen1 != 8:
        fail("turn 1 generated %d tokens, want 8 (the test model never ends early)" % gen1)
    # Turn 2: the session holds prompt 1 and all generated tokens but the
    # last; the suffix is that token, EOS and the new user turn.
    pre2, reused2, gen2 = t.turn("how are you")
    suffix = n_tokens(EOS + USER + "how are you" + ASSISTANT + THINK_END)
    if reused2 != prompt1 + gen1 - 1 or pre2 != 1 + suffix:
        fail("turn 2: prefilled %d reused %d, want %d and %d" % (pre2, reused2, 1 + suffix, prompt1 + gen1 - 1))

    # /ctx: a new session; the next turn prefills the whole conversation.
    t.send("/ctx 2048\r")
    t.expect(rb"context 2048 tokens")
    t.expect(rb"ds4> ")
    pre3, reused3, _ = t.turn("again")
    whole = prompt1 + gen1 + suffix + gen2 + n_tokens(EOS + USER + "again" + ASSISTANT + THINK_END)
    if reused3 != 0 or pre3 != whole:
        fail("after /ctx: prefilled %d reused %d, want %d and 0" % (pre3, reused3, whole))

    # /read: the file is the next message.
    path = os.path.join(WORK, "message.txt")
    text = "Please summarise this file.\nIt has two lines."
    with open(path, "w") as f:
        f.write(text)
    t.send("/read " + path + "\r")
    t.expect(rb"sending .*message.txt")
    m = t.expect(STATS)
    t.expect(rb"ds4> ")
    if int(m.group(1)) != 1 + n_tokens(EOS + USER) + n_tokens(text) + n_tokens(ASSISTANT + THINK_END):
        fail("/read: prefilled %s tokens" % m.group(1).decode())
    # Non-ASCII input goes through the line editor's character decoding
    # intact (the terminal runs in the C locale: ds4 switches to UTF-8), and
    # a line ending in a backslash continues the message on the next line.
    for typed, message in (("ciao, 你好 😀", "ciao, 你好 😀"), ("first line\\\rsecond line", "first line\nsecond line")):
        pre, _, _ = t.turn(typed)
        want = 1 + n_tokens(EOS + USER + message + ASSISTANT + THINK_END)
        if pre != want:
            fail("message %r: prefilled %d tokens, want %d" % (message, pre, want))
    t.send("/read /nonexistent/file\r")
    t.expect(rb"/read: cannot open /nonexistent/file")

    # Commands, and Ctrl+C on a half-typed line.
    t.send("/help\r")
    t.expect(rb"/ctx N")
    t.send("/bogus\r")
    t.expect(rb"unknown command /bogus")
    t.send("/ctx 0\r")
    t.expect(rb"/ctx N: N must be")
    t.send(b"half typed\x03")
    t.expect(rb"\^C")
    t.expect(rb"ds4> ")
    t.send("/nothink\r")
    t.expect(rb"thinking off")
    t.expect(rb"ds4> ")
    t.finish()
    with open(os.path.join(WORK, ".ds4_history"), "rb") as f:
        hist = f.read()
    for want in (b"Hello", b"/ctx\\0402048", b"again"):
        if want not in hist:
            fail("history file lacks %r: %r" % (want, hist))


def test_interrupt_generation():
    t = Term(["--nothink", "--temp", "0", "-n", "100000", "-c", "8192"])
    t.expect(rb"ds4> ")
    t.send("Tell me a long story\r")
    t.expect(ANSWER_STARTED)
    t.send(b"\x03")
    m = t.expect(STATS + rb", interrupted\r?\n")
    t.expect(rb"ds4> ")
    pre1, gen1 = int(m.group(1)), int(m.group(3))
    if gen1 < 1 or gen1 > 50000:
        fail("interrupted generation made %d tokens" % gen1)
    # Everything generated is in the session: the next turn prefills only
    # EOS and the new user turn, and answers (stopped by Ctrl+C again).
    t.send("Now a short one\r")
    t.expect(ANSWER_STARTED)
    t.send(b"\x03")
    m = t.expect(STATS + rb", interrupted\r?\n")
    t.expect(rb"ds4> ")
    pre2, reused2, gen2 = int(m.group(1)), int(m.group(2)), int(m.group(3))
    suffix = n_tokens(EOS + USER + "Now a short one" + ASSISTANT + THINK_END)
    if reused2 != pre1 + gen1 or pre2 != suffix:
        fail("after Ctrl+C: prefilled %d reused %d, want %d and %d" % (pre2, reused2, suffix, pre1 + gen1))
    if gen2 < 1:
        fail("no answer after the interrupted turn")
    t.finish()


def test_interrupt_prefill():
    # A message of more than one prefill chunk (2048 tokens): Ctrl+C after the
    # progress line stops at the first chunk boundary and takes the turn back.
    path = os.path.join(WORK, "long.txt")
    with open(path, "w") as f:
        f.write(" ".join("word%d" % i for i in range(1400)))
    t = Term(["--nothink", "--temp", "0", "-n", "4", "-c", "8192"])
    t.expect(rb"ds4> ")
    t.send("/read " + path + "\r")
    t.expect(rb"processing \d+ input tokens")
    t.send(b"\x03")
    t.expect(rb"interrupted \(turn taken back\)")
    t.expect(rb"ds4> ")
    # The conversation is as before: a fresh turn renders only itself.
    pre, reused, _ = t.turn("Hi")
    prompt = n_tokens(BOS + "You are a helpful assistant" + USER + "Hi" + ASSISTANT + THINK_END)
    if pre + reused != prompt:
        fail("after an interrupted prefill the prompt is %d tokens, want %d" % (pre + reused, prompt))
    t.finish()


def test_thinking_colour():
    t = Term(["--temp", "0", "-n", "6"])
    t.expect(rb"ds4> ")
    t.send("Hello\r")
    t.expect(rb"\x1b\[90m")  # reasoning in grey
    t.expect(STATS)
    t.expect(rb"ds4> ")
    t.finish()


for test in (test_multi_turn, test_interrupt_generation, test_thinking_colour, test_interrupt_prefill):
    start = time.time()
    test()
    print("cli_repl: %s ok (%.1f s)" % (test.__name__, time.time() - start))
