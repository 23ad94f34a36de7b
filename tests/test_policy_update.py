"""The update's gradient in C (csrc/policy_update.c, ``CGradient``) against torch
autograd through grpo.py's own loss (``surrogate``, ``aggregate_loss``) on the
same policy and batch, against torch's ``clip_grad_norm_`` and ``clip_fractions``,
and a whole ``grpo_update`` with and without it."""
import copy
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

import torch

from grpo_ctrl._cdef import C_FLAGS
from grpo_ctrl._pendsim import ffi, lib
from grpo_ctrl.c_gradient import CGradient
from grpo_ctrl.grpo import (Trainer, adam, aggregate_loss, clip_fractions, gaussian_log_prob,
                            grpo_update)
from grpo_ctrl.grpo_config import default_config
from grpo_ctrl.policy import GaussianPolicy
from grpo_ctrl.trust_region import surrogate


def _policy(nobs, hidden, layers, features, seed):
    torch.manual_seed(seed)
    p = GaussianPolicy(nobs, 2.0, hidden, layers, features=features, feature_scale=3.0,
                       log_std_init=-0.3)
    with torch.no_grad():  # outputs of order 1, as after some training
        p.net[-1].weight.mul_(100.0)
    return p


def _batch(policy, B, L, seed, masked=0.2):
    """A batch as collect makes one: z drawn around a nearby old policy's mean, so the
    ratios spread on both sides of the clip; a fifth of the steps masked out."""
    g = torch.Generator().manual_seed(seed)
    nobs = policy.arch["nobs"]
    obs = torch.randn(B, L, nobs, generator=g) * 1.5
    with torch.no_grad():
        mu = policy.mu(obs)
    mu_old = mu + 0.3 * torch.randn(B, L, generator=g)
    log_std_old = torch.tensor([-0.4])
    z = mu_old + torch.exp(log_std_old) * torch.randn(B, L, generator=g)
    mask = (torch.rand(B, L, generator=g) >= masked).float()
    return SimpleNamespace(obs=obs, z=z, logp_old=gaussian_log_prob(z, mu_old, log_std_old),
                           mu_old=mu_old, adv=torch.randn(B, L, generator=g), mask=mask,
                           log_std_old=log_std_old, probe_mask=None)


def _torch_gradient(policy, batch, rows, agg, eps_low, eps_high):
    policy.zero_grad()
    mu, log_std = policy.dist(batch.obs[rows])
    logp = gaussian_log_prob(batch.z[rows], mu, log_std)
    ratio = torch.exp(logp - batch.logp_old[rows])
    per_step = -surrogate("clip", ratio, batch.adv[rows], eps_low, eps_high)
    loss = aggregate_loss(per_step, batch.mask[rows], agg, batch.z.shape[1])
    loss.backward()
    low, high = clip_fractions(ratio.detach(), batch.adv[rows], batch.mask[rows], eps_low,
                               eps_high)
    return float(loss.detach()), [p.grad.clone() for p in policy.parameters()], low, high, mu.detach()


def _obs_zeroed(batch, idle_rows):
    """The batch with zeros, not NaN, where ``idle_rows`` are (for autograd, which
    computes every step)."""
    obs = batch.obs.clone()
    obs[idle_rows] = 0.0
    return SimpleNamespace(**{**vars(batch), "obs": obs})


CFG = default_config("pendulum", "gym")


@pytest.mark.parametrize("nobs,hidden,layers,features,B,L,nrows", [
    (3, 32, 2, 64, 256, 32, 128),   # the gym default's minibatch
    (3, 17, 3, 0, 40, 13, 37),      # no features; widths and rows not whole blocks or chunks
    (5, 9, 1, 7, 12, 50, 1),        # one branch: a part of a chunk
    (6, 64, 2, 16, 30, 64, 30)])
@pytest.mark.parametrize("agg", ["token", "grpo", "dr_grpo"])
def test_gradient_matches_torch_autograd(nobs, hidden, layers, features, B, L, nrows, agg):
    policy = _policy(nobs, hidden, layers, features, seed=B + nrows)
    batch = _batch(policy, B, L, seed=nrows)
    rows = torch.randperm(B, generator=torch.Generator().manual_seed(1))[:nrows]
    loss, want, low, high, mu = _torch_gradient(policy, batch, rows, agg, 0.2, 0.28)
    assert low > 0.01 and high > 0.01  # both sides of the clip are exercised
    c = CGradient.of(policy, CFG, batch)
    got = c.gradient(rows, agg, 0.2, 0.28, 0.0)
    for w, p in zip(want, policy.parameters()):
        assert w.abs().max() > 0
        np.testing.assert_allclose(p.grad, w, rtol=1e-4, atol=1e-5 * float(w.abs().max()))
    assert got["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-6)
    assert got["clip_low"] == pytest.approx(low) and got["clip_high"] == pytest.approx(high)
    norm = math.sqrt(sum(float((w ** 2).sum()) for w in want))
    assert got["grad_norm"] == pytest.approx(norm, rel=1e-5)
    np.testing.assert_allclose(c.mean(rows), mu, rtol=1e-5, atol=1e-5 * float(mu.abs().max()))


def test_clipping_matches_clip_grad_norm():
    policy = _policy(3, 32, 2, 64, seed=0)
    batch = _batch(policy, 64, 32, seed=0)
    rows = torch.arange(0, 64, 2)
    _, want, *_ = _torch_gradient(policy, batch, rows, "token", 0.2, 0.28)
    for p, w in zip(policy.parameters(), want):
        p.grad = w.clone()
    norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.01))
    assert norm > 0.05  # five times the bound: the clip acts
    clipped = [p.grad.clone() for p in policy.parameters()]
    got = CGradient.of(policy, CFG, batch).gradient(rows, "token", 0.2, 0.28, 0.01)
    assert got["grad_norm"] == pytest.approx(norm, rel=1e-5)
    for w, p in zip(clipped, policy.parameters()):
        np.testing.assert_allclose(p.grad, w, rtol=1e-4, atol=1e-5 * float(w.abs().max()))


def test_no_step_in_the_loss_gives_a_zero_gradient():
    policy = _policy(3, 8, 2, 4, seed=0)
    batch = _batch(policy, 8, 16, seed=0, masked=1.0)
    got = CGradient.of(policy, CFG, batch).gradient(torch.arange(8), "token", 0.2, 0.28, 1.0)
    assert got["loss"] == 0.0 and got["grad_norm"] == 0.0
    assert all(float(p.grad.abs().max()) == 0.0 for p in policy.parameters())


@pytest.mark.parametrize("idle", ["adv", "mask"])
def test_steps_that_cannot_move_the_loss_are_skipped_by_whole_tiles(idle):
    """Branches whose advantage is 0 (groups whose returns all tie) or whose steps are all
    masked (ended) fill whole tiles of 16 lanes (L = 32), which C skips: observations that
    would poison any sum they entered (NaN) change no bit of the gradient. Without the skip
    the weights' lane sums would add the same terms in the same order (the recorded weight
    hashes, tests/test_weight_hashes.py, hold either way)."""
    policy = _policy(3, 32, 2, 64, seed=3)
    batch = _batch(policy, 64, 32, seed=3)
    idle_rows = torch.arange(64) % 3 == 0
    getattr(batch, idle)[idle_rows] = 0.0
    rows = torch.randperm(64, generator=torch.Generator().manual_seed(2))
    got = []
    for fill in (0.0, float("nan")):
        batch.obs[idle_rows] = fill
        c = CGradient.of(policy, CFG, batch)
        stats = c.gradient(rows, "token", 0.2, 0.28, 0.0)
        got.append(([p.grad.clone() for p in policy.parameters()], stats))
    (clean, clean_stats), (poisoned, poisoned_stats) = got
    assert math.isfinite(poisoned_stats["loss"]) and poisoned_stats == clean_stats
    for a, b in zip(clean, poisoned):
        assert a.abs().max() > 0 and torch.equal(a, b)
    _, want, *_ = _torch_gradient(policy, _obs_zeroed(batch, idle_rows), rows, "token", 0.2,
                                  0.28)
    for w, a in zip(want, clean):
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5 * float(w.abs().max()))


def test_a_whole_update_matches_the_torch_update():
    """One grpo_update (two minibatches, Adam, the gradient clip, the KL diagnostic)
    from the same trainer state, with the gradient from C and from autograd."""
    cfg = replace(default_config("pendulum", "gym"), overlap=False, time_budget=0.0,
                  eval_every=1e9, epochs=2)
    trainer = Trainer(cfg, "pendulum", "gym")
    for _ in range(20):
        trainer.step()
    batch = trainer.rollout.collect(trainer.policy, trainer.gen)
    results = []
    for c_update in (True, False):
        policy = copy.deepcopy(trainer.policy)
        opt = adam(policy.parameters(), cfg.lr)
        opt.load_state_dict(copy.deepcopy(trainer.opt.state_dict()))  # its own moments
        stats = grpo_update(policy, None, opt, batch, replace(cfg, c_update=c_update), 0.2,
                            0.28, torch.Generator().manual_seed(3))
        results.append((stats, [p.detach().clone() for p in policy.parameters()]))
    (c_stats, c_params), (t_stats, t_params) = results
    moved = sum(float((p - q.detach()).abs().max())
                for p, q in zip(c_params, trainer.policy.parameters()))
    assert moved > 1e-4
    # Within 2e-6 but for a few weights of one unit: a step whose pre-activation lies
    # within float error of 0 can pass a ReLU in one implementation and not in the other
    # (the features' sine is a polynomial in C, torch's own in torch), and Adam scales that
    # one step's difference up where the unit's gradients are rare (seen once: 9 weights
    # of 1,024 moved 1.1e-5 apart, the rest within 3e-8)
    off = 0
    for p, q in zip(c_params, t_params):
        np.testing.assert_allclose(p, q, atol=5e-5)
        off += int(((p - q).abs() > 2e-6).sum())
    assert off <= 16, off
    for key in ("grad_norm", "clip_low", "clip_high"):
        assert c_stats[key] == pytest.approx(t_stats[key], rel=1e-4, abs=1e-7), key
    assert c_stats["kl_old"] == pytest.approx(t_stats["kl_old"], rel=1e-3, abs=1e-9)


@pytest.mark.parametrize("change", [
    {"c_update": False}, {"loss_type": "sapo"},
    {"w_smooth": 0.1}, {"beta": 0.1}])
def test_losses_c_does_not_compute_fall_back_to_torch(change):
    policy = _policy(3, 8, 2, 4, seed=0)
    batch = _batch(policy, 8, 4, seed=0)
    ref = copy.deepcopy(policy) if "beta" in change else None
    assert CGradient.of(policy, replace(CFG, **change), batch, ref) is None


@pytest.mark.parametrize("arch", [{"activation": "elu"}, {"activation": "tanh"}])
def test_policies_c_does_not_run_fall_back_to_torch(arch):
    policy = GaussianPolicy(3, 2.0, 8, 2, **arch)
    batch = _batch(_policy(3, 8, 2, 0, seed=0), 8, 4, seed=0)
    assert CGradient.of(policy, CFG, batch) is None


def test_rows_out_of_range_are_refused():
    policy = _policy(3, 8, 2, 4, seed=0)
    batch = _batch(policy, 8, 4, seed=0)
    c = CGradient.of(policy, CFG, batch)
    with pytest.raises(ValueError, match="pu_gradient"):
        c.gradient(torch.tensor([0, 8]), "token", 0.2, 0.28, 1.0)
    with pytest.raises(ValueError, match="pu_mean"):
        c.mean(torch.tensor([-1]))


def test_gradients_moved_elsewhere_are_followed():
    """Data-parallel training moves every .grad into one flat buffer after the first
    minibatch (distributed.py): the next C call writes there, not into the freed tensors."""
    policy = _policy(3, 8, 2, 4, seed=0)
    batch = _batch(policy, 16, 8, seed=0)
    c = CGradient.of(policy, CFG, batch)
    c.gradient(torch.arange(8), "token", 0.2, 0.28, 0.0)
    params = list(policy.parameters())
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    at = 0
    for p in params:
        p.grad = flat[at:at + p.numel()].view_as(p)
        at += p.numel()
    flat.zero_()
    rows = torch.arange(8, 16)
    c.gradient(rows, "token", 0.2, 0.28, 0.0)
    _, want, *_ = _torch_gradient(copy.deepcopy(policy), batch, rows, "token", 0.2, 0.28)
    at = 0
    for p, w in zip(params, want):
        np.testing.assert_allclose(flat[at:at + p.numel()].view_as(p), w, rtol=1e-4,
                                   atol=1e-5 * float(w.abs().max()))
        at += p.numel()


def test_one_policy_keeps_its_network_and_takes_each_batch():
    """``CGradient.of`` sets a policy's network up once and binds each new batch: a second
    batch's gradient is that batch's (against autograd); parameters replaced since (not
    updated in place) get a network built again; the cache does not keep a policy alive."""
    import gc
    import weakref
    policy = _policy(3, 8, 2, 4, seed=0)
    first, second = _batch(policy, 8, 4, seed=0), _batch(policy, 8, 4, seed=1)
    c = CGradient.of(policy, CFG, first)
    assert CGradient.of(policy, CFG, second) is c
    rows = torch.arange(8)
    c.gradient(rows, "token", 0.2, 0.28, 0.0)
    _, want, *_ = _torch_gradient(copy.deepcopy(policy), second, rows, "token", 0.2, 0.28)
    for p, w in zip(policy.parameters(), want):
        np.testing.assert_allclose(p.grad, w, rtol=1e-4, atol=1e-5 * float(w.abs().max()))
    layer = policy.net[-1]
    layer.weight = torch.nn.Parameter(layer.weight.detach() * 2.0)  # elsewhere in memory
    c2 = CGradient.of(policy, CFG, second)
    assert c2 is not c
    c2.gradient(rows, "token", 0.2, 0.28, 0.0)
    _, want, *_ = _torch_gradient(copy.deepcopy(policy), second, rows, "token", 0.2, 0.28)
    for p, w in zip(policy.parameters(), want):
        np.testing.assert_allclose(p.grad, w, rtol=1e-4, atol=1e-5 * float(w.abs().max()))
    alive = weakref.ref(policy)
    del policy, layer, c, c2
    gc.collect()
    assert alive() is None


# --- SIMD paths (csrc/policy_simd.h) ---------------------------------------------------------

CSRC = Path(__file__).resolve().parent.parent / "csrc"
PATHS = ffi.string(lib.pr_simd_paths()).decode().split()
FUSED = ffi.string(lib.pr_simd_fused_paths()).decode().split()


@pytest.fixture
def simd_path():
    """Selects a SIMD path for the test; the one in use before comes back after it."""
    start = ffi.string(lib.pr_simd_path())
    yield lambda name: lib.pr_simd_select(name.encode())
    lib.pr_simd_select(start)


@pytest.mark.parametrize("nobs,hidden,layers,features,B,L,nrows", [
    (3, 32, 2, 64, 256, 32, 128), (3, 17, 3, 0, 40, 13, 37), (6, 64, 2, 16, 30, 64, 30)])
def test_every_simd_path_gives_the_same_gradient_bits(simd_path, nobs, hidden, layers, features,
                                                      B, L, nrows):
    """Each path adds each lane's products in the same order without fused multiply-adds,
    so the gradients, loss and means agree bit for bit; the plain loops' against torch
    autograd to float32 rounding."""
    p = _policy(nobs, hidden, layers, features, seed=B)
    batch = _batch(p, B, L, seed=1)
    rows = torch.randperm(B, generator=torch.Generator().manual_seed(2))[:nrows]
    results = {}
    for path in PATHS:
        assert simd_path(path) >= 0
        assert ffi.string(lib.pr_simd_path()).decode() == path
        p.zero_grad()
        c = CGradient.of(p, CFG, batch)
        stats = c.gradient(rows, "grpo", 0.2, 0.28, 0.0)
        mu = c.mean(rows)
        results[path] = ([t.grad.numpy().tobytes() for t in p.parameters()], stats,
                         mu.numpy().tobytes())
    for path in PATHS:
        assert results[path] == results["plain"], path
    simd_path("plain")
    _, want, _, _, _ = _torch_gradient(p, batch, rows, "grpo", 0.2, 0.28)
    p.zero_grad()
    CGradient.of(p, CFG, batch).gradient(rows, "grpo", 0.2, 0.28, 0.0)
    for got, ref in zip((t.grad for t in p.parameters()), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()) + 1e-7)


@pytest.mark.parametrize("nobs,hidden,layers,features,B,L,nrows", [
    (3, 32, 2, 64, 256, 32, 128), (3, 17, 3, 0, 40, 13, 37), (6, 64, 2, 16, 30, 64, 30)])
def test_the_fused_paths_give_the_gradient_within_float_rounding(simd_path, nobs, hidden, layers,
                                                                 features, B, L, nrows):
    """avx2+fma and avx512+fma round each product once, with its sum: not the exact paths'
    bits, but their gradients, loss and means within float32 rounding of the plain loops'
    (means to 1e-5 of their largest, gradients to 1e-4 relative), and the two fused paths
    (the same products in the same order) the same bits."""
    if not FUSED:
        pytest.skip("no fused path on this CPU: it needs AVX2 and FMA (x86-64-v3)")
    p = _policy(nobs, hidden, layers, features, seed=B)
    batch = _batch(p, B, L, seed=1)
    rows = torch.randperm(B, generator=torch.Generator().manual_seed(2))[:nrows]
    results = {}
    for path in ["plain"] + FUSED:
        assert simd_path(path) >= 0
        assert ffi.string(lib.pr_simd_path()).decode() == path
        p.zero_grad()
        c = CGradient.of(p, CFG, batch)
        stats = c.gradient(rows, "grpo", 0.2, 0.28, 0.0)
        results[path] = ([t.grad.clone() for t in p.parameters()], stats, c.mean(rows).clone())
    want_grads, want_stats, want_mu = results["plain"]
    for path in FUSED:
        grads, stats, mu = results[path]
        assert not torch.equal(mu, want_mu)  # the fused products do round otherwise
        np.testing.assert_allclose(mu, want_mu, rtol=0, atol=1e-5 * float(want_mu.abs().max()))
        for got, ref in zip(grads, want_grads):
            np.testing.assert_allclose(got, ref, rtol=1e-4,
                                       atol=1e-5 * float(ref.abs().max()) + 1e-7)
        assert stats["loss"] == pytest.approx(want_stats["loss"], rel=1e-5, abs=1e-7)
    if len(FUSED) == 2:
        a, b = (results[path] for path in FUSED)
        assert all(torch.equal(x, y) for x, y in zip(a[0], b[0])) and torch.equal(a[2], b[2])


def test_the_workspace_may_start_at_any_float():
    """pu_gradient and pr_mean start their workspace's parts on a cache line within the
    buffer they are given (a buffer 16 bytes off one split the loads and cost 13 %): the
    same bits from every float's offset in a line, and no write past pu_work_size /
    pr_work_size (the floats after it stay as they were)."""
    p = _policy(3, 32, 2, 64, seed=5)
    batch = _batch(p, 64, 32, seed=3)
    rows = torch.arange(0, 64, 2, dtype=torch.int64)
    c = CGradient.of(p, CFG, batch)
    size = lib.pu_work_size(c.net)
    net, params = p.c_mean_network()
    pr = ffi.new("pr_net *", net)
    pr.params = ffi.from_buffer("float[]", params)
    B = 64  # rows exactly B apart: pr_mean's last part, its output, written to the end
    obs = np.random.default_rng(0).standard_normal((B, 3)).astype(np.float32)
    mu = np.empty(B, np.float32)
    pr_size = lib.pr_work_size(pr, B)
    calls = [(size, lambda work: lib.pu_gradient(
                 c.net, float(p.log_std.detach()), c.batch, ffi.cast("int64_t *", rows.data_ptr()),
                 rows.numel(), lib.PU_AGG_TOKEN, 0.2, 0.28, 0.0, c.grad_log_std, c.stats, work)),
             (pr_size, lambda work: lib.pr_mean(pr, B, ffi.from_buffer("float[]", obs),
                                                ffi.from_buffer("float[]", mu), work))]
    got = set()
    for offset in range(16):
        for n, call in calls:
            buffer = np.full(n + 32, 7.0, np.float32)
            assert call(ffi.from_buffer("float[]", buffer[offset:offset + n])) == 0
            assert np.all(buffer[offset + n:] == 7.0)
        got.add(b"".join(t.grad.numpy().tobytes() for t in p.parameters() if t.grad is not None)
                + mu.tobytes())
    assert len(got) == 1


def test_the_paths_a_cpu_runs_and_the_cap():
    assert PATHS[-2:] == ["baseline", "plain"] and PATHS == sorted(
        PATHS, key=["avx512", "avx2", "baseline", "plain"].index)
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":")[1].split())
                break
    assert ("avx512" in PATHS) == ({"avx512f", "avx512vl", "avx512bw", "avx512dq"} <= flags)
    assert ("avx2" in PATHS) == ({"avx2", "fma", "bmi1", "bmi2"} <= flags)
    assert FUSED == [f"{path}+fma" for path in PATHS if path.startswith("avx")]
    assert ffi.string(lib.pr_simd_path()).decode() in PATHS + FUSED
    assert lib.pr_simd_select(b"avx 512") == -1 and lib.pr_simd_select(ffi.NULL) == -1


def test_the_default_path_is_the_widest_fused_where_the_cpu_has_avx2():
    """Fused products wherever the widest path is avx2 or avx512 (faster on Intel and AMD
    cores alike); baseline or plain elsewhere: csrc/policy_simd.c."""
    want = f"{PATHS[0]}+fma" if PATHS[0] in ("avx2", "avx512") else PATHS[0]
    assert ffi.string(lib.pr_simd_default()).decode() == want
    assert want in FUSED + PATHS


@pytest.mark.parametrize("value,want", [("avx512", 0), ("avx2", 1), ("baseline", 2),
                                        ("plain", 3), ("", None), (None, None)])
def test_grpo_ctrl_simd_picks_the_path_capped_at_the_cpu(value, want):
    """The environment variable, read when the library loads: a path, capped at the widest
    the CPU runs (PATHS, widest first), or unset/empty: the default (pr_simd_default)."""
    env = {k: v for k, v in os.environ.items() if k != "GRPO_CTRL_SIMD"}
    if value is not None:
        env["GRPO_CTRL_SIMD"] = value
    r = subprocess.run([sys.executable, "-c", "from grpo_ctrl._pendsim import ffi, lib; "
                        "print(ffi.string(lib.pr_simd_path()).decode())"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    names = ["avx512", "avx2", "baseline", "plain"]
    assert r.stdout.strip() == (ffi.string(lib.pr_simd_default()).decode() if want is None
                                else max(PATHS[0], names[want], key=names.index))


def test_a_bad_grpo_ctrl_simd_is_a_one_line_error():
    env = dict(os.environ, GRPO_CTRL_SIMD="avx3")
    r = subprocess.run([sys.executable, "-c", "import grpo_ctrl._pendsim"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: GRPO_CTRL_SIMD=avx3 is not a SIMD path; this CPU runs: {' '.join(PATHS + FUSED)}"]


def test_check_kernels_every_path_against_plain_and_a_double_reference(tmp_path):
    """csrc/check_kernels.c, built with the extension's flags: the mean and the gradient on
    networks of the default's and of odd shapes, each path's bits against the plain loops',
    the plain loops within 1e-5 (mean) and 1e-4 (gradient) of the largest value of a double
    reference."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed"
    exe = tmp_path / "check_kernels"
    subprocess.run([cc, *C_FLAGS, "-pedantic", "-Werror", f"-I{CSRC}",
                    *(str(CSRC / f) for f in ("check_kernels.c", "pendsim.c", "plants.c",
                                              "policy_rollout.c", "policy_update.c",
                                              "policy_simd.c")), "-lm", "-o", str(exe)],
                   check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[0].startswith(f"paths: {' '.join(PATHS)} ")
    # ~15,800 values compared on each exact path: 47,451 on an AVX2-only CPU, 63,268 with AVX-512
    assert r.stdout.splitlines()[-1].startswith("ok ")
    assert int(r.stdout.split()[-1]) > 15_000 * len(PATHS)
    digests = {}
    for line in r.stdout.splitlines()[1:-1]:
        net, path, digest = line.rsplit(" ", 2)
        digests.setdefault(net, set()).add(digest)
    assert len(digests) == 6 and all(len(d) == 1 for d in digests.values())


def test_bench_kernels_times_every_path_and_the_libraries():
    """grpo-ctrl bench kernels, one short round: the CPU, its paths, a row per path (whole
    network and products only) and the library rows; a bad option is one line, exit 2."""
    cli = [sys.executable, "-m", "grpo_ctrl.cli", "bench", "kernels"]
    r = subprocess.run(cli + ["--rounds", "1", "--seconds", "0.002"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("CPU: ") and f"widest SIMD path {PATHS[0]}" in lines[0]
    assert lines[1].startswith(f"SIMD paths this CPU runs: {' '.join(PATHS)} ")
    rows = {line[:40].strip(): line[40:].split() for line in lines[5:]}
    for path in PATHS:
        assert float(rows[f"C {path}"][0]) > 0 and float(rows[f"C {path}"][2]) > 0
        assert float(rows[f"C {path}, products only"][0]) > 0
    assert rows[f"C {PATHS[0]}"][1] == "1.00"
    assert float(rows["torch mm (products only)"][2]) > 0
    bad = subprocess.run(cli + ["--rounds", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["avx512+fma", "avx2+fma"])
def test_grpo_ctrl_simd_takes_a_fused_path_capped_at_the_cpu(value):
    """A +fma name, capped at the widest fused path the CPU runs; on a CPU without AVX2 and
    FMA, the widest exact one."""
    env = dict(os.environ, GRPO_CTRL_SIMD=value)
    r = subprocess.run([sys.executable, "-c", "from grpo_ctrl._pendsim import ffi, lib; "
                        "print(ffi.string(lib.pr_simd_path()).decode())"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    if not FUSED:
        assert r.stdout.strip() == PATHS[0]
    else:
        assert r.stdout.strip() == max(FUSED[0], value, key=["avx512+fma", "avx2+fma"].index)
