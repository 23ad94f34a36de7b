"""What ``grpo-ctrl train`` prints and logs besides metrics.jsonl: plain lines
in a log file (no progress bar's carriage returns), TensorBoard event files
with the metrics' scalars, and curve.png's smoothed lines and legends."""
import json
import subprocess
import sys

import numpy as np
import pytest

from grpo_ctrl import train_log
from grpo_ctrl.run_folder import read_metrics

CLI = [sys.executable, "-m", "grpo_ctrl.cli"]
TINY = ["--time-budget", "0", "--num-starts", "4", "--group-size", "2", "--horizon", "8",
        "--loss-steps", "4", "--eval-episodes", "2", "--overlap", "false"]


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    """Seven iterations, evaluated at the first and the last (eval_every 1000 s:
    no other comes due), stdout and stderr to files, and TensorBoard event files."""
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    base = tmp_path_factory.mktemp("train-log")
    out, tb = base / "run", base / "tb"
    with open(base / "stdout.txt", "w") as so, open(base / "stderr.txt", "w") as se:
        r = subprocess.run(CLI + ["train", "--out", str(out), "--iterations", "7",
                                  "--eval-every", "1000", "--tensorboard", str(tb), *TINY],
                           stdout=so, stderr=se, timeout=300)
    assert r.returncode == 0, (base / "stderr.txt").read_text()
    return out, tb, (base / "stdout.txt").read_text(), (base / "stderr.txt").read_text()


def test_a_log_file_gets_one_plain_line_per_evaluation(logged_run):
    out, _, stdout, stderr = logged_run
    assert "\r" not in stdout and "\r" not in stderr
    evaluations = [r for r in read_metrics(out / "metrics.jsonl") if r["eval_return"] is not None]
    lines = [line for line in stdout.splitlines() if line.startswith("it ")]
    assert [r["iteration"] for r in evaluations] == [1, 7] and len(lines) == 2
    for line, row in zip(lines, evaluations):
        fields = line.split("  ")
        assert fields[0] == f"it {row['iteration']}"
        assert fields[2] == f"eval {row['eval_return']:.1f}"
    assert stdout.splitlines()[0].startswith("training ") and "done:" in stdout.splitlines()[-1]


def test_tensorboard_event_files_hold_the_metrics_scalars(logged_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, tb, _, _ = logged_run
    rows = read_metrics(out / "metrics.jsonl")
    acc = EventAccumulator(str(tb))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    numeric = {k for r in rows for k, v in r.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None}
    expected = {f"train/{k}" for k in numeric - {"eval_return", "eval_success"}}
    expected |= {"eval/return", "eval/success"}
    assert tags == expected
    # per iteration: every row's value at its iteration (float32 in the event file)
    kl = {e.step: e.value for e in acc.Scalars("train/kl_old")}
    assert kl == {r["iteration"]: pytest.approx(r["kl_old"], rel=1e-6, abs=1e-12) for r in rows}
    # per evaluation: only the iterations that evaluated
    ev = {e.step: e.value for e in acc.Scalars("eval/return")}
    assert ev == {r["iteration"]: pytest.approx(r["eval_return"], rel=1e-6)
                  for r in rows if r["eval_return"] is not None}
    assert len(ev) < len(rows)


def test_an_unwritable_tensorboard_folder_is_refused_before_training(tmp_path):
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    (tmp_path / "file").write_text("")
    r = subprocess.run(CLI + ["train", "--out", str(tmp_path / "run"), "--iterations", "1",
                              "--tensorboard", str(tmp_path / "file"), *TINY],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "is a file" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_smoothed_is_a_centred_moving_average_skipping_nans():
    y = np.array([1.0, 2.0, np.nan, 4.0, 8.0, 16.0])
    got = train_log.smoothed(y, 3)
    # by hand: the mean of the finite values among i-1, i, i+1
    want = [np.nanmean(y[max(0, i - 1):i + 2]) for i in range(len(y))]
    np.testing.assert_allclose(got, want)


def test_curve_legends_cover_no_curve(tmp_path):
    """One series per panel: its name is the panel's title (no legend box);
    KL and clip fraction: a legend placed where few of their points are."""
    pytest.importorskip("matplotlib",
                        reason="needs matplotlib, the train extra: pip install -e '.[train]'")
    import matplotlib
    matplotlib.use("Agg")
    rng = np.random.default_rng(0)
    rows = [{"wall_time": 0.1 * i, "iteration": i + 1,
             "eval_return": -1000 + 5 * i + 30 * rng.standard_normal() if i % 5 == 0 else None,
             "branch_return": -900 + 4 * i + 40 * rng.standard_normal(),
             "kl_old": 10 ** rng.uniform(-4, -2), "clip_low": 0.01, "clip_high": 0.02 * rng.random(),
             "entropy": -1 - 0.01 * i} for i in range(200)]
    fig = train_log.curve_figure(rows, "synthetic")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        labels = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
        if len(labels) == 1:
            assert legend is None and ax.get_title() == labels[0]
            continue
        box = legend.get_window_extent(renderer)
        points = np.concatenate([ax.transData.transform(line.get_xydata())
                                 for line in ax.get_lines()])
        inside = box.contains_points(points) if hasattr(box, "contains_points") else \
            ((points[:, 0] > box.x0) & (points[:, 0] < box.x1) & (points[:, 1] > box.y0)
             & (points[:, 1] < box.y1))
        assert inside.mean() < 0.05
    # each series has its raw line and a smoothed one over it
    assert len(fig.axes[1].get_lines()) == 2
    raw, smooth = (line.get_ydata() for line in fig.axes[1].get_lines())
    assert np.std(np.diff(smooth)) < 0.5 * np.std(np.diff(raw))
    fig.savefig(tmp_path / "c.png")
