"""The boards ``grpo-ctrl firmware`` targets: one record each, holding all
that differs between them (toolchain, flags, project layout, emulator,
what a count of the check image is), so that building (``board_build``),
fitting (``board_fit``) and emulating (``board_emulate``) read the record and
never test a board's name.
"""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from grpo_ctrl.errors import UserError

FIRMWARE = Path(__file__).resolve().parent / "firmware"
CSRC = Path(__file__).resolve().parent.parent / "csrc"
ARDUINO_AVR = Path("/usr/share/arduino/hardware/arduino/avr")
ARDUINO_CORE, ARDUINO_VARIANT = ARDUINO_AVR / "cores" / "arduino", ARDUINO_AVR / "variants" / "standard"
WARNINGS = ("-Wall", "-Wextra", "-Werror")
CORE_FILES = ("fw_core.c", "fw_core.h", "fw_hw.h", "proto.c", "proto.h")
ARM_LINK = ("-nostartfiles", "-Wl,--gc-sections", "--specs=nano.specs", "--specs=nosys.specs")
MPS2_FILES = ("board_mps2.c", "startup.c", "mps2_an386.ld")
PLANT_SOURCES = ("pendsim.c", "plants.c")  # and every header of csrc/


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    family: str             # "avr": an Arduino sketch, simavr; "arm": bare metal, QEMU
    cc: str                 # the C compiler
    size_tool: str
    apt: str                # Debian packages that provide the toolchain
    flash: int              # bytes for the program
    ram: int                # bytes of SRAM
    clock_hz: int
    target_flags: tuple     # machine flags, for every file
    opt: tuple              # optimisation, as each platform's tools set it
    c_std: str              # as the Arduino tools / plain C99
    stack_reserve: int      # RAM left free for the stack besides a policy's scratch
    emulator: str           # the emulator of target_check, and its Debian package
    emulator_package: str
    count_unit: int         # what one count of target_check.c is, in cycles or instructions
    next_step: str          # how to build or upload the written project ({out}: its folder)
    extra_tools: tuple = ()  # more programs the build runs
    extra_files: tuple = ()  # (folder, a file in it) the build needs besides the tools
    unbounded_link: tuple = ()  # link flags that let an overflowing image link (to measure it)
    check_flags: tuple = ()  # target_check's machine flags, where they differ
    check_machine: str = ""  # the emulated machine of target_check
    pack_weights: bool = False  # large weight arrays packed losslessly (c_avr._packed)
    block: int = 1          # outputs per pass of the controller's matrix products (c_graph)
    timed_on_device: bool = False  # board_fit's simavr-fitted tick estimate applies
    # the on-device tick (fw_tick calling the policy) in cycles, board_fit.tick_estimate:
    # fixed + a float multiply-add, one on packed weights, one in q15, a q15 input or output
    tick_model: tuple = (0.0, 0.0, 0.0, 0.0, 0.0)

    def missing(self) -> str | None:
        """None when the toolchain is installed, else a message naming the packages."""
        absent = [t for t in (self.cc, self.size_tool, *self.extra_tools) if shutil.which(t) is None]
        absent += [folder for folder, marker in self.extra_files
                   if not (Path(folder) / marker).is_file()]
        if absent:
            return (f"the {self.name} toolchain is not installed ({', '.join(absent)} missing); "
                    f"apt-get install {self.apt}")
        return None

    @property
    def check_board(self) -> "Board":
        """The board target_check builds for: the ATmega1284P stands in for the
        Uno (the 328P's core and instruction timings, and 128 KB of flash, so
        that the core, any controller and the check's data fit)."""
        if not self.check_flags:
            return self
        return dataclasses.replace(self, target_flags=self.check_flags)


BOARDS = {
    "uno": Board(
        "uno", "Arduino Uno: ATmega328P, 16 MHz, 8-bit AVR", "avr", "avr-gcc", "avr-size",
        "gcc-avr avr-libc arduino-core-avr", flash=32256,  # 32 KiB less the 512 B Optiboot
        ram=2048, clock_hz=16_000_000,
        target_flags=("-mmcu=atmega328p", "-DF_CPU=16000000L", "-DARDUINO=10807",
                      "-DARDUINO_AVR_UNO", "-DARDUINO_ARCH_AVR"),
        # the Arduino AVR platform links with LTO
        opt=("-Os", "-ffunction-sections", "-fdata-sections", "-flto", "-fno-fat-lto-objects"),
        c_std="-std=gnu11", stack_reserve=256,
        emulator="simavr", emulator_package="simavr", count_unit=1,  # AVR cycles
        next_step="upload: arduino-cli compile --fqbn arduino:avr:uno {out} && arduino-cli "
                  "upload -p /dev/ttyACM0 --fqbn arduino:avr:uno {out}",
        extra_tools=("avr-g++",), extra_files=((str(ARDUINO_AVR), "cores/arduino/Arduino.h"),),
        # avr-ld's regions, widened for the measurement
        unbounded_link=("-Wl,--defsym=__TEXT_REGION_LENGTH__=0x40000",
                        "-Wl,--defsym=__DATA_REGION_LENGTH__=0x10000"),
        check_flags=("-mmcu=atmega1284p", "-DF_CPU=16000000L"), check_machine="atmega1284p",
        pack_weights=True,  # 3.5 B a weight: the default policy fits
        timed_on_device=True,
        # simavr's cycle counts (board_fit's UNO_* constants)
        tick_model=(15400.0, 300.0, 315.0, 138.0, 423.0)),
    "mps2-an386": Board(
        "mps2-an386", "Arm MPS2 AN386: Cortex-M4F, 25 MHz (QEMU -M mps2-an386)", "arm",
        "arm-none-eabi-gcc", "arm-none-eabi-size", "gcc-arm-none-eabi libnewlib-arm-none-eabi",
        flash=4 << 20, ram=4 << 20, clock_hz=25_000_000,
        target_flags=("-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16"),
        # -O2 -funroll-loops: the policy's dot products unrolled (its inner loop
        # 5 instructions a multiply-add rather than 7 at -Os; flash is plenty)
        opt=("-O2", "-funroll-loops", "-ffunction-sections", "-fdata-sections"),
        c_std="-std=c99", stack_reserve=4096,
        # SysTick periods at 25 MHz, 40 instructions each under QEMU's -icount shift=0
        emulator="qemu-system-arm", emulator_package="qemu-system-arm", count_unit=40,
        next_step="build: make -C {out}; run: qemu-system-arm -M mps2-an386 -nographic "
                  "-monitor none -serial pty -kernel {out}/firmware.elf, then grpo-ctrl run "
                  "--port /dev/pts/N",
        check_machine="mps2-an386", block=16,
        # the Cortex-M4 TRM model on QEMU's trace (m4_cycles), fitted to the rig graph with
        # 3-H-H-1 weights: float H = 8, 32, 64 (within 4 %), q15 H = 16, 64
        tick_model=(2620.0, 3.57, 3.57, 1.77, 14.8)),
}


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
