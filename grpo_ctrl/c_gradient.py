"""GRPO's clipped-ratio gradient in C (csrc/policy_update.h), for grpo_update.

A minibatch's gradient through torch autograd is ~40 small ops forward and
back, each paying torch's per-call cost; ``CGradient.gradient`` computes the
same gradient in one C call and writes it into the parameters' ``.grad``, so
the optimiser steps as before. It covers the default policy and loss: ReLU
layers (Fourier features or none), the clip or adaptive clip, no KL to a
reference, no smoothness term. ``CGradient.applies`` says where; the trainer
takes the torch path elsewhere (grpo.gradient_backend).
"""
from __future__ import annotations

import math
import weakref

import numpy as np
import torch
from torch import nn

from grpo_ctrl._pendsim import ffi, lib
from grpo_ctrl.policy import LOG_2PI, FourierFeatures, GaussianPolicy

# policy -> its CGradient, kept while the policy lives
_BUILT: "weakref.WeakKeyDictionary[GaussianPolicy, CGradient]" = weakref.WeakKeyDictionary()

AGGREGATIONS = {"token": lib.PU_AGG_TOKEN, "grpo": lib.PU_AGG_GRPO,
                "dr_grpo": lib.PU_AGG_DR_GRPO}


def _floats(t: torch.Tensor):
    """A float * to a contiguous float32 CPU tensor's data."""
    if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError(f"C wants contiguous float32 CPU tensors, got {t.dtype} {tuple(t.shape)}")
    return ffi.cast("float *", t.data_ptr())


def _pointers(policy: GaussianPolicy) -> list[int]:
    """Where the tensors C reads live: a parameter replaced since C was pointed at it
    (not updated in place) would leave C reading freed memory."""
    tensors = [policy.log_std]
    for m in policy.net:
        if isinstance(m, nn.Linear):
            tensors += [m.weight, m.bias]
        elif isinstance(m, FourierFeatures):
            tensors += [m.B, m.b]
    return [t.data_ptr() for t in tensors]


class CGradient:
    """One policy's network and one batch, as pu_gradient takes them. Get one per
    update (``of``): it points at the parameters' and gradients' memory as they are,
    and at that update's batch."""

    @staticmethod
    def applies(policy: GaussianPolicy, cfg, ref=None) -> bool:
        """Whether C computes this loss's gradient for this policy: ReLU layers (at most
        PU_MAX_HIDDEN), the clip or adaptive clip, no KL to a reference, no w_smooth, an
        aggregation C knows, and ``c_update`` on."""
        arch = policy.arch
        return bool(cfg.c_update and arch["activation"] == "relu"
                    and cfg.loss_type in ("clip", "adaptive_clip")
                    and not (cfg.beta > 0 and ref is not None) and cfg.w_smooth == 0
                    and cfg.loss_agg in AGGREGATIONS and arch["layers"] <= lib.PU_MAX_HIDDEN)

    @staticmethod
    def of(policy: GaussianPolicy, cfg, batch, ref=None) -> "CGradient | None":
        """The C gradient for this update, or None where it does not apply (``applies``)."""
        if not CGradient.applies(policy, cfg, ref):
            return None
        return CGradient.bound(policy, batch)

    @staticmethod
    def bound(policy: GaussianPolicy, batch) -> "CGradient":
        """``policy``'s C gradient pointed at ``batch``. The network's pointers are set up
        once per policy (~0.1 ms an update otherwise, with the caches cold after a
        rollout), and checked each time."""
        c = _BUILT.get(policy)
        if c is None or c.pointers != _pointers(policy):
            c = _BUILT[policy] = CGradient(policy)
        c.bind(batch)
        return c

    def __init__(self, policy: GaussianPolicy):
        arch = policy.arch
        # the log std, not the policy: the cache (_BUILT) must not keep its key alive
        self.log_std = policy.log_std
        net = ffi.new("pu_net *")
        net.nobs, net.nfeat = arch["nobs"], arch["features"]
        net.nhidden, net.width = arch["layers"], arch["hidden"]
        self.linear = [m for m in policy.net if isinstance(m, nn.Linear)]
        for m in policy.net:
            if isinstance(m, FourierFeatures):
                net.feat_B, net.feat_b = _floats(m.B), _floats(m.b)
        for i, m in enumerate(self.linear):
            net.W[i], net.b[i] = _floats(m.weight), _floats(m.bias)
        self.pointers = _pointers(policy)
        # log std's one value, read without torch (the optimiser updates it in place; a
        # replaced log std is a changed pointer, and a new CGradient)
        self.log_std_value = policy.log_std.detach().numpy()
        self.net, self.grads = net, []
        self._bind_gradients()
        self.work = np.empty(lib.pu_work_size(net), np.float32)
        self.p_work = ffi.from_buffer("float[]", self.work)
        self.stats = ffi.new("pu_stats *")
        self.grad_log_std = ffi.new("float *")
        self.batch = ffi.new("pu_batch *")

    def bind(self, batch) -> None:
        """Point C at this update's batch."""
        B, L = batch.z.shape
        self.L = L
        # the batch's tensors stay referenced (self.arrays) while C points at them
        self.arrays = [t.contiguous() for t in (batch.obs, batch.z, batch.logp_old, batch.adv,
                                                 batch.mask)]
        c = self.batch
        c.B, c.L = B, L
        c.obs, c.z, c.logp_old, c.adv, c.mask = (_floats(t) for t in self.arrays)

    def _bind_gradients(self) -> None:
        """Point C at the parameters' .grad tensors (made where missing), and keep them:
        whoever replaces one (data-parallel training moves them into one flat buffer,
        distributed.py) must not leave C writing into freed memory."""
        params = [p for m in self.linear for p in (m.weight, m.bias)] + [self.log_std]
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        for i, m in enumerate(self.linear):
            self.net.gW[i], self.net.gb[i] = _floats(m.weight.grad), _floats(m.bias.grad)
        self.grads = [(p, p.grad) for p in params]
        self.log_std_grad = self.log_std.grad.numpy()  # its one value, written without torch

    def gradient(self, rows: torch.Tensor, loss_agg: str, eps_low: float, eps_high: float,
                 max_grad_norm: float) -> dict:
        """Writes the loss's gradient over branches ``rows`` (int64) into every
        parameter's .grad, clipped to ``max_grad_norm`` (0: not clipped). Returns the
        loss, the gradient's norm before clipping, and the clip's fractions."""
        if any(p.grad is not g for p, g in self.grads):
            self._bind_gradients()
        rows = rows.contiguous()
        rc = lib.pu_gradient(self.net, float(self.log_std_value[0]), self.batch,
                             ffi.cast("int64_t *", rows.data_ptr()), rows.numel(),
                             AGGREGATIONS[loss_agg], eps_low, eps_high, max_grad_norm,
                             self.grad_log_std, self.stats, self.p_work)
        if rc:
            raise ValueError("pu_gradient: malformed network, batch or rows")
        self.log_std_grad[0] = self.grad_log_std[0]
        s = self.stats
        n = max(s.mask_sum, 1.0)
        return {"loss": s.loss, "grad_norm": s.grad_norm, "clip_low": s.clipped_low / n,
                "clip_high": s.clipped_high / n}

    def mean(self, rows: torch.Tensor) -> torch.Tensor:
        """The network's mean at every step of branches ``rows``: (len(rows), L)."""
        rows = rows.contiguous()
        mu = torch.empty(rows.numel(), self.L)
        rc = lib.pu_mean(self.net, self.batch, ffi.cast("int64_t *", rows.data_ptr()),
                         rows.numel(), _floats(mu), self.p_work)
        if rc:
            raise ValueError("pu_mean: malformed network, batch or rows")
        return mu

    def kl_old(self, rows: torch.Tensor, mu_old: torch.Tensor, log_std_old: torch.Tensor) -> float:
        """KL(pi_old || pi) averaged over the masked steps of branches ``rows`` (int64), pi
        the network now and its log std, pi_old the batch's means ``mu_old`` (B, L) and
        ``log_std_old`` (1,): ``gaussian_kl``'s masked mean in one C call, in double
        (within float32 rounding of torch's; a diagnostic, and the adaptive clip's
        measure)."""
        rows = rows.contiguous()
        out = ffi.new("double *")
        rc = lib.pu_kl_old(self.net, self.batch, _floats(mu_old),
                           ffi.cast("int64_t *", rows.data_ptr()), rows.numel(),
                           float(log_std_old), float(self.log_std_value[0]), out, self.p_work)
        if rc:
            raise ValueError("pu_kl_old: malformed network, batch or rows")
        return out[0]


def loss_steps(policy: GaussianPolicy, L: int, z: np.ndarray, mu: np.ndarray,
               alive: np.ndarray, adv_branch: np.ndarray, saturated: float,
               raw: np.ndarray | None) -> dict:
    """A rollout's loss steps as a Batch holds them, in one C pass (csrc/policy_update.h,
    ``pu_loss_steps``): from the rollout's step-major float32 z and mu (>= L, B) and bool
    alive (>= L, B), the first L steps of each branch, branch-major, as float32 tensors
    (B, L): "z", "mu", "logp_old" (``gaussian_log_prob`` under the policy's log std, bit for
    bit), "mask" (alive as 1 or 0), "adv" (``adv_branch`` (B,) float64 at each of the
    branch's steps, 0 where |mu| > ``saturated``, compared in float32 as torch compares;
    inf: nowhere); with ``raw`` (>= L, B, nobs) float32, "obs" (B, L, nobs), as
    ``policy.normalise`` makes it."""
    B = adv_branch.shape[0]
    want = [(z, np.float32, 2), (mu, np.float32, 2), (alive, np.bool_, 2),
            (adv_branch, np.float64, 1)] + ([(raw, np.float32, 3)] if raw is not None else [])
    for a, dtype, ndim in want:
        if (a.dtype != dtype or a.ndim != ndim or not a.flags.c_contiguous
                or (ndim > 1 and (a.shape[0] < L or a.shape[1] != B))):
            raise ValueError("loss_steps: z, mu, alive (>= L, B), adv_branch (B,) and raw "
                             "(>= L, B, nobs) must be C-contiguous, float32 but for alive "
                             "(bool) and adv_branch (float64)")
    log_std = policy.log_std.detach()
    inv_std = float(torch.exp(-log_std))  # the one exp, torch's, as gaussian_log_prob takes it
    names = ("z", "mu", "logp_old", "mask", "adv")
    block = torch.empty(len(names), B, L)  # one allocation; each (B, L) row is contiguous
    got = dict(zip(names, block.unbind()))
    first = ffi.cast("float *", block.data_ptr())
    obs_args = (0, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL)
    if raw is not None:
        if raw.shape[2] != policy.arch["nobs"]:
            raise ValueError(f"loss_steps: raw has {raw.shape[2]} observations, the policy "
                             f"{policy.arch['nobs']}")
        got["obs"] = torch.empty(B, L, raw.shape[2])
        obs_args = (raw.shape[2], ffi.from_buffer("float[]", raw), _floats(policy._obs_mean),
                    _floats(policy._obs_inv_std), _floats(got["obs"]))
    rc = lib.pu_loss_steps(B, L, ffi.from_buffer("float[]", z), ffi.from_buffer("float[]", mu),
                           ffi.from_buffer("uint8_t[]", alive.view(np.uint8)),
                           ffi.from_buffer("double[]", adv_branch), saturated,
                           float(log_std), inv_std, 0.5 * LOG_2PI,
                           *(first + i * B * L for i in range(len(names))),
                           *obs_args)
    if rc:
        raise ValueError("pu_loss_steps: malformed arguments")
    return got


def squashed_entropy(logp_old: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, u_max: float,
                     rows: slice) -> float:
    """grpo.squashed_entropy on branches ``rows`` (a slice of positive step) in one C call
    (``pu_squashed_entropy``), in double: within float32 rounding of torch's."""
    B, L = z.shape
    first, _, stride = rows.indices(B)
    out = ffi.new("double *")
    rc = lib.pu_squashed_entropy(B, L, first, stride, _floats(logp_old), _floats(z),
                                 _floats(mask), math.log(u_max), out)
    if rc:
        raise ValueError("pu_squashed_entropy: malformed arguments")
    return out[0]
