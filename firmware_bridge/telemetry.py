"""Telemetry of a closed-loop run: one row per device frame (and per lost
one), the reader for those files, and the plot of angle and command."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from grpo_ctrl.files import save_figure


COLUMNS = ["kind", "dev_seq", "dev_t_us", "host_rx_s", "host_tx_s", "mode", "fault", "flags",
           "cmd_seq", "loop_latency_us", "actuator", "pos", "vel", "obs", "action", "compute_us"]


class Telemetry:
    """One row per device frame (and per lost one), written and flushed at once."""

    def __init__(self, path: Path | None):
        self.path = path
        self._file = None
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self._json = path.suffix.lower() in (".jsonl", ".json")
        self._file = open(path, "w", newline="")
        if not self._json:
            self._csv = csv.writer(self._file)
            self._csv.writerow(COLUMNS)
            self._file.flush()

    def write(self, row: dict) -> None:
        if self._file is None:
            return
        if self._json:
            self._file.write(json.dumps(row) + "\n")
        else:
            self._csv.writerow([" ".join(f"{x:.6g}" for x in v) if isinstance(v, (list, tuple))
                                else ("" if v is None else v) for v in
                                (row.get(k) for k in COLUMNS)])
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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
