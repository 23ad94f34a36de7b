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
from grpo_ctrl.presets import (FINETUNE_DEFAULTS, LONG_BUDGET_DEFAULTS,  # noqa: F401
                              TRAINING_DEFAULTS, long_budget_defaults, training_defaults)


def two_cores() -> bool:
    """Whether this process may run on two cores or more (overlap's default:
    on one core the collector would only take turns with the update)."""
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except AttributeError:  # no affinity on this platform
        return (os.cpu_count() or 1) >= 2


def knob(default, doc: str, choices: tuple[str, ...] | None = None, *, low=None, high=None,
         above=None, section: str = "", default_factory=None):
    """A config field with its documentation, its allowed values (``choices``, or a range
    ``[low, high]``; ``above``: a strict lower bound) and its ``section`` of
    ``grpo-ctrl train --help`` attached. ``default_factory``: a default computed when the
    config is made, instead of ``default``."""
    metadata = {"doc": doc, "choices": choices, "low": low, "high": high, "above": above,
                "section": section}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _section(name: str):
    """``knob`` for the fields of one section."""
    return lambda *args, **kwargs: knob(*args, section=name, **kwargs)


# the sections of GRPOConfig, in the order --help lists them
SECTIONS = ("rollout", "advantage and loss", "optimisation", "policy", "run", "deployment",
            "backend")
_rollout, _loss, _optim, _policy, _run, _deploy, _backend = map(_section, SECTIONS)

# loss_type: the per-step objective (grpo_ctrl/trust_region.py)
LOSS_TYPES = ("clip", "adaptive_clip", "sapo")


@dataclass
class GRPOConfig:
    # rollout
    num_starts: int = _rollout(32, "start states (GRPO \"queries\") per iteration", low=1,
                               high=2**20)
    group_size: int = _rollout(8, "branches cloned from each start state (G)", low=2, high=2**16)
    horizon: int = _rollout(64, "decisions each branch is rolled out", low=1, high=2**20)
    loss_steps: int = _rollout(32, "first decisions of a branch in the loss; the rest: "
                               "look-ahead", low=1, high=2**20)
    action_repeat: int = _rollout(1, "control steps each training action is held (1 = every "
                                  "step)", low=1, high=10_000)
    gamma: float = _rollout(0.98, "discount of rewards within a branch", above=0.0, high=1.0)
    reset_prob: float = _rollout(0.1, "chance per iteration that a trajectory restarts from a "
                                 "reset", low=0.0, high=1.0)
    continuation: str = _rollout("random", "branch a trajectory continues from: the best "
                                 "(greedy), one drawn by its group-normalised return "
                                 "(softmax), any (random), or branch 0, which follows the "
                                 "mean action and is left out of the loss (mean)",
                                 choices=("greedy", "softmax", "random", "mean"))
    w_du: float = _rollout(0.0, "action-rate penalty: each decision loses w_du (du / u_max)^2, "
                           "for smooth commands on a real motor", low=0.0, high=1e6)
    costs_from: float = _rollout(0.0, "fraction of the budget before which the reward's costs "
                                 "of effort (command, motor power, velocities) are scaled by "
                                 "costs_early: a swing-up found first, then made economical "
                                 "(0 = on from the start)", low=0.0, high=1.0)
    costs_early: float = _rollout(0.01, "scale of the costs of effort before costs_from: 0.1 "
                                  "for a smoother, cheaper swing-up (the pendubot's simulation "
                                  "score 0.51 -> 0.63 over 3 seeds, its robustness score 0.72 "
                                  "-> 0.60; docs/double_pendulum.md); above 1 they weigh more "
                                  "than the plant's own", low=0.0, high=1e3)
    starts: str = _rollout("preset", "where the training trajectories start: the preset's start "
                           "box (preset), or anywhere (wide): every angle over a whole turn "
                           "around it, every angular velocity within 1 rad/s; evaluation keeps "
                           "the preset's. wide for a policy that recovers from any state (the "
                           "pendubot's robustness score 0.60 -> 0.87 over 3 seeds, each "
                           "higher; its simulation score 0.63 -> 0.56; "
                           "docs/double_pendulum.md)",
                           choices=("preset", "wide"))
    # advantage and loss
    adv_scale: str = _loss("group", "divide centred returns by the std of the group, the "
                           "batch, or nothing", choices=("group", "batch", "none"))
    saturated: float = _loss(0.0, "zero the advantage of loss steps whose command is "
                             "saturated whatever the noise: |mu| - 2 sigma > this before the "
                             "tanh (3: within 0.5 % of full scale; 0 = off)", low=0.0,
                             high=1e3)
    loss_type: str = _loss("clip", "per-step objective: PPO's ratio clip (clip), the clip "
                           "scaled to hold KL(old||new) at kl_target (adaptive_clip), or "
                           "SAPO's soft gate (sapo); grpo_ctrl/trust_region.py",
                           choices=LOSS_TYPES)
    eps_low: float = _loss(0.2, "ratio clip below: 1 - eps_low", above=0.0, high=0.999)
    eps_high: float = _loss(0.28, "ratio clip above: 1 + eps_high (DAPO clip-higher)",
                            above=0.0, high=100.0)
    kl_target: float = _loss(0.01, "adaptive_clip: the KL(pi_old || pi) per update it holds",
                             above=0.0, high=100.0)
    beta: float = _loss(0.0, "weight of the k3 KL penalty to the reference policy (0 = off)",
                        low=0.0, high=1e6)
    ref_refresh: int = _loss(20, "iterations between copies of pi into pi_ref", low=1,
                             high=2**31)
    loss_agg: str = _loss("token", "grpo (per branch, then mean), token (all steps), dr_grpo",
                          choices=("grpo", "token", "dr_grpo"))
    w_smooth: float = _loss(0.0, "weight of the mean command's smoothness in the loss (CAPS): "
                            "its squared change between decisions and under observation "
                            "noise", low=0.0, high=1e6)
    smooth_sigma: float = _loss(0.05, "std of the observation perturbation of w_smooth, in "
                                "normalised units", above=0.0, high=1e3)
    smooth_terms: str = _loss("both", "the terms w_smooth weighs: both (the mean command's "
                              "change between decisions and its gain), or spatial (the gain "
                              "alone: a push may still be answered at once)",
                              choices=("both", "spatial"))
    # optimisation
    epochs: int = _optim(1, "passes over each batch of groups (mu)", low=1, high=10_000)
    minibatches: int = _optim(2, "minibatches per epoch, split by branch", low=1, high=2**20)
    lr: float = _optim(2e-3, "Adam learning rate at the start", above=0.0, high=10.0)
    lr_end: float = _optim(0.05, "learning rate at the end of the budget, a fraction of lr "
                           "(linear decay)", low=0.0, high=1.0)
    max_grad_norm: float = _optim(1.0, "gradient clipping by global norm (0 = none)", low=0.0,
                                  high=1e9)
    # policy
    hidden: int = _policy(64, "width of each hidden layer", low=1, high=2**16)
    layers: int = _policy(2, "number of hidden layers", low=1, high=64)
    activation: str = _policy("relu", "hidden activation (tanh is slow on this CPU)",
                              choices=("relu", "elu", "tanh"))
    features: int = _policy(0, "random Fourier features of the normalised observation fed to "
                            "the first layer with it: sin(x B + b), B and b drawn once and "
                            "fixed (0 = none, the observation alone)", low=0, high=2**16)
    feature_scale: float = _policy(1.0, "std of the Fourier features' frequencies B",
                                   above=0.0, high=1e4)
    log_std_init: float = _policy(0.0, "initial log std of the pre-squash Gaussian",
                                  low=-20.0, high=5.0)
    log_std_min: float = _policy(-2.5, "noise floor: log std is clamped at or above this",
                                 low=-20.0, high=5.0)
    catch: float = _policy(0.0, "the LQR about upright takes over inside x'Px < catch, P "
                           "its cost-to-go (grpo_ctrl/baselines/lqr.py, LQRCatch), in "
                           "training's simulator and in the deployed controller; the policy "
                           "learns to bring the plant there (0 = never; 100: the acrobot's "
                           "preset; 300: its robustness score 0.59 -> 0.68 over 3 seeds, "
                           "its simulation score 0.54 -> 0.47; docs/double_pendulum.md)",
                           low=0.0, high=1e12)
    # run
    init: str = _run("", "a run folder or checkpoint whose trained policy this run starts "
                     "from (fine-tuning): its network and its observation normaliser, kept "
                     "fixed; the noise starts at log_std_init, and the plant's fine-tuning "
                     "defaults apply (the acrobot: whole episodes from hanging, "
                     "docs/double_pendulum.md)")
    seed: int = _run(0, "seeds the simulator and torch", low=0, high=MAX_SEED)
    time_budget: float = _run(30.0, "seconds of training wall time (0 = no limit)", low=0.0,
                              high=MAX_SECONDS)
    iterations: int = _run(0, "stop after this many iterations (0 = no limit)", low=0,
                           high=2**40)
    # up to 1e12: scripts and tests say "never" with 1e9
    eval_every: float = _run(1.0, "training seconds between evaluations (0 = every "
                             "iteration)", low=0.0, high=1e12)
    eval_episodes: int = _run(100, "episodes per evaluation (fixed starts, mean action)",
                              low=1, high=10**6)
    # deployment
    deploy: str = _deploy("best", "the policy deployed.pt holds, the one eval, export and run "
                          "use: best (the best evaluation's), final (the one training ends "
                          "with, at the end of the learning-rate schedule), calm (the "
                          "latest of the last calm_window's policies whose command chatters "
                          "no more than swing-up + LQR's on nominal plants; "
                          "grpo_ctrl/deploy.py) or score (the double pendulum: the evaluated "
                          "policy whose benchmark run has the best RealAI score v2; the "
                          "pendubot with costs_early 0.1 and eval_every 2: 0.641-0.648 on 5 "
                          "seeds, against 0.531-0.622 by the return; docs/double_pendulum.md)",
                          choices=("best", "final", "calm", "score"))
    calm_window: float = _deploy(0.25, "deploy calm: the share of the run, at its end, whose "
                                 "policies are candidates", above=0.0, high=1.0)
    calm_every: int = _deploy(10, "deploy calm: a candidate every this many iterations",
                              low=1, high=2**20)
    # backend
    threads: int = _backend(1, "torch threads for the update (rollouts use one: small ops)",
                            low=1, high=1024)
    overlap: bool = _backend(None, "collect the next batch on a second core during the update",
                             default_factory=two_cores)
    c_rollout: bool = _backend(True, "run the rollout's network, noise, squash and simulator "
                               "steps in one C loop (csrc/policy_rollout.c) where the policy "
                               "allows: ReLU; false: torch, a step at a time")
    c_update: bool = _backend(True, "compute each minibatch's gradient in one C call "
                              "(csrc/policy_update.c) where the policy and loss allow: ReLU, "
                              "the clip or adaptive clip, beta 0, no w_smooth; false: torch "
                              "autograd")


# field name -> allowed values, for the fields that are a choice
CHOICES = {f.name: f.metadata["choices"] for f in fields(GRPOConfig) if f.metadata.get("choices")}

# Fields the research record (docs/research.md; tag research-2026-12 holds their code) found
# no better than the defaults, each with its value that meant "off": a config file or
# checkpoint that gives one this value reads as before, any other value is refused.
REMOVED = {"noise_corr": 0.0, "noise_window": 0, "noise_outside": "shared",
           "antithetic": False, "query_pool": 0, "query_floor": 0.5, "query_is": 0.0,
           "query_replay": 0.0, "screen_group": 0, "focus_starts": 8, "probes": 0,
           "probe_weight": 1.0, "state_std": False, "sde": False, "sde_sample_freq": 0,
           "reward_form": "outcome", "lr_decay": "linear", "softmax_temperature": 1.0}
# old name -> new name, and old value -> new value, of config files and checkpoints
RENAMED = {"trust_region": "loss_type"}
OLD_VALUES = {"loss_type": {"fixed": "clip", "adaptive": "adaptive_clip"},
              "continuation": {"policy": "mean"}}
# loss types the research record refuted (trust_region's old values)
REMOVED_VALUES = {"loss_type": ("cispo", "dcpo", "kl_mask")}


def upgrade_config(data: dict, source: str) -> tuple[dict, list[str]]:
    """A config table of any earlier version in today's names: renamed fields and values
    mapped (each with a one-line note, returned), removed fields at their "off" value
    dropped; UserError naming a removed field, or value, that asks for what is gone."""
    out, notes = {}, []
    for old_name, old_value in data.items():
        if old_name in REMOVED:
            if old_value != REMOVED[old_name]:
                raise UserError(f"{source}: {old_name} = {old_value!r} was removed (no better "
                                f"than the default in the research record, docs/research.md; "
                                f"the tag research-2026-12 still has it): drop {old_name}")
            continue
        name, value = RENAMED.get(old_name, old_name), old_value
        if isinstance(value, str) and value in REMOVED_VALUES.get(name, ()):
            raise UserError(f"{source}: {old_name} = {value!r} was removed (no better than "
                            f"the default in the research record, docs/research.md; the tag "
                            f"research-2026-12 still has it); choose one of "
                            f"{list(CHOICES[name])}")
        if isinstance(value, str):
            value = OLD_VALUES.get(name, {}).get(value, value)
        if (name, value) != (old_name, old_value):
            notes.append(f"{source}: {old_name} = {old_value!r} is now {name} = {value!r}")
        out[name] = value
    return out, notes

# What each plant changes from the dataclass defaults, and what a long run changes on top:
# grpo_ctrl/presets.py, the one home of per-preset settings.
SYSTEM_DEFAULTS = TRAINING_DEFAULTS


def default_config(system: str, preset: str, time_budget: float = 0.0,
                   init: str = "") -> GRPOConfig:
    """The plant's defaults (``SYSTEM_DEFAULTS``), and for a ``time_budget`` of at least a
    plant's ``LONG_BUDGET_DEFAULTS`` threshold, those on top; for a run that starts from
    the trained policy ``init``, the plant's ``FINETUNE_DEFAULTS`` on top instead."""
    return GRPOConfig(**training_defaults(system, preset, time_budget, bool(init)), init=init)


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
