"""Domain randomisation: the ranges a simulated plant is drawn from.

Every environment of a ``BatchSim`` built with a ``Randomization`` gets a new
plant at each reset and autoreset, drawn in C from its own counter-based RNG
(so a branch copies its plant with its state, and a seed reproduces every
draw). This module holds the ranges and the ``[randomize]`` table of a config
file (the defaults a real rig needs are in ``grpo_ctrl.presets``);
``grpo_ctrl.sim`` turns them into the C model's absolute ranges.

>>> r = Randomization(params=0.3, delay=(1, 2), motor_k=(0.5, 1.0))
>>> sim = BatchSim("pendulum", 4096, preset="rig", randomize=r)

Units: parameter ranges are factors of the nominal value (``scale``) or
absolute values (``absolute``); ``torque_noise`` and ``push`` are fractions of
the actuator limit u_max; ``delay`` and ``push_steps`` count control steps;
``offset`` is in the position's unit (rad for angles).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from grpo_ctrl.errors import UserError
from grpo_ctrl.presets import RANDOMIZATION

# g is the one parameter no rig gets wrong; a pendulum's shape (com, inertia) is drawn only
# where a range names it
FIXED_PARAMS = ("g", "com", "inertia")


def _pair(value, name: str, kind=float) -> tuple:
    try:
        if isinstance(value, (int, float)):
            return (kind(value), kind(value))
        lo, hi = value
        return (kind(lo), kind(hi))
    except (TypeError, ValueError):
        raise UserError(f"randomize.{name} must be a number or a [low, high] pair, got "
                        f"{value!r}") from None


@dataclass(frozen=True)
class Randomization:
    """Ranges of the plant drawn per environment at every reset (uniform)."""
    params: float = field(default=0.0, metadata={
        "help": "relative half-width s: every physical parameter but g is drawn from "
                "nominal x U(1-s, 1+s)"})
    scale: dict = field(default_factory=dict, metadata={
        "help": "per-parameter factor ranges, {name: [low, high]} (overrides params)"})
    absolute: dict = field(default_factory=dict, metadata={
        "help": "per-parameter absolute ranges, {name: [low, high]} (e.g. friction "
                "whose nominal is 0)"})
    delay: tuple = field(default=(0, 0), metadata={
        "help": "actuation delay, [low, high] control steps"})
    motor_k: tuple = field(default=(1.0, 1.0), metadata={
        "help": "first-order motor response per step, tau += k (u - tau), [low, high] "
                "in (0, 1]; 1 = instant"})
    torque_noise: tuple = field(default=(0.0, 0.0), metadata={
        "help": "std of Gaussian actuator noise, [low, high], fraction of u_max"})
    offset: float = field(default=0.0, metadata={
        "help": "encoder offset: each position reads x + U(-offset, offset) (rad or m)"})
    push_rate: float = field(default=0.0, metadata={"help": "random pushes per second"})
    push: tuple = field(default=(0.0, 0.0), metadata={
        "help": "push magnitude, [low, high], fraction of u_max (random sign)"})
    push_steps: int = field(default=1, metadata={"help": "control steps one push lasts"})
    noise_std: dict = field(default_factory=dict, metadata={
        "help": "sensor noise std per state component, {name: std} (not drawn: fixed)"})

    def __post_init__(self):
        object.__setattr__(self, "delay", _pair(self.delay, "delay", int))
        for name in ("motor_k", "torque_noise", "push"):
            object.__setattr__(self, name, _pair(getattr(self, name), name))
        for name in ("scale", "absolute"):
            object.__setattr__(self, name, {str(k): _pair(v, f"{name}.{k}")
                                            for k, v in dict(getattr(self, name)).items()})
        object.__setattr__(self, "noise_std", {str(k): float(v)
                                               for k, v in dict(self.noise_std).items()})
        problems = []
        steps = self.push_steps  # a count: --randomize push_steps=50 parses as 50.0
        if isinstance(steps, float) and steps.is_integer():
            object.__setattr__(self, "push_steps", int(steps))
        elif not isinstance(steps, int) or isinstance(steps, bool):
            problems.append(f"push_steps must be a whole number of control steps, got {steps!r}")
            object.__setattr__(self, "push_steps", 1)
        if not 0 <= self.params < 1:
            problems.append(f"params must lie in [0, 1), got {self.params}")
        for name, (lo, hi) in {**self.scale, **self.absolute}.items():
            if not lo <= hi:
                problems.append(f"the range of {name} must have low <= high, got [{lo}, {hi}]")
        for name, (lo, hi) in self.scale.items():
            if lo <= 0:
                problems.append(f"scale.{name} must stay above 0, got [{lo}, {hi}]")
        for name, (lo, hi) in self.absolute.items():
            # every physical parameter is a size, a mass or a loss: a negative friction feeds
            # energy in, and the drawn plant's state runs off to infinity
            if lo < 0:
                problems.append(f"absolute.{name} must stay at or above 0 (a physical "
                                f"parameter), got [{lo}, {hi}]")
        if not 0 <= self.delay[0] <= self.delay[1]:
            problems.append(f"delay must be 0 <= low <= high steps, got {list(self.delay)}")
        if not 0 < self.motor_k[0] <= self.motor_k[1] <= 1:
            problems.append(f"motor_k must satisfy 0 < low <= high <= 1, got "
                            f"{list(self.motor_k)}")
        for name in ("torque_noise", "push"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                problems.append(f"{name} must be 0 <= low <= high, got [{lo}, {hi}]")
        if self.offset < 0 or self.push_rate < 0 or self.push_steps < 1:
            problems.append("offset and push_rate must be >= 0 and push_steps >= 1")
        if any(v < 0 for v in self.noise_std.values()):
            problems.append(f"noise_std must be >= 0, got {self.noise_std}")
        if problems:
            raise UserError("randomize: " + "; ".join(problems))

    @property
    def active(self) -> bool:
        """Whether any quantity is drawn (otherwise the plant is the nominal one)."""
        base = Randomization()
        return any(getattr(self, f.name) != getattr(base, f.name)
                   for f in fields(self) if f.name != "noise_std")

    def param_range(self, name: str, nominal: float) -> tuple[float, float]:
        """The absolute range of physical parameter ``name`` of nominal value ``nominal``."""
        if name in self.absolute:
            return self.absolute[name]
        lo, hi = self.scale.get(name, (1.0, 1.0) if name in FIXED_PARAMS
                                else (1.0 - self.params, 1.0 + self.params))
        return (nominal * lo, nominal * hi) if nominal >= 0 else (nominal * hi, nominal * lo)

    def to_table(self) -> dict:
        """The ``[randomize]`` table (TOML-ready: lists, not tuples)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, dict):
                v = {k: list(x) if isinstance(x, tuple) else x for k, x in v.items()}
            out[f.name] = v
        return out

    @classmethod
    def from_table(cls, table: dict, base: "Randomization | None" = None) -> "Randomization":
        """Ranges from a ``[randomize]`` table, over ``base`` (default: nothing drawn).
        ``{"off": true}`` turns every range off."""
        table = dict(table)
        if table.pop("off", False):
            base = cls()
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise UserError(f"unknown randomize key(s) {unknown}; known: {sorted(known)} "
                            "and off")
        return replace(base or cls(), **table)


def parse_override(text: str):
    """One ``KEY=VALUE`` of ``--randomize`` as a (key, value) pair for a table:
    ``params=0.3``, ``delay=1,2``, ``scale.m=0.8,1.2``, ``off``."""
    if text.strip() == "off":
        return "off", True
    key, sep, value = text.partition("=")
    if not sep:
        raise UserError(f"--randomize wants KEY=VALUE (e.g. params=0.3, delay=1,2) or off, "
                        f"got {text!r}")
    try:
        numbers = [float(v) for v in value.split(",")]
    except ValueError:
        raise UserError(f"--randomize {key}: values must be numbers, got {value!r}") from None
    parsed = numbers[0] if len(numbers) == 1 else numbers
    head, _, sub = key.strip().partition(".")
    return (head, {sub: parsed}) if sub else (head, parsed)


def with_overrides(base: "Randomization", overrides: list[str]) -> "Randomization":
    """``base`` with the ``--randomize KEY=VALUE`` overrides applied in order."""
    table: dict = {}
    for text in overrides:
        key, value = parse_override(text)
        if key == "off":
            base, table = Randomization(), {}
        elif isinstance(value, dict):
            merged = dict(table.get(key, getattr(base, key, {}) or {}))
            merged.update(value)
            table[key] = merged
        else:
            table[key] = value
    return Randomization.from_table(table, base)


def default_randomization(system: str, preset: str) -> Randomization:
    """The ranges ``system``/``preset`` trains with by default (nothing drawn for
    the gym presets; ``grpo_ctrl.presets.RANDOMIZATION``)."""
    return Randomization(**RANDOMIZATION.get((system, preset), {}))


# ``train --plant``: how far around a fitted value its range reaches
FIT_SIGMAS = 3.0     # standard errors of the fit ...
FIT_FLOOR = 0.10     # ... but at least this share of the value (what a fit does not see:
                     # temperature, wear, another payload)
HOST_TICK = 1        # a fit's delay counts from the applied command; a host-side policy's
                     # command applies from the tick after the measurement it answers


def centred_on_fit(base: Randomization, params: dict, std: dict, delay: int,
                   offset: float, offset_std: float = 0.0) -> Randomization:
    """``base`` with every physical parameter but g drawn around a fitted
    plant (``grpo_ctrl.plant_file.PlantValues``): value +- max(3 std, 10%),
    the delay within a step of the fitted one plus the host loop's tick
    (HOST_TICK), and encoder offsets up to the fitted one's size (+ 3 std);
    the rest of ``base`` (motor, noise, pushes) stays."""
    absolute = {}
    for name, v in params.items():
        if name in FIXED_PARAMS:
            continue
        half = max(FIT_SIGMAS * float(std.get(name, 0.0)), FIT_FLOOR * abs(v))
        absolute[name] = (max(v - half, 0.05 * v), v + half)  # positive where v is
    return replace(base, params=0.0, scale={}, absolute=absolute,
                   delay=(int(delay) + HOST_TICK - 1, int(delay) + HOST_TICK + 1),
                   offset=max(base.offset, abs(offset) + FIT_SIGMAS * offset_std))
