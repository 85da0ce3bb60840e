"""parallel.py - ds4-server with many sessions at once (--parallel), stdlib
only (part of the default suite through tests/suite/server_parallel.sh).

  - concurrent requests of the four APIs, streaming and not, give the very
    answers (greedy: text, finish, token counts) a one-session server gives
    them one at a time, and their steps really were shared;
  - a client that goes away mid-stream frees its session within one
    batched step, and the request waiting for it then runs;
  - the queue: 429 beyond --queue while the sessions are busy;
  - the scheduler: a conversation's next turn, and tool outputs sent alone,
    find their own session among others; an idle session given to another conversation goes to the disk
    cache and its conversation comes back from there;
  - /v1/ds4/stats: sessions, batches, queue, tokens per second;
  - shutdown with sessions running and requests queued: errors and 503s,
    every session saved to the disk cache;
  - startup: --parallel 0 is a usage error, more sessions than the memory
    holds a startup error naming the memory needed; the startup line's
    arithmetic, and a default --parallel sized by it;
  - admission: a prompt over the context refused at once (never queued),
    one whose max_tokens runs past it stopped where the context ends; by
    memory: with room for two small sessions or one big, requests wait and
    all complete as alone, idle sessions freed to make room; a request
    whose session could never fit refused at once with the bytes; a
    conversation that outgrows its session keeps its live state;
  - growth while answering: a request without max_tokens starts in a
    session of its prompt and a granule of output and grows at its end,
    answering as a session made whole from the start; without room for
    the growth, it waits for a running request to end, or ends there
    (finish length, usage stopped_by_memory) when none would free memory
    or --grow-wait is spent; a reused state longer than the admitted
    session (a thinking turn replayed without its reasoning) grows before
    its prefill, or is given up for a cold prefill without room.
The heavy variants (32 SDK clients, 1,000 requests with the RSS watched)
are tests/server/test_sdk_parallel.py (make test-server-parallel).
"""
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import MODEL, ROOT, Server, ensure_model, parse_sse  # noqa: E402

PASSED = []


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def request_for(i, stream):
    """(path, body) of client i: the four APIs in turn, prompts of different
    lengths, greedy."""
    words = "client %d: %s" % (i, " ".join(["tell me about the sea"] * (1 + i % 5)))
    kind = i % 4
    if kind == 0:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": words}], "max_tokens": 12,
                                        "temperature": 0, "stream": stream, "thinking": False}
    if kind == 1:
        return "/v1/completions", {"prompt": words, "max_tokens": 12, "temperature": 0, "stream": stream,
                                   "thinking": False}
    if kind == 2:
        return "/v1/responses", {"input": words, "max_output_tokens": 12, "temperature": 0, "stream": stream,
                                 "reasoning": {"effort": "none"}}
    return "/v1/messages", {"messages": [{"role": "user", "content": words}], "max_tokens": 12, "temperature": 0,
                            "stream": stream, "thinking": {"type": "disabled"}}


def answer_of(path, stream, data):
    """What must be equal between runs: the text and the token counts."""
    if not stream:
        b = json.loads(data)
        if path == "/v1/chat/completions":
            return b["choices"][0]["message"]["content"], b["choices"][0]["finish_reason"], \
                b["usage"]["completion_tokens"], b["usage"]["prompt_tokens"]
        if path == "/v1/completions":
            return b["choices"][0]["text"], b["choices"][0]["finish_reason"], b["usage"]["completion_tokens"], \
                b["usage"]["prompt_tokens"]
        if path == "/v1/responses":
            text = "".join(c["text"] for o in b["output"] if o["type"] == "message" for c in o["content"])
            return text, b["status"], b["usage"]["output_tokens"], b["usage"]["input_tokens"]
        u = b["usage"]
        return "".join(c.get("text", "") for c in b["content"]), b["stop_reason"], u["output_tokens"], \
            u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
    ev = parse_sse(data.decode("utf-8"))
    if path == "/v1/chat/completions":
        text = "".join(d["choices"][0]["delta"].get("content") or "" for e, d in ev
                       if e != ":" and d != "[DONE]" and d.get("choices"))
        fin = [d["choices"][0]["finish_reason"] for e, d in ev if e != ":" and d != "[DONE]" and d.get("choices")
               and d["choices"][0].get("finish_reason")]
        check(ev[-1][1] == "[DONE]", ev[-2:])
        return text, fin[-1], None, None
    if path == "/v1/completions":
        text = "".join(d["choices"][0]["text"] for e, d in ev if e != ":" and d != "[DONE]" and d.get("choices"))
        fin = [d["choices"][0]["finish_reason"] for e, d in ev if e != ":" and d != "[DONE]" and d.get("choices")
               and d["choices"][0].get("finish_reason")]
        check(ev[-1][1] == "[DONE]", ev[-2:])
        return text, fin[-1], None, None
    if path == "/v1/responses":
        done = [d for e, d in ev if isinstance(d, dict) and d.get("type") in ("response.completed",
                                                                                "response.incomplete")]
        check(done, ev[-2:])
        b = done[0]["response"]
        text = "".join(c["text"] for o in b["output"] if o["type"] == "message" for c in o["content"])
        return text, b["status"], b["usage"]["output_tokens"], b["usage"]["input_tokens"]
    text = "".join(d["delta"].get("text", "") for e, d in ev if e == "content_block_delta")
    md = [d for e, d in ev if e == "message_delta"]
    check(md and ev[-1][0] == "message_stop", ev[-2:])
    return text, md[0]["delta"]["stop_reason"], md[0]["usage"]["output_tokens"], None


def run_one(s, i, stream):
    path, body = request_for(i, stream)
    st, hdrs, data = s.request("POST", path, body)
    check(st == 200, (i, st, data[:300]))
    return answer_of(path, stream, data)


def run_all(s, n, stream_of, concurrent):
    out = [None] * n
    errors = []

    def go(i):
        try:
            out[i] = run_one(s, i, stream_of(i))
        except Exception as e:  # noqa: BLE001 - reported below with the client's number
            errors.append((i, repr(e)))
    if not concurrent:
        for i in range(n):
            go(i)
    else:
        th = [threading.Thread(target=go, args=(i,)) for i in range(n)]
        for t in th:
            t.start()
        for t in th:
            t.join()
    check(not errors, errors)
    return out


def t_concurrent_equals_solo():
    """8 clients at once on 8 sessions: each answer is the one a one-session
    server gives the same request alone, streaming or not."""
    n = 8
    with Server("--parallel", "1") as solo:
        want = run_all(solo, n, lambda i: False, False)
    with Server("--parallel", str(n), "--batch-tokens", "48") as s:
        got = run_all(s, n, lambda i: i % 3 == 1, True)
        st = answered_stats(s, n)
    for i in range(n):
        w, g = want[i], got[i]
        check(g[0] == w[0] and g[1] == w[1], (i, "batched", g, "solo", w))
        check(g[2] is None or g[2] == w[2], (i, g, w))
        check(g[3] is None or g[3] == w[3], (i, g, w))
    check(st["sessions"]["parallel"] == n and st["jobs"]["answered"] == n, st)
    check(st["batches"]["max_sessions"] > 1 and st["batches"]["max_rows"] <= 48, st["batches"])
    # the pacer (engine/pace.h): the decoders' step seen, the piece within
    # [16, 48] once one was cut beside them
    pace = st["batches"]
    check(pace["decode_step_ms"] is None or pace["decode_step_ms"] > 0, pace)
    check(pace["prefill_piece"] is None or 16 <= pace["prefill_piece"] <= 48, pace)


def open_stream(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    check(r.status == 200, r.status)
    return c, r


def wait_for(fn, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


def answered_stats(s, n, timeout=10):
    """The stats once n jobs are counted answered: a client has its whole
    answer a moment before its job ends and is counted (seen: 7 of 8)."""
    return wait_for(lambda: (lambda st: st if st["jobs"]["answered"] == n else None)(s.stats()),
                    "%d jobs counted answered" % n, timeout)


def t_disconnect_frees_session():
    """One session: a stream whose client goes away frees it within one
    batched step, and the request queued behind it runs."""
    with Server("--parallel", "1") as s:
        long = {"messages": [{"role": "user", "content": "Write a long essay."}], "max_tokens": 3000,
                "stream": True, "thinking": False}
        c, r = open_stream(s.port, long)
        r.read1(200)  # the stream has started
        result = {}

        def queued():
            result["got"] = run_one(s, 0, False)
        t = threading.Thread(target=queued)
        t.start()
        wait_for(lambda: s.stats()["jobs"]["waiting"] == 1, "the second request to queue")
        c.sock.close()
        c.close()
        t.join(timeout=60)
        check("got" in result, "the queued request did not run")
        st = s.stats()
        check(st["jobs"]["cancelled"] == 1 and st["tokens"]["generated"] < 3000, st["jobs"])
        check(st["jobs"]["cancel_free_steps_max"] <= 1, st["jobs"])


def t_queue_full():
    """--queue 1 with the one session busy: the second request waits, the
    third is refused 429."""
    with Server("--parallel", "1", "--queue", "1") as s:
        c, r = open_stream(s.port, {"messages": [{"role": "user", "content": "Write a long essay."}],
                                    "max_tokens": 3000, "stream": True, "thinking": False})
        r.read1(200)
        result = {}
        t = threading.Thread(target=lambda: result.update(got=run_one(s, 1, False)))
        t.start()
        wait_for(lambda: s.stats()["jobs"]["waiting"] == 1, "the second request to queue")
        st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        check(st == 429 and "too many requests queued" in b["error"]["message"], (st, b))
        c.sock.close()
        c.close()
        t.join(timeout=60)
        check("got" in result, "the queued request did not run")
        check(s.stats()["jobs"]["rejected_queue_full"] == 1, s.stats()["jobs"])


def t_admission():
    """With the one session busy and the queue full, a prompt longer than
    the context is answered 400 at once (context_length_exceeded, JSON,
    never queued), another request 429; a request whose prompt and
    max_tokens exceed the context waits, runs in a session that grows to
    the whole context, and stops where the context ends (finish length)."""
    with Server("--parallel", "1", "--queue", "1", ctx=512) as s:
        c, r = open_stream(s.port, {"messages": [{"role": "user", "content": "Write a long essay."}],
                                    "max_tokens": 3000, "stream": True, "thinking": False})
        r.read1(200)
        result = {}

        def queued():
            result["got"] = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Go on."}],
                                                            "max_tokens": 100000, "temperature": 0,
                                                            "thinking": False})
        t = threading.Thread(target=queued)
        t.start()
        wait_for(lambda: s.stats()["jobs"]["waiting"] == 1, "the second request to queue")
        t0 = time.time()
        st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "sea " * 600}],
                                                "max_tokens": 2})
        check(st == 400 and b["error"]["code"] == "context_length_exceeded" and b["error"]["n_ctx"] == 512
              and time.time() - t0 < 5, (st, b))
        st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        check(st == 429 and "too many requests queued" in b["error"]["message"], (st, b))
        jobs = s.stats()["jobs"]
        check(jobs["queued"] == 2 and jobs["waiting"] == 1 and jobs["rejected_queue_full"] == 1, jobs)
        c.sock.close()
        c.close()
        t.join(timeout=120)
        check("got" in result, "the queued request did not end")
        st, b = result["got"]
        u = b["usage"]
        check(st == 200 and b["choices"][0]["finish_reason"] == "length"
              and u["prompt_tokens"] + u["completion_tokens"] == 511, (st, b))


def chat_turns(s, conv, turns):
    """Run the conversation's next turn; returns (usage, kv source)."""
    st, b = s.post("/v1/chat/completions", {"messages": conv, "max_tokens": 6, "temperature": 0, "thinking": False})
    check(st == 200, b)
    conv.append({"role": "assistant", "content": b["choices"][0]["message"]["content"]})
    conv.append({"role": "user", "content": "And then? (%d)" % turns})
    return b["usage"], s.stats()["last_prompt"]["kv_source"]


def t_conversations_find_their_session():
    """Three conversations on three sessions, turns interleaved: every turn
    after the first continues its own session (its live state or the
    checkpoint of its last prompt), reusing at least its previous prompt."""
    with Server("--parallel", "3") as s:
        convs = [[{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "Topic %d: %s" % (i, "the sea " * (i + 1))}] for i in range(3)]
        prev = [None] * 3
        for turn in range(3):
            for i in range(3):
                u, src = chat_turns(s, convs[i], turn)
                if turn:
                    check(src in ("memory-token", "memory-text", "memory-checkpoint"), (i, turn, src))
                    check(u["prompt_tokens_details"]["cached_tokens"] >= prev[i]["prompt_tokens"], (i, u, prev[i]))
                prev[i] = u
        st = s.stats()
        check(st["sessions"]["live"] == 3 and st["sessions"]["evicted"] == 0, st["sessions"])


def t_eviction_to_disk_and_back():
    """Two sessions, three conversations: the third takes the least
    recently used session, whose conversation goes to the disk cache
    (evict) and comes back from it at its next turn."""
    kvdir = tempfile.mkdtemp(prefix="ds4-par-kv-")
    try:
        with Server("--parallel", "2", "--kv-disk-dir", kvdir, "--kv-cache-min-tokens", "16",
                    "--kv-cache-boundary-align-tokens", "16") as s:
            convs = [[{"role": "user", "content": "Conversation %d: %s" % (i, "waves and tides " * 8)}]
                     for i in range(3)]
            chat_turns(s, convs[0], 0)
            chat_turns(s, convs[1], 0)
            chat_turns(s, convs[2], 0)  # evicts conversation 0's session
            st = s.stats()
            check(st["sessions"]["evicted"] == 1, st["sessions"])
            check(st["kvcache"]["files_written_by_reason"]["evict"] >= 1, st["kvcache"])
            u, src = chat_turns(s, convs[0], 1)  # back from the disk (evicting conversation 1's session)
            check(src == "disk" and u["prompt_tokens_details"]["cached_tokens"] > 0, (src, u))
    finally:
        shutil.rmtree(kvdir, ignore_errors=True)


TOOL_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
               "required": ["city"]}


def t_tool_outputs_find_their_session():
    """Anthropic and Responses tool calls in two conversations, other
    requests in between on other sessions: the tool outputs sent alone go
    to the session that holds their calls (anthropic-tool-output,
    responses-tool-output, every live token kept), whichever came last."""
    with Server("--parallel", "3") as s:
        a_base = {"system": "Weather bot.", "thinking": {"type": "disabled"},
                  "tools": [{"name": "get_weather", "description": "Weather", "input_schema": TOOL_PARAMS}]}
        st, a = s.post("/v1/messages", dict(a_base, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                            max_tokens=200), headers={"X-DS4-Test-Output": "weather_call"})
        tu = [c for c in a["content"] if c["type"] == "tool_use"]
        check(st == 200 and len(tu) == 1, a)
        a_live = a["usage"]["cache_creation_input_tokens"] + a["usage"]["output_tokens"] - 1
        r_base = {"instructions": "Weather bot.", "reasoning": {"effort": "none"},
                  "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
                             "parameters": TOOL_PARAMS}]}
        st, r = s.post("/v1/responses", dict(r_base, input=[{"role": "user", "content": "Weather in Rome?"}]),
                       headers={"X-DS4-Test-Output": "weather_call"})
        fc = [o for o in r["output"] if o["type"] == "function_call"]
        check(st == 200 and len(fc) == 1, r)
        r_live = r["usage"]["input_tokens"] + r["usage"]["output_tokens"] - 1
        for i in range(2):  # unrelated requests: the third session, then the least recently used one
            st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Other %d" % i}],
                                                    "max_tokens": 2, "thinking": False})
            check(st == 200, b)
        st, r2 = s.post("/v1/responses", dict(r_base, input=[{"type": "function_call_output", "call_id":
                                                               fc[0]["call_id"], "output": "sunny"}],
                                              max_output_tokens=4))
        check(st == 200 and s.stats()["last_prompt"]["kv_source"] == "responses-tool-output", (r2, s.stats()))
        check(r2["usage"]["input_tokens_details"]["cached_tokens"] == r_live, (r2["usage"], r_live))
        results = [{"type": "tool_result", "tool_use_id": tu[0]["id"], "content": "sunny"}]
        st, a2 = s.post("/v1/messages", dict(a_base, messages=[{"role": "user", "content": results}], max_tokens=4))
        check(st == 200 and s.stats()["last_prompt"]["kv_source"] == "anthropic-tool-output", (a2, s.stats()))
        check(a2["usage"]["cache_read_input_tokens"] == a_live, (a2["usage"], a_live))


def t_stats_while_running():
    """/v1/ds4/stats while two long generations run: both sessions run,
    steps carry both, tokens per second is measured, the queue is seen."""
    with Server("--parallel", "2") as s:
        streams = [open_stream(s.port, {"messages": [{"role": "user", "content": "Essay %d please." % i}],
                                        "max_tokens": 3000, "stream": True, "thinking": False}) for i in range(2)]
        for c, r in streams:
            r.read1(200)
        queued = threading.Thread(target=lambda: s.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}))
        queued.start()
        # the first token comes from a prefill, a step of one session: wait
        # for a step that carries both as well (on a busy machine the rate
        # is seen before it)
        st = wait_for(lambda: (lambda v: v if v["jobs"]["waiting"] == 1 and v["tokens"]["generated_per_second"] > 0
                               and v["batches"]["max_sessions"] >= 2 else None)(s.stats()),
                      "a queued job, a token rate and a step of both sessions", timeout=40)
        check(st["sessions"]["running"] == 2 and st["jobs"]["running"] == 2, st["sessions"])
        check(st["batches"]["max_sessions"] >= 2 and st["batches"]["mean_sessions"] > 1, st["batches"])
        check(st["jobs"]["oldest_wait_seconds"] >= 0, st["jobs"])
        for c, r in streams:
            c.sock.close()
            c.close()
        queued.join(timeout=60)
        check(s.stats()["jobs"]["answered"] >= 1, s.stats()["jobs"])


def t_shutdown_with_sessions_running():
    """SIGTERM with three sessions generating and two requests queued: the
    streams end with an error event, the queued requests get 503, every
    session's state is saved ("shutdown"), the process exits 0."""
    kvdir = tempfile.mkdtemp(prefix="ds4-par-kv-")
    try:
        s = Server("--parallel", "3", "--kv-disk-dir", kvdir, "--kv-cache-min-tokens", "16").start()
        out = {}

        def stream(i):
            out[i] = s.stream("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Long story number %d about %s" % (i, "the sea " * 8)}],
                "max_tokens": 3500,
                "stream": True, "thinking": False})

        def queued(i):
            out[i] = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Queued %d" % i}],
                                                     "max_tokens": 2})
        th = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for t in th:
            t.start()
        wait_for(lambda: s.stats()["jobs"]["running"] == 3, "three running sessions")
        th += [threading.Thread(target=queued, args=(i,)) for i in (3, 4)]
        for t in th[3:]:
            t.start()
        wait_for(lambda: s.stats()["jobs"]["waiting"] == 2, "two queued requests")
        time.sleep(0.3)  # generating
        rc = s.stop()
        for t in th:
            t.join()
        check(rc == 0, "exit status %s: %s" % (rc, s.text()[-800:]))
        for i in range(3):
            errs = [d for e, d in out[i] if e == "error"]
            check(errs and errs[0]["error"]["message"] == "shutdown requested", out[i][-3:])
        for i in (3, 4):
            check(out[i][0] == 503 and "shutting down" in out[i][1]["error"]["message"], out[i])
        check(s.text().count("(shutdown,") == 3, s.text()[-1500:])
        check(len([f for f in os.listdir(kvdir) if f.endswith(".kv")]) == 3, os.listdir(kvdir))
        os.unlink(s.log.name)
    finally:
        shutil.rmtree(kvdir, ignore_errors=True)


def run_server(*args):
    ensure_model()
    binary = os.environ.get("DS4_SERVER_BIN") or os.path.join(ROOT, "ds4-server")
    p = subprocess.run([binary, "-m", MODEL, "--port", "0"] + list(args), capture_output=True, text=True,
                       timeout=600)
    return p.returncode, p.stderr


def t_startup_errors():
    """--parallel 0 is a usage error (and a --pace-stretch that is not 0 or
    above 1); more sessions of the least than the
    sessions' memory holds a startup error naming the memory needed and the
    budget, before any session is made (CUDA: the GPU's free memory; it
    used to find out session by session); so is a --kv-mem-mb below one
    session (the default context of 32768 tokens: sessions of 2048 and
    more)."""
    rc, err = run_server("--parallel", "0")
    check(rc == 2 and "--parallel" in err, (rc, err))
    # the pacer's stretch: 0 (none) or above 1, within 100
    for bad in ("0.5", "1", "101", "x"):
        rc, err = run_server("--pace-stretch", bad)
        check(rc == 2 and "--pace-stretch" in err, (bad, rc, err))
    rc, err = run_server("--parallel", "64", "--kv-mem-mb", "8")
    m = re.search(r"ds4-server: --parallel 64: 64 sessions of at least 2048 tokens need [\d.]+ \w+ of memory "
                  r"\([\d.]+ \w+ each\), but the sessions have 8.0 MiB \(--kv-mem-mb\); lower --parallel", err)
    check(rc == 1 and m, (rc, err))
    rc, err = run_server("--kv-mem-mb", "1")
    m = re.search(r"ds4-server: a session of 2048 tokens needs [\d.]+ \w+ of memory, but the sessions have 1.0 MiB "
                  r"\(--kv-mem-mb\); lower --ctx or free memory", err)
    check(rc == 1 and m, (rc, err))


SESSIONS_LINE = re.compile(r"server +(\d+) sessions? at most, each of (\d+) to (\d+) tokens: ([\d.]+ \w+) to "
                           r"([\d.]+ \w+) \(at \d+ tokens: state ([\d.]+ \w+), checkpoint ([\d.]+ \w+|0 bytes), "
                           r"token list ([\d.]+ \w+)\); (.*)")


def sessions_line(*args):
    """The startup line of a server started with args: (sessions, the
    line's groups)."""
    with Server(*args) as s:
        m = SESSIONS_LINE.search(s.text())
        check(m, s.text()[-1500:])
        check(s.stats()["sessions"]["parallel"] == int(m.group(1)), (s.stats()["sessions"], m.group(0)))
        return int(m.group(1)), m


def t_startup_sizing():
    """The startup line says what a session takes at its least (state,
    checkpoint, token list) and at the whole context, and the memory's
    arithmetic; without --parallel the sessions are as many of the least
    as the budget (three quarters of the room left beside the weights)
    holds, at most 16 (engine/capacity.h, tested with given figures in
    tests/unit/test_capacity.c)."""
    n, m = sessions_line()
    holds = [int(h) for h in re.findall(r"(\d+) of the least or \d+ of the most at once", m.group(9))]
    check(holds and re.search(r"memory: [\d.]+ \w+ for sessions \(3/4 of [\d.]+ \w+ available - [\d.]+ \w+ "
                              r"weights - [\d.]+ \w+ shared\)", m.group(9)), m.group(0))
    check(n == max(1, min(16, min(holds))), (n, holds, m.group(0)))
    # contexts of 4096 tokens grow by 256 (the granule): 256 token ids of 4 bytes
    check(m.group(2) == "256" and m.group(3) == "4096" and m.group(8) == "1.0 KiB", m.group(0))
    check(m.group(6) == m.group(7), m.group(0))  # the checkpoint is a KV state
    check("no --parallel: as many as the memory holds, at most 16" in m.group(9), m.group(0))
    # a given --parallel and budget
    n, m = sessions_line("--parallel", "2", "--kv-mem-mb", "64")
    check(n == 2 and re.search(r"memory: 64.0 MiB for sessions \(--kv-mem-mb\), \d+ of the least or \d+ of the "
                               r"most at once$", m.group(9)), m.group(0))
    n, m = sessions_line("--parallel", "1", "--no-memory-checkpoint")
    check(n == 1 and m.group(7) == "0 bytes", m.group(0))


def chat(content, max_tokens, stream=False):
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0,
            "stream": stream, "thinking": False}


def held(s):
    return s.stats()["sessions"]["memory"][0]["held_bytes"]


# Requests of the memory tests: three of sessions of the least (the second
# runs longest), one of three times as many tokens (a longer prompt).
SMALL = [chat("Small request %d: tell me about the sea." % i, n) for i, n in enumerate((100, 230, 60))]
BIG = chat("Big request: " + "waves " * 600, 8)


def t_admission_by_memory():
    """Two sessions, memory for two small ones or the big one: two small
    requests run; the big one waits (and the small one after it: first in
    line first), also once the first small one ended and its session is
    free: that session goes first to free its memory, then the other once
    its request ended, and the big one runs, then the last; every answer is
    the one a lone session gives, and the sessions never hold more than the
    budget.  The budget (--kv-mem-mb) comes from what a lone session holds
    after a small request and after the big one."""
    want = []
    with Server("--parallel", "1") as solo:
        sizes = []
        for body in SMALL + [BIG]:
            st, b = solo.post("/v1/chat/completions", body)
            check(st == 200, b)
            want.append(b["choices"][0]["message"]["content"])
            sizes.append(held(solo))
    small, big, mib = sizes[0], sizes[3], 1 << 20
    budget = (max(2 * small, big) + mib - 1) // mib
    check(budget * mib < small + big and budget * mib < 3 * small, (small, big, budget))
    with Server("--parallel", "2", "--kv-mem-mb", str(budget)) as s:
        got = [None] * 4
        order = []

        def go(i, body):
            st, b = s.post("/v1/chat/completions", body)
            check(st == 200, (i, st, b))
            got[i] = b["choices"][0]["message"]["content"]
            order.append(i)
        th = []
        for i, body in ((0, SMALL[0]), (1, SMALL[1]), (3, BIG), (2, SMALL[2])):
            th.append(threading.Thread(target=go, args=(i, body)))
            th[-1].start()
            wait_for(lambda: s.stats()["jobs"]["queued"] == len(th), "request %d to queue" % i)
        seen = []
        while any(t.is_alive() for t in th):
            st = s.stats()
            mem = st["sessions"]["memory"][0]
            check(mem["held_bytes"] <= mem["budget_bytes"] == budget << 20, mem)
            seen.append((st["jobs"]["running"], st["jobs"]["waiting"]))
            time.sleep(0.02)
        for t in th:
            t.join()
        check(got == want, (got, want))
        check((2, 2) in seen, seen)  # two small ones ran, the big one and the last waited
        check((1, 2) in seen, seen)  # and waited for memory with a session free
        check(order.index(3) < order.index(2) and set(order[:2]) == {0, 1}, order)
        st = answered_stats(s, 4)
        check(st["sessions"]["evicted_for_memory"] >= 3, st["sessions"])


def t_conversation_grows():
    """A conversation that goes on past its session's size: the next turn's
    session is grown with its state kept (the turn reuses the live tokens,
    prefilling only the new ones) and answers as a fresh server does from
    the whole prompt; the session then holds that size.  (The first answer
    is a forced text, whose tokens the next turn's rendering repeats.)"""
    conv = [{"role": "user", "content": "Tell me about the weather."}]
    with Server("--parallel", "1") as s:
        st, b = s.post("/v1/chat/completions", dict(chat("", 40), messages=conv),
                       headers={"X-DS4-Test-Output": "answer"})
        check(st == 200, b)
        first = b["usage"]["prompt_tokens"]
        small = held(s)
        conv += [{"role": "assistant", "content": b["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "And the moon? " + "waves " * 300}]
        st, b = s.post("/v1/chat/completions", dict(chat("", 40), messages=conv))
        check(st == 200, b)
        u = b["usage"]
        check(s.stats()["last_prompt"]["kv_source"] == "memory-token"
              and u["prompt_tokens_details"]["cached_tokens"] > first, (u, s.stats()["last_prompt"]))
        check(u["prompt_tokens"] + 41 > 256 and held(s) > small, (u, held(s), small))
        got = b["choices"][0]["message"]["content"]
    with Server("--parallel", "1") as fresh:
        st, b = fresh.post("/v1/chat/completions", dict(chat("", 40), messages=conv))
        check(st == 200 and b["choices"][0]["message"]["content"] == got, (b, got))


def t_request_too_large():
    """With memory for sessions of 256 tokens only (a context of 1024): a
    request whose session could never fit is answered 400 at once with the
    bytes needed and available (never queued); without max_tokens its
    output is lowered to what the largest session that fits leaves, and it
    runs."""
    with Server("--parallel", "1", "--kv-mem-mb", "2", ctx=1024) as s:
        st, b = s.post("/v1/chat/completions", chat("x", 1000))
        check(st == 400 and b["error"]["code"] == "kv_memory_exceeded", (st, b))
        check(re.search(r"needs a session of 1024 tokens \(a prompt of \d+ tokens and 1000 of output\), [\d.]+ "
                        r"\w+ of memory, but the sessions have 2.0 MiB in all", b["error"]["message"]), b)
        body = chat("x", 0)
        del body["max_tokens"]
        st, b = s.post("/v1/chat/completions", body, timeout=300)
        check(st == 200 and b["choices"][0]["finish_reason"] == "length", (st, b))
        u = b["usage"]
        check(u["prompt_tokens"] + u["completion_tokens"] + 1 == 256, u)
        jobs = s.stats()["jobs"]
        check(jobs["rejected_too_large"] == 1 and jobs["queued"] == 1, jobs)


# Requests without max_tokens under -n 300, greedy: X of 236 prompt tokens
# and Y of 246 start in sessions of 512 tokens (the prompt and a granule of
# 256, rounded up; 768 with the whole output up front) and grow to 768 at
# their 511th token (X's 276th of output, Y's 266th); R (13 tokens and 400
# of output) fits 512.
GROW_N = "300"
X = "Story X: " + "waves " * 228
Y = "Story Y: " + "tides " * 238
R = "Story R: tell me about the sea."
CUT = {"X": 512 - 1 - 236 + 1, "Y": 512 - 1 - 246 + 1}  # tokens handed out when a session of 512 is full


def no_max(content):
    body = chat(content, 0)
    del body["max_tokens"]
    return body


def answer_of_chat(st, b):
    """(text, finish, usage)."""
    check(st == 200, (st, b))
    return b["choices"][0]["message"]["content"], b["choices"][0]["finish_reason"], b["usage"]


def held_tokens(s):
    return s.stats()["sessions"]["held_tokens"]


def run_together(s, bodies, budget=None, gap=False):
    """Run the requests at once (each once the previous one runs when gap),
    the sessions never over the budget (when given); their answers."""
    got = [None] * len(bodies)

    def go(i):
        got[i] = s.post("/v1/chat/completions", bodies[i], timeout=120)
    th = []
    for i in range(len(bodies)):
        th.append(threading.Thread(target=go, args=(i,)))
        th[-1].start()
        if gap:
            wait_for(lambda: s.stats()["jobs"]["running"] == i + 1, "request %d to run" % i)
    while any(t.is_alive() for t in th):
        if budget:
            mem = s.stats()["sessions"]["memory"][0]
            check(mem["held_bytes"] <= mem["budget_bytes"] == budget << 20, mem)
        time.sleep(0.02)
    return [answer_of_chat(*g) for g in got]


def references(*bodies):
    """The answers of a server whose sessions hold them whole from the
    start (a context of 65536 tokens: granules of 4096), run together (on
    the CPU a session's tokens do not depend on what shares its steps)."""
    with Server("--parallel", str(len(bodies)), "-n", GROW_N, ctx=65536) as big:
        out = run_together(big, bodies)
        st = big.stats()["sessions"]
        check(st["held_tokens"] == 4096 * len(bodies) and st["grown"] == 0, st)
    return out


def whole(got, want):
    """The whole answer, as a session that held it from the start gives it
    (greedy: the same text of the same number of tokens)."""
    check(got[:2] == want[:2] == (want[0], "length") and got[2]["completion_tokens"] == 300
          and want[2]["completion_tokens"] == 300, ("same text", got[0] == want[0], got[1:], want[1:]))
    check("stopped_by_memory" not in got[2], got[2])


def grows_alone(want):
    """A request without max_tokens starts in a session of its prompt and a
    granule of output (what the session holds after a short answer of the
    same prompt), grows by a granule where its answer reaches the
    session's end (sessions.grown, held_tokens and held_bytes up, the log
    line), and answers as a session that held the whole answer from the
    start."""
    with Server("--parallel", "1", "-n", GROW_N) as s:
        s.post("/v1/chat/completions", no_max(X), headers={"X-DS4-Test-Output": "answer"})  # ends at its EOS
        small = held(s)
        check(held_tokens(s) == 512, s.stats()["sessions"])
        got = answer_of_chat(*s.post("/v1/chat/completions", no_max(X)))
        st = s.stats()["sessions"]
        check(st["held_tokens"] == 768 and st["grown"] == 1 and st["grow_refused"] == 0 and held(s) > small, st)
        check("session 0 grew from 512 to 768 tokens" in s.text(), s.text()[-1500:])
    whole(got, want["X"])


def session_bytes():
    """What a lone session of 512 and of 768 tokens holds: a forced answer
    after a prompt of 13 and of 308 tokens, and a granule of output."""
    out = {}
    with Server("--parallel", "1") as s:
        for content, tokens in ((R, 512), ("Story Z: " + "waves " * 300, 768)):
            s.post("/v1/chat/completions", chat(content, 300), headers={"X-DS4-Test-Output": "answer"})
            check(held_tokens(s) == tokens, (tokens, s.stats()["sessions"]))
            out[tokens] = held(s)
    return out


def cut_short(got, want, n):
    """Ended where its session of 512 tokens was full: its answer up to
    there (what max_tokens n gives), finish length, the usage saying
    why."""
    check(got[:2] == want[:2] == (want[0], "length") and got[2]["completion_tokens"] == n
          and want[2]["completion_tokens"] == n, ("same text", got[0] == want[0], got[1:], want[1:]))
    check(got[2].get("stopped_by_memory") is True, got[2])


def grows_without_room(want):
    """Memory for two sessions of 512 tokens, or one of 512 growing to 768
    beside its old state, not both (--kv-mem-mb from what lone sessions
    hold):
      - Y and X reach their sessions' end (Y, started first with fewer
        tokens to go, most often first): the first waits to grow; the
        other finds no running request that could free memory and ends at
        once (finish length, usage stopped_by_memory, at 512 - 1 tokens
        held: its answer as far as a session of 512 holds it); its idle
        session is freed and the first grows and answers whole;
      - X reaches its end while R runs: it waits for R to end, then grows
        and answers whole; with --grow-wait 0 it ends there at once.
    Every answer is the one a session that held it whole from the start
    gives (R's is checked elsewhere: it never grows)."""
    sizes = session_bytes()
    mib = 1 << 20
    budget = (sizes[512] + sizes[768] + mib - 1) // mib
    check(budget * mib < 2 * sizes[512] + sizes[768], (sizes, budget))
    args = ("--parallel", "2", "-n", GROW_N, "--kv-mem-mb", str(budget))
    with Server(*args) as s:
        got = dict(zip("YX", run_together(s, [no_max(Y), no_max(X)], budget, gap=True)))
        st = s.stats()["sessions"]
        log = s.text()
    first = "Y" if got["Y"][2]["completion_tokens"] == 300 else "X"
    other = "X" if first == "Y" else "Y"
    whole(got[first], want[first])
    cut_short(got[other], want[other + "_cut"], CUT[other])
    check(st["grown"] == 1 and st["grow_refused"] == 1 and st["evicted_for_memory"] == 1, st)
    check("waits for running requests to end to grow from 512 to 768 tokens" in log
          and "no other running request would free any" in log and "stopped by memory" in log, log[-2500:])
    for wait in ("60", "0"):
        with Server(*args, "--grow-wait", wait) as s:
            r, x = run_together(s, [chat(R, 400), no_max(X)], budget, gap=True)
            st = s.stats()["sessions"]
            log = s.text()
        check(r[1] == "length" and r[2]["completion_tokens"] == 400, r)
        if wait == "60":
            whole(x, want["X"])
            check(st["grown"] == 1 and st["grow_refused"] == 0 and st["evicted_for_memory"] == 1
                  and "waits for running requests to end" in log, (st, log[-2000:]))
        else:
            cut_short(x, want["X_cut"], CUT["X"])
            check(st["grown"] == 0 and st["grow_refused"] == 1 and "still after --grow-wait" in log, (st, log[-2000:]))


def thinking_then_replay(s):
    """A thinking answer of about 290 tokens (forced), then the next turn
    replaying it without its reasoning, with 250 tokens of output: admitted
    in a session of 512 tokens, its reused state (the live session,
    reasoning kept) and that output need 768.  The second answer's usage
    and the stats."""
    msgs = [{"role": "user", "content": "Weather?"}]
    st, b = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 400},
                   headers={"X-DS4-Test-Output": "long_think"})
    check(st == 200 and b["choices"][0]["message"]["content"] == "It is sunny.", b)
    check(held_tokens(s) == 512, s.stats()["sessions"])
    msgs += [{"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "Tomorrow?"}]
    st, b = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 250, "temperature": 0})
    check(st == 200 and b["usage"]["completion_tokens"] == 250, b)
    return b["usage"], s.stats()


def t_reused_state_grows():
    """A reused state longer than the session its request was admitted
    with (a thinking turn replayed without its reasoning) grows through
    the same admission before the prefill: with room, it keeps the live
    state (thinking-visible, one growth); where the growth does not fit
    (--kv-mem-mb below the old and the new state together), the prompt is
    prefilled from the start in the admitted session instead (cold, the
    growth refused, the sessions never over the budget)."""
    sizes = session_bytes()
    mib = 1 << 20
    budget = (sizes[512] + sizes[768] - 1) // mib
    check(budget * mib >= sizes[768], (sizes, budget))
    with Server("--parallel", "1") as s:
        u, st = thinking_then_replay(s)
        check(st["last_prompt"]["kv_source"] == "thinking-visible" and u["prompt_tokens_details"]["cached_tokens"] > 290
              and st["sessions"]["grown"] == 1 and st["sessions"]["held_tokens"] == 768, (u, st))
    with Server("--parallel", "1", "--kv-mem-mb", str(budget)) as s:
        u, st = thinking_then_replay(s)
        mem = st["sessions"]["memory"][0]
        check(st["last_prompt"]["kv_source"] == "cold" and u["prompt_tokens_details"]["cached_tokens"] == 0
              and st["sessions"]["grow_refused"] == 1 and st["sessions"]["held_tokens"] == 512
              and mem["held_bytes"] <= mem["budget_bytes"], (u, st))
        check("the prompt is prefilled from the start instead" in s.text(), s.text()[-1500:])


def t_output_grows():
    """Sessions that grow while they answer (docs/SERVER.md): alone, and
    where the memory has no room for the growth; the answers compared
    with those of sessions that held them whole from the start."""
    want = dict(zip(("X", "Y", "X_cut", "Y_cut"),
                    references(no_max(X), no_max(Y), chat(X, CUT["X"]), chat(Y, CUT["Y"]))))
    grows_alone(want)
    grows_without_room(want)


def main():
    for fn in (t_startup_errors, t_startup_sizing, t_admission, t_admission_by_memory, t_request_too_large,
               t_conversation_grows, t_output_grows, t_reused_state_grows,
               t_concurrent_equals_solo, t_disconnect_frees_session, t_queue_full,
               t_conversations_find_their_session, t_tool_outputs_find_their_session, t_eviction_to_disk_and_back,
               t_stats_while_running,
               t_shutdown_with_sessions_running):
        t0 = time.time()
        fn()
        PASSED.append(fn.__name__)
        print("ok %-36s %.2fs" % (fn.__name__, time.time() - t0), flush=True)
    print("%d passed, 0 failed" % len(PASSED))


if __name__ == "__main__":
    main()
