"""Energy-based swing-up with a switch to LQR near upright.

Far from upright the controller drives the energy E of the plant towards
its value at upright rest, E_up; near upright the LQR takes over.

* Pendulum (Astrom and Furuta 2000): with E the pendulum's energy, a torque
  u gives dE/dt = thd (u - friction), so u = k (E_up - E) thd, saturated,
  raises or lowers E monotonically towards E_up.
* Cart-pole and Furuta: the same idea on the actuated coordinate q (cart
  position, arm angle) would let the cart or arm drift without bound, so we
  use its Lyapunov extension (Lozano, Fantoni and Block 2000 for the
  cart-pole; Fantoni and Lozano 2002 for the Furuta pendulum):
  with E the total energy and generalised force tau on q,
      V = (E - E_up)^2 / 2 + kv qd^2 / 2 + kq q^2 / 2,
      dV/dt = qd ((E - E_up) tau + kv qdd + kq q),
  and since qdd = f(x) + g(x) tau is affine in tau, the choice
      tau = -(kv f + kq q + kd qd) / (E - E_up + kv g)
  gives dV/dt = -kd qd^2 <= 0: the energy goes to E_up while the cart or
  arm comes back to rest at the middle, i.e. the state approaches the
  homoclinic orbit through upright. kv > E_up / min g keeps the denominator
  positive everywhere (E >= 0). kq and kd are set by a natural frequency and
  damping ratio of the cart/arm centring (qdd ~ -kq/kv q - kd/kv qd).

The switch is a region test, not a memory: LQR acts inside the level set
x'Px < c of its cost-to-go, the energy law outside it. The cart's position
and the arm's angle do not enter the dynamics, so they are left out of the
test (the LQR brings them back once it holds the pendulum). A pure function
of the observation keeps the controller stateless, so its ONNX and C exports
compute exactly the function of the torch module; a hysteresis would need
the last mode as a state.

Every energy target carries a small margin so that the pendulum reaches the
top with some speed instead of creeping along the homoclinic orbit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from grpo_ctrl.baselines.lqr import LQRDesign, design, obs_to_state
from grpo_ctrl.sim import BatchSim, PlantSpec

# state components that do not enter the dynamics (cart position, arm angle)
CYCLIC = {"pendulum": (), "cartpole": (0,), "furuta": (0,)}


@dataclass(frozen=True)
class SwingUpParams:
    """Tuning of one plant's swing-up."""
    energy_margin: float       # drive E to E_up (1 + margin)
    region_level: float        # LQR inside x'Px < region_level
    k_energy: float            # pendulum: N m per (J rad/s); cart/arm: acceleration per J
    accel_limit: float = 0.0   # cart/arm: cap on the pumping acceleration (m/s^2, rad/s^2)
    centre_freq: float = 0.0   # cart/arm: natural frequency of the centring PD, rad/s
    centre_damping: float = 1.0  # and its damping ratio


# tuned on the batched simulator; `grpo-ctrl baselines` reports the result
TUNING = {
    ("pendulum", "gym"): SwingUpParams(k_energy=50.0, energy_margin=0.0, region_level=3.0),
    ("pendulum", "rig"): SwingUpParams(k_energy=50.0, energy_margin=0.02, region_level=10.0),
    ("cartpole", "gym"): SwingUpParams(k_energy=10.0, accel_limit=5.0, centre_freq=1.0,
                                       centre_damping=0.7, energy_margin=0.02,
                                       region_level=10.0),
    ("cartpole", "swingup"): SwingUpParams(k_energy=10.0, accel_limit=5.0, centre_freq=1.0,
                                           centre_damping=0.7, energy_margin=0.02,
                                           region_level=10.0),
    ("furuta", "qube-servo2"): SwingUpParams(k_energy=1e4, accel_limit=50.0,
                                             centre_freq=3.0, energy_margin=0.02,
                                             region_level=10.0),
}


class SwingUpLQR(nn.Module):
    """Energy control outside the LQR's region, LQR inside it. Subclasses
    supply the plant's energy law ``pump(x)``."""

    def __init__(self, spec: PlantSpec, lqr: LQRDesign, params: dict[str, float],
                 tuning: SwingUpParams):
        super().__init__()
        self.spec, self.lqr, self.tuning = spec, lqr, tuning
        self.p = params
        self.register_buffer("gain", torch.tensor(lqr.K, dtype=torch.float32))
        self.register_buffer("cost_to_go", torch.tensor(lqr.P, dtype=torch.float32))
        keep = torch.ones(1, spec.nx)
        keep[0, list(CYCLIC[spec.system])] = 0.0
        self.register_buffer("catch_coords", keep)

    def pump(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs_to_state(self.spec.system, obs)
        u_lqr = -(x @ self.gain.T)
        xc = x * self.catch_coords
        level = ((xc @ self.cost_to_go) * xc).sum(dim=1, keepdim=True)
        u = torch.where(level < self.tuning.region_level, u_lqr, self.pump(x))
        return torch.clamp(u, -self.spec.u_max, self.spec.u_max)


class PendulumSwingUp(SwingUpLQR):
    def energy(self, x):
        g, m, l = self.p["g"], self.p["m"], self.p["l"]
        th, thd = x[:, 0:1], x[:, 1:2]
        return 0.5 * (m * l * l / 3.0) * thd * thd + 0.5 * m * g * l * (1.0 + torch.cos(th))

    def pump(self, x):
        g, m, l = self.p["g"], self.p["m"], self.p["l"]
        target = m * g * l * (1.0 + self.tuning.energy_margin)
        return self.tuning.k_energy * (target - self.energy(x)) * x[:, 1:2]


class CollocatedSwingUp(SwingUpLQR):
    """Energy pumping through the actuated coordinate q (cart position or
    arm angle) for a pendulum carried by it. The input is computed so that
    q's acceleration equals a chosen v (collocated partial feedback
    linearisation, Spong 1995: qdd = f(x) + g(x) tau is affine in tau), and
    v is Astrom and Furuta's pivot law plus a PD that keeps q near zero:
        v = clip(k (E_up - E) sign(pump_direction), +-a_max) - w^2 q - 2 z w qd.
    Subclasses give the pendulum energy, its upright value, the affine parts
    (f, g), the direction in which q's acceleration adds energy, and the map
    from generalised force to actuator command."""
    upright_energy: float

    def pump(self, x):
        t = self.tuning
        f, g = self.accel_affine(x)
        q, qd = x[:, 0:1], x[:, ACTUATED_VELOCITY[self.spec.system]:][:, 0:1]
        target = self.upright_energy * (1.0 + t.energy_margin)
        push = torch.clamp(t.k_energy * (target - self.pole_energy(x))
                           * torch.sign(self.pump_direction(x)), -t.accel_limit, t.accel_limit)
        v = push - t.centre_freq ** 2 * q - 2.0 * t.centre_damping * t.centre_freq * qd
        return self.command((v - f) / g, x)


class CartPoleSwingUp(CollocatedSwingUp):
    """Gymnasium's cart-pole equations (pole half-length l, theta clockwise)."""

    def __init__(self, spec, lqr, params, tuning):
        self.upright_energy = 2.0 * params["mp"] * params["g"] * params["l"]
        super().__init__(spec, lqr, params, tuning)

    def pole_energy(self, x):
        """The pole's energy about its hinge, zero hanging at rest."""
        g, mp, l = self.p["g"], self.p["mp"], self.p["l"]
        th, thd = x[:, 2:3], x[:, 3:4]
        return 0.5 * (4.0 / 3.0 * mp * l * l) * thd * thd + mp * g * l * (1.0 + torch.cos(th))

    def pump_direction(self, x):
        """A cart acceleration a gives the pole dE/dt = -mp l a thd cos th."""
        return -x[:, 3:4] * torch.cos(x[:, 2:3])

    def accel_affine(self, x):
        """Cart acceleration = f + g * force."""
        g, mc, mp, l = self.p["g"], self.p["mc"], self.p["mp"], self.p["l"]
        total = mc + mp
        th, thd = x[:, 2:3], x[:, 3:4]
        c, s = torch.cos(th), torch.sin(th)
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

    def __init__(self, spec, lqr, params, tuning):
        self.upright_energy = params["mp"] * params["g"] * params["lp"]
        super().__init__(spec, lqr, params, tuning)

    def _inertia(self, al):
        p = self.p
        s, c = torch.sin(al), torch.cos(al)
        m11 = p["jr"] + p["mp"] * p["lr"] ** 2 + 0.25 * p["mp"] * p["lp"] ** 2 * s * s
        m12 = -0.5 * p["mp"] * p["lp"] * p["lr"] * c
        m22 = p["jp"] + 0.25 * p["mp"] * p["lp"] ** 2
        return m11, m12, m22

    def pole_energy(self, x):
        """The pendulum's energy about its pivot, zero hanging at rest."""
        p = self.p
        al, ald = x[:, 1:2], x[:, 3:4]
        return (0.5 * (p["jp"] + 0.25 * p["mp"] * p["lp"] ** 2) * ald * ald
                + 0.5 * p["mp"] * p["g"] * p["lp"] * (1.0 + torch.cos(al)))

    def pump_direction(self, x):
        """An arm acceleration thdd gives the pendulum
        dE/dt = (mp lp lr / 2) thdd ald cos al (plus a centrifugal term)."""
        return x[:, 3:4] * torch.cos(x[:, 1:2])

    def accel_affine(self, x):
        """Arm acceleration = f + g * torque."""
        p = self.p
        al, thd, ald = x[:, 1:2], x[:, 2:3], x[:, 3:4]
        s, c = torch.sin(al), torch.cos(al)
        m11, m12, m22 = self._inertia(al)
        mp, lp, lr = p["mp"], p["lp"], p["lr"]
        r1 = -p["dr"] * thd - 0.5 * mp * lp * lp * s * c * thd * ald - 0.5 * mp * lp * lr * s * ald * ald
        r2 = -p["dp"] * ald + 0.25 * mp * lp * lp * s * c * thd * thd + 0.5 * mp * p["g"] * lp * s
        det = m11 * m22 - m12 * m12
        return (m22 * r1 - m12 * r2) / det, m22 / det

    def command(self, tau, x):
        """Voltage giving torque tau through the motor's resistance and back-EMF."""
        return self.p["rm"] / self.p["km"] * tau + self.p["km"] * x[:, 2:3]


ACTUATED_VELOCITY = {"cartpole": 1, "furuta": 2}
_CLASSES = {"pendulum": PendulumSwingUp, "cartpole": CartPoleSwingUp, "furuta": FurutaSwingUp}


def make_swingup_lqr(system: str, preset: str | None = None,
                     tuning: SwingUpParams | None = None) -> SwingUpLQR:
    sim = BatchSim(system, 1, preset)
    spec = sim.spec
    if tuning is None:
        tuning = TUNING.get((system, spec.preset))
    if tuning is None:
        raise ValueError(f"no swing-up tuning for {system}/{spec.preset}; pass one "
                         f"(known: {sorted(TUNING)})")
    params = dict(zip(spec.param_names, (float(v) for v in sim.get_state()["param"][0])))
    return _CLASSES[system](spec, design(system, spec.preset), params, tuning)
