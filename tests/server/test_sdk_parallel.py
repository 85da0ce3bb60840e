"""test_sdk_parallel.py - ds4-server with 32 sessions driven by 32 clients of
the official `openai` and `anthropic` SDKs at once (versions pinned in
tests/server/requirements.txt; run by `make test-server-parallel`, which
makes the venv as tests/server/run.sh does).

  1. 32 clients at once: OpenAI chat, completions and Responses and
     Anthropic messages, streaming and not (the SDKs' own stream parsers);
     every fourth client first opens a long stream and goes away after a
     few events.  Every answer is complete and equal (greedy: text, finish,
     output tokens) to what a one-session server gives the same request
     alone; the abandoned streams were cancelled, their sessions free
     within a few steps (the step in flight, and those the other sessions
     run before the freed session's thread is scheduled again: one within
     one step is parallel.py's, on one session), not after their 3,000
     tokens; and the steps were shared by many sessions.
  2. 1,000 requests from the 32 clients: the server's resident memory after
     the first 200 (every session, tokenizer cache and pool warm) and after
     the last differ by less than 5 % (a leak of a few hundred bytes per
     request would show), and its file descriptors come back.
"""
import os
import sys
import threading
import time

import anthropic
import openai

sys.path.insert(0, os.path.dirname(__file__))
from harness import Server  # noqa: E402

KEY = "test-key-123"
N = 32
PASSED = []


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def words(i):
    return "client %d: %s" % (i, " ".join(["waves and tides"] * (1 + i % 7)))


def ask(oc, ac, i, stream, max_tokens=12):
    """Client i's request through its API; (text, finish, output tokens)."""
    kind = i % 4
    msgs = [{"role": "user", "content": words(i)}]
    if kind == 0:
        kw = dict(model="x", messages=msgs, max_tokens=max_tokens, temperature=0, extra_body={"thinking": False})
        if not stream:
            r = oc.chat.completions.create(**kw)
            return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens
        text, fin, n = "", None, None
        for ch in oc.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                fin = ch.choices[0].finish_reason or fin
            if ch.usage:
                n = ch.usage.completion_tokens
        return text, fin, n
    if kind == 1:
        kw = dict(model="x", prompt=words(i), max_tokens=max_tokens, temperature=0, extra_body={"thinking": False})
        if not stream:
            r = oc.completions.create(**kw)
            return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens
        text, fin, n = "", None, None
        for ch in oc.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
            if ch.choices:
                text += ch.choices[0].text
                fin = ch.choices[0].finish_reason or fin
            if ch.usage:
                n = ch.usage.completion_tokens
        return text, fin, n
    if kind == 2:
        kw = dict(model="x", input=words(i), max_output_tokens=max_tokens, temperature=0,
                  reasoning={"effort": "none"})
        if not stream:
            r = oc.responses.create(**kw)
            return r.output_text, r.status, r.usage.output_tokens
        text, final = "", None
        for ev in oc.responses.create(stream=True, **kw):
            if ev.type == "response.output_text.delta":
                text += ev.delta
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response
        check(final is not None and final.output_text == text, (i, final))
        return text, final.status, final.usage.output_tokens
    kw = dict(model="x", max_tokens=max_tokens, messages=msgs, thinking={"type": "disabled"},
              extra_body={"temperature": 0})
    if not stream:
        m = ac.messages.create(**kw)
        return "".join(c.text for c in m.content if c.type == "text"), m.stop_reason, m.usage.output_tokens
    with ac.messages.stream(**kw) as st:
        text = "".join(st.text_stream)
        m = st.get_final_message()
    check("".join(c.text for c in m.content if c.type == "text") == text, (i, m))
    return text, m.stop_reason, m.usage.output_tokens


def abandon(oc, ac, i):
    """Open a long stream and go away after a few events."""
    msgs = [{"role": "user", "content": "Write a long essay, client %d." % i}]
    if i % 2:
        with ac.messages.stream(model="x", max_tokens=3000, messages=msgs, thinking={"type": "disabled"}) as st:
            for k, _ in enumerate(st.text_stream):
                if k == 3:
                    break
        return
    s = oc.chat.completions.create(model="x", messages=msgs, max_tokens=3000, stream=True,
                                   extra_body={"thinking": False})
    for k, _ in enumerate(s):
        if k == 3:
            break
    s.close()


def clients(url):
    return (openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=600),
            anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=600))


def run_clients(n, fn):
    errors = []

    def go(i):
        try:
            fn(i)
        except Exception as e:  # noqa: BLE001 - reported below with the client's number
            errors.append((i, repr(e)))
    th = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    check(not errors, errors[:4])


def t_32_clients_equal_solo():
    with Server("--api-key", KEY, "--parallel", "1") as solo:
        oc, ac = clients(solo.url)
        want = [ask(oc, ac, i, False) for i in range(N)]
    got = [None] * N
    with Server("--api-key", KEY, "--parallel", str(N), "--batch-tokens", "128", "--queue", str(2 * N)) as s:
        def client(i):
            oc, ac = clients(s.url)
            if i % 4 == 3:
                abandon(oc, ac, i)
            got[i] = ask(oc, ac, i, i % 2 == 1)
        run_clients(N, client)
        deadline = time.time() + 30
        while time.time() < deadline and stats(s)["jobs"]["running"]:
            time.sleep(0.05)
        st = stats(s)
    for i in range(N):
        check(got[i] == want[i], (i, "concurrent", got[i], "solo", want[i]))
    j = st["jobs"]
    check(j["answered"] == N and j["cancelled"] == N // 4 and j["failed"] == 0, j)
    check(j["cancel_free_steps_max"] < 50, j)
    check(st["batches"]["max_sessions"] >= 8, st["batches"])


def stats(s):
    return s.get("/v1/ds4/stats", headers={"Authorization": "Bearer " + KEY})[1]


def proc_usage(pid):
    with open("/proc/%d/status" % pid) as f:
        rss = [int(line.split()[1]) for line in f if line.startswith("VmRSS:")][0]
    return rss, len(os.listdir("/proc/%d/fd" % pid))


def t_rss_flat_over_1000_requests():
    total, warm = 1000, 200
    with Server("--api-key", KEY, "--parallel", str(N), "--queue", str(2 * N)) as s:
        done = [0]
        lock = threading.Lock()
        marks = {}

        def client(i):
            oc, ac = clients(s.url)
            k = 0
            while True:
                with lock:
                    if done[0] >= total:
                        return
                    done[0] += 1
                    n = done[0]
                text, fin, out = ask(oc, ac, i + N * (k % 3), k % 2 == 1, max_tokens=3)
                check(out == 3 and fin in ("length", "incomplete", "max_tokens"), (i, k, fin, out))
                k += 1
                if n == warm:
                    with lock:
                        marks["warm"] = proc_usage(s.proc.pid)
        t0 = time.time()
        run_clients(N, client)
        time.sleep(0.5)
        end = proc_usage(s.proc.pid)
        st = stats(s)
        print("   %d requests in %.1f s; RSS %d KiB after %d, %d KiB after %d; fds %d -> %d" % (
            total, time.time() - t0, marks["warm"][0], warm, end[0], total, marks["warm"][1], end[1]))
        check(st["jobs"]["answered"] == total, st["jobs"])
        check(end[0] < marks["warm"][0] * 1.05, (marks["warm"], end))
        check(end[1] <= marks["warm"][1] + 2, (marks["warm"], end))


def main():
    for fn in (t_32_clients_equal_solo, t_rss_flat_over_1000_requests):
        t0 = time.time()
        fn()
        PASSED.append(fn.__name__)
        print("ok %-32s %.2fs" % (fn.__name__, time.time() - t0), flush=True)
    print("openai %s, anthropic %s" % (openai.__version__, anthropic.__version__))
    print("%d passed, 0 failed" % len(PASSED))


if __name__ == "__main__":
    main()
