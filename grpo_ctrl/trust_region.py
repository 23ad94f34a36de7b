"""How far one batch may move the policy: the per-step surrogate objectives.

``trust_region`` in the config picks one (``surrogate``); all are to be
maximised, per loss step, and all equal the plain policy gradient
``A grad log pi`` at ratio 1. They differ in what happens to a sample whose
ratio ``r = pi / pi_old`` has moved:

* ``fixed`` / ``adaptive``: PPO's clip, min(r A, clip(r, 1 - eps_low,
  1 + eps_high) A): the gradient stops dead past the bound on the side the
  advantage pushes. ``adaptive`` rescales both eps between updates
  (``grpo.adapt_clip``).
* ``sapo``: SAPO's soft gate (Gao et al. 2025, arXiv 2511.20347),
  (4 / tau) sigmoid(tau (r - 1)) A, whose gradient is
  sech^2(tau (r - 1) / 2) r A grad log pi: 1 at r = 1, fading smoothly
  instead of stopping. tau is set from the clip so the gate halves where the
  clip would cut: tau = 2 acosh(sqrt 2) / eps, sharper for negative
  advantages (eps_low < eps_high), as SAPO's tau_neg > tau_pos.
* ``cispo``: CISPO (MiniMax-M1, arXiv 2506.13585), sg(min(r, 1 + eps_high))
  A log pi: the importance weight is clipped and carries no gradient, so
  every sample keeps its gradient; only its weight is bounded.
* ``dcpo``: DCPO-style bounds per sample (Yang et al. 2025, arXiv
  2509.02333), 0.5 + 0.5 sqrt(max(1 - 4 eps_low / q, 0)) <= r <=
  0.5 + 0.5 sqrt(1 + 4 eps_high / q), q the sample's prior probability:
  rare samples may move further. For a continuous action q is the old
  density relative to its mode, exp(-((z - mu_old) / sigma_old)^2 / 2) in
  (0, 1]; the upper bound is capped at DCPO_MAX_RATIO.
* ``kl_mask``: whole branches out of the loss when their mean
  KL(pi_old || pi) over the branch's steps exceeds ``kl_target``; the
  branches inside keep the unclipped r A.
"""
from __future__ import annotations

import math

import torch

SAPO_HALF_GATE = 2.0 * math.acosh(math.sqrt(2.0))  # sech^2(x / 2) = 1/2 at x = 1.7627
DCPO_MAX_RATIO = 10.0


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


def cispo_surrogate(ratio: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor,
                    eps_high: float) -> torch.Tensor:
    """CISPO: sg(min(r, 1 + eps_high)) A log pi."""
    return torch.clamp(ratio, max=1.0 + eps_high).detach() * adv * logp


def dcpo_bounds(z: torch.Tensor, mu_old: torch.Tensor, log_std_old: torch.Tensor,
                eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample ratio bounds (low, high) from the sample's old relative density q."""
    q = torch.exp(-0.5 * ((z - mu_old) * torch.exp(-log_std_old)) ** 2)
    low = 0.5 + 0.5 * torch.sqrt(torch.clamp(1.0 - 4.0 * eps_low / q, min=0.0))
    high = torch.clamp(0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * eps_high / q), max=DCPO_MAX_RATIO)
    return low, high


def kl_branch_mask(kl: torch.Tensor, mask: torch.Tensor, bound: float) -> torch.Tensor:
    """(B, 1): 1 for the branches whose mean per-step KL (over their loss
    steps, ``mask``) is within ``bound``, else 0."""
    mean = (kl * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
    return (mean <= bound).to(kl.dtype)


def surrogate(rule: str, ratio, logp, adv, eps_low: float, eps_high: float, *, z=None,
              mu_old=None, log_std_old=None, kl=None, mask=None,
              kl_bound: float = 0.0) -> torch.Tensor:
    """The per-step objective of the trust region ``rule`` (see module doc)."""
    if rule in ("fixed", "adaptive"):
        return clipped_surrogate(ratio, adv, eps_low, eps_high)
    if rule == "sapo":
        return sapo_surrogate(ratio, adv, SAPO_HALF_GATE / eps_high, SAPO_HALF_GATE / eps_low)
    if rule == "cispo":
        return cispo_surrogate(ratio, logp, adv, eps_high)
    if rule == "dcpo":
        low, high = dcpo_bounds(z, mu_old, log_std_old, eps_low, eps_high)
        return clipped_surrogate(ratio, adv, 1.0 - low, high - 1.0)
    if rule == "kl_mask":
        return ratio * adv * kl_branch_mask(kl.detach(), mask, kl_bound)
    raise ValueError(f"unknown trust region {rule!r}")
