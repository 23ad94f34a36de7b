"""The C core built for aarch64 and its C tests run under qemu-user.

Debian's cross compiler (package gcc-aarch64-linux-gnu) builds every file of
csrc/ the extension compiles as C99 at -Wall -Wextra -Werror -pedantic with
the extension's flags (grpo_ctrl/_cdef.py), and qemu-aarch64 (package
qemu-user) runs:
- csrc/stress.c: every preset through the public API, the policy rollout and
  gradient (its own checks: finite, copies bit-identical, bad input refused);
- csrc/check_kernels.c: the policy's kernels on every path aarch64 runs
  ("baseline" = NEON vectors of 4 floats in blocks, and "plain"), each
  against the plain loops bit for bit and against a double reference (means
  within 1e-5, gradients within 1e-4 of the largest value); and its digests
  of every network's results against the same program built for this
  machine: bit for bit. That holds because no path fuses multiply-adds
  (-ffp-contract=off), each adds its lanes' products in the same order, and
  the C library's expf and sin (the loss's ratio, the reference's features)
  round alike on both. Where a C library's expf rounded a value otherwise,
  the digests would differ and the double reference's tolerance is what holds;
- csrc/check_exact_math.c: exact_math.h bit for bit against the C library
  and NumPy's remainder (a tenth of its random values: emulation is slow).
Timings under emulation mean nothing; only correctness is checked here.
"""
import shutil
import subprocess
from pathlib import Path

import pytest

from grpo_ctrl._cdef import C_FLAGS

CSRC = Path(__file__).resolve().parent.parent / "csrc"
CORE = ["pendsim.c", "plants.c", "policy_rollout.c", "policy_update.c", "policy_simd.c"]
CROSS_CC = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64")
SYSROOT = Path("/usr/aarch64-linux-gnu")

pytestmark = pytest.mark.skipif(
    not (CROSS_CC and QEMU and SYSROOT.is_dir()),
    reason="needs Debian's gcc-aarch64-linux-gnu and qemu-user "
           "(apt-get install gcc-aarch64-linux-gnu qemu-user)")

FLAGS = [*C_FLAGS, "-pedantic", "-Werror", f"-I{CSRC}"]


def _build(cc, folder: Path, main: str, core: bool = True) -> Path:
    exe = folder / main
    sources = [CSRC / f"{main}.c"] + ([CSRC / f for f in CORE] if core else [])
    subprocess.run([cc, *FLAGS, *map(str, sources), "-lm", "-o", str(exe)], check=True)
    return exe


def _qemu(exe: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([QEMU, "-L", str(SYSROOT), str(exe), *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def arm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("aarch64")
    return {main: _build(CROSS_CC, folder, main, core=main != "check_exact_math")
            for main in ("stress", "check_kernels", "check_exact_math")}


def test_binaries_are_aarch64(arm):
    for exe in arm.values():
        with open(exe, "rb") as f:
            head = f.read(20)
        assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183  # EM_AARCH64


def test_stress_under_qemu(arm):
    r = _qemu(arm["stress"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok ") and int(r.stdout.split()[1]) > 100_000


def _digests(stdout: str) -> dict:
    """check_kernels' lines 'net ...: PATH DIGEST' -> {net: {path: digest}}."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("net "):
            net, path, digest = line.rsplit(" ", 2)
            out.setdefault(net, {})[path] = digest
    return out


def test_kernels_under_qemu_match_this_machine_bit_for_bit(arm, tmp_path):
    r = _qemu(arm["check_kernels"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("paths: baseline plain (in use: baseline)")
    assert r.stdout.splitlines()[-1].startswith("ok ")
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed"
    native = subprocess.run([str(_build(cc, tmp_path, "check_kernels"))], capture_output=True,
                            text=True, timeout=300)
    assert native.returncode == 0, native.stdout + native.stderr
    here, there = _digests(native.stdout), _digests(r.stdout)
    assert here.keys() == there.keys() and len(here) == 6
    for net in here:
        assert set(here[net].values()) == set(there[net].values()), net


def test_exact_math_under_qemu(arm):
    r = _qemu(arm["check_exact_math"], "10")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok ") and int(r.stdout.split()[1]) >= 3_000_000
