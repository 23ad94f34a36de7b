"""The Gymnasium adapters: Gymnasium's own checker, parity with Pendulum-v1,
and the vector env against SyncVectorEnv over single ones."""
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from grpo_ctrl.gym_env import SimEnv, SimVectorEnv
from grpo_ctrl.sim import presets, systems

ALL_PRESETS = [(s, p) for s in systems() for p in presets(s)]


@pytest.mark.parametrize("system,preset", ALL_PRESETS)
def test_passes_gymnasiums_env_checker(system, preset):
    env = SimEnv(system, preset=preset)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    # the checker only suggests a [-1, 1] action space, as it does for Pendulum-v1
    unexpected = [str(w.message) for w in caught if "symmetric and normalized" not in str(w.message)]
    assert not unexpected, unexpected


def test_matches_gymnasium_pendulum_v1_from_the_same_start():
    ours = SimEnv("pendulum", preset="gym")
    theirs = gym.make("Pendulum-v1")
    rng = np.random.default_rng(0)
    for episode in range(5):
        g_obs, _ = theirs.reset(seed=episode)
        obs, _ = ours.reset(options={"state": theirs.unwrapped.state})
        np.testing.assert_array_equal(obs, g_obs)
        assert ours.observation_space == theirs.observation_space
        assert ours.action_space == theirs.action_space
        for _ in range(200):
            a = rng.uniform(-2, 2, 1).astype(np.float32)
            obs, reward, term, trunc, _ = ours.step(a)
            g_obs, g_reward, g_term, g_trunc, _ = theirs.step(a)
            np.testing.assert_allclose(obs, g_obs, atol=1e-6, rtol=0)
            assert reward == pytest.approx(g_reward, abs=1e-9)
            assert (term, trunc) == (g_term, g_trunc)
            assert type(reward) is float and type(term) is bool and obs.dtype == np.float32
        assert trunc  # the 200-step limit lives in the simulator


def test_seeding():
    env = SimEnv("cartpole", preset="swingup")
    a, _ = env.reset(seed=3)
    b, _ = env.reset(seed=3)
    c, _ = env.reset(seed=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    d, _ = env.reset()  # continues the seeded stream: a new start
    assert not np.array_equal(d, c)


def test_bad_action_is_a_clear_error():
    env = SimEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="one number"):
        env.step(np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.array([np.nan], np.float32))


@pytest.mark.parametrize("system,preset", [("cartpole", "gym"), ("pendulum", "gym")])
def test_vector_env_matches_sync_vector_env_of_single_envs(system, preset):
    """Same seeds, same actions: our one-call vector env and Gymnasium's
    SyncVectorEnv (same-step autoreset) over single envs agree on every
    output, final_obs included, across many episode ends."""
    n = 8
    ours = SimVectorEnv(n, system, preset=preset)
    theirs = SyncVectorEnv([lambda: SimEnv(system, preset=preset)] * n,
                           autoreset_mode=AutoresetMode.SAME_STEP)
    assert ours.metadata["autoreset_mode"] == theirs.metadata["autoreset_mode"]
    assert ours.observation_space == theirs.observation_space
    assert ours.action_space == theirs.action_space
    obs, _ = ours.reset(seed=10)
    g_obs, _ = theirs.reset(seed=10)
    np.testing.assert_array_equal(obs, g_obs)
    rng = np.random.default_rng(1)
    episode_ends = 0
    for _ in range(450):
        actions = rng.uniform(-1, 1, (n, 1)).astype(np.float32) * ours.single_action_space.high
        obs, reward, term, trunc, info = ours.step(actions)
        g_obs, g_reward, g_term, g_trunc, g_info = theirs.step(actions)
        np.testing.assert_array_equal(obs, g_obs)
        np.testing.assert_array_equal(reward, g_reward)
        np.testing.assert_array_equal(term, g_term)
        np.testing.assert_array_equal(trunc, g_trunc)
        assert info.keys() == g_info.keys()
        if "final_obs" in info:
            np.testing.assert_array_equal(info["_final_obs"], g_info["_final_obs"])
            for i in np.flatnonzero(info["_final_obs"]):
                np.testing.assert_array_equal(info["final_obs"][i], g_info["final_obs"][i])
            assert info["final_obs"][~info["_final_obs"]].tolist() == [None] * int(
                (~info["_final_obs"]).sum())
            episode_ends += int(info["_final_obs"].sum())
        assert ours.observation_space.contains(obs)
    assert episode_ends >= n


def test_vector_env_seeds_and_partial_reset():
    env = SimVectorEnv(4, "pendulum", preset="rig")
    a, _ = env.reset(seed=[5, 6, 7, 8])
    b, _ = env.reset(seed=5)  # seed s gives environment i the seed s + i
    np.testing.assert_array_equal(a, b)
    x = env.sim.get_state()["x"]
    env.step(np.zeros((4, 1), np.float32))
    moved = env.sim.get_state()["x"]
    obs, _ = env.reset(options={"reset_mask": np.array([True, False, False, True])})
    after = env.sim.get_state()["x"]
    np.testing.assert_array_equal(after[[1, 2]], moved[[1, 2]])
    assert not np.array_equal(after[[0, 3]], moved[[0, 3]])
    assert not np.array_equal(after[[0, 3]], x[[0, 3]])  # new draws, not the old starts
    with pytest.raises(ValueError, match="one seed per environment"):
        env.reset(seed=[1, 2])


def test_gymnasium_stays_optional():
    """Without gymnasium the simulator imports and the adapter says what to install."""
    code = ("import sys; sys.modules['gymnasium'] = None\n"
            "import grpo_ctrl.sim\n"
            "try:\n"
            "    import grpo_ctrl.gym_env\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'grpo-ctrl[gym]'" in out.stdout
