"""Fixtures shared by the serial-loop tests."""
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "grpo_ctrl.cli"]


def export_baseline(tmp_path_factory, controller: str, system: str, preset: str):
    """A baseline controller exported to ONNX through the command line."""
    pytest.importorskip("torch",
                        reason="exporting needs the train extra: pip install -e '.[train]'")
    path = tmp_path_factory.mktemp("onnx") / f"{controller}-{system}-{preset}.onnx"
    subprocess.run(CLI + ["export", "--controller", controller, "--system", system, "--preset",
                          preset, "--onnx", str(path)], check=True, capture_output=True)
    return path


@pytest.fixture(scope="session")
def swingup(tmp_path_factory):
    """The swing-up + LQR controller of the rig pendulum, as ONNX."""
    return export_baseline(tmp_path_factory, "swingup-lqr", "pendulum", "rig")
