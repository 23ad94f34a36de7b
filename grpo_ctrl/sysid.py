"""System identification: a plant's physical parameters, delay and encoder
offset from closed- or open-loop logs (``grpo-ctrl run`` / ``excite``).

Two fits, the second refining the first:

1. Least squares on the equation of motion, which is linear in a few
   combinations of the parameters. For the pendulum (``csrc/plants.c``,
   angle from upright, encoder offset o, so the log reads y = theta + o)::

       thdd = a1 sin(y - o) + a2 u(t - d) - a3 thd - a4 tanh(thd / vc)
       a1 = 3 g / (2 l), a2 = 3 / (m l^2), a3 = b a2, a4 = fc a2

   and a1 sin(y - o) = (a1 cos o) sin y - (a1 sin o) cos y, so with g known
   all of m, l, b, fc and o follow. Velocity and acceleration come from the
   position, Butterworth-filtered forwards and backwards (zero phase), and
   the command goes through the same filter. The integer delay d is the
   one whose fit leaves the smallest residual.
2. A simulation-error fit: the batched C simulator (``BatchSim`` holding
   one candidate plant per environment) replays the logged commands over
   short windows from the measured states, every candidate and window in
   one call; Levenberg-Marquardt from the least-squares answer (its
   Jacobian by finite differences, all in one call) finds the plant whose
   simulated angle stays closest to the measured one.

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
CUTOFF_HZ = 8.0          # Butterworth cutoff of the derivative filter
HELD_OUT = 0.25          # last share of each log kept for validation
MIN_PIECE_S = 1.5        # shortest stretch between lost frames that is used
GAP_KINDS = ("lost", "seq_jump", "malformed", "failed")  # rows that mean a missing state
WINDOW_S = 1.0           # simulation-error windows
CORRELATION_WARN = 0.95  # |correlation| of two estimates above which they are not separable
CONDITION_WARN = 1e3     # condition number of the (column-scaled) regressor


@dataclass
class Log:
    """One log's state rows: time (s), the pendulum's angle reading (rad,
    unwrapped; from the observation the host built, which scaled the
    encoder counts by the device's INFO) and the actuator value applied
    from each row on; ``breaks``: the rows that follow lost frames."""
    name: str
    t: np.ndarray
    angle: np.ndarray
    u: np.ndarray
    breaks: tuple = ()

    @property
    def dt(self) -> float:
        return float(np.median(np.diff(self.t)))


@dataclass
class Fit:
    """What ``identify`` found."""
    system: str
    preset: str
    params: dict            # physical parameters, PlantSpec.param_names
    std: dict               # their standard errors (least squares)
    delay: int              # steps
    offset: float           # encoder offset of the pendulum angle (rad)
    nominal: dict           # the preset's parameters
    ls_params: dict         # the least-squares answer before refinement
    ls_residual: float      # rms of the acceleration residual (rad/s^2)
    ls_residuals_by_delay: list
    sim_error_ls: float     # rms angle error (rad) on held-out windows: least squares ...
    sim_error: float        # ... and the refined fit
    condition: float
    warnings: list = field(default_factory=list)

    def table(self) -> dict:
        """The TOML of ``--out``: the parameters, delay and offset at the top
        (``--reveal``'s format), standard errors and fit quality below."""
        table = PlantValues(self.params, self.delay, self.offset, self.std).table()
        table["fit"] = {"system": self.system, "preset": self.preset,
                        "ls_residual": float(self.ls_residual),
                        "sim_error_held_out": float(self.sim_error),
                        "sim_error_held_out_ls": float(self.sim_error_ls),
                        "condition": float(self.condition), "warnings": list(self.warnings)}
        return table


# ---------------------------------------------------------------------- logs
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
    nch = {len(r["pos"]) for r in states}
    if nch != {len(spec.channels)}:
        raise UserError(f"log {str(path)!r} has {sorted(nch)} position channel(s) but "
                        f"{spec.system} has {len(spec.channels)}: wrong plant; give the "
                        "--system the log was recorded on")
    if {len(r["obs"]) for r in states} != {spec.nobs}:
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
    i = spec.pole_obs
    log = Log(path.name, t, np.unwrap(np.arctan2(obs[:, i + 1], obs[:, i])), u, tuple(breaks))
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
                        f"{saturated:.0%} of rows, where the torque is unknown; record an "
                        "excitation within the limits (`grpo-ctrl excite`)")
    travel = np.ptp(log.angle)
    if travel < MIN_TRAVEL:
        raise UserError(f"{where} never moves: the pendulum travels {travel:.3g} rad in all; "
                        "excite it (`grpo-ctrl excite`) or check that the device was armed")


# ---------------------------------------------------------------------- least squares
def _filter(dt: float):
    from scipy.signal import butter, filtfilt
    b, a = butter(4, min(CUTOFF_HZ * 2 * dt, 0.9))
    pad = int(0.75 / dt)  # well past the filter's settling, so the ends are not distorted
    return lambda x: filtfilt(b, a, x, padtype="odd", padlen=min(pad, len(x) - 1))


def _delayed(u: np.ndarray, d: int) -> np.ndarray:
    """The torque acting at each row with delay d: commands are held for a
    step, so around row k the filtered torque is the mean of u[k-1-d] and
    u[k-d] (first values repeated before the log starts)."""
    padded = np.concatenate([np.full(d + 1, u[0]), u])
    return 0.5 * (padded[1:len(u) + 1] + padded[:len(u)])


@dataclass
class _Segment:
    y: np.ndarray      # filtered angle reading (rad, offset included)
    yd: np.ndarray
    ydd: np.ndarray
    u: np.ndarray      # raw commands
    raw: np.ndarray    # raw angle reading
    dt: float


def _segments(logs: list[Log], spec: PlantSpec) -> tuple[list[_Segment], list[_Segment]]:
    """Each log's contiguous pieces (split where frames were lost), cut into
    the fitting part and the held-out last quarter."""
    fit, held = [], []
    for log in logs:
        dt, n = log.dt, len(log.angle)
        n_fit = int(n * (1 - HELD_OUT))
        f = _filter(dt)
        edges = [0, *log.breaks, n]
        for a, b in zip(edges[:-1], edges[1:]):
            for lo, hi, out in ((a, min(b, n_fit), fit), (max(a, n_fit), b, held)):
                if (hi - lo) * dt < MIN_PIECE_S:
                    continue
                raw, u = log.angle[lo:hi], log.u[lo:hi]
                yf = f(raw)
                yd = np.gradient(yf, dt)
                out.append(_Segment(yf, yd, np.gradient(yd, dt), u, raw, dt))
    if not fit or not held:
        raise UserError("the logs hold no stretch of 1.5 s without lost frames in their first "
                        "three quarters and in their last; record again on a steadier link")
    return fit, held


def _regressor(seg: _Segment, d: int, vc: float, trim: int):
    f = _filter(seg.dt)
    ud = f(_delayed(seg.u, d))
    X = np.column_stack([np.sin(seg.y), np.cos(seg.y), ud, -seg.yd, -np.tanh(seg.yd / vc)])
    s = slice(trim, len(seg.y) - trim)
    return X[s], seg.ydd[s]


def _physical(theta: np.ndarray, g: float) -> np.ndarray:
    """(m, l, b, fc, offset) from the coefficients (c1, c2, a2, a3, a4)."""
    c1, c2, a2, a3, a4 = theta
    a1 = math.hypot(c1, c2)
    l = 3 * g / (2 * a1)
    return np.array([3 / (a2 * l * l), l, a3 / a2, a4 / a2, math.atan2(-c2, c1)])


def least_squares(segments: list[_Segment], spec: PlantSpec, g: float, vc: float,
                  max_delay: int) -> dict:
    """The linear fit for every delay 0..max_delay; the best one with its
    covariance, in coefficients and in physical parameters."""
    dt = segments[0].dt
    trim = int(0.2 / dt)
    results = []
    for d in range(max_delay + 1):
        parts = [_regressor(s, d, vc, trim) for s in segments]
        X = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        theta, *_ = np.linalg.lstsq(X, y, rcond=None)
        r = y - X @ theta
        results.append((float(np.sqrt(np.mean(r * r))), d, theta, X, r))
    rms, d, theta, X, r = min(results, key=lambda x: x[0])
    n, p = X.shape
    # the residual is coloured by the filter: about one independent sample
    # per 1 / (2 cutoff) seconds, not per row
    n_eff = max(p + 1.0, n * min(1.0, 2 * CUTOFF_HZ * dt))
    sigma2 = float(r @ r) / (n_eff - p)
    cov = sigma2 * np.linalg.pinv(X.T @ X)
    phys = _physical(theta, g)
    J = np.empty((5, 5))
    for k in range(5):
        h = 1e-6 * max(abs(theta[k]), 1e-3)
        tp, tm = theta.copy(), theta.copy()
        tp[k] += h
        tm[k] -= h
        J[:, k] = (_physical(tp, g) - _physical(tm, g)) / (2 * h)
    cov_phys = J @ cov @ J.T
    scale = np.linalg.norm(X, axis=0)
    cond = float(np.linalg.cond(X / np.where(scale > 0, scale, 1)))
    sd = np.sqrt(np.maximum(np.diag(cov_phys), 0))
    corr = cov_phys / np.outer(np.where(sd > 0, sd, 1), np.where(sd > 0, sd, 1))
    return {"delay": d, "rms": rms, "rms_by_delay": [x[0] for x in results], "theta": theta,
            "phys": phys, "std": sd, "corr": corr, "cond": cond}


# ---------------------------------------------------------------------- simulation error
PHYS_NAMES = ("m", "l", "b", "fc", "offset")


class SimScorer:
    """Rms angle error of candidate plants replaying logged commands over
    fixed windows, every (candidate, window) pair one environment of one
    ``BatchSim`` holding its plant."""

    def __init__(self, spec: PlantSpec, segments: list[_Segment], g: float,
                 window_s: float = WINDOW_S, max_windows: int = 12):
        dt = segments[0].dt
        self.K = K = max(10, int(round(window_s / dt)))
        starts = []
        for i, s in enumerate(segments):
            lo, hi = MAX_DELAY + int(0.2 / dt), len(s.y) - K - int(0.2 / dt)
            if hi > lo:
                starts += [(i, k) for k in range(lo, hi, K)]
        if not starts:
            raise UserError("the logs are too short for the simulation-error windows; record "
                            f"at least {MIN_SECONDS:g} s")
        pick = np.linspace(0, len(starts) - 1, min(max_windows, len(starts))).round().astype(int)
        self.starts = [starts[j] for j in pick]
        self.segments, self.spec, self.g, self.dt = segments, spec, g, dt
        W = len(self.starts)
        self.u = np.stack([segments[i].u[k:k + K] for i, k in self.starts], axis=1)  # (K, W)
        self.u_before = np.stack([segments[i].u[k - MAX_DELAY:k] for i, k in self.starts])
        self.y = np.stack([segments[i].raw[k + 1:k + K + 1] for i, k in self.starts], axis=1)
        self.x0 = np.array([(segments[i].y[k], segments[i].yd[k]) for i, k in self.starts])
        self.W = W
        self._sims: dict[int, BatchSim] = {}

    def _sim(self, B: int) -> BatchSim:
        if B not in self._sims:
            h = self.spec.dt / init_model(self.spec.system, self.spec.preset)[0].substeps
            self._sims[B] = BatchSim(self.spec.system, B, preset=self.spec.preset,
                                     hold_plant=True, dt=self.dt,
                                     substeps=max(1, math.ceil(self.dt / h - 1e-9)),
                                     noise_std=[0.0] * self.spec.nx,
                                     enc_counts=[0.0] * self.spec.nx,
                                     v_max=0.0, max_steps=0)
        return self._sims[B]

    def simulate(self, phys: np.ndarray, delays: np.ndarray) -> np.ndarray:
        """Simulated angle readings ``(K, C, W)`` of C candidates
        ``phys (C, 5)`` (m, l, b, fc, offset) with integer ``delays (C,)``."""
        C, W, K = len(phys), self.W, self.K
        sim = self._sim(C * W)
        rep = lambda a: np.repeat(a, W, axis=0)  # noqa: E731  (candidate-major)
        P, D = rep(phys), rep(delays)
        sim.set_plant({"g": self.g, "m": P[:, 0], "l": P[:, 1], "b": P[:, 2], "fc": P[:, 3],
                       "delay": D, "offset_theta": P[:, 4]})
        sim.reset()
        x0 = np.tile(self.x0, (C, 1))
        x0[:, 0] -= P[:, 4]
        act = np.zeros((C * W, MAX_DELAY), np.float32)
        ub = np.tile(self.u_before, (C, 1))
        for b in range(C * W):  # the commands still in the delay line at the window start
            d = int(D[b])
            act[b, :d] = ub[b, MAX_DELAY - d:]
        sim.set_state({"x": x0, "act_buf": act, "t": np.zeros(C * W, np.int64)})
        obs, *_ = sim.rollout(np.tile(self.u, (1, C)).astype(np.float32))
        angle = np.arctan2(obs[..., 1], obs[..., 0])  # obs: cos, sin, thd
        return angle.reshape(K, C, W)

    def residuals(self, phys: np.ndarray, delays: np.ndarray) -> np.ndarray:
        """Angle errors (rad, wrapped) of each candidate, ``(C, K * W)``."""
        e = self.simulate(phys, delays) - self.y[:, None, :]
        return np.arctan2(np.sin(e), np.cos(e)).transpose(1, 0, 2).reshape(len(phys), -1)

    def score(self, phys: np.ndarray, delays: np.ndarray) -> np.ndarray:
        """Rms angle error (rad) of each candidate over every window."""
        return np.sqrt(np.mean(self.residuals(phys, delays) ** 2, axis=1))


def refine(scorer: SimScorer, phys0: np.ndarray, delay0: int, iterations: int = 10):
    """Levenberg-Marquardt on the simulation error over (m, l, b, fc,
    offset), from the least-squares answer, for the delays next to its
    delay; each iteration scores every delay's Jacobian candidates in one
    simulator call and every delay's trial steps in another. Returns the
    best candidate, its delay and score (the start is one, so the result is
    never worse)."""
    delays = np.arange(max(0, delay0 - 1), min(MAX_DELAY, delay0 + 1) + 1)
    nd, n = len(delays), len(phys0)
    p = np.tile(phys0, (nd, 1))
    lam = np.full(nd, 1e-2)
    steps = np.array([1.0, 0.5, 0.2])
    lows = np.array([1e-6, 1e-6, 0.0, 0.0, -np.inf])
    cost = (scorer.residuals(p, delays) ** 2).sum(axis=1)
    for _ in range(iterations):
        h = 1e-4 * np.maximum(np.abs(p), np.array([1e-3, 1e-3, 1e-3, 1e-3, 1e-2]))
        cand = np.repeat(p, n + 1, axis=0)
        for j in range(nd):
            cand[j * (n + 1) + 1:(j + 1) * (n + 1)] += np.diag(h[j])
        r = scorer.residuals(cand, np.repeat(delays, n + 1)).reshape(nd, n + 1, -1)
        trials = []
        for j in range(nd):
            J = (r[j, 1:] - r[j, 0]).T / h[j]              # (K W, n)
            A, grad = J.T @ J, J.T @ r[j, 0]
            delta = -np.linalg.solve(A + lam[j] * np.diag(np.diag(A) + 1e-12), grad)
            trials += [np.maximum(p[j] + a * delta, lows) for a in steps]
        trials = np.array(trials)
        c = (scorer.residuals(trials, np.repeat(delays, len(steps))) ** 2).sum(axis=1)
        c = c.reshape(nd, len(steps))
        for j in range(nd):
            k = int(np.argmin(c[j]))
            if c[j, k] < cost[j]:
                p[j], cost[j] = trials[j * len(steps) + k], c[j, k]
                lam[j] = max(lam[j] / 3, 1e-6)
            else:
                lam[j] *= 10
    j = int(np.argmin(cost))
    return p[j], int(delays[j]), float(np.sqrt(cost[j] / scorer.K / scorer.W))


# ---------------------------------------------------------------------- the whole fit
def identify(logs: list[Log], spec: PlantSpec, max_delay: int = 4,
             refine_fit: bool = True) -> tuple[Fit, "SimScorer", np.ndarray]:
    """Least squares, then simulation-error refinement, on the fitting part
    of ``logs``; scored on the held-out part. Returns the fit, the held-out
    scorer and the nominal plant's (m, l, b, fc, offset) for comparison."""
    if spec.system != "pendulum":
        raise UserError(f"sysid fits the pendulum so far; --system {spec.system!r} is not "
                        "supported yet")
    nominal = nominal_params(spec)
    g, vc = nominal["g"], float(init_model(spec.system, spec.preset)[0].coulomb_vc)
    dts = [log.dt for log in logs]
    if max(dts) > 1.05 * min(dts):
        raise UserError(f"the logs were recorded at different rates ({sorted(set(dts))} s): "
                        "fit logs of one control rate together")
    fit_part, held = _segments(logs, spec)
    ls = least_squares(fit_part, spec, g, vc, min(max_delay, MAX_DELAY))
    phys_ls, std = ls["phys"], ls["std"]
    if not (np.all(np.isfinite(phys_ls)) and phys_ls[0] > 0 and phys_ls[1] > 0):
        raise UserError("the least-squares fit gives no physical plant (mass or length <= 0): "
                        "the log does not excite the pendulum; record an excitation run")
    warnings = []
    names = PHYS_NAMES
    for i in range(5):
        for j in range(i + 1, 5):
            if abs(ls["corr"][i, j]) > CORRELATION_WARN:
                warnings.append(f"{names[i]} and {names[j]} are not separable by these data "
                                f"(correlation {ls['corr'][i, j]:+.3f}): only a combination "
                                "of them is identified")
    if ls["cond"] > CONDITION_WARN:
        warnings.append(f"the regressor is ill-conditioned (condition number {ls['cond']:.3g}): "
                        "excite more (larger swings, faster command changes)")
    for i, name in enumerate(names[:4]):
        if std[i] > 0.2 * abs(phys_ls[i]) and std[i] > 1e-4:
            warnings.append(f"{name} is poorly determined: {phys_ls[i]:.4g} +- {std[i]:.2g}")
    fit_scorer = SimScorer(spec, fit_part, g)
    held_scorer = SimScorer(spec, held, g)
    delay_ls = int(ls["delay"])
    if refine_fit:
        phys, delay, _ = refine(fit_scorer, phys_ls, delay_ls)
    else:
        phys, delay = phys_ls, delay_ls
    err = held_scorer.score(np.stack([phys_ls, phys]), np.array([delay_ls, delay]))
    params = dict(nominal)
    params.update(m=phys[0], l=phys[1], b=phys[2], fc=phys[3])
    ls_params = dict(nominal)
    ls_params.update(m=phys_ls[0], l=phys_ls[1], b=phys_ls[2], fc=phys_ls[3])
    sd = {name: 0.0 for name in spec.param_names}
    sd.update(m=std[0], l=std[1], b=std[2], fc=std[3])
    sd["offset"] = std[4]
    fit = Fit(spec.system, spec.preset, {k: float(v) for k, v in params.items()},
              {k: float(v) for k, v in sd.items()}, int(delay), float(phys[4]),
              nominal, {k: float(v) for k, v in ls_params.items()}, ls["rms"], ls["rms_by_delay"],
              float(err[0]), float(err[1]), ls["cond"], warnings)
    nominal_phys = np.array([nominal["m"], nominal["l"], nominal["b"], nominal["fc"], 0.0])
    return fit, held_scorer, nominal_phys


def plot_held_out(path, fit: Fit, scorer: SimScorer, nominal_phys: np.ndarray,
                  nominal_delay: int = 0, windows: int = 4) -> None:
    """Measured against simulated angle on held-out windows: the fitted
    plant and the preset's, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from grpo_ctrl.files import save_figure

    phys = np.array([fit.params["m"], fit.params["l"], fit.params["b"], fit.params["fc"],
                     fit.offset])
    sims = scorer.simulate(np.stack([phys, nominal_phys]), np.array([fit.delay, nominal_delay]))
    e = sims - scorer.y[:, None, :]
    sims = scorer.y[:, None, :] + np.arctan2(np.sin(e), np.cos(e))  # on the measured branch
    n = min(windows, scorer.W)
    fig, axes = plt.subplots(n, 1, figsize=(8, 2.2 * n), squeeze=False)
    t = np.arange(1, scorer.K + 1) * scorer.dt
    for w, ax in zip(np.linspace(0, scorer.W - 1, n).round().astype(int), axes[:, 0]):
        ax.plot(t, scorer.y[:, w], "k", lw=1.5, label="measured")
        ax.plot(t, sims[:, 0, w], "C0", lw=1, label="fitted")
        ax.plot(t, sims[:, 1, w], "C3--", lw=1, label="preset")
        ax.set_ylabel("angle (rad)")
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[0, 0].set_title(f"held-out windows: rms error fitted {fit.sim_error:.3g} rad", fontsize=9)
    axes[-1, 0].set_xlabel("time in window (s)")
    fig.tight_layout()
    save_figure(fig, path, dpi=90)
    plt.close(fig)
