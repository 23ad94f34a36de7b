"""System identification: a plant's physical parameters, delay and encoder
offset from closed- or open-loop logs (``grpo-ctrl run`` / ``excite``), for
the pendulum and the Furuta pendulum.

Two fits, the second refining the first:

1. Least squares on the equations of motion (``csrc/plants.c``), which are
   linear in a few combinations of the parameters. Velocity and
   acceleration come from the positions, Butterworth-filtered forwards and
   backwards (zero phase); the command goes through the same filter. The
   integer delay d is the one whose fit leaves the smallest residual.

   Pendulum (angle from upright, encoder offset o, the log reads y = theta + o)::

       thdd = a1 sin(y - o) + a2 u(t - d) - a3 thd - a4 tanh(thd / vc)
       a1 = 3 g / (2 l), a2 = 3 / (m l^2), a3 = b a2, a4 = fc a2

   and a1 sin(y - o) = (a1 cos o) sin y - (a1 sin o) cos y, so with g known
   all of m, l, b, fc and o follow.

   Furuta (arm th, pendulum al from upright, s = sin al, c = cos al)::

       A thdd + B (s^2 thdd + 2 s c thd ald) + C (s ald^2 - c aldd) + Bm thd = kv V(t - d)
       D aldd - C c thdd - B s c thd^2 + dp ald - E s = 0
       A = jr + mp lr^2, B = mp lp^2 / 4, C = mp lp lr / 2, D = jp + mp lp^2 / 4,
       E = mp g lp / 2, kv = km / rm, Bm = km^2 / rm + dr

   Both equations are homogeneous in (A, B, C, D, E, kv, Bm, dp): angles
   and voltage fix them only up to one common scale. The ratios give
   lp = 2 g B / E and lr = g C / E; the scale needs one mass (mp, weighed)
   and the split of kv and Bm into km and dr needs rm (an ohmmeter): both
   are ``known`` (measured, or the preset's), and mr does not enter the
   equations at all (jr holds the arm's inertia).
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
    ls_residual: float      # rms of the least-squares residual (model.residual_unit)
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


def _covariance(X: np.ndarray, r: np.ndarray, dt: float, cutoff_hz: float) -> np.ndarray:
    """The least-squares covariance of the coefficients. The residual is
    coloured by the filter: about one independent sample per
    1 / (2 cutoff) seconds, not per row."""
    n, p = X.shape
    n_eff = max(p + 1.0, n * min(1.0, 2 * cutoff_hz * dt))
    sigma2 = float(r @ r) / (n_eff - p)
    return sigma2 * np.linalg.pinv(X.T @ X)


def _to_physical(to_phys, theta: np.ndarray, cov: np.ndarray, X: np.ndarray) -> dict:
    """Physical estimates, their standard errors and correlations (the
    covariance carried through the map's Jacobian), and the regressor's
    column-scaled condition number."""
    phys = to_phys(theta)
    J = np.empty((len(phys), len(theta)))
    for k in range(len(theta)):
        h = 1e-6 * max(abs(theta[k]), 1e-3 * np.max(np.abs(theta)))
        tp, tm = theta.copy(), theta.copy()
        tp[k] += h
        tm[k] -= h
        J[:, k] = (to_phys(tp) - to_phys(tm)) / (2 * h)
    cov_phys = J @ cov @ J.T
    scale = np.linalg.norm(X, axis=0)
    cond = float(np.linalg.cond(X / np.where(scale > 0, scale, 1)))
    sd = np.sqrt(np.maximum(np.diag(cov_phys), 0))
    corr = cov_phys / np.outer(np.where(sd > 0, sd, 1), np.where(sd > 0, sd, 1))
    return {"phys": phys, "std": sd, "corr": corr, "cond": cond}


def _best_delay(model, segments: list, max_delay: int, fit) -> dict:
    """``fit(d, trim) -> (rms, theta, X, r)`` for every delay 0..max_delay;
    the delay of the smallest rms, its fit in coefficients and in physical
    parameters (``model._physical``) with their covariance."""
    dt = segments[0].dt
    trim = int(0.2 / dt)
    results = [(*fit(d, trim), d) for d in range(max_delay + 1)]
    rms, theta, X, r, d = min(results, key=lambda x: x[0])
    out = _to_physical(model._physical, theta, _covariance(X, r, dt, model.cutoff_hz), X)
    return {"delay": d, "rms": rms, "rms_by_delay": [x[0] for x in results], **out}


class PendulumModel:
    """The pendulum's regression and its simulator plant. The fitted
    vector: (m, l, b, fc, offset)."""
    system = "pendulum"
    names = ("m", "l", "b", "fc", "offset")
    lows = np.array([1e-6, 1e-6, 0.0, 0.0, -np.inf])
    cutoff_hz = 8.0          # Butterworth cutoff of the derivative filter
    fd_step = 1e-4           # relative finite-difference step of the refinement
    window_s = 1.0           # simulation-error windows
    long_window_s = None     # no second, long-window stage (1 s windows fit within 1.2 %)
    residual_unit = "rad/s^2"  # of the least-squares residual (the equation's)
    known_names = ("g",)
    positive = ("m", "l")    # a least-squares answer without these is no plant

    def __init__(self, spec: PlantSpec, known: dict):
        self.spec, self.base = spec, {**nominal_params(spec), **known}
        self.g = self.base["g"]
        self.vc = float(init_model(spec.system, spec.preset)[0].coulomb_vc)
        self.floors = np.array([1e-3, 1e-3, 1e-3, 1e-3, 1e-2])
        self.negligible = np.full(4, 1e-4)   # standard errors below this are no warning
        self.notes = []

    def _regressor(self, seg: _Segment, d: int, trim: int):
        f = _filter(seg.dt, seg.cutoff_hz)
        ud = f(_delayed(seg.u, d))
        y, yd = seg.y[:, 0], seg.yd[:, 0]
        X = np.column_stack([np.sin(y), np.cos(y), ud, -yd, -np.tanh(yd / self.vc)])
        s = slice(trim, len(y) - trim)
        return X[s], seg.ydd[s, 0]

    def _physical(self, theta: np.ndarray) -> np.ndarray:
        """(m, l, b, fc, offset) from the coefficients (c1, c2, a2, a3, a4)."""
        c1, c2, a2, a3, a4 = theta
        l = 3 * self.g / (2 * math.hypot(c1, c2))
        return np.array([3 / (a2 * l * l), l, a3 / a2, a4 / a2, math.atan2(-c2, c1)])

    def least_squares(self, segments: list[_Segment], max_delay: int) -> dict:
        """The linear fit for every delay 0..max_delay; the best one with its
        covariance, in coefficients and in physical parameters."""
        def fit(d, trim):
            parts = [self._regressor(s, d, trim) for s in segments]
            X = np.concatenate([p[0] for p in parts])
            y = np.concatenate([p[1] for p in parts])
            theta, *_ = np.linalg.lstsq(X, y, rcond=None)
            r = y - X @ theta
            return float(np.sqrt(np.mean(r * r))), theta, X, r
        return _best_delay(self, segments, max_delay, fit)

    def plant(self, P: np.ndarray, D: np.ndarray) -> dict:
        """``BatchSim.set_plant`` values of candidates ``P (C, 6)`` (the
        names and motor_k), delays ``D``."""
        return {"g": self.g, "m": P[:, 0], "l": P[:, 1], "b": P[:, 2], "fc": P[:, 3],
                "delay": D, "offset_theta": P[:, 4], "motor_k": P[:, 5]}

    def state(self, y: np.ndarray, yd: np.ndarray, P: np.ndarray) -> np.ndarray:
        """Simulator states ``(C, nx)`` of readings ``y, yd (C, channels)``."""
        return np.column_stack([y[:, 0] - P[:, 4], yd[:, 0]])

    def params(self, p: np.ndarray) -> dict:
        return {**self.base, "m": p[0], "l": p[1], "b": p[2], "fc": p[3]}

    def vector(self, params: dict, offset: float, motor_k: float) -> np.ndarray:
        return np.array([params["m"], params["l"], params["b"], params["fc"], offset, motor_k])


class FurutaModel:
    """The Furuta pendulum's regression (module docstring) and its simulator
    plant. The fitted vector: (km, lr, jr, dr, lp, jp, dp, offset of the
    pendulum encoder); mp and rm are known (measured, or the preset's)."""
    system = "furuta"
    names = ("km", "lr", "jr", "dr", "lp", "jp", "dp", "offset")
    lows = np.array([1e-6, 1e-6, 0.0, 0.0, 1e-6, 0.0, 0.0, -np.inf])
    cutoff_hz = 15.0         # the arm under its holding loop moves faster than the rod
    fd_step = 1e-3           # a larger step: dr and dp barely move the angles
    residual_unit = "V"      # the arm's equation, in the command's unit
    window_s = 2.0           # long windows: the dampings act slowly (on simulated 40 s
                             # logs, 2 s windows halved the worst dr and dp errors of 1 s ones)
    long_window_s = math.inf  # then a second stage, each piece one window: the dampings'
                              # slow effects add up over the whole piece (docs/sysid.md)
    known_names = ("g", "mp", "rm", "mr")
    positive = ("km", "lr", "lp")

    def __init__(self, spec: PlantSpec, known: dict):
        self.spec, self.base = spec, {**nominal_params(spec), **known}
        self.g, self.mp, self.rm = self.base["g"], self.base["mp"], self.base["rm"]
        nominal = nominal_params(spec)
        self.floors = np.array([nominal[k] for k in self.names[:-1]] + [1e-2])
        self.negligible = 0.01 * self.floors[:-1]
        assumed = [k for k in ("mp", "rm") if k not in known]
        self.notes = ["mr does not enter the equations of motion (jr holds the arm's "
                      "inertia): it stays the preset's"]
        if assumed:
            self.notes.append(f"{' and '.join(assumed)} set the scale of the fit and cannot "
                              "come from angles and voltage: the preset's value is assumed; "
                              "give measured values with --known " +
                              " ".join(f"{k}=..." for k in assumed))

    def _regressor(self, seg: _Segment, d: int, offset: float, trim: int):
        """Rows of both equations, unknowns (A, B, C, D, E cos o, E sin o,
        Bm, dp) / kv: the arm's with the delayed command as target, the
        pendulum's with 0."""
        f = _filter(seg.dt, seg.cutoff_hz)
        ud = f(_delayed(seg.u, d))
        s_ = slice(trim, len(seg.u) - trim)
        th, y = seg.y[s_, 0], seg.y[s_, 1]
        thd, ald = seg.yd[s_, 0], seg.yd[s_, 1]
        thdd, aldd = seg.ydd[s_, 0], seg.ydd[s_, 1]
        s, c = np.sin(y - offset), np.cos(y - offset)
        z = np.zeros_like(th)
        arm = np.column_stack([thdd, s * s * thdd + 2 * s * c * thd * ald,
                               s * ald * ald - c * aldd, z, z, z, thd, z])
        pend = np.column_stack([z, -s * c * thd * thd, -c * thdd, aldd, -np.sin(y), np.cos(y),
                                z, ald])
        return arm, ud[s_], pend

    def _physical(self, theta: np.ndarray) -> np.ndarray:
        a, b, cc, dd, ec, es, bm, dpn = theta
        e, g, mp, rm = math.hypot(ec, es), self.g, self.mp, self.rm
        lp, lr = 2 * g * b / e, g * cc / e
        kv = mp * lp * lp / (4 * b)
        return np.array([kv * rm, lr, a * kv - mp * lr * lr, bm * kv - kv * kv * rm, lp,
                         dd * kv - mp * lp * lp / 4, dpn * kv, math.atan2(es, ec)])

    def least_squares(self, segments: list[_Segment], max_delay: int) -> dict:
        """For every delay: the joint fit of both equations, each weighted
        by its residual's inverse rms, the offset used in the nonlinear
        terms refined from the gravity term's phase; the delay with the
        smallest arm residual (in command units) wins."""
        def fit(d, trim):
            offset, w = 0.0, np.ones(2)
            for _ in range(3):
                parts = [self._regressor(s, d, offset, trim) for s in segments]
                arm = np.concatenate([p[0] for p in parts])
                target = np.concatenate([p[1] for p in parts])
                pend = np.concatenate([p[2] for p in parts])
                X = np.vstack([w[0] * arm, w[1] * pend])
                y = np.concatenate([w[0] * target, np.zeros(len(pend))])
                theta, *_ = np.linalg.lstsq(X, y, rcond=None)
                r_arm, r_pend = target - arm @ theta, -pend @ theta
                w = 1 / np.array([np.sqrt(np.mean(r_arm ** 2)), np.sqrt(np.mean(r_pend ** 2))])
                offset = math.atan2(theta[5], theta[4])
            X = np.vstack([w[0] * arm, w[1] * pend])
            r = np.concatenate([w[0] * r_arm, w[1] * r_pend])
            return float(np.sqrt(np.mean(r_arm ** 2))), theta, X, r
        return _best_delay(self, segments, max_delay, fit)

    def plant(self, P: np.ndarray, D: np.ndarray) -> dict:
        out = {k: self.base[k] for k in ("g", "rm", "mr", "mp")}
        out.update({name: P[:, i] for i, name in enumerate(self.names[:-1])})
        return {**out, "delay": D, "offset_alpha": P[:, 7], "motor_k": P[:, 8]}

    def state(self, y: np.ndarray, yd: np.ndarray, P: np.ndarray) -> np.ndarray:
        return np.column_stack([y[:, 0], y[:, 1] - P[:, 7], yd[:, 0], yd[:, 1]])

    def params(self, p: np.ndarray) -> dict:
        return {**self.base, **dict(zip(self.names[:-1], p[:7]))}

    def vector(self, params: dict, offset: float, motor_k: float) -> np.ndarray:
        return np.array([params[k] for k in self.names[:-1]] + [offset, motor_k])


MODELS = (PendulumModel, FurutaModel)  # per-plant regression code, found by .system


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
    found = [m for m in MODELS if m.system == spec.system]
    if not found:
        raise UserError(f"sysid fits {' and '.join(m.system for m in MODELS)}; --system "
                        f"{spec.system!r} is not supported yet")
    cls = found[0]
    known = dict(known or {})
    for name, v in known.items():
        if name not in cls.known_names:
            raise UserError(f"--known {name}: sysid fits {name} itself or {spec.system} has no "
                            f"such parameter; --known takes {', '.join(cls.known_names)}")
        if not (math.isfinite(v) and v > 0):
            raise UserError(f"--known {name} must be a finite number above 0, got {v!r}")
    return cls(spec, known)


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
