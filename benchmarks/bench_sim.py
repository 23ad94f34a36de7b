#!/usr/bin/env python3
"""Simulator throughput, side by side in one process.

The full step of Gymnasium's Pendulum-v1 (dynamics, observation, reward,
200-step truncation with autoreset) for a batch of B environments, by:

* ``c``: this project's C simulator, ``BatchSim("pendulum", B, preset="gym").step``;
* ``numpy``: the identical step vectorised over the batch in numpy
  (``NumpyPendulum`` below; checked against the C step before timing);
* ``gymnasium``: Gymnasium's Pendulum-v1, one env at B = 1, its
  ``SyncVectorEnv`` above;
* ``envpool``: EnvPool's Pendulum-v1 with one thread, when installed.

Everything runs on one core. Prints steps per second per batch size, the
ratios of the C simulator to the others and microseconds per call at
B = 1; ``--json PATH`` writes the same numbers.

    python benchmarks/bench_sim.py            # or: grpo-ctrl bench sim
    python benchmarks/bench_sim.py --quick --json sim.json

Targets (issue 2), at B = 4096: C >= 2x numpy and >= 50x EnvPool; at B = 1
a C step under 2 us through Python. Timings on a shared machine are noisy:
read the ratios, and repeat.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from grpo_ctrl.files import atomic_write
from grpo_ctrl.sim import BatchSim

BATCH_SIZES = (1, 64, 4096)
COMPETITORS = ("c", "numpy", "gymnasium", "envpool")
TARGETS = {"c_vs_numpy_at_4096": 2.0, "c_vs_envpool_at_4096": 50.0, "c_us_per_call_at_1": 2.0}
DISTINCT_ACTIONS = 16  # rows of pre-drawn actions cycled through while timing


def angle_normalize(x):
    return ((x + np.pi) % (2 * np.pi)) - np.pi


class NumpyPendulum:
    """Gymnasium's Pendulum-v1, B environments per call, in numpy.

    Gymnasium's arithmetic line for line (a float32 action meets Python
    floats and stays float32, then meets the float64 state), with the
    TimeLimit's truncation and a same-step autoreset like ``BatchSim``'s."""

    max_speed, max_torque, dt, g, m, l, max_steps = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0, 200

    def __init__(self, num_envs: int, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.th = np.zeros(num_envs)
        self.thd = np.zeros(num_envs)
        self.t = np.zeros(num_envs, np.int32)
        self.obs = np.empty((num_envs, 3), np.float32)
        self.terminated = np.zeros(num_envs, bool)
        self.reset(np.ones(num_envs, bool))

    def reset(self, mask):
        n = int(mask.sum())
        self.th[mask] = self.rng.uniform(-np.pi, np.pi, n)
        self.thd[mask] = self.rng.uniform(-1.0, 1.0, n)
        self.t[mask] = 0
        self._observe()
        return self.obs

    def _observe(self):
        self.obs[:, 0] = np.cos(self.th)
        self.obs[:, 1] = np.sin(self.th)
        self.obs[:, 2] = self.thd

    def step(self, u):
        g, m, l, dt = self.g, self.m, self.l, self.dt
        th, thd = self.th, self.thd
        u = np.clip(u, -self.max_torque, self.max_torque)
        costs = angle_normalize(th) ** 2 + 0.1 * thd**2 + 0.001 * (u**2)
        newthd = thd + (3 * g / (2 * l) * np.sin(th) + 3.0 / (m * l**2) * u) * dt
        np.clip(newthd, -self.max_speed, self.max_speed, out=newthd)
        self.th = th + newthd * dt
        self.thd = newthd
        self.t += 1
        truncated = self.t >= self.max_steps
        if truncated.any():
            self.reset(truncated)  # observes too
        else:
            self._observe()
        return self.obs, -costs, self.terminated, truncated


# ---------------------------------------------------------------- competitors
# Each maker returns step(actions) for a batch of B, actions float32 (B,),
# or raises ImportError when the competitor is not installed.
def make_c(B):
    sim = BatchSim("pendulum", B, preset="gym", seed=0, autoreset=True)
    return sim.step


def make_numpy(B):
    return NumpyPendulum(B).step


def make_gymnasium(B):
    import gymnasium as gym

    if B == 1:  # one plain env, reset by hand when its episode ends
        env = gym.make("Pendulum-v1")
        env.reset(seed=0)

        def step(actions):
            result = env.step(actions)
            if result[2] or result[3]:
                env.reset()
            return result
        return step
    envs = gym.make_vec("Pendulum-v1", num_envs=B, vectorization_mode="sync")
    envs.reset(seed=0)
    return lambda actions: envs.step(actions.reshape(B, 1))


def make_envpool(B):
    with warnings.catch_warnings():  # its float64 space bounds make Gymnasium warn
        warnings.simplefilter("ignore")
        import envpool
        envs = envpool.make_gym("Pendulum-v1", num_envs=B, batch_size=B, num_threads=1, seed=0)
        envs.reset()
    return lambda actions: envs.step(actions.reshape(B, 1))


MAKERS = {"c": make_c, "numpy": make_numpy, "gymnasium": make_gymnasium, "envpool": make_envpool}


def seconds_per_call(step, actions, budget_s: float, repeats: int) -> float:
    """Best over ``repeats`` timed runs of back-to-back calls, each run about
    ``budget_s / repeats`` long (the best is the least disturbed by other load)."""
    for a in actions:  # warm up
        step(a)
    calls, elapsed = len(actions), 0.0
    while True:  # find a call count that fills one run
        t0 = time.perf_counter()
        for i in range(calls):
            step(actions[i % len(actions)])
        elapsed = time.perf_counter() - t0
        if elapsed >= budget_s / repeats or calls >= 1 << 24:
            break
        calls *= 2
    best = elapsed / calls
    rows = [actions[i % len(actions)] for i in range(calls)]
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for a in rows:
            step(a)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def agreement(num_envs: int = 256, steps: int = 200) -> dict:
    """Largest gaps between the numpy and C steps from the same starts, over
    one whole episode: the two implementations time the same work."""
    sim = BatchSim("pendulum", num_envs, preset="gym", seed=1, autoreset=True)
    ref = NumpyPendulum(num_envs, seed=1)
    x = sim.get_state()["x"]
    ref.th[:], ref.thd[:] = x[:, 0], x[:, 1]
    actions = np.random.default_rng(2).uniform(-2.5, 2.5, (steps, num_envs)).astype(np.float32)
    worst_obs = worst_reward = 0.0
    same_ends = True
    for k in range(steps):
        c_obs, c_reward, c_term, c_trunc = sim.step(actions[k])
        n_obs, n_reward, n_term, n_trunc = ref.step(actions[k])
        if k < steps - 1:  # at the last step both autoreset, each from its own RNG
            worst_obs = max(worst_obs, float(np.abs(c_obs - n_obs).max()))
        worst_reward = max(worst_reward, float(np.abs(c_reward - n_reward).max()))
        same_ends &= bool(np.array_equal(c_term, n_term) and np.array_equal(c_trunc, n_trunc))
    return {"max_obs_diff": worst_obs, "max_reward_diff": worst_reward, "same_episode_ends": same_ends,
            "envs": num_envs, "steps": steps}


def run_benchmark(batch_sizes, budget_s: float, repeats: int, competitors) -> dict:
    rng = np.random.default_rng(0)
    results = {name: {} for name in competitors}
    notes = {}
    for B in batch_sizes:
        actions = list(rng.uniform(-2.0, 2.0, (DISTINCT_ACTIONS, B)).astype(np.float32))
        for name in competitors:
            try:
                step = MAKERS[name](B)
            except ImportError as e:
                notes[name] = f"not installed ({e})"
                results[name][str(B)] = None
                continue
            s = seconds_per_call(step, actions, budget_s, repeats)
            results[name][str(B)] = {"steps_per_s": B / s, "us_per_call": s * 1e6}
    ratios = {}
    for other in competitors:
        if other == "c":
            continue
        ratios[f"c_vs_{other}"] = {
            str(B): (results["c"][str(B)]["steps_per_s"] / results[other][str(B)]["steps_per_s"]
                     if results[other].get(str(B)) and results["c"].get(str(B)) else None)
            for B in batch_sizes}
    return {"results": results, "ratios": ratios, "notes": notes}


def targets(report: dict) -> dict:
    """Each target with the measured value and whether it is met (None: not measured)."""
    def get(path):
        node = report
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node
    measured = {
        "c_vs_numpy_at_4096": get(["ratios", "c_vs_numpy", "4096"]),
        "c_vs_envpool_at_4096": get(["ratios", "c_vs_envpool", "4096"]),
        "c_us_per_call_at_1": get(["results", "c", "1", "us_per_call"]),
    }
    out = {}
    for name, goal in TARGETS.items():
        value = measured[name]
        met = None if value is None else (value < goal if name.endswith("at_1") else value >= goal)
        out[name] = {"goal": goal, "measured": value, "met": met}
    return out


def versions() -> dict:
    found = {"python": platform.python_version(), "numpy": np.__version__}
    for module in ("gymnasium", "envpool"):
        try:
            found[module] = __import__(module).__version__
        except ImportError:
            found[module] = None
    return found


def print_report(report: dict) -> None:
    batch_sizes = report["batch_sizes"]
    print(f"pendulum/gym full step, one core; best of {report['repeats']} runs "
          f"of ~{report['budget_s'] / report['repeats']:.2g} s each")
    print(f"{'steps/s':>12}" + "".join(f"{'B=' + str(B):>14}" for B in batch_sizes))
    for name, row in report["results"].items():
        cells = "".join(f"{row[str(B)]['steps_per_s']:>14,.0f}" if row.get(str(B)) else
                        f"{'not installed':>14}" for B in batch_sizes)
        print(f"{name:>12}{cells}")
    for name, row in report["ratios"].items():
        cells = "".join(f"{row[str(B)]:>13.1f}x" if row[str(B)] else f"{'-':>14}"
                        for B in batch_sizes)
        print(f"{name:>12}{cells}")
    if report["results"]["c"].get("1"):
        print("us per call at B=1: " + ", ".join(
            f"{name} {row['1']['us_per_call']:.2f}" for name, row in report["results"].items()
            if row.get("1")))
    for name, note in report["notes"].items():
        print(f"{name}: {note}")
    a = report["agreement"]
    print(f"numpy vs C over {a['envs']} envs x {a['steps']} steps: max obs diff "
          f"{a['max_obs_diff']:.2g}, max reward diff {a['max_reward_diff']:.2g}, "
          f"same episode ends: {a['same_episode_ends']}")
    for name, t in report["targets"].items():
        status = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        value = "-" if t["measured"] is None else f"{t['measured']:.3g}"
        print(f"target {name}: {value} (goal {'<' if name.endswith('at_1') else '>='} "
              f"{t['goal']:g}): {status}")


def write_json(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(report, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grpo-ctrl bench sim", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="CI-sized run: short timings, one run each")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES),
                        metavar="B", help="batch sizes to time (default: 1 64 4096)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="time budget per competitor and batch size (default 1.0, quick 0.02)")
    parser.add_argument("--only", nargs="+", choices=COMPETITORS, default=list(COMPETITORS),
                        help="time only these (the C simulator is always included)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the numbers as JSON to PATH")
    args = parser.parse_args(argv)
    if any(B < 1 for B in args.batch_sizes):
        parser.error("batch sizes must be positive")
    budget = args.seconds if args.seconds is not None else (0.02 if args.quick else 1.0)
    if not budget > 0:
        parser.error("--seconds must be positive")
    repeats = 1 if args.quick else 5
    competitors = ["c"] + [name for name in COMPETITORS if name in args.only and name != "c"]
    report = {"benchmark": "sim", "system": "pendulum", "preset": "gym", "quick": args.quick,
              "batch_sizes": args.batch_sizes, "budget_s": budget, "repeats": repeats,
              "machine": {"platform": platform.platform(), "processor": platform.machine(),
                          "cpu_count": os.cpu_count()},
              "versions": versions(), "agreement": agreement()}
    report.update(run_benchmark(args.batch_sizes, budget, repeats, competitors))
    report["targets"] = targets(report)
    print_report(report)
    if args.json:
        write_json(args.json, report)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
