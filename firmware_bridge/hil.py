"""``grpo-ctrl hil``: a hardware-in-the-loop pendulum on a pseudo-terminal.

The firmware core (``firmware/fw_core.c``) runs with the simulated back-end
(``firmware/hw_sim.c``) that drives the ``csrc/`` plant, in real time, paced
by the monotonic clock, in a C loop that holds 1 kHz. The host talks to it
exactly as to a board on USB serial: open the printed device path.

From Python (tests, ``grpo-ctrl demo``)::

    with serve_hil(HilConfig(system="pendulum", preset="rig", angle0=0.1)) as hil:
        summary = run_loop(hil.port, "policy.onnx", duration=5)
        trace = hil.trace()   # what the plant really did, tick by tick
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import threading
import time
import tty
from dataclasses import dataclass

import numpy as np

from grpo_ctrl.firmware_bridge._firmware import ffi, lib
from grpo_ctrl.firmware_bridge.protocol import FAULTS, MODES
from grpo_ctrl.errors import UserError
from grpo_ctrl.option_types import number, probability, seconds, seed
from grpo_ctrl.plant import plant_spec, resolve_plant, system_id, systems
from grpo_ctrl.plant_file import PlantValues


@dataclass
class HilConfig:
    """What to serve and how badly the line behaves."""
    system: str = "pendulum"
    preset: str | None = None        # the system's first preset
    rate: float | None = None        # control rate, Hz (default: the preset's)
    angle0: float | None = None      # start at rest with the pendulum at this angle
                                     # (rad from upright; the double pendulum's shoulder,
                                     # the elbow straight); default: the preset's draw
    hold_until_armed: bool = False   # hold the plant still until first armed, as a hand would
    plant: PlantValues | None = None  # a plant that is not the preset (grpo_ctrl.plant_file)
    sensor_noise: float = 0.0        # std of Gaussian noise on every position sensor before
                                     # it is counted (rad or m)
    seed: int = 0
    device_id: int = 1
    watchdog_ms: float | None = None     # default: two control periods
    velocity_limit: float | None = None  # every channel; default: the plant's (PlantSpec), 0 = none
    position_limit: float | None = None  # channel 0 (cart, arm, the double pendulum's
                                         # shoulder); default: the plant's (PlantSpec), 0 = none
    velocity_cutoff_hz: float = 20.0  # device velocity low-pass cutoff, 0 = none
    device_gains: tuple | None = None  # link an on-device controller u = -K obs (PROTOCOL.md)
    corrupt: float = 0.0             # probability that a byte is corrupted
    drop: float = 0.0                # probability that a device frame is dropped
    latency_ms: float = 0.0          # added to every device frame
    spike_rate: float = 0.0          # probability of a latency spike per frame ...
    spike_ms: float = 0.0            # ... of this size
    disconnect_after: float = 0.0    # close the line after this many seconds, 0 = never
    both_ways: bool = False          # corrupt the host's bytes too
    trace_seconds: float = 120.0     # how much per-tick trace to keep
    realtime: bool = True            # try a real-time priority for the loop (best effort)


class HilServer:
    """The HIL device on a fresh pseudo-terminal, run in a background thread
    (the C loop releases the GIL). ``port`` is the path a host opens."""

    def __init__(self, config: HilConfig | None = None):
        c = self.config = config or HilConfig()
        _, preset = resolve_plant(c.system, c.preset)
        for name in ("corrupt", "drop", "spike_rate"):
            if not 0.0 <= getattr(c, name) <= 1.0:
                raise UserError(f"--{name.replace('_', '-')} is a probability in [0, 1], "
                                f"got {getattr(c, name)}")
        if c.rate is not None and not 1.0 <= c.rate <= 20000.0:
            raise UserError(f"--rate must lie in [1, 20000] Hz, got {c.rate}")
        self.preset = preset
        self.spec = spec = plant_spec(c.system, preset)
        o = self._options = ffi.new("hil_options *")
        o.system = system_id(c.system)
        o.preset = preset.encode()
        o.rate_hz = c.rate or 0.0
        if c.angle0 is not None:
            o.set_x0 = 1
            for k, v in enumerate(spec.rest_state(float(c.angle0))):
                o.x0[k] = v
        o.hold_until_armed = int(c.hold_until_armed)
        if c.plant is not None:
            o.n_param = len(spec.param_names)
            o.param[0:o.n_param] = [float(c.plant.params[name]) for name in spec.param_names]
            o.delay_steps = int(c.plant.delay)
            pole = [pos for pos, _ in spec.channels].index(spec.pole_angle)
            o.offset[pole] = float(c.plant.offset)
            o.motor_k = float(c.plant.motor_k)
        if not (math.isfinite(c.sensor_noise) and c.sensor_noise >= 0):
            raise UserError(f"--sensor-noise must be a finite std >= 0, got {c.sensor_noise}")
        o.sensor_noise[0:len(spec.channels)] = [float(c.sensor_noise)] * len(spec.channels)
        o.seed = c.seed
        o.device_id = c.device_id
        o.watchdog_us = int(round(c.watchdog_ms * 1000)) if c.watchdog_ms else 0
        for ch, (pos, vel) in enumerate(zip(spec.channel_pos_limits, spec.channel_vel_limits)):
            o.pos_limit[ch] = pos
            o.vel_limit[ch] = vel if c.velocity_limit is None else c.velocity_limit
        if c.position_limit is not None:
            o.pos_limit[0] = c.position_limit
        o.vel_cutoff_hz = c.velocity_cutoff_hz
        gains = tuple(c.device_gains or ())
        if len(gains) > len(o.controller_gain) or not all(map(math.isfinite, gains)):
            raise UserError(f"device_gains must be at most {len(o.controller_gain)} finite "
                            f"numbers, got {gains}")
        o.controller_nobs = len(gains)
        o.controller_gain[0:len(gains)] = gains
        f = o.faults
        f.corrupt_rate, f.drop_rate = c.corrupt, c.drop
        f.latency_us, f.spike_rate, f.spike_us = c.latency_ms * 1e3, c.spike_rate, c.spike_ms * 1e3
        f.disconnect_after_s, f.both_ways = c.disconnect_after, int(c.both_ways)

        # the pseudo-terminal: raw, non-blocking on our side; we keep the
        # slave open so that a host closing it does not hang the line up
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)
        tty.setraw(self._master)
        os.set_blocking(self._master, False)
        self.port = os.ttyname(self._slave)
        o.fd = self._master
        o.realtime = int(c.realtime)

        rate = c.rate or 1.0 / spec.dt
        cap = int(c.trace_seconds * rate) + 16
        self._trace = {"t_us": np.zeros(cap, np.uint64), "due_us": np.zeros(cap, np.uint64),
                       "x": np.zeros((cap, 4)),
                       "u": np.zeros(cap, np.float32), "mode": np.zeros(cap, np.uint8),
                       "fault": np.zeros(cap, np.uint8)}
        o.trace_cap = cap
        o.trace_t_us = ffi.from_buffer("uint64_t[]", self._trace["t_us"])
        o.trace_due_us = ffi.from_buffer("uint64_t[]", self._trace["due_us"])
        o.trace_x = ffi.from_buffer("double[]", self._trace["x"])
        o.trace_u = ffi.from_buffer("float[]", self._trace["u"])
        o.trace_mode = ffi.from_buffer("uint8_t[]", self._trace["mode"])
        o.trace_fault = ffi.from_buffer("uint8_t[]", self._trace["fault"])
        self._mem = ffi.new("char[]", lib.hil_sizeof())
        self._sim = ffi.cast("hil_sim *", self._mem)
        rc = lib.hil_init(self._sim, o)
        if rc:
            self._close_fds()
            raise UserError(f"the HIL could not be set up (error {rc}): check --rate and the limits")
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ running
    def start(self, duration: float = 0.0) -> "HilServer":
        """Run in a background thread for ``duration`` seconds (0: until ``stop``)."""
        self._thread = threading.Thread(target=lib.hil_run, args=(self._sim, float(duration)),
                                        name="hil", daemon=True)
        self._thread.start()
        return self

    def run(self, duration: float = 0.0) -> None:
        """Run in this thread (Ctrl-C stops it)."""
        self.start(duration)
        try:
            while self._thread.is_alive():
                self._thread.join(0.1)
        finally:
            self.stop()

    def stop(self) -> None:
        lib.hil_stop(self._sim)
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        self.stop()
        self._close_fds()

    def _close_fds(self) -> None:
        for name in ("_master", "_slave"):
            fd = getattr(self, name, -1)
            setattr(self, name, -1)
            if fd < 0 or (name == "_master" and self.stats_raw().disconnected):
                continue  # the C loop closed it when it disconnected
            os.close(fd)

    def __enter__(self) -> "HilServer":
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ what happened
    def stats_raw(self):
        s = ffi.new("hil_stats *")
        lib.hil_get_stats(self._sim, s)
        return s

    def stats(self) -> dict:
        """Counters of the device and of the fault injector."""
        s = self.stats_raw()
        out = {name: getattr(s, name) for name in dir(s)}
        out["mode_name"], out["fault_name"] = MODES[s.mode], FAULTS.get(s.fault, "unknown")
        return out

    def trace(self) -> dict:
        """Per-tick record so far (copies): ``t`` (device s), ``due`` (when
        the tick was due, s), ``x`` (plant state, ``(n, nx)``), ``u``
        (actuator), ``mode``, ``fault``."""
        n = min(self.stats_raw().trace_len, len(self._trace["u"]))
        nx = self.spec.nx
        return {"t": self._trace["t_us"][:n].astype(float) * 1e-6,
                "due": self._trace["due_us"][:n].astype(float) * 1e-6,
                "x": self._trace["x"][:n, :nx].copy(), "u": self._trace["u"][:n].copy(),
                "mode": self._trace["mode"][:n].copy(), "fault": self._trace["fault"][:n].copy()}


@contextlib.contextmanager
def serve_hil(config: HilConfig | None = None, **fields):
    """Serve the HIL device for the ``with`` block: yields the running
    ``HilServer`` (``.port``, ``.trace()``, ``.stats()``). Fields of
    ``HilConfig`` may be given as keywords instead of ``config``."""
    server = HilServer(config or HilConfig(**fields))
    try:
        yield server.start()
    finally:
        server.close()


def default_stop_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP back to their default action: a child's
    ``preexec_fn``, so that a child started from a job that ignores SIGINT
    (``nohup ... &``: POSIX shells start background jobs so, and an exec keeps
    an ignored signal ignored) starts as from a terminal."""
    import signal

    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)


def spawn_hil(*cli_args: str):
    """``grpo-ctrl hil`` in its own process (its own GIL and scheduling):
    returns ``(process, port)`` once the port is ready. Arguments as on the
    command line, e.g. ``spawn_hil("--preset", "rig", "--duration", "10")``;
    stop it with ``process.send_signal(signal.SIGINT)``."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "grpo_ctrl.cli", "hil", *cli_args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=default_stop_signals)
    port = process.stdout.readline().strip()
    if not port.startswith("/"):
        process.kill()
        _, err = process.communicate()
        raise UserError(f"grpo-ctrl hil did not start: {err.strip() or port}")
    return process, port


# ---------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    milliseconds = number(float, 0.0, 10_000.0, unit=" (ms)")
    p.add_argument("--system", default="pendulum",
                   help=f"plant: {', '.join(systems())} (default: pendulum)")
    p.add_argument("--preset", default=None, help="parameter preset (default: the system's first)")
    p.add_argument("--rate", type=number(float, 1.0, 20000.0, unit=" Hz"), default=None,
                   metavar="HZ",
                   help="control rate (default: the preset's; 1000 for a 1 kHz loop)")
    p.add_argument("--angle0", type=number(float, -100.0, 100.0, unit=" (rad)"), default=None,
                   metavar="RAD",
                   help="start at rest with the pendulum at this angle from upright, every "
                        "other coordinate zero (double_pendulum: the shoulder's angle, the "
                        "elbow straight; pi hangs it)")
    p.add_argument("--hold-until-armed", action="store_true",
                   help="hold the plant at its start until the host first arms it")
    g = p.add_argument_group("a plant that is not the preset")
    g.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a physical parameter (PlantSpec.param_names), delay (steps) or offset "
                        "(rad, the pendulum encoder's); repeat for several")
    g.add_argument("--plant", metavar="FILE.toml",
                   help="the plant of a file (grpo-ctrl sysid --out, --reveal)")
    g.add_argument("--mystery", type=seed, default=None, metavar="SEED",
                   help="a hidden plant: every parameter but g x U(0.7, 1.3), 0-2 steps of "
                        "delay, an encoder offset within 0.05 rad, a motor response per step "
                        "(motor_k) in U(0.5, 1); never printed")
    g.add_argument("--sensor-noise", type=number(float, 0.0, 1.0, unit=" (rad or m)"),
                   default=0.0, metavar="STD",
                   help="Gaussian noise on every position sensor before it is counted "
                        "(default 0: quantisation only)")
    g.add_argument("--reveal", metavar="FILE.toml",
                   help="write the plant served (e.g. --mystery's) to this file")
    p.add_argument("--duration", type=seconds("until Ctrl-C"), default=0.0, metavar="S",
                   help="stop after this long (default: until Ctrl-C)")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--watchdog-ms", type=number(float, above=0.0, high=10_000.0, unit=" (ms)"),
                   default=None,
                   help="watchdog: the oldest STATE the command in effect may answer "
                        "(default: two control periods)")
    p.add_argument("--velocity-limit", type=number(float, 0.0, 1e6, unit=" (0: none)"),
                   default=None,
                   help="disarm beyond this speed, rad/s or m/s, on every sensor "
                        "(double_pendulum: either joint; default: the plant's, 0: none)")
    p.add_argument("--position-limit", type=number(float, 0.0, 1e6, unit=" (0: none)"),
                   default=None,
                   help="disarm when channel 0 (cart, arm, or double_pendulum's shoulder, "
                        "counted from upright over whole turns; the elbow has none) goes "
                        "beyond this, rad or m (default: the plant's, 0: none)")
    p.add_argument("--velocity-cutoff", type=number(float, 0.0, 1e5, unit=" Hz (0: none)"),
                   default=20.0, metavar="HZ",
                   help="low-pass cutoff of the device's velocity estimate (0: raw differences)")
    g = p.add_argument_group("fault injection")
    g.add_argument("--corrupt", type=probability, default=0.0, metavar="P",
                   help="probability that a byte from the device is corrupted")
    g.add_argument("--drop", type=probability, default=0.0, metavar="P",
                   help="probability that a frame from the device is dropped")
    g.add_argument("--latency-ms", type=milliseconds, default=0.0,
                   help="added to every device frame")
    g.add_argument("--spike-rate", type=probability, default=0.0, metavar="P",
                   help="probability of a latency spike on a frame")
    g.add_argument("--spike-ms", type=milliseconds, default=0.0, help="size of a latency spike")
    g.add_argument("--disconnect-after", type=seconds("never"), default=0.0, metavar="S",
                   help="hang the line up after this long")
    g.add_argument("--both-ways", action="store_true",
                   help="corrupt the host's bytes too (raise --watchdog-ms to match)")


def plant_from_args(args) -> PlantValues | None:
    """The plant ``--mystery``, ``--plant`` and ``--param`` ask for (None: the preset)."""
    from grpo_ctrl.plant_file import mystery_plant, plant_from_params, read_plant_file

    if args.mystery is not None and (args.plant or args.param):
        raise UserError("--mystery draws the whole plant: leave out --plant and --param")
    spec = plant_spec(*resolve_plant(args.system, args.preset))
    if args.mystery is not None:
        return mystery_plant(spec, args.mystery)
    base = read_plant_file(args.plant, spec) if args.plant else None
    if not args.param:
        return base
    return plant_from_params(args.param, spec, base)


def config_from_args(args) -> HilConfig:
    return HilConfig(system=args.system, preset=args.preset, rate=args.rate, angle0=args.angle0,
                     hold_until_armed=args.hold_until_armed, seed=args.seed,
                     plant=plant_from_args(args), sensor_noise=args.sensor_noise,
                     watchdog_ms=args.watchdog_ms, velocity_limit=args.velocity_limit,
                     position_limit=args.position_limit,
                     velocity_cutoff_hz=args.velocity_cutoff, corrupt=args.corrupt, drop=args.drop,
                     latency_ms=args.latency_ms, spike_rate=args.spike_rate,
                     spike_ms=args.spike_ms, disconnect_after=args.disconnect_after,
                     both_ways=args.both_ways,
                     trace_seconds=min(args.duration or 60.0, 600.0))


def run(args) -> int:
    from grpo_ctrl.files import check_writable, write_toml

    config = config_from_args(args)
    if args.reveal:
        check_writable(args.reveal)
    server = HilServer(config)
    if args.reveal:  # the plant served, for checking a fit afterwards; never printed
        write_toml(args.reveal, (config.plant or _preset_values(server.spec)).table())
    s = server.stats_raw()
    # the first line is the device path alone, for scripts
    print(server.port, flush=True)
    print(f"HIL {args.system}/{server.preset}: {1e6 / s.period_us:g} Hz, actuator limit "
          f"{s.u_max:g}; open {server.port} with `grpo-ctrl run --port {server.port} ...`; "
          "Ctrl-C stops", flush=True)
    start = time.monotonic()
    try:
        server.run(args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    st = server.stats()
    elapsed = time.monotonic() - start
    print(f"served {elapsed:.1f} s: {st['ticks']} ticks ({st['ticks'] / max(elapsed, 1e-9):.1f} Hz), "
          f"{st['late_ticks']} late, armed {st['arms']} times, watchdog trips "
          f"{st['watchdog_trips']}, received {st['rx_frames']} frames ({st['rx_crc_errors']} CRC "
          f"errors), final mode {st['mode_name']}" +
          (f" ({st['fault_name']})" if st["fault"] else ""), flush=True)
    return 0


def _preset_values(spec) -> PlantValues:
    from grpo_ctrl.plant_file import nominal_params
    return PlantValues(nominal_params(spec))
