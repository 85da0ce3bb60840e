"""cli_runtime.py - ds4 and ds4-server at run time: Ctrl+C at every stage
and --no-sim (issue 50, items 1 and 11).

Ctrl+C before the work starts is made deterministic: the program is started
with SIGINT blocked and one already pending, as a parent that blocked it
would leave it; a program that handles Ctrl+C unblocks it and must then act
on the press it finds, not lose it.  Ctrl+C during the work is sent once the
model is loaded (the memory line is on stderr) into a run that takes many
seconds.  --no-sim: ds4-server's greedy answer equals the CLI's with the
simulations off and differs from the one with them on, so the option
reaches the forward pass of both programs.

usage: cli_runtime.py WORK_DIR   (the model is the server tests' tiny one)
"""
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
import harness  # noqa: E402

DS4 = os.path.join(ROOT, "ds4")
SERVER = os.path.join(ROOT, "ds4-server")


def fail(msg):
    print("cli_runtime: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def block_sigint():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])


def run_with_pending_sigint(args):
    """(status, stdout, stderr) of a run started with a Ctrl+C waiting."""
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=block_sigint)
    os.kill(p.pid, signal.SIGINT)  # blocked in the child: it waits there
    out, err = p.communicate(timeout=300)
    return p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def run_interrupted_after_load(args, delay=1.0):
    """(status, stdout, stderr) of a run that gets Ctrl+C once it has loaded."""
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = b""
    while b"memory: " not in err:
        line = p.stderr.readline()
        if not line:
            break
        err += line
    time.sleep(delay)
    if p.poll() is not None:
        fail("%s finished before Ctrl+C could interrupt it: %s" % (args, err.decode()))
    p.send_signal(signal.SIGINT)
    out, rest = p.communicate(timeout=300)
    return p.returncode, out.decode("utf-8", "replace"), (err + rest).decode("utf-8", "replace")


def expect(what, got, want_status, want_err):
    status, out, err = got
    if status != want_status:
        fail("%s: exit status %s, want %s; stderr: %s" % (what, status, want_status, err))
    if want_err not in err:
        fail("%s: stderr lacks %r: %s" % (what, want_err, err))
    print("cli_runtime: %s ok" % what)
    return out, err


def test_ctrl_c(model, text):
    base = [DS4, "-m", model, "-c", "4096", "--nothink", "--temp", "0", "-n", "64", "-p", "Hello"]
    # Pressed before the prefill: the answer is not generated, status 130.
    out, _ = expect("Ctrl+C before the prefill", run_with_pending_sigint(base), 130, "ds4: interrupted")
    if out:
        fail("Ctrl+C before the prefill: an answer was printed: %r" % out)
    # Pressed before --warm-weights: the reading stops before it starts.
    expect("Ctrl+C during --warm-weights", run_with_pending_sigint(base + ["--warm-weights"]), 130,
           "ds4: warming the weights: interrupted")
    # The diagnostics exit 130 too, before and during their work.
    ppl = [DS4, "-m", model, "-c", "4096", "--perplexity-file", text]
    expect("Ctrl+C before --perplexity-file", run_with_pending_sigint(ppl), 130, "ds4: interrupted")
    out, _ = expect("Ctrl+C during --perplexity-file", run_interrupted_after_load(ppl), 130, "ds4: interrupted")
    if "ppl=" in out:
        fail("an interrupted --perplexity-file printed a result: %s" % out)
    lp = os.path.join(os.path.dirname(text), "interrupted.json")
    dump = [DS4, "-m", model, "-c", "4096", "-n", "100000", "-p", "Hello", "--dump-logprobs", lp]
    expect("Ctrl+C during --dump-logprobs", run_interrupted_after_load(dump), 130, "ds4: interrupted")
    with open(lp) as f:  # the steps made so far are kept, as valid JSON
        steps = json.load(f)["steps"]
    if not 0 < len(steps) < 100000:
        fail("an interrupted --dump-logprobs kept %d steps" % len(steps))
    # ds4-server: a signal while --warm-weights reads the model ends it (130).
    srv = [SERVER, "-m", model, "-c", "256", "--port", "0", "--warm-weights"]
    _, err = expect("ds4-server: SIGINT during --warm-weights", run_with_pending_sigint(srv), 130,
                    "ds4-server: warming the weights: interrupted")
    if "listening" in err:
        fail("ds4-server listened after an interrupted --warm-weights: %s" % err)


def greedy_cli(model, *extra):
    args = [DS4, "-m", model, "-c", "4096", "-sys", "", "--nothink", "--temp", "0", "-n", "200", "-p", "Hello"]
    r = subprocess.run(args + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
    out = r.stdout.decode("utf-8", "replace")
    return out[:-1] if out.endswith("\n") else out  # the newline ds4 ends an answer with


def greedy_server(*extra):
    with harness.Server(*extra, ctx=4096, force=False) as s:
        status, body = s.post("/v1/chat/completions", {"model": "deepseek-chat", "temperature": 0, "max_tokens": 200,
                                                      "messages": [{"role": "user", "content": "Hello"}]})
        if status != 200:
            fail("ds4-server %s: status %d: %s" % (extra, status, body))
        log = s.text()
    return body["choices"][0]["message"]["content"], log


def test_no_sim():
    model = harness.ensure_model()
    cli_sim, cli_exact = greedy_cli(model), greedy_cli(model, "--no-sim")
    if cli_sim == cli_exact:
        fail("--no-sim changed nothing in 200 greedy tokens of ds4 (the test needs a prompt where it does)")
    srv_exact, log = greedy_server("--no-sim")
    if "simulations off" not in log:
        fail("ds4-server --no-sim does not say so: %s" % log)
    if srv_exact != cli_exact:
        fail("ds4-server --no-sim answered %r, ds4 --no-sim %r" % (srv_exact[:80], cli_exact[:80]))
    srv_sim, _ = greedy_server()
    if srv_sim != cli_sim:
        fail("ds4-server answered %r, ds4 %r" % (srv_sim[:80], cli_sim[:80]))
    print("cli_runtime: --no-sim ok (ds4 and ds4-server agree, with and without the simulations)")


def main():
    if len(sys.argv) != 2:
        fail("usage: cli_runtime.py WORK_DIR")
    os.makedirs(sys.argv[1], exist_ok=True)
    text = os.path.join(sys.argv[1], "long.txt")
    with open(text, "w") as f:  # about 2000 tokens: seconds of scoring
        for i in range(120):
            f.write("Line %d of a text long enough that scoring it takes a while on the tiny model.\n" % i)
    test_ctrl_c(harness.ensure_model(), text)
    test_no_sim()


if __name__ == "__main__":
    main()
