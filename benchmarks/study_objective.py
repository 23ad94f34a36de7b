#!/usr/bin/env python3
"""What GRPO's objective costs on the gym pendulum, before any learning.

A GRPO branch scores a loss step by the rewards it sees ahead: at most
``horizon`` of them (``horizon - t`` for loss step t of the outcome form),
discounted by ``gamma``. The best controller for that objective is the
receding-horizon controller of ``grpo_ctrl.baselines.optimum.horizon_values``
(dynamic programming, exact up to the grid). Scored on the 1,000 held-out
Gymnasium episodes and paired with the optimum, it bounds what GRPO can reach
with that horizon and discount, however well it learns (docs/grpo.md §9).

    python benchmarks/study_objective.py                   # the table of docs/grpo.md
    python benchmarks/study_objective.py --case 0.98:64 --case 1.0:64
    python benchmarks/study_objective.py --case 0.99:40 --case 0.99:48 --case 0.99:56 \
        --case 0.99:64          # the hanging starts of docs/grpo.md §9, fourth pass
"""
from __future__ import annotations

import argparse

import numpy as np

from grpo_ctrl.baselines.optimum import OptimalPendulum, horizon_values, make_optimum
from grpo_ctrl.heldout import HELDOUT_EPISODES, format_difference, near_hanging, score

CASES = ("0.98:32", "0.98:48", "0.98:64", "0.98:400", "0.99:48", "0.99:64", "0.99:400",
         "0.995:64", "1.0:32", "1.0:48", "1.0:64")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", action="append", metavar="GAMMA:STEPS",
                   help="discount and number of rewards seen ahead (repeatable)")
    p.add_argument("--episodes", type=int, default=HELDOUT_EPISODES)
    args = p.parse_args(argv)
    optimum = make_optimum("pendulum", "gym")
    ref = score(optimum, args.episodes)
    print(f"optimum (undiscounted, converged): {ref}\n")
    hanging = near_hanging("pendulum", "gym", args.episodes)
    print("| gamma | rewards seen ahead | return, receding-horizon optimum | minus the optimum, "
          "paired | of it, on hanging starts | hanging starts losing > 50 (an extra swing) |")
    print("|---|---|---|---|---|---|")
    for case in args.case or CASES:
        gamma, steps = float(case.split(":")[0]), int(case.split(":")[1])
        ctl = OptimalPendulum(optimum.spec, horizon_values(steps, gamma), gamma=gamma)
        s = score(ctl, args.episodes)
        d = (s.returns - ref.returns)[hanging]
        print(f"| {gamma:g} | {steps} | {s} | {format_difference(s.minus(ref))} | {d.mean():+.1f} | "
              f"{100 * np.mean(d < -50):.0f} % |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
