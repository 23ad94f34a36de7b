"""The robustness benchmark (``grpo-ctrl eval RUN --robustness``), after RealAIGym's.

Each category sweeps one kind of sim-to-real gap over a grid, all else
nominal, and scores the share of successful episodes (never terminated,
upright and still at the end) over its grid points:

* model: each physical parameter but g alone, x0.5 ... x1.5 of nominal;
* delay: 0 ... 40 ms of actuation delay, in whole control steps;
* velocity noise: Gaussian noise on every observed velocity;
* torque noise: Gaussian noise on the actuator input;
* motor response: a first-order motor of time constant 0 ... 80 ms;
* pushes: torque pulses of 50 ms, one a second on average, of growing size.

The robustness score is the mean of the six, with its standard error from
the episodes (each point's share is a mean of 0/1 outcomes). Every
controller meets the same episodes (same plants, pushes and noise, drawn
from the seeds), so two controllers are compared paired: the score's
difference and its standard error from the per-episode differences
(``paired_difference``). The "realistic" row draws
every episode a plant with all of it at once, at the level a real rig
shows (``REALISTIC``). Episodes start from seeds far from any training seed.
The grids of the plant categories run as one batch: every environment holds
its own plant (``BatchSim(hold_plant=True)``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grpo_ctrl.closed_loop import Episodes, run_episodes
from grpo_ctrl.files import atomic_write, save_figure
from grpo_ctrl.randomize import FIXED_PARAMS, Randomization
from grpo_ctrl.sim import BatchSim

SEED = 7_000_000_000  # episode seeds: training draws from seeds near 0
SCALES = np.round(np.linspace(0.5, 1.5, 11), 2)
DELAY_S = np.linspace(0.0, 0.040, 11)
VELOCITY_NOISE = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8)          # rad/s (m/s on a cart)
TORQUE_NOISE = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)            # std, fraction of u_max
MOTOR_TAU_S = (0.0, 0.005, 0.01, 0.02, 0.04, 0.08)        # motor time constant
PUSH = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0)                    # fraction of u_max
PUSH_RATE, PUSH_S = 1.0, 0.05
CATEGORIES = ("model", "delay", "velocity noise", "torque noise", "motor response", "pushes")
# all parameters +-30%, delay 1-2 steps, a motor of up to 1.4 steps' time
# constant (k >= 0.5), encoder offsets of a few counts, encoder-level noise
REALISTIC = dict(params=0.3, delay=(1, 2), motor_k=(0.5, 1.0), offset=0.005)
ENCODER_NOISE = (0.002, 0.05)  # rad on angles, rad/s on angular velocities


@dataclass
class Point:
    category: str
    label: str    # what varies, e.g. "m" or "delay"
    value: float  # where on its grid
    success: float
    mean_return: float
    du_mean: float
    du_sign_changes: float
    outcomes: list  # 0/1 success of each episode, in episode order (for the paired s.e.)


def _grid_points(system: str, preset: str, spec) -> list[tuple[str, str, float, dict]]:
    """(category, label, value, plant values) of every per-environment point."""
    nominal = BatchSim(system, 1, preset=preset).plant()
    points = []
    for name in spec.param_names:
        if name in FIXED_PARAMS:  # g, and a pendulum's shape factors
            continue
        for s in SCALES:
            points.append(("model", name, float(s), {name: nominal[name][0] * s}))
    for steps in np.unique(np.floor(DELAY_S / spec.dt + 1e-9).astype(int)):
        points.append(("delay", "delay (ms)", 1e3 * steps * spec.dt, {"delay": int(steps)}))
    for level in TORQUE_NOISE:
        points.append(("torque noise", "torque noise (x u_max)", level,
                       {"torque_noise": level * spec.u_max}))
    for tau in MOTOR_TAU_S:
        k = 1.0 if tau == 0 else 1.0 - math.exp(-spec.dt / tau)
        points.append(("motor response", "motor time constant (ms)", 1e3 * tau, {"motor_k": k}))
    return points


def _score(eps: Episodes, sl=slice(None)) -> tuple[float, float, float, float]:
    return (float(eps.success[sl].mean()), float(eps.returns[sl].mean()),
            float(eps.du_mean[sl].mean()), float(eps.du_sign_changes[sl].mean()))


def _point(category: str, label: str, value: float, eps: Episodes, sl=slice(None)) -> Point:
    return Point(category, label, value, *_score(eps, sl),
                 [int(s) for s in np.asarray(eps.success[sl], dtype=bool)])


def _score_stderr(points: list[Point], outcomes) -> float:
    """Standard error of the robustness score (the mean over categories of the
    mean over each category's points of the points' success shares), given
    each point's per-episode outcomes (or their paired differences):
    the points are independent episodes, so the variances add with the
    squares of the weights 1 / (categories x points in the category)."""
    var = 0.0
    for c in CATEGORIES:
        mine = [o for p, o in zip(points, outcomes) if p.category == c]
        for o in mine:
            o = np.asarray(o, dtype=float)
            if len(o) > 1:
                var += (o.var(ddof=1) / len(o)) / (len(CATEGORIES) * len(mine)) ** 2
    return math.sqrt(var)


def paired_difference(a: dict, b: dict) -> tuple[float, float]:
    """Robustness score of ``a`` minus ``b`` (results of ``benchmark`` on the
    same episodes) and its standard error from the per-episode differences."""
    if [(p.category, p.label, p.value, len(p.outcomes)) for p in a["points"]] != \
            [(p.category, p.label, p.value, len(p.outcomes)) for p in b["points"]]:
        raise ValueError("the two results were not run on the same grid and episodes")
    diffs = [np.subtract(p.outcomes, q.outcomes) for p, q in zip(a["points"], b["points"])]
    return a["score"] - b["score"], _score_stderr(a["points"], diffs)


def benchmark(controller, episodes: int = 20, realistic_episodes: int = 200) -> dict:
    """Every grid point of every category, ``episodes`` each, and the
    realistic row over ``realistic_episodes``. Returns {"points": [Point],
    "categories": {name: score}, "score": mean, "realistic": {...},
    "nominal": {...}}."""
    import torch
    torch.set_num_threads(1)  # small batches: a second thread only spins (docs/grpo.md §6)
    spec = controller.spec
    system, preset = spec.system, spec.preset
    nx = len(spec.state_names)
    velocity = [k for k in range(nx) if k >= nx // 2]
    out: list[Point] = []
    # the plant categories: one batch, each environment holding its plant
    grid = _grid_points(system, preset, spec)
    sim = BatchSim(system, len(grid) * episodes, preset=preset, seed=SEED, hold_plant=True)
    for i, (_, _, _, values) in enumerate(grid):
        sim.set_plant(values, np.arange(i * episodes, (i + 1) * episodes))
    eps = run_episodes(controller, sim)
    for i, (category, label, value, _) in enumerate(grid):
        out.append(_point(category, label, value, eps, slice(i * episodes, (i + 1) * episodes)))
    # the model-level categories: a simulator per grid point
    for level in VELOCITY_NOISE:
        noise = np.zeros(nx)
        noise[velocity] = level
        eps = run_episodes(controller, BatchSim(system, episodes, preset=preset, seed=SEED,
                                                noise_std=noise))
        out.append(_point("velocity noise", "velocity noise std", level, eps))
    for level in PUSH:
        r = Randomization(push_rate=PUSH_RATE if level > 0 else 0.0, push=(level, level),
                          push_steps=max(1, round(PUSH_S / spec.dt)))
        eps = run_episodes(controller, BatchSim(system, episodes, preset=preset, seed=SEED,
                                                randomize=r))
        out.append(_point("pushes", "push (x u_max)", level, eps))
    categories = {c: float(np.mean([p.success for p in out if p.category == c]))
                  for c in CATEGORIES}
    real = run_episodes(controller, BatchSim(system, realistic_episodes, preset=preset,
                                             seed=SEED + 1, randomize=realistic(spec)))
    nominal = run_episodes(controller, BatchSim(system, realistic_episodes, preset=preset,
                                                seed=SEED + 1))
    return {"points": out, "categories": categories,
            "score": float(np.mean(list(categories.values()))),
            "score_stderr": _score_stderr(out, [p.outcomes for p in out]),
            "realistic": dict(zip(("success", "mean_return", "du_mean", "du_sign_changes"),
                                  _score(real)), episodes=realistic_episodes,
                              stderr=float(real.success.std() / math.sqrt(realistic_episodes))),
            "nominal": dict(zip(("success", "mean_return", "du_mean", "du_sign_changes"),
                                _score(nominal)), episodes=realistic_episodes,
                            return_stderr=float(nominal.returns.std()
                                                / math.sqrt(realistic_episodes)))}


def realistic(spec) -> Randomization:
    """The realistic row's plant ranges for ``spec``'s plant."""
    nx = len(spec.state_names)
    noise = {name: ENCODER_NOISE[k >= nx // 2] for k, name in enumerate(spec.state_names)}
    return Randomization(**REALISTIC, noise_std=noise)


def table(results: dict[str, dict]) -> str:
    """A markdown table: one column per controller; with several, each
    robustness score's paired difference from the last column's."""
    names = list(results)
    head = "| | " + " | ".join(names) + " |\n|---|" + "---|" * len(names) + "\n"
    rows = []

    def row(label, values):
        rows.append(f"| {label} | " + " | ".join(values) + " |")

    for c in CATEGORIES:
        row(c, [f"{100 * r['categories'][c]:.1f}%" for r in results.values()])
    row("**robustness score**", [f"**{100 * r['score']:.1f}%** +- {100 * r['score_stderr']:.1f}"
                                 for r in results.values()])
    if len(names) > 1:  # paired, on the same episodes, against the last column
        last = results[names[-1]]
        row(f"score minus {names[-1]}'s, paired", [
            "" if name == names[-1] else "{:+.1f} +- {:.1f}".format(
                *(100 * x for x in paired_difference(r, last)))
            for name, r in results.items()])
    row("realistic row", [f"{100 * r['realistic']['success']:.1f}% +- "
                          f"{100 * r['realistic']['stderr']:.1f}" for r in results.values()])
    row("nominal success", [f"{100 * r['nominal']['success']:.1f}%" for r in results.values()])
    row("nominal return", [f"{r['nominal']['mean_return']:.1f} +- "
                           f"{r['nominal']['return_stderr']:.1f}" for r in results.values()])
    row("mean abs du / u_max (nominal)", [f"{r['nominal']['du_mean']:.4f}"
                                          for r in results.values()])
    row("du sign changes (nominal)", [f"{100 * r['nominal']['du_sign_changes']:.1f}%"
                                      for r in results.values()])
    row("mean abs du / u_max (realistic)", [f"{r['realistic']['du_mean']:.4f}"
                                            for r in results.values()])
    row("du sign changes (realistic)", [f"{100 * r['realistic']['du_sign_changes']:.1f}%"
                                        for r in results.values()])
    return head + "\n".join(rows) + "\n"


def plot(results: dict[str, dict], png: Path, title: str) -> None:
    """Success against each perturbation, one line per controller (and per
    parameter in the model panel)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    styles = ["-", "--", ":", "-."]
    for ax, category in zip(axes.flat, CATEGORIES):
        for j, (name, r) in enumerate(results.items()):
            pts = [p for p in r["points"] if p.category == category]
            for label in dict.fromkeys(p.label for p in pts):
                xs = [p.value for p in pts if p.label == label]
                ys = [100 * p.success for p in pts if p.label == label]
                tag = f"{name}: {label}" if category == "model" else name
                ax.plot(xs, ys, styles[j % 4], marker="o", ms=3, lw=1, label=tag)
            ax.set_xlabel("x nominal" if category == "model" else pts[0].label)
        ax.set_title(f"{category}")
        ax.set_ylabel("success (%)")
        ax.set_ylim(-3, 103)
        ax.legend(fontsize=5 if category == "model" else 7)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, png, dpi=100)
    plt.close(fig)


def write_results(results: dict[str, dict], out: Path, title: str) -> str:
    """robustness.md (the table), robustness.json and robustness.png in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    text = table(results)
    atomic_write(out / "robustness.md", f"# {title}\n\n{text}")
    atomic_write(out / "robustness.json", json.dumps(
        {name: {**r, "points": [p.__dict__ for p in r["points"]]} for name, r in results.items()},
        indent=1))
    plot(results, out / "robustness.png", title)
    return text
