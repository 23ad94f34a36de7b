#!/usr/bin/env python3
"""End to end on mystery HIL plants (issue 13): for each seed, the fit
``study_sysid.py --keep FOLDER`` left (``FOLDER/fitted{seed}.toml``),
``grpo-ctrl train --system S --plant`` with the default budget,
``grpo-ctrl export``, then 30 s of ``run_loop`` on the mystery HIL from
hanging (the encoders' noise as in the fit's study), beside a nominally
trained policy (``--nominal``: an ONNX file, or ``train`` to train one with
the preset's default randomisation first) on the same seed. Success: the
run completes (no limit tripped) and in its last 10 s armed the pendulum
never leaves 0.3 rad of upright. Each flight also reports the deadlines
the host loop missed (a loaded machine stalls the host and the emulated
device alike: what a real rig's own processor would not do) and, for the
Furuta, the arm's largest excursion (its limit is 2 rad). Beside each
trained policy, its share of ``--sim-episodes`` simulated 30 s flights on
the revealed plant (the C simulator holding the true parameters, delay,
lag and offset, plus the host loop's tick) that end upright and still
without a limit: it tells a policy that fails the plant from a flight that
failed the machine.

    python benchmarks/study_sysid.py --seeds 0-9 --keep /tmp/fits
    python benchmarks/study_bringup.py --fits /tmp/fits --seeds 0-9
    python benchmarks/study_sysid.py --system furuta --seeds 0-9 --keep /tmp/fu
    python benchmarks/study_bringup.py --system furuta --fits /tmp/fu --nominal train

The Furuta's default budget (120 s) gives about 250 iterations on a loaded
2-core machine, far from the ~1200-1500 a quiet one gives (docs/distributed.md
§6: 1,176 with ``--overlap false``); ``--iterations 1176 --overlap false``
trains by count instead, and ``--reuse`` flies the policies a previous or
parallel run exported.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from grpo_ctrl.closed_loop import run_episodes
from grpo_ctrl.firmware_bridge.hil import HilConfig, serve_hil
from grpo_ctrl.firmware_bridge.host import run_loop
from grpo_ctrl.firmware_bridge.protocol import MODE_ARMED
from grpo_ctrl.plant import plant_spec
from grpo_ctrl.plant_file import mystery_plant
from grpo_ctrl.policy import load_policy_controller
from grpo_ctrl.randomize import HOST_TICK
from grpo_ctrl.sim import BatchSim

PRESETS = {"pendulum": "rig", "furuta": "qube-servo2"}  # the rigs
REUSE = False  # --reuse: a policy already exported is flown, not trained again
ROOT = Path(__file__).resolve().parent.parent


def fly(system: str, seed: int, policy: Path, log: Path, noise: float) -> tuple[str, float, str]:
    """30 s on the mystery HIL: how it ended, the largest angle off upright in
    its last 10 s armed, and a note (missed deadlines, the Furuta arm's reach)."""
    spec = plant_spec(system, PRESETS[system])
    truth = mystery_plant(spec, seed)
    with serve_hil(HilConfig(system=system, preset=spec.preset, plant=truth, angle0=math.pi,
                             watchdog_ms=300, sensor_noise=noise)) as hil:
        summary = run_loop(hil.port, policy, 30.0, log, False, print_fn=lambda *a: None)
        trace = hil.trace()
    # the armed ticks only: the trace goes on while run_loop closes its log, and a
    # disarmed pendulum falls
    armed = trace["mode"] == MODE_ARMED
    t, angle = trace["t"][armed], trace["x"][armed, spec.pole_angle]
    off_upright = np.abs(np.remainder(angle + np.pi, 2 * np.pi) - np.pi)
    note = f"missed {summary.get('missed_deadlines', 0) / max(len(t), 1):.1%}"
    if system == "furuta":
        note += f", arm {np.abs(trace['x'][armed, 0]).max():.2f} rad"
    return summary["ended"], float(off_upright[t > t[-1] - 10].max()), note


def simulated(system: str, seed: int, run: Path, episodes: int, noise: float) -> float:
    """The share of ``episodes`` simulated 30 s flights of ``run``'s policy on
    seed's revealed plant (delay + the host loop's tick, lag, offset, encoder
    noise) from rest at hanging that end upright and still without a limit."""
    torch.set_num_threads(1)  # small batches: a second thread only spins (docs/grpo.md §6)
    spec = plant_spec(system, PRESETS[system])
    truth = mystery_plant(spec, seed)
    sim = BatchSim(system, episodes, spec.preset, seed=seed, hold_plant=True,
                   noise_std=[noise if k < spec.nx // 2 else 0.0 for k in range(spec.nx)])
    sim.set_plant({**truth.params, "delay": truth.delay + HOST_TICK, "motor_k": truth.motor_k,
                   f"offset_{spec.state_names[spec.pole_angle]}": truth.offset})
    start = np.repeat(spec.rest_state(math.pi)[None], episodes, axis=0)
    eps = run_episodes(load_policy_controller(run), sim, round(30.0 / spec.dt), start)
    return float(eps.success.mean())


def train(system: str, out: Path, onnx: Path, *extra: str) -> None:
    if REUSE and onnx.is_file() and out.is_dir():
        return
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
    p.add_argument("--iterations", type=int, default=0,
                   help="train this many iterations without a time budget (default: the "
                        "preset's default budget)")
    p.add_argument("--overlap", choices=("true", "false"), default=None,
                   help="train with the overlap collector on or off (default: the preset's)")
    p.add_argument("--sim-episodes", type=int, default=20,
                   help="simulated flights per policy on the revealed plant (0: none)")
    p.add_argument("--flights", action=argparse.BooleanOptionalAction, default=True,
                   help="fly on the HIL (--no-flights: the simulated flights only, which "
                        "machine load does not change)")
    p.add_argument("--reuse", action="store_true",
                   help="fly policies already exported in --fits instead of training them")
    args = p.parse_args()
    global REUSE
    REUSE = args.reuse
    budget = (["--iterations", str(args.iterations), "--time-budget", "0"]
              if args.iterations else [])
    budget += ["--overlap", args.overlap] if args.overlap else []
    lo, _, hi = args.seeds.partition("-")
    fits = Path(args.fits)
    nominal = Path(args.nominal)
    if args.nominal == "train":
        nominal = fits / "policy-nominal.onnx"
        train(args.system, fits / "run-nominal", nominal, *budget)
    ok = {"fitted": 0, "nominal": 0}
    n = 0
    print(f"load average at the start {os.getloadavg()[0]:.1f}")
    print("| seed | fitted policy: ended, max off upright in last 10 s (flight) "
          "| simulated | nominal policy | simulated |")
    print("|---|---|---|---|---|")
    for seed in range(int(lo), int(hi or lo) + 1):
        onnx = fits / f"policy{seed}.onnx"
        train(args.system, fits / f"run{seed}", onnx, "--plant",
              str(fits / f"fitted{seed}.toml"), *budget)
        cells = []
        for tag, policy, run in (("fitted", onnx, fits / f"run{seed}"),
                                 ("nominal", nominal, fits / "run-nominal")):
            if args.flights:
                ended, worst, note = fly(args.system, seed, policy,
                                         fits / f"run-{tag}{seed}.csv", args.sensor_noise)
                ok[tag] += ended.startswith("completed") and worst < 0.3
                cells.append(f"{ended}, {worst:.3f} rad ({note})")
            else:
                cells.append("-")
            share = (simulated(args.system, seed, run, args.sim_episodes, args.sensor_noise)
                     if args.sim_episodes and run.is_dir() else None)
            cells.append("-" if share is None else f"{share:.0%}")
        n += 1
        print(f"| {seed} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nupright at the end: fitted {ok['fitted']}/{n}, nominal {ok['nominal']}/{n}; "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
