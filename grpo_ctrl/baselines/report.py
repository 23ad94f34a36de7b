"""``grpo-ctrl baselines``: the classic controllers on every plant, as a table.

Evaluates ``lqr`` and ``swingup-lqr`` on every preset of every plant over N
episodes of the batched C simulator (and the ``gym`` pendulum also on
Gymnasium's own Pendulum-v1, the independent reference), prints a markdown
report and writes it to ``docs/baselines.md``.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from grpo_ctrl.baselines import available, make_controller
from grpo_ctrl.bench_cli import cpu_model
from grpo_ctrl.closed_loop import (BALANCE_TILT, STILL_TOL, UPRIGHT_TOL, evaluate,
                                   evaluate_on_gymnasium_pendulum, near_upright_start)
from grpo_ctrl.errors import UserError
from grpo_ctrl.files import atomic_write, check_writable
from grpo_ctrl.option_types import MAX_EPISODES, positive_int, seed
from grpo_ctrl.plant import presets, systems

INTRO = f"""# Classic control baselines

Written by `grpo-ctrl baselines` (do not edit by hand; rerun it). Each
controller is a stateless function of the observation (`grpo_ctrl.baselines`),
evaluated over many episodes from the preset's own start distribution.
*Success*: the episode never terminated and ends with the pendulum (both links
of the double pendulum) within {UPRIGHT_TOL} rad of upright, turning slower than
{STILL_TOL} rad/s.

* `lqr`: discrete LQR about upright on the simulator's own one-step map
  (finite differences through the C simulator), with Q and R the task's
  per-step quadratic cost (`w_x`, `w_u`); Gymnasium's CartPole has no such
  cost and gets Bryson's rule, the double pendulum (whose reward is a height)
  RealAIGym's own weights (`LQR_WEIGHTS` in `grpo_ctrl/presets.py`; the acrobot's
  shoulder gain saturates its motor beyond about 0.02 rad, and the `-real`
  presets' friction defeats the design: docs/double_pendulum.md). The Riccati
  equation is solved in numpy by structure-preserving doubling.
* `swingup-lqr`: energy-based swing-up (Astrom and Furuta 2000) outside a
  region around upright, LQR inside it. For the pendulum the torque pumps the
  energy directly; for the cart-pole and the Furuta pendulum the input is
  computed so that the cart or arm follows a chosen acceleration (collocated
  partial feedback linearisation), which pumps the pendulum's energy and, with
  a PD term, keeps the cart or arm near the middle. The double pendulum has
  none yet.

**Why a region and not a hysteresis.** The switch to LQR is a region test:
LQR acts where the LQR cost-to-go x'Px (without the cart position or arm
angle, which do not enter the dynamics) is below a level, energy control
elsewhere. A hysteresis would need the last mode as controller state; a pure
function of the observation keeps every controller stateless, so its ONNX
and C exports are the same function as the torch module. They compute the
same bits, too: the angles, the gain products and the region's level come
from `grpo_ctrl.baselines.portable` (an atan2 and dot products in one fixed order, built
from exactly rounded float32 operations), where `torch.atan2` and `x @ K`
would differ between torch, onnxruntime and C by a unit in the last place,
which gains of up to 86 per radian magnify beyond the export's 1e-5. The energy
law drives the state onto the homoclinic orbit through upright, which passes
through the region, so it is normally entered once and kept; the last
column counts the hand-overs between the two modes per episode. (On the gym
pendulum, whose torque limit is below the peak gravity torque, a few
swings enter the region too fast, leave it and come back.)
"""


def add_arguments(parser) -> None:
    parser.add_argument("--episodes", type=positive_int(MAX_EPISODES), default=1000,
                        help="episodes per controller and plant (default: 1000)")
    parser.add_argument("--seed", type=seed, default=0, help="first seed (default: 0)")
    parser.add_argument("--output", default="docs/baselines.md",
                        help="where to write the markdown report (default: docs/baselines.md)")
    parser.add_argument("--no-gymnasium", action="store_true",
                        help="skip the run on Gymnasium's own Pendulum-v1")


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _results_table(rows) -> list[str]:
    lines = [_row(["plant", "preset", "controller", "start", "simulator", "episodes",
                   "return mean", "median", "worst", "success", "mode switches mean / max"]),
             _row(["---"] * 5 + ["---:"] * 6)]
    for system, preset, name, start, simulator, ep in rows:
        r, sw = ep.returns, ep.mode_switches
        lines.append(_row([system, preset, f"`{name}`", start, simulator, len(r),
                           f"{r.mean():.1f}", f"{np.median(r):.1f}", f"{r.min():.1f}",
                           f"{100 * ep.success.mean():.1f} %",
                           "-" if sw is None else f"{sw.mean():.2f} / {sw.max()}"]))
    return lines


def _design_table(designs) -> list[str]:
    lines = [_row(["plant", "preset", "Q (diagonal)", "R", "gain K (u = -K x)",
                   "closed-loop poles (z)"]),
             _row(["---"] * 6)]
    for system, preset, d in designs:
        poles = sorted(d.poles, key=lambda z: (-abs(z), -z.imag))
        lines.append(_row([system, preset, _numbers(np.diag(d.Q)), f"{d.R[0, 0]:.4g}",
                           _numbers(d.K[0]), ", ".join(
                               f"{z.real:.4f}{z.imag:+.4f}j" if z.imag else f"{z.real:.4f}"
                               for z in poles)]))
    return lines


def _numbers(v) -> str:
    return "[" + ", ".join(f"{x:.4g}" for x in v) + "]"


def build_report(episodes: int, seed: int, gymnasium: bool) -> str:
    rows, designs = [], []
    tilted = f"up to {np.degrees(BALANCE_TILT):.0f} deg off upright"
    for system in systems():
        for preset in presets(system):
            for name in available(system):
                controller = make_controller(name, system, preset)
                if name == "lqr":
                    designs.append((system, preset, controller.lqr))
                rows.append((system, preset, name, "preset", "C (batched)",
                             evaluate(controller, episodes, seed=seed)))
                if gymnasium and (system, preset) == ("pendulum", "gym"):
                    rows.append((system, preset, name, "preset", "Gymnasium Pendulum-v1",
                                 evaluate_on_gymnasium_pendulum(controller, episodes, seed)))
                rows.append((system, preset, name, tilted, "C (batched)",
                             evaluate(controller, episodes, seed=seed,
                                      **near_upright_start(system))))
    lines = [INTRO, "## Results", "", *_results_table(rows), "",
             f"Seeds {seed} to {seed + episodes - 1} (Gymnasium: episode i reset with seed i). "
             "*Start*: the preset's own start distribution, or a balance test from a "
             "uniform start with the pendulum up to "
             f"{np.degrees(BALANCE_TILT):.0f} degrees off upright and every other state "
             "component within 0.05 of zero. The scores are deterministic functions of the "
             f"seeds; `grpo-ctrl baselines` wrote this report on {cpu_model()}.", "",
             "## LQR designs", "", "State order: " + "; ".join(
                 f"{s}: {', '.join(make_controller('lqr', s).spec.state_names)}" for s in systems())
             + ". Poles of the discrete closed loop, largest first.", "",
             *_design_table(designs), ""]
    return "\n".join(lines)


def run(args) -> int:
    out = check_writable(args.output)
    gymnasium = not args.no_gymnasium
    if gymnasium:
        try:
            import gymnasium  # noqa: F401
        except ImportError:
            raise UserError("the reference run needs Gymnasium: pip install 'grpo-ctrl[gym]', "
                            "or pass --no-gymnasium") from None
    torch.set_num_threads(1)  # batched forwards of tiny models: threads only add overhead
    start = time.perf_counter()
    text = build_report(args.episodes, args.seed, bool(gymnasium))
    atomic_write(out, text)
    print(text)
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s")
    return 0
