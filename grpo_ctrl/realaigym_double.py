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
"""
from __future__ import annotations

import gzip
import math
from dataclasses import dataclass

import numpy as np

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
             params: dict | None = None) -> list[Trajectory]:
    """``n`` benchmark runs of ``policy`` (observations ``(B, 6)`` float32 to
    torques ``(B,)`` in N m) on our ``double_pendulum`` preset: 5000 steps
    of 2 ms from hanging at rest, recorded as their simulator records
    (the start state, the state after each step but the last, the applied
    torques). ``params``: parameter overrides, {name: value or (n,) values}."""
    from grpo_ctrl.sim import BatchSim

    sim = BatchSim("double_pendulum", n, preset, seed=seed)
    for name, v in (params or {}).items():
        sim.set_param(name, np.broadcast_to(np.asarray(v, dtype=float), (n,)))
    obs = sim.reset().copy()
    steps = sim.spec.max_steps
    u_max, actuated = sim.spec.u_max, int(sim.model.actuated)
    xs = np.empty((steps, n, 4))
    us = np.empty((steps, n))
    for k in range(steps):
        xs[k] = sim.get_state()["x"]
        u = np.clip(np.asarray(policy(obs), dtype=np.float32).reshape(n), -u_max, u_max)
        us[k] = u
        obs = sim.step(u)[0].copy()
    t = np.arange(steps) * sim.spec.dt
    return [Trajectory.of(t, xs[:, b, :2], xs[:, b, 2:], us[:, b], actuated) for b in range(n)]
