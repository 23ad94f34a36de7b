"""Linear models of a plant about an equilibrium, from the C simulator itself.

Continuous time: ``xdot ~ A dx + B du`` by central differences of
``BatchSim.dynamics``. Discrete time: ``discrete_by_simulation``, central
differences of one control step taken by the simulator (``set_state`` then
``step``), so the model includes the preset's integrator, substeps and
float32 action. This is what the LQR design uses: it is the map the
controller really acts on. (The tests check it against the exact
zero-order hold of (A, B), which it equals up to the integrator's error.)
"""
from __future__ import annotations

import numpy as np

from grpo_ctrl.sim import BatchSim

def equilibrium(sim: BatchSim) -> tuple[np.ndarray, float]:
    """The upright equilibrium (every angle and velocity zero, cart at the
    origin) and its holding input, zero for every plant here."""
    return np.zeros(sim.spec.nx), 0.0


def linearize(sim: BatchSim, x0=None, u0: float = 0.0, eps: float = 1e-6, env: int = 0):
    """Continuous-time Jacobians ``A = df/dx (nx, nx)`` and ``B = df/du (nx, 1)``
    at ``(x0, u0)`` by central differences of the C dynamics."""
    x0 = equilibrium(sim)[0] if x0 is None else np.asarray(x0, dtype=float)
    nx = sim.spec.nx
    A = np.empty((nx, nx))
    for k in range(nx):
        dx = np.zeros(nx)
        dx[k] = eps
        A[:, k] = (sim.dynamics(x0 + dx, u0, env) - sim.dynamics(x0 - dx, u0, env)) / (2 * eps)
    B = ((sim.dynamics(x0, u0 + eps, env) - sim.dynamics(x0, u0 - eps, env)) / (2 * eps))
    return A, B[:, None]


def discrete_by_simulation(sim: BatchSim, x0=None, u0: float = 0.0, eps_x: float = 1e-6,
                           eps_u: float = 1e-3):
    """Discrete-time Jacobians of one control step ``x+ = F(x, u)`` of the
    simulator, by central differences through ``set_state`` / ``step``.

    Uses a private copy of the plant's model (``sim`` is not disturbed).
    The action is float32, so its step ``eps_u`` is coarse; that is exact
    here because every plant is affine in its input."""
    x0 = equilibrium(sim)[0] if x0 is None else np.asarray(x0, dtype=float)
    nx = sim.spec.nx
    # 2 nx + 2 probes, stepped at once on a scratch copy of the plant
    probes = BatchSim(sim.system, 2 * nx + 2, preset=sim.preset)
    probes.model[0] = sim.model[0]
    if probes.model.delay:
        raise ValueError("discrete_by_simulation needs delay = 0: a delayed plant's step "
                         "does not depend on the current action")
    X = np.repeat(x0[None, :], 2 * nx + 2, axis=0)
    for k in range(nx):
        X[2 * k, k] += eps_x
        X[2 * k + 1, k] -= eps_x
    u = np.full(2 * nx + 2, u0, np.float32)
    u[-2] += np.float32(eps_u)
    u[-1] -= np.float32(eps_u)
    du = float(u[-2]) - float(u[-1])  # the float32 step actually taken
    param = sim.get_state()["param"][:1].repeat(2 * nx + 2, axis=0)
    probes.set_state({"x": X, "param": param})
    probes.step(u)
    Xn = probes.get_state()["x"]
    Ad = np.stack([(Xn[2 * k] - Xn[2 * k + 1]) / (2 * eps_x) for k in range(nx)], axis=1)
    Bd = ((Xn[-2] - Xn[-1]) / du)[:, None]
    return Ad, Bd
