"""``grpo-ctrl eval``: score a trained run or a baseline controller.

On the C simulator (batched, every episode at once) by default; with
``--gym`` on Gymnasium's own ``Pendulum-v1``, so the numbers compare with
published ones. Trained policies act with their deterministic (mean) action,
the deployed controller. Success: never terminated, and upright and still at
the end (``grpo_ctrl.closed_loop.upright_and_still``).
"""
from __future__ import annotations

import argparse

from grpo_ctrl.baselines import BASELINES
from grpo_ctrl.closed_loop import evaluate_on_gym, evaluate_on_sim
from grpo_ctrl.controller import load_controller
from grpo_ctrl.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", help="run folder (its best checkpoint) or checkpoint file")
    p.add_argument("--controller", choices=BASELINES,
                   help="evaluate a baseline instead of a run (needs --system)")
    p.add_argument("--system", help="plant of the baseline: pendulum, cartpole or furuta")
    p.add_argument("--preset", help="preset of the baseline's plant")
    p.add_argument("--episodes", type=int, default=100, help="episodes (default 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of the start states (default 0)")
    p.add_argument("--gym", action="store_true",
                   help="evaluate on Gymnasium's Pendulum-v1 (pendulum/gym controllers only)")


def resolve_controller(args):
    if args.controller:
        if args.run:
            raise UserError("give either a RUN or --controller, not both")
        if not args.system:
            raise UserError(f"--controller {args.controller} needs --system "
                            "pendulum|cartpole|furuta")
        return load_controller(args.controller, args.system, args.preset)
    if not args.run:
        raise UserError("name a RUN folder or checkpoint, or a baseline with --controller "
                        "lqr|swingup-lqr --system S")
    return load_controller(args.run)


def run(args) -> int:
    if args.episodes < 1:
        raise UserError(f"--episodes must be positive, got {args.episodes}")
    controller = resolve_controller(args)
    spec = controller.spec
    where = "Gymnasium Pendulum-v1" if args.gym else f"C simulator {spec.system}/{spec.preset}"
    s = (evaluate_on_gym if args.gym else evaluate_on_sim)(controller, args.episodes, args.seed)
    name = args.run or args.controller
    print(f"{name} on {where}, {s['episodes']} episodes (seed {args.seed}), deterministic action:")
    print(f"  mean return   {s['mean']:10.2f}\n  median return {s['median']:10.2f}\n"
          f"  worst return  {s['worst']:10.2f}\n  success       {100 * s['success']:9.1f} %  "
          "(upright and still at the end)")
    return 0
