"""Building a board's firmware: the project's files (``project_files``,
``stage``) and the image (``build_image``), as the board's family builds it:
an Arduino sketch with the Arduino core (AVR) or bare-metal C with its
startup and linker script (Arm). What differs per board is its record
(``board_registry.Board``)."""
from __future__ import annotations

import shutil
from pathlib import Path

from grpo_ctrl.errors import UserError
from grpo_ctrl.firmware_bridge.board_registry import (ARDUINO_CORE, ARDUINO_VARIANT, ARM_LINK,
                                                      CORE_FILES, CSRC, FIRMWARE, MPS2_FILES,
                                                      PLANT_SOURCES, WARNINGS, Board, _run)


# ---------------------------------------------------------------- the project
def _sketch_files(board_dir: Path, sketch: str) -> dict[str, Path]:
    files = {f"{sketch}.ino": board_dir / "pendulum_board.ino"}
    for n in ("board_pendulum.c", "board_pendulum.h", "arduino_api.h"):
        files[n] = board_dir / n
    return files


def _bare_metal_files(board_dir: Path, sketch: str) -> dict[str, Path]:
    files = {n: board_dir / "mps2_an386" / n for n in MPS2_FILES}
    for src in [CSRC / n for n in PLANT_SOURCES] + sorted(CSRC.glob("*.h")):
        files[src.name] = src
    files["Makefile"] = board_dir / "mps2_an386" / "Makefile"
    return files


PROJECT = {"avr": _sketch_files, "arm": _bare_metal_files}  # a family's own files


def project_files(b: Board, sketch: str = "pendulum_board") -> dict[str, Path]:
    """Destination name -> source file of the project for board ``b``."""
    board_dir = FIRMWARE / "board"
    if not (FIRMWARE / "fw_core.c").is_file():
        raise UserError(f"no firmware sources at {FIRMWARE}: they ship with the source tree; "
                        "run from a clone installed with pip install -e .")
    files = {n: FIRMWARE / n for n in CORE_FILES}
    files["policy_link.h"] = board_dir / "policy_link.h"
    files.update(PROJECT[b.family](board_dir, sketch))
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
    _run([b.cc, *b.target_flags, b.c_std, *WARNINGS, *b.opt,
          *defines, *[f"-I{i}" for i in includes], "-c", c_file, "-o", out],
         f"compiling {c_file.name} for {b.name}")
    return out


def _arduino_core(b: Board, build: Path) -> list[Path]:
    """The Arduino core's objects, built as the Arduino tools build them
    (warnings off: it is not our code)."""
    core, variant = ARDUINO_CORE, ARDUINO_VARIANT
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
        _run([cc, *b.target_flags, *extra, "-w", *b.opt,
              f"-I{core}", f"-I{variant}", "-c", src, "-o", obj], f"compiling the Arduino core {src.name}")
        objs.append(obj)
    return objs


def _sketch_image(b: Board, project: Path, build: Path, defines, elf: Path, link_extra) -> None:
    inc = (project, ARDUINO_CORE, ARDUINO_VARIANT)
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
              "-fno-threadsafe-statics", *WARNINGS, *b.opt, *defines, *[f"-I{i}" for i in inc], "-c", cpp, "-o", obj],
             f"compiling {ino.name} for {b.name}")
        objs.append(obj)
    # the core goes in as an archive, as the Arduino tools link it: only
    # the members something needs (Tone.cpp's timer interrupt stays out)
    core_a = build / "core.a"
    if not core_a.exists():
        _run(["avr-gcc-ar", "rcs", core_a, *_arduino_core(b, build)], "archiving the core")
    _run([b.cc, *b.target_flags, *b.opt, "-fuse-linker-plugin", "-Wl,--gc-sections",
          *link_extra, *objs, core_a, f"-L{build}", "-o", elf, "-lm"],
         f"linking the {b.name} image")


def _bare_metal_image(b: Board, project: Path, build: Path, defines, elf: Path, link_extra) -> None:
    inc = (project,)
    objs = [compile_object(b, c, build / f"{c.name}.o", defines, inc)
            for c in sorted(project.glob("*.c"))]
    _run([b.cc, *b.target_flags, *ARM_LINK, *link_extra, "-T", project / "mps2_an386.ld", *objs,
          "-o", elf, "-lm"], f"linking the {b.name} image")


IMAGE = {"avr": _sketch_image, "arm": _bare_metal_image}  # how a family's image is built


def build_image(b: Board, project: Path, build: Path, defines=(), name: str = "firmware",
                unbounded: bool = False) -> Path:
    """Build the project in ``project`` into ``build/<name>.elf``; objects
    already in ``build`` are reused. ``unbounded``: link even an image that
    overflows the chip (to measure by how much; where the board's linker
    has regions to widen)."""
    build.mkdir(parents=True, exist_ok=True)
    elf = build / f"{name}.elf"
    IMAGE[b.family](b, project, build, defines, elf, b.unbounded_link if unbounded else ())
    return elf
