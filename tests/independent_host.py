"""A second host for the serial protocol, written from firmware_bridge/PROTOCOL.md alone.

It imports nothing from grpo_ctrl (standard library and pyserial only): framing,
CRC, COBS, message layouts, handshake, backlog discard, arming, the watchdog and
the disarm are this file's own reading of the spec, so a gap in the spec shows as
a failure here (tests/test_independent_host.py). It closes the loop with a PD law
that holds a pendulum hanging at rest (stable whatever the plant's parameters,
which the spec does not give), and returns what it sent, received and was told.

    python tests/independent_host.py /dev/pts/N --duration 3
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import select
import struct
import sys
import time
import zlib

import serial

VERSION = 3
HELLO, ARM, DISARM, COMMAND, HEARTBEAT, PARAM_GET, PARAM_SET = range(1, 8)
STATE, INFO, ACK, STATUS, FAULT, PARAM = 0x80, 0x81, 0x82, 0x83, 0x84, 0x86
LENGTHS = {INFO: 96, ACK: 7, STATUS: 66, FAULT: 66, PARAM: 7}   # STATE: 24 + 8 n
MAX_CHUNK = 108          # longer runs without a delimiter are an overflow
COUNTERS = ("rx_frames", "rx_crc_errors", "rx_bad_frames", "rx_overflows", "tx_frames",
            "watchdog_trips", "stale_ticks", "late_ticks", "stale_commands",
            "ignored_commands", "tx_dropped_states", "tx_dropped_replies")
DISARMED, ARMED = 0, 1
WATCHDOG_US = 0          # parameter id
FRESH = 1


# ------------------------------------------------------------------ framing
def cobs_encode(data: bytes) -> bytes:
    out, block = bytearray(), bytearray()
    for b in data:
        if b == 0:
            out += bytes([len(block) + 1]) + block
            block.clear()
        else:
            block.append(b)
            if len(block) == 254:
                out += b"\xff" + block
                block.clear()
    return bytes(out + bytes([len(block) + 1]) + block)


def cobs_decode(data: bytes) -> bytes | None:
    out, i = bytearray(), 0
    while i < len(data):
        code = data[i]
        if code == 0 or i + code > len(data):
            return None
        out += data[i + 1:i + code]
        i += code
        if code < 0xFF and i < len(data):
            out.append(0)
    return bytes(out)


def frame(msg_type: int, seq: int, payload: bytes = b"") -> bytes:
    body = struct.pack("<BBI", VERSION, msg_type, seq & 0xFFFFFFFF) + payload
    return cobs_encode(body + struct.pack("<I", zlib.crc32(body))) + b"\x00"


def parse(raw: bytes):
    """(type, seq, payload) of a valid device-to-host frame, else None."""
    if len(raw) < 10 or struct.unpack_from("<I", raw, len(raw) - 4)[0] != zlib.crc32(raw[:-4]):
        return None
    version, msg_type, seq = struct.unpack_from("<BBI", raw)
    payload = raw[6:-4]
    if version != VERSION:
        return None
    if msg_type == STATE:
        if len(payload) < 24 or payload[23] > 4 or len(payload) != 24 + 8 * payload[23]:
            return None
    elif LENGTHS.get(msg_type) != len(payload):
        return None
    return msg_type, seq, payload


def decode_state(p: bytes) -> dict:
    t_us, cmd_seq, latency, u, mode, fault, flags, n = struct.unpack_from("<QIIfBBBB", p)
    chans = [struct.unpack_from("<ii", p, 24 + 8 * c) for c in range(n)]
    return dict(t_us=t_us, cmd_seq=cmd_seq, latency_us=latency, u=u, mode=mode, fault=fault,
                flags=flags, pos=[c[0] for c in chans], vel=[c[1] for c in chans])


def decode_info(p: bytes) -> dict:
    (version, system, n, angle_mask, device_id, period_us, u_max, u_limit) = \
        struct.unpack_from("<BBBBIIff", p)
    return dict(version=version, system=system, n_channels=n, angle_mask=angle_mask,
                device_id=device_id, period_us=period_us, u_max=u_max, u_limit=u_limit,
                counts_per_unit=list(struct.unpack_from("<4f", p, 20)),
                watchdog_us=struct.unpack_from("<I", p, 36)[0],
                preset=p[40:56].rstrip(b"\x00").decode("ascii"),
                firmware_version=struct.unpack_from("<H", p, 56)[0],
                controller=p[58], control_source=p[59],
                vel_cutoff_hz=struct.unpack_from("<f", p, 60)[0],
                pos_limit=list(struct.unpack_from("<4f", p, 64)),
                vel_limit=list(struct.unpack_from("<4f", p, 80)))


def decode_status(p: bytes) -> dict:
    mode, fault, t_us, info_t_us = struct.unpack_from("<BBQQ", p)
    return dict(mode=mode, fault=fault, t_us=t_us, info_t_us=info_t_us,
                **dict(zip(COUNTERS, struct.unpack_from("<12I", p, 18))))


def newer(a: int, b: int) -> bool:
    return 1 <= (a - b) % 2**32 <= 2**31 - 1


class ProtocolError(RuntimeError):
    pass


# ------------------------------------------------------------------ the link
class Link:
    """Frames in and out of a serial line; every device seq is counted received or lost."""

    def __init__(self, port: str):
        self.ser = serial.Serial(port, 115200, timeout=0)
        self.fd = self.ser.fileno()
        self.buf = bytearray()
        self.pending = collections.deque()   # decoded frames not yet taken
        self.overflow = False
        self.seq = 0                 # the host's next frame number
        self.sent = 0                # frames written
        self.rejected = 0            # delimited chunks this host's decoder dropped
        self.tracking = False        # counting device seqs (after the handshake's INFO)
        self.expect = None           # next device seq
        self.received = self.lost = 0

    def send(self, msg_type: int, payload: bytes = b"") -> int:
        seq = self.seq
        self.ser.write(frame(msg_type, seq, payload))
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        self.sent += 1
        return seq

    def next_frame(self, timeout: float):
        """The next valid frame, (type, seq, payload), waiting up to ``timeout`` s, else None.
        Frames are counted as they are taken, so those left queued are not yet seen."""
        if not self.pending:
            self.read(timeout)
        if not self.pending:
            return None
        got = self.pending.popleft()
        self.count(got[1])
        return got

    def read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0.0))
        if not ready:
            return
        data = os.read(self.fd, 65536)
        if not data:
            raise ProtocolError("the line was hung up")
        for b in data:
            if b != 0:
                if len(self.buf) >= MAX_CHUNK:
                    self.overflow = True
                else:
                    self.buf.append(b)
                continue
            chunk, overflowed = bytes(self.buf), self.overflow
            self.buf.clear()
            self.overflow = False
            if not chunk and not overflowed:
                continue                                 # an empty frame: a flush
            raw = None if overflowed else cobs_decode(chunk)
            got = parse(raw) if raw is not None else None
            if got is None:
                self.rejected += 1
            else:
                self.pending.append(got)

    def count(self, seq: int) -> None:
        if not self.tracking:
            return
        if self.expect is not None and newer(seq, self.expect - 1):
            self.lost += (seq - self.expect) % 2**32
        self.received += 1
        self.expect = (seq + 1) & 0xFFFFFFFF

    def close(self) -> None:
        self.ser.close()


# ------------------------------------------------------------------ the host
def wrap(angle: float) -> float:
    return (angle + math.pi) % (2 * math.pi) - math.pi


@contextlib.contextmanager
def realtime():
    """SCHED_FIFO for this thread where permitted (root), as a control loop should
    run: a busy machine then cannot hold the host between a STATE and its answer."""
    try:
        before = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5))
    except (AttributeError, OSError):
        before = None
    try:
        yield
    finally:
        if before is not None:
            os.sched_setscheduler(0, *before)


class Host:
    """Handshake, parameters, the closed loop and the disarm over one ``Link``."""

    def __init__(self, port: str, kp_fraction: float = 1.0):
        self.link = Link(port)
        self.kp_fraction = kp_fraction    # full command at 1 rad of error
        self.info = None
        self.states = []                  # (seq, state) received while armed
        self.commands = {}                # host seq -> value sent
        self.answered = 0
        self.faults = []

    def wait(self, want, timeout: float):
        """The first frame that satisfies ``want`` within ``timeout`` s, else None."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = self.link.next_frame(end - time.monotonic())
            if got:
                msg_type, seq, payload = got
                if msg_type == FAULT:
                    self.faults.append(decode_status(payload))
                if want(msg_type, seq, payload):
                    return msg_type, seq, payload
        return None

    def request(self, msg_type, payload, want, attempts=5, timeout=1.0):
        for _ in range(attempts):
            seq = self.link.send(msg_type, payload)
            got = self.wait(lambda t, s, p: want(seq, t, s, p), timeout)
            if got:
                return got
        raise ProtocolError(f"no answer to message type {msg_type} after {attempts} tries")

    def ack(self, msg_type, expect_mode):
        _, _, p = self.request(msg_type, b"",
                               lambda seq, t, s, p: t == ACK and p[0] == msg_type
                               and struct.unpack_from("<I", p, 1)[0] == seq)
        result, mode = p[5], p[6]
        if result != 0 or mode != expect_mode:
            raise ProtocolError(f"message type {msg_type}: result {result}, mode {mode}")

    def handshake(self) -> dict:
        # the backlog: flush what the tty holds, then treat all until INFO as old
        self.link.ser.reset_input_buffer()
        self.link.ser.write(b"\x00")                 # end any partial frame at the device
        _, seq, p = self.request(HELLO, bytes([VERSION]),
                                 lambda seq, t, s, p: t == INFO or (t == ACK and p[0] == HELLO))
        if p[0] == HELLO:                            # an ACK: result 3, another version
            raise ProtocolError(f"device refused protocol version {VERSION} (result {p[5]})")
        info = decode_info(p)
        if info["version"] != VERSION:
            raise ProtocolError(f"device speaks protocol {info['version']}")
        if info["system"] != 0 or info["n_channels"] < 1 or not info["angle_mask"] & 1:
            raise ProtocolError("this host drives a pendulum: channel 0 an angle")
        if not 0 < info["u_limit"] <= info["u_max"]:
            raise ProtocolError(f"u_limit {info['u_limit']} outside (0, u_max {info['u_max']}]")
        if info["control_source"] != 0:
            raise ProtocolError("device is set to on-device control")
        self.info = info
        self.link.tracking = True
        self.link.expect = (seq + 1) & 0xFFFFFFFF
        return info

    def param(self, pid: int, value: float | None = None) -> float:
        if value is None:
            msg, payload = PARAM_GET, struct.pack("<H", pid)
        else:
            msg, payload = PARAM_SET, struct.pack("<Hf", pid, value)
        _, _, p = self.request(msg, payload, lambda seq, t, s, p: t == PARAM
                               and struct.unpack_from("<H", p)[0] == pid)
        if p[2] != 0:
            raise ProtocolError(f"parameter {pid}: result {p[2]}")
        return struct.unpack_from("<f", p, 3)[0]

    def status(self) -> dict:
        _, seq, p = self.request(HEARTBEAT, b"", lambda seq, t, s, p: t == STATUS)
        return dict(decode_status(p), seq=seq)

    def control(self, state: dict) -> float:
        """PD towards hanging at rest (th = pi), clamped to u_limit."""
        cpr = self.info["counts_per_unit"][0]
        err = wrap(2 * math.pi * state["pos"][0] / cpr - math.pi)
        rate = 2 * math.pi * state["vel"][0] / cpr
        u_lim = self.info["u_limit"]
        u = -self.kp_fraction * u_lim * (err + 0.2 * rate)
        return max(-u_lim, min(u_lim, u))

    def command(self, seq: int, state: dict, u: float) -> None:
        host_seq = self.link.send(COMMAND, struct.pack("<fII", u, seq, state["t_us"] & 0xFFFFFFFF))
        self.commands[host_seq] = u

    def run(self, duration: float) -> dict:
        """Arm, answer every armed STATE for ``duration`` s, disarm. No keep-alive:
        a COMMAND answering an old STATE would not feed the watchdog."""
        with realtime():
            return self._run(duration)

    def _run(self, duration: float) -> dict:
        newest = None                                  # (seq, state) last received
        self.ack(ARM, ARMED)
        end = time.monotonic() + duration
        try:
            while time.monotonic() < end:
                got = self.link.next_frame(end - time.monotonic())
                if got is None:
                    continue
                msg_type, seq, payload = got
                if msg_type == FAULT:
                    self.faults.append(decode_status(payload))
                    raise ProtocolError(f"device faulted: fault {payload[1]}")
                if msg_type != STATE:
                    continue
                st = decode_state(payload)
                if st["mode"] != ARMED:         # queued before the ARM took effect, or a fault
                    if st["fault"]:
                        raise ProtocolError(f"device faulted: fault {st['fault']}")
                    continue
                newest = (seq, st)
                self.states.append(newest)
                self.command(seq, st, self.control(st))
                self.answered += 1
        finally:
            self.stop(newest)
        return self.summary()

    def stop(self, newest) -> None:
        """Zero COMMAND answering the newest STATE, then DISARM until acknowledged."""
        if newest:
            self.command(*newest, 0.0)
        self.ack(DISARM, DISARMED)

    def summary(self) -> dict:
        return dict(sent=self.link.sent, received=self.link.received, lost=self.link.lost,
                    rejected=self.link.rejected, answered=self.answered, faults=self.faults)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("port")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--watchdog-ms", type=float, default=None,
                    help="set the device watchdog before arming (default: the device's)")
    args = ap.parse_args(argv)
    host = Host(args.port)
    out = {}
    try:
        out["info"] = host.handshake()
        if args.watchdog_ms is not None:
            out["watchdog_us"] = host.param(WATCHDOG_US, round(args.watchdog_ms * 1000))
        out["status_before"] = host.status()
        out.update(host.run(args.duration))
        out["status_after"] = host.status()
        out["ok"] = True
    except ProtocolError as e:
        out.update(host.summary(), ok=False, error=str(e))
    finally:
        host.link.close()
    json.dump(out, sys.stdout)
    print()
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
