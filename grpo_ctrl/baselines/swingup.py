"""Energy-based swing-up (Astrom and Furuta 2000) with a switch to LQR.

Far from upright the controller drives the pendulum's energy E (about its
pivot, zero hanging at rest) towards its upright value E_up; near upright the
LQR takes over.

* Pendulum: a torque u gives dE/dt = thd (u - friction), so
  u = k (E_up - E) thd, saturated, moves E monotonically towards E_up.
* Cart-pole and Furuta: the pendulum is pumped by the acceleration of its
  pivot, dE/dt = c(x) qdd (pump_direction below), where q is the cart
  position or the arm angle. Because qdd = f(x) + g(x) tau is affine in the
  generalised force tau, the input is computed so that q follows a chosen
  acceleration v exactly (collocated partial feedback linearisation, Spong
  1995): tau = (v - f) / g, with
      v = clip(k (E_up - E) sign(c), +-a_max) - w^2 q - 2 z w qd,
  Astrom and Furuta's pivot law plus a PD that keeps the cart or arm near
  the middle of its range. The acceleration cap a_max sets how hard the
  pumping is and so how far the cart or arm travels.

The switch is a region test, not a memory: LQR acts inside the level set
x'Px < c of its cost-to-go, the energy law outside it. The cart's position
and the arm's angle do not enter the dynamics, so they are left out of the
test (the LQR brings them back once it holds the pendulum). A pure function
of the observation keeps the controller stateless, so its ONNX and C exports
compute exactly the function of the torch module; a hysteresis would need
the last mode as a state.

An energy target a little above E_up makes the pendulum reach the top with
some speed instead of creeping along the homoclinic orbit.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

import torch
from torch import nn

from grpo_ctrl.baselines import portable
from grpo_ctrl.baselines.lqr import LQRDesign, design, obs_to_state, region_matrix
from grpo_ctrl.errors import UserError
from grpo_ctrl.plant import PlantSpec
from grpo_ctrl.presets import SWINGUP
from grpo_ctrl.sim import BatchSim


@dataclass(frozen=True)
class SwingUpParams:
    """Tuning of one plant's swing-up."""
    energy_margin: float       # drive E to E_up (1 + margin)
    region_level: float        # LQR inside x'Px < region_level
    k_energy: float            # pendulum: N m per (J rad/s); cart/arm: acceleration per J
    accel_limit: float = 0.0   # cart/arm: cap on the pumping acceleration (m/s^2, rad/s^2)
    centre_freq: float = 0.0   # cart/arm: natural frequency of the centring PD, rad/s
    centre_damping: float = 1.0  # and its damping ratio


class SwingUpLQR(nn.Module, abc.ABC):
    """Energy control outside the LQR's region, LQR inside it. Subclasses
    supply the plant's energy law ``pump(x)``; ``p`` holds the plant's
    nominal parameters by name."""

    def __init__(self, spec: PlantSpec, lqr: LQRDesign, params: dict[str, float],
                 tuning: SwingUpParams):
        super().__init__()
        self.spec, self.lqr, self.tuning = spec, lqr, tuning
        self.p = params
        self.register_buffer("gain", torch.tensor(lqr.K, dtype=torch.float32))
        self.register_buffer("cost_to_go", torch.tensor(region_matrix(spec, lqr),
                                                        dtype=torch.float32))

    @abc.abstractmethod
    def pump(self, x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The energy law's command for states x (N, nx) whose pole angle has
        cosine c and sine s (N, 1)."""

    def in_lqr_region(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 1) bool: whether states x (N, nx) are in the LQR's region."""
        return portable.quadratic_form(x, self.cost_to_go) < self.tuning.region_level

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        """(N, 1) bool: whether the LQR acts on observations obs (N, nobs)."""
        return self.in_lqr_region(obs_to_state(self.spec, obs))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs_to_state(self.spec, obs)
        # the energy laws take the pole's cosine and sine from the observation
        # itself: exact, and no cos(atan2(...)) round trip to differ between
        # torch and an ONNX runtime
        i = self.spec.pole_obs
        c, s = obs[:, i:i + 1], obs[:, i + 1:i + 2]
        u = torch.where(self.in_lqr_region(x), -portable.dot(x, self.gain[0]), self.pump(x, c, s))
        return torch.clamp(u, -self.spec.u_max, self.spec.u_max)


class PendulumSwingUp(SwingUpLQR):
    """Centre of mass at com l, inertia inertia m l^2 about the pivot (csrc/pendsim.h)."""

    def pole_energy(self, x, c):
        g, m, l = self.p["g"], self.p["m"], self.p["l"]
        thd = x[:, 1:2]
        return (0.5 * (self.p["inertia"] * m * l * l) * thd * thd
                + self.p["com"] * m * g * l * (1.0 + c))

    def pump(self, x, c, s):
        g, m, l = self.p["g"], self.p["m"], self.p["l"]
        target = 2.0 * self.p["com"] * m * g * l * (1.0 + self.tuning.energy_margin)
        thd = x[:, 1:2]
        # at rest (an encoder-differenced speed is exactly 0) pump as if moving
        # at 1 rad/s: the law alone would never leave the hanging equilibrium
        moving = torch.where(thd == 0.0, torch.ones_like(thd), thd)
        return self.tuning.k_energy * (target - self.pole_energy(x, c)) * moving


class CollocatedSwingUp(SwingUpLQR):
    """Energy pumping through the pivot's acceleration for a pendulum on a
    cart or arm (see the module's docstring). Subclasses give the pendulum
    energy, its upright value, the affine parts (f, g) of the actuated
    acceleration, the sign of the pumping acceleration and the map from
    generalised force to actuator command."""
    upright_energy: float
    velocity_index: int  # where the cart's or arm's velocity sits in the state

    def pump(self, x, c, s):
        t = self.tuning
        f, g = self.accel_affine(x, c, s)
        i = self.velocity_index
        q, qd = x[:, 0:1], x[:, i:i + 1]
        target = self.upright_energy * (1.0 + t.energy_margin)
        # sign(0) taken as +1, so that rest at the bottom is left too
        direction = torch.where(self.pump_direction(x, c) >= 0.0, 1.0, -1.0)
        push = torch.clamp(t.k_energy * (target - self.pole_energy(x, c)) * direction,
                           -t.accel_limit, t.accel_limit)
        v = push - t.centre_freq ** 2 * q - 2.0 * t.centre_damping * t.centre_freq * qd
        return self.command((v - f) / g, x)


class CartPoleSwingUp(CollocatedSwingUp):
    """Gymnasium's cart-pole equations (pole half-length l, theta clockwise)."""
    velocity_index = 1

    def __init__(self, spec, lqr, params, tuning):
        super().__init__(spec, lqr, params, tuning)
        self.upright_energy = 2.0 * params["mp"] * params["g"] * params["l"]

    def pole_energy(self, x, c):
        """The pole's energy about its hinge, zero hanging at rest."""
        g, mp, l = self.p["g"], self.p["mp"], self.p["l"]
        thd = x[:, 3:4]
        return 0.5 * (4.0 / 3.0 * mp * l * l) * thd * thd + mp * g * l * (1.0 + c)

    def pump_direction(self, x, c):
        """A cart acceleration a gives the pole dE/dt = -mp l a thd cos th."""
        return -x[:, 3:4] * c

    def accel_affine(self, x, c, s):
        """Cart acceleration = f + g * force."""
        g, mc, mp, l = self.p["g"], self.p["mc"], self.p["mp"], self.p["l"]
        total = mc + mp
        thd = x[:, 3:4]
        denom = l * (4.0 / 3.0 - mp * c * c / total)
        temp0 = mp * l * thd * thd * s / total          # temp at zero force
        thacc0 = (g * s - c * temp0) / denom
        f = temp0 - mp * l * thacc0 * c / total
        gain = (1.0 + mp * l * c * c / (total * denom)) / total
        return f, gain

    def command(self, tau, x):
        return tau


class FurutaSwingUp(CollocatedSwingUp):
    """The Qube-Servo 2 equations of csrc/plants.c, driven by arm torque."""
    velocity_index = 2

    def __init__(self, spec, lqr, params, tuning):
        super().__init__(spec, lqr, params, tuning)
        self.upright_energy = params["mp"] * params["g"] * params["lp"]

    def pole_energy(self, x, c):
        """The pendulum's energy about its pivot, zero hanging at rest."""
        p = self.p
        ald = x[:, 3:4]
        return (0.5 * (p["jp"] + 0.25 * p["mp"] * p["lp"] ** 2) * ald * ald
                + 0.5 * p["mp"] * p["g"] * p["lp"] * (1.0 + c))

    def pump_direction(self, x, c):
        """An arm acceleration thdd gives the pendulum
        dE/dt = (mp lp lr / 2) thdd ald cos al (plus a centrifugal term)."""
        return x[:, 3:4] * c

    def accel_affine(self, x, c, s):
        """Arm acceleration = f + g * torque, from the mass matrix
        M = [[m11, m12], [m12, m22]] and the remaining forces (r1, r2)."""
        p = self.p
        mp, lp, lr = p["mp"], p["lp"], p["lr"]
        thd, ald = x[:, 2:3], x[:, 3:4]
        m11 = p["jr"] + mp * lr * lr + 0.25 * mp * lp * lp * s * s
        m12 = -0.5 * mp * lp * lr * c
        m22 = p["jp"] + 0.25 * mp * lp * lp
        r1 = (-p["dr"] * thd - 0.5 * mp * lp * lp * s * c * thd * ald
              - 0.5 * mp * lp * lr * s * ald * ald)
        r2 = -p["dp"] * ald + 0.25 * mp * lp * lp * s * c * thd * thd + 0.5 * mp * p["g"] * lp * s
        det = m11 * m22 - m12 * m12
        return (m22 * r1 - m12 * r2) / det, m22 / det

    def command(self, tau, x):
        """Voltage giving torque tau through the motor's resistance and back-EMF."""
        return self.p["rm"] / self.p["km"] * tau + self.p["km"] * x[:, 2:3]


_CLASSES = {"pendulum": PendulumSwingUp, "cartpole": CartPoleSwingUp, "furuta": FurutaSwingUp}


def make_swingup_lqr(system: str, preset: str | None = None,
                     tuning: SwingUpParams | None = None) -> SwingUpLQR:
    if system not in _CLASSES:
        raise UserError(f"no swing-up controller for {system}; its energy law goes in "
                        "grpo_ctrl/baselines/swingup.py (the lqr baseline needs none)")
    sim = BatchSim(system, 1, preset)
    spec = sim.spec
    if tuning is None:
        if (system, spec.preset) not in SWINGUP:
            raise ValueError(f"no swing-up tuning for {system}/{spec.preset}; pass one or add "
                             f"it to grpo_ctrl/presets.py (known: {sorted(SWINGUP)})")
        tuning = SwingUpParams(**SWINGUP[(system, spec.preset)])
    params = dict(zip(spec.param_names, (float(v) for v in sim.get_state()["param"][0])))
    return _CLASSES[system](spec, design(system, spec.preset), params, tuning)
