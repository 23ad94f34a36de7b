"""``grpo-ctrl excite``: a safe identification experiment on the rig.

A multisine command (15 tones, 0.2-4 Hz, random phases: every frequency the
pendulum's dynamics live in, at a low crest factor), the first half at a
third of the actuator limit, the second at two thirds (small swings), faded
in and out. For the pendulum it is the torque, around the hanging position.
For the Furuta pendulum it is added, 1.4 times larger, to a loop that holds
the arm on a slow sweep around its start (a PD controller tuned on the
preset to 2 Hz, damping 0.7; the arm is an integrator of the voltage and
would run into its stops; the sweep, 0.4 rad at 0.25 Hz, shows the arm's
damping), so the arm swings about a radian and shakes the rod. Guards
override it per tick: beyond ``--max-swing`` from hanging, or half the
device's velocity limit (from its INFO), the pendulum's command brakes and
the Furuta's excitation stops; the Furuta's arm beyond 60 % of the device's
position limit is never pushed further. The run goes through ``run_loop``
like ``grpo-ctrl run``: same link, loop, telemetry, and the same safe stop
(zero command, DISARM) on every exit path. The log feeds ``grpo-ctrl
sysid``.
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


ARM_HOLD_HZ, ARM_HOLD_DAMPING = 2.0, 0.7   # the Furuta arm's holding loop
ARM_GUARD = 0.6                             # of the device's arm position limit
# The Furuta's arm follows a slow sweep, ARM_SWEEP_RAD * sin(2 pi ARM_SWEEP_HZ t) (at most a
# third of the guard; faded in and out over ARM_SWEEP_FADE_S): slow enough that the arm's
# damping km^2/rm + dr opposes it about as much as its inertia does (at the rod's 1.7 Hz the
# inertia is ten times the damping); dr is that sum less km^2/rm. The multisine is ROD_GAIN
# times the pendulum's, for larger rod swings: the scale (km from the known mp) and dp come
# from the rod's motion. Cramer-Rao bounds on simulated 20 s logs of mystery seeds 4 and 7,
# with sysid's one-window stage: dr 3.6-4.9 % and dp 1.9-4.5 % before, 1.3-2.5 % and
# 1.0-1.8 % after (docs/sysid.md).
ARM_SWEEP_RAD, ARM_SWEEP_HZ, ARM_SWEEP_FADE_S = 0.4, 0.25, 1.0
ROD_GAIN = 1.4


def arm_hold_gains(spec) -> tuple[float, float]:
    """PD gains (V/rad, V s/rad) that hold a Furuta arm at ARM_HOLD_HZ with
    ARM_HOLD_DAMPING on the preset's plant: its arm inertia with the rod's
    mass at the tip, A = jr + mp lr^2, voltage gain km / rm and back-EMF
    damping km^2 / rm + dr (csrc/plants.c)."""
    from grpo_ctrl.plant_file import nominal_params

    p = nominal_params(spec)
    inertia = p["jr"] + p["mp"] * p["lr"] ** 2
    gain, damping = p["km"] / p["rm"], p["km"] ** 2 / p["rm"] + p["dr"]
    w = 2 * math.pi * ARM_HOLD_HZ
    return inertia * w * w / gain, max(0.0, (2 * ARM_HOLD_DAMPING * w * inertia - damping) / gain)


def arm_sweep(duration: float, dt: float, amplitude: float) -> tuple[np.ndarray, np.ndarray]:
    """The Furuta arm's reference (rad) and its rate (rad/s) at steps of
    ``dt``: a sine of ``amplitude`` at ARM_SWEEP_HZ, faded in and out."""
    t = np.arange(int(math.ceil(duration / dt)) + 1) * dt
    w = 2 * math.pi * ARM_SWEEP_HZ
    fade = np.clip(np.minimum(t, duration - t) / ARM_SWEEP_FADE_S, 0, 1)
    fade_rate = np.where((t < ARM_SWEEP_FADE_S) & (fade < 1), 1.0,
                         np.where((duration - t < ARM_SWEEP_FADE_S) & (fade > 0), -1.0, 0.0))
    ref = amplitude * fade * np.sin(w * t)
    rate = amplitude * (fade * w * np.cos(w * t) + fade_rate / ARM_SWEEP_FADE_S * np.sin(w * t))
    return ref, rate


class Excitation:
    """The host-side command source: the multisine by device-independent
    wall time since the first STATE, with the guards. Called once per STATE,
    allocation-free but for the float it returns.
    ``command(k, obs)`` is the law at step k, for a simulator too."""

    def __init__(self, spec, u_max: float, dt: float, duration: float, seed: int,
                 max_swing: float, vel_limit: float = 0.0, arm_limit: float = 0.0):
        self.spec, self.u_max, self.dt = spec, float(u_max), float(dt)
        self.shape = multisine(duration, self.dt, seed) * self.u_max
        self.pole_obs = spec.pole_obs
        self.vel_obs = spec.obs_index[spec.pole_velocity]
        self.vel_guard = 0.5 * vel_limit if vel_limit > 0 else math.inf
        self.max_swing = max_swing
        self.arm = spec.system == "furuta"
        if self.arm:
            self.kp, self.kd = arm_hold_gains(spec)
            self.arm_obs, self.arm_vel_obs = spec.obs_index[0], spec.obs_index[2]
            self.arm_guard = ARM_GUARD * arm_limit if arm_limit > 0 else math.inf
            self.shape = self.shape * ROD_GAIN
            self.arm_ref, self.arm_ref_rate = arm_sweep(duration, self.dt,
                                                        min(ARM_SWEEP_RAD, self.arm_guard / 3))
        self.t0 = None

    @classmethod
    def from_device(cls, info, features, duration: float, seed: int, max_swing: float):
        """The experiment for the device that sent ``info``: its period,
        command limit and safety limits."""
        from grpo_ctrl.plant import plant_spec, presets

        spec = (plant_spec(features.system, info.preset) if info.preset in presets(features.system)
                else features.spec)
        channel = {v: c for c, (_, v) in enumerate(spec.channels)}[spec.pole_velocity]
        vel_limit = info.vel_limit[channel] * features.scale[channel]
        arm_limit = info.pos_limit[0] * features.scale[0]
        return cls(spec, info.u_limit or info.u_max, info.period_us * 1e-6, duration, seed,
                   max_swing, vel_limit, arm_limit)

    def __call__(self, obs) -> float:
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        return self.command(int((now - self.t0) / self.dt), obs)

    def command(self, k: int, obs) -> float:
        k = min(k, len(self.shape) - 1)
        u = float(self.shape[k])
        i = self.pole_obs
        swing = math.remainder(math.atan2(float(obs[i + 1]), float(obs[i])) - math.pi,
                               2 * math.pi)
        velocity = float(obs[self.vel_obs])
        if self.arm:
            if abs(swing) > self.max_swing or abs(velocity) > self.vel_guard:
                u = 0.0
            arm = math.atan2(float(obs[self.arm_obs + 1]), float(obs[self.arm_obs]))
            if abs(arm) > self.arm_guard and u * arm > 0:
                u = 0.0
            u -= (self.kp * (arm - self.arm_ref[k]) +
                  self.kd * (float(obs[self.arm_vel_obs]) - self.arm_ref_rate[k]))
            return max(-self.u_max, min(self.u_max, u))
        brake = AMPLITUDES[1] * self.u_max
        if abs(velocity) > self.vel_guard:
            return -math.copysign(brake, velocity)
        if abs(swing) > self.max_swing and u * swing > 0:
            return -math.copysign(brake, swing)
        return u


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", required=True,
                   help="serial device path or pyserial URL (as for `grpo-ctrl run`)")
    p.add_argument("--system", default="pendulum",
                   help="the plant on the port, pendulum or furuta (checked)")
    p.add_argument("--preset", default=None,
                   help="its preset, checked against the device's (default: the device's)")
    p.add_argument("--duration", type=number(float, 5.0, 3600.0, unit=" (seconds; sysid needs "
                                             ">= 5)"), default=20.0, metavar="S",
                   help="length of the experiment (default 20; sysid needs >= 5)")
    p.add_argument("--log", required=True, help="telemetry file, .csv or .jsonl, for sysid")
    p.add_argument("--plot", default=None, help="PNG plot (default: next to the log)")
    p.add_argument("--max-swing", type=number(float, above=0.0, high=math.pi / 2, unit=" (rad)"),
                   default=1.0, metavar="RAD",
                   help="beyond this angle of the rod from hanging, brake (pendulum) or stop "
                        "the multisine (furuta) (default 1.0)")
    p.add_argument("--seed", type=seed, default=0, help="phases of the multisine")
    p.add_argument("--baud", type=positive_int(100_000_000), default=1_000_000,
                   help="baud rate for a UART")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args) -> int:
    from grpo_ctrl.firmware_bridge.host import EXIT_CODES, run_loop
    from grpo_ctrl.firmware_bridge.loop import format_summary
    from grpo_ctrl.plant import plant_spec

    if args.system not in ("pendulum", "furuta"):
        raise UserError(f"excite drives the pendulum and the Furuta pendulum; --system "
                        f"{args.system!r} is not supported yet")
    try:
        spec = plant_spec(args.system, args.preset)
    except ValueError as e:
        raise UserError(str(e)) from None

    def make_policy(info, features):
        if features.system != spec.system or args.preset not in (None, info.preset):
            raise UserError(f"the device on {args.port} is {features.system}/{info.preset}, not "
                            f"{spec.system}/{args.preset or 'any'}: check --port, --system and "
                            "--preset")
        return Excitation.from_device(info, features, args.duration, args.seed, args.max_swing)

    summary = run_loop(args.port, None, args.duration, args.log, args.plot, baudrate=args.baud,
                       make_policy=make_policy)
    print(json.dumps(summary) if args.json else format_summary(summary), flush=True)
    if summary["ended"].startswith("error: "):
        print(f"grpo-ctrl excite: {summary['ended']}", file=sys.stderr, flush=True)
    return EXIT_CODES.get(summary["ended"].split(":")[0], 1)
