"""GRPO for control, on group-branch rollouts of the C simulator. No critic.

Read top to bottom, as one iteration runs:

1. Rollout (``Exploration``, ``GroupRollout``). A pool of ``num_starts``
   trajectories holds the start states, the "queries". Each is cloned into
   ``group_size`` branches, and all branches roll out ``horizon`` decisions
   together, z = mu(s) + sigma e, e ~ N(0, 1), the command u_max tanh(z).
2. Returns. A branch's return is its discounted sum of rewards,
   R = sum_t gamma^t r_t, over the whole horizon (the steps after
   ``loss_steps`` are look-ahead).
3. Group advantage (``group_advantages``): A = (R - mean of its group) / s,
   one number for every loss step of the branch.
4. Loss (``policy_loss``): the clip or SAPO surrogate of the ratio
   pi / pi_old (grpo_ctrl/trust_region.py), minus beta k3 KL to a reference
   policy, aggregated over steps and branches; the torch reference that the
   C gradient (grpo_ctrl/c_gradient.py) is tested against.
5. Update (``grpo_update``): ``epochs`` passes over ``minibatches``, Adam,
   gradient clipping, the noise floor.
6. ``Trainer``: strings them together; each trajectory continues from one
   branch's state at step ``loss_steps`` (``choose_continuation``), some
   restart from a fresh reset.

Process tuning (threads, heap, the fused Adam step) lives in
grpo_ctrl/runtime.py; the equations with their references in docs/grpo.md.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path

from grpo_ctrl import runtime  # first: it sets the OpenMP environment before torch loads

import numpy as np  # noqa: E402
import torch  # noqa: E402

from grpo_ctrl.baselines.lqr import catch_overrides  # noqa: E402
from grpo_ctrl.c_gradient import CGradient, loss_steps  # noqa: E402
from grpo_ctrl.c_gradient import squashed_entropy as c_squashed_entropy  # noqa: E402
from grpo_ctrl.distributed import Ranks  # noqa: E402
from grpo_ctrl.errors import UserError  # noqa: E402
from grpo_ctrl.grpo_config import GRPOConfig, check_config  # noqa: E402
from grpo_ctrl.overlap import OverlapCollector  # noqa: E402
from grpo_ctrl.plant import plant_spec  # noqa: E402
from grpo_ctrl.policy import (GaussianPolicy, RunningNorm, gaussian_log_prob,  # noqa: E402
                             load_policy, log_tanh_jacobian)
from grpo_ctrl.randomize import Randomization  # noqa: E402
from grpo_ctrl.runtime import adam, adam_step  # noqa: E402,F401 (adam: API)
from grpo_ctrl.sim import BatchSim  # noqa: E402
from grpo_ctrl.trust_region import clipped_surrogate, surrogate  # noqa: E402,F401 (API)

ENTROPY_STRIDE = 8  # the batch's entropy estimate: on one branch in 8 (1 = all)
KL_STRIDE = 32  # the diagnostic KL after an update: on one branch in 32 (in 8, a 13th of
# the update's time on an AVX2 core: the updating process is the one the overlap waits on)


# =====================================================================
# 1. Rollout.
# =====================================================================
class Exploration:
    """How branches explore: z = mu(s) + sigma e at every decision, e ~ N(0, 1) drawn
    from the trainer's generator for every decision and branch, sigma = exp(log_std)
    one learned number. With continuation ``mean`` branch 0 of each group takes e = 0:
    it follows the mean action, the deployed policy, and is not a sample of pi (the
    loss leaves it out, ``sampled``)."""

    def __init__(self, cfg: GRPOConfig):
        self.horizon, self.groups, self.size = cfg.horizon, cfg.num_starts, cfg.group_size
        self.mean_branch = cfg.continuation == "mean"

    def spread(self, log_std: torch.Tensor, gen: torch.Generator,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """sigma e of every decision (horizon, branches), in units of z; into ``out`` where
        given (the rollout's own buffer: the same draws)."""
        noise = torch.randn(self.horizon, self.groups * self.size, generator=gen, out=out)
        if self.mean_branch:
            noise.view(self.horizon, self.groups, self.size)[:, :, 0] = 0.0
        return noise.mul_(torch.exp(log_std))  # the scale once, not an exp and a product a step

    def sampled(self, mask: np.ndarray) -> np.ndarray:
        """The loss mask (branches, loss steps) without the branches that did not sample."""
        if self.mean_branch:
            mask[np.arange(self.groups) * self.size] = 0.0
        return mask


def diagnostic_rows(B: int, stride: int) -> slice:
    """The branches a diagnostic is estimated on: one in ``stride``, from branch 1 (not a
    group's branch 0, the mean-action branch of continuation ``mean``), the stride halved
    until the batch holds four of them; all of them for a stride of 1."""
    while stride > 1 and B < 4 * stride:
        stride //= 2
    return slice(1, None, stride) if stride > 1 else slice(None)


@dataclass
class Batch:
    obs: torch.Tensor | None  # (B, L, nobs) normalised observations of the loss steps (None:
    # shipped; the trainer normalises raw_loss_obs with its own statistics)
    z: torch.Tensor          # (B, L) pre-squash actions taken
    logp_old: torch.Tensor   # (B, L) Gaussian log-density under pi_old
    mu_old: torch.Tensor     # (B, L) pi_old's mean, for the exact KL diagnostic
    adv: torch.Tensor        # (B, L) advantages
    mask: torch.Tensor       # (B, L) 1 where the step is in the loss
    returns: np.ndarray      # (N, G) discounted branch returns
    entropy: float           # Monte-Carlo entropy of the squashed action distribution
    raw_obs: torch.Tensor | None  # (B*H, nobs) raw observations (None: shipped, below)
    raw_loss_obs: torch.Tensor  # (B, L, nobs) raw observations of the loss steps, for pi_ref
    log_std_old: torch.Tensor   # (1,) pi_old's log std
    collect_s: float = 0.0      # wall time the collection took
    sim_steps: int = 0          # simulator steps of the rollout pool so far, this batch's too
    obs_moments: torch.Tensor | None = None  # [count, mean (nobs), biased var (nobs)] of
    # raw_obs, float64: what the running normaliser folds in (RunningNorm.moments)


class GroupRollout:
    """The trajectory pool and the group simulator it branches into.
    ``batch_std``: the std of the batch's returns (adv_scale = batch); data-
    parallel training passes one that reduces across processes."""

    def __init__(self, cfg: GRPOConfig, system: str, preset: str, seed: int,
                 batch_std=None, randomize: Randomization | None = None,
                 shipped: bool = False):
        n, g = cfg.num_starts, cfg.group_size
        self.cfg = cfg
        # shipped: the batches go to another process (overlap), which normalises the loss
        # steps itself and folds obs_moments: neither raw_obs nor obs travel (~300 kB)
        self.shipped = shipped
        self.batch_std = batch_std
        # a pool trajectory draws its plant at each reset, and its start (the preset's box, or
        # any state: cfg.starts); its branches copy it
        spec = plant_spec(system, preset)
        box = spec.wide_box() if cfg.starts == "wide" else (None, None)
        # the LQR's catch in every step (cfg.catch), as BatchSim's model overrides
        self.catch = catch = catch_overrides(spec, cfg.catch)
        self.pool = BatchSim(system, n, preset=preset, seed=seed, randomize=randomize,
                             x0_low=box[0], x0_high=box[1], **catch)
        self.group = BatchSim(system, n * g, preset=preset, seed=seed + 10_000,
                              randomize=randomize, **catch)
        # the branches' states at step loss_steps, which the trajectories continue from
        self.snapshot = BatchSim(system, n * g, preset=preset, seed=seed + 20_000,
                                 randomize=randomize, **catch)
        self.spec = self.pool.spec
        self.rng = np.random.default_rng(seed)
        self.sim_steps = 0
        self.exploration = Exploration(cfg)
        self.discounts = cfg.gamma ** np.arange(cfg.horizon)  # a branch's return: these . rewards
        # made once, used by every batch: the copies' checked indices (branch: pool -> group;
        # the states at step loss_steps: group -> snapshot) and the rollout's scratch (what
        # leaves in a Batch is made fresh for each)
        B, H = n * g, cfg.horizon
        self._queries, self._first = np.arange(n), np.arange(n) * g
        self._branch = self.group.copier(np.arange(B), self.pool, np.repeat(self._queries, g))
        self._keep_snapshot = self.snapshot.copier(np.arange(B), self.group, np.arange(B))
        self._continue_from = self.pool.copier(self._queries, self.snapshot)  # the pool: n
        self._noise, self._z, self._mu = (torch.empty(H, B) for _ in range(3))
        self._rewards, self._alive = np.empty((H, B)), np.empty((H + 1, B), dtype=bool)
        self._last_act = np.empty(B, np.float32)
        # the backend, chosen once: the C loop where the network allows (ReLU)
        self._roll = (self._roll_c if cfg.c_rollout and cfg.activation == "relu"
                      else self._roll_torch)

    def set_cost_scale(self, scale: float) -> None:
        """The reward's costs of effort at ``scale`` of the plant's (BatchSim.scale_costs)."""
        for sim in (self.pool, self.group, self.snapshot):
            sim.scale_costs(scale)

    def restart(self, seed: int) -> None:
        """Fresh trajectories in the whole pool, from ``seed`` (a resumed run)."""
        self.pool.reset(seed=seed)

    def _buffers(self, nobs: int) -> tuple:
        """The raw observations (fresh: a Batch keeps them), z, mu, rewards and alive
        (the rollout's own)."""
        self._alive[0] = True  # alive[t]: not terminated before step t
        return (torch.empty(self.cfg.horizon, self._alive.shape[1], nobs), self._z, self._mu,
                self._rewards, self._alive)

    def _roll_c(self, policy: GaussianPolicy, sim: BatchSim, spread: torch.Tensor) -> tuple:
        """``_roll_torch`` in one C loop (csrc/policy_rollout.c): 2x faster (docs/grpo.md)."""
        c_net = policy.c_mean_network()
        if c_net is None:  # a policy C does not run, whatever the config says
            return self._roll_torch(policy, sim, spread)
        cfg, L, H = self.cfg, self.cfg.loss_steps, self.cfg.horizon
        raw, z, mu, rewards, alive = self._buffers(sim.observe().shape[1])
        spread_np, raw_np, z_np, mu_np = spread.numpy(), raw.numpy(), z.numpy(), mu.numpy()
        for lo, hi in ((0, L), (L, H)):
            if lo < hi:
                sim.roll_policy(*c_net, spread_np[lo:hi], raw_np[lo:hi], mu_np[lo:hi],
                                z_np[lo:hi], rewards[lo:hi], alive[lo:hi + 1], self._last_act,
                                lo > 0, u_max=policy.u_max, w_du=cfg.w_du,
                                repeat=cfg.action_repeat)
            if hi == L:
                self._keep_snapshot()
        return raw, z, mu, rewards, alive

    def _roll_torch(self, policy: GaussianPolicy, sim: BatchSim, spread: torch.Tensor) -> tuple:
        """Roll the branches of ``sim`` ``horizon`` decisions, z = mu + ``spread``, each
        command u_max tanh(z) held ``action_repeat`` steps; at step ``loss_steps`` their
        states go to the snapshot simulator. Returns the raw observations (H, b, nobs),
        z and mu (H, b), the rewards (H, b) (minus the action-rate penalty w_du) and
        alive (H + 1, b)."""
        cfg, H, b = self.cfg, self.cfg.horizon, sim.num_envs
        obs_np = sim.observe()
        raw, z, mu, rewards, alive = self._buffers(obs_np.shape[1])
        last_act = None
        for t in range(H):
            raw[t] = torch.from_numpy(obs_np)
            mu[t] = policy.mu(policy.normalise(raw[t]))
            z[t] = mu[t] + spread[t]
            act = policy.u_max * np.tanh(z[t].numpy())  # np.tanh: torch.tanh is slow here
            rewards[t] = 0.0
            if cfg.w_du > 0 and last_act is not None:  # the action-rate penalty
                rewards[t] -= cfg.w_du * ((act - last_act) / policy.u_max) ** 2 * alive[t]
            last_act = act
            alive[t + 1] = alive[t]
            for _ in range(cfg.action_repeat):
                obs_np, r, term, _ = sim.step(act)
                rewards[t] += r * alive[t + 1]  # after termination a branch earns nothing
                alive[t + 1] &= ~term
            if t + 1 == cfg.loss_steps:  # the states trajectories continue from
                self._keep_snapshot()
        return raw, z, mu, rewards, alive

    @torch.no_grad()
    def collect(self, policy: GaussianPolicy, gen: torch.Generator) -> Batch:
        """One batch: roll out, score (returns, group advantages), continue."""
        started = time.perf_counter()
        cfg, n, g = self.cfg, self.cfg.num_starts, self.cfg.group_size
        B, H, L = n * g, cfg.horizon, cfg.loss_steps
        self._branch()  # the pool's trajectories into the group simulator, g branches each
        log_std = policy.log_std.detach()
        spread = self.exploration.spread(log_std, gen, out=self._noise)
        raw, z, mu, rewards, alive = self._roll(policy, self.group, spread)
        self.sim_steps += B * H * cfg.action_repeat
        # 2. returns: one product, not H vector steps (0.15 ms)
        returns = (self.discounts @ rewards).reshape(n, g)
        # 3. group advantages, the branch's for each of its loss steps
        adv = group_advantages(returns, cfg.adv_scale, batch_std=self.batch_std)
        self._continue(returns, alive[L])
        # the loss steps, branch-major, in one pass: z, mu, log-probabilities, mask, the
        # advantages (0 on saturated steps) and the normalised observations
        log_std_old = log_std.clone()
        steps = loss_steps(policy, L, z.numpy(), mu.numpy(), alive, adv.reshape(B),
                           saturation_bound(log_std_old, cfg.saturated), None if self.shipped
                           else raw.numpy())
        zl, mask_t = steps["z"], steps["mask"]
        self.exploration.sampled(mask_t.numpy())
        everything = raw.reshape(H * B, raw.shape[2])
        logp_old = steps["logp_old"]
        return Batch(obs=steps.get("obs"), z=zl, logp_old=logp_old, mu_old=steps["mu"],
                     log_std_old=log_std_old, adv=steps["adv"], mask=mask_t, returns=returns,
                     entropy=c_squashed_entropy(logp_old, zl, mask_t, policy.u_max,
                                                diagnostic_rows(B, ENTROPY_STRIDE)),
                     raw_obs=None if self.shipped else everything,
                     obs_moments=RunningNorm.moments(everything),
                     raw_loss_obs=raw[:L].transpose(0, 1),
                     collect_s=time.perf_counter() - started, sim_steps=self.sim_steps)

    def _continue(self, returns: np.ndarray, alive_at_l: np.ndarray) -> None:
        """Each trajectory continues from one branch's state at step loss_steps
        (``choose_continuation``); one that ended there (terminated, or at the episode's
        end) or draws ``reset_prob`` restarts from a fresh reset."""
        cfg, n = self.cfg, self.cfg.num_starts
        src = self._first + choose_continuation(returns, cfg.continuation, self.rng)
        self._continue_from(src.astype(np.int32))  # pool trajectory i <- snapshot src[i]
        ended = ~alive_at_l[src] | (self.pool.step_counts() >= self.spec.max_steps)
        restart = ended | (self.rng.random(n) < cfg.reset_prob)
        if restart.any():
            self.pool.reset(mask=restart)


def choose_continuation(returns: np.ndarray, rule: str, rng: np.random.Generator,
                        temperature: float = 1.0) -> np.ndarray:
    """Index (within its group) of the branch each trajectory continues from,
    given branch returns (num_groups, G): the best (``greedy``), any (``random``),
    branch 0, the one that followed the mean action (``mean``), or one drawn with
    probability softmax(group-normalised return / ``temperature``) (``softmax``)."""
    n, g = returns.shape
    if rule == "greedy":
        return returns.argmax(axis=1)
    if rule == "random":
        return rng.integers(0, g, size=n)
    if rule == "mean":
        return np.zeros(n, dtype=np.int64)
    if rule == "softmax":
        z = group_advantages(returns, "group") / max(temperature, 1e-6)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        u = rng.random((n, 1))
        return np.minimum((p.cumsum(axis=1) < u).sum(axis=1), g - 1)
    raise ValueError(f"unknown continuation {rule!r}")


def squashed_entropy(logp_old: torch.Tensor, z: torch.Tensor, mask: torch.Tensor,
                     u_max: float) -> float:
    """Monte-Carlo entropy of the command u_max tanh(z), -E[log pi(a)], over the sampled
    loss steps of one branch in ENTROPY_STRIDE (a diagnostic: 0.2 ms on all). collect
    takes the same numbers from C (c_gradient.squashed_entropy)."""
    rows = diagnostic_rows(z.shape[0], ENTROPY_STRIDE)
    logp_squashed = logp_old[rows] - log_tanh_jacobian(z[rows], u_max)
    sampled = mask[rows]
    return -float((logp_squashed * sampled).sum() / sampled.sum().clamp(min=1.0))


# =====================================================================
# 2-3. Group advantage.
# =====================================================================
def group_advantages(returns: np.ndarray, scale: str, eps: float = 1e-8,
                     batch_std=None) -> np.ndarray:
    """GRPO advantages within groups: returns (num_groups, G, ...) ->
    A_i = (R_i - mean over the group) / s, with s = the group's std (``group``,
    unbiased as torch.std), the std of all returns of the batch (``batch``,
    ``batch_std(returns)``: across processes in data-parallel training), or
    1 (``none``: Dr. GRPO, A_i = R_i - mean(G)). Extra trailing axes are
    normalised separately, each across its group."""
    # the group means as np.mean makes them (its sum, then / G), without its Python
    centred = returns - np.add.reduce(returns, axis=1, keepdims=True) / returns.shape[1]
    if scale == "none":
        return centred
    if scale == "group":
        return centred / (returns.std(axis=1, ddof=1, keepdims=True) + eps)
    if scale == "batch":
        std = batch_std(returns) if batch_std is not None else returns.std(ddof=1)
        return centred / (std + eps)
    raise ValueError(f"unknown advantage scale {scale!r}")


def zero_spread_fraction(returns: np.ndarray, tol: float = 1e-9) -> float:
    """Fraction of groups (axis 0) whose returns all equal: no learning signal."""
    spread = returns.max(axis=1) - returns.min(axis=1)
    if spread.ndim > 1:
        spread = spread.reshape(spread.shape[0], -1).max(axis=1)
    return np.count_nonzero(spread <= tol) / spread.shape[0]


def saturated(mu: torch.Tensor, log_std: torch.Tensor, bound: float) -> torch.Tensor:
    """Steps whose squashed command hardly depends on the noise: |mu| - 2 sigma > bound
    before the tanh, so that 97.7 % of the samples give a command within 1 - tanh(bound)
    of full scale (bound 3: 0.5 %). Their outcome cannot depend on the noise drawn
    there, yet their score (z - mu) / sigma^2 is as large as anywhere: in the policy
    gradient they add variance and no signal (``saturated`` zeroes their advantage)."""
    if log_std.numel() == 1:  # one std: one comparison with one number
        return mu.abs() > saturation_bound(log_std, bound)
    return (mu.abs() - 2.0 * torch.exp(log_std)) > bound


def saturation_bound(log_std: torch.Tensor, bound: float) -> float:
    """``saturated``'s threshold on |mu| for one std: bound + 2 sigma (inf: ``bound`` 0,
    off)."""
    return bound + 2.0 * math.exp(float(log_std)) if bound > 0 else math.inf


# =====================================================================
# 4. Loss.
# =====================================================================
def k3_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref) at samples from pi:
    pi_ref/pi - log(pi_ref/pi) - 1, >= 0 and 0 iff the densities agree."""
    log_r = logp_ref - logp
    return torch.exp(log_r) - log_r - 1.0


def aggregate_loss(per_step: torch.Tensor, mask: torch.Tensor, how: str,
                   max_steps: int) -> torch.Tensor:
    """Average per-step losses (branches, steps) under mask: ``grpo`` mean over
    each branch's steps then over branches; ``token`` over all steps;
    ``dr_grpo`` sum over steps / max_steps, then mean over branches."""
    if how == "grpo":
        per_branch = (per_step * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return per_branch.mean()
    if how == "token":
        return (per_step * mask).sum() / mask.sum().clamp(min=1.0)
    if how == "dr_grpo":
        return (per_step * mask).sum() / (per_step.shape[0] * max_steps)
    raise ValueError(f"unknown loss aggregation {how!r}")


def mean_command_smoothness(policy: GaussianPolicy, obs: torch.Tensor, mu: torch.Tensor,
                            mask: torch.Tensor, sigma: float, gen: torch.Generator,
                            temporal: bool = True) -> torch.Tensor:
    """CAPS (Mysore et al., 2021) on the deployed command a = tanh(mu), in units
    of u_max: the squared change of a between consecutive decisions of a branch
    (temporal; left out with ``temporal=False``) plus the squared change of a
    when the normalised observation moves by N(0, sigma^2) (spatial: the
    policy's gain at the scale of encoder steps and noise). On the mean, not
    the sampled action: exploration noise does not drown it, and the mean is
    what the device runs."""
    a = torch.tanh(mu)
    moved = torch.tanh(policy.mu(obs + sigma * torch.randn(obs.shape, generator=gen)))
    spatial = ((moved - a) ** 2 * mask).sum() / mask.sum().clamp(min=1.0)
    if not temporal:
        return spatial
    both = mask[:, 1:] * mask[:, :-1]
    return spatial + ((a[:, 1:] - a[:, :-1]) ** 2 * both).sum() / both.sum().clamp(min=1.0)


def policy_loss(policy: GaussianPolicy, ref: GaussianPolicy | None, batch: Batch,
                idx: torch.Tensor, cfg: GRPOConfig, eps_low: float, eps_high: float,
                gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss of branches ``idx``, to minimise, and their ratios r = pi / pi_old:

        loss = agg_t,i [ -S(r_t,i, A_i) + beta k3(pi, pi_ref)_t,i ] + w_smooth CAPS

    S the ``loss_type``'s surrogate (clip: min(r A, clip(r, 1 - eps_low, 1 + eps_high) A);
    sapo: the soft gate; grpo_ctrl/trust_region.py), k3 the KL estimate to the reference
    policy, agg the ``loss_agg`` average over the loss steps, CAPS the mean command's
    smoothness. Autograd through this is what the C gradient computes (for the clip,
    beta 0, no w_smooth; tests/test_policy_update.py holds them equal)."""
    mu, log_std = policy.dist(batch.obs[idx])
    logp = gaussian_log_prob(batch.z[idx], mu, log_std)
    ratio = torch.exp(logp - batch.logp_old[idx])
    adv, mask = batch.adv[idx], batch.mask[idx]
    per_step = -surrogate(cfg.loss_type, ratio, adv, eps_low, eps_high)
    if cfg.beta > 0 and ref is not None:
        with torch.no_grad():
            mu_ref, log_std_ref = ref.dist(ref.normalise(batch.raw_loss_obs[idx]))
            logp_ref = gaussian_log_prob(batch.z[idx], mu_ref, log_std_ref)
        per_step = per_step + cfg.beta * k3_kl(logp, logp_ref)
    loss = aggregate_loss(per_step, mask, cfg.loss_agg, batch.z.shape[1])
    if cfg.w_smooth > 0:
        loss = loss + cfg.w_smooth * mean_command_smoothness(
            policy, batch.obs[idx], mu, mask, cfg.smooth_sigma, gen,
            temporal=cfg.smooth_terms == "both")
    return loss, ratio


def clip_fractions(ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, eps_low: float,
                   eps_high: float) -> tuple[float, float]:
    """Sign-aware fractions of steps where the clip stops the gradient:
    low = A < 0 and ratio < 1 - eps_low; high = A > 0 and ratio > 1 + eps_high."""
    n = mask.sum().clamp(min=1.0)
    low = ((adv < 0) & (ratio < 1.0 - eps_low)).float() * mask
    high = ((adv > 0) & (ratio > 1.0 + eps_high)).float() * mask
    return float(low.sum() / n), float(high.sum() / n)


def gaussian_kl(mu_p, log_std_p, mu_q, log_std_q) -> torch.Tensor:
    """Exact KL(N(mu_p, s_p) || N(mu_q, s_q)) per state. The tanh squashing is
    a bijection, so this is also the KL between the squashed policies."""
    var_ratio = torch.exp(2.0 * (log_std_p - log_std_q))
    return 0.5 * (var_ratio + (mu_p - mu_q) ** 2 * torch.exp(-2.0 * log_std_q) - 1.0) \
        - (log_std_p - log_std_q)


# =====================================================================
# 5. Update.
# =====================================================================
class TorchGradient:
    """A minibatch's gradient by autograd through ``policy_loss``."""

    def __init__(self, policy: GaussianPolicy, ref: GaussianPolicy | None, opt, cfg: GRPOConfig,
                 gen: torch.Generator, average_gradients=None):
        self.policy, self.ref, self.opt, self.cfg, self.gen = policy, ref, opt, cfg, gen
        self.average_gradients = average_gradients

    def bind(self, batch: Batch) -> None:
        self.batch = batch

    def gradient(self, idx: torch.Tensor, eps_low: float, eps_high: float) -> tuple:
        """Writes the gradient into the parameters' .grad, not clipped. Returns (None: the
        norm is yet to take, and the clip's fractions)."""
        loss, ratio = policy_loss(self.policy, self.ref, self.batch, idx, self.cfg, eps_low,
                                  eps_high, self.gen)
        self.opt.zero_grad(set_to_none=self.average_gradients is None)
        loss.backward()
        lo, hi = clip_fractions(ratio.detach(), self.batch.adv[idx], self.batch.mask[idx],
                                eps_low, eps_high)
        return None, lo, hi

    def mean(self, rows) -> torch.Tensor:
        return self.policy.mu(self.batch.obs[rows])


class CGradientStep:
    """A minibatch's gradient in one C call (grpo_ctrl/c_gradient.py), clipped there
    unless the ranks average the gradients first."""

    def __init__(self, policy: GaussianPolicy, cfg: GRPOConfig, average_gradients=None):
        self.policy, self.cfg = policy, cfg
        self.max_norm = cfg.max_grad_norm if average_gradients is None else 0.0
        self.B, self._rows = 0, {}

    def bind(self, batch: Batch) -> None:
        self.c = CGradient.bound(self.policy, batch)
        self.batch = batch
        if self.B != batch.z.shape[0]:
            self.B, self._rows = batch.z.shape[0], {}

    def gradient(self, idx: torch.Tensor, eps_low: float, eps_high: float) -> tuple:
        got = self.c.gradient(idx, self.cfg.loss_agg, eps_low, eps_high, self.max_norm)
        return got["grad_norm"], got["clip_low"], got["clip_high"]

    def rows(self, rows: slice) -> torch.Tensor:
        """The branches of ``rows`` (diagnostic_rows) as C takes them, made once."""
        key = (rows.start, rows.stop, rows.step)
        if key not in self._rows:
            self._rows[key] = torch.arange(self.B)[rows].contiguous()
        return self._rows[key]

    def mean(self, rows) -> torch.Tensor:
        return self.c.mean(self.rows(rows))

    def kl_old(self, rows: slice) -> float:
        """``update_kl``'s KL(pi_old || pi), by C (CGradient.kl_old)."""
        return self.c.kl_old(self.rows(rows), self.batch.mu_old, self.batch.log_std_old)


def gradient_backend(policy: GaussianPolicy, ref: GaussianPolicy | None, opt, cfg: GRPOConfig,
                     gen: torch.Generator, average_gradients=None):
    """C where it computes this loss for this policy (``CGradient.applies``), else torch."""
    if CGradient.applies(policy, cfg, ref):
        return CGradientStep(policy, cfg, average_gradients)
    return TorchGradient(policy, ref, opt, cfg, gen, average_gradients)


def grpo_update(policy: GaussianPolicy, ref: GaussianPolicy | None, opt: torch.optim.Optimizer,
                batch: Batch, cfg: GRPOConfig, eps_low: float, eps_high: float,
                gen: torch.Generator, average_gradients=None, backend=None) -> dict:
    """``epochs`` passes of minibatch steps over the batch's branches: the gradient of
    ``policy_loss`` (``backend``: ``gradient_backend``'s, made here if not given),
    clipped to ``max_grad_norm``, an Adam step, log std floored at ``log_std_min``.
    ``average_gradients(params)``, in data-parallel training, averages the
    gradients across processes before they are clipped; the gradients are
    then zeroed in place rather than dropped, so that they stay in the flat
    buffer it reduces (grpo_ctrl/distributed.py)."""
    B = batch.z.shape[0]
    if backend is None:
        backend = gradient_backend(policy, ref, opt, cfg, gen, average_gradients)
    backend.bind(batch)
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
    seen = []  # (grad norm, clip low, clip high) of each minibatch
    for _ in range(cfg.epochs):
        perm = torch.randperm(B, generator=gen)
        for idx in perm.chunk(cfg.minibatches):
            grad_norm, lo, hi = backend.gradient(idx, eps_low, eps_high)
            if grad_norm is None or average_gradients is not None:
                params = list(policy.parameters())
                if average_gradients is not None:
                    average_gradients(params)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            adam_step(opt)
            with torch.no_grad():
                policy.log_std.clamp_(min=cfg.log_std_min)
            seen.append((grad_norm, lo, hi))
    kl_old, kl_ref = update_kl(policy, ref, batch, backend, cfg)
    # each column's mean, in plain floats (np.mean's bits up to 8 minibatches)
    grad_norm, clip_low, clip_high = (sum(column) / len(seen) for column in zip(*seen))
    return {"grad_norm": grad_norm, "clip_low": clip_low, "clip_high": clip_high,
            "kl_old": kl_old, "kl_ref": kl_ref}


@torch.no_grad()
def update_kl(policy: GaussianPolicy, ref: GaussianPolicy | None, batch: Batch, backend,
              cfg: GRPOConfig) -> tuple[float, float]:
    """How far the update moved, exactly: KL(pi_old || pi) and KL(pi || pi_ref) over the
    loss steps. The adaptive clip steers by the first, so it takes the whole batch;
    elsewhere they are diagnostics and take one branch in KL_STRIDE (a forward pass
    over the whole batch was a fifth of the update's time)."""
    B = batch.z.shape[0]
    rows = diagnostic_rows(B, KL_STRIDE if cfg.loss_type != "adaptive_clip" else 1)
    if ref is None and isinstance(backend, CGradientStep):  # the same sums, fewer torch calls
        return backend.kl_old(rows), 0.0
    mu, log_std = backend.mean(rows), policy.log_std
    m = batch.mask[rows]
    n = m.sum().clamp(min=1.0)
    kl_old = float((gaussian_kl(batch.mu_old[rows], batch.log_std_old, mu, log_std) * m).sum()
                   / n)
    kl_ref = 0.0
    if ref is not None:
        mu_ref, log_std_ref = ref.dist(ref.normalise(batch.raw_loss_obs[rows]))
        kl_ref = float((gaussian_kl(mu, log_std, mu_ref, log_std_ref) * m).sum() / n)
    return kl_old, kl_ref


def adapt_clip(eps_scale: float, kl: float, target: float) -> float:
    """Adaptive clip: widen the clip range when the measured KL(pi_old || pi) is
    under half the target, narrow it when over twice."""
    if kl > 2.0 * target:
        eps_scale /= 1.5
    elif kl < 0.5 * target:
        eps_scale *= 1.5
    return float(min(max(eps_scale, 0.05), 5.0))


# =====================================================================
# 6. The trainer.
# =====================================================================
def make_policy(cfg: GRPOConfig, spec) -> GaussianPolicy:
    """The untrained policy a run of ``cfg`` on plant ``spec`` starts from."""
    return GaussianPolicy(spec.nobs, spec.u_max, cfg.hidden, cfg.layers, cfg.activation,
                          cfg.log_std_init, cfg.log_std_min, cfg.features, cfg.feature_scale)


# the config fields a trained policy fixes for a run that starts from it: its network's shape
# and the LQR's catch it learned to reach
INIT_FIELDS = ("hidden", "layers", "activation", "features", "feature_scale", "catch")


def init_policy(path: str) -> tuple[GaussianPolicy, tuple[str, str], dict]:
    """The trained policy ``GRPOConfig.init`` names (a run folder's deployed one, or a
    checkpoint file), the plant (system, preset) it was trained on and the ``INIT_FIELDS``
    it fixes; UserError where there is none."""
    policy, ck, _ = load_policy(Path(path))
    fixed = {k: policy.arch[k] for k in INIT_FIELDS if k != "catch"}
    fixed["catch"] = float(ck.get("config", {}).get("catch", 0.0))
    return policy, (ck.get("system"), ck.get("preset")), fixed


def check_init(cfg: GRPOConfig, system: str, preset: str, trained_on: tuple, fixed: dict) -> None:
    """UserError where the run's plant is not the one ``cfg.init``'s policy was trained on,
    or ``cfg`` sets an ``INIT_FIELDS`` value other than that policy's."""
    if tuple(trained_on) != (system, preset):
        raise UserError(f"init {cfg.init!r} was trained on {trained_on[0]}/{trained_on[1]}, "
                        f"not {system}/{preset}: start from a run of this plant")
    for name, value in fixed.items():
        if getattr(cfg, name) != value:
            raise UserError(f"{name} = {getattr(cfg, name)!r}, but the policy of init "
                            f"{cfg.init!r} has {name} = {value!r}: leave {name} out")


def start_from(policy: GaussianPolicy, cfg: GRPOConfig, system: str, preset: str) -> None:
    """``policy`` takes the network and the observation normaliser of ``cfg.init``'s; the
    normaliser stays fixed (the learned function keeps its input), the noise is the
    config's (``log_std_init``). UserError where it does not fit (``check_init``)."""
    source, trained_on, fixed = init_policy(cfg.init)
    check_init(cfg, system, preset, trained_on, fixed)
    policy.net.load_state_dict(source.net.state_dict())
    policy.obs_norm.load_state_dict(source.obs_norm.state_dict())
    policy.obs_norm.frozen = True
    policy.refresh_norm()


class Trainer:
    """One GRPO run: policy, optimiser, reference policy, rollout pool.
    ``ranks``: this process's place in data-parallel training (default: the
    initialised torch.distributed group, or one process); it collects its
    share of the start states with its own seeds (grpo_ctrl/distributed.py)."""

    def __init__(self, cfg: GRPOConfig, system: str, preset: str, ranks: Ranks | None = None,
                 randomize: Randomization | None = None):
        check_config(cfg)
        runtime.tune_process()
        self.ranks = ranks = ranks or Ranks.current()
        if cfg.overlap and ranks.world > 1:
            raise UserError("overlap and data-parallel training both want the spare cores: "
                            "set overlap = false with more than one process")
        local = ranks.local_config(cfg)
        self.cfg, self.system, self.preset = cfg, system, preset
        self.randomize = randomize if randomize is not None else Randomization()
        torch.manual_seed(cfg.seed)
        self.gen = torch.Generator().manual_seed(ranks.seed(cfg.seed))
        self.rollout = GroupRollout(local, system, preset, ranks.seed(cfg.seed), ranks.batch_std,
                                    self.randomize)
        self.spec = self.rollout.spec
        self.policy = make_policy(cfg, self.spec)
        if cfg.init:  # fine-tuning: a trained policy's network and normaliser
            start_from(self.policy, cfg, system, preset)
        self.opt = adam(self.policy.parameters(), cfg.lr)
        self.ref = copy.deepcopy(self.policy) if cfg.beta > 0 else None
        # the update's backend, chosen once (a new reference policy keeps its choice)
        self.backend = gradient_backend(self.policy, self.ref, self.opt, cfg, self.gen,
                                        ranks.average_gradients if ranks.world > 1 else None)
        self.eval_seed = 1_000_003 + cfg.seed  # the same start states at every evaluation
        self.iteration = 0
        self.eps_scale = 1.0
        self.cost_scale = 1.0  # set_progress's
        ranks.broadcast_parameters(self.policy)  # the same start on every rank, whatever seeds did
        # the pool starts from resets; prime the normaliser with what they look like
        ranks.reduce_batch(self.policy.obs_norm,
                           torch.from_numpy(self.rollout.pool.observe().copy()))
        self.policy.refresh_norm()
        # overlap: a second process collects (started here, before the training clock)
        self._collector = None
        if cfg.overlap:
            spec = self.spec
            self._collector = OverlapCollector(
                lambda: GroupRollout(cfg, system, preset, cfg.seed, randomize=self.randomize,
                                     shipped=True),
                lambda: make_policy(cfg, spec),
                cfg.seed)

    def _batch(self) -> Batch:
        """This iteration's groups. With overlap, the collector process
        gathered them with the policy as it was one update ago (their
        log-probs are the ratio's denominator, so the update stays correct;
        the clip bounds the step) and is on the next batch already; ``step``
        sends it the updated policy for the one after. The observations are
        normalised again with today's statistics."""
        if self._collector is None:
            runtime.use_threads(1)
            return self.rollout.collect(self.policy, self.gen)
        batch = self._collector.next_batch(self.policy, self.cost_scale)
        self.rollout.sim_steps = batch.sim_steps
        batch.obs = self.policy.normalise(batch.raw_loss_obs).contiguous()
        return batch

    def close(self) -> None:
        """Stop the collector process (overlap), if there is one."""
        if self._collector is not None:
            self._collector.close()
            self._collector = None

    def set_ref(self, policy: GaussianPolicy) -> None:
        """The reference policy of the KL term: a copy of ``policy`` (beta > 0)."""
        self.ref = copy.deepcopy(policy)
        if isinstance(self.backend, TorchGradient):
            self.backend.ref = self.ref

    def step(self, lead=None) -> dict:
        """One iteration: collect groups, update, refresh stats. Returns metrics.
        ``lead()``: values rank 0 shares with every rank on the batch
        statistics' message, returned under "lead" (Ranks.reduce_batch)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        batch = self._batch()
        t1 = time.perf_counter()
        runtime.use_threads(cfg.threads)
        eps_low, eps_high = cfg.eps_low * self.eps_scale, cfg.eps_high * self.eps_scale
        eps_low = min(eps_low, 0.95)
        stats = grpo_update(self.policy, self.ref, self.opt, batch, cfg, eps_low, eps_high,
                            self.gen, self.ranks.average_gradients if self.ranks.world > 1
                            else None, self.backend)
        returns = batch.returns
        # the whole batch's normaliser statistics and diagnostics, the same on every rank
        stats = self.ranks.reduce_batch(self.policy.obs_norm, batch.raw_obs, {
            "branch_return": float(returns.mean()),
            "group_reward_std": float(returns.std(axis=1, ddof=1).mean()),
            "zero_spread": zero_spread_fraction(returns), "entropy": batch.entropy, **stats},
            lead, moments=batch.obs_moments)
        if cfg.loss_type == "adaptive_clip":
            self.eps_scale = adapt_clip(self.eps_scale, stats["kl_old"], cfg.kl_target)
        self.policy.refresh_norm()
        if self._collector is not None:  # for the batch after the one it is collecting
            self._collector.updated(self.policy, self.cost_scale)
        self.iteration += 1
        if self.ref is not None and self.iteration % cfg.ref_refresh == 0:
            self.set_ref(self.policy)
        return {"iteration": self.iteration, **stats,
                "log_std": float(self.policy.log_std.detach()),
                "lr": self.opt.param_groups[0]["lr"],
                "eps_low": eps_low, "eps_high": eps_high,
                "sim_steps": batch.sim_steps * self.ranks.world,
                "rollout_s": batch.collect_s, "rollout_wait_s": t1 - t0,
                "update_s": time.perf_counter() - t1}

    def set_progress(self, fraction: float) -> None:
        """The learning rate falls linearly from lr to lr_end * lr over the run (fraction 0
        to 1 of the budget): fine steps at the end polish the final policy. The reward's costs
        of effort are at ``costs_early`` before ``costs_from`` of it."""
        frac = min(max(fraction, 0.0), 1.0)
        scale = 1.0 - (1.0 - self.cfg.lr_end) * frac
        for group in self.opt.param_groups:
            group["lr"] = self.cfg.lr * scale
        # the costs of effort apply from costs_from of the run on, at costs_early before (some
        # cost of velocity keeps the swing-up from spinning); the collector's rollout gets the
        # scale with the next policy
        self.cost_scale = 1.0 if frac >= self.cfg.costs_from else self.cfg.costs_early
        self.rollout.set_cost_scale(self.cost_scale)

    def evaluate(self) -> tuple[float, float]:
        """(mean return, success rate) of the deterministic policy, on plants
        drawn as in training (``evaluation_episodes``)."""
        returns, success = self.evaluation_episodes()
        return float(returns.mean()), float(success.mean())

    def evaluation_episodes(self) -> tuple[np.ndarray, np.ndarray]:
        """Each evaluation episode's return and success: in the C rollout where it runs the
        policy (its mean within ~1e-6 of torch's; 6-16x faster than a torch forward pass
        a step), else through the deployed controller (``closed_loop.evaluate``)."""
        from grpo_ctrl.closed_loop import evaluate, upright_and_still
        # the catch (cfg.catch) in the simulator's step, as in training: the deployed
        # LQRCatch's function of the state, without its many small torch operations a step
        c_net = self.policy.c_mean_network() if self.cfg.c_rollout else None
        if c_net is None:
            ep = evaluate(self.policy.controller(self.spec), self.cfg.eval_episodes,
                          self.eval_seed, randomize=self.randomize, **self.rollout.catch)
            return ep.returns, ep.success
        n = self.cfg.eval_episodes
        sim = BatchSim(self.spec.system, n, self.spec.preset, seed=self.eval_seed,
                       randomize=self.randomize, **self.rollout.catch)
        nobs, steps = sim.reset().shape[1], sim.model.max_steps
        T = min(steps, 256)  # decisions a call; one command a step, as deployed
        spread, mu, z = (np.zeros((T, n), np.float32) for _ in range(3))
        raw, reward = np.empty((T, n, nobs), np.float32), np.empty((T, n))
        alive, last_act = np.ones((T + 1, n), bool), np.zeros(n, np.float32)
        returns = np.zeros(n)
        for start in range(0, steps, T):
            t = min(T, steps - start)
            sim.roll_policy(*c_net, spread[:t], raw[:t], mu[:t], z[:t], reward[:t],
                            alive[:t + 1], last_act, start > 0, u_max=self.policy.u_max)
            returns += reward[:t].sum(axis=0)
            alive[0] = alive[t]
        return returns, alive[0] & upright_and_still(self.spec, sim.get_state()["x"])
