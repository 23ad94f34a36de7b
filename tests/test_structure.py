"""The code's shape: imports run one way (docs/architecture.md), a plant's
layout is written in its C model only and is consistent with its dynamics,
and the source stays Python 3.10 compatible (pyproject's requires-python)."""
import ast
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from grpo_ctrl.plant import Observer, plant_spec, presets, systems
from grpo_ctrl.sim import BatchSim

ROOT = Path(__file__).resolve().parent.parent
# where each installed package's source lives (pyproject's package-dir)
PACKAGES = {"grpo_ctrl": ROOT / "grpo_ctrl", "grpo_ctrl.export": ROOT / "export",
            "grpo_ctrl.firmware_bridge": ROOT / "firmware_bridge"}

# The layers, bottom first; a module may import its own layer and those below.
# A module's layer is that of the longest entry naming it or a package above it.
LAYERS = [
    ("base", ["grpo_ctrl", "grpo_ctrl.errors", "grpo_ctrl.files", "grpo_ctrl.run_folder",
              "grpo_ctrl.option_types", "grpo_ctrl.presets", "grpo_ctrl._cdef", "grpo_ctrl._build_sim"]),
    ("plant", ["grpo_ctrl.plant", "grpo_ctrl._pendsim", "grpo_ctrl.randomize",
               "grpo_ctrl.plant_file"]),
    ("simulator", ["grpo_ctrl.sim"]),
    ("controllers and Gymnasium adapters", ["grpo_ctrl.baselines", "grpo_ctrl.policy",
                                            "grpo_ctrl.gym_env", "grpo_ctrl.render"]),
    ("controller contract and evaluation", ["grpo_ctrl.controller", "grpo_ctrl.closed_loop",
                                            "grpo_ctrl.robustness", "grpo_ctrl.heldout",
                                            "grpo_ctrl.realaigym", "grpo_ctrl.realaigym_double",
                                            "grpo_ctrl.estimator"]),
    ("training", ["grpo_ctrl.grpo_config", "grpo_ctrl.distributed", "grpo_ctrl.grpo",
                  "grpo_ctrl.c_gradient",
                  "grpo_ctrl.overlap", "grpo_ctrl.trust_region", "grpo_ctrl.train",
                  "grpo_ctrl.heap", "grpo_ctrl.runtime", "grpo_ctrl.deploy",
                  "grpo_ctrl.train_log"]),
    ("export", ["grpo_ctrl.export"]),
    ("serial bridge", ["grpo_ctrl.firmware_bridge", "grpo_ctrl.sysid"]),
    ("application", ["grpo_ctrl.cli", "grpo_ctrl.fit", "grpo_ctrl.distill", "grpo_ctrl.trajopt", "grpo_ctrl.__main__", "grpo_ctrl.demo", "grpo_ctrl.bench_cli",
                     "grpo_ctrl.cli_eval", "grpo_ctrl.cli_sysid", "grpo_ctrl.cli_video", "grpo_ctrl.baselines.report",
                     "grpo_ctrl.export.cli_export", "grpo_ctrl.export.cli_inspect",
                     "grpo_ctrl.export.cli_verify"]),
]
RANK = {name: rank for rank, (_, names) in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def rank_of(module: str) -> int:
    """The layer of ``module``; a new module must be given one (the top
    package ``grpo_ctrl`` names only its ``__init__``, not all below it)."""
    parts = module.split(".")
    for n in range(len(parts), 1 if len(parts) > 1 else 0, -1):
        if ".".join(parts[:n]) in RANK:
            return RANK[".".join(parts[:n])]
    raise AssertionError(f"{module} has no layer: add it to LAYERS here and to "
                         "docs/architecture.md")


def imports(path: Path, known) -> set[str]:
    """The project modules ``path`` imports, at the top or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                     else node.module for a in node.names]
        else:
            continue
        out |= {n for n in names if n == "grpo_ctrl" or n.startswith("grpo_ctrl.")}
    return out


# The one import that goes up on purpose: the package registers its Gymnasium ids when
# gymnasium loads (Gymnasium's convention: ``import grpo_ctrl`` makes the ids available).
REGISTRATION = {("grpo_ctrl", "grpo_ctrl.gym_env")}


def test_every_module_imports_only_its_own_layer_and_those_below():
    known = modules()
    upward = []
    for module, path in known.items():
        for target in imports(path, known):
            if rank_of(target) > rank_of(module) and (module, target) not in REGISTRATION:
                upward.append(f"{module} ({LAYERS[rank_of(module)][0]}) imports {target} "
                              f"({LAYERS[rank_of(target)][0]})")
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_a_module_without_a_layer_is_named():
    with pytest.raises(AssertionError, match="grpo_ctrl.brand_new has no layer"):
        rank_of("grpo_ctrl.brand_new")
    assert rank_of("grpo_ctrl.baselines.lqr") == rank_of("grpo_ctrl.baselines")


def test_the_layer_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from grpo_ctrl.export.onnx_export import export_onnx\n")
    found = imports(bad, modules())
    assert found == {"grpo_ctrl.export.onnx_export"}
    assert rank_of("grpo_ctrl.export.onnx_export") > rank_of("grpo_ctrl.sim")


# ---------------------------------------------------------------- plant layouts
# the per-plant tables that once restated a plant's layout outside csrc/plants.c
OLD_TABLES = ["POLE", "POLE_TRIG", "CYCLIC", "_ACTION", "_VELOCITY_RANGE", "_ANGLES", "_TRACK",
              "_START", "DEFAULT_LIMITS"]
# a dict literal keyed by the plants' names is a layout written down by hand
PER_PLANT_DICT = re.compile(r'\{\s*"pendulum"\s*:')
# ... except where the entries are per-plant code, not layout
PER_PLANT_CODE = {"grpo_ctrl.baselines.swingup",  # each plant's energy law is its own class
                  "grpo_ctrl.presets"}  # the one home of per-preset settings


def test_no_module_outside_the_plant_layer_writes_down_a_plant_layout():
    offenders = []
    for module, path in modules().items():
        text = path.read_text()
        for name in OLD_TABLES:
            if re.search(rf"^\s*{re.escape(name)}\s*=", text, re.M):
                offenders.append(f"{module}: table {name}")
        if PER_PLANT_DICT.search(text) and module not in PER_PLANT_CODE:
            offenders.append(f"{module}: a dict keyed by plant name")
    assert not offenders, offenders


def per_preset_tables(source: str) -> list[int]:
    """Lines of the dict literals in ``source`` keyed by (system, preset) pairs:
    per-preset tables, whose home is grpo_ctrl.presets."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Dict)
            and any(isinstance(k, ast.Tuple) and len(k.elts) == 2
                    and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                            for e in k.elts) and k.elts[0].value in systems()
                    for k in node.keys)]


def test_per_preset_tables_live_in_presets_only():
    """Adding a preset touches its C entry and grpo_ctrl/presets.py, nowhere else."""
    offenders = [f"{module}:{line}" for module, path in modules().items()
                 if module != "grpo_ctrl.presets"
                 for line in per_preset_tables(path.read_text())]
    assert not offenders, offenders
    assert per_preset_tables('T = {("pendulum", "rig"): 1}') == [1]
    assert per_preset_tables('if (s, p) == ("pendulum", "gym"):\n    pass') == []


# ---------------------------------------------------------------- equations of motion
# The equations of motion live in csrc/plants.c only: Python reaches them through
# BatchSim.dynamics / dynamics_rows / energy (the LQR's linearisation, sysid's least squares).
# The telltale of one restated in Python: a function or class that takes a sine, cosine or
# tanh (the angle's gravity term, the smoothed Coulomb friction) and reads gravity (an
# attribute .g, a ["g"] lookup, a name `gravity`). Not matched, and kept on purpose: the
# swing-up's energy law and collocated linearisation (baselines/swingup.py) are torch
# operations on the observation's own cosine and sine, inside the graph that ONNX and the C
# export compile, so they cannot call the simulator; tests/ keep their independent references.
EQUATION_FOLDERS = ("grpo_ctrl", "export", "firmware_bridge")
TRIG_CALLS = {"sin", "cos", "tanh"}
GRAVITY = "g"


def _reads_gravity(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == GRAVITY
            or isinstance(node, ast.Name) and node.id == "gravity"
            or isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            and node.slice.value == GRAVITY)


def restated_equations(source: str) -> list[str]:
    """The top-level functions and classes of ``source`` that look like an
    equation of motion: a trig (or tanh) call and a gravity read in one."""
    found = []
    for scope in ast.parse(source).body:
        if not isinstance(scope, (ast.FunctionDef, ast.ClassDef)):
            continue
        nodes = list(ast.walk(scope))
        trig = [n.lineno for n in nodes if isinstance(n, ast.Call) and
                (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) in TRIG_CALLS]
        gravity = [n.lineno for n in nodes if _reads_gravity(n)]
        if trig and gravity:
            found.append(f"{scope.name} (trig at line {trig[0]}, gravity at line {gravity[0]})")
    return found


# kept on purpose, each with its reason: (file, function or class) -> why
RESTATED_ON_PURPOSE = {
    ("grpo_ctrl/realaigym.py", "EnergyShapingLQR"):
        "RealAIGym's published energy-shaping entry, reproduced with its own energy formula",
    ("grpo_ctrl/realaigym.py", "ILQRTVLQR"):
        "RealAIGym's published iLQR entry plans on its own model (atan friction), not ours",
}


def test_no_plant_equation_is_restated_outside_c():
    found = {(str(path.relative_to(ROOT)), hit.split(" ")[0]): hit
             for path in sorted(p for folder in EQUATION_FOLDERS
                                for p in (ROOT / folder).rglob("*.py"))
             for hit in restated_equations(path.read_text())}
    offenders = [f"{where[0]}: {hit}" for where, hit in found.items()
                 if where not in RESTATED_ON_PURPOSE]
    assert not offenders, offenders
    stale = [where for where in RESTATED_ON_PURPOSE if where not in found]
    assert not stale, f"{stale} no longer restate an equation: drop them from RESTATED_ON_PURPOSE"


# the least squares sysid once wrote (tag research-2026-12, grpo_ctrl/sysid.py:331-343)
RESTATED = """
class PendulumModel:
    def _regressor(self, seg, d, trim):
        y, yd = seg.y[:, 0], seg.yd[:, 0]
        X = np.column_stack([np.sin(y), np.cos(y), ud, -yd, -np.tanh(yd / self.vc)])
        return X, seg.ydd[:, 0]

    def _physical(self, theta):
        c1, c2, a2, a3, a4 = theta
        l = 3 * self.g / (2 * math.hypot(c1, c2))
        return np.array([3 / (a2 * l * l), l, a3 / a2, a4 / a2, math.atan2(-c2, c1)])
"""


def test_the_equation_check_sees_a_restated_equation():
    assert restated_equations(RESTATED) == ["PendulumModel (trig at line 5, gravity at line 10)"]
    # and a gravity term written inline in one function
    assert restated_equations("def f(p, x):\n    return 1.5 * p['g'] / p['l'] * "
                              "math.sin(x[0])\n") == ["f (trig at line 2, gravity at line 2)"]
    # a group size g next to a tanh squashing is no equation
    assert restated_equations("def h(g, x):\n    return torch.tanh(x) * g\n") == []


ALL_PRESETS = [(s, p) for s in systems() for p in presets(s)]


@pytest.mark.parametrize("system,preset", ALL_PRESETS)
def test_each_layout_agrees_with_its_plants_dynamics_and_observation(system, preset):
    spec = plant_spec(system, preset)
    nx = spec.nx
    sim = BatchSim(system, 1, preset, enc_counts=[0.0] * nx)  # exact sensors
    assert spec == sim.spec
    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 1.0, nx)
    xdot = sim.dynamics(x, 0.3)
    # the sensors' velocities are their positions' derivatives; an angle's
    # rate is an angular velocity, in rad/s
    for pos, vel in spec.channels:
        assert xdot[pos] == x[vel]
        assert spec.angular_velocities[vel] == spec.angles[pos]
    assert sorted(k for ch in spec.channels for k in ch) == list(range(nx))
    assert spec.angles[spec.pole_angle] and xdot[spec.pole_angle] == x[spec.pole_velocity]
    for k in range(nx):
        want = ("rad",) if spec.angles[k] else ("rad/s",) if spec.angular_velocities[k] else (
            "m", "m/s")
        assert spec.state_units[k] in want
    # cyclic components do not enter the dynamics
    for k in spec.cyclic:
        moved = x.copy()
        moved[k] += 0.7
        np.testing.assert_array_equal(sim.dynamics(moved, 0.3), xdot)
    # the observation: cos/sin of each angle where obs_index says, the rest as is
    obs = Observer(spec)(x)
    sim.set_state({"x": x[None, :]})
    np.testing.assert_array_equal(obs, sim.observe()[0])  # the same C function
    assert len(spec.obs_units) == spec.nobs
    for k in range(nx):
        i = spec.obs_index[k]
        if spec.angles[k]:
            np.testing.assert_allclose(obs[i:i + 2], [np.cos(x[k]), np.sin(x[k])], atol=1e-7)
            assert spec.obs_units[i:i + 2] == ("1", "1")
        else:
            assert obs[i] == np.float32(x[k]) and spec.obs_units[i] == spec.state_units[k]
    # the start box and limits are the preset's
    assert spec.x0_low == tuple(sim.model.x0_low[k] for k in range(nx))
    assert len(spec.channel_pos_limits) == len(spec.channels) == len(spec.channel_vel_limits)


# what each sensor channel of a rig reads, written out by hand as the
# independent reference: (state index of its position, of its velocity)
RIG_CHANNELS = {"pendulum": [(0, 1)], "cartpole": [(0, 1), (2, 3)], "furuta": [(0, 2), (1, 3)],
                "double_pendulum": [(0, 2), (1, 3)]}


@pytest.mark.parametrize("system", systems())
def test_the_host_observes_a_rig_as_the_simulator_observes_its_state(system):
    from grpo_ctrl.firmware_bridge import protocol as P
    from grpo_ctrl.firmware_bridge.observation import Features

    spec = plant_spec(system)
    channels = RIG_CHANNELS[system]
    angle_mask = sum(spec.angles[pos] << c for c, (pos, _) in enumerate(channels))
    counts_per_unit = [4096.0 if angle_mask >> c & 1 else 10000.0 for c in range(len(channels))]
    info = P.Info(P.VERSION, P.SYSTEMS.index(system), len(channels), angle_mask, 1, 5000, 1.0,
                  tuple(counts_per_unit + [0.0] * (4 - len(channels))), 10000, spec.preset, 1)
    features = Features(info)
    sim = BatchSim(system, 1, enc_counts=[0.0] * spec.nx)
    rng = np.random.default_rng(1)
    for _ in range(20):
        pos = tuple(int(v) for v in rng.integers(-6000, 6000, len(channels)))
        vel = tuple(int(v) for v in rng.integers(-90000, 90000, len(channels)))
        x = np.zeros(spec.nx)
        for c, (p, v) in enumerate(channels):
            unit = (2 * np.pi if angle_mask >> c & 1 else 1.0) / counts_per_unit[c]
            x[p], x[v] = pos[c] * unit, vel[c] * unit
        sim.set_state({"x": x[None, :]})
        obs = features(P.State(0, 0, 0, 0.0, 1, 0, 0, pos=pos, vel=vel))
        np.testing.assert_array_equal(obs, sim.observe()[0])
        pole = x[spec.pole_angle]
        assert features.angle(obs) == pytest.approx(np.arctan2(np.sin(pole), np.cos(pole)),
                                                     abs=1e-6)


# ---------------------------------------------------------------- Python 3.10
def test_the_source_runs_on_python_3_10(tmp_path):
    vermin = shutil.which("vermin")
    if vermin is None:
        pytest.skip("vermin is not installed: pip install 'grpo-ctrl[test]' (or pip install vermin)")

    def check(*paths):
        return subprocess.run([vermin, "-q", "-t=3.10-", "--no-tips", "--violations",
                               "--eval-annotations", *map(str, paths)], cwd=ROOT,
                              capture_output=True, text=True)

    done = check("grpo_ctrl", "export", "firmware_bridge", "benchmarks", "tests")
    assert done.returncode == 0, done.stdout + done.stderr
    newer = tmp_path / "newer.py"
    newer.write_text("import tomllib\n")  # 3.11: what train.py once did
    assert check(newer).returncode != 0
