"""C headers as cffi's cdef parser wants them, for the two build scripts.

The headers stay the one home of the C declarations: each build script
hands its public headers here instead of copying them into a cdef string.
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the flags both extensions compile csrc/ with, so the HIL plant is the
# simulator's plant bit for bit. -ffp-contract=off: no fused multiply-adds,
# so the gym presets round exactly as NumPy does; -fno-trapping-math lets the
# observation loop's selects vectorise (it changes no value, only FP exception
# flags); -fno-wrapv undoes Python's default -fwrapv, which costs the step
# loop 30% (the code relies on no signed overflow; the sanitizer tests check).
C_FLAGS = ["-O3", "-std=c99", "-Wall", "-Wextra", "-ffp-contract=off", "-fno-trapping-math",
           "-fno-wrapv"]


def cdef_from_headers(*headers: Path) -> str:
    """The headers without comments, includes or guards; every ``#define``
    and every array size left to the compiler (``...``)."""
    parts = []
    for header in headers:
        text = re.sub(r"/\*.*?\*/", "", header.read_text(), flags=re.S)
        lines = []
        for line in text.splitlines():
            define = re.match(r"#define\s+(\w+)\s+\S", line)
            if define:
                lines.append(f"#define {define.group(1)} ...")
            elif not line.startswith("#"):
                lines.append(line)
        parts.append(re.sub(r"\[[A-Za-z_][^\]]*\]", "[...]", "\n".join(lines)))
    return "\n".join(parts)
