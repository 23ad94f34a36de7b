#!/usr/bin/env python3
"""Time to quality on the pendulum: GRPO against the tools people use, side by side.

Trains GRPO (``grpo-ctrl train`` defaults) on the ``pendulum``/``gym``
preset of the C simulator for ``--budget`` seconds of wall time (from
``--seeds`` training seeds), snapshots the deterministic policy every
``--every`` seconds of training, and scores every snapshot afterwards on the
held-out episodes of ``grpo_ctrl.heldout`` (1,000 Gymnasium Pendulum-v1
start states from seed 10000 on, stepped in the C simulator's gym preset,
which matches Gymnasium step for step; evaluation time is not training
time). Then, where Stable-Baselines3 is installed, trains its PPO and SAC
with the rl-zoo tuned Pendulum-v1 hyperparameters under the same wall-clock
budget, snapshotted and scored the same way; and scores the hand-written
swing-up-plus-LQR controller and the dynamic-programming optimum
(``grpo_ctrl.baselines.optimum``) on the same episodes.

Prints, per method: the return at each snapshot, the first training time at
which the mean return reached -200 and -160, and the final and best
returns; per GRPO seed, the final policy (latest.pt) and deployed.pt against the
optimum, paired, and deployed.pt against latest.pt; and policy-in-the-loop
rollout throughput (C simulator stepped by the deterministic policy, batched).

    python benchmarks/bench_train.py                 # or: grpo-ctrl bench train
    python benchmarks/bench_train.py --budget 10 --no-sb3 --seeds 3 --json out.json

Targets: GRPO >= -160 within 8 s, the final policy within 2 points of the
optimum after the default (30 s) run (issue 16), rollouts >= 2 million
steps/s. The machine is shared: wall-clock numbers are pessimistic when
other work runs (the GRPO iteration counts are printed beside them); the
ratios between methods, measured in the same process, are the robust part.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from grpo_ctrl.controller import act  # noqa: E402
from grpo_ctrl.heldout import HELDOUT_EPISODES, format_difference  # noqa: E402
from grpo_ctrl.heldout import score as heldout_score  # noqa: E402
from grpo_ctrl.grpo_config import default_config  # noqa: E402
from grpo_ctrl.sim import BatchSim  # noqa: E402
from grpo_ctrl.train import train  # noqa: E402

TARGETS = {"return_by_8s": -160.0, "gap_to_optimum": 2.0, "rollout_steps_per_s": 2e6}
THRESHOLDS = (-200.0, -160.0, -150.0)
SPEC = BatchSim("pendulum", 1, preset="gym").spec

# rl-baselines3-zoo hyperparams/ppo.yml and sac.yml, Pendulum-v1
PPO_ZOO = dict(n_envs=4, normalize=True, n_steps=1024, batch_size=64, gae_lambda=0.95, gamma=0.9,
               n_epochs=10, ent_coef=0.0, learning_rate=1e-3, clip_range=0.2, max_grad_norm=0.5,
               use_sde=True, sde_sample_freq=4)
SAC_ZOO = dict(learning_rate=1e-3)


class Snapshots:
    """Deterministic controllers taken every ``every`` seconds of training."""

    def __init__(self, every: float):
        self.every, self.next, self.items = every, every, []

    def maybe(self, wall: float, make) -> None:
        if wall >= self.next:
            self.items.append((wall, make()))
            while self.next <= wall:
                self.next += self.every


# ---------------------------------------------------------------------- GRPO
def run_grpo(budget: float, every: float, seed: int, out) -> dict:
    cfg = default_config("pendulum", "gym", budget)  # what `grpo-ctrl train` runs for it
    cfg.time_budget, cfg.seed = budget, seed
    snaps = Snapshots(every)

    def on_iteration(trainer, row):
        snaps.maybe(row["wall_time"], lambda: trainer.policy.controller(trainer.spec))

    summary = train("pendulum", "gym", cfg, out, progress=False, on_iteration=on_iteration)
    trainer = summary["trainer"]
    snaps.items.append((summary["wall_time"], trainer.policy.controller(trainer.spec)))
    from grpo_ctrl.policy import load_policy_controller
    best = load_policy_controller(out)
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    sim_rate = float(np.median([r["sim_steps_per_s"] for r in rows])) if rows else float("nan")
    return {"snapshots": snaps.items, "best": best, "iterations": summary["iterations"],
            "grpo_rollout_steps_per_s": sim_rate}


# ---------------------------------------------------------------------- SB3
class SB3Controller(torch.nn.Module):
    """A snapshot of an SB3 policy (and its observation normaliser) as a
    controller. SB3 policies with gSDE do not deepcopy, so the snapshot is a
    state dict, loaded into the live model's policy when this one acts."""

    def __init__(self, model, obs_rms=None, clip_obs: float = 10.0):
        super().__init__()
        self.spec = SPEC
        self.model = model
        self.state = {k: v.detach().clone() for k, v in model.policy.state_dict().items()}
        self.obs_rms = copy.deepcopy(obs_rms)
        self.clip_obs = clip_obs

    @torch.no_grad()
    def forward(self, obs):
        if getattr(self.model, "_bench_loaded", None) is not self:
            self.model.policy.load_state_dict(self.state)
            self.model._bench_loaded = self
        o = obs.numpy().astype(np.float64)
        if self.obs_rms is not None:
            o = np.clip((o - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8),
                        -self.clip_obs, self.clip_obs)
        a, _ = self.model.policy.predict(o.astype(np.float32), deterministic=True)
        return torch.as_tensor(np.clip(a, -2.0, 2.0), dtype=torch.float32).reshape(-1, 1)


def run_sb3(algo: str, budget: float, every: float, seed: int) -> dict:
    import gymnasium as gym
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    if algo == "ppo":
        hp = dict(PPO_ZOO)
        env = make_vec_env("Pendulum-v1", n_envs=hp.pop("n_envs"), seed=seed)
        hp.pop("normalize")
        env = VecNormalize(env, gamma=hp["gamma"])
        model = PPO("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **hp)
    else:
        env = gym.make("Pendulum-v1")
        model = SAC("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **SAC_ZOO)
    snaps = Snapshots(every)

    class Clock(BaseCallback):
        """Stops at the budget; snapshots on training time (snapshot cost excluded)."""

        def _on_training_start(self):
            self.t0, self.paused = time.perf_counter(), 0.0

        def _on_step(self):
            wall = time.perf_counter() - self.t0 - self.paused
            if wall >= snaps.next:
                t = time.perf_counter()
                rms = getattr(model.get_vec_normalize_env(), "obs_rms", None)
                snaps.maybe(wall, lambda: SB3Controller(model, rms))
                self.paused += time.perf_counter() - t
            self.wall = wall
            return wall < budget

    clock = Clock()
    model.learn(total_timesteps=10**9, callback=clock)
    rms = getattr(model.get_vec_normalize_env(), "obs_rms", None)
    snaps.items.append((clock.wall, SB3Controller(model, rms)))
    return {"snapshots": snaps.items, "steps": int(model.num_timesteps)}


# ---------------------------------------------------------------------- throughput
@torch.no_grad()
def rollout_throughput(controller, num_envs: int = 4096, steps: int = 200) -> float:
    """Steps/s of the C simulator driven by the controller, all envs batched."""
    torch.set_num_threads(1)
    sim = BatchSim("pendulum", num_envs, preset="gym", seed=0, autoreset=True)
    obs = sim.reset()
    for _ in range(5):
        obs, *_ = sim.step(act(controller, obs))
    t = time.perf_counter()
    for _ in range(steps):
        obs, *_ = sim.step(act(controller, obs))
    return num_envs * steps / (time.perf_counter() - t)


# ---------------------------------------------------------------------- report
def score(snapshots, episodes: int) -> list[tuple[float, float]]:
    return [(t, heldout_score(c, episodes).mean) for t, c in snapshots]


def first_time(curve, threshold: float):
    return next((t for t, r in curve if r >= threshold), None)


def fmt_t(t):
    return "never" if t is None else f"{t:6.1f} s"


def grpo_seeds(args, out_root) -> list[dict]:
    """GRPO from each training seed: curve, latest and deployed.pt scored on the
    held-out episodes."""
    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        r = run_grpo(args.budget, args.every, seed, out_root / f"grpo-{seed}")
        r["curve"] = score(r["snapshots"], args.episodes)
        r["latest_score"] = heldout_score(r["snapshots"][-1][1], args.episodes)
        r["best_score"] = heldout_score(r["best"], args.episodes)
        r["seed"] = seed
        runs.append(r)
    return runs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=30.0, help="training wall time per method (s)")
    p.add_argument("--every", type=float, default=2.0, help="snapshot period (s of training)")
    p.add_argument("--episodes", type=int, default=HELDOUT_EPISODES,
                   help=f"held-out episodes per score (default {HELDOUT_EPISODES})")
    p.add_argument("--seed", type=int, default=0, help="first training seed")
    p.add_argument("--seeds", type=int, default=1, help="GRPO training seeds (default 1)")
    p.add_argument("--no-sb3", action="store_true", help="skip Stable-Baselines3 PPO and SAC")
    p.add_argument("--out", default=None, help="folder for the GRPO runs (default: a temporary one)")
    p.add_argument("--json", help="write the results to this JSON file")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    import tempfile
    from pathlib import Path
    from grpo_ctrl.baselines import make_controller
    from grpo_ctrl.baselines.optimum import make_optimum
    tmp = tempfile.TemporaryDirectory()
    out_root = Path(args.out) if args.out else Path(tmp.name)

    print(f"# bench_train: pendulum, {args.budget:g} s of training per method, scored on "
          f"{args.episodes} held-out Gymnasium Pendulum-v1 episodes (deterministic action)")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
          f"{torch.__version__}; load average {os.getloadavg()[0]:.1f} at start")
    optimum = heldout_score(make_optimum("pendulum", "gym"), args.episodes)
    baseline = heldout_score(make_controller("swingup-lqr", "pendulum", "gym"), args.episodes)
    results = {}
    grpo = grpo_seeds(args, out_root)
    curves = {f"grpo-{r['seed']}" if args.seeds > 1 else "grpo": r["curve"] for r in grpo}
    best = {name: r["best_score"].mean for name, r in zip(curves, grpo)}
    results["grpo_iterations"] = [r["iterations"] for r in grpo]
    sb3 = None
    if not args.no_sb3:
        try:
            import stable_baselines3 as sb3
        except ImportError:
            print("# stable-baselines3 not installed (pip install stable-baselines3): "
                  "PPO and SAC skipped")
    if sb3 is not None:
        for algo in ("ppo", "sac"):
            r = run_sb3(algo, args.budget, args.every, args.seed)
            curves[f"sb3-{algo}"] = score(r["snapshots"], args.episodes)
            best[f"sb3-{algo}"] = max(v for _, v in curves[f"sb3-{algo}"])
            results[f"sb3_{algo}_env_steps"] = r["steps"]

    print(f"\n{'method':<10} {'to -200':>9} {'to -160':>9} {'to -150':>9} {'at 8 s':>8} "
          f"{'final':>8} {'best':>8}")
    summary = {}
    for name, curve in curves.items():
        at8 = max((r for t, r in curve if t <= 8.0 + 1e-9), default=None)
        row = {"curve": curve, "time_to": {str(th): first_time(curve, th) for th in THRESHOLDS},
               "return_by_8s": at8, "final": curve[-1][1], "best": best[name]}
        summary[name] = row
        print(f"{name:<10} " + " ".join(f"{fmt_t(first_time(curve, th)):>9}" for th in THRESHOLDS)
              + f" {at8 if at8 is not None else float('nan'):8.1f} {curve[-1][1]:8.1f} "
              f"{best[name]:8.1f}")
    print(f"{'swingup-lqr':<10} {'(hand-written, no training)':>38} {baseline.mean:8.1f}")
    print(f"{'optimum':<10} {'(dynamic programming)':>38} {optimum.mean:8.1f}")
    print("\nlearning curves (training s: mean return):")
    for name, curve in curves.items():
        print(f"  {name:<8} " + "  ".join(f"{t:.0f}:{r:.0f}" for t, r in curve))

    print(f"\npaired on the same {args.episodes} episodes (optimum {optimum}, swing-up + LQR "
          f"{baseline}):")
    gaps = []
    for r in grpo:
        latest, bst = r["latest_score"], r["best_score"]
        gaps.append(latest.minus(optimum)[0])
        r["paired"] = {"latest_minus_optimum": latest.minus(optimum),
                       "best_minus_optimum": bst.minus(optimum),
                       "best_minus_latest": bst.minus(latest),
                       "latest_minus_swingup_lqr": latest.minus(baseline)}
        print(f"  GRPO seed {r['seed']}, {r['iterations']} iterations: latest {latest}, "
              f"deployed.pt {bst}; latest - optimum "
              f"{format_difference(r['paired']['latest_minus_optimum'])}, deployed.pt - latest "
              f"{format_difference(r['paired']['best_minus_latest'])}, latest - swing-up + LQR "
              f"{format_difference(r['paired']['latest_minus_swingup_lqr'])}")
    worst_gap = -min(gaps)

    rate = rollout_throughput(grpo[0]["best"])
    print(f"\npolicy-in-the-loop rollout, 4096 envs batched, one thread: {rate / 1e6:.2f} M "
          f"steps/s (target >= 2); inside GRPO's rollouts (256 envs): "
          f"{grpo[0]['grpo_rollout_steps_per_s'] / 1e6:.2f} M steps/s")
    g = summary[next(iter(curves))]
    checks = {"return_by_8s": (g["return_by_8s"] or -np.inf) >= TARGETS["return_by_8s"],
              "gap_to_optimum": worst_gap <= TARGETS["gap_to_optimum"],
              "rollout_steps_per_s": rate >= TARGETS["rollout_steps_per_s"]}
    print(f"targets: final policy within {TARGETS['gap_to_optimum']:g} of the optimum on every "
          f"seed (worst gap {worst_gap:.1f}); "
          + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in checks.items()))
    for name in curves:
        if name.startswith("sb3"):
            t_g, t_o = first_time(g["curve"], -160.0), first_time(curves[name], -160.0)
            ratio = (f"{t_o / t_g:.1f}x sooner" if t_g and t_o else
                     "only GRPO" if t_g else "neither")
            print(f"GRPO vs {name}: reached -160 {ratio}; final {g['final']:.1f} vs "
                  f"{curves[name][-1][1]:.1f}")
    print(f"# load average {os.getloadavg()[0]:.1f} at end")
    if args.json:
        results.update(summary=summary, rollout_steps_per_s=rate, swingup_lqr=baseline.mean,
                       optimum=optimum.mean, targets=checks, budget=args.budget,
                       paired={r["seed"]: r["paired"] for r in grpo})
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
