"""``grpo-ctrl firmware``: a ready firmware project for a board, built and sized
with Debian's cross toolchains.

    grpo-ctrl firmware --board uno --out pendulum_board
    grpo-ctrl firmware --board mps2-an386 --out pil --policy policy.onnx

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
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grpo_ctrl.errors import UserError
from grpo_ctrl.files import atomic_write, check_folder

FIRMWARE = Path(__file__).resolve().parent / "firmware"
CSRC = Path(__file__).resolve().parent.parent / "csrc"
ARDUINO_AVR = Path("/usr/share/arduino/hardware/arduino/avr")
WARNINGS = ("-Wall", "-Wextra", "-Werror")
CORE_FILES = ("fw_core.c", "fw_core.h", "fw_hw.h", "proto.c", "proto.h")


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    cc: str                 # the C compiler
    size_tool: str
    apt: str                # Debian packages that provide the toolchain
    flash: int              # bytes for the program
    ram: int                # bytes of SRAM
    clock_hz: int
    target_flags: tuple     # machine flags, for every file
    stack_reserve: int      # RAM left free for the stack besides a policy's scratch
    pack_weights: bool = False  # large weight arrays packed losslessly (c_codegen._packed)
    block: int = 1          # outputs per pass of the controller's matrix products (c_codegen)

    def missing(self) -> str | None:
        """None when the toolchain is installed, else a message naming the packages."""
        tools = [self.cc, self.size_tool]
        if self.name == "uno":
            tools.append("avr-g++")
        absent = [t for t in tools if shutil.which(t) is None]
        if self.name == "uno" and not (ARDUINO_AVR / "cores" / "arduino" / "Arduino.h").is_file():
            absent.append(str(ARDUINO_AVR))
        if absent:
            return (f"the {self.name} toolchain is not installed ({', '.join(absent)} missing); "
                    f"apt-get install {self.apt}")
        return None


BOARDS = {
    "uno": Board(
        "uno", "Arduino Uno: ATmega328P, 16 MHz, 8-bit AVR", "avr-gcc", "avr-size",
        "gcc-avr avr-libc arduino-core-avr", flash=32256,  # 32 KiB less the 512 B Optiboot
        ram=2048, clock_hz=16_000_000,
        target_flags=("-mmcu=atmega328p", "-DF_CPU=16000000L", "-DARDUINO=10807",
                      "-DARDUINO_AVR_UNO", "-DARDUINO_ARCH_AVR"),
        stack_reserve=256, pack_weights=True),  # 3.5 B a weight: the default policy fits
    "mps2-an386": Board(
        "mps2-an386", "Arm MPS2 AN386: Cortex-M4F, 25 MHz (QEMU -M mps2-an386)",
        "arm-none-eabi-gcc", "arm-none-eabi-size", "gcc-arm-none-eabi libnewlib-arm-none-eabi",
        flash=4 << 20, ram=4 << 20, clock_hz=25_000_000,
        target_flags=("-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16"),
        stack_reserve=4096, block=16),
}
# optimisation as each platform's tools set it (the Arduino AVR platform links with LTO)
_OPT = {"uno": ("-Os", "-ffunction-sections", "-fdata-sections", "-flto", "-fno-fat-lto-objects"),
        # -O2 -funroll-loops: the policy's dot products unrolled (its inner loop
        # 5 instructions a multiply-add rather than 7 at -Os; flash is plenty)
        "mps2-an386": ("-O2", "-funroll-loops", "-ffunction-sections", "-fdata-sections")}
# target_check's AVR: the ATmega1284P has the 328P's core and instruction timings
# and 128 KB of flash, so that the core, any controller and the check's data fit
CHECK_AVR = dataclasses.replace(
    BOARDS["uno"], name="uno", target_flags=("-mmcu=atmega1284p", "-DF_CPU=16000000L"))
ARM_LINK = ("-nostartfiles", "-Wl,--gc-sections", "--specs=nano.specs", "--specs=nosys.specs")
MPS2_FILES = ("board_mps2.c", "startup.c", "mps2_an386.ld")
PLANT_SOURCES = ("pendsim.c", "plants.c")  # and every header of csrc/


@dataclass
class Sizes:
    text: int
    data: int
    bss: int

    @property
    def flash(self) -> int:
        return self.text + self.data

    @property
    def ram(self) -> int:
        return self.data + self.bss


def board(name: str) -> Board:
    if name not in BOARDS:
        raise UserError(f"unknown board {name!r}; choose one of {', '.join(BOARDS)}")
    return BOARDS[name]


def _run(cmd: list, what: str) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if proc.returncode:
        raise UserError(f"{what} failed ({' '.join(map(str, cmd[:3]))} ...):\n"
                        f"{(proc.stderr or proc.stdout).strip()[-3000:]}")
    return proc.stdout


def size_of(b: Board, path: Path) -> Sizes:
    """text, data and bss of an object or image, from the board's ``size`` tool."""
    line = _run([b.size_tool, path], "size").strip().splitlines()[-1].split()
    return Sizes(int(line[0]), int(line[1]), int(line[2]))


# ---------------------------------------------------------------- the project
def project_files(b: Board, sketch: str = "pendulum_board") -> dict[str, Path]:
    """Destination name -> source file of the project for board ``b``."""
    board_dir = FIRMWARE / "board"
    if not (FIRMWARE / "fw_core.c").is_file():
        raise UserError(f"no firmware sources at {FIRMWARE}: they ship with the source tree; "
                        "run from a clone installed with pip install -e .")
    files = {n: FIRMWARE / n for n in CORE_FILES}
    files["policy_link.h"] = board_dir / "policy_link.h"
    if b.name == "uno":
        files[f"{sketch}.ino"] = board_dir / "pendulum_board.ino"
        for n in ("board_pendulum.c", "board_pendulum.h", "arduino_api.h"):
            files[n] = board_dir / n
    else:
        for n in MPS2_FILES:
            files[n] = board_dir / "mps2_an386" / n
        for src in [CSRC / n for n in PLANT_SOURCES] + sorted(CSRC.glob("*.h")):
            files[src.name] = src
        files["Makefile"] = board_dir / "mps2_an386" / "Makefile"
    return files


def stage(b: Board, folder: Path, policy_src=None, sketch: str = "pendulum_board") -> Path:
    """Copy the project into ``folder`` (and the generated controller, a
    ``c_codegen.CSource``, when given)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, src in project_files(b, sketch).items():
        shutil.copyfile(src, folder / name)
    if policy_src is not None:
        (folder / f"{policy_src.name}.c").write_text(policy_src.c)
        (folder / f"{policy_src.name}.h").write_text(policy_src.h)
    return folder


# ---------------------------------------------------------------- building
def compile_object(b: Board, c_file: Path, out: Path, defines=(), includes=()) -> Path:
    """One of our C files for the board, at -Werror."""
    if out.exists():
        return out
    std = "-std=gnu11" if b.name == "uno" else "-std=c99"  # as the Arduino tools / plain C99
    _run([b.cc, *b.target_flags, std, *WARNINGS, *_OPT[b.name],
          *defines, *[f"-I{i}" for i in includes], "-c", c_file, "-o", out],
         f"compiling {c_file.name} for {b.name}")
    return out


def _arduino_core(b: Board, build: Path) -> list[Path]:
    """The Arduino core's objects, built as the Arduino tools build them
    (warnings off: it is not our code)."""
    core, variant = ARDUINO_AVR / "cores" / "arduino", ARDUINO_AVR / "variants" / "standard"
    objs = []
    for src in sorted(core.iterdir()):
        if src.suffix not in (".c", ".cpp", ".S"):
            continue
        cc = "avr-g++" if src.suffix == ".cpp" else b.cc
        # Debian's gcc-avr 5.4 gives C++ no DECIMAL_DIG (its float.h: C99 only), which
        # the core's WString.cpp needs: the value the compiler gives C
        extra = (["-std=gnu++11", "-fpermissive", "-fno-exceptions", "-fno-threadsafe-statics",
                  "-DDECIMAL_DIG=__DECIMAL_DIG__"]
                 if src.suffix == ".cpp" else ["-x", "assembler-with-cpp"] if src.suffix == ".S"
                 else ["-std=gnu11"])
        obj = build / f"core_{src.name}.o"
        if obj.exists():
            objs.append(obj)
            continue
        _run([cc, *b.target_flags, *extra, "-w", *_OPT[b.name],
              f"-I{core}", f"-I{variant}", "-c", src, "-o", obj], f"compiling the Arduino core {src.name}")
        objs.append(obj)
    return objs


def build_image(b: Board, project: Path, build: Path, defines=(), name: str = "firmware",
                unbounded: bool = False) -> Path:
    """Build the project in ``project`` into ``build/<name>.elf``; objects
    already in ``build`` are reused. ``unbounded``: link even an image that
    overflows the chip (to measure by how much; AVR only)."""
    build.mkdir(parents=True, exist_ok=True)
    link_extra = []
    if unbounded and b.name == "uno":  # avr-ld's regions, widened for the measurement
        link_extra += ["-Wl,--defsym=__TEXT_REGION_LENGTH__=0x40000",
                 "-Wl,--defsym=__DATA_REGION_LENGTH__=0x10000"]
    elf = build / f"{name}.elf"
    if b.name == "uno":
        core, variant = ARDUINO_AVR / "cores" / "arduino", ARDUINO_AVR / "variants" / "standard"
        inc = (project, core, variant)
        objs = [compile_object(b, c, build / f"{c.name}.o", defines, inc)
                for c in sorted(project.glob("*.c"))]
        for ino in project.glob("*.ino"):  # the Arduino tools add Arduino.h to the sketch
            cpp = build / f"{ino.name}.cpp"
            cpp.write_text(f'#include <Arduino.h>\n#line 1 "{ino.name}"\n' + ino.read_text())
            obj = build / f"{ino.name}.o"
            if obj.exists():
                objs.append(obj)
                continue
            _run(["avr-g++", *b.target_flags, "-std=gnu++11", "-fno-exceptions",
                  "-fno-threadsafe-statics", *WARNINGS, *_OPT[b.name], *defines, *[f"-I{i}" for i in inc], "-c", cpp, "-o", obj],
                 f"compiling {ino.name} for {b.name}")
            objs.append(obj)
        # the core goes in as an archive, as the Arduino tools link it: only
        # the members something needs (Tone.cpp's timer interrupt stays out)
        core_a = build / "core.a"
        if not core_a.exists():
            _run(["avr-gcc-ar", "rcs", core_a, *_arduino_core(b, build)], "archiving the core")
        _run([b.cc, *b.target_flags, *_OPT[b.name], "-fuse-linker-plugin", "-Wl,--gc-sections",
              *link_extra, *objs, core_a, f"-L{build}", "-o", elf, "-lm"],
             f"linking the {b.name} image")
    else:
        inc = (project,)
        objs = [compile_object(b, c, build / f"{c.name}.o", defines, inc)
                for c in sorted(project.glob("*.c"))]
        _run([b.cc, *b.target_flags, *ARM_LINK, *link_extra, "-T", project / "mps2_an386.ld", *objs,
              "-o", elf, "-lm"], f"linking the {b.name} image")
    return elf


# ---------------------------------------------------------------- fitting
def controller_c(b: Board, model, quantize: str | None = None):
    """The generated C of ``model`` (ONNX) as board ``b`` links it: on the
    Uno the hidden-to-hidden weights packed (3.5 B a float, lossless); on the
    Cortex-M4F sixteen outputs per pass: sixteen accumulators, eight weights
    a VLDM and the input fill its 32 FPU registers without a spill.
    ``quantize="q15"``: the hidden layers in fixed point
    (``c_build.quantized_c``: calibrated, its error measured on the host)."""
    from grpo_ctrl.export.c_build import quantized_c
    from grpo_ctrl.export.c_codegen import generate_c

    if quantize:
        return quantized_c(model, "policy", pack=b.pack_weights, block=b.block)
    return generate_c(model, "policy", pack=b.pack_weights, block=b.block)


def widened(model, h: int, seed: int | None = None):
    """A copy of ``model``, a nobs-H-H-1 MLP like the rig policy (weights named
    net.0/2/4), with random h-wide hidden layers: for sizes and timing."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    rng = np.random.default_rng(h if seed is None else seed)
    nobs = next(numpy_helper.to_array(t).shape[1] for t in model.graph.initializer
                if t.name == "net.0.weight")
    shapes = {"net.0.weight": (h, nobs), "net.0.bias": (h,), "net.2.weight": (h, h),
              "net.2.bias": (h,), "net.4.weight": (1, h)}
    for t in model.graph.initializer:
        if t.name in shapes:
            t.CopyFrom(numpy_helper.from_array(
                (rng.standard_normal(shapes[t.name]) * 0.1).astype(np.float32), t.name))
    return model


def largest_mlp(nobs: int, weight_bytes: int, packed: bool = False) -> int:
    """Widest hidden layer H of an nobs-H-H-1 float network (with input
    normalisation) whose constants take at most ``weight_bytes`` (``packed``:
    the H x H weights at 3.5 B each, plus their 16-byte table)."""
    if weight_bytes <= 0:
        return 0
    # 4 (nobs H + H + H + H + 2 nobs) + w H^2 <= bytes, w = 4 or 3.5 (+ 16 packed);
    # the output bias is a literal in the code
    w = 3.5 if packed else 4.0
    a, b_, c = w / 4, nobs + 3.0, 2 * nobs - (weight_bytes - (16 if packed else 0)) / 4
    h = int((-b_ + math.sqrt(b_ * b_ - 4 * a * c)) / (2 * a)) if b_ * b_ - 4 * a * c >= 0 else 0
    return max(h, 0)


@dataclass
class Fit:
    firmware: Sizes         # the image without a controller
    total: Sizes            # with the controller linked in (the same as firmware without one)
    const_bytes: int        # the controller's weights and tables
    scratch: int            # the controller's stack scratch


_BARE_SIZES: dict = {}  # (board, digest of the project's files) -> Sizes


def _bare_size(b: Board, tmp: Path) -> Sizes:
    """The image without a controller, built once per board and per content
    of its sources (a process that measures several controllers builds it once)."""
    digest = hashlib.sha256()
    for name, src in sorted(project_files(b).items()):
        digest.update(name.encode() + b"\0" + src.read_bytes())
    key = (b, digest.hexdigest())
    if key not in _BARE_SIZES:
        _BARE_SIZES[key] = size_of(b, build_image(b, stage(b, tmp / "bare"), tmp / "build",
                                                  unbounded=True))
    return _BARE_SIZES[key]


def measure(b: Board, policy_src=None) -> Fit:
    """Build the board's image in a temporary folder, without and with the
    controller (which the back-end links in as the on-device controller
    where the project has a policy.h), and measure both."""
    with tempfile.TemporaryDirectory(prefix="grpo_ctrl_fw_") as tmp:
        firmware = total = _bare_size(b, Path(tmp))
        if policy_src is not None:
            project = stage(b, Path(tmp) / "with_controller", policy_src)
            total = size_of(b, build_image(b, project, Path(tmp) / "build_c", unbounded=True))
    return Fit(firmware, total, policy_src.size.const_bytes if policy_src else 0,
               policy_src.size.ram_bytes if policy_src else 0)


def check_fit(b: Board, fit: Fit, nobs: int) -> None:
    """UserError with the sizes and the largest network that fits, if it does not."""
    ram_need = fit.total.ram + fit.scratch + b.stack_reserve
    if fit.total.flash <= b.flash and ram_need <= b.ram:
        return
    room = b.flash - (fit.total.flash - fit.const_bytes)
    h = largest_mlp(nobs, room, b.pack_weights)
    raise UserError(
        f"the controller does not fit the {b.name}: flash {fit.total.flash} B with the controller "
        f"linked in ({fit.firmware.flash} B without it; {fit.const_bytes} B of weights) of "
        f"{b.flash} B; RAM {fit.total.ram} B static + {fit.scratch} B scratch + "
        f"{b.stack_reserve} B stack = {ram_need} B of {b.ram} B. The largest "
        f"{nobs}-H-H-1 network that fits has H = {h}" +
        ("" if h else " (none does)") + "; train a smaller one (grpo-ctrl train --hidden ...)")


# ---------------------------------------------------------------- time on the Uno
# The Uno's on-device tick (fw_tick with the core calling the policy: the
# observation, the policy, the clamp, the STATE frame), in CPU cycles:
# UNO_TICK_FIXED + UNO_MAC a multiply-add (UNO_PACKED_MAC where the weight is
# read packed). Measured on simavr (cycle-accurate) for the rig policy's graph
# with 3-H-H-1 weights, H = 1 to 64 (python benchmarks/bench_boards.py
# --uno-widths 1,2,3,4,8,12,16,24,64): within about 10 % of each (software
# floating point takes data-dependent time). An estimate for a controller
# like that graph (normalisation, Relu layers, tanh, clip).
UNO_TICK_FIXED, UNO_MAC, UNO_PACKED_MAC = 15400, 300, 315
# --quantize q15 (its plain-C integers on AVR): a multiply-add and, per input
# quantised or output converted back, the soft-float work around the
# integers; fitted to the q15 rig graph at H = 2, 4, 8 and 64 on simavr
# (within 2.2 % of each)
UNO_Q15_MAC, UNO_Q15_IO = 138, 423
UNO_ON_DEVICE_SHARE = 0.25  # of the period: the goal for the on-device tick


def uno_tick_estimate(macs: int, packed_macs: int = 0, q15_macs: int = 0,
                      q15_io: int = 0) -> float:
    """Estimated cycles of the Uno's on-device tick for a controller with
    ``macs`` multiply-adds (``packed_macs`` of them on packed weights,
    ``q15_macs`` in q15 with ``q15_io`` inputs and outputs)."""
    floats = macs - packed_macs - q15_macs
    return (UNO_TICK_FIXED + UNO_MAC * floats + UNO_PACKED_MAC * packed_macs +
            UNO_Q15_MAC * q15_macs + UNO_Q15_IO * q15_io)


def uno_widest_in_time(nobs: int, cycles: float) -> int:
    """Widest H of an nobs-H-H-1 network whose estimated on-device tick
    takes at most ``cycles`` (0: none)."""
    h = 0
    while True:
        w = h + 1
        square = w * w  # packed where generate_c(pack=True) would pack it (_packed)
        packed = square if square >= 256 else 0
        if uno_tick_estimate(nobs * w + square + w, packed) > cycles:
            return h
        h = w


def on_device_timing(b: Board, policy_src, nobs: int, dt: float) -> str | None:
    """A line on whether the Uno can run the controller on the chip at the
    period dt (None on other boards)."""
    if b.name != "uno":
        return None
    size = policy_src.size
    est = uno_tick_estimate(size.macs, size.packed_macs, size.q15_macs, size.q15_io)
    budget = b.clock_hz * dt
    share = est / budget
    h = uno_widest_in_time(nobs, UNO_ON_DEVICE_SHARE * budget)
    verdict = ("within" if share <= UNO_ON_DEVICE_SHARE else "over") + \
        f" the {100 * UNO_ON_DEVICE_SHARE:.0f} % goal"
    return (f"on-device control, estimated from simavr measurements: about {est:,.0f} cycles a "
            f"tick ({size.macs} multiply-adds) = {1e3 * est / b.clock_hz:.1f} ms, "
            f"{100 * share:.0f} % of the {1 / dt:.0f} Hz period, {verdict}" +
            ("" if share <= 1 else "; the chip cannot run it at this rate (every tick late)") +
            f". The widest {nobs}-H-H-1 network within {100 * UNO_ON_DEVICE_SHARE:.0f} % has "
            f"H = {h}; host-computed control is unaffected")


# ---------------------------------------------------------------- on an emulated MCU
EMULATOR = {"uno": ("simavr", "simavr"), "mps2-an386": ("qemu-system-arm", "qemu-system-arm")}
# what one count of target_check.c is: AVR cycles; SysTick periods at 25 MHz,
# 40 instructions each under QEMU's -icount shift=0
COUNT_UNIT = {"uno": 1, "mps2-an386": 40}


def emulator_missing(b: Board) -> str | None:
    tool, package = EMULATOR[b.name]
    if shutil.which(tool) is None:
        return f"{tool} is not installed; apt-get install {package}"
    return b.missing()


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
        if b.name == "uno":  # whether it fits the Uno is the sketch build's measurement
            b = CHECK_AVR
        # -fno-ipa-icf: the measured_* wrappers stay apart (target_check.c)
        objs = [compile_object(b, c, folder / f"{c.name}.o",
                               ("-fno-ipa-icf",) if c.name == "target_check.c" else (), (folder,))
                for c in srcs]
        if b is CHECK_AVR:
            _run([b.cc, *b.target_flags, *_OPT[b.name], "-fuse-linker-plugin", "-Wl,--gc-sections",
                  *objs, "-o", elf, "-lm"], "linking the check image")
            cmd = ["simavr", "-m", "atmega1284p", "-f", str(b.clock_hz), elf]
        else:
            start = compile_object(b, FIRMWARE / "board" / "mps2_an386" / "startup.c",
                                   folder / "startup.o")
            _run([b.cc, *b.target_flags, *ARM_LINK, "-T",
                  FIRMWARE / "board" / "mps2_an386" / "mps2_an386.ld", start, *objs, "-o", elf,
                  "-lm"], "linking the check image")
            cmd = ["qemu-system-arm", "-M", "mps2-an386", "-nographic", "-monitor", "none",
                   "-serial", "stdio", "-semihosting-config", "enable=on,target=native",
                   "-icount", "shift=0", "-kernel", elf]
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                              timeout=timeout)
        image = size_of(b, elf)
        estimate = _m4_cycles(cmd, elf, folder, timeout) if cycles and b.name == "mps2-an386" \
            else None
    text = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)  # simavr: stderr
    items = re.findall(r"\b(out|tick|ondevice|receive|policy|reps|mode|stack|done)\b ?([0-9a-f]*)",
                       text)
    if not items or items[-1][0] != "done":
        raise UserError(f"the check image did not finish on {cmd[0]}: {text[-500:]}")
    outs = np.array([int(v, 16) for k, v in items if k == "out"], np.uint32).view(np.float32)
    res = {k: int(v) for k, v in items if k not in ("out", "done")}
    reps = res.pop("reps")
    for k in ("tick", "ondevice", "receive", "policy"):
        res[k] = res[k] * COUNT_UNIT[b.name] / reps
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
                        "within 1e-3 of u_max of onnxruntime, measured and refused beyond)")


def run(args: argparse.Namespace) -> int:
    b = board(args.board)
    out = check_folder(args.out)
    sketch = re.sub(r"[^A-Za-z0-9_]", "_", out.resolve().name) or "pendulum_board"
    policy_src, nobs, dt = None, 0, 0.0
    if args.policy:
        import onnx

        from grpo_ctrl.export.session import PolicySession

        # both back-ends are the pendulum with the rig preset's rate and limit
        session = PolicySession(args.policy, system="pendulum", preset="rig")
        nobs, dt = session.nobs, session.dt
        policy_src = controller_c(b, onnx.load(args.policy), args.quantize)
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
        print(f"controller in q15: {policy_src.error}")
    timing = on_device_timing(b, policy_src, nobs, dt) if policy_src is not None else None
    if timing:
        print(timing)
    if b.name == "uno":
        print(f"upload: arduino-cli compile --fqbn arduino:avr:uno {out} && arduino-cli upload "
              f"-p /dev/ttyACM0 --fqbn arduino:avr:uno {out}")
    else:
        print(f"build: make -C {out}; run: qemu-system-arm -M mps2-an386 -nographic -monitor none "
              f"-serial pty -kernel {out}/firmware.elf, then grpo-ctrl run --port /dev/pts/N")
    return 0
