"""The firmware core (firmware/fw_core.c) on a fake board: a clock, encoder
counts and a serial line that the test controls tick by tick, through the
same cffi extension the HIL uses. Each test pins one rule of PROTOCOL.md's
"Device behaviour", with the device's own frames decoded by the host codec."""
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from grpo_ctrl.firmware_bridge import protocol as P
from grpo_ctrl.firmware_bridge._firmware import ffi, lib

PERIOD = 5000
U_MAX = 0.15
CPR = 2048.0


class FakeBoard:
    """fw_device with Python hardware: ``t`` (us), ``counts``, the bytes the
    core wrote (``line``), the actuator values written, and a line that takes
    ``room`` bytes at most (None: unlimited)."""

    def __init__(self, watchdog_us=0, cutoff=0.0, room=None, controller=None, system=0,
                 channels=1, angle_mask=1, cpr=(CPR, 0, 0, 0)):
        self.t, self.counts, self.room = 1000, [0, 0, 0, 0], room
        self.line, self.actuator, self.obs_seen = bytearray(), [], []
        self.seq, self.decoder = 0, P.Decoder()
        self._controller = controller
        cbs = self._callbacks = {
            "micros": ffi.callback("uint64_t(void *)", lambda ctx: self.t),
            "read_sensors": ffi.callback("void(void *, int32_t *)", self._read),
            "write_actuator": ffi.callback("void(void *, float)",
                                           lambda ctx, u: self.actuator.append(u)),
            "serial_write": ffi.callback("void(void *, const uint8_t *, size_t)", self._write),
            "serial_room": ffi.callback("size_t(void *)", self._room),
            "controller": ffi.callback("int(void *, const float *, float *)", self._control),
        }
        hw = ffi.new("fw_hw *")
        for name in ("micros", "read_sensors", "write_actuator", "serial_write"):
            setattr(hw, name, cbs[name])
        hw.serial_room = cbs["serial_room"] if room is not None else ffi.NULL
        hw.controller = cbs["controller"] if controller is not None else ffi.NULL
        cfg = ffi.new("fw_config *")
        cfg.system, cfg.n_channels, cfg.angle_mask = system, channels, angle_mask
        cfg.device_id, cfg.period_us, cfg.u_max = 7, PERIOD, U_MAX
        for c in range(4):
            cfg.counts_per_unit[c] = cpr[c]
        cfg.watchdog_us, cfg.vel_cutoff_hz = watchdog_us, cutoff
        cfg.preset = b"rig"
        self.dev = ffi.new("fw_device *")
        lib.fw_init(self.dev, cfg, hw)

    def _read(self, ctx, counts):
        for c in range(4):
            counts[c] = self.counts[c]

    def _write(self, ctx, data, n):
        assert self.room is None or n <= self.room, "wrote more than the line had room for"
        self.line += ffi.buffer(data, n)[:]
        if self.room is not None:
            self.room -= n

    def _room(self, ctx):
        return self.room

    def _control(self, ctx, obs, action):
        o = [obs[i] for i in range(6)]
        self.obs_seen.append(o)
        u = self._controller(o)
        if u is None:
            return 1
        action[0] = u
        return 0

    # ---------------------------------------------------------------- host side
    def send(self, message, seq=None):
        if seq is None:
            seq, self.seq = self.seq, self.seq + 1
        wire = P.encode(message, seq)
        lib.fw_receive(self.dev, wire, len(wire))
        return seq

    def tick(self, n=1, dt=PERIOD):
        """``n`` ticks ``dt`` apart, each on time."""
        for _ in range(n):
            self.t += dt
            lib.fw_tick(self.dev, self.t % 2**32)

    def late_tick(self, due, late):
        """A tick due at ``due`` that the back-end runs ``late`` us after it
        (the HIL's thread stalled)."""
        self.t = due + late
        lib.fw_tick(self.dev, due % 2**32)

    def frames(self):
        """(seq, message) of everything the device wrote since the last call."""
        out = [(f.seq, P.decode_message(f)) for f in self.decoder.feed(bytes(self.line))]
        self.line.clear()
        return out

    def of(self, kind, frames):
        return [m for _, m in frames if type(m) is kind]

    def request(self, message, kind):
        self.send(message)
        (reply,) = self.of(kind, self.frames())
        return reply

    def last_state(self):
        return self.of(P.State, self.frames())[-1]

    def arm(self):
        assert self.request(P.Arm(), P.Ack).result == 0

    def answer(self, u, state=None):
        """A COMMAND answering the newest STATE (or ``state``)."""
        if state is None:
            (state,) = self.of(P.State, self.frames())[-1:]
        return self.send(P.Command(u, 0, state.t_us))


def param_set(board, name, value):
    return board.request(P.ParamSet(P.PARAMS[name], value), P.Param)


# ---------------------------------------------------------------- commands
def test_only_a_newer_command_applies_and_feeds_the_watchdog():
    b = FakeBoard(watchdog_us=4 * PERIOD)
    b.arm()
    b.tick()
    b.answer(0.1)
    b.tick()
    (answered,) = b.of(P.State, b.frames())
    stuck = P.encode(P.Command(0.12, 0, answered.t_us), 100)  # a host re-sending one frame
    lib.fw_receive(b.dev, stuck, len(stuck))             # new the first time
    b.tick()
    lib.fw_receive(b.dev, stuck, len(stuck))             # then a duplicate
    b.tick()
    b.send(P.Command(-0.1, 0, answered.t_us), seq=99)      # backwards
    b.tick()
    lib.fw_receive(b.dev, stuck, len(stuck))
    b.tick(2)            # 4 periods, then 5, after the STATE the last new one answers
    states = b.of(P.State, b.frames())
    assert [s.actuator for s in states] == pytest.approx([0.12, 0.12, 0.12, 0.12, 0])
    assert [s.mode for s in states][-2:] == [P.MODE_ARMED, P.MODE_FAULT]
    status = b.request(P.Heartbeat(), P.Status)
    assert P.FAULTS[status.fault] == "watchdog"          # duplicates did not feed it
    assert status.stale_commands == 3 and status.watchdog_trips == 1


@pytest.mark.parametrize("late_state, late_tick", [(2760, 430), (2000, 3800)])
def test_a_late_tick_and_a_late_command_do_not_trip_the_watchdog(late_state, late_tick):
    """Issue 10's two traces (demo under disk load, 50 ms period) at 1/10
    scale: the command answering STATE k-1 came in time; tick k ran
    ``late_state`` late (the HIL's thread stalled), the host's answer to it
    was slow too, and tick k+1 (``late_tick`` late) ran before it arrived.
    The information in effect at tick k+1 is STATE k-1's, two periods old at
    that tick's due time: within the two-period watchdog. Counted from the
    command's arrival (protocol version 2) this tripped."""
    b = FakeBoard()                                      # watchdog: two periods
    b.arm()
    due = b.t + PERIOD
    b.late_tick(due, 0)                                  # STATE k-1, on time
    b.t += 100
    b.answer(0.05)
    b.late_tick(due + PERIOD, late_state)                # STATE k, late
    b.late_tick(due + 2 * PERIOD, late_tick)             # before the answer to k came
    states = b.of(P.State, b.frames())
    b.answer(0.06, state=states[0])                      # the answer to k, late
    b.late_tick(due + 3 * PERIOD, 0)
    states += b.of(P.State, b.frames())
    assert [s.mode for s in states] == [P.MODE_ARMED] * 3
    assert [s.actuator for s in states] == pytest.approx([0.05, 0.05, 0.06])
    status = b.request(P.Heartbeat(), P.Status)
    assert status.watchdog_trips == 0 and status.late_ticks == 0
    # the watchdog counts from the time of the STATE the command answers
    assert status.info_t_us == due + PERIOD + late_state


def test_a_wrong_due_time_forgives_at_most_the_watchdog():
    """A back-end whose schedule is stuck (it passes the same due time every
    tick) and a host gone silent: the device forgives itself at most
    watchdog_us of lateness, so it trips 5 periods after the answered STATE
    (at most twice the watchdog and a period) instead of never; with the
    right due times it trips at the third tick."""
    b = FakeBoard()                                      # watchdog: two periods
    b.arm()
    b.tick()
    b.answer(0.1)
    stuck = b.t
    for _ in range(5):
        b.t += PERIOD
        lib.fw_tick(b.dev, stuck)
    modes = [s.mode for s in b.of(P.State, b.frames())]
    assert modes == [P.MODE_ARMED] * 4 + [P.MODE_FAULT]


def test_commands_answering_old_states_do_not_keep_the_device_armed():
    """A host working through a backlog: a new command every period, each
    answering a STATE three periods old. Under protocol version 2 every
    one fed the watchdog; now the device trips before acting on one."""
    b = FakeBoard()                                      # watchdog: two periods
    b.arm()
    b.tick(3)
    backlog = b.of(P.State, b.frames())
    for _ in range(5):
        b.answer(0.1, state=backlog.pop(0))
        b.tick()
        backlog += b.of(P.State, b.frames())
    modes = [s.mode for s in backlog]
    assert modes[0] == P.MODE_FAULT and P.FAULTS[backlog[0].fault] == "watchdog"
    assert b.actuator[-1] == 0 and 0.1 not in b.actuator[:-1]  # never applied
    # one answering the newest STATE, two periods old at the next tick, holds
    assert b.request(P.Disarm(), P.Ack).result == 0
    b.arm()
    b.tick()
    b.answer(0.1)
    b.tick(2)
    assert [s.mode for s in b.of(P.State, b.frames())] == [P.MODE_ARMED, P.MODE_ARMED]
    b.tick()
    assert b.last_state().mode == P.MODE_FAULT


def test_a_command_answering_no_state_is_stale():
    """A COMMAND that echoes a time after the device's newest STATE (or
    comes before any STATE) answers nothing the device sent: counted stale,
    neither applied nor feeding the watchdog."""
    b = FakeBoard(watchdog_us=4 * PERIOD)
    b.arm()
    b.send(P.Command(0.1, 0, b.t))                       # no STATE yet
    b.tick()
    newest = b.last_state()
    b.send(P.Command(0.1, 0, newest.t_us + 1))           # after the newest STATE
    b.send(P.Command(0.1, 0, newest.t_us - 2 ** 31 - 1)) # as far after it, modulo 2^32
    b.tick()
    assert b.last_state().actuator == 0
    assert b.request(P.Heartbeat(), P.Status).stale_commands == 3
    b.send(P.Command(0.1, 0, newest.t_us))               # answering it
    b.tick()
    assert b.last_state().actuator == pytest.approx(0.1)


HALF = 2**31


def armed_board_at(t_us):
    """A board armed and ticked once at device time ``t_us`` (64 bits), and
    that STATE."""
    b = FakeBoard(watchdog_us=4 * PERIOD)
    b.t = t_us - PERIOD
    b.arm()
    b.tick()
    return b, b.last_state()


@pytest.mark.parametrize("uptime", [5 * 2**32 + 7_000_000, 5 * 2**32 - 20_000, HALF + 3_000_000],
                         ids=["hours", "low-bits-about-to-wrap", "just-over-2^31"])
def test_an_echoed_time_2_31_minus_50_ms_old_is_placed_in_64_bits(uptime):
    """The clean-room host's case on a device up long enough: a COMMAND echoing
    (the low 32 bits of) a time 2^31 us - 50 ms before the newest STATE answers
    that STATE; the watchdog trips at the next tick and the FAULT's 64-bit
    ``info_t_us`` is that time: the newest STATE's t_us minus the echoed age,
    high bits included (version 3 of the firmware extended it against the
    FAULT's own time: before start-up on a device up 8 s)."""
    b, newest = armed_board_at(uptime)
    age = HALF - 50_000
    expected = newest.t_us - age                          # an independent 64-bit reference
    assert expected >= 0 and expected % 2**32 == (newest.t_us - age) % 2**32
    b.send(P.Command(0.1, 0, (newest.t_us - age) % 2**32))
    b.tick()
    frames = b.frames()
    (fault,) = b.of(P.Fault, frames)
    assert P.FAULTS[fault.fault] == "watchdog" and fault.info_t_us == expected
    assert b.request(P.Heartbeat(), P.Status).info_t_us == expected
    assert b.of(P.State, frames)[-1].actuator == 0


def test_echoed_times_at_the_2_31_boundary():
    """2^31 - 1 us before the newest STATE answers it (the FAULT names that
    time in 64 bits); 2^31 before is as far after it, modulo 2^32: stale."""
    b, newest = armed_board_at(3 * 2**32 + 1_234_567)
    b.send(P.Command(0.1, 0, (newest.t_us - HALF) % 2**32))
    b.tick()
    assert b.of(P.Fault, b.frames()) == []
    assert b.request(P.Heartbeat(), P.Status).stale_commands == 1
    b, newest = armed_board_at(3 * 2**32 + 1_234_567)
    b.send(P.Command(0.1, 0, (newest.t_us - (HALF - 1)) % 2**32))
    b.tick()
    frames = b.frames()
    (fault,) = b.of(P.Fault, frames)                      # never taken for information to come
    assert fault.info_t_us == newest.t_us - (HALF - 1)
    assert [s.actuator for s in b.of(P.State, frames)] == [0]
    assert b.request(P.Heartbeat(), P.Status).stale_commands == 0


def test_an_echoed_time_before_start_up_answers_no_state():
    """A device up 8 s: an echoed time 2^31 - 50 ms before its newest STATE
    would lie before start-up, so it answers no STATE the device sent:
    stale, no FAULT, the watchdog still counts from the ARM; time 0 itself
    (start-up) is the earliest a command may echo."""
    b, newest = armed_board_at(7_985_647)
    armed_at = b.request(P.Heartbeat(), P.Status).info_t_us
    assert 0 < armed_at <= newest.t_us
    b.send(P.Command(0.1, 0, (newest.t_us - (HALF - 50_000)) % 2**32))
    b.send(P.Command(0.1, 0, 2**32 - 1))                  # 1 us before start-up
    b.tick()
    assert b.of(P.Fault, b.frames()) == []
    status = b.request(P.Heartbeat(), P.Status)
    assert status.stale_commands == 2 and status.mode == P.MODE_ARMED
    assert status.info_t_us == armed_at
    b.send(P.Command(0.1, 0, 0))                          # start-up: answers the first STATE's era
    b.tick()
    (fault,) = b.of(P.Fault, b.frames())
    assert fault.info_t_us == 0 and P.FAULTS[fault.fault] == "watchdog"


def test_status_before_any_arm_reports_info_time_zero():
    b = FakeBoard()
    b.tick(3)
    assert b.request(P.Heartbeat(), P.Status).info_t_us == 0


def test_command_seq_is_compared_modulo_2_32_and_restarts_at_arming():
    b = FakeBoard(watchdog_us=100000)
    b.arm()
    b.tick()
    b.send(P.Command(0.01, 0, 0), seq=0xFFFFFFFF)
    b.send(P.Command(0.02, 0, 0), seq=0)                 # newer across the wrap
    b.tick()
    assert b.last_state().actuator == pytest.approx(0.02)
    b.send(P.Command(0.03, 0, 0), seq=0x80000000)        # 2^31 ahead: ambiguous, refused
    b.tick()
    assert b.last_state().actuator == pytest.approx(0.02)
    assert b.request(P.Disarm(), P.Ack).result == 0
    b.arm()                                              # a new host may start anywhere
    b.send(P.Command(0.04, 0, 0), seq=5)
    b.tick()
    assert b.last_state().actuator == pytest.approx(0.04)
    assert b.request(P.Heartbeat(), P.Status).stale_commands == 1


def test_commands_while_disarmed_are_counted_and_ignored():
    b = FakeBoard()
    b.tick()
    b.answer(0.1)
    b.tick()
    assert b.last_state().actuator == 0
    assert b.request(P.Heartbeat(), P.Status).ignored_commands == 1


def test_lowering_u_limit_while_armed_reclamps_the_command_in_effect_at_once():
    b = FakeBoard(watchdog_us=100000)
    b.arm()
    b.tick()
    b.answer(0.15)
    b.tick()
    assert b.last_state().actuator == pytest.approx(0.15)
    b.actuator.clear()
    q = param_set(b, "u_limit", 0.01)
    assert (q.result, q.value) == (0, pytest.approx(0.01))
    assert b.actuator == [pytest.approx(0.01)]           # before the next tick
    b.tick()
    s = b.last_state()
    assert s.actuator == pytest.approx(0.01) and s.flags & P.FLAG_CLAMPED


def test_latency_is_exact_for_a_command_answering_an_old_state():
    b = FakeBoard(watchdog_us=1000000)
    b.arm()
    b.tick()
    old = b.of(P.State, b.frames())[0]
    b.tick(20)                                           # 20 periods later ...
    b.t += 1234                                          # ... and 1.234 ms into the next
    b.answer(0.0, state=old)
    b.tick()
    assert b.last_state().latency_us == 20 * PERIOD + 1234
    b.tick()
    assert b.last_state().latency_us == P.LATENCY_UNKNOWN  # none this period


# ---------------------------------------------------------------- INFO, HELLO, parameters
def test_info_reports_the_hardware_limit_and_the_settings_apart():
    b = FakeBoard(cutoff=20.0)
    assert param_set(b, "u_limit", 0.05).result == 0
    assert param_set(b, "vel_limit0", 9779.5).result == 0
    assert param_set(b, "pos_limit0", 4096).result == 0
    info = b.request(P.Hello(), P.Info)
    assert info.protocol_version == P.VERSION == 3
    assert info.u_max == pytest.approx(U_MAX) and info.u_limit == pytest.approx(0.05)
    assert info.vel_limit[0] == 9779.5 and info.pos_limit[0] == 4096
    assert info.vel_cutoff_hz == 20.0 and info.watchdog_us == 2 * PERIOD
    assert (info.controller, info.control_source) == (0, P.CONTROL_HOST)


def test_hello_of_another_version_is_answered_bad_request():
    b = FakeBoard()
    ack = b.request(P.Hello(version=1), P.Ack)
    assert (ack.acked_type, P.RESULTS[ack.result]) == (P.Hello.TYPE, "bad request")


def test_watchdog_parameter_bounds():
    b = FakeBoard()
    assert P.RESULTS[param_set(b, "watchdog_us", PERIOD).result] == "out of range"  # 1 period
    assert param_set(b, "watchdog_us", 2 * PERIOD).result == 0
    assert P.RESULTS[param_set(b, "watchdog_us", 20000.5).result] == "bad request"
    assert P.RESULTS[param_set(b, "watchdog_us", 10e6 + 1).result] == "out of range"
    q = param_set(b, "watchdog_us", 10e6)
    assert (q.result, q.value) == (0, 10e6)
    # a configuration below two periods is raised to two periods
    assert FakeBoard(watchdog_us=PERIOD).request(P.Hello(), P.Info).watchdog_us == 2 * PERIOD


def test_parameter_rules_the_spec_states():
    """PROTOCOL.md's Parameters: a watchdog both fractional and out of range is
    a bad request; limits are any finite value >= 0; a channel the device does
    not have (one channel here) keeps its limits; "rw while not armed" is
    settable in the fault mode and refused (7) only while armed."""
    b = FakeBoard()
    assert P.RESULTS[param_set(b, "watchdog_us", 10.5).result] == "bad request"
    assert P.RESULTS[param_set(b, "watchdog_us", -0.5).result] == "bad request"
    for name in ("pos_limit3", "vel_limit3"):
        assert P.RESULTS[param_set(b, name, -1.0).result] == "out of range"
        assert P.RESULTS[param_set(b, name, float("inf")).result] == "out of range"
        q = param_set(b, name, 1e30)
        assert (q.result, q.value) == (0, pytest.approx(1e30))
    info = b.request(P.Hello(), P.Info)
    assert info.n_channels == 1 and info.pos_limit[3] == pytest.approx(1e30)
    # into the fault mode (the watchdog), then the safety settings
    b.arm()
    b.tick(4)
    assert b.last_state().mode == P.MODE_FAULT
    for name, value in (("watchdog_us", 4 * PERIOD), ("pos_limit0", 100.0),
                        ("vel_limit0", 100.0), ("control_source", 0)):
        assert param_set(b, name, value).result == 0
    assert b.request(P.Disarm(), P.Ack).result == 0
    b.arm()
    assert P.RESULTS[param_set(b, "pos_limit0", 5.0).result] == "not while armed"
    assert param_set(b, "u_limit", 0.1).result == 0      # rw at any time


def test_arm_while_armed_keeps_the_command_seq():
    """ARM while armed changes nothing: an older COMMAND after it is still
    stale; DISARM and a fresh ARM forget the seq."""
    b = FakeBoard(watchdog_us=100000)
    b.arm()
    b.tick()
    b.send(P.Command(0.01, 0, 0), seq=50)
    b.arm()
    b.send(P.Command(0.02, 0, 0), seq=10)
    b.tick()
    assert b.last_state().actuator == pytest.approx(0.01)
    assert b.request(P.Heartbeat(), P.Status).stale_commands == 1
    assert b.request(P.Disarm(), P.Ack).result == 0
    b.arm()
    b.tick()
    b.send(P.Command(0.03, 0, 0), seq=10)
    b.tick()
    assert b.last_state().actuator == pytest.approx(0.03)


def test_fresh_keys_on_the_state_seq_alone():
    """FRESH: the command taken at a tick was accepted since the previous
    tick and names the previous tick's STATE by seq; the echoed time only
    decides acceptance (and the watchdog)."""
    b = FakeBoard(watchdog_us=100000)
    b.arm()
    b.tick(3)
    frames = b.frames()
    (old_seq, old), (new_seq, new) = [(q, m) for q, m in frames if type(m) is P.State][-2:]
    b.send(P.Command(0.01, old_seq, new.t_us))              # wrong seq, right time
    b.tick()
    (seq, state), = [(q, m) for q, m in b.frames() if type(m) is P.State]
    assert not state.flags & P.FLAG_FRESH and state.actuator == pytest.approx(0.01)
    b.send(P.Command(0.02, seq, old.t_us))                  # right seq, an older time
    b.tick()
    state = b.last_state()
    assert state.flags & P.FLAG_FRESH and state.actuator == pytest.approx(0.02)
    b.tick()                                                # holding it: not fresh
    state = b.last_state()
    assert not state.flags & P.FLAG_FRESH and state.actuator == pytest.approx(0.02)


def test_a_device_to_host_type_sent_to_the_device_is_a_bad_frame():
    b = FakeBoard()
    echo = P.encode(P.State(1, 2, 3, 0.0, 0, 0, 0, (1,), (2,)), 0)
    lib.fw_receive(b.dev, echo, len(echo))
    s = b.request(P.Heartbeat(), P.Status)
    assert (s.rx_frames, s.rx_bad_frames) == (1, 1)       # the heartbeat alone is valid


# ---------------------------------------------------------------- sensing
def test_velocity_across_an_encoder_wrap_and_the_filter_coefficient():
    b = FakeBoard()                                       # no filter: raw differences
    b.counts[0] = 2**31 - 5
    b.tick()
    b.counts[0] = -(2**31) + 5                            # +10 counts across the wrap
    b.tick()
    assert b.last_state().vel[0] == 10 * 1e6 / PERIOD
    fc = 20.0
    b = FakeBoard(cutoff=fc)
    b.tick()
    b.counts[0] = 100
    b.tick()
    alpha = 1 - math.exp(-2 * math.pi * fc * PERIOD * 1e-6)
    assert b.last_state().vel[0] == round(alpha * 100 * 1e6 / PERIOD)


def test_two_ticks_close_together_do_not_jolt_the_velocity():
    """After a stall the back-end may tick twice within microseconds: one
    count over 50 us is 20 000 counts/s raw, and must weigh in with that dt's
    coefficient (a velocity limit tripped on it under load with the nominal one)."""
    fc = 20.0
    b = FakeBoard(cutoff=fc)
    b.tick(3)
    b.counts[0] = 1
    b.tick(dt=50)
    alpha = 1 - math.exp(-2 * math.pi * fc * 50e-6)
    assert b.last_state().vel[0] == round(alpha * 1 / 50e-6)      # 125, not ~9300


# ---------------------------------------------------------------- transmit queue
def test_a_blocked_line_drops_the_oldest_states_never_blocks_and_keeps_replies():
    b = FakeBoard(room=0)
    b.send(P.Hello())                                     # a 108-byte reply, queued
    b.tick(20)                                            # the tick goes on regardless
    assert b.line == b""
    b.room = 10**6
    lib.fw_transmit(b.dev)
    frames = b.frames()
    assert type(frames[0][1]) is P.Info                   # the reply survived
    states = [(seq, m) for seq, m in frames if type(m) is P.State]
    seqs = [seq for seq, _ in states]
    assert seqs == list(range(21 - len(seqs), 21)) and len(seqs) >= 2   # the newest
    st = b.request(P.Heartbeat(), P.Status)
    assert st.tx_dropped_states == 20 - len(seqs) and st.tx_dropped_replies == 0
    # replies that find the queue full of replies are dropped, counted
    b.room = 0
    for _ in range(12):
        b.send(P.Heartbeat())
    b.room = 10**6
    lib.fw_transmit(b.dev)
    got = len(b.of(P.Status, b.frames()))
    assert b.request(P.Heartbeat(), P.Status).tx_dropped_replies == 12 - got > 0


def test_transmit_hands_over_no_more_than_the_room_and_frames_survive_splitting():
    b = FakeBoard(room=0)
    b.send(P.Hello())
    b.tick(3)
    while b.dev.tx_bytes:
        b.room = 7                                        # a UART that frees 7 bytes at a time
        lib.fw_transmit(b.dev)
    kinds = [type(m) for _, m in b.frames()]
    assert kinds[0] is P.Info and kinds.count(P.State) >= 1


# ---------------------------------------------------------------- on-device control
def test_on_device_controller_closes_the_loop_each_tick():
    K = np.array([0.0, 2.0, 0.1])
    b = FakeBoard(watchdog_us=50000, controller=lambda o: float(-K @ np.array(o[:3])))
    assert P.RESULTS[FakeBoard().request(P.ParamSet(P.PARAMS["control_source"], 1),
                                         P.Param).result] == "bad request"  # none linked
    assert param_set(b, "control_source", 1).result == 0
    assert b.request(P.Hello(), P.Info).controller == 1
    b.arm()
    assert P.RESULTS[param_set(b, "control_source", 0).result] == "not while armed"
    b.counts[0] = 20                                       # 20 / 2048 of a turn
    b.tick(2)                                              # at rest there: velocity 0
    th = 2 * math.pi * 20 / CPR
    s = b.last_state()
    assert b.obs_seen[-1][:3] == pytest.approx([math.cos(th), math.sin(th), 0], abs=1e-6)
    u = float(-K @ np.array(b.obs_seen[-1][:3]))
    assert -U_MAX < u < 0 and s.actuator == pytest.approx(u, rel=1e-6)
    assert s.flags & P.FLAG_ON_DEVICE and s.flags & P.FLAG_FRESH
    b.counts[0] = 2048 * 1000 + 20                         # a thousand turns on: same angle
    b.tick(2)
    assert b.obs_seen[-1][:2] == pytest.approx([math.cos(th), math.sin(th)], abs=1e-6)
    b.answer(5.0)                                          # the host's value is moot ...
    b.tick()
    assert b.last_state().actuator != 5.0
    b.tick(10)                                             # ... but it feeds the watchdog
    assert P.FAULTS[b.last_state().fault] == "watchdog"


def test_on_device_controller_failure_faults():
    b = FakeBoard(controller=lambda o: None)
    assert param_set(b, "control_source", 1).result == 0
    b.arm()
    b.tick()
    assert P.FAULTS[b.last_state().fault] == "bad command" and b.actuator[-1] == 0
    b = FakeBoard(controller=lambda o: float("nan"))
    param_set(b, "control_source", 1)
    b.arm()
    b.tick()
    assert P.FAULTS[b.last_state().fault] == "bad command"


# ---------------------------------------------------------------- fuzzing
FIRMWARE = Path(__file__).resolve().parent.parent / "firmware_bridge" / "firmware"
SOURCES = [str(FIRMWARE / n) for n in ("fuzz_fw.c", "fw_core.c", "proto.c")]


def test_core_fuzzed_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    """Random scripts of raw bytes, valid host frames, ticks, encoder jumps
    across the int32 wrap and line room, with the core's safety invariants
    checked after every step (fuzz_fw.c). 2 x 10^6 script bytes here;
    benchmarks/fuzz_protocol.py runs 10^7 and more."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler is needed"
    exe = tmp_path / "fuzz_fw"
    subprocess.run([cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-g", "-O1",
                    "-fsanitize=address,undefined", "-fno-sanitize-recover=all", *SOURCES,
                    "-lm", "-o", str(exe)], check=True)
    for seed in (1, 2):
        r = subprocess.run([str(exe), "1000000", str(seed)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        stats = {k: int(v) for k, v in (kv.split("=") for kv in r.stdout.split())}
        assert stats["bytes"] >= 1_000_000 and stats["rx_frames"] > 5000 and stats["ticks"] > 10000
        assert stats["tx_dropped"] > 0 and stats["ended_fault"] > 0   # those paths were reached


def test_core_under_libfuzzer(tmp_path):
    """The same harness as a libFuzzer target (clang), for a short bounded run."""
    clang = shutil.which("clang")
    if clang is None:
        pytest.skip("clang is not installed: apt-get install -y clang libclang-rt-14-dev")
    exe = tmp_path / "fuzz_fw_libfuzzer"
    r = subprocess.run([clang, "-std=c99", "-g", "-O1", "-DFUZZ_LIBFUZZER",
                        "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all",
                        *SOURCES, "-lm", "-o", str(exe)], capture_output=True, text=True)
    if r.returncode != 0 and "libclang_rt.fuzzer" in r.stderr + r.stdout:
        pytest.skip("clang has no libFuzzer runtime: apt-get install -y libclang-rt-14-dev")
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe), "-runs=20000", "-seed=1", "-max_len=2048"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Done 20000 runs" in r.stderr


@pytest.mark.parametrize("system", P.SYSTEMS)
def test_the_device_observes_as_the_host_does(system):
    """fw_core.c's observation (what an on-device controller gets) against the
    host's (observation.Features, the simulator's own observation function) for
    the same counts and velocities, on every plant: its layout in the firmware
    is a second statement of the plant's, so it is pinned here."""
    from grpo_ctrl.firmware_bridge.observation import Features
    from grpo_ctrl.plant import plant_spec

    spec = plant_spec(system)
    channels = len(spec.channels)
    mask = sum(spec.angles[pos] << c for c, (pos, _) in enumerate(spec.channels))
    cpr = [4096.0 if mask >> c & 1 else 10000.0 for c in range(channels)]
    b = FakeBoard(system=P.SYSTEMS.index(system), channels=channels, angle_mask=mask,
                  cpr=tuple(cpr + [0.0] * (4 - channels)), controller=lambda o: 0.0,
                  watchdog_us=10**6)
    features = Features(b.request(P.Hello(), P.Info))
    param_set(b, "control_source", 1)
    b.arm()
    rng = np.random.default_rng(3)
    for _ in range(20):
        b.tick()
        b.counts[:channels] = [int(v) for v in rng.integers(-6000, 6000, channels)]
        b.tick()                                           # velocity: the step over one period
        state = b.last_state()
        device = np.array(b.obs_seen[-1][:len(features.obs_names)])
        np.testing.assert_allclose(device, features(state), rtol=2e-6, atol=2e-6)


CROSS = {"avr (16-bit int)": ("avr-gcc", ["-mmcu=atmega328p"], "gcc-avr avr-libc"),
         "cortex-m4f": ("arm-none-eabi-gcc", ["-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard",
                                              "-mfpu=fpv4-sp-d16", "-Wdouble-promotion"],
                        "gcc-arm-none-eabi")}


@pytest.mark.parametrize("target", CROSS)
def test_core_and_codec_compile_warning_free_for_the_boards(target, tmp_path):
    """proto.c and fw_core.c with the boards' cross compilers, -Wconversion
    and -Werror included (the unsigned shifts matter with AVR's 16-bit int)."""
    cc, flags, packages = CROSS[target]
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed: apt-get install -y {packages}")
    for name in ("proto.c", "fw_core.c"):
        r = subprocess.run([cc, "-std=c99", "-Os", "-Wall", "-Wextra", "-Wpedantic", "-Wconversion",
                            "-Werror", *flags, "-c", str(FIRMWARE / name), "-o",
                            str(tmp_path / (name + ".o"))], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
