#!/usr/bin/env python3
"""The GRPO design studies of docs/grpo.md, on the gym pendulum.

* continuation: which branch a trajectory continues from (greedy, softmax,
  random, policy), the other settings at their defaults;
* advantages: group, batch or no std scaling; outcome or per-step reward-to-go;
* trust region: fixed clipping against the adaptive clip range.

Every variant trains from the same seeds for the same number of iterations
(iterations, not seconds, so the comparison does not depend on what else
the shared machine runs; every variant costs the same per iteration). The
curve is the in-training evaluation (deterministic policy, 100 fixed C
simulator episodes); the final policy is then scored on Gymnasium's own
Pendulum-v1 over 100 episodes. Prints markdown tables and writes PNG plots.

    python benchmarks/study_grpo.py --seeds 3 --iterations 300 --png-dir docs
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

from grpo_ctrl.closed_loop import evaluate_on_gym, evaluate_on_sim  # noqa: E402
from grpo_ctrl.grpo_config import default_config  # noqa: E402
from grpo_ctrl.train import train  # noqa: E402

THRESHOLD = {("pendulum", "gym"): -160.0, ("furuta", "qube-servo2"): -1500.0,
             ("cartpole", "swingup"): -500.0}
YLIM = {("pendulum", "gym"): (-600, -100)}
STUDIES = {
    "continuation": [("greedy", {"continuation": "greedy"}), ("softmax", {"continuation": "softmax"}),
                     ("random", {"continuation": "random"}), ("policy", {"continuation": "policy"})],
    "advantages": [("outcome, group std", {}), ("outcome, batch std", {"adv_scale": "batch"}),
                   ("outcome, no scaling", {"adv_scale": "none"}),
                   ("reward-to-go, group std", {"reward_form": "reward_to_go"})],
    "trust_region": [("fixed clip, 1 epoch", {"trust_region": "fixed"}),
                     ("adaptive clip, 1 epoch", {"trust_region": "adaptive"}),
                     ("fixed clip, 4 epochs", {"trust_region": "fixed", "epochs": 4}),
                     ("adaptive clip, 4 epochs", {"trust_region": "adaptive", "epochs": 4})],
}


def one_run(plant: tuple[str, str], overrides: dict, seed: int, iterations: int,
            eval_every_it: int) -> dict:
    cfg = default_config(*plant)
    cfg.seed, cfg.iterations, cfg.time_budget = seed, iterations, 0.0
    cfg.eval_every = 1e9  # evaluations below, every eval_every_it iterations
    for k, v in overrides.items():
        setattr(cfg, k, v)
    curve = []

    def on_iteration(trainer, row):
        if trainer.iteration % eval_every_it == 0:
            curve.append((trainer.iteration, trainer.evaluate()[0]))

    t = time.perf_counter()
    summary = train(*plant, cfg, None, progress=False, on_iteration=on_iteration)
    wall = time.perf_counter() - t
    tr = summary["trainer"]
    ctrl = tr.policy.controller(tr.spec)
    final = (evaluate_on_gym(ctrl, 100, seed=0) if plant == ("pendulum", "gym")
             else evaluate_on_sim(ctrl, 100, seed=0))
    first = next((it for it, r in curve if r >= THRESHOLD.get(plant, np.inf)), None)
    return {"curve": curve, "final": final["mean"], "success": final["success"],
            "best_curve": max(r for _, r in curve), "it_to_threshold": first, "wall": wall}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system", default="pendulum")
    p.add_argument("--preset", default="gym")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=10, help="iterations between evaluations")
    p.add_argument("--study", choices=list(STUDIES), action="append")
    p.add_argument("--png-dir", default=None, help="write [PLANT-]STUDY.png plots here")
    args = p.parse_args(argv)
    plant = (args.system, args.preset)
    gym = plant == ("pendulum", "gym")
    threshold = THRESHOLD.get(plant)
    cfg = default_config(*plant)
    steps = cfg.num_starts * cfg.group_size * cfg.horizon * cfg.action_repeat
    for study in args.study or list(STUDIES):
        print(f"\n## {study}, {args.system}/{args.preset}: {args.seeds} seeds x "
              f"{args.iterations} iterations (~{args.iterations * steps / 1e6:.1f} M simulator "
              "steps each)\n")
        where = "Gymnasium" if gym else "C simulator"
        print(f"| variant | {where} return, final policy (mean ± sd over seeds) | success | "
              f"best in-training eval | iterations to {threshold:g} (median) |")
        print("|---|---|---|---|---|")
        results = {}
        for name, overrides in STUDIES[study]:
            runs = [one_run(plant, overrides, s, args.iterations, args.eval_every)
                    for s in range(args.seeds)]
            results[name] = runs
            g = np.array([r["final"] for r in runs])
            b = np.array([r["best_curve"] for r in runs])
            its = [r["it_to_threshold"] for r in runs]
            reached = [i for i in its if i is not None]
            med = f"{np.median(reached):.0f}" if len(reached) == len(its) else \
                f"{len(reached)}/{len(its)} reached"
            success = np.mean([r["success"] for r in runs])
            print(f"| {name} | {g.mean():.1f} ± {g.std():.1f} | {100 * success:.0f} % | "
                  f"{b.mean():.1f} | {med} |", flush=True)
        if args.png_dir:
            prefix = "" if gym else f"{args.system}-"
            plot(results, plant, study, os.path.join(args.png_dir, f"{prefix}{study}.png"))
    return 0


def plot(results: dict, plant, study: str, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (name, runs), color in zip(results.items(), colors):
        its = np.array([it for it, _ in runs[0]["curve"]])
        ys = np.array([[r for _, r in run["curve"]] for run in runs])
        ax.plot(its, ys.mean(0), color=color, label=name)
        ax.fill_between(its, ys.min(0), ys.max(0), color=color, alpha=0.15)
    if plant in YLIM:
        ax.set_ylim(*YLIM[plant])
    if plant in THRESHOLD:
        ax.axhline(THRESHOLD[plant], color="k", lw=0.6, ls=":")
    ax.set_xlabel("iteration")
    ax.set_ylabel("return, deterministic policy")
    ax.set_title(f"{plant[0]}/{plant[1]}: {study.replace('_', ' ')} (mean, min-max over seeds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
