"""cffi build script (API mode, out-of-line) for the C simulator in csrc/.

Run by setuptools at install time through ``cffi_modules``; it produces the
extension ``grpo_ctrl._pendsim``. Nothing is compiled on import.
"""
import sys
from pathlib import Path

from cffi import FFI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run by path at build time
from grpo_ctrl._cdef import C_FLAGS, ROOT, cdef_from_headers  # noqa: E402

ffibuilder = FFI()
ffibuilder.cdef(cdef_from_headers(ROOT / "csrc" / "pendsim.h", ROOT / "csrc" / "plant_layout.h",
                                   ROOT / "csrc" / "policy_rollout.h",
                                   ROOT / "csrc" / "policy_update.h",
                                   ROOT / "csrc" / "policy_simd.h"))
ffibuilder.set_source(
    "grpo_ctrl._pendsim",
    '#include "pendsim.h"\n#include "plant_layout.h"\n#include "policy_rollout.h"\n'
    '#include "policy_update.h"\n#include "policy_simd.h"\n',
    # setuptools wants paths relative to the project root
    sources=["csrc/pendsim.c", "csrc/plants.c", "csrc/policy_rollout.c",
             "csrc/policy_update.c", "csrc/policy_simd.c"],
    include_dirs=["csrc"],
    # the headers too: a change to one (the kernels live in policy_kernels.h) rebuilds
    depends=sorted(str(h.relative_to(ROOT)) for h in (ROOT / "csrc").glob("*.h")),
    extra_compile_args=C_FLAGS,
    libraries=["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
