"""PROTOCOL.md is enough to write a host: tests/independent_host.py, written from the spec
alone (no grpo_ctrl import), flies the HIL device at 200 Hz and at 1 kHz.

Asserted: safety and protocol outcomes, never timings. The handshake and the arming
succeed; every frame the host sent is accepted by the device (STATUS rx_frames) and none
is bad, stale or ignored; every device seq after INFO is received or counted lost and
the losses agree with the device's drop counters; every armed STATE is answered once;
the actuator never exceeds u_limit and equals the clamped command it names; no fault;
DISARM is acknowledged."""
import ast
import math
import pathlib
import signal
import sys

import pytest

from grpo_ctrl.firmware_bridge.hil import spawn_hil

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
import independent_host as ih  # noqa: E402

WATCHDOG_US = 50_000     # as tests/test_run.py's START: a loaded pty stalls for ms


def test_the_independent_host_imports_nothing_from_the_project():
    tree = ast.parse((HERE / "independent_host.py").read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {n for n in names if n and n.split(".")[0] not in
                set(sys.stdlib_module_names) | {"serial"}}


@pytest.fixture
def device(request):
    rate = request.param
    process, port = spawn_hil("--preset", "rig", "--rate", str(rate), "--hold-until-armed",
                              "--angle0", str(math.pi - 0.6), "--duration", "60")
    try:
        yield rate, port
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(10)
        except Exception:
            process.kill()
            process.wait()


@pytest.mark.parametrize("device", [200, 1000], indirect=True, ids=["200Hz", "1kHz"])
def test_a_host_written_from_the_spec_alone_flies_the_hil_device(device):
    rate, port = device
    host = ih.Host(port)
    try:
        info = host.handshake()
        info_seq = (host.link.expect - 1) % 2**32
        assert info["version"] == 3 and info["period_us"] == round(1e6 / rate)
        assert 0 < info["u_limit"] <= info["u_max"]
        assert info["watchdog_us"] == 2 * info["period_us"]      # the default
        # PROTOCOL.md, "Watchdog": the default two periods suit a real-time link; over a
        # pty the round trip's tail is milliseconds under load, so the host sets its own
        assert host.param(ih.WATCHDOG_US, WATCHDOG_US) == WATCHDOG_US
        before = host.status()
        lost_at_before = host.link.lost
        assert before["mode"] == ih.DISARMED and before["rx_frames"] == host.link.sent
        summary = host.run(3.0)
        after = host.status()
    finally:
        host.link.close()

    # the device accepted every frame this host sent, and none was bad, stale or ignored
    assert after["rx_frames"] == host.link.sent
    for name in ("rx_crc_errors", "rx_bad_frames", "rx_overflows", "stale_commands",
                 "ignored_commands", "watchdog_trips"):
        assert after[name] == 0, name
    assert after["mode"] == ih.DISARMED and after["fault"] == 0 and not summary["faults"]
    # the watchdog counted last from the STATE the final zero COMMAND answered
    assert after["info_t_us"] == host.states[-1][1]["t_us"]
    # every device seq after INFO is accounted for; a pty loses no bytes, so every loss is
    # a STATE the device dropped from its queue, counted between the two STATUS frames
    assert after["tx_frames"] == after["seq"]
    link = host.link
    assert link.received + link.lost == (after["seq"] - info_seq) % 2**32
    assert link.rejected == 0
    dropped = (after["tx_dropped_states"] + after["tx_dropped_replies"]
               - before["tx_dropped_states"] - before["tx_dropped_replies"])
    assert link.lost - lost_at_before <= dropped <= link.lost
    # every armed STATE answered once; commands = answers + the final zero
    assert summary["answered"] == len(host.states) > rate       # over a second of control
    assert len(host.commands) == summary["answered"] + 1
    # the actuator stays within u_limit and is the clamped value of the command it names
    u_lim = info["u_limit"]
    for seq, st in host.states:
        assert abs(st["u"]) <= u_lim
        if st["cmd_seq"] in host.commands:
            want = max(-u_lim, min(u_lim, host.commands[st["cmd_seq"]]))
            assert st["u"] == pytest.approx(want, abs=1e-6)
        else:                       # before the first command after arming: nothing applied
            assert st["u"] == 0.0 and not st["flags"] & ih.FRESH
    # the loop was closed: the PD drove the pendulum and it settled towards hanging
    assert any(abs(st["u"]) > 0 for _, st in host.states)
    cpr = info["counts_per_unit"][0]
    err = [abs(ih.wrap(2 * math.pi * st["pos"][0] / cpr - math.pi)) for _, st in host.states]
    assert err[0] > 0.5 and max(err[-rate // 5:]) < 0.3
