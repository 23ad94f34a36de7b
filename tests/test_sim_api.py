"""The batched API: branching, delay, sensors, autoreset, rollout, and errors
that leave the state untouched."""
import subprocess
import sys

import numpy as np
import pytest

from grpo_ctrl.sim import MAX_DELAY, BatchSim, presets, systems


def random_actions(sim, steps, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (steps, sim.num_envs)) * sim.spec.u_max).astype(np.float32)


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# ---------------------------------------------------------------- branching
@pytest.mark.parametrize("system", systems())
def test_branches_given_identical_actions_are_bit_identical_to_the_source(system):
    """Branch mid-episode with a delay line full of pending actions and sensor
    noise on: source and G copies then run identically, noise included."""
    nx = BatchSim(system, 1).spec.nx
    src = BatchSim(system, 3, seed=7, delay=3, noise_std=[0.01] * nx)
    for a in random_actions(src, 40):
        src.step(a)
    G = 5
    group = src.branch([1], G)
    assert group.num_envs == G
    for a in random_actions(src, 60, seed=1):
        obs, reward, term, trunc = src.step(a)
        g_obs, g_reward, g_term, g_trunc = group.step(np.full(G, a[1], np.float32))
        for j in range(G):
            np.testing.assert_array_equal(g_obs[j], obs[1])
            assert (g_reward[j], g_term[j], g_trunc[j]) == (reward[1], term[1], trunc[1])
    for j in range(G):
        for key, value in group.get_state().items():
            np.testing.assert_array_equal(value[j], src.get_state()[key][1], err_msg=key)


def test_branches_given_different_actions_diverge():
    src = BatchSim("pendulum", 1, preset="rig", seed=3)
    group = src.branch([0], 4)
    actions = np.array([-0.1, 0.0, 0.05, 0.1], np.float32)
    for _ in range(50):
        group.step(actions)
    x = group.get_state()["x"]
    assert len(np.unique(x[:, 0])) == 4
    # more torque, more angle gained: ordered as the actions are
    assert np.all(np.diff(x[:, 0]) > 0)


def test_branch_copies_the_delay_buffer():
    """With a delay of 4 the first 4 steps after branching apply actions
    chosen before it; a branch that lost them would differ immediately."""
    src = BatchSim("pendulum", 1, preset="gym", delay=4)
    for a in [1.5, -2.0, 0.7, 2.0]:
        src.step(np.array([a], np.float32))
    group = src.branch([0], 2)
    fresh = BatchSim("pendulum", 2, preset="gym", delay=4)
    fresh.set_state({"x": group.get_state()["x"], "t": group.get_state()["t"]})  # no pending actions
    for _ in range(4):
        g_obs = group.step(np.zeros(2, np.float32))[0]
        fresh.step(np.zeros(2, np.float32))
        np.testing.assert_array_equal(g_obs[0], g_obs[1])
    assert not np.array_equal(group.get_state()["x"], fresh.get_state()["x"])
    np.testing.assert_array_equal(group.get_state()["act_buf"][:, :4], 0.0)


def test_branch_copies_the_rng_and_reseeding_makes_noise_differ():
    src = BatchSim("pendulum", 2, preset="gym", seed=11, noise_std=[0.05, 0.2])
    group = src.branch([0, 1], 3)
    obs = group.observe().copy()
    np.testing.assert_array_equal(obs[0], obs[1])  # same stream, same noise
    np.testing.assert_array_equal(obs[3], obs[5])
    assert not np.array_equal(obs[0], obs[3])  # different sources differ
    group.reseed(np.arange(6), np.arange(100, 106))
    obs = group.observe()
    assert len({tuple(o) for o in obs[:3]}) == 3  # now each branch draws its own noise
    # the state itself is untouched by reseeding: noise is on the observation only
    x = group.get_state()["x"]
    np.testing.assert_array_equal(x[0], x[1])


def test_autoreset_start_states_replay_in_branches():
    """Starts drawn at autoreset come from the copied RNG: same in every branch."""
    src = BatchSim("pendulum", 1, preset="gym", seed=5, autoreset=True)
    for _ in range(150):
        src.step(np.zeros(1, np.float32))
    group = src.branch([0], 3)
    for _ in range(50):
        obs, _, _, trunc = group.step(np.zeros(3, np.float32))
    assert trunc.all()  # the episode ended in all of them at once (t was copied)
    assert (group.get_state()["t"] == 0).all()
    np.testing.assert_array_equal(obs[0], obs[1])
    np.testing.assert_array_equal(obs[0], obs[2])


def test_branch_into_out_reuses_a_simulator_and_keeps_the_model():
    src = BatchSim("pendulum", 4, preset="rig", seed=2, delay=2, dt=0.01)
    out = BatchSim("pendulum", 6, preset="rig", delay=2, dt=0.01)
    result = src.branch([3, 0], 3, out=out)
    assert result is out
    x = out.get_state()["x"]
    np.testing.assert_array_equal(x[:3], np.repeat(src.get_state()["x"][[3]], 3, axis=0))
    np.testing.assert_array_equal(x[3:], np.repeat(src.get_state()["x"][[0]], 3, axis=0))
    made = src.branch([0], 2)
    assert made.model.delay == 2 and made.model.dt == 0.01
    assert made.spec == src.spec  # what controllers read must describe the same plant


def test_copy_envs_within_one_simulator():
    sim = BatchSim("cartpole", 4, seed=1)
    before = sim.get_state()
    sim.copy_envs([2, 3], sim, [0, 0])
    after = sim.get_state()
    for key in before:
        np.testing.assert_array_equal(after[key][[0, 1]], before[key][[0, 1]])
        np.testing.assert_array_equal(after[key][[2, 3]], before[key][[0, 0]])


# ---------------------------------------------------------------- actuator and sensors
@pytest.mark.parametrize("k", [1, 3, MAX_DELAY])
def test_delay_of_k_steps_shifts_the_response_exactly_k_steps(k):
    actions = random_actions(BatchSim("furuta", 2), 200, seed=k)
    delayed = BatchSim("furuta", 2, seed=0, delay=k)
    prompt = BatchSim("furuta", 2, seed=0)
    shifted = np.concatenate([np.zeros((k, 2), np.float32), actions[:-k]])
    d_obs, d_reward, _, _ = delayed.rollout(actions)
    p_obs, p_reward, _, _ = prompt.rollout(shifted)
    np.testing.assert_array_equal(d_obs, p_obs)
    np.testing.assert_array_equal(d_reward, p_reward)
    # the first k steps act on nothing but the zero-filled line: bit-identical to zero input
    idle = BatchSim("furuta", 2, seed=0).rollout(np.zeros((k, 2), np.float32))[0]
    np.testing.assert_array_equal(d_obs[:k], idle)


def test_saturation_clips_the_action_to_u_max():
    sim = BatchSim("pendulum", 3, preset="gym")
    sim.set_state({"x": np.zeros((3, 2))})
    sim.step(np.array([2.0, 50.0, -50.0], np.float32))
    thd = sim.get_state()["x"][:, 1]
    assert thd[1] == thd[0] and thd[2] == -thd[0]


def test_encoder_quantisation_rounds_angles_to_counts():
    sim = BatchSim("furuta", 4, preset="qube-servo2")
    q = 2 * np.pi / 2048  # the preset's 2048-count encoders
    th = np.array([10.0, 10.4, 9.6, -300.49]) * q
    al = np.array([np.pi, np.pi - 0.3 * q, np.pi + 0.45 * q, 0.51 * q])
    rates = np.array([[0.1234567, -2.5]] * 4)
    sim.set_state({"x": np.column_stack([th, al, rates])})
    obs = sim.observe()
    th_q, al_q = np.round(th / q) * q, np.round(al / q) * q
    expected = np.column_stack([np.cos(th_q), np.sin(th_q), np.cos(al_q), np.sin(al_q), rates])
    np.testing.assert_allclose(obs, expected.astype(np.float32), rtol=0, atol=1e-7)
    np.testing.assert_array_equal(obs[0], obs[1])  # within half a count: same reading
    np.testing.assert_array_equal(obs[0], obs[2])
    assert obs[3, 2] < 1.0  # 0.51 counts from upright reads one count off
    # velocities are not quantised
    np.testing.assert_array_equal(obs[:, 4:], rates.astype(np.float32))


def test_sensor_noise_has_the_requested_spread_and_leaves_the_state_alone():
    sim = BatchSim("pendulum", 20000, preset="gym", seed=0, noise_std=[0.0, 0.3])
    sim.set_state({"x": np.tile([0.5, 1.0], (20000, 1))})
    obs = sim.observe()
    np.testing.assert_array_equal(obs[:, 0], np.float32(np.cos(0.5)))  # theta noiseless
    assert np.mean(obs[:, 2]) == pytest.approx(1.0, abs=0.01)
    assert np.std(obs[:, 2]) == pytest.approx(0.3, rel=0.03)
    np.testing.assert_array_equal(sim.get_state()["x"][:, 1], 1.0)


def test_reseed_takes_the_seeds_seed_takes():
    """Any Python int seeds: seed(s) gives environment b the seed s + b
    (mod 2**64), and reseed of one environment with that seed is the same stream."""
    for s in (0, 12345, -5, 2**64 + 7):
        whole = BatchSim("pendulum", 2, seed=s)
        one = BatchSim("pendulum", 2, seed=99)
        one.reseed([1], [s + 1])
        np.testing.assert_array_equal(one.get_state()["rng_key"][1], whole.get_state()["rng_key"][1])
        np.testing.assert_array_equal(one.get_state()["rng_ctr"][1], 0)


def test_seed_reproduces_and_different_seeds_differ():
    a = BatchSim("cartpole", 8, preset="swingup", seed=42).get_state()["x"]
    b = BatchSim("cartpole", 8, preset="swingup", seed=42).get_state()["x"]
    c = BatchSim("cartpole", 8, preset="swingup", seed=43).get_state()["x"]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(np.unique(a[:, 2])) == 8  # environments draw different starts


@pytest.mark.parametrize("system,preset", [(s, p) for s in systems() for p in presets(s)])
def test_reset_draws_from_the_start_box(system, preset):
    sim = BatchSim(system, 5000, preset=preset, seed=1)
    x = sim.get_state()["x"]
    low = np.array(list(sim.model.x0_low))[:sim.spec.nx]
    high = np.array(list(sim.model.x0_high))[:sim.spec.nx]
    assert np.all(x >= low) and np.all(x <= high)
    # uniform: the mean sits mid-box
    np.testing.assert_allclose(x.mean(axis=0), (low + high) / 2, atol=0.03 * (high - low).max())
    assert (sim.get_state()["t"] == 0).all()


# ---------------------------------------------------------------- episodes
def test_autoreset_and_final_obs():
    actions = random_actions(BatchSim("pendulum", 3), 200, seed=2)
    auto = BatchSim("pendulum", 3, preset="gym", seed=9, autoreset=True)
    plain = BatchSim("pendulum", 3, preset="gym", seed=9)
    for k in range(200):
        obs, reward, term, trunc = auto.step(actions[k])
        p_obs, p_reward, _, p_trunc = plain.step(actions[k])
        np.testing.assert_array_equal(reward, p_reward)
        np.testing.assert_array_equal(auto.final_obs, p_obs)
        if k < 199:
            np.testing.assert_array_equal(obs, p_obs)
    assert trunc.all() and not term.any()
    # the returned observation is the reset one: a fresh start, t back to 0
    state = auto.get_state()
    assert (state["t"] == 0).all()
    assert not np.array_equal(obs, auto.final_obs)
    np.testing.assert_array_equal(obs, auto.observe())
    assert np.all(np.abs(state["x"][:, 1]) <= 1.0)  # Pendulum-v1's start box


def test_autoreset_resets_only_the_environments_that_ended():
    sim = BatchSim("cartpole", 3, preset="gym", seed=0, autoreset=True)
    sim.set_state({"x": np.array([[2.39, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
                   "t": np.array([7, 7, 499], np.int32)})
    obs, reward, term, trunc = sim.step(np.zeros(3, np.float32))
    np.testing.assert_array_equal(term, [True, False, False])
    np.testing.assert_array_equal(trunc, [False, False, True])
    np.testing.assert_array_equal(sim.get_state()["t"], [0, 8, 0])
    assert sim.final_obs[0, 0] > 2.4  # it left the track ...
    assert abs(obs[0, 0]) <= 0.05  # ... and came back to a fresh start
    np.testing.assert_array_equal(obs[1], sim.final_obs[1])
    np.testing.assert_array_equal(reward, [1.0, 1.0, 1.0])


def test_truncation_at_max_steps_without_autoreset():
    sim = BatchSim("pendulum", 2, preset="gym")
    _, _, _, trunc = sim.rollout(np.zeros((200, 2), np.float32))
    assert not trunc[:199].any() and trunc[199].all()


@pytest.mark.parametrize("autoreset", [False, True])
def test_rollout_equals_k_steps(autoreset):
    kwargs = dict(preset="qube-servo2", seed=4, delay=2, noise_std=[0.001, 0.001, 0.01, 0.01],
                  autoreset=autoreset, max_steps=37)
    a, b = BatchSim("furuta", 6, **kwargs), BatchSim("furuta", 6, **kwargs)
    actions = random_actions(a, 100, seed=8)
    r_obs, r_reward, r_term, r_trunc = a.rollout(actions)
    for k in range(100):
        obs, reward, term, trunc = b.step(actions[k])
        np.testing.assert_array_equal(r_obs[k], obs)
        np.testing.assert_array_equal(r_reward[k], reward)
        np.testing.assert_array_equal(r_term[k], term)
        np.testing.assert_array_equal(r_trunc[k], trunc)
    assert r_trunc.any()
    assert_same_state(a.get_state(), b.get_state())


def test_rollout_returns_fresh_arrays_and_step_returns_its_buffers():
    sim = BatchSim("pendulum", 2)
    first = sim.rollout(np.zeros((3, 2), np.float32))[0]
    kept = first.copy()
    sim.rollout(np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(first, kept)
    obs1 = sim.step(np.zeros(2, np.float32))[0]
    obs2 = sim.step(np.zeros(2, np.float32))[0]
    assert obs1 is obs2  # documented: copy what you keep


def test_step_accepts_float64_and_column_actions():
    a, b = BatchSim("pendulum", 3, seed=1), BatchSim("pendulum", 3, seed=1)
    u = np.array([0.25, -1.0, 1.5])
    np.testing.assert_array_equal(a.step(u)[0], b.step(u.astype(np.float32)[:, None])[0])


# ---------------------------------------------------------------- physical parameters
def test_set_param_randomises_per_environment():
    sim = BatchSim("pendulum", 2, preset="gym")
    sim.set_param("m", [1.0, 2.0])
    sim.set_state({"x": np.zeros((2, 2))})
    sim.step(np.array([1.0, 1.0], np.float32))
    thd = sim.get_state()["x"][:, 1]
    assert thd[0] == pytest.approx(2 * thd[1])  # twice the mass, half the acceleration
    sim.reset()
    np.testing.assert_array_equal(sim.get_state()["param"][:, 1], [1.0, 1.0])  # reset restores


# ---------------------------------------------------------------- errors
def test_unknown_system_preset_and_fields_name_the_choices():
    with pytest.raises(ValueError, match="pendulum"):
        BatchSim("pendulm")
    with pytest.raises(ValueError, match="qube-servo2"):
        BatchSim("furuta", preset="qube")
    with pytest.raises(ValueError, match="rk4"):
        BatchSim("pendulum", integrator="rk5")
    with pytest.raises(ValueError, match="noise_std"):
        BatchSim("pendulum", noise_sd=[0.1, 0.1])
    with pytest.raises(ValueError, match="2 finite numbers"):
        BatchSim("pendulum", noise_std=[0.1])
    with pytest.raises(ValueError, match="delay"):
        BatchSim("pendulum", delay=MAX_DELAY + 1)
    with pytest.raises(ValueError, match="num_envs"):
        BatchSim("pendulum", 0)
    with pytest.raises(ValueError, match="unknown parameter"):
        BatchSim("pendulum").set_param("mass", 1.0)
    with pytest.raises(ValueError,
                       match=r"preset's name, one of \['gym', 'rig', 'realaigym'\], got 5"):
        BatchSim("pendulum", preset=5)


def test_energy_refuses_a_state_of_the_wrong_size():
    """The C side reads nx numbers from x: a shorter x was read past its end."""
    sim = BatchSim("cartpole", 1)
    with pytest.raises(ValueError, match=r"shape \(4,\), got \(2,\)"):
        sim.energy(np.zeros(2))
    with pytest.raises(ValueError, match="shape"):
        sim.energy(np.zeros((1, 4)))
    x = np.array([0.1, 2.0, -0.3, 0.5])
    sim.set_state({"x": x})
    assert sim.energy(x) == sim.energy()


def noisy_sim():
    """A simulator whose every step would move the RNG counter, so a
    half-done step would show in the state."""
    sim = BatchSim("pendulum", 4, preset="rig", seed=3, delay=2, noise_std=[0.01, 0.01])
    sim.step(np.full(4, 0.1, np.float32))
    return sim


BAD_ACTIONS = {
    "too few": (np.zeros(3, np.float32), "shape"),
    "too many columns": (np.zeros((4, 2), np.float32), "shape"),
    "integers": (np.zeros(4, np.int32), "floating point"),
    "NaN": (np.array([0.0, np.nan, 0.0, 0.0], np.float32), "NaN"),
    "inf": (np.array([0.0, 0.0, 0.0, -np.inf], np.float32), "infinite"),
}


@pytest.mark.parametrize("case", list(BAD_ACTIONS))
def test_bad_actions_raise_and_leave_the_state_untouched(case):
    actions, message = BAD_ACTIONS[case]
    sim = noisy_sim()
    before = sim.get_state()
    with pytest.raises(ValueError, match=message):
        sim.step(actions)
    assert_same_state(sim.get_state(), before)


def test_a_nan_late_in_a_rollout_rejects_the_whole_rollout():
    sim = noisy_sim()
    before = sim.get_state()
    actions = np.zeros((50, 4), np.float32)
    actions[49, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        sim.rollout(actions)
    assert_same_state(sim.get_state(), before)
    with pytest.raises(ValueError, match=r"\(K, 4\)"):
        sim.rollout(np.zeros((50, 3), np.float32))
    assert_same_state(sim.get_state(), before)


BAD_STATES = {
    "unknown key": ({"y": np.zeros((4, 2))}, "unknown state key"),
    "wrong shape": ({"x": np.zeros((4, 3))}, "shape"),
    "NaN": ({"x": np.full((4, 2), np.nan)}, "finite"),
    "negative t": ({"t": np.array([0, -1, 0, 0])}, "non-negative"),
    "float key": ({"rng_key": np.zeros(4)}, "integers"),
    "t beyond int32": ({"t": np.array([0, 2**40, 0, 0])}, "fit int32"),  # was wrapped to 0
    # a valid part must not be written when another part is bad
    "valid x, bad param": ({"x": np.ones((4, 2)), "param": np.full((4, 7), np.inf)}, "finite"),
}


@pytest.mark.parametrize("case", list(BAD_STATES))
def test_set_state_validates_everything_before_writing(case):
    state, message = BAD_STATES[case]
    sim = noisy_sim()
    before = sim.get_state()
    with pytest.raises(ValueError, match=message):
        sim.set_state(state)
    assert_same_state(sim.get_state(), before)


def test_set_state_round_trips_and_writes_subsets():
    a, b = noisy_sim(), BatchSim("pendulum", 4, preset="rig", delay=2, noise_std=[0.01, 0.01])
    b.set_state(a.get_state())
    assert_same_state(a.get_state(), b.get_state())
    np.testing.assert_array_equal(a.step(np.zeros(4, np.float32))[0],
                                  b.step(np.zeros(4, np.float32))[0])
    b.set_state({"x": np.array([[0.5, -0.5]])}, indices=[2])
    x = b.get_state()["x"]
    np.testing.assert_array_equal(x[2], [0.5, -0.5])
    np.testing.assert_array_equal(x[[0, 1, 3]], a.get_state()["x"][[0, 1, 3]])
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        b.set_state({"x": np.zeros((1, 2))}, indices=[4])


def test_branch_and_copy_errors():
    sim = noisy_sim()
    before = sim.get_state()
    with pytest.raises(ValueError, match="group_size"):
        sim.branch([0], 0)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        sim.branch([4], 2)
    with pytest.raises(ValueError, match="indices is empty"):
        sim.branch(np.array([], np.int64), 2)
    with pytest.raises(ValueError, match="needs 6"):
        sim.branch([0, 1], 3, out=BatchSim("pendulum", 5, preset="rig"))
    with pytest.raises(ValueError, match="cannot copy"):
        BatchSim("cartpole", 4).copy_envs([0], sim, [0])
    with pytest.raises(ValueError, match="differ in length"):
        sim.copy_envs([0, 1], BatchSim("pendulum", 2, preset="rig"), [0])
    assert_same_state(sim.get_state(), before)


def test_dynamics_and_energy_reject_an_environment_out_of_range():
    """The C side reads that environment's parameters: an index out of range
    must be refused in Python, not read out of bounds (run apart, as a bad read
    can crash the interpreter)."""
    code = """
import numpy as np
from grpo_ctrl.sim import BatchSim
sim = BatchSim("pendulum", 2, preset="gym")
x = np.array([0.1, 0.0])
for call in (lambda: sim.dynamics(x, 0.0, env=2), lambda: sim.dynamics(x, 0.0, env=-1),
             lambda: sim.dynamics(x, 0.0, env=10**6), lambda: sim.energy(x, env=2),
             lambda: sim.energy(x, env=-1), lambda: sim.energy(env=-1)):
    try:
        call()
    except ValueError as e:
        assert "env" in str(e), e
    else:
        raise SystemExit("no ValueError")
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", (
        f"exit status {result.returncode}: {result.stdout}{result.stderr[-2000:]}")
