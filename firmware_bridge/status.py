"""``grpo-ctrl run``'s status line: is the loop alive, how fast, where is the
pendulum.

The loop publishes a snapshot after every STATE (one tuple assigned to one
attribute: no lock, no I/O in the loop); a thread of its own reads it a few
times a second and writes one line to a stream (stderr for ``grpo-ctrl
run``):

    run  3.2 s  200.0 Hz  angle +0.012 rad  command +0.034  missed 0  lost 0

On a terminal the line is rewritten in place, four times a second; anywhere
else (a pipe, a file) a plain line is written once a second, so that a log
holds no carriage returns. The control-loop thread never writes.
"""
from __future__ import annotations

import os
import threading
import time

TERMINAL_PERIOD = 0.25   # s between rewrites of the line on a terminal
PLAIN_PERIOD = 1.0       # s between lines in a pipe or file


def format_status(now: float, snap, previous) -> str:
    """The line for ``snap``, the loop's ``(host time s, STATEs received,
    time armed or None, angle rad, command, missed deadlines, lost frames)``;
    the rate is that of the STATEs between ``previous`` and ``snap``."""
    if snap is None:
        return "run: waiting for the device"
    t, states, armed_at, angle, command, missed, lost = snap
    if previous is not None and t > previous[0]:
        rate = f"{(states - previous[1]) / (t - previous[0]):6.1f}"
    else:
        rate = "   ---"  # one snapshot: no rate yet
    elapsed = now - armed_at if armed_at is not None else 0.0
    return (f"run {elapsed:5.1f} s  {rate} Hz  angle {angle:+.3f} rad  "
            f"command {command:+.3f}  missed {missed}  lost {lost}")


class StatusLine:
    """``with StatusLine(loop_ref, stream):`` writes the status of
    ``loop_ref()`` (the loop, or None before it exists) to ``stream`` from
    its own thread until the block ends."""

    def __init__(self, loop_ref, stream):
        self.loop_ref, self.stream = loop_ref, stream
        try:
            self.terminal = bool(stream.isatty())
        except (AttributeError, OSError, ValueError):
            self.terminal = False
        terminal = self.terminal
        self.period = TERMINAL_PERIOD if terminal else PLAIN_PERIOD
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="grpo-ctrl run status",
                                        daemon=True)
        self.lines = 0

    def __enter__(self) -> "StatusLine":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        _lower_priority_realtime()
        previous = None
        written = False
        while not self._done.wait(self.period):
            loop = self.loop_ref()
            snap = getattr(loop, "snapshot", None)
            line = format_status(time.monotonic(), snap, previous)
            previous = snap if snap is not None else previous
            try:
                if self.terminal:
                    self.stream.write("\r" + line + "\x1b[K")
                else:
                    self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # the stream went away: the loop goes on
                return
            written = True
            self.lines += 1
        if written and self.terminal:
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass


def _lower_priority_realtime() -> None:
    """Real-time priority 1 for this thread where the loop has 5 (best
    effort): a thread at ordinary priority that a busy machine preempts while
    it holds the GIL would hold up the loop behind it."""
    if hasattr(os, "sched_setscheduler"):
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError:
            pass
