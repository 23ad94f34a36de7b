#!/usr/bin/env python3
"""Per-iteration cost of GRPO configurations, side by side in one process.

Each ``--arm`` is a set of GRPOConfig overrides on a plant's default (TOML
inline-table syntax); every arm gets its own Trainer (one thread, no overlap),
and the Trainers take their iterations in turn, so load on a shared machine
falls on all of them alike. Prints the median rollout and update seconds per
iteration (after ``--warmup``) and their ratios to the plant's default.

    python benchmarks/bench_iteration.py --arm 'hidden = 64' \\
        --arm 'c_update = false, c_rollout = false'
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from grpo_ctrl import runtime  # first: it sets the OpenMP environment before torch loads

import torch  # noqa: E402

from grpo_ctrl._pendsim import ffi, lib
from grpo_ctrl.bench_cli import cpu_model
from grpo_ctrl.grpo import Trainer
from grpo_ctrl.grpo_config import default_config

try:
    import tomllib  # novermin: 3.10 takes the except branch
except ModuleNotFoundError:  # Python 3.10: tomli is the same parser (pyproject requires it there)
    import tomli as tomllib


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system", default="pendulum")
    p.add_argument("--preset", default="gym")
    p.add_argument("--arm", action="append", default=[],
                   help="GRPOConfig overrides, e.g. 'hidden = 64, minibatches = 4'")
    p.add_argument("--iterations", type=int, default=300, help="per arm, warm-up included")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--simd", default="", help="comma-separated SIMD paths to run each arm on too "
                   "(avx512, avx2, baseline, plain, avx512+fma, avx2+fma; capped at the CPU's)")
    args = p.parse_args(argv)
    start = ffi.string(lib.pr_simd_path()).decode()
    paths = [start]
    for name in filter(None, args.simd.split(",")):
        if lib.pr_simd_select(name.encode()) < 0:
            p.error(f"--simd: {name!r} is not a SIMD path; this CPU runs: "
                    f"{ffi.string(lib.pr_simd_paths()).decode()} "
                    f"{ffi.string(lib.pr_simd_fused_paths()).decode()}".rstrip())
        taken = ffi.string(lib.pr_simd_path()).decode()
        if taken not in paths:
            paths.append(taken)
    lib.pr_simd_select(start.encode())
    torch.set_num_threads(1)
    base = replace(default_config(args.system, args.preset), overlap=False, time_budget=0.0,
                   eval_every=1e9)
    configs = {"default": base}
    for arm in args.arm:
        configs[arm] = replace(base, **tomllib.loads(f"arm = {{{arm}}}")["arm"])
    arms = {}  # name -> (SIMD path, Trainer)
    for path in paths:
        for name, cfg in configs.items():
            label = name if path == start else f"{name} @ {path}"
            arms[label] = (path, Trainer(cfg, args.system, args.preset))
    seconds = {name: ([], []) for name in arms}
    runtime.freeze_setup()  # as train does: the collector walks only what the loop makes
    print(f"CPU: {cpu_model()}; SIMD path in use: {start}; torch {torch.__version__} "
          f"{torch.backends.cpu.get_cpu_capability()}")
    for i in range(args.iterations):
        for name, (path, trainer) in arms.items():
            lib.pr_simd_select(path.encode())
            m = trainer.step()
            if i >= args.warmup:
                seconds[name][0].append(m["rollout_s"])
                seconds[name][1].append(m["update_s"])
    r0, u0 = (statistics.median(x) for x in seconds["default"])
    for name, (r, u) in seconds.items():
        r, u = statistics.median(r), statistics.median(u)
        print(f"{name}: rollout {1e3 * r:.2f} ms ({r / r0:.2f}x), update {1e3 * u:.2f} ms "
              f"({u / u0:.2f}x), iteration {(r + u) / (r0 + u0):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
