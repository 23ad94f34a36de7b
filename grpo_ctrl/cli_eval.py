"""``grpo-ctrl eval``: score a trained run or a baseline controller.

On the held-out episodes of ``grpo_ctrl.heldout`` by default: 1,000 fixed
start states from seeds 10000 on (for the gym pendulum, Gymnasium's own
Pendulum-v1 resets), stepped in the C simulator (batched), mean +- standard
error; ``--against`` another controller prints the paired difference on the
same episodes. With ``--gym`` the episodes step in Gymnasium itself. Trained policies act with their deterministic (mean) action,
the deployed controller. Success: never terminated, and upright and still at
the end (``grpo_ctrl.closed_loop.upright_and_still``). Smoothness:
mean |du| / u_max per step, and the share of steps where du changes sign.
``--robustness`` runs the robustness benchmark (``grpo_ctrl.robustness``) on
one or more runs and baselines of one plant, in one table. ``--score realaigym``
and ``--robustness realaigym`` score pendulum/realaigym controllers as RealAIGym's
leaderboards do (``grpo_ctrl.realaigym``, docs/realaigym.md), and double_pendulum
controllers by its simulation v2 and robustness v2 (``grpo_ctrl.realaigym_double``,
docs/double_pendulum.md).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from grpo_ctrl import cli_video, render
from grpo_ctrl.baselines import BASELINES
from grpo_ctrl.closed_loop import evaluate_on_gymnasium_pendulum, summarise
from grpo_ctrl.controller import OPTIMUM, load_controller
from grpo_ctrl.errors import UserError
from grpo_ctrl.heldout import HELDOUT_EPISODES, HELDOUT_SEED, Score, format_difference
from grpo_ctrl.heldout import run as run_heldout
from grpo_ctrl.option_types import MAX_EPISODES, number, positive_int, seed


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="*", help="run folder (its deployed checkpoint) or checkpoint file "
                   "(several with --robustness)")
    p.add_argument("--controller", choices=(*BASELINES, OPTIMUM),
                   help="evaluate a baseline instead of a run (needs --system; with "
                        "--robustness: alongside the runs)")
    p.add_argument("--system", help="plant of the baseline: pendulum, cartpole or furuta")
    p.add_argument("--preset", help="preset of the baseline's plant")
    p.add_argument("--episodes", type=positive_int(MAX_EPISODES), help=f"episodes (default "
                   f"{HELDOUT_EPISODES}; with --robustness: per grid point, default 20)")
    p.add_argument("--seed", type=seed, default=HELDOUT_SEED,
                   help=f"seed of the first episode's start state (default {HELDOUT_SEED}, "
                        "away from the starts training selects deployed.pt on)")
    p.add_argument("--against", metavar="RUN|BASELINE",
                   help="also score this run, checkpoint, baseline or 'optimum' on the same "
                        "episodes and print the paired difference")
    p.add_argument("--gym", action="store_true",
                   help="evaluate on Gymnasium's Pendulum-v1 (pendulum/gym controllers only)")
    p.add_argument("--score", choices=("realaigym",),
                   help="realaigym: RealAIGym's RealAI score of one run from hanging at rest, "
                        "each criterion beside their entries (pendulum/realaigym, "
                        "docs/realaigym.md; double_pendulum: simulation v2, "
                        "docs/double_pendulum.md)")
    p.add_argument("--robustness", nargs="?", const=True, default=False, metavar="realaigym",
                   help="the robustness benchmark: success under parameter, delay, noise, motor "
                        "and push perturbations, a table and a PNG (docs/robustness.md); "
                        "'--robustness realaigym': RealAIGym's four categories instead "
                        "(double_pendulum: robustness v2's six); "
                        "--episodes per grid point (default 20), 10x that in the realistic row")
    p.add_argument("--estimator", type=number(float, above=0.0, high=1e5, unit=" Hz"),
                   metavar="HZ",
                   help="with --score / --robustness realaigym on the double pendulum: the "
                        "controller acts on the model estimate of the state (the measured angles, "
                        "velocities from the plant's model corrected at this bandwidth; as "
                        "`grpo-ctrl run --estimator`), not on the measured velocities; 20 "
                        "on RealAIGym's (docs/double_pendulum.md)")
    p.add_argument("--out", help="folder for the robustness table, JSON and PNG (default: the "
                                 "first run's folder, else robustness-SYSTEM-PRESET)")
    cli_video.add_eval_arguments(p)


def column_names(runs: list[str]) -> list[str]:
    """A short, distinct name per run: the folder's or file's name, with its
    parent folder where two would read alike (runs/a/latest.pt, runs/b/latest.pt)."""
    short = [Path(run).name or run for run in runs]
    return [f"{Path(run).parent.name}/{name}" if short.count(name) > 1 else name
            for run, name in zip(runs, short)]


def resolve_controllers(args) -> dict:
    """{name: controller} of the RUNs and the baseline named."""
    if len(args.run) > 1 and not args.robustness:
        raise UserError("name one RUN (several only with --robustness)")
    if args.controller and args.run and not args.robustness:
        raise UserError("give either a RUN or --controller, not both")
    if not args.run and not args.controller:
        raise UserError("name a RUN folder or checkpoint, or a baseline with --controller "
                        "lqr|swingup-lqr --system S")
    controllers = {name: load_controller(run) for name, run in zip(column_names(args.run), args.run)}
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


def run_realaigym_double(controllers: dict, args) -> int:
    """RealAIGym's double pendulum leaderboards: simulation v2 and robustness v2."""
    from grpo_ctrl import realaigym_double
    if args.episodes:
        raise UserError("RealAIGym's double pendulum benchmark fixes its runs (robustness v2: "
                        "722 of 10 s); drop --episodes")
    if args.estimator is not None:
        from grpo_ctrl.estimator import check_bandwidth
        check_bandwidth(args.estimator, next(iter(controllers.values())).spec.dt)
        print(f"the controllers act on the model estimate of the state, {args.estimator:g} Hz "
              "(--estimator)")
    if args.score:
        print(realaigym_double.score_table(controllers, args.estimator))
    if args.robustness:
        print(realaigym_double.robustness_table(controllers, args.seed, args.estimator))
    return 0


def run_realaigym(controllers: dict, args) -> int:
    from grpo_ctrl import realaigym
    if next(iter(controllers.values())).spec.system == "double_pendulum":
        return run_realaigym_double(controllers, args)
    if args.estimator is not None:
        raise UserError("--estimator scores the double pendulum's controllers; RealAIGym's "
                        "single pendulum benchmark measures the state itself: drop --estimator")
    realaigym.check_plant(controllers)
    if args.score:
        print(realaigym.score_table(controllers))
    if args.robustness:
        print(realaigym.robustness_table(controllers, args.episodes or 100, args.seed))
    return 0


def run(args) -> int:
    if isinstance(args.robustness, str) and args.robustness != "realaigym":
        # "--robustness RUN": the flag without its optional value, then a run
        args.run.insert(0, args.robustness)
        args.robustness = True
    if args.video:
        if args.robustness:
            raise UserError("--video draws episodes of one controller; drop --robustness")
        render.check_video_path(args.video)
    if args.estimator is not None and not (args.score or args.robustness == "realaigym"):
        raise UserError("--estimator goes with --score realaigym or --robustness realaigym on "
                        "the double pendulum; add one, or drop --estimator")
    if args.score or args.robustness == "realaigym":
        if args.gym:
            raise UserError("RealAIGym's benchmark runs on the C simulator; drop --gym")
        if args.robustness is True:
            raise UserError("--score realaigym goes with '--robustness realaigym', not ours")
        controllers = resolve_controllers(args)
        run_realaigym(controllers, args)
        if args.video:  # the held-out episodes, as without --score
            name, controller = next(iter(controllers.items()))
            cli_video.eval_video(controller, name, args)
        return 0
    if args.robustness and args.gym:
        raise UserError("--robustness runs on the C simulator; drop --gym")
    controllers = resolve_controllers(args)
    if args.robustness:
        return run_robustness(controllers, args)
    name, controller = next(iter(controllers.items()))
    spec = controller.spec
    other = None
    if args.against:
        other = load_controller(args.against, spec.system, args.preset or spec.preset)
        if (other.spec.system, other.spec.preset) != (spec.system, spec.preset):
            raise UserError(f"--against {args.against} is for {other.spec.system}/"
                            f"{other.spec.preset}, not {spec.system}/{spec.preset}: a paired "
                            "comparison needs the same plant")
    where = "Gymnasium Pendulum-v1" if args.gym else f"C simulator {spec.system}/{spec.preset}"
    if args.gym and (spec.system, spec.preset) != ("pendulum", "gym"):
        raise UserError(f"--gym evaluates on Gymnasium's Pendulum-v1, which is the pendulum/gym "
                        f"preset; this controller is for {spec.system}/{spec.preset}")
    episodes = args.episodes or HELDOUT_EPISODES
    runner = evaluate_on_gymnasium_pendulum if args.gym else run_heldout
    ep = runner(controller, episodes, args.seed)
    s = summarise(ep.returns, ep.success, ep.du_mean, ep.du_sign_changes)
    result = Score(ep.returns, ep.success, args.seed)
    print(f"{name} on {where}, {episodes} held-out episodes (seeds {args.seed} to "
          f"{args.seed + episodes - 1}), deterministic action:")
    print(f"  mean return   {s['mean']:10.2f}  (s.e. {result.se:.2f})\n"
          f"  median return {s['median']:10.2f}\n"
          f"  worst return  {s['worst']:10.2f}\n  success       {100 * s['success']:9.1f} %  "
          "(upright and still at the end)")
    if "du_mean" in s:
        print(f"  mean |du|/u_max {s['du_mean']:8.4f}   per step\n"
              f"  du sign changes {100 * s['du_sign_changes']:7.1f} %  of steps (chatter)")
    if other is not None:
        o = runner(other, episodes, args.seed)
        o = Score(o.returns, o.success, args.seed)
        print(f"  {args.against} on the same episodes: {o.mean:.2f} (s.e. {o.se:.2f}); "
              f"{name} - {args.against} (paired): {format_difference(result.minus(o))}")
    if args.video:
        cli_video.eval_video(controller, name, args)
    return 0
