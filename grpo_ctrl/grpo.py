"""GRPO for control, on group-branch rollouts of the C simulator. No critic.

Read top to bottom: the one hyperparameter dataclass, the small named
functions each variant is made of (unit-tested in tests/test_grpo_math.py),
the rollout, the update, and the trainer that strings them together.
docs/grpo.md gives the equations with pointers back here.

One iteration:
 1. A pool of ``num_starts`` trajectories (a BatchSim) holds the start
    states, the "queries". ``branch`` clones each into ``group_size``
    environments of one group simulator.
 2. All ``num_starts * group_size`` branches roll out ``horizon`` steps
    together: one simulator call and one policy forward pass per step,
    actions sampled from pi_old.
 3. Rewards become advantages within each group (outcome or per-step
    reward-to-go; scale group/batch/none).
 4. The first ``loss_steps`` steps of each branch enter the clipped-ratio
    loss (the rest is look-ahead for the rewards); ``epochs`` passes over
    ``minibatches``; optional k3 KL to a reference policy.
 5. Each trajectory continues from one branch's state at step
    ``loss_steps`` (continuation rule); some restart from a fresh reset.
"""
from __future__ import annotations

import copy
import math
import os
import time
from collections import deque
from dataclasses import dataclass

# Idle OpenMP threads sleep instead of spinning: on a machine shared with
# other processes, spinning made two-thread updates 20-60x slower. Only
# effective if torch is not yet imported, as under `grpo-ctrl train`.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from grpo_ctrl.c_gradient import CGradient
from grpo_ctrl.distributed import Ranks
from grpo_ctrl.errors import UserError
from grpo_ctrl.grpo_config import GRPOConfig, check_config
from grpo_ctrl.heap import keep_freed_memory
from grpo_ctrl.overlap import OverlapCollector
from grpo_ctrl.policy import (GaussianPolicy, RunningNorm, gaussian_log_prob, log_tanh_jacobian,
                             sde_log_std)
from grpo_ctrl.randomize import Randomization
from grpo_ctrl.sim import BatchSim
from grpo_ctrl.trust_region import clipped_surrogate, surrogate  # noqa: F401 (clipped_surrogate: API)


# =====================================================================
# The variants: small named functions.
# =====================================================================
def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """Reward-to-go R_t = sum_{k >= t} gamma^(k-t) r_k along the last axis."""
    out = np.empty_like(rewards, dtype=np.float64)
    acc = np.zeros(rewards.shape[:-1])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        acc = rewards[..., t] + gamma * acc
        out[..., t] = acc
    return out


def group_advantages(rewards: np.ndarray, scale: str, eps: float = 1e-8,
                     batch_std=None) -> np.ndarray:
    """GRPO advantages within groups: rewards (num_groups, G, ...) ->
    (R - mean over the group) / s, with s = the group's std (``group``,
    unbiased as torch.std), the std of all rewards of the batch (``batch``,
    ``batch_std(rewards)``: across processes in data-parallel training), or
    1 (``none``: Dr. GRPO, A_i = R_i - mean(G)). Extra trailing axes (time
    steps) are normalised separately, each across its group."""
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    if scale == "none":
        return centred
    if scale == "group":
        return centred / (rewards.std(axis=1, ddof=1, keepdims=True) + eps)
    if scale == "batch":
        std = batch_std(rewards) if batch_std is not None else rewards.std(ddof=1)
        return centred / (std + eps)
    raise ValueError(f"unknown advantage scale {scale!r}")


def zero_spread_fraction(rewards: np.ndarray, tol: float = 1e-9) -> float:
    """Fraction of groups (axis 0) whose rewards all equal: no learning signal."""
    spread = rewards.max(axis=1) - rewards.min(axis=1)
    return float(np.mean(spread.reshape(spread.shape[0], -1).max(axis=1) <= tol))


def clip_fractions(ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, eps_low: float,
                   eps_high: float) -> tuple[float, float]:
    """Sign-aware fractions of steps where the clip stops the gradient:
    low = A < 0 and ratio < 1 - eps_low; high = A > 0 and ratio > 1 + eps_high."""
    n = mask.sum().clamp(min=1.0)
    low = ((adv < 0) & (ratio < 1.0 - eps_low)).float() * mask
    high = ((adv > 0) & (ratio > 1.0 + eps_high)).float() * mask
    return float(low.sum() / n), float(high.sum() / n)


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


def choose_continuation(returns: np.ndarray, rule: str, rng: np.random.Generator,
                        temperature: float = 1.0) -> np.ndarray:
    """Index (within its group) of the branch each trajectory continues from,
    given branch returns (num_groups, G). ``policy`` picks branch 0, the one
    that followed the mean action."""
    n, g = returns.shape
    if rule == "greedy":
        return returns.argmax(axis=1)
    if rule == "random":
        return rng.integers(0, g, size=n)
    if rule == "policy":
        return np.zeros(n, dtype=np.int64)
    if rule == "softmax":
        z = group_advantages(returns, "group") / max(temperature, 1e-6)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        u = rng.random((n, 1))
        return np.minimum((p.cumsum(axis=1) < u).sum(axis=1), g - 1)
    raise ValueError(f"unknown continuation {rule!r}")


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


def gaussian_kl(mu_p, log_std_p, mu_q, log_std_q) -> torch.Tensor:
    """Exact KL(N(mu_p, s_p) || N(mu_q, s_q)) per state. The tanh squashing is
    a bijection, so this is also the KL between the squashed policies."""
    var_ratio = torch.exp(2.0 * (log_std_p - log_std_q))
    return 0.5 * (var_ratio + (mu_p - mu_q) ** 2 * torch.exp(-2.0 * log_std_q) - 1.0) \
        - (log_std_p - log_std_q)


def correlated_noise(horizon: int, branches: int, rho: float,
                     gen: torch.Generator) -> torch.Tensor:
    """Exploration noise (horizon, branches) with unit marginal variance, AR(1)
    along time within each branch: n_0 = e_0, n_t = rho n_(t-1) + sqrt(1 - rho^2) e_t,
    e ~ N(0, 1) iid from ``gen``, so corr(n_t, n_(t+k)) = rho^k. rho = 0 is iid
    noise, the same draws as before. Correlated noise does not average out over
    a swing-up of 60-100 steps: branches differ in strategy, not only in jitter
    (colored noise in on-policy RL, Hollenstein et al. 2023). The ratio keeps the
    per-step Gaussian, the noise's marginal, as those papers do."""
    e = torch.randn(horizon, branches, generator=gen)
    if rho == 0.0:
        return e
    out, keep = torch.empty_like(e), math.sqrt(1.0 - rho * rho)
    out[0] = e[0]
    for t in range(1, horizon):
        out[t] = rho * out[t - 1] + keep * e[t]
    return out


def sde_exploration(log_std: torch.Tensor, horizon: int, branches: int, every: int,
                    gen: torch.Generator) -> torch.Tensor:
    """gSDE's exploration matrices (draws, branches, features), E_j ~ N(0, exp(log_std_j)^2)
    from ``gen``: one per branch for its whole horizon (``every`` = 0), or a fresh one every
    ``every`` decisions, decision t using draw t // every. A branch's noise at state s is
    sde_features(s) . E (policy.py): a deterministic function of the state between draws,
    so a branch that pushes longer, or switches later, does so as a whole (Raffin, Kober,
    Stulp 2022), where per-step noise only jitters."""
    draws = 1 if every == 0 else -(-horizon // every)
    return torch.exp(log_std) * torch.randn(draws, branches, log_std.numel(), generator=gen)


PROBE_SATURATED = 3.0  # a probe flips where |mu| - 2 sigma > this, if saturated is 0


def saturated(mu: torch.Tensor, log_std: torch.Tensor, bound: float) -> torch.Tensor:
    """Steps whose squashed command hardly depends on the noise: |mu| - 2 sigma > bound
    before the tanh, so that 97.7 % of the samples give a command within 1 - tanh(bound)
    of full scale (bound 3: 0.5 %). Their outcome cannot depend on the noise drawn
    there, yet their score (z - mu) / sigma^2 is as large as anywhere: in the policy
    gradient they add variance and no signal (the hanging swing-up decides at one or two
    unsaturated steps among 32, docs/grpo.md §9, fifth pass)."""
    if log_std.numel() == 1:  # one std: one comparison with one number
        return mu.abs() > bound + 2.0 * math.exp(float(log_std))
    return (mu.abs() - 2.0 * torch.exp(log_std)) > bound


def flip_windows(probes: int, size: int, loss_steps: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The window in which each probe may flip its command: (branch, start, end), each
    (probes,). The probe is the last branch of each of the first ``probes`` groups (its
    twin, the one before it, follows the mean action throughout); its window [start, end)
    within the loss steps has start uniform in [0, loss_steps) and end uniform in
    (start, loss_steps]. The probe flips at the window's first saturated step
    (``GroupRollout._roll``) and holds that command to the window's end: a bang-bang
    command switched earlier than the policy switches it, held for any length (flipping
    -mu(t) at every step would undo the switch wherever the policy makes it itself,
    docs/grpo.md §9, tenth pass)."""
    start = rng.integers(0, loss_steps, size=probes)
    end = rng.integers(start + 1, loss_steps + 1)
    return np.arange(probes) * size + size - 1, start, end


def mirrored(noise: torch.Tensor, groups: int, size: int) -> torch.Tensor:
    """Antithetic pairs: noise (T, groups * size, ...) with branch j + size/2 of each group
    given the negated noise of branch j. Each branch's noise keeps its distribution (the
    ratio and the clip are unchanged). A pair's terms in the gradient on the mean are
    A_j e_j + A_j' (-e_j) = (R_j - R_j') e_j: the return's even-order (curvature) response
    to the noise is the same for both and cancels, what is left is its odd-order effect
    (mirrored sampling in evolution strategies, Brockhoff et al. 2010; Salimans et al.
    2017)."""
    half = size // 2
    view = noise.view(noise.shape[0], groups, size, -1)
    view[:, :, half:2 * half] = -view[:, :, :half]
    return noise


def noise_window(noise: torch.Tensor, loss_steps: int, width: int, gen: torch.Generator,
                 outside: str = "shared") -> tuple[torch.Tensor, torch.Tensor]:
    """Common random numbers within each group: noise (H, groups, G) -> the same, with
    every branch of a group given branch 0's noise (``outside = "shared"``) or none
    (``"mean"``: the mean action) except in one window of ``width`` consecutive loss
    steps, its start uniform in [0, loss_steps - width] per group; and ``inside``
    (groups, loss_steps), true in the window. The branches of a group then differ only
    by the noise of their window, so their return differences measure what those few
    steps did (a swing-up decided at one switching step is not drowned by the noise of
    31 others), and only the window's steps carry an advantage. With ``"mean"`` they
    measure it on the deployed policy's continuation, which is what the device runs,
    not on a continuation that must survive its own noise."""
    H, groups, _ = noise.shape
    start = torch.randint(0, loss_steps - width + 1, (groups,), generator=gen)
    t = torch.arange(H)[:, None]
    inside = (t >= start) & (t < start + width)  # (H, groups)
    fill = noise[:, :, :1] if outside == "shared" else noise.new_zeros(())
    return torch.where(inside[:, :, None], noise, fill), inside[:loss_steps].T


def group_moments(values: np.ndarray, group: np.ndarray,
                  num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample std (ddof 1) over each group of branches of unequal size:
    values (B, ...) of branches, ``group`` (B,) the group of each, in
    [0, num_groups) -> two arrays (num_groups, ...)."""
    flat = values.reshape(len(group), -1)
    count = np.bincount(group, minlength=num_groups).astype(np.float64)[:, None]
    total = np.zeros((num_groups, flat.shape[1]))
    np.add.at(total, group, flat)
    mean = total / count
    square = np.zeros_like(total)
    np.add.at(square, group, (flat - mean[group]) ** 2)
    shape = (num_groups, *values.shape[1:])
    return mean.reshape(shape), np.sqrt(square / (count - 1.0)).reshape(shape)


def ragged_group_advantages(rewards: np.ndarray, group: np.ndarray, num_groups: int,
                            scale: str, eps: float = 1e-8, batch_std=None) -> np.ndarray:
    """``group_advantages`` for groups of unequal size (two stages, ``screen_group``):
    rewards (B, ...) of branches, ``group`` (B,) the group of each."""
    mean, std = group_moments(rewards, group, num_groups)
    centred = rewards - mean[group]
    if scale == "none":
        return centred
    if scale == "group":
        return centred / (std[group] + eps)
    if scale == "batch":
        spread = batch_std(rewards) if batch_std is not None else rewards.std(ddof=1)
        return centred / (spread + eps)
    raise ValueError(f"unknown advantage scale {scale!r}")


def query_probabilities(spread: np.ndarray, k: int, floor: float) -> np.ndarray:
    """Probabilities that each pool trajectory is among the k queries of an
    iteration (prioritised queries, ``query_pool``): k x ((1 - floor) s_i / sum s +
    floor / M), s_i the spread (std) expected of the returns of a group from
    trajectory i's state; a probability above 1 is set to 1 and its excess shared
    among the others in proportion, so that they sum to k. All spreads zero (none
    known yet): uniform. Prioritised level replay (Jiang et al. 2021) scores a level
    by the spread of its returns likewise; the floor is prioritised replay's uniform
    part (Schaul et al. 2016)."""
    m = spread.size
    share = spread / spread.sum() if spread.sum() > 0 else np.full(m, 1.0 / m)
    p = (1.0 - floor) * share + floor / m
    pi, free = np.zeros(m), np.ones(m, dtype=bool)
    while True:
        pi[free] = (k - np.count_nonzero(~free)) * p[free] / p[free].sum()
        over = free & (pi >= 1.0)
        if not over.any():
            return pi
        pi[over], free[over] = 1.0, False


def predicted_spread(states: np.ndarray, scored: np.ndarray, spread: np.ndarray,
                     neighbours: int) -> np.ndarray:
    """The spread expected of a group from each of ``states`` (M, d): the mean spread of
    the groups from the ``neighbours`` nearest (Euclidean) of the recently queried
    start states ``scored`` (K, d); zeros while fewer than that are known. A pool
    trajectory moves on once queried, so its own last spread belongs to a state it
    has left (docs/grpo.md §9, sixth pass (b)); its neighbours' belong to where it is."""
    if len(scored) < neighbours:
        return np.zeros(len(states))
    d2 = ((states[:, None, :] - scored[None, :, :]) ** 2).sum(axis=2)
    near = np.argpartition(d2, neighbours - 1, axis=1)[:, :neighbours]
    return spread[near].mean(axis=1)


def draw_queries(pi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """k = sum(pi) distinct pool indices, in increasing order, index i drawn with
    probability exactly pi_i (each <= 1): systematic sampling, points u, u + 1, ...,
    u + k - 1 on the cumulated probabilities of the indices in a random order."""
    k = int(round(pi.sum()))
    order = rng.permutation(pi.size)
    edges = np.cumsum(pi[order])
    edges *= k / edges[-1]
    points = (1.0 - rng.random()) + np.arange(k)  # u in (0, 1]
    return np.sort(order[np.searchsorted(edges, points, side="left")])


def adapt_clip(eps_scale: float, kl: float, target: float) -> float:
    """Adaptive trust region: widen the clip range when the measured
    KL(pi_old || pi) is under half the target, narrow it when over twice."""
    if kl > 2.0 * target:
        eps_scale /= 1.5
    elif kl < 0.5 * target:
        eps_scale *= 1.5
    return float(min(max(eps_scale, 0.05), 5.0))


# =====================================================================
# Rollout: all branches of all groups in each simulator call and forward.
# =====================================================================
ENTROPY_STRIDE = 8  # the batch's entropy estimate: on one branch in 8 (1 = all)


def diagnostic_rows(B: int, stride: int) -> slice:
    """The branches a diagnostic is estimated on: one in ``stride``, from branch 1 (not a
    group's branch 0, the mean-action branch of the continuation policy); all of them for
    a stride of 1 or a batch under four strides."""
    return slice(1, None, stride) if stride > 1 and B >= 4 * stride else slice(None)


@dataclass
class Batch:
    obs: torch.Tensor | None  # (B, L, nobs) normalised observations of the loss steps (None:
    # shipped; the trainer normalises raw_loss_obs with its own statistics)
    z: torch.Tensor          # (B, L) pre-squash actions taken
    logp_old: torch.Tensor   # (B, L) Gaussian log-density under pi_old
    mu_old: torch.Tensor     # (B, L) pi_old's mean, for the exact KL diagnostic
    adv: torch.Tensor        # (B, L) advantages
    mask: torch.Tensor       # (B, L) 1 where the step is in the loss
    returns: np.ndarray      # (N, G) discounted branch returns (screen_group: stage 1's)
    entropy: float           # Monte-Carlo entropy of the squashed action distribution
    raw_obs: torch.Tensor | None  # (B*H, nobs) raw observations (None: shipped, below)
    raw_loss_obs: torch.Tensor  # (B, L, nobs) raw observations of the loss steps, for pi_ref
    log_std_old: torch.Tensor   # pi_old's log std: (1,), or (B, L) per state (state_std)
    collect_s: float = 0.0      # wall time the collection took
    sim_steps: int = 0          # simulator steps taken by the rollout pool so far, this batch's included
    probe_mask: torch.Tensor | None = None  # (B, L) 1 where a winning probe flipped (probes)
    probe_wins: float = 0.0     # the share of probes that beat their twins
    obs_moments: torch.Tensor | None = None  # [count, mean (nobs), biased var (nobs)] of
    # raw_obs, float64: what the running normaliser folds in (RunningNorm.moments)


# prioritised queries: a pool state's expected spread is that of the groups from its
# NEIGHBOURS nearest start states queried in the last SCORED_ITERATIONS iterations
NEIGHBOURS = 4
SCORED_ITERATIONS = 8


class GroupRollout:
    """The trajectory pool and the group simulators it branches into.
    ``batch_std``: the std of the batch's rewards (adv_scale = batch); data-
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
        # a pool trajectory draws its plant at each reset; its branches copy it
        self.pool = BatchSim(system, cfg.query_pool or n, preset=preset, seed=seed,
                             randomize=randomize)
        # the start observations and group return spreads of the last iterations' queries
        self.scored: deque = deque(maxlen=SCORED_ITERATIONS)
        # the spread of each pool state kept for replay (nan: a trajectory moving on)
        self.replayed = np.full(self.pool.num_envs, np.nan)
        if cfg.screen_group:  # the two stages' group simulators
            self.stages = [BatchSim(system, b, preset=preset, seed=seed + 10_000,
                                    randomize=randomize) for b in (n * cfg.screen_group,
                                                                   n * (g - cfg.screen_group))]
        else:
            self.group = BatchSim(system, n * g, preset=preset, seed=seed + 10_000,
                                  randomize=randomize)
        self.snapshot = BatchSim(system, n * g, preset=preset, seed=seed + 20_000,
                                 randomize=randomize)
        self.spec = self.pool.spec
        self.rng = np.random.default_rng(seed)
        self.sim_steps = 0
        self.discounts = cfg.gamma ** np.arange(cfg.horizon)  # a branch's return: these . rewards

    def restart(self, seed: int) -> None:
        """Fresh trajectories in the whole pool, from ``seed`` (a resumed run)."""
        self.pool.reset(seed=seed)
        self.scored.clear()
        self.replayed[:] = np.nan

    def _queries(self, policy: GaussianPolicy) -> tuple[np.ndarray, np.ndarray | None]:
        """The pool trajectories queried this iteration, and the importance weight of
        each one's group (None: all queried, or no correction), the largest 1."""
        cfg, n = self.cfg, self.cfg.num_starts
        if not cfg.query_pool:
            return np.arange(n), None
        spread = np.zeros(self.pool.num_envs)
        if self.scored:  # distances between normalised observations
            scored = policy.normalise(torch.cat([obs for obs, _ in self.scored])).numpy()
            here = policy.normalise(torch.as_tensor(self.pool.observe(),
                                                    dtype=torch.float32)).numpy()
            spread = predicted_spread(here, scored, np.concatenate(
                [s for _, s in self.scored]), NEIGHBOURS)
        if cfg.query_replay:  # a state kept for replay has a spread of its own
            spread = np.where(np.isnan(self.replayed), spread, self.replayed)
        pi = query_probabilities(spread, n, cfg.query_floor)
        queries = draw_queries(pi, self.rng)
        if cfg.query_is == 0:
            return queries, None
        weight = (n / cfg.query_pool / pi[queries]) ** cfg.query_is
        return queries, weight / weight.max()

    def _noise(self, policy: GaussianPolicy, groups: int, size: int, gen: torch.Generator,
               mean_branch: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Exploration noise of ``groups`` groups of ``size`` branches: gSDE's matrices
        (draws, b, features), or per-step draws in units of the std (H, b); and the noise
        window (None without). With continuation ``policy`` and ``mean_branch``, branch 0
        of each group gets none: it follows the mean action."""
        cfg, H, b = self.cfg, self.cfg.horizon, groups * size
        window = None
        if policy.arch["sde"]:
            noise = sde_exploration(policy.log_std.detach(), H, b, cfg.sde_sample_freq, gen)
        else:
            noise = correlated_noise(H, b, cfg.noise_corr, gen)
        if cfg.antithetic:
            noise = mirrored(noise, groups, size)
        if cfg.noise_window > 0:
            shared, window = noise_window(noise.view(H, groups, size), cfg.loss_steps,
                                          cfg.noise_window, gen, cfg.noise_outside)
            noise = shared.reshape(H, b)
        if mean_branch and cfg.continuation == "policy":
            noise.view(noise.shape[0], groups, size, -1)[:, :, 0] = 0.0
        if cfg.probes:  # a probe and its twin follow the mean action
            noise.view(noise.shape[0], groups, size, -1)[:, :cfg.probes, size - 2:] = 0.0
        return noise, window

    def _roll(self, policy: GaussianPolicy, sim: BatchSim, noise: torch.Tensor,
              snapshot_at: np.ndarray, flip: tuple | None = None) -> tuple:
        """Roll the branches of ``sim`` ``horizon`` decisions with ``noise`` (``_noise``),
        in each probe's window (``flip``: ``flip_windows``) from its first saturated step on
        the command held at -mu of that step;
        at step ``loss_steps`` their states go to the snapshot simulator's
        ``snapshot_at``. Returns the raw observations (H, b, nobs), z and mu (H, b), the
        rewards (H, b), alive (H + 1, b) and the log std (per state: (H, b); gSDE: (L, b))."""
        cfg, H, b = self.cfg, self.cfg.horizon, sim.num_envs
        obs_np = sim.observe()
        raw = torch.empty(H, b, obs_np.shape[1])
        z = torch.empty(H, b)
        mu = torch.empty(H, b)
        rewards = np.empty((H, b))
        alive = np.ones((H + 1, b), dtype=bool)  # alive[t]: not terminated before step t
        sde = policy.arch["sde"]
        log_std = torch.empty(H, b) if policy.std_head is not None else policy.log_std.detach()
        if sde:
            every = cfg.sde_sample_freq or H
            features = torch.empty(H, b, noise.shape[-1])
        # a state-independent std: the noise's scale once, not an exp and a product a step
        spread = noise * torch.exp(log_std) if not sde and policy.std_head is None else None
        net = policy.c_mean_network() if cfg.c_rollout and spread is not None and flip is None \
            else None
        if net is not None:  # the loop below, in C: 2x faster (docs/grpo.md §2, §9 twelfth pass)
            last_act, spread_np, raw_np = np.zeros(b, np.float32), spread.numpy(), raw.numpy()
            for lo, hi in ((0, cfg.loss_steps), (cfg.loss_steps, H)):
                if lo < hi:
                    sim.roll_policy(*net, spread_np[lo:hi], raw_np[lo:hi], mu.numpy()[lo:hi],
                                    z.numpy()[lo:hi], rewards[lo:hi], alive[lo:hi + 1], last_act,
                                    lo > 0, u_max=policy.u_max, w_du=cfg.w_du,
                                    repeat=cfg.action_repeat)
                if hi == cfg.loss_steps:
                    self.snapshot.copy_envs(snapshot_at, sim, np.arange(b))
            return raw, z, mu, rewards, alive, log_std
        last_act = None
        if flip is not None:  # numpy views: a few numbers a step, where torch's calls cost more
            probe, opened, closed = flip
            held, flipping = np.zeros(len(probe), np.float32), np.zeros(len(probe), bool)
            mu_np, z_np = mu.numpy(), z.numpy()
            bound = cfg.saturated or PROBE_SATURATED
        for t in range(H):
            raw[t] = torch.from_numpy(obs_np)
            if sde:  # its log std: after the loop, in one call
                mu[t], features[t] = policy.sde_dist(policy.normalise(raw[t]))
                z[t] = mu[t] + (features[t] * noise[t // every]).sum(-1)
            elif spread is not None:
                mu[t], ls = policy.mu(policy.normalise(raw[t])), log_std
                z[t] = mu[t] + spread[t]
            else:
                mu[t], log_std[t] = policy.dist(policy.normalise(raw[t]))
                ls = log_std[t]
                z[t] = mu[t] + noise[t] * torch.exp(ls)
            if flip is not None and t < cfg.loss_steps:
                inside = (opened <= t) & (t < closed)
                m = mu_np[t, probe]
                log_sd = ls.numpy() if ls.numel() == 1 else ls.numpy()[probe]
                opens = inside & ~flipping & (np.abs(m) - 2.0 * np.exp(log_sd) > bound)  # saturated()
                held[opens] = -m[opens]
                flipping = (flipping | opens) & inside
                z_np[t, probe[flipping]] = held[flipping]
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
                self.snapshot.copy_envs(snapshot_at, sim, np.arange(b))
        if sde:
            log_std = sde_log_std(features[:cfg.loss_steps], policy.log_std.detach())  # (L, b)
        return raw, z, mu, rewards, alive, log_std

    def _two_stages(self, policy: GaussianPolicy, gen: torch.Generator,
                    queries: np.ndarray) -> tuple:
        """More branches where they disagree (``screen_group``): every query gets
        screen_group branches; the focus_starts queries whose returns spread most
        among those (ties in random order) get the remaining branches, the same
        number each. Both stages sample pi_old from the same start states, so each
        query's branches form one group. Returns ``_roll``'s arrays, stage 1's
        branches then stage 2's, and the group (query) of each branch."""
        cfg, n, g1 = self.cfg, self.cfg.num_starts, self.cfg.screen_group
        H, k = cfg.horizon, cfg.focus_starts
        extra = n * (cfg.group_size - g1) // k
        noise = self._noise(policy, n, g1, gen)[0]
        first = self._roll(policy, self.pool.branch(queries, g1, out=self.stages[0]), noise,
                           np.arange(n * g1))
        spread = discounted_returns(first[3].T.reshape(n, g1, H), cfg.gamma)[:, :, 0].std(
            axis=1, ddof=1)
        order = self.rng.permutation(n)
        focus = order[np.argsort(-spread[order], kind="stable")[:k]]
        noise = self._noise(policy, k, extra, gen, mean_branch=False)[0]
        second = self._roll(policy, self.pool.branch(queries[focus], extra, out=self.stages[1]),
                            noise, n * g1 + np.arange(k * extra))
        both = [torch.cat((a, b), dim=1) if isinstance(a, torch.Tensor)
                else np.concatenate((a, b), axis=1) for a, b in zip(first[:5], second[:5])]
        log_std = first[5] if first[5].dim() == 1 else torch.cat((first[5], second[5]), dim=1)
        group = np.concatenate((np.repeat(np.arange(n), g1), np.repeat(focus, extra)))
        return (*both, log_std, group)

    @torch.no_grad()
    def collect(self, policy: GaussianPolicy, gen: torch.Generator) -> Batch:
        started = time.perf_counter()
        cfg, n, g = self.cfg, self.cfg.num_starts, self.cfg.group_size
        B, H, L = n * g, cfg.horizon, cfg.loss_steps
        queries, weight = self._queries(policy)
        if cfg.screen_group:
            raw, z, mu, rewards, alive, log_std, group = self._two_stages(policy, gen, queries)
        else:
            sim = self.pool.branch(queries, g, out=self.group)
            noise, window = self._noise(policy, n, g, gen)
            flip = flip_windows(cfg.probes, g, L, self.rng) if cfg.probes else None
            raw, z, mu, rewards, alive, log_std = self._roll(policy, sim, noise, np.arange(B),
                                                             flip)
            group = np.repeat(np.arange(n), g)
        nobs = raw.shape[2]
        self.sim_steps += B * H * cfg.action_repeat
        # scores and advantages, per branch (B, L)
        if cfg.screen_group:
            rtg = discounted_returns(rewards.T, cfg.gamma)  # (B, H)
            flat_returns = rtg[:, 0]
            if cfg.reward_form == "outcome":
                adv = np.repeat(ragged_group_advantages(flat_returns, group, n, cfg.adv_scale,
                                                        batch_std=self.batch_std)[:, None],
                                L, axis=1)
            else:
                adv = ragged_group_advantages(rtg[:, :L], group, n, cfg.adv_scale,
                                              batch_std=self.batch_std)
            spread = group_moments(flat_returns, group, n)[1]
            returns = flat_returns[:n * cfg.screen_group].reshape(n, cfg.screen_group)
        else:
            if cfg.reward_form == "outcome":  # one product, not H vector steps (0.15 ms)
                flat_returns = self.discounts @ rewards
                returns = flat_returns.reshape(n, g)
            else:
                rtg = discounted_returns(rewards.T.reshape(n, g, H), cfg.gamma)  # (n, g, H)
                returns = rtg[:, :, 0]
                flat_returns = returns.reshape(B)
            if cfg.reward_form == "outcome":
                adv = np.repeat(group_advantages(returns, cfg.adv_scale,
                                                 batch_std=self.batch_std)[:, :, None], L, axis=2)
            else:
                adv = group_advantages(rtg[:, :, :L], cfg.adv_scale, batch_std=self.batch_std)
            if cfg.probes:  # the probe groups' samples are scored among themselves
                p = cfg.probes
                if cfg.reward_form == "outcome":
                    adv[:p, :g - 2] = group_advantages(returns[:p, :g - 2], cfg.adv_scale,
                                                       batch_std=self.batch_std)[:, :, None]
                else:
                    adv[:p, :g - 2] = group_advantages(rtg[:p, :g - 2, :L], cfg.adv_scale,
                                                       batch_std=self.batch_std)
                adv[:p, g - 2:] = 0.0
            if cfg.noise_window > 0:  # outside its window a step's noise is the group's own
                adv = adv * window.numpy()[:, None, :]
            adv = adv.reshape(B, L)
            spread = returns.std(axis=1, ddof=1)
        if weight is not None:
            adv = adv * weight[group][:, None]
        first = np.arange(n) * (cfg.screen_group or g)  # each group's first branch
        mask = np.ascontiguousarray(alive[:L].T, dtype=np.float32)  # (B, L)
        if cfg.continuation == "policy":
            mask[first] = 0.0  # the mean-action branch is not a sample of pi
        probe_mask = None
        probe_wins = 0.0
        if cfg.probes:  # a probe and its twin are not samples of pi either
            p, probes = cfg.probes, flip[0]  # each probe group's last branch; its twin before it
            mask[probes - 1] = mask[probes] = 0.0
            wins = returns[:p, g - 1] > returns[:p, g - 2]
            probe_wins = float(wins.mean())
            probe_mask = torch.zeros(B, L)
            won = probes[wins]
            probe_mask[won] = ((z[:L, won] != mu[:L, won]).T
                               & torch.from_numpy(alive[:L, won].T)).float()
        # continuation and fresh resets
        if cfg.screen_group:
            members = [np.flatnonzero(group == q) for q in range(n)]
            src = np.array([m[choose_continuation(flat_returns[m][None], cfg.continuation,
                                                  self.rng, cfg.softmax_temperature)[0]]
                            for m in members])
        else:
            src = first + choose_continuation(returns, cfg.continuation, self.rng,
                                              cfg.softmax_temperature)
            if cfg.probes:  # not from a probe or its twin
                src[:cfg.probes] = first[:cfg.probes] + choose_continuation(
                    returns[:cfg.probes, :g - 2], cfg.continuation, self.rng,
                    cfg.softmax_temperature)
        keep = np.zeros(n, dtype=bool)  # level replay: these stay to be queried again
        if cfg.query_replay:
            keep = (spread >= np.quantile(spread, 1.0 - cfg.query_replay)) & (spread > 0)
            self.replayed[queries] = np.where(keep, spread, np.nan)
        go = ~keep
        self.pool.copy_envs(queries[go], self.snapshot, src[go])
        state = self.pool.get_state()
        ended = ~alive[L][src] | (state["t"][queries] >= self.spec.max_steps)
        restart = (ended | (self.rng.random(n) < cfg.reset_prob)) & go
        if cfg.query_pool:
            self.scored.append((raw[0, first], spread))
        if restart.any():
            fresh = np.zeros(self.pool.num_envs, dtype=bool)
            fresh[queries[restart]] = True
            self.pool.reset(mask=fresh)
        # the loss steps, branch-major
        zl = z[:L].T.contiguous()
        mul = mu[:L].T.contiguous()
        log_std_old = log_std[:L].T.contiguous() if log_std.dim() == 2 else log_std.clone()
        logp_old = gaussian_log_prob(zl, mul, log_std_old)
        mask_t = torch.from_numpy(mask)
        # the entropy, a diagnostic, estimated on one branch in ENTROPY_STRIDE (0.2 ms on all)
        rows = diagnostic_rows(B, ENTROPY_STRIDE)
        logp_squashed = logp_old[rows] - log_tanh_jacobian(zl[rows], policy.u_max)
        sampled = mask_t  # the entropy estimate needs steps that drew noise: with noise_outside
        if cfg.noise_window > 0 and cfg.noise_outside == "mean":  # = mean, the windows' alone
            sampled = mask_t * window.repeat_interleave(g, 0)
        sampled = sampled[rows]
        entropy = -float((logp_squashed * sampled).sum() / sampled.sum().clamp(min=1.0))
        obs_l = None if self.shipped else policy.normalise(raw[:L].transpose(0, 1)).contiguous()
        everything = raw.reshape(H * B, nobs)
        adv_t = torch.from_numpy(adv).float()
        if cfg.saturated > 0:
            adv_t.masked_fill_(saturated(mul, log_std_old, cfg.saturated), 0.0)
        return Batch(obs=obs_l, z=zl, logp_old=logp_old, mu_old=mul, log_std_old=log_std_old,
                     adv=adv_t,
                     mask=mask_t, returns=returns,
                     entropy=entropy, raw_obs=None if self.shipped else everything,
                     obs_moments=RunningNorm.moments(everything),
                     raw_loss_obs=raw[:L].transpose(0, 1),
                     collect_s=time.perf_counter() - started, sim_steps=self.sim_steps,
                     probe_mask=probe_mask, probe_wins=probe_wins)


# =====================================================================
# Update.
# =====================================================================
KL_STRIDE = 8  # the diagnostic KL after an update: on one branch in 8


def grpo_update(policy: GaussianPolicy, ref: GaussianPolicy | None, opt: torch.optim.Optimizer,
                batch: Batch, cfg: GRPOConfig, eps_low: float, eps_high: float,
                gen: torch.Generator, average_gradients=None) -> dict:
    """``epochs`` passes of clipped-ratio (+ beta k3) steps over minibatches of branches.
    ``average_gradients(params)``, in data-parallel training, averages the
    gradients across processes before they are clipped; the gradients are
    then zeroed in place rather than dropped, so that they stay in the flat
    buffer it reduces (grpo_ctrl/distributed.py)."""
    B, L = batch.z.shape
    per_state = batch.log_std_old.dim() == 2
    grad_norms, clip_lo, clip_hi = [], [], []
    c = CGradient.of(policy, cfg, batch, ref)  # the default loss's gradient in one C call
    for _ in range(cfg.epochs):
        perm = torch.randperm(B, generator=gen)
        for idx in perm.chunk(cfg.minibatches):
            if c is not None:  # clipped in C, unless the ranks average the gradients first
                got = c.gradient(idx, cfg.loss_agg, eps_low, eps_high,
                                 cfg.max_grad_norm if average_gradients is None else 0.0)
                grad_norm, lo, hi = got["grad_norm"], got["clip_low"], got["clip_high"]
            else:
                mu, log_std = policy.dist(batch.obs[idx])
                log_std_old = batch.log_std_old[idx] if per_state else batch.log_std_old
                logp = gaussian_log_prob(batch.z[idx], mu, log_std)
                ratio = torch.exp(logp - batch.logp_old[idx])
                adv, mask = batch.adv[idx], batch.mask[idx]
                kl = (gaussian_kl(batch.mu_old[idx], log_std_old, mu, log_std)
                      if cfg.trust_region == "kl_mask" else None)
                per_step = -surrogate(cfg.trust_region, ratio, logp, adv, eps_low, eps_high,
                                      z=batch.z[idx], mu_old=batch.mu_old[idx],
                                      log_std_old=log_std_old, kl=kl, mask=mask,
                                      kl_bound=cfg.kl_target)
                if cfg.beta > 0 and ref is not None:
                    with torch.no_grad():
                        mu_ref, log_std_ref = ref.dist(ref.normalise(batch.raw_loss_obs[idx]))
                        logp_ref = gaussian_log_prob(batch.z[idx], mu_ref, log_std_ref)
                    per_step = per_step + cfg.beta * k3_kl(logp, logp_ref)
                loss = aggregate_loss(per_step, mask, cfg.loss_agg, L)
                if batch.probe_mask is not None:  # toward the flips that beat the mean action
                    loss = loss + cfg.probe_weight * (
                        batch.probe_mask[idx] * (mu - batch.z[idx]) ** 2
                    ).sum() / mask.sum().clamp(min=1.0)
                if cfg.w_smooth > 0:
                    loss = loss + cfg.w_smooth * mean_command_smoothness(
                        policy, batch.obs[idx], mu, mask, cfg.smooth_sigma, gen,
                        temporal=cfg.smooth_terms == "both")
                opt.zero_grad(set_to_none=average_gradients is None)
                loss.backward()
                grad_norm = None
                lo, hi = clip_fractions(ratio.detach(), adv, mask, eps_low, eps_high)
            if grad_norm is None or average_gradients is not None:
                if average_gradients is not None:
                    average_gradients(policy.parameters())
                grad_norm = float(torch.nn.utils.clip_grad_norm_(
                    policy.parameters(), cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf))
            grad_norms.append(grad_norm)
            adam_step(opt)
            with torch.no_grad():
                policy.log_std.clamp_(min=cfg.log_std_min)
            clip_lo.append(lo)
            clip_hi.append(hi)
    # How far the update moved, exactly: KL(pi_old || pi), KL(pi || pi_ref). The adaptive clip
    # steers by it, so it takes the whole batch; elsewhere it is a diagnostic and takes one
    # branch in KL_STRIDE (a forward pass over the whole batch was a fifth of the update's time)
    rows = diagnostic_rows(B, KL_STRIDE if cfg.trust_region != "adaptive" else 1)
    with torch.no_grad():
        if c is not None:
            mu, log_std = c.mean(torch.arange(B)[rows]), policy.log_std
        else:
            mu, log_std = policy.dist(batch.obs[rows])
        m = batch.mask[rows]
        n = m.sum().clamp(min=1.0)
        log_std_old = batch.log_std_old[rows] if per_state else batch.log_std_old
        kl_old = float((gaussian_kl(batch.mu_old[rows], log_std_old, mu, log_std) * m).sum() / n)
        kl_ref = 0.0
        if ref is not None:
            mu_ref, log_std_ref = ref.dist(ref.normalise(batch.raw_loss_obs[rows]))
            kl_ref = float((gaussian_kl(mu, log_std, mu_ref, log_std_ref) * m).sum() / n)
    return {"grad_norm": float(np.mean(grad_norms)), "clip_low": float(np.mean(clip_lo)),
            "clip_high": float(np.mean(clip_hi)), "kl_old": kl_old, "kl_ref": kl_ref}


# =====================================================================
# The trainer.
# =====================================================================
def adam(params, lr: float) -> torch.optim.Adam:
    """Adam, fused where this torch has a fused CPU kernel (2.4 and later): all the
    parameters in one kernel, 44 against 130 us a step at the gym default (two steps an
    iteration; docs/grpo.md §9, twelfth pass)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):  # older torch: CUDA only
        return torch.optim.Adam(params, lr=lr)


def adam_step(opt: torch.optim.Optimizer) -> None:
    """``opt.step()``; for fused Adam, its kernel called directly, as torch's own step
    calls it. The same arithmetic on the same state, so checkpoints and results do not
    change, without torch.optim's Python around it: 40 us a step when warm, 94-280 us
    in training, where the rollout before it leaves the caches cold; the direct call
    15 / 27 us (docs/grpo.md §9, fourteenth pass). torch.optim.Adam's step where the
    call does not apply: another optimiser or option, a first step (no state yet), a
    parameter without a gradient, a torch without the kernel."""
    group = opt.param_groups[0] if len(opt.param_groups) == 1 else {}
    params = group.get("params", [])
    states = [opt.state.get(p) for p in params]
    if (not isinstance(opt, torch.optim.Adam) or not group.get("fused") or group["amsgrad"]
            or group["maximize"] or group["weight_decay"] != 0
            or group.get("decoupled_weight_decay") or group["differentiable"]
            or not hasattr(torch, "_fused_adam_") or not all(states)
            or any(p.grad is None for p in params)):
        opt.step()
        return
    steps = [st["step"] for st in states]
    torch._foreach_add_(steps, 1)
    beta1, beta2 = group["betas"]
    torch._fused_adam_(params, [p.grad for p in params], [st["exp_avg"] for st in states],
                       [st["exp_avg_sq"] for st in states], [], steps, amsgrad=False,
                       lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=0.0,
                       eps=group["eps"], maximize=False, grad_scale=None, found_inf=None)


def make_policy(cfg: GRPOConfig, spec) -> GaussianPolicy:
    """The untrained policy a run of ``cfg`` on plant ``spec`` starts from."""
    return GaussianPolicy(spec.nobs, spec.u_max, cfg.hidden, cfg.layers, cfg.activation,
                          cfg.log_std_init, cfg.state_std, cfg.log_std_min, cfg.sde,
                          cfg.features, cfg.feature_scale)


class Trainer:
    """One GRPO run: policy, optimiser, reference policy, rollout pool.
    ``ranks``: this process's place in data-parallel training (default: the
    initialised torch.distributed group, or one process); it collects its
    share of the start states with its own seeds (grpo_ctrl/distributed.py)."""

    def __init__(self, cfg: GRPOConfig, system: str, preset: str, ranks: Ranks | None = None,
                 randomize: Randomization | None = None):
        check_config(cfg)
        # every iteration frees and allocates the same large tensors: keep the pages rather
        # than fault them in again (thousands of faults per iteration otherwise; heap.py)
        keep_freed_memory()
        self.ranks = ranks = ranks or Ranks.current()
        if cfg.overlap and ranks.world > 1:
            raise UserError("overlap and data-parallel training both want the spare cores: "
                            "set overlap = false with more than one process")
        if (cfg.query_pool or cfg.screen_group) and ranks.world > 1:
            raise UserError("query_pool and screen_group choose among one process's start "
                            "states: set them to 0 with more than one process")
        local = ranks.local_config(cfg)
        self.cfg, self.system, self.preset = cfg, system, preset
        self.randomize = randomize if randomize is not None else Randomization()
        torch.manual_seed(cfg.seed)
        self.gen = torch.Generator().manual_seed(ranks.seed(cfg.seed))
        self.rollout = GroupRollout(local, system, preset, ranks.seed(cfg.seed), ranks.batch_std,
                                    self.randomize)
        self.spec = self.rollout.spec
        self.policy = make_policy(cfg, self.spec)
        self.opt = adam(self.policy.parameters(), cfg.lr)
        self.ref = copy.deepcopy(self.policy) if cfg.beta > 0 else None
        self.eval_seed = 1_000_003 + cfg.seed  # the same start states at every evaluation
        self.iteration = 0
        self.eps_scale = 1.0
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
            torch.set_num_threads(1)
            return self.rollout.collect(self.policy, self.gen)
        batch = self._collector.next_batch(self.policy)
        self.rollout.sim_steps = batch.sim_steps
        batch.obs = self.policy.normalise(batch.raw_loss_obs).contiguous()
        return batch

    def close(self) -> None:
        """Stop the collector process (overlap), if there is one."""
        if self._collector is not None:
            self._collector.close()
            self._collector = None

    def step(self, lead=None) -> dict:
        """One iteration: collect groups, update, refresh stats. Returns metrics.
        ``lead()``: values rank 0 shares with every rank on the batch
        statistics' message, returned under "lead" (Ranks.reduce_batch)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        batch = self._batch()
        t1 = time.perf_counter()
        torch.set_num_threads(cfg.threads)
        eps_low, eps_high = cfg.eps_low * self.eps_scale, cfg.eps_high * self.eps_scale
        eps_low = min(eps_low, 0.95)
        stats = grpo_update(self.policy, self.ref, self.opt, batch, cfg, eps_low, eps_high,
                            self.gen, self.ranks.average_gradients if self.ranks.world > 1
                            else None)
        returns = batch.returns
        # the whole batch's normaliser statistics and diagnostics, the same on every rank
        stats = self.ranks.reduce_batch(self.policy.obs_norm, batch.raw_obs, {
            "branch_return": float(returns.mean()),
            "group_reward_std": float(returns.std(axis=1, ddof=1).mean()),
            "zero_spread": zero_spread_fraction(returns), "entropy": batch.entropy,
            **({"probe_wins": batch.probe_wins} if cfg.probes else {}), **stats},
            lead, moments=batch.obs_moments)
        if cfg.trust_region == "adaptive":
            self.eps_scale = adapt_clip(self.eps_scale, stats["kl_old"], cfg.kl_target)
        self.policy.refresh_norm()
        if self._collector is not None:  # for the batch after the one it is collecting
            self._collector.updated(self.policy)
        self.iteration += 1
        if self.ref is not None and self.iteration % cfg.ref_refresh == 0:
            self.ref = copy.deepcopy(self.policy)
        return {"iteration": self.iteration, **stats,
                "log_std": float(self.policy.log_std.detach()) if batch.log_std_old.dim() == 1
                else float((batch.log_std_old * batch.mask).sum() / batch.mask.sum()),
                "lr": self.opt.param_groups[0]["lr"],
                "eps_low": eps_low, "eps_high": eps_high,
                "sim_steps": batch.sim_steps * self.ranks.world,
                "rollout_s": batch.collect_s, "rollout_wait_s": t1 - t0,
                "update_s": time.perf_counter() - t1}

    def set_progress(self, fraction: float) -> None:
        """Learning rate decays from lr to lr_end * lr over the run (fraction 0 to 1 of
        the budget): fine steps at the end polish the final policy (docs/grpo.md §4).
        Linearly, or with ``lr_decay`` exponential geometrically, which spends more of
        the run at small steps (near the optimum a step of 5e-4 already loses it,
        docs/grpo.md §9, seventh pass)."""
        frac = min(max(fraction, 0.0), 1.0)
        if self.cfg.lr_decay == "exponential":
            scale = self.cfg.lr_end ** frac
        else:
            scale = 1.0 - (1.0 - self.cfg.lr_end) * frac
        for group in self.opt.param_groups:
            group["lr"] = self.cfg.lr * scale

    def evaluate(self) -> tuple[float, float]:
        """(mean return, success rate) of the deterministic policy, on plants
        drawn as in training."""
        from grpo_ctrl.closed_loop import evaluate
        ep = evaluate(self.policy.controller(self.spec), self.cfg.eval_episodes, self.eval_seed,
                      randomize=self.randomize)
        return float(ep.returns.mean()), float(ep.success.mean())

    # resume support: what beyond the policy a run needs to continue
    def state(self) -> dict:
        return {"optimizer": self.opt.state_dict(), "iteration": self.iteration,
                "eps_scale": self.eps_scale, "torch_rng": self.gen.get_state(),
                "sim_steps": self.rollout.sim_steps * self.ranks.world}

    def load_state(self, policy: GaussianPolicy, st: dict) -> None:
        self.policy.load_state_dict(policy.state_dict())
        self.policy.obs_norm.load_state_dict(policy.obs_norm.state_dict())
        self.policy.refresh_norm()
        self.opt.load_state_dict(st["optimizer"])
        self.iteration, self.eps_scale = int(st["iteration"]), float(st["eps_scale"])
        self.rollout.sim_steps = int(st["sim_steps"]) // self.ranks.world
        if self.ranks.is_main:  # the checkpoint holds rank 0's noise stream
            self.gen.set_state(st["torch_rng"])
        else:
            self.gen.manual_seed(self.ranks.seed(self.cfg.seed) + 7919 * self.iteration)
        if self.ref is not None:
            self.ref = copy.deepcopy(self.policy)
        # fresh trajectories for the rest of the run, from a seed tied to the iteration
        self.rollout.restart(self.ranks.seed(self.cfg.seed) + 7919 * self.iteration)
