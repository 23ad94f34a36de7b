#!/usr/bin/env python3
"""Does GRPO's noisy objective prefer the trained policy's early switch on the hanging
starts? (docs/grpo.md §9, sixth pass (c).)

Training scores a branch by a 64-step return whose continuation is the noisy policy;
the device runs the mean action. If surviving its own noise made an earlier switch pay,
the two continuations would rank a step's commands differently. Along the deployed
(mean-action) path from the ``--worst`` hanging starts of the held-out episodes, at
each of the first ``--steps`` steps: the first command u on a grid over
[-u_max, u_max], then ``--horizon`` - 1 steps of (a) the mean action, (b) the policy
with its own noise (``--draws`` draws); Q(u) = the discounted return as in training.
Printed where either gains more than 1 on the policy's own command: the best u and
its gain under each continuation, the slope of Q at the policy's command (all a
likelihood-ratio gradient sees with small noise), and p_find, the chance that one
sampled command at that step lands where Q_mean gains half its best gain or more.

    python benchmarks/study_switch.py RUN/latest.pt
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.stats import norm

from grpo_ctrl.baselines.optimum import make_optimum
from grpo_ctrl.heldout import near_hanging, score, start_states
from grpo_ctrl.policy import load_policy
from grpo_ctrl.run_folder import LATEST
from grpo_ctrl.sim import BatchSim

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from study_hanging import rollout  # noqa: E402


@torch.no_grad()
def q_curve(policy, x: np.ndarray, first: np.ndarray, horizon: int, gamma: float,
            noise: float, draws: int, gen: torch.Generator) -> np.ndarray:
    """Mean discounted return from state x (2,) of each first command, then the policy
    with ``noise`` times its own std for the remaining steps, over ``draws`` draws."""
    n = len(first) * draws
    ret, _, _ = rollout(policy, np.repeat(x[None], n, 0), horizon, noise, gamma, gen,
                        first=np.repeat(first, draws))
    return ret.reshape(len(first), draws).mean(1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a run folder (its latest.pt) or a checkpoint file")
    p.add_argument("--worst", type=int, default=8, help="hanging starts, the worst first")
    p.add_argument("--steps", type=int, default=16, help="steps of the mean path to probe")
    p.add_argument("--horizon", type=int, default=64)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--draws", type=int, default=128, help="noisy continuations per command")
    args = p.parse_args(argv)
    policy, _, _ = load_policy(Path(args.checkpoint), LATEST)
    if policy.std_head is not None:
        raise SystemExit("a per-state std (state_std) is not supported here")
    optimum = make_optimum("pendulum", "gym")
    x0, hanging = start_states("pendulum", "gym"), near_hanging("pendulum", "gym")
    d = score(policy.controller(optimum.spec)).returns - score(optimum).returns
    grid = np.linspace(-policy.u_max, policy.u_max, 41)
    z_grid = np.arctanh(np.clip(grid / policy.u_max, -1 + 1e-6, 1 - 1e-6))
    cells = np.concatenate([[-np.inf], (z_grid[1:] + z_grid[:-1]) / 2, [np.inf]])
    sd, gen = float(torch.exp(policy.log_std.detach())), torch.Generator().manual_seed(0)
    for i in [i for i in np.argsort(d) if hanging[i]][:args.worst]:
        print(f"start {x0[i, 0]:+.2f}, {x0[i, 1]:+.2f}: loses {d[i]:.0f} to the optimum")
        sim = BatchSim("pendulum", 1, "gym", seed=0)
        sim.reset()
        sim.set_state({"x": x0[i:i + 1]})
        for t in range(args.steps):
            with torch.no_grad():
                mu = float(policy.dist(policy.normalise(torch.as_tensor(
                    sim.observe(), dtype=torch.float32)))[0][0])
            u = policy.u_max * np.tanh(mu)
            x = sim.get_state()["x"][0].copy()
            q_mean = q_curve(policy, x, grid, args.horizon, args.gamma, 0.0, 1, gen)
            q_noisy = q_curve(policy, x, grid, args.horizon, args.gamma, 1.0, args.draws, gen)
            j = int(np.argmin(np.abs(grid - u)))
            lo, hi = max(j - 1, 0), min(j + 1, len(grid) - 1)
            if max(q_mean.max() - q_mean[j], q_noisy.max() - q_noisy[j]) > 1.0:
                wins = q_mean - q_mean[j] >= 0.5 * (q_mean.max() - q_mean[j])
                p_find = sum(norm.cdf(cells[k + 1], mu, sd) - norm.cdf(cells[k], mu, sd)
                             for k in np.nonzero(wins)[0])
                row = " | ".join(
                    f"{name}: best u {grid[q.argmax()]:+.1f} gains {q.max() - q[j]:5.1f}, slope "
                    f"{(q[hi] - q[lo]) / (grid[hi] - grid[lo]):+6.1f}"
                    for name, q in (("mean cont.", q_mean), ("noisy cont.", q_noisy)))
                print(f"  step {t:2d} mu {mu:+5.2f} u {u:+.2f} p_find {p_find:.3f} | {row}")
            sim.step(np.array([u]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
