"""Discrete-time LQR, solved in numpy, and the LQR controller.

The discrete algebraic Riccati equation

    P = A'PA - A'PB (R + B'PB)^-1 B'PA + Q

is solved by the structure-preserving doubling algorithm (Chu, Fan, Lin and
Wang 2004), which converges quadratically: about a dozen iterations where
plain value iteration needs thousands at the Furuta's 500 Hz. The gain
K = (R + B'PB)^-1 B'PA gives u = -K x.

Both are computed in Python floats, each sum correctly rounded (``math.fsum``), not
through numpy's BLAS: OpenBLAS picks its kernels by CPU, and the acrobot's iteration
carried their rounding to 3e-11 of P and K (Haswell against Sandybridge kernels on one
AMD EPYC), which the catch (``catch_overrides``) put into every training step, so a
fixed seed trained to other weights on another CPU. The plants' matrices are at most 4 x 4
(a design takes 4-7 ms).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from grpo_ctrl._pendsim import lib
from grpo_ctrl.baselines import portable
from grpo_ctrl.baselines.linearize import discrete_by_simulation, equilibrium
from grpo_ctrl.plant import PlantSpec, plant_spec
from grpo_ctrl.presets import LQR_WEIGHTS
from grpo_ctrl.sim import BatchSim


def _matmul(X: list, Y: list) -> list:
    """X Y for lists of rows, each entry a correctly rounded sum of the rounded products."""
    cols = list(zip(*Y))
    return [[math.fsum(a * b for a, b in zip(row, col)) for col in cols] for row in X]


def _solve(M: list, Y: list) -> list:
    """M^-1 Y by Gauss-Jordan elimination with partial pivoting; ``ValueError`` where M is
    singular."""
    n = len(M)
    rows = [list(M[i]) + list(Y[i]) for i in range(n)]
    for c in range(n):
        pivot = max(range(c, n), key=lambda r: abs(rows[r][c]))
        if not rows[pivot][c] or not math.isfinite(rows[pivot][c]):
            raise ValueError("singular matrix")
        rows[c], rows[pivot] = rows[pivot], rows[c]
        inverse = 1.0 / rows[c][c]
        rows[c] = [v * inverse for v in rows[c]]
        for r in range(n):
            if r != c and rows[r][c]:
                f = rows[r][c]
                rows[r] = [v - f * w for v, w in zip(rows[r], rows[c])]
    return [row[n:] for row in rows]


def _transpose(X: list) -> list:
    return [list(col) for col in zip(*X)]


def _add(X: list, Y: list) -> list:
    return [[a + b for a, b in zip(x, y)] for x, y in zip(X, Y)]


def _rows(X) -> list:
    return [[float(v) for v in row] for row in np.asarray(X, dtype=float)]


def _norm1(X: list) -> float:
    return max(math.fsum(abs(v) for v in col) for col in zip(*X))


def solve_dare(A: np.ndarray, B: np.ndarray, Q: np.ndarray, R: np.ndarray,
               tol: float = 1e-12, max_iter: int = 100) -> np.ndarray:
    """The stabilising solution P of the discrete algebraic Riccati equation,
    by structure-preserving doubling. Raises ``ValueError`` if it does not
    converge (e.g. (A, B) not stabilisable)."""
    A, B, Q, R = _rows(A), _rows(B), _rows(Q), _rows(R)
    n = len(A)
    I = [[float(i == j) for j in range(n)] for i in range(n)]
    try:
        Ak, Hk = A, Q
        Gk = _matmul(B, _solve(R, _transpose(B)))
        for _ in range(max_iter):
            W = _add(I, _matmul(Gk, Hk))
            # A_k W^-1 and W^-1 A_k, the two solves each doubling step needs
            AW = _transpose(_solve(_transpose(W), _transpose(Ak)))
            WA = _solve(W, Ak)
            H_next = _add(Hk, _matmul(_matmul(_transpose(Ak), Hk), WA))
            Gk = _add(Gk, _matmul(_matmul(AW, Gk), _transpose(Ak)))
            Ak = _matmul(AW, Ak)
            if not all(math.isfinite(v) for row in H_next for v in row):
                break
            done = (_norm1([[a - b for a, b in zip(x, y)] for x, y in zip(H_next, Hk)])
                    <= tol * max(1.0, _norm1(H_next)))
            Hk = [[0.5 * (H_next[i][j] + H_next[j][i]) for j in range(n)] for i in range(n)]
            if done:
                return np.array(Hk)
    except (ValueError, OverflowError):  # a singular W or an overflow: it diverged
        pass
    raise ValueError("the Riccati iteration did not converge: is (A, B) stabilisable "
                     "and Q positive semi-definite, R positive definite?")


@dataclass(frozen=True)
class LQRDesign:
    """A discrete LQR design: model, weights, gain, cost-to-go and poles."""
    A: np.ndarray
    B: np.ndarray
    Q: np.ndarray
    R: np.ndarray
    K: np.ndarray      # (1, nx): u = -K x
    P: np.ndarray      # cost-to-go x'Px
    poles: np.ndarray  # eigenvalues of A - B K


def dlqr(A, B, Q, R) -> LQRDesign:
    P = solve_dare(A, B, Q, R)
    BtP = _matmul(_transpose(_rows(B)), _rows(P))
    K = np.array(_solve(_add(_rows(R), _matmul(BtP, _rows(B))), _matmul(BtP, _rows(A))))
    poles = np.linalg.eigvals(A - B @ K)
    return LQRDesign(A=A, B=B, Q=Q, R=R, K=K, P=P, poles=poles)


def task_weights(sim: BatchSim) -> tuple[np.ndarray, np.ndarray]:
    """Q and R from the task's per-step quadratic cost (``w_x``, ``w_u``):
    then LQR is the task's own optimum near upright. A task without a
    quadratic cost (Gymnasium's CartPole, reward 1 per step alive) gets
    Bryson's rule: each state over its termination limit (1 where there is
    none) and the input over its saturation, squared. A preset with LQR
    weights of its own (``presets.LQR_WEIGHTS``: the double pendulum, whose
    reward is the end effector's height) uses those."""
    m, nx = sim.model, sim.spec.nx
    own = LQR_WEIGHTS.get((sim.system, sim.preset))
    if own is not None:
        return np.diag(np.asarray(own["Q"], dtype=float)), np.array([[float(own["R"])]])
    w_x = np.array([m.w_x[k] for k in range(nx)])
    if np.any(w_x > 0) and m.w_u > 0:
        return np.diag(w_x), np.array([[m.w_u]])
    limits = np.array([m.term_limit[k] if m.term_limit[k] > 0 else 1.0 for k in range(nx)])
    return np.diag(1.0 / limits**2), np.array([[1.0 / m.u_max**2]])


def design(system: str, preset: str | None = None) -> LQRDesign:
    """The LQR about upright of a plant preset, on the simulator's own
    discrete step with the task's weights.

    Coulomb friction is left out of the model: its smoothed tanh has a slope
    of fc / v_c at rest (a huge, fictitious damping) that holds only within
    v_c of zero speed, and a design that trusts it has almost no velocity
    feedback. The LQR treats it as the disturbance it is."""
    sim = BatchSim(system, 1, preset)
    for coulomb in ("fc", "cf1", "cf2"):  # the double pendulum's atan(100 v) likewise
        if coulomb in sim.spec.param_names:
            sim.set_param(coulomb, 0.0)
    x0, u0 = equilibrium(sim)
    A, B = discrete_by_simulation(sim, x0, u0)
    Q, R = task_weights(sim)
    return dlqr(A, B, Q, R)


def obs_to_state(spec: PlantSpec, obs: torch.Tensor) -> torch.Tensor:
    """The state (angles in [-pi, pi]) of an observation batch, by the
    plant's layout. The angles come from ``portable.atan2``, which torch,
    onnxruntime and the exported C round identically: the gains magnify one
    unit in the last place of an angle beyond the export's 1e-5 tolerance."""
    columns = []
    for i, angle in zip(spec.obs_index, spec.angles):
        columns.append(portable.atan2(obs[:, i + 1:i + 2], obs[:, i:i + 1]) if angle
                       else obs[:, i:i + 1])
    return torch.cat(columns, dim=1)


class LQRController(nn.Module):
    """u = clip(-K x, +-u_max) with x recovered from the observation."""

    def __init__(self, spec: PlantSpec, lqr: LQRDesign):
        super().__init__()
        self.spec = spec
        self.lqr = lqr
        self.register_buffer("gain", torch.tensor(lqr.K, dtype=torch.float32))  # (1, nx)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs_to_state(self.spec, obs)
        # summed in one fixed order, so that the export computes the same bits
        u = -portable.dot(x, self.gain[0])
        return torch.clamp(u, -self.spec.u_max, self.spec.u_max)


def make_lqr(system: str, preset: str | None = None) -> LQRController:
    spec = plant_spec(system, preset)
    return LQRController(spec, design(system, spec.preset))


def region_matrix(spec: PlantSpec, lqr: LQRDesign) -> np.ndarray:
    """The cost-to-go P whose level sets x'Px < c are the LQR's region, with the rows and
    columns of the cyclic components zeroed: a cart's position and an arm's angle do not
    enter the dynamics, so the region leaves them out (the LQR brings them back once it
    holds the pendulum)."""
    keep = np.ones(spec.nx)
    keep[list(spec.cyclic)] = 0.0
    return np.asarray(lqr.P) * keep[:, None] * keep[None, :]


# the catch's blend: the LQR's share falls from 1 to 0 as sqrt(x'Px / level) goes from 1 to
# this (csrc/pendsim.h)
CATCH_BAND = float(lib.PS_CATCH_BAND)


class LQRCatch(nn.Module):
    """A controller that the LQR about upright catches: with v = x'Px on the LQR's cost-to-go
    (``region_matrix``), the command is the LQR's clip(-K x) where v < level, the inner
    controller's where v > CATCH_BAND^2 level, and between the two a blend whose LQR share
    falls linearly in sqrt(v) from 1 to 0: the handover moves the command continuously (a
    jump of the torque at the switch alone costs RealAIGym's smoothness criterion as much as
    a whole swing-up; a band of v from level to 2 level, crossed in 11 steps, most of it).
    A function of the observation, as ``SwingUpLQR``'s switch: stateless, so its ONNX and C
    exports compute the function of this module.

    ``GRPOConfig.catch`` trains a policy with the same catch in the simulator's step
    (``catch_overrides``), so that the policy learns to bring the plant into the region
    rather than to balance it (the acrobot: docs/double_pendulum.md)."""

    def __init__(self, inner: nn.Module, spec: PlantSpec, lqr: LQRDesign, level: float):
        super().__init__()
        if not level > 0:
            raise ValueError(f"the catch's level must be > 0, got {level!r}")
        self.inner, self.spec, self.lqr, self.level = inner, spec, lqr, float(level)
        self.source_info = dict(getattr(inner, "source_info", {}))
        self.register_buffer("gain", torch.tensor(lqr.K, dtype=torch.float32))
        self.register_buffer("cost_to_go", torch.tensor(region_matrix(spec, lqr),
                                                        dtype=torch.float32))

    def share(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 1): the LQR's share of the command at states x (N, nx)."""
        v = torch.clamp(portable.quadratic_form(x, self.cost_to_go), min=0.0)
        return torch.clamp((CATCH_BAND - torch.sqrt(v / self.level)) / (CATCH_BAND - 1.0),
                           0.0, 1.0)

    def lqr_share(self, obs: torch.Tensor) -> torch.Tensor:
        """(N, 1): the LQR's share of the command for observations obs (N, nobs)."""
        return self.share(obs_to_state(self.spec, obs))

    def blend(self, x: torch.Tensor, inner: torch.Tensor) -> torch.Tensor:
        """(N, 1): the command at states x (N, nx) where the inner controller commands
        ``inner`` (N, 1)."""
        share = self.share(x)
        u_max = self.spec.u_max
        lqr = torch.clamp(-portable.dot(x, self.gain[0]), -u_max, u_max)
        return torch.clamp(share * lqr + (1.0 - share) * inner, -u_max, u_max)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.blend(obs_to_state(self.spec, obs), self.inner(obs))


def catch_overrides(spec: PlantSpec, level: float) -> dict:
    """``BatchSim`` model overrides that put ``LQRCatch``'s switch into the simulator's step
    (csrc/pendsim.h, ``catch_level``): where x'Px < level the plant receives clip(-K x)
    whatever the action, blended into the action up to CATCH_BAND^2 level. Empty for level 0."""
    if level == 0:
        return {}
    lqr = design(spec.system, spec.preset)
    return {"catch_level": float(level), "catch_K": np.asarray(lqr.K, dtype=float).reshape(-1),
            "catch_P": region_matrix(spec, lqr)}
