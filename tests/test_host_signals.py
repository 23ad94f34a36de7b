"""Every signal that ends ``grpo-ctrl run`` (SIGINT: Ctrl-C; SIGTERM: timeout,
systemd, docker; SIGHUP: the terminal closed), in every phase of the run,
ends with the actuator at zero and the device disarmed (or never armed),
a non-zero exit status, and the log and plot written once the loop began.

Each child starts with the three signals at their default action
(``default_stop_signals``), as from a terminal, whatever this process
inherited: a suite started with ``nohup ... &`` runs with SIGINT ignored, and
an ignored SIGINT stays ignored across exec until ``run`` installs its
handlers."""
import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from grpo_ctrl.firmware_bridge import protocol as P
from grpo_ctrl.firmware_bridge.hil import HilConfig, default_stop_signals, serve_hil

CLI = [sys.executable, "-m", "grpo_ctrl.cli"]
START = dict(system="pendulum", preset="rig", angle0=0.1, hold_until_armed=True, watchdog_ms=50)


def wait_for(condition, timeout=30.0):
    end = time.monotonic() + timeout
    while not condition() and time.monotonic() < end:
        time.sleep(0.005)
    return condition()


# phase -> (run duration, what to wait for before signalling)
PHASES = {
    "start-up": (10, lambda hil, p: True),                         # still importing
    "handshake": (10, lambda hil, p: hil.stats()["rx_frames"] > 0),  # HELLO in, not armed
    "armed": (30, lambda hil, p: hil.stats()["arms"] > 0 and time.sleep(0.5) is None),
    # the run's time is up: DISARM is in, the host is writing the log and the plot
    "shutdown": (1, lambda hil, p: hil.stats()["arms"] > 0
                 and hil.stats()["mode"] == P.MODE_DISARMED),
}


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_in_any_phase_leaves_the_device_disarmed(swingup, tmp_path, phase, sig):
    duration, ready = PHASES[phase]
    log = tmp_path / "s.csv"
    with serve_hil(HilConfig(**START)) as hil:
        p = subprocess.Popen(CLI + ["run", "--port", hil.port, "--policy", str(swingup),
                                    "--duration", str(duration), "--log", str(log), "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=default_stop_signals)
        assert wait_for(lambda: ready(hil, p)), phase
        alive = p.poll() is None
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        time.sleep(0.05)
        stats, trace = hil.stats(), hil.trace()
    assert "Traceback" not in err or phase == "start-up", err
    # the device: disarmed with the actuator at zero, or never armed (whether a
    # loaded machine also tripped its watchdog before the signal is not this
    # test's: under loadgen disk it did, in 5 of 12 runs, with 50 ms)
    assert stats["mode_name"] == "disarmed"
    assert np.all(trace["u"] == 0) if stats["arms"] == 0 else trace["u"][-1] == 0
    if alive:
        assert p.returncode != 0
    if phase in ("armed", "shutdown"):
        assert stats["arms"] == 1
        s = json.loads(out.strip().splitlines()[-1])
        assert s["disarm_acknowledged"]
        assert s["ended"] in ("interrupted", "completed", "fault: watchdog")
        assert log.is_file() and log.with_suffix(".png").is_file()
    if phase == "armed" and stats["watchdog_trips"] == 0:
        assert s["ended"] == "interrupted" and s["signal"] == sig.name
        assert p.returncode == 128 + sig
    if phase == "handshake" and out.strip():
        # signalled once the device has the HELLO: the INFO answers within a millisecond and
        # the host may have sent its ARM before the signal lands (2 in 8 runs here, the code
        # before this test's change included); either way the run ends interrupted, disarmed
        s = json.loads(out.strip().splitlines()[-1])
        assert stats["arms"] <= 1 and s["ended"] == "interrupted" and s["disarm_acknowledged"]
        assert log.is_file() and log.with_suffix(".png").is_file()
