"""The C simulator under AddressSanitizer and UndefinedBehaviorSanitizer:
csrc/stress.c drives every preset through the public API (delay, noise,
quantisation, saturation, autoreset, rollouts, branch copies, refused
input, the policy rollout of policy_rollout.c and the update gradient of
policy_update.c) and checks copies stay bit-identical; csrc/check_kernels.c
runs the policy's kernels on every SIMD path against the plain loops and a
double reference. Both are also built with -Werror -pedantic, as C99, and run
once per SIMD path this CPU runs (csrc/policy_simd.h, GRPO_CTRL_SIMD)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from grpo_ctrl._pendsim import ffi, lib

CSRC = Path(__file__).resolve().parent.parent / "csrc"
CORE = ["pendsim.c", "plants.c", "policy_rollout.c", "policy_update.c", "policy_simd.c"]
PATHS = ffi.string(lib.pr_simd_paths()).decode().split()
FUSED = ffi.string(lib.pr_simd_fused_paths()).decode().split()  # avx512+fma, avx2+fma


BUILDS = {"dispatched": [], "no-clones": ["-DPR_NO_CLONES"]}


def _build(folder, main, kernels):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler is needed"
    exe = folder / main
    subprocess.run([cc, "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-g", "-O1",
                    "-ffp-contract=off", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", *kernels, f"-I{CSRC}", str(CSRC / f"{main}.c"),
                    *(str(CSRC / f) for f in CORE), "-lm", "-o", str(exe)],
                   check=True)
    return exe


@pytest.fixture(scope="module")
def stress(tmp_path_factory):
    """The stress harness per build, compiled once."""
    return {name: _build(tmp_path_factory.mktemp(name), "stress", flags)
            for name, flags in BUILDS.items()}


# "dispatched": the build the extension is (AVX-512 and AVX2 kernels compiled where GCC targets
# them), on every path this CPU runs, the fused ones too; "no-clones": -DPR_NO_CLONES, the baseline and plain
# kernels only (other compilers, other architectures)
@pytest.mark.parametrize("build,path", [("dispatched", p) for p in PATHS + FUSED] +
                         [("no-clones", "baseline"), ("no-clones", "plain")])
def test_simulator_is_clean_under_asan_and_ubsan(stress, build, path):
    r = subprocess.run([str(stress[build])], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, GRPO_CTRL_SIMD=path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok ") and int(r.stdout.split()[1]) > 100_000
    assert "runtime error" not in r.stderr


@pytest.mark.parametrize("build", BUILDS)
def test_kernels_are_clean_under_asan_and_ubsan(tmp_path, build):
    """check_kernels selects each path the build and CPU run in turn."""
    kernels = BUILDS[build]
    exe = _build(tmp_path, "check_kernels", kernels)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    want = PATHS if not kernels else ["baseline", "plain"]
    assert r.stdout.startswith(f"paths: {' '.join(want)} ")
    assert r.stdout.splitlines()[-1].startswith("ok ")
    assert "runtime error" not in r.stderr
