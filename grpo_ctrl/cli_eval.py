"""``grpo-ctrl eval``: score a trained run or a baseline controller.

On the C simulator (batched, every episode at once) by default; with
``--gym`` on Gymnasium's own ``Pendulum-v1``, so the numbers compare with
published ones. Trained policies act with their deterministic (mean) action,
the deployed controller. Success: never terminated, and upright and still at
the end (``grpo_ctrl.closed_loop.upright_and_still``). Smoothness:
mean |du| / u_max per step, and the share of steps where du changes sign.
``--robustness`` runs the robustness benchmark (``grpo_ctrl.robustness``) on
one or more runs and baselines of one plant, in one table.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from grpo_ctrl.baselines import BASELINES
from grpo_ctrl.closed_loop import evaluate_on_gym, evaluate_on_sim
from grpo_ctrl.controller import load_controller
from grpo_ctrl.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="*", help="run folder (its best checkpoint) or checkpoint file "
                   "(several with --robustness)")
    p.add_argument("--controller", choices=BASELINES,
                   help="evaluate a baseline instead of a run (needs --system; with "
                        "--robustness: alongside the runs)")
    p.add_argument("--system", help="plant of the baseline: pendulum, cartpole or furuta")
    p.add_argument("--preset", help="preset of the baseline's plant")
    p.add_argument("--episodes", type=int, help="episodes (default 100; with --robustness: "
                   "per grid point, default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the start states (default 0)")
    p.add_argument("--gym", action="store_true",
                   help="evaluate on Gymnasium's Pendulum-v1 (pendulum/gym controllers only)")
    p.add_argument("--robustness", action="store_true",
                   help="the robustness benchmark: success under parameter, delay, noise, motor "
                        "and push perturbations, a table and a PNG (docs/robustness.md); "
                        "--episodes per grid point (default 20), 10x that in the realistic row")
    p.add_argument("--out", help="folder for the robustness table, JSON and PNG (default: the "
                                 "first run's folder, else robustness-SYSTEM-PRESET)")


def resolve_controllers(args) -> dict:
    """{name: controller} of the RUNs and the baseline named."""
    if len(args.run) > 1 and not args.robustness:
        raise UserError("name one RUN (several only with --robustness)")
    if args.controller and args.run and not args.robustness:
        raise UserError("give either a RUN or --controller, not both")
    if not args.run and not args.controller:
        raise UserError("name a RUN folder or checkpoint, or a baseline with --controller "
                        "lqr|swingup-lqr --system S")
    controllers = {Path(run).name or run: load_controller(run) for run in args.run}
    if args.controller:
        first = next(iter(controllers.values()), None)
        system = args.system or (first.spec.system if first else None)
        preset = args.preset or (first.spec.preset if first else None)
        if not system:
            raise UserError(f"--controller {args.controller} needs --system "
                            "pendulum|cartpole|furuta")
        controllers[args.controller] = load_controller(args.controller, system, preset)
    plants = {(c.spec.system, c.spec.preset) for c in controllers.values()}
    if len(plants) > 1:
        raise UserError(f"the controllers are for different plants {sorted(plants)}; compare "
                        "controllers of one plant")
    return controllers


def run_robustness(controllers: dict, args) -> int:
    from grpo_ctrl import robustness
    spec = next(iter(controllers.values())).spec
    episodes = args.episodes or 20
    out = Path(args.out) if args.out else (
        Path(args.run[0]) / "robustness" if args.run and Path(args.run[0]).is_dir()
        else Path(f"robustness-{spec.system}-{spec.preset}"))
    results = {}
    for name, controller in controllers.items():
        print(f"robustness of {name} on {spec.system}/{spec.preset}: {episodes} episodes per "
              f"grid point, {10 * episodes} in the realistic row ...", flush=True)
        results[name] = robustness.benchmark(controller, episodes, 10 * episodes)
        # after each controller, so a long comparison leaves what it measured
        text = robustness.write_results(results, out, f"robustness, {spec.system}/{spec.preset}")
    print(text + f"\nwritten: {out}/robustness.md, robustness.json, robustness.png")
    return 0


def run(args) -> int:
    if args.episodes is not None and args.episodes < 1:
        raise UserError(f"--episodes must be positive, got {args.episodes}")
    if args.robustness and args.gym:
        raise UserError("--robustness runs on the C simulator; drop --gym")
    controllers = resolve_controllers(args)
    if args.robustness:
        return run_robustness(controllers, args)
    name, controller = next(iter(controllers.items()))
    spec = controller.spec
    where = "Gymnasium Pendulum-v1" if args.gym else f"C simulator {spec.system}/{spec.preset}"
    s = (evaluate_on_gym if args.gym else evaluate_on_sim)(controller, args.episodes or 100,
                                                           args.seed)
    print(f"{name} on {where}, {s['episodes']} episodes (seed {args.seed}), deterministic action:")
    print(f"  mean return   {s['mean']:10.2f}\n  median return {s['median']:10.2f}\n"
          f"  worst return  {s['worst']:10.2f}\n  success       {100 * s['success']:9.1f} %  "
          "(upright and still at the end)")
    if "du_mean" in s:
        print(f"  mean |du|/u_max {s['du_mean']:8.4f}   per step\n"
              f"  du sign changes {100 * s['du_sign_changes']:7.1f} %  of steps (chatter)")
    return 0
