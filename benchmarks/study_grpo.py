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

The trust-region comparison of docs/grpo.md §10 (Furuta, the rig): first the
per-iteration cost of each rule side by side (``--cost ROUNDS``), then one
run per rule and seed, each saved as it ends (``--record DIR``, queued one
process at a time), then the tables and plot of what was saved
(``--report DIR``): paired differences against the fixed clip on the same
held-out episodes, nominal and drawn plants.

    python benchmarks/study_grpo.py --system furuta --preset qube-servo2 --cost 14
    python benchmarks/study_grpo.py --system furuta --preset qube-servo2 --iterations 400 \
        --eval-every 50 --record runs/tr --seed-list 0 --only fixed
    python benchmarks/study_grpo.py --system furuta --preset qube-servo2 --report runs/tr \
        --png-dir docs

Every run trains without overlap (one core; the batch comes from the policy
it updates).
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

from grpo_ctrl.closed_loop import evaluate  # noqa: E402
from grpo_ctrl.heldout import (HELDOUT_EPISODES, HELDOUT_SEED, Score, near_hanging,  # noqa: E402
                               score, standard_error, start_states)
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
    cfg.overlap = False  # one core: the batch is collected by the policy it updates
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
    controller = tr.policy.controller(tr.spec)
    final = score(controller, episodes)
    # the same held-out seeds on plants drawn as in training (pushes and noise included)
    ep = evaluate(controller, episodes, seed=HELDOUT_SEED, randomize=tr.randomize)
    first = next((it for it, r in curve if r >= THRESHOLD.get(plant, np.inf)), None)
    return {"curve": curve, "final": final, "drawn": Score(ep.returns, ep.success, HELDOUT_SEED),
            "best_curve": max(r for _, r in curve), "it_to_threshold": first, "wall": wall,
            "iterations": tr.iteration}


def record_path(folder: str, plant, study: str, variant: str, seed: int) -> str:
    name = f"{plant[0]}-{plant[1]}-{study}-{variant}-s{seed}".replace(" ", "_").replace(",", "")
    return os.path.join(folder, name + ".npz")


def record_runs(plant, study: str, seeds: list[int], only, args) -> None:
    """One run per (variant, seed), seed by seed, each saved as soon as it is
    scored (a cut-short queue keeps what it finished; a run already saved is
    skipped): the curve, the held-out returns and successes, the wall time."""
    import io
    from grpo_ctrl.files import atomic_write
    for seed in seeds:
        for name, overrides in STUDIES[study]:
            path = record_path(args.record, plant, study, name, seed)
            if (only and name not in only) or os.path.exists(path):
                continue
            r = one_run(plant, overrides, seed, args.iterations, args.eval_every, args.episodes)
            buf = io.BytesIO()
            np.savez(buf, curve=np.array(r["curve"]), returns=r["final"].returns,
                     success=r["final"].success, drawn_returns=r["drawn"].returns,
                     drawn_success=r["drawn"].success, wall=r["wall"],
                     iterations=r["iterations"])
            atomic_write(path, buf.getvalue())
            print(f"{name} seed {seed}: {r['iterations']} it, {r['wall']:.0f} s; nominal "
                  f"{100 * r['final'].success.mean():.1f} % / {r['final'].mean:.1f}, drawn "
                  f"{100 * r['drawn'].success.mean():.1f} % / {r['drawn'].mean:.1f}", flush=True)


def report_runs(plant, study: str, folder: str, png: str | None) -> None:
    """Tables of the saved runs: per seed, mean ± s.e. over seeds, and each
    rule minus the first (the fixed clip) paired on the same held-out
    episodes and training seed, mean ± s.e. over the seeds both have."""
    runs = {}
    for name, _ in STUDIES[study]:
        got = {}
        for seed in range(100):
            path = record_path(folder, plant, study, name, seed)
            if os.path.exists(path):
                got[seed] = dict(np.load(path))
        if got:
            runs[name] = got
    if not runs:
        print(f"no saved runs of {study} for {plant[0]}/{plant[1]} in {folder}")
        return
    base_name = next(iter(runs))
    base = runs[base_name]
    seeds = sorted({s for got in runs.values() for s in got})
    eps = next(iter(base.values()))["returns"].size
    for key, what in (("", "nominal plant"), ("drawn_", "plants drawn as in training")):
        print(f"\n### {plant[0]}/{plant[1]}, {what}: {eps} held-out episodes, success / mean "
              f"return of the final policy\n")
        print("| rule | " + " | ".join(f"seed {s}" for s in seeds) + " |")
        print("|---|" + "---|" * len(seeds))
        for name, got in runs.items():
            cells = [f"{100 * got[s][key + 'success'].mean():.1f} % / "
                     f"{got[s][key + 'returns'].mean():.0f}" if s in got else "—" for s in seeds]
            print(f"| {name} | " + " | ".join(cells) + " |")
        print(f"\n| rule | seeds | success, mean ± s.e. over seeds | return | "
              f"success - {base_name}, paired | return - {base_name}, paired (per seed) |")
        print("|---|---|---|---|---|---|")
        for name, got in runs.items():
            succ = [100 * got[s][key + "success"].mean() for s in got]
            ret = [got[s][key + "returns"].mean() for s in got]
            both = [s for s in got if s in base]
            dsucc = [100 * (got[s][key + "success"].mean() - base[s][key + "success"].mean())
                     for s in both]
            dret = [Score(got[s][key + "returns"], got[s][key + "success"], 0).minus(
                Score(base[s][key + "returns"], base[s][key + "success"], 0)) for s in both]
            per_seed = ", ".join(f"{m:+.1f} ± {e:.1f}" for m, e in dret)
            paired = "—" if name == base_name else (
                f"{mean_se(dsucc, '+')} | {mean_se([m for m, _ in dret], '+')} ({per_seed})")
            print(f"| {name} | {len(got)} | {mean_se(succ)} | {mean_se(ret)} | {paired} |"
                  + (" — |" if name == base_name else ""))
    walls = {name: np.mean([float(r["wall"]) for r in got.values()]) for name, got in runs.items()}
    its = sorted({int(r["iterations"]) for got in runs.values() for r in got.values()})
    print(f"\niterations {its}; wall s per run (load-dependent, a rough guide): "
          + ", ".join(f"{n} {w:.0f}" for n, w in walls.items()))
    if png:
        plot_records(runs, plant, study, png)


def plot_records(runs: dict, plant, study: str, path: str) -> None:
    """Per-seed held-out success and return of each rule on drawn plants (dots),
    the mean over seeds (bar)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from grpo_ctrl.files import save_figure
    fig, axes = plt.subplots(1, 2, figsize=(9, 0.45 * len(runs) + 1.6), sharey=True)
    for ax, key, label in ((axes[0], "drawn_success", "success, %"),
                           (axes[1], "drawn_returns", "mean return")):
        for k, (name, got) in enumerate(runs.items()):
            ys = [(100 if key.endswith("success") else 1) * got[s][key].mean() for s in got]
            ax.plot(ys, k + 0.08 * (np.arange(len(ys)) - (len(ys) - 1) / 2), "o", ms=4,
                    color="C0")
            ax.plot(np.mean(ys), k, "|", ms=16, color="k")
        lo, hi = ax.get_xlim()
        if key == "drawn_returns" and lo < 3 * hi < 0:  # a failed rule: keep the rest readable
            ax.set_xscale("symlog", linthresh=-hi)
        ax.set_xlabel(f"{label}, final policy, held-out episodes\n(dots: seeds; bar: mean)")
    axes[0].set_yticks(range(len(runs)), list(runs))
    axes[0].invert_yaxis()
    fig.suptitle(f"{plant[0]}/{plant[1]}, drawn plants: {study.replace('_', ' ')}")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def iteration_cost(plant: tuple[str, str], rules: list[str], epochs: int, rounds: int,
                   seed: int = 0) -> None:
    """Per-iteration cost of each trust-region rule, side by side in this
    process: every round collects one batch, then runs each rule's update on
    that same batch from the same policy and optimiser state (the order
    rotates each round), so load on a shared machine hits all rules alike.
    Prints the median milliseconds and the ratios to the fixed clip, and the
    collection; an iteration without overlap costs collection + update."""
    import copy
    import torch
    from grpo_ctrl.grpo import Trainer, grpo_update
    cfg = default_config(*plant)
    cfg.seed, cfg.overlap, cfg.time_budget = seed, False, 0.0
    torch.set_num_threads(1)
    tr = Trainer(cfg, *plant)
    for _ in range(3):  # away from the first, unnormalised steps
        tr.step()
    variants = [(f"fixed, 1 epoch", "fixed", 1)] + [(f"{r}, {epochs} epochs", r, epochs)
                                                    for r in rules]
    ms = {name: [] for name, _, _ in variants}
    collect = []
    for k in range(rounds):
        t = time.perf_counter()
        batch = tr.rollout.collect(tr.policy, tr.gen)
        collect.append(1e3 * (time.perf_counter() - t))
        for name, rule, ep in variants[k % len(variants):] + variants[:k % len(variants)]:
            c = copy.copy(cfg)
            c.trust_region, c.epochs = rule, ep
            policy = copy.deepcopy(tr.policy)
            opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
            opt.load_state_dict(tr.opt.state_dict())
            t = time.perf_counter()
            grpo_update(policy, None, opt, batch, c, cfg.eps_low, cfg.eps_high, tr.gen)
            ms[name].append(1e3 * (time.perf_counter() - t))
    col = float(np.median(collect))
    base = float(np.median(ms[f"fixed, {epochs} epochs"]))
    print(f"\n{plant[0]}/{plant[1]}, {rounds} rounds, one thread: collection "
          f"{col:.1f} ms (median)\n")
    print("| update | ms (median) | / fixed clip | iteration without overlap, ms | / fixed clip |")
    print("|---|---|---|---|---|")
    for name, _, _ in variants:
        m = float(np.median(ms[name]))
        print(f"| {name} | {m:.1f} | {m / base:.3f} | {col + m:.1f} | "
              f"{(col + m) / (col + base):.3f} |")


def mean_se(x, sign: str = "") -> str:
    return f"{np.mean(x):{sign}.1f} ± {standard_error(x):.1f}"


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
    p.add_argument("--cost", type=int, metavar="ROUNDS",
                   help="instead of training: per-iteration cost of the trust regions of "
                        "trust_region_4_epochs side by side, ROUNDS batches")
    p.add_argument("--seed-list", type=int, nargs="+", metavar="SEED",
                   help="train these seeds (default: 0 .. --seeds - 1)")
    p.add_argument("--record", metavar="DIR",
                   help="save each run to DIR as it ends, skip runs saved already, print no table")
    p.add_argument("--report", metavar="DIR", help="instead of training: the tables (and with "
                   "--png-dir a plot) of the runs saved in DIR")
    p.add_argument("--png-dir", default=None, help="write [PLANT-]STUDY.png plots here")
    p.add_argument("--plot-gaps", nargs="+", metavar="PNG TABLE",
                   help="instead of training: draw the per-seed paired gaps to the optimum of "
                        "the printed tables TABLE... (gym pendulum studies) into PNG")
    args = p.parse_args(argv)
    if args.plot_gaps:
        plot_gaps(args.plot_gaps[1:], args.plot_gaps[0])
        return 0
    plant = (args.system, args.preset)
    if args.cost:
        iteration_cost(plant, [o["trust_region"] for _, o in STUDIES["trust_region_4_epochs"]], 4, args.cost)
        return 0
    if args.record or args.report:
        for study in args.study or ["trust_region_4_epochs"]:
            if args.report:
                png = args.png_dir and os.path.join(args.png_dir,
                                                   f"{args.system}-{args.preset}-{study}.png")
                report_runs(plant, study, args.report, png)
            else:
                record_runs(plant, study, args.seed_list or list(range(args.seeds)), args.only,
                            args)
        return 0
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
                    for s in args.seed_list or range(args.seeds)]
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
