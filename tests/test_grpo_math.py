"""The mathematics of grpo_ctrl.grpo and grpo_ctrl.policy against hand-computed
cases, analytic formulas and numerical differentiation."""
import math
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

import torch

from grpo_ctrl.distributed import Ranks
from grpo_ctrl.grpo import (GroupRollout, adapt_clip, aggregate_loss, choose_continuation,
                            clip_fractions, clipped_surrogate, gaussian_kl, group_advantages,
                            k3_kl, mean_command_smoothness, saturated, zero_spread_fraction)
from grpo_ctrl.grpo_config import default_config
from grpo_ctrl.policy import (GaussianPolicy, RunningNorm, gaussian_log_prob,
                             squashed_log_prob)

torch.set_num_threads(1)


# ------------------------------------------------------------------ advantages
def test_design_guide_example_without_scaling():
    adv = group_advantages(np.array([[10.0, 5.0, 2.0]]), "none")
    np.testing.assert_allclose(adv[0], [4.33, -0.67, -3.67], atol=0.005)
    assert abs(adv.sum()) < 1e-12  # centred: the group mean is the baseline


def test_group_std_scaling_divides_by_the_sample_std_of_each_group():
    rewards = np.array([[10.0, 5.0, 2.0], [1.0, 2.0, 3.0]])
    adv = group_advantages(rewards, "group")
    # group 1: mean 17/3, sample std sqrt(((13/3)^2 + (2/3)^2 + (11/3)^2) / 2) = 4.0415
    np.testing.assert_allclose(adv[0], np.array([13, -2, -11]) / 3 / 4.041452, rtol=1e-5)
    # group 2: mean 2, sample std 1
    np.testing.assert_allclose(adv[1], [-1.0, 0.0, 1.0], rtol=1e-6)
    # scaling a group's rewards does not change its advantages
    np.testing.assert_allclose(group_advantages(rewards * 100 + 7, "group"), adv, rtol=1e-6)


def test_batch_scaling_uses_one_std_for_the_whole_batch():
    rewards = np.array([[10.0, 5.0, 2.0], [1.0, 2.0, 3.0]])
    s = np.std([10, 5, 2, 1, 2, 3], ddof=1)
    np.testing.assert_allclose(group_advantages(rewards, "batch"),
                               group_advantages(rewards, "none") / s, rtol=1e-6)


def test_equal_rewards_give_zero_advantage_and_count_as_zero_spread():
    rewards = np.array([[3.0, 3.0, 3.0, 3.0], [1.0, 2.0, 3.0, 4.0]])
    adv = group_advantages(rewards, "group")
    assert np.all(adv[0] == 0) and np.all(np.isfinite(adv))
    assert zero_spread_fraction(rewards) == 0.5


def test_per_step_normalisation_is_across_the_group_at_each_time_step():
    rng = np.random.default_rng(0)
    rtg = rng.normal(size=(3, 5, 7)) * np.arange(1, 8)  # (groups, G, steps), spread grows with t
    adv = group_advantages(rtg, "group")
    for t in range(7):
        np.testing.assert_allclose(adv[:, :, t], group_advantages(rtg[:, :, t], "group"))
    np.testing.assert_allclose(adv.mean(axis=1), 0, atol=1e-12)
    np.testing.assert_allclose(adv.std(axis=1, ddof=1), 1, rtol=1e-6)


# ------------------------------------------------------------------ KL
def test_k3_is_zero_at_equal_policies_and_positive_elsewhere():
    logp = torch.tensor([-1.0, -0.3, -2.5, 0.4])
    assert torch.all(k3_kl(logp, logp) == 0)
    for shift in (-2.0, -0.1, 0.05, 1.5):
        assert torch.all(k3_kl(logp, logp + shift) > 0)


def test_k3_averages_to_the_exact_gaussian_kl():
    # samples from pi = N(0.3, 1.0); pi_ref = N(-0.2, 0.8): E_pi[k3] = KL(pi || pi_ref)
    g = torch.Generator().manual_seed(1)
    mu, ls, mu_r, ls_r = 0.3, 0.0, -0.2, math.log(0.8)
    z = mu + torch.randn(400_000, generator=g, dtype=torch.float64)
    lp = gaussian_log_prob(z, torch.tensor(mu), torch.tensor(ls))
    lp_ref = gaussian_log_prob(z, torch.tensor(mu_r), torch.tensor(ls_r))
    exact = math.log(0.8 / 1.0) + (1.0 ** 2 + 0.5 ** 2) / (2 * 0.8 ** 2) - 0.5
    assert float(gaussian_kl(torch.tensor(mu), torch.tensor(ls), torch.tensor(mu_r),
                             torch.tensor(ls_r))) == pytest.approx(exact, rel=1e-6)
    assert float(k3_kl(lp, lp_ref).mean()) == pytest.approx(exact, rel=0.02)


# ------------------------------------------------------------------ the clipped objective
def test_at_ratio_one_the_gradient_is_the_group_baseline_policy_gradient():
    # a policy whose mean is one parameter w, so d log pi / dw = (z - w) / sigma^2 by hand
    rewards = np.array([[10.0, 5.0, 2.0], [0.0, 1.0, 4.0]])
    adv = torch.tensor(group_advantages(rewards, "none").reshape(6, 1), dtype=torch.float64)
    z = torch.tensor([[0.5], [-0.2], [1.3], [0.1], [-0.9], [0.7]], dtype=torch.float64)
    sigma, w0 = 0.6, 0.25
    w = torch.tensor(w0, dtype=torch.float64, requires_grad=True)
    logp = gaussian_log_prob(z, w, torch.tensor(math.log(sigma), dtype=torch.float64))
    ratio = torch.exp(logp - logp.detach())  # pi_old = pi
    loss = aggregate_loss(-clipped_surrogate(ratio, adv, 0.2, 0.28), torch.ones_like(z),
                          "token", 1)
    loss.backward()
    # REINFORCE with the group mean as baseline: -mean_i (R_i - mean(G)) (z_i - w) / sigma^2
    hand = -np.mean(group_advantages(rewards, "none").reshape(6) *
                    (z.numpy().reshape(6) - w0) / sigma ** 2)
    assert float(w.grad) == pytest.approx(hand, rel=1e-12)


@pytest.mark.parametrize("adv, ratio, has_gradient", [
    # positive advantage: clipped (no gradient) only above 1 + eps_high
    (2.0, 1.10, True), (2.0, 1.27, True), (2.0, 1.29, False), (2.0, 3.0, False),
    (2.0, 0.5, True),
    # negative advantage: clipped only below 1 - eps_low
    (-2.0, 0.81, True), (-2.0, 0.79, False), (-2.0, 0.1, False), (-2.0, 1.5, True),
])
def test_clipping_stops_the_gradient_exactly_where_it_should(adv, ratio, has_gradient):
    r = torch.tensor([ratio], requires_grad=True)
    clipped_surrogate(r, torch.tensor([adv]), eps_low=0.2, eps_high=0.28).sum().backward()
    assert float(r.grad) == (adv if has_gradient else 0.0)


def test_sign_aware_clip_fractions_count_the_clipped_steps():
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.0, 1.5])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])  # the last step is not in the loss
    low, high = clip_fractions(ratio, adv, mask, eps_low=0.2, eps_high=0.28)
    assert (low, high) == (pytest.approx(1 / 5), pytest.approx(1 / 5))


def test_loss_aggregations_by_hand():
    per_step = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    assert float(aggregate_loss(per_step, mask, "token", 4)) == pytest.approx(40 / 6)
    assert float(aggregate_loss(per_step, mask, "grpo", 4)) == pytest.approx((2.5 + 15) / 2)
    assert float(aggregate_loss(per_step, mask, "dr_grpo", 4)) == pytest.approx(40 / 8)


# ------------------------------------------------------------------ squashed Gaussian
@pytest.mark.parametrize("mu, sigma, u_max", [(0.0, 1.0, 2.0), (0.7, 0.3, 2.0),
                                              (-1.2, 0.8, 10.0), (2.5, 0.5, 0.15)])
def test_squashed_log_prob_is_the_derivative_of_the_cdf(mu, sigma, u_max):
    # P(a <= y) = Phi((atanh(y / u_max) - mu) / sigma); its numerical derivative is the density
    def cdf(y):
        return 0.5 * (1 + math.erf((math.atanh(y / u_max) - mu) / (sigma * math.sqrt(2))))

    for frac in (-0.95, -0.5, 0.0, 0.3, 0.9, 0.99):
        y = frac * u_max
        h = 1e-6 * u_max
        numeric = (cdf(y + h) - cdf(y - h)) / (2 * h)
        z = torch.tensor(math.atanh(frac), dtype=torch.float64)
        lp = squashed_log_prob(z, torch.tensor(mu, dtype=torch.float64),
                               torch.tensor(math.log(sigma), dtype=torch.float64), u_max)
        # (far in a tail the CDF difference loses digits: hence the absolute tolerance)
        assert math.exp(float(lp)) == pytest.approx(numeric, rel=1e-5, abs=1e-9 / u_max)


def test_squashed_density_integrates_to_one_and_is_stable_far_out():
    u_max, mu, ls = 2.0, 0.4, math.log(0.7)
    z = torch.linspace(-12, 12, 200_001, dtype=torch.float64)
    a = u_max * torch.tanh(z)
    dens = torch.exp(squashed_log_prob(z, torch.tensor(mu), torch.tensor(ls), u_max))
    assert float(torch.trapezoid(dens, a)) == pytest.approx(1.0, abs=1e-4)
    far = squashed_log_prob(torch.tensor([40.0, -40.0]), torch.tensor(0.0), torch.tensor(0.0), 1.0)
    assert torch.all(torch.isfinite(far))


# ------------------------------------------------------------------ continuation, adaptive clip
def test_continuation_rules():
    rng = np.random.default_rng(0)
    returns = np.array([[1.0, 5.0, 2.0], [9.0, -1.0, 0.0]])
    np.testing.assert_array_equal(choose_continuation(returns, "greedy", rng), [1, 0])
    np.testing.assert_array_equal(choose_continuation(returns, "mean", rng), [0, 0])
    np.testing.assert_array_equal(choose_continuation(returns, "softmax", rng, 1e-3), [1, 0])
    picks = np.stack([choose_continuation(returns, "random", rng) for _ in range(3000)])
    assert set(np.unique(picks)) == {0, 1, 2}
    np.testing.assert_allclose(np.bincount(picks.ravel(), minlength=3) / picks.size, 1 / 3,
                               atol=0.02)
    # a hot softmax is near uniform, a warm one prefers the best branch
    hot = np.stack([choose_continuation(returns, "softmax", rng, 1e3) for _ in range(3000)])
    assert abs(np.mean(hot[:, 0] == 1) - 1 / 3) < 0.03
    warm = np.stack([choose_continuation(returns, "softmax", rng, 1.0) for _ in range(3000)])
    assert np.mean(warm[:, 0] == 1) > 0.5


def test_adaptive_clip_narrows_on_large_kl_and_widens_on_small():
    assert adapt_clip(1.0, kl=0.05, target=0.01) < 1.0
    assert adapt_clip(1.0, kl=0.001, target=0.01) > 1.0
    assert adapt_clip(1.0, kl=0.01, target=0.01) == 1.0


def test_running_norm_matches_numpy_over_all_batches():
    rng = np.random.default_rng(3)
    batches = [rng.normal(loc=[1, -2, 5], scale=[0.1, 3, 10], size=(n, 3)) for n in (7, 100, 33)]
    norm = RunningNorm(3)
    for b in batches:
        norm.update(torch.from_numpy(b))
    allx = np.concatenate(batches)
    np.testing.assert_allclose(norm.mean.numpy(), allx.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), allx.var(0), rtol=1e-4)


@pytest.mark.parametrize("B, stride, want", [(256, 32, [1, 33, 65, 97, 129, 161, 193, 225]),
                                              (64, 32, [1, 17, 33, 49]),
                                              (256, 8, list(range(1, 256, 8))),
                                              (3, 8, [0, 1, 2]), (256, 1, list(range(256)))])
def test_diagnostic_rows_keep_four_branches_at_least(B, stride, want):
    from grpo_ctrl.grpo import diagnostic_rows
    assert list(range(B))[diagnostic_rows(B, stride)] == want


@pytest.mark.parametrize("rows", [1, 7, 100, 16_384])
def test_observation_moments_in_c_match_numpy_in_double(rows):
    """The simulators' float32 observations take C's two passes (pr_moments); numpy's in
    float64 of the same numbers agree to rounding, for row counts on and off its
    four-way split."""
    rng = np.random.default_rng(rows)
    x = rng.normal(loc=[1, -2, 5], scale=[0.1, 3, 10], size=(rows, 3)).astype(np.float32)
    got = RunningNorm.moments(torch.from_numpy(x)).numpy()
    ref = x.astype(np.float64)
    assert got[0] == rows
    np.testing.assert_allclose(got[1:4], ref.mean(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[4:], ref.var(0), rtol=1e-10, atol=1e-14)


def test_mean_command_smoothness_by_hand():
    policy = GaussianPolicy(nobs=2, u_max=3.0)
    policy.net = torch.nn.Sequential(torch.nn.Linear(2, 1)).double()
    with torch.no_grad():  # a linear mean: mu = 0.5 x0 - 0.2 x1
        policy.net[0].weight.copy_(torch.tensor([[0.5, -0.2]]))
        policy.net[0].bias.zero_()
    obs = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [3.0, 0.0]]],
                       dtype=torch.float64)  # one branch
    mu = policy.mu(obs)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)  # the last: out of the loss
    a = np.tanh([0.0, 0.5, 0.3])
    temporal = ((a[1] - a[0]) ** 2 + (a[2] - a[1]) ** 2) / 2
    # sigma -> 0: the spatial term is sigma^2 |d tanh(mu)/dx|^2 per step
    sigma = 1e-3
    spatial = np.mean([(1 - t ** 2) ** 2 * (0.5 ** 2 + 0.2 ** 2) for t in a]) * sigma ** 2
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        samples = [float(mean_command_smoothness(policy, obs, mu, mask, sigma, gen))
                   for _ in range(2000)]
    assert np.mean(samples) - temporal == pytest.approx(spatial, rel=0.05)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the gain term alone: the same draws, without the temporal part
        alone = [float(mean_command_smoothness(policy, obs, mu, mask, sigma, gen, temporal=False))
                 for _ in range(2000)]
    assert np.mean(alone) == pytest.approx(spatial, rel=0.05)
    np.testing.assert_allclose(np.array(samples) - alone, temporal, rtol=1e-6)
    # a constant command along a branch, and a policy that ignores its input, score 0
    with torch.no_grad():
        policy.net[0].weight.zero_()
        flat = policy.mu(obs)
        assert float(mean_command_smoothness(policy, obs, flat, mask, 0.5, gen)) == 0.0


def test_saturated_steps_by_hand_and_by_sampling():
    """|mu| - 2 sigma > bound: by hand, and then the defining property: at such a step
    97.7 % of the sampled commands lie within 1 - tanh(bound) of full scale."""
    mu = torch.tensor([4.3, -4.3, 4.2, 0.0, -10.0])
    log_std = torch.log(torch.tensor([0.65, 0.65, 0.65, 0.65, 3.0]))
    assert saturated(mu, log_std, 3.0).tolist() == [True, True, False, False, True]
    z = 4.31 + 0.65 * torch.randn(200_000, generator=torch.Generator().manual_seed(0))
    near_full = (torch.tanh(z) >= math.tanh(3.0)).float().mean()
    assert float(near_full) == pytest.approx(0.977, abs=0.003)


# ------------------------------------------------------------------ schedule, update, batch
def test_learning_rate_schedule_by_hand():
    from grpo_ctrl.grpo import Trainer
    from grpo_ctrl.grpo_config import GRPOConfig
    tr = Trainer(GRPOConfig(num_starts=2, group_size=2, horizon=4, loss_steps=2, lr=2e-3,
                            lr_end=0.04, overlap=False), "pendulum", "gym")
    got = []
    for fraction in (0.0, 0.5, 1.0, 1.5):
        tr.set_progress(fraction)
        got.append(tr.opt.param_groups[0]["lr"])
    assert got == pytest.approx([2e-3, 1.04e-3, 8e-5, 8e-5], rel=1e-12)


@pytest.mark.parametrize("loss_type", ["clip", "adaptive_clip"])
def test_reported_kl_is_the_exact_kl_after_the_update(loss_type):
    """kl_old is KL(pi_old || pi) after the update: over the whole batch where the adaptive
    clip steers by it, over one branch in KL_STRIDE (a diagnostic) otherwise; either way
    within a fifth of the whole batch's (the sampled branches are iid draws of the same
    groups), recomputed here from the policy by the closed form in float64."""
    import copy
    from grpo_ctrl.grpo import KL_STRIDE, Trainer, grpo_update
    from grpo_ctrl.grpo_config import GRPOConfig
    cfg = GRPOConfig(num_starts=32, group_size=8, horizon=16, loss_steps=8, overlap=False,
                     loss_type=loss_type, time_budget=0.0, eval_every=1e9, seed=3,
                     lr=3e-3)
    tr = Trainer(cfg, "pendulum", "gym")
    batch = tr.rollout.collect(tr.policy, tr.gen)
    policy = copy.deepcopy(tr.policy)
    stats = grpo_update(policy, None, torch.optim.Adam(policy.parameters(), lr=cfg.lr), batch,
                        cfg, cfg.eps_low, cfg.eps_high, tr.gen)
    with torch.no_grad():  # in float64: float32's var_ratio - 1 cancels to ~1e-5 of the KL
        mu, log_std = (t.double() for t in policy.dist(batch.obs))
        kl = gaussian_kl(batch.mu_old.double(), batch.log_std_old.double(), mu, log_std)
    whole = float((kl * batch.mask).sum() / batch.mask.sum())
    assert whole > 1e-5  # the update moved the policy
    if loss_type == "adaptive_clip":
        assert stats["kl_old"] == pytest.approx(whole, rel=1e-5)
    else:
        rows = slice(1, None, KL_STRIDE)
        sub = float((kl[rows] * batch.mask[rows]).sum() / batch.mask[rows].sum())
        assert stats["kl_old"] == pytest.approx(sub, rel=1e-5)
        assert stats["kl_old"] == pytest.approx(whole, rel=0.2)


def test_a_shipped_batch_folds_into_the_normaliser_as_its_raw_observations_do():
    """The overlap collector ships each batch's observation moments, not its raw
    observations (GroupRollout(shipped=True)); folding them in (Ranks.reduce_batch)
    must give the running normaliser RunningNorm.update's bits."""
    cfg = replace(default_config("pendulum", "gym"), num_starts=4)
    policy = GaussianPolicy(3, 2.0, 8, 1)
    kept = GroupRollout(cfg, "pendulum", "gym", seed=1).collect(policy, torch.Generator())
    shipped = GroupRollout(cfg, "pendulum", "gym", seed=1, shipped=True).collect(
        policy, torch.Generator())
    assert shipped.raw_obs is None and shipped.obs is None
    assert torch.equal(shipped.obs_moments, kept.obs_moments)
    by_update, by_moments = RunningNorm(3), RunningNorm(3)
    for _ in range(2):  # twice: the second merge meets a non-empty normaliser
        by_update.update(kept.raw_obs)
        Ranks.current().reduce_batch(by_moments, None, moments=shipped.obs_moments)
    assert by_moments.count == by_update.count == 2 * kept.raw_obs.shape[0]
    assert torch.equal(by_moments.mean, by_update.mean)
    assert torch.equal(by_moments.var, by_update.var)


def test_adam_step_is_torchs_step_bit_for_bit():
    """``adam_step`` (fused Adam's kernel called directly) against ``opt.step()`` on a copy:
    the same parameters and optimiser state, bit for bit, over steps with a changing
    learning rate; the first step (no state yet) and a parameter without a gradient take
    torch's own step."""
    import copy

    from grpo_ctrl.grpo import adam, adam_step
    torch.manual_seed(0)
    ours = GaussianPolicy(3, 2.0, 16, 2, features=8)
    theirs = copy.deepcopy(ours)
    opt_ours, opt_theirs = adam(ours.parameters(), 1e-2), adam(theirs.parameters(), 1e-2)
    for k in range(6):
        for opt in (opt_ours, opt_theirs):
            opt.param_groups[0]["lr"] = 1e-2 * (1.0 - 0.1 * k)
        g = torch.Generator().manual_seed(k)
        for a, b in zip(ours.parameters(), theirs.parameters()):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        if k == 4:  # a parameter without a gradient: torch skips it
            ours.log_std.grad = theirs.log_std.grad = None
        adam_step(opt_ours)
        opt_theirs.step()
        for a, b in zip(ours.parameters(), theirs.parameters()):
            assert torch.equal(a, b)
            sa, sb = opt_ours.state[a], opt_theirs.state[b]
            assert all(torch.equal(sa[key], sb[key]) for key in ("step", "exp_avg",
                                                                  "exp_avg_sq"))


def test_outcome_returns_are_the_discounted_sums_of_the_rewards():
    """A batch's branch returns (one product with the discounts) against the reward-to-go
    recursion at t = 0, on the rewards its rollout collected."""
    cfg = default_config("pendulum", "gym")
    ro = GroupRollout(cfg, "pendulum", "gym", seed=3)
    policy = GaussianPolicy(3, 2.0, 16, 2)
    seen = {}
    roll = ro._roll

    def keep(*args, **kwargs):
        out = roll(*args, **kwargs)
        seen["rewards"] = out[3].copy()
        return out
    ro._roll = keep
    batch = ro.collect(policy, torch.Generator().manual_seed(0))
    n, g, H = cfg.num_starts, cfg.group_size, cfg.horizon
    want = np.zeros((n, g))
    for t in range(H - 1, -1, -1):  # R_t = r_t + gamma R_(t+1)
        want = seen["rewards"][t].reshape(n, g) + cfg.gamma * want
    np.testing.assert_allclose(batch.returns, want, rtol=1e-12, atol=1e-9)
