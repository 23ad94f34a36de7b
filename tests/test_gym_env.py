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


REGISTERED = [(env_id, system, preset) for env_id, system in __import__(
    "grpo_ctrl.gym_env").gym_env.IDS.items() for preset in presets(system)]


@pytest.mark.parametrize("env_id,system,preset", REGISTERED)
def test_every_registered_id_and_preset_passes_the_checker_with_its_render_modes(env_id, system,
                                                                                 preset):
    """gymnasium.make of each id, with each preset: the checker's full run,
    which also makes one environment per declared render mode and renders
    it ("human" with matplotlib's Agg backend: no window)."""
    pytest.importorskip("matplotlib",
                        reason="needs matplotlib, the train extra: pip install -e '.[train]'")
    env = gym.make(env_id, preset=preset)
    assert env.unwrapped.plant_spec.system == system and env.unwrapped.plant_spec.preset == preset
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    unexpected = [str(w.message) for w in caught if "symmetric and normalized" not in str(w.message)]
    assert not unexpected, unexpected
    assert set(env.metadata["render_modes"]) == {"human", "rgb_array"}
    spec = env.unwrapped.plant_spec
    assert env.metadata["render_fps"] == min(50, round(1 / spec.dt))


@pytest.mark.parametrize("env_id,system,preset", REGISTERED)
def test_rgb_array_frames_are_500_square_and_follow_the_pole(env_id, system, preset):
    """The documented size, and the picture moves with the state: the pole's
    red pixels sit above the pivot upright and below it hanging."""
    env = gym.make(env_id, preset=preset, render_mode="rgb_array")
    env.reset(seed=0)
    spec = env.unwrapped.plant_spec
    rows = {}
    for name, angle in (("up", 0.0), ("down", np.pi)):
        env.reset(options={"state": spec.rest_state(angle)})
        img = env.render()
        assert img.shape == (500, 500, 3) and img.dtype == np.uint8
        red = (img[..., 0] > 180) & (img[..., 1] < 110) & (img[..., 2] < 110)
        assert red.sum() > 500, name
        rows[name] = np.nonzero(red)[0].mean()
    assert rows["up"] < rows["down"] - 50  # image rows grow downwards
    env.step(np.array([spec.u_max], np.float32))
    bar = env.render()[-25:]  # the command bar: orange for a positive command
    assert ((bar[..., 0] > 200) & (bar[..., 1] > 120) & (bar[..., 2] < 80)).sum() > 200


def test_render_without_a_mode_warns_and_human_returns_none():
    pytest.importorskip("matplotlib",
                        reason="needs matplotlib, the train extra: pip install -e '.[train]'")
    env = gym.make("grpo_ctrl/Pendulum-v0")
    env.reset(seed=0)
    with pytest.warns(UserWarning, match="render_mode"):
        assert env.unwrapped.render() is None
    human = gym.make("grpo_ctrl/Pendulum-v0", render_mode="human")
    human.reset(seed=0)
    human.step(np.zeros(1, np.float32))
    assert human.render() is None
    human.close()


@pytest.mark.parametrize("order", ["import gymnasium; import grpo_ctrl",
                                   "import grpo_ctrl; import gymnasium"])
def test_importing_the_package_registers_the_ids_in_either_order(order):
    """``import grpo_ctrl`` alone does not load gymnasium (the command line
    stays quick), and the ids are there however the two imports come."""
    code = (f"import sys; {order}\n"
            "import gymnasium as gym\n"
            "env = gym.make('grpo_ctrl/Furuta-v0', render_mode='rgb_array')\n"
            "env.reset(seed=0); print(env.render().shape)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(500, 500, 3)"
    quick = subprocess.run([sys.executable, "-c", "import sys, grpo_ctrl.cli; "
                            "print('gymnasium' in sys.modules, 'numpy' in sys.modules)"],
                           capture_output=True, text=True, check=True)
    assert quick.stdout.split() == ["False", "False"]


def test_make_vec_builds_the_c_vector_env():
    envs = gym.make_vec("grpo_ctrl/CartPole-v0", num_envs=3, vectorization_mode="vector_entry_point",
                        preset="swingup")
    assert isinstance(envs, SimVectorEnv) and envs.sim.spec.preset == "swingup"
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (3, 5)


def test_stable_baselines3_learns_on_a_registered_id():
    """SAC (Stable-Baselines3, an optional test dependency) for 3,000 steps on
    grpo_ctrl/Pendulum-v0 (the gym preset: Pendulum-v1's physics): its
    deterministic policy beats random actions on the same 10 starts by a
    wide margin (measured: -869 against -1214; SAC's default 256-unit
    network reaches -161 after 4,000 steps, but takes twice as long)."""
    pytest.importorskip("stable_baselines3", reason="pip install stable-baselines3 (the sb3 extra)")
    import torch
    from stable_baselines3 import SAC

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        env = gym.make("grpo_ctrl/Pendulum-v0", preset="gym")
        model = SAC("MlpPolicy", env, seed=0, learning_starts=300, batch_size=128,
                    policy_kwargs={"net_arch": [128, 128]}, device="cpu")
        model.learn(3000)
    finally:
        torch.set_num_threads(threads)

    def mean_return(act):
        test = gym.make("grpo_ctrl/Pendulum-v0", preset="gym")
        test.action_space.seed(0)
        total = 0.0
        for episode in range(10):
            obs, _ = test.reset(seed=100 + episode)
            done = False
            while not done:
                obs, reward, terminated, truncated, _ = test.step(act(obs, test))
                total += reward
                done = terminated or truncated
        return total / 10

    trained = mean_return(lambda obs, e: model.predict(obs, deterministic=True)[0])
    random = mean_return(lambda obs, e: e.action_space.sample())
    assert trained > random + 150, (trained, random)


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
