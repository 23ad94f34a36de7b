"""What the device's raw counts mean to a policy: the observation builder,
and the check that an exported ONNX controller fits the device before it
may arm."""
from __future__ import annotations

import math

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.firmware_bridge import protocol as P


class Features:
    """Raw device counts -> the plant's observation vector, in the simulator's
    layout (``grpo_ctrl.sim`` obs_names): angles zero at upright, velocities
    estimated by the device."""

    def __init__(self, info: P.Info):
        from grpo_ctrl.sim import BatchSim

        self.system = info.system_name
        if self.system not in P.SYSTEMS:
            raise UserError(f"the device reports an unknown system id {info.system}")
        self.obs_names = list(BatchSim(self.system, 1).spec.obs_names)
        need = {"pendulum": 1, "cartpole": 2, "furuta": 2}[self.system]
        if info.n_channels < need:
            raise UserError(f"a {self.system} needs {need} sensor channels; the device has "
                            f"{info.n_channels}")
        self.scale = np.array([(2 * math.pi if info.angle_mask >> c & 1 else 1.0) / cpu
                               if cpu > 0 else 0.0
                               for c, cpu in enumerate(info.counts_per_unit)])

    def __call__(self, s: P.State) -> np.ndarray:
        n = len(s.pos)
        q = np.asarray(s.pos, float) * self.scale[:n]
        v = np.asarray(s.vel, float) * self.scale[:n]
        if self.system == "pendulum":
            obs = [math.cos(q[0]), math.sin(q[0]), v[0]]
        elif self.system == "cartpole":
            obs = [q[0], v[0], math.cos(q[1]), math.sin(q[1]), v[1]]
        else:
            obs = [math.cos(q[0]), math.sin(q[0]), math.cos(q[1]), math.sin(q[1]), v[0], v[1]]
        return np.asarray(obs, np.float32)

    def angle(self, obs: np.ndarray) -> float:
        """The pendulum's angle from upright, in [-pi, pi]."""
        c, s = (obs[2], obs[3]) if self.system != "pendulum" else (obs[0], obs[1])
        return math.atan2(float(s), float(c))


def load_onnx_controller(path, info: P.Info, features: Features, warn=print):
    """The ONNX controller, checked against the device: same system, same
    observation layout, same actuator limit; otherwise a refusal."""
    from grpo_ctrl.export.session import PolicySession

    try:
        policy = PolicySession(path, system=info.system_name, nobs=len(features.obs_names),
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
    return policy
