"""pmix_fwd.py - carry a rank's connection to mpirun across network namespaces.

tests/link/run.sh runs mpirun (and rank 0) in one network namespace and rank 1
in another, joined only by the veth pair under test.  mpirun's PMIx server
listens on 127.0.0.1 of its namespace, which rank 1 cannot reach: this
forwarder listens on 127.0.0.1:PORT in rank 1's namespace and connects each
client to 127.0.0.1:PORT in mpirun's (setns(2) for the outgoing socket only),
so the launcher's control traffic does not cross the link and only the
pipeline's own messages do.

usage: pmix_fwd.py PORT /run/netns/NAME  (prints "ready" once listening)
"""
import ctypes
import os
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000


def main():
    port, other = int(sys.argv[1]), sys.argv[2]
    libc = ctypes.CDLL(None, use_errno=True)
    here = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(other, os.O_RDONLY)
    lock = threading.Lock()

    def connect_there():
        with lock:  # the namespace is the thread's: one switch at a time
            if libc.setns(there, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns " + other)
            try:
                return socket.create_connection(("127.0.0.1", port))
            finally:
                libc.setns(here, CLONE_NEWNET)

    def pump(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(16)
    print("ready", flush=True)
    while True:
        client, _ = listener.accept()
        upstream = connect_there()
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()


if __name__ == "__main__":
    main()
