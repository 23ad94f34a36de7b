"""How far one batch may move the policy: the per-step surrogate objectives.

``loss_type`` in the config picks one (``surrogate``); both are to be
maximised, per loss step, and both equal the plain policy gradient
``A grad log pi`` at ratio 1. They differ in what happens to a sample whose
ratio ``r = pi / pi_old`` has moved:

* ``clip`` / ``adaptive_clip``: PPO's clip, min(r A, clip(r, 1 - eps_low,
  1 + eps_high) A): the gradient stops dead past the bound on the side the
  advantage pushes. ``adaptive_clip`` rescales both eps between updates
  (``grpo.adapt_clip``).
* ``sapo``: SAPO's soft gate (Gao et al. 2025, arXiv 2511.20347),
  (4 / tau) sigmoid(tau (r - 1)) A, whose gradient is
  sech^2(tau (r - 1) / 2) r A grad log pi: 1 at r = 1, fading smoothly
  instead of stopping. tau is set from the clip so the gate halves where the
  clip would cut: tau = 2 acosh(sqrt 2) / eps, sharper for negative
  advantages (eps_low < eps_high), as SAPO's tau_neg > tau_pos.

CISPO, DCPO's per-sample bounds and a KL mask of whole branches were tried
and removed (docs/research.md; the tag research-2026-12 has them).
"""
from __future__ import annotations

import math

import torch

SAPO_HALF_GATE = 2.0 * math.acosh(math.sqrt(2.0))  # sech^2(x / 2) = 1/2 at x = 1.7627


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps_low, eps_high) -> torch.Tensor:
    """PPO/GRPO objective per step, to maximise:
    min(ratio A, clip(ratio, 1 - eps_low, 1 + eps_high) A). The bounds may
    be numbers or per-step tensors."""
    return torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)


def sapo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, tau_pos: float,
                   tau_neg: float) -> torch.Tensor:
    """SAPO's soft gate: (4 / tau) sigmoid(tau (r - 1)) A, tau by the sign of A."""
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    return 4.0 / tau * torch.sigmoid(tau * (ratio - 1.0)) * adv


def surrogate(loss_type: str, ratio: torch.Tensor, adv: torch.Tensor, eps_low: float,
              eps_high: float) -> torch.Tensor:
    """The per-step objective of ``loss_type`` (see the module's doc)."""
    if loss_type in ("clip", "adaptive_clip"):
        return clipped_surrogate(ratio, adv, eps_low, eps_high)
    if loss_type == "sapo":
        return sapo_surrogate(ratio, adv, SAPO_HALF_GATE / eps_high, SAPO_HALF_GATE / eps_low)
    raise ValueError(f"unknown loss type {loss_type!r}")
