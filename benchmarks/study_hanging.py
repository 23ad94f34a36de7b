#!/usr/bin/env python3
"""Where a trained gym-pendulum policy loses to the optimum, and whether its
own exploration could find what it misses (docs/grpo.md §9, fourth pass).

On the 1,000 held-out episodes, paired with the optimum:

* the loss by start angle, and how many hanging starts lose more than 50
  (an extra swing);
* how saturated the policy's pre-squash mean is on the hanging starts' first
  60 steps (where |mu| >> 1 the exploration noise cannot move the command),
  and the policy scored with its own noise against its mean action;
* from each of the worst starts, ``--branches`` branches of the policy with
  its own noise, ``--horizon`` steps discounted by ``--gamma`` as in
  training: their spread, and how many come within 2 points of the
  optimum's return over the same steps; and the first ``--actions`` commands of
  the optimum, of the mean action, and averaged over the branches that come within
  2 points of the optimum and over the others (where they part is the decision
  the policy gets wrong).

    python benchmarks/study_hanging.py RUN/latest.pt
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from grpo_ctrl.baselines.optimum import make_optimum
from grpo_ctrl.closed_loop import act
from grpo_ctrl.heldout import (HELDOUT_EPISODES, near_hanging, score, standard_error,
                               start_states)
from grpo_ctrl.policy import load_policy
from grpo_ctrl.run_folder import LATEST
from grpo_ctrl.sim import BatchSim


@torch.no_grad()
def rollout(policy, x0: np.ndarray, steps: int, noise: float, gamma: float,
            gen: torch.Generator, first: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Discounted returns (N,) from start states x0 (N, 2) of the policy with
    ``noise`` times its own std before the tanh, the pre-squash means (steps, N) and
    the commands (steps, N). ``first`` (N,): the first step's commands, given (the
    policy acts from the second step; the first step's mean is then nan)."""
    sim = BatchSim("pendulum", len(x0), "gym", seed=0)
    sim.reset()
    sim.set_state({"x": x0})
    obs, ret, mus, commands = sim.observe(), np.zeros(len(x0)), [], []
    for t in range(steps):
        if t == 0 and first is not None:
            mus.append(np.full(len(x0), np.nan, dtype=np.float32))
            commands.append(np.asarray(first, dtype=np.float64))
        else:
            mu, log_std = policy.dist(policy.normalise(torch.as_tensor(obs,
                                                                       dtype=torch.float32)))
            z = mu + noise * torch.exp(log_std) * torch.randn(mu.shape, generator=gen)
            commands.append((policy.u_max * np.tanh(z.numpy())).astype(np.float64))
            mus.append(mu.numpy())
        obs, r, _, _ = sim.step(commands[-1])
        ret += gamma ** t * r
    return ret, np.array(mus), np.array(commands)


def deterministic_return(controller, x0: np.ndarray, steps: int,
                         gamma: float) -> tuple[float, np.ndarray]:
    """The discounted return of ``controller`` from x0 (2,), and its commands (steps,)."""
    sim = BatchSim("pendulum", 1, "gym", seed=0)
    sim.reset()
    sim.set_state({"x": x0[None]})
    obs, ret, commands = sim.observe(), 0.0, []
    for t in range(steps):
        commands.append(float(act(controller, obs)[0]))
        obs, r, _, _ = sim.step(np.array(commands[-1:]))
        ret += gamma ** t * float(r[0])
    return ret, np.array(commands)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a run folder (its latest.pt) or a checkpoint file")
    p.add_argument("--worst", type=int, default=8, help="starts to branch from")
    p.add_argument("--branches", type=int, default=64)
    p.add_argument("--horizon", type=int, default=64)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--actions", type=int, default=12, help="first commands to print")
    p.add_argument("--against", metavar="RUN",
                   help="also pair with this run (its latest.pt) on the same episodes: all / "
                        "hanging / rest, with their standard errors")
    args = p.parse_args(argv)
    policy, _, _ = load_policy(Path(args.checkpoint), LATEST)
    optimum = make_optimum("pendulum", "gym")
    n = HELDOUT_EPISODES
    x0 = start_states("pendulum", "gym", n)
    hanging = near_hanging("pendulum", "gym", n)
    mine = score(policy.controller(optimum.spec), n).returns
    d = mine - score(optimum, n).returns
    print(f"minus the optimum, paired: {d.mean():+.2f}; hanging starts {d[hanging].mean():+.1f} "
          f"({100 * np.mean(d[hanging] < -50):.0f} % of them lose > 50), rest "
          f"{d[~hanging].mean():+.2f}")
    if args.against:
        other, _, _ = load_policy(Path(args.against), LATEST)
        e = mine - score(other.controller(optimum.spec), n).returns
        print(f"minus {args.against}, paired: " + " / ".join(
            f"{name} {e[m].mean():+.2f} (s.e. {standard_error(e[m]):.2f})"
            for name, m in (("all", np.ones(n, dtype=bool)), ("hanging", hanging),
                            ("rest", ~hanging))))
    from_down = np.abs(np.abs(x0[:, 0]) - np.pi)
    for lo in np.arange(0.0, np.pi, np.pi / 6):
        m = (from_down >= lo) & (from_down < lo + np.pi / 6)
        print(f"  start {lo:.2f}-{lo + np.pi / 6:.2f} rad from hanging down: {m.sum()} episodes, "
              f"{d[m].mean():+.1f}, {100 * np.mean(d[m] < -20):.0f} % lose > 20")
    gen = torch.Generator().manual_seed(0)
    _, mus, _ = rollout(policy, x0[hanging], 60, 0.0, 1.0, gen)
    q = np.percentile(np.abs(mus), [50, 75, 90])
    print(f"hanging starts, first 60 steps: |mu| median {q[0]:.1f}, 75th {q[1]:.1f}, 90th "
          f"{q[2]:.1f}; log std {float(policy.log_std.detach().mean()):.2f} (state-independent "
          "part; gSDE: its mean over the features)")
    for noise in (0.5, 1.0):
        ret, _, _ = rollout(policy, x0, 200, noise, 1.0, gen)
        print(f"with {noise:g} x its own noise: {ret.mean() - mine.mean():+.2f} against its mean "
              "action")
    print(f"\n{args.branches} branches x {args.horizon} steps, gamma {args.gamma}, from the "
          f"{args.worst} worst starts:")
    print("| start (angle, speed) | episode loss | optimum | mean action | branches: mean | std "
          "| best | within 2 of the optimum |")
    print("|---|---|---|---|---|---|---|---|")
    controller = policy.controller(optimum.spec)
    commands = []
    for i in np.argsort(d)[:args.worst]:
        best, by_optimum = deterministic_return(optimum, x0[i], args.horizon, args.gamma)
        mean_action, by_mean = deterministic_return(controller, x0[i], args.horizon, args.gamma)
        ret, _, by_branch = rollout(policy, np.repeat(x0[i:i + 1], args.branches, 0),
                                    args.horizon, 1.0, args.gamma, gen)
        print(f"| {x0[i, 0]:+.2f}, {x0[i, 1]:+.2f} | {d[i]:.0f} | {best:.1f} | {mean_action:.1f} | "
              f"{ret.mean():.1f} | {ret.std():.1f} | {ret.max():.1f} | "
              f"{100 * np.mean(ret >= best - 2):.0f} % |")
        win = ret >= best - 2
        winners = by_branch[:, win].mean(1) if win.any() else None
        commands.append((x0[i], {"optimum": by_optimum, "mean action": by_mean,
                                 "winning branches": winners,
                                 "other branches": by_branch[:, ~win].mean(1)}))
    print(f"\nfirst {args.actions} commands (N m) from the same starts:")
    for x, rows in commands:
        print(f"start {x[0]:+.2f}, {x[1]:+.2f}")
        for name, u in rows.items():
            if u is not None:
                print(f"  {name:>16}: " + " ".join(f"{v:+.1f}" for v in u[:args.actions]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
