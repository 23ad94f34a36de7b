"""The `gym` presets against Gymnasium's own environments, step by step.

Each Gymnasium episode starts from its own seeded reset; the simulator is
put in the same start state with ``set_state`` (the two RNGs differ), then
both receive the same actions. The simulator steps all episodes as one batch.
"""
import importlib.util
import shutil
import subprocess
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from grpo_ctrl._cdef import C_FLAGS
from grpo_ctrl.sim import BatchSim

CSRC = Path(__file__).resolve().parent.parent / "csrc"


def test_pendulum_gym_preset_matches_gymnasium_pendulum_v1():
    episodes, steps = 1000, 200
    rng = np.random.default_rng(0)
    envs = [gym.make("Pendulum-v1", disable_env_checker=True) for _ in range(episodes)]
    gym_obs0 = np.array([env.reset(seed=i)[0] for i, env in enumerate(envs)])
    sim = BatchSim("pendulum", episodes, preset="gym")
    sim.set_state({"x": np.array([env.unwrapped.state for env in envs])})
    np.testing.assert_array_equal(sim.observe(), gym_obs0)

    # beyond the torque limit on purpose: both must saturate at 2 N m
    actions = rng.uniform(-2.5, 2.5, (steps, episodes)).astype(np.float32)
    worst_obs = worst_reward = 0.0
    for k in range(steps):
        obs, reward, terminated, truncated = sim.step(actions[k])
        results = [env.step(actions[k, i:i + 1]) for i, env in enumerate(envs)]
        g_obs = np.array([r[0] for r in results])
        g_reward = np.array([r[1] for r in results])
        worst_obs = max(worst_obs, float(np.abs(g_obs - obs).max()))
        worst_reward = max(worst_reward, float(np.abs(g_reward - reward).max()))
        np.testing.assert_array_equal([r[2] for r in results], terminated, err_msg=f"step {k}")
        np.testing.assert_array_equal([r[3] for r in results], truncated, err_msg=f"step {k}")
    assert truncated.all()  # both end every episode at step 200
    # NumPy's float32 u**2 is sometimes one ulp off u*u: rewards differ by < 5e-10
    assert worst_obs <= 1e-6, worst_obs
    assert worst_reward <= 1e-9, worst_reward


def test_cartpole_gym_preset_matches_gymnasium_cartpole_v1_with_continuous_force():
    """Gymnasium's CartPole takes a discrete push of +-force_mag; a continuous
    force f is the push 1 (right) or 0 (left) with force_mag = |f|."""
    episodes = 300
    rng = np.random.default_rng(1)
    envs = [gym.make("CartPole-v1", disable_env_checker=True) for _ in range(episodes)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    sim = BatchSim("cartpole", episodes, preset="gym")
    sim.set_state({"x": np.array([env.unwrapped.state for env in envs])})
    u_max = sim.spec.u_max
    # half the episodes random (short, end by falling or leaving the track);
    # half under a noisy balancing feedback (last the 500 steps, end truncated)
    balancing = np.arange(episodes) % 2 == 0
    gains = np.array([1.0, 2.0, 30.0, 5.0])
    running = np.ones(episodes, bool)
    ended_by = {"terminated": 0, "truncated": 0}
    for k in range(500):
        x = sim.get_state()["x"]
        force = np.where(balancing, x @ gains + rng.normal(0.0, 3.0, episodes),
                         rng.uniform(-12.0, 12.0, episodes)).astype(np.float32)
        obs, reward, terminated, truncated = sim.step(force)
        x = sim.get_state()["x"]
        live = np.flatnonzero(running)
        results = []
        for i in live:
            f = float(np.clip(force[i], -u_max, u_max))
            envs[i].unwrapped.force_mag = abs(f)
            results.append(envs[i].step(1 if f > 0 else 0))
        g_state = np.array([envs[i].unwrapped.state for i in live])
        g_obs = np.array([r[0] for r in results])
        g_end = np.array([r[1:4] for r in results])
        # same operations in the same order: bit for bit
        np.testing.assert_array_equal(g_state, x[live], err_msg=f"step {k}")
        np.testing.assert_array_equal(
            np.stack([g_obs[:, 0], g_obs[:, 1], np.cos(g_state[:, 2]), np.sin(g_state[:, 2]),
                      g_obs[:, 3]], axis=1).astype(np.float32), obs[live], err_msg=f"step {k}")
        np.testing.assert_array_equal(
            g_end, np.stack([reward[live], terminated[live], truncated[live]], axis=1),
            err_msg=f"step {k}")
        ended_by["terminated"] += int(g_end[:, 1].sum())
        ended_by["truncated"] += int(g_end[:, 2].sum())
        running[live] = ~(g_end[:, 1] + g_end[:, 2]).astype(bool)
    assert not running.any()
    assert ended_by["terminated"] >= episodes // 2 and ended_by["truncated"] >= episodes // 4, ended_by


def _cpu_flags() -> set:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in text.splitlines()
                     if line.startswith("flags")), []))


@pytest.mark.parametrize("isa", ["baseline", "avx2+fma"])
def test_vectorised_sin_and_angle_normalize_match_libm_and_numpy_bit_for_bit(tmp_path, isa):
    """The pendulum step's vectorised sin (csrc/exact_math.h) against libm's
    sin, and its fmod-free angle normalisation against NumPy's remainder, on
    3e7 values including the hard cases: built with the simulator's flags,
    plain and (where the CPU has them) with the AVX2/FMA code the simulator
    dispatches to."""
    extra = []
    if isa == "avx2+fma":
        if not {"avx2", "fma"} <= _cpu_flags():
            pytest.skip("this CPU has no AVX2 with FMA")
        extra = ["-mavx2", "-mfma"]
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler is needed"
    exe = tmp_path / "check_exact_math"
    subprocess.run([cc, *C_FLAGS, "-pedantic", "-Werror", *extra, f"-I{CSRC}",
                    str(CSRC / "check_exact_math.c"), "-lm", "-o", str(exe)], check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok "), r.stdout + r.stderr
    assert int(r.stdout.split()[1]) >= 30_000_000


def test_sin_table_is_what_its_generator_writes():
    spec = importlib.util.spec_from_file_location("gen_sin_table", CSRC / "gen_sin_table.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (CSRC / "sin_table.h").read_text() == gen.render()
