"""The HIL device on a real pseudo-terminal, driven frame by frame from a
Python client: its rate, its plant (against the simulator stepped on its
own), the watchdog, the limits, parameters and the fault injector."""
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from grpo_ctrl.firmware_bridge import protocol as P
from grpo_ctrl.firmware_bridge.hil import HilConfig, serve_hil, spawn_hil
from grpo_ctrl.firmware_bridge.link import Link
from grpo_ctrl.sim import BatchSim

RIG_PERIOD_US = 5000
CPR = 2048  # the rig preset's encoder


class Client:
    """A bare protocol client: what the tests see of the device."""

    def __init__(self, port):
        self.link = Link(port)
        self.link.flush_input()
        self.frames = []  # (frame, message, host time)

    def pump(self, seconds, answer=None):
        """Read for ``seconds``; answer each STATE with ``answer(state)`` if given."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for f in self.link.poll(0.01):
                msg = P.decode_message(f)
                self.frames.append((f, msg, time.monotonic()))
                if answer is not None and isinstance(msg, P.State):
                    self.link.send(P.Command(answer(msg), f.seq, msg.t_us))

    def request(self, message, kind, timeout=1.0):
        seq, _ = self.link.send(message)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for f in self.link.poll(0.01):
                msg = P.decode_message(f)
                self.frames.append((f, msg, time.monotonic()))
                if isinstance(msg, kind) and (not isinstance(msg, P.Ack) or msg.acked_seq == seq):
                    return msg
        raise AssertionError(f"no {kind.__name__} answered {message}")

    def of(self, kind):
        return [(f, m) for f, m, _ in self.frames if type(m) is kind]

    def close(self):
        self.link.close()


def relax_watchdog(client):
    """50 ms instead of two periods: this test client is plain Python, and a
    busy machine may pause it for longer than 10 ms (the watchdog test keeps
    the default)."""
    assert client.request(P.ParamSet(P.PARAMS["watchdog_us"], 50000), P.Param).result == 0


@pytest.fixture
def rig():
    with serve_hil(HilConfig(system="pendulum", preset="rig", angle0=0.3)) as hil:
        client = Client(hil.port)
        yield hil, client
        client.close()


def test_hello_reports_the_rig(rig):
    _, c = rig
    info = c.request(P.Hello(), P.Info)
    assert (info.system_name, info.preset, info.period_us) == ("pendulum", "rig", RIG_PERIOD_US)
    assert info.u_max == pytest.approx(0.15) and info.counts_per_unit[0] == CPR
    assert info.watchdog_us == 2 * RIG_PERIOD_US and info.angle_mask == 1


def test_state_stream_runs_at_the_control_rate_and_follows_the_simulator(rig):
    hil, c = rig
    c.pump(1.0)
    states = c.of(P.State)
    t = np.array([m.t_us for _, m in states]) * 1e-6
    rate = (len(t) - 1) / (t[-1] - t[0])
    assert rate == pytest.approx(200.0, rel=0.02)
    seqs = [f.seq for f, _ in states]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # nothing lost on a clean line
    # the plant, unactuated from rest at 0.3 rad, is the simulator's pendulum
    trace = hil.trace()
    assert np.all(trace["u"] == 0) and np.all(trace["mode"] == P.MODE_DISARMED)
    sim = BatchSim("pendulum", 1, preset="rig")
    sim.set_state({"x": np.array([[0.3, 0.0]])})
    ref = []
    for _ in range(len(trace["x"])):  # the HIL steps the plant, then ticks
        sim.step(np.zeros(1, np.float32))
        ref.append(sim.get_state()["x"][0].copy())
    np.testing.assert_allclose(trace["x"], np.array(ref), atol=1e-12)
    # each STATE reports that plant's angle through a 2048-count encoder
    by_time = dict(zip((trace["t"] * 1e6).round().astype(np.int64), trace["x"][:, 0]))
    for _, s in states[::20]:
        if s.t_us in by_time:
            assert s.pos[0] == round(by_time[s.t_us] * CPR / (2 * math.pi))


def test_watchdog_zeroes_the_actuator_and_faults_when_the_host_goes_silent(rig):
    hil, c = rig
    assert c.request(P.Arm(), P.Ack).result == 0
    c.pump(0.5, answer=lambda s: 0.05)   # a host that answers every state ...
    c.pump(0.2)                          # ... then goes silent
    (_, fault), = c.of(P.Fault)
    assert P.FAULTS[fault.fault] == "watchdog" and fault.mode == P.MODE_FAULT
    # the watchdog counts from the STATE the last command answered: the fault
    # came at the first tick whose information is more than two periods old,
    # the tick's lateness forgiven up to the watchdog time (PROTOCOL.md; a
    # late tick of a loaded machine's HIL is not the host's). Counted in the
    # trace's ticks: the device may drop STATEs a slow reader has not taken.
    watchdog_us = 2 * RIG_PERIOD_US
    assert fault.t_us - fault.info_t_us > watchdog_us
    trace = hil.trace()
    t_us, due_us = (np.round(trace[k] * 1e6).astype(np.int64) for k in ("t", "due"))
    answered = int(np.flatnonzero(t_us % 2**32 == fault.info_t_us)[-1])
    tripped = int(np.argmax(trace["mode"] == P.MODE_FAULT))
    age_us = t_us - np.minimum(t_us - due_us, watchdog_us) - t_us[answered]
    assert tripped == answered + 1 + int(np.argmax(age_us[answered + 1:] > watchdog_us))
    if np.all(t_us[answered:tripped + 1] - due_us[answered:tripped + 1] < RIG_PERIOD_US):
        assert tripped - answered == 3   # on time: the third tick after
    t_fault = fault.t_us * 1e-6
    after = trace["t"] >= t_fault - 1e-6
    assert np.all(trace["u"][after] == 0) and np.all(trace["mode"][after] == P.MODE_FAULT)
    before = (trace["t"] < t_fault - 1e-6) & (trace["mode"] == P.MODE_ARMED)
    # zero until the first command arrives (a tick or more: a busy machine may
    # pause this Python client for longer), then the command to the fault
    u_armed = trace["u"][before]
    first = int(np.argmax(u_armed != 0))
    assert u_armed[first] != 0 and np.all(u_armed[:first] == 0)
    assert np.all(u_armed[first:] == pytest.approx(0.05))
    # the STATEs say the same, and the fault sticks until DISARM
    later = [s for _, s in c.of(P.State) if s.t_us > fault.t_us]
    assert later and all(s.actuator == 0 and s.mode == P.MODE_FAULT for s in later)
    assert c.request(P.Arm(), P.Ack).result == 1          # refused: fault active
    ack = c.request(P.Disarm(), P.Ack)
    assert (ack.result, ack.mode) == (0, P.MODE_DISARMED)
    assert c.request(P.Arm(), P.Ack).result == 0


def test_velocity_limit_disarms_safely(rig):
    hil, c = rig
    relax_watchdog(c)
    limit = 2.0  # rad/s
    q = c.request(P.ParamSet(P.PARAMS["vel_limit0"], limit * CPR / (2 * math.pi)), P.Param)
    assert q.result == 0
    assert c.request(P.Arm(), P.Ack).result == 0
    busy = c.request(P.ParamSet(P.PARAMS["vel_limit0"], 1e9), P.Param)
    assert P.RESULTS[busy.result] == "not while armed"   # safety settings are frozen while armed
    c.pump(1.5, answer=lambda s: 0.15)   # full torque, falling from 0.3 rad: it speeds up
    (_, fault), = c.of(P.Fault)
    assert P.FAULTS[fault.fault] == "velocity limit"
    trace = hil.trace()
    t_fault = fault.t_us * 1e-6
    thd = trace["x"][:, 1]
    after = trace["t"] >= t_fault - 1e-6
    assert np.all(trace["u"][after] == 0) and np.all(trace["mode"][after] == P.MODE_FAULT)
    # it stopped near the limit, not long after it
    i = np.argmax(after)
    assert limit * 0.8 < abs(thd[i]) < limit * 1.5


def test_commands_are_clamped_and_non_finite_ones_fault(rig):
    hil, c = rig
    relax_watchdog(c)
    assert c.request(P.Arm(), P.Ack).result == 0
    c.pump(0.3, answer=lambda s: 5.0)
    states = [s for _, s in c.of(P.State) if s.mode == P.MODE_ARMED and s.cmd_seq]
    assert states and all(s.actuator == pytest.approx(0.15) for s in states[1:])
    assert all(s.flags & P.FLAG_CLAMPED for s in states[1:])
    assert np.max(np.abs(hil.trace()["u"])) == pytest.approx(0.15)
    c.pump(0.1, answer=lambda s: float("nan"))
    (_, fault), = c.of(P.Fault)
    assert P.FAULTS[fault.fault] == "bad command"


def test_parameters(rig):
    _, c = rig
    assert c.request(P.ParamGet(P.PARAMS["period_us"]), P.Param).value == RIG_PERIOD_US
    q = c.request(P.ParamSet(P.PARAMS["watchdog_us"], 20000), P.Param)
    assert (q.result, q.value) == (0, 20000)
    assert c.request(P.Hello(), P.Info).watchdog_us == 20000
    assert P.RESULTS[c.request(P.ParamSet(P.PARAMS["period_us"], 1), P.Param).result] == "read-only"
    assert P.RESULTS[c.request(P.ParamSet(P.PARAMS["watchdog_us"], 1), P.Param).result] == "out of range"
    assert P.RESULTS[c.request(P.ParamGet(99), P.Param).result] == "unknown parameter"
    status = c.request(P.Heartbeat(), P.Status)
    assert status.mode == P.MODE_DISARMED and status.rx_frames >= 6 and status.rx_crc_errors == 0


def test_fault_injector_drops_and_corrupts_at_the_set_rates():
    with serve_hil(HilConfig(preset="rig", rate=1000, corrupt=0.01, drop=0.05, seed=3)) as hil:
        c = Client(hil.port)
        c.pump(3.0)
        c.close()
        st = hil.stats()
    seqs = [f.seq for f, _, _ in c.frames]
    span = seqs[-1] - seqs[0] + 1
    lost = span - len(seqs)
    # a 44-byte state frame survives 1% byte corruption with probability 0.99^44
    p_loss = 1 - 0.95 * 0.99 ** 44
    assert lost / span == pytest.approx(p_loss, abs=0.03)
    assert st["tx_dropped"] / st["tx_frames"] == pytest.approx(0.05, abs=0.01)
    assert c.link.decoder.crc_errors + c.link.decoder.bad_frames > 0.5 * (lost - st["tx_dropped"])


def test_hil_command_line_prints_its_port_first():
    process, port = spawn_hil("--system", "pendulum", "--preset", "rig", "--duration", "1")
    assert port.startswith("/dev/") and os.path.exists(port)
    c = Client(port)
    info = c.request(P.Hello(), P.Info)
    c.close()
    out, _ = process.communicate(timeout=10)
    assert process.returncode == 0 and info.preset == "rig" and "ticks" in out


def test_hil_rejects_bad_options_cleanly():
    r = subprocess.run([sys.executable, "-m", "grpo_ctrl.cli", "hil", "--preset", "nope"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown preset 'nope'" in r.stderr and "Traceback" not in r.stderr


def test_reference_board_back_end_runs_against_a_mock_arduino(tmp_path):
    """The board sketch's C back-end, built for the host with a mock of the
    Arduino calls: quadrature decoding, handshake, PWM and direction,
    clamping and the watchdog (board/board_test.c)."""
    import shutil
    from pathlib import Path

    fw = Path(__file__).resolve().parent.parent / "firmware_bridge" / "firmware"
    board = fw / "board"
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    exe = tmp_path / "board_test"
    subprocess.run([cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-g",
                    "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    f"-I{board}", f"-I{fw}", str(board / "board_test.c"),
                    str(board / "board_pendulum.c"), str(board / "mock_arduino.c"),
                    str(fw / "fw_core.c"), str(fw / "proto.c"), "-lm", "-o", str(exe)], check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True)
    assert r.returncode == 0 and "0 failures" in r.stdout, r.stdout + r.stderr


def test_link_reads_a_burst_larger_than_one_read_without_losing_a_frame():
    """The host waits with edge-triggered epoll and reads 4096 bytes a time:
    a burst of several tty buffers (a host that stalled at 1 kHz) arrives in
    full, in order, and the wait that follows still wakes on new bytes."""
    import pty
    master, slave = pty.openpty()
    os.set_blocking(master, False)
    link = Link(os.ttyname(slave))
    try:
        link.flush_input()
        wire = b"".join(P.encode(P.Param(0, 0, 0.0), seq) for seq in range(3000))
        assert len(wire) > 4 * 4096
        sent, got, end = 0, [], time.monotonic() + 10
        while len(got) < 3000 and time.monotonic() < end:
            if sent < len(wire):
                try:
                    sent += os.write(master, wire[sent:sent + 8192])
                except BlockingIOError:
                    pass
            got += link.poll(0.01)
        assert [f.seq for f in got] == list(range(3000))
        os.write(master, P.encode(P.Param(0, 0, 0.0), 3000))  # a new edge after the drain
        late = link.poll(1.0)
        assert [f.seq for f in late] == [3000]
    finally:
        link.close()
        os.close(master)
        os.close(slave)


def test_on_device_lqr_balances_the_hil_pendulum_while_the_host_supervises():
    """On-device control in the HIL: the rig's LQR gain, linked as the device's
    controller (u = -K obs on the observation the device builds), switched on
    through the protocol; the host only sets limits, arms and keeps the
    watchdog fed with commands whose values (here far off) are ignored."""
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    from grpo_ctrl.baselines.lqr import design

    k_th, k_thd = design("pendulum", "rig").K[0]
    gains = (0.0, k_th, k_thd)  # on [cos th, sin th, thd]: sin th ~ th near upright
    with serve_hil(HilConfig(system="pendulum", preset="rig", angle0=0.15,
                             device_gains=gains)) as hil:
        c = Client(hil.port)
        try:
            info = c.request(P.Hello(), P.Info)
            assert (info.controller, info.control_source) == (1, P.CONTROL_HOST)
            # the host's timing no longer matters to the loop: a watchdog of
            # 0.5 s supervises it (this client is plain Python on a busy machine)
            assert c.request(P.ParamSet(P.PARAMS["watchdog_us"], 500000), P.Param).result == 0
            q = c.request(P.ParamSet(P.PARAMS["control_source"], P.CONTROL_ON_DEVICE), P.Param)
            assert (q.result, q.value) == (0, P.CONTROL_ON_DEVICE)
            assert c.request(P.Arm(), P.Ack).result == 0
            c.pump(3.0, answer=lambda s: -0.15)              # moot: the device controls
            armed = [s for _, s in c.of(P.State) if s.mode == P.MODE_ARMED]
            assert len(armed) > 500 and all(s.flags & P.FLAG_ON_DEVICE for s in armed)
            # each STATE's actuator is -K obs of that STATE's own measurement
            # (the device uses its unrounded velocity: within a count/s)
            for s in armed[::25]:
                th = 2 * math.pi * s.pos[0] / CPR
                u = -(k_th * math.sin(th) + k_thd * 2 * math.pi * s.vel[0] / CPR)
                assert s.actuator == pytest.approx(np.clip(u, -0.15, 0.15), abs=abs(k_thd) * 0.01)
            ack = c.request(P.Disarm(), P.Ack)
            assert ack.result == 0
        finally:
            c.close()
        trace = hil.trace()
    on = trace["mode"] == P.MODE_ARMED
    assert on.sum() > 500
    th = trace["x"][on, 0]
    assert abs(th[0]) > 0.1 and np.max(np.abs(th[-200:])) < 0.02   # balanced, upright
    assert not c.of(P.Fault)


def test_run_loop_supervises_on_device_control_then_takes_the_loop_back(tmp_path):
    """``run_loop(on_device=True)`` (``grpo-ctrl run --on-device``): the device's
    LQR balances, the host arms, logs and disarms; a host-mode run that follows
    on the same device switches control back to the host by itself."""
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    from grpo_ctrl.baselines.lqr import design
    from grpo_ctrl.errors import UserError
    from grpo_ctrl.firmware_bridge.host import run_loop
    from grpo_ctrl.firmware_bridge.telemetry import read_telemetry

    quiet = dict(print_fn=lambda *_: None, plot=False)
    with serve_hil(HilConfig(system="pendulum", preset="rig", angle0=0.2)) as hil:
        with pytest.raises(UserError, match="no controller linked"):
            run_loop(hil.port, None, 1.0, None, on_device=True, **quiet)
    k_th, k_thd = design("pendulum", "rig").K[0]
    # held still until armed: how long the handshake takes must not decide the start
    with serve_hil(HilConfig(system="pendulum", preset="rig", angle0=0.2, hold_until_armed=True,
                             device_gains=(0.0, k_th, k_thd), watchdog_ms=100)) as hil:
        s = run_loop(hil.port, None, 2.0, tmp_path / "on.csv", on_device=True, **quiet)
        assert s["ended"] == "completed" and s["disarm_acknowledged"]
        states = [r for r in read_telemetry(tmp_path / "on.csv") if r["kind"] == "state"]
        armed = [r for r in states if r["mode"] == P.MODE_ARMED]
        assert len(armed) > 300 and all(int(r["flags"]) & P.FLAG_ON_DEVICE for r in armed)
        assert abs(armed[-1]["obs"][1]) < 0.02                       # sin th: upright
        policy = Path(__file__).parent / "data" / "pendulum-rig-grpo.onnx"
        s = run_loop(hil.port, policy, 1.0, tmp_path / "host.csv", **quiet)
        assert s["ended"] == "completed"
        armed = [r for r in read_telemetry(tmp_path / "host.csv")
                 if r["kind"] == "state" and r["mode"] == P.MODE_ARMED]
        assert armed and not any(int(r["flags"]) & P.FLAG_ON_DEVICE for r in armed)


class RawHost:
    """The device's pty opened bare (no pyserial: its open flushes the input),
    every frame received kept with its seq."""

    def __init__(self, port):
        import termios
        self.fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        termios.tcflush(self.fd, termios.TCIFLUSH)
        self.decoder, self.seq, self.received = P.Decoder(), 0, []  # (seq, message)

    def send(self, message):
        os.write(self.fd, P.encode(message, self.seq))
        self.seq += 1

    def read_until(self, done, timeout=3.0):
        import select
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            select.select([self.fd], [], [], 0.01)
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            for f in self.decoder.feed(data):
                self.received.append((f.seq, P.decode_message(f)))
            if done():
                return
        raise AssertionError("the device did not answer in time")

    def statuses(self):
        return [(seq, m) for seq, m in self.received if type(m) is P.Status]

    def close(self):
        os.close(self.fd)


def dropped(status):
    return status.tx_dropped_states + status.tx_dropped_replies


def test_every_missed_seq_is_counted_by_a_later_status():
    """The clean-room host's scenario at 200 Hz: the line left unread for 4 s,
    then 10 HEARTBEATs, then everything read. A STATUS counts the frames
    dropped before it was made; a STATE numbered before it may still be
    dropped after it (to make room for the replies behind it), so the rule
    PROTOCOL.md states ("Counters") is: from STATUS A to STATUS B the
    counters grow by at most the seqs missed after the last frame received
    before A's HEARTBEAT was sent, up to B; and from A to a STATUS C asked
    for after B arrived, by at least the seqs missed between A and B. Over the
    whole exchange (the line drained at A and at C) they match exactly."""
    with serve_hil(HilConfig(system="pendulum", preset="rig", angle0=0.1)) as hil:
        host = RawHost(hil.port)
        try:
            host.send(P.Hello())
            host.read_until(lambda: any(type(m) is P.Info for _, m in host.received))
            host.received.clear()                        # the backlog: before this host
            t_end = time.monotonic() + 0.2
            host.read_until(lambda: time.monotonic() > t_end)
            last_read = {}                               # STATUS seq -> the last seq read before its HEARTBEAT
            f_a = host.received[-1][0]
            host.send(P.Heartbeat())
            host.read_until(lambda: len(host.statuses()) == 1)
            (a_seq, a), = host.statuses()
            last_read[a_seq] = f_a
            f_b = host.received[-1][0]
            time.sleep(4.0)                              # nothing read
            for _ in range(10):
                host.send(P.Heartbeat())
            t_end = time.monotonic() + 1.0               # the backlog drains in well under 1 s
            host.read_until(lambda: time.monotonic() > t_end)
            bs = host.statuses()[1:]
            for seq, _ in bs:
                last_read[seq] = f_b
            host.send(P.Heartbeat())
            n = len(host.statuses())
            host.read_until(lambda: len(host.statuses()) > n)
            c_seq, c = host.statuses()[-1]
        finally:
            host.close()
    seqs = sorted({seq for seq, _ in host.received})
    got = set(seqs)

    def missed(after, before):  # seqs in (after, before) never received
        return sum(1 for s in range(after + 1, before) if s not in got)

    assert 1 <= len(bs) <= 10
    if missed(a_seq, bs[-1][0]) == 0:  # Linux 6.18's pty holds ~2.8 s of this stream
        pytest.skip("this pseudo-terminal held all 4 s of STATEs: nothing was dropped")
    short = []
    points = [(a_seq, a)] + bs
    for i, (x_seq, x) in enumerate(points):
        for y_seq, y in points[i + 1:]:
            grew = dropped(y) - dropped(x)
            assert grew <= missed(last_read[x_seq], y_seq), (x_seq, y_seq)
            assert dropped(c) - dropped(x) >= missed(x_seq, y_seq), (x_seq, y_seq)
            short.append(missed(x_seq, y_seq) - grew)
    # version 3's rule (growth A -> B >= seqs missed between them) fails here: the
    # STATEs dropped to make room for B's own reply are numbered before B
    assert max(short) > 0
    assert dropped(c) - dropped(a) == missed(a_seq, c_seq)
