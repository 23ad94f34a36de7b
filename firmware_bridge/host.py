"""``grpo-ctrl run``: an exported ONNX controller, closed-loop, over serial.

``run_loop(port, policy, duration, log)`` opens the port (a device path, or
any pyserial URL), handshakes, refuses a policy whose metadata does not match
the device, arms, runs the loop (``loop.py``) and writes the telemetry and the
plot. The pieces: ``link.py`` (the port and framing), ``observation.py``
(counts -> observations, the controller's check), ``telemetry.py`` (rows and
plot), ``loop.py`` (the loop, safe stop, summary).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib.util
import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

from grpo_ctrl.errors import UserError
from grpo_ctrl.firmware_bridge import protocol as P
from grpo_ctrl.firmware_bridge.link import Link, handshake, select_control_source
from grpo_ctrl.firmware_bridge.loop import ControlLoop, format_summary
from grpo_ctrl.firmware_bridge.status import StatusLine
from grpo_ctrl.firmware_bridge.observation import (Features, check_onnx_controller,
                                                   open_onnx_controller)
from grpo_ctrl.firmware_bridge.telemetry import Telemetry, write_plot
from grpo_ctrl.option_types import number, positive_int, positive_seconds

EXIT_CODES = {"completed": 0, "fault": 3, "link lost": 4, "error": 5, "interrupted": 130}


STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, n))


def run_loop(port: str, policy_path, duration: float = 10.0, log=None, plot=None, *,
             baudrate: int = 1_000_000, stop: threading.Event | None = None,
             print_fn=print, on_device: bool = False, make_policy=None, status=None,
             estimator_hz: float | None = None, plant=None) -> dict:
    """Run ``policy_path`` (ONNX) on the device at ``port`` for ``duration``
    seconds; returns the summary dict (``ended``: completed, interrupted,
    fault, link lost or error). Telemetry goes to ``log`` (.csv or .jsonl) and
    the plot to ``plot`` (None: next to ``log``; False: none). SIGINT, SIGTERM
    and SIGHUP (in the main thread) or ``stop.set()`` end the run safely: zero
    command, DISARM, log and plot written. ``on_device``: the device's linked
    controller closes the loop (PROTOCOL.md, "On-device control"); the host
    arms, keeps the watchdog fed and logs; ``policy_path`` may then be None.
    ``make_policy(info, features)``: a host-side command source other than
    an ONNX file (``grpo-ctrl excite``'s experiment); ``policy_path`` is
    then ignored. ``status``: a stream for the status line (status.py),
    written from a thread of its own; None: no status line. The plot needs
    matplotlib (the train extra): without it the default plot is skipped
    with a note, and ``plot`` given is refused before the port opens.
    ``estimator_hz``: the policy sees the host's model estimate of the
    state (``grpo_ctrl/estimator.py``, this bandwidth) instead of the device's
    velocities; its model is the device's preset, or ``plant`` (a TOML file
    of ``grpo-ctrl sysid --out``)."""
    if not duration > 0 or not math.isfinite(duration):
        raise UserError(f"--duration must be a positive number of seconds, got {duration}")
    if not on_device and make_policy is None and not Path(policy_path).is_file():
        raise UserError(f"no ONNX controller at {str(policy_path)!r}; export one with "
                        "`grpo-ctrl export ... --onnx FILE`")
    log = Path(log) if log else None
    skipped_plot = None  # the default plot matplotlib's absence skips: said after the run
    if plot is None:
        plot = log.with_suffix(".png") if log else None
        if plot is not None and not _importable("matplotlib"):
            skipped_plot, plot = plot, None
    elif plot and not _importable("matplotlib"):
        raise UserError(f"--plot {str(plot)!r} needs matplotlib: pip install 'grpo-ctrl[train]' "
                        "(or leave --plot out)")
    plot = Path(plot) if plot else None
    _check_outputs(log, plot)
    if on_device and (estimator_hz is not None or plant is not None):
        raise UserError("--estimator and --plant serve a policy the host runs; the device's own "
                        "controller (--on-device) uses its own velocities: leave them out")
    if plant is not None and estimator_hz is None:
        raise UserError("--plant is the model of --estimator HZ: give both, or neither")
    stop = stop or threading.Event()
    caught: list[int] = []
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, _frame):
            caught.append(signum)
            stop.set()
        previous_handlers = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    telemetry = loop = None
    shown = contextlib.nullcontext() if status is None else StatusLine(lambda: loop, status)
    try:
        onnx_policy = (open_onnx_controller(policy_path)
                       if not on_device and make_policy is None else None)
        fitted = _fitted_plant(plant, onnx_policy) if plant is not None else None
        with Link(port, baudrate) as link, shown:
            info, info_frame = handshake(link)
            features = Features(info)
            if estimator_hz is not None:
                features.estimator = _estimator(features, info, estimator_hz, fitted)
            select_control_source(link, info, on_device)
            if on_device:  # keep-alive commands: the device ignores their value
                policy = _keepalive
            elif make_policy is not None:
                policy = make_policy(info, features)
            else:
                policy = check_onnx_controller(onnx_policy, info, features, warn=print_fn)
            telemetry = Telemetry(log)
            loop = ControlLoop(link, info, features, policy, telemetry, stop,
                               keepalive_only=on_device)
            loop.account(info_frame, P.Info.unpack(info_frame.payload), time.monotonic())
            with _realtime() as granted:
                loop.run(duration)
            summary = loop.summary()
            summary.update(granted, low_latency_mode=link.low_latency, estimator_hz=estimator_hz)
        telemetry.close()
        summary["telemetry_dropped"] = telemetry.dropped
        if telemetry.error:
            print_fn(f"warning: the telemetry {str(log)!r} is incomplete: {telemetry.error}")
        if caught:
            summary["signal"] = signal.Signals(caught[0]).name
        summary["log"] = str(log) if log else None
        summary["plot"] = str(plot) if plot else None
        if plot:
            write_plot(plot, loop.r.t, loop.r.angle, loop.r.action, info.u_max,
                       title=f"{features.system}/{info.preset} via {port}: {summary['ended']}")
        elif skipped_plot is not None:
            print_fn(f"note: no plot {str(skipped_plot)!r}: matplotlib is not installed (pip "
                     "install 'grpo-ctrl[train]')")
    finally:
        if telemetry is not None:
            telemetry.close()
        for s, handler in previous_handlers.items():
            signal.signal(s, handler)
    return summary


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def _fitted_plant(path, policy):
    """``--plant``'s file, read against the policy's plant before the port opens."""
    from grpo_ctrl.plant import plant_spec
    from grpo_ctrl.plant_file import read_plant_file

    if not Path(path).is_file():
        raise UserError(f"--plant {str(path)!r} is not a file; give the TOML that "
                        "`grpo-ctrl sysid --out` wrote")
    meta = policy.metadata
    return read_plant_file(path, plant_spec(meta["system"], meta["preset"]))


def _estimator(features: Features, info: P.Info, bandwidth_hz: float, fitted):
    """The model estimator of the device's plant: its preset, or the
    ``fitted`` plant (``_fitted_plant``)."""
    from grpo_ctrl.estimator import ModelEstimator
    from grpo_ctrl.plant import plant_spec, presets

    if info.preset not in presets(features.system):
        raise UserError(f"--estimator needs the plant's model; the device's preset "
                        f"{info.preset!r} is not one of {features.system}'s "
                        f"{presets(features.system)}: give --plant FILE")
    spec = plant_spec(features.system, info.preset)
    return ModelEstimator(spec, info.period_us * 1e-6, bandwidth_hz, fitted)


def _keepalive(obs) -> float:
    return 0.0


def _check_outputs(log: Path | None, plot: Path | None) -> None:
    """Every output path is checked before the port is opened: a bad one is
    a one-line error before anything moves, not after the run."""
    for path, option in ((log, "--log"), (plot, "--plot")):
        if path is None:
            continue
        if path.is_dir():
            raise UserError(f"{option} {str(path)!r} is a folder; give a file name")
        if log is not None and path == log and option == "--plot":
            raise UserError(f"--plot and --log are the same file {str(path)!r}; give two names")
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent  # the folder is created: its nearest existing parent counts
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            raise UserError(f"{option} {str(path)!r}: cannot write in {str(folder)!r}; "
                            "choose a writable place")
        if path.exists() and not os.access(path, os.W_OK):
            raise UserError(f"{option} {str(path)!r} exists and is not writable; choose another "
                            "name")


@contextlib.contextmanager
def _realtime():
    """While the loop runs: SCHED_FIFO for this thread (it blocks in select,
    so it cannot starve the machine), its memory locked as it is touched (a
    busy machine reclaims page cache, the loop's code pages among them, and
    faulting one back in waits on the disk), and no garbage-collector pauses
    (the loop makes no reference cycles). Each is best effort."""
    before = None
    if hasattr(os, "sched_setscheduler"):
        try:
            before = (os.sched_getscheduler(0), os.sched_getparam(0))
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5))
        except OSError:
            before = None
    locked = _lock_memory()
    gc.collect()
    gc.disable()
    try:
        yield {"realtime_priority": before is not None, "memory_locked": locked}
    finally:
        gc.enable()
        if locked:
            _libc().munlockall()
        if before is not None:
            os.sched_setscheduler(0, *before)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _lock_memory() -> bool:
    """mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT): pages in memory stay
    there, pages touched later are locked when touched (nothing is read in
    ahead). Needs root or CAP_IPC_LOCK; Linux only."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _libc().mlockall(1 | 2 | 4) == 0
    except (OSError, AttributeError):
        return False


# ---------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("SIGINT, SIGTERM and SIGHUP end the run safely (zero command, DISARM, log "
                "written); the handlers are installed before the port opens, and a signal the "
                "parent ignores (SIGINT under `nohup ... &`) stays ignored until then.")
    p.add_argument("--port", required=True,
                   help="serial device path (/dev/ttyACM0, the path `grpo-ctrl hil` prints) or a "
                        "pyserial URL (socket://host:port, rfc2217://...)")
    p.add_argument("--policy", default=None,
                   help="exported ONNX controller (grpo-ctrl export); not with --on-device")
    p.add_argument("--on-device", action="store_true",
                   help="the device's own linked controller closes the loop; the host arms, "
                        "supervises and logs")
    p.add_argument("--duration", type=positive_seconds, default=10.0, metavar="S",
                   help="run this long")
    p.add_argument("--log", default=None,
                   help="telemetry file, .csv or .jsonl (default: runs/serial/<time>.csv)")
    p.add_argument("--plot", default=None, help="PNG plot (default: next to the log)")
    p.add_argument("--baud", type=positive_int(100_000_000), default=1_000_000,
                   help="baud rate for a UART (ignored by USB CDC and pseudo-terminals)")
    p.add_argument("--estimator", type=number(float, above=0.0, high=1e5, unit=" Hz"),
                   default=None, metavar="HZ",
                   help="the policy sees the host's estimate of the state instead of the "
                        "device's velocities: the plant's model predicts each tick from the "
                        "applied command, the encoders correct it with this bandwidth (5 flies "
                        "the acrobot on 4096-count encoders, which needs it)")
    p.add_argument("--plant", default=None, metavar="FILE.toml",
                   help="the estimator's model: a fitted rig (grpo-ctrl sysid --out) instead of "
                        "the device's preset")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true",
                   help="no status line (elapsed, rate, angle, command, missed deadlines, lost "
                        "frames), which otherwise goes to stderr: rewritten in place 4 times a "
                        "second on a terminal, a plain line a second elsewhere")


def run(args) -> int:
    if (args.policy is None) != args.on_device:
        raise UserError("give --policy FILE (the host runs it) or --on-device (the device's "
                        "own controller), one of the two")
    log = args.log or f"runs/serial/{time.strftime('%Y%m%d-%H%M%S')}.csv"
    summary = run_loop(args.port, args.policy, args.duration, log, args.plot,
                       baudrate=args.baud, on_device=args.on_device,
                       status=None if args.quiet else sys.stderr,
                       estimator_hz=args.estimator, plant=args.plant)
    print(json.dumps(summary) if args.json else format_summary(summary), flush=True)
    if summary["ended"].startswith("error: "):  # the one line that says why, where errors go
        print(f"grpo-ctrl run: {summary['ended']}", file=sys.stderr, flush=True)
    if "signal" in summary:  # stopped by a signal: the shell's convention, 128 + its number
        return 128 + signal.Signals[summary["signal"]].value
    return EXIT_CODES.get(summary["ended"].split(":")[0], 1)
