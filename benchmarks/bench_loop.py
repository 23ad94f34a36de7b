#!/usr/bin/env python3
"""The closed loop over a pseudo-terminal, on a quiet and on a busy machine.

Serves the HIL pendulum on a pseudo-terminal (started near upright, held
until armed) and runs the exported swing-up-plus-LQR controller through
``firmware_bridge.host.run_loop``: the same code as ``grpo-ctrl run``, with
the real pty, framing, CRC, onnxruntime and telemetry. Rates: 20 Hz (the
gym preset, what ``grpo-ctrl demo`` flies), 200 Hz (the rig) and 1 kHz (the
rig, faster). Loads (``benchmarks/loadgen.py``): quiet, cpu, disk, memory,
pip, mix.

For each load and rate: achieved command rate, missed periods (ticks whose
command did not answer the previous STATE), watchdog trips (the run ends with
the first; protocol version 3: at a tick's due time the command in effect
answered a STATE more than the watchdog old), the round trip measured by the device (a STATE leaves at the
tick -> the COMMAND answering it arrives; p99 and max), frames lost and
telemetry rows dropped.

    python benchmarks/bench_loop.py --load all --seconds 5   # or: grpo-ctrl bench loop ...
    python benchmarks/bench_loop.py --load disk --rates 20,1000
    python benchmarks/bench_loop.py --json loop.json

The watchdog is the device's default of two periods, but at least 20 ms
(``--watchdog-ms``): at 20 Hz that is the demo's 100 ms. Target (issue 6):
1 kHz held on a quiet machine with p99 round trip below 1 ms and under 0.1%
of periods missed. The machine is shared: state its load with the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import KINDS, load  # noqa: E402  (benchmarks/ is not a package)

from grpo_ctrl.firmware_bridge.hil import HilConfig, serve_hil  # noqa: E402
from grpo_ctrl.firmware_bridge.host import run_loop  # noqa: E402
from grpo_ctrl.firmware_bridge.telemetry import Telemetry, read_telemetry  # noqa: E402

TARGET_RATE, TARGET_P99_MS, TARGET_MISSED = 1000.0, 1.0, 0.001
PRESET_FOR_RATE = {20.0: "gym"}  # the others fly the rig


def export_swingup(folder: Path, preset: str) -> Path:
    path = folder / f"swingup-lqr-pendulum-{preset}.onnx"
    if not path.exists():
        subprocess.run([sys.executable, "-m", "grpo_ctrl.cli", "export", "--controller",
                        "swingup-lqr", "--system", "pendulum", "--preset", preset,
                        "--onnx", str(path)], check=True, capture_output=True)
    return path


def measure(folder: Path, rate: float, seconds: float, watchdog_ms: float | None) -> dict:
    preset = PRESET_FOR_RATE.get(rate, "rig")
    policy = export_swingup(folder, preset)
    wd = watchdog_ms if watchdog_ms is not None else max(2000.0 / rate, 20.0)
    config = HilConfig(system="pendulum", preset=preset, rate=rate, angle0=0.02,
                       hold_until_armed=True, watchdog_ms=wd, trace_seconds=seconds + 5)
    log = folder / f"loop-{rate:g}.csv"
    with serve_hil(config) as hil:
        s = run_loop(hil.port, policy, seconds, log, plot=False, print_fn=lambda *_: None)
        stats = hil.stats()
    rtt = [r["loop_latency_us"] for r in read_telemetry(log)
           if r["kind"] == "state" and r["loop_latency_us"] is not None]
    s.update(rate_target_hz=rate, preset=preset, watchdog_ms=wd,
             watchdog_trips=stats["watchdog_trips"], device_late_ticks=stats["late_ticks"],
             hil_realtime=bool(stats["realtime"]), rtt_ms_max=max(rtt) * 1e-3 if rtt else None)
    return s


SAMPLE_ROW = {"kind": "state", "dev_seq": 1234, "dev_t_us": 123456789, "host_rx_s": 12.345678,
              "host_tx_s": 12.345789, "mode": 1, "fault": 0, "flags": 1, "cmd_seq": 1233,
              "loop_latency_us": 321, "actuator": 0.0123, "pos": [1024], "vel": [-37],
              "obs": [0.99, 0.01, -0.11], "action": 0.0123, "compute_us": 111.0}


def telemetry_call_ms(folder: Path, queued: bool, seconds: float) -> list[float]:
    """How long the loop thread spends in one telemetry row at 1 kHz: the
    queued ``Telemetry.write`` against the write-and-flush it replaced."""
    times = []
    path = folder / f"rows-{'queued' if queued else 'flushed'}.csv"
    telemetry = Telemetry(path) if queued else None
    plain = None if queued else open(path, "w")
    end = time.monotonic() + seconds
    try:
        while (now := time.monotonic()) < end:
            if queued:
                telemetry.write(SAMPLE_ROW)
            else:
                plain.write(",".join(str(v) for v in SAMPLE_ROW.values()) + "\n")
                plain.flush()
            times.append((time.monotonic() - now) * 1e3)
            time.sleep(max(0.0, now + 0.001 - time.monotonic()))
    finally:
        telemetry.close() if queued else plain.close()
    return times


def telemetry_row(load_name: str, queued: bool, ms: list[float]) -> str:
    a = np.array(ms)
    return (f"| {load_name} | {'queued (writer thread)' if queued else 'write + flush'} | "
            f"{a.size} | {np.percentile(a, 99.9):.3f} | {a.max():.1f} | {(a > 10).sum()} |")


def row(load_name: str, s: dict) -> str:
    rtt_max = f"{s['rtt_ms_max']:.2f}" if s["rtt_ms_max"] is not None else "-"
    return (f"| {load_name} | {s['rate_target_hz']:g} | {s['achieved_rate_hz']:.1f} | "
            f"{s['missed_deadlines']} ({100 * s['missed_fraction']:.2f}%) | "
            f"{s['watchdog_trips']} | {s['loop_latency_ms_p99']:.2f} | {rtt_max} | "
            f"{s['lost_frames']} | {s['telemetry_dropped']} | {s['ended']} "
            f"({s['duration_s']:.1f} s) |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", default="quiet",
                    help=f"quiet, {', '.join(KINDS)}, a comma list, or all (default: quiet)")
    ap.add_argument("--rates", default="20,200,1000",
                    help="control rates in Hz (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per run (default: 5)")
    ap.add_argument("--quick", action="store_true", help="2 s per run")
    ap.add_argument("--watchdog-ms", type=float, default=None,
                    help="device watchdog (default: two periods, at least 20 ms)")
    ap.add_argument("--telemetry-seconds", type=float, default=3.0,
                    help="per load, time the loop thread's telemetry call this long, queued and "
                         "written in place, alternately twice (0: skip; default: %(default)s)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    loads = ["quiet", *KINDS] if args.load == "all" else args.load.split(",")
    for name in loads:
        if name != "quiet" and name not in KINDS:
            ap.error(f"unknown load {name!r}; choose quiet, {', '.join(KINDS)} or all")
    rates = [float(r) for r in args.rates.split(",")]
    seconds = 2.0 if args.quick else args.seconds
    print(f"closed loop over a pty, {seconds:g} s per run; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} before starting (shared machine: noisy)")
    print("| load | rate Hz | achieved Hz | missed periods | watchdog trips | rtt p99 ms | "
          "rtt max ms | lost | telemetry dropped | ended |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    results, telemetry = [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in loads:
            with load(name):
                for rate in rates:
                    s = measure(folder, rate, seconds, args.watchdog_ms)
                    s["load"], s["load_average"] = name, os.getloadavg()[0]
                    results.append(s)
                    print(row(name, s), flush=True)
                if args.telemetry_seconds > 0:
                    for queued in (False, True, False, True):
                        ms = telemetry_call_ms(folder, queued, args.telemetry_seconds / 2)
                        telemetry.append(telemetry_row(name, queued, ms))
    if telemetry:
        print("\ntime the loop thread spends per telemetry row at 1 kHz (ms):")
        print("| load | telemetry | rows | p99.9 | max | > 10 ms |\n|---|---|---|---|---|---|")
        print("\n".join(telemetry))
    fast = [s for s in results if s["load"] == "quiet" and s["rate_target_hz"] == TARGET_RATE]
    if fast:
        f = fast[0]
        ok = (f["ended"] == "completed" and f["achieved_rate_hz"] >= 0.99 * TARGET_RATE
              and f["loop_latency_ms_p99"] < TARGET_P99_MS and f["missed_fraction"] < TARGET_MISSED)
        print(f"target (quiet, 1 kHz held, p99 < {TARGET_P99_MS:g} ms, < {100 * TARGET_MISSED:g}% "
              f"missed): {'MET' if ok else 'NOT MET'}; real-time priority: host "
              f"{'yes' if f['realtime_priority'] else 'no'}, HIL {'yes' if f['hil_realtime'] else 'no'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": seconds, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
