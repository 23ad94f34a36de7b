"""Telemetry of a closed-loop run: one row per device frame (and per run of
lost ones), written off the loop thread; the reader for those files, and the
plot of angle and command."""
from __future__ import annotations

import collections
import csv
import io
import json
import threading
import time
from pathlib import Path

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.files import save_figure


COLUMNS = ["kind", "dev_seq", "dev_t_us", "host_rx_s", "host_tx_s", "mode", "fault", "flags",
           "cmd_seq", "loop_latency_us", "actuator", "pos", "vel", "obs", "action", "compute_us",
           "count"]
QUEUE_ROWS = 1 << 16   # ~13 MB of rows: several seconds of a stalled disk at 1 kHz
WRITER_IDLE_S = 0.02   # how often the writer looks for rows when there were none


class Telemetry:
    """One row per device frame (and one per run of lost ones), written by a
    background thread.

    The loop thread only formats a row and appends it to a bounded queue: a
    write can wait behind the page cache and the filesystem journal for
    100+ ms on a busy machine (issue 10), so no write, flush or fsync
    happens in the loop thread. When the queue is full the row is dropped
    and counted (``dropped``), never waited for."""

    def __init__(self, path: Path | None, capacity: int = QUEUE_ROWS):
        self.path = path
        self._dropped_full = 0      # counted by the loop thread
        self._dropped_failed = 0    # counted by the writer thread
        self.error: str | None = None
        self._capacity = capacity
        self._queue: collections.deque[bytes] = collections.deque()
        self._closing = False
        self._thread = None
        if path is None:
            return
        self._json = path.suffix.lower() in (".jsonl", ".json")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "wb")
        except OSError as e:
            raise UserError(f"cannot write the telemetry {str(path)!r}: {e.strerror or e}; "
                            "choose a writable --log path") from None
        if not self._json:
            self._buffer = io.StringIO()
            self._csv = csv.writer(self._buffer)
            self._queue.append(self._csv_line(COLUMNS))
        self._thread = threading.Thread(target=self._write_rows, name="telemetry", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Rows not written: the queue was full, or the file failed."""
        return self._dropped_full + self._dropped_failed

    def write(self, row: dict) -> None:
        """Queue one row (never waits: a full queue drops the row and counts it)."""
        if self._thread is None:
            return
        if len(self._queue) >= self._capacity:
            self._dropped_full += 1
            return
        if self._json:
            line = (json.dumps(row) + "\n").encode()
        else:
            line = self._csv_line([" ".join(f"{x:.6g}" for x in v) if isinstance(v, (list, tuple))
                                   else ("" if v is None else v)
                                   for v in (row.get(k) for k in COLUMNS)])
        self._queue.append(line)

    def _csv_line(self, values) -> bytes:
        self._buffer.seek(0)
        self._buffer.truncate()
        self._csv.writerow(values)
        return self._buffer.getvalue().encode()

    def _write_rows(self) -> None:
        """The writer thread: drains the queue into the file until closed."""
        while True:
            if not self._queue:
                if self._closing:
                    return
                time.sleep(WRITER_IDLE_S)
                continue
            batch = []
            while self._queue and len(batch) < 4096:
                batch.append(self._queue.popleft())
            if self.error is not None:
                self._dropped_failed += len(batch)
                continue
            try:
                self._file.write(b"".join(batch))
            except OSError as e:  # disk full, I/O error: keep draining, count what is lost
                self.error = e.strerror or str(e)
                self._dropped_failed += len(batch)

    def close(self) -> None:
        """Write what is queued, then close the file (called after the loop)."""
        if self._thread is None:
            return
        self._closing = True
        self._thread.join()
        self._thread = None
        try:
            self._file.close()
        except OSError as e:
            self.error = self.error or e.strerror or str(e)


def read_telemetry(path) -> list[dict]:
    """Rows of a telemetry file (CSV or JSONL) as dicts of numbers and lists."""
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".json"):
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row = {}
            for k, v in r.items():
                if k == "kind":
                    row[k] = v
                elif k in ("pos", "vel", "obs"):
                    row[k] = [float(x) for x in v.split()] if v else None
                else:
                    row[k] = float(v) if v else None
            rows.append(row)
    return rows


def write_plot(path: Path, t, angle, action, u_max: float, title: str = "") -> None:
    """Angle and command over device time, as a PNG (written whole, then renamed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.asarray(t) - (t[0] if len(t) else 0.0)
    fig, (a0, a1) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
    a0.plot(t, angle, lw=1)
    a0.set_ylabel("angle from upright (rad)")
    a0.axhline(0, color="k", lw=0.5)
    a1.plot(t, action, lw=1, color="C1")
    for s in (-u_max, u_max):
        a1.axhline(s, color="k", ls="--", lw=0.5)
    a1.set_ylabel("command")
    a1.set_xlabel("device time (s)")
    a0.set_title(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)
