"""The dynamic-programming optimum of the gym pendulum: its value function
solves the Bellman equation with transitions taken from Gymnasium's own
Pendulum-v1 (an independent implementation of the dynamics and the cost),
and run as a feedback controller it beats the hand-written swing-up + LQR
on the same episodes."""
import numpy as np
import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

import torch

from grpo_ctrl.baselines import make_controller
from grpo_ctrl.closed_loop import evaluate
from grpo_ctrl.baselines.optimum import (DPGrid, OptimalPendulum, horizon_values, load_or_compute,
                                         make_optimum)
from grpo_ctrl.controller import load_controller
from grpo_ctrl.errors import UserError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache") / "made-on-first-use"
    mp = pytest.MonkeyPatch()
    mp.setenv("GRPO_CTRL_CACHE", str(cache))
    yield load_or_compute("pendulum", "gym")
    assert list(cache.glob("optimum-pendulum-gym-*.npz")), "the table was not cached"
    mp.undo()


def test_value_function_solves_the_bellman_equation_with_gymnasium_transitions(table):
    gym = pytest.importorskip("gymnasium")
    env = gym.make("Pendulum-v1").unwrapped
    env.reset(seed=0)
    rng = np.random.default_rng(1)
    ia, js = rng.integers(0, table.n_angle, 300), rng.integers(0, table.n_speed, 300)
    angle, speed = table.angles()[ia], table.speeds()[js]
    torques = np.linspace(-2.0, 2.0, DPGrid().n_actions)
    q = np.empty((300, torques.size))
    for k, (a, s) in enumerate(zip(angle, speed)):
        for m, u in enumerate(torques):
            env.state = np.array([a, s])
            _, reward, *_ = env.step(np.array([u], np.float32))
            q[k, m] = reward + table(env.state[0], env.state[1])
    residual = np.abs(q.max(1) - table.values[ia, js])
    assert residual.max() < 1e-4, residual.max()
    # and the values mean what they say: zero cost to go upright at rest,
    # a negative one everywhere else, the worst from hanging down
    assert table.values[table.n_angle // 2, table.n_speed // 2] == 0.0
    assert (table.values <= 0).all()
    assert table.values.min() < -200


def test_horizon_values_are_the_best_discounted_two_step_return_in_gymnasium():
    """Two decisions, the second discounted by 0.5, searched by brute force
    over the grid's torques in Gymnasium's own Pendulum-v1."""
    gym = pytest.importorskip("gymnasium")
    env = gym.make("Pendulum-v1").unwrapped
    env.reset(seed=0)
    table = horizon_values(2, 0.5)
    torques = np.linspace(-2.0, 2.0, DPGrid().n_actions)
    rng = np.random.default_rng(2)
    for ia, js in zip(rng.integers(0, table.n_angle, 20), rng.integers(0, table.n_speed, 20)):
        start = np.array([table.angles()[ia], table.speeds()[js]])
        best = -np.inf
        for u in torques:
            env.state = start.copy()
            _, r1, *_ = env.step(np.array([u], np.float32))
            after = env.state.copy()
            r2 = []
            for u2 in torques:
                env.state = after.copy()
                r2.append(env.step(np.array([u2], np.float32))[1])
            best = max(best, r1 + 0.5 * max(r2))
        # one step of the table is the first decision; its values are the second, interpolated
        first = []
        for u in torques:
            env.state = start.copy()
            _, r1, *_ = env.step(np.array([u], np.float32))
            first.append(r1 + 0.5 * table(env.state[0], env.state[1]))
        assert abs(max(first) - best) < 0.02 * max(1.0, abs(best)), (start, max(first), best)


def test_the_optimum_beats_swing_up_lqr_on_the_same_episodes(table):
    optimum = OptimalPendulum(make_controller("lqr", "pendulum", "gym").spec, table)
    baseline = make_controller("swingup-lqr", "pendulum", "gym")
    n = 300
    a = evaluate(optimum, n, seed=123_457)
    b = evaluate(baseline, n, seed=123_457)
    d = a.returns - b.returns
    se = d.std(ddof=1) / np.sqrt(n)
    assert d.mean() > 4 * se, (d.mean(), se)
    assert a.success.all()
    # better or as good on nearly every episode, not just on average
    assert (d > -1.0).mean() > 0.95


def test_optimum_is_a_named_controller_only_for_an_exactly_sensed_pendulum():
    with pytest.raises(UserError, match="pendulum"):
        load_controller("optimum", "furuta")
    with pytest.raises(UserError, match="exact sensors"):
        make_optimum("pendulum", "rig", DPGrid(n_angle=8, n_speed=5))
