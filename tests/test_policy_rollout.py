"""The rollout in C (csrc/policy_rollout.c, ``BatchSim.roll_policy``) against
independent references: the policy's own torch forward on the observations C
recorded, the simulator stepped one call at a time from Python with the same
commands, a network built by hand whose output is sin(x), and the torch rollout
of ``GroupRollout`` on the same noise."""
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

import torch

from grpo_ctrl._pendsim import ffi, lib
from grpo_ctrl.grpo import GroupRollout, Trainer
from grpo_ctrl.grpo_config import default_config
from grpo_ctrl.policy import GaussianPolicy
from grpo_ctrl.sim import BatchSim


def _policy(nobs, u_max, hidden, layers, features, seed):
    torch.manual_seed(seed)
    p = GaussianPolicy(nobs, u_max, hidden, layers, features=features, feature_scale=3.0)
    with torch.no_grad():  # a trained-looking network: outputs of order 1, not ~0
        p.net[-1].weight.mul_(1000.0)
        p.net[-1].bias.fill_(0.2)
    x = torch.randn(500, nobs) * 2.0 + 0.5
    p.obs_norm.update(x)
    p.refresh_norm()
    return p


def _buffers(T, B, nobs):
    return (np.empty((T, B, nobs), np.float32), np.empty((T, B), np.float32),
            np.empty((T, B), np.float32), np.empty((T, B)), np.ones((T + 1, B), bool),
            np.zeros(B, np.float32))


@pytest.mark.parametrize("system,features,layers,hidden,B", [
    ("pendulum", 64, 2, 32, 256), ("pendulum", 0, 1, 5, 37), ("cartpole", 9, 3, 33, 17),
    ("furuta", 16, 2, 64, 1)])
def test_mean_matches_torch_forward_on_recorded_observations(system, features, layers, hidden,
                                                             B):
    sim = BatchSim(system, B, seed=3)
    p = _policy(sim.spec.nobs, sim.spec.u_max, hidden, layers, features, seed=B)
    net = p.c_mean_network()
    assert net is not None
    T = 12
    raw, mu, z, reward, alive, last = _buffers(T, B, sim.spec.nobs)
    spread = (np.random.default_rng(0).standard_normal((T, B)) * 0.5).astype(np.float32)
    start = sim.observe().copy()
    sim.roll_policy(*net, spread, raw, mu, z, reward, alive, last, False, u_max=p.u_max)
    assert np.array_equal(raw[0], start)
    with torch.no_grad():
        want = p.mu(p.normalise(torch.from_numpy(raw))).numpy()
    assert np.abs(want).max() > 0.5  # a network that does something
    np.testing.assert_allclose(mu, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    assert np.array_equal(z, mu + spread)  # float32 addition, as torch's
    np.testing.assert_allclose(last, p.u_max * np.tanh(z[-1]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("system,repeat,w_du", [("pendulum", 1, 0.0), ("pendulum", 3, 0.1),
                                                ("cartpole", 2, 0.05)])
def test_rollout_replays_bit_for_bit_through_python_steps(system, repeat, w_du):
    """Noise of +-20 saturates every command (tanh(z) is exactly +-1 in float32), so
    the commands are known exactly and a replay one ps_step call at a time must give
    the same observations, rewards and terminations, bit for bit."""
    B, T = 48, 30
    sim = BatchSim(system, B, seed=11)
    replay = BatchSim(system, B, seed=99)
    replay.copy_envs(np.arange(B), sim, np.arange(B))
    p = _policy(sim.spec.nobs, sim.spec.u_max, 16, 2, 8, seed=1)
    sign = np.where(np.random.default_rng(1).random((T, B)) < 0.5, -1.0, 1.0)
    spread = (20.0 * sign).astype(np.float32)
    raw, mu, z, reward, alive, last = _buffers(T, B, sim.spec.nobs)
    alive[0, ::7] = False  # branches that ended before this call earn nothing
    last[:] = p.u_max
    sim.observe()
    sim.roll_policy(*p.c_mean_network(), spread, raw, mu, z, reward, alive, last, True,
                    u_max=p.u_max, w_du=w_du, repeat=repeat)
    u = np.float32(p.u_max) * np.sign(z).astype(np.float32)
    prev, ok = np.full(B, p.u_max, np.float32), alive[0].copy()
    obs = replay.observe()
    for t in range(T):
        assert np.array_equal(raw[t], obs)
        du = (u[t] - prev) / np.float32(p.u_max)
        want = -(np.float32(w_du) * (du * du)).astype(np.float64) * ok
        for _ in range(repeat):
            obs, r, term, _ = replay.step(u[t])
            want = want + r * ok
            ok = ok & ~term
        np.testing.assert_array_equal(alive[t + 1], ok)
        np.testing.assert_allclose(reward[t], want, rtol=1e-12, atol=1e-12)
        prev = u[t]
    if system == "cartpole":
        assert (alive[:-1] & ~alive[1:]).any()  # terminations were exercised
    assert np.array_equal(last, u[-1])


def test_the_c_squash_against_numpy_tanh():
    """A network whose mean is 0 (every weight and bias zero), so z is the noise alone:
    the command after one decision, u_max tanh(z), against numpy's tanh in float64 over
    |z| up to 30 (both branches of the C tanh, the switch at 0.5, the clamp at 9),
    within 3 float32 ulp; a NaN command is refused as before."""
    B = 20_000
    sim = BatchSim("pendulum", B, seed=0)
    z = np.concatenate([np.linspace(-30.0, 30.0, B // 2),
                        np.geomspace(1e-30, 1.0, B // 4), -np.geomspace(1e-6, 12.0, B // 4)])
    spread = z.astype(np.float32)[None]
    nets = {"nobs": 3, "nfeat": 0, "nhidden": 1, "width": 4}
    params = np.zeros(2 * 3 + 4 * 3 + 4 + 4 + 1, np.float32)
    params[3:6] = 1.0  # the normaliser's scale
    raw, mu, zz, reward, alive, last = _buffers(1, B, 3)
    sim.observe()
    sim.roll_policy(nets, params, spread, raw, mu, zz, reward, alive, last, False, u_max=2.0)
    assert np.array_equal(zz[0], spread[0])
    want = 2.0 * np.tanh(spread[0].astype(np.float64))
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    assert (np.abs(last - want) <= 3.0 * ulp).all(), np.max(np.abs(last - want) / ulp)
    spread[0, 5] = np.nan
    with pytest.raises(ValueError, match="NaN|finite"):
        sim.roll_policy(nets, params, spread, raw, mu, zz, reward, alive, last, False,
                        u_max=2.0)


def test_the_c_sine_against_numpy_through_a_hand_built_network():
    """Feature weight 1, phase 0, the normaliser the identity; the hidden layer
    passes relu(s) and relu(-s), the output takes their difference: mu = sin(x0)."""
    B = 4000
    x = np.linspace(-300.0, 300.0, B).astype(np.float32)
    nobs = 3
    parts = [np.zeros(nobs), np.ones(nobs), np.array([1.0, 0.0, 0.0]), np.zeros(1),
             np.array([[1.0, 0, 0, 0], [-1.0, 0, 0, 0]]).ravel(), np.zeros(2),
             np.array([1.0, -1.0]), np.zeros(1)]
    params = np.concatenate(parts).astype(np.float32)
    sim = BatchSim("pendulum", B, seed=0)
    obs = sim.observe()
    obs[:] = 0.0
    obs[:, 0] = x
    raw, mu, z, reward, alive, last = _buffers(1, B, nobs)
    sim.roll_policy({"nobs": nobs, "nfeat": 1, "nhidden": 1, "width": 2}, params,
                    np.zeros((1, B), np.float32), raw, mu, z, reward, alive, last, False,
                    u_max=2.0)
    err = np.abs(mu[0] - np.sin(x.astype(np.float64)))
    assert err.max() < 3e-7, err.max()


def test_collect_in_c_matches_the_torch_rollout():
    """The same trainer state, start states and noise through both rollouts: the same
    batch up to float32 rounding (the network's sums run in another order)."""
    cfg = replace(default_config("pendulum", "gym"), overlap=False, num_starts=8,
                  time_budget=0.0, eval_every=1e9)
    trainer = Trainer(cfg, "pendulum", "gym")
    for _ in range(30):  # a policy that has learnt something
        trainer.step()
    batches = []
    for c in (True, False):
        rollout = GroupRollout(replace(cfg, c_rollout=c), "pendulum", "gym", seed=5)
        gen = torch.Generator().manual_seed(7)
        batches.append(rollout.collect(trainer.policy, gen))
    c_batch, t_batch = batches
    np.testing.assert_allclose(c_batch.mu_old, t_batch.mu_old, atol=1e-5)
    np.testing.assert_allclose(c_batch.z, t_batch.z, atol=1e-5)
    np.testing.assert_allclose(c_batch.raw_obs, t_batch.raw_obs, atol=2e-4)
    np.testing.assert_allclose(c_batch.returns, t_batch.returns, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("system, preset, iterations, init", [
    ("pendulum", "gym", 300, ""),  # a swing-up that succeeds in every episode
    ("pendulum", "rig", 60, ""),  # plants drawn, noise, delay, pushes
    ("double_pendulum", "acrobot", 0, "tests/data/double-pendulum-acrobot-trajopt-robust")])
def test_the_training_evaluation_in_c_is_the_deployed_controllers(system, preset, iterations,
                                                                  init, monkeypatch):
    """Trainer.evaluation_episodes (the C rollout, noise 0) against closed_loop.evaluate's
    deployed controller in torch, episode by episode: the returns within 1e-5 but for the
    few episodes whose commands' last bits send them another way, the same successes.
    The acrobot: a swing-up by trajectory optimisation (its catch in the simulator)."""
    from grpo_ctrl import closed_loop
    from grpo_ctrl.closed_loop import evaluate

    cfg = replace(default_config(system, preset), overlap=False, seed=0, init=init)
    trainer = Trainer(cfg, system, preset)
    for _ in range(iterations):
        trainer.step()
    with monkeypatch.context() as m:  # the C rollout's, not the controller's episodes
        m.setattr(closed_loop, "evaluate", None)
        returns, success = trainer.evaluation_episodes()
    ep = evaluate(trainer.policy.controller(trainer.spec), cfg.eval_episodes,
                  trainer.eval_seed, randomize=trainer.randomize, **trainer.rollout.catch)
    assert returns.shape == ep.returns.shape == (cfg.eval_episodes,)
    assert np.mean(np.abs(returns - ep.returns) <= 1e-5 * np.abs(ep.returns)) >= 0.9
    assert np.mean(success == ep.success) >= 0.95
    if system != "pendulum" or preset == "gym":
        assert success.mean() == 1.0
    assert trainer.evaluate() == (returns.mean(), success.mean())


@pytest.mark.parametrize("arch", [{"activation": "elu"}, {"activation": "tanh"}])
def test_networks_c_does_not_run_fall_back_to_torch(arch):
    p = GaussianPolicy(3, 2.0, 8, 2, **arch)
    assert p.c_mean_network() is None
    cfg = replace(default_config("pendulum", "gym"), overlap=False, num_starts=4,
                  time_budget=0.0, activation=arch["activation"], eval_every=1e9)
    Trainer(cfg, "pendulum", "gym").step()  # runs, through torch


def test_the_c_network_follows_every_change_of_the_policy():
    """``c_mean_network`` keeps the layers' flat views between calls; what it returns is
    always the policy as it is, after an in-place update, a ``load_state_dict`` (which
    copies into the features' B, kept transposed), a replaced parameter and a new
    normaliser."""
    p = _policy(3, 2.0, 8, 2, 5, seed=0)

    def fresh():
        parts = [p._obs_mean, p._obs_inv_std, p.net[0].B.t(), p.net[0].b]
        parts += [t for m in p.net if isinstance(m, torch.nn.Linear) for t in (m.weight, m.bias)]
        return torch.cat([t.detach().reshape(-1) for t in parts]).numpy()

    np.testing.assert_array_equal(p.c_mean_network()[1], fresh())
    with torch.no_grad():
        p.net[1].weight.add_(0.5)
    np.testing.assert_array_equal(p.c_mean_network()[1], fresh())
    p.load_state_dict(_policy(3, 2.0, 8, 2, 5, seed=1).state_dict())
    np.testing.assert_array_equal(p.c_mean_network()[1], fresh())
    p.net[-1].bias = torch.nn.Parameter(torch.tensor([3.0]))
    np.testing.assert_array_equal(p.c_mean_network()[1], fresh())
    p.obs_norm.update(torch.randn(50, 3) * 4.0)
    p.refresh_norm()
    got = p.c_mean_network()[1]
    np.testing.assert_array_equal(got, fresh())
    assert got[-1] == 3.0


def test_roll_policy_refuses_wrong_buffers():
    sim = BatchSim("pendulum", 4)
    p = _policy(3, 2.0, 8, 1, 0, seed=0)
    net, params = p.c_mean_network()
    raw, mu, z, reward, alive, last = _buffers(5, 4, 3)
    spread = np.zeros((5, 4), np.float32)
    with pytest.raises(ValueError, match="reward must be a C-contiguous float64"):
        sim.roll_policy(net, params, spread, raw, mu, z, reward.astype(np.float32), alive,
                        last, False, u_max=2.0)
    with pytest.raises(ValueError, match="alive must be .* of shape \\(6, 4\\)"):
        sim.roll_policy(net, params, spread, raw, mu, z, reward, alive[:5], last, False,
                        u_max=2.0)
    with pytest.raises(ValueError, match="params has 10 floats"):
        sim.roll_policy(net, params[:10].copy(), spread, raw, mu, z, reward, alive, last,
                        False, u_max=2.0)


def _roll_on(path: str, p, spread: np.ndarray) -> tuple:
    """The pendulum's branches (spread's columns) rolled out by ``p`` on SIMD path ``path``
    (selected, and left so): raw, mu, z, reward, alive, last."""
    T, B = spread.shape
    assert lib.pr_simd_select(path.encode()) >= 0
    sim = BatchSim("pendulum", B, seed=8)
    out = _buffers(T, B, 3)
    sim.observe()
    sim.roll_policy(*p.c_mean_network(), spread, *out, False, u_max=p.u_max, w_du=0.1)
    return out


def test_every_simd_path_rolls_out_the_same_bits():
    """The rollout on each SIMD path this CPU runs (csrc/policy_simd.h): the same means,
    actions, observations and rewards, bit for bit (the kernels add each lane's products
    in the same order, without fused multiply-adds)."""
    paths = ffi.string(lib.pr_simd_paths()).decode().split()
    start = ffi.string(lib.pr_simd_path())
    T, B = 20, 256
    p = _policy(3, 2.0, 32, 2, 64, seed=4)
    spread = (np.random.default_rng(2).standard_normal((T, B)) * 0.5).astype(np.float32)
    results = {}
    try:
        for path in paths:
            results[path] = [a.tobytes() for a in _roll_on(path, p, spread)]
    finally:
        lib.pr_simd_select(start)
    assert np.abs(np.frombuffer(results["plain"][1], np.float32)).max() > 0.5
    for path in paths:
        assert results[path] == results["plain"], path


def test_a_fused_path_rolls_out_the_same_means_within_float_rounding():
    """avx2+fma / avx512+fma (csrc/policy_simd.h): the first step's means, from the same
    observations, within 1e-5 of their largest of the exact path's, not the same bits;
    every step's finite."""
    fused = ffi.string(lib.pr_simd_fused_paths()).decode().split()
    if not fused:
        pytest.skip("no fused path on this CPU: it needs AVX2 and FMA (x86-64-v3)")
    start = ffi.string(lib.pr_simd_path())
    T, B = 20, 256
    p = _policy(3, 2.0, 32, 2, 64, seed=4)
    spread = (np.random.default_rng(2).standard_normal((T, B)) * 0.5).astype(np.float32)
    mus = {}
    try:
        for path in ["plain"] + fused:
            _, mu, _, reward, _, _ = _roll_on(path, p, spread)
            assert np.isfinite(mu).all() and np.isfinite(reward).all()
            mus[path] = mu
    finally:
        lib.pr_simd_select(start)
    want = mus["plain"][0]
    for path in fused:
        assert not np.array_equal(mus[path][0], want)
        np.testing.assert_allclose(mus[path][0], want, rtol=0, atol=1e-5 * np.abs(want).max())
