"""What ``grpo-ctrl train`` shows while it runs, and the curve it leaves.

``Progress`` takes each iteration's metrics row (the row ``metrics.jsonl``
gets) and

* on a terminal (stdout and stderr both), moves a tqdm bar on stderr
  (seconds of the budget, or iterations);
* anywhere else (``grpo-ctrl train ... > train.log``, a CI log), prints one
  plain line per evaluation on stdout, so the log holds no carriage returns::

      it 40  12.3 s  eval -812.4  best -790.1  success 62%  KL 0.0021  clip 0.031  sim 1.21M steps/s

* with ``tensorboard=DIR``, writes the same scalars to TensorBoard event
  files (``torch.utils.tensorboard``): every numeric key of the row as
  ``train/KEY`` at each iteration, and ``eval/return`` and ``eval/success``
  at each evaluation, the step being the iteration.

``plot_curve`` draws ``curve.png`` from ``metrics.jsonl``: each raw series
faint, a moving average over it, legends where they cover nothing.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from grpo_ctrl.files import save_figure
from grpo_ctrl.run_folder import read_metrics

EVAL_KEYS = {"eval_return": "eval/return", "eval_success": "eval/success"}


def scalars(row: dict) -> dict[str, float]:
    """The TensorBoard tags and values of one metrics row: numeric keys as
    ``train/KEY``, the evaluation's as ``eval/...`` (only when it ran)."""
    out = {}
    for key, value in row.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value):
            continue
        out[EVAL_KEYS.get(key, f"train/{key}")] = float(value)
    return out


class Progress:
    """``update(row, dt, iteration, last_eval, best)`` after each iteration,
    ``close()`` at the end. ``show``: print progress at all (rank 0, not
    ``--quiet``); ``budget``: the time budget in s (inf: the bar counts
    iterations, of ``iterations`` if not 0). The bar (on stderr, as tqdm
    writes) where stdout and stderr are both terminals; plain lines on
    stdout otherwise."""

    def __init__(self, show: bool, budget: float, iterations: int = 0,
                 tensorboard: str | Path | None = None):
        self.budget = budget
        self.bar = None
        terminal = show and _terminal()
        self.plain = show and not terminal
        if terminal:
            from tqdm import tqdm
            # no tqdm monitor thread: it outlives the bar and wakes every 10 s to take the GIL
            # at ordinary priority, so a busy machine that preempts it there holds up a
            # real-time control loop that runs later in the same process (`grpo-ctrl demo`)
            tqdm.monitor_interval = 0
            if math.isinf(budget):  # no time budget: the bar counts iterations
                self.bar = tqdm(total=iterations or None, unit="it")
            else:
                self.bar = tqdm(total=round(budget, 1), unit="s",
                                bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s "
                                           "[{elapsed}{postfix}]")
        self.writer = None
        if tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(log_dir=str(tensorboard))

    def update(self, row: dict, dt: float, iteration: int, last_eval: float | None,
               best: float) -> None:
        shown = last_eval if last_eval is not None else float("nan")
        success = row.get("eval_success")
        fields = [f"eval {shown:.1f}", f"best {best:.1f}",
                  *([f"success {100 * success:.0f}%"] if success is not None else []),
                  f"KL {row['kl_old']:.4f}", f"clip {row['clip_low'] + row['clip_high']:.3f}",
                  f"sim {row['sim_steps_per_s'] / 1e6:.2f}M steps/s"]
        if self.bar is not None:
            self.bar.update(1 if math.isinf(self.budget) else min(dt, self.bar.total - self.bar.n))
            self.bar.set_postfix_str(" ".join([f"it {iteration}"] + [f for f in fields
                                                                      if "success" not in f]),
                                     refresh=False)
        elif self.plain and row.get("eval_return") is not None:
            print("  ".join([f"it {iteration}", f"{row['wall_time']:.1f} s"] + fields),
                  flush=True)
        if self.writer is not None:
            for tag, value in scalars(row).items():
                self.writer.add_scalar(tag, value, iteration)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()


def check_tensorboard(folder) -> None:
    """A one-line refusal, before training, where event files cannot be written."""
    import importlib.util

    from grpo_ctrl.errors import UserError

    try:
        found = importlib.util.find_spec("tensorboard") is not None
    except ImportError:
        found = False
    if not found:
        raise UserError("--tensorboard needs the tensorboard package: pip install "
                        "'grpo-ctrl[train]' (or pip install tensorboard)")
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise UserError(f"--tensorboard {str(path)!r} is a file; give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--tensorboard {str(path)!r}: cannot create it: {e.strerror or e}") \
            from None


def _terminal() -> bool:
    """Whether stdout and stderr are both terminals (a person watching)."""
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


# ---------------------------------------------------------------- curve.png
def smoothed(y, window: int) -> np.ndarray:
    """The centred moving average of ``y`` over ``window`` points (shorter at
    the ends, where fewer points are), NaNs skipped."""
    y = np.asarray(y, float)
    ok = np.isfinite(y)
    kernel = np.ones(max(1, window))
    total = np.convolve(np.where(ok, y, 0.0), kernel, "same")
    count = np.convolve(ok.astype(float), kernel, "same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _window(n: int) -> int:
    return max(1, min(51, n // 15 | 1))


def plot_curve(metrics_path: Path, png: Path) -> None:
    """Training curve: evaluation and branch returns, KL, clip and entropy vs
    wall time; each series raw (faint) and smoothed (a centred moving
    average over about a fifteenth of the points)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = read_metrics(metrics_path)
    if not rows:
        return
    fig = curve_figure(rows, metrics_path.parent.name)
    save_figure(fig, png, dpi=90)
    plt.close(fig)


def curve_figure(rows: list[dict], name: str):
    """``plot_curve``'s figure of metrics rows."""
    import matplotlib.pyplot as plt

    t = np.array([r["wall_time"] for r in rows])
    w = _window(len(rows))
    fig, ax = plt.subplots(2, 2, figsize=(10, 6.5), sharex=True)

    def series(a, y, colour, label, log=False):
        y = np.asarray(y, float)
        if log:
            y = np.maximum(y, 1e-8)
        a.plot(t, y, lw=0.6, color=colour, alpha=0.3)
        a.plot(t, smoothed(y, w), lw=1.6, color=colour, label=label)

    ev = [(r["wall_time"], r["eval_return"]) for r in rows if r.get("eval_return") is not None]
    if ev:
        te, ye = np.array(ev).T
        ax[0, 0].plot(te, ye, "o", ms=2.5, color="C0", alpha=0.35)
        ax[0, 0].plot(te, smoothed(ye, _window(len(ye))), lw=1.6, color="C0",
                      label="evaluation return (deterministic policy)")
    ax[0, 0].set_ylabel("return")
    series(ax[0, 1], [r["branch_return"] for r in rows], "C1", "discounted branch return")
    ax[0, 1].set_ylabel("discounted branch return")
    series(ax[1, 0], [r["kl_old"] for r in rows], "C2", "KL(old||new)", log=True)
    series(ax[1, 0], [r["clip_low"] + r["clip_high"] for r in rows], "C3", "clip fraction",
           log=True)
    ax[1, 0].set_yscale("log")
    ax[1, 0].set_ylim(bottom=1e-5)
    series(ax[1, 1], [r["entropy"] for r in rows], "C4", "entropy")
    ax[1, 1].set_ylabel("entropy (nats)")
    # one series: its name as the panel's title (covers nothing); two: a legend where the
    # curves leave room
    for a in ax.flat:
        handles, labels = a.get_legend_handles_labels()
        if len(labels) == 1:
            a.set_title(labels[0], fontsize=9)
        elif labels:
            a.legend(loc="best", fontsize=8, framealpha=0.8)
    for a in ax[1]:
        a.set_xlabel("training wall time (s)")
    fig.suptitle(f"{name}  (faint: per iteration; bold: moving average "
                 f"over {w} iterations)", fontsize=10)
    fig.tight_layout()
    return fig
