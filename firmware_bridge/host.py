"""``grpo-ctrl run``: an exported ONNX controller, closed-loop, over serial.

The host half of the serial bridge. ``run_loop(port, policy, duration, log)``
opens the port (a device path, or any pyserial URL), handshakes, refuses a
policy whose metadata does not match the device, arms, and runs the loop:

    STATE in -> features (raw counts -> the plant's observation vector)
             -> onnxruntime -> COMMAND out (answering that STATE's seq)

Every frame the device sent is accounted for in the telemetry, written and
flushed as it happens: a row per received frame and a ``lost`` row per
missing sequence number. However the loop ends (duration, Ctrl-C, an
exception, a lost link, a device fault) it sends a zero command and DISARM
and waits for the device's acknowledgement while the device still answers.
"""
from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import os
import select
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grpo_ctrl.firmware_bridge import protocol as P
from grpo_ctrl.errors import UserError
from grpo_ctrl.files import save_figure
from grpo_ctrl.option_types import positive_int, positive_seconds

LATENCY_UNKNOWN = 0xFFFFFFFF
KEEPALIVE_AFTER = 1.5   # periods without a STATE before the host re-sends its command
READ_CHUNK = 4096       # a tty's whole read buffer: one read takes all that is there
EXIT_CODES = {"completed": 0, "fault": 3, "link lost": 4, "interrupted": 130}


# ---------------------------------------------------------------------- the link
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

    def send(self, message: P.Message) -> tuple[int, float]:
        """Send one message; returns its sequence number and the send time."""
        seq = self.seq
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        data = P.encode(message, seq)
        if self._epoll is not None:  # os.write: pyserial's write would poll the tty afterwards
            try:
                data = data[os.write(self._fd, data):]
            except BlockingIOError:
                pass
        if data:
            self.ser.write(data)  # the line is full (or no fd): wait, up to the write timeout
        return seq, time.monotonic()

    def poll(self, timeout: float) -> list[P.Frame]:
        """Frames that arrive within ``timeout`` seconds (returns on the first bytes)."""
        if self.backlog:
            frames, self.backlog = self.backlog, []
            return frames
        if self._epoll is not None:
            if not self._readable:
                # select on the epoll fd: microsecond timeouts (epoll.poll rounds up to ms)
                if select.select([self._epoll], [], [], max(timeout, 0.0))[0]:
                    self._readable = bool(self._epoll.poll(0))
                if not self._readable:
                    return []
            try:
                data = os.read(self._fd, READ_CHUNK)
            except BlockingIOError:
                data = b""
            self._readable = len(data) == READ_CHUNK  # more may be waiting: no new edge
        else:
            if self._fd is not None:
                select.select([self._fd], [], [], max(timeout, 0.0))
            elif timeout > 0:
                time.sleep(min(timeout, 0.0005))
            data = self.ser.read(max(self.ser.in_waiting, 1))
        return self.decoder.feed(data) if data else []

    def flush_input(self) -> None:
        self.ser.reset_input_buffer()
        self._readable = True
        self.decoder = P.Decoder()
        self.backlog = []

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
        try:
            self.ser.close()
        except self._serial_errors:
            pass


def _await(link: Link, want, timeout: float, on_frame=None):
    """Poll until a frame for which ``want(frame, message)`` is true; other
    frames go to ``on_frame``. Returns ``(frame, message)``, or None on timeout."""
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        frames = link.poll(min(left, 0.02))
        for i, f in enumerate(frames):
            msg = P.decode_message(f)
            if on_frame is not None:
                on_frame(f, msg, time.monotonic())
            if want(f, msg):
                link.backlog = frames[i + 1:] + link.backlog
                return f, msg
    return None


def handshake(link: Link, tries: int = 5) -> tuple[P.Info, P.Frame]:
    """HELLO until INFO: the device introduces itself."""
    link.flush_input()
    for _ in range(tries):
        link.send(P.Hello())
        got = _await(link, lambda f, m: isinstance(m, P.Info), 0.3)
        if got is not None:
            frame, info = got
            if info.protocol_version != P.VERSION:
                raise UserError(f"the device speaks protocol version {info.protocol_version}, "
                                f"this host version {P.VERSION}; update the firmware or grpo-ctrl")
            return info, frame
    raise UserError(f"no answer to HELLO from {link.ser.name!r} after {tries} tries; is it a "
                    "grpo-ctrl device (or `grpo-ctrl hil`) and is the port right?")


# ---------------------------------------------------------------------- features
class Features:
    """Raw device counts -> the plant's observation vector, in the simulator's
    layout (``grpo_ctrl.sim`` obs_names): angles zero at upright, velocities
    estimated by the device."""

    def __init__(self, info: P.Info):
        from grpo_ctrl.sim import BatchSim

        self.system = info.system_name
        if self.system not in P.SYSTEMS:
            raise UserError(f"the device reports an unknown system id {info.system}")
        self.obs_names = list(BatchSim(self.system, 1).spec.obs_names)
        need = {"pendulum": 1, "cartpole": 2, "furuta": 2}[self.system]
        if info.n_channels < need:
            raise UserError(f"a {self.system} needs {need} sensor channels; the device has "
                            f"{info.n_channels}")
        self.scale = np.array([(2 * math.pi if info.angle_mask >> c & 1 else 1.0) / cpu
                               if cpu > 0 else 0.0
                               for c, cpu in enumerate(info.counts_per_unit)])

    def __call__(self, s: P.State) -> np.ndarray:
        n = len(s.pos)
        q = np.asarray(s.pos, float) * self.scale[:n]
        v = np.asarray(s.vel, float) * self.scale[:n]
        if self.system == "pendulum":
            obs = [math.cos(q[0]), math.sin(q[0]), v[0]]
        elif self.system == "cartpole":
            obs = [q[0], v[0], math.cos(q[1]), math.sin(q[1]), v[1]]
        else:
            obs = [math.cos(q[0]), math.sin(q[0]), math.cos(q[1]), math.sin(q[1]), v[0], v[1]]
        return np.asarray(obs, np.float32)

    def angle(self, obs: np.ndarray) -> float:
        """The pendulum's angle from upright, in [-pi, pi]."""
        c, s = (obs[2], obs[3]) if self.system != "pendulum" else (obs[0], obs[1])
        return math.atan2(float(s), float(c))


def load_policy(path, info: P.Info, features: Features, warn=print):
    """The ONNX controller, checked against the device: same system, same
    observation layout, same actuator limit; otherwise a refusal."""
    from grpo_ctrl.export.session import PolicySession

    try:
        policy = PolicySession(path, system=info.system_name, nobs=len(features.obs_names),
                               u_max=info.u_max)
    except UserError as e:
        raise UserError(f"refusing to arm: {e}") from None
    meta = policy.metadata
    if list(meta["obs_names"]) != features.obs_names:
        raise UserError(f"refusing to arm: {str(path)!r} expects observations "
                        f"{meta['obs_names']}, the device gives {features.obs_names}")
    policy(np.zeros(len(features.obs_names), np.float32))  # warm up before the clock starts
    if meta.get("preset") != info.preset:
        warn(f"note: the policy was made for preset {meta.get('preset')!r}, the device is "
             f"{info.preset!r} (same system, layout and limits: running it)")
    if not math.isclose(meta["dt"], info.period_us * 1e-6, rel_tol=1e-3):
        warn(f"note: the policy was made for a {meta['dt'] * 1e3:g} ms period, the device runs "
             f"at {info.period_us / 1e3:g} ms")
    return policy


# ---------------------------------------------------------------------- telemetry
COLUMNS = ["kind", "dev_seq", "dev_t_us", "host_rx_s", "host_tx_s", "mode", "fault", "flags",
           "cmd_seq", "loop_latency_us", "actuator", "pos", "vel", "obs", "action", "compute_us"]


class Telemetry:
    """One row per device frame (and per lost one), written and flushed at once."""

    def __init__(self, path: Path | None):
        self.path = path
        self._file = None
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self._json = path.suffix.lower() in (".jsonl", ".json")
        self._file = open(path, "w", newline="")
        if not self._json:
            self._csv = csv.writer(self._file)
            self._csv.writerow(COLUMNS)
            self._file.flush()

    def write(self, row: dict) -> None:
        if self._file is None:
            return
        if self._json:
            self._file.write(json.dumps(row) + "\n")
        else:
            self._csv.writerow([" ".join(f"{x:.6g}" for x in v) if isinstance(v, (list, tuple))
                                else ("" if v is None else v) for v in
                                (row.get(k) for k in COLUMNS)])
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_telemetry(path) -> list[dict]:
    """Rows of a telemetry file (CSV or JSONL) as dicts of numbers and lists."""
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".json"):
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row = {}
            for k, v in r.items():
                if k == "kind":
                    row[k] = v
                elif k in ("pos", "vel", "obs"):
                    row[k] = [float(x) for x in v.split()] if v else None
                else:
                    row[k] = float(v) if v else None
            rows.append(row)
    return rows


# ---------------------------------------------------------------------- the loop
@dataclass
class _Run:
    """What the loop accumulates for the summary and the plot."""
    expected_seq: int | None = None
    lost: int = 0
    states: int = 0
    commands: int = 0
    keepalives: int = 0
    stale: int = 0
    armed_states: int = 0
    latencies_us: list = field(default_factory=list)   # device-measured, per period
    compute_us: list = field(default_factory=list)
    t: list = field(default_factory=list)              # device time, s
    angle: list = field(default_factory=list)
    action: list = field(default_factory=list)
    first_t_us: int | None = None
    last_t_us: int | None = None
    fault: str | None = None
    status: P.Status | None = None


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
        policy = load_policy(policy_path, info, features, warn=print_fn)
        telemetry = Telemetry(log)
        loop = _Loop(link, info, features, policy, telemetry, stop)
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


class _Loop:
    def __init__(self, link, info, features, policy, telemetry, stop):
        self.link, self.info, self.features = link, info, features
        self.policy, self.telemetry, self.stop = policy, telemetry, stop
        self.period = info.period_us * 1e-6
        self.r = _Run()
        self.armed = False
        self.arming = False   # ARM sent, not yet confirmed
        self.ended = "completed"
        self.disarm_acked = False
        self.t0 = self.start = time.monotonic()  # telemetry times count from t0
        self.elapsed = 0.0

    # -------------------------------------------------------------- accounting
    def account(self, f: P.Frame, msg: P.Message, rx: float) -> None:
        """Count the frame against the device's sequence and log it."""
        r = self.r
        if r.expected_seq is not None:
            gap = (f.seq - r.expected_seq) & 0xFFFFFFFF
            if gap < 1 << 31:
                for k in range(gap):
                    self.telemetry.write({"kind": "lost",
                                          "dev_seq": (r.expected_seq + k) & 0xFFFFFFFF})
                r.lost += gap
        r.expected_seq = (f.seq + 1) & 0xFFFFFFFF
        if not isinstance(msg, P.State):  # states are logged with their command
            row = {"kind": type(msg).__name__.lower(), "dev_seq": f.seq,
                   "host_rx_s": rx - self.t0}
            if isinstance(msg, (P.Status, P.Ack)):
                row["mode"] = msg.mode
            if isinstance(msg, P.Status):
                row.update(dev_t_us=msg.t_us, fault=msg.fault)
            self.telemetry.write(row)

    # -------------------------------------------------------------- states
    def on_state(self, f: P.Frame, s: P.State, rx: float) -> None:
        r = self.r
        r.states += 1
        r.first_t_us = s.t_us if r.first_t_us is None else r.first_t_us
        r.last_t_us = s.t_us
        obs = self.features(s)
        action, tx = None, None
        if self.armed and s.mode == P.MODE_ARMED and not self.stop.is_set():
            action = self.policy(obs)
            if not math.isfinite(action):
                raise RuntimeError(f"the policy returned {action} for observation {obs}")
            _, tx = self.link.send(P.Command(action, f.seq))
            r.commands += 1
            r.compute_us.append((tx - rx) * 1e6)
            r.armed_states += 1
            if not s.flags & P.FLAG_FRESH and r.armed_states > 2:
                r.stale += 1
            if s.latency_us != LATENCY_UNKNOWN:
                r.latencies_us.append(s.latency_us)
        self.last_obs, self.last_state_seq, self.last_state_rx = obs, f.seq, rx
        r.t.append(s.t_us * 1e-6)
        r.angle.append(self.features.angle(obs))
        r.action.append(s.actuator)
        self.telemetry.write({
            "kind": "state", "dev_seq": f.seq, "dev_t_us": s.t_us, "host_rx_s": rx - self.t0,
            "host_tx_s": None if tx is None else tx - self.t0, "mode": s.mode, "fault": s.fault,
            "flags": s.flags, "cmd_seq": s.cmd_seq,
            "loop_latency_us": None if s.latency_us == LATENCY_UNKNOWN else s.latency_us,
            "actuator": s.actuator, "pos": list(s.pos), "vel": list(s.vel),
            "obs": [float(x) for x in obs], "action": action,
            "compute_us": None if tx is None else (tx - rx) * 1e6})
        if self.armed and not self.arming and s.mode != P.MODE_ARMED:
            self.r.fault = self.r.fault or P.FAULTS.get(s.fault, "unknown")
            raise _DeviceStopped()

    def handle(self, frames) -> None:
        for i, f in enumerate(frames):
            rx = time.monotonic()
            msg = P.decode_message(f)
            self.account(f, msg, rx)
            try:
                if isinstance(msg, P.State):
                    self.on_state(f, msg, rx)
                elif isinstance(msg, P.Fault):
                    self.r.fault = P.FAULTS.get(msg.fault, "unknown")
                    raise _DeviceStopped()
            except _DeviceStopped:
                self.link.backlog = frames[i + 1:] + self.link.backlog  # still to be accounted
                raise

    # -------------------------------------------------------------- phases
    def request(self, message: P.Message, want, timeout=0.3, tries=3):
        """Send, await the answer (logging what else arrives); None if none came."""
        for _ in range(tries):
            seq, _ = self.link.send(message)
            got = _await(self.link, lambda f, m: want(seq, m), timeout, self._side_frame)
            if got is not None:
                return got[1]
        return None

    def _side_frame(self, f, msg, rx) -> None:
        """A frame that arrives while the host waits for an answer: accounted,
        and a STATE is answered if the loop is (being) armed."""
        self.account(f, msg, rx)
        if isinstance(msg, P.State):
            self.on_state(f, msg, rx)

    def catch_up(self) -> None:
        """Handle the states that queued up while the policy loaded, so that
        the first armed state is answered at once, not after the backlog
        (for at most a second: a device faster than this host never drains)."""
        end = time.monotonic() + 1.0
        while time.monotonic() < end and (frames := self.link.poll(0.0)):
            self.handle(frames)

    def arm(self) -> None:
        """ARM, confirmed by its ACK or by the first STATE in the armed mode
        (the ACK may be lost on a noisy line). From the moment ARM is sent the
        host answers armed STATEs, so the watchdog is fed from the first tick."""
        def armed(seq, m):
            return ((isinstance(m, P.Ack) and m.acked_seq == seq and m.acked_type == P.Arm.TYPE)
                    or (isinstance(m, P.State) and m.mode == P.MODE_ARMED))

        self.armed = self.arming = True
        try:
            got = self.request(P.Arm(), armed)
        finally:
            self.arming = False
        if isinstance(got, P.Ack) and got.result == 1:  # a fault left from before: clear it, once
            self.armed = False
            self.request(P.Disarm(), lambda seq, m: isinstance(m, P.Ack) and m.acked_seq == seq)
            self.armed = self.arming = True
            try:
                got = self.request(P.Arm(), armed)
            finally:
                self.arming = False
        if got is None:
            self.armed = False
            raise UserError("the device did not acknowledge ARM")
        if isinstance(got, P.Ack) and got.result != 0:
            self.armed = False
            raise UserError(f"the device refused to arm: {P.RESULTS.get(got.result, got.result)}")

    def run(self, duration: float) -> None:
        link_timeout = max(0.25, 20 * self.period)
        try:
            if self.stop.is_set():  # interrupted during the handshake: do not arm
                self.ended = "interrupted"
                self.safe_stop()
                return
            self.catch_up()
            self.arm()
            self.start = start = time.monotonic()
            self.last_state_rx = last_rx = start
            next_keepalive = start + KEEPALIVE_AFTER * self.period
            while True:
                now = time.monotonic()
                if now - start >= duration:
                    break
                if self.stop.is_set():
                    self.ended = "interrupted"
                    break
                frames = self.link.poll(min(next_keepalive, start + duration) - now)
                now = time.monotonic()
                if frames:
                    last_rx = now
                    self.handle(frames)
                    next_keepalive = self.last_state_rx + KEEPALIVE_AFTER * self.period
                elif now - last_rx > link_timeout:
                    self.ended = "link lost"
                    break
                if now >= next_keepalive and hasattr(self, "last_obs"):
                    # no STATE this period (lost or late): keep the watchdog fed with
                    # the command for the newest observation, answering its state
                    u = self.policy(self.last_obs)
                    self.link.send(P.Command(u, self.last_state_seq))
                    self.r.keepalives += 1
                    next_keepalive = now + self.period
        except _DeviceStopped:
            self.ended = "fault"
        except self.link._serial_errors:
            self.ended = "link lost"
        except BaseException:
            self.ended = "exception"
            self.safe_stop()
            raise
        self.elapsed = time.monotonic() - self.start
        self.safe_stop()

    def safe_stop(self) -> None:
        """Zero command, DISARM, wait for the acknowledgement (where the device answers)."""
        self.armed = False
        try:
            self.link.send(P.Command(0.0, getattr(self, "last_state_seq", 0)))
            ack = self.request(P.Disarm(), lambda seq, m: isinstance(m, P.Ack)
                               and m.acked_seq == seq and m.acked_type == P.Disarm.TYPE)
            self.disarm_acked = ack is not None and ack.result == 0
            self.r.status = self.request(P.Heartbeat(), lambda seq, m: isinstance(m, P.Status)
                                         and type(m) is P.Status, tries=1)
        except self.link._serial_errors:
            self.disarm_acked = False

    # -------------------------------------------------------------- summary
    def summary(self) -> dict:
        r, d = self.r, self.link.decoder
        lat = np.array(r.latencies_us, float) * 1e-3
        comp = np.array(r.compute_us, float) * 1e-3
        span = ((r.last_t_us - r.first_t_us) * 1e-6) if r.states > 1 else 0.0
        q = (lambda a, p: float(np.percentile(a, p)) if a.size else float("nan"))
        out = {
            "ended": self.ended + (f": {r.fault}" if self.ended == "fault" and r.fault else ""),
            "duration_s": self.elapsed,
            "device_period_ms": self.period * 1e3,
            "states_received": r.states,
            "achieved_rate_hz": r.armed_states / self.elapsed if self.elapsed > 0 else 0.0,
            "device_rate_hz": (r.states + r.lost) / span if span > 0 else 0.0,
            "commands_sent": r.commands,
            "keepalive_commands": r.keepalives,
            "loop_latency_ms_p50": q(lat, 50), "loop_latency_ms_p99": q(lat, 99),
            "host_compute_ms_p50": q(comp, 50), "host_compute_ms_p99": q(comp, 99),
            "missed_deadlines": r.stale,
            "missed_fraction": r.stale / r.armed_states if r.armed_states else 0.0,
            "crc_errors": d.crc_errors, "bad_frames": d.bad_frames + d.overflows,
            "lost_frames": r.lost,
            "max_abs_angle": float(np.max(np.abs(r.angle))) if r.angle else float("nan"),
            "disarm_acknowledged": self.disarm_acked,
        }
        if r.status is not None:
            out.update(device_rx_crc_errors=r.status.rx_crc_errors,
                       device_rx_bad_frames=r.status.rx_bad_frames,
                       device_watchdog_trips=r.status.watchdog_trips,
                       device_late_ticks=r.status.late_ticks)
        return out


class _DeviceStopped(Exception):
    """The device left the armed mode on its own (a fault)."""


def write_plot(path: Path, t, angle, action, u_max: float, title: str = "") -> None:
    """Angle and command over device time, as a PNG (written whole, then renamed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.asarray(t) - (t[0] if len(t) else 0.0)
    fig, (a0, a1) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
    a0.plot(t, angle, lw=1)
    a0.set_ylabel("angle from upright (rad)")
    a0.axhline(0, color="k", lw=0.5)
    a1.plot(t, action, lw=1, color="C1")
    for s in (-u_max, u_max):
        a1.axhline(s, color="k", ls="--", lw=0.5)
    a1.set_ylabel("command")
    a1.set_xlabel("device time (s)")
    a0.set_title(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def format_summary(s: dict) -> str:
    lines = [f"ended: {s['ended']} after {s['duration_s']:.2f} s "
             f"(disarm {'acknowledged' if s['disarm_acknowledged'] else 'NOT acknowledged'})",
             f"rate: {s['achieved_rate_hz']:.1f} Hz received, device {s['device_rate_hz']:.1f} Hz "
             f"(period {s['device_period_ms']:g} ms)",
             f"loop latency (device-measured, state out -> command in): p50 "
             f"{s['loop_latency_ms_p50']:.3f} ms, p99 {s['loop_latency_ms_p99']:.3f} ms; host "
             f"compute p50 {s['host_compute_ms_p50']:.3f} ms, p99 {s['host_compute_ms_p99']:.3f} ms",
             f"missed deadlines: {s['missed_deadlines']} ({100 * s['missed_fraction']:.2f}%), "
             f"keep-alive commands {s['keepalive_commands']}",
             f"link: {s['lost_frames']} frames lost, {s['crc_errors']} CRC errors, "
             f"{s['bad_frames']} bad frames"
             + (f"; device saw {s['device_rx_crc_errors']} CRC errors"
                if "device_rx_crc_errors" in s else ""),
             f"max |angle|: {s['max_abs_angle']:.3f} rad"]
    if s.get("log"):
        lines.append(f"telemetry: {s['log']}" + (f", plot: {s['plot']}" if s.get("plot") else ""))
    return "\n".join(lines)


# ---------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", required=True,
                   help="serial device path (/dev/ttyACM0, the path `grpo-ctrl hil` prints) or a "
                        "pyserial URL (socket://host:port, rfc2217://...)")
    p.add_argument("--policy", required=True, help="exported ONNX controller (grpo-ctrl export)")
    p.add_argument("--duration", type=positive_seconds, default=10.0, metavar="S",
                   help="run this long")
    p.add_argument("--log", default=None,
                   help="telemetry file, .csv or .jsonl (default: runs/serial/<time>.csv)")
    p.add_argument("--plot", default=None, help="PNG plot (default: next to the log)")
    p.add_argument("--baud", type=positive_int(100_000_000), default=1_000_000,
                   help="baud rate for a UART (ignored by USB CDC and pseudo-terminals)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args) -> int:
    log = args.log or f"runs/serial/{time.strftime('%Y%m%d-%H%M%S')}.csv"
    summary = run_loop(args.port, args.policy, args.duration, log, args.plot,
                       baudrate=args.baud)
    print(json.dumps(summary) if args.json else format_summary(summary), flush=True)
    return EXIT_CODES.get(summary["ended"].split(":")[0], 1)
