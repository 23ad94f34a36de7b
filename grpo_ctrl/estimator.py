"""A model estimate of the state from measured positions: the plant's
simulator predicts each tick from the torque applied, and the measured
positions correct the prediction. ``grpo-ctrl run --estimator HZ`` feeds a
policy this estimate in place of a device's velocities, and ``grpo-ctrl eval
--estimator HZ`` scores a controller on it (RealAIGym's benchmarks).

A device's own velocity is a finite difference of encoder counts through a
low-pass filter: at 500 Hz one count of a 4096-count encoder is 0.77 rad/s,
and a filter that smooths that away lags by its time constant (8 ms at
20 Hz). A swing-up that meets the LQR's small region (the acrobot) misses it
on either. A model predicts the velocity without that lag; the positions'
residuals pull the estimate back to the plant. Each measured position has a
third-order loop (a Luenberger observer with a per-joint gain): its
position, its velocity and an acceleration the model does not explain (a
push, a model's error), the three poles at the given bandwidth: low
bandwidth trusts the model, high bandwidth the measurements.
"""
from __future__ import annotations

import math

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.plant import PlantSpec, init_model

MAX_GAIN = 0.5        # omega x period: the discrete loop stays well damped below it
MAX_GAP_TICKS = 50    # a longer silence (a stall), or time going back, restarts the
                      # estimate from the measured state


def check_bandwidth(bandwidth_hz: float, period_s: float) -> None:
    """A one-line ``UserError`` for a bandwidth the discrete loop cannot take."""
    if not (bandwidth_hz > 0 and 2 * math.pi * bandwidth_hz * period_s <= MAX_GAIN):
        top = MAX_GAIN / (2 * math.pi * period_s)
        raise UserError(f"--estimator {bandwidth_hz:g} Hz: give a bandwidth above 0 and at "
                        f"most {math.floor(top)} Hz for a {period_s * 1e3:g} ms period "
                        "(5 Hz for 4096-count encoders at 2 ms)")


class ModelEstimator:
    """Positions and velocities of ``num_envs`` plants of ``spec`` from
    measurements each ``period_s``.

    ``update(x, t_us, applied, ticks=None)`` takes the measured states
    ``(nx,)`` or ``(num_envs, nx)`` (their velocities are used only to start
    from), the time in microseconds, the torque applied from now until the
    next tick (a scalar or ``(num_envs,)``) and, where the caller counts
    them, the device's ticks since the last update, and returns the
    estimates, shaped as ``x``. Without ``ticks`` they are counted from the
    time; but a device's tick may run late with its plant on schedule (a
    loaded host's HIL, by more than a period, then the next at once), and a
    count from the time then steps the model twice, then not at all.
    ``plant``: a fitted plant (``grpo_ctrl.plant_file.PlantValues``) instead
    of the preset."""

    def __init__(self, spec: PlantSpec, period_s: float, bandwidth_hz: float, plant=None,
                 num_envs: int = 1):
        from grpo_ctrl.sim import BatchSim

        check_bandwidth(bandwidth_hz, period_s)
        model, _ = init_model(spec.system, spec.preset)
        h = model.dt / model.substeps  # the preset's integration step, or finer
        self.sim = BatchSim(spec.system, num_envs, spec.preset, hold_plant=plant is not None,
                            dt=period_s, substeps=max(1, math.ceil(period_s / h - 1e-9)),
                            max_steps=0)
        if plant is not None:
            self.sim.set_plant({**plant.params, "delay": plant.delay, "motor_k": plant.motor_k})
        self.period_us = period_s * 1e6
        self.omega, self.period_s = 2 * math.pi * bandwidth_hz, period_s
        self.pos = np.array([p for p, _ in spec.channels])
        self.vel = np.array([v for _, v in spec.channels])
        self.wrap = np.array([spec.angles[p] for p in self.pos])  # residuals in [-pi, pi)
        self.x = None
        self.accel = np.zeros((num_envs, len(self.pos)))  # what the model does not explain
        self.t_us = 0
        self.applied = np.zeros(num_envs, np.float32)

    def restart(self, x: np.ndarray) -> None:
        """Start over from the measured states ``x (num_envs, nx)``."""
        self.x = np.array(x, float)
        self.accel[:] = 0.0
        self.sim.reset()
        self.sim.set_state({"x": self.x})

    def update(self, x: np.ndarray, t_us: int, applied, ticks: int | None = None) -> np.ndarray:
        one = np.ndim(x) == 1
        x = np.atleast_2d(x)
        by_time = 0 if self.x is None else round((t_us - self.t_us) / self.period_us)
        ticks = by_time if ticks is None or self.x is None else ticks
        # a stall or a clock gone back, by the count or by the time
        fresh = (self.x is None or not 0 <= ticks <= MAX_GAP_TICKS
                 or not 0 <= by_time <= MAX_GAP_TICKS)
        if fresh:
            self.restart(x)
        if not (fresh or ticks == 0):  # (0: the same tick again)
            sim = self.sim
            for _ in range(ticks):  # the ticks between: the torque last reported
                sim.step(self.applied)
            pred = sim.get_state()["x"]
            w, t, a = self.omega, ticks * self.period_s, self.accel
            pred[:, self.pos] += a * (t * t / 2)
            pred[:, self.vel] += a * t
            r = x[:, self.pos] - pred[:, self.pos]
            r[:, self.wrap] = (r[:, self.wrap] + math.pi) % (2 * math.pi) - math.pi
            # the poles of (s + w)^3: s^3 + 3 w s^2 + 3 w^2 s + w^3
            pred[:, self.pos] += 3 * w * t * r
            pred[:, self.vel] += 3 * w * w * t * r
            a += w ** 3 * t * r
            lost = ~np.isfinite(pred).all(axis=1) | ~np.isfinite(a).all(axis=1)
            pred[lost], a[lost] = x[lost], 0.0  # a plant that blew up: measured again
            self.x = pred
            sim.set_state({"x": pred})
        self.t_us = t_us
        self.applied[:] = applied
        return self.x[0].copy() if one else self.x.copy()


class EstimatedPolicy:
    """A batch policy (observations ``(B, nobs)`` -> commands ``(B,)``) that
    acts on the model estimate of the state: the measured positions (from
    the observation) and the estimator's velocities, with the policy's own
    commands, clipped to ``u_max``, as the torque applied. Stateful: a
    benchmark calls ``reset(B)`` before its runs."""

    def __init__(self, policy, spec: PlantSpec, bandwidth_hz: float):
        from grpo_ctrl.plant import state_of_observation

        check_bandwidth(bandwidth_hz, spec.dt)
        self.policy, self.spec, self.bandwidth_hz = policy, spec, bandwidth_hz
        self._state = state_of_observation
        self.reset(1)

    def reset(self, num_envs: int) -> None:
        from grpo_ctrl.sim import BatchSim

        self.estimator = ModelEstimator(self.spec, self.spec.dt, self.bandwidth_hz,
                                        num_envs=num_envs)
        self.meter = BatchSim(self.spec.system, num_envs, self.spec.preset)  # observes, in C
        self.k = 0

    def __call__(self, obs) -> np.ndarray:
        estimator = self.estimator
        # the torque of the tick ahead is this call's command: set below
        x = estimator.update(self._state(self.spec, np.asarray(obs, float)),
                             round(self.k * self.spec.dt * 1e6), estimator.applied)
        self.k += 1
        self.meter.set_state({"x": x})
        u = np.asarray(self.policy(self.meter.observe().copy()), dtype=float).reshape(-1)
        estimator.applied[:] = np.clip(np.nan_to_num(u), -self.spec.u_max, self.spec.u_max)
        return u
