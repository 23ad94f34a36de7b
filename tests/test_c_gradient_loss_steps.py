"""loss_steps (grpo_ctrl/c_gradient.py, csrc/policy_update.c's pu_loss_steps): a rollout's
loss steps as a Batch holds them, bit for bit what torch made of them before (the
transposes, gaussian_log_prob, the mask, the saturated advantages, policy.normalise)."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

from grpo_ctrl.c_gradient import loss_steps  # noqa: E402
from grpo_ctrl.grpo import saturated, saturation_bound  # noqa: E402
from grpo_ctrl.policy import GaussianPolicy, gaussian_log_prob  # noqa: E402


def _reference(policy, L, z, mu, alive, adv_branch, bound, raw):
    """What GroupRollout.collect computed in torch."""
    zl = torch.from_numpy(z)[:L].T.contiguous()
    mul = torch.from_numpy(mu)[:L].T.contiguous()
    log_std = policy.log_std.detach()
    adv = torch.from_numpy(np.repeat(adv_branch[:, None], L, axis=1)).float()
    if bound > 0:
        adv.masked_fill_(saturated(mul, log_std, bound), 0.0)
    return {"z": zl, "mu": mul, "logp_old": gaussian_log_prob(zl, mul, log_std),
            "mask": torch.from_numpy(np.ascontiguousarray(alive[:L].T, dtype=np.float32)),
            "adv": adv, "obs": policy.normalise(torch.from_numpy(raw)[:L].transpose(0, 1))
            .contiguous()}


@pytest.mark.parametrize("H, L, B, nobs, bound", [(64, 32, 256, 3, 3.0), (9, 9, 5, 6, 0.0),
                                                  (7, 3, 33, 4, 0.5)])
def test_loss_steps_are_the_torch_ones_bit_for_bit(H, L, B, nobs, bound):
    rng = np.random.default_rng(H * B)
    policy = GaussianPolicy(nobs, 2.0, hidden=8, layers=1, log_std_init=-0.37)
    policy.obs_norm.merge(100.0, torch.randn(nobs, dtype=torch.float64),
                          torch.rand(nobs, dtype=torch.float64) + 0.1)
    policy.refresh_norm()
    z = (rng.normal(size=(H, B)) * 4).astype(np.float32)
    mu = (rng.normal(size=(H, B)) * 4).astype(np.float32)
    if bound > 0:  # means on the threshold and one float either side of it
        edge = np.float32(saturation_bound(policy.log_std.detach(), bound))
        mu[0, :3] = [edge, np.nextafter(edge, np.float32(0)), np.nextafter(edge, np.float32(9))]
        mu[1, :3] = -mu[0, :3]
    alive = rng.random((H + 1, B)) < 0.8
    adv_branch = rng.normal(size=B) * 1e3
    raw = (rng.normal(size=(H, B, nobs)) * 5).astype(np.float32)
    want = _reference(policy, L, z, mu, alive, adv_branch, bound, raw)
    got = loss_steps(policy, L, z, mu, alive, adv_branch,
                     saturation_bound(policy.log_std.detach(), bound), raw)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].shape == want[key].shape, key
        assert torch.equal(got[key], want[key]), key
    shipped = loss_steps(policy, L, z, mu, alive, adv_branch, math.inf, None)
    assert "obs" not in shipped and torch.equal(shipped["logp_old"], want["logp_old"])


def test_loss_steps_refuses_wrong_arrays():
    policy = GaussianPolicy(3, 2.0, hidden=8, layers=1)
    z = np.zeros((4, 5), np.float32)
    alive = np.ones((5, 5), bool)
    adv = np.zeros(5)
    raw = np.zeros((4, 5, 3), np.float32)
    loss_steps(policy, 4, z, z, alive, adv, math.inf, raw)
    for args in [(5, z, z, alive, adv, math.inf, raw),  # L beyond the rollout
                 (4, z.astype(np.float64), z, alive, adv, math.inf, raw),
                 (4, z, z[:, :4], alive, adv, math.inf, raw),
                 (4, z, z, alive.astype(np.uint8), adv, math.inf, raw),
                 (4, z, z, alive, adv.astype(np.float32), math.inf, raw),
                 (4, z, z, alive, adv, math.inf, np.zeros((4, 5, 2), np.float32)),
                 (4, np.asfortranarray(z), z, alive, adv, math.inf, raw)]:
        with pytest.raises(ValueError):
            loss_steps(policy, *args)


@pytest.mark.parametrize("loss_type", ["clip", "adaptive_clip"])
def test_the_c_update_kl_is_gaussian_kl_s(loss_type):
    """update_kl's KL(pi_old || pi) by C (CGradient.kl_old, in double) after an update has
    moved the policy: gaussian_kl's masked mean by torch in float64 of the C means, on one
    branch in KL_STRIDE (clip) or all of them (adaptive clip)."""
    from dataclasses import replace

    from grpo_ctrl.grpo import KL_STRIDE, Trainer, diagnostic_rows, gaussian_kl, grpo_update
    from grpo_ctrl.grpo_config import default_config
    cfg = replace(default_config("pendulum", "gym"), overlap=False, time_budget=0.0,
                  eval_every=1e9, loss_type=loss_type, lr=0.02)
    tr = Trainer(cfg, "pendulum", "gym")
    for _ in range(3):
        tr.step()
    batch = tr.rollout.collect(tr.policy, tr.gen)
    got = grpo_update(tr.policy, None, tr.opt, batch, cfg, 0.2, 0.28, tr.gen,
                      backend=tr.backend)["kl_old"]
    rows = diagnostic_rows(batch.z.shape[0], KL_STRIDE if loss_type == "clip" else 1)
    with torch.no_grad():  # in float64: float32's var_ratio - 1 cancels to ~1e-5 of the KL
        mu, m = tr.backend.mean(rows).double(), batch.mask[rows].double()
        want = float((gaussian_kl(batch.mu_old[rows].double(), batch.log_std_old.double(), mu,
                                  tr.policy.log_std.double()) * m).sum() / m.sum().clamp(min=1.0))
    assert got > 1e-6 and got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("B, L, stride, u_max", [(256, 32, 8, 2.0), (20, 7, 8, 0.3), (9, 5, 1, 7.5)])
def test_the_c_squashed_entropy_is_torch_s(B, L, stride, u_max):
    """c_gradient.squashed_entropy (one C call, in double) against grpo.squashed_entropy and
    a float64 reference by torch: within float32 rounding, z out to the softplus's far
    ends."""
    from grpo_ctrl.c_gradient import squashed_entropy as c_squashed_entropy
    from grpo_ctrl.grpo import diagnostic_rows, squashed_entropy
    gen = torch.Generator().manual_seed(B)
    z = torch.randn(B, L, generator=gen) * 3
    z.view(-1)[:2] = torch.tensor([40.0, -40.0])  # beyond softplus's threshold, both sides
    mu = z + torch.randn(B, L, generator=gen) * 0.4
    log_std = torch.tensor([-0.6])
    logp_old = gaussian_log_prob(z, mu, log_std)
    mask = (torch.rand(B, L, generator=gen) < 0.9).float()
    rows = diagnostic_rows(B, stride)
    want = squashed_entropy(logp_old, z, mask, u_max) if stride == 8 else None
    if want is None:  # squashed_entropy's own stride is ENTROPY_STRIDE: all rows by hand
        from grpo_ctrl.policy import log_tanh_jacobian
        want = -float(((logp_old - log_tanh_jacobian(z, u_max)) * mask).sum()
                      / mask.sum().clamp(min=1.0))
    got = c_squashed_entropy(logp_old, z, mask, u_max, rows)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    from grpo_ctrl.policy import log_tanh_jacobian
    z64, m64 = z[rows].double(), mask[rows].double()
    exact = -float(((logp_old[rows].double() - log_tanh_jacobian(z64, u_max)) * m64).sum()
                   / m64.sum().clamp(min=1.0))
    assert got == pytest.approx(exact, rel=1e-9, abs=1e-9)
