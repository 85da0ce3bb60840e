"""relay.py - a delayed link in user space, for kernels without netem.

tests/link/run.sh adds one-way delays to the link between its two network
namespaces with `tc netem`; a kernel without the netem qdisc (sch_netem) gets
this instead: a TUN device in each namespace (made by run.sh, persistent, with
an address each) and this process holding both, which reads each IP packet
from one and writes it to the other DELAY_MS after it was read, in the order
read.  Its own cost - the reads, the writes, the wake-ups - comes on top of
the delay: run.sh measures the link with the relay at delay 0 and reports it.

usage: relay.py DELAY_MS NETNS_A DEV_A NETNS_B DEV_B
  NETNS a file that names a network namespace (/run/netns/NAME); prints
  "ready" once it holds both devices, forwards until killed.
"""
import collections
import ctypes
import fcntl
import os
import select
import struct
import sys
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
PR_SET_TIMERSLACK = 29
PACKET_MAX = 65536
SPIN = 0.2e-3


def open_tun(libc, netns, dev):
    """The TUN device DEV of the namespace NETNS, opened from inside it: a TUN
    file belongs to the namespace that opened it."""
    here = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(netns, os.O_RDONLY)
    try:
        if libc.setns(there, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns " + netns)
        try:
            fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", dev.encode(), IFF_TUN | IFF_NO_PI))
        finally:
            libc.setns(here, CLONE_NEWNET)
    finally:
        os.close(here)
        os.close(there)
    return fd


def read_all(fd, queue, now):
    """Every packet waiting on fd, stamped with the time it was read."""
    while True:
        try:
            packet = os.read(fd, PACKET_MAX)
        except BlockingIOError:
            return
        queue.append((now, packet))


def release_due(queue, fd, delay, now):
    """Writes the packets whose delay has passed; returns when the next is due
    (None: the queue is empty)."""
    while queue:
        stamp, packet = queue[0]
        if stamp + delay > now:
            return stamp + delay
        queue.popleft()
        try:
            os.write(fd, packet)
        except OSError:
            pass  # the namespace's stack refused it (its device went down): a lost packet, as on a wire
    return None


def forward(a, b, delay):
    """Both directions, each in the order read, until killed."""
    queues = {a: collections.deque(), b: collections.deque()}
    other = {a: b, b: a}
    while True:
        now = time.monotonic()
        due = [t for t in (release_due(queues[fd], other[fd], delay, now) for fd in (a, b)) if t is not None]
        timeout = None
        if due:
            wait = min(due) - time.monotonic()
            timeout = wait - SPIN if wait > SPIN else 0.0
        ready, _, _ = select.select([a, b], [], [], timeout)
        now = time.monotonic()
        for fd in ready:
            read_all(fd, queues[fd], now)


def main():
    delay = float(sys.argv[1]) / 1e3
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)  # wake-ups within a microsecond, not the default 50
    a = open_tun(libc, sys.argv[2], sys.argv[3])
    b = open_tun(libc, sys.argv[4], sys.argv[5])
    print("ready", flush=True)
    forward(a, b, delay)


if __name__ == "__main__":
    main()
