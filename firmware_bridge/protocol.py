"""The wire protocol in Python: the host's half of ``PROTOCOL.md``.

A frame is ``version u8 | type u8 | seq u32 | payload | crc32 u32``
(little-endian, CRC-32 as ``zlib.crc32`` over everything before it),
COBS-encoded and ended by one 0x00 byte. The device's C codec
(``firmware/proto.c``) implements the same document; the test vectors in it
pin both.

>>> wire = encode(Command(u=0.05, state_seq=7, state_t_us=35000), seq=3)
>>> decoder = Decoder(accept=FROM_HOST)  # as the device decodes
>>> [decode_message(f) for f in decoder.feed(wire)]
[Command(u=0.05000000074505806, state_seq=7, state_t_us=35000)]
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import astuple, dataclass, field
from typing import ClassVar

from grpo_ctrl.plant import systems

VERSION = 3
MAX_CHANNELS = 4
MAX_PAYLOAD = 96
HEADER = struct.Struct("<BBI")
CRC = struct.Struct("<I")
MAX_RAW = HEADER.size + MAX_PAYLOAD + CRC.size
MAX_WIRE = MAX_RAW + MAX_RAW // 254 + 2

MODES = {0: "disarmed", 1: "armed", 2: "fault"}
MODE_DISARMED, MODE_ARMED, MODE_FAULT = 0, 1, 2
FAULTS = {0: "none", 1: "watchdog", 2: "position limit", 3: "velocity limit", 4: "bad command"}
FLAG_FRESH, FLAG_CLAMPED, FLAG_LATE, FLAG_HELD, FLAG_ON_DEVICE = 1, 2, 4, 8, 16
CONTROL_HOST, CONTROL_ON_DEVICE = 0, 1
RESULTS = {0: "ok", 1: "fault active (disarm first)", 2: "a limit is exceeded", 3: "bad request",
           4: "unknown parameter", 5: "read-only", 6: "out of range", 7: "not while armed"}
PARAMS = {"watchdog_us": 0, "u_limit": 1,
          **{f"pos_limit{c}": 2 + c for c in range(MAX_CHANNELS)},
          **{f"vel_limit{c}": 6 + c for c in range(MAX_CHANNELS)},
          "vel_cutoff_hz": 10, "period_us": 11, "device_id": 12, "control_source": 13}
LATENCY_UNKNOWN = 0xFFFFFFFF
# a decoder's accepted directions (a host takes device frames only, a device host frames only)
FROM_HOST, FROM_DEVICE, FROM_EITHER = 1, 2, 3
SYSTEMS = tuple(systems())  # the plant ids the C plant layer numbers (csrc/pendsim.h)


class ProtocolError(ValueError):
    """A frame or payload that does not follow PROTOCOL.md."""


# ---------------------------------------------------------------- CRC and COBS
def crc32(data: bytes) -> int:
    """CRC-32/ISO-HDLC (check value 0xCBF43926 for b"123456789")."""
    return zlib.crc32(data) & 0xFFFFFFFF


def cobs_encode(data: bytes) -> bytes:
    """Consistent Overhead Byte Stuffing, without the trailing delimiter.
    (A run of 254 non-zero bytes is followed by an empty block, as in the C
    encoder; frames are far shorter than that.)"""
    out = bytearray()
    for block in data.split(b"\x00"):
        while len(block) >= 254:
            out += b"\xff" + block[:254]
            block = block[254:]
        out += bytes([len(block) + 1]) + block
    return bytes(out)


def cobs_decode(data: bytes) -> bytes:
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        code = data[i]
        block = data[i + 1:i + code]
        if code == 0 or len(block) != code - 1 or 0 in block:
            raise ProtocolError("invalid COBS block")
        out += block
        i += code
        if code != 0xFF and i < n:
            out.append(0)
    return bytes(out)


# ---------------------------------------------------------------- messages
@dataclass
class Message:
    TYPE: ClassVar[int]
    FORMAT: ClassVar[struct.Struct]

    def pack(self) -> bytes:
        return self.FORMAT.pack(*astuple(self))

    @classmethod
    def unpack(cls, payload: bytes) -> "Message":
        if len(payload) != cls.FORMAT.size:
            raise ProtocolError(f"{cls.__name__} payload must be {cls.FORMAT.size} bytes, "
                                f"got {len(payload)}")
        return cls(*cls.FORMAT.unpack(payload))


@dataclass
class Hello(Message):
    TYPE, FORMAT = 0x01, struct.Struct("<B")
    version: int = VERSION


@dataclass
class Arm(Message):
    TYPE, FORMAT = 0x02, struct.Struct("<")


@dataclass
class Disarm(Message):
    TYPE, FORMAT = 0x03, struct.Struct("<")


@dataclass
class Command(Message):
    """The actuator value answering the STATE numbered ``state_seq``, whose
    ``t_us`` is echoed (low 32 bits): the device measures the latency from it,
    and its watchdog the age of the information the command acts on."""
    TYPE, FORMAT = 0x04, struct.Struct("<fII")
    u: float
    state_seq: int
    state_t_us: int

    def pack(self) -> bytes:
        return self.FORMAT.pack(self.u, self.state_seq, self.state_t_us & 0xFFFFFFFF)


@dataclass
class Heartbeat(Message):
    TYPE, FORMAT = 0x05, struct.Struct("<")


@dataclass
class ParamGet(Message):
    TYPE, FORMAT = 0x06, struct.Struct("<H")
    id: int


@dataclass
class ParamSet(Message):
    TYPE, FORMAT = 0x07, struct.Struct("<Hf")
    id: int
    value: float


_STATE_FIXED = struct.Struct("<QIIfBBBB")
_CHANNEL = struct.Struct("<ii")


@dataclass
class State(Message):
    """One control tick of the device: time, the command in effect, raw sensors."""
    TYPE = 0x80
    t_us: int
    cmd_seq: int
    latency_us: int          # LATENCY_UNKNOWN: no command accepted this period
    actuator: float
    mode: int
    fault: int
    flags: int
    pos: tuple = ()          # counts, one per channel
    vel: tuple = ()          # counts per second

    def pack(self) -> bytes:
        n = len(self.pos)
        head = _STATE_FIXED.pack(self.t_us, self.cmd_seq, self.latency_us, self.actuator,
                                 self.mode, self.fault, self.flags, n)
        return head + b"".join(_CHANNEL.pack(p, v) for p, v in zip(self.pos, self.vel))

    @classmethod
    def unpack(cls, payload: bytes) -> "State":
        if len(payload) < _STATE_FIXED.size:
            raise ProtocolError("State payload too short")
        *head, n = _STATE_FIXED.unpack_from(payload)
        if n > MAX_CHANNELS or len(payload) != _STATE_FIXED.size + _CHANNEL.size * n:
            raise ProtocolError(f"State payload of {len(payload)} bytes does not hold {n} channels")
        channels = [_CHANNEL.unpack_from(payload, _STATE_FIXED.size + 8 * c) for c in range(n)]
        return cls(*head, pos=tuple(c[0] for c in channels), vel=tuple(c[1] for c in channels))


@dataclass
class Info(Message):
    """The device introduces itself (answer to Hello). The fields new in
    version 2 come last here (with defaults) so that version 1's positional
    order still constructs one; the wire order is PROTOCOL.md's."""
    TYPE, FORMAT = 0x81, struct.Struct("<BBBBIIff4fI16sHBBf4f4f")
    protocol_version: int
    system: int
    n_channels: int
    angle_mask: int
    device_id: int
    period_us: int
    u_max: float             # the hardware limit
    counts_per_unit: tuple
    watchdog_us: int
    preset: str
    firmware_version: int
    u_limit: float | None = None  # the command clamp now (PARAM u_limit); None: u_max
    controller: int = 0           # 1: an on-device controller is linked
    control_source: int = CONTROL_HOST
    vel_cutoff_hz: float = 0.0
    pos_limit: tuple = (0.0,) * MAX_CHANNELS   # counts per channel, 0 = none
    vel_limit: tuple = (0.0,) * MAX_CHANNELS   # counts/s per channel, 0 = none

    def __post_init__(self):
        if self.u_limit is None:
            self.u_limit = self.u_max

    def pack(self) -> bytes:
        return self.FORMAT.pack(self.protocol_version, self.system, self.n_channels,
                                self.angle_mask, self.device_id, self.period_us, self.u_max,
                                self.u_limit, *self.counts_per_unit, self.watchdog_us,
                                self.preset.encode(), self.firmware_version, self.controller,
                                self.control_source, self.vel_cutoff_hz, *self.pos_limit,
                                *self.vel_limit)

    @classmethod
    def unpack(cls, payload: bytes) -> "Info":
        if len(payload) != cls.FORMAT.size:
            raise ProtocolError(f"Info payload must be {cls.FORMAT.size} bytes")
        v = cls.FORMAT.unpack(payload)
        preset = v[13].split(b"\x00", 1)[0].decode("ascii", "replace")
        return cls(*v[:7], tuple(v[8:12]), v[12], preset, v[14], u_limit=v[7],
                   controller=v[15], control_source=v[16], vel_cutoff_hz=v[17],
                   pos_limit=tuple(v[18:22]), vel_limit=tuple(v[22:26]))

    @property
    def system_name(self) -> str:
        return SYSTEMS[self.system] if self.system < len(SYSTEMS) else f"unknown({self.system})"


@dataclass
class Ack(Message):
    TYPE, FORMAT = 0x82, struct.Struct("<BIBB")
    acked_type: int
    acked_seq: int
    result: int
    mode: int


@dataclass
class Status(Message):
    """Mode, fault and error counters (answer to Heartbeat)."""
    TYPE, FORMAT = 0x83, struct.Struct("<BBQQ12I")
    mode: int
    fault: int
    t_us: int
    info_t_us: int    # the watchdog counts from here (PROTOCOL.md, "Watchdog")
    rx_frames: int
    rx_crc_errors: int
    rx_bad_frames: int
    rx_overflows: int
    tx_frames: int
    watchdog_trips: int
    stale_ticks: int
    late_ticks: int
    stale_commands: int = 0      # the counters new in version 2 default to 0
    ignored_commands: int = 0
    tx_dropped_states: int = 0
    tx_dropped_replies: int = 0


@dataclass
class Fault(Status):
    """Sent by the device, unprompted, as it enters the fault mode."""
    TYPE = 0x84


@dataclass
class Param(Message):
    TYPE, FORMAT = 0x86, struct.Struct("<HBf")
    id: int
    result: int
    value: float


MESSAGES = {cls.TYPE: cls for cls in (Hello, Arm, Disarm, Command, Heartbeat, ParamGet, ParamSet,
                                      State, Info, Ack, Status, Fault, Param)}


def direction(type_: int) -> int:
    """FROM_HOST for host-to-device types (below 0x80), else FROM_DEVICE."""
    return FROM_HOST if type_ < 0x80 else FROM_DEVICE


# ---------------------------------------------------------------- frames
@dataclass(frozen=True)
class Frame:
    type: int
    seq: int
    payload: bytes = b""


def encode_frame(type_: int, seq: int, payload: bytes) -> bytes:
    """Wire bytes of one frame: COBS(header, payload, CRC) + 0x00."""
    if len(payload) > MAX_PAYLOAD:
        raise ProtocolError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    raw = HEADER.pack(VERSION, type_, seq & 0xFFFFFFFF) + payload
    return cobs_encode(raw + CRC.pack(crc32(raw))) + b"\x00"


def encode(message: Message, seq: int) -> bytes:
    return encode_frame(message.TYPE, seq, message.pack())


def decode_message(frame: Frame) -> Message:
    return MESSAGES[frame.type].unpack(frame.payload)


@dataclass
class Decoder:
    """Stream decoder: feed it bytes as they come, get the valid frames.

    Anything between two 0x00 delimiters that is not a valid frame (bad COBS,
    wrong CRC, another version, a type unknown or of the other direction
    than ``accept``, wrong length) is dropped and counted; decoding resumes at
    the next delimiter. A host's decoder (the default) takes device-to-host
    types only. ``other_version`` keeps the version byte of the last frame
    dropped for its version alone (CRC good), so a host can name it."""
    accept: int = FROM_DEVICE
    frames: int = 0
    crc_errors: int = 0
    bad_frames: int = 0
    overflows: int = 0
    other_version: int | None = None
    _pending: bytearray = field(default_factory=bytearray)
    _overflow: bool = False

    def feed(self, data: bytes) -> list[Frame]:
        out = []
        chunks = data.split(b"\x00")
        for i, chunk in enumerate(chunks):
            if not self._overflow:
                self._pending += chunk
                if len(self._pending) > MAX_WIRE:  # no frame is that long: skip to the delimiter
                    self._overflow = True
                    self._pending.clear()
            if i == len(chunks) - 1:
                break  # no delimiter yet
            if self._overflow:
                self.overflows += 1
            elif self._pending:
                frame = self._judge(bytes(self._pending))
                if frame is not None:
                    out.append(frame)
            self._pending.clear()
            self._overflow = False
        return out

    def _judge(self, encoded: bytes) -> Frame | None:
        try:
            raw = cobs_decode(encoded)
        except ProtocolError:
            self.bad_frames += 1
            return None
        if not HEADER.size + CRC.size <= len(raw) <= MAX_RAW:
            self.bad_frames += 1
            return None
        body, (crc,) = raw[:-CRC.size], CRC.unpack(raw[-CRC.size:])
        if crc32(body) != crc:
            self.crc_errors += 1
            return None
        version, type_, seq = HEADER.unpack_from(body)
        payload = body[HEADER.size:]
        cls = MESSAGES.get(type_)
        if version != VERSION:
            self.other_version = version
        if (version != VERSION or cls is None or not direction(type_) & self.accept
                or len(payload) > MAX_PAYLOAD):
            self.bad_frames += 1
            return None
        try:
            cls.unpack(payload)  # the length must fit the type
        except ProtocolError:
            self.bad_frames += 1
            return None
        self.frames += 1
        return Frame(type_, seq, payload)
