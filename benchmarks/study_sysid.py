#!/usr/bin/env python3
"""System identification on mystery HIL plants (issue 13, "What must show").

For each seed: ``grpo-ctrl hil --mystery SEED`` (in process: the preset's
2048-count encoders, ``--sensor-noise`` Gaussian noise before counting, the
hidden plant, delay, offset and motor lag), ``grpo-ctrl excite --duration
S``, ``grpo-ctrl sysid`` on its log; then the fitted values against the
revealed ones. Prints a Markdown table (true, fitted, error for each seed and
parameter) and the worst relative error per parameter.

    python benchmarks/study_sysid.py --system pendulum --seeds 0-9 --duration 20
    python benchmarks/study_sysid.py --system furuta --seeds 0-9 --duration 20

The Furuta's fit needs the pendulum's mass and the motor's resistance
(sysid's module docstring): the study hands sysid the true values, as a
user would weigh the rod and read an ohmmeter (``--known-error`` spoils
them by a relative amount, to see what a measurement error costs).

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
from grpo_ctrl.sysid import model_for

FITTED = {"pendulum": ("m", "l", "b", "fc"),
          "furuta": ("km", "lr", "jr", "dr", "lp", "jp", "dp")}
PRESETS = {"pendulum": "rig", "furuta": "qube-servo2"}  # the rigs


def lag_steps(delay: int, motor_k: float) -> float:
    """The actuator's mean delay in steps: the dead time plus the first-order
    lag's (1 - k) / k; what a slow excitation sees of the two."""
    return delay + (1 - motor_k) / motor_k


def seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def one(system: str, seed: int, duration: float, folder: str, noise: float,
        known_error: float) -> tuple:
    spec = plant_spec(system, PRESETS[system])
    truth = mystery_plant(spec, seed)
    log, out = f"{folder}/excite{seed}.csv", f"{folder}/fitted{seed}.toml"
    known = [f"--known={k}={truth.params[k] * (1 + known_error):.9g}"
             for k in model_for(spec).known_names if k not in ("g", "mr")]
    with serve_hil(HilConfig(system=system, preset=spec.preset, plant=truth, angle0=math.pi,
                             watchdog_ms=300, sensor_noise=noise)) as hil:
        quiet = io.StringIO()
        stdout, sys.stdout = sys.stdout, quiet
        try:
            rc = main(["excite", "--port", hil.port, "--system", system, "--preset",
                       spec.preset, "--duration", str(duration), "--log", log])
            rc = rc or main(["sysid", log, "--system", system, "--preset", spec.preset,
                             "--out", out, *known])
        finally:
            sys.stdout = stdout
    if rc:
        print(f"seed {seed} failed ({rc}): {quiet.getvalue().splitlines()[:1]}", file=sys.stderr)
        return truth, None
    return truth, read_plant_file(out, spec)


def run(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", default="pendulum", choices=sorted(FITTED))
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--sensor-noise", type=float, default=0.001,
                   help="std of the HIL's encoder noise before counting, rad (default 0.001, "
                        "a third of a 2048-count step)")
    p.add_argument("--known-error", type=float, default=0.0,
                   help="relative error of the measured parameters handed to sysid")
    p.add_argument("--keep", default=None, metavar="FOLDER",
                   help="keep the logs and fits here (for end-to-end runs)")
    args = p.parse_args(argv)
    params = FITTED[args.system]
    worst = {k: 0.0 for k in (*params, "motor_k")}
    delays_ok = fitted = 0
    worst_lag = 0.0
    print("| seed | " + " | ".join(f"{k} true / fitted (err)" for k in params) +
          " | motor_k true / fitted | delay true / fitted | delay + lag (steps) true / fitted "
          "| offset true / fitted (rad) |")
    print("|---" * (len(params) + 5) + "|")
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or scratch
        all_seeds = seeds(args.seeds)
        for seed in all_seeds:
            truth, fit = one(args.system, seed, args.duration, folder, args.sensor_noise,
                             args.known_error)
            if fit is None:
                print(f"| {seed} | failed |")
                continue
            cells = []
            for k in params:
                err = fit.params[k] / truth.params[k] - 1
                worst[k] = max(worst[k], abs(err))
                cells.append(f"{truth.params[k]:.4g} / {fit.params[k]:.4g} ({err:+.1%})")
            worst["motor_k"] = max(worst["motor_k"], abs(fit.motor_k / truth.motor_k - 1))
            delays_ok += fit.delay == truth.delay
            fitted += 1
            lags = lag_steps(truth.delay, truth.motor_k), lag_steps(fit.delay, fit.motor_k)
            worst_lag = max(worst_lag, abs(lags[1] - lags[0]))
            print(f"| {seed} | " + " | ".join(cells) + f" | {truth.motor_k:.3f} / "
                  f"{fit.motor_k:.3f} | {truth.delay} / {fit.delay} | {lags[0]:.2f} / "
                  f"{lags[1]:.2f} | {truth.offset:+.4f} / {fit.offset:+.4f} |", flush=True)
    print("\nworst |error|: " + ", ".join(f"{k} {v:.1%}" for k, v in worst.items()) +
          f"; delay exact on {delays_ok} of {fitted} fitted, delay + lag within {worst_lag:.2f} "
          f"steps; {len(all_seeds) - fitted} failed")
    return 0


if __name__ == "__main__":
    sys.exit(run())
