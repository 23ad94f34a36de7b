#!/usr/bin/env python3
"""When in an episode a controller loses against the optimum (gym pendulum).

Every controller runs the 1,000 held-out episodes (Gymnasium's Pendulum-v1 starts, the C
simulator's ``gym`` preset) with the dynamic-programming optimum beside it. The per-step
reward differences, summed over windows of ``--window`` steps and averaged over the
episodes, show where a return is lost: a controller that pays later for saving early
(a discount's trade) gains in the first window and loses in the next ones. Hanging
starts (within 0.64 rad of hanging down) and the rest are shown apart.

A controller is a run folder (its latest.pt), a checkpoint file, or ``rh:GAMMA:STEPS``:
the receding-horizon optimum of an objective that sees STEPS rewards ahead discounted by
GAMMA (``horizon_values``), the best any policy trained on that objective can do
(docs/grpo.md §9, ninth pass).

    python benchmarks/study_when.py RUN/latest.pt rh:0.99:64 rh:1.0:64

``--extra-swing D`` adds a second table: the rest starts that lose more than D points against
the optimum (an extra swing: an attempt that stalls short of the top and falls back) apart
from the other rest starts, each as its share of the rest starts' mean (docs/grpo.md §9,
tenth pass).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from grpo_ctrl.baselines.optimum import OptimalPendulum, horizon_values, make_optimum
from grpo_ctrl.closed_loop import evaluate
from grpo_ctrl.heldout import HELDOUT_EPISODES, near_hanging, start_states
from grpo_ctrl.policy import load_policy
from grpo_ctrl.run_folder import LATEST


def returns_to(controller, x0: np.ndarray, ends) -> np.ndarray:
    """Returns (len(ends), N) of ``controller`` from start states x0 (N, 2) over the first
    ``end`` steps, for each end: the project's own episode runner, once per end."""
    return np.array([evaluate(controller, len(x0), steps=end, start_states=x0).returns
                     for end in ends])


def controller_of(name: str, optimum: OptimalPendulum):
    if name.startswith("rh:"):
        try:
            gamma, steps = float(name.split(":")[1]), int(name.split(":")[2])
        except (IndexError, ValueError):
            raise SystemExit(f"study_when: {name!r} is not rh:GAMMA:STEPS (e.g. rh:0.99:64)")
        return OptimalPendulum(optimum.spec, horizon_values(steps, gamma), gamma=gamma)
    return load_policy(Path(name), LATEST)[0].controller(optimum.spec)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("controller", nargs="+", help="run folder, checkpoint or rh:GAMMA:STEPS")
    p.add_argument("--window", type=int, default=20, help="steps per column")
    p.add_argument("--extra-swing", type=float, default=0.0, metavar="D",
                   help="also split the rest starts at a loss of D points (0: off)")
    args = p.parse_args(argv)
    optimum = make_optimum("pendulum", "gym")
    x0 = start_states("pendulum", "gym", HELDOUT_EPISODES)
    hanging = near_hanging("pendulum", "gym", HELDOUT_EPISODES)
    steps = optimum.spec.max_steps
    ends = list(range(args.window, steps, args.window)) + [steps]
    reference = returns_to(optimum, x0, ends)
    print(f"minus the optimum, paired, per {args.window} steps of the episode "
          f"({hanging.sum()} hanging starts, {(~hanging).sum()} others)\n")
    print("| controller | starts | all steps | " +
          " | ".join(f"{a}-{b}" for a, b in zip([0] + ends[:-1], ends)) + " |")
    print("|---|---|---|" + "---|" * len(ends))
    whole = {}
    for name in args.controller:
        d = returns_to(controller_of(name, optimum), x0, ends) - reference  # (ends, N)
        whole[name] = d[-1]
        windows = np.diff(d, axis=0, prepend=0.0)
        for label, m in (("hanging", hanging), ("rest", ~hanging), ("all", np.ones_like(hanging))):
            print(f"| {name} | {label} | {d[-1, m].mean():+.2f} | " +
                  " | ".join(f"{w:+.2f}" for w in windows[:, m].mean(1)) + " |", flush=True)
    if args.extra_swing > 0:
        print(f"\n| controller | all (s.e.) | hanging | rest | rest starts losing more than "
              f"{args.extra_swing:g}: count / share of the rest mean | the other rest starts |")
        print("|---|---|---|---|---|---|")
        for name, d in whole.items():
            rest = d[~hanging]
            swing = rest < -args.extra_swing
            print(f"| {name} | {d.mean():+.2f} ({d.std(ddof=1) / np.sqrt(len(d)):.2f}) | "
                  f"{d[hanging].mean():+.2f} | {rest.mean():+.2f} | {swing.sum()} / "
                  f"{rest[swing].sum() / len(rest):+.2f} | {rest[~swing].sum() / len(rest):+.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
