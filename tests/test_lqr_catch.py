"""The LQR's catch (``GRPOConfig.catch``): the same switch in the simulator's step
(csrc/pendsim.c, ``catch_level``), where training meets it, and in the deployed
controller (``baselines.lqr.LQRCatch``), which the exports carry."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from grpo_ctrl.baselines.lqr import CATCH_BAND, LQRCatch, catch_overrides, design, region_matrix
from grpo_ctrl.cli import main
from grpo_ctrl.controller import act
from grpo_ctrl.export.c_build import CPolicy, compile_shared, host_cc
from grpo_ctrl.export.c_codegen import write_c
from grpo_ctrl.export.onnx_export import export_onnx
from grpo_ctrl.plant import plant_spec
from grpo_ctrl.policy import GaussianPolicy, load_policy_controller
from grpo_ctrl.sim import BatchSim


class Constant(torch.nn.Module):
    """A controller that commands u everywhere (the catch's "outside")."""

    def __init__(self, spec, u: float):
        super().__init__()
        self.spec, self.u = spec, u

    def forward(self, obs):
        return torch.full((obs.shape[0], 1), self.u)


def wrapped(x):
    return (x + np.pi) % (2 * np.pi) - np.pi


def around_the_region(P, level, n, seed):
    """n states x whose sqrt(x'Px / level) spreads evenly over 0 to 4: a quarter inside the
    region, half in its blend (1 to CATCH_BAND = 3), a quarter outside."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, len(P)))
    z *= (np.sqrt(level) * rng.uniform(0, 4, n) / np.linalg.norm(z, axis=1))[:, None]
    return np.linalg.solve(np.linalg.cholesky(P).T, z.T).T  # P = C C', x = C'^-1 z


def observations(preset, x):
    """The simulator's float32 observations of states x (N, 4)."""
    sim = BatchSim("double_pendulum", len(x), preset)
    sim.reset()
    sim.set_state({"x": x})
    return sim.observe().copy()


def lqr_share(x, P, level):
    """The LQR's share of the command at states x: 1 below level, 0 above 9 level, linear
    in sqrt(x'Px) between."""
    e = np.concatenate([wrapped(x[:, :2]), x[:, 2:]], axis=1)
    r = np.sqrt(np.einsum("bi,ij,bj->b", e, P, e) / level)
    assert CATCH_BAND == 3
    return np.clip((3 - r) / 2, 0.0, 1.0), e


@pytest.mark.parametrize("preset", ["acrobot", "pendubot"])
def test_the_step_applies_the_lqr_inside_the_region_and_the_action_outside(preset):
    """Below x'Px = level the plant receives clip(-K x) whatever the action, above 9 level
    the action, between the two their blend: checked against a simulator without the catch
    that is given those commands."""
    spec = plant_spec("double_pendulum", preset)
    lqr = design("double_pendulum", preset)
    K, P, level = lqr.K.reshape(-1), lqr.P, 100.0
    x = around_the_region(P, level, 4000, 1)
    x[:, 0] += 2 * np.pi * np.random.default_rng(2).integers(-2, 3, len(x))  # whole turns off
    caught = BatchSim("double_pendulum", len(x), preset, **catch_overrides(spec, level))
    free = BatchSim("double_pendulum", len(x), preset)
    action = np.random.default_rng(3).uniform(-6, 6, len(x)).astype(np.float32)
    for sim in (caught, free):
        sim.reset()
        sim.set_state({"x": x})
    share, e = lqr_share(x, P, level)
    for part, (lo, hi) in {"LQR": (1, 1), "blend": (0.01, 0.99), "action": (0, 0)}.items():
        assert np.mean((share >= lo) & (share <= hi)) > 0.2, part  # each part tested
    command = (share * np.clip(-e @ K, -6, 6) + (1 - share) * action).astype(np.float32)
    _, r_caught, *_ = caught.step(action)
    _, r_free, *_ = free.step(command)
    np.testing.assert_array_equal(caught.get_state()["x"], free.get_state()["x"])
    np.testing.assert_array_equal(r_caught, r_free)  # the reward charges the applied torque


def test_a_level_of_zero_is_no_catch_and_bad_fields_are_refused():
    spec = plant_spec("double_pendulum", "acrobot")
    assert catch_overrides(spec, 0.0) == {}
    overrides = catch_overrides(spec, 100.0)
    for bad in ({"catch_level": -1.0}, {"catch_level": float("nan")},
                {"catch_P": np.full((4, 4), np.inf)}, {"catch_P": np.eye(3)},
                {"catch_K": [1.0, 2.0]}):
        with pytest.raises(ValueError):
            BatchSim("double_pendulum", 1, "acrobot", **{**overrides, **bad})


def test_the_region_leaves_out_the_cyclic_components():
    """The cart's position does not enter the region (as the swing-up's switch)."""
    spec = plant_spec("cartpole", "swingup")
    P = region_matrix(spec, design("cartpole", "swingup"))
    assert np.all(P[0] == 0) and np.all(P[:, 0] == 0) and np.all(np.linalg.eigvalsh(P[1:, 1:]) > 0)


def test_the_controller_is_the_lqr_inside_the_region_and_the_inner_one_outside():
    spec = plant_spec("double_pendulum", "acrobot")
    lqr = design("double_pendulum", "acrobot")
    ctrl = LQRCatch(Constant(spec, 1.5), spec, lqr, 100.0)
    x = around_the_region(lqr.P, 100.0, 2000, 4)
    obs = observations("acrobot", x)
    share, e = lqr_share(x, lqr.P, 100.0)
    # float32: x'Px sums terms up to ~1e4 times the level's ulp-sized parts
    np.testing.assert_allclose(ctrl.lqr_share(torch.as_tensor(obs)).numpy()[:, 0], share,
                               atol=5e-3)
    want = share * np.clip(-e @ lqr.K.reshape(-1), -6, 6) + (1 - share) * 1.5
    np.testing.assert_allclose(act(ctrl, obs), want, atol=0.03)
    np.testing.assert_array_equal(act(ctrl, obs)[share == 0], 1.5)


def test_the_controller_and_the_simulators_catch_fly_the_same_episode():
    """From states inside the region, the deployed controller (the LQR on the float32
    observation, an inner command of 0 outside) and the simulator's catch (the LQR on the
    float64 state, the action 0) fly 2 s to the same state, upright."""
    spec = plant_spec("double_pendulum", "acrobot")
    ctrl = LQRCatch(Constant(spec, 0.0), spec, design("double_pendulum", "acrobot"), 100.0)
    x = around_the_region(ctrl.lqr.P, 100.0 / 16, 64, 5)  # x'Px < 100
    caught = BatchSim("double_pendulum", len(x), "acrobot", **catch_overrides(spec, 100.0))
    plain = BatchSim("double_pendulum", len(x), "acrobot")
    for sim in (caught, plain):
        sim.reset()
        sim.set_state({"x": x})
    obs, zero = plain.observe().copy(), np.zeros(len(x), np.float32)
    for _ in range(1000):
        caught.step(zero)
        obs, *_ = plain.step(act(ctrl, obs))
    a, b = caught.get_state()["x"], plain.get_state()["x"]
    assert np.max(np.abs(a - b)) < 1e-3
    assert np.max(np.abs(wrapped(a[:, :2]))) < 0.05 and np.max(np.abs(a[:, 2:])) < 1.0


def test_export_carries_the_catch(tmp_path):
    """The caught policy's ONNX graph and its C computes the torch module's commands on
    observations inside the region, in its blend and outside."""
    spec = plant_spec("double_pendulum", "acrobot")
    torch.manual_seed(0)
    policy = GaussianPolicy(spec.nobs, spec.u_max, 32, 2, "relu", features=16)
    ctrl = policy.controller(spec, catch=100.0)
    assert isinstance(ctrl, LQRCatch)
    model, result = export_onnx(ctrl, tmp_path / "c.onnx", source="test")
    assert result.ok, result.summary()
    obs = observations("acrobot", around_the_region(ctrl.lqr.P, 100.0, 5000, 6))
    share = ctrl.lqr_share(torch.as_tensor(obs)).numpy()[:, 0]
    assert np.mean(share == 1) > 0.2 and np.mean((share > 0) & (share < 1)) > 0.2
    got = ort.InferenceSession(str(tmp_path / "c.onnx")).run(None, {"obs": obs})[0][:, 0]
    np.testing.assert_allclose(got, act(ctrl, obs), atol=1e-5)
    if host_cc() is None:
        pytest.skip("no C compiler on this host (apt-get install gcc): the C export unchecked")
    write_c(model, tmp_path / "c")
    c = CPolicy(compile_shared(tmp_path / "c" / "policy.c", tmp_path / "c" / "libpolicy.so"),
                spec.nobs).batch(obs)
    np.testing.assert_allclose(c, got, atol=1e-5)


@pytest.mark.parametrize("flags,caught", [([], True), (["--catch", "0"], False)])
def test_an_acrobot_run_deploys_the_catch_it_trained_with(tmp_path, flags, caught):
    """The acrobot preset trains with the catch (its default) and deploys it; --catch 0
    deploys the policy alone."""
    out = tmp_path / "run"
    assert main(["train", "--system", "double_pendulum", "--preset", "acrobot", *flags,
                 "--iterations", "2", "--time-budget", "0", "--overlap", "false",
                 "--num-starts", "4", "--group-size", "2", "--eval-episodes", "1",
                 "--out", str(out)]) == 0
    ctrl = load_policy_controller(out)
    assert isinstance(ctrl, LQRCatch) == caught
    assert ctrl.source_info["checkpoint"].endswith("deployed.pt")
    if caught:
        assert ctrl.level == 100.0
