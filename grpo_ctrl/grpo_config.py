"""GRPO's hyperparameters: one dataclass, one home.

Every field carries its one-line documentation (and, for a choice, its allowed
values) in its metadata; ``grpo-ctrl train --help``, the config-file check
and ``check_config`` all read them from there. The dataclass defaults are the
gym pendulum's; ``SYSTEM_DEFAULTS`` holds what each other plant changes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from grpo_ctrl.errors import UserError


def two_cores() -> bool:
    """Whether this process may run on two cores or more (overlap's default:
    on one core the collector would only take turns with the update)."""
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except AttributeError:  # no affinity on this platform
        return (os.cpu_count() or 1) >= 2


def knob(default, doc: str, choices: tuple[str, ...] | None = None):
    """A config field with its documentation (and allowed values) attached."""
    return field(default=default, metadata={"doc": doc, "choices": choices})


@dataclass
class GRPOConfig:
    # rollouts
    num_starts: int = knob(32, "start states (GRPO \"queries\") per iteration")
    group_size: int = knob(8, "branches cloned from each start state (G)")
    horizon: int = knob(64, "decisions each branch is rolled out")
    loss_steps: int = knob(32, "first decisions of a branch in the loss; the rest: "
                           "look-ahead")
    action_repeat: int = knob(1, "control steps each training action is held (1 = every "
                              "step)")
    gamma: float = knob(0.98, "discount of rewards within a branch")
    reset_prob: float = knob(0.1, "chance per iteration that a trajectory restarts from a "
                             "reset")
    continuation: str = knob("random", "branch a trajectory continues from",
                             choices=("greedy", "softmax", "random", "policy"))
    softmax_temperature: float = knob(1.0, "on group-normalised returns, for softmax continuation")
    w_du: float = knob(0.0, "action-rate penalty: each decision loses w_du (du / u_max)^2, "
                       "for smooth commands on a real motor")
    # advantages and loss
    reward_form: str = knob("outcome", "outcome (branch return) or reward_to_go (per step)",
                            choices=("outcome", "reward_to_go"))
    adv_scale: str = knob("group", "divide centred rewards by the std of the group, the batch, "
                          "or nothing", choices=("group", "batch", "none"))
    loss_agg: str = knob("token", "grpo (per branch, then mean), token (all steps), dr_grpo",
                         choices=("grpo", "token", "dr_grpo"))
    eps_low: float = knob(0.2, "ratio clip below: 1 - eps_low")
    eps_high: float = knob(0.28, "ratio clip above: 1 + eps_high (DAPO clip-higher)")
    trust_region: str = knob("fixed", "fixed clip; adaptive: scale eps to hold KL(old||new) "
                             "at kl_target; sapo, cispo, dcpo, kl_mask: grpo_ctrl/trust_region.py",
                             choices=("fixed", "adaptive", "sapo", "cispo", "dcpo", "kl_mask"))
    kl_target: float = knob(0.01, "target KL(pi_old || pi) per update (adaptive), or the "
                            "bound of a branch's mean KL (kl_mask)")
    beta: float = knob(0.0, "weight of the k3 KL penalty to the reference policy (0 = off)")
    ref_refresh: int = knob(20, "iterations between copies of pi into pi_ref")
    # optimisation
    epochs: int = knob(1, "passes over each batch of groups (mu)")
    minibatches: int = knob(2, "minibatches per epoch, split by branch")
    lr: float = knob(2e-3, "Adam learning rate at the start")
    lr_end: float = knob(0.05, "learning rate at the end of the budget, a fraction of lr")
    max_grad_norm: float = knob(1.0, "gradient clipping by global norm")
    # policy
    hidden: int = knob(64, "width of each hidden layer")
    layers: int = knob(2, "number of hidden layers")
    activation: str = knob("relu", "hidden activation (tanh is slow on this CPU)",
                           choices=("relu", "elu", "tanh"))
    log_std_init: float = knob(0.0, "initial log std of the pre-squash Gaussian")
    log_std_min: float = knob(-2.5, "noise floor: log std is clamped at or above this")
    # run
    seed: int = knob(0, "seeds the simulator and torch")
    time_budget: float = knob(30.0, "seconds of training wall time (0 = no limit)")
    iterations: int = knob(0, "stop after this many iterations (0 = no limit)")
    eval_every: float = knob(1.0, "training seconds between evaluations (best checkpoint)")
    eval_episodes: int = knob(100, "episodes per evaluation (fixed starts, mean action)")
    threads: int = knob(1, "torch threads for the update (rollouts use one: small ops)")
    overlap: bool = field(default_factory=two_cores, metadata={
        "doc": "collect the next batch on a second core during the update", "choices": None})


# field name -> allowed values, for the fields that are a choice
CHOICES = {f.name: f.metadata["choices"] for f in fields(GRPOConfig) if f.metadata.get("choices")}

# Per-plant defaults: the dataclass defaults are the gym pendulum's.
SYSTEM_DEFAULTS = {
    ("pendulum", "gym"): {},
    # 200 Hz control: hold training actions for 4 steps (50 Hz decisions, 2 s horizon)
    # w_du: smooth commands for a real motor (docs/robustness.md)
    ("pendulum", "rig"): {"action_repeat": 4, "horizon": 100, "loss_steps": 50, "gamma": 0.99,
                          "time_budget": 60.0, "eval_every": 10.0, "eval_episodes": 50,
                          "w_du": 0.02},
    ("cartpole", "gym"): {"horizon": 128, "loss_steps": 64, "gamma": 0.99, "time_budget": 30.0,
                          "eval_every": 5.0},
    ("cartpole", "swingup"): {"horizon": 160, "loss_steps": 80, "gamma": 0.99,
                              "time_budget": 60.0, "eval_every": 5.0, "eval_episodes": 50},
    # 500 Hz control: hold each training action for 5 steps (100 Hz decisions), so that
    # exploration noise is not averaged away within the pendulum's time constant; the
    # deployed controller still acts every step. Without it: 0 % success after 300 s.
    # lr 1.5e-3: with overlap, 100 % success on both seeds tried (2e-3: 97 % and 100 %)
    ("furuta", "qube-servo2"): {"action_repeat": 5, "horizon": 120, "loss_steps": 60,
                                "gamma": 0.99, "lr": 1.5e-3, "time_budget": 120.0,
                                "eval_every": 20.0, "eval_episodes": 50, "w_du": 0.02},
}


def default_config(system: str, preset: str) -> GRPOConfig:
    return GRPOConfig(**SYSTEM_DEFAULTS.get((system, preset), {}))


def check_config(cfg: GRPOConfig) -> None:
    """UserError naming the first bad field."""
    for name, allowed in CHOICES.items():
        if getattr(cfg, name) not in allowed:
            raise UserError(f"{name} = {getattr(cfg, name)!r} is not one of {list(allowed)}")
    positive = ("num_starts", "group_size", "horizon", "loss_steps", "action_repeat", "epochs",
                "minibatches", "hidden", "layers", "eval_episodes", "threads", "lr", "ref_refresh")
    for name in positive:
        if not getattr(cfg, name) > 0:
            raise UserError(f"{name} must be positive, got {getattr(cfg, name)!r}")
    if cfg.loss_steps > cfg.horizon:
        raise UserError(f"loss_steps ({cfg.loss_steps}) cannot exceed horizon ({cfg.horizon})")
    if cfg.group_size < 2:
        raise UserError("group_size must be at least 2: advantages compare branches of a group")
    if cfg.minibatches > cfg.num_starts * cfg.group_size:
        raise UserError(f"minibatches ({cfg.minibatches}) exceeds the number of branches "
                        f"({cfg.num_starts * cfg.group_size})")
    if not 0.0 < cfg.gamma <= 1.0 or not 0.0 <= cfg.reset_prob <= 1.0:
        raise UserError("gamma must lie in (0, 1] and reset_prob in [0, 1]")
    if not (cfg.eps_low > 0 and cfg.eps_high > 0 and cfg.eps_low < 1):
        raise UserError("eps_low must lie in (0, 1) and eps_high be positive")
    for name in ("beta", "lr_end", "time_budget", "iterations", "eval_every", "max_grad_norm",
                 "kl_target", "softmax_temperature", "w_du"):
        if getattr(cfg, name) < 0:
            raise UserError(f"{name} must be non-negative, got {getattr(cfg, name)!r}")
    if cfg.overlap and cfg.threads > 1:
        raise UserError("overlap already puts the rollouts on the second core: set threads = 1")
