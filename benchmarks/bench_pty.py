#!/usr/bin/env python3
"""Is the pseudo-terminal or the host the limit of a fast loop on a busy machine?

Two processes echo a 36-byte message (a STATE's size) at 1 kHz, both SCHED_FIFO
where permitted (root), once over a pty pair and once over a pipe pair, side by
side under the same load (benchmarks/loadgen.py). A pty moves bytes through
the kernel's tty worker thread, of ordinary priority, in each direction; a pipe
wakes the reader directly. The same two programs, the same priorities: the
difference in the tail is the pty's.

    python benchmarks/bench_pty.py --load disk --n 3000

Prints one row per transport: round-trip percentiles, maximum, and the number
of round trips over 1, 2, 10 and 50 ms (a watchdog of two periods at 1 kHz,
200 Hz, and the tests' 50 ms), with the load average.
"""
from __future__ import annotations

import argparse
import os
import pty
import select
import sys
import time
import tty
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import KINDS, load  # noqa: E402

MESSAGE = b"x" * 36
THRESHOLDS_MS = (1, 2, 10, 50)


def _fifo(priority: int) -> bool:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        return True
    except (AttributeError, OSError):
        return False


def round_trips(transport: str, n: int, period: float) -> tuple[list[float], bool]:
    if transport == "pty":
        master, slave = pty.openpty()
        tty.setraw(master)
        tty.setraw(slave)
        host_r = host_w = master
        dev_r = dev_w = slave
    else:
        dev_r, host_w = os.pipe()
        host_r, dev_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the echoing "device"
        _fifo(10)
        got = 0
        while got < n * len(MESSAGE):
            data = os.read(dev_r, 4096)
            got += len(data)
            os.write(dev_w, data)
        os._exit(0)
    realtime = _fifo(5)
    rtt = []
    try:
        for _ in range(n):
            t0 = time.monotonic()
            os.write(host_w, MESSAGE)
            got = 0
            while got < len(MESSAGE):
                select.select([host_r], [], [])
                got += len(os.read(host_r, 4096))
            rtt.append(time.monotonic() - t0)
            time.sleep(max(0.0, t0 + period - time.monotonic()))
    finally:
        if realtime:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        os.waitpid(pid, 0)
        for fd in {host_r, host_w, dev_r, dev_w}:
            os.close(fd)
    return sorted(rtt), realtime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", choices=("quiet",) + KINDS, default="quiet")
    ap.add_argument("--n", type=int, default=3000, help="round trips per transport")
    ap.add_argument("--rate", type=float, default=1000.0, help="round trips per second")
    args = ap.parse_args(argv)
    print(f"| load | transport | SCHED_FIFO | p50 us | p99 us | p99.9 us | max us | "
          + " | ".join(f"> {t} ms" for t in THRESHOLDS_MS) + " | load avg |")
    print("|---" * (8 + len(THRESHOLDS_MS)) + "|")
    with load(args.load):
        for transport in ("pty", "pipe"):
            rtt, realtime = round_trips(transport, args.n, 1.0 / args.rate)
            q = lambda p: round(rtt[int(p * (len(rtt) - 1))] * 1e6)  # noqa: E731
            over = " | ".join(str(sum(r > t * 1e-3 for r in rtt)) for t in THRESHOLDS_MS)
            print(f"| {args.load} | {transport} | {'yes' if realtime else 'no'} | {q(0.5)} | "
                  f"{q(0.99)} | {q(0.999)} | {q(1.0)} | {over} | {os.getloadavg()[0]:.1f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
