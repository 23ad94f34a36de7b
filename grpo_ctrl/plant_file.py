"""A plant that is not a preset, as a TOML file: what ``grpo-ctrl sysid
--out`` and ``grpo-ctrl hil --reveal`` write and ``hil --plant`` and
``train --plant`` read.

The top-level keys are the plant's parameter names (``PlantSpec.
param_names``: g, m, l, b, fc for the pendulum), ``delay`` (control steps),
``offset`` (encoder offset of the pendulum's angle, rad) and ``motor_k``
(the actuator's first-order response per control step, as the simulator's:
1 is instant); any may be left out (the preset's value, 0, 1). A fit adds a
``[std]`` table of standard errors and a ``[fit]`` table of its quality::

    m = 0.18
    l = 0.26
    delay = 1
    offset = 0.02

    [std]
    m = 0.0012
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.plant import PlantSpec, init_model
from grpo_ctrl.randomize import FIXED_PARAMS

MAX_FILE_DELAY = 32  # PS_MAX_DELAY
MYSTERY_SCALE = 0.3        # every parameter but FIXED_PARAMS: nominal x U(1 - s, 1 + s)
MYSTERY_DELAY = (0, 2)     # steps
MYSTERY_OFFSET = 0.05      # rad, U(-o, o) on the pendulum's encoder
MYSTERY_MOTOR_K = (0.5, 1.0)  # the actuator's response per step: a lag of up to ~1.4 steps


@dataclass
class PlantValues:
    """A plant's physical parameters (every one of ``PlantSpec.param_names``),
    actuation delay, the pendulum encoder's offset, the motor's response
    per step (1: instant) and, from a fit, the parameters' standard errors."""
    params: dict
    delay: int = 0
    offset: float = 0.0
    std: dict = field(default_factory=dict)
    motor_k: float = 1.0

    def table(self) -> dict:
        """The TOML table (``write_toml``)."""
        out = {k: float(v) for k, v in self.params.items()}
        out.update(delay=int(self.delay), offset=float(self.offset), motor_k=float(self.motor_k))
        if self.std:
            out["std"] = {k: float(v) for k, v in self.std.items()}
        return out


def nominal_params(spec: PlantSpec) -> dict:
    """The preset's physical parameters by name."""
    model, _ = init_model(spec.system, spec.preset)
    return {name: float(model.param[k]) for k, name in enumerate(spec.param_names)}


def _check(values: PlantValues, spec: PlantSpec, where: str) -> PlantValues:
    for name, v in values.params.items():
        if name not in spec.param_names:
            raise UserError(f"{where}: {name!r} is not a parameter of {spec.system}; known: "
                            f"{list(spec.param_names)}, delay, offset and motor_k")
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise UserError(f"{where}: {name} must be a finite number >= 0, got {v!r}")
        if v == 0 and name in ("m", "l", "g"):
            raise UserError(f"{where}: {name} must be above 0, got {v!r}")
    d = values.delay
    if not (isinstance(d, (int, float)) and float(d).is_integer() and 0 <= d <= MAX_FILE_DELAY):
        raise UserError(f"{where}: delay must be whole control steps in [0, {MAX_FILE_DELAY}], "
                        f"got {d!r}")
    o = values.offset
    if not (isinstance(o, (int, float)) and math.isfinite(o) and abs(o) < math.pi):
        raise UserError(f"{where}: offset must be a finite angle in (-pi, pi) rad, got {o!r}")
    k = values.motor_k
    if not (isinstance(k, (int, float)) and 0 < k <= 1):
        raise UserError(f"{where}: motor_k is the motor's response per control step, in (0, 1] "
                        f"(1: instant), got {k!r}")
    values.motor_k = float(k)
    values.params = {**nominal_params(spec), **{k: float(v) for k, v in values.params.items()}}
    values.delay, values.offset = int(d), float(o)
    return values


def read_plant_file(path, spec: PlantSpec) -> PlantValues:
    """A plant file, checked against ``spec`` (one-line ``UserError``s)."""
    try:
        import tomllib  # novermin: 3.10 takes the except branch
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise UserError(f"plant file {str(path)!r} does not exist; write one with "
                        "`grpo-ctrl sysid --out`") from None
    except OSError as e:
        raise UserError(f"cannot read plant file {str(path)!r}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"plant file {str(path)!r} is not valid TOML: {e}") from None
    fit = data.pop("fit", {})
    if isinstance(fit, dict) and fit.get("system") not in (None, spec.system):
        raise UserError(f"plant file {str(path)!r} was fitted for {fit['system']}, not "
                        f"{spec.system}: give the matching --system")
    std = data.pop("std", {})
    delay, offset = data.pop("delay", 0), data.pop("offset", 0.0)
    motor_k = data.pop("motor_k", 1.0)
    where = f"plant file {str(path)!r}"
    values = _check(PlantValues(dict(data), delay, offset, motor_k=motor_k), spec, where)
    values.std = {k: float(v) for k, v in std.items()
                  if (k in spec.param_names or k == "offset")
                  and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0}
    return values


def parse_param(text: str, option: str = "--param") -> tuple[str, float]:
    """One ``--param NAME=VALUE`` (or another option's)."""
    name, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = None
    if not sep or not name.strip() or number is None:
        raise UserError(f"{option} wants NAME=VALUE (e.g. m=0.18" +
                        (", delay=1, offset=0.02" if option == "--param" else "") +
                        f"), got {text!r}")
    return name.strip(), number


def plant_from_params(pairs: list[str], spec: PlantSpec,
                      base: PlantValues | None = None) -> PlantValues:
    """``base`` (default: the preset) with ``--param NAME=VALUE`` overrides."""
    base = base or PlantValues({})
    params, delay, offset = dict(base.params), base.delay, base.offset
    motor_k = base.motor_k
    for text in pairs:
        name, v = parse_param(text)
        if name == "delay":
            delay = int(v) if float(v).is_integer() else v
        elif name == "offset":
            offset = v
        elif name == "motor_k":
            motor_k = v
        else:
            params[name] = v
    return _check(PlantValues(params, delay, offset, motor_k=motor_k), spec, "--param")


def mystery_plant(spec: PlantSpec, seed: int) -> PlantValues:
    """A hidden plant drawn from ``seed``: every parameter but g and a
    pendulum's shape (com, inertia: ``randomize.FIXED_PARAMS``, the preset's
    rod, which sysid assumes) scaled by U(0.7, 1.3), a delay of 0-2 steps, an
    encoder offset within +-0.05 rad, a motor response per step in U(0.5, 1)
    (drawn last: the other draws are those of the seed before the motor lag
    existed). The fixed parameters take no draw, so a seed's plant is the
    same as before the pendulum had them."""
    rng = np.random.default_rng([int(seed), 0x5EC2E7])
    params = {name: (v if name in FIXED_PARAMS else
                     float(v * rng.uniform(1 - MYSTERY_SCALE, 1 + MYSTERY_SCALE)))
              for name, v in nominal_params(spec).items()}
    delay = int(rng.integers(MYSTERY_DELAY[0], MYSTERY_DELAY[1] + 1))
    offset = float(rng.uniform(-MYSTERY_OFFSET, MYSTERY_OFFSET))
    motor_k = float(rng.uniform(*MYSTERY_MOTOR_K))
    return PlantValues(params, delay, offset, motor_k=motor_k)
