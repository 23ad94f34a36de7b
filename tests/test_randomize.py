"""Plants drawn per environment in C: shared by the branches of a group,
redrawn at reset and autoreset from the seed, distributed as their ranges
say, and acting as stated (first-order motor, delay, offset, noise, pushes),
checked against hand-computed responses and a nominal simulator."""
import numpy as np
import pytest

from grpo_ctrl.errors import UserError
from grpo_ctrl.randomize import Randomization, default_randomization, with_overrides
from grpo_ctrl.sim import BatchSim

WIDE = Randomization(params=0.3, absolute={"fc": (0.0, 0.01)}, delay=(1, 3),
                     motor_k=(0.3, 0.9), torque_noise=(0.0, 0.1), offset=0.02,
                     push_rate=2.0, push=(0.2, 0.5), push_steps=5)


def rig(n, seed=0, **kw):
    return BatchSim("pendulum", n, preset="rig", seed=seed, **kw)


def test_branches_of_a_group_share_their_drawn_plant_and_stay_identical():
    src = rig(6, seed=3, randomize=WIDE)
    for _ in range(7):
        src.step(np.full(6, 0.05, np.float32))
    group = src.branch(np.array([1, 4]), group_size=3)
    plants, source = group.plant(), src.plant()
    for name, values in plants.items():
        np.testing.assert_array_equal(values, np.repeat(source[name][[1, 4]], 3), err_msg=name)
    assert plants["m"][0] != plants["m"][3]  # two groups, two plants
    for key, value in group.get_state().items():  # motor and push state too
        np.testing.assert_array_equal(value, np.repeat(src.get_state()[key][[1, 4]], 3, axis=0),
                                      err_msg=key)
    actions = np.random.default_rng(0).uniform(-0.2, 0.2, (50, 6)).astype(np.float32)
    obs_src, r_src, _, _ = src.rollout(actions)
    obs_g, r_g, _, _ = group.rollout(np.repeat(actions[:, [1, 4]], 3, axis=1))
    np.testing.assert_array_equal(obs_g, np.repeat(obs_src[:, [1, 4]], 3, axis=1))
    np.testing.assert_array_equal(r_g, np.repeat(r_src[:, [1, 4]], 3, axis=1))


def test_reset_draws_a_new_plant_reproducible_from_the_seed():
    a, b, c = rig(64, seed=5, randomize=WIDE), rig(64, seed=5, randomize=WIDE), \
        rig(64, seed=6, randomize=WIDE)
    first = a.plant()
    for name in first:
        np.testing.assert_array_equal(first[name], b.plant()[name], err_msg=name)
    assert not np.array_equal(first["m"], c.plant()["m"])
    a.step(np.zeros(64, np.float32))
    a.reset()
    assert not np.array_equal(a.plant()["m"], first["m"])
    b.step(np.zeros(64, np.float32))
    b.reset()
    np.testing.assert_array_equal(a.plant()["l"], b.plant()["l"])


def test_autoreset_draws_a_new_plant_only_for_environments_that_ended():
    sim = rig(32, seed=1, randomize=WIDE, autoreset=True, max_steps=5)
    sim._t[:16] = 3  # the first half ends two steps earlier
    before = sim.plant()
    for _ in range(2):
        sim.step(np.zeros(32, np.float32))
    after = sim.plant()
    assert np.all(after["m"][:16] != before["m"][:16])
    np.testing.assert_array_equal(after["m"][16:], before["m"][16:])
    again = rig(32, seed=1, randomize=WIDE, autoreset=True, max_steps=5)
    again._t[:16] = 3
    for _ in range(2):
        again.step(np.zeros(32, np.float32))
    np.testing.assert_array_equal(again.plant()["m"], after["m"])


def test_each_drawn_quantity_is_uniform_on_its_range():
    n = 40_000
    sim = rig(n, seed=2, randomize=WIDE)
    p, nominal, u_max = sim.plant(), BatchSim("pendulum", 1, preset="rig").plant(), 0.15
    expect = {"m": (0.7 * nominal["m"][0], 1.3 * nominal["m"][0]),
              "l": (0.7 * nominal["l"][0], 1.3 * nominal["l"][0]),
              "b": (0.7 * nominal["b"][0], 1.3 * nominal["b"][0]),
              "fc": (0.0, 0.01), "motor_k": (0.3, 0.9),
              "torque_noise": (0.0, 0.1 * u_max), "offset_theta": (-0.02, 0.02)}
    for name, (lo, hi) in expect.items():
        v = p[name]
        assert lo <= v.min() < lo + 0.001 * (hi - lo) and hi - 0.001 * (hi - lo) < v.max() <= hi, name
        # a uniform's mean and std, within 4 standard errors
        assert abs(v.mean() - (lo + hi) / 2) < 4 * (hi - lo) / np.sqrt(12 * n), name
        assert abs(v.std() - (hi - lo) / np.sqrt(12)) < 0.02 * (hi - lo), name
    np.testing.assert_array_equal(p["g"], 9.81)  # g is never drawn
    counts = np.bincount(p["delay"], minlength=4)
    assert counts[0] == 0 and all(abs(c / n - 1 / 3) < 0.01 for c in counts[1:])


def test_motor_follows_a_hand_computed_first_order_response():
    k, u = 0.3, 0.1
    sim = rig(1, seed=0, hold_plant=True)
    sim.set_plant({"motor_k": k, "delay": 0})
    sim.reset(seed=0)  # a held plant survives the reset
    ref = rig(1, seed=0)  # the nominal plant, driven by the hand-computed torque
    ref.reset(seed=0)
    for n in range(1, 40):
        sim.step(np.array([u], np.float32))
        tau = float(np.float32(u)) * (1 - (1 - k) ** n)
        np.testing.assert_allclose(sim.get_state()["tau"][0], tau, rtol=1e-12)
        ref.step(np.array([tau], np.float32))
        np.testing.assert_allclose(sim.get_state()["x"], ref.get_state()["x"], rtol=1e-6,
                                   atol=1e-9)


def test_delay_is_the_action_sequence_shifted():
    delay, n = 3, 8
    held = rig(n, seed=4, hold_plant=True)
    held.set_plant({"delay": delay})
    held.reset(seed=4)
    nominal = rig(n, seed=4)
    nominal.reset(seed=4)
    actions = np.random.default_rng(1).uniform(-0.2, 0.2, (60, n)).astype(np.float32)
    shifted = np.concatenate([np.zeros((delay, n), np.float32), actions[:-delay]])
    obs_h, _, _, _ = held.rollout(actions)
    obs_n, _, _, _ = nominal.rollout(shifted)
    np.testing.assert_array_equal(obs_h, obs_n)
    np.testing.assert_array_equal(held.get_state()["x"], nominal.get_state()["x"])


def test_encoder_offset_shifts_the_reading_not_the_state():
    sim = BatchSim("furuta", 2000, preset="qube-servo2", seed=0,
                   randomize=Randomization(offset=0.05))
    obs = sim.reset()
    x, off = sim.get_state()["x"], sim.plant()
    q = 2 * np.pi / 2048  # the preset's encoders
    for k, name in ((0, "theta"), (1, "alpha")):
        read = np.arctan2(obs[:, 2 * k + 1], obs[:, 2 * k])
        err = np.angle(np.exp(1j * (read - x[:, k] - off[f"offset_{name}"])))
        assert np.abs(err).max() <= q / 2 + 1e-6
    assert off["offset_alpha"].std() > 0.02  # drawn per environment


def test_torque_noise_has_its_drawn_std():
    n, std = 20_000, 0.02
    noisy = rig(n, seed=0, randomize=Randomization(torque_noise=(std / 0.15, std / 0.15)))
    clean = rig(n, seed=0, hold_plant=True)
    clean.set_state({"x": noisy.get_state()["x"]})
    noisy.step(np.zeros(n, np.float32))
    clean.step(np.zeros(n, np.float32))
    p = clean.plant()
    # one step of constant extra torque e: thd moves by ~ 3 e dt / (m l^2)
    gain = 3 * 0.005 / (p["m"] * p["l"] ** 2)
    e = (noisy.get_state()["x"][:, 1] - clean.get_state()["x"][:, 1]) / gain
    assert abs(e.std() / std - 1) < 0.05 and abs(e.mean()) < 4 * std / np.sqrt(n)


def test_pushes_come_at_their_rate_with_their_length_and_size():
    n, rate, steps = 4000, 4.0, 5
    sim = rig(n, seed=0, randomize=Randomization(push_rate=rate, push=(0.2, 0.6),
                                                 push_steps=steps))
    starts = active = 0
    free = 0
    sizes = []
    for _ in range(200):
        left_before = sim.get_state()["push_left"]
        sim.step(np.zeros(n, np.float32))
        state = sim.get_state()
        new = state["push_left"] == steps - 1
        free += int((left_before == 0).sum())
        starts += int(new.sum())
        active += int((left_before > 0).sum() + new.sum())
        sizes.append(state["push"][new])
    sizes = np.concatenate(sizes)
    p = rate * 0.005
    assert abs(starts / free - p) < 4 * np.sqrt(p / free)
    assert active == pytest.approx(starts * steps, rel=0.05)
    assert np.all((np.abs(sizes) >= 0.2 * 0.15) & (np.abs(sizes) <= 0.6 * 0.15))
    assert abs((sizes > 0).mean() - 0.5) < 0.05


def test_gym_presets_stay_nominal_by_default_and_rigs_are_drawn():
    assert not default_randomization("pendulum", "gym").active
    assert not default_randomization("cartpole", "gym").active
    for system, preset in (("pendulum", "rig"), ("furuta", "qube-servo2")):
        r = default_randomization(system, preset)
        assert r.active
        sim = BatchSim(system, 64, preset=preset, randomize=r)
        assert np.ptp(sim.plant()["delay"]) > 0 or r.delay[0] == r.delay[1]


def test_table_and_overrides():
    base = default_randomization("pendulum", "rig")
    r = with_overrides(base, ["params=0.1", "delay=1,2", "scale.m=0.9,1.1"])
    assert r.params == 0.1 and r.delay == (1, 2) and r.scale["m"] == (0.9, 1.1)
    assert r.motor_k == base.motor_k
    assert not with_overrides(base, ["off"]).active
    assert Randomization.from_table(r.to_table()) == r
    with pytest.raises(UserError, match="unknown randomize key"):
        Randomization.from_table({"delays": [1, 2]})
    with pytest.raises(UserError, match="motor_k"):
        Randomization(motor_k=(0.0, 1.0))
    # a negative friction feeds energy in: the drawn pendulum's state would overflow
    with pytest.raises(UserError, match=r"absolute.b2 must stay at or above 0"):
        Randomization(absolute={"b2": (-0.1, 0.1)})
    with pytest.raises(UserError, match="KEY=VALUE"):
        with_overrides(base, ["params"])
    # a count from the command line (parsed as a number) is a whole number of steps
    pushes = with_overrides(base, ["push_steps=50"])
    assert pushes.push_steps == 50 and type(pushes.push_steps) is int
    BatchSim("pendulum", 2, preset="rig", randomize=pushes)
    with pytest.raises(UserError, match="push_steps must be a whole number"):
        with_overrides(base, ["push_steps=2.5"])
    with pytest.raises(ValueError, match="not parameters"):
        BatchSim("pendulum", 2, preset="rig", randomize=Randomization(scale={"mass": (1, 2)}))


def test_held_plants_survive_resets_and_autoresets():
    sim = rig(4, seed=0, hold_plant=True, autoreset=True, max_steps=3)
    assert sim.plant_names == ("g", "m", "l", "b", "fc", "com", "inertia", "delay", "motor_k",
                               "torque_noise", "offset_theta")
    candidates = {"m": [0.1, 0.15, 0.2, 0.25], "delay": [0, 1, 2, 3], "offset_theta": 0.01}
    sim.set_plant(candidates)
    sim.reset()
    for _ in range(7):  # two autoresets
        sim.step(np.zeros(4, np.float32))
    p = sim.plant()
    np.testing.assert_array_equal(p["m"], candidates["m"])
    np.testing.assert_array_equal(p["delay"], candidates["delay"])
    np.testing.assert_array_equal(p["offset_theta"], 0.01)


@pytest.mark.parametrize("values, message", [
    ({"delay": 1.5}, "whole steps"), ({"delay": 99}, "whole steps"),
    ({"motor_k": 0.0}, "motor_k"), ({"torque_noise": -1.0}, "torque_noise"),
    ({"mass": 1.0}, "unknown plant quantity"), ({"m": np.nan}, "finite")])
def test_set_plant_refuses_bad_values_and_writes_nothing(values, message):
    sim = rig(2, hold_plant=True)
    before = sim.plant()
    with pytest.raises(ValueError, match=message):
        sim.set_plant({"l": 0.5, **values})
    np.testing.assert_array_equal(sim.plant()["l"], before["l"])


def test_training_groups_face_one_plant_each_and_restarts_draw_new_ones():
    """The trainer's path: every branch of a group rolls out on its start
    trajectory's plant; a trajectory continued from a branch keeps it; one
    restarted from a reset draws a new one, the same from the same seed."""
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    import torch
    from grpo_ctrl.grpo import GroupRollout
    from grpo_ctrl.grpo_config import GRPOConfig
    from grpo_ctrl.policy import GaussianPolicy

    cfg = GRPOConfig(num_starts=6, group_size=4, horizon=6, loss_steps=3, action_repeat=2,
                     reset_prob=0.5, overlap=False)

    def collect(seed):
        rollout = GroupRollout(cfg, "pendulum", "rig", seed=seed, randomize=WIDE)
        before = rollout.pool.plant()
        pool_t = rollout.pool.get_state()["t"].copy()
        policy = GaussianPolicy(rollout.spec.nobs, rollout.spec.u_max)
        rollout.collect(policy, torch.Generator().manual_seed(seed))
        return rollout, before, pool_t

    rollout, before, _ = collect(11)
    group = rollout.group.plant()
    for name, values in group.items():  # branch i*G..i*G+G-1 carry trajectory i's plant
        np.testing.assert_array_equal(values.reshape(6, 4), np.repeat(before[name][:, None], 4, 1),
                                      err_msg=name)
    after, t = rollout.pool.plant(), rollout.pool.get_state()["t"]
    restarted = t == 0  # a reset puts the step counter back to 0; continuing ones are at 3 x 2
    assert restarted.any() and (~restarted).any()
    np.testing.assert_array_equal(after["m"][~restarted], before["m"][~restarted])
    assert np.all(after["m"][restarted] != before["m"][restarted])
    again, _, _ = collect(11)
    for name, values in after.items():
        np.testing.assert_array_equal(again.pool.plant()[name], values, err_msg=name)
