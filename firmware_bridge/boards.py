"""``grpo-ctrl firmware``: a ready firmware project for a board, built and sized
with Debian's cross toolchains.

    grpo-ctrl firmware --board uno --out pendulum_board
    grpo-ctrl firmware --board mps2-an386 --out pil --policy policy.onnx
    grpo-ctrl firmware --board uno --out pendulum_board --policy small.onnx --simavr

Boards:

* ``uno``: an Arduino sketch folder (the reference back-end,
  ``firmware/board/``), built the way the Arduino tools build it: the sketch
  and the core from Debian's ``arduino-core-avr``, ``avr-gcc`` for the
  ATmega328P. The sketch's own files compile at -Wall -Wextra -Werror.
* ``mps2-an386``: Arm's MPS2 board with the AN386 Cortex-M4F image, as
  ``qemu-system-arm -M mps2-an386`` emulates it: bare-metal C (startup,
  linker script, Makefile) with the pendulum simulated on the chip and the
  protocol on UART0: the processor-in-the-loop target (docs/boards.md).

With ``--policy`` the exported controller's C (``export.c_codegen``) is
generated into the project, its size measured with the board's compiler, and
a controller that does not fit is refused before anything is written, with
the sizes and the largest two-layer network that would fit.

The boards' records are ``board_registry``'s; building, fitting and
emulating are ``board_build``, ``board_fit`` and ``board_emulate``; this
module is the command (and names their functions for callers).
"""
from __future__ import annotations

import argparse
import math
import re
import tempfile
from pathlib import Path

from grpo_ctrl.errors import UserError
from grpo_ctrl.files import atomic_write, check_folder
from grpo_ctrl.option_types import number
from grpo_ctrl.firmware_bridge.board_build import (build_image, compile_object,  # noqa: F401
                                                   project_files, stage)
from grpo_ctrl.firmware_bridge.board_emulate import (MEASURED, PIL_WATCHDOG_US,  # noqa: F401
                                                     build_pil_image, emulator_missing,
                                                     simavr_pil, simavr_pil_missing,
                                                     target_check)
from grpo_ctrl.firmware_bridge.board_fit import (Fit, check_fit, controller_c,  # noqa: F401
                                                 largest_mlp, measure, measured_tick,
                                                 on_device_timing, tick_estimate,
                                                 uno_tick_estimate, uno_widest_in_time, widened)
from grpo_ctrl.firmware_bridge.board_registry import (BOARDS, Board, Sizes, board,  # noqa: F401
                                                      size_of)


# ---------------------------------------------------------------- the command
def add_arguments(p: argparse.ArgumentParser) -> None:
    from grpo_ctrl.export.c_codegen import QUANTIZE

    p.add_argument("--board", required=True, choices=list(BOARDS),
                   help="; ".join(f"{k}: {v.description}" for k, v in BOARDS.items()))
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the project folder to write (for the uno, the sketch folder: the .ino "
                        "takes its name)")
    p.add_argument("--policy", metavar="ONNX",
                   help="an exported controller to generate into the project as C (policy.c/.h)")
    p.add_argument("--quantize", choices=QUANTIZE,
                   help="q15: the policy's hidden layers in 16-bit fixed point (SMLALD on the "
                        "Cortex-M4: 7.5 %% of a 1 kHz period at 168 MHz rather than 10.8 %%; "
                        "within 1e-3 of u_max of onnxruntime, measured and refused beyond); "
                        "int16: the whole MLP in 16-bit integers with 32-bit sums, for the Uno "
                        "(within 2e-2 of u_max, measured and refused beyond; chosen on the uno "
                        "when the float policy's tick is over 25 %% of the period and int16's "
                        "is within)")
    p.add_argument("--simavr", action="store_true",
                   help="uno: then run the sketch on simavr's ATmega328P inside a simulated "
                        "bench (the rig's pendulum, its encoder and motor driver) with UART0 "
                        "on a pseudo-terminal, for grpo-ctrl run --port /dev/pts/N "
                        "[--on-device], until Ctrl-C (processor in the loop, docs/boards.md)")
    p.add_argument("--start-angle", type=number(float, -100.0, 100.0), default=math.pi,
                   metavar="RAD",
                   help="with --simavr: the pendulum's start angle from upright (default pi, "
                        "hanging at rest; another is held until the chip drives the motor)")


def run(args: argparse.Namespace) -> int:
    b = board(args.board)
    if args.simavr and b.family != "avr":
        raise UserError(f"--simavr runs the Uno; the {b.name} runs in QEMU: "
                        + b.next_step.format(out=args.out))
    out = check_folder(args.out)
    sketch = re.sub(r"[^A-Za-z0-9_]", "_", out.resolve().name) or "pendulum_board"
    policy_src, nobs, dt = None, 0, 0.0
    if args.policy:
        import onnx

        from grpo_ctrl.export.session import PolicySession

        # both back-ends are the pendulum with the rig preset's rate and limit
        session = PolicySession(args.policy, system="pendulum", preset="rig")
        nobs, dt = session.nobs, session.dt
        model = onnx.load(args.policy)
        policy_src = controller_c(b, model, args.quantize)
        if args.quantize is None:
            policy_src = _int16_if_it_fits(b, model, policy_src, dt)
    elif args.quantize:
        raise UserError("--quantize applies to the controller: give it with --policy ONNX")
    missing = b.missing()
    fit = None
    if missing is None:
        fit = measure(b, policy_src)
        check_fit(b, fit, nobs)
    elif policy_src is not None and policy_src.size.const_bytes > b.flash:
        raise UserError(f"the controller's weights alone ({policy_src.size.const_bytes} B) exceed "
                        f"the {b.name}'s {b.flash} B of flash")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the folder {str(out)!r}: {e.strerror or e}") from None
    for name, src in project_files(b, sketch).items():
        atomic_write(out / name, src.read_bytes())
    if policy_src is not None:
        atomic_write(out / "policy.h", policy_src.h)
        atomic_write(out / "policy.c", policy_src.c)
    print(f"wrote the {b.description} project to {out}")
    if fit is None:
        print(f"not built: {missing}")
    else:
        print(f"firmware: flash {fit.firmware.flash} B, static RAM {fit.firmware.ram} B "
              f"(of {b.flash} B and {b.ram} B)")
        if policy_src is not None:
            print(f"with the controller linked in: flash {fit.total.flash} B ({fit.const_bytes} B "
                  f"of weights), static RAM {fit.total.ram} B + {fit.scratch} B scratch on the "
                  "stack")
    if policy_src is not None and policy_src.error:
        which = "int16" if getattr(policy_src.size, "int16_macs", 0) else "q15"
        print(f"controller in {which}: {policy_src.error}")
    timing = on_device_timing(b, policy_src, nobs, dt) if policy_src is not None else None
    if timing:
        print(timing)
    if not args.simavr:
        print(b.next_step.format(out=out))
        return 0
    return _run_simavr(b, out, args.start_angle)


def _int16_if_it_fits(b: Board, model, float_src, dt: float):
    """On a board timed on the device (the Uno): the controller in int16
    (``export/int16.py``) where the float C's estimated on-device tick is
    over ``UNO_ON_DEVICE_SHARE`` of the period and int16's is within; the
    float C otherwise, or where int16 does not apply or strays beyond its
    tolerance (said in one line)."""
    from grpo_ctrl.firmware_bridge.board_fit import UNO_ON_DEVICE_SHARE

    if not b.timed_on_device:
        return float_src
    budget = UNO_ON_DEVICE_SHARE * b.clock_hz * dt
    if tick_estimate(b, float_src.size) <= budget:
        return float_src
    try:
        src = controller_c(b, model, "int16")
    except UserError as e:
        print(f"int16 not used: {e}")
        return float_src
    if tick_estimate(b, src.size) > budget:
        return float_src
    print(f"the float controller's on-device tick is over {100 * UNO_ON_DEVICE_SHARE:.0f} % of "
          f"the period on the {b.name} and int16's is within: the controller in int16 "
          "(--quantize int16)")
    return src


def _run_simavr(b: Board, project: Path, angle0: float) -> int:
    """The written sketch on simavr in its bench until Ctrl-C or SIGTERM."""
    missing = simavr_pil_missing(b)
    if missing:
        raise UserError(f"--simavr: {missing}")
    with tempfile.TemporaryDirectory(prefix="grpo_ctrl_simavr_") as tmp:
        elf = build_pil_image(b, Path(tmp), project=project)
        with simavr_pil(b, elf, angle0, Path(tmp)) as (port, proc):
            print(f"simavr: the Uno's UART0 is {port}; in another terminal: grpo-ctrl run "
                  f"--port {port} --on-device (or --policy ONNX); Ctrl-C here ends it",
                  flush=True)
            try:
                proc.wait()
            except KeyboardInterrupt:
                proc.terminate()
            print(proc.stderr.read().strip())
    return 0
