"""Python face of the C simulator; it and ``grpo_ctrl.plant`` alone reach ``csrc/``.

``BatchSim`` steps ``num_envs`` copies of one plant in one C call. Its state
lives in numpy arrays (structure-of-arrays, component-major) that the C code
reads and writes in place, so there is no copy between Python and C.

>>> sim = BatchSim("pendulum", num_envs=4, preset="gym", seed=0)
>>> obs = sim.reset()
>>> obs, reward, terminated, truncated = sim.step(np.zeros(4, np.float32))

The arrays returned by ``step`` and ``reset`` are the simulator's own output
buffers, overwritten by the next call (as Gymnasium's vector environments do
with ``copy=False``): copy them if you keep them.
"""
from __future__ import annotations

import functools

import numpy as np

from grpo_ctrl._pendsim import ffi, lib
# PlantSpec, systems, presets and default_preset live in the plant layer; they
# stay importable from here, where they used to be
from grpo_ctrl.plant import (PlantSpec, default_preset, init_model, presets,  # noqa: F401
                             spec_of_model, systems)
from grpo_ctrl.randomize import Randomization

MAX_DELAY = lib.PS_MAX_DELAY
INTEGRATORS = {"euler": lib.PS_EULER, "semi_euler": lib.PS_SEMI_EULER, "rk4": lib.PS_RK4}

# model fields a caller may override, with their kind
_SCALAR_FIELDS = {"dt": float, "substeps": int, "u_max": float, "v_max": float,
                  "delay": int, "max_steps": int, "term_reward": float, "w_u": float,
                  "coulomb_vc": float, "w_height": float, "w_down": float,
                  "up_height": float, "w_power": float, "catch_level": float}
_VECTOR_FIELDS = ("noise_std", "enc_counts", "w_x", "term_limit", "x0_low", "x0_high",
                  "catch_K")

_ERRORS = {
    lib.PS_ERR_NONFINITE: ("an action is NaN or infinite (or too large for float32); "
                           "the state was not changed"),
    lib.PS_ERR_INDEX: "an environment index is out of range",
    lib.PS_ERR_MODEL: "a model field is out of range",
    lib.PS_ERR_DATA: "a per-environment plant array is missing",
}

# what each environment's plant is beyond its physical parameters (plant_mode
# other than nominal), and the actuator state; (dtype, per position component)
_PLANT_ARRAYS = {"delay": (np.int32, False), "motor_k": (np.float64, False),
                 "torque_noise": (np.float64, False), "offset": (np.float64, True)}
_ACTUATOR_ARRAYS = {"tau": np.float64, "push": np.float64, "push_left": np.int32}


def _check_indices(idx, n: int, what: str) -> np.ndarray:
    a = np.asarray(idx)
    if a.dtype.kind not in "iu" or a.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array of integers, got dtype {a.dtype} "
                         f"and shape {a.shape}")
    if a.size and (a.min() < 0 or a.max() >= n):
        raise ValueError(f"{what} must lie in [0, {n}), got values from {a.min()} to {a.max()}")
    return np.ascontiguousarray(a, dtype=np.int32)


class BatchSim:
    """``num_envs`` environments of one plant, stepped together in C.

    Parameters
    ----------
    system: ``"pendulum"``, ``"cartpole"`` or ``"furuta"``.
    preset: a parameter preset of that system (``presets(system)``); the
        first one by default.
    seed: seeds environment b's counter-based RNG with ``seed + b``.
    autoreset: reset environments that end inside ``step`` (the returned
        observation is then the reset one; ``final_obs`` keeps the last).
    randomize: a ``grpo_ctrl.randomize.Randomization``: every reset and
        autoreset draws each environment a new plant from its ranges (in C,
        from the environment's RNG). None or ranges that draw nothing: the
        nominal plant.
    hold_plant: keep each environment's plant (``set_plant``) across resets,
        which then reset only the state: many candidate plants at once.
    **model: overrides of model fields, e.g. ``delay=2``,
        ``integrator="rk4"``, ``substeps=4``, ``noise_std=[0.01, 0.1]``.
    """

    def __init__(self, system: str = "pendulum", num_envs: int = 1, preset: str | None = None,
                 seed: int = 0, autoreset: bool = False,
                 randomize: Randomization | None = None, hold_plant: bool = False, **model):
        if not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        self._model, preset = init_model(system, preset)
        self._apply_overrides(model)
        m = self._model  # its costs of effort as made, for scale_costs
        self._costs = (m.w_u, m.w_power, [m.w_x[k] for k in range(m.nx // 2, m.nx)])
        self.spec = spec_of_model(self._model, preset)
        self.randomize = randomize if randomize is not None else Randomization()
        self._apply_randomization(self.randomize, hold_plant)
        m = self._model
        self.system, self.preset, self.num_envs = system, preset, int(num_envs)
        self.autoreset = bool(autoreset)
        B = self.num_envs
        # state, component-major (structure-of-arrays)
        self._x = np.zeros((m.nx, B))
        self._param = np.zeros((m.nparam, B))
        self._act_buf = np.zeros((MAX_DELAY, B), np.float32)
        self._rng_key = np.zeros(B, np.uint64)
        self._rng_ctr = np.zeros(B, np.uint64)
        self._t = np.zeros(B, np.int32)
        self._data = ffi.new("ps_data *")
        self._data.B = B
        self._data.x = ffi.from_buffer("double[]", self._x)
        self._data.param = ffi.from_buffer("double[]", self._param)
        self._data.act_buf = ffi.from_buffer("float[]", self._act_buf)
        self._data.rng_key = ffi.from_buffer("uint64_t[]", self._rng_key)
        self._data.rng_ctr = ffi.from_buffer("uint64_t[]", self._rng_ctr)
        self._data.t = ffi.from_buffer("int32_t[]", self._t)
        self._plant = {name: np.zeros((m.nx // 2, B) if per_position else B, dtype)
                       for name, (dtype, per_position) in _PLANT_ARRAYS.items()}
        self._actuator = {name: np.zeros(B, dtype) for name, dtype in _ACTUATOR_ARRAYS.items()}
        for name, a in {**self._plant, **self._actuator}.items():
            setattr(self._data, name, ffi.from_buffer(
                "int32_t[]" if a.dtype == np.int32 else "double[]", a))
        # the nominal plant to start with (what a held plant is until set_plant)
        self._param[:] = np.array([m.param[k] for k in range(m.nparam)])[:, None]
        self._plant["delay"][:] = m.delay
        self._plant["motor_k"][:] = 1.0
        # output buffers, with their C pointers cached
        self._action = np.zeros(B, np.float32)
        self._obs = np.zeros((B, m.nobs), np.float32)
        self._final_obs = np.zeros((B, m.nobs), np.float32)
        self._reward = np.zeros(B)
        self._terminated = np.zeros(B, np.uint8)
        self._truncated = np.zeros(B, np.uint8)
        self._p_action = ffi.from_buffer("float[]", self._action)
        self._p_obs = ffi.from_buffer("float[]", self._obs)
        self._p_final_obs = ffi.from_buffer("float[]", self._final_obs)
        self._p_reward = ffi.from_buffer("double[]", self._reward)
        self._p_terminated = ffi.from_buffer("uint8_t[]", self._terminated)
        self._p_truncated = ffi.from_buffer("uint8_t[]", self._truncated)
        self._terminated_view = self._terminated.view(bool)
        self._truncated_view = self._truncated.view(bool)
        self._work = np.empty(0, np.float32)  # roll_policy's activations
        self.seed(seed)
        lib.ps_reset(self._model, self._data, ffi.NULL, ffi.NULL)

    # ------------------------------------------------------------------ model
    def _apply_overrides(self, model: dict) -> None:
        m = self._model
        for name, value in model.items():
            if value is None:
                continue
            if name == "integrator":
                if value not in INTEGRATORS:
                    raise ValueError(f"unknown integrator {value!r}; choose one of "
                                     f"{list(INTEGRATORS)}")
                m.integrator = INTEGRATORS[value]
            elif name in _SCALAR_FIELDS:
                setattr(m, name, _SCALAR_FIELDS[name](value))
            elif name in _VECTOR_FIELDS:
                v = np.asarray(value, dtype=float)
                if v.shape != (m.nx,) or not np.all(np.isfinite(v)):
                    raise ValueError(f"{name} must be {m.nx} finite numbers (one per state "
                                     f"component), got {value!r}")
                for k in range(m.nx):
                    getattr(m, name)[k] = v[k]
            elif name == "catch_P":
                v = np.asarray(value, dtype=float)
                if v.shape != (m.nx, m.nx) or not np.all(np.isfinite(v)):
                    raise ValueError(f"catch_P must be a finite {m.nx} x {m.nx} matrix, "
                                     f"got {value!r}")
                for k, w in enumerate(v.ravel()):
                    m.catch_P[k] = w
            elif name in ("param", "params"):
                raise ValueError("set per-environment parameters with set_param() after "
                                 "construction")
            else:
                raise ValueError(f"unknown model field {name!r}; known: "
                                 f"{['integrator', *_SCALAR_FIELDS, *_VECTOR_FIELDS, 'catch_P']}")
        if lib.ps_model_check(m) != lib.PS_OK:
            raise ValueError(f"model overrides {model} put a field out of range (dt > 0, "
                             f"substeps >= 1, 0 <= delay <= {MAX_DELAY}, u_max > 0, "
                             "non-negative noise and encoder counts)")

    def _apply_randomization(self, r: Randomization, hold_plant: bool) -> None:
        """The C model's plant mode and absolute ranges from ``r``."""
        m = self._model
        states, params = self.spec.state_names, self.spec.param_names
        unknown = sorted((set(r.scale) | set(r.absolute)) - set(params))
        unknown += sorted(set(r.noise_std) - set(states))
        if unknown:
            raise ValueError(f"randomize names {unknown} are not parameters {list(params)} "
                             f"or states {list(states)} of {self.spec.system}")
        for name, std in r.noise_std.items():
            m.noise_std[states.index(name)] = std
        if hold_plant:
            m.plant_mode = lib.PS_PLANT_HOLD
        elif not r.active:
            m.plant_mode = lib.PS_PLANT_NOMINAL
            return
        else:
            m.plant_mode = lib.PS_PLANT_DRAW
        q = m.ranges
        for k, name in enumerate(params):
            q.param_lo[k], q.param_hi[k] = r.param_range(name, m.param[k])
        q.delay_lo, q.delay_hi = r.delay
        q.motor_k_lo, q.motor_k_hi = r.motor_k
        q.torque_noise_lo, q.torque_noise_hi = (v * m.u_max for v in r.torque_noise)
        for k in range(m.nx // 2):
            q.offset_lo[k], q.offset_hi[k] = -r.offset, r.offset
        q.push_rate = r.push_rate
        q.push_lo, q.push_hi = (v * m.u_max for v in r.push)
        q.push_steps = r.push_steps
        if r.delay[1] > MAX_DELAY or lib.ps_model_check(m) != lib.PS_OK:
            inertia = ("; the double pendulum's mass matrix must stay positive definite at "
                       "every corner of the ranges: I1 I2 + m2 l1^2 (I2 - m2 r2^2) > 0 "
                       "(narrow params, or m2, r2, I2)"
                       if m.system == lib.PS_DOUBLE_PENDULUM else "")
            raise ValueError(f"randomize ranges out of bounds (delay <= {MAX_DELAY} steps, "
                             f"0 < motor_k <= 1, low <= high{inertia}): {r}")

    @property
    def model(self):
        """The C model struct (read it; changing it after construction is at your own risk)."""
        return self._model

    def scale_costs(self, scale: float) -> None:
        """The reward's costs of effort at ``scale`` times the model's: the command
        (``w_u``), the motor's power (``w_power``) and the velocities (the second half
        of ``w_x``); the task's own terms (angles, height, time below it) unchanged.
        ``GRPOConfig.costs_from`` turns them on part way through a run."""
        if not 0.0 <= scale <= 1e6:
            raise ValueError(f"cost scale must be in [0, 1e6], got {scale!r}")
        m = self._model
        w_u, w_power, w_v = self._costs
        m.w_u, m.w_power = w_u * scale, w_power * scale
        for k, w in enumerate(w_v, start=m.nx // 2):
            m.w_x[k] = w * scale

    # ------------------------------------------------------------------ stepping
    def seed(self, seed: int) -> None:
        """Seed every environment's RNG: environment b gets ``seed + b``."""
        seeds = (np.uint64(int(seed) % 2**64) + np.arange(self.num_envs, dtype=np.uint64))
        lib.ps_seed(self._data, ffi.from_buffer("uint64_t[]", seeds))

    def reseed(self, indices, seeds) -> None:
        """Give the listed environments new RNG streams (e.g. branches whose
        sensor noise should differ)."""
        idx = _check_indices(indices, self.num_envs, "indices")
        seeds = np.array([int(s) % 2**64 for s in np.ravel(seeds)], dtype=np.uint64)
        if seeds.shape != idx.shape:
            raise ValueError(f"need one seed per index, got {seeds.size} for {idx.size}")
        keys, ctrs = self._rng_key.copy(), self._rng_ctr.copy()
        tmp = ffi.new("ps_data *", {"B": idx.size})
        k, c = np.zeros(idx.size, np.uint64), np.zeros(idx.size, np.uint64)
        tmp.rng_key, tmp.rng_ctr = ffi.from_buffer("uint64_t[]", k), ffi.from_buffer("uint64_t[]", c)
        lib.ps_seed(tmp, ffi.from_buffer("uint64_t[]", np.ascontiguousarray(seeds)))
        keys[idx], ctrs[idx] = k, c
        self._rng_key[:], self._rng_ctr[:] = keys, ctrs

    def reset(self, mask=None, seed: int | None = None) -> np.ndarray:
        """Reset all environments (or those where ``mask`` is true) to draws
        from the preset's start distribution; returns the observation of all
        (a fresh sensor reading, noise included, for every environment)."""
        if seed is not None:
            self.seed(seed)
        if mask is None:
            lib.ps_reset(self._model, self._data, ffi.NULL, self._p_obs)
        else:
            mask = np.asarray(mask)
            if mask.shape != (self.num_envs,) or mask.dtype != bool:
                raise ValueError(f"mask must be a bool array of shape ({self.num_envs},), got "
                                 f"{mask.dtype} {mask.shape}")
            m8 = np.ascontiguousarray(mask, dtype=np.uint8)
            lib.ps_reset(self._model, self._data, ffi.from_buffer("uint8_t[]", m8), ffi.NULL)
            lib.ps_observe(self._model, self._data, self._p_obs)
        return self._obs

    def observe(self) -> np.ndarray:
        """Observation of the current state (draws sensor noise if the model has any)."""
        lib.ps_observe(self._model, self._data, self._p_obs)
        return self._obs

    def _actions_into_buffer(self, actions) -> None:
        a = actions if isinstance(actions, np.ndarray) else np.asarray(actions)
        if a.dtype.kind != "f":
            raise ValueError(f"actions must be floating point (float32 preferred), got {a.dtype}")
        if a.shape != (self.num_envs,) and a.shape != (self.num_envs, 1):
            raise ValueError(f"actions must have shape ({self.num_envs},) or "
                             f"({self.num_envs}, 1), got {a.shape}")
        self._action[:] = a.reshape(self.num_envs)

    def step(self, actions):
        """One control step of every environment.

        Returns ``(obs, reward, terminated, truncated)``: float32
        ``(num_envs, nobs)``, float64, bool, bool. Raises ``ValueError`` for a
        wrong shape or dtype, or a NaN or infinite action, leaving the state
        untouched."""
        self._actions_into_buffer(actions)
        rc = lib.ps_step(self._model, self._data, self._p_action, self._p_obs, self._p_reward,
                         self._p_terminated, self._p_truncated, self.autoreset,
                         self._p_final_obs)
        if rc:
            raise ValueError(_ERRORS[rc])
        return self._obs, self._reward, self._terminated_view, self._truncated_view

    def roll_policy(self, net: dict, params: np.ndarray, spread: np.ndarray, raw: np.ndarray,
                    mu: np.ndarray, z: np.ndarray, reward: np.ndarray, alive: np.ndarray,
                    last_act: np.ndarray, have_last: bool, *, u_max: float, w_du: float = 0.0,
                    repeat: int = 1) -> None:
        """T decisions of a Gaussian policy's mean network in C (csrc/policy_rollout.h,
        ``pr_rollout``), continuing from the last observation (``observe()`` or the
        last step's). ``net`` and ``params``: ``GaussianPolicy.c_mean_network()``;
        ``spread`` (T, B): each decision's noise times the std. Writes in place: ``raw``
        (T, B, nobs) the observations, ``mu`` and ``z`` = mu + spread (T, B), float32;
        ``reward`` (T, B) float64; ``alive`` (T + 1, B) bool, from its given row 0;
        ``last_act`` (B,) float32, the last command (read first when ``have_last``, for the
        action-rate penalty ``w_du``). Each command ``u_max tanh(z)`` is held ``repeat``
        steps."""
        B, nobs = self.num_envs, self._model.nobs
        T = spread.shape[0] if spread.ndim == 2 else -1
        want = {"spread": (spread, np.float32, (T, B)), "raw": (raw, np.float32, (T, B, nobs)),
                "mu": (mu, np.float32, (T, B)), "z": (z, np.float32, (T, B)),
                "reward": (reward, np.float64, (T, B)), "alive": (alive, np.bool_, (T + 1, B)),
                "last_act": (last_act, np.float32, (B,)), "params": (params, np.float32, None)}
        for name, (a, dtype, shape) in want.items():
            if (not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags.c_contiguous
                    or (shape is not None and a.shape != shape)):
                raise ValueError(f"{name} must be a C-contiguous {np.dtype(dtype).name} array"
                                 + (f" of shape {shape}" if shape else ""))
        c_net = ffi.new("pr_net *", {k: int(v) for k, v in net.items()})
        c_net.params = ffi.from_buffer("float[]", params)
        if lib.pr_net_num_params(c_net) != params.size:
            raise ValueError(f"params has {params.size} floats, the network {net} takes "
                             f"{lib.pr_net_num_params(c_net)}")
        size = lib.pr_work_size(c_net, B)
        if self._work.size < size:
            self._work = np.empty(size, np.float32)
        rc = lib.pr_rollout(self._model, self._data, c_net, T, int(repeat), self.autoreset,
                            float(u_max), float(w_du), ffi.from_buffer("float[]", spread),
                            self._p_obs, ffi.from_buffer("float[]", raw),
                            ffi.from_buffer("float[]", mu), ffi.from_buffer("float[]", z),
                            ffi.from_buffer("double[]", reward),
                            ffi.from_buffer("uint8_t[]", alive.view(np.uint8)),
                            ffi.from_buffer("float[]", last_act), bool(have_last),
                            self._p_action, self._p_reward, self._p_terminated,
                            self._p_truncated, ffi.from_buffer("float[]", self._work))
        if rc:
            raise ValueError(_ERRORS[rc])

    @property
    def final_obs(self) -> np.ndarray:
        """The observation each environment reached in the last step, before any autoreset."""
        return self._final_obs

    def rollout(self, actions):
        """K steps of every environment given actions of shape ``(K, num_envs)``.

        Returns fresh arrays ``obs (K, B, nobs)``, ``reward (K, B)``,
        ``terminated (K, B)``, ``truncated (K, B)``; ``obs[k]`` follows
        step k."""
        a = np.asarray(actions)
        if a.dtype.kind != "f" or a.ndim not in (2, 3) or a.shape[1] != self.num_envs or (
                a.ndim == 3 and a.shape[2] != 1):
            raise ValueError(f"actions must be floating point with shape (K, {self.num_envs}), "
                             f"got {a.dtype} {a.shape}")
        a = np.ascontiguousarray(a.reshape(a.shape[0], self.num_envs), dtype=np.float32)
        K, B, nobs = a.shape[0], self.num_envs, self._model.nobs
        obs = np.empty((K, B, nobs), np.float32)
        reward = np.empty((K, B))
        term = np.empty((K, B), np.uint8)
        trunc = np.empty((K, B), np.uint8)
        rc = lib.ps_rollout(self._model, self._data, K, ffi.from_buffer("float[]", a),
                            ffi.from_buffer("float[]", obs), ffi.from_buffer("double[]", reward),
                            ffi.from_buffer("uint8_t[]", term), ffi.from_buffer("uint8_t[]", trunc),
                            self.autoreset)
        if rc:
            raise ValueError(_ERRORS[rc])
        return obs, reward, term.view(bool), trunc.view(bool)

    # ------------------------------------------------------------------ state
    def _state_arrays(self) -> dict:
        """Every per-environment array, component-major as C holds it."""
        return {"x": self._x, "param": self._param, "act_buf": self._act_buf,
                "rng_key": self._rng_key, "rng_ctr": self._rng_ctr, "t": self._t,
                **self._plant, **self._actuator}

    def get_state(self) -> dict:
        """A copy of the full state, environment-major: ``x (B, nx)``,
        ``param (B, nparam)``, ``act_buf (B, MAX_DELAY)``, ``rng_key (B,)``,
        ``rng_ctr (B,)``, ``t (B,)``; the plant beyond its parameters,
        ``delay``, ``motor_k``, ``torque_noise`` ``(B,)`` and ``offset
        (B, nx / 2)``; the actuator's ``tau``, ``push``, ``push_left`` ``(B,)``."""
        return {key: a.T.copy() for key, a in self._state_arrays().items()}

    def step_counts(self) -> np.ndarray:
        """Each environment's steps since its reset, ``get_state()["t"]`` without copying the
        whole state: the simulator's own array, to read (copy it to keep it)."""
        return self._t

    def set_state(self, state: dict, indices=None) -> None:
        """Write a state (as from ``get_state``), whole or in part: any subset
        of its keys, for all environments or those in ``indices``. Everything
        is checked before anything is written."""
        idx = (np.arange(self.num_envs) if indices is None
               else _check_indices(indices, self.num_envs, "indices"))
        n = idx.size
        arrays = self._state_arrays()
        checked = {}
        for key, value in state.items():
            if key not in arrays:
                raise ValueError(f"unknown state key {key!r}; known: {list(arrays)}")
            target = arrays[key]
            shape = (n, *target.shape[:-1])
            v = np.asarray(value)
            if target.ndim == 2 and v.ndim == 1 and n == 1:
                v = v[None, :]
            if v.shape != shape:
                raise ValueError(f"state[{key!r}] must have shape {shape}, got {v.shape}")
            if target.dtype.kind == "f":
                if v.dtype.kind not in "fiu" or not np.all(np.isfinite(v)):
                    raise ValueError(f"state[{key!r}] must be finite numbers")
            elif v.dtype.kind not in "iu" or (v.size and v.min() < 0):
                raise ValueError(f"state[{key!r}] must be non-negative integers, got {v.dtype}")
            elif v.size and int(v.max()) > np.iinfo(target.dtype).max:  # astype would wrap it
                raise ValueError(f"state[{key!r}] must fit {target.dtype.name}, got "
                                 f"{int(v.max())}")
            if key == "delay" and v.size and v.max() > MAX_DELAY:
                raise ValueError(f"state['delay'] must be at most {MAX_DELAY} steps")
            if key == "motor_k" and v.size and (v.min() <= 0 or v.max() > 1):
                raise ValueError("state['motor_k'] must lie in (0, 1]")
            checked[key] = v.astype(target.dtype)
        for key, v in checked.items():
            arrays[key][..., idx] = v.T

    def set_param(self, name: str, values, indices=None) -> None:
        """Set one physical parameter per environment (until the next reset,
        unless the simulator holds its plants: ``hold_plant``)."""
        if name not in self.spec.param_names:
            raise ValueError(f"unknown parameter {name!r} for {self.system}; known: "
                             f"{list(self.spec.param_names)}")
        self.set_plant({name: values}, indices)

    @property
    def plant_names(self) -> tuple[str, ...]:
        """What defines one environment's plant: the physical parameters, the
        actuation delay (steps), the motor response ``motor_k``, the actuator
        noise std ``torque_noise`` (action units) and each position's sensor
        offset ``offset_<state>``."""
        nq = self._x.shape[0] // 2
        return (*self.spec.param_names, "delay", "motor_k", "torque_noise",
                *(f"offset_{name}" for name in self.spec.state_names[:nq]))

    def _plant_row(self, name: str):
        """(array, row) where plant quantity ``name`` lives."""
        if name in self.spec.param_names:
            return self._param, self.spec.param_names.index(name)
        if name.startswith("offset_") and name in self.plant_names:
            return self._plant["offset"], self.spec.state_names.index(name[len("offset_"):])
        if name in _PLANT_ARRAYS and name != "offset":
            return self._plant[name][None, :], 0
        raise ValueError(f"unknown plant quantity {name!r} for {self.system}; known: "
                         f"{list(self.plant_names)}")

    def plant(self) -> dict[str, np.ndarray]:
        """Each environment's plant (a copy): ``{name: values (B,)}`` for
        ``plant_names``. Under the nominal plant mode, the extras read as an
        ideal actuator: the model's delay, ``motor_k`` 1, no noise or offset."""
        out = {}
        for name in self.plant_names:
            array, row = self._plant_row(name)
            out[name] = array[row].copy()
        return out

    def set_plant(self, values: dict, indices=None) -> None:
        """Set plant quantities (``plant_names``) per environment. They last
        until the next reset, or across resets with ``hold_plant=True`` (then
        the delay, motor response, noise and offsets act; under the nominal
        plant mode only the physical parameters do)."""
        idx = (np.arange(self.num_envs) if indices is None
               else _check_indices(indices, self.num_envs, "indices"))
        checked = []
        for name, value in values.items():
            target, row = self._plant_row(name)
            v = np.broadcast_to(np.asarray(value, dtype=float), idx.shape)
            if not np.all(np.isfinite(v)):
                raise ValueError(f"values for {name!r} must be finite")
            if name == "delay" and (np.any(v != np.round(v)) or v.min() < 0 or v.max() > MAX_DELAY):
                raise ValueError(f"delay must be whole steps in [0, {MAX_DELAY}]")
            if name == "motor_k" and (v.min() <= 0 or v.max() > 1):
                raise ValueError("motor_k must lie in (0, 1]")
            if name == "torque_noise" and v.min() < 0:
                raise ValueError("torque_noise must be >= 0")
            checked.append((target, row, v))
        for target, row, v in checked:
            target[row, idx] = v

    def copy_envs(self, dst_indices, src: "BatchSim", src_indices) -> None:
        """Copy the full state of ``src`` environments ``src_indices`` into
        this simulator's ``dst_indices`` (delay buffers and RNG included)."""
        d, s = self._copy_indices(dst_indices, src, src_indices)
        if src is self:  # the C copy wants distinct source and destination
            snapshot = {k: v[s] for k, v in self.get_state().items()}
            self.set_state(snapshot, d)
            return
        lib.ps_copy_envs(self._model, self._data, ffi.from_buffer("int32_t[]", d), src._data,
                         ffi.from_buffer("int32_t[]", s), d.size)

    def _copy_indices(self, dst_indices, src: "BatchSim", src_indices) -> tuple:
        """copy_envs' indices, checked, as int32 arrays."""
        if src.system != self.system or src.preset != self.preset:
            raise ValueError(f"cannot copy {src.system}/{src.preset} state into "
                             f"{self.system}/{self.preset}")
        d = _check_indices(dst_indices, self.num_envs, "dst_indices")
        s = _check_indices(src_indices, src.num_envs, "src_indices")
        if d.shape != s.shape:
            raise ValueError(f"dst_indices and src_indices differ in length: {d.size} vs {s.size}")
        return d, s

    def copier(self, dst_indices, src: "BatchSim", src_indices=None):
        """``copy_envs(dst_indices, src, src_indices)`` made ready once: the indices checked
        and their C pointers taken, so that each call of the function returned is one C call
        (GroupRollout's copies, every iteration). Without ``src_indices`` the function takes
        them, an int32 array as long as ``dst_indices`` (C checks their range). ``src`` may
        not be this simulator."""
        if src is self:
            raise ValueError("copier: the source must be another simulator")
        if src_indices is not None:
            d, s = self._copy_indices(dst_indices, src, src_indices)
            # the pointers (ffi.from_buffer) hold their index arrays alive
            return functools.partial(lib.ps_copy_envs, self._model, self._data,
                                     ffi.from_buffer("int32_t[]", d), src._data,
                                     ffi.from_buffer("int32_t[]", s), d.size)
        d, _ = self._copy_indices(dst_indices, src, np.zeros(len(dst_indices), np.int32))
        args = (self._model, self._data, ffi.from_buffer("int32_t[]", d), src._data)

        def copy_from(src_indices: np.ndarray) -> None:
            if (not isinstance(src_indices, np.ndarray) or src_indices.dtype != np.int32
                    or src_indices.shape != d.shape or not src_indices.flags.c_contiguous):
                raise ValueError(f"src_indices must be a C-contiguous int32 array of shape "
                                 f"{d.shape}")
            if lib.ps_copy_envs(*args, ffi.from_buffer("int32_t[]", src_indices), d.size):
                raise ValueError(f"src_indices must lie in [0, {src.num_envs})")
        return copy_from

    def branch(self, indices, group_size: int, out: "BatchSim | None" = None) -> "BatchSim":
        """Clone environments ``indices`` into groups of ``group_size``: in the
        result, environment ``i * group_size + j`` is a copy of ``indices[i]``
        (state, parameters, delay buffer and RNG). ``out`` (a simulator of
        ``len(indices) * group_size`` environments of the same plant) is
        filled and returned; without it a new one is made."""
        idx = _check_indices(indices, self.num_envs, "indices")
        if idx.size == 0:
            raise ValueError("indices is empty: name at least one environment to branch")
        if not isinstance(group_size, (int, np.integer)) or group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
        n = idx.size * int(group_size)
        if out is None:
            out = BatchSim(self.system, n, preset=self.preset, autoreset=self.autoreset)
            out._model[0] = self._model[0]
            out.spec, out.randomize = self.spec, self.randomize
        elif out.num_envs != n:
            raise ValueError(f"out has {out.num_envs} environments; branching {idx.size} "
                             f"into groups of {group_size} needs {n}")
        out.copy_envs(np.arange(n), self, np.repeat(idx, group_size))
        return out

    # ------------------------------------------------------------------ physics
    def _check_env(self, env) -> None:
        if not isinstance(env, (int, np.integer)) or not 0 <= env < self.num_envs:
            raise ValueError(f"env must be an integer in [0, {self.num_envs}), got {env!r}")

    def dynamics(self, x, u: float, env: int = 0) -> np.ndarray:
        """Continuous-time xdot = f(x, u) with environment ``env``'s parameters."""
        self._check_env(env)
        x = np.ascontiguousarray(x, dtype=float)
        if x.shape != (self._x.shape[0],):
            raise ValueError(f"x must have shape ({self._x.shape[0]},), got {x.shape}")
        xdot = np.empty_like(x)
        lib.ps_dynamics(self._model, self._data, int(env), ffi.from_buffer("double[]", x),
                        float(u), ffi.from_buffer("double[]", xdot))
        return xdot

    def dynamics_rows(self, x, u, env: int = 0) -> np.ndarray:
        """``dynamics`` of many states with environment ``env``'s parameters:
        ``x (N, nx)`` and ``u (N,)`` give ``xdot (N, nx)``."""
        self._check_env(env)
        x = np.ascontiguousarray(x, dtype=float)
        u = np.asarray(u, dtype=float)
        if x.ndim != 2 or x.shape[1] != self._x.shape[0] or u.shape != x.shape[:1]:
            raise ValueError(f"x must have shape (N, {self._x.shape[0]}) and u (N,), got "
                             f"{x.shape} and {u.shape}")
        xdot = np.empty_like(x)
        xp, op, nx = ffi.from_buffer("double[]", x), ffi.from_buffer("double[]", xdot), x.shape[1]
        f, m, d, b = lib.ps_dynamics, self._model, self._data, int(env)
        for i, ui in enumerate(u.tolist()):
            f(m, d, b, xp + i * nx, ui, op + i * nx)
        return xdot

    def energy(self, x=None, env: int = 0) -> float:
        """Mechanical energy (J) of state ``x`` (default: environment ``env``'s)."""
        self._check_env(env)
        x = self._x[:, env].copy() if x is None else np.ascontiguousarray(x, dtype=float)
        if x.shape != (self._x.shape[0],):
            raise ValueError(f"x must have shape ({self._x.shape[0]},), got {x.shape}")
        return float(lib.ps_energy(self._model, self._data, int(env),
                                   ffi.from_buffer("double[]", x)))
