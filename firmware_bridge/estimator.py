"""The host's state estimate for ``grpo-ctrl run --estimator HZ``: the
plant's simulator predicts each tick from the torque the device applied, and
the encoders' positions correct the prediction.

A device's own velocity is a finite difference of encoder counts through a
low-pass filter: at 500 Hz one count of a 4096-count encoder is 0.77 rad/s,
and a filter that smooths that away lags by its time constant (8 ms at
20 Hz). A swing-up that meets the LQR's small region (the acrobot) misses it
on either. A model predicts the velocity without that lag; the positions'
residuals pull the estimate back to the rig, each joint's correction a
critically damped second-order loop of the given bandwidth (a Luenberger
observer with a per-joint gain): low bandwidth trusts the model, high
bandwidth the encoders.
"""
from __future__ import annotations

import math

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.plant import PlantSpec, init_model

MAX_GAIN = 0.5        # omega x period: the discrete loop stays well damped below it
MAX_GAP_TICKS = 50    # a longer silence (a stall), or time going back, restarts the
                      # estimate from the device's state


class ModelEstimator:
    """Positions and velocities of ``spec``'s plant from a device's STATEs.

    ``update(x, t_us, applied)`` takes the state the device's counts give
    (its positions and its own velocities), the STATE's time and the
    actuator value it reports (what the device applies until its next
    tick) and returns the estimate. ``plant``: a fitted plant
    (``grpo_ctrl.plant_file.PlantValues``) instead of the preset."""

    def __init__(self, spec: PlantSpec, period_s: float, bandwidth_hz: float, plant=None):
        from grpo_ctrl.sim import BatchSim

        omega_t = 2 * math.pi * bandwidth_hz * period_s
        if not (bandwidth_hz > 0 and omega_t <= MAX_GAIN):
            top = MAX_GAIN / (2 * math.pi * period_s)
            raise UserError(f"--estimator {bandwidth_hz:g} Hz: give a bandwidth above 0 and at "
                            f"most {math.floor(top)} Hz for the device's {period_s * 1e3:g} ms period "
                            "(10 Hz is a good start)")
        model, _ = init_model(spec.system, spec.preset)
        h = model.dt / model.substeps  # the preset's integration step, or finer
        self.sim = BatchSim(spec.system, 1, spec.preset, hold_plant=plant is not None,
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
        self.t_us = 0
        self.applied = np.zeros(1, np.float32)

    def restart(self, x: np.ndarray) -> np.ndarray:
        """Start over from the device's state ``x`` (its own velocities)."""
        self.x = np.array(x, float)
        self.sim.reset()
        self.sim.set_state({"x": self.x[None]})
        return self.x.copy()

    def update(self, x: np.ndarray, t_us: int, applied: float) -> np.ndarray:
        ticks = 0 if self.x is None else round((t_us - self.t_us) / self.period_us)
        fresh = self.x is None or not 0 <= ticks <= MAX_GAP_TICKS  # a stall, a clock gone back
        if fresh:
            self.restart(x)
        if fresh or ticks == 0:  # (0: the same tick again)
            self.t_us, self.applied[0] = t_us, applied
            return self.x.copy()
        sim = self.sim
        for _ in range(ticks):  # the ticks between: the torque the device last reported
            sim.step(self.applied)
        pred = sim.get_state()["x"][0]
        r = x[self.pos] - pred[self.pos]
        r[self.wrap] = (r[self.wrap] + math.pi) % (2 * math.pi) - math.pi
        t = ticks * self.period_s
        pred[self.pos] += 2 * self.omega * t * r
        pred[self.vel] += self.omega ** 2 * t * r
        self.x = pred
        sim.set_state({"x": pred[None]})
        self.t_us, self.applied[0] = t_us, applied
        return pred.copy()
