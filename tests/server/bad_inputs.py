"""bad_inputs.py - a corpus of bad input for ds4-server, at the HTTP and the
JSON level (stdlib only; tests/suite/server_bad_inputs.sh).

Every case must get a proper error (the API's JSON error shape with a 4xx
status, or a closed connection for broken HTTP), never a crash or a hang,
and other clients must be served meanwhile: malformed request lines, huge
and numerous headers, a huge URL, 100 MB bodies (declared and chunked), a
body shorter than declared, slow and stalled clients (timeouts), a
slowloris crowd, wrong JSON types for every field of every API, random
bytes, invalid UTF-8, NUL characters, deep nesting.  At the end the server
still answers and holds no more file descriptors than before.
"""
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import Server  # noqa: E402

ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]
PASSED = []


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def raw(port, data, read=True, timeout=20):
    """Send bytes, return the response bytes (b"" when the server closed)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            out += b
            if b"\r\n\r\n" in out:
                head, _, body = out.partition(b"\r\n\r\n")
                cl = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
                if cl and len(body) >= cl[0]:
                    break
        return out
    finally:
        s.close()


def status_of(resp):
    try:
        return int(resp.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def post_bytes(path, body, extra=b""):
    return (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n%s\r\n" % (path.encode(), len(body), extra)) + body


def fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def alive(s):
    st, b = s.get("/health")
    check(st == 200 and b["status"] == "ok", (st, b))


def t_http_level(s):
    for junk in (b"GARBAGE\r\n\r\n", b"GET\r\n\r\n", b"\x00\x01\x02\xff\r\n\r\n", b"POST /v1/messages HTTP/9.9\r\n\r\n"):
        r = raw(s.port, junk)
        check(r == b"" or status_of(r) >= 400, (junk, r[:100]))
    r = raw(s.port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 300000 + b"\r\n\r\n")
    check(r == b"" or status_of(r) >= 400, r[:100])
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(20000))
    r = raw(s.port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + many + b"\r\n")
    check(r == b"" or status_of(r) >= 400, r[:100])
    r = raw(s.port, b"GET /" + b"a" * 200000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    check(r == b"" or status_of(r) >= 400, r[:100])
    for method in (b"PUT", b"DELETE", b"PATCH"):
        r = raw(s.port, method + b" /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        check(status_of(r) == 405, r[:200])
    alive(s)


def t_huge_bodies(s):
    # Declared 100 MB: refused from the header, before reading it.
    t0 = time.time()
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=20)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % (100 << 20))
    sock.sendall(b"{" + b" " * 65536)
    r = sock.recv(65536)
    sock.close()
    check(status_of(r) == 413 and b"larger than" in r, r[:300])
    check(time.time() - t0 < 5, "413 took %.1f s" % (time.time() - t0))
    # Chunked 100 MB: refused once past the limit.
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
    sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (1 << 20, b"a" * (1 << 20))
    got = b""
    try:
        for _ in range(100):
            sock.sendall(chunk)
        sock.sendall(b"0\r\n\r\n")
        sock.settimeout(20)
        got = sock.recv(65536)
    except (BrokenPipeError, ConnectionResetError):
        pass
    sock.close()
    check(got == b"" or status_of(got) == 413, got[:200])
    # Shorter than declared, then gone.
    raw(s.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{\"a\"", read=False)
    alive(s)


def t_slow_clients(s):
    """Stalled and trickling clients time out while others are served."""
    socks = []
    for i in range(40):  # a slowloris crowd: headers never finished
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        socks.append(c)
    trickle = socket.create_connection(("127.0.0.1", s.port))
    trickle.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n")
    # Others are answered meanwhile.
    t0 = time.time()
    st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    check(st == 200 and time.time() - t0 < 5, (st, b))
    # The idle ones are dropped after the timeout (2 s here).
    time.sleep(3.5)
    closed = 0
    for c in socks + [trickle]:
        c.settimeout(2)
        try:
            c.recv(100)  # b"" (closed) or an error response: either way the server let go
            closed += 1
        except ConnectionResetError:
            closed += 1
        except socket.timeout:
            pass
        c.close()
    check(closed == len(socks) + 1, "%d of %d idle connections closed" % (closed, len(socks) + 1))
    alive(s)


WRONG_VALUES = [None, True, 0, -1, 1.5, "str", "", [], [1], {}, {"x": 1}, "\u0000", 10 ** 30]


def t_wrong_types(s):
    """Every top-level field with every wrong type: 4xx with the API's error shape, never 5xx."""
    bases = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
        "/v1/completions": {"prompt": "x", "max_tokens": 2},
        "/v1/responses": {"input": "x", "max_output_tokens": 2},
        "/v1/messages": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
    }
    fields = ["messages", "prompt", "input", "instructions", "system", "tools", "tool_choice", "temperature", "top_p",
              "top_k", "min_p", "seed", "max_tokens", "max_completion_tokens", "max_output_tokens", "stop",
              "stop_sequences", "stream", "stream_options", "thinking", "think", "reasoning", "reasoning_effort",
              "output_config", "n", "model", "previous_response_id"]
    n = 0
    for path, base in bases.items():
        for f in fields:
            for v in WRONG_VALUES:
                body = dict(base)
                body[f] = v
                st, hdrs, data = s.request("POST", path, body)
                n += 1
                check(st in (200, 400), (path, f, v, st, data[:200]))
                if hdrs.get("Content-Type") == "text/event-stream":
                    check(st == 200 and data.startswith((b"data: ", b"event: ")), data[:100])
                    continue
                b = json.loads(data)
                if st == 400:
                    if path == "/v1/messages":
                        check(b["type"] == "error" and b["error"]["message"], b)
                    else:
                        check(b["error"]["message"] and b["error"]["type"] == "invalid_request_error", b)
        # Message-level wrong types.
        for v in WRONG_VALUES:
            for mf in ("role", "content", "tool_calls", "tool_call_id", "reasoning_content", "name"):
                key = {"/v1/completions": None, "/v1/responses": "input"}.get(path, "messages")
                if key is None:
                    continue
                msg = {"role": "user", "content": "x", mf: v}
                body = dict(base, **{key: [msg]})
                st, hdrs, data = s.request("POST", path, body)
                n += 1
                check(st in (200, 400), (path, mf, v, st, data[:200]))
    print("   %d wrong-type requests" % n)
    alive(s)


def t_random_bytes(s):
    rnd = random.Random(1234)
    seeds = [b'{"messages":[{"role":"user","content":"x"}]}', b'{"input":[{"type":"function_call"}]}',
             b'{"prompt":"x"}', b'{"messages":[{"role":"assistant","content":[{"type":"tool_use"}]}]}']
    for i in range(300):
        base = bytearray(rnd.choice(seeds))
        for _ in range(rnd.randint(1, 6)):
            op = rnd.randint(0, 2)
            pos = rnd.randint(0, len(base))
            if op == 0:
                base[pos:pos] = bytes([rnd.randint(0, 255)])
            elif op == 1 and len(base) > 1:
                del base[min(pos, len(base) - 1)]
            else:
                base[pos:pos] = rnd.choice([b"[", b"]", b"{", b"}", b'"', b"\\", b"\xc3", b"\xff", b"null", b",", b":"])
        path = ENDPOINTS[i % 4]
        st, hdrs, data = s.request("POST", path, raw=bytes(base))
        check(st in (200, 400), (path, bytes(base), st, data[:200]))
        json.loads(data)
    for body in (b'{"messages":[{"role":"user","content":"\xed\xa0\x80"}]}',
                 b'{"messages":' + b'[' * 5000 + b']' * 5000 + b'}', b'\xef\xbb\xbf{"prompt":"x"}', b'{"prompt":"x"} trailing'):
        st, hdrs, data = s.request("POST", "/v1/chat/completions", raw=body)
        check(st == 400 and json.loads(data)["error"]["message"], (body[:40], st, data[:200]))
    alive(s)


def main():
    with Server("--timeout", "2", "--max-body-mb", "8", "-n", "4") as s:
        alive(s)
        time.sleep(0.2)
        base_fds = fds(s.proc.pid)
        for fn in (t_http_level, t_huge_bodies, t_wrong_types, t_random_bytes, t_slow_clients):
            t0 = time.time()
            fn(s)
            PASSED.append(fn.__name__)
            print("ok %-20s %.2fs" % (fn.__name__, time.time() - t0), flush=True)
        time.sleep(0.5)
        now = fds(s.proc.pid)
        check(now <= base_fds + 1, "file descriptors: %d before, %d after" % (base_fds, now))
        alive(s)
    print("%d passed, 0 failed" % len(PASSED))


if __name__ == "__main__":
    main()
