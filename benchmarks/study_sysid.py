#!/usr/bin/env python3
"""System identification on mystery HIL pendulums (issue 13, "What must show").

For each seed: ``grpo-ctrl hil --mystery SEED`` (in process: the rig preset,
2048-count encoder quantisation, the hidden plant, delay and offset),
``grpo-ctrl excite --duration S``, ``grpo-ctrl sysid`` on its log; then the
fitted values against the revealed ones. Prints a Markdown table (true,
fitted, error for each seed) and the worst relative error per parameter.

    python benchmarks/study_sysid.py --seeds 0-9 --duration 20

The HIL runs in real time beside the host loop on this machine; the host's
missed deadlines under load only change which command each tick applied,
which the log records, so the fit does not depend on the load.
"""
from __future__ import annotations

import argparse
import io
import math
import sys
import tempfile

from grpo_ctrl.cli import main
from grpo_ctrl.firmware_bridge.hil import HilConfig, serve_hil
from grpo_ctrl.plant import plant_spec
from grpo_ctrl.plant_file import mystery_plant, read_plant_file

PARAMS = ("m", "l", "b", "fc")


def seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def one(seed: int, duration: float, folder: str) -> tuple:
    spec = plant_spec("pendulum", "rig")
    truth = mystery_plant(spec, seed)
    log, out = f"{folder}/excite{seed}.csv", f"{folder}/fitted{seed}.toml"
    with serve_hil(HilConfig(system="pendulum", preset="rig", plant=truth, angle0=math.pi,
                             watchdog_ms=300)) as hil:
        quiet = io.StringIO()
        stdout, sys.stdout = sys.stdout, quiet
        try:
            rc = main(["excite", "--port", hil.port, "--preset", "rig", "--duration",
                       str(duration), "--log", log])
            rc = rc or main(["sysid", log, "--preset", "rig", "--out", out])
        finally:
            sys.stdout = stdout
    if rc:
        print(f"seed {seed} failed ({rc}): {quiet.getvalue().splitlines()[:1]}", file=sys.stderr)
        return truth, None
    return truth, read_plant_file(out, spec)


def run(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--keep", default=None, metavar="FOLDER",
                   help="keep the logs and fits here (for end-to-end runs)")
    args = p.parse_args(argv)
    worst = {k: 0.0 for k in PARAMS}
    delays_ok = fitted = 0
    print("| seed | " + " | ".join(f"{k} true / fitted (err)" for k in PARAMS) +
          " | delay true / fitted | offset true / fitted (rad) |")
    print("|---" * (len(PARAMS) + 3) + "|")
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or scratch
        all_seeds = seeds(args.seeds)
        for seed in all_seeds:
            truth, fit = one(seed, args.duration, folder)
            if fit is None:
                print(f"| {seed} | failed |")
                continue
            cells = []
            for k in PARAMS:
                err = fit.params[k] / truth.params[k] - 1
                worst[k] = max(worst[k], abs(err))
                cells.append(f"{truth.params[k]:.4g} / {fit.params[k]:.4g} ({err:+.1%})")
            delays_ok += fit.delay == truth.delay
            fitted += 1
            print(f"| {seed} | " + " | ".join(cells) + f" | {truth.delay} / {fit.delay} | "
                  f"{truth.offset:+.4f} / {fit.offset:+.4f} |", flush=True)
    print("\nworst |error|: " + ", ".join(f"{k} {v:.1%}" for k, v in worst.items()) +
          f"; delay exact on {delays_ok} of {fitted} fitted; {len(all_seeds) - fitted} failed")
    return 0


if __name__ == "__main__":
    sys.exit(run())
