"""The simulator's observation at large angles (reachable through set_state):
(cos, sin) of each angle against libm (NumPy), on the vectorised path
(presets without a sensor model: float32 for float32) and on the
per-environment path (presets with encoders and noise: within the noise),
for every plant. csrc/pendsim.c's fast_sincos is accurate only for |angle|
<= 1e5; beyond, libm's values must show."""
import numpy as np
import pytest

from grpo_ctrl.sim import BatchSim, presets, systems

# where each plant's angles sit in the state and where their cos sits in obs
ANGLES = {"pendulum": [(0, 0)], "cartpole": [(2, 2)], "furuta": [(0, 0), (1, 2)],
          "double_pendulum": [(0, 0), (1, 2)]}


def large_angles():
    rng = np.random.default_rng(0)
    fixed = [3e10, -3e10, 1e5, 1e5 + 0.5, -2.5e6, 7.77e8, 2.0 ** 51, -(2.0 ** 53) + 1, 1e15, 1e300]
    wide = rng.uniform(5, 300, 200)  # |x| in [1e5, 1e300]
    return np.array(fixed + list(10 ** wide * rng.choice([-1, 1], 200)))


def observe_at(sim, theta, system):
    x = sim.get_state()["x"].copy()
    for k, _ in ANGLES[system]:
        x[:, k] = theta
    sim.set_state({"x": x})
    return sim.observe().copy()


@pytest.mark.parametrize("system", systems())
def test_observation_matches_libm_at_large_angles(system):
    theta = large_angles()
    for preset in presets(system):
        sim = BatchSim(system, theta.size, preset=preset)
        small = observe_at(sim, np.full(theta.size, 0.3), system)
        exact = np.all(small[:, ANGLES[system][0][1]] == np.float32(np.cos(0.3)))
        # a sensor model (encoder, noise): within the noise, and only where a
        # double still resolves the encoder's step (|angle| <= 1e12)
        atol, near = (1.2e-7, np.ones(theta.size, bool)) if exact else (0.05, np.abs(theta) <= 1e12)
        obs = observe_at(sim, theta, system)[near]
        c, s = np.cos(theta[near]).astype(np.float32), np.sin(theta[near]).astype(np.float32)
        for _, at in ANGLES[system]:
            np.testing.assert_allclose(obs[:, at], c, rtol=0, atol=atol, err_msg=f"{preset} cos")
            np.testing.assert_allclose(obs[:, at + 1], s, rtol=0, atol=atol, err_msg=f"{preset} sin")
