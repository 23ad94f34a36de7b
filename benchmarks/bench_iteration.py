#!/usr/bin/env python3
"""Per-iteration cost of GRPO configurations, side by side in one process.

Each ``--arm`` is a set of GRPOConfig overrides on a plant's default (TOML
inline-table syntax); every arm gets its own Trainer (one thread, no overlap),
and the Trainers take their iterations in turn, so load on a shared machine
falls on all of them alike. Prints the median rollout and update seconds per
iteration (after ``--warmup``) and their ratios to the plant's default.

    python benchmarks/bench_iteration.py --arm 'hidden = 64' \\
        --arm 'c_update = false, c_rollout = false'
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

import torch

from grpo_ctrl.grpo import Trainer
from grpo_ctrl.grpo_config import default_config

try:
    import tomllib  # novermin: 3.10 takes the except branch
except ModuleNotFoundError:  # Python 3.10: tomli is the same parser (pyproject requires it there)
    import tomli as tomllib


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system", default="pendulum")
    p.add_argument("--preset", default="gym")
    p.add_argument("--arm", action="append", default=[],
                   help="GRPOConfig overrides, e.g. 'hidden = 64, minibatches = 4'")
    p.add_argument("--iterations", type=int, default=300, help="per arm, warm-up included")
    p.add_argument("--warmup", type=int, default=20)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    base = replace(default_config(args.system, args.preset), overlap=False, time_budget=0.0,
                   eval_every=1e9)
    arms = {"default": Trainer(base, args.system, args.preset)}
    for arm in args.arm:
        arms[arm] = Trainer(replace(base, **tomllib.loads(f"arm = {{{arm}}}")["arm"]),
                            args.system, args.preset)
    seconds = {name: ([], []) for name in arms}
    for i in range(args.iterations):
        for name, trainer in arms.items():
            m = trainer.step()
            if i >= args.warmup:
                seconds[name][0].append(m["rollout_s"])
                seconds[name][1].append(m["update_s"])
    r0, u0 = (statistics.median(x) for x in seconds["default"])
    for name, (r, u) in seconds.items():
        r, u = statistics.median(r), statistics.median(u)
        print(f"{name}: rollout {1e3 * r:.2f} ms ({r / r0:.2f}x), update {1e3 * u:.2f} ms "
              f"({u / u0:.2f}x), iteration {(r + u) / (r0 + u0):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
