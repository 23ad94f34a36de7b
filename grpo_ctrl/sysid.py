"""System identification: a plant's physical parameters, delay and encoder
offset from closed- or open-loop logs (``grpo-ctrl run`` / ``excite``), for
the pendulum and the Furuta pendulum.

Two fits, the second refining the first:

1. Least squares on the equations of motion, which are the C simulator's
   own (``csrc/plants.c``, through ``BatchSim.dynamics_rows``): velocity
   and acceleration come from the positions, Butterworth-filtered forwards
   and backwards (zero phase); the command goes through the same filter;
   Gauss-Newton finds the parameters (``presets.SYSID``: for the pendulum
   m, l, b, fc and the encoder offset; for the Furuta km, lr, jr, dr, lp,
   jp, dp and the pendulum encoder's offset) whose C plant's accelerations
   at the filtered states are closest to the measured ones, each joint's
   equation weighted by its residual's inverse rms. The integer delay d is
   the one that leaves the actuated joint the smallest residual. Where the
   equations are homogeneous in the parameters (the Furuta: every inertia
   and damping times s, mp times s and rm over s move nothing), the known
   ``scale_names`` (a weighed mass, an ohmmeter's resistance, or the
   preset's) set the scale; a parameter that does not move the C plant's
   accelerations (the Furuta's mr) is not fitted.
2. A simulation-error fit: the batched C simulator (``BatchSim`` holding
   one candidate plant per environment) replays the logged commands over
   short windows from the measured states, every candidate and window in
   one call; Levenberg-Marquardt from the least-squares answer (its
   Jacobian by finite differences, all in one call) finds the plant whose
   simulated angles stay closest to the measured ones. For the Furuta a
   second pass from that answer uses windows that each span a piece of log:
   the dampings' small effects add up over it (docs/sysid.md).

The last quarter of every log is held out: the fits never see it, and the
reported simulation error and the plot are on it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.plant import PlantSpec, init_model
from grpo_ctrl.plant_file import PlantValues, nominal_params
from grpo_ctrl.presets import SYSID
from grpo_ctrl.sim import MAX_DELAY, BatchSim

REQUIRED_COLUMNS = ("kind", "dev_t_us", "pos", "obs", "actuator")
MIN_SECONDS = 5.0        # of log, before the held-out quarter is taken
MIN_TRAVEL = 0.03        # rad of peak-to-peak travel of a log that moved (20 fine encoder steps)
MAX_SATURATED = 0.5      # share of rows at the actuator limit beyond which torque is unknown
HELD_OUT = 0.25          # last share of each log kept for validation
MIN_PIECE_S = 1.5        # shortest stretch between lost frames that is used
GAP_KINDS = ("lost", "seq_jump", "malformed", "failed")  # rows that mean a missing state
CORRELATION_WARN = 0.95  # |correlation| of two estimates above which they are not separable
CONDITION_WARN = 1e3     # condition number of the (column-scaled) regressor
MOTOR_K_LOW = 0.05       # the slowest motor response per step the refinement tries


@dataclass
class Log:
    """One log's state rows: time (s), each position sensor's reading
    (``pos (n, channels)``: rad, angles unwrapped; from the observation the
    host built, which scaled the encoder counts by the device's INFO) and
    the actuator value applied from each row on; ``breaks``: the rows that
    follow lost frames; ``pole``: the pendulum's column."""
    name: str
    t: np.ndarray
    pos: np.ndarray
    u: np.ndarray
    breaks: tuple = ()
    pole: int = 0

    @property
    def angle(self) -> np.ndarray:
        """The pendulum's angle reading."""
        return self.pos[:, self.pole]

    @property
    def dt(self) -> float:
        return float(np.median(np.diff(self.t)))


@dataclass
class Fit:
    """What ``identify`` found."""
    system: str
    preset: str
    params: dict            # physical parameters, PlantSpec.param_names
    std: dict               # their standard errors (least squares; 0: not fitted)
    delay: int              # steps
    offset: float           # encoder offset of the pendulum angle (rad)
    nominal: dict           # the preset's parameters
    ls_params: dict         # the least-squares answer before refinement
    ls_residual: float      # rms of the actuated joint's least-squares residual (rad/s^2)
    ls_residuals_by_delay: list
    sim_error_ls: float     # rms angle error (rad) on held-out windows: least squares ...
    sim_error: float        # ... and the refined fit
    condition: float
    warnings: list = field(default_factory=list)
    fitted: tuple = ()      # the parameters the data determined (the rest: known or preset)
    motor_k: float = 1.0    # the motor's response per control step (simulation-error fit)

    def table(self) -> dict:
        """The TOML of ``--out``: the parameters, delay, offset and motor
        response at the top (``--reveal``'s format), standard errors and fit
        quality below."""
        table = PlantValues(self.params, self.delay, self.offset, self.std,
                            motor_k=self.motor_k).table()
        table["fit"] = {"system": self.system, "preset": self.preset,
                        "fitted": list(self.fitted),
                        "ls_residual": float(self.ls_residual),
                        "sim_error_held_out": float(self.sim_error),
                        "sim_error_held_out_ls": float(self.sim_error_ls),
                        "condition": float(self.condition), "warnings": list(self.warnings)}
        return table


# ---------------------------------------------------------------------- logs
def positions(obs: np.ndarray, spec: PlantSpec) -> np.ndarray:
    """Each position sensor's reading ``(..., channels)`` from observations
    ``(..., nobs)``: an angle from its (cos, sin), in (-pi, pi]."""
    cols = []
    for k, _ in spec.channels:
        i = spec.obs_index[k]
        cols.append(np.arctan2(obs[..., i + 1], obs[..., i]) if spec.angles[k] else obs[..., i])
    return np.stack(cols, axis=-1)


def read_log(path, spec: PlantSpec) -> Log:
    """A run/excite telemetry file's state rows, checked: one line of
    ``UserError`` for a missing file or column, a wrong plant, a log too
    short, saturated or never moving."""
    from grpo_ctrl.firmware_bridge.telemetry import read_telemetry

    path = Path(path)
    if not path.is_file():
        raise UserError(f"log {str(path)!r} does not exist; give a file written by "
                        "`grpo-ctrl run --log` or `grpo-ctrl excite --log`")
    try:
        rows = read_telemetry(path)
    except (ValueError, KeyError, UnicodeDecodeError) as e:
        raise UserError(f"log {str(path)!r} is not a telemetry CSV/JSONL file ({e}); give a "
                        "file written by `grpo-ctrl run --log`") from None
    states, breaks, gap = [], [], False
    for r in rows:  # a state row after lost frames starts a new contiguous piece
        usable = r.get("kind") == "state" and all(r.get(c) is not None for c in REQUIRED_COLUMNS)
        if usable:
            if gap and states:
                breaks.append(len(states))
            states.append(r)
        gap = (gap or r.get("kind") in GAP_KINDS or r.get("kind") == "state") and not usable
    columns = set(states[0]) if states else set(rows[0]) if rows else set()
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise UserError(f"log {str(path)!r} lacks the column(s) {missing}; sysid needs "
                        f"{list(REQUIRED_COLUMNS)} as `grpo-ctrl run --log` writes them")
    if len(states) < 2:
        raise UserError(f"log {str(path)!r} is too short: {len(states)} state rows; record "
                        f"at least {MIN_SECONDS:g} s (`grpo-ctrl excite --duration 20`)")
    nch = {len(r["pos"]) if isinstance(r["pos"], list) else 1 for r in states}
    if nch != {len(spec.channels)}:
        raise UserError(f"log {str(path)!r} has {sorted(nch)} position channel(s) but "
                        f"{spec.system} has {len(spec.channels)}: wrong plant; give the "
                        "--system the log was recorded on")
    if {len(r["obs"]) if isinstance(r["obs"], list) else 1 for r in states} != {spec.nobs}:
        raise UserError(f"log {str(path)!r} has observations of another size than "
                        f"{spec.system}'s {spec.nobs}: wrong plant; give the --system the log "
                        "was recorded on")
    t = np.array([r["dev_t_us"] for r in states], float) * 1e-6
    obs = np.array([r["obs"] for r in states], float)
    u = np.array([r["actuator"] for r in states], float)
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(obs)) and np.all(np.isfinite(u))):
        raise UserError(f"log {str(path)!r} holds non-finite values; record it again")
    if np.any(np.diff(t) <= 0):
        raise UserError(f"log {str(path)!r}: the device time goes backwards; is it two logs "
                        "in one file? Give them as separate LOG arguments")
    pole = [k for k, _ in spec.channels].index(spec.pole_angle)
    log = Log(path.name, t, np.unwrap(positions(obs, spec), axis=0), u, tuple(breaks), pole)
    check_log(log, spec)
    return log


def check_log(log: Log, spec: PlantSpec) -> None:
    """``UserError`` unless ``log`` can identify ``spec``'s plant."""
    where = f"log {log.name!r}"
    duration = log.t[-1] - log.t[0]
    if duration < MIN_SECONDS:
        raise UserError(f"{where} is too short: {duration:.1f} s; record at least "
                        f"{MIN_SECONDS:g} s (`grpo-ctrl excite --duration 20`)")
    if np.max(np.abs(log.u)) > spec.u_max * 1.01:
        raise UserError(f"{where} commands up to {np.max(np.abs(log.u)):.3g} but "
                        f"{spec.system}/{spec.preset} allows {spec.u_max:g}: wrong plant; give "
                        "the --system and --preset the log was recorded on")
    saturated = float(np.mean(np.abs(log.u) >= 0.98 * spec.u_max))
    if saturated > MAX_SATURATED:
        raise UserError(f"{where} is saturated: the command sits at the actuator limit in "
                        f"{saturated:.0%} of rows, where the {spec.action_name} is unknown; "
                        "record an excitation within the limits (`grpo-ctrl excite`)")
    travel = float(np.max(np.ptp(log.pos, axis=0)))
    if travel < MIN_TRAVEL:
        raise UserError(f"{where} never moves: no sensor travels more than {travel:.3g} in "
                        "all; excite it (`grpo-ctrl excite`) or check that the device was armed")


# ---------------------------------------------------------------------- least squares
def _filter(dt: float, cutoff_hz: float):
    from scipy.signal import butter, filtfilt
    b, a = butter(4, min(cutoff_hz * 2 * dt, 0.9))
    pad = int(0.75 / dt)  # well past the filter's settling, so the ends are not distorted
    return lambda x: filtfilt(b, a, x, axis=0, padtype="odd", padlen=min(pad, len(x) - 1))


def _delayed(u: np.ndarray, d: int) -> np.ndarray:
    """The command acting at each row with delay d: commands are held for a
    step, so around row k the filtered command is the mean of u[k-1-d] and
    u[k-d] (first values repeated before the log starts)."""
    padded = np.concatenate([np.full(d + 1, u[0]), u])
    return 0.5 * (padded[1:len(u) + 1] + padded[:len(u)])


@dataclass
class _Segment:
    y: np.ndarray      # filtered position readings (n, channels), offsets included
    yd: np.ndarray
    ydd: np.ndarray
    u: np.ndarray      # raw commands
    raw: np.ndarray    # raw position readings (n, channels)
    dt: float
    cutoff_hz: float


def _segments(logs: list[Log], cutoff_hz: float) -> tuple[list[_Segment], list[_Segment]]:
    """Each log's contiguous pieces (split where frames were lost), cut into
    the fitting part and the held-out last quarter."""
    fit, held = [], []
    for log in logs:
        dt, n = log.dt, len(log.t)
        n_fit = int(n * (1 - HELD_OUT))
        f = _filter(dt, cutoff_hz)
        edges = [0, *log.breaks, n]
        for a, b in zip(edges[:-1], edges[1:]):
            for lo, hi, out in ((a, min(b, n_fit), fit), (max(a, n_fit), b, held)):
                if (hi - lo) * dt < MIN_PIECE_S:
                    continue
                raw, u = log.pos[lo:hi], log.u[lo:hi]
                yf = f(raw)
                yd = np.gradient(yf, dt, axis=0)
                out.append(_Segment(yf, yd, np.gradient(yd, dt, axis=0), u, raw, dt, cutoff_hz))
    if not fit or not held:
        raise UserError("the logs hold no stretch of 1.5 s without lost frames in their first "
                        "three quarters and in their last; record again on a steadier link")
    return fit, held


def _statistics(J: np.ndarray, r: np.ndarray, dt: float, cutoff_hz: float) -> dict:
    """Standard errors and correlations of a least-squares answer whose
    residual ``r`` has Jacobian ``J`` (rows, parameters), and ``J``'s
    column-scaled condition number. The residual is coloured by the filter:
    about one independent sample per 1 / (2 cutoff) seconds, not per row."""
    n, p = J.shape
    n_eff = max(p + 1.0, n * min(1.0, 2 * cutoff_hz * dt))
    cov = float(r @ r) / (n_eff - p) * np.linalg.pinv(J.T @ J)
    scale = np.linalg.norm(J, axis=0)
    cond = float(np.linalg.cond(J / np.where(scale > 0, scale, 1)))
    sd = np.sqrt(np.maximum(np.diag(cov), 0))
    corr = cov / np.outer(np.where(sd > 0, sd, 1), np.where(sd > 0, sd, 1))
    return {"std": sd, "corr": corr, "cond": cond}


def _gauss_newton(residual, p0: np.ndarray, lows: np.ndarray, floors: np.ndarray,
                  iterations: int = 60, tolerance: float = 1e-10):
    """Minimise ``|residual(p)|^2`` from ``p0`` within ``lows`` (the
    Jacobian by forward differences, a halved step where a full one does
    not lower the cost) until a step moves no parameter by more than
    ``tolerance`` of its size (``floors`` below). ``residual(P)`` answers every
    candidate row of ``P (C, n)`` at once, ``(C, rows)``. Returns p, its
    residual and Jacobian."""
    p = np.maximum(p0, lows)
    r = residual(p[None])[0]
    cost = float(r @ r)
    for _ in range(iterations):
        h = 1e-6 * np.where(p != 0, np.abs(p), floors)  # relative: a scaled plant, a scaled step
        J = ((residual(p + np.diag(h)) - r) / h[:, None]).T
        delta = -np.linalg.lstsq(J, r, rcond=None)[0]
        for step in 0.5 ** np.arange(8):
            trial = np.maximum(p + step * delta, lows)
            rt = residual(trial[None])[0]
            if float(rt @ rt) < cost:
                break
        else:
            break
        done = np.all(np.abs(trial - p) <= tolerance * np.maximum(np.abs(p), floors))
        p, r, cost = trial, rt, float(rt @ rt)
        if done:
            break
    h = 1e-6 * np.where(p != 0, np.abs(p), floors)  # relative: a scaled plant, a scaled step
    return p, r, ((residual(p + np.diag(h)) - r) / h[:, None]).T


class PlantModel:
    """A plant's identification: its fitted vector (``presets.SYSID``: the
    physical parameters the data determine, then the pendulum encoder's
    offset), the plant that vector gives the simulator, and the least
    squares on the equations of motion, which are the C plant's own
    (``BatchSim.dynamics_rows``): the accelerations it computes from the
    filtered states and the delayed command are fitted to the measured
    ones, each joint's equation weighted by its residual's inverse rms."""

    residual_unit = "rad/s^2"  # of the least-squares residual (an acceleration)

    def __init__(self, spec: PlantSpec, known: dict):
        settings = SYSID[spec.system]
        self.system = spec.system
        for key in ("names", "cutoff_hz", "fd_step", "window_s", "long_window_s",
                    "known_names", "positive", "scale_names"):
            setattr(self, key, settings[key])
        self.lows = np.array(settings["lows"], float)
        self.spec, self.base = spec, {**nominal_params(spec), **known}
        nominal = nominal_params(spec)
        fitted = self.names[:-1]
        self.floors = np.array(settings["floors"] or [nominal[k] for k in fitted] + [1e-2])
        self.negligible = (np.array(settings["negligible"]) if settings["negligible"]
                           else 0.01 * self.floors[:-1])
        self.offset_name = f"offset_{spec.state_names[spec.pole_angle]}"
        self._sim = None
        absent = [k for k in spec.param_names if k not in fitted and not self._enters(k)]
        self.notes = [f"{k} does not enter the equations of motion: it is not fitted"
                      for k in absent]
        assumed = [k for k in self.scale_names if k not in known]
        if assumed:
            self.notes.append(f"{' and '.join(assumed)} set the scale of the fit and cannot "
                              "come from angles and voltage: the preset's value is assumed; "
                              "give measured values with --known " +
                              " ".join(f"{k}=..." for k in assumed))

    # ------------------------------------------------------------ the simulator's plant
    def plant(self, P: np.ndarray, D: np.ndarray) -> dict:
        """``BatchSim.set_plant`` values of candidates ``P (C, len(names) + 1)``
        (the names and motor_k), delays ``D``."""
        out = {k: self.base[k] for k in self.spec.param_names if k not in self.names}
        out.update({name: P[:, i] for i, name in enumerate(self.names[:-1])})
        n = len(self.names)
        return {**out, "delay": D, self.offset_name: P[:, n - 1], "motor_k": P[:, n]}

    def state(self, y: np.ndarray, yd: np.ndarray, P: np.ndarray) -> np.ndarray:
        """Simulator states ``(C, nx)`` of readings ``y, yd (C, channels)``."""
        spec = self.spec
        x = np.zeros((len(y), spec.nx))
        for c, (k, v) in enumerate(spec.channels):
            x[:, k] = y[:, c] - (P[:, len(self.names) - 1] if k == spec.pole_angle else 0.0)
            x[:, v] = yd[:, c]
        return x

    def params(self, p: np.ndarray) -> dict:
        return {**self.base, **dict(zip(self.names[:-1], p[:len(self.names) - 1]))}

    def vector(self, params: dict, offset: float, motor_k: float) -> np.ndarray:
        return np.array([params[k] for k in self.names[:-1]] + [offset, motor_k])

    # ------------------------------------------------------------ least squares
    def accelerations(self, P: np.ndarray, y: np.ndarray, yd: np.ndarray,
                      u: np.ndarray) -> np.ndarray:
        """Each joint's acceleration ``(C, rows, channels)`` that the C plant of
        each candidate ``P (C, len(names))`` gives readings ``y, yd (rows,
        channels)`` under commands ``u (rows,)``."""
        C, spec = len(P), self.spec
        if self._sim is None or self._sim.num_envs < C:
            self._sim = BatchSim(spec.system, C, preset=spec.preset, hold_plant=True)
        full = np.column_stack([P, np.ones(C)])
        self._sim.set_plant(self.plant(full, np.zeros(C)), np.arange(C))
        vel = [v for _, v in spec.channels]
        out = np.empty((C, len(u), len(vel)))
        for b in range(C):
            x = self.state(y, yd, np.broadcast_to(full[b], (len(u), full.shape[1])))
            out[b] = self._sim.dynamics_rows(x, u, b)[:, vel]
        return out

    def _enters(self, name: str) -> bool:
        """Whether parameter ``name`` changes the C plant's accelerations."""
        spec, sim = self.spec, BatchSim(self.spec.system, 2, preset=self.spec.preset,
                                        hold_plant=True)
        sim.set_plant({name: 1.5 * self.base[name] + 1e-3}, [1])
        x = np.full((1, spec.nx), 0.3)
        return not np.array_equal(sim.dynamics_rows(x, [0.5], 0), sim.dynamics_rows(x, [0.5], 1))

    def least_squares(self, segments: list[_Segment], max_delay: int) -> dict:
        """For every delay 0..max_delay: the parameters whose C plant's
        accelerations fit the measured ones best (Gauss-Newton from the
        preset, then from the previous delay's answer), each joint's
        equation weighted by its residual's inverse rms; the delay with the
        smallest residual of the actuated joint (the first sensor) wins,
        with its standard errors."""
        dt = segments[0].dt
        trim = int(0.2 / dt)
        s_ = [slice(trim, len(s.u) - trim) for s in segments]
        y = np.concatenate([s.y[k] for s, k in zip(segments, s_)])
        yd = np.concatenate([s.yd[k] for s, k in zip(segments, s_)])
        ydd = np.concatenate([s.ydd[k] for s, k in zip(segments, s_)])
        filt = _filter(dt, self.cutoff_hz)
        p0 = self.vector(self.base, 0.0, 1.0)[:-1]

        def fit(d, p, w=None):
            u = np.concatenate([filt(_delayed(s.u, d))[k] for s, k in zip(segments, s_)])
            error = lambda P: ydd - self.accelerations(P, y, yd, u)  # noqa: E731
            if w is None:  # first, each joint's measured accelerations weigh alike
                w = 1 / np.sqrt(np.mean(ydd ** 2, axis=0))
            p, r, J = _gauss_newton(lambda P: (error(P) * w).reshape(len(P), -1),
                                    p, self.lows, self.floors)
            r_joint = r.reshape(-1, len(w)) / w
            return float(np.sqrt(np.mean(r_joint[:, 0] ** 2))), p, r, J, r_joint

        results = []
        for d in range(max_delay + 1):
            results.append(fit(d, results[-1][1] if results else p0))
        d = int(np.argmin([x[0] for x in results]))
        # the chosen delay's fit again, weighted by its residuals' inverse rms
        rms, p, r, J, r_joint = fit(d, results[d][1],
                                    1 / np.sqrt(np.mean(results[d][4] ** 2, axis=0)))
        return {"delay": d, "rms": rms, "rms_by_delay": [x[0] for x in results], "phys": p,
                **_statistics(J, r, dt, self.cutoff_hz)}


# ---------------------------------------------------------------------- simulation error
class SimScorer:
    """Rms angle error of candidate plants replaying logged commands over
    fixed windows, every (candidate, window) pair one environment of one
    ``BatchSim`` holding its plant."""

    def __init__(self, model, segments: list[_Segment], max_windows: int = 12,
                 window_s: float | None = None):
        dt = segments[0].dt
        window_s = window_s or model.window_s
        lo, margin = MAX_DELAY + int(0.2 / dt), int(0.2 / dt)  # the delay line, the filter's ends
        if math.isinf(window_s):  # each piece one window: the shortest that holds a short one
            window_s = min([(len(s.u) - lo - margin) * dt for s in segments
                            if (len(s.u) - lo - margin) * dt >= model.window_s] or [model.window_s])
        self.K = K = max(10, int(round(window_s / dt)))
        starts = []
        for i, s in enumerate(segments):
            hi = len(s.u) - K - margin
            if hi >= lo:
                starts += [(i, k) for k in range(lo, hi + 1, K)]
        if not starts:
            raise UserError(f"the logs are too short for the simulation-error windows of "
                            f"{window_s:g} s (their last quarter is held out); record "
                            "longer (`grpo-ctrl excite --duration 20`)")
        pick = np.linspace(0, len(starts) - 1, min(max_windows, len(starts))).round().astype(int)
        self.starts = [starts[j] for j in pick]
        self.model, self.spec, self.dt = model, model.spec, dt
        self.W = len(self.starts)
        self.u = np.stack([segments[i].u[k:k + K] for i, k in self.starts], axis=1)  # (K, W)
        self.u_before = np.stack([segments[i].u[k - MAX_DELAY:k] for i, k in self.starts])
        # measured readings (K, W, channels)
        self.y = np.stack([segments[i].raw[k + 1:k + K + 1] for i, k in self.starts], axis=1)
        self.y0 = np.array([segments[i].y[k] for i, k in self.starts])
        self.yd0 = np.array([segments[i].yd[k] for i, k in self.starts])
        self._sims: dict[int, BatchSim] = {}

    def _sim(self, B: int) -> BatchSim:
        if B not in self._sims:
            spec = self.spec
            h = spec.dt / init_model(spec.system, spec.preset)[0].substeps
            self._sims[B] = BatchSim(spec.system, B, preset=spec.preset,
                                     hold_plant=True, dt=self.dt,
                                     substeps=max(1, math.ceil(self.dt / h - 1e-9)),
                                     noise_std=[0.0] * spec.nx, enc_counts=[0.0] * spec.nx,
                                     v_max=0.0, max_steps=0, term_limit=[0.0] * spec.nx)
        return self._sims[B]

    def simulate(self, phys: np.ndarray, delays: np.ndarray, dx0=None) -> np.ndarray:
        """Simulated readings ``(K, C, W, channels)`` of C candidates
        ``phys (C, len(model.names))`` with integer ``delays (C,)``, each
        window starting from its filtered state plus ``dx0 (C, W, nx)``."""
        C, W, K = len(phys), self.W, self.K
        sim = self._sim(C * W)
        rep = lambda a: np.repeat(a, W, axis=0)  # noqa: E731  (candidate-major)
        P, D = rep(phys), rep(delays)
        sim.set_plant(self.model.plant(P, D))
        sim.reset()
        x0 = self.model.state(np.tile(self.y0, (C, 1)), np.tile(self.yd0, (C, 1)), P)
        if dx0 is not None:
            x0 = x0 + dx0.reshape(C * W, -1)
        act = np.zeros((C * W, MAX_DELAY), np.float32)
        ub = np.tile(self.u_before, (C, 1))
        for b in range(C * W):  # the commands still in the delay line at the window start
            d = int(D[b])
            act[b, :d] = ub[b, MAX_DELAY - d:]
        # the motor's output at the window start: its lag run over the
        # commands that have left the delay line
        k, tau = P[:, -1], ub[:, 0].astype(float)
        for j in range(1, MAX_DELAY):
            tau = np.where(j < MAX_DELAY - D, tau + k * (ub[:, j] - tau), tau)
        sim.set_state({"x": x0, "act_buf": act, "t": np.zeros(C * W, np.int64), "tau": tau})
        obs, *_ = sim.rollout(np.tile(self.u, (1, C)).astype(np.float32))
        return positions(obs, self.spec).reshape(K, C, W, -1)

    def residuals(self, phys: np.ndarray, delays: np.ndarray, dx0=None) -> np.ndarray:
        """Reading errors (wrapped) of each candidate, ``(C, W, K * channels)``."""
        e = self.simulate(phys, delays, dx0) - self.y[:, None]
        e = np.arctan2(np.sin(e), np.cos(e)).transpose(1, 2, 0, 3)
        return e.reshape(len(phys), self.W, -1)

    def score(self, phys: np.ndarray, delays: np.ndarray) -> np.ndarray:
        """Rms reading error (rad) of each candidate over every window."""
        return np.sqrt(np.mean(self.residuals(phys, delays) ** 2, axis=(1, 2)))


def refine(scorer: SimScorer, phys0: np.ndarray, delay0: int, iterations: int = 40,
           tolerance: float = 1e-6):
    """Levenberg-Marquardt on the simulation error over the model's vector,
    the motor's response per step (``phys0``'s last entry) and every
    window's start state (the filtered state is off by the
    encoder's resolution, which would otherwise bend the parameters), from
    the least-squares answer, for the delays next to its delay. A window's
    start moves only its own window, so one candidate perturbs a state
    component of every window at once: each iteration scores every delay's
    Jacobian candidates in one simulator call and every delay's trial steps
    in another. Stops after ``iterations``, or once an iteration lowers no
    delay's cost by more than ``tolerance`` of it (a lagging motor, which
    least squares leaves out, can start it 30 % off). Returns the best
    candidate, its delay and score (the start is one, so the result is never
    worse)."""
    model, W = scorer.model, scorer.W
    nx = scorer.spec.nx
    delays = np.arange(max(0, delay0 - 1), min(MAX_DELAY, delay0 + 1) + 1)
    nd, n = len(delays), len(phys0)               # the model's names and motor_k
    m = n + nx                                     # candidates per delay beyond the base
    low, high = np.append(model.lows, MOTOR_K_LOW), np.append(np.full(n - 1, np.inf), 1.0)
    floors = np.append(model.floors, 1.0)
    sign = np.append(np.ones(n - 1), -1.0)         # motor_k: a backward difference (1 is its top)
    p = np.tile(np.clip(phys0, low, high), (nd, 1))
    dx = np.zeros((nd, W, nx))
    lows = np.concatenate([low, np.full(W * nx, -np.inf)])
    highs = np.concatenate([high, np.full(W * nx, np.inf)])
    state_h = np.where(np.array(scorer.spec.angular_velocities) |
                       ~np.array(scorer.spec.angles), 1e-3, 1e-4)
    lam = np.full(nd, 1e-2)
    steps = np.array([1.0, 0.5, 0.2])
    cost = (scorer.residuals(p, delays, dx) ** 2).sum(axis=(1, 2))
    for _ in range(iterations):
        h = sign * model.fd_step * np.maximum(np.abs(p), floors)
        cand = np.repeat(p, m + 1, axis=0)
        cdx = np.repeat(dx, m + 1, axis=0)
        for j in range(nd):
            cand[j * (m + 1) + 1:j * (m + 1) + 1 + n] += np.diag(h[j])
            for i in range(nx):
                cdx[j * (m + 1) + 1 + n + i, :, i] += state_h[i]
        r = scorer.residuals(cand, np.repeat(delays, m + 1), cdx).reshape(nd, m + 1, W, -1)
        trials, trial_dx = [], []
        for j in range(nd):
            r0 = r[j, 0].reshape(-1)
            Jp = (r[j, 1:n + 1].reshape(n, -1) - r0).T / h[j]          # (residuals, n)
            Js = np.zeros((W, r.shape[-1], W, nx))                     # block diagonal
            for i in range(nx):
                Js[np.arange(W), :, np.arange(W), i] = (r[j, 1 + n + i] - r[j, 0]) / state_h[i]
            J = np.hstack([Jp, Js.reshape(-1, W * nx)])
            A, grad = J.T @ J, J.T @ r0
            delta = -np.linalg.lstsq(A + lam[j] * np.diag(np.diag(A) + 1e-12), grad,
                                     rcond=None)[0]
            z = np.concatenate([p[j], dx[j].reshape(-1)])
            for a in steps:
                t = np.clip(z + a * delta, lows, highs)
                trials.append(t[:n])
                trial_dx.append(t[n:].reshape(W, nx))
        trials, trial_dx = np.array(trials), np.array(trial_dx)
        c = scorer.residuals(trials, np.repeat(delays, len(steps)), trial_dx)
        c = (c ** 2).sum(axis=(1, 2))
        c = c.reshape(nd, len(steps))
        if np.all(c.min(axis=1) > cost * (1 - tolerance)) and np.all(lam > 1e2):
            break
        for j in range(nd):
            k = int(np.argmin(c[j]))
            if c[j, k] < cost[j]:
                i = j * len(steps) + k
                p[j], dx[j], cost[j] = trials[i], trial_dx[i], c[j, k]
                lam[j] = max(lam[j] / 3, 1e-6)
            else:
                lam[j] *= 10
    j = int(np.argmin(cost))
    return p[j], int(delays[j]), float(np.sqrt(cost[j] / (W * r.shape[-1])))


# ---------------------------------------------------------------------- the whole fit
def model_for(spec: PlantSpec, known: dict | None = None):
    """The regression model of ``spec``'s plant, with ``known`` parameters
    (measured: they replace the preset's); one-line ``UserError`` for a plant
    sysid cannot fit or a known value it fits itself."""
    if spec.system not in SYSID:
        raise UserError(f"sysid fits {' and '.join(SYSID)}; --system "
                        f"{spec.system!r} is not supported yet")
    known = dict(known or {})
    for name, v in known.items():
        if name not in SYSID[spec.system]["known_names"]:
            raise UserError(f"--known {name}: sysid fits {name} itself or {spec.system} has no "
                            f"such parameter; --known takes "
                            f"{', '.join(SYSID[spec.system]['known_names'])}")
        if not (math.isfinite(v) and v > 0):
            raise UserError(f"--known {name} must be a finite number above 0, got {v!r}")
    return PlantModel(spec, known)


def identify(logs: list[Log], spec: PlantSpec, max_delay: int = 4, refine_fit: bool = True,
             known: dict | None = None) -> tuple[Fit, "SimScorer", np.ndarray]:
    """Least squares, then simulation-error refinement, on the fitting part
    of ``logs``; scored on the held-out part. Returns the fit, the held-out
    scorer and the nominal plant's vector (``model.names``) for comparison."""
    model = model_for(spec, known)
    nominal = nominal_params(spec)
    dts = [log.dt for log in logs]
    if max(dts) > 1.05 * min(dts):
        raise UserError(f"the logs were recorded at different rates ({sorted(set(dts))} s): "
                        "fit logs of one control rate together")
    fit_part, held = _segments(logs, model.cutoff_hz)
    ls = model.least_squares(fit_part, min(max_delay, MAX_DELAY))
    phys_ls, std = ls["phys"], ls["std"]
    names = model.names
    bad = [n for n, v in zip(names, phys_ls)
           if not np.isfinite(v) or (n in model.positive and v <= 0)]
    if bad:
        raise UserError(f"the least-squares fit gives no physical plant ({', '.join(bad)} "
                        "<= 0): the log does not excite the plant; record an excitation run "
                        "(`grpo-ctrl excite`)")
    warnings = list(model.notes)
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            if abs(ls["corr"][i, j]) > CORRELATION_WARN:
                warnings.append(f"{names[i]} and {names[j]} are not separable by these data "
                                f"in least squares (correlation {ls['corr'][i, j]:+.3f}): only "
                                "a combination of them is identified there; the refined fit's "
                                "held-out error says whether the simulation separates them")
    if ls["cond"] > CONDITION_WARN:
        warnings.append(f"the regressor is ill-conditioned (condition number {ls['cond']:.3g}): "
                        "excite more (larger swings, faster command changes)")
    for i, name in enumerate(names[:-1]):
        if std[i] > 0.2 * abs(phys_ls[i]) and std[i] > model.negligible[i]:
            warnings.append(f"{name} is poorly determined: {phys_ls[i]:.4g} +- {std[i]:.2g}")
    fit_scorer = SimScorer(model, fit_part)
    held_scorer = SimScorer(model, held)
    delay_ls = int(ls["delay"])
    phys_ls = np.append(phys_ls, 1.0)  # least squares takes the motor as instant
    if refine_fit:
        phys, delay, _ = refine(fit_scorer, phys_ls, delay_ls)
        if model.long_window_s:
            phys, delay, _ = refine(SimScorer(model, fit_part, window_s=model.long_window_s),
                                    phys, delay)
    else:
        phys, delay = phys_ls, delay_ls
    err = held_scorer.score(np.stack([phys_ls, phys]), np.array([delay_ls, delay]))
    sd = {name: 0.0 for name in spec.param_names}
    sd.update(zip(names, std))
    fit = Fit(spec.system, spec.preset, {k: float(v) for k, v in model.params(phys).items()},
              {k: float(v) for k, v in sd.items()}, int(delay), float(phys[-2]),
              nominal, {k: float(v) for k, v in model.params(phys_ls).items()}, ls["rms"],
              ls["rms_by_delay"], float(err[0]), float(err[1]), ls["cond"], warnings,
              tuple(names[:-1]), float(phys[-1]))
    return fit, held_scorer, model.vector(nominal, 0.0, 1.0)


def plot_held_out(path, fit: Fit, scorer: SimScorer, nominal_phys: np.ndarray,
                  nominal_delay: int = 0, windows: int = 4) -> None:
    """Measured against simulated readings on held-out windows: the fitted
    plant and the preset's, as a PNG (a column per position sensor)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from grpo_ctrl.files import save_figure

    phys = scorer.model.vector(fit.params, fit.offset, fit.motor_k)
    sims = scorer.simulate(np.stack([phys, nominal_phys]), np.array([fit.delay, nominal_delay]))
    e = sims - scorer.y[:, None]
    sims = scorer.y[:, None] + np.arctan2(np.sin(e), np.cos(e))  # on the measured branch
    n, nch = min(windows, scorer.W), scorer.y.shape[-1]
    fig, axes = plt.subplots(n, nch, figsize=(8 * nch ** 0.5, 2.2 * n), squeeze=False)
    t = np.arange(1, scorer.K + 1) * scorer.dt
    names = [scorer.spec.state_names[k] for k, _ in scorer.spec.channels]
    for row, w in zip(axes, np.linspace(0, scorer.W - 1, n).round().astype(int)):
        for ch, ax in enumerate(row):
            ax.plot(t, scorer.y[:, w, ch], "k", lw=1.5, label="measured")
            ax.plot(t, sims[:, 0, w, ch], "C0", lw=1, label="fitted")
            ax.plot(t, sims[:, 1, w, ch], "C3--", lw=1, label="preset")
            ax.set_ylabel(f"{names[ch]} (rad)")
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[0, 0].set_title(f"held-out windows: rms error fitted {fit.sim_error:.3g} rad", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("time in window (s)")
    fig.tight_layout()
    save_figure(fig, path, dpi=90)
    plt.close(fig)
