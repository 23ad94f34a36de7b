"""``grpo-ctrl excite``: a safe identification experiment on the rig.

A multisine torque (15 tones, 0.2-4 Hz, random phases: every frequency the
pendulum's dynamics live in, at a low crest factor) around the hanging
position: the first half at a third of the actuator limit, the second at
two thirds (small swings), faded in and out. A guard overrides it: beyond
``--max-swing`` from hanging, or half the device's velocity limit (from its
INFO), the command brakes. The run goes through ``run_loop`` like
``grpo-ctrl run``: same link, loop, telemetry, and the same safe stop (zero
command, DISARM) on every exit path. The log feeds ``grpo-ctrl sysid``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.option_types import number, positive_int, seed

TONES = np.linspace(0.2, 4.0, 15)  # Hz
AMPLITUDES = (1 / 3, 2 / 3)         # of u_max: around hanging, then small swings
FADE_S = 0.5


def multisine(duration: float, dt: float, seed: int) -> np.ndarray:
    """The excitation's shape at steps of ``dt``: peak 1, its amplitude
    profile applied (a third, then two thirds, faded in and out)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(math.ceil(duration / dt)) + 1) * dt
    u = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 2 * np.pi)) for f in TONES)
    u = u / np.max(np.abs(u))
    profile = np.where(t < duration / 2, AMPLITUDES[0], AMPLITUDES[1])
    fade = np.clip(np.minimum(t, duration - t) / FADE_S, 0, 1)
    return u * profile * fade


class Excitation:
    """The host-side command source: the multisine by device-independent
    wall time since the first STATE, with the guard. Called once per STATE
    (and for keep-alives), allocation-free but for the float it returns."""

    def __init__(self, info, features, duration: float, seed: int, max_swing: float):
        spec = features.spec
        self.u_max = float(info.u_limit or info.u_max)
        self.dt = info.period_us * 1e-6
        self.shape = multisine(duration, self.dt, seed) * self.u_max
        self.features = features
        self.vel_obs = spec.obs_index[spec.pole_velocity]
        pole_channel = [v for _, v in spec.channels].index(spec.pole_velocity)
        limit = info.vel_limit[pole_channel] * features.scale[pole_channel]
        self.vel_guard = 0.5 * limit if limit > 0 else math.inf
        self.max_swing = max_swing
        self.t0 = None

    def __call__(self, obs) -> float:
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        k = min(int((now - self.t0) / self.dt), len(self.shape) - 1)
        u = float(self.shape[k])
        swing = math.remainder(self.features.angle(obs) - math.pi, 2 * math.pi)
        velocity = float(obs[self.vel_obs])
        brake = AMPLITUDES[1] * self.u_max
        if abs(velocity) > self.vel_guard:
            return -math.copysign(brake, velocity)
        if abs(swing) > self.max_swing and u * swing > 0:
            return -math.copysign(brake, swing)
        return u


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", required=True,
                   help="serial device path or pyserial URL (as for `grpo-ctrl run`)")
    p.add_argument("--system", default="pendulum", help="the plant on the port (checked)")
    p.add_argument("--preset", default=None,
                   help="its preset, checked against the device's (default: the device's)")
    p.add_argument("--duration", type=number(float, 5.0, 3600.0, unit=" (seconds; sysid needs "
                                             ">= 5)"), default=20.0, metavar="S",
                   help="length of the experiment (default 20; sysid needs >= 5)")
    p.add_argument("--log", required=True, help="telemetry file, .csv or .jsonl, for sysid")
    p.add_argument("--plot", default=None, help="PNG plot (default: next to the log)")
    p.add_argument("--max-swing", type=number(float, above=0.0, high=math.pi / 2, unit=" (rad)"),
                   default=1.0, metavar="RAD",
                   help="brake beyond this angle from hanging (default 1.0)")
    p.add_argument("--seed", type=seed, default=0, help="phases of the multisine")
    p.add_argument("--baud", type=positive_int(100_000_000), default=1_000_000,
                   help="baud rate for a UART")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args) -> int:
    from grpo_ctrl.firmware_bridge.host import EXIT_CODES, run_loop
    from grpo_ctrl.firmware_bridge.loop import format_summary
    from grpo_ctrl.plant import plant_spec

    if args.system != "pendulum":
        raise UserError(f"excite drives the pendulum so far; --system {args.system!r} is not "
                        "supported yet")
    try:
        spec = plant_spec(args.system, args.preset)
    except ValueError as e:
        raise UserError(str(e)) from None

    def make_policy(info, features):
        if features.system != spec.system or args.preset not in (None, info.preset):
            raise UserError(f"the device on {args.port} is {features.system}/{info.preset}, not "
                            f"{spec.system}/{args.preset or 'any'}: check --port, --system and "
                            "--preset")
        return Excitation(info, features, args.duration, args.seed, args.max_swing)

    summary = run_loop(args.port, None, args.duration, args.log, args.plot, baudrate=args.baud,
                       make_policy=make_policy)
    print(json.dumps(summary) if args.json else format_summary(summary), flush=True)
    if summary["ended"].startswith("error: "):
        print(f"grpo-ctrl excite: {summary['ended']}", file=sys.stderr, flush=True)
    return EXIT_CODES.get(summary["ended"].split(":")[0], 1)
