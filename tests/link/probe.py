"""probe.py - a link's round-trip time and bandwidth, measured with TCP.

  probe.py serve PORT          (in one namespace) echo 64-byte pings, sink bulk data
  probe.py measure HOST PORT   (in the other) print "rtt_ms MBps": the mean of 200
                               64-byte round trips, and 32 MiB sent one way

For tests/link/run.sh: the link's numbers that the pipeline's cost model uses.
"""
import socket
import sys
import time


def serve(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(4)
    print("ready", flush=True)
    for mode in ("ping", "bulk"):
        c, _ = s.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            data = c.recv(1 << 20)
            if not data:
                break
            if mode == "ping":
                c.sendall(data)
        if mode == "bulk":
            c.sendall(b"k")
        c.close()


def recv_exact(c, n):
    got = b""
    while len(got) < n:
        part = c.recv(n - len(got))
        if not part:
            raise OSError("closed")
        got += part
    return got


def measure(host, port):
    c = socket.create_connection((host, port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"x" * 64
    for _ in range(10):
        c.sendall(msg)
        recv_exact(c, 64)
    t0 = time.perf_counter()
    n = 200
    for _ in range(n):
        c.sendall(msg)
        recv_exact(c, 64)
    rtt = (time.perf_counter() - t0) / n
    c.close()
    c = socket.create_connection((host, port))
    block = b"y" * (1 << 20)
    t0 = time.perf_counter()
    for _ in range(32):
        c.sendall(block)
    c.shutdown(socket.SHUT_WR)
    recv_exact(c, 1)
    bw = 32 * (1 << 20) / (time.perf_counter() - t0)
    print("%.4f %.1f" % (rtt * 1e3, bw / 1e6))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        measure(sys.argv[2], int(sys.argv[3]))
