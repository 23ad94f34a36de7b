"""Every preset's default training, bit for bit: the weights after a fixed-seed
150-iteration run hash to the recorded value.

A change meant to leave the defaults' arithmetic alone (a refactor, a faster
kernel) must leave these hashes alone. The bits depend on the CPU's kernels in
two places. torch picks its vector kernels by
``torch.backends.cpu.get_cpu_capability()`` (AVX512, AVX2, ...; the environment
variable ATEN_CPU_CAPABILITY lowers it). And torch's BLAS and vector math are
Intel's MKL, which picks its own code by CPU vendor and model: on an Intel Xeon
its AVX-512 exp rounds the policy's std differently in the last bit from what it
gives an AMD EPYC, and its matrix products (the presets whose gradient torch
computes) add in another order. So the values are recorded per capability and
vendor, and a machine with another pair skips, naming it. The C kernels' exact
SIMD paths (csrc/policy_simd.h) give the same bits on every path, and so do its two
fused paths (avx512+fma, avx2+fma), other bits than the exact ones': the key's third
part is the family of the path in use, the default (fused where the CPU has AVX2) or
the one GRPO_CTRL_SIMD names.

Recorded with torch 2.13.0 (2.14.1 gives the same bits): on an AMD EPYC (Zen 4,
family 25 model 17) and an Intel Xeon (AVX-512 with AMX, family 6 model 167),
AVX512 natively, AVX2 with ATEN_CPU_CAPABILITY=avx2 (the same values on each
vendor; ``test_avx2_kernels_on_an_avx512_machine`` checks one in a subprocess
where the CPU allows). The AMD values are the hashes of the code at the tag
research-2026-12, before the refuted options were removed, but for the double
pendulum's, recorded again when its reward took the leaderboard score's costs of
effort, for the two presets with Fourier features, recorded again when the
features' sine became a shorter polynomial (csrc/policy_dense.h), and for the
acrobot when its LQR (whose catch acts in its every step) stopped going through
numpy's BLAS, whose kernels differ by CPU (baselines/lqr.py): that value, and the AMD
fused ones, were recorded on an AVX2-only AMD EPYC (Zen 3, family 25 model 1), which
gave the Zen 4's values for every other preset and the overlap run on the exact
paths. The Intel fused values were recorded on that Xeon when the fused paths
became its default (avx512+fma with AVX512 and avx2+fma with AVX2: the same values);
its acrobot is to record again since the LQR's change.
"""
import dataclasses
import hashlib
import json
import os
import platform
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

import torch

from grpo_ctrl._pendsim import ffi, lib
from grpo_ctrl.bench_cli import cpu_info
from grpo_ctrl.grpo_config import default_config
from grpo_ctrl.plant import presets, systems
from grpo_ctrl.train import train

ITERATIONS = 150
AMD, INTEL = "AuthenticAMD", "GenuineIntel"
# (torch CPU capability, CPU vendor, SIMD family) -> (system, preset) -> weights hash of the
# serial run
EXPECTED = {
    ("AVX512", AMD, "exact"): {
        ("pendulum", "gym"): "9cc8e6ed9aca3957",
        ("pendulum", "rig"): "5722726c9746e15a",
        ("cartpole", "gym"): "57a268be5f57923a",
        ("cartpole", "swingup"): "5f58bf31b075e1d4",
        ("furuta", "qube-servo2"): "e24b468f3ca24c5a",
        ("pendulum", "realaigym"): "d1c0b0ea18fdb4c5",
        ("double_pendulum", "acrobot"): "ca7dc92da30824e3",
        ("double_pendulum", "pendubot"): "009634044be56111",
        ("double_pendulum", "acrobot-real"): "6f3bdb3ccc5226b2",
        ("double_pendulum", "pendubot-real"): "8b73e7bbc5cc1215",
    },
    ("AVX512", INTEL, "exact"): {
        ("pendulum", "gym"): "c69858708cbe286c",
        ("pendulum", "rig"): "66bbdf698b42f85c",
        ("cartpole", "gym"): "b5b2b1d4fd251f08",
        ("cartpole", "swingup"): "13a484e91379202a",
        ("furuta", "qube-servo2"): "25a776a34830cbf4",
        ("pendulum", "realaigym"): "b6aa01b049efbb61",
        ("double_pendulum", "pendubot"): "42e462919bb38607",
        ("double_pendulum", "acrobot-real"): "6d749bd9c4830204",
        ("double_pendulum", "pendubot-real"): "5237e2e18d8d86e8",
    },
    ("AVX512", AMD, "fused"): {
        ("pendulum", "gym"): "019e7053a3731e5e",
        ("pendulum", "rig"): "4e5072dcd48401d7",
        ("cartpole", "gym"): "d7d07a50ae0f1fb5",
        ("cartpole", "swingup"): "e92540a1e9260983",
        ("furuta", "qube-servo2"): "c3cf22951443b960",
        ("pendulum", "realaigym"): "1120e5af0ea878b7",
        ("double_pendulum", "acrobot"): "9e9713b86aa05f9c",
        ("double_pendulum", "pendubot"): "1ae627b6909abb93",
        ("double_pendulum", "acrobot-real"): "d390cb4c5d1915ae",
        ("double_pendulum", "pendubot-real"): "65db4c1e8a1e8c47",
    },
    ("AVX512", INTEL, "fused"): {
        ("pendulum", "gym"): "383f27572f0c9b97",
        ("pendulum", "rig"): "7fc667da513b9a6c",
        ("cartpole", "gym"): "d8ddc173caad3ba8",
        ("cartpole", "swingup"): "baf1f4bae37b2b98",
        ("furuta", "qube-servo2"): "cad3299dad164e23",
        ("pendulum", "realaigym"): "ea284e56cc316722",
        ("double_pendulum", "pendubot"): "449ebf6069fb06e8",
        ("double_pendulum", "acrobot-real"): "50e00b8051f3c25b",
        ("double_pendulum", "pendubot-real"): "798173b2b396ccef",
    },
}
# torch's AVX2 kernels give these small networks the same bits (measured on both machines)
for (_capability, _vendor, _family), _hashes in list(EXPECTED.items()):
    EXPECTED[("AVX2", _vendor, _family)] = dict(_hashes)
# the overlap collector's run of the gym pendulum
EXPECTED_OVERLAP = {("AVX512", AMD, "exact"): "b5737e3e1ed751aa",
                    ("AVX512", AMD, "fused"): "3a71a656dcc7fd30",
                    ("AVX512", INTEL, "exact"): "1de65a3098e05ac8",
                    ("AVX512", INTEL, "fused"): "98b25dfe6b13e84d"}
for (_capability, _vendor, _family), _hash in list(EXPECTED_OVERLAP.items()):
    EXPECTED_OVERLAP[("AVX2", _vendor, _family)] = _hash
# every preset the simulator has; one without a recorded hash skips, naming itself
PRESETS = [(system, preset) for system in systems() for preset in presets(system)]


def weights_hash(system: str, preset: str, overlap: bool = False,
                 iterations: int = ITERATIONS) -> str:
    """The first 16 hex digits of the SHA-256 of the trained policy's state dict (names
    and float32 bytes, in name order) after ``iterations`` of the preset's defaults,
    seed 0, no evaluation."""
    cfg = dataclasses.replace(default_config(system, preset), iterations=iterations,
                              time_budget=0.0, eval_every=1e9, overlap=overlap, seed=0)
    state = train(system, preset, cfg, None, progress=False)["trainer"].policy.state_dict()
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _key(capability: str | None = None, path: str | None = None) -> tuple:
    """(torch CPU capability, CPU vendor: x86 Linux's vendor_id, else the machine, and the
    family of the SIMD path in use, or of ``path``: fused or exact)."""
    vendor = cpu_info().get("vendor_id") or platform.machine() or "unknown"
    path = path or ffi.string(lib.pr_simd_path()).decode()
    return (capability or torch.backends.cpu.get_cpu_capability(), vendor,
            "fused" if path.endswith("+fma") else "exact")


def _skip_unrecorded(what: str, key: tuple, recorded: str = "") -> None:
    pytest.skip(f"no {what} recorded for torch CPU capability {key[0]!r} on a {key[1]} CPU "
                f"with the {key[2]} SIMD paths{recorded}")


def _expected(capability: str | None = None) -> dict:
    key = _key(capability)
    if not EXPECTED.get(key):
        _skip_unrecorded("weight hashes", key,
                         f" (recorded: {sorted(k for k, v in EXPECTED.items() if v)})")
    return EXPECTED[key]


@pytest.mark.parametrize("system, preset", PRESETS)
def test_the_defaults_train_to_the_recorded_weights(system, preset):
    want = _expected().get((system, preset))
    if want is None:
        pytest.skip(f"no weight hash recorded for {system}/{preset}: record "
                    f"weights_hash({system!r}, {preset!r}) in EXPECTED")
    assert weights_hash(system, preset) == want


def test_overlap_trains_the_gym_pendulum_to_its_recorded_weights():
    """The overlap collector (a second process, one update behind) is deterministic too."""
    want = EXPECTED_OVERLAP.get(_key())
    if want is None:
        _skip_unrecorded("overlap hash", _key())
    assert weights_hash("pendulum", "gym", overlap=True) == want


def test_the_other_family_of_simd_paths_trains_to_its_recorded_weights():
    """The gym pendulum on the exact paths where the fused ones are in use, and the other
    way round (each selected in this process, the one in use restored after)."""
    start = ffi.string(lib.pr_simd_path()).decode()
    exact = ffi.string(lib.pr_simd_paths()).decode().split()
    fused = ffi.string(lib.pr_simd_fused_paths()).decode().split()
    other = exact[0] if start.endswith("+fma") else (fused or [None])[0]
    if other is None:
        pytest.skip("no fused SIMD path on this CPU: it needs AVX2 and FMA (x86-64-v3)")
    want = EXPECTED.get(_key(path=other), {}).get(("pendulum", "gym"))
    if want is None:
        _skip_unrecorded("weight hashes", _key(path=other))
    assert lib.pr_simd_select(other.encode()) >= 0
    try:
        assert weights_hash("pendulum", "gym") == want
    finally:
        lib.pr_simd_select(start.encode())


def test_avx2_kernels_on_an_avx512_machine():
    """torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2), in a subprocess: the recorded AVX2
    hash of the gym pendulum."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("needs a CPU with AVX-512 to run the AVX2 kernels beside them")
    want = _expected("AVX2")[("pendulum", "gym")]
    code = ("import json, torch; from tests.test_weight_hashes import weights_hash; "
            "print(json.dumps([torch.backends.cpu.get_cpu_capability(), "
            "weights_hash('pendulum', 'gym')]))")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == ["AVX2", want]
