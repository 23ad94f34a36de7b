"""The C simulator under AddressSanitizer and UndefinedBehaviorSanitizer:
csrc/stress.c drives every preset through the public API (delay, noise,
quantisation, saturation, autoreset, rollouts, branch copies, refused
input, the policy rollout of policy_rollout.c and the update gradient of
policy_update.c) and checks copies stay bit-identical. It is also built with
-Werror -pedantic, as C99."""
import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parent.parent / "csrc"


@pytest.mark.parametrize("kernels", [[], ["-DPR_NO_CLONES"]], ids=["dispatched", "plain-loops"])
def test_simulator_is_clean_under_asan_and_ubsan(tmp_path, kernels):
    """``kernels``: the policy's kernels as the extension dispatches them on this CPU
    (AVX-512's register blocks where it has them), and the plain loops every other
    CPU runs (csrc/policy_dense.h)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler is needed"
    exe = tmp_path / "stress"
    subprocess.run([cc, "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-g", "-O1",
                    "-ffp-contract=off", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", *kernels, f"-I{CSRC}", str(CSRC / "stress.c"),
                    str(CSRC / "pendsim.c"), str(CSRC / "plants.c"),
                    str(CSRC / "policy_rollout.c"), str(CSRC / "policy_update.c"), "-lm",
                    "-o", str(exe)],
                   check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok ") and int(r.stdout.split()[1]) > 100_000
    assert "runtime error" not in r.stderr
