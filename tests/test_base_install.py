"""The base install (no extras) is the rig computer's runtime: ``grpo-ctrl hil``
and ``grpo-ctrl run`` with an exported ONNX controller work end to end with
torch, onnx, matplotlib, tqdm, scipy, tensorboard and gymnasium unimportable;
a command that needs an extra says which in one line, exit status 2.

The child processes get a ``sitecustomize`` (through PYTHONPATH) whose
meta-path finder, first in ``sys.meta_path``, raises ``ModuleNotFoundError``
for those packages as an environment without them would."""
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_ctrl.cli import EXTRAS
from grpo_ctrl.firmware_bridge.telemetry import read_telemetry

CLI = [sys.executable, "-m", "grpo_ctrl.cli"]
NOT_IN_BASE = sorted(EXTRAS)
# a controller exported before (tests/data/README.md): exporting one needs the train extra, and
# this test runs where it is missing too
POLICY = Path(__file__).parent / "data" / "pendulum-rig-grpo.onnx"


@pytest.fixture(scope="module")
def base_env(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base-install")
    (folder / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import sys

        BLOCKED = {set(NOT_IN_BASE)!r}

        class NotInstalled:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, NotInstalled())
        """))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(folder)] + ([env["PYTHONPATH"]]
                                                          if env.get("PYTHONPATH") else []))
    return env


@pytest.mark.parametrize("package", NOT_IN_BASE)
def test_the_stand_in_environment_lacks_the_extras(base_env, package):
    r = subprocess.run([sys.executable, "-c", f"import {package}"], env=base_env,
                       capture_output=True, text=True)
    assert r.returncode != 0 and f"No module named '{package}'" in r.stderr


def test_hil_and_run_drive_an_exported_controller_without_torch_or_onnx(base_env, tmp_path):
    # a generous watchdog: host and HIL share this (possibly busy) machine
    hil = subprocess.Popen(CLI + ["hil", "--system", "pendulum", "--preset", "rig",
                                  "--angle0", "3.14159", "--duration", "30",
                                  "--watchdog-ms", "150"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=base_env)
    try:
        port = hil.stdout.readline().strip()
        assert port.startswith("/dev/"), hil.communicate(timeout=10)
        log = tmp_path / "run.csv"
        r = subprocess.run(CLI + ["run", "--port", port, "--policy", str(POLICY),
                                  "--duration", "6", "--log", str(log), "--json"],
                           capture_output=True, text=True, timeout=90, env=base_env)
    finally:
        hil.terminate()
        hil.communicate(timeout=10)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["ended"] == "completed" and s["disarm_acknowledged"]
    assert s["commands_sent"] > 0.8 * 6 * 200
    # the loop read the rig's telemetry and the plot was skipped, said so, no traceback
    assert log.is_file() and not (tmp_path / "run.png").exists()
    assert "matplotlib is not installed" in r.stderr + r.stdout and "Traceback" not in r.stderr
    # what the loop's last seconds saw: swung up from hanging and held upright
    assert s["max_abs_angle"] > 3.0  # it started hanging
    states = [row for row in read_telemetry(log) if row["kind"] == "state"]
    angles = [abs(math.atan2(row["obs"][1], row["obs"][0])) for row in states[-200:]]
    assert len(states) > 1000 and max(angles) < 0.2   # and was upright for the last second


@pytest.mark.parametrize("command,extra", [
    (["train", "--iterations", "1"], "train"),
    (["export", "--controller", "lqr", "--onnx", "x.onnx"], "train"),
    (["eval", "--controller", "lqr"], "train"),
])
def test_a_command_that_needs_an_extra_says_which_in_one_line(base_env, tmp_path, command,
                                                              extra):
    r = subprocess.run(CLI + command, env=base_env, capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 2
    assert r.stderr == (f"grpo-ctrl {command[0]}: needs the {extra} extra: "
                        f"pip install 'grpo-ctrl[{extra}]'\n")
    assert not list(tmp_path.iterdir())  # nothing written


def test_an_explicit_plot_without_matplotlib_is_refused_before_the_port_opens(base_env,
                                                                                tmp_path):
    r = subprocess.run(CLI + ["run", "--port", "/dev/null-no-such", "--policy", str(POLICY),
                              "--log", str(tmp_path / "x.csv"), "--plot", str(tmp_path / "x.png")],
                       env=base_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "needs matplotlib" in r.stderr
    assert len(r.stderr.splitlines()) == 1
