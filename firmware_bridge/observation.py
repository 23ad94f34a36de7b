"""What the device's raw counts mean to a policy: the observation builder,
and the check that an exported ONNX controller fits the device before it
may arm."""
from __future__ import annotations

import math

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.firmware_bridge import protocol as P
from grpo_ctrl.plant import Observer, plant_spec

MIN_PERIOD_US, MAX_PERIOD_US = 100, 10_000_000  # 10 kHz .. 0.1 Hz: what this host can run


class Features:
    """Raw device counts -> the plant's observation vector. The sensors'
    positions and velocities fill the plant's state where its layout says
    (``PlantSpec.channels``), and the simulator's own C observation function
    (``grpo_ctrl.plant.Observer``) makes the observation of it: the simulator
    and the rig cannot disagree on what a policy sees. ``estimator``, when
    set (``run --estimator``): a ``grpo_ctrl.estimator.ModelEstimator`` whose
    state replaces the device's (``ticks``: the device's ticks since the last
    STATE, where the caller counts them; else the estimator counts them from
    the STATEs' times)."""

    def __init__(self, info: P.Info):
        self.system = info.system_name
        if self.system not in P.SYSTEMS:
            raise UserError(f"the device reports an unknown system id {info.system}")
        self.spec = plant_spec(self.system)
        self.obs_names = list(self.spec.obs_names)
        need = len(self.spec.channels)
        if not need <= info.n_channels <= P.MAX_CHANNELS:
            raise UserError(f"a {self.system} needs {need} sensor channels; the device has "
                            f"{info.n_channels}")
        if not (MIN_PERIOD_US <= info.period_us <= MAX_PERIOD_US
                and math.isfinite(info.u_max) and info.u_max > 0
                and all(math.isfinite(c) for c in info.counts_per_unit)):
            raise UserError(f"the device's INFO is not usable (period {info.period_us} us, "
                            f"u_max {info.u_max}, counts per unit {info.counts_per_unit}); "
                            "check the firmware")
        self.scale = np.array([(2 * math.pi if info.angle_mask >> c & 1 else 1.0) / cpu
                               if cpu > 0 else 0.0
                               for c, cpu in enumerate(info.counts_per_unit)])[:need]
        self._position = [p for p, _ in self.spec.channels]
        self._velocity = [v for _, v in self.spec.channels]
        self._x = np.zeros(self.spec.nx)
        self._observe = Observer(self.spec)
        self.estimator = None

    def __call__(self, s: P.State, ticks: int | None = None) -> np.ndarray:
        n = len(self._position)
        self._x[self._position] = np.asarray(s.pos[:n], float) * self.scale
        self._x[self._velocity] = np.asarray(s.vel[:n], float) * self.scale
        if self.estimator is not None:
            return self._observe(self.estimator.update(self._x, s.t_us, s.actuator, ticks))
        return self._observe(self._x)

    def angle(self, obs: np.ndarray) -> float:
        """The pendulum's angle from upright, in [-pi, pi]."""
        i = self.spec.pole_obs
        return math.atan2(float(obs[i + 1]), float(obs[i]))


def open_onnx_controller(path):
    """The ONNX controller at ``path``, opened before the port is: importing
    onnx and onnxruntime takes about 0.9 s here (seconds on a crowded
    machine), and between the handshake and arming the device's STATEs pile
    up, about 1.1 s of them before its line drops some."""
    from grpo_ctrl.export.session import PolicySession

    try:
        return PolicySession(path)
    except UserError as e:
        raise UserError(f"refusing to arm: {e}") from None


def check_onnx_controller(policy, info: P.Info, features: Features, warn=print):
    """The opened controller, checked against the device: same system, same
    observation layout, same actuator limit; otherwise a refusal."""
    path = policy.path
    try:
        policy.check_expected(system=info.system_name, nobs=len(features.obs_names),
                              u_max=info.u_max)
    except UserError as e:
        raise UserError(f"refusing to arm: {e}") from None
    meta = policy.metadata
    if list(meta["obs_names"]) != features.obs_names:
        raise UserError(f"refusing to arm: {str(path)!r} expects observations "
                        f"{meta['obs_names']}, the device gives {features.obs_names}")
    policy(np.zeros(len(features.obs_names), np.float32))  # warm up before the clock starts
    if meta.get("preset") != info.preset:
        warn(f"note: the policy was made for preset {meta.get('preset')!r}, the device is "
             f"{info.preset!r} (same system, layout and limits: running it)")
    if not math.isclose(meta["dt"], info.period_us * 1e-6, rel_tol=1e-3):
        warn(f"note: the policy was made for a {meta['dt'] * 1e3:g} ms period, the device runs "
             f"at {info.period_us / 1e3:g} ms")
    if info.u_limit < info.u_max:
        warn(f"note: the device clamps commands to {info.u_limit:g} (its u_limit), below its "
             f"hardware limit {info.u_max:g} that the policy was checked against")
    return policy
