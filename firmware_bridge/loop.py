"""The control loop: arm, answer the newest STATE of each read with the
policy's COMMAND (which feeds the device's watchdog), and stop safely
however the run ends.

    STATE in -> features (raw counts -> the plant's observation vector)
             -> onnxruntime -> COMMAND out (answering that STATE's seq)

Every frame the device sent is accounted for in the telemetry: a row per
received frame and a ``lost`` row per missing sequence number. However the
loop ends (duration, Ctrl-C, an exception, a lost link, a device fault) it
sends a zero command and DISARM and waits for the device's acknowledgement
while the device still answers.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.firmware_bridge import protocol as P
from grpo_ctrl.firmware_bridge.link import LinkError, await_frame

KEEPALIVES_PER_WATCHDOG = 4  # under on-device control: one COMMAND per watchdog_us / 4
MIN_LOST_GAP = 64       # a gap up to this many frames is always taken for frames lost
FLOOD_WINDOW = 0.5      # s: more than twice the device's rate over this long is a flood


@dataclass
class _Run:
    """What the loop accumulates for the summary and the plot."""
    expected_seq: int | None = None
    lost: int = 0
    states: int = 0
    commands: int = 0
    stale: int = 0
    armed_states: int = 0
    latencies_us: list = field(default_factory=list)   # device-measured, per period
    compute_us: list = field(default_factory=list)
    t: list = field(default_factory=list)              # device time, s
    angle: list = field(default_factory=list)
    action: list = field(default_factory=list)
    first_t_us: int | None = None
    last_t_us: int | None = None
    seq_jumps: int = 0
    malformed: int = 0     # valid CRC, payload not as PROTOCOL.md says
    failed: int = 0        # frames whose handling raised
    fault: str | None = None
    abort: str | None = None   # why the host stopped the run itself
    status: P.Status | None = None


class ControlLoop:
    """The armed loop and its safe stop, with what it accumulates for the summary."""

    def __init__(self, link, info, features, policy, telemetry, stop, keepalive_only=False):
        self.link, self.info, self.features = link, info, features
        self.policy, self.telemetry, self.stop = policy, telemetry, stop
        self.period = info.period_us * 1e-6
        # under on-device control the COMMANDs only feed the watchdog: one per
        # watchdog_us / 4 (PROTOCOL.md, "Keep-alive"), not one per STATE, which
        # at 1 kHz is more than a slow line carries; 0: answer every STATE
        self.command_every = (info.watchdog_us * 1e-6 / KEEPALIVES_PER_WATCHDOG
                              if keepalive_only else 0.0)
        self.next_command = 0.0
        self.r = _Run()
        self.last_state_seq = self.last_state_t_us = 0   # the newest STATE received
        self.other_frames = 0   # frames of other types since it (they take sequence numbers)
        self.armed = False
        self.arming = False   # ARM sent, not yet confirmed
        self.ended = "completed"
        self.disarm_acked = False
        self.stopping = False
        self.t0 = self.start = self.last_account_rx = time.monotonic()  # telemetry times from t0
        self.elapsed = 0.0
        self.armed_at = None
        # what the status line shows (status.py), published after each STATE as one tuple:
        # another thread reads it, the loop itself writes nothing anywhere
        self.snapshot = None

    # -------------------------------------------------------------- accounting
    def account(self, f: P.Frame, msg: P.Message | None, rx: float) -> None:
        """Count the frame against the device's sequence and log it. A gap is
        one row and one count however long: frames the line lost when no
        more could have been sent since the last frame, else a jump of the
        device's counter (which also covers one going backwards)."""
        r = self.r
        dev_t_us = msg.t_us if isinstance(msg, P.State) else None
        if r.expected_seq is not None:
            gap = (f.seq - r.expected_seq) & 0xFFFFFFFF
            if gap:
                # the time the device had to send them: the host's since the last
                # frame, or the device's own clock between two STATEs where that is
                # longer (a backlog read at once, after the host did not read for
                # seconds: policy loading on a crowded machine)
                elapsed = rx - self.last_account_rx
                if dev_t_us is not None and r.last_t_us is not None:
                    elapsed = max(elapsed, (dev_t_us - r.last_t_us) * 1e-6)
                possible = elapsed / self.period * 2 + MIN_LOST_GAP
                if gap <= possible:
                    r.lost += gap
                    kind = "lost"
                else:
                    r.seq_jumps += 1
                    kind = "seq_jump"
                self.telemetry.write({"kind": kind, "dev_seq": r.expected_seq, "count": gap,
                                      "host_rx_s": rx - self.t0})
        r.expected_seq = (f.seq + 1) & 0xFFFFFFFF
        self.last_account_rx = rx
        if dev_t_us is not None:
            r.last_t_us = dev_t_us
        if msg is None or not isinstance(msg, P.State):  # states are logged with their command
            row = {"kind": type(msg).__name__.lower() if msg is not None else "malformed",
                   "dev_seq": f.seq, "host_rx_s": rx - self.t0}
            if isinstance(msg, (P.Status, P.Ack)):
                row["mode"] = msg.mode
            if isinstance(msg, P.Status):
                row.update(dev_t_us=msg.t_us, fault=msg.fault)
            self.telemetry.write(row)

    # -------------------------------------------------------------- states
    def on_state(self, f: P.Frame, s: P.State, rx: float, answer: bool = True) -> None:
        """Account and log one STATE; answer it if ``answer`` (a STATE that a
        newer one in the same read supersedes is logged, not answered)."""
        r = self.r
        r.states += 1
        r.first_t_us = s.t_us if r.first_t_us is None else r.first_t_us
        # the device's ticks since the last STATE: a STATE a tick, so the sequence numbers
        # between them less the other frames seen (a frame the line lost counts as a tick)
        ticks = None if r.states == 1 else \
            ((f.seq - self.last_state_seq) & 0xFFFFFFFF) - self.other_frames
        self.other_frames = 0
        obs = self.observe(s, ticks)
        action, tx = None, None
        if answer and self.armed and s.mode == P.MODE_ARMED and not self.stop.is_set() and \
                rx >= self.next_command:
            action = self.act(obs)
            _, tx = self.link.send(P.Command(action, f.seq, s.t_us))
            self.next_command = rx + self.command_every
            r.commands += 1
            r.compute_us.append((tx - rx) * 1e6)
            r.armed_states += 1
            if not s.flags & P.FLAG_FRESH and r.armed_states > 2:
                r.stale += 1
            if s.latency_us != P.LATENCY_UNKNOWN:
                r.latencies_us.append(s.latency_us)
        self.last_state_seq, self.last_state_t_us = f.seq, s.t_us
        r.t.append(s.t_us * 1e-6)
        r.angle.append(self.features.angle(obs))
        r.action.append(s.actuator)
        self.snapshot = (rx, r.states, self.armed_at, r.angle[-1],
                         s.actuator if action is None else action, r.stale, r.lost)
        self.telemetry.write({
            "kind": "state", "dev_seq": f.seq, "dev_t_us": s.t_us, "host_rx_s": rx - self.t0,
            "host_tx_s": None if tx is None else tx - self.t0, "mode": s.mode, "fault": s.fault,
            "flags": s.flags, "cmd_seq": s.cmd_seq,
            "loop_latency_us": None if s.latency_us == P.LATENCY_UNKNOWN else s.latency_us,
            "actuator": s.actuator, "pos": list(s.pos), "vel": list(s.vel),
            "obs": [float(x) for x in obs], "action": action,
            "compute_us": None if tx is None else (tx - rx) * 1e6})
        if self.armed and not self.arming and s.mode != P.MODE_ARMED:
            self.r.fault = self.r.fault or P.FAULTS.get(s.fault, "unknown")
            raise _DeviceStopped()

    def observe(self, s: P.State, ticks: int | None = None) -> np.ndarray:
        """The observation, or ``Abort`` for a STATE that cannot give one; ``ticks``: the
        device's since the last STATE (``Features``)."""
        if len(s.pos) != self.info.n_channels:
            raise Abort(f"the device sent a STATE with {len(s.pos)} channels, its INFO says "
                        f"{self.info.n_channels}; check the firmware")
        if not math.isfinite(s.actuator):
            raise Abort(f"the device reports a non-finite actuator value ({s.actuator}); "
                        "check the firmware")
        obs = self.features(s, ticks)
        if not np.all(np.isfinite(obs)):
            raise Abort(f"the device's counts give a non-finite observation {obs}; check the "
                        "firmware's counts per unit")
        return obs

    def act(self, obs: np.ndarray) -> float:
        """The policy's command, or ``Abort`` if it is not a number."""
        action = self.policy(obs)
        if not math.isfinite(action):
            raise Abort(f"the policy returned {action} for the observation "
                        f"{np.round(obs, 4).tolist()}; check the exported controller "
                        "(grpo-ctrl verify)")
        return action

    def take(self, f: P.Frame, rx: float, answer: bool = True) -> None:
        """Decode, account and act on one frame (a STATE is answered if
        ``answer``). A frame whose handling fails
        is logged as ``failed`` before the error goes on (while stopping, the
        error is only logged: the safe stop goes on)."""
        if f.type != P.State.TYPE:
            self.other_frames += 1
        try:
            msg = P.decode_message(f)
        except P.ProtocolError:
            self.r.malformed += 1
            self.account(f, None, rx)
            return
        self.account(f, msg, rx)
        try:
            if isinstance(msg, P.State):
                self.on_state(f, msg, rx, answer)
            elif isinstance(msg, P.Fault) and self.armed and not self.arming:
                self.r.fault = P.FAULTS.get(msg.fault, "unknown")
                raise _DeviceStopped()
        except _DeviceStopped:
            raise
        except Exception as e:
            self.r.failed += 1
            self.telemetry.write({"kind": "failed", "dev_seq": f.seq, "host_rx_s": rx - self.t0})
            if not self.stopping:
                raise
            if isinstance(e, Abort):
                self.r.abort = self.r.abort or str(e)

    def handle(self, frames) -> None:
        """Take the frames of one read. Only the newest STATE among them is
        answered: a COMMAND for an older one would be superseded on arrival,
        and a host that answers every STATE of a backlog stays busy, so that
        on a loaded machine it falls further behind instead of catching up
        (a CI run of December 1: the watchdog tripped 2-3 s into four runs;
        firmware_bridge/README.md)."""
        newest = max((i for i, f in enumerate(frames) if f.type == P.State.TYPE), default=-1)
        for i, f in enumerate(frames):
            try:
                self.take(f, time.monotonic(), answer=i == newest)
            except BaseException:
                self.link.backlog = frames[i + 1:] + self.link.backlog  # still to be accounted
                raise

    # -------------------------------------------------------------- phases
    def request(self, message: P.Message, want, timeout=0.3, tries=3):
        """Send, await the answer (logging what else arrives); None if none came."""
        for _ in range(tries):
            seq, _ = self.link.send(message)
            got = await_frame(self.link, lambda f, m: want(seq, m), timeout, self._side_frame)
            if got is not None:
                return got[1]
        return None

    def _side_frame(self, f, rx) -> None:
        """A frame that arrives while the host waits for an answer: accounted,
        and a STATE is answered if the loop is (being) armed."""
        self.take(f, rx)

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
            self.armed_at = self.start = start = time.monotonic()
            last_rx = start
            window_end, window_states = start + FLOOD_WINDOW, self.r.states
            most = 2 * FLOOD_WINDOW / self.period + MIN_LOST_GAP
            while True:
                now = time.monotonic()
                if now - start >= duration:
                    break
                if self.stop.is_set():
                    self.ended = "interrupted"
                    break
                # no keep-alive when STATEs stop: a COMMAND proves only as
                # much as the STATE it answers (PROTOCOL.md, "Watchdog")
                frames = self.link.poll(min(last_rx + link_timeout, start + duration) - now)
                now = time.monotonic()
                if frames:
                    last_rx = now
                    self.handle(frames)
                elif now - last_rx > link_timeout:
                    self.ended = "link lost"
                    break
                if now >= window_end:
                    if self.r.states - window_states > most:
                        raise Abort(f"the device sent {self.r.states - window_states} STATEs in "
                                    f"{FLOOD_WINDOW:g} s, at a {self.period * 1e3:g} ms period; "
                                    "check the firmware")
                    window_end, window_states = now + FLOOD_WINDOW, self.r.states
        except _DeviceStopped:
            self.ended = "fault"
        except Abort as e:
            self.ended = "error"
            self.r.abort = str(e)
        except LinkError:
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
        self.stopping = True
        try:
            self.link.send(P.Command(0.0, self.last_state_seq, self.last_state_t_us))
            # a device gone silent gets two tries, so that the run ends within a
            # second of the silence; one that still talks gets six: an ACK crosses
            # a line that drops 5 % of frames and corrupts 1 % of bytes whole with
            # probability 0.8, and three tries all failed in a CI run (December 1).
            # STATUS is asked only of one that answers.
            ack = self.request(P.Disarm(), lambda seq, m: isinstance(m, P.Ack)
                               and m.acked_seq == seq and m.acked_type == P.Disarm.TYPE,
                               tries=2 if self.ended == "link lost" else 6)
            self.disarm_acked = ack is not None and ack.result == 0
            if ack is not None:
                self.r.status = self.request(P.Heartbeat(), lambda seq, m: isinstance(m, P.Status)
                                             and type(m) is P.Status, tries=1)
        except LinkError:
            self.disarm_acked = False

    # -------------------------------------------------------------- summary
    def summary(self) -> dict:
        r = self.r
        lat = np.array(r.latencies_us, float) * 1e-3
        comp = np.array(r.compute_us, float) * 1e-3
        span = ((r.last_t_us - r.first_t_us) * 1e-6) if r.states > 1 else 0.0
        q = (lambda a, p: float(np.percentile(a, p)) if a.size else float("nan"))
        out = {
            "ended": self.ended + (f": {r.fault}" if self.ended == "fault" and r.fault else "")
                     + (f": {r.abort}" if self.ended == "error" else ""),
            "duration_s": self.elapsed,
            "device_period_ms": self.period * 1e3,
            "states_received": r.states,
            "achieved_rate_hz": r.armed_states / self.elapsed if self.elapsed > 0 else 0.0,
            "device_rate_hz": (r.states + r.lost) / span if span > 0 else 0.0,
            "commands_sent": r.commands,
            "loop_latency_ms_p50": q(lat, 50), "loop_latency_ms_p99": q(lat, 99),
            "host_compute_ms_p50": q(comp, 50), "host_compute_ms_p99": q(comp, 99),
            "missed_deadlines": r.stale,
            "missed_fraction": r.stale / r.armed_states if r.armed_states else 0.0,
            "crc_errors": self.link.crc_errors, "bad_frames": self.link.bad_frames,
            "lost_frames": r.lost,
            "seq_jumps": r.seq_jumps,
            "malformed_frames": r.malformed,
            "failed_frames": r.failed,
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


class Abort(Exception):
    """The host stops the run: the device or the policy gave something it
    cannot act on (the message says what, in one line)."""


def format_summary(s: dict) -> str:
    lines = [f"ended: {s['ended']} after {s['duration_s']:.2f} s "
             f"(disarm {'acknowledged' if s['disarm_acknowledged'] else 'NOT acknowledged'})",
             f"rate: {s['achieved_rate_hz']:.1f} Hz received, device {s['device_rate_hz']:.1f} Hz "
             f"(period {s['device_period_ms']:g} ms)",
             f"loop latency (device-measured, state out -> command in): p50 "
             f"{s['loop_latency_ms_p50']:.3f} ms, p99 {s['loop_latency_ms_p99']:.3f} ms; host "
             f"compute p50 {s['host_compute_ms_p50']:.3f} ms, p99 {s['host_compute_ms_p99']:.3f} ms",
             f"missed deadlines: {s['missed_deadlines']} ({100 * s['missed_fraction']:.2f}%)",
             f"link: {s['lost_frames']} frames lost, {s['crc_errors']} CRC errors, "
             f"{s['bad_frames'] + s['malformed_frames']} bad frames"
             + (f", {s['seq_jumps']} sequence jumps" if s["seq_jumps"] else "")
             + (f"; device saw {s['device_rx_crc_errors']} CRC errors"
                if "device_rx_crc_errors" in s else ""),
             f"max |angle|: {s['max_abs_angle']:.3f} rad"]
    if s.get("telemetry_dropped"):
        lines.append(f"telemetry: {s['telemetry_dropped']} rows dropped (the disk did not keep up)")
    if s.get("log"):
        lines.append(f"telemetry: {s['log']}" + (f", plot: {s['plot']}" if s.get("plot") else ""))
    return "\n".join(lines)
