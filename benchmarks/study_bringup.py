#!/usr/bin/env python3
"""End to end on mystery HIL plants (issue 13): for each seed, the fit
``study_sysid.py --keep FOLDER`` left (``FOLDER/fitted{seed}.toml``),
``grpo-ctrl train --system S --plant`` with the default budget,
``grpo-ctrl export``, then 30 s of ``run_loop`` on the mystery HIL from
hanging (the encoders' noise as in the fit's study), beside a nominally
trained policy (``--nominal``: an ONNX file, or ``train`` to train one with
the preset's default randomisation first) on the same seed. Success: the
run completes (no limit tripped) and in the last 10 s the pendulum never
leaves 0.3 rad of upright.

    python benchmarks/study_sysid.py --seeds 0-9 --keep /tmp/fits
    python benchmarks/study_bringup.py --fits /tmp/fits --seeds 0-9
    python benchmarks/study_sysid.py --system furuta --seeds 0-9 --keep /tmp/fu
    python benchmarks/study_bringup.py --system furuta --fits /tmp/fu --nominal train
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

PRESETS = {"pendulum": "rig", "furuta": "qube-servo2"}  # the rigs
ROOT = Path(__file__).resolve().parent.parent


def fly(system: str, seed: int, policy: Path, log: Path, noise: float) -> tuple[str, float]:
    spec = plant_spec(system, PRESETS[system])
    truth = mystery_plant(spec, seed)
    with serve_hil(HilConfig(system=system, preset=spec.preset, plant=truth, angle0=math.pi,
                             watchdog_ms=300, sensor_noise=noise)) as hil:
        summary = run_loop(hil.port, policy, 30.0, log, False, print_fn=lambda *a: None)
        trace = hil.trace()
    t, angle = trace["t"], trace["x"][:, spec.pole_angle]
    off_upright = np.abs(np.remainder(angle + np.pi, 2 * np.pi) - np.pi)
    return summary["ended"], float(off_upright[t > t[-1] - 10].max())


def train(system: str, out: Path, onnx: Path, *extra: str) -> None:
    subprocess.run(["grpo-ctrl", "train", "--system", system, "--preset", PRESETS[system],
                    *extra, "--out", str(out),
                    "--quiet"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["grpo-ctrl", "export", str(out), "--onnx", str(onnx)], check=True,
                   stdout=subprocess.DEVNULL)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", default="pendulum")
    p.add_argument("--fits", required=True)
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--nominal", default=str(ROOT / "tests/data/pendulum-rig-grpo.onnx"),
                   help="the nominally trained policy, or 'train' to train one here")
    p.add_argument("--sensor-noise", type=float, default=0.001)
    args = p.parse_args()
    lo, _, hi = args.seeds.partition("-")
    fits = Path(args.fits)
    nominal = Path(args.nominal)
    if args.nominal == "train":
        nominal = fits / "policy-nominal.onnx"
        train(args.system, fits / "run-nominal", nominal)
    ok = {"fitted": 0, "nominal": 0}
    n = 0
    print("| seed | fitted policy: ended, max off upright in last 10 s | nominal policy |")
    print("|---|---|---|")
    for seed in range(int(lo), int(hi or lo) + 1):
        onnx = fits / f"policy{seed}.onnx"
        train(args.system, fits / f"run{seed}", onnx, "--plant",
              str(fits / f"fitted{seed}.toml"))
        cells = []
        for tag, policy in (("fitted", onnx), ("nominal", nominal)):
            ended, worst = fly(args.system, seed, policy, fits / f"run-{tag}{seed}.csv",
                               args.sensor_noise)
            ok[tag] += ended.startswith("completed") and worst < 0.3
            cells.append(f"{ended}, {worst:.3f} rad")
        n += 1
        print(f"| {seed} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nupright at the end: fitted {ok['fitted']}/{n}, nominal {ok['nominal']}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
