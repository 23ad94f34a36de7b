"""The plant layer: what each plant is, as its C model says.

``csrc/plants.c`` is a plant's one home: its equations, presets and layout
(names and units, which state components are angles, where the pendulum
sits, a rig's position sensors and safety limits; ``csrc/plant_layout.h``).
``PlantSpec`` carries that for one preset, and every module above (the
simulator's wrapper, baselines, export checks, HIL, host) reads a plant's
layout from it; none writes one down itself.

>>> spec = plant_spec("cartpole", "swingup")
>>> spec.state_names[spec.pole_angle], spec.action_unit
('theta', 'N')
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_ctrl._pendsim import ffi, lib
from grpo_ctrl.errors import UserError


def systems() -> list[str]:
    """Names of the plants the simulator knows."""
    return [ffi.string(lib.ps_system_name(s)).decode() for s in range(lib.PS_NUM_SYSTEMS)]


def system_id(system: str) -> int:
    """The C id of ``system``; ``ValueError`` naming the choices if unknown."""
    sid = lib.ps_system_id(system.encode()) if isinstance(system, str) else -1
    if sid < 0:
        raise ValueError(f"unknown system {system!r}; choose one of {systems()}")
    return sid


def presets(system: str) -> list[str]:
    """Names of the parameter presets of ``system``."""
    sid = system_id(system)
    return [ffi.string(lib.ps_preset_name(sid, k)).decode()
            for k in range(lib.ps_num_presets(sid))]


def default_preset(system: str) -> str:
    return presets(system)[0]


def resolve_plant(system: str, preset: str | None = None) -> tuple[str, str]:
    """``(system, preset)``, the system's first preset for None; ``UserError``
    naming the choices when either is unknown."""
    if system not in systems():
        raise UserError(f"unknown system {system!r}; choose one of {', '.join(systems())}")
    if preset is None:
        return system, default_preset(system)
    if preset not in presets(system):
        raise UserError(f"unknown preset {preset!r} for {system}; choose one of "
                        f"{', '.join(presets(system))}")
    return system, preset


def _strings(array, n: int) -> tuple[str, ...]:
    return tuple(ffi.string(array[k]).decode() for k in range(n))


def _names(fn, sid: int, n: int) -> tuple[str, ...]:
    return tuple(ffi.string(fn(sid, k)).decode() for k in range(n))


@dataclass(frozen=True)
class PlantSpec:
    """One plant preset as everything outside the simulator sees it: sizes,
    names, units, the pendulum's place, a rig's sensors and limits."""
    system: str
    preset: str
    dt: float
    u_max: float
    max_steps: int
    state_names: tuple[str, ...]
    obs_names: tuple[str, ...]
    param_names: tuple[str, ...]
    action_name: str
    action_unit: str
    state_units: tuple[str, ...]
    obs_units: tuple[str, ...]
    param_units: tuple[str, ...]
    angles: tuple[bool, ...]  # which state components are angles
    angular_velocities: tuple[bool, ...]  # which are clipped by v_max
    obs_index: tuple[int, ...]  # where each state component enters the observation
                                # (an angle: its cosine, its sine next)
    cyclic: tuple[int, ...]  # components that do not enter the dynamics
    pole_angle: int  # state index of the pendulum's angle ...
    pole_velocity: int  # ... and of its angular velocity
    operating_range: tuple[float, ...]  # |x_k| reached in use
    channels: tuple[tuple[int, int], ...]  # a rig's sensors: (position, velocity) index
    channel_pos_limits: tuple[float, ...]  # a rig's default safety limits, 0 = none
    channel_vel_limits: tuple[float, ...]
    v_max: float  # the simulator's clip on angular velocities, 0 = none
    term_limit: tuple[float, ...]  # |x_k| that ends an episode, 0 = none
    x0_low: tuple[float, ...]  # the preset's start box
    x0_high: tuple[float, ...]
    actuated: int = 0  # which of DRIVEN[system's id] the actuator drives (the double
                       # pendulum's 0 shoulder, 1 elbow; one choice elsewhere)

    @property
    def nx(self) -> int:
        return len(self.state_names)

    @property
    def nobs(self) -> int:
        return len(self.obs_names)

    @property
    def pole_obs(self) -> int:
        """Where the pendulum angle's cosine sits in the observation (its sine next)."""
        return self.obs_index[self.pole_angle]

    def rest_state(self, pole_angle: float) -> np.ndarray:
        """Every component at rest and zero but the pendulum, at ``pole_angle``."""
        x = np.zeros(self.nx)
        x[self.pole_angle] = pole_angle
        return x

    def near_upright_box(self, tilt: float, others: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
        """A start box (low, high) with the pendulum up to ``tilt`` off upright
        and every other component within ``others`` of zero."""
        high = np.full(self.nx, others)
        high[self.pole_angle] = tilt
        return -high, high

    def wide_box(self, velocity: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """The preset's start box (low, high) widened to any state of the pendulum: each
        angle's sensor channel over a whole turn around the box's centre, its velocity
        within ``velocity`` of zero; every other component (a cart's position, a cyclic
        arm) as the preset has it."""
        low, high = np.array(self.x0_low), np.array(self.x0_high)
        for a, v in self.channels:
            if self.angles[a] and a not in self.cyclic:
                centre = 0.5 * (low[a] + high[a])
                low[a], high[a] = centre - np.pi, centre + np.pi
                low[v], high[v] = -velocity, velocity
        return low, high

    def observation(self, x) -> np.ndarray:
        """The float32 observation of state ``x (nx,)``, by the C function the
        simulator observes with (no sensor noise or quantisation)."""
        return Observer(self)(x)

    @property
    def observation_convention(self) -> str:
        """One line: the observation, each coordinate's zero and positive
        direction, the units, and what the actuator drives (``COORDINATES``,
        ``DRIVEN``; names and units from the C layout)."""
        sid = system_id(self.system)
        coords = "; ".join(COORDINATES[sid])
        units = ", ".join(f"{n} {u}" for n, u in zip(self.obs_names, self.obs_units) if u != "1")
        driven = DRIVEN[sid]
        index, joint = driven[self.actuated]
        passive = [name for _, name in driven if name != joint]
        action = (f"{self.action_name} in {self.action_unit} on {joint}"
                  f"{''.join(f' ({name} passive)' for name in passive)}, positive towards "
                  f"+{self.state_names[index]}")
        return f"obs [{', '.join(self.obs_names)}]; {coords}; units {units}; {action}"


# Each plant's coordinates in words, by its C id: where each angle or position
# is zero and which way it is positive (the C layout has names and units, not
# directions).
# The one home of these words: PlantSpec.observation_convention puts them
# together, and export writes that into a controller's metadata
# (``observation_convention``: ``grpo-ctrl inspect``, the generated C header).
# tests/test_export.py checks each direction against the simulator.
COORDINATES = {
    lib.PS_PENDULUM: ("theta the pendulum's angle, zero upright, counter-clockwise positive",),
    lib.PS_CARTPOLE: ("x the cart's position, zero mid-track, positive to the right",
                      "theta the pole's angle, zero upright, positive leaning towards +x"),
    lib.PS_FURUTA: ("theta the arm's angle, counter-clockwise positive seen from above",
                    "alpha the pendulum's angle, zero upright, positive the way the arm "
                    "accelerating towards +theta swings it from upright"),
    lib.PS_DOUBLE_PENDULUM: ("theta1 the shoulder's angle, zero upright",
                             "theta2 the elbow's angle relative to link 1, zero when the "
                             "links are in line", "both counter-clockwise positive"),
}
# What the actuator can drive: (state index of its coordinate, its name), one
# per choice of PlantSpec.actuated.
DRIVEN = {
    lib.PS_PENDULUM: ((0, "the pivot"),),
    lib.PS_CARTPOLE: ((0, "the cart"),),
    lib.PS_FURUTA: ((0, "the arm"),),
    lib.PS_DOUBLE_PENDULUM: ((0, "the shoulder"), (1, "the elbow")),
}


def spec_of_model(model, preset: str) -> PlantSpec:
    """The ``PlantSpec`` of a filled C ``ps_model`` (overrides included)."""
    m, sid = model, model.system
    layout = ffi.new("ps_layout *")
    lib.ps_plant_layout(sid, layout)
    nx, nobs, nparam, nch = m.nx, m.nobs, m.nparam, layout.n_channels
    return PlantSpec(
        system=ffi.string(lib.ps_system_name(sid)).decode(), preset=preset,
        dt=float(m.dt), u_max=float(m.u_max), max_steps=int(m.max_steps),
        state_names=_names(lib.ps_state_name, sid, nx),
        obs_names=_names(lib.ps_obs_name, sid, nobs),
        param_names=_names(lib.ps_param_name, sid, nparam),
        action_name=ffi.string(layout.action_name).decode(),
        action_unit=ffi.string(layout.action_unit).decode(),
        state_units=_strings(layout.state_unit, nx), obs_units=_strings(layout.obs_unit, nobs),
        param_units=_strings(layout.param_unit, nparam),
        angles=tuple(bool(layout.is_angle[k]) for k in range(nx)),
        angular_velocities=tuple(bool(layout.is_angular_velocity[k]) for k in range(nx)),
        obs_index=tuple(layout.obs_index[k] for k in range(nx)),
        cyclic=tuple(k for k in range(nx) if layout.cyclic[k]),
        pole_angle=layout.pole_angle, pole_velocity=layout.pole_velocity,
        operating_range=tuple(layout.operating_range[k] for k in range(nx)),
        channels=tuple((layout.channel_position[c], layout.channel_velocity[c])
                       for c in range(nch)),
        channel_pos_limits=tuple(layout.channel_pos_limit[c] for c in range(nch)),
        channel_vel_limits=tuple(layout.channel_vel_limit[c] for c in range(nch)),
        v_max=float(m.v_max), term_limit=tuple(m.term_limit[k] for k in range(nx)),
        x0_low=tuple(m.x0_low[k] for k in range(nx)),
        x0_high=tuple(m.x0_high[k] for k in range(nx)), actuated=int(m.actuated))


def init_model(system: str, preset: str | None = None):
    """A C ``ps_model`` filled from a preset (the system's first by default),
    and the preset's name."""
    sid = system_id(system)
    preset = default_preset(system) if preset is None else preset
    if not isinstance(preset, str):
        raise ValueError(f"preset must be a preset's name, one of {presets(system)}, got "
                         f"{preset!r}")
    model = ffi.new("ps_model *")
    if lib.ps_model_init(model, sid, preset.encode()) != lib.PS_OK:
        raise ValueError(f"unknown preset {preset!r} for system {system!r}; "
                         f"choose one of {presets(system)}")
    return model, preset


def plant_spec(system: str, preset: str | None = None) -> PlantSpec:
    """The ``PlantSpec`` of a preset (the system's first by default)."""
    return spec_of_model(*init_model(system, preset))


def wrap_angle(angle) -> np.ndarray:
    """Angles to [-pi, pi): the error of an angle from its zero."""
    return (np.asarray(angle) + np.pi) % (2 * np.pi) - np.pi


def state_of_observation(spec: PlantSpec, obs: np.ndarray) -> np.ndarray:
    """The states ``(B, nx)`` that observations ``obs (B, nobs)`` show: an
    angle from its cosine and sine (in [-pi, pi]), the rest as observed."""
    obs = np.atleast_2d(obs)
    x = np.empty((obs.shape[0], spec.nx))
    for k, i in enumerate(spec.obs_index):
        x[:, k] = np.arctan2(obs[:, i + 1], obs[:, i]) if spec.angles[k] else obs[:, i]
    return x


class Observer:
    """Observations of single states of one plant by the C function the
    simulator observes with (``ps_observation``: no sensor noise or
    quantisation), into buffers made once: for a control loop."""

    def __init__(self, spec: PlantSpec):
        self._sid = system_id(spec.system)
        self._x = np.zeros(spec.nx)
        self._obs = np.zeros(spec.nobs, np.float32)
        self._px = ffi.from_buffer("double[]", self._x)
        self._pobs = ffi.from_buffer("float[]", self._obs)

    def __call__(self, x) -> np.ndarray:
        """The float32 observation ``(nobs,)`` of state ``x (nx,)`` (a new array)."""
        self._x[:] = x
        lib.ps_observation(self._sid, self._px, self._pobs)
        return self._obs.copy()
