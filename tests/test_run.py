"""``grpo-ctrl run`` end to end over a real pseudo-terminal against the HIL
pendulum rig: an exported swing-up-plus-LQR controller, and a trained GRPO
policy, balance it; through corrupted and dropped frames too; and every way
of ending is safe."""
import json
import re
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from grpo_ctrl.firmware_bridge import protocol as P
from grpo_ctrl.firmware_bridge.hil import HilConfig, serve_hil
from grpo_ctrl.firmware_bridge.host import run_loop
from grpo_ctrl.firmware_bridge.telemetry import read_telemetry

from conftest import export_baseline

CLI = [sys.executable, "-m", "grpo_ctrl.cli"]


# A GRPO policy trained on the rig preset (tests/data/README.md says how).
TRAINED_RIG_POLICY = Path(__file__).parent / "data" / "pendulum-rig-grpo.onnx"


@pytest.fixture(scope="module", params=["swingup-lqr", "grpo"])
def rig_controller(request, swingup):
    return swingup if request.param == "swingup-lqr" else TRAINED_RIG_POLICY


def grpo_run(port, policy, duration, log, *extra):
    return subprocess.run(CLI + ["run", "--port", port, "--policy", str(policy), "--duration",
                                 str(duration), "--log", str(log), "--json", *extra],
                          capture_output=True, text=True, timeout=duration + 60)


def summary_of(result):
    return json.loads(result.stdout.strip().splitlines()[-1])


def wrapped(angle):
    return np.abs(np.remainder(np.asarray(angle) + np.pi, 2 * np.pi) - np.pi)


def armed_span(trace):
    armed = trace["mode"] == P.MODE_ARMED
    return armed, trace["t"][armed][-1] - trace["t"][armed][0]


def check_accounting(log, summary):
    """Every device sequence number from the handshake on is in the telemetry
    once: a row per frame, a row per run of lost ones."""
    rows = read_telemetry(log)
    seqs = []
    for r in rows:
        n = int(r["count"]) if r["kind"] == "lost" else 1
        seqs += range(int(r["dev_seq"]), int(r["dev_seq"]) + n)
    assert sorted(seqs) == list(range(seqs[0], seqs[0] + len(seqs)))
    assert sum(int(r["count"]) for r in rows if r["kind"] == "lost") == summary["lost_frames"]
    return rows


# Near upright (0.1 rad, at rest), held still until the host arms. The
# watchdog is 30 periods rather than 2 (test_hil checks the default): these
# tests are about the chain, and a CI machine shared with other jobs, with no
# real-time priority in its container, holds the host up for more than 10 ms
# often and for more than 50 ms now and then (a CI run of December 1 tripped
# 50 ms in four tests running; `bench_loop.py --load crowd` under `setpriv
# --bounding-set -sys_nice`: round trips up to 34 ms, one run of four tripped
# 50 ms, none of five 150 ms; firmware_bridge/README.md).
START = dict(system="pendulum", preset="rig", angle0=0.1, hold_until_armed=True, watchdog_ms=150)


def test_exported_controller_balances_the_rig_for_10_s(rig_controller, tmp_path):
    log = tmp_path / "run.csv"
    with serve_hil(HilConfig(**START)) as hil:
        r = grpo_run(hil.port, rig_controller, 10, log)
        trace, stats = hil.trace(), hil.stats()
    assert r.returncode == 0, (r.stdout, r.stderr, stats)
    s = summary_of(r)
    # rates are the benchmark's (grpo-ctrl bench loop): on a loaded machine the
    # HIL's ticks come late too; what must hold is the outcome and the accounting
    assert s["ended"] == "completed" and s["disarm_acknowledged"]
    armed, span = armed_span(trace)
    assert span >= 9.9
    assert np.max(wrapped(trace["x"][armed, 0])) < 0.2          # what the plant did
    assert s["max_abs_angle"] < 0.2                             # what the host saw
    assert stats["mode_name"] == "disarmed" and stats["watchdog_trips"] == 0
    rows = check_accounting(log, s)
    assert s["lost_frames"] == 0 and sum(r["kind"] == "state" for r in rows) >= 2000
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_swings_up_from_hanging_and_balances(rig_controller, tmp_path):
    with serve_hil(HilConfig(**dict(START, angle0=math.pi))) as hil:
        r = grpo_run(hil.port, rig_controller, 8, tmp_path / "up.csv")
        trace = hil.trace()
    assert r.returncode == 0, (r.stdout, r.stderr)
    armed, span = armed_span(trace)
    t = trace["t"][armed] - trace["t"][armed][0]
    angle = wrapped(trace["x"][armed, 0])
    assert angle[0] > 3.0 and span >= 7.9
    assert np.max(angle[t > 3.0]) < 0.2   # up within 3 s, and it stays up


def test_balances_through_corrupted_bytes_and_dropped_frames(swingup, tmp_path):
    log = tmp_path / "faults.jsonl"
    with serve_hil(HilConfig(**START, corrupt=0.01, drop=0.05, seed=7)) as hil:
        r = grpo_run(hil.port, swingup, 6, log)
        trace, stats = hil.trace(), hil.stats()
    assert r.returncode == 0, (r.stdout, r.stderr, stats)
    s = summary_of(r)
    assert s["ended"] == "completed" and s["disarm_acknowledged"]
    armed, span = armed_span(trace)
    assert span >= 5.9 and np.max(wrapped(trace["x"][armed, 0])) < 0.2
    check_accounting(log, s)
    # the host lost what the line lost: a 44-byte STATE frame survives with
    # probability 0.95 (not dropped) x 0.99^44 (no byte corrupted)
    seen = s["lost_frames"] + s["states_received"]
    assert s["lost_frames"] / seen == pytest.approx(1 - 0.95 * 0.99 ** 44, abs=0.05)
    assert stats["tx_dropped"] > 0.03 * stats["tx_frames"]
    assert s["crc_errors"] + s["bad_frames"] > 0.1 * s["states_received"]
    assert stats["watchdog_trips"] == 0


def test_sigint_disarms_and_the_device_acknowledges(swingup, tmp_path):
    with serve_hil(HilConfig(**START)) as hil:
        p = subprocess.Popen(CLI + ["run", "--port", hil.port, "--policy", str(swingup),
                                    "--duration", "30", "--log", str(tmp_path / "i.csv"),
                                    "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        deadline = time.monotonic() + 20
        while hil.stats()["arms"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)  # the plot comes after: slow under load
        time.sleep(0.1)
        trace, stats = hil.trace(), hil.stats()
    assert p.returncode == 130, err
    s = json.loads(out.strip().splitlines()[-1])
    assert s["ended"] == "interrupted" and s["disarm_acknowledged"]
    assert 0.5 < s["duration_s"] < 5
    assert stats["mode_name"] == "disarmed" and stats["watchdog_trips"] == 0
    assert trace["u"][-1] == 0 and trace["mode"][-1] == P.MODE_DISARMED


def relabelled(src, dst, **changes):
    """A copy of an exported controller with some metadata changed."""
    import onnx

    from grpo_ctrl.export import metadata

    model = onnx.load(str(src))
    metadata.write(model, changes)
    onnx.save(model, str(dst))
    return dst


@pytest.mark.parametrize("change,why", [
    ({"system": "cartpole"}, "system"),                                  # another plant
    ({"obs_names": "sin_theta,cos_theta,theta_dot"}, "observations"),    # another layout
    ({"u_max": "2.0"}, "u_max"),                                         # another actuator
])
def test_mismatched_policy_is_refused_before_arming(swingup, tmp_path, change, why):
    policy = relabelled(swingup, tmp_path / "other.onnx", **change)
    with serve_hil(HilConfig(system="pendulum", preset="rig")) as hil:
        r = grpo_run(hil.port, policy, 5, tmp_path / "x.csv")
        stats = hil.stats()
        u = hil.trace()["u"]
    assert r.returncode == 2
    assert "refusing to arm" in r.stderr and why in r.stderr and "Traceback" not in r.stderr
    assert stats["arms"] == 0 and np.all(u == 0)


def test_an_exported_policy_for_another_preset_is_refused_by_its_limits(tmp_path_factory,
                                                                         tmp_path):
    gym = export_baseline(tmp_path_factory, "lqr", "pendulum", "gym")  # a 2 N m actuator, not the rig's
    with serve_hil(HilConfig(system="pendulum", preset="rig")) as hil:
        r = grpo_run(hil.port, gym, 5, tmp_path / "x.csv")
        stats = hil.stats()
    assert r.returncode == 2 and "refusing to arm" in r.stderr and "u_max" in r.stderr
    assert stats["arms"] == 0


def test_velocity_limit_exceeded_ends_in_a_safe_stop(swingup, tmp_path):
    limit = 3.0
    with serve_hil(HilConfig(system="pendulum", preset="rig", angle0=0.5, hold_until_armed=True,
                             velocity_limit=limit, watchdog_ms=START["watchdog_ms"])) as hil:
        r = grpo_run(hil.port, swingup, 10, tmp_path / "lim.csv")
        trace, stats = hil.trace(), hil.stats()
    assert r.returncode == 3, r.stderr
    s = summary_of(r)
    assert s["ended"] == "fault: velocity limit" and s["disarm_acknowledged"]
    faulted = np.nonzero(trace["mode"] == P.MODE_FAULT)[0]
    first = faulted[0]
    assert np.all(trace["u"][first:] == 0)
    assert abs(trace["x"][first, 1]) < 1.5 * limit
    assert stats["mode_name"] == "disarmed"


def test_lost_link_ends_the_run_and_the_device_stops_itself(swingup, tmp_path):
    # a 50 ms watchdog, not the default two periods (10 ms): a loaded 2-CPU
    # machine delays the pty by more than 10 ms now and then (the kernel's
    # tty worker waits behind other processes), and a watchdog trip before
    # the line goes is another test (the velocity-limit one is alike); not
    # START's 150 ms either: the trip's time after the line goes is checked
    with serve_hil(HilConfig(**dict(START, watchdog_ms=50), disconnect_after=1.5)) as hil:
        s = run_loop(hil.port, swingup, 5.0, tmp_path / "ll.csv", print_fn=lambda *_: None)
        time.sleep(0.1)
        trace, stats = hil.trace(), hil.stats()
    assert s["ended"] == "link lost" and not s["disarm_acknowledged"]
    assert s["duration_s"] < 3.0
    # the device's watchdog took over after the line went: actuator zero from
    # the fault on (its exact delay is test_hil's: here the HIL thread shares
    # a loaded machine too, and its late ticks stretch it)
    assert stats["disconnected"] and stats["fault_name"] == "watchdog"
    t_fault = trace["t"][np.argmax(trace["mode"] == P.MODE_FAULT)]
    assert np.all(trace["u"][trace["t"] >= t_fault] == 0)
    assert 1.5 < t_fault < 1.5 + 0.25


def test_added_latency_shows_in_the_measured_round_trip(swingup, tmp_path):
    """The injector delays every device frame by 2 ms (and 5% of them by 6 ms
    more): the device's own round-trip measurement sees the 2 ms, and each
    spiked STATE misses its deadline (it arrives after the next tick, with
    the next STATE behind it, and only that newer one is answered); the
    loop holds."""
    with serve_hil(HilConfig(**START)) as hil:
        clean = run_loop(hil.port, swingup, 2.0, None, print_fn=lambda *_: None)
    with serve_hil(HilConfig(**START, latency_ms=2.0, spike_rate=0.05, spike_ms=6.0)) as hil:
        slow = run_loop(hil.port, swingup, 2.0, None, print_fn=lambda *_: None)
    assert clean["ended"] == slow["ended"] == "completed"
    assert slow["loop_latency_ms_p50"] - clean["loop_latency_ms_p50"] == pytest.approx(2.0, abs=0.5)
    # ~20 of 400 STATEs spiked (binomial s.d. 4.4): 10 is two s.d. below
    assert slow["missed_fraction"] > 0.025
    assert slow["missed_deadlines"] > clean["missed_deadlines"]


def test_demo_trains_exports_and_flies_the_hil_pendulum(tmp_path):
    """The README's first command, shortened: train (both cores), export,
    serve the HIL pendulum on a pty, fly it, and leave it upright. Its
    default budget is iterations, not seconds: a busy machine trains as far
    (a 3 s budget gave 22 iterations at load average 15, and a policy that
    never swung up)."""
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    out = tmp_path / "demo"
    r = subprocess.run(CLI + ["demo", "--duration", "4", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for name in ("policy.onnx", "telemetry.csv", "loop.png", "run/deployed.pt"):
        assert (out / name).is_file(), name
    assert "ended: completed" in r.stdout and "disarm acknowledged" in r.stdout
    end = next(line for line in r.stdout.splitlines() if line.startswith("pendulum at the end"))
    assert end.endswith("(upright)"), end


STATUS = re.compile(r"^run +(\d+\.\d) s +(---|\d+\.\d) Hz  angle ([-+]\d\.\d{3}) rad  "
                    r"command ([-+]\d\.\d{3})  missed (\d+)  lost (\d+)$")


def test_run_prints_a_status_line_to_stderr_and_quiet_silences_it(swingup, tmp_path):
    """Not a terminal: one plain line a second on stderr, no carriage return;
    the summary on stdout is untouched."""
    outs = {}
    for quiet in (False, True):
        with serve_hil(HilConfig(**START)) as hil:
            outs[quiet] = grpo_run(hil.port, swingup, 3, tmp_path / f"s{quiet}.csv",
                                   *(["--quiet"] if quiet else []))
    loud, quiet = outs[False], outs[True]
    assert loud.returncode == quiet.returncode == 0, (loud.stderr, quiet.stderr)
    assert summary_of(loud)["ended"] == summary_of(quiet)["ended"] == "completed"
    assert "\r" not in loud.stderr
    lines = [m for m in map(STATUS.match, loud.stderr.splitlines()) if m]
    assert 2 <= len(lines) <= 5
    last = lines[-1]
    elapsed, rate = float(last[1]), float(last[2])
    assert 1.5 <= elapsed <= 3.5 and rate == pytest.approx(200, rel=0.25)  # the rig's 200 Hz
    assert abs(float(last[3])) < 0.2 and abs(float(last[4])) <= 0.15      # upright, within u_max
    assert not any(map(STATUS.match, quiet.stderr.splitlines()))


def test_the_status_line_is_written_from_outside_the_loop_thread(swingup):
    """run_loop runs the loop in the calling thread; every status write comes
    from another, and on a terminal the line is rewritten in place."""
    import threading

    class Terminal:
        def __init__(self):
            self.writes = []

        def write(self, text):
            self.writes.append((threading.get_ident(), text))

        def flush(self):
            pass

        def isatty(self):
            return True

    tty = Terminal()
    loop_thread = threading.get_ident()
    with serve_hil(HilConfig(**START)) as hil:
        s = run_loop(hil.port, swingup, 2.0, None, plot=False, print_fn=lambda *_: None,
                     status=tty)
    assert s["ended"] == "completed"
    assert tty.writes and all(ident != loop_thread for ident, _ in tty.writes)
    texts = [t for _, t in tty.writes]
    assert all(t.startswith("\r") and t.endswith("\x1b[K") for t in texts[:-1])
    assert texts[-1] == "\n"
    assert 5 <= len(texts) - 1 <= 12  # four a second for about two seconds
