"""The install puts one top-level package, ``grpo_ctrl``, in site-packages.

export/ and firmware_bridge/ sit at the top of the repository (the product
card's layout) but install as ``grpo_ctrl.export`` and
``grpo_ctrl.firmware_bridge``: a user's own ``export.py`` cannot shadow them,
and they shadow nothing of the user's.
"""
import subprocess
import sys


def _python(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True)


def test_the_bridge_and_exporter_import_under_the_grpo_ctrl_namespace(tmp_path):
    done = _python("import grpo_ctrl.export.c_codegen, grpo_ctrl.firmware_bridge.protocol;"
                   "from grpo_ctrl.firmware_bridge._firmware import lib;"
                   "print(grpo_ctrl.export.__name__)", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "grpo_ctrl.export"


def test_no_generic_top_level_names_are_installed(tmp_path):
    for name in ("export", "firmware_bridge"):
        done = _python(f"import {name}", tmp_path)
        assert done.returncode != 0 and "No module named" in done.stderr, name


def test_a_users_own_export_module_does_not_shadow_ours(tmp_path):
    (tmp_path / "export.py").write_text("raise SystemExit('the user module was imported')\n")
    done = _python("import grpo_ctrl.export.metadata as m; print(m.__name__)", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "grpo_ctrl.export.metadata"


def _project():
    try:
        import tomllib  # novermin: 3.10 takes the except branch
    except ModuleNotFoundError:
        import tomli as tomllib
    from pathlib import Path
    return tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]


def _names(requirements):
    import re
    return {re.split(r"[ <>=;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_base_install_is_the_runtime_and_the_extras_hold_the_rest():
    """No torch, onnx or plotting in the base install (a rig's computer runs
    hil and run with it: tests/test_base_install.py); every package the
    command line names an extra for is declared in that extra."""
    from grpo_ctrl.cli import EXTRAS
    project = _project()
    base = _names(project["dependencies"])
    assert base == {"numpy", "cffi", "onnxruntime", "pyserial", "tomli"}
    extras = {name: _names(reqs) for name, reqs in project["optional-dependencies"].items()}
    for package, extra in EXTRAS.items():
        assert package in extras[extra], (package, extra)
        assert package not in base
    # the tests' extra holds what the tests import beyond the runtime, except torch (the
    # README installs train with it: a CPU build can be chosen first)
    assert {"pytest", "hypothesis", "vermin", "gymnasium", "scipy", "onnx"} <= extras["test"]
    assert "torch" not in extras["test"]
