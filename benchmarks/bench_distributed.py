#!/usr/bin/env python3
"""Data-parallel GRPO: 1 and 2 processes side by side, and a cost model for N.

1. Throughput. Trains the gym pendulum (8 branches x 64 steps per start
   state, overlap off) for ``--iterations`` iterations with 1 process and
   with 2 processes (``grpo_ctrl.distributed.launch``, gloo on loopback) in
   three ways: each rank bound to its own CPU (GRPO_CTRL_DIST_PIN=1; the
   trainer's default where the ranks are as many as the CPUs, as on a
   2-core machine), not bound (GRPO_CTRL_DIST_PIN=0), both polling each
   collective for up to GRPO_CTRL_DIST_SPIN_MS (default 5 ms), and bound but
   sleeping in every collective (GRPO_CTRL_DIST_SPIN_MS=0); ``--two`` picks
   some. It alternates them ``--rounds`` times so that load from other work
   hits all alike: the default batch of 32 start states split across the
   processes, 32 and 128 per process, and 128 split (``--case`` picks some).
   Reports simulator steps/s and updates (iterations)/s between the second
   and the last iteration, the 2-process over 1-process ratio of steps/s, the
   same ratio computed from the CPU seconds per iteration of the busiest rank
   (what a core per rank would give, communication waits aside; other work
   changes it little), and per iteration the collectives, the time rank 0
   spent in them (waiting for the other rank included) and the busiest
   process's minor page faults; and the torch threads of every process (1:
   both competitors compute on one core per process). Goal (issue 15): 2
   processes >= 1.8x one.
2. Cost model. Times the single-process iteration (collection + update, CPU
   time) at several batch sizes and fits t = a + b * branches; times, between
   2 ranks on loopback, the trainer's sum over ranks (an all-gather and the
   additions, ``Ranks._sum``) against gloo's all_reduce, each sleeping and
   polling, for float32 tensors of several sizes, giving a latency per
   message and a bandwidth. Prints the predicted speed-up at 8, 32 and 128
   processes on loopback and on an assumed 10 GbE network (formulae in
   docs/distributed.md).

    python benchmarks/bench_distributed.py            # or: grpo-ctrl bench distributed
    python benchmarks/bench_distributed.py --quick --json out.json

On a shared machine the wall-clock numbers move with the other work: the
printed load averages say how much there was. With more runnable processes
than cores, the ranks also wait for each other at every collective.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from grpo_ctrl import distributed, runtime  # noqa: E402
from grpo_ctrl.distributed import Ranks  # noqa: E402
from grpo_ctrl.grpo import Trainer  # noqa: E402
from grpo_ctrl.grpo_config import default_config  # noqa: E402
from grpo_ctrl.heap import keep_freed_memory  # noqa: E402
from grpo_ctrl.train import train  # noqa: E402

GOAL_RATIO = 1.8
PREDICT_AT = (8, 32, 128)
SIZES = (16, 4_482, 100_000, 1_000_000)  # floats per collective (4482: the policy's gradient)
# a network between machines, for the prediction: TCP over 10 Gb Ethernet
NET_LATENCY, NET_BANDWIDTH = 50e-6, 1.1e9
# (name, start states with 1 process, with 2): the default batch split in two
# (strong scaling), the default and a 4x batch on each process (weak), a 4x batch split
CASES = (("32 starts split", 32, 32), ("32 starts per process", 32, 64),
         ("128 starts split", 128, 128), ("128 starts per process", 128, 256))
# the 2-process competitors: (name, environment for the workers): whether each rank is
# bound to its own CPU (GRPO_CTRL_DIST_PIN) and how it waits in a collective
TWO = (("pinned", {"GRPO_CTRL_DIST_PIN": "1"}), ("unpinned", {"GRPO_CTRL_DIST_PIN": "0"}),
       ("pinned, sleeping", {"GRPO_CTRL_DIST_PIN": "1", "GRPO_CTRL_DIST_SPIN_MS": "0"}))


def config(iterations: int, num_starts: int = 32):
    cfg = default_config("pendulum", "gym")
    cfg.overlap, cfg.time_budget, cfg.iterations = False, 0.0, iterations
    cfg.eval_every, cfg.eval_episodes, cfg.num_starts = 1e9, 1, num_starts
    return cfg


def steps_per_iteration(cfg) -> int:
    return cfg.num_starts * cfg.group_size * cfg.horizon * cfg.action_repeat


# ------------------------------------------------------------ 1. throughput
def _timed_training(out_dir: str, cfg) -> None:
    stamps, arrivals = [], []
    ranks = Ranks.current()
    wait = ranks._wait

    def arrive_and_wait(work) -> None:  # when this rank reached each collective
        arrivals.append(time.perf_counter())  # CLOCK_MONOTONIC: one clock for all processes
        wait(work)

    ranks._wait = arrive_and_wait
    train("pendulum", "gym", cfg, None, progress=False, ranks=ranks,
          on_iteration=lambda trainer, row: stamps.append(
              (time.perf_counter(), time.process_time(), trainer.ranks.collectives,
               trainer.ranks.waited_s, resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
               torch.get_num_threads())))
    with open(os.path.join(out_dir, f"{ranks.rank}.json"), "w") as fh:
        json.dump({"stamps": stamps, "arrivals": arrivals}, fh)


def throughput(nproc: int, iterations: int, num_starts: int, env: dict | None = None,
               heap: str = "kept") -> dict:
    """Iterations/s and steps/s of one run with nproc processes, timed on
    rank 0 from the end of the first iteration (start-up excluded) to the
    end of the next-to-last (the last one includes an evaluation); the CPU
    seconds per iteration of the busiest rank, which load from other work
    changes little: one process's over it is the ratio the run would reach
    with a core per rank and free communication; rank 0's collectives per
    iteration and its wall time in them; the busiest process's minor page
    faults per iteration; with several ranks, how much later than the first
    the last rank reached each collective, summed over an iteration's
    collectives (the time the others waited for it). ``env``: variables set
    for the workers (GRPO_CTRL_DIST_SPIN_MS, GRPO_CTRL_DIST_PIN), restored
    after. ``heap``: ``kept`` as the trainer sets it (grpo_ctrl/heap.py), or
    ``glibc``'s default thresholds, as before December 1 (the workers are forked
    from this process, whose allocator the throughput runs leave as it is)."""
    cfg = config(iterations, num_starts)
    env = env or {}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # the forked workers read it
    if heap == "glibc":
        runtime.keep_freed_memory = lambda: False  # the forked workers inherit the patch
    try:
        with tempfile.TemporaryDirectory() as tmp:
            distributed.launch(nproc, _timed_training, (tmp, cfg))
            runs = [json.load(open(os.path.join(tmp, f"{r}.json"))) for r in range(nproc)]
    finally:
        runtime.keep_freed_memory = keep_freed_memory
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    stamps = [run["stamps"] for run in runs]
    n = iterations - 2
    first, last = stamps[0][0], stamps[0][-2]
    # every rank takes part in the same collectives in the same order
    arrivals = np.array([run["arrivals"][first[2]:last[2]] for run in runs])
    its = n / (last[0] - first[0])
    return {"nproc": nproc, "iterations_per_s": its,
            "optimiser_steps_per_s": its * cfg.epochs * cfg.minibatches,
            "sim_steps_per_s": its * steps_per_iteration(cfg),
            "cpu_s_per_iteration": max(s[-2][1] - s[0][1] for s in stamps) / n,
            "collectives_per_iteration": (last[2] - first[2]) / n,
            "collective_s_per_iteration": (last[3] - first[3]) / n,
            "faults_per_iteration": max(s[-2][4] - s[0][4] for s in stamps) / n,
            "threads": sorted({row[5] for s in stamps for row in s}),
            "arrival_spread_s_per_iteration": float((arrivals.max(0) - arrivals.min(0)).sum()) / n}


# ------------------------------------------------------------ 2. cost model
def compute_time(num_starts: int, iterations: int) -> float:
    """CPU seconds per iteration (collection + update) of one process holding
    num_starts start states (median over iterations, first one excluded)."""
    trainer = Trainer(config(iterations, num_starts), "pendulum", "gym", Ranks())
    times = []
    for _ in range(iterations):
        t = time.process_time()
        trainer.step()
        times.append(time.process_time() - t)
    return float(np.median(times[1:]))


def _time_reductions(out_file: str, repeats: int) -> None:
    """Median wall time of a sum over the 2 ranks, per size: gloo's
    all_reduce and the trainer's all-gather + additions, each with the
    trainer's polled wait and sleeping in wait(), taken in turn so that other
    work hits all four alike."""
    here = Ranks.current()
    waits = {"sleeping": Ranks(here.rank, here.world, spin=0.0),
             "polling": Ranks(here.rank, here.world, spin=distributed.spin_seconds())}
    times = {}
    for n in SIZES:
        t = torch.ones(n)
        for i in range(repeats + 5):  # the first 5 warm the connection
            for method in ("all_reduce", "gathered sum"):
                for wait, ranks in waits.items():
                    dist.barrier()
                    start = time.perf_counter()
                    if method == "all_reduce":
                        ranks._wait(dist.all_reduce(t, async_op=True))
                    else:
                        ranks._sum(t, out=t)
                    if i >= 5:
                        times.setdefault(f"{method}, {wait}, {n}", []).append(
                            time.perf_counter() - start)
    if dist.get_rank() == 0:
        with open(out_file, "w") as fh:
            json.dump({key: float(np.median(v)) for key, v in times.items()}, fh)


def reduction_times(repeats: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "reductions.json")
        distributed.launch(2, _time_reductions, (out, repeats))
        return json.load(open(out))


def gathered_sum(n: int, nbytes: float, latency: float, bandwidth: float) -> float:
    """The trainer's sum over n ranks: a ring all-gather, n - 1 messages in
    sequence, each rank receiving (n - 1) times the data. With n = 2: one
    latency + bytes / bandwidth."""
    return (n - 1) * (latency + nbytes / bandwidth)


def predict(n: int, branches: int, a: float, b: float, latency: float, bandwidth: float,
            grad_bytes: int, grad_reduces: int, small_reduces: int) -> float:
    """Seconds per iteration with n processes sharing ``branches``."""
    return (a + b * branches / n + grad_reduces * gathered_sum(n, grad_bytes, latency, bandwidth)
            + small_reduces * gathered_sum(n, 256, latency, bandwidth))


def compare_throughput(report: dict, iterations: int, rounds: int, cases=CASES,
                       competitors=TWO, heaps=("kept",)) -> None:
    report["throughput"] = {}
    print(f"1. throughput, pendulum, 8 branches x 64 steps per start state, overlap off, "
          f"{iterations} iterations per run, {report['cores']} cores; 2 processes: "
          + ", ".join(name for name, _ in competitors) + " (the trainer's default: pinned "
          f"{'here' if distributed.pin_ranks(2) else 'only with 2 CPUs'}; polling each "
          f"collective unless sleeping); heap: " + ", ".join(heaps) + "; every other round "
          "runs them in reverse order")
    # the runs of a round: (name, processes, environment, heap), a competitor's name with
    # the heap it ran with unless the trainer's (kept)
    runs, one_process = [], {}  # one_process: heap -> the name of its 1-process run
    for heap in heaps:
        suffix = "" if heap == "kept" else f", {heap} heap"
        one_process[heap] = "1 process" + suffix
        runs += [(one_process[heap], 1, {}, heap)]
        runs += [("2 processes, " + two + suffix, 2, env, heap) for two, env in competitors]
    twos = [run[0] for run in runs if run[1] == 2]
    for name, one_starts, two_starts in cases:
        pairs = []
        for r in range(rounds):
            load = os.getloadavg()[0]
            # what ran first had the machine in another state: alternate the order
            result = {run_name: throughput(nproc, iterations,
                                           one_starts if nproc == 1 else two_starts, env, heap)
                      for run_name, nproc, env, heap in (runs[::-1] if r % 2 else runs)}
            line = f"  {name}, round {r + 1} (load {load:.1f})"
            for run_name, nproc, _, heap in runs:
                got = result[run_name]
                line += (f"\n    {run_name}: {got['sim_steps_per_s'] / 1e6:.2f} M steps/s, "
                         f"{got['iterations_per_s']:.1f} updates/s")
                if nproc == 2:
                    one = result[one_process[heap]]
                    got["ratio"] = got["sim_steps_per_s"] / one["sim_steps_per_s"]
                    got["cpu_ratio"] = ((two_starts / got["cpu_s_per_iteration"])
                                        / (one_starts / one["cpu_s_per_iteration"]))
                    line += (f" | {got['ratio']:.2f}x wall, {got['cpu_ratio']:.2f}x by CPU time | "
                             f"{got['collectives_per_iteration']:.1f} collectives, "
                             f"{got['collective_s_per_iteration'] * 1e3:.1f} ms in them, the "
                             f"last rank {got['arrival_spread_s_per_iteration'] * 1e3:.1f} ms "
                             f"after the first")
                line += (f", {got['faults_per_iteration']:.0f} page faults per iteration, torch "
                         f"threads {got['threads']}")
            pairs.append({"load": load, **result})
            print(line, flush=True)
        summary = {"rounds": pairs}
        for two_name in twos:
            summary[two_name] = {key: float(np.median([p[two_name][key] for p in pairs]))
                                 for key in ("ratio", "cpu_ratio")}
        report["throughput"][name] = summary
        print(f"  {name}: median " + ", ".join(
            f"{two_name.removeprefix('2 processes, ')} {summary[two_name]['ratio']:.2f}x wall, "
            f"{summary[two_name]['cpu_ratio']:.2f}x by CPU time" for two_name in twos)
            + f" (goal >= {GOAL_RATIO}x)")


def cost_model(report: dict, iterations: int, repeats: int) -> None:
    print("2. cost model")
    starts = (32, 16, 8, 4)
    per_it = {s: compute_time(s, max(iterations // 2, 6)) for s in starts}
    branches = np.array([s * 8 for s in starts], dtype=float)
    b, a = np.polyfit(branches, [per_it[s] for s in starts], 1)
    print("  one process, CPU time per iteration: " + ", ".join(
        f"{s * 8} branches {per_it[s] * 1e3:.1f} ms" for s in starts)
        + f"\n  fit: a = {a * 1e3:.2f} ms fixed + b = {b * 1e6:.1f} us per branch")
    times = reduction_times(repeats)
    for method in ("all_reduce", "gathered sum"):
        for wait in ("sleeping", "polling"):
            print(f"  {method}, {wait}, 2 ranks, loopback: " + ", ".join(
                f"{n * 4 / 1e3:g} kB {times[f'{method}, {wait}, {n}'] * 1e6:.0f} us"
                for n in SIZES))
    # the trainer's (gathered sum, polling), 2 ranks: t = latency + bytes / bandwidth; the
    # latency from the smallest message, the bandwidth from the slope between the two largest
    ours = [times[f"gathered sum, polling, {n}"] for n in SIZES]
    latency = ours[0]
    bandwidth = 4 * (SIZES[-1] - SIZES[-2]) / max(ours[-1] - ours[-2], 1e-9)
    print(f"  fit (gathered sum, polling): latency {latency * 1e6:.0f} us per message, "
          f"{bandwidth / 1e9:.2f} GB/s")
    cfg = config(1)
    policy = Trainer(cfg, "pendulum", "gym", Ranks()).policy
    grad_floats = sum(p.numel() for p in policy.parameters())
    grad_reduces = cfg.epochs * cfg.minibatches
    small = 1 + (2 if cfg.adv_scale == "batch" else 0)  # normaliser, diagnostics, clock (+ std)
    model = dict(a=a, b=b, latency=latency, bandwidth=bandwidth, grad_bytes=4 * grad_floats,
                 grad_reduces=grad_reduces, small_reduces=small)
    print(f"  gradient {grad_floats} floats ({4 * grad_floats / 1e3:.1f} kB), {grad_reduces} "
          f"gradient sums per iteration + {small} small one(s)")
    report["cost_model"] = {**model, "compute_s": per_it, "reduction_s": times,
                            "predictions": []}
    networks = (("loopback, as measured", latency, bandwidth),
                ("10 GbE, assumed", NET_LATENCY, NET_BANDWIDTH))
    for network, lat, bw in networks:
        net = {**model, "latency": lat, "bandwidth": bw}
        t32, t128 = predict(1, 256, **net), predict(1, 1024, **net)
        print(f"  predicted, {network} ({lat * 1e6:.0f} us, {bw / 1e9:.2f} GB/s): 2 processes "
              f"{t32 / predict(2, 256, **net):.2f}x (32 starts split), "
              f"{t128 / predict(2, 1024, **net):.2f}x (128 split)")
        for n in PREDICT_AT:
            row = {"network": network, "n": n,
                   # the default batch split n ways (32 starts: at most 32 processes)
                   "strong_speedup": t32 / predict(n, 256, **net) if 32 % n == 0 else None,
                   # 32 or 128 starts on every process: n times the steps per iteration
                   "weak_speedup_32": n * t32 / predict(n, 256 * n, **net),
                   "weak_speedup_128": n * t128 / predict(n, 1024 * n, **net)}
            report["cost_model"]["predictions"].append(row)
            print(f"  {n:5d} processes: steps/s over one process's with 32 starts split "
                  + (f"{row['strong_speedup']:.1f}x" if row["strong_speedup"] else "(impossible)")
                  + f", 32 per process {row['weak_speedup_32']:.1f}x, 128 per process "
                  f"{row['weak_speedup_128']:.1f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=40, help="iterations per timed run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating 1- and 2-process runs")
    ap.add_argument("--quick", action="store_true", help="15 iterations, 2 rounds, fewer repeats")
    ap.add_argument("--only", choices=("throughput", "model"), help="run one part")
    ap.add_argument("--case", action="append", choices=[c[0] for c in CASES],
                    help="throughput only for this batch case (repeatable; default: all)")
    ap.add_argument("--two", action="append", choices=[c[0] for c in TWO],
                    help="throughput only for this 2-process competitor (repeatable; default: "
                         "all)")
    ap.add_argument("--heap", choices=("kept", "glibc", "both"), default="kept",
                    help="the trainer's kept heap (grpo_ctrl/heap.py), glibc's default "
                         "thresholds (the trainer before December 1), or both side by side")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    iterations, rounds, repeats = (15, 2, 20) if args.quick else (args.iterations, args.rounds, 100)
    torch.set_num_threads(1)
    report = {"load_before": os.getloadavg(), "cores": len(os.sched_getaffinity(0))}
    if args.only != "model":
        compare_throughput(report, iterations, rounds,
                           [c for c in CASES if not args.case or c[0] in args.case],
                           [c for c in TWO if not args.two or c[0] in args.two],
                           ("kept", "glibc") if args.heap == "both" else (args.heap,))
    if args.only != "throughput":
        cost_model(report, iterations, repeats)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
