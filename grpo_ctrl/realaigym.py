"""RealAIGym's torque-limited simple pendulum benchmark: its score, its
published entries and its robustness categories, computed by our own code
from the published definitions (DFKI underactuated lab,
``torque_limited_simple_pendulum``: ``leaderboard/simulation`` and
``leaderboard/robustness``; BSD 3-clause).

The plant is our ``pendulum/realaigym`` preset (``csrc/plants.c``): a point
mass of 0.57288 kg on a 0.5 m rod, damping 0.1 N m s, Coulomb friction
0.093 N m (exact sign of the velocity), torque limit 2 N m, RK4 at 10 ms,
1000 steps from hanging at rest. Their angle q is zero hanging; ours is zero
upright: q = theta - pi, unwrapped as the simulator integrates it.

The score of one run, as their leaderboard computes it: the trajectory is
recorded after each step (times dt, 2 dt, ..., 10 s; the state after the
step; the torque commanded for it), then

================  ==========================================  ======  ==========
criterion         from the trajectory                         weight  normaliser
================  ==========================================  ======  ==========
swingup_time      first time from which the pendulum stays     0.2     10 s
                  within 0.02 rad and 0.2 rad/s of upright
max_tau           max |tau|                                    0.1     2 N m
energy            sum |dq * tau| (mechanical work)             0.1     100 J
integ_tau         sum |tau| dt                                 0.1     20 N m s
tau_cost          sum tau^2 dt                                 0.1     40 N^2 m^2 s
tau_smoothness    std of the torque's step-to-step changes     0.2     4 N m
velocity_cost     sum qd^2 dt                                  0.2     100 rad^2/s
================  ==========================================  ======  ==========

score = success * (1 - sum weight * criterion / normaliser); success: the
swing-up time lies before the last sample. The sums run over all samples
but the last; the smoothness is over the changes of all torques but the
last. The swing-up time is the start of the last run of consecutive samples
inside the goal region, as their code finds it: walking back from the last
such sample while the samples are consecutive, but never onto the first
sample inside the region at all (a run that starts there is timed from its
second sample), and the last sample's time (no success) where fewer than
three samples are inside.

The robustness leaderboard (``--robustness realaigym``) scores four
categories, 100 runs each in theirs, success meaning the pendulum reaches
0.1 rad and 0.1 rad/s of upright (it need not stay) within 10 s:
consistency (starts uniform in q in [-pi, pi], qd in [-3 pi, 3 pi]),
robustness (a torque disturbance U(-2, 2) N m held 1 s from t = 0, 8/3, 16/3
and 8 s), sensitivity (each of m, l, b, cf and the inertia J changed to
(p + U(0, 0.1)) U(0.5, 1.5)) and the smallest torque limit of 10, 5, 2.5,
2, 1.5, 1, 0.5, 0.25, 0.1 N m (tried in that order until one fails, 100 s
each) with which it still swings up. Overall: 0.25 (consistency +
robustness + sensitivity shares + (10 - min torque) / 10).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from grpo_ctrl.sim import BatchSim

SYSTEM, PRESET = "pendulum", "realaigym"
# leaderboard/simulation/compute_leaderboard.py
WEIGHTS = {"swingup_time": 0.2, "max_tau": 0.1, "energy": 0.1, "integ_tau": 0.1,
           "tau_cost": 0.1, "tau_smoothness": 0.2, "velocity_cost": 0.2}
NORMALISERS = {"swingup_time": 10.0, "max_tau": 2.0, "energy": 100.0, "integ_tau": 20.0,
               "tau_cost": 40.0, "tau_smoothness": 4.0, "velocity_cost": 100.0}
CRITERIA = tuple(WEIGHTS)
UNITS = {"swingup_time": "s", "max_tau": "N m", "energy": "J", "integ_tau": "N m s",
         "tau_cost": "N^2 m^2 s", "tau_smoothness": "N m", "velocity_cost": "rad^2/s"}
GOAL_EPS = (2e-2, 2e-1)        # rad, rad/s: the score's upright region
REACH_EPS = (0.1, 0.1)         # the robustness benchmark's

# The published simulation leaderboard (RealAI Score) and the robustness
# benchmark results their repository ships (data/benchmarks/*/benchmark.yml:
# consistency, robustness, sensitivity in % of 100 runs, min torque in N m).
PUBLISHED_SCORES = {"iLQR + TVLQR": 0.701, "energy shaping + LQR": 0.666, "DDPG": 0.661,
                    "SAC": 0.477}
PUBLISHED_ROBUSTNESS = {"iLQR + TVLQR": (100, 54, 70, 1.5), "DDPG": (100, 100, 79, 1.0),
                        "SAC": (100, 100, 69, 1.5)}
TORQUE_LIMITS = (10.0, 5.0, 2.5, 2.0, 1.5, 1.0, 0.5, 0.25, 0.1)


# ---------------------------------------------------------------- the score
@dataclass
class Trajectory:
    """A run as their leaderboard records it: after each step, its time, the
    state (their angle q, zero hanging; velocity) and the torque of the step."""
    t: np.ndarray
    q: np.ndarray
    qd: np.ndarray
    tau: np.ndarray


def swingup_time(tr: Trajectory, eps=GOAL_EPS) -> float:
    """Start of the last run of consecutive samples in the upright region (their
    search, quirks included: see the module's docstring)."""
    near = (np.abs(np.mod(tr.q, 2 * np.pi) - np.pi) < eps[0]) & (np.abs(tr.qd) < eps[1])
    n = np.flatnonzero(near)
    index = len(tr.t) - 1
    for i in range(len(n) - 2, 0, -1):
        if n[i] + 1 != n[i + 1]:
            break
        index = n[i]
    return float(tr.t[index])


def criteria(tr: Trajectory) -> dict:
    dt = np.diff(tr.t)
    tau = tr.tau[:-1]
    return {"swingup_time": swingup_time(tr),
            "max_tau": float(np.max(np.abs(tr.tau))),
            "energy": float(np.sum(np.abs(np.diff(tr.q) * tau))),
            "integ_tau": float(np.sum(np.abs(tau) * dt)),
            "tau_cost": float(np.sum(tau * tau * dt)),
            "tau_smoothness": float(np.std(np.diff(tau))),
            "velocity_cost": float(np.sum(tr.qd[:-1] ** 2 * dt))}


def score(c: dict, t_end: float) -> float:
    """The RealAI score of criteria ``c`` of a run ending at ``t_end``."""
    if not c["swingup_time"] < t_end:
        return 0.0
    return 1.0 - sum(WEIGHTS[k] * c[k] / NORMALISERS[k] for k in CRITERIA)


# ---------------------------------------------------------------- running controllers
def nn_policy(controller):
    """A stateless controller (obs -> command) as a benchmark policy."""
    from grpo_ctrl.controller import act

    def policy(obs, x, t):
        return act(controller, obs).astype(np.float64)
    policy.reset = lambda n: None
    return policy


def simulate(policy, n: int = 1, steps: int = 1000, x0=None, params: dict | None = None,
             disturbance=None, torque_limit: float | None = None, stop_at=None):
    """Run ``policy(obs, x, t) -> tau (n,)`` on n realaigym plants. Returns the
    trajectory arrays (steps, n) of t, q, qd, tau; with ``stop_at`` (the
    robustness region), also whether and when each reached it.
    x0: (n, 2) in their convention (q, qd); params: per-plant values by name;
    disturbance(t, k) -> (n,) torque added to the command; torque_limit:
    commands clipped to it before the plant (whose own limit stays 2 N m)."""
    sim = BatchSim(SYSTEM, n, preset=PRESET, hold_plant=params is not None)
    if params is not None:
        sim.set_plant(params)
    sim.reset()
    if x0 is not None:
        x0 = np.asarray(x0, float).reshape(n, 2)
        sim.set_state({"x": np.stack([x0[:, 0] + np.pi, x0[:, 1]], axis=1)})
    if hasattr(policy, "reset"):
        policy.reset(n)
    obs = sim.observe()
    dt = sim.spec.dt
    T, Q, QD, U = (np.zeros((steps, n)) for _ in range(4))
    reached = np.zeros(n, bool)
    for k in range(steps):
        x = sim.get_state()["x"]
        u = np.asarray(policy(obs, x, k * dt), float).reshape(n)
        if disturbance is not None:
            u = u + disturbance(k * dt, k)
        if torque_limit is not None:
            u = np.clip(u, -np.asarray(torque_limit), np.asarray(torque_limit))
        applied = np.clip(np.float32(u), -sim.spec.u_max, sim.spec.u_max)
        obs = sim.step(applied)[0]
        x = sim.get_state()["x"]
        T[k], Q[k], QD[k], U[k] = (k + 1) * dt, x[:, 0] - np.pi, x[:, 1], u
        if stop_at is not None:
            err = np.mod(x[:, 0] + np.pi, 2 * np.pi) - np.pi
            reached |= (np.abs(err) < stop_at[0]) & (np.abs(x[:, 1]) < stop_at[1])
            if reached.all():
                return T[:k + 1], Q[:k + 1], QD[:k + 1], U[:k + 1], reached
    return (T, Q, QD, U) if stop_at is None else (T, Q, QD, U, reached)


def evaluate(policy) -> tuple[dict, float, Trajectory]:
    """Criteria and score of one benchmark run (hanging at rest, 10 s)."""
    T, Q, QD, U = simulate(policy)
    tr = Trajectory(T[:, 0], Q[:, 0], QD[:, 0], U[:, 0])
    c = criteria(tr)
    return c, score(c, tr.t[-1]), tr


# ---------------------------------------------------------------- their controllers, our code
def plant_constants() -> dict:
    p = BatchSim(SYSTEM, 1, preset=PRESET).plant()
    return {k: float(p[k][0]) for k in ("g", "m", "l", "b", "fc")}


def upright_lqr(Q=np.diag([10.0, 1.0]), R=1.0) -> tuple[np.ndarray, np.ndarray]:
    """Continuous-time LQR about upright of the point-mass pendulum with its
    damping (Coulomb friction left out), in their convention; (K, S)."""
    p = plant_constants()
    inertia = p["m"] * p["l"] ** 2
    A = np.array([[0.0, 1.0], [p["m"] * p["g"] * p["l"] / inertia, -p["b"] / inertia]])
    B = np.array([[0.0], [1.0 / inertia]])
    S = scipy.linalg.solve_continuous_are(A, B, Q, np.array([[R]]))
    return (B.T @ S / R).reshape(2), S


class EnergyShapingLQR:
    """RealAIGym's energy shaping + LQR entry (con_energyshaping_lqr.py: k = 1,
    Q = diag(10, 1), R = 1, its own torque limit 1 N m), written from its
    definition: the LQR's command u = -K [wrap(q - pi), qd] + cf sign(qd)
    acts wherever |u| <= 1 N m; elsewhere the energy law
    u = -k qd (E - E_up) + b qd clipped to +-1 N m, E = m l^2 qd^2 / 2 +
    m g l (1 - cos q), with a kick of +1 N m when |q| and |qd| are both below
    0.05 (the law alone never leaves rest)."""

    def __init__(self, k: float = 1.0, limit: float = 1.0):
        self.p, self.k, self.limit = plant_constants(), k, limit
        self.K, _ = upright_lqr()

    def __call__(self, obs, x, t):
        p = self.p
        q, qd = x[:, 0] - np.pi, x[:, 1]
        dq = np.mod(q, 2 * np.pi) - np.pi  # q - pi wrapped to [-pi, pi)
        u_lqr = -(self.K[0] * dq + self.K[1] * qd) + np.sign(qd) * p["fc"]
        energy = 0.5 * p["m"] * (p["l"] * qd) ** 2 + p["m"] * p["g"] * p["l"] * (1 - np.cos(q))
        target = 2.0 * p["m"] * p["g"] * p["l"]
        u_energy = -self.k * qd * (energy - target) + p["b"] * qd
        u_energy = np.where((np.abs(q) < 0.05) & (np.abs(qd) < 0.05), self.limit, u_energy)
        u_energy = np.clip(u_energy, -self.limit, self.limit)
        return np.where(np.abs(u_lqr) <= self.limit, u_lqr, u_energy)


# ---------------------------------------------------------------- robustness
@dataclass
class RobustnessResult:
    consistency: float   # shares of runs that reached upright
    robustness: float
    sensitivity: float
    min_torque: float    # N m

    @property
    def overall(self) -> float:
        return 0.25 * (self.consistency + self.robustness + self.sensitivity
                       + (10.0 - self.min_torque) / 10.0)


def _reach(policy, n, **kw) -> np.ndarray:
    return simulate(policy, n, stop_at=REACH_EPS, **kw)[4]


def robustness(policy, runs: int = 100, seed: int = 0) -> RobustnessResult:
    """Their four robustness categories for ``policy`` (``runs`` each)."""
    rng = np.random.default_rng(seed)
    steps = 1000
    x0 = np.stack([rng.uniform(-np.pi, np.pi, runs), rng.uniform(-3 * np.pi, 3 * np.pi, runs)], 1)
    consistency = _reach(policy, runs, steps=steps, x0=x0).mean()

    starts = np.linspace(0.0, 8.0, 4)
    levels = rng.uniform(-2.0, 2.0, (len(starts), runs))

    # each window opens at the first step whose start time lies after its start, for 100 steps
    first = np.floor(starts / 0.01 + 1e-9).astype(int) + 1

    def disturbance(t, k):
        active = (first <= k) & (k < first + 100)
        return levels[active].sum(axis=0)
    robust = _reach(policy, runs, steps=steps, disturbance=disturbance).mean()

    nominal = plant_constants()

    def modified(value):
        return (value + rng.uniform(0, 0.1, runs)) * (rng.uniform(0, 1, runs) * 1.0 + 0.5)
    m, l = modified(nominal["m"]), modified(nominal["l"])
    b, fc = modified(nominal["b"]), modified(nominal["fc"])
    J = modified(nominal["m"] * nominal["l"] ** 2)
    params = {"m": m, "l": l, "b": b, "fc": fc, "inertia": J / (m * l * l)}
    sensitivity = _reach(policy, runs, steps=steps, params=params).mean()

    # every limit at once, then theirs: in order until the first that fails
    limits = np.array(TORQUE_LIMITS)
    swung = _reach(policy, len(limits), steps=10 * steps, torque_limit=limits)
    min_torque = math.inf
    for limit, ok in zip(limits, swung):
        if not ok:
            break
        min_torque = float(limit)
    return RobustnessResult(float(consistency), float(robust), float(sensitivity), min_torque)


class ILQRTVLQR:
    """RealAIGym's iLQR + TVLQR entry (con_ilqr_tvlqr_lqr.py), written from its
    definition. Offline, iLQR plans 500 states (4.99 s) from hanging at rest
    on their RK4 model with the Coulomb term smoothed as cf atan(1e8 qd) 2/pi:
    stage cost 0.1 u^2, final cost 1000 (q - pi)^2 + (qd)^2 (each error offset
    by 1e-6 as theirs), regulariser from 100 (x0.7 on success, x2 on failure,
    within [0.01, 1e4]), up to 100 iterations, stopping once the expected
    reduction is below 1e-6. A time-varying LQR (Q = diag(10, 1), R = 2, final
    cost-to-go that of an LQR about their linearisation point) tracks the plan
    with commands clipped to 1.5 N m (after the plan, to 4.99 s, its fixed gain
    about upright); within 0.1 rad and 0.1 rad/s of upright
    it hands over for good to the upright LQR (Q = diag(10, 1), R = 1, plus
    cf sign(qd)), clipped to 1.5 N m. The tracking is the discrete-time
    Riccati recursion on the plan's linearisation (theirs: Drake's
    continuous-time finite-horizon LQR on the model without Coulomb friction)."""

    def __init__(self, seed: int = 0, limit: float = 1.5, iterations: int = 100):
        p = self.p = plant_constants()
        self.dt, self.limit = 0.01, limit
        self.I = p["m"] * p["l"] ** 2
        self.xs, self.us = self._plan(seed, iterations)
        self.gains = self._tracking_gains()
        self.K_up, _ = upright_lqr()

    # their model: (u - m g l sin q - b qd - cf atan(1e8 qd) 2 / pi) / (m l^2)
    def _f(self, q, v, u):
        p = self.p
        acc = (u - p["m"] * p["g"] * p["l"] * math.sin(q) - p["b"] * v
               - p["fc"] * math.atan(1e8 * v) * 2 / math.pi) / self.I
        dacc_dq = -p["m"] * p["g"] * p["l"] * math.cos(q) / self.I
        dacc_dv = (-p["b"] - p["fc"] * 2 / math.pi * 1e8 / (1 + 1e16 * v * v)) / self.I
        return acc, dacc_dq, dacc_dv

    def _step(self, q, v, u):
        """One RK4 step and its Jacobians A (2x2), B (2,) by the chain rule."""
        h = self.dt
        # stage derivatives: d(state)/d(q0, v0, u) as rows for q and v
        sq, sv = (1.0, 0.0, 0.0), (0.0, 1.0, 0.0)
        ks = []
        for c in (0.0, 0.5, 0.5, 1.0):
            if ks:
                kq, kv, dkq, dkv = ks[-1]
                qs, vs = q + c * h * kq, v + c * h * kv
                dq = tuple(a + c * h * b for a, b in zip(sq, dkq))
                dv = tuple(a + c * h * b for a, b in zip(sv, dkv))
            else:
                qs, vs, dq, dv = q, v, sq, sv
            acc, aq, av = self._f(qs, vs, u)
            dacc = tuple(aq * a + av * b for a, b in zip(dq, dv))
            dacc = (dacc[0], dacc[1], dacc[2] + 1.0 / self.I)
            ks.append((vs, acc, dv, dacc))
        w = (1.0, 2.0, 2.0, 1.0)
        qn = q + h / 6 * sum(wi * k[0] for wi, k in zip(w, ks))
        vn = v + h / 6 * sum(wi * k[1] for wi, k in zip(w, ks))
        dqn = [sq[j] + h / 6 * sum(wi * k[2][j] for wi, k in zip(w, ks)) for j in range(3)]
        dvn = [sv[j] + h / 6 * sum(wi * k[3][j] for wi, k in zip(w, ks)) for j in range(3)]
        A = np.array([[dqn[0], dqn[1]], [dvn[0], dvn[1]]])
        return qn, vn, A, np.array([dqn[2], dvn[2]])

    def _plan(self, seed, iterations, N=500):
        eps, goal = 1e-6, math.pi
        rng = np.random.default_rng(seed)
        us = rng.standard_normal(N - 1) * 1e-4

        def rollout(us_new, xs_old=None, k=None, K=None):
            xs = np.zeros((N, 2))
            out = us_new.copy()
            jac = []
            for n in range(N - 1):
                if K is not None:
                    out[n] = us_new[n] + k[n] + K[n] @ (xs[n] - xs_old[n])
                q, v, A, B = self._step(xs[n, 0], xs[n, 1], out[n])
                xs[n + 1] = q, v
                jac.append((A, B))
            return xs, out, jac

        def cost(xs, us_):
            stage = np.sum(0.1 * us_ ** 2) / N
            return stage + 1000 * (xs[-1, 0] - goal + eps) ** 2 + (xs[-1, 1] + eps) ** 2

        xs, us, jac = rollout(us)
        total, regu = cost(xs, us), 100.0
        self.trace = []  # (cost, regulariser, expected reduction) of every iteration
        for _ in range(iterations):
            Vx = np.array([2000 * (xs[-1, 0] - goal + eps), 2 * (xs[-1, 1] + eps)])
            Vxx = np.diag([2000.0, 2.0])
            k, K = np.zeros(N - 1), np.zeros((N - 1, 2))
            expected = 0.0
            for n in range(N - 2, -1, -1):
                A, B = jac[n]
                Qx = A.T @ Vx
                Qu = B @ Vx + 0.2 * us[n]
                Qxx = A.T @ Vxx @ A
                Qux = B @ Vxx @ A
                Quu = 0.2 + B @ Vxx @ B
                k[n] = -Qu / (Quu + regu)
                K[n] = -Qux / (Quu + regu)
                Vx = Qx + K[n] * Qu + 0.5 * (Qux * k[n] + K[n] * Quu * k[n])
                Vxx = Qxx + np.outer(Qux, K[n]) + np.outer(K[n], Qux) + Quu * np.outer(K[n], K[n])
                expected += -Qu * k[n] - 0.5 * k[n] * Quu * k[n]
            xs_new, us_new, jac_new = rollout(us, xs, k, K)
            new = cost(xs_new, us_new)
            if total - new > 0:
                xs, us, jac, total = xs_new, us_new, jac_new, new
                regu *= 0.7
            else:
                regu *= 2.0
            regu = min(max(regu, 0.01), 1e4)
            self.trace.append((total, regu, expected))
            if expected <= 1e-6:
                break
        self._jac = jac
        return xs, np.append(us, 0.0)

    def _tracking_gains(self):
        p, dt = self.p, self.dt
        # their final cost-to-go: the LQR about the state their set_goal
        # linearises at (the goal q = pi shifted by pi and wrapped: q = 0)
        A = np.array([[0.0, 1.0], [-p["g"] / p["l"], -p["b"] / self.I]])
        B = np.array([[0.0], [1.0 / self.I]])
        P = scipy.linalg.solve_continuous_are(A, B, np.diag([10.0, 1.0]), np.array([[1.0]]))
        self.K_end = (B.T @ P).reshape(2)  # what their tracker applies after the plan
        Q, R = np.diag([10.0, 1.0]) * dt, 2.0 * dt
        gains = np.zeros((len(self.xs), 2))
        for n in range(len(self._jac) - 1, -1, -1):
            A, B = self._jac[n]
            K = (B @ P @ A) / (R + B @ P @ B)
            gains[n] = K
            P = Q + A.T @ P @ (A - np.outer(B, K))
        return gains

    def reset(self, n: int):
        self.upright = np.zeros(n, bool)

    def __call__(self, obs, x, t):
        p = self.p
        q, qd = x[:, 0] - np.pi, x[:, 1]
        dq_up = np.mod(q, 2 * np.pi) - np.pi  # q - pi wrapped to [-pi, pi)
        self.upright |= (np.abs(dq_up) < 0.1) & (np.abs(qd) < 0.1)
        u_up = -(self.K_up[0] * dq_up + self.K_up[1] * qd) + np.sign(qd) * p["fc"]
        n = int(round(t / self.dt))
        if n < len(self.xs) - 1:
            e = np.mod(q - self.xs[n, 0] + np.pi, 2 * np.pi) - np.pi
            u_track = self.us[n] - (self.gains[n, 0] * e + self.gains[n, 1] * (qd - self.xs[n, 1]))
        else:  # past the plan: their tracker's fixed gain, about upright
            u_track = -(self.K_end[0] * dq_up + self.K_end[1] * qd)
        u = np.where(self.upright, u_up, u_track)
        return np.clip(u, -self.limit, self.limit)


# ---------------------------------------------------------------- reports
REFERENCES = {"energy shaping + LQR": EnergyShapingLQR, "iLQR + TVLQR": ILQRTVLQR}


def check_plant(controllers: dict) -> None:
    from grpo_ctrl.errors import UserError
    for name, c in controllers.items():
        if (c.spec.system, c.spec.preset) != (SYSTEM, PRESET):
            raise UserError(f"{name} is a {c.spec.system}/{c.spec.preset} controller; RealAIGym's "
                            f"benchmark is the {SYSTEM}/{PRESET} preset (train with --preset "
                            f"{PRESET})")


def score_table(controllers: dict, references: bool = True) -> str:
    """Each criterion of one benchmark run of every controller, beside our runs of
    their reference controllers and their published scores."""
    columns = {name: evaluate(nn_policy(c))[:2] for name, c in controllers.items()}
    if references:
        for name, make in REFERENCES.items():
            columns[f"{name}*"] = evaluate(make())[:2]
    width = max(12, *(len(n) + 2 for n in columns))
    lines = [f"RealAIGym torque-limited simple pendulum ({SYSTEM}/{PRESET}): one run from "
             "hanging at rest, 10 s",
             f"{'criterion':<26}{'weight':>7}{'norm':>7}"
             + "".join(f"{n:>{width}}" for n in columns)]
    for k in CRITERIA:
        lines.append(f"{k + ' [' + UNITS[k] + ']':<26}{WEIGHTS[k]:>7.1f}{NORMALISERS[k]:>7g}"
                     + "".join(f"{c[k]:>{width}.3f}" for c, _ in columns.values()))
    lines.append(f"{'RealAI score':<40}" + "".join(f"{s:>{width}.3f}" for _, s in columns.values()))
    lines.append("published: " + ", ".join(f"{n} {v:.3f}" for n, v in PUBLISHED_SCORES.items()))
    if references:
        lines.append("* their controller's law, our code and simulator (grpo_ctrl.realaigym)")
    return "\n".join(lines)


def robustness_table(controllers: dict, runs: int = 100, seed: int = 0,
                     references: bool = True) -> str:
    """Their robustness categories for every controller, beside their published results."""
    rows = {name: robustness(nn_policy(c), runs, seed) for name, c in controllers.items()}
    if references:
        for name, make in REFERENCES.items():
            rows[f"{name}*"] = robustness(make(), runs, seed)
    for name, (c, r, s, t) in PUBLISHED_ROBUSTNESS.items():
        rows[f"{name} (published)"] = RobustnessResult(c / 100, r / 100, s / 100, t)
    width = max(len(n) for n in rows) + 2
    lines = [f"RealAIGym robustness ({SYSTEM}/{PRESET}): {runs} runs per category (theirs: 100), "
             f"seed {seed}; success = reaching 0.1 rad and 0.1 rad/s of upright",
             f"{'controller':<{width}}{'consistency':>12}{'robustness':>11}{'sensitivity':>12}"
             f"{'min torque':>11}{'overall':>9}"]
    for name, r in rows.items():
        lines.append(f"{name:<{width}}{100 * r.consistency:>11.0f}%{100 * r.robustness:>10.0f}%"
                     f"{100 * r.sensitivity:>11.0f}%{r.min_torque:>9.2f} N m{r.overall:>9.3f}")
    if references:
        lines.append("* their controller's law, our code and simulator (grpo_ctrl.realaigym)")
    return "\n".join(lines)
