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
import gc
import json
import os
import signal
import threading
import time
from pathlib import Path

from grpo_ctrl.errors import UserError
from grpo_ctrl.firmware_bridge import protocol as P
from grpo_ctrl.firmware_bridge.link import Link, handshake
from grpo_ctrl.firmware_bridge.loop import ControlLoop, format_summary
from grpo_ctrl.firmware_bridge.observation import Features, load_onnx_controller
from grpo_ctrl.firmware_bridge.telemetry import Telemetry, write_plot

EXIT_CODES = {"completed": 0, "fault": 3, "link lost": 4, "interrupted": 130}


def run_loop(port: str, policy_path, duration: float = 10.0, log=None, plot=None, *,
             baudrate: int = 1_000_000, stop: threading.Event | None = None,
             print_fn=print) -> dict:
    """Run ``policy_path`` (ONNX) on the device at ``port`` for ``duration``
    seconds; returns the summary dict (``ended``: completed, interrupted,
    fault or link lost). Telemetry goes to ``log`` (.csv or .jsonl) and the
    plot to ``plot`` (default: next to ``log``). Ctrl-C (in the main thread)
    or ``stop.set()`` end the run safely."""
    if not duration > 0:
        raise UserError(f"--duration must be positive, got {duration}")
    if not Path(policy_path).is_file():
        raise UserError(f"no ONNX controller at {str(policy_path)!r}; export one with "
                        "`grpo-ctrl export ... --onnx FILE`")
    log = Path(log) if log else None
    plot = Path(plot) if plot else (log.with_suffix(".png") if log else None)
    link = Link(port, baudrate)
    telemetry = None
    stop = stop or threading.Event()
    previous_handler = None
    if threading.current_thread() is threading.main_thread():
        previous_handler = signal.signal(signal.SIGINT, lambda *_: stop.set())
    previous_policy = _realtime_priority()
    try:
        info, info_frame = handshake(link)
        features = Features(info)
        policy = load_onnx_controller(policy_path, info, features, warn=print_fn)
        telemetry = Telemetry(log)
        loop = ControlLoop(link, info, features, policy, telemetry, stop)
        loop.account(info_frame, P.Info.unpack(info_frame.payload), time.monotonic())
        # no garbage-collector pauses inside the loop: it makes no reference
        # cycles, so reference counting frees everything as it goes
        gc.collect()
        gc.disable()
        try:
            loop.run(duration)
        finally:
            gc.enable()
        summary = loop.summary()
    finally:
        if telemetry is not None:
            telemetry.close()
        link.close()
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)
        if previous_policy is not None:
            os.sched_setscheduler(0, *previous_policy)
    summary["low_latency_mode"] = link.low_latency
    summary["realtime_priority"] = previous_policy is not None
    summary["log"] = str(log) if log else None
    summary["plot"] = str(plot) if plot else None
    if plot:
        write_plot(plot, loop.r.t, loop.r.angle, loop.r.action, info.u_max,
                   title=f"{features.system}/{info.preset} via {port}: {summary['ended']}")
    return summary


def _realtime_priority():
    """Best effort: SCHED_FIFO for this thread while the loop runs (the loop
    blocks in select, so it cannot starve the machine). Returns what to
    restore, or None if not granted."""
    if not hasattr(os, "sched_setscheduler"):
        return None
    try:
        before = (os.sched_getscheduler(0), os.sched_getparam(0))
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5))
        return before
    except (OSError, PermissionError):
        return None


# ---------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", required=True,
                   help="serial device path (/dev/ttyACM0, the path `grpo-ctrl hil` prints) or a "
                        "pyserial URL (socket://host:port, rfc2217://...)")
    p.add_argument("--policy", required=True, help="exported ONNX controller (grpo-ctrl export)")
    p.add_argument("--duration", type=float, default=10.0, metavar="S", help="run this long")
    p.add_argument("--log", default=None,
                   help="telemetry file, .csv or .jsonl (default: runs/serial/<time>.csv)")
    p.add_argument("--plot", default=None, help="PNG plot (default: next to the log)")
    p.add_argument("--baud", type=int, default=1_000_000,
                   help="baud rate for a UART (ignored by USB CDC and pseudo-terminals)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args) -> int:
    log = args.log or f"runs/serial/{time.strftime('%Y%m%d-%H%M%S')}.csv"
    summary = run_loop(args.port, args.policy, args.duration, log, args.plot,
                       baudrate=args.baud)
    print(json.dumps(summary) if args.json else format_summary(summary), flush=True)
    return EXIT_CODES.get(summary["ended"].split(":")[0], 1)
