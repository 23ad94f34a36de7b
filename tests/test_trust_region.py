"""The trust-region surrogates against hand-computed values and gradients."""
import math

import pytest
import torch

from grpo_ctrl.trust_region import (DCPO_MAX_RATIO, SAPO_HALF_GATE, clipped_surrogate,
                                    cispo_surrogate, dcpo_bounds, kl_branch_mask, sapo_surrogate,
                                    surrogate)

RULES = ("fixed", "adaptive", "sapo", "cispo", "dcpo", "kl_mask")


def _grad(f, x: float) -> tuple[float, float]:
    t = torch.tensor([x], dtype=torch.float64, requires_grad=True)
    y = f(t).sum()
    y.backward()
    return float(y.detach()), float(t.grad)


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_is_the_plain_policy_gradient_at_ratio_one(rule):
    # logp = logp_old: ratio 1; d objective / d logp must be A for every sample
    adv = torch.tensor([[2.0, -1.5, 0.5]], dtype=torch.float64)
    logp = torch.tensor([[-0.3, -1.2, -2.0]], dtype=torch.float64, requires_grad=True)
    ratio = torch.exp(logp - logp.detach())
    z = torch.tensor([[0.1, -0.4, 1.0]], dtype=torch.float64)
    obj = surrogate(rule, ratio, logp, adv, 0.2, 0.28, z=z, mu_old=torch.zeros_like(z),
                    log_std_old=torch.tensor(0.0, dtype=torch.float64),
                    kl=torch.zeros_like(z), mask=torch.ones_like(z), kl_bound=0.01)
    obj.sum().backward()
    torch.testing.assert_close(logp.grad, adv)


def test_sapo_gate_is_one_at_ratio_one_and_halves_where_the_clip_cuts():
    assert math.cosh(SAPO_HALF_GATE / 2) ** -2 == pytest.approx(0.5)
    tau_pos, tau_neg = SAPO_HALF_GATE / 0.28, SAPO_HALF_GATE / 0.2
    f = lambda a: (lambda r: sapo_surrogate(r, torch.tensor([a], dtype=torch.float64),  # noqa
                                            tau_pos, tau_neg))
    value, grad = _grad(f(2.0), 1.0)
    assert value == pytest.approx(4 / tau_pos * 0.5 * 2.0) and grad == pytest.approx(2.0)
    assert _grad(f(2.0), 1.28)[1] == pytest.approx(1.0)       # half of A = 2
    assert _grad(f(-3.0), 0.8)[1] == pytest.approx(-1.5)      # half of A = -3
    # by hand at r = 1.1, A = 2: 4 s (1 - s) A with s = sigmoid(tau_pos 0.1)
    s = 1 / (1 + math.exp(-tau_pos * 0.1))
    assert _grad(f(2.0), 1.1)[1] == pytest.approx(4 * s * (1 - s) * 2.0)
    # no dead zone: far past the clip the gradient is small but not zero
    assert 0 < _grad(f(2.0), 1.6)[1] < 0.2


def test_cispo_keeps_the_gradient_of_every_sample_with_a_clipped_weight():
    adv = torch.tensor([3.0, -2.0], dtype=torch.float64)
    logp = torch.tensor([-0.7, -1.1], dtype=torch.float64, requires_grad=True)
    ratio = torch.tensor([1.5, 0.5], dtype=torch.float64, requires_grad=True)
    obj = cispo_surrogate(ratio, logp, adv, eps_high=0.28)
    torch.testing.assert_close(obj, torch.tensor([1.28 * 3 * -0.7, 0.5 * -2 * -1.1],
                                                 dtype=torch.float64))
    obj.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([1.28 * 3, 0.5 * -2], dtype=torch.float64))
    assert ratio.grad is None or torch.all(ratio.grad == 0)  # the weight is a stop-gradient
    # where the PPO clip would have stopped the first sample's gradient dead
    assert _grad(lambda r: clipped_surrogate(r, adv[:1], 0.2, 0.28), 1.5)[1] == 0.0


def test_dcpo_bounds_widen_for_rare_samples():
    z = torch.tensor([0.0, 2.0, 20.0], dtype=torch.float64)   # 0, 2 and 20 sigma off the mean
    low, high = dcpo_bounds(z, torch.zeros(3, dtype=torch.float64),
                            torch.tensor(0.0, dtype=torch.float64), 0.2, 0.28)
    q = math.exp(-2.0)
    torch.testing.assert_close(low, torch.tensor([0.5 + 0.5 * math.sqrt(0.2), 0.5, 0.5],
                                                 dtype=torch.float64))
    torch.testing.assert_close(high, torch.tensor(
        [0.5 + 0.5 * math.sqrt(2.12), 0.5 + 0.5 * math.sqrt(1 + 4 * 0.28 / q), DCPO_MAX_RATIO],
        dtype=torch.float64))
    # r = 1.5, A > 0: clipped for the typical sample, still learning for the rare one
    adv = torch.ones(3, dtype=torch.float64)
    ratio = torch.full((3,), 1.5, dtype=torch.float64, requires_grad=True)
    obj = surrogate("dcpo", ratio, None, adv, 0.2, 0.28, z=z,
                    mu_old=torch.zeros(3, dtype=torch.float64),
                    log_std_old=torch.tensor(0.0, dtype=torch.float64))
    obj.sum().backward()
    torch.testing.assert_close(ratio.grad, torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64))


def test_kl_mask_drops_whole_branches_outside_the_trust_region():
    kl = torch.tensor([[0.001, 0.003], [0.02, 0.0], [0.001, 1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])  # the 1.0 is not a loss step
    keep = kl_branch_mask(kl, mask, bound=0.005)     # means 0.002, 0.01, 0.001
    torch.testing.assert_close(keep, torch.tensor([[1.0], [0.0], [1.0]]))
    ratio = torch.full((3, 2), 1.4, requires_grad=True)
    adv = torch.full((3, 2), 2.0)
    surrogate("kl_mask", ratio, None, adv, 0.2, 0.28, kl=kl, mask=mask,
              kl_bound=0.005).sum().backward()
    # inside: the unclipped gradient A even at ratio 1.4; outside: nothing
    torch.testing.assert_close(ratio.grad, torch.tensor([[2.0, 2.0], [0.0, 0.0], [2.0, 2.0]]))


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="unknown trust region"):
        surrogate("trpo", torch.ones(1), torch.ones(1), torch.ones(1), 0.2, 0.28)
