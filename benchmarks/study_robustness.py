#!/usr/bin/env python3
"""The multi-seed robustness study of docs/robustness.md §5.

For each training seed, two policies of one hardware preset: the default
(trained on drawn plants) and the nominally trained one (``--randomize off``,
no smoothness terms: the default before issue 12). Each, and swing-up + LQR,
goes through the robustness benchmark (``grpo_ctrl.robustness``: 20 episodes
a grid point, ``--realistic`` episodes in the realistic row) and the 1,000
held-out nominal episodes (``grpo_ctrl.heldout``), where every controller
meets the same start states: the nominal returns are compared paired, per
seed. Chatter is measured the same way for every controller: its
deterministic command at every control step (``run_episodes``), the share of
steps where du changes sign (``grpo_ctrl.closed_loop.command_smoothness``).

Runs are bounded in iterations, not seconds, so the result does not depend on
what else the machine runs; each run's wall time and iteration cost are
printed with the load. Trained runs are kept in ``--runs`` and reused, so two
processes can train different seeds or variants side by side
(``--train-only``) and a last one reports.

    python benchmarks/study_robustness.py --system pendulum --preset rig \\
        --seeds 0 1 2 --iterations 400 --runs runs/study-rig
    python benchmarks/study_robustness.py --system furuta --preset qube-servo2 \\
        --seeds 0 1 2 --iterations 1500 --nominal-iterations 2400 --runs runs/study-qube
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

from grpo_ctrl import heldout, robustness  # noqa: E402
from grpo_ctrl.baselines import make_controller  # noqa: E402
from grpo_ctrl.files import atomic_write  # noqa: E402
from grpo_ctrl.grpo_config import default_config  # noqa: E402
from grpo_ctrl.policy import load_policy_controller  # noqa: E402
from grpo_ctrl.randomize import Randomization, default_randomization  # noqa: E402
from grpo_ctrl.train import train  # noqa: E402

VARIANTS = ("randomised", "nominal")
EVAL = "study-eval.json"


def configure(variant: str, system: str, preset: str, seed: int, iterations: int):
    cfg = default_config(system, preset)
    cfg.seed, cfg.iterations, cfg.time_budget = seed, iterations, 0.0
    if variant == "nominal":  # the default before issue 12
        cfg.w_du = cfg.w_smooth = 0.0
        return cfg, Randomization()
    return cfg, default_randomization(system, preset)


def metrics(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def ensure_trained(folder: Path, variant: str, plant, seed: int, iterations: int) -> None:
    rows = metrics(folder)
    if rows and rows[-1]["iteration"] >= iterations and (folder / "best.pt").is_file():
        return
    if folder.exists():
        raise SystemExit(f"{folder} holds an unfinished run: remove it")
    cfg, randomize = configure(variant, *plant, seed, iterations)
    load = os.getloadavg()[0]
    train(*plant, cfg, folder, progress=False, randomize=randomize)
    rows = metrics(folder)
    print(f"trained {folder}: {rows[-1]['iteration']} iterations in {rows[-1]['wall_time']:.0f} s "
          f"(load {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)", flush=True)


def training_summary(folder: Path) -> dict:
    """Iterations, wall time, CPU time per iteration of the collection and the
    update, and the first evaluations at 90% and 100% success (on the
    training's own plants: drawn, or nominal)."""
    rows = metrics(folder)
    evals = [(r["iteration"], r["eval_success"]) for r in rows if r["eval_success"] is not None]
    first = {f"it_to_{int(100 * s)}": next((i for i, v in evals if v >= s), None)
             for s in (0.9, 1.0)}
    return {"iterations": rows[-1]["iteration"], "wall_s": rows[-1]["wall_time"],
            "rollout_ms": 1e3 * float(np.mean([r["rollout_s"] for r in rows])),
            "update_ms": 1e3 * float(np.mean([r["update_s"] for r in rows])), **first}


def iteration_cost(plant, steps: int) -> dict:
    """CPU seconds of one iteration (collection + update, one core, no
    overlap), the two variants' trainers stepping in turn in this process, so
    that the machine's load weighs on both alike."""
    from grpo_ctrl.grpo import Trainer
    trainers, cpu = {}, {v: [] for v in VARIANTS}
    for v in VARIANTS:
        cfg, randomize = configure(v, *plant, 0, steps)
        cfg.overlap = False
        trainers[v] = Trainer(cfg, *plant, randomize=randomize)
    for _ in range(steps):
        for v, trainer in trainers.items():
            t = time.process_time()
            trainer.step()
            cpu[v].append(time.process_time() - t)
    return {v: float(np.median(c)) for v, c in cpu.items()}


def evaluate(controller, episodes: int, realistic: int, held: int, cache: Path) -> dict:
    """The benchmark and the held-out episodes, kept in ``cache`` (JSON): a
    process can score runs as they finish and a last one only reports."""
    if cache.is_file():
        r = json.loads(cache.read_text())
        if (r["episodes"], r["realistic_episodes"], len(r["returns"])) == (episodes, realistic,
                                                                           held) and "points" in r:
            return {**r, "returns": np.array(r["returns"])}
    rb = robustness.benchmark(controller, episodes, realistic)
    ep = heldout.run(controller, held)
    r = {"score": rb["score"], "categories": rb["categories"],
         "realistic": rb["realistic"]["success"],
         "realistic_sign_changes": rb["realistic"]["du_sign_changes"],
         "realistic_du": rb["realistic"]["du_mean"],
         "points": [[p.category, p.label, p.value, p.success] for p in rb["points"]],
         "returns": ep.returns.tolist(), "success": float(ep.success.mean()),
         "du": float(ep.du_mean.mean()), "sign_changes": float(ep.du_sign_changes.mean()),
         "episodes": episodes, "realistic_episodes": realistic}
    atomic_write(cache, json.dumps(r))
    return {**r, "returns": ep.returns}


def mean_se(values, fmt="{:.1f}", scale=1.0) -> str:
    v = scale * np.asarray(values, dtype=float)
    se = v.std(ddof=1) / np.sqrt(v.size) if v.size > 1 else 0.0
    return (f"{fmt.format(v.mean())} ± {fmt.replace('+', '').format(se)} ("
            + ", ".join(fmt.format(x) for x in v) + ")")


def weak_points(results: dict, baseline: dict, names: list[str]) -> str:
    """The grid points where some controller fails an episode: success per
    seed and the baseline's, on the same episodes (where the score's points go)."""
    at = {n: [{tuple(p[:3]): p[3] for p in r["points"]} for r in results[n]] for n in names}
    base = {tuple(p[:3]): p[3] for p in baseline["points"]}
    weak = [k for k in base if base[k] < 1 or any(s[k] < 1 for n in names for s in at[n])]
    lines = ["\nGrid points below 100% for some controller (success, per seed):\n",
             "| category | what | value | " + " | ".join(names) + " | swing-up + LQR |",
             "|---|---|---|" + "---|" * (len(names) + 1)]
    for k in weak:
        cells = [", ".join(f"{100 * s[k]:.0f}" for s in at[n]) for n in names]
        lines.append(f"| {k[0]} | {k[1]} | {k[2]:g} | " + " | ".join(cells)
                     + f" | {100 * base[k]:.0f} |")
    return "\n".join(lines)


def report(results: dict, baseline: dict, realistic: int, held: int) -> str:
    names = [v for v in VARIANTS if results.get(v)]
    head = (f"| (mean ± s.e. over seeds (per seed)) | " + " | ".join(names)
            + " | swing-up + LQR |\n|---|" + "---|" * (len(names) + 1))
    lines = [head]

    def row(label, key, fmt="{:.1f}", scale=1.0):
        cells = [mean_se([r[key] for r in results[n]], fmt, scale) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells)
                     + f" | {fmt.format(scale * baseline[key])} |")

    row("robustness score (%)", "score", scale=100)
    row(f"realistic row, success (%, {realistic} episodes)", "realistic", scale=100)
    row(f"nominal success (%, {held} held-out)", "success", scale=100)
    for n in names:
        for r in results[n]:
            r["nominal_return"] = float(r["returns"].mean())
    baseline["nominal_return"] = float(baseline["returns"].mean())
    row(f"nominal return ({held} held-out)", "nominal_return")
    row("du sign changes, nominal (%)", "sign_changes", scale=100)
    row("mean abs du / u_max, nominal", "du", "{:.4f}")
    row("du sign changes, realistic (%)", "realistic_sign_changes", scale=100)
    row("mean abs du / u_max, realistic", "realistic_du", "{:.4f}")
    for key, label in (("iterations", "training iterations"), ("wall_s", "training wall s"),
                       ("rollout_ms", "collection ms / iteration (wall)"),
                       ("update_ms", "update ms / iteration (wall)")):
        cells = [mean_se([r["train"][key] for r in results[n]], "{:.0f}") for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " | |")
    for key in ("it_to_90", "it_to_100"):
        cells = [", ".join(str(r["train"][key]) for r in results[n]) for n in names]
        lines.append(f"| first evaluation at {key[6:]}% success (iteration, per seed) | "
                     + " | ".join(cells) + " | |")
    lines.append(weak_points(results, baseline, names))
    if len(names) == 2:  # paired, seed by seed, on the same held-out episodes
        lines.append("\nNominal return, randomised - nominal training, paired on the same "
                     f"{held} held-out episodes:\n")
        rel = []
        nominal = {r["seed"]: r for r in results["nominal"]}
        for a, b in ((a, nominal[a["seed"]]) for a in results["randomised"]
                     if a["seed"] in nominal):
            d = a["returns"] - b["returns"]
            rel.append(d.mean() / abs(b["returns"].mean()))
            lines.append(f"- seed {a['seed']}: {d.mean():+.1f} ± "
                         f"{d.std(ddof=1) / np.sqrt(d.size):.1f} "
                         f"({100 * rel[-1]:+.1f}% of the nominal policy's "
                         f"{b['returns'].mean():.1f})")
        lines.append(f"- mean over seeds: {mean_se(rel, '{:+.1f}', 100)} %")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system", default="pendulum")
    p.add_argument("--preset", default="rig")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=400, help="of the randomised runs")
    p.add_argument("--nominal-iterations", type=int, help="of the nominal runs (default: "
                   "--iterations)")
    p.add_argument("--nominal-seeds", type=int, nargs="+", help="(default: --seeds)")
    p.add_argument("--runs", required=True, help="folder of the trained runs (reused)")
    p.add_argument("--only", choices=VARIANTS, action="append")
    p.add_argument("--train-only", action="store_true")
    p.add_argument("--no-report", action="store_true", help="train and score, print nothing")
    p.add_argument("--episodes", type=int, default=20, help="per grid point")
    p.add_argument("--realistic", type=int, default=500, help="episodes of the realistic row")
    p.add_argument("--heldout", type=int, default=heldout.HELDOUT_EPISODES)
    p.add_argument("--cost-iterations", type=int, default=20,
                   help="iterations of each variant timed side by side (0: skip)")
    args = p.parse_args(argv)
    plant = (args.system, args.preset)
    runs = Path(args.runs)
    iterations = {"randomised": args.iterations,
                  "nominal": args.nominal_iterations or args.iterations}
    variants = args.only or list(VARIANTS)
    t = time.perf_counter()
    results = {v: [] for v in variants}
    seeds = {"randomised": args.seeds, "nominal": args.nominal_seeds or args.seeds}
    for seed in sorted(set(args.seeds) | set(seeds["nominal"])):
        for v in (v for v in variants if seed in seeds[v]):
            folder = runs / f"{v}-seed{seed}"
            ensure_trained(folder, v, plant, seed, iterations[v])
            if not args.train_only:
                r = evaluate(load_policy_controller(folder), args.episodes, args.realistic,
                             args.heldout, folder / EVAL)
                results[v].append({**r, "seed": seed, "train": training_summary(folder)})
    if args.train_only:
        return 0
    baseline = evaluate(make_controller("swingup-lqr", *plant), args.episodes, args.realistic,
                        args.heldout, runs / f"swingup-lqr-{EVAL}")
    if args.no_report:
        return 0
    text = report(results, baseline, args.realistic, args.heldout)
    if args.cost_iterations:
        cost = iteration_cost(plant, args.cost_iterations)
        text += ("\n\nCPU time of one iteration (collection + update, one core), the variants "
                 f"side by side, median of {args.cost_iterations}: "
                 + ", ".join(f"{v} {1e3 * c:.0f} ms" for v, c in cost.items())
                 + f"; randomised / nominal {cost['randomised'] / cost['nominal']:.2f}")
    print(f"\n## {plant[0]}/{plant[1]}, seeds {args.seeds} (evaluation "
          f"{time.perf_counter() - t:.0f} s, "
          f"load {os.getloadavg()[0]:.1f})\n\n{text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
