"""``grpo-ctrl distill``: a large controller's behaviour in a small network,
DAgger-style, on the simulator.

    grpo-ctrl distill runs/rig-full --fit uno --out runs/rig-uno
    grpo-ctrl distill runs/rig-full --hidden 8 --layers 2 --out runs/rig-8x2

Each round rolls ``envs`` plants (the preset's training randomisation) for a
whole episode, every environment acting with the teacher or, from the second
round on, with the student (the teacher's share halves each round, DAgger's
beta), and records every ``stride``-th observation with the teacher's command
for it: the states both controllers visit. The student (the policy's network,
the teacher's observation normaliser when the teacher is a trained policy)
then fits the aggregated set: ``steps`` Adam steps on the squared difference
of the commands, in units of u_max. Until ``time_budget`` seconds have
passed. The result is a run folder whose deployed checkpoint ``grpo-ctrl
eval``, ``export`` and ``firmware`` take like a trained one.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.option_types import number


@dataclass
class DistillConfig:
    hidden: int = 8
    layers: int = 2
    time_budget: float = 120.0  # seconds
    rounds: int = 0             # stop after this many rounds instead (0: by time_budget)
    envs: int = 128             # plants per round
    stride: int = 4             # record every stride-th step
    steps: int = 1500           # Adam steps per round
    batch: int = 4096
    lr: float = 3e-3
    seed: int = 0


def distill(teacher, cfg: DistillConfig, log=print) -> tuple:
    """The student ``GaussianPolicy`` distilled from ``teacher`` (a controller,
    ``grpo_ctrl.controller``'s contract) and per round ``(beta, samples, loss before, loss
    after)``: the teacher's share of the round's rollouts, the states gathered so far, and
    the student's imitation loss on all of them before and after the round's fit."""
    import torch

    from grpo_ctrl.policy import GaussianPolicy
    from grpo_ctrl.randomize import default_randomization
    from grpo_ctrl.sim import BatchSim

    spec = teacher.spec
    torch.manual_seed(cfg.seed)
    student = GaussianPolicy(spec.nobs, spec.u_max, cfg.hidden, cfg.layers, "relu")
    if hasattr(teacher, "obs_mean"):  # a trained policy: its normaliser
        with torch.no_grad():
            student.obs_norm.mean.copy_(teacher.obs_mean.double())
            student.obs_norm.var.copy_((1.0 / teacher.obs_inv_std.double()) ** 2)
            student.obs_norm.count = 1e9
    else:
        sim = BatchSim(spec.system, 4096, spec.preset, seed=cfg.seed)
        student.obs_norm.update(torch.from_numpy(sim.reset().copy()))
    student.refresh_norm()
    opt = torch.optim.Adam(student.net.parameters(), lr=cfg.lr)
    rng = np.random.default_rng(cfg.seed)
    xs, ys, history = [], [], []
    start, rnd = time.monotonic(), 0
    randomize = default_randomization(spec.system, spec.preset)
    steps = BatchSim(spec.system, 1, spec.preset).model.max_steps
    while True:
        beta = 0.5 ** rnd
        sim = BatchSim(spec.system, cfg.envs, spec.preset, seed=cfg.seed + 1000 * (rnd + 1),
                       randomize=randomize)
        obs = sim.reset().copy()
        with_teacher = rng.random(cfg.envs) < beta
        with torch.no_grad():
            for t in range(steps):
                o = torch.from_numpy(obs)
                u_t = teacher(o).reshape(-1)
                if t % cfg.stride == 0:
                    xs.append(o.clone())
                    ys.append(u_t.clone())
                u_s = student.command(student.normalise(o))
                u = torch.where(torch.from_numpy(with_teacher), u_t, u_s)
                obs = sim.step(u.numpy().astype(np.float32))[0].copy()
        x, y = torch.cat(xs), torch.cat(ys)

        def imitation_loss(rows=slice(None)):  # of u_max squared
            u_s = student.command(student.normalise(x[rows]))
            return ((u_s - y[rows]) ** 2).mean() / spec.u_max ** 2

        with torch.no_grad():
            before = imitation_loss().item()
        for _ in range(cfg.steps):
            loss = imitation_loss(torch.randint(0, len(x), (cfg.batch,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            after = imitation_loss().item()
        rnd += 1
        history.append((beta, len(x), before, after))
        log(f"round {rnd}: teacher's share {beta:.3g}, {len(x)} states, loss on them "
            f"{before:.3g} -> {after:.3g} (of u_max squared), {time.monotonic() - start:.0f} s")
        if (rnd >= cfg.rounds if cfg.rounds else time.monotonic() - start >= cfg.time_budget):
            return student, history


def save_run(student, spec, cfg: DistillConfig, teacher_source: str, out: Path) -> Path:
    """``out`` as a run folder: config.toml and the deployed checkpoint."""
    from dataclasses import asdict

    from grpo_ctrl.policy import save_policy_run

    config = {"hidden": cfg.hidden, "layers": cfg.layers, "features": 0,
              "activation": "relu"}
    return save_policy_run(out, student, spec, config,
                           {"distilled_from": teacher_source,
                            **{f"distill_{k}": v for k, v in asdict(cfg).items()}},
                           {"distilled_from": teacher_source})


# ---------------------------------------------------------------- the command
def add_arguments(p: argparse.ArgumentParser) -> None:
    from grpo_ctrl.fit import BOARD_OF

    p.add_argument("teacher", help="run folder, checkpoint file or baseline (lqr, swingup-lqr) "
                                   "to imitate")
    p.add_argument("--system", help="plant of a baseline teacher")
    p.add_argument("--preset", help="preset of a baseline teacher's plant")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--fit", choices=list(BOARD_OF),
                   help="the student's size chosen for the board as train --fit chooses it")
    p.add_argument("--hidden", type=number(int, 1, 4096), help="student's hidden width")
    p.add_argument("--layers", type=number(int, 1, 16), help="student's hidden layers")
    p.add_argument("--time-budget", type=number(float, 1.0, 1e7), default=120.0,
                   metavar="S", help="seconds of distillation (default 120)")
    p.add_argument("--seed", type=number(int, 0, 2**31 - 1), default=0)


def run(args) -> int:
    from grpo_ctrl.controller import load_controller
    from grpo_ctrl.fit import choose

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {args.out!r} exists and is not an empty folder")
    teacher = load_controller(args.teacher, args.system, args.preset)
    spec = teacher.spec
    if args.fit:
        choice = choose(args.fit, spec.system, spec.preset, args.hidden or 64, args.layers or 2,
                        exact=args.hidden is not None or args.layers is not None)
        hidden, layers = choice.network.hidden, choice.network.layers
        print(f"fit {choice.board}: {choice.network.describe(spec.nobs)}, on-device tick "
              f"{choice.cycles:,.0f} of {choice.budget:,.0f} cycles", flush=True)
    else:
        if args.hidden is None or args.layers is None:
            raise UserError("give the student's size: --fit uno|m4, or --hidden H --layers L")
        hidden, layers = args.hidden, args.layers
    cfg = DistillConfig(hidden=hidden, layers=layers, time_budget=args.time_budget,
                        seed=args.seed)
    student, history = distill(teacher, cfg)
    path = save_run(student, spec, cfg, args.teacher, out)
    print(f"distilled {args.teacher} into {spec.nobs}-{'-'.join([str(hidden)] * layers)}-1 in "
          f"{len(history)} rounds (final loss {history[-1][3]:.3g} of u_max squared): {path}; "
          f"evaluate with grpo-ctrl eval {out} --against {args.teacher}")
    return 0
