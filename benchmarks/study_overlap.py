#!/usr/bin/env python3
"""Serial against overlapped collection on the gym pendulum, by wall clock.

Overlap (the next batch collected in a second process during the update)
buys iterations per second, so unlike benchmarks/study_grpo.py this study
gives every variant the same wall-clock budget. Each variant trains from
the same seeds; its deterministic policy is snapshotted every ``--every``
seconds of training and scored afterwards on Gymnasium's Pendulum-v1 (100
episodes), as in benchmarks/bench_train.py. Prints, per variant, the final
return of every seed, their mean, the worst snapshot and the iterations.

    python benchmarks/study_overlap.py                # 4 seeds x 30 s x 3 variants
    python benchmarks/study_overlap.py --seeds 2 --budget 10

Runs one after the other: an overlapped run needs both cores to itself.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train import Snapshots, score  # noqa: E402

from grpo_ctrl.grpo_config import default_config  # noqa: E402
from grpo_ctrl.train import train  # noqa: E402

VARIANTS = [("serial, lr 3e-3", {"overlap": False, "lr": 3e-3}),
            ("overlap, lr 3e-3", {"overlap": True, "lr": 3e-3}),
            ("overlap, lr 2e-3", {"overlap": True, "lr": 2e-3})]


def one_run(overrides: dict, seed: int, budget: float, every: float) -> dict:
    cfg = default_config("pendulum", "gym")
    cfg.time_budget, cfg.seed = budget, seed
    for name, value in overrides.items():
        setattr(cfg, name, value)
    snaps = Snapshots(every)
    summary = train("pendulum", "gym", cfg, None, progress=False,
                    on_iteration=lambda tr, row: snaps.maybe(
                        row["wall_time"], lambda: tr.policy.controller(tr.spec)))
    curve = score(snaps.items, 100)
    return {"final": curve[-1][1], "worst": min(r for _, r in curve),
            "iterations": summary["iterations"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--budget", type=float, default=30.0, help="training seconds per run")
    p.add_argument("--every", type=float, default=2.0, help="snapshot period (s of training)")
    args = p.parse_args(argv)
    print("| variant | final return per seed | mean | worst snapshot | iterations |")
    print("|---|---|---|---|---|")
    for name, overrides in VARIANTS:
        runs = [one_run(overrides, seed, args.budget, args.every) for seed in range(args.seeds)]
        finals = [r["final"] for r in runs]
        its = [r["iterations"] for r in runs]
        print(f"| {name} | {', '.join(f'{f:.1f}' for f in finals)} | {np.mean(finals):.1f} | "
              f"{min(r['worst'] for r in runs):.1f} | {min(its)}-{max(its)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
