"""Fixtures shared by the serial-loop tests."""
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "grpo_ctrl.cli"]


def export_cli(tmp_path_factory, name: str, *source: str):
    """``grpo-ctrl export SOURCE... --onnx NAME.onnx`` in a temporary folder: its path."""
    pytest.importorskip("torch",
                        reason="exporting needs the train extra: pip install -e '.[train]'")
    path = tmp_path_factory.mktemp("onnx") / f"{name}.onnx"
    r = subprocess.run(CLI + ["export", *source, "--onnx", str(path)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    return path


def export_baseline(tmp_path_factory, controller: str, system: str, preset: str):
    """A baseline controller exported to ONNX through the command line."""
    return export_cli(tmp_path_factory, f"{controller}-{system}-{preset}", "--controller",
                      controller, "--system", system, "--preset", preset)


@pytest.fixture(scope="session")
def swingup(tmp_path_factory):
    """The swing-up + LQR controller of the rig pendulum, as ONNX."""
    return export_baseline(tmp_path_factory, "swingup-lqr", "pendulum", "rig")
