"""RealAIGym's double pendulum benchmark (acrobot and pendubot): the RealAI
score v2 of a trajectory, and runs of a controller on our plant scored by it.

Our own code of the published definition (DFKI underactuated lab,
``double_pendulum``, BSD 3-clause: ``src/python/double_pendulum/analysis/
leaderboard.py`` with ``score_version="v2"``, the weights and normalisers of
``leaderboard/<robot>/simulation_v2/calculate_leaderboard_score.py`` and
``leaderboard/<robot>/real_hardware_v2/create_leaderboard.py``).

The trajectory is their recording: samples ``k = 0 .. N-1`` at times
``t_k``, the state ``x_k`` and the torque ``tau_k`` applied from it (their
simulator records the start state and the state after each step; their CSV
keeps as many rows as there are torques). Criteria, sums over
``k < N - 1`` with ``dt_k = t_{k+1} - t_k``:

================  ============================================  ==================
criterion         from the trajectory                           normaliser sim/real
================  ============================================  ==================
swingup_time      the time of the first sample of the last run  20 s / 20 s
                  of samples with the end effector above
                  0.9 (l1 + l2), walking back from sample N - 2
energy            sum_j sum_k |(q_j,k+1 - q_j,k) tau_j,k|        60 J / 60 J
tau_cost          sum_k |tau_k|^2 dt_k                           20 / 100 N^2 m^2 s
tau_smoothness    sum_j std_k (tau_j,k+1 - tau_j,k)              0.1 / 4 N m
velocity_cost     sum_k |qd_k|^2 dt_k                            400 / 400 rad^2/s
================  ============================================  ==================

    score = success * (1 - 1/5 sum_c tanh(pi c / n_c)),

success: the swing-up time lies before the last sample's time (and the
trajectory reaches 99 % of the 10 s). The pi inside tanh is in their code,
not in their published pages. Their walk back starts at sample N - 2 and
stops at sample 1: the last sample never counts, and a pendulum up from the
very first sample is timed from the second.

Angles: ours, shoulder zero UPRIGHT (``theta1``), elbow relative
(``theta2``), counter-clockwise positive. Theirs: shoulder zero hanging,
``q1 = theta1 + pi``; the same elbow; the same torque signs. The criteria
use angle differences and the end effector's height, so the convention does
not change a score; ``from_realaigym`` converts their CSVs.

Robustness v2 (``robustness``; ``leaderboard/<robot>/robustness_v2/
benchmark_controller.py``, ``analysis/benchmark.py``, ``benchmark_scores.py``):
722 runs from hanging, each judged on its final state (0.35 rad, 1 rad/s of
upright), in six categories whose shares of successes are averaged: model
parameters one at a time, velocity noise and torque noise (21 values x 10
runs, a value counting where more than half succeed), torque response,
measurement delay, torque pulses (docs/double_pendulum.md, Robustness v2).
"""
from __future__ import annotations

import gzip
import math
from dataclasses import dataclass

import numpy as np

SYSTEM = "double_pendulum"
CRITERIA = ("swingup_time", "energy", "tau_cost", "tau_smoothness", "velocity_cost")
UNITS = {"swingup_time": "s", "energy": "J", "tau_cost": "N^2 m^2 s",
         "tau_smoothness": "N m", "velocity_cost": "rad^2/s"}
# weight 1 on each of the five criteria (max_tau and integ_tau have weight 0 in v2)
NORMALISERS = {
    "simulation": {"swingup_time": 20.0, "energy": 60.0, "tau_cost": 20.0,
                   "tau_smoothness": 0.1, "velocity_cost": 400.0},
    "real_hardware": {"swingup_time": 20.0, "energy": 60.0, "tau_cost": 100.0,
                      "tau_smoothness": 4.0, "velocity_cost": 400.0},
}
HEIGHT_FRACTION = 0.9   # the end effector above 0.9 (l1 + l2) counts as up
T_FINAL = 10.0
# design C.1's link lengths (the end effector's reach)
L1, L2 = 0.2, 0.3

# the tops of the leaderboards (their CSVs, 2025-09 snapshot)
PUBLISHED_TOPS = {
    ("acrobot", "simulation_v2"): ("History-SAC", 0.655),
    ("pendubot", "simulation_v2"): ("History-SAC", 0.682),
    ("acrobot", "robustness_v2"): ("History-SAC", 0.751),
    ("pendubot", "robustness_v2"): ("AR-EAPO", 0.913),
    ("acrobot", "real_hardware_v2"): ("iLQR-TVLQR", 0.592),
    ("pendubot", "real_hardware_v2"): ("MC-PILCO", 0.598),
}

# the simulation v2 tops' criteria as their pages show them (CRITERIA's order)
PUBLISHED_SIMULATION_TOP = {"acrobot": (1.0, 8.08, 1.8, 0.01, 88.5),
                            "pendubot": (1.15, 7.67, 2.36, 0.007, 62.07)}


@dataclass(frozen=True)
class Trajectory:
    """One recorded run: ``t (N,)``, ``q (N, 2)`` ours (shoulder zero upright,
    elbow relative), ``qd (N, 2)``, ``tau (N, 2)`` applied to each joint."""
    t: np.ndarray
    q: np.ndarray
    qd: np.ndarray
    tau: np.ndarray

    @classmethod
    def of(cls, t, q, qd, tau, actuated: int | None = None) -> "Trajectory":
        """From arrays; ``tau`` may be the actuated joint's alone ``(N,)``, then
        ``actuated`` (0 shoulder, 1 elbow) says which."""
        t = np.asarray(t, dtype=float)
        q, qd = (np.asarray(a, dtype=float).reshape(len(t), 2) for a in (q, qd))
        tau = np.asarray(tau, dtype=float)
        if tau.ndim == 1:
            if actuated not in (0, 1):
                raise ValueError("a torque of one joint needs actuated = 0 or 1")
            both = np.zeros((len(t), 2))
            both[:, actuated] = tau
            tau = both
        if tau.shape != (len(t), 2):
            raise ValueError(f"tau must have shape ({len(t)},) or ({len(t)}, 2), got {tau.shape}")
        return cls(t, q, qd, tau)


def end_effector_height(q, l1: float = L1, l2: float = L2) -> np.ndarray:
    """Height of the end effector above the shoulder, q ours (zero upright)."""
    q = np.asarray(q, dtype=float)
    return l1 * np.cos(q[..., 0]) + l2 * np.cos(q[..., 0] + q[..., 1])


def swingup_time(tr: Trajectory, l1: float = L1, l2: float = L2) -> float:
    """Their "height" swing-up time with has_to_stay (see the module's note)."""
    if tr.t[-1] < 0.99 * T_FINAL:
        return math.inf
    up = end_effector_height(tr.q, l1, l2) > HEIGHT_FRACTION * (l1 + l2)
    index = len(tr.t) - 1
    for i in range(len(up) - 2, 0, -1):
        if not up[i]:
            break
        index = i
    return float(tr.t[index])


def criteria(tr: Trajectory, l1: float = L1, l2: float = L2) -> dict:
    """The five criteria of score v2 and success."""
    dt = np.diff(tr.t)
    tau, qd = tr.tau[:-1], tr.qd[:-1]
    c = {"swingup_time": swingup_time(tr, l1, l2),
         "energy": float(np.sum(np.abs(np.diff(tr.q, axis=0) * tau))),
         "tau_cost": float(np.sum(np.sum(tau * tau, axis=1) * dt)),
         "tau_smoothness": float(np.sum(np.std(np.diff(tr.tau, axis=0), axis=0))),
         "velocity_cost": float(np.sum(np.sum(qd * qd, axis=1) * dt))}
    c["success"] = bool(c["swingup_time"] < tr.t[-1])
    return c


def score(c: dict, leaderboard: str = "simulation") -> float:
    """RealAI score v2 of criteria ``c`` with a leaderboard's normalisers."""
    if leaderboard not in NORMALISERS:
        raise ValueError(f"unknown leaderboard {leaderboard!r}; choose one of "
                         f"{sorted(NORMALISERS)}")
    if not c["success"]:
        return 0.0
    n = NORMALISERS[leaderboard]
    return float(1.0 - sum(np.tanh(np.pi * c[k] / n[k]) for k in CRITERIA) / len(CRITERIA))


def evaluate(tr: Trajectory, leaderboard: str = "simulation") -> dict:
    """Criteria, success and score of one trajectory."""
    c = criteria(tr)
    c["score"] = score(c, leaderboard)
    return c


def from_realaigym(csv_path) -> Trajectory:
    """A trajectory CSV of theirs (``save_trajectory``): the measured state
    (``pos_meas*``, ``vel_meas*``; else ``pos*``, ``vel*``) and the commanded
    torque (``tau_con*``; else ``tau*``), the shoulder turned to ours. A
    ``.gz`` file is read through gzip."""
    opener = gzip.open if str(csv_path).endswith(".gz") else open
    with opener(csv_path, "rt") as f:
        header = f.readline().strip().split(",")
    data = np.loadtxt(csv_path, delimiter=",", skiprows=1, ndmin=2)
    col = {name: data[:, i] for i, name in enumerate(header)}

    def pick(*names):
        for group in names:
            if all(n in col for n in group):
                return np.column_stack([col[n] for n in group])
        raise ValueError(f"{csv_path}: none of the columns {names}")
    x = pick(("pos_meas1", "pos_meas2", "vel_meas1", "vel_meas2"), ("pos1", "pos2", "vel1", "vel2"))
    tau = pick(("tau_con1", "tau_con2"), ("tau1", "tau2"))
    q = x[:, :2].copy()
    q[:, 0] -= np.pi
    return Trajectory(col["time"], q, x[:, 2:], tau)


def simulate(policy, preset: str = "acrobot", n: int = 1, seed: int = 0,
             params: dict | None = None, catch: float = 0.0) -> list[Trajectory]:
    """``n`` benchmark runs of ``policy`` (observations ``(B, 6)`` float32 to
    torques ``(B,)`` in N m) on our ``double_pendulum`` preset: 5000 steps
    of 2 ms from hanging at rest, recorded as their simulator records
    (the start state, the state after each step but the last, the applied
    torques). ``params``: parameter overrides, {name: value or (n,) values};
    ``catch`` > 0: the LQR about upright catches the plant inside x'Px < catch in
    the simulator's step (``LQRCatch``'s blend, in C: one torch call for the whole
    record, not one a step)."""
    from grpo_ctrl.plant import plant_spec
    from grpo_ctrl.sim import BatchSim

    spec = plant_spec("double_pendulum", preset)
    overrides = {}
    if catch:  # torch's (the train extra): a run without it needs only the base install
        from grpo_ctrl.baselines.lqr import catch_overrides
        overrides = catch_overrides(spec, catch)
    sim = BatchSim("double_pendulum", n, preset, seed=seed, **overrides)
    sim.reset()
    # after the reset, which restores the nominal parameters
    for name, v in (params or {}).items():
        sim.set_param(name, np.broadcast_to(np.asarray(v, dtype=float), (n,)))
    obs = sim.observe().copy()
    if hasattr(policy, "reset"):
        policy.reset(n)
    steps = sim.spec.max_steps
    u_max, actuated = sim.spec.u_max, int(sim.model.actuated)
    xs = np.empty((steps, n, 4))
    us = np.empty((steps, n))
    for k in range(steps):
        xs[k] = sim.get_state()["x"]
        u = np.clip(np.asarray(policy(obs), dtype=np.float32).reshape(n), -u_max, u_max)
        us[k] = u
        obs = sim.step(u)[0].copy()
    if catch:
        us = _caught(spec, catch, xs, us)
    t = np.arange(steps) * sim.spec.dt
    return [Trajectory.of(t, xs[:, b, :2], xs[:, b, 2:], us[:, b], actuated) for b in range(n)]


def _caught(spec, catch: float, xs: np.ndarray, us: np.ndarray) -> np.ndarray:
    """The torques the catch applied at states ``xs (T, B, 4)`` to commands ``us (T, B)``."""
    import torch

    from grpo_ctrl.baselines.lqr import LQRCatch, design
    from grpo_ctrl.plant import wrap_angle

    lqr_catch = LQRCatch(torch.nn.Identity(), spec, design(spec.system, spec.preset), catch)
    x = np.concatenate([wrap_angle(xs[..., :2]), xs[..., 2:]], axis=-1)
    with torch.no_grad():
        u = lqr_catch.blend(torch.as_tensor(x.reshape(-1, 4), dtype=torch.float32),
                            torch.as_tensor(us.reshape(-1, 1), dtype=torch.float32))
    return u.numpy().astype(np.float64).reshape(us.shape)


# ---------------------------------------------------------------- robustness v2
# leaderboard/<robot>/robustness_v2/benchmark_controller.py and
# analysis/benchmark.py, benchmark_scores.py: success is the final state
# within GOAL_EPS of upright (angles wrapped, velocities in rad/s)
N_VAR = 21
REPETITIONS = 10           # runs per value of the two noise categories
PUSH_RUNS = 50             # runs of the perturbation category
GOAL_EPS = (0.35, 0.35, 1.0, 1.0)
MODEL_PARAMS = ("Ir", "m1r1", "I1", "b1", "cf1", "m2r2", "m2", "I2", "b2", "cf2")
CATEGORIES = ("model", "velocity_noise", "torque_noise", "torque_response", "delay",
              "perturbation")
TITLES = {"model": "Model", "velocity_noise": "Velocity noise", "torque_noise": "Torque noise",
          "torque_response": "Torque response", "delay": "Time delay",
          "perturbation": "Perturbations"}
PUSHES = {"per_joint": 3, "min_t_dist": 1.0, "sigma": (0.05, 0.1), "amplitude": (0.5, 5.0)}
HANGING = (np.pi, 0.0, 0.0, 0.0)
# their robustness v2 leaderboards (the web pages' tables): % of model, velocity noise,
# torque noise, torque response, delay, perturbations, and the overall score
PUBLISHED_ROBUSTNESS = {
    "acrobot": {"mcpilco": (9.0, 9.5, 19.0, 52.4, 4.8, 50.0, 0.241),
                "History-SAC": (58.1, 23.8, 100.0, 100.0, 90.5, 78.0, 0.751),
                "TVLQR": (48.1, 19.0, 100.0, 95.2, 23.8, 78.0, 0.607),
                "AR-EAPO": (67.6, 28.6, 100.0, 100.0, 76.2, 64.0, 0.727),
                "iLQR Riccati Gains": (4.8, 9.5, 9.5, 52.4, 4.8, 2.0, 0.138),
                "evolsac": (64.8, 23.8, 100.0, 100.0, 47.6, 76.0, 0.687),
                "iLQR MPC stabilization": (6.7, 9.5, 90.5, 52.4, 4.8, 42.0, 0.343)},
    "pendubot": {"mcpilco": (24.8, 76.2, 61.9, 95.2, 28.6, 82.0, 0.614),
                 "History-SAC": (68.1, 47.6, 100.0, 100.0, 100.0, 46.0, 0.770),
                 "AR-EAPO": (87.6, 81.0, 100.0, 100.0, 81.0, 98.0, 0.913),
                 "iLQR Riccati Gains": (5.2, 38.1, 9.5, 85.7, 14.3, 0.0, 0.255),
                 "evolsac": (75.2, 57.1, 100.0, 100.0, 71.4, 68.0, 0.786),
                 "TVLQR": (62.9, 90.5, 100.0, 100.0, 42.9, 64.0, 0.767),
                 "iLQR MPC stabilization": (31.9, 90.5, 100.0, 100.0, 38.1, 44.0, 0.674)},
}
_BIG_TORQUE = 1e3          # the plant's own limit, lifted: pushes add to the clipped command


def robot_of(preset: str) -> str:
    """``acrobot`` or ``pendubot``: the leaderboard a preset's controller enters."""
    robot = preset.split("-")[0]
    if robot not in ("acrobot", "pendubot"):
        raise ValueError(f"unknown double pendulum preset {preset!r}")
    return robot


def grids(preset: str = "acrobot") -> dict:
    """Every category's grid: ``model`` {parameter: 21 values}, the noise
    sigmas (rad/s, N m), the torque responses, the delays (s)."""
    from grpo_ctrl.plant import plant_spec
    from grpo_ctrl.plant_file import nominal_params
    p = nominal_params(plant_spec(SYSTEM, preset))
    rel = np.linspace(0.75, 1.25, N_VAR)     # their get_par_list of a non-zero value
    model = {"Ir": np.linspace(0.0, 1e-4, N_VAR), "m1r1": rel * (p["m1"] * p["r1"]),
             "I1": rel * p["I1"], "b1": np.linspace(-0.1, 0.1, N_VAR),
             "cf1": np.linspace(-0.2, 0.2, N_VAR), "m2r2": rel * (p["m2"] * p["r2"]),
             "m2": rel * p["m2"], "I2": rel * p["I2"], "b2": np.linspace(-0.1, 0.1, N_VAR),
             "cf2": np.linspace(-0.2, 0.2, N_VAR)}
    return {"model": model, "velocity_noise": np.linspace(0.0, 0.5, N_VAR),
            "torque_noise": np.linspace(0.0, 1.1, N_VAR),
            "torque_response": np.linspace(0.1, 2.0, N_VAR),
            "delay": np.linspace(0.0, 0.04, N_VAR)}


def _model_params(name: str, value: float, p: dict) -> dict:
    """Our plant's parameters for one model variation (m1 r1 and m2 r2 move r)."""
    if name == "m1r1":
        return {"r1": value / p["m1"]}
    if name == "m2r2":
        return {"r2": value / p["m2"]}
    return {name: value}


def draw_pushes(rng: np.random.Generator, steps: int, dt: float = 0.002) -> np.ndarray:
    """One run's torque pulses ``(2, steps)`` (their
    ``get_random_gauss_perturbation_array``): 6 Gaussian pulses at least
    ``min_t_dist`` apart (the first after it, each next one 1 to 1.5 s
    later), shuffled 3 to a joint, width sigma U(0.05, 0.1) s, height +-U(0.5, 5) N m."""
    n, t_final = 2 * PUSHES["per_joint"], steps * dt
    wiggle = (t_final - (n + 1) * PUSHES["min_t_dist"]) / n
    mu = np.cumsum(PUSHES["min_t_dist"] + rng.random(n) * wiggle)
    rng.shuffle(mu)
    mu = mu.reshape(2, -1)
    lo, hi = PUSHES["sigma"]
    sigma = lo + rng.random(mu.shape) * (hi - lo)
    lo, hi = PUSHES["amplitude"]
    amp = rng.uniform(-(hi - lo), hi - lo, mu.shape)
    amp += lo * np.sign(amp)
    t = np.arange(0.0, t_final, dt)[:steps]
    return np.sum(amp[..., None] * np.exp(-(t - mu[..., None]) ** 2 / (2 * sigma[..., None] ** 2)),
                  axis=1)


@dataclass
class Runs:
    """Runs side by side, each with its own plant and perturbations:
    ``params`` {name: (B,)}; measured velocities with noise ``vel_sigma``
    (rad/s) and the measured state ``delay`` steps old; the command through
    the motor's response ``response`` and noise ``u_sigma`` (N m), clipped,
    plus the pulses ``push`` (B, steps) on the actuated joint."""
    params: dict
    vel_sigma: np.ndarray
    delay: np.ndarray
    response: np.ndarray
    u_sigma: np.ndarray
    push: np.ndarray

    @classmethod
    def nominal(cls, n: int, steps: int = 5000) -> "Runs":
        return cls({}, np.zeros(n), np.zeros(n, int), np.ones(n), np.zeros(n),
                   np.zeros((n, steps)))


def benchmark_runs(preset: str = "acrobot", seed: int = 0) -> tuple[Runs, dict]:
    """The 722 runs of robustness v2 and where each category's lie:
    {category: index array shaped as their results (model: (10, 21), the
    noises (21, 10), response and delay (21,), perturbation (50,))}."""
    from grpo_ctrl.sim import BatchSim
    from grpo_ctrl.plant_file import nominal_params
    sim = BatchSim(SYSTEM, 1, preset)
    p = nominal_params(sim.spec)
    steps, g = sim.spec.max_steps, grids(preset)
    n_model, n_noise = len(MODEL_PARAMS) * N_VAR, N_VAR * REPETITIONS
    sizes = {"model": n_model, "velocity_noise": n_noise, "torque_noise": n_noise,
             "torque_response": N_VAR, "delay": N_VAR, "perturbation": PUSH_RUNS}
    starts = np.cumsum([0, *sizes.values()])
    where = {c: np.arange(a, a + sizes[c]) for c, a in zip(CATEGORIES, starts)}
    runs = Runs.nominal(int(starts[-1]), steps)
    params = {k: np.full(runs.delay.size, v) for k, v in p.items()}
    for i, name in enumerate(MODEL_PARAMS):
        for j, value in enumerate(g["model"][name]):
            for k, v in _model_params(name, value, p).items():
                params[k][where["model"][i * N_VAR + j]] = v
    runs.params = {k: v for k, v in params.items() if np.any(v != p[k])}
    runs.vel_sigma[where["velocity_noise"]] = np.repeat(g["velocity_noise"], REPETITIONS)
    runs.u_sigma[where["torque_noise"]] = np.repeat(g["torque_noise"], REPETITIONS)
    runs.response[where["torque_response"]] = g["torque_response"]
    # their n_delay = int(delay / dt) + 1 samples back in the record: delay / dt steps
    runs.delay[where["delay"]] = (g["delay"] / sim.spec.dt).astype(int)
    rng = np.random.default_rng(seed)
    actuated = int(sim.model.actuated)
    for b in where["perturbation"]:
        # the passive joint's pulses are drawn but do not act: their plant's B
        # matrix zeroes the torque of a joint whose limit is 0
        runs.push[b] = draw_pushes(rng, steps, sim.spec.dt)[actuated]
    shapes = {"model": (len(MODEL_PARAMS), N_VAR), "velocity_noise": (N_VAR, REPETITIONS),
              "torque_noise": (N_VAR, REPETITIONS)}
    return runs, {c: w.reshape(shapes.get(c, w.shape)) for c, w in where.items()}


def upright(x) -> np.ndarray:
    """Their success test of final states ``x (B, 4)`` (ours): within
    ``GOAL_EPS`` of upright, the shoulder wrapped to [0, 2 pi) in their
    angle, the elbow to [-pi, pi)."""
    x = np.asarray(x, dtype=float)
    q1 = np.mod(x[:, 0] + np.pi, 2 * np.pi)
    q2 = np.mod(x[:, 1] + np.pi, 2 * np.pi) - np.pi
    return ((np.abs(q1 - np.pi) < GOAL_EPS[0]) & (np.abs(q2) < GOAL_EPS[1])
            & (np.abs(x[:, 2]) < GOAL_EPS[2]) & (np.abs(x[:, 3]) < GOAL_EPS[3]))


def run_perturbed(policy, preset: str, runs: Runs, x0=HANGING, seed: int = 0,
                  record: bool = False):
    """Their simulator's loop over all ``runs`` at once on our plant: each
    step the measurement (the state ``delay`` steps ago, noise on the
    velocities), the command ``u = policy(obs)``, the applied torque
    ``clip(last + response (u - last) + N(0, u_sigma), +-u_max) + push`` with
    ``last`` the torque applied the step before, then one RK4 step. Returns
    the final states ``(B, 4)``; with ``record``, also the states ``(steps +
    1, B, 4)`` and the applied torques ``(steps, B)``."""
    from grpo_ctrl.sim import BatchSim
    B = runs.delay.size
    sim = BatchSim(SYSTEM, B, preset, u_max=_BIG_TORQUE)
    meter = BatchSim(SYSTEM, B, preset)     # observes the measured states, by the C function
    u_max, dt, steps = meter.spec.u_max, sim.spec.dt, runs.push.shape[1]
    sim.reset()
    x = np.broadcast_to(np.asarray(x0, dtype=float), (B, 4)).copy()
    sim.set_state({"x": x})
    sim.set_plant(runs.params)
    if hasattr(policy, "reset"):
        policy.reset(B)
    rng = np.random.default_rng(seed)
    depth = int(runs.delay.max()) + 1
    ring = np.repeat(x[None], depth, axis=0)     # the last `depth` states
    cols = np.arange(B)
    noisy_v, noisy_u = np.any(runs.vel_sigma > 0), np.any(runs.u_sigma > 0)
    # their pulse index int(t / dt), t summed step by step (it lags k from step 1007 on)
    t, index = 0.0, np.empty(steps, int)
    for k in range(steps):
        index[k] = int(t / dt)
        t += dt
    last = np.zeros(B)
    xs, us = (np.empty((steps + 1, B, 4)), np.empty((steps, B))) if record else (None, None)
    for k in range(steps):
        if record:
            xs[k] = x
        meas = ring[np.maximum(k - runs.delay, 0) % depth, cols]
        if noisy_v:
            meas[:, 2:] += runs.vel_sigma[:, None] * rng.standard_normal((B, 2))
        meas[~np.isfinite(meas).all(axis=1)] = 0.0     # a blown-up run (it fails) reads zeros
        meter.set_state({"x": meas})
        u = np.asarray(policy(meter.observe().copy()), dtype=float).reshape(B)
        applied = last + runs.response * (u - last)
        if noisy_u:
            applied = applied + runs.u_sigma * rng.standard_normal(B)
        applied = np.clip(applied, -u_max, u_max) + runs.push[:, index[k]]
        applied[~np.isfinite(applied)] = 0.0    # a policy's NaN: that run gets no torque
        last = applied
        if record:
            us[k] = applied
        sim.step(applied.astype(np.float32))
        x = sim.get_state()["x"]
        ring[(k + 1) % depth] = x
    if record:
        xs[steps] = x
        return x, xs, us
    return x


@dataclass(frozen=True)
class Robustness:
    """Successes per category, shaped as theirs, and the scores."""
    preset: str
    successes: dict

    def scores(self) -> dict:
        """Each category's share (benchmark_scores.py): the model's over all
        210 runs; a noise value succeeds where more than half its runs do."""
        s = self.successes
        out = {"model": float(np.mean(s["model"]))}
        for c in ("velocity_noise", "torque_noise"):
            out[c] = float(np.mean(np.mean(s[c], axis=1) > 0.5))
        for c in ("torque_response", "delay", "perturbation"):
            out[c] = float(np.mean(s[c]))
        return out

    @property
    def score(self) -> float:
        """The overall robustness score: the six categories' mean."""
        return float(np.mean(list(self.scores().values())))


def robustness(policy, preset: str = "acrobot", seed: int = 0, x0=HANGING) -> Robustness:
    """RealAIGym's robustness benchmark v2 of ``policy`` (observations
    ``(B, 6)`` to torques ``(B,)``) on ``preset``: 722 runs of 10 s, batched."""
    runs, where = benchmark_runs(preset, seed)
    final = upright(run_perturbed(policy, preset, runs, x0, seed + 1))
    return Robustness(preset, {c: final[w] for c, w in where.items()})


def controller_policy(controller, estimator_hz: float | None = None):
    """A controller (``grpo_ctrl.controller``) as a benchmark policy; with
    ``estimator_hz``, acting on the model estimate of the state
    (``grpo_ctrl.estimator.EstimatedPolicy``: the measured angles, the
    estimator's velocities)."""
    from grpo_ctrl.controller import act

    def policy(obs):
        return act(controller, obs).astype(np.float64)
    if estimator_hz is None:
        return policy
    from grpo_ctrl.estimator import EstimatedPolicy
    return EstimatedPolicy(policy, controller.spec, estimator_hz)


def benchmark_score(controller) -> float:
    """RealAI score v2 of ``controller``'s one simulation-v2 run (10 s from hanging at rest on
    its robot's benchmark model): what training's ``deploy = "score"`` chooses by."""
    (tr,) = simulate(controller_policy(controller), robot_of(controller.spec.preset))
    return evaluate(tr)["score"]


def score_table(controllers: dict, estimator_hz: float | None = None) -> str:
    """Each criterion of one simulation-v2 run of every controller, beside the published top."""
    robot = robot_of(next(iter(controllers.values())).spec.preset)
    cols = {}
    for name, c in controllers.items():
        (tr,) = simulate(controller_policy(c, estimator_hz), robot)
        cols[name] = evaluate(tr)
    top = PUBLISHED_TOPS[(robot, "simulation_v2")]
    cols[top[0] + "*"] = {**dict(zip(CRITERIA, PUBLISHED_SIMULATION_TOP[robot])),
                          "success": True, "score": top[1]}
    w = max(12, *(len(n) + 2 for n in cols))
    n = NORMALISERS["simulation"]
    lines = [f"RealAIGym double pendulum, simulation v2 ({SYSTEM}/{robot}): one run from "
             "hanging at rest, 10 s", f"{'criterion':<30}{'norm':>6}" +
             "".join(f"{k:>{w}}" for k in cols)]
    for k in CRITERIA:
        lines.append(f"{k + ' [' + UNITS[k] + ']':<30}{n[k]:>6g}" +
                     "".join(f"{c[k]:>{w}.3f}" for c in cols.values()))
    lines.append(f"{'success':<36}" + "".join(f"{str(c['success']):>{w}}" for c in cols.values()))
    lines.append(f"{'RealAI score':<36}" + "".join(f"{c['score']:>{w}.3f}" for c in cols.values()))
    lines.append(f"* the published top of simulation v2 ({robot})")
    return "\n".join(lines)


def robustness_table(controllers: dict, seed: int = 0, estimator_hz: float | None = None) -> str:
    """The six categories of every controller, beside the published top."""
    robot = robot_of(next(iter(controllers.values())).spec.preset)
    rows = {name: robustness(controller_policy(c, estimator_hz), robot, seed)
            for name, c in controllers.items()}
    top = PUBLISHED_TOPS[(robot, "robustness_v2")]
    w = max(12, len(top[0]) + 3, *(len(n) + 2 for n in rows))  # + 3: the name's "*", a space
    lines = [f"RealAIGym double pendulum, robustness v2 ({SYSTEM}/{robot}): 722 runs of 10 s "
             f"from hanging at rest, seed {seed}; success = the final state within 0.35 rad "
             "and 1 rad/s of upright", f"{'category [% success]':<24}" +
             "".join(f"{k:>{w}}" for k in rows)]
    published = PUBLISHED_ROBUSTNESS[robot][top[0]]
    scores = {**{name: r.scores() for name, r in rows.items()},
              "published": dict(zip(CATEGORIES, np.divide(published[:6], 100)))}
    totals = [*(r.score for r in rows.values()), published[6]]
    lines[-1] += f"{top[0] + '*':>{w}}"
    for c in CATEGORIES:
        lines.append(f"{TITLES[c]:<24}" + "".join(f"{100 * s[c]:>{w}.1f}" for s in scores.values()))
    lines.append(f"{'robustness score':<24}" + "".join(f"{t:>{w}.3f}" for t in totals))
    lines.append(f"* the published top of robustness v2 ({robot})")
    return "\n".join(lines)
