#!/usr/bin/env python3
"""The GRPO design studies of docs/grpo.md, on the gym pendulum.

* continuation: which branch a trajectory continues from (greedy, softmax,
  random, policy), the other settings at their defaults;
* advantages: group, batch or no std scaling; outcome or per-step reward-to-go;
* trust region: the fixed clip, the adaptive clip, and the per-sample
  surrogates of grpo_ctrl/trust_region.py (SAPO, CISPO, DCPO, KL mask);
* gap: what holds GRPO below the dynamic-programming optimum (horizon and
  discount, the start-state mix, capacity).

Every variant trains from the same seeds for the same number of iterations
(iterations, not seconds, so the comparison does not depend on what else
the shared machine runs; the wall time per run is printed too, since the
variants do not all cost the same per iteration). The curve is the
in-training evaluation (deterministic policy, 100 fixed C simulator
episodes); the final policy is then scored on the held-out episodes of
grpo_ctrl.heldout (1,000 by default; for the gym pendulum, Gymnasium's own
starts) and, on the gym pendulum, paired against the optimum on the same
episodes. Prints markdown tables (mean +- standard error over training
seeds) and writes PNG plots.

    python benchmarks/study_grpo.py --seeds 3 --iterations 300 --png-dir docs
    python benchmarks/study_grpo.py --study gap --seeds 3 --iterations 800
    python benchmarks/study_grpo.py --system furuta --preset qube-servo2 \
        --study trust_region_4_epochs --seeds 5 --iterations 200
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

from grpo_ctrl.heldout import HELDOUT_EPISODES, near_hanging, score, standard_error  # noqa: E402
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
    "trust_region_4_epochs": [(rule, {"trust_region": rule, "epochs": 4}) for rule in
                              ("fixed", "adaptive", "sapo", "cispo", "dcpo", "kl_mask")],
    "gap": [("default (H 64, L 32, gamma 0.98)", {}),
            ("H 128, L 64, gamma 0.99", {"horizon": 128, "loss_steps": 64, "gamma": 0.99}),
            ("reset_prob 0.3", {"reset_prob": 0.3}),
            ("hidden 128", {"hidden": 128})],
    # the gap sits on hanging-down starts: weigh the groups by their spread, or look further
    "gap_weighting": [("advantages not scaled (Dr. GRPO)", {"adv_scale": "none"}),
                      ("advantages scaled by the batch std", {"adv_scale": "batch"}),
                      ("gamma 0.99", {"gamma": 0.99})],
    # a longer look-ahead (study_objective.py: gamma 0.98 alone costs 2.9) needs unscaled advantages
    "look_ahead": [("gamma 0.99, group std", {"gamma": 0.99}),
                   ("gamma 0.99, no scaling", {"gamma": 0.99, "adv_scale": "none"}),
                   ("action repeat 2, group std", {"action_repeat": 2}),
                   ("action repeat 2, no scaling", {"action_repeat": 2, "adv_scale": "none"}),
                   ("H 96, gamma 0.99, no scaling", {"horizon": 96, "gamma": 0.99,
                                                     "adv_scale": "none"})],
}


def one_run(plant: tuple[str, str], overrides: dict, seed: int, iterations: int,
            eval_every_it: int, episodes: int) -> dict:
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
    final = score(tr.policy.controller(tr.spec), episodes)
    first = next((it for it, r in curve if r >= THRESHOLD.get(plant, np.inf)), None)
    return {"curve": curve, "final": final, "best_curve": max(r for _, r in curve),
            "it_to_threshold": first, "wall": wall}


def mean_se(x) -> str:
    return f"{np.mean(x):.1f} ± {standard_error(x):.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system", default="pendulum")
    p.add_argument("--preset", default="gym")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=10, help="iterations between evaluations")
    p.add_argument("--episodes", type=int, default=HELDOUT_EPISODES,
                   help="held-out episodes scoring each final policy")
    p.add_argument("--study", choices=list(STUDIES), action="append")
    p.add_argument("--only", action="append", metavar="VARIANT",
                   help="run only these variants of the studies (repeatable)")
    p.add_argument("--png-dir", default=None, help="write [PLANT-]STUDY.png plots here")
    p.add_argument("--plot-gaps", nargs="+", metavar="PNG TABLE",
                   help="instead of training: draw the per-seed paired gaps to the optimum of "
                        "the printed tables TABLE... (gym pendulum studies) into PNG")
    args = p.parse_args(argv)
    if args.plot_gaps:
        plot_gaps(args.plot_gaps[1:], args.plot_gaps[0])
        return 0
    plant = (args.system, args.preset)
    gym = plant == ("pendulum", "gym")
    threshold = THRESHOLD.get(plant)
    cfg = default_config(*plant)
    steps = cfg.num_starts * cfg.group_size * cfg.horizon * cfg.action_repeat
    optimum = None
    if gym:
        from grpo_ctrl.baselines.optimum import make_optimum
        optimum = score(make_optimum("pendulum", "gym"), args.episodes)
        hanging = near_hanging("pendulum", "gym", args.episodes)  # half the gap (§8)
    for study in args.study or list(STUDIES):
        print(f"\n## {study}, {args.system}/{args.preset}: {args.seeds} seeds x "
              f"{args.iterations} iterations (~{args.iterations * steps / 1e6:.1f} M simulator "
              f"steps each at the defaults), final policy on {args.episodes} held-out episodes\n")
        gap = (" | final - optimum, paired (per seed) | of it, on hanging starts "
               "(1/5 of the episodes)") if gym else ""
        print(f"| variant | return, final policy (mean ± s.e. over seeds){gap} | success | "
              f"best in-training eval | iterations to {threshold:g} (median) | wall s per run |")
        print("|---|---|---|---|---|---|" + ("---|---|" if gym else ""))
        results = {}
        for name, overrides in STUDIES[study]:
            if args.only and name not in args.only:
                continue
            runs = [one_run(plant, overrides, s, args.iterations, args.eval_every, args.episodes)
                    for s in range(args.seeds)]
            results[name] = runs
            g = [r["final"].mean for r in runs]
            b = [r["best_curve"] for r in runs]
            its = [r["it_to_threshold"] for r in runs]
            reached = [i for i in its if i is not None]
            med = f"{np.median(reached):.0f}" if len(reached) == len(its) else \
                f"{len(reached)}/{len(its)} reached"
            success = np.mean([r["final"].success.mean() for r in runs])
            paired = ""
            if gym:
                d = [r["final"].minus(optimum) for r in runs]
                hang = [(r["final"].returns - optimum.returns)[hanging].mean() for r in runs]
                paired = (f" {mean_se([m for m, _ in d])} ("
                          + ", ".join(f"{m:+.1f} ± {e:.1f}" for m, e in d) + f") | {mean_se(hang)} |")
            print(f"| {name} | {mean_se(g)} |{paired} {100 * success:.0f} % | {np.mean(b):.1f} | "
                  f"{med} | {np.mean([r['wall'] for r in runs]):.0f} |", flush=True)
            if args.png_dir:  # after every variant: a run cut short keeps its plot
                prefix = "" if gym else f"{args.system}-"
                plot(results, plant, study, os.path.join(args.png_dir, f"{prefix}{study}.png"))
    return 0


def plot_gaps(tables: list[str], path: str) -> None:
    """Per-seed paired gaps (final - optimum, with their s.e.) read back from
    the markdown rows this script prints, one row of points per variant."""
    import re
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = []
    for table in tables:
        for line in open(table):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 3 and "(" in cells[2] and "±" in cells[2]:
                per_seed = re.findall(r"([-+][\d.]+) ± ([\d.]+)", cells[2].split("(", 1)[1])
                rows.append((cells[0], [(float(m), float(e)) for m, e in per_seed]))
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.2))
    for k, (name, seeds) in enumerate(rows):
        for j, (m, e) in enumerate(seeds):
            ax.errorbar(m, k + 0.12 * (j - (len(seeds) - 1) / 2), xerr=2 * e, fmt="o", ms=4,
                        color="C0", ecolor="C0", elinewidth=1)
        ax.plot(np.mean([m for m, _ in seeds]), k, "|", ms=16, color="k")
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    ax.invert_yaxis()
    if min(m for _, seeds in rows for m, _ in seeds) < -100:  # a failed variant: keep the rest readable
        ax.set_xscale("symlog", linthresh=20)
    ax.axvline(0, color="k", lw=0.6, ls=":")
    ax.set_xlabel("final policy - optimum, paired on held-out episodes\n"
                  "(dots: seeds, ± 2 s.e.; bar: mean over seeds)")
    fig.tight_layout()
    from grpo_ctrl.files import save_figure
    save_figure(fig, path)
    plt.close(fig)


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
