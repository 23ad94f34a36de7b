#!/usr/bin/env python3
"""How close can the policy's own network get to the optimum when it is *told* the
optimum's command? A supervised frontier for the gym pendulum (docs/grpo.md §9,
seventh pass).

The dynamic-programming optimum (``grpo_ctrl/baselines/optimum.py``) labels states
with its command; a ``GaussianPolicy`` mean network of each ``--arch`` (width x
layers, ReLU, the running normaliser, the deployed ``u_max tanh(mu)``) is fitted to
them by mean squared error on the command, with DAgger (Ross et al. 2011): after each
round the student's own closed-loop states, labelled by the optimum, join the data.
The first data are the optimum's own episodes from the preset's start distribution
and states uniform over angle and speed. After every round the student is scored on
the 1,000 held-out episodes, paired with the optimum (all / hanging / rest, as
``study_hanging.py``).

Only the fitting is timed (one torch thread, as GRPO's update); labels, rollouts and
scoring are free. GRPO never sees the optimum's command and pays for its own
samples, so at a given number of seconds this is an optimistic reference for what
the same network can reach, not a bound.

    python benchmarks/study_capacity.py --arch 64x2 --arch 128x3
    python benchmarks/study_capacity.py --features 64 --feature-scale 3 --lr 3e-3 \\
        --batch 512 --rounds 4 --epochs 4        # eighth pass: Fourier features
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from grpo_ctrl.baselines.optimum import make_optimum
from grpo_ctrl.closed_loop import act
from grpo_ctrl.heldout import near_hanging, score, standard_error
from grpo_ctrl.policy import GaussianPolicy
from grpo_ctrl.sim import BatchSim

LABEL_CHUNK = 20_000  # states per call of the optimum (x 81 look-ahead torques)


def label(optimum, obs: np.ndarray) -> np.ndarray:
    """The optimum's commands (N,) for observations (N, 3)."""
    return np.concatenate([act(optimum, obs[i:i + LABEL_CHUNK])
                           for i in range(0, len(obs), LABEL_CHUNK)]).astype(np.float32)


def closed_loop_states(controller, episodes: int, seed: int) -> np.ndarray:
    """Every observation (episodes x max_steps, 3) of ``controller``'s episodes from
    the preset's start distribution (C simulator, seeds away from the held-out ones)."""
    sim = BatchSim("pendulum", episodes, "gym", seed=seed)
    obs, seen = sim.reset(), []
    for _ in range(sim.model.max_steps):
        seen.append(obs.astype(np.float32))
        obs, _, _, _ = sim.step(act(controller, obs))
    return np.concatenate(seen)


def uniform_states(n: int, rng: np.random.Generator, max_speed: float) -> np.ndarray:
    """Observations (n, 3) of states uniform in angle and in speed up to ``max_speed``,
    as the simulator observes them."""
    x = np.stack([rng.uniform(-np.pi, np.pi, n), rng.uniform(-max_speed, max_speed, n)], 1)
    sim = BatchSim("pendulum", n, "gym")
    sim.reset()
    sim.set_state({"x": x})
    return sim.observe()


def fit(policy: GaussianPolicy, opt: torch.optim.Optimizer, x: np.ndarray, y: np.ndarray,
        epochs: int, batch: int, gen: torch.Generator) -> float:
    """``epochs`` passes of Adam on the squared command error; returns the seconds."""
    xt = policy.normalise(torch.as_tensor(x))
    yt = torch.as_tensor(y)
    started = time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), batch):
            idx = order[i:i + batch]
            u = policy.u_max * torch.tanh(policy.mu(xt[idx]))
            loss = ((u - yt[idx]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return time.perf_counter() - started


def dagger(arch: str, optimum, args):
    """Fit a fresh network of ``arch`` ("WIDTHxLAYERS") to the optimum's commands, round by
    round; yields (policy, round, labelled states, fitting seconds) after each round."""
    hidden, layers = (int(v) for v in arch.split("x"))
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x = np.concatenate([closed_loop_states(optimum, args.episodes, args.seed + 1),
                        uniform_states(args.uniform, rng, optimum.spec.v_max)])
    y = label(optimum, x)
    policy = GaussianPolicy(3, optimum.spec.u_max, hidden=hidden, layers=layers,
                            features=args.features, feature_scale=args.feature_scale)
    policy.obs_norm.update(torch.as_tensor(x))
    policy.refresh_norm()  # fixed from the first data (GRPO keeps updating its own)
    opt = torch.optim.Adam(policy.net.parameters(), lr=args.lr)
    seconds = 0.0
    for round_ in range(args.rounds):
        if round_ == args.rounds - 2:
            for group in opt.param_groups:
                group["lr"] = args.lr * 0.3
        seconds += fit(policy, opt, x, y, args.epochs, args.batch, gen)
        yield policy, round_, len(x), seconds
        more = closed_loop_states(policy.controller(optimum.spec), args.episodes // 2,
                                  args.seed + 100 + round_)
        x = np.concatenate([x, more])
        y = np.concatenate([y, label(optimum, more)])


def paired_row(policy, optimum, reference: np.ndarray, hanging: np.ndarray) -> str:
    """"minus the optimum (s.e.) | hanging | rest" of ``policy``'s mean action."""
    d = score(policy.controller(optimum.spec)).returns - reference
    return f"{d.mean():+.2f} ({standard_error(d):.2f}) | {d[hanging].mean():+.1f} | " \
           f"{d[~hanging].mean():+.2f}"


def frontier(arch: str, optimum, reference: np.ndarray, hanging: np.ndarray, args) -> None:
    for policy, round_, labelled, seconds in dagger(arch, optimum, args):
        print(f"| {arch} | {round_} | {labelled:,} | {seconds:.0f} | "
              f"{paired_row(policy, optimum, reference, hanging)} |", flush=True)


def add_fit_options(p: argparse.ArgumentParser, rounds: int = 6, epochs: int = 8,
                    batch: int = 1024, lr: float = 1e-3) -> None:
    p.add_argument("--rounds", type=int, default=rounds, help="DAgger rounds")
    p.add_argument("--epochs", type=int, default=epochs, help="passes over the data per round")
    p.add_argument("--episodes", type=int, default=2000,
                   help="optimum episodes at the start (half as many student episodes per round)")
    p.add_argument("--uniform", type=int, default=200_000, help="uniform states at the start")
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--lr", type=float, default=lr, help="Adam; x 0.3 for the last two rounds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--features", type=int, default=0,
                   help="random Fourier features before the network (GRPOConfig.features)")
    p.add_argument("--feature-scale", type=float, default=1.0,
                   help="std of their frequencies (GRPOConfig.feature_scale)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", action="append", metavar="WIDTHxLAYERS",
                   help="network to fit (repeatable; default 64x2, the gym default)")
    add_fit_options(p)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    optimum = make_optimum("pendulum", "gym")
    print("| network | DAgger round | labelled states | fitting seconds | minus the optimum, "
          "paired (s.e.) | hanging | rest |")
    print("|---|---|---|---|---|---|---|")
    reference, hanging = score(optimum).returns, near_hanging("pendulum", "gym")
    for arch in args.arch or ["64x2"]:
        frontier(arch, optimum, reference, hanging, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
