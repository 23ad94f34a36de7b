"""cffi build script (API mode, out-of-line) for the firmware core and its
simulated hardware back-end: the extension ``firmware_bridge._firmware``.

Run by setuptools at install time through ``cffi_modules``. It compiles the
portable core (``firmware/proto.c``, ``firmware/fw_core.c``), the HIL
back-end (``firmware/hw_sim.c``) and, again, the plant from ``csrc/`` that
the back-end drives through ``csrc/pendsim.h``.
"""
import sys
from pathlib import Path

from cffi import FFI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run by path at build time
from grpo_ctrl._cdef import C_FLAGS, ROOT, cdef_from_headers  # noqa: E402

FIRMWARE = ROOT / "firmware_bridge" / "firmware"

ffibuilder = FFI()
ffibuilder.cdef(cdef_from_headers(FIRMWARE / "proto.h", FIRMWARE / "fw_hw.h", FIRMWARE / "fw_core.h",
                                  FIRMWARE / "hil.h"))
ffibuilder.set_source(
    "grpo_ctrl.firmware_bridge._firmware",
    '#include "proto.h"\n#include "hil.h"\n',
    # setuptools wants paths relative to the project root
    sources=["firmware_bridge/firmware/proto.c", "firmware_bridge/firmware/fw_core.c",
             "firmware_bridge/firmware/hw_sim.c", "csrc/pendsim.c", "csrc/plants.c"],
    include_dirs=["firmware_bridge/firmware", "csrc"],
    extra_compile_args=C_FLAGS,
    libraries=["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
