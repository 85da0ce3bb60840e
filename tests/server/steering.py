"""steering.py - ds4-server's directional steering (docs/SERVER.md,
docs/STEERING.md) on the harness's tiny model, greedy answers:

- started with a direction file and --dir-steering-ffn 0, a request without
  the dir_steering field answers as a server without a file; {"ffn": 3}
  answers otherwise; back to {"ffn": 0} answers exactly as at first (the
  state computed with other scales was dropped);
- started with the file alone (FFN scale 1) it answers as {"ffn": 1} did;
- bad fields are 400 with a message; scales on a server without a file are
  400 naming --dir-steering-file; 0 scales there are fine.
Run by tests/suite/steering.sh (STEERING_DIR: a folder to write in).
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import ROOT, Server, ensure_model  # noqa: E402

OUT = os.environ.get("STEERING_DIR") or os.path.join(ROOT, "build", "suite", "steering")


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def ask(s, steering=None):
    body = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 16,
            "temperature": 0, "thinking": {"type": "disabled"}}
    if steering is not None:
        body["dir_steering"] = steering
    st, b = s.post("/v1/chat/completions", body)
    check(st == 200, "status %d: %s" % (st, b))
    return b["choices"][0]["message"]["content"]


def bad(s, steering, part):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "dir_steering": steering}
    st, b = s.post("/v1/chat/completions", body)
    check(st == 400 and part in b["error"]["message"], "%s: %d %s" % (steering, st, b))


def main():
    model = ensure_model()
    os.makedirs(OUT, exist_ok=True)
    d = os.path.join(ROOT, "tests", "data", "steering")
    f32 = os.path.join(OUT, "server-dir.f32")
    subprocess.run([os.path.join(ROOT, "ds4-direction"), "-m", model, "-c", "512", "--good-file",
                    os.path.join(d, "cheerful.txt"), "--bad-file", os.path.join(d, "gloomy.txt"), "-o", f32],
                   check=True, stderr=subprocess.DEVNULL)
    with Server(force=False) as s:
        plain = ask(s)
        bad(s, {"ffn": 1}, "--dir-steering-file")
        check(ask(s, {"ffn": 0, "attn": 0}) == plain, "zero scales on a server without a file")
    with Server("--dir-steering-file", f32, "--dir-steering-ffn", "0", force=False) as s:
        check(ask(s) == plain, "a file with scale 0 changed the answer")
        one = ask(s, {"ffn": 1})
        three = ask(s, {"ffn": 3})
        check(three != plain, "scale 3 did not change the answer")
        check(ask(s, {"ffn": 0}) == plain, "back to scale 0: %r vs %r" % (ask(s, {"ffn": 0}), plain))
        check(ask(s, {"ffn": 3}) == three, "scale 3 again answered otherwise")
        bad(s, {"ffn": "x"}, "ffn must be a number")
        bad(s, {"ffn": 101}, "between -100 and 100")
        bad(s, {"fnn": 1}, "dir_steering.fnn: unknown field")
        bad(s, [1], "dir_steering must be an object")
    with Server("--dir-steering-file", f32, force=False) as s:
        check(ask(s) == one, "the file alone (scale 1) answered otherwise than {\"ffn\": 1}")
    print("server steering: ok")


main()
