"""A controller on an emulated board: ``target_check`` builds
``firmware/board/target_check.c`` with it, runs it on the board's emulator
(simavr, cycle-accurate; QEMU with -icount) and returns the commands and
the measured counts; on the Cortex-M4F an instruction trace costed by the
Cortex-M4 TRM (``m4_cycles``) adds cycle estimates."""
from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from grpo_ctrl.errors import UserError
from grpo_ctrl.firmware_bridge.board_build import compile_object
from grpo_ctrl.firmware_bridge.board_registry import (ARM_LINK, CORE_FILES, FIRMWARE, Board, _run,
                                                      size_of)


def emulator_missing(b: Board) -> str | None:
    if shutil.which(b.emulator) is None:
        return f"{b.emulator} is not installed; apt-get install {b.emulator_package}"
    return b.missing()


def _avr_check_image(b: Board, folder: Path, objs: list, elf: Path) -> list:
    """Link the check image for simavr; its command line."""
    _run([b.cc, *b.target_flags, *b.opt, "-fuse-linker-plugin", "-Wl,--gc-sections",
          *objs, "-o", elf, "-lm"], "linking the check image")
    return [b.emulator, "-m", b.check_machine, "-f", str(b.clock_hz), elf]


def _arm_check_image(b: Board, folder: Path, objs: list, elf: Path) -> list:
    """Link the check image for QEMU (startup and linker script of the
    bare-metal back-end); its command line."""
    start = compile_object(b, FIRMWARE / "board" / "mps2_an386" / "startup.c",
                           folder / "startup.o")
    _run([b.cc, *b.target_flags, *ARM_LINK, "-T",
          FIRMWARE / "board" / "mps2_an386" / "mps2_an386.ld", start, *objs, "-o", elf,
          "-lm"], "linking the check image")
    return [b.emulator, "-M", b.check_machine, "-nographic", "-monitor", "none",
            "-serial", "stdio", "-semihosting-config", "enable=on,target=native",
            "-icount", "shift=0", "-kernel", elf]


CHECK_IMAGE = {"avr": _avr_check_image, "arm": _arm_check_image}


def _check_data(obs) -> str:
    import numpy as np

    body = ", ".join(f"{float(v):.9g}f" for v in np.asarray(obs, np.float32).reshape(-1))
    return f"""#include <stdint.h>
#define CHECK_N {len(obs)}u
#if defined(__AVR__)
#include <avr/pgmspace.h>
static const float CHECK_TABLE[] PROGMEM = {{{body}}};
#define CHECK_OBS(i) pgm_read_float(&CHECK_TABLE[i])
#else
static const float CHECK_TABLE[] = {{{body}}};
#define CHECK_OBS(i) (CHECK_TABLE[i])
#endif
"""


def target_check(b: Board, policy_src, obs, timeout: float = 300.0,
                 cycles: bool = False) -> dict:
    """Build ``firmware/board/target_check.c`` with the controller for board
    ``b``, run it on the emulator, and return ``out`` (the commands for
    ``obs``, float32), per-call ``tick``, ``receive`` and ``policy`` counts
    in cycles (AVR) or instructions (Cortex-M4F, QEMU -icount), ``mode``,
    ``image`` (the check image's Sizes: core + controller, no board
    back-end), on AVR ``stack`` (bytes) and, with ``cycles`` on the
    Cortex-M4F, ``cycles``: per call the Cortex-M4 TRM estimate from an
    instruction trace (``_m4_cycles``; a second QEMU run, a few seconds)."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="grpo_ctrl_check_") as tmp:
        folder = Path(tmp)
        for n in CORE_FILES:
            shutil.copyfile(FIRMWARE / n, folder / n)
        shutil.copyfile(FIRMWARE / "board" / "target_check.c", folder / "target_check.c")
        (folder / f"{policy_src.name}.c").write_text(policy_src.c)
        (folder / f"{policy_src.name}.h").write_text(policy_src.h)
        (folder / "check_data.h").write_text(_check_data(obs))
        elf = folder / "check.elf"
        srcs = [folder / n for n in ("target_check.c", "fw_core.c", "proto.c", "policy.c")]
        # whether it fits the Uno is the sketch build's measurement: the check image
        # goes on a larger chip of the same core (Board.check_board)
        b = b.check_board
        # -fno-ipa-icf: the measured_* wrappers stay apart (target_check.c)
        objs = [compile_object(b, c, folder / f"{c.name}.o",
                               ("-fno-ipa-icf",) if c.name == "target_check.c" else (), (folder,))
                for c in srcs]
        cmd = CHECK_IMAGE[b.family](b, folder, objs, elf)
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                              timeout=timeout)
        image = size_of(b, elf)
        estimate = (TRACE[b.family](cmd, elf, folder, timeout)
                    if cycles and b.family in TRACE else None)
    text = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)  # simavr: stderr
    items = re.findall(r"\b(out|tick|ondevice|receive|policy|reps|mode|stack|done)\b ?([0-9a-f]*)",
                       text)
    if not items or items[-1][0] != "done":
        raise UserError(f"the check image did not finish on {cmd[0]}: {text[-500:]}")
    outs = np.array([int(v, 16) for k, v in items if k == "out"], np.uint32).view(np.float32)
    res = {k: int(v) for k, v in items if k not in ("out", "done")}
    reps = res.pop("reps")
    for k in ("tick", "ondevice", "receive", "policy"):
        res[k] = res[k] * b.count_unit / reps
    res["out"] = outs
    res["image"] = image
    if estimate is not None:
        res["cycles"] = estimate
    return res


MEASURED = ("tick", "receive", "policy", "ondevice")  # target_check.c's measured_<name>


def _m4_cycles(cmd: list, elf: Path, folder: Path, timeout: float) -> dict:
    """The check image again on QEMU with every executed instruction logged,
    costed by the Cortex-M4 TRM's timings (``m4_cycles``): per measured call,
    mean ``instructions``, estimated ``cycles``, ``refills`` (taken branches,
    each ``m4_cycles.REFILL`` of the cycles) and, for the on-device tick,
    the cycles ``by_symbol``."""
    from grpo_ctrl.firmware_bridge import m4_cycles

    log = folder / "trace.log"
    subprocess.run([str(c) for c in cmd[:-2]] + ["-singlestep", "-d", "exec,nochain", "-D",
                                                 str(log), "-kernel", str(elf)],
                   capture_output=True, timeout=timeout, check=True)
    syms = m4_cycles.symbols(elf)
    calls = m4_cycles.calls(m4_cycles.trace_pcs(log), m4_cycles.disassemble(elf),
                            {k: syms[f"measured_{k}"] for k in MEASURED})
    out = {k: {w: calls[k].mean(w) for w in ("instructions", "cycles", "refills")}
           for k in MEASURED}
    n = len(calls["ondevice"].cycles)
    out["ondevice"]["by_symbol"] = {s: c / n for s, c in sorted(
        calls["ondevice"].by_symbol.items(), key=lambda kv: -kv[1])}
    return out


TRACE = {"arm": _m4_cycles}  # a family's cycle estimate from an instruction trace


# ---------------------------------------------------------------- the Uno in the loop
PIL_RUNNER = FIRMWARE / "board" / "simavr_pil.c"
SIMAVR_HEADERS = Path("/usr/include/simavr")
SIMAVR_DEV = "libsimavr-dev libsimavrparts1"
# the sketch's watchdog under simavr: the host's keep-alives cross a pty and simavr's UART
# thread (two periods, the sketch's own, trip on the first stall of a loaded host)
PIL_WATCHDOG_US = 200_000


def simavr_pil_missing(b: Board) -> str | None:
    """None when the Uno's processor-in-the-loop can run here, else what to install."""
    if b.family != "avr":
        return f"the simavr processor-in-the-loop is the Uno's; the {b.name} runs in QEMU"
    missing = emulator_missing(b)
    if missing:
        return missing
    if shutil.which("cc") is None or not (SIMAVR_HEADERS / "parts" / "uart_pty.h").is_file():
        return ("the simavr processor-in-the-loop needs a host C compiler and simavr's library "
                f"and parts; apt-get install gcc {SIMAVR_DEV}")
    return None


def build_pil_runner(folder: Path) -> Path:
    """``firmware/board/simavr_pil.c`` (the bench around the chip: the csrc/
    pendulum, its encoder, the H-bridge, the UART on a pty) for this host."""
    from grpo_ctrl.firmware_bridge.board_registry import CSRC, PLANT_SOURCES

    exe = folder / "simavr_pil"
    _run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-ffp-contract=off", f"-I{CSRC}",
          f"-I{SIMAVR_HEADERS}", PIL_RUNNER, *[CSRC / n for n in PLANT_SOURCES], "-o", exe,
          "-lsimavrparts", "-lsimavr", "-lpthread", "-lm"], "building the simavr bench")
    return exe


def build_pil_image(b: Board, folder: Path, policy_src=None, project: Path | None = None) -> Path:
    """The Uno sketch as it is uploaded (``project``, a folder ``grpo-ctrl
    firmware`` wrote, or the sketch staged with ``policy_src`` linked in),
    its watchdog ``PIL_WATCHDOG_US``: the image simavr runs, in ``folder``."""
    from grpo_ctrl.firmware_bridge.board_build import build_image, stage

    project = project or stage(b, folder / "sketch", policy_src)
    return build_image(b, project, folder / "build",
                       defines=(f"-DBOARD_WATCHDOG_US={PIL_WATCHDOG_US}u",))


@contextlib.contextmanager
def simavr_pil(b: Board, elf: Path, angle0: float = 0.1, folder: Path | None = None):
    """Run ``elf`` (``build_pil_image``) on simavr's ATmega328P with the
    bench around it; yields ``(pty, process)``: its UART0 on ``/dev/pts/N``
    for ``grpo-ctrl run --port``. On leaving, the bench is stopped (SIGTERM:
    it prints its chip time against wall time on stderr)."""
    missing = simavr_pil_missing(b)
    if missing:
        raise UserError(missing)
    with tempfile.TemporaryDirectory(prefix="grpo_ctrl_pil_") as tmp:
        exe = build_pil_runner(Path(folder or tmp))
        proc = subprocess.Popen([str(exe), str(elf), repr(float(angle0))],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            port = None
            for line in proc.stdout:  # simavr's own lines first
                if line.startswith("pty "):
                    port = line.split()[1]
                    break
            if port is None:
                raise UserError(f"simavr did not offer a pty: {proc.stderr.read()[-500:]}")
            yield port, proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
