"""Every preset's default training, bit for bit: the weights after a fixed-seed
150-iteration run hash to the recorded value.

A change meant to leave the defaults' arithmetic alone (a refactor, a faster
kernel) must leave these hashes alone. The bits depend on the CPU's kernels:
torch picks its vector kernels by ``torch.backends.cpu.get_cpu_capability()``
(AVX512, AVX2, ...; the environment variable ATEN_CPU_CAPABILITY lowers it),
so the values are recorded per capability, and a machine with another one
skips, naming it. The C kernels' SIMD paths (csrc/policy_simd.h) give the same
bits on every path, so they are not part of the key.

Recorded on an AMD EPYC (Zen 4) with torch 2.13.0: AVX512 natively, AVX2 with
ATEN_CPU_CAPABILITY=avx2 (the same values; ``test_avx2_kernels_on_an_avx512_machine``
checks one in a subprocess where the CPU allows). They are the hashes of the code at
the tag research-2026-12, before the refuted options were removed, but for the double
pendulum's, recorded again when its reward took the leaderboard score's costs of effort,
for the two presets with Fourier features, recorded again when the features' sine
became a shorter polynomial (csrc/policy_dense.h), and for the acrobot when its preset
took the LQR's catch and its costs of effort at 10 % throughout.
"""
import dataclasses
import hashlib
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

import torch

from grpo_ctrl.grpo_config import default_config
from grpo_ctrl.plant import presets, systems
from grpo_ctrl.train import train

ITERATIONS = 150
# (system, preset) -> weights hash of the serial run, per torch CPU capability
EXPECTED = {
    "AVX512": {
        ("pendulum", "gym"): "9cc8e6ed9aca3957",
        ("pendulum", "rig"): "5722726c9746e15a",
        ("cartpole", "gym"): "57a268be5f57923a",
        ("cartpole", "swingup"): "5f58bf31b075e1d4",
        ("furuta", "qube-servo2"): "e24b468f3ca24c5a",
        ("pendulum", "realaigym"): "d1c0b0ea18fdb4c5",
        ("double_pendulum", "acrobot"): "77a990166d5b3e02",
        ("double_pendulum", "pendubot"): "009634044be56111",
        ("double_pendulum", "acrobot-real"): "6f3bdb3ccc5226b2",
        ("double_pendulum", "pendubot-real"): "8b73e7bbc5cc1215",
    },
}
# torch's AVX2 kernels give these small networks the same bits (measured on the machine above)
EXPECTED["AVX2"] = dict(EXPECTED["AVX512"])
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


def _expected(capability: str) -> dict:
    if not EXPECTED.get(capability):
        pytest.skip(f"no weight hashes recorded for torch CPU capability {capability!r} "
                    f"(recorded: {sorted(k for k, v in EXPECTED.items() if v)})")
    return EXPECTED[capability]


@pytest.mark.parametrize("system, preset", PRESETS)
def test_the_defaults_train_to_the_recorded_weights(system, preset):
    want = _expected(torch.backends.cpu.get_cpu_capability()).get((system, preset))
    if want is None:
        pytest.skip(f"no weight hash recorded for {system}/{preset}: record "
                    f"weights_hash({system!r}, {preset!r}) in EXPECTED")
    assert weights_hash(system, preset) == want


def test_overlap_trains_the_gym_pendulum_to_its_recorded_weights():
    """The overlap collector (a second process, one update behind) is deterministic too."""
    want = {"AVX512": "b5737e3e1ed751aa"}.get(torch.backends.cpu.get_cpu_capability())
    if want is None:
        pytest.skip(f"no overlap hash recorded for torch CPU capability "
                    f"{torch.backends.cpu.get_cpu_capability()!r}")
    assert weights_hash("pendulum", "gym", overlap=True) == want


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
