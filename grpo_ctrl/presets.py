"""What Python knows of each plant preset, in one place.

A preset's physics (parameters, limits, start box, noise) lives in C
(``csrc/plants.c``); everything else Python tunes per plant is here, as plain
data: the training defaults, the randomisation ranges, the swing-up tuning
and the identification settings. Adding a preset touches its C entry and,
where it differs from the generic defaults, this file. The modules that use
the tables build their objects from them (``grpo_config.default_config``,
``randomize.default_randomization``, ``baselines.swingup.make_swingup_lqr``,
``sysid.model_for``); this module imports none of them.

The evidence behind every value is in ``docs/research.md`` (sections named
below as §N) and ``docs/robustness.md``.
"""
from __future__ import annotations

import math

# ---------------------------------------------------------------- training
# What each preset changes from GRPOConfig's defaults (the gym pendulum's but
# for its discount and advantage scale).
_DOUBLE_PENDULUM_TRAINING = {"action_repeat": 5, "horizon": 120, "loss_steps": 60, "gamma": 0.99,
                              "lr": 1.5e-3, "log_std_init": -0.5, "time_budget": 300.0,
                              "eval_every": 20.0, "eval_episodes": 20, "w_du": 0.02,
                              "w_smooth": 0.3, "costs_from": 0.65}
TRAINING_DEFAULTS = {
    # gamma 0.99 with unscaled centred returns (research §2, §3); the noise floor and start
    # (§6); saturated steps without advantage (§6); 64 Fourier features at lr 1.5e-3 (§10);
    # hidden 32 (§11); the final policy deployed, not the best-evaluated one (§14)
    ("pendulum", "gym"): {"gamma": 0.99, "adv_scale": "none", "log_std_min": -0.5,
                          "log_std_init": -0.5, "saturated": 3.0, "features": 64,
                          "feature_scale": 3.0, "lr": 1.5e-3, "hidden": 32,
                          "deploy": "final"},
    # 200 Hz control held 4 steps (50 Hz decisions); smooth commands (w_du, w_smooth) and the
    # calm deployed policy for a real motor (research §15, robustness.md §3)
    ("pendulum", "rig"): {"action_repeat": 4, "horizon": 100, "loss_steps": 50, "gamma": 0.99,
                          "time_budget": 60.0, "eval_every": 10.0, "eval_episodes": 50,
                          "w_du": 0.1, "w_smooth": 0.1, "smooth_terms": "spatial",
                          "deploy": "calm"},
    # RealAIGym's benchmark (docs/realaigym.md): the gym pendulum's network and noise, decisions
    # at 20 Hz as there (5 control steps of 10 ms held), 3.2 s of look-ahead
    ("pendulum", "realaigym"): {"action_repeat": 5, "horizon": 64, "loss_steps": 32,
                                "gamma": 0.99, "adv_scale": "none", "log_std_min": -0.5,
                                "log_std_init": -0.5, "saturated": 3.0, "features": 64,
                                "feature_scale": 3.0, "lr": 1.5e-3, "hidden": 32,
                                "time_budget": 120.0, "eval_every": 10.0, "eval_episodes": 1},
    ("cartpole", "gym"): {"horizon": 128, "loss_steps": 64, "gamma": 0.99, "time_budget": 30.0,
                          "eval_every": 5.0},
    ("cartpole", "swingup"): {"horizon": 160, "loss_steps": 80, "gamma": 0.99,
                              "time_budget": 60.0, "eval_every": 5.0, "eval_episodes": 50},
    # 500 Hz control held 5 steps (100 Hz decisions: 0 % success without), lr 1.5e-3 and
    # log std from -0.5, smooth commands (research §15)
    ("furuta", "qube-servo2"): {"action_repeat": 5, "horizon": 120, "loss_steps": 60,
                                "gamma": 0.99, "lr": 1.5e-3, "log_std_init": -0.5,
                                "time_budget": 120.0,
                                "eval_every": 20.0, "eval_episodes": 50, "w_du": 0.02,
                                "w_smooth": 0.3},
    # 500 Hz held 5 steps (100 Hz decisions) and smooth commands as the Furuta's; the reward's
    # costs of effort (the leaderboard score's, plant_double.h) on from 65 % of the budget: the
    # swing-up is found first (docs/double_pendulum.md: pendubot RealAI score 0.26 with the
    # height reward alone, 0.41-0.59 over 3 seeds with the costs from 65 %)
    ("double_pendulum", "pendubot"): _DOUBLE_PENDULUM_TRAINING,
    # the acrobot finds no balance of its own: the LQR catches it inside x'Px < 100, the costs
    # at 10 % throughout (docs/double_pendulum.md: RealAI score 0 without; 0.52-0.56 over 4
    # seeds with the catch)
    ("double_pendulum", "acrobot"): {**_DOUBLE_PENDULUM_TRAINING, "catch": 100.0,
                                     "costs_early": 0.1, "costs_from": 1.0},
}

# A run that starts from a trained policy (``GRPOConfig.init``) takes these on top of its
# preset's defaults. The acrobot's: whole 10 s episodes from hanging, the benchmark's one start
# (1,000 decisions, all in the loss, undiscounted), 4 x 32 branches each iteration; the costs of
# effort at 2.5 times the plant's (0.75 of the score's ratios), so a branch's return trades time
# against effort nearly as the score does; small steps (lr 5e-5, log std -2.5) that keep the
# swing-up it found; 2,000 iterations, as much as two runs of 1,000 one after the other
# (docs/double_pendulum.md, research §19)
FINETUNE_DEFAULTS = {
    ("double_pendulum", "acrobot"): {"horizon": 1000, "loss_steps": 1000, "gamma": 1.0,
                                     "reset_prob": 1.0, "num_starts": 4, "group_size": 32,
                                     "minibatches": 4, "lr": 5e-5, "lr_end": 0.1,
                                     "log_std_init": -2.5, "log_std_min": -4.0,
                                     "w_smooth": 3.0, "costs_early": 2.5,
                                     "costs_from": 1.0, "time_budget": 0.0,
                                     "iterations": 2000, "eval_episodes": 1},
}

# For a run of at least this many seconds, these replace a preset's training defaults (where
# the command line and the config file leave them): gamma 0.995 and 64 starts (research §12)
LONG_BUDGET_DEFAULTS = {
    ("pendulum", "gym"): (120.0, {"gamma": 0.995, "num_starts": 64}),
}


def training_defaults(system: str, preset: str, time_budget: float = 0.0,
                      init: bool = False) -> dict:
    """The preset's ``TRAINING_DEFAULTS``, with its ``LONG_BUDGET_DEFAULTS`` on top where
    ``time_budget`` reaches their threshold, or, for a run that starts from a trained
    policy (``init``), its ``FINETUNE_DEFAULTS`` where it has them."""
    key = (system, preset)
    on_top = (FINETUNE_DEFAULTS[key] if init and key in FINETUNE_DEFAULTS
              else long_budget_defaults(system, preset, time_budget))
    return {**TRAINING_DEFAULTS.get(key, {}), **on_top}


def long_budget_defaults(system: str, preset: str, time_budget: float) -> dict:
    """The preset's ``LONG_BUDGET_DEFAULTS`` where ``time_budget`` reaches their threshold."""
    seconds, longer = LONG_BUDGET_DEFAULTS.get((system, preset), (math.inf, {}))
    return dict(longer) if time_budget >= seconds else {}


# ---------------------------------------------------------------- randomisation
# What a real rig trains on (``randomize.Randomization`` fields; robustness.md §1-2 gives
# the reasons). The gym presets have no entry: they stay Gymnasium's environments exactly.
RANDOMIZATION = {
    ("pendulum", "rig"): dict(
        params=0.35, delay=(0, 3), motor_k=(0.4, 1.0), torque_noise=(0.0, 0.03),
        offset=0.01, push_rate=2.0, push=(0.0, 2.0), push_steps=10,
        scale={"m": (0.5, 1.5), "l": (0.5, 1.5)}, absolute={"fc": (0.0, 0.012)},
        noise_std={"theta": 0.002, "theta_dot": 0.05}),
    # RealAIGym's robustness categories (docs/realaigym.md): their sensitivity draws
    # (p + U(0, 0.1)) U(0.5, 1.5) of m, l, b, fc and the inertia, their disturbances are
    # up to 2 N m held for 1 s; without these, 19 % of random starts reach upright
    ("pendulum", "realaigym"): dict(
        scale={"m": (0.5, 1.75), "l": (0.5, 1.8), "inertia": (0.5, 2.5)},
        absolute={"b": (0.05, 0.3), "fc": (0.045, 0.29)},
        push_rate=0.3, push=(0.0, 1.0), push_steps=50),
    ("furuta", "qube-servo2"): dict(
        params=0.35, delay=(0, 3), motor_k=(0.4, 1.0), torque_noise=(0.0, 0.02),
        offset=0.01, push_rate=0.2, push=(0.0, 0.1), push_steps=10,
        noise_std={"theta": 0.002, "alpha": 0.002, "theta_dot": 0.05, "alpha_dot": 0.05}),
}

# ---------------------------------------------------------------- swing-up
# ``baselines.swingup.SwingUpParams`` fields, tuned on the batched simulator;
# `grpo-ctrl baselines` reports the result.
SWINGUP = {
    ("pendulum", "gym"): dict(k_energy=50.0, energy_margin=0.0, region_level=3.0),
    ("pendulum", "rig"): dict(k_energy=50.0, energy_margin=0.02, region_level=10.0),
    # the best RealAI score of a small grid (docs/realaigym.md)
    ("pendulum", "realaigym"): dict(k_energy=1.0, energy_margin=0.05, region_level=1.0),
    # Gymnasium's CartPole ends at 12 degrees: LQR must own all of that
    ("cartpole", "gym"): dict(k_energy=10.0, accel_limit=5.0, centre_freq=1.0,
                              centre_damping=0.7, energy_margin=0.02, region_level=100.0),
    ("cartpole", "swingup"): dict(k_energy=10.0, accel_limit=5.0, centre_freq=1.0,
                                  centre_damping=0.7, energy_margin=0.02, region_level=10.0),
    ("furuta", "qube-servo2"): dict(k_energy=1e4, accel_limit=50.0, centre_freq=3.0,
                                    energy_margin=0.02, region_level=10.0),
}

# ---------------------------------------------------------------- LQR
# State and input weights of the LQR about upright where the task's reward is not a quadratic
# cost (``baselines.lqr.task_weights``): the double pendulum's height reward. RealAIGym's own
# LQR weights for design C.1 (data/controller_parameters/design_C.1/model_1.1/<robot>/lqr/
# controller_par.csv), state order (theta1, theta2, theta1_dot, theta2_dot).
_ACROBOT_LQR = dict(Q=(0.97, 0.93, 0.39, 0.26), R=0.11)
_PENDUBOT_LQR = dict(Q=(1.92, 1.92, 0.3, 0.3), R=0.82)
LQR_WEIGHTS = {
    ("double_pendulum", "acrobot"): _ACROBOT_LQR,
    ("double_pendulum", "acrobot-real"): _ACROBOT_LQR,
    ("double_pendulum", "pendubot"): _PENDUBOT_LQR,
    ("double_pendulum", "pendubot-real"): _PENDUBOT_LQR,
}

# ---------------------------------------------------------------- identification
# Per plant (every preset of a plant shares its fit; docs/sysid.md): the parameters the fit
# solves for, those it takes as known, and how it filters and refines.
SYSID = {
    "pendulum": dict(
        names=("m", "l", "b", "fc", "offset"),
        lows=(1e-6, 1e-6, 0.0, 0.0, -math.inf),
        floors=(1e-3, 1e-3, 1e-3, 1e-3, 1e-2),  # finite-difference steps' floors
        negligible=(1e-4, 1e-4, 1e-4, 1e-4),   # standard errors below this are no warning
        cutoff_hz=8.0,            # Butterworth cutoff of the derivative filter
        fd_step=1e-4,             # relative finite-difference step of the refinement
        window_s=1.0,             # simulation-error windows
        long_window_s=None,       # no second, long-window stage (1 s windows fit within 1.2 %)
        known_names=("g",),
        positive=("m", "l"),      # a least-squares answer without these is no plant
        scale_names=()),
    "furuta": dict(
        names=("km", "lr", "jr", "dr", "lp", "jp", "dp", "offset"),
        lows=(1e-6, 1e-6, 0.0, 0.0, 1e-6, 0.0, 0.0, -math.inf),
        floors=None,              # the preset's values (and 1e-2 for the offset)
        negligible=None,          # 1 % of the floors
        cutoff_hz=15.0,           # the arm under its holding loop moves faster than the rod
        fd_step=1e-3,             # a larger step: dr and dp barely move the angles
        window_s=2.0,             # the dampings act slowly (2 s windows halved the worst
                                  # dr and dp errors of 1 s ones on simulated 40 s logs)
        long_window_s=math.inf,   # then each piece one window (docs/sysid.md)
        known_names=("g", "mp", "rm", "mr"),
        positive=("km", "lr", "lp"),
        # the equations are homogeneous in (jr + mp lr^2, mp lp^2 / 4, mp lp lr / 2,
        # jp + mp lp^2 / 4, mp g lp / 2, km / rm, km^2 / rm + dr, dp): angles and voltage fix
        # them up to one scale, which a weighed mass and a measured resistance set
        scale_names=("mp", "rm")),
}
