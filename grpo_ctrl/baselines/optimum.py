"""The optimal controller of the simulated pendulum, by dynamic programming:
the reference GRPO and the hand-written baselines are measured against.

Value iteration on a grid of (angle, angular velocity), the value function
interpolated bilinearly (Bertsekas, *Dynamic Programming and Optimal
Control*, vol. 2, sec. 6.5). The transitions are one step of the C simulator
itself (``BatchSim``), so the table is for exactly the plant the other
controllers run on (the ``gym`` preset is Gymnasium's Pendulum-v1 bit for
bit). The return is undiscounted: with a zero-cost upright equilibrium the
total cost to go is finite and the sweeps converge to it.

    V(s) = max_a [ r(s, a) + V(f(s, a)) ]

On-line, ``OptimalPendulum`` is a feedback controller with one step of
look-ahead: at the measured state it tries ``lookahead_actions`` torques
(finer than the grid's) through the simulator and takes the best
``r + V(f)``. It is stateless, as the controller contract asks, but not
exportable: it steps a simulator inside ``forward``.

The table takes some seconds to compute and is cached (``cache_dir()``).
"""
from __future__ import annotations

import hashlib
import io
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from grpo_ctrl.errors import UserError
from grpo_ctrl.plant import PlantSpec
from grpo_ctrl.sim import BatchSim


@dataclass(frozen=True)
class DPGrid:
    """Resolution of the dynamic programme."""
    n_angle: int = 360         # periodic over [-pi, pi): 1 degree apart
    n_speed: int = 321         # over [-v_max, v_max]
    n_actions: int = 21        # torques tried per grid state, over [-u_max, u_max]
    lookahead_actions: int = 81  # torques tried on-line, at the measured state
    tol: float = 1e-6          # stop when no value moves more than this in a sweep
    max_sweeps: int = 2000


def cache_dir() -> Path:
    """Where computed tables are kept: $GRPO_CTRL_CACHE, else
    $XDG_CACHE_HOME/grpo-ctrl, else ~/.cache/grpo-ctrl."""
    if os.environ.get("GRPO_CTRL_CACHE"):
        return Path(os.environ["GRPO_CTRL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "grpo-ctrl"


def _check_plant(sim: BatchSim) -> None:
    m = sim.model
    if sim.system != "pendulum":
        raise UserError(f"the dynamic-programming optimum is for the pendulum, not {sim.system}")
    if (m.v_max <= 0 or m.delay or any(m.noise_std[k] for k in range(m.nx))
            or any(m.enc_counts[k] for k in range(m.nx))):
        raise UserError(f"the dynamic-programming optimum needs a pendulum preset with a "
                        f"velocity limit, no delay, exact sensors; {sim.preset!r} is not one "
                        "(use --preset gym)")


class ValueTable:
    """V on the grid, and the bilinear interpolation that reads it anywhere."""

    def __init__(self, values: np.ndarray, v_max: float):
        self.values = values                   # (n_angle, n_speed)
        self.v_max = float(v_max)
        self.n_angle, self.n_speed = values.shape
        self.flat = values.reshape(-1)

    def angles(self) -> np.ndarray:
        return -np.pi + 2 * np.pi * np.arange(self.n_angle) / self.n_angle

    def speeds(self) -> np.ndarray:
        return np.linspace(-self.v_max, self.v_max, self.n_speed)

    def stencil(self, angle: np.ndarray, speed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flat indices (..., 4) and weights (..., 4) of the four grid points
        around each (angle, speed): the angle wraps, the speed is clamped."""
        fa = (np.asarray(angle) + np.pi) * (self.n_angle / (2 * np.pi))
        fs = (np.clip(speed, -self.v_max, self.v_max) + self.v_max) * (
            (self.n_speed - 1) / (2 * self.v_max))
        ia = np.floor(fa)
        wa = fa - ia
        ia = ia.astype(np.int64) % self.n_angle
        ia1 = (ia + 1) % self.n_angle
        js = np.minimum(np.floor(fs).astype(np.int64), self.n_speed - 2)
        ws = fs - js
        idx = np.stack([ia * self.n_speed + js, ia * self.n_speed + js + 1,
                        ia1 * self.n_speed + js, ia1 * self.n_speed + js + 1], axis=-1)
        w = np.stack([(1 - wa) * (1 - ws), (1 - wa) * ws, wa * (1 - ws), wa * ws], axis=-1)
        return idx, w

    def __call__(self, angle, speed) -> np.ndarray:
        idx, w = self.stencil(angle, speed)
        return (self.flat[idx] * w).sum(-1)


def one_step(sim: BatchSim, x: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Next states (n, 2) and rewards (n,) of one simulator step from states
    ``x`` (n, 2) under torques ``u`` (n,); ``sim`` has n environments."""
    sim.set_state({"x": x, "t": np.zeros(len(x), np.int32)})
    _, reward, _, _ = sim.step(u.astype(np.float32))
    return sim.get_state()["x"], reward.copy()


def transitions(system: str, preset: str, grid: DPGrid):
    """Stencils and rewards of every (grid state, grid action): indices and
    weights (n_actions, S, 4), rewards (n_actions, S)."""
    sim = BatchSim(system, grid.n_angle * grid.n_speed, preset)
    _check_plant(sim)
    table = ValueTable(np.zeros((grid.n_angle, grid.n_speed)), sim.model.v_max)
    a, s = np.meshgrid(table.angles(), table.speeds(), indexing="ij")
    x = np.stack([a.reshape(-1), s.reshape(-1)], axis=1)
    idx, w, r = [], [], []
    for u in np.linspace(-sim.spec.u_max, sim.spec.u_max, grid.n_actions):
        xn, reward = one_step(sim, x, np.full(len(x), u))
        i, wt = table.stencil(xn[:, 0], xn[:, 1])
        idx.append(i.astype(np.int32))
        w.append(wt)
        r.append(reward)
    return np.stack(idx), np.stack(w), np.stack(r), sim.model.v_max


def bellman(values: np.ndarray, idx, w, r, gamma: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """One sweep: max over actions of r + gamma V(f), and the maximising action index."""
    flat = values.reshape(-1)
    q = r + gamma * (flat[idx] * w).sum(-1)       # (n_actions, S)
    best = q.argmax(0)
    return q.max(0).reshape(values.shape), best.reshape(values.shape)


def value_iteration(system: str = "pendulum", preset: str = "gym", grid: DPGrid = DPGrid()):
    """(ValueTable, sweeps, last change): sweeps of ``bellman`` from V = 0
    until no value moves more than ``grid.tol``."""
    idx, w, r, v_max = transitions(system, preset, grid)
    values = np.zeros((grid.n_angle, grid.n_speed))
    for sweep in range(1, grid.max_sweeps + 1):
        new, _ = bellman(values, idx, w, r)
        change = float(np.abs(new - values).max())
        values = new
        if change < grid.tol:
            break
    return ValueTable(values, v_max), sweep, change


def horizon_values(steps: int, gamma: float, system: str = "pendulum", preset: str = "gym",
                   grid: DPGrid = DPGrid()) -> ValueTable:
    """The best return of ``steps`` decisions discounted by ``gamma``, nothing
    after them: ``steps - 1`` sweeps from V = 0, the last decision being the
    controller's own look-ahead (``OptimalPendulum(..., gamma=gamma)``). This
    is the objective a GRPO branch optimises for a loss step that sees
    ``steps`` rewards ahead (docs/research.md §2: what the objective costs)."""
    idx, w, r, v_max = transitions(system, preset, grid)
    values = np.zeros((grid.n_angle, grid.n_speed))
    for _ in range(steps - 1):
        values, _ = bellman(values, idx, w, r, gamma)
    return ValueTable(values, v_max)


def _cache_key(system: str, preset: str, grid: DPGrid) -> str:
    sim = BatchSim(system, 1, preset)
    m = sim.model
    model = (m.dt, m.substeps, m.integrator, m.u_max, m.v_max, m.w_u, list(m.w_x)[:m.nx],
             sim.get_state()["param"][0].tolist())
    text = repr((1, system, preset, model, sorted(asdict(grid).items())))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_or_compute(system: str = "pendulum", preset: str = "gym",
                    grid: DPGrid = DPGrid()) -> ValueTable:
    """The converged table, from the cache when it is there."""
    from grpo_ctrl.files import atomic_write
    _check_plant(BatchSim(system, 1, preset))
    path = cache_dir() / f"optimum-{system}-{preset}-{_cache_key(system, preset, grid)}.npz"
    if path.exists():
        with np.load(path) as z:
            return ValueTable(z["values"], float(z["v_max"]))
    table, sweeps, change = value_iteration(system, preset, grid)
    if change >= grid.tol:
        raise RuntimeError(f"value iteration did not converge in {sweeps} sweeps "
                           f"(last change {change:.2e})")
    buf = io.BytesIO()
    np.savez(buf, values=table.values, v_max=table.v_max)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # atomic_write wants the folder there
        atomic_write(path, buf.getvalue())
    except (OSError, UserError):
        pass  # an unwritable cache only costs the next call the computation
    return table


class OptimalPendulum(nn.Module):
    """Feedback from the value table by one step of look-ahead (see module doc)."""

    def __init__(self, spec: PlantSpec, table: ValueTable, lookahead_actions: int = 81,
                 gamma: float = 1.0):
        super().__init__()
        self.spec = spec
        self.table = table
        self.gamma = float(gamma)  # discount of the table's values (horizon_values)
        self.torques = np.linspace(-spec.u_max, spec.u_max, lookahead_actions)
        self._sim = None

    def _scratch(self, n: int) -> BatchSim:
        if self._sim is None or self._sim.num_envs != n:
            self._sim = BatchSim(self.spec.system, n, self.spec.preset)
        return self._sim

    @torch.no_grad()
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        o = obs.detach().cpu().numpy().astype(np.float64)
        x = np.stack([np.arctan2(o[:, 1], o[:, 0]), o[:, 2]], axis=1)
        n, k = len(x), len(self.torques)
        xs = np.repeat(x, k, axis=0)
        us = np.tile(self.torques, n)
        xn, r = one_step(self._scratch(n * k), xs, us)
        q = (r + self.gamma * self.table(xn[:, 0], xn[:, 1])).reshape(n, k)
        u = self.torques[q.argmax(1)]
        return torch.as_tensor(u, dtype=torch.float32).reshape(-1, 1)


def make_optimum(system: str = "pendulum", preset: str | None = None,
                 grid: DPGrid = DPGrid()) -> OptimalPendulum:
    if system != "pendulum":
        raise UserError(f"the dynamic-programming optimum is for the pendulum, not {system}")
    preset = preset or "gym"
    table = load_or_compute(system, preset, grid)
    return OptimalPendulum(BatchSim(system, 1, preset).spec, table, grid.lookahead_actions)
