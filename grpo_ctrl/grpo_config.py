"""GRPO's hyperparameters: one dataclass, one home.

Every field carries its one-line documentation (and, for a choice, its allowed
values) in its metadata; ``grpo-ctrl train --help``, the config-file check
and ``check_config`` all read them from there. The dataclass defaults are the
gym pendulum's but for its discount and advantage scale; what each preset
changes lives in ``grpo_ctrl/presets.py`` (``SYSTEM_DEFAULTS`` here).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from grpo_ctrl.errors import UserError
from grpo_ctrl.option_types import MAX_SECONDS, MAX_SEED, describe_range, in_range
from grpo_ctrl.presets import (LONG_BUDGET_DEFAULTS, TRAINING_DEFAULTS,  # noqa: F401
                              long_budget_defaults, training_defaults)


def two_cores() -> bool:
    """Whether this process may run on two cores or more (overlap's default:
    on one core the collector would only take turns with the update)."""
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except AttributeError:  # no affinity on this platform
        return (os.cpu_count() or 1) >= 2


def knob(default, doc: str, choices: tuple[str, ...] | None = None, *, low=None, high=None,
         above=None):
    """A config field with its documentation and its allowed values attached:
    ``choices``, or a range ``[low, high]`` (``above``: a strict lower bound)."""
    return field(default=default, metadata={"doc": doc, "choices": choices, "low": low,
                                            "high": high, "above": above})


@dataclass
class GRPOConfig:
    # rollouts
    num_starts: int = knob(32, "start states (GRPO \"queries\") per iteration", low=1, high=2**20)
    group_size: int = knob(8, "branches cloned from each start state (G)", low=2, high=2**16)
    horizon: int = knob(64, "decisions each branch is rolled out", low=1, high=2**20)
    loss_steps: int = knob(32, "first decisions of a branch in the loss; the rest: "
                           "look-ahead", low=1, high=2**20)
    action_repeat: int = knob(1, "control steps each training action is held (1 = every "
                              "step)", low=1, high=10_000)
    gamma: float = knob(0.98, "discount of rewards within a branch", above=0.0, high=1.0)
    reset_prob: float = knob(0.1, "chance per iteration that a trajectory restarts from a "
                             "reset", low=0.0, high=1.0)
    continuation: str = knob("random", "branch a trajectory continues from",
                             choices=("greedy", "softmax", "random", "policy"))
    noise_corr: float = knob(0.0, "correlation of a branch's exploration noise from one decision "
                             "to the next (AR(1); 0 = independent), so that branches try "
                             "different strategies, not only jitter", low=0.0, high=0.999)
    noise_window: int = knob(0, "branches of a group share their exploration noise but in one "
                             "random window of this many loss steps, which alone carry the "
                             "advantage (common random numbers; 0 = independent noise)",
                             low=0, high=2**20)
    antithetic: bool = knob(False, "mirrored exploration: branch j + G/2 of a group draws the "
                            "negated noise of branch j (antithetic pairs, as in evolution "
                            "strategies): in a pair's gradient on the mean the noise's even-order "
                            "(curvature) effects on the return cancel; needs an even "
                            "group_size")
    query_pool: int = knob(0, "trajectories in the pool, of which num_starts are queried each "
                           "iteration, drawn with probability rising with the spread (std) of "
                           "their last group's returns (prioritised queries; 0 = num_starts: "
                           "every trajectory every iteration)", low=0, high=2**20)
    query_floor: float = knob(0.5, "with query_pool: the share of the draw spread uniformly over "
                              "the pool, the rest in proportion to the last return std",
                              above=0.0, high=1.0)
    query_is: float = knob(0.0, "with query_pool: exponent of the importance weight "
                           "(uniform / drawn probability) on a group's advantages (0 = none, "
                           "1 = the uniform pool's expected gradient)", low=0.0, high=1.0)
    query_replay: float = knob(0.0, "with query_pool: the share of each iteration's queries, "
                               "those whose returns spread most, that keep their start state "
                               "to be queried again, scored by their own spread (level "
                               "replay; 0 = every query moves on)", low=0.0, high=1.0)
    screen_group: int = knob(0, "two stages at equal branches: every query gets this many "
                             "branches first, then the focus_starts queries whose returns "
                             "spread most get the remaining num_starts x (group_size - this) "
                             "(0 = one stage of group_size)", low=0, high=2**16)
    focus_starts: int = knob(8, "with screen_group: the queries re-branched in the second stage",
                             low=1, high=2**20)
    probes: int = knob(0, "groups per iteration whose last two branches test a flipped command "
                       "(policy iteration's test where Gaussian noise cannot reach: a saturated "
                       "command): both follow the mean action, one flips its command at the first "
                       "saturated step of a random window of the loss steps and holds it to the "
                       "window's end; where it returns more than its twin, mu is regressed "
                       "toward that command (0 = off)", low=0, high=2**20)
    probe_weight: float = knob(1.0, "with probes: weight of the regression toward a winning flip, "
                               "per loss step, beside the GRPO loss", low=0.0, high=1e6)
    noise_outside: str = knob("shared", "with a noise_window, what the steps outside it take: "
                              "branch 0's noise (shared), or none (mean: the deployed action, "
                              "look-ahead included, so a group's return differences score the "
                              "window by the deployed policy's continuation)",
                              choices=("shared", "mean"))
    softmax_temperature: float = knob(1.0, "on group-normalised returns, for softmax continuation",
                                      above=0.0, high=1e6)
    w_du: float = knob(0.0, "action-rate penalty: each decision loses w_du (du / u_max)^2, "
                       "for smooth commands on a real motor", low=0.0, high=1e6)
    w_smooth: float = knob(0.0, "weight of the mean command's smoothness in the loss (CAPS): "
                           "its squared change between decisions and under observation noise",
                           low=0.0, high=1e6)
    smooth_sigma: float = knob(0.05, "std of the observation perturbation of w_smooth, in "
                               "normalised units", above=0.0, high=1e3)
    smooth_terms: str = knob("both", "the terms w_smooth weighs: both (the mean command's "
                             "change between decisions and its gain), or spatial (the gain "
                             "alone: a push may still be answered at once)",
                             choices=("both", "spatial"))
    # advantages and loss
    reward_form: str = knob("outcome", "outcome (branch return) or reward_to_go (per step)",
                            choices=("outcome", "reward_to_go"))
    adv_scale: str = knob("group", "divide centred rewards by the std of the group, the batch, "
                          "or nothing", choices=("group", "batch", "none"))
    saturated: float = knob(0.0, "zero the advantage of loss steps whose command is saturated "
                            "whatever the noise: |mu| - 2 sigma > this before the tanh (3: "
                            "within 0.5 % of full scale; 0 = off)", low=0.0, high=1e3)
    loss_agg: str = knob("token", "grpo (per branch, then mean), token (all steps), dr_grpo",
                         choices=("grpo", "token", "dr_grpo"))
    eps_low: float = knob(0.2, "ratio clip below: 1 - eps_low", above=0.0, high=0.999)
    eps_high: float = knob(0.28, "ratio clip above: 1 + eps_high (DAPO clip-higher)", above=0.0,
                           high=100.0)
    trust_region: str = knob("fixed", "fixed clip; adaptive: scale eps to hold KL(old||new) "
                             "at kl_target; sapo, cispo, dcpo, kl_mask: grpo_ctrl/trust_region.py",
                             choices=("fixed", "adaptive", "sapo", "cispo", "dcpo", "kl_mask"))
    kl_target: float = knob(0.01, "target KL(pi_old || pi) per update (adaptive), or the "
                            "bound of a branch's mean KL (kl_mask)", above=0.0, high=100.0)
    beta: float = knob(0.0, "weight of the k3 KL penalty to the reference policy (0 = off)",
                       low=0.0, high=1e6)
    ref_refresh: int = knob(20, "iterations between copies of pi into pi_ref", low=1, high=2**31)
    # optimisation
    epochs: int = knob(1, "passes over each batch of groups (mu)", low=1, high=10_000)
    minibatches: int = knob(2, "minibatches per epoch, split by branch", low=1, high=2**20)
    lr: float = knob(2e-3, "Adam learning rate at the start", above=0.0, high=10.0)
    lr_end: float = knob(0.05, "learning rate at the end of the budget, a fraction of lr",
                         low=0.0, high=1.0)
    lr_decay: str = knob("linear", "how the learning rate falls from lr to lr_end x lr: "
                         "linearly, or exponential (geometrically: the same factor every "
                         "second, more of the run at small steps)",
                         choices=("linear", "exponential"))
    max_grad_norm: float = knob(1.0, "gradient clipping by global norm (0 = none)", low=0.0,
                                high=1e9)
    # policy
    hidden: int = knob(64, "width of each hidden layer", low=1, high=2**16)
    layers: int = knob(2, "number of hidden layers", low=1, high=64)
    activation: str = knob("relu", "hidden activation (tanh is slow on this CPU)",
                           choices=("relu", "elu", "tanh"))
    features: int = knob(0, "random Fourier features of the normalised observation fed to the "
                         "first layer with it: sin(x B + b), B and b drawn once and fixed "
                         "(0 = none, the observation alone)", low=0, high=2**16)
    feature_scale: float = knob(1.0, "std of the Fourier features' frequencies B", above=0.0,
                                high=1e4)
    log_std_init: float = knob(0.0, "initial log std of the pre-squash Gaussian", low=-20.0,
                               high=5.0)
    log_std_min: float = knob(-2.5, "noise floor: log std is clamped at or above this", low=-20.0,
                              high=5.0)
    state_std: bool = knob(False, "exploration std per state: log std = the learned number plus "
                           "an output of the network's last hidden layer (the deployed "
                           "controller uses the mean only)")
    sde: bool = knob(False, "state-dependent exploration (gSDE): a branch's noise is its own "
                     "random linear function of the last hidden layer (sde_features), so it "
                     "explores the same way each time it passes a state; one log std per "
                     "feature, log_std_init and log_std_min apply to each and bound the per-step "
                     "std (the deployed controller uses the mean only)")
    sde_sample_freq: int = knob(0, "with sde: decisions between fresh draws of a branch's "
                                "exploration matrix (0 = one draw for its whole horizon)",
                                low=0, high=2**20)
    # run
    seed: int = knob(0, "seeds the simulator and torch", low=0, high=MAX_SEED)
    time_budget: float = knob(30.0, "seconds of training wall time (0 = no limit)", low=0.0,
                              high=MAX_SECONDS)
    iterations: int = knob(0, "stop after this many iterations (0 = no limit)", low=0,
                           high=2**40)
    # up to 1e12: scripts and tests say "never" with 1e9
    eval_every: float = knob(1.0, "training seconds between evaluations (best checkpoint; 0 = "
                              "every iteration)", low=0.0, high=1e12)
    eval_episodes: int = knob(100, "episodes per evaluation (fixed starts, mean action)", low=1,
                              high=10**6)
    deploy: str = knob("best", "the policy best.pt holds, the one eval, export and run use: "
                       "best (the best evaluation's), final (the one training ends with, "
                       "at the end of the learning-rate schedule) or calm (the latest of the "
                       "last calm_window's policies whose command chatters no more than "
                       "swing-up + LQR's on nominal plants; grpo_ctrl/deploy.py)",
                       choices=("best", "final", "calm"))
    calm_window: float = knob(0.25, "deploy calm: the share of the run, at its end, whose "
                              "policies are candidates", above=0.0, high=1.0)
    calm_every: int = knob(10, "deploy calm: a candidate every this many iterations", low=1,
                           high=2**20)
    threads: int = knob(1, "torch threads for the update (rollouts use one: small ops)", low=1,
                       high=1024)
    overlap: bool = field(default_factory=two_cores, metadata={
        "doc": "collect the next batch on a second core during the update", "choices": None,
        "low": None, "high": None, "above": None})
    c_rollout: bool = knob(True, "run the rollout's network, noise, squash and simulator steps "
                           "in one C loop (csrc/policy_rollout.c) where the policy allows: ReLU, "
                           "a state-independent std, no flip probes; false: torch, a step at a "
                           "time")
    c_update: bool = knob(True, "compute each minibatch's gradient in one C call "
                          "(csrc/policy_update.c) where the policy and loss allow: ReLU, a "
                          "state-independent std, the fixed or adaptive clip, beta 0, no probes "
                          "or w_smooth; false: torch autograd")


# field name -> allowed values, for the fields that are a choice
CHOICES = {f.name: f.metadata["choices"] for f in fields(GRPOConfig) if f.metadata.get("choices")}

# What each plant changes from the dataclass defaults, and what a long run changes on top:
# grpo_ctrl/presets.py, the one home of per-preset settings.
SYSTEM_DEFAULTS = TRAINING_DEFAULTS


def default_config(system: str, preset: str, time_budget: float = 0.0) -> GRPOConfig:
    """The plant's defaults (``SYSTEM_DEFAULTS``), and for a ``time_budget`` of at least a
    plant's ``LONG_BUDGET_DEFAULTS`` threshold, those on top."""
    return GRPOConfig(**training_defaults(system, preset, time_budget))


def check_config(cfg: GRPOConfig) -> None:
    """UserError naming the first bad field: each field's type and allowed
    values (from its metadata), then what fields demand of each other, then
    whether the run fits in this machine's memory."""
    for f in fields(GRPOConfig):
        value, m = getattr(cfg, f.name), f.metadata
        want = {"int": int, "float": float, "str": str, "bool": bool}[f.type]
        if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            raise UserError(f"{f.name} must be a {want.__name__}, got {value!r}")
        if m["choices"] and value not in m["choices"]:
            raise UserError(f"{f.name} = {value!r} is not one of {list(m['choices'])}")
        if want in (int, float) and not in_range(value, m["low"], m["high"], m["above"]):
            wanted = describe_range(want, m["low"], m["high"], m["above"])
            raise UserError(f"{f.name} must be {wanted}, got {value!r}")
    if cfg.loss_steps > cfg.horizon:
        raise UserError(f"loss_steps ({cfg.loss_steps}) cannot exceed horizon ({cfg.horizon})")
    if cfg.noise_window > cfg.loss_steps:
        raise UserError(f"noise_window ({cfg.noise_window}) cannot exceed loss_steps "
                        f"({cfg.loss_steps})")
    if cfg.query_pool and cfg.query_pool < cfg.num_starts:
        raise UserError(f"query_pool ({cfg.query_pool}) must hold at least num_starts "
                        f"({cfg.num_starts}) trajectories (or be 0: off)")
    if cfg.query_replay and not cfg.query_pool:
        raise UserError("query_replay keeps states in a larger pool: set query_pool too")
    if cfg.screen_group:
        extra = cfg.num_starts * (cfg.group_size - cfg.screen_group)
        if not 2 <= cfg.screen_group < cfg.group_size:
            raise UserError(f"screen_group ({cfg.screen_group}) must be at least 2 and below "
                            f"group_size ({cfg.group_size}), or 0: off")
        if cfg.focus_starts > cfg.num_starts or extra % cfg.focus_starts:
            raise UserError(f"focus_starts ({cfg.focus_starts}) must be at most num_starts and "
                            f"divide the {extra} second-stage branches evenly")
        if cfg.noise_window:
            raise UserError("screen_group and noise_window do not combine: set one to 0")
    if cfg.probes and (cfg.probes > cfg.num_starts or cfg.group_size < 4 or cfg.screen_group
                       or cfg.sde):
        raise UserError(f"probes ({cfg.probes}) takes the last two branches of that many groups: "
                        f"at most num_starts ({cfg.num_starts}), group_size at least 4 (is "
                        f"{cfg.group_size}), without screen_group or sde")
    if cfg.noise_outside != "shared" and cfg.noise_window == 0:
        raise UserError(f"noise_outside = {cfg.noise_outside} needs a noise_window: the loss "
                        f"steps that sample (noise_window = loss_steps: all of them, the "
                        f"look-ahead on the mean)")
    if cfg.sde and (cfg.state_std or cfg.noise_corr > 0 or cfg.noise_window > 0):
        raise UserError("sde draws its own noise: leave state_std, noise_corr and noise_window "
                        "at their defaults (off) with it")
    if cfg.lr_decay == "exponential" and cfg.lr_end == 0:
        raise UserError("lr_decay = exponential needs lr_end above 0 (a geometric decay "
                        "never reaches 0): set lr_end, e.g. 0.02")
    if cfg.antithetic and (cfg.group_size % 2 or cfg.screen_group):
        raise UserError(f"antithetic pairs each branch with a mirrored one: group_size "
                        f"({cfg.group_size}) must be even, without screen_group")
    if cfg.minibatches > cfg.num_starts * cfg.group_size:
        raise UserError(f"minibatches ({cfg.minibatches}) exceeds the number of branches "
                        f"({cfg.num_starts * cfg.group_size})")
    if cfg.overlap and cfg.threads > 1:
        raise UserError("overlap already puts the rollouts on the second core: set threads = 1")
    need, have = memory_estimate(cfg), physical_memory()
    if have and need > have / 2:
        raise UserError(f"num_starts x group_size x horizon = {cfg.num_starts} x {cfg.group_size} "
                        f"x {cfg.horizon} with hidden {cfg.hidden} x {cfg.layers} layers needs "
                        f"about {need / 2**30:.3g} GiB, more than half of this machine's "
                        f"{have / 2**30:.3g} GiB; make them smaller")


def memory_estimate(cfg: GRPOConfig, nobs: int = 8) -> int:
    """Bytes a run needs, roughly (within a factor of ~2, on the high side):
    the rollout's per-step buffers (twice with overlap), the update's
    activations, the weights with Adam's moments and the simulators. ``nobs``:
    the widest plant's observation."""
    branches = cfg.num_starts * cfg.group_size
    steps = branches * cfg.horizon
    rollout = steps * (3 * 4 * nobs + 40) * (2 if cfg.overlap else 1)
    batch = branches * cfg.loss_steps * (2 * 4 * nobs + 24)
    activations = (3 * 4 * (cfg.hidden * cfg.layers + cfg.features) * branches * cfg.loss_steps
                   // cfg.minibatches)
    weights = 4 * 4 * (cfg.hidden * cfg.hidden * cfg.layers
                       + cfg.hidden * (nobs + cfg.features + 2) + nobs * cfg.features)
    simulators = 3 * 256 * branches
    eval_ = cfg.eval_episodes * (4 * cfg.hidden * cfg.layers + 256)
    return rollout + batch + activations + weights + simulators + eval_


def physical_memory() -> int:
    """Bytes of RAM (0 where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
