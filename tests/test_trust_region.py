"""The trust-region surrogates against hand-computed values and gradients."""
import math

import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

import torch

from grpo_ctrl.grpo_config import LOSS_TYPES
from grpo_ctrl.trust_region import SAPO_HALF_GATE, clipped_surrogate, sapo_surrogate, surrogate


def _grad(f, x: float) -> tuple[float, float]:
    t = torch.tensor([x], dtype=torch.float64, requires_grad=True)
    y = f(t).sum()
    y.backward()
    return float(y.detach()), float(t.grad)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_is_the_plain_policy_gradient_at_ratio_one(loss_type):
    # logp = logp_old: ratio 1; d objective / d logp must be A for every sample
    adv = torch.tensor([[2.0, -1.5, 0.5]], dtype=torch.float64)
    logp = torch.tensor([[-0.3, -1.2, -2.0]], dtype=torch.float64, requires_grad=True)
    ratio = torch.exp(logp - logp.detach())
    obj = surrogate(loss_type, ratio, adv, 0.2, 0.28)
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


def test_the_clip_stops_the_gradient_past_the_bound_on_the_side_the_advantage_pushes():
    adv_pos, adv_neg = torch.tensor([3.0], dtype=torch.float64), torch.tensor([-2.0],
                                                                             dtype=torch.float64)
    clip = lambda a: (lambda r: clipped_surrogate(r, a, 0.2, 0.28))  # noqa: E731
    assert _grad(clip(adv_pos), 1.5) == (pytest.approx(1.28 * 3.0), 0.0)
    assert _grad(clip(adv_pos), 0.5)[1] == pytest.approx(3.0)   # below: still learning
    assert _grad(clip(adv_neg), 0.5) == (pytest.approx(0.8 * -2.0), 0.0)
    assert _grad(clip(adv_neg), 1.5)[1] == pytest.approx(-2.0)  # above: still learning
    # the same through surrogate(), for both clip rules
    for loss_type in ("clip", "adaptive_clip"):
        assert _grad(lambda r: surrogate(loss_type, r, adv_pos, 0.2, 0.28), 1.5)[1] == 0.0


def test_an_unknown_loss_type_is_refused():
    with pytest.raises(ValueError, match="unknown loss type"):
        surrogate("cispo", torch.ones(1), torch.ones(1), 0.2, 0.28)
