"""Export round trips: torch == ONNX == C within 1e-5 on 10,000 observations
across each plant's operating range, for hand-written controllers, the
baselines and a trained GRPO policy; metadata, the session helper, and the
command line's handling of bad input."""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch", reason="needs the [train] extra (torch)")

from grpo_ctrl.export import metadata, onnx_version
from grpo_ctrl.export.c_build import CPolicy, check_c, compile_shared, host_cc
from grpo_ctrl.export.c_codegen import generate_c, write_c
from grpo_ctrl.export.onnx_export import export_onnx, to_onnx
from grpo_ctrl.baselines import available
from grpo_ctrl.baselines.portable import atan2, dot, quadratic_form
from grpo_ctrl.export.session import PolicySession
from grpo_ctrl.export.verify import (ROUNDING_CAP, TOLERANCE, float32_rounding,
                                     operating_observations, operating_states, verify)
from grpo_ctrl.cli import main
from grpo_ctrl.controller import act
from grpo_ctrl.errors import UserError
from grpo_ctrl.policy import GaussianPolicy, PolicyController
from grpo_ctrl.sim import BatchSim, presets, systems

torch.set_num_threads(1)
PLANTS = [(s, p) for s in systems() for p in presets(s)]
needs_cc = pytest.mark.skipif(host_cc() is None, reason="no host C compiler")


def spec_of(system, preset=None):
    return BatchSim(system, 1, preset).spec


class TinyPolicy(torch.nn.Module):
    """An MLP with the deployed policy's post-processing: normalise, tanh
    squash, scale, clip (written independently of grpo_ctrl.policy)."""

    def __init__(self, system, preset=None, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.spec = spec_of(system, preset)
        n = self.spec.nobs
        self.net = torch.nn.Sequential(torch.nn.Linear(n, 32), torch.nn.ELU(),
                                       torch.nn.Linear(32, 32), torch.nn.Tanh(),
                                       torch.nn.Linear(32, 1))
        self.register_buffer("mean", torch.randn(n) * 0.3)
        self.register_buffer("inv_std", torch.rand(n) + 0.2)

    def forward(self, obs):
        z = self.net((obs - self.mean) * self.inv_std)
        u = self.spec.u_max * torch.tanh(z)
        return torch.clamp(u, -self.spec.u_max, self.spec.u_max)


class EnergyBangBang(torch.nn.Module):
    """A hand-written nonlinear pendulum controller: angle from atan2, energy
    pumping with sign(), a balancing law inside a region (where), clamp."""

    def __init__(self, preset="gym"):
        super().__init__()
        self.spec = spec_of("pendulum", preset)

    def forward(self, obs):
        c, s, w = obs[:, 0:1], obs[:, 1:2], obs[:, 2:3]
        th = atan2(s, c)
        energy = 0.5 * w * w + 10.0 * (1.0 + c)
        pump = 0.1 * torch.sign((20.0 - energy) * w) * torch.abs(energy - 20.0)
        balance = -dot(torch.cat([th, w], dim=1), [6.0, 1.5])
        u = torch.where(torch.abs(th) < 0.6, balance, pump)
        return torch.clamp(u, -self.spec.u_max, self.spec.u_max)


class OpZoo(torch.nn.Module):
    """Many ops and shapes through the C generator: broadcasting, concat,
    gather, flip (negative-step slice), transpose, min/max, logic, pow."""

    def __init__(self):
        super().__init__()
        self.spec = spec_of("furuta")
        self.register_buffer("w", torch.linspace(-1.0, 1.0, 12).reshape(2, 6))
        self.register_buffer("col", torch.tensor([[0.5], [-0.25]]))

    def forward(self, obs):
        x = obs / torch.tensor([1.0, 1.0, 1.0, 1.0, 20.0, 30.0])
        pair = torch.stack([x, x.flip(1)], dim=1)            # (N, 2, 6)
        mixed = (pair * self.w + self.col).transpose(1, 2)   # (N, 6, 2)
        feat = torch.cat([mixed[:, :, 0], torch.relu(mixed[:, :, 1]), x[:, [5, 0, 3]]], dim=1)
        a = torch.sigmoid(feat).sum(dim=1, keepdim=True) - torch.nn.functional.softplus(feat[:, :1])
        b = torch.maximum(feat[:, 1:2], feat[:, 2:3]) * torch.minimum(feat[:, 3:4], 0.3 * feat[:, 4:5])
        c = torch.where((x[:, 0:1] > 0) & (x[:, 2:3] <= 0.5), torch.cos(b), torch.sin(a) ** 2)
        d = torch.nn.functional.leaky_relu(a - b, 0.1) + torch.floor(3.0 * c) / torch.sqrt(a * a + 1)
        return torch.clamp(d + quadratic_form(x[:, 4:6], [[1.0, 0.5], [0.5, 2.0]]), -10.0, 10.0)


class Reductions(torch.nn.Module):
    """Sums, means and maxima over a transposed outer product: reductions,
    strided slices and a scattered transpose (an index table in C)."""

    spec = spec_of("furuta")

    def forward(self, obs):
        z = (obs.unsqueeze(2) * torch.linspace(0.0, 1.0, 5)).transpose(1, 2).reshape(-1, 30)
        u = (0.1 * z.sum(1, keepdim=True) - z[:, ::7].mean(1, keepdim=True)
             + z.amax(1, keepdim=True))
        return torch.clamp(u, -10.0, 10.0)


class LibmGaps(torch.nn.Module):
    """Erf, Round and Softplus: the ops whose libm functions (erff, nearbyintf,
    log1pf) avr-libc lacks, so the generated C defines them for AVR."""

    spec = spec_of("pendulum", "rig")

    def forward(self, obs):
        u = (0.05 * torch.erf(0.3 * obs[:, 2:3]) + 0.01 * torch.round(2.5 * obs[:, 0:1])
             + 0.01 * torch.nn.functional.softplus(3.0 * obs[:, 1:2]))
        return torch.clamp(u, -0.15, 0.15)


class SkipRelu(torch.nn.Module):
    """Two products followed by a Relu: the first product's output is read
    again after its Relu (a skip term), so only the second's Relu may be
    applied as the product stores it (c_codegen fuses it in place)."""

    spec = spec_of("pendulum", "rig")

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.a = torch.nn.Linear(3, 16)
        self.b = torch.nn.Linear(16, 16)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.5

    def forward(self, obs):
        x = self.a(obs)
        h = torch.relu(self.b(torch.relu(x)))
        u = 0.05 * (h.sum(1, keepdim=True) - x.sum(1, keepdim=True))
        return torch.clamp(u, -0.15, 0.15)


def compile_c(model, folder: Path) -> CPolicy:
    write_c(model, folder)
    lib = compile_shared(folder / "policy.c", folder / "libpolicy.so")
    return CPolicy(lib, src_nobs(model))


def src_nobs(model) -> int:
    return model.graph.input[0].type.tensor_type.shape.dim[1].dim_value


def assert_round_trip(controller, tmp_path: Path):
    """torch vs onnxruntime (in the export) and onnxruntime vs compiled C, on
    the same 10,000 operating-range observations."""
    model, result = export_onnx(controller, tmp_path / "c.onnx", source="test")
    assert result.samples == 10_000
    assert result.ok, result.summary()
    spec = controller.spec
    obs = operating_observations(spec.system, spec.preset)
    session = ort.InferenceSession(str(tmp_path / "c.onnx"))
    got = session.run(None, {"obs": obs})[0][:, 0]
    want = act(controller, obs)
    assert np.max(np.abs(got - want)) <= TOLERANCE
    assert np.all(np.abs(want) <= spec.u_max)
    if host_cc() is not None:
        c = compile_c(model, tmp_path / "c").batch(obs)
        assert np.max(np.abs(c - got)) <= TOLERANCE
        assert np.max(np.abs(c - want)) <= TOLERANCE
    return model


# ---------------------------------------------------------------- sampling
@pytest.mark.parametrize("system,preset", PLANTS)
def test_operating_observations_cover_the_circle_and_the_ranges(system, preset):
    sim = BatchSim(system, 1, preset)
    states = operating_states(system, preset, 10_000)
    obs = operating_observations(system, preset, 10_000)
    assert obs.dtype == np.float32 and obs.shape == (10_000, sim.spec.nobs)
    names = list(sim.spec.obs_names)
    for k, name in enumerate(sim.spec.state_names):
        if sim.spec.angles[k]:
            # cos/sin pairs on the unit circle, every quadrant visited
            c, s = obs[:, names.index(f"cos_{name}")], obs[:, names.index(f"sin_{name}")]
            np.testing.assert_allclose(c * c + s * s, 1.0, atol=1e-6)
            quadrants = np.floor((np.arctan2(s, c) + math.pi) / (math.pi / 2)).astype(int)
            assert set(quadrants) >= {0, 1, 2, 3}
        else:
            col = obs[:, names.index(name)]
            np.testing.assert_allclose(col, states[:, k], rtol=1e-6, atol=1e-6)
            assert col.min() < -0.8 * np.abs(col).max() and col.max() > 0.8 * np.abs(col).max()
    if system == "cartpole":
        x = obs[:, names.index("x")]
        assert 2.0 < x.max() <= 2.4 and -2.4 <= x.min() < -2.0  # the whole track


# ---------------------------------------------------------------- round trips
@pytest.mark.parametrize("system,preset", [("pendulum", "rig"), ("cartpole", "swingup"),
                                           ("furuta", "qube-servo2")])
def test_mlp_controller_round_trip(system, preset, tmp_path):
    assert_round_trip(TinyPolicy(system, preset), tmp_path)


def test_hand_written_nonlinear_controller_round_trip(tmp_path):
    model = assert_round_trip(EnergyBangBang(), tmp_path)
    ops = {n.op_type for n in model.graph.node}
    assert {"Where", "Sign", "Abs", "Clip"} <= ops


def test_op_zoo_round_trip(tmp_path):
    model = assert_round_trip(OpZoo(), tmp_path)
    ops = {n.op_type for n in model.graph.node}
    assert {"Concat", "Transpose", "Sigmoid", "Softplus", "LeakyRelu", "Floor", "Max", "Sqrt",
            "Min", "And", "Cos", "Sin"} <= ops, ops


def test_relu_after_a_product_round_trip(tmp_path):
    model = assert_round_trip(SkipRelu(), tmp_path)  # one output a pass
    c = generate_c(model).c
    assert c.count("and the Relu that follows") == 1  # not the one whose input is read again
    assert c.count("> 0.0f ?") == 2
    eight = generate_c(model, block=8)  # eight a pass, through <ROM>_MAC<inputs>X8
    assert eight.c.count("and the Relu that follows") == 1
    assert "POLICY_ROM_MAC4X8(ap, wp," in eight.c
    if host_cc() is not None:
        obs = operating_observations("pendulum", "rig", 2000)
        assert check_c(eight, model, obs) <= TOLERANCE


def test_libm_gaps_round_trip(tmp_path):
    model = assert_round_trip(LibmGaps(), tmp_path)
    assert {"Erf", "Round", "Softplus"} <= {n.op_type for n in model.graph.node}
    assert {"erff", "nearbyintf", "log1pf"} <= set(generate_c(model).size.libm)


def test_reductions_round_trip(tmp_path):
    model = assert_round_trip(Reductions(), tmp_path)
    assert {"ReduceSum", "ReduceMean", "ReduceMax"} <= {n.op_type for n in model.graph.node}
    assert "static const unsigned short" in generate_c(model).c


@pytest.mark.parametrize("board", ["uno", "mps2-an386"])
@pytest.mark.parametrize("controller", [OpZoo, Reductions, LibmGaps],
                         ids=["op-zoo", "index-table", "libm-gaps"])
def test_c_runs_on_the_emulated_mcu_with_constants_in_flash(controller, board, tmp_path):
    """The generated C built for the chip at -Werror (on AVR with every
    constant and index table in flash, read through pgm_read_*) computes
    what onnxruntime computes, on simavr / QEMU."""
    from grpo_ctrl.firmware_bridge import boards

    b = boards.BOARDS[board]
    missing = boards.emulator_missing(b)
    if missing:
        pytest.skip(missing)
    c = controller()
    model = to_onnx(c)
    src = generate_c(model)
    obs = operating_observations(c.spec.system, c.spec.preset, 16, seed=5)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {session.get_inputs()[0].name: obs})[0].reshape(-1)
    r = boards.target_check(b, src, obs)
    assert np.max(np.abs(r["out"] - want)) <= TOLERANCE
    if board == "uno":  # every constant in flash: the object has no .data for SRAM
        write_c(model, tmp_path)
        obj = tmp_path / "policy.o"
        subprocess.run([b.cc, "-mmcu=atmega328p", "-std=c99", "-Wall", "-Wextra", "-Wpedantic",
                        "-Werror", "-Os", "-c", str(tmp_path / "policy.c"), "-o", str(obj)],
                       check=True)
        size = boards.size_of(b, obj)
        assert size.data == 0 and size.bss == 0 and size.text > src.size.const_bytes


@pytest.mark.parametrize("activation", ["relu", "elu", "tanh"])
def test_grpo_policy_controller_round_trip(activation, tmp_path):
    spec = spec_of("cartpole", "swingup")
    torch.manual_seed(1)
    policy = GaussianPolicy(spec.nobs, spec.u_max, hidden=64, layers=2, activation=activation)
    policy.obs_norm.update(torch.randn(500, spec.nobs) * torch.tensor([1.0, 2.0, 0.7, 0.7, 5.0]))
    with torch.no_grad():
        policy.net[-1].weight.mul_(100.0)  # a head that uses the whole tanh range
    assert_round_trip(PolicyController(policy, spec), tmp_path)


def test_fourier_feature_policy_round_trip(tmp_path):
    """A policy on random Fourier features (MatMul, Add, Sin, Concat before the MLP) exports
    to ONNX and to C like the plain MLP, with its frequencies high enough that sin wraps
    many times over the operating range."""
    spec = spec_of("pendulum", "gym")
    torch.manual_seed(3)
    policy = GaussianPolicy(spec.nobs, spec.u_max, hidden=32, layers=2, features=16,
                            feature_scale=3.0)
    policy.obs_norm.update(torch.randn(500, spec.nobs) * torch.tensor([0.7, 0.7, 4.0]))
    policy.refresh_norm()
    with torch.no_grad():
        policy.net[-1].weight.mul_(100.0)
    model = assert_round_trip(PolicyController(policy, spec), tmp_path)
    assert {"Sin", "Concat"} <= {n.op_type for n in model.graph.node}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    from grpo_ctrl.grpo_config import GRPOConfig
    from grpo_ctrl.train import train

    out = tmp_path_factory.mktemp("run") / "pendulum"
    cfg = GRPOConfig(num_starts=8, group_size=4, horizon=16, loss_steps=8, iterations=3,
                     time_budget=0.0, eval_episodes=4, threads=1)
    train("pendulum", "gym", cfg, out, progress=False)
    return out


def test_trained_grpo_run_round_trip_and_provenance(trained_run, tmp_path, capsys):
    from grpo_ctrl.controller import load_controller

    controller = load_controller(str(trained_run))
    out = tmp_path / "policy.onnx"
    assert main(["export", str(trained_run), "--onnx", str(out), "--c", str(tmp_path / "c")]) == 0
    printed = capsys.readouterr().out
    assert "PASS" in printed and "flash" in printed and "RAM 512 B" in printed
    meta = metadata.parse(metadata.raw(onnx.load(str(out))))
    ckpt = Path(controller.source_info["checkpoint"])
    assert meta["source"] == str(ckpt)
    assert meta["source_sha256"] == metadata.sha256_file(ckpt)
    assert meta["verified_samples"] == 10_000 and meta["verified_max_abs_error"] <= TOLERANCE
    assert meta["randomize"]["params"] == 0.0 and meta["randomize"]["delay"] == [0, 0]  # gym: exact
    obs = operating_observations("pendulum", "gym")
    session = ort.InferenceSession(str(out))
    onnx_u = session.run(None, {"obs": obs})[0][:, 0]
    torch_u = act(controller, obs)
    assert np.max(np.abs(onnx_u - torch_u)) <= TOLERANCE
    if host_cc() is not None:
        lib = compile_shared(tmp_path / "c" / "policy.c", tmp_path / "libp.so")
        c_u = CPolicy(lib, 3).batch(obs)
        assert np.max(np.abs(c_u - onnx_u)) <= TOLERANCE
    assert main(["verify", str(out), str(trained_run)]) == 0
    # --quantize q15: its hidden layer in fixed point, the measured error in the header
    assert main(["export", str(trained_run), "--c", str(tmp_path / "q"), "--quantize", "q15"]) == 0
    if host_cc() is not None:
        assert "C (q15) vs onnxruntime: max |C - onnxruntime| =" in capsys.readouterr().out
        assert "q15 (hidden layers in 16-bit fixed point)" in (tmp_path / "q" / "policy.h").read_text()


@pytest.mark.parametrize("name,system,preset",
                         [(name, s, p) for s, p in PLANTS for name in available(s)])
def test_baseline_round_trip(name, system, preset, tmp_path):
    from grpo_ctrl.baselines import make_controller

    assert_round_trip(make_controller(name, system, preset), tmp_path)


# ---------------------------------------------------------------- metadata
def test_metadata_describes_the_plant_and_the_export(tmp_path):
    controller = EnergyBangBang("rig")
    model, result = export_onnx(controller, tmp_path / "p.onnx", source="energy-bang-bang")
    meta = metadata.parse(metadata.raw(onnx.load(str(tmp_path / "p.onnx"))))
    assert set(meta) == set(metadata.KEYS)
    assert meta["system"] == "pendulum" and meta["preset"] == "rig"
    assert meta["obs_names"] == ["cos_theta", "sin_theta", "theta_dot"]
    assert meta["action_name"] == "torque" and meta["action_unit"] == "N*m"
    assert meta["u_max"] == BatchSim("pendulum", 1, "rig").spec.u_max
    assert meta["dt"] == 0.005
    assert meta["source"] == "energy-bang-bang"
    # a baseline has no checkpoint: the hash is the graph's
    import hashlib
    assert meta["source_sha256"] == hashlib.sha256(model.graph.SerializeToString()).hexdigest()
    assert "torch" in meta["exporter"] and "onnx" in meta["exporter"]
    assert meta["verified_samples"] == 10_000
    assert meta["verified_max_abs_error"] == float(f"{result.worst:.3g}")
    opset = {o.domain: o.version for o in model.opset_import}[""]
    assert opset >= 17


def test_inspect_prints_the_metadata(tmp_path, capsys):
    export_onnx(EnergyBangBang(), tmp_path / "p.onnx", source="bb")
    assert main(["inspect", str(tmp_path / "p.onnx")]) == 0
    out = capsys.readouterr().out
    assert "cos_theta, sin_theta, theta_dot" in out and "N*m" in out and "opset 17" in out
    assert main(["inspect", str(tmp_path / "p.onnx"), "--json"]) == 0
    import json
    assert json.loads(capsys.readouterr().out)["system"] == "pendulum"


# What each plant's actuator drives, by the plants' definitions (README,
# docs/double_pendulum.md: the acrobot's motor is at the elbow, the pendubot's
# at the shoulder).
DRIVES = {"pendulum": "pivot", "cartpole": "cart", "furuta": "arm", "acrobot": "elbow",
          "pendubot": "shoulder"}


@pytest.mark.parametrize("system,preset", PLANTS)
def test_metadata_states_the_observation_convention(system, preset):
    """``observation_convention``: one line from the plant layer naming the
    observation, the pendulum angle's zero (upright: a small tilt at rest
    falls away from it in the simulator), the units, the joint the actuator
    drives and its direction (a positive command from rest at zero speeds
    that coordinate up in the simulator)."""
    spec = spec_of(system, preset)
    text = metadata.for_controller(TinyPolicy(system, preset), "tiny", "0" * 64)[
        "observation_convention"]
    assert text == spec.observation_convention
    assert "\n" not in text and "*/" not in text          # one line, safe in a C comment
    assert text.startswith(f"obs [{', '.join(spec.obs_names)}]; ")
    for name, unit in zip(spec.obs_names, spec.obs_units):
        assert (f"{name} {unit}" in text) == (unit != "1")
    pole = spec.state_names[spec.pole_angle]
    assert "zero upright" in text.split(f"; {pole} the ", 1)[1].split(";")[0]

    def velocities_after_one_step(x0, u):
        sim = BatchSim(system, 1, preset)
        sim.set_state({"x": np.array([x0], float)})
        sim.step(np.array([u], np.float32))
        return sim.get_state()["x"][0]

    tilted = np.zeros(spec.nx)
    tilted[spec.pole_angle] = 0.1
    assert velocities_after_one_step(tilted, 0.0)[spec.pole_velocity] > 0   # zero is upright
    robot = preset.removesuffix("-real") if system == "double_pendulum" else system
    assert f"{spec.action_name} in {spec.action_unit} on the {DRIVES[robot]}" in text
    driven = text.split("positive towards +", 1)[1].split()[0]
    moved = velocities_after_one_step(np.zeros(spec.nx), 0.5 * spec.u_max)
    assert moved[spec.state_names.index(f"{driven}_dot")] > 0
    if system == "double_pendulum":
        other = "shoulder" if robot == "acrobot" else "elbow"
        assert f"(the {other} passive)" in text
        assert ("theta1 the shoulder's angle, zero upright; theta2 the elbow's angle relative "
                "to link 1, zero when the links are in line; both counter-clockwise positive"
                ) in text


def test_observation_convention_reaches_inspect_and_the_c_header(tmp_path, capsys):
    """The pendubot's LQR exported through the command line: the convention
    is in the ONNX metadata, `grpo-ctrl inspect` prints it, and the generated
    header's comment carries it."""
    onnx_path, c_dir = tmp_path / "lqr.onnx", tmp_path / "c"
    assert main(["export", "--controller", "lqr", "--system", "double_pendulum", "--preset",
                 "pendubot", "--onnx", str(onnx_path), "--c", str(c_dir)]) == 0
    capsys.readouterr()
    text = spec_of("double_pendulum", "pendubot").observation_convention
    meta = metadata.parse(metadata.raw(onnx.load(str(onnx_path))))
    assert meta["observation_convention"] == text
    assert main(["inspect", str(onnx_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("observation_convention") and line.endswith(text)
               for line in lines)
    assert f" *   observation_convention: {text}\n" in (c_dir / "policy.h").read_text()


# ---------------------------------------------------------------- verification
def test_verify_detects_a_different_controller(tmp_path, capsys):
    export_onnx(TinyPolicy("pendulum", seed=0), tmp_path / "a.onnx", source="a")
    model = onnx.load(str(tmp_path / "a.onnx"))
    assert verify(model, TinyPolicy("pendulum", seed=0)).max_abs_error <= TOLERANCE
    other = verify(model, TinyPolicy("pendulum", seed=1))
    assert not other.ok and other.max_abs_error > 0.01


class Absorbs(torch.nn.Module):
    """(w + 1e4) - 1e4 of the pendulum's velocity w, plus ``shift``: float32 drops w's bits
    below half a unit in the last place of 1e4 (2^-11), float64 none."""
    spec = spec_of("pendulum")

    def __init__(self, shift=0.0, big=1e4):
        super().__init__()
        self.shift, self.big = shift, big

    def forward(self, obs):
        return torch.clamp((obs[:, 2:3] + self.big) - self.big + self.shift, -2.0, 2.0)


def test_float32_rounding_is_the_modules_own_float32_error():
    obs = operating_observations("pendulum", None, 2000)
    want = Absorbs()(torch.from_numpy(obs)).numpy()
    w = obs[:, 2:3]
    in_numpy = np.clip((w + np.float32(1e4)) - np.float32(1e4), -2, 2)  # float32, as torch
    expected = np.max(np.abs(in_numpy.astype(np.float64) - np.clip(w.astype(np.float64), -2, 2)))
    assert float32_rounding(Absorbs(), obs, want) == pytest.approx(expected, rel=1e-12)
    assert 2.0 ** -12 < expected <= 2.0 ** -11


def test_verify_accepts_twice_the_controllers_own_rounding_and_no_more(tmp_path):
    """A graph computing the same float32 arithmetic passes at twice the module's rounding
    (beyond 1e-5 here), widened no further than ROUNDING_CAP of u_max; a module 3e-3 away
    still fails; a module that cannot run in float64 is held to 1e-5."""
    model = to_onnx(Absorbs())
    same = verify(model, Absorbs())
    assert same.ok and same.tolerance == 2 * same.rounding > 50 * TOLERANCE
    other = verify(model, Absorbs(shift=3e-3))
    assert not other.ok and other.max_abs_error == pytest.approx(3e-3, rel=1e-3)

    class Float32Only(torch.nn.Module):
        spec = spec_of("pendulum")

        def forward(self, obs):
            gain = torch.tensor([[0.0], [0.0], [-0.5]], dtype=torch.float32)  # made here
            return torch.clamp(obs @ gain, -2.0, 2.0)

    coarse = verify(to_onnx(Absorbs(big=1e6)), Absorbs(big=1e6))  # rounds by up to 2^-5
    assert coarse.rounding > 0.01 and coarse.tolerance == ROUNDING_CAP * Absorbs.spec.u_max
    strict = verify(to_onnx(Float32Only()), Float32Only())
    assert strict.ok and (strict.rounding, strict.tolerance) == (0.0, TOLERANCE)


def test_export_refuses_a_graph_that_does_not_match_and_writes_nothing(tmp_path):
    class DataDependentPython(torch.nn.Module):
        """Python control flow on a value: tracing freezes one branch."""
        spec = spec_of("pendulum")

        def forward(self, obs):
            if float(obs[0, 2]) > 0:
                return torch.clamp(-obs[:, 2:3], -2.0, 2.0)
            return torch.clamp(obs[:, 2:3], -2.0, 2.0)

    with pytest.raises(UserError, match="does not match"):
        export_onnx(DataDependentPython(), tmp_path / "bad.onnx", source="x")
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_a_controller_that_does_not_clip(tmp_path):
    class Unclipped(torch.nn.Module):
        spec = spec_of("pendulum")

        def forward(self, obs):
            return -10.0 * obs[:, 1:2]

    with pytest.raises(UserError, match="beyond u_max = 2"):
        export_onnx(Unclipped(), tmp_path / "bad.onnx", source="x")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- C specifics
@needs_cc
def test_c_source_is_dependency_free_and_rejects_non_finite_input(tmp_path):
    model = to_onnx(TinyPolicy("cartpole", "gym"))
    src = generate_c(model)
    includes = [line for line in src.c.splitlines() + src.h.splitlines() if "#include" in line]
    # avr/pgmspace.h only where __AVR__ is defined (weights in flash)
    assert includes == ["#include <math.h>", '#include "policy.h"', "#include <avr/pgmspace.h>"]
    assert src.c.index("#if defined(__AVR__)") < src.c.index("#include <avr/pgmspace.h>")
    for banned in ("malloc", "printf", "stdio", "static float", "double"):
        assert banned not in src.c
    assert "static const float" in src.c
    assert "int policy_step(const float *obs, float *action);" in src.h
    assert "flash" in src.h and "RAM" in src.h and "estimated" not in src.h
    policy = compile_c(model, tmp_path)
    assert policy.step([0.0, 0.0, 1.0, 0.0, float("nan")]) == (1, 0.0)
    assert policy.step([0.0, float("inf"), 1.0, 0.0, 0.0]) == (1, 0.0)
    assert policy.step([0.1, 0.0, 1.0, 0.0, 0.0])[0] == 0


def test_c_scratch_ram_is_the_largest_live_set():
    # 3 -> 32 -> 32 -> 1: at the second layer the 32 inputs and 32 outputs are
    # live together; the 3 + 3 normalisation values are dead by then
    model = to_onnx(TinyPolicy("pendulum"))
    size = generate_c(model).size
    assert size.ram_bytes == 4 * (32 + 32)
    weights = 4 * (3 * 32 + 32 + 32 * 32 + 32 + 32 + 1 + 3 + 3)
    assert size.const_bytes == weights - 4  # the last bias is a scalar literal


@needs_cc
def test_c_generator_sorts_nodes_stored_out_of_order():
    model = to_onnx(EnergyBangBang())
    shuffled = onnx.ModelProto()
    shuffled.CopyFrom(model)
    nodes = list(shuffled.graph.node)
    del shuffled.graph.node[:]
    shuffled.graph.node.extend(nodes[::-1])
    obs = operating_observations("pendulum", "gym", 2000)
    assert check_c(generate_c(shuffled), model, obs) == 0.0  # a bit-exact controller


def test_c_generator_names_an_unsupported_op():
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Softmax", ["obs"], ["s"], axis=1),
         helper.make_node("ReduceMax", ["s"], ["action"], keepdims=1)], "g",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 1])])
    model = onnx_version.make_model(g, opset=17)
    with pytest.raises(UserError, match="op Softmax"):
        generate_c(model)


@pytest.mark.parametrize("value,literal", [(1.0, "1.0f"), (-0.5, "(-0.5f)"), (1e-20, "9.99999968e-21f"),
                                           (math.inf, "INFINITY"), (0.1, "0.100000001f")])
def test_float_literals_round_trip_exactly(value, literal):
    from grpo_ctrl.export.c_codegen import _float_literal

    assert _float_literal(value) == literal
    text = literal.strip("()").rstrip("f")
    if text != "INFINITY":
        assert np.float32(float(text)) == np.float32(value)


# ---------------------------------------------------------------- portable math
def test_portable_atan2_is_accurate_and_exports_bit_exactly(tmp_path):
    rng = np.random.default_rng(0)
    y = np.concatenate([rng.standard_normal(50_000), [0.0, 0.0, 1.0, -1.0, 0.0]]).astype(np.float32)
    x = np.concatenate([rng.standard_normal(50_000), [0.0, -1.0, 0.0, 0.0, 1.0]]).astype(np.float32)
    got = atan2(torch.from_numpy(y), torch.from_numpy(x)).numpy()
    ref = np.arctan2(y.astype(np.float64), x.astype(np.float64))
    ulps = np.abs(got - ref) / np.spacing(np.abs(ref).astype(np.float32) + np.float32(1e-30))
    assert ulps.max() <= 3.0
    np.testing.assert_array_equal(got[-5:], np.float32([0.0, math.pi, math.pi / 2, -math.pi / 2, 0.0]))


def test_portable_controller_is_bit_exact_in_onnx_and_c(tmp_path):
    controller = EnergyBangBang()
    model = to_onnx(controller)
    obs = operating_observations("pendulum", "gym")
    onnx_u = ort.InferenceSession(model.SerializeToString()).run(None, {"obs": obs})[0]
    np.testing.assert_array_equal(onnx_u[:, 0], act(controller, obs))
    if host_cc() is not None:
        assert check_c(generate_c(model), model, obs) == 0.0


# ---------------------------------------------------------------- session
@pytest.fixture
def rig_onnx(tmp_path):
    path = tmp_path / "rig.onnx"
    export_onnx(EnergyBangBang("rig"), path, source="bb")
    return path


def test_session_runs_one_observation_and_exposes_parsed_metadata(rig_onnx):
    policy = PolicySession(rig_onnx, system="pendulum", nobs=3, u_max=0.15, preset="rig")
    assert policy.metadata["obs_names"] == ["cos_theta", "sin_theta", "theta_dot"]
    assert policy.metadata["dt"] == 0.005 and policy.metadata["u_max"] == 0.15
    obs = operating_observations("pendulum", "rig", 50)
    want = act(EnergyBangBang("rig"), obs)
    got = np.array([policy(o) for o in obs], np.float32)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("expect,message", [
    ({"system": "cartpole"}, "system = 'pendulum'.*system = 'cartpole'"),
    ({"nobs": 5}, "nobs = 3.*nobs = 5"),
    ({"u_max": 2.0}, "u_max = 0.15.*u_max = 2.0"),
    ({"preset": "gym"}, "preset = 'rig'.*preset = 'gym'"),
])
def test_session_refuses_a_model_for_another_plant(rig_onnx, expect, message):
    with pytest.raises(UserError, match=message):
        PolicySession(rig_onnx, **expect)


def test_session_refuses_foreign_and_misshapen_models(tmp_path):
    from onnx import TensorProto, helper

    def save(name, width_in, width_out, meta):
        g = helper.make_graph(
            [helper.make_node("ReduceSum", ["obs"], ["action"], keepdims=1)], "g",
            [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", width_in])],
            [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", width_out])])
        model = onnx_version.make_model(g, opset=17)
        if meta:
            metadata.write(model, metadata.for_controller(EnergyBangBang(), "x", "0"))
        onnx.save(model, str(tmp_path / name))
        return tmp_path / name

    with pytest.raises(UserError, match="not a grpo-ctrl controller"):
        PolicySession(save("foreign.onnx", 3, 1, meta=False))
    with pytest.raises(UserError, match="needs float \\(batch, 3\\)"):
        PolicySession(save("wide.onnx", 4, 1, meta=True))
    (tmp_path / "junk.onnx").write_bytes(b"\x00garbage\xff" * 10)
    with pytest.raises(UserError, match="not a loadable ONNX"):
        PolicySession(tmp_path / "junk.onnx")
    with pytest.raises(UserError, match="no ONNX controller"):
        PolicySession(tmp_path / "missing.onnx")


# ---------------------------------------------------------------- command line
def _fails_cleanly(argv, capsys, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err, err


def test_cli_bad_sources_fail_cleanly(tmp_path, capsys):
    out = tmp_path / "p.onnx"
    _fails_cleanly(["export", str(tmp_path / "nope"), "--onnx", str(out)], capsys, "neither")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint at all")
    _fails_cleanly(["export", str(corrupt), "--onnx", str(out)], capsys, "corrupt.pt")
    empty_run = tmp_path / "run"
    empty_run.mkdir()
    _fails_cleanly(["export", str(empty_run), "--onnx", str(out)], capsys, "no checkpoint")
    _fails_cleanly(["export", "--controller", "lqr", "--onnx", str(out)], capsys, "--system")
    _fails_cleanly(["export", "--controller", "lqr", "--system", "pendulum"], capsys, "--onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.pt", "run"]


def test_cli_unwritable_output_leaves_nothing(tmp_path, capsys, trained_run):
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    _fails_cleanly(["export", str(trained_run), "--onnx", str(blocker / "p.onnx")], capsys,
                   "does not exist")
    _fails_cleanly(["export", str(trained_run), "--onnx", str(tmp_path)], capsys,
                   "it is a folder")
    _fails_cleanly(["export", str(trained_run), "--c", str(blocker)], capsys,
                   "not a folder")
    # a folder no one may create files in, root included (CI runs as root)
    _fails_cleanly(["export", str(trained_run), "--onnx", "/proc/p.onnx"], capsys, "cannot write")
    assert not Path("/proc/p.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_cli_inspect_and_verify_refuse_what_is_not_a_controller(tmp_path, capsys):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x07garbage")
    _fails_cleanly(["inspect", str(junk)], capsys, "junk.onnx")
    _fails_cleanly(["inspect", str(tmp_path / "missing.onnx")], capsys, "does not exist")
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])])
    foreign = tmp_path / "foreign.onnx"
    onnx.save(onnx_version.make_model(g), str(foreign))
    _fails_cleanly(["inspect", str(foreign)], capsys, "not a grpo-ctrl controller")
    _fails_cleanly(["verify", str(foreign), "--controller", "lqr"], capsys,
                   "not a grpo-ctrl controller")


def test_cli_verify_tells_match_from_mismatch(trained_run, tmp_path, capsys):
    out = tmp_path / "p.onnx"
    assert main(["export", str(trained_run), "--onnx", str(out)]) == 0
    assert main(["verify", str(out), str(trained_run)]) == 0
    assert "PASS" in capsys.readouterr().out
    # the same plant, another controller: a clean failure with exit status 1
    export_onnx(EnergyBangBang(), out, source="bb")
    assert main(["verify", str(out), str(trained_run)]) == 1
    assert "FAIL" in capsys.readouterr().out
    # another plant: refused before comparing
    export_onnx(TinyPolicy("cartpole"), out, source="tiny")
    _fails_cleanly(["verify", str(out), str(trained_run)], capsys, "system = 'cartpole'")


def test_exported_models_declare_what_the_runtime_reads(tmp_path, capsys):
    """Every graph the project writes carries an IR version and opset the
    installed onnxruntime reads; `inspect` and `verify` say in one line when
    a file is newer than that (here: one IR version or one opset too new)."""
    ir_version, opset = onnx_version.runtime_limits()
    model, _ = export_onnx(EnergyBangBang(), tmp_path / "bb.onnx", source="bb")
    assert model.ir_version <= ir_version
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) <= opset
    ort.InferenceSession(str(tmp_path / "bb.onnx"), providers=["CPUExecutionProvider"])
    for field, value, words in (("ir_version", ir_version + 1, f"IR version {ir_version + 1}"),
                                ("opset", opset + 1, f"opset {opset + 1}")):
        newer = onnx.load(str(tmp_path / "bb.onnx"))
        if field == "ir_version":
            newer.ir_version = value
        else:
            next(o for o in newer.opset_import if o.domain in ("", "ai.onnx")).version = value
        path = tmp_path / f"newer-{field}.onnx"
        onnx.save(newer, str(path))
        with pytest.raises(Exception):                    # the runtime itself refuses it
            ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert main(["inspect", str(path)]) == 0          # the metadata still prints ...
        out, err = capsys.readouterr()
        assert "system" in out and len(err.strip().splitlines()) == 1   # ... and one line says why
        assert "newer than the installed onnxruntime" in err and words in err
        _fails_cleanly(["verify", str(path), "--controller", "lqr"], capsys, words)
        with pytest.raises(UserError, match=words):
            verify(newer, EnergyBangBang())
