#!/usr/bin/env python3
"""What a flip probe sees: GRPO's own objective for a switched bang-bang command (gym pendulum).

From a start state the policy's deployed episode is traced; at each of ``--steps`` the
policy's continuation (its mean action for ``--horizon`` steps, rewards discounted by
``--gamma``: a branch's return in training) is compared with a probe that holds the flipped
command -mu of that step for k steps (``--hold``), then follows the policy again. A positive
difference is what a winning probe (``probes``, docs/grpo.md §1 and §9, tenth pass) would
regress the policy toward; a saturated mu (|mu| of 4 and more) is where the Gaussian noise of a
sample cannot reach the other command.

    python benchmarks/study_flip.py RUN -2.2 0.03 --steps 4 6 7 8 9 10
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from grpo_ctrl.policy import load_policy
from grpo_ctrl.run_folder import LATEST
from grpo_ctrl.sim import BatchSim


def mean_command(policy, obs: np.ndarray) -> torch.Tensor:
    """mu of each observation: the pre-squash command the deployed controller squashes."""
    with torch.no_grad():
        return policy.mu(policy.normalise(torch.as_tensor(obs, dtype=torch.float32)))


def returns_with_holds(policy, x: np.ndarray, holds, horizon: int, gamma: float) -> np.ndarray:
    """Discounted returns from state x (nx,): the policy's mean action, except that rollout
    j holds -mu(x) for its first holds[j] steps (0: the policy's own continuation)."""
    n = len(holds)
    sim = BatchSim("pendulum", n, "gym")
    sim.reset()
    sim.set_state({"x": np.repeat(x[None], n, axis=0)})
    obs = sim.observe()
    held = -mean_command(policy, obs)
    hold = torch.as_tensor(holds)
    total, weight = np.zeros(n), 1.0
    for t in range(horizon):
        z = torch.where(t < hold, held, mean_command(policy, obs))
        obs, reward, _, _ = sim.step(policy.u_max * np.tanh(z.numpy().astype(np.float64)))
        total += weight * reward
        weight *= gamma
    return total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="run folder or checkpoint (its latest policy)")
    p.add_argument("theta", type=float, help="start angle, rad (0: upright)")
    p.add_argument("omega", type=float, help="start speed, rad/s")
    p.add_argument("--steps", type=int, nargs="+", default=[4, 6, 7, 8, 9, 10])
    p.add_argument("--hold", type=int, nargs="+", default=[4, 10, 16, 22, 28])
    p.add_argument("--horizon", type=int, default=64)
    p.add_argument("--gamma", type=float, default=0.99)
    args = p.parse_args(argv)
    policy = load_policy(Path(args.run), LATEST)[0]
    sim = BatchSim("pendulum", 1, "gym")
    sim.reset()
    sim.set_state({"x": np.array([[args.theta, args.omega]])})
    obs, states = sim.observe(), []
    for _ in range(max(args.steps) + 1):  # the deployed episode
        states.append(sim.get_state()["x"][0].copy())
        obs = sim.step(policy.u_max * np.tanh(mean_command(policy, obs).numpy().astype(
            np.float64)))[0]
    print(f"| step | state (angle, speed) | mu | policy's return | probe minus policy, held "
          f"{', '.join(map(str, args.hold))} steps |")
    print("|---|---|---|---|---|")
    for t in args.steps:
        x = states[t]
        r = returns_with_holds(policy, x, [0, *args.hold], args.horizon, args.gamma)
        mu = float(mean_command(policy, np.array([[np.cos(x[0]), np.sin(x[0]), x[1]]])))
        print(f"| {t} | ({x[0]:+.2f}, {x[1]:+.2f}) | {mu:+.2f} | {r[0]:.1f} | " +
              " / ".join(f"{d:+.1f}" for d in r[1:] - r[0]) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
