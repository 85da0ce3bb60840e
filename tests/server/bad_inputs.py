"""bad_inputs.py - a corpus of bad input for ds4-server, at the HTTP and the
JSON level (stdlib only; tests/suite/server_bad_inputs.sh).

Every case must get a proper error (the API's JSON error shape with a 4xx
status, or a closed connection for broken HTTP), never a crash or a hang,
and other clients must be served meanwhile: malformed request lines, huge
and numerous headers, a huge URL, 100 MB bodies (declared and chunked), a
body shorter than declared, slow and stalled clients (timeouts), a
slowloris crowd, wrong JSON types for every field of every API, random
bytes, invalid UTF-8, deep nesting.  At the end the server still answers
and holds no more file descriptors than before.

Hardening cases (each failed on the server before its fix): the default
body limit (64 MB, with no --max-body-mb); answers decided from the
headers before the body is read (API key, size); JSON that would cost
gigabytes to parse (many values) and the memory given back after it (RSS
within 10 %); headers trickled a byte at a time against --header-timeout
with every connection slot taken; the Host allow-list against DNS
rebinding, Content-Type application/json, CORS off by default; a 30 MB
prompt refused cheaply; an empty --api-key; a request smuggled after a
body with both Content-Length and Transfer-Encoding; an error message cut
inside a character.  DS4_TEST_KEEP_GOING=1 runs every case and lists the
failures instead of stopping at the first.
"""
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import traceback

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


def t_big_numbers_in_text_fields(s):
    """Numbers beyond 64 bits or the double range where text is expected (a message's content, a
    role, a stop string, a tool call's name) are wrong types like any other: 400, never 500.
    In tool schemas they are numbers, written back exactly."""
    big = ["1" + "0" * 30, "1e400", "-1e400", "NaN"]
    cases = [
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": %s}], "max_tokens": 2}'),
        ("/v1/chat/completions", '{"messages": [{"role": %s, "content": "x"}], "max_tokens": 2}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "stop": [%s], "max_tokens": 2}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": %s}]}], "max_tokens": 2}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",'
         ' "tool_calls": [{"id": "c", "type": "function", "function": {"name": %s, "arguments": "{}"}}]}], "max_tokens": 2}'),
        ("/v1/messages", '{"messages": [{"role": "user", "content": %s}], "max_tokens": 2}'),
        ("/v1/messages", '{"system": %s, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}'),
        ("/v1/responses", '{"input": [{"role": "user", "content": %s}], "max_output_tokens": 2}'),
        ("/v1/responses", '{"input": %s, "max_output_tokens": 2}'),
        ("/v1/completions", '{"prompt": [%s], "max_tokens": 2}'),
    ]
    for path, tmpl in cases:
        for b in big:
            st, _, data = s.request("POST", path, raw=(tmpl % b).encode())
            check(st == 400, (path, tmpl % b, st, data[:200]))
    tool = ('{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "tools": [{"type": "function",'
            ' "function": {"name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "integer",'
            ' "maximum": %s}}}}}]}')
    for b in big[:3]:
        st, _, data = s.request("POST", "/v1/chat/completions", raw=(tool % b).encode())
        check(st == 200, (b, st, data[:200]))


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


# ---------------------------------------------------------------- hardening

def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def recv_all(sock, limit=1 << 20):
    out = b""
    try:
        while len(out) < limit:
            b = sock.recv(65536)
            if not b:
                break
            out += b
    except (ConnectionResetError, socket.timeout):
        pass
    return out


def t_default_body_limit():
    """No --max-body-mb: 64 MB holds (a declared 100 MB body is refused from
    its header, a chunked one once past the limit)."""
    with Server("--timeout", "5") as s:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (100 << 20) + b"{" + b" " * 65536)
        r = recv_all(sock)
        sock.close()
        check(status_of(r) == 413 and b"larger than 64 MB" in r, r[:300])
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=20)
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (4 << 20, b"a" * (4 << 20))
        got = b""
        try:
            for _ in range(20):
                sock.sendall(chunk)
            sock.sendall(b"0\r\n\r\n")
            got = recv_all(sock)
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.close()
        check(got == b"" or status_of(got) == 413, got[:200])
        alive(s)


def t_auth_before_body():
    """The API key is checked on the headers: a keyless upload is answered
    401 before its body is read (and the connection closed)."""
    with Server("--api-key", "sekrit") as s:
        for hdr in (b"", b"x-api-key: wrong\r\n", b"Authorization: Bearer wrong\r\n"):
            t0 = time.time()
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=5)
            sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + hdr +
                         b"Content-Length: %d\r\n\r\n{" % (50 << 20))
            r = recv_all(sock)
            sock.close()
            check(status_of(r) == 401 and b"API key" in r and time.time() - t0 < 3, (hdr, r[:200]))
        st, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
                       headers={"Authorization": "Bearer sekrit"})
        check(st == 200, (st, b))


def t_json_memory(s):
    """Bodies whose parse would cost far more than their size are refused
    before parsing (values counted on the text); after them and after large
    valid bodies the server's memory returns to what it was, round after
    round (the second round failed while the threads' own malloc arenas
    kept what their parses freed: 20 MB more each round)."""
    for _ in range(2):
        json_memory_round(s)


def json_memory_round(s):
    for _ in range(3):  # warm up: tokenizer pool, arenas of a few threads
        s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "warm " * 500}], "max_tokens": 1})
    time.sleep(0.3)
    before = rss_kib(s.proc.pid)
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kib(s.proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    arrays = b'{"messages":[' + b"[]," * (8 << 20) + b'[]]}'           # 24 MB, 8M arrays
    members = b'{"x":{' + b",".join(b'"k%d":0' % i for i in range(600000)) + b'}}'
    results = []

    def post(body):
        st, hdrs, data = s.request("POST", "/v1/chat/completions", raw=body, timeout=60)
        results.append((st, data[:200]))

    threads = [threading.Thread(target=post, args=(b,)) for b in (arrays, arrays, members)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for st, data in results:
        check(st == 413 and b"more than 500000 values" in data, (st, data))
    # Large valid bodies: a 40 MB string (refused by its length: it cannot
    # fit the context) and many small messages.
    big = json.dumps({"messages": [{"role": "user", "content": "a" * (40 << 20)}]}).encode()
    st, hdrs, data = s.request("POST", "/v1/chat/completions", raw=big, timeout=60)
    check(st == 400 and b"context size" in data, (st, data[:200]))
    many = json.dumps({"messages": [{"role": "user", "content": "m%d" % i} for i in range(100000)]}).encode()
    st, hdrs, data = s.request("POST", "/v1/chat/completions", raw=many, timeout=60)
    check(st == 400 and b"context size" in data, (st, data[:200]))
    stop.set()
    sampler.join()
    time.sleep(0.5)
    after = rss_kib(s.proc.pid)
    print("   RSS %d KiB before, %d KiB peak, %d KiB after" % (before, peak[0], after))
    check(after <= before * 1.10, "RSS %d KiB after the memory tests, %d KiB before" % (after, before))
    check(peak[0] < before + (1 << 20), "RSS peaked at %d KiB" % peak[0])


def trickle(port, stop, closed, i):
    """Send a request's headers one byte every 0.3 s until the server closes
    the connection (closed[i]: seconds from the connect to the close seen)
    or the test stops it."""
    c = socket.create_connection(("127.0.0.1", port))
    t0 = time.time()
    c.settimeout(0.3)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 200
    for b in head:
        if stop.is_set():
            break
        try:
            c.sendall(bytes([b]))
            if c.recv(100) == b"":
                closed[i] = time.time() - t0
                break
        except socket.timeout:
            continue
        except OSError:
            closed[i] = time.time() - t0
            break
    c.close()


def t_slowloris_deadline():
    """Headers trickled a byte at a time stay under the idle timeout but not
    under --header-timeout: with every slot taken by such clients, /health
    answers again once their deadline passed.  Without the deadline the
    trickle would hold the slots for 75 s (250 bytes, 0.3 s apart), so the
    bounds below leave room for a loaded machine without letting that
    through: every trickler is closed by the server (not by the test), none
    before its 2 s deadline, and /health answers within 20 s."""
    with Server("--max-connections", "8", "--timeout", "60", "--header-timeout", "2") as s:
        stop = threading.Event()
        closed = [None] * 8
        crowd = [threading.Thread(target=trickle, args=(s.port, stop, closed, i)) for i in range(8)]
        for t in crowd:
            t.start()
        time.sleep(2.5)
        t0 = time.time()
        ok = False
        while time.time() - t0 < 20 and not ok:
            try:
                ok = s.request("GET", "/health", timeout=2)[0] == 200
            except OSError:
                time.sleep(0.2)
        # The tricklers end when they see the close; stop them only after a
        # generous wait, so a thread the machine was slow to run is not
        # counted as never closed.
        t1 = time.time()
        while time.time() - t1 < 20 and any(c is None for c in closed):
            time.sleep(0.1)
        stop.set()
        for t in crowd:
            t.join()
        check(ok, "/health not answered while trickling clients held every connection")
        check(all(c is not None for c in closed), "trickling clients closed by the server: %s" % closed)
        check(all(c >= 1.9 for c in closed), "a trickling client closed before its deadline: %s" % closed)
        check("its headers did not arrive in time" in s.text(), s.text()[-500:])
    # A body trickled a byte at a time: closed at --body-timeout.
    with Server("--timeout", "60", "--body-timeout", "2") as s:
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n")
        c.settimeout(0.3)
        t0, gone = time.time(), False
        # Without the deadline the trickle would last until the idle
        # timeout (60 s): the upper bound leaves room for a loaded machine.
        while time.time() - t0 < 15 and not gone:
            try:
                c.sendall(b" ")
                gone = c.recv(100) == b""
            except socket.timeout:
                continue
            except OSError:
                gone = True
        c.close()
        check(gone and 1.5 < time.time() - t0 < 12, "body trickle closed after %.1f s" % (time.time() - t0))
        check("its body did not arrive in time" in s.text(), s.text()[-500:])


def raw_status(port, req):
    r = raw(port, req)
    return status_of(r), r


def t_host_content_type_cors(s):
    """DNS rebinding: only the bound names and loopback in Host; POST bodies
    must say application/json; no CORS headers unless --cors."""
    get = b"GET /v1/models HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
    for host, want in ((b"evil.example", 403), (b"evil.example:%d" % s.port, 403), (b"127.0.0.1", 200),
                       (b"localhost:%d" % s.port, 200), (b"[::1]:%d" % s.port, 200), (b"127.0.0.2", 200),
                       (b"10.0.0.1", 403), (b"localhost.evil.example", 403)):
        st, r = raw_status(s.port, get % host)
        check(st == want, (host, r[:200]))
        if want == 403:
            check(b"DNS rebinding" in r, r[:300])
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}).encode()
    for ctype, want in ((b"text/plain", 415), (b"application/x-www-form-urlencoded", 415), (None, 415),
                        (b"application/json; charset=utf-8", 200), (b"Application/JSON", 200)):
        hdr = b"Content-Type: %s\r\n" % ctype if ctype else b""
        st, r = raw_status(s.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + hdr +
                           b"Content-Length: %d\r\n\r\n" % len(body) + body)
        check(st == want, (ctype, r[:300]))
    st, r = raw_status(s.port, b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\n"
                               b"Connection: close\r\n\r\n")
    check(st == 204 and b"access-control-allow-origin" not in r.lower(), r[:300])
    st, r = raw_status(s.port, get % b"127.0.0.1")
    check(b"access-control-allow-origin" not in r.lower(), r[:300])
    with Server("--allowed-hosts", "mybox.lan, other.lan", "--host", "0.0.0.0", second=True) as s2:
        for host, want in ((b"mybox.lan:8000", 200), (b"other.lan", 200), (b"192.168.1.5:8000", 200),
                           (b"evil.example", 403)):
            st, r = raw_status(s2.port, get % host)
            check(st == want, (host, r[:200]))


def cpu_seconds(pid):
    """User + system CPU time of a process (load on the machine does not
    change it)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def t_huge_prompt_is_cheap(s):
    """A prompt that cannot fit is refused without tokenizing all of it: by
    its length alone, or once the tokens passed the context."""
    body = json.dumps({"messages": [{"role": "user", "content": "word " * (6 << 20)}]}).encode()
    cpu = cpu_seconds(s.proc.pid)
    st, hdrs, data = s.request("POST", "/v1/chat/completions", raw=body, timeout=120)
    cpu = cpu_seconds(s.proc.pid) - cpu
    check(st == 400 and json.loads(data)["error"]["code"] == "context_length_exceeded", (st, data[:200]))
    check(cpu < 1.5, "refusing a 30 MB prompt took %.2f s of CPU" % cpu)
    t0 = time.time()
    st, b = s.post("/v1/messages", {"messages": [{"role": "user", "content": "ab cd " * 40000}], "max_tokens": 1})
    check(st == 400 and "at least" in b["error"]["message"] and b["error"]["n_prompt_tokens"] > 4096, (st, b))
    check(time.time() - t0 < 2, "took %.1f s" % (time.time() - t0))


def t_empty_api_key():
    binary = os.environ.get("DS4_SERVER_BIN") or os.path.join(os.path.dirname(__file__), "..", "..", "ds4-server")
    from harness import ensure_model
    r = subprocess.run([binary, "-m", ensure_model(), "--port", "0", "--api-key", ""], capture_output=True, timeout=60,
                       text=True)
    check(r.returncode == 2 and "must not be empty" in r.stderr, (r.returncode, r.stderr[-300:]))


def t_smuggling(s):
    """Content-Length and Transfer-Encoding together: refused, and what
    follows the body is not answered as a second request."""
    body = b"0\r\n\r\n"
    smuggled = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(body)) + body + smuggled
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=5)
    sock.sendall(req)
    r = recv_all(sock)
    sock.close()
    check(r.count(b"HTTP/1.1 ") == 1 and status_of(r) == 400, r[:500])


def t_error_message_cut_in_a_character(s):
    """An error message longer than its buffer is cut at a character
    boundary: it stays valid UTF-8 and keeps its message field."""
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                 "reasoning_effort": "\u00e9" * 1500}),
                       ("/v1/messages", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                         "output_config": {"effort": "\u20ac" * 900}})):
        st, hdrs, data = s.request("POST", path, body)
        b = json.loads(data)
        msg = b["error"].get("message")
        check(st == 400 and msg and "unknown reasoning effort" in msg and len(msg.encode()) < 1300, (st, data[:200]))


HARDENING_ALONE = (t_default_body_limit, t_auth_before_body, t_slowloris_deadline, t_empty_api_key)
HARDENING_SHARED = (t_json_memory, t_host_content_type_cors, t_huge_prompt_is_cheap, t_smuggling,
                    t_error_message_cut_in_a_character)


def run_case(fn, *args):
    """Run one case; with DS4_TEST_KEEP_GOING=1 a failure is listed and the
    run goes on."""
    t0 = time.time()
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - report every kind of failure the same way
        if not os.environ.get("DS4_TEST_KEEP_GOING"):
            raise
        FAILED.append(fn.__name__)
        print("FAIL %-20s\n%s" % (fn.__name__, traceback.format_exc(limit=3)), flush=True)
        return
    PASSED.append(fn.__name__)
    print("ok %-20s %.2fs" % (fn.__name__, time.time() - t0), flush=True)


FAILED = []


def main():
    with Server("--timeout", "2", "-n", "4") as s:
        alive(s)
        time.sleep(0.2)
        base_fds = fds(s.proc.pid)
        for fn in (t_http_level, t_huge_bodies, t_wrong_types, t_big_numbers_in_text_fields, t_random_bytes, t_slow_clients) + HARDENING_SHARED:
            run_case(fn, s)
        time.sleep(0.5)
        now = fds(s.proc.pid)
        check(now <= base_fds + 1, "file descriptors: %d before, %d after" % (base_fds, now))
        alive(s)
    for fn in HARDENING_ALONE:
        run_case(fn)
    print("%d passed, %d failed%s" % (len(PASSED), len(FAILED), (": " + " ".join(FAILED)) if FAILED else ""))
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
