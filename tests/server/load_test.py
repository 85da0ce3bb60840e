"""load_test.py - many concurrent clients against ds4-server (stdlib only).

    python3 tests/server/load_test.py [--clients 64] [--requests 20] [--rounds 2] [--queue N] [--parallel N]

Each client thread keeps one HTTP/1.1 connection and sends its requests in
turn, cycling through the four APIs, streaming and not, some with forced
tool-call output; every answer is checked (status 200 with a well-formed
body or event stream, or a documented refusal: 429 when the queue is full,
503 when shutting down).  After each round the server's resident memory
and open file descriptors are read from /proc; a leak shows as growth from
one identical round to the next.  Finally the server must still answer.
Prints a summary (the numbers in docs/PERFORMANCE.md, "Server").
"""
import argparse
import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import Server, parse_sse  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def proc_usage(pid):
    with open("/proc/%d/status" % pid) as f:
        rss = [int(line.split()[1]) for line in f if line.startswith("VmRSS:")][0]
    return rss, len(os.listdir("/proc/%d/fd" % pid)), len(os.listdir("/proc/%d/task" % pid))


def make_request(client, i):
    """(path, body, headers, checker) for request i of a client."""
    kind = (client + i) % 6
    stream = (client + i) % 2 == 1
    words = "client %d request %d: tell me about the sea" % (client, i)
    if kind == 0:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": words}], "max_tokens": 4,
                                        "stream": stream, "thinking": False}, {}, "chat"
    if kind == 1:
        return "/v1/completions", {"prompt": words, "max_tokens": 4, "stream": stream}, {}, "completions"
    if kind == 2:
        return "/v1/responses", {"input": words, "max_output_tokens": 4, "stream": stream}, {}, "responses"
    if kind == 3:
        return "/v1/messages", {"messages": [{"role": "user", "content": words}], "max_tokens": 4,
                                "stream": stream}, {}, "messages"
    if kind == 4:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": words}], "tools": TOOLS,
                                        "stream": stream, "thinking": False}, \
            {"X-DS4-Test-Output": "weather_call"}, "chat-tool"
    return "/v1/messages", {"messages": [{"role": "user", "content": words}], "max_tokens": 50, "stream": stream,
                            "thinking": {"type": "disabled"}}, {"X-DS4-Test-Output": "answer"}, "messages-answer"


def check_answer(kind, stream, data):
    if stream:
        ev = parse_sse(data.decode("utf-8"))
        payload = [d for e, d in ev if e != ":"]
        if kind in ("chat", "completions", "chat-tool"):
            assert payload[-1] == "[DONE]", payload[-2:]
            fin = [d["choices"][0]["finish_reason"] for d in payload[:-1] if d["choices"]][-1]
            assert fin == ("tool_calls" if kind == "chat-tool" else "length"), fin
        elif kind == "responses":
            assert payload[-1]["type"] == "response.incomplete", payload[-1]
        else:
            assert payload[-1]["type"] == "message_stop", payload[-1]
            if kind == "messages-answer":
                text = "".join(d["delta"].get("text", "") for d in payload if d["type"] == "content_block_delta")
                assert text == "It is sunny in Paris, 21 degrees.", text
        return
    b = json.loads(data)
    if kind == "chat":
        assert b["choices"][0]["finish_reason"] == "length" and b["usage"]["completion_tokens"] == 4, b
    elif kind == "chat-tool":
        assert json.loads(b["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])["city"] == "Paris", b
    elif kind == "completions":
        assert b["choices"][0]["finish_reason"] == "length", b
    elif kind == "responses":
        assert b["status"] == "incomplete", b
    elif kind == "messages":
        assert b["stop_reason"] == "max_tokens", b
    else:
        assert b["content"][0]["text"] == "It is sunny in Paris, 21 degrees.", b


def client_thread(port, client, n, results, lock):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    for i in range(n):
        path, body, headers, kind = make_request(client, i)
        headers = dict(headers, **{"Content-Type": "application/json"})
        t0 = time.time()
        try:
            conn.request("POST", path, json.dumps(body), headers)
            r = conn.getresponse()
            data = r.read()
            status = r.status
            if status == 200:
                check_answer(kind, body.get("stream"), data)
                outcome = "ok"
            elif status in (429, 503):
                err = json.loads(data)
                assert "error" in err, err
                outcome = str(status)
            else:
                outcome = "bad-status-%d" % status
        except Exception as e:  # a wrong answer or a broken connection
            outcome = "error: %s" % repr(e)[:200]
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        with lock:
            results.append((outcome, time.time() - t0))
    conn.close()


def run_round(s, clients, requests):
    results, lock = [], threading.Lock()
    threads = [threading.Thread(target=client_thread, args=(s.port, c, requests, results, lock)) for c in range(clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.time() - t0


def summarize(results, seconds):
    counts = {}
    for outcome, _ in results:
        counts[outcome] = counts.get(outcome, 0) + 1
    lat = sorted(t for _, t in results)
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
    return counts, "%d requests in %.1f s (%.1f/s), latency p50 %.2f s p95 %.2f s max %.2f s" % (
        len(results), seconds, len(results) / seconds, p(0.5), p(0.95), lat[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--queue", type=int, default=0, help="server --queue (0: its default)")
    ap.add_argument("--parallel", type=int, default=0, help="server --parallel (0: its default)")
    a = ap.parse_args()
    extra = (["--queue", str(a.queue)] if a.queue else []) + (["--parallel", str(a.parallel)] if a.parallel else [])
    bad = 0
    with Server(*extra) as s:
        pid = s.proc.pid
        run_round(s, 8, 4)  # warm-up: tokenizers, arenas, caches
        base = proc_usage(pid)
        print("baseline: RSS %d KiB, %d fds, %d threads" % base)
        for rnd in range(a.rounds):
            results, secs = run_round(s, a.clients, a.requests)
            counts, line = summarize(results, secs)
            time.sleep(0.5)  # let connection threads wind down
            usage = proc_usage(pid)
            print("round %d: %s" % (rnd + 1, line))
            print("round %d: outcomes %s" % (rnd + 1, json.dumps(counts, sort_keys=True)))
            print("round %d: RSS %d KiB, %d fds, %d threads" % ((rnd + 1,) + usage))
            bad += sum(v for k, v in counts.items() if k not in ("ok", "429", "503"))
        st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "still there?"}],
                                                "max_tokens": 2})
        print("after: status %d, jobs %s" % (st, json.dumps(s.stats()["jobs"])))
        print("after: sessions %s, batches %s" % (json.dumps(s.stats()["sessions"]), json.dumps(s.stats()["batches"])))
        if st != 200:
            bad += 1
    print("%s: %d wrong answers" % ("PASS" if bad == 0 else "FAIL", bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
