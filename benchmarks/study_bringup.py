#!/usr/bin/env python3
"""End to end on mystery HIL pendulums (issue 13): for each seed, the fit
``study_sysid.py --keep FOLDER`` left (``FOLDER/fitted{seed}.toml``),
``grpo-ctrl train --preset rig --plant`` with the default budget,
``grpo-ctrl export``, then 30 s of ``run_loop`` on the mystery HIL from
hanging, beside the nominally trained policy (``--nominal``, default
tests/data/pendulum-rig-grpo.onnx) on the same seed. Success: in the last
10 s the pendulum never leaves 0.3 rad of upright.

    python benchmarks/study_sysid.py --seeds 0-9 --keep /tmp/fits
    python benchmarks/study_bringup.py --fits /tmp/fits --seeds 0-9
"""
from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

from grpo_ctrl.firmware_bridge.hil import HilConfig, serve_hil
from grpo_ctrl.firmware_bridge.host import run_loop
from grpo_ctrl.plant import plant_spec
from grpo_ctrl.plant_file import mystery_plant

ROOT = Path(__file__).resolve().parent.parent


def fly(seed: int, policy: Path, log: Path) -> tuple[str, float]:
    truth = mystery_plant(plant_spec("pendulum", "rig"), seed)
    with serve_hil(HilConfig(system="pendulum", preset="rig", plant=truth, angle0=math.pi,
                             watchdog_ms=300)) as hil:
        summary = run_loop(hil.port, policy, 30.0, log, False, print_fn=lambda *a: None)
        trace = hil.trace()
    t, theta = trace["t"], trace["x"][:, 0]
    off_upright = np.abs(np.remainder(theta + np.pi, 2 * np.pi) - np.pi)
    return summary["ended"], float(off_upright[t > t[-1] - 10].max())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fits", required=True)
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--nominal", default=str(ROOT / "tests/data/pendulum-rig-grpo.onnx"))
    args = p.parse_args()
    lo, _, hi = args.seeds.partition("-")
    fits = Path(args.fits)
    ok = {"fitted": 0, "nominal": 0}
    n = 0
    print("| seed | fitted policy: ended, max off upright in last 10 s | nominal policy |")
    print("|---|---|---|")
    for seed in range(int(lo), int(hi or lo) + 1):
        run, onnx = fits / f"run{seed}", fits / f"policy{seed}.onnx"
        subprocess.run(["grpo-ctrl", "train", "--preset", "rig", "--plant",
                        str(fits / f"fitted{seed}.toml"), "--out", str(run), "--quiet"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["grpo-ctrl", "export", str(run), "--onnx", str(onnx)], check=True,
                       stdout=subprocess.DEVNULL)
        cells = []
        for tag, policy in (("fitted", onnx), ("nominal", Path(args.nominal))):
            ended, worst = fly(seed, policy, fits / f"run-{tag}{seed}.csv")
            ok[tag] += ended.startswith("completed") and worst < 0.3
            cells.append(f"{ended}, {worst:.3f} rad")
        n += 1
        print(f"| {seed} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nupright at the end: fitted {ok['fitted']}/{n}, nominal {ok['nominal']}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
