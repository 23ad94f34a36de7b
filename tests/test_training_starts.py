"""Where training trajectories start (GRPOConfig.starts): the preset's start box, or any
state of the pendulum ("wide"), checked against each preset's box by hand and against
the states the trainer's pool actually draws, at its first reset and at its restarts."""
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

from grpo_ctrl.grpo import GroupRollout
from grpo_ctrl.grpo_config import default_config
from grpo_ctrl.plant import plant_spec

PI = np.pi


@pytest.mark.parametrize("system,preset,low,high", [
    # hanging at rest -> both links anywhere, both joints within 1 rad/s
    ("double_pendulum", "pendubot", [0, -PI, -1, -1], [2 * PI, PI, 1, 1]),
    # the cart's position and velocity as the preset has them, the pole anywhere
    ("cartpole", "swingup", [-0.05, -0.05, 0, -1], [0.05, 0.05, 2 * PI, 1]),
    # the arm is cyclic (it does not enter the dynamics): kept; the pendulum anywhere
    ("furuta", "qube-servo2", [-0.05, 0, -0.05, -1], [0.05, 2 * PI, 0.05, 1]),
    # Pendulum-v1's own box is already every state: unchanged
    ("pendulum", "gym", [-PI, -1], [PI, 1]),
])
def test_the_wide_box_by_hand(system, preset, low, high):
    spec = plant_spec(system, preset)
    got_low, got_high = spec.wide_box()
    np.testing.assert_allclose(got_low, low, atol=1e-12)
    np.testing.assert_allclose(got_high, high, atol=1e-12)


def _pool_states(starts: str, restarts: int = 0) -> np.ndarray:
    cfg = replace(default_config("double_pendulum", "pendubot"), num_starts=256, starts=starts)
    rollout = GroupRollout(cfg, "double_pendulum", "pendubot", seed=3)
    states = [rollout.pool.get_state()["x"]]
    for _ in range(restarts):  # what a trajectory that ends or draws reset_prob gets
        rollout.pool.reset(mask=np.arange(256) % 2 == 0)
        states.append(rollout.pool.get_state()["x"][::2])
    return np.concatenate(states)


def test_the_preset_starts_hanging_at_rest():
    x = _pool_states("preset", restarts=2)
    np.testing.assert_array_equal(x, np.tile([PI, 0.0, 0.0, 0.0], (len(x), 1)))


def test_wide_starts_cover_the_box_at_the_first_reset_and_at_restarts():
    x = _pool_states("wide", restarts=2)
    low, high = plant_spec("double_pendulum", "pendubot").wide_box()
    assert np.all((x >= low) & (x <= high))
    for k in range(4):  # spread over the box: each quarter of each component drawn
        quarter = np.floor(4 * (x[:, k] - low[k]) / (high[k] - low[k])).clip(0, 3)
        assert set(quarter.astype(int)) == {0, 1, 2, 3}, k
    # the restarted half draws from the same box as the first reset
    restarted = x[256:]
    assert restarted[:, 0].min() < PI - 2.5 and restarted[:, 0].max() > PI + 2.5
