"""``grpo-ctrl eval``: score a trained run or a baseline controller.

On the held-out episodes of ``grpo_ctrl.heldout`` by default: 1,000 fixed
start states from seeds 10000 on (for the gym pendulum, Gymnasium's own
Pendulum-v1 resets), stepped in the C simulator, mean +- standard error;
``--against`` another controller prints the paired difference on the same
episodes. With ``--gym`` the episodes step in Gymnasium itself (slower, the
same numbers). Trained policies act with their deterministic (mean) action,
the deployed controller. Success: never terminated, and upright and still at
the end (``grpo_ctrl.baselines.evaluate.upright_and_still``).
"""
from __future__ import annotations

import argparse

import numpy as np

from grpo_ctrl.controller import BASELINES, OPTIMUM, load_controller
from grpo_ctrl.errors import UserError
from grpo_ctrl.heldout import HELDOUT_EPISODES, HELDOUT_SEED, Score, format_difference, score


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", help="run folder (its best checkpoint) or checkpoint file")
    p.add_argument("--controller", choices=(*BASELINES, OPTIMUM),
                   help="evaluate a baseline (or the pendulum's dynamic-programming optimum) "
                        "instead of a run (needs --system)")
    p.add_argument("--system", help="plant of the baseline: pendulum, cartpole or furuta")
    p.add_argument("--preset", help="preset of the baseline's plant")
    p.add_argument("--episodes", type=int, default=HELDOUT_EPISODES,
                   help=f"episodes (default {HELDOUT_EPISODES})")
    p.add_argument("--seed", type=int, default=HELDOUT_SEED,
                   help=f"seed of the first episode's start state (default {HELDOUT_SEED}, "
                        "away from the seeds training evaluates on)")
    p.add_argument("--against", metavar="RUN|BASELINE",
                   help="also score this run, checkpoint, baseline or 'optimum' on the same "
                        "episodes and print the paired difference")
    p.add_argument("--gym", action="store_true",
                   help="evaluate on Gymnasium's Pendulum-v1 (pendulum/gym controllers only)")


def evaluate_on_sim(controller, episodes: int = HELDOUT_EPISODES,
                    seed: int = HELDOUT_SEED) -> Score:
    """Scores on the held-out episodes, stepped in the C simulator."""
    return score(controller, episodes, seed)


def evaluate_on_gym(controller, episodes: int = HELDOUT_EPISODES,
                    seed: int = HELDOUT_SEED) -> Score:
    """Scores on Gymnasium's own Pendulum-v1: episode i is reset with seed
    ``seed + i``; all episodes step in lockstep so each control step is one
    batched forward pass."""
    from grpo_ctrl.baselines.evaluate import evaluate_on_gymnasium_pendulum
    spec = controller.spec
    if (spec.system, spec.preset) != ("pendulum", "gym"):
        raise UserError(f"--gym evaluates on Gymnasium's Pendulum-v1, which is the pendulum/gym "
                        f"preset; this controller is for {spec.system}/{spec.preset}")
    ep = evaluate_on_gymnasium_pendulum(controller, episodes, seed=seed)
    return Score(ep.returns, ep.success, seed)


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
    if args.against:
        other = load_controller(args.against, spec.system, args.preset or spec.preset)
        if (other.spec.system, other.spec.preset) != (spec.system, spec.preset):
            raise UserError(f"--against {args.against} is for {other.spec.system}/"
                            f"{other.spec.preset}, not {spec.system}/{spec.preset}: a paired "
                            "comparison needs the same plant")
    where = ("Gymnasium Pendulum-v1" if args.gym else
             f"C simulator {spec.system}/{spec.preset}")
    evaluate = evaluate_on_gym if args.gym else evaluate_on_sim
    result = evaluate(controller, args.episodes, args.seed)
    name = args.run or args.controller
    print(f"{name} on {where}, {result.returns.size} held-out episodes (seeds {args.seed} to "
          f"{args.seed + args.episodes - 1}), deterministic action:")
    print(f"  mean return   {result.mean:10.2f}  (s.e. {result.se:.2f})\n"
          f"  median return {np.median(result.returns):10.2f}\n"
          f"  worst return  {result.returns.min():10.2f}\n"
          f"  success       {100 * result.success.mean():9.1f} %  (upright and still at the end)")
    if args.against:
        o = evaluate(other, args.episodes, args.seed)
        print(f"  {args.against} on the same episodes: {o.mean:.2f} (s.e. {o.se:.2f}); "
              f"{name} - {args.against} (paired): {format_difference(result.minus(o))}")
    return 0
