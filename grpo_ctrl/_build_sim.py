"""cffi build script (API mode, out-of-line) for the C simulator in csrc/.

Run by setuptools at install time through ``cffi_modules``; it produces the
extension ``grpo_ctrl._pendsim``. Nothing is compiled on import.
"""
import re
from pathlib import Path

from cffi import FFI

CSRC = Path(__file__).resolve().parent.parent / "csrc"
HEADER = CSRC / "pendsim.h"


def cdef_from_header(text: str) -> str:
    """The public header, as cffi's cdef parser wants it: no comments, no
    include guards, array sizes given by the compiler (``[...]``)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    kept = []
    for line in text.splitlines():
        if line.startswith("#") and not line.startswith("#define PS_"):
            continue
        kept.append(line)
    text = "\n".join(kept)
    text = re.sub(r"\[PS_MAX_\w+\]", "[...]", text)
    return text.replace("#define PENDSIM_H", "")


ffibuilder = FFI()
ffibuilder.cdef(cdef_from_header(HEADER.read_text()))
ffibuilder.set_source(
    "grpo_ctrl._pendsim",
    '#include "pendsim.h"',
    # setuptools wants paths relative to the project root
    sources=["csrc/pendsim.c", "csrc/plants.c"],
    include_dirs=["csrc"],
    # -ffp-contract=off: no fused multiply-adds, so that the gym presets
    # round exactly as NumPy does. -fno-trapping-math lets the observation
    # loop's selects vectorise; it changes no value, only FP exception flags.
    # -fno-wrapv undoes Python's default -fwrapv, which costs the step loop
    # 30% (the code relies on no signed overflow; the sanitizer tests check).
    extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wextra", "-ffp-contract=off",
                        "-fno-trapping-math", "-fno-wrapv"],
    libraries=["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
