"""harness.py - start and stop ds4-server on a generated tiny model for the
server tests (stdlib only, shared by smoke.py, load_test.py and the SDK tests).

The model is made by ds4-mkmodel with the real DeepSeek V4 tokenizer
(build/tokenizer.gguf, imported as scripts/demo.sh does), so prompts render
and tokenize exactly as for the real model; its weights are random, so the
text it writes is gibberish: tests check structure, counters and
determinism, and drive the tool-call paths with forced outputs
(--test-force-output tests/server/force.json, header X-DS4-Test-Output).
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "build", "models", "server-test.gguf")
TOKENIZER = os.path.join(ROOT, "build", "tokenizer.gguf")
FORCE = os.path.join(ROOT, "tests", "server", "force.json")

# The servers these tests start take their own instance lock
# (src/base/instance_lock.h) unless the test runner chose one: a model
# process elsewhere on the machine does not stop them, nor they it.
if not os.environ.get("DS4_LOCK_FILE"):
    os.makedirs(os.path.join(ROOT, "build", "test-locks"), exist_ok=True)
    os.environ["DS4_LOCK_FILE"] = os.path.join(
        ROOT, "build", "test-locks", os.path.splitext(os.path.basename(sys.argv[0] or "server"))[0] + ".lock")


def ensure_model():
    if not os.path.exists(TOKENIZER):
        tj = os.path.join(ROOT, "build", "tokenizer.json")
        with open(tj, "wb") as f:
            subprocess.run(["xz", "-dc", os.path.join(ROOT, "data/tokenizer/deepseek-v4-tokenizer.json.xz")],
                           stdout=f, check=True)
        subprocess.run([os.path.join(ROOT, "ds4-tokenizer"), "import", tj, TOKENIZER], check=True)
    if not os.path.exists(MODEL):
        os.makedirs(os.path.dirname(MODEL), exist_ok=True)
        subprocess.run([os.path.join(ROOT, "ds4-mkmodel"), "--preset", "tiny", "--recipe", "q8_0", "--tokenizer",
                        TOKENIZER, "--seed", "7", "-q", "-o", MODEL], check=True)
    return MODEL


class Server:
    """A ds4-server process on a free port; use as a context manager."""

    def __init__(self, *args, ctx=4096, threads=2, force=True, second=False):
        """second: a second server while another runs (its own instance lock)."""
        ensure_model()
        self.env = dict(os.environ)
        if second:
            self.env["DS4_LOCK_FILE"] = os.environ["DS4_LOCK_FILE"] + ".second"
        binary = os.environ.get("DS4_SERVER_BIN") or os.path.join(ROOT, "ds4-server")
        self.args = [binary, "-m", MODEL, "--port", "0", "-c", str(ctx), "-t", str(threads)]
        if force:
            self.args += ["--test-force-output", FORCE]
        self.args += list(args)
        self.log = tempfile.NamedTemporaryFile(prefix="ds4-server-", suffix=".log", delete=False)
        self.proc = None
        self.port = None

    def start(self):
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.time() + 60
        while time.time() < deadline:
            m = re.search(r"listening on http://[^:]+:(\d+)", self.text())
            if m:
                self.port = int(m.group(1))
                return self
            if self.proc.poll() is not None:
                raise RuntimeError("ds4-server exited (%d):\n%s" % (self.proc.returncode, self.text()))
            time.sleep(0.05)
        raise RuntimeError("ds4-server did not start:\n" + self.text())

    def text(self):
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=timeout)
        return self.proc.returncode if self.proc else None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        rc = self.stop()
        if exc[0] is None and rc not in (0, None):
            raise RuntimeError("ds4-server exited with %s:\n%s" % (rc, self.text()))
        os.unlink(self.log.name)

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def request(self, method, path, body=None, headers=None, raw=None, timeout=120):
        """(status, headers, bytes) for one request."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def post(self, path, body, headers=None, **kw):
        status, hdrs, data = self.request("POST", path, body, headers, **kw)
        return status, json.loads(data) if data else None

    def get(self, path, headers=None):
        status, hdrs, data = self.request("GET", path, None, headers)
        return status, json.loads(data) if data else None

    def stream(self, path, body, headers=None):
        """SSE events of a streaming request: list of (event, data) with data
        parsed as JSON ("[DONE]" kept as a string); comments as (':', text)."""
        status, hdrs, data = self.request("POST", path, body, headers)
        if status != 200:
            raise AssertionError("stream status %d: %s" % (status, data[:500]))
        assert hdrs.get("Content-Type", "").startswith("text/event-stream"), hdrs
        return parse_sse(data.decode("utf-8"))

    def stats(self):
        return self.get("/v1/ds4/stats")[1]


def parse_sse(text):
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        event, data = None, []
        for line in block.split("\n"):
            if line.startswith(":"):
                events.append((":", line[1:].strip()))
            elif line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            d = "\n".join(data)
            events.append((event, d if d == "[DONE]" else json.loads(d)))
    return events


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)
