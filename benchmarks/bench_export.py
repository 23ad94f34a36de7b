#!/usr/bin/env python3
"""Single-observation controller latency, side by side in one process.

One observation in, one command out, the way the serial bridge runs a
controller every control period, for the default GRPO policy network
(2 x 64 ReLU, tanh-squashed, pendulum: 3 observations) by:

* ``torch``: the PyTorch controller, eager, ``inference_mode``, one thread;
* ``ort-default``: onnxruntime with default session options;
* ``ort-tuned``: ``export.session.PolicySession`` (one intra-op thread, no
  spinning, all graph optimisations), as the bridge calls it;
* ``c-ctypes``: the generated C, built with the host compiler, called from
  Python through ctypes;
* ``c-loop``: the same C called in a C loop (no Python at all).

Each call is timed on its own (``perf_counter_ns``; ``clock_gettime`` in C)
over a cycle of distinct operating-range observations; prints median and
99th percentile in microseconds, and the ratio of each median to
``ort-tuned``. The network's weights are random: latency does not depend
on their values.

    python benchmarks/bench_export.py        # or: grpo-ctrl bench export
    python benchmarks/bench_export.py --quick --json export.json

Target (issue 5): ort-tuned median <= 15 us and p99 <= 50 us. The machine
is shared: timings are noisy, so read the ratios and repeat.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from grpo_ctrl.export.c_build import CFLAGS, CPolicy, compile_shared, host_cc
from grpo_ctrl.export.c_codegen import write_c
from grpo_ctrl.export.onnx_export import export_onnx
from grpo_ctrl.export.session import PolicySession
from grpo_ctrl.export.verify import operating_observations
from grpo_ctrl.grpo_config import GRPOConfig
from grpo_ctrl.policy import GaussianPolicy, PolicyController
from grpo_ctrl.sim import BatchSim

TARGET_MEDIAN_US, TARGET_P99_US = 15.0, 50.0
DISTINCT_OBS = 1000

C_LOOP = r"""
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "policy.h"

static int by_value(const void *a, const void *b) {
  long long x = *(const long long *)a, y = *(const long long *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  /* argv: calls; stdin: DISTINCT observations, POLICY_NOBS floats each */
  if (argc != 2) return 2;
  long calls = atol(argv[1]);
  static float obs[%(distinct)d][POLICY_NOBS];
  for (int i = 0; i < %(distinct)d; ++i)
    for (int k = 0; k < POLICY_NOBS; ++k)
      if (scanf("%%f", &obs[i][k]) != 1) return 2;
  long long *ns = malloc(sizeof(long long) * calls);
  volatile float sink = 0.0f;
  float action;
  for (long i = 0; i < calls; ++i) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    policy_step(obs[i %% %(distinct)d], &action);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    sink += action;
    ns[i] = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
  }
  qsort(ns, calls, sizeof(long long), by_value);
  printf("%%lld %%lld\n", ns[calls / 2], ns[(long)(calls * 0.99)]);
  free(ns);
  return sink == 12345.0f;
}
"""


def default_policy_controller(system: str = "pendulum", preset: str = "gym"):
    """The default GRPOConfig network, random weights, realistic normaliser."""
    cfg = GRPOConfig()
    spec = BatchSim(system, 1, preset).spec
    torch.manual_seed(0)
    policy = GaussianPolicy(spec.nobs, spec.u_max, cfg.hidden, cfg.layers, cfg.activation)
    policy.obs_norm.update(torch.from_numpy(operating_observations(system, preset, 2000)))
    return PolicyController(policy, spec), cfg


def time_calls(fn, inputs: list, calls: int) -> np.ndarray:
    """Nanoseconds of each of ``calls`` calls ``fn(inputs[i % len(inputs)])``,
    after a warm-up."""
    n = len(inputs)
    for i in range(min(calls // 10, 2000)):
        fn(inputs[i % n])
    out = np.empty(calls, np.int64)
    clock = time.perf_counter_ns
    for i in range(calls):
        x = inputs[i % n]
        t0 = clock()
        fn(x)
        out[i] = clock() - t0
    return out


def c_loop(folder: Path, observations: np.ndarray, calls: int) -> tuple[float, float]:
    main_c = folder / "bench_main.c"
    main_c.write_text(C_LOOP % {"distinct": len(observations)})
    exe = folder / "bench_policy"
    build = subprocess.run([host_cc(), *CFLAGS, str(main_c), str(folder / "policy.c"), "-o",
                            str(exe), "-lm"], capture_output=True, text=True)
    if build.returncode:
        raise RuntimeError(f"the C benchmark loop does not build:\n{build.stderr}")
    text = "\n".join(" ".join(f"{v:.9g}" for v in row) for row in observations)
    out = subprocess.run([str(exe), str(calls)], input=text, capture_output=True, text=True,
                         check=True).stdout.split()
    return int(out[0]) / 1e3, int(out[1]) / 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="grpo-ctrl bench export",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20_000, help="timed calls per competitor")
    parser.add_argument("--quick", action="store_true", help="2,000 calls per competitor")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    calls = 2_000 if args.quick else args.calls
    torch.set_num_threads(1)
    controller, cfg = default_policy_controller()
    observations = operating_observations("pendulum", "gym", DISTINCT_OBS, seed=1)
    results: dict[str, dict] = {}

    with tempfile.TemporaryDirectory(prefix="bench_export_") as tmp:
        folder = Path(tmp)
        onnx_path = folder / "policy.onnx"
        model, _ = export_onnx(controller, onnx_path, source="bench (random weights)")

        def record(name, ns=None, median_us=None, p99_us=None):
            if ns is not None:
                median_us, p99_us = np.median(ns) / 1e3, np.percentile(ns, 99) / 1e3
            results[name] = {"median_us": float(median_us), "p99_us": float(p99_us)}

        rows = list(observations)
        with torch.inference_mode():
            tensors = [torch.from_numpy(o[None, :].copy()) for o in observations]
            record("torch", time_calls(controller, tensors, calls))

        default = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        feeds = [{"obs": o[None, :].copy()} for o in observations]
        record("ort-default", time_calls(lambda feed: default.run(None, feed), feeds, calls))

        tuned = PolicySession(onnx_path, system="pendulum", nobs=3)
        record("ort-tuned", time_calls(tuned, rows, calls))

        if host_cc() is not None:
            write_c(model, folder / "c")
            lib = compile_shared(folder / "c" / "policy.c", folder / "libpolicy.so")
            record("c-ctypes", time_calls(CPolicy(lib, 3), rows, calls))
            record("c-loop", None, *c_loop(folder / "c", observations, max(calls, 100_000)))
        else:
            print("no host C compiler: skipping the C competitors")

    ref = results["ort-tuned"]["median_us"]
    print(f"single-observation latency, default policy network ({cfg.layers} x {cfg.hidden} "
          f"{cfg.activation}, pendulum), {calls} calls each; {platform.processor() or platform.machine()}, "
          f"onnxruntime {ort.__version__}, torch {torch.__version__}")
    print(f"{'competitor':<12} {'median us':>10} {'p99 us':>10} {'median / ort-tuned':>20}")
    for name, r in results.items():
        print(f"{name:<12} {r['median_us']:>10.2f} {r['p99_us']:>10.2f} "
              f"{r['median_us'] / ref:>19.2f}x")
    tuned_r = results["ort-tuned"]
    ok = tuned_r["median_us"] <= TARGET_MEDIAN_US and tuned_r["p99_us"] <= TARGET_P99_US
    print(f"target ort-tuned median <= {TARGET_MEDIAN_US:g} us and p99 <= {TARGET_P99_US:g} us: "
          f"{'met' if ok else 'NOT met'} ({tuned_r['median_us']:.2f} us, {tuned_r['p99_us']:.2f} us)")
    if args.json:
        report = {"calls": calls, "results": results, "target_met": ok,
                  "cpu_count": os.cpu_count(), "machine": platform.machine()}
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
