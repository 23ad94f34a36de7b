"""The host's end of the serial line: a port, the frame decoder, the host's
sequence counter, and the two exchanges every host starts with.

``Link(port)`` opens a device path or any pyserial URL; use it as a context
manager. Transport failures (the device unplugged, the pty closed) surface as
``LinkError`` from ``send`` and ``poll``; the decoder's counters (``crc_errors``,
``bad_frames``) say what the line mangled.
"""
from __future__ import annotations

import os
import select
import time

from grpo_ctrl.errors import UserError
from grpo_ctrl.firmware_bridge import protocol as P

READ_CHUNK = 4096       # a tty's whole read buffer: one read takes all that is there


class LinkError(OSError):
    """The serial line failed (device gone, port closed)."""


class Link:
    """A serial port, the frame decoder and the host's sequence counter."""

    def __init__(self, port: str, baudrate: int = 1_000_000):
        import serial

        self._serial_errors = (serial.SerialException, OSError)
        try:
            self.ser = serial.serial_for_url(port, baudrate=baudrate, timeout=0, write_timeout=0.5)
        except (serial.SerialException, OSError, ValueError) as e:
            raise UserError(f"cannot open {port!r}: {e}; check the device path (or start "
                            "`grpo-ctrl hil` and use the path it prints)") from None
        self.low_latency = False
        if hasattr(self.ser, "set_low_latency_mode"):  # Linux USB serial: ASYNC_LOW_LATENCY
            try:
                self.ser.set_low_latency_mode(True)
                self.low_latency = True
            except (OSError, ValueError, serial.SerialException):
                pass  # not supported by this driver (a pty, a CDC-ACM port): fine
        try:
            self._fd = self.ser.fileno()
        except Exception:  # URL handlers without a file descriptor
            self._fd = None
        # A tty's poll() and its input-count ioctl wait for the kernel worker
        # that moves bytes into the line discipline whenever no input is ready
        # yet; the loop thread, woken by that same worker, has usually just
        # preempted it, so every such call waited for it behind whatever else
        # the CPU runs (1+ ms stalls, the missed periods). Edge-triggered epoll
        # never polls the tty unasked, and reading only after an event never
        # finds it empty.
        self._epoll = None
        if self._fd is not None and hasattr(select, "epoll"):
            os.set_blocking(self._fd, False)  # pyserial's already is: reads never wait
            self._epoll = select.epoll()
            self._epoll.register(self._fd, select.EPOLLIN | select.EPOLLET)
        self._readable = True  # an edge may have passed before registration
        self.decoder = P.Decoder()
        self.seq = 0
        self.backlog: list[P.Frame] = []  # decoded, not yet handled

    def __enter__(self) -> "Link":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def name(self) -> str:
        return self.ser.name

    @property
    def crc_errors(self) -> int:
        return self.decoder.crc_errors

    @property
    def heard(self) -> int:
        """Frames received since the last flush, valid or not."""
        d = self.decoder
        return d.frames + d.crc_errors + d.bad_frames + d.overflows

    @property
    def bad_frames(self) -> int:
        """Frames the decoder threw away: bad length or type, or overflowing its buffer."""
        return self.decoder.bad_frames + self.decoder.overflows

    def send(self, message: P.Message) -> tuple[int, float]:
        """Send one message; returns its sequence number and the send time."""
        seq = self.seq
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        data = P.encode(message, seq)
        try:
            if self._epoll is not None:  # os.write: pyserial's write would poll the tty afterwards
                try:
                    data = data[os.write(self._fd, data):]
                except BlockingIOError:
                    pass
            if data:
                self.ser.write(data)  # the line is full (or no fd): wait, up to the write timeout
        except self._serial_errors as e:
            raise LinkError(str(e)) from e
        return seq, time.monotonic()

    def poll(self, timeout: float) -> list[P.Frame]:
        """Frames that arrive within ``timeout`` seconds (returns on the first bytes)."""
        if self.backlog:
            frames, self.backlog = self.backlog, []
            return frames
        try:
            data = self._read(timeout)
        except self._serial_errors as e:
            raise LinkError(str(e)) from e
        return self.decoder.feed(data) if data else []

    def _read(self, timeout: float) -> bytes:
        if self._epoll is not None:
            if not self._readable:
                # select on the epoll fd: microsecond timeouts (epoll.poll rounds up to ms)
                if select.select([self._epoll], [], [], max(timeout, 0.0))[0]:
                    self._readable = bool(self._epoll.poll(0))
                if not self._readable:
                    return b""
            try:
                data = os.read(self._fd, READ_CHUNK)
            except BlockingIOError:
                data = b""
            self._readable = len(data) == READ_CHUNK  # more may be waiting: no new edge
            return data
        if self._fd is not None:
            select.select([self._fd], [], [], max(timeout, 0.0))
        elif timeout > 0:
            time.sleep(min(timeout, 0.0005))
        return self.ser.read(max(self.ser.in_waiting, 1))

    def flush_input(self) -> None:
        self.ser.reset_input_buffer()
        self._readable = True
        self.decoder = P.Decoder()
        self.backlog = []

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        try:
            self.ser.close()
        except self._serial_errors:
            pass


def await_frame(link: Link, want, timeout: float, on_frame=None):
    """Poll until a frame for which ``want(frame, message)`` is true; every
    frame first goes to ``on_frame(frame, rx_time)``. Returns ``(frame,
    message)``, or None on timeout. Frames not yet seen when it returns (or
    raises) stay in ``link.backlog``."""
    end = time.monotonic() + timeout
    while True:
        # past the deadline, what has already arrived is still read (for at
        # most another timeout): a host descheduled past it must not miss an
        # answer waiting in the buffer
        left = end - time.monotonic()
        if left < -timeout:
            return None
        frames = link.poll(min(max(left, 0.0), 0.02))
        if not frames and left <= 0:
            return None
        for i, f in enumerate(frames):
            try:
                if on_frame is not None:
                    on_frame(f, time.monotonic())
                try:
                    msg = P.decode_message(f)
                except P.ProtocolError:
                    continue
            except BaseException:
                link.backlog = frames[i + 1:] + link.backlog
                raise
            if want(f, msg):
                link.backlog = frames[i + 1:] + link.backlog
                return f, msg


def handshake(link: Link, tries: int = 10, tries_heard: int = 40) -> tuple[P.Info, P.Frame]:
    """HELLO until INFO: the device introduces itself, in tries of 0.3 s. A
    silent port is reported after ``tries`` (3 s); a device that is heard
    (any frame, even a corrupted one) is asked up to ``tries_heard`` times:
    an INFO frame is ~110 bytes on the wire, so a line that drops 5 % of
    frames and corrupts 1 % of bytes (tests/test_run.py) carries it whole
    with probability 0.95 x 0.99^110 = 0.32, and ten tries all failed in
    about one run of 30 (December 1); forty fail in one of 10^6."""
    link.flush_input()
    sent = 0
    while sent < tries_heard and (sent < tries or link.heard):
        link.send(P.Hello())
        sent += 1
        got = await_frame(link, lambda f, m: isinstance(m, P.Info), 0.3)
        if got is not None:
            frame, info = got
            if info.protocol_version != P.VERSION:
                raise UserError(f"the device speaks protocol version {info.protocol_version}, "
                                f"this host version {P.VERSION}; update the firmware or grpo-ctrl")
            return info, frame
        other = link.decoder.other_version  # frames of another version are dropped, noted
        if other is not None:
            raise UserError(f"the device speaks protocol version {other}, this host version "
                            f"{P.VERSION}; update the firmware or grpo-ctrl")
    raise UserError(f"no answer to HELLO from {link.name!r} after {sent} tries; is it a "
                    "grpo-ctrl device (or `grpo-ctrl hil`) and is the port right?")


def select_control_source(link: Link, info: P.Info, on_device: bool) -> None:
    """Before arming: make the device's controller (``on_device``) or the
    host's COMMANDs drive the actuator (parameter ``control_source``)."""
    want = P.CONTROL_ON_DEVICE if on_device else P.CONTROL_HOST
    if on_device and not info.controller:
        raise UserError("--on-device: the device has no controller linked (its INFO says so); "
                        "flash a firmware with one, or run the policy on the host")
    if info.control_source == want:
        return
    for _ in range(3):
        seq, _ = link.send(P.ParamSet(P.PARAMS["control_source"], want))
        got = await_frame(link, lambda f, m: isinstance(m, P.Param)
                          and m.id == P.PARAMS["control_source"], 0.3)
        if got is not None:
            if got[1].result != 0:
                raise UserError(f"the device refused control_source {want}: "
                                f"{P.RESULTS.get(got[1].result, got[1].result)}")
            return
    raise UserError("the device did not answer setting control_source")
