"""q15: the generated C's hidden layers in 16-bit fixed point
(``generate_c(quantize="q15")``, export/q15.py), on the host. The C's
integer arithmetic against its Python statement (``q15.emulate``) bit for bit,
including saturated inputs, an odd input count and sums at their extremes;
that arithmetic against the exact product within its quantisation error; the
rig policy against onnxruntime within the export's tolerance; bad requests
refused. The Cortex-M4 (SMLALD) and AVR builds are in test_boards.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from grpo_ctrl.cli import main
from grpo_ctrl.errors import UserError
from grpo_ctrl.export import onnx_version, q15
from grpo_ctrl.export.c_build import CPolicy, check_c, compile_shared, host_cc, quantized_c
from grpo_ctrl.export.c_codegen import generate_c

RIG = Path(__file__).parent / "data" / "pendulum-rig-grpo.onnx"
needs_cc = pytest.mark.skipif(host_cc() is None, reason="no host C compiler (apt-get install gcc)")


def relu_gemm_pick(w: np.ndarray, b: np.ndarray, pick: int) -> onnx.ModelProto:
    """obs (1, K) -> Relu -> Gemm (W (N, K), b) -> output ``pick`` of the N
    (a Gemm by a one-hot row: the float C passes it through exactly)."""
    n, k = w.shape
    one_hot = np.zeros((1, n), np.float32)
    one_hot[0, pick] = 1.0
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), name)
             for a, name in ((w, "W"), (b, "b"), (one_hot, "pick"))]
    nodes = [helper.make_node("Relu", ["obs"], ["h"]),
             helper.make_node("Gemm", ["h", "W", "b"], ["z"], transB=1),
             helper.make_node("Gemm", ["z", "pick"], ["action"], transB=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", k])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 1])], inits)
    return onnx_version.make_model(graph)  # stamped for the installed onnxruntime


def build(src, folder: Path, nobs: int) -> CPolicy:
    folder.mkdir()
    (folder / "policy.h").write_text(src.h)
    (folder / "policy.c").write_text(src.c)
    return CPolicy(compile_shared(folder / "policy.c", folder / "libpolicy.so"), nobs)


@needs_cc
def test_the_c_computes_the_stated_integer_arithmetic_bit_for_bit(tmp_path):
    """A 5-input, 2-output layer (an odd count: padded to 8) with signed
    weights of several magnitudes and a bias, calibrated on inputs up to
    3: the C's outputs are q15.emulate's bit for bit, for inputs inside the
    range, at 0, and far beyond it (saturated at 65535), including the
    patterns that drive each sum to its extremes; and within the analytic
    quantisation error of the exact product where nothing saturates."""
    rng = np.random.default_rng(7)
    w = np.array([[0.9, -0.7, 1e-3, -0.25, 0.5], [-0.8, 0.6, 0.3, -1e-4, -0.9]], np.float32)
    b = np.array([0.3, -2.5], np.float32)
    calibration = rng.uniform(-1, 3, (2000, 5)).astype(np.float32)
    amax = float(np.max(np.maximum(calibration, 0)))
    layer = q15.quantize_layer(w, b, amax)
    assert layer.sa == 14 and layer.sw == 15  # 3 x 1.25 -> 2^14 a unit; 0.9 -> 2^15
    inside = rng.uniform(-1, 3, (300, 5)).astype(np.float32)
    big = np.float32(1e6)
    extremes = np.concatenate([np.where(w > 0, big, 0), np.where(w < 0, big, 0),
                               np.full((1, 5), big), np.zeros((1, 5))]).astype(np.float32)
    obs = np.concatenate([inside, extremes])
    want = q15.emulate(layer, np.maximum(obs, 0))
    for j in range(2):
        src = generate_c(relu_gemm_pick(w, b, j), quantize="q15", calibration=calibration)
        assert src.size.q15_macs == 10 and "POLICY_ROM_Q15_MAC4X2" in src.c
        got = build(src, tmp_path / f"out{j}", 5).batch(obs)
        assert np.array_equal(got.view(np.uint32), want[:, j].view(np.uint32)), j
    # the extremes: every weight of one sign times 65535 (saturated), as floats
    exact = np.minimum(np.maximum(obs, 0), 65535 * 2.0 ** -layer.sa) @ w.T.astype(np.float64) + b
    step_a, step_w = 2.0 ** -layer.sa, 2.0 ** -layer.sw
    err = 0.5 * step_a * np.abs(w).sum(1) + 0.5 * step_w * np.maximum(obs, 0)[:300].sum(1)[:, None]
    assert np.all(np.abs(want[:300] - exact[:300]) <= err[:300] + 1e-6 * np.abs(exact[:300]) + 1e-6)
    assert np.allclose(want[300:], exact[300:], rtol=1e-6, atol=1e-3)
    # those sums, in the integers' units, are past what a 32-bit sum holds
    assert np.abs(exact[300:]).max() * 2.0 ** (layer.sw + layer.sa) > 2 ** 31


@needs_cc
def test_the_rig_policy_in_q15_is_within_1e_3_of_its_torque_limit(tmp_path):
    """The default 3-64-64-1 policy with its 64 x 64 layer in q15: within
    1e-3 of u_max of onnxruntime on observations across the operating range
    (other than the calibration's), measured and stated in the header; the
    float default is untouched by the option."""
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    from grpo_ctrl.export.verify import operating_observations

    model = onnx.load(RIG)
    src = quantized_c(model, block=16)
    assert src.size.q15_macs == 64 * 64 and src.size.macs == 4352
    assert "q15 (hidden layers in 16-bit fixed point)" in src.h and "of u_max" in src.error
    obs = operating_observations("pendulum", "rig", 4000, seed=9)
    err = check_c(src, model, obs)
    assert 1e-6 < err <= 1e-3 * 0.15
    assert "Q15" not in generate_c(model).c


def test_bad_requests_are_refused_with_one_line(tmp_path, capsys):
    """--quantize without --c; a graph with no Relu-fed hidden layer (the
    LQR baseline is linear); an unknown scheme."""
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    assert main(["export", "--controller", "lqr", "--system", "pendulum", "--preset", "rig",
                 "--onnx", str(tmp_path / "a.onnx"), "--quantize", "q15"]) == 2
    assert "--quantize applies to the C" in capsys.readouterr().err
    assert main(["export", "--controller", "lqr", "--system", "pendulum", "--preset", "rig",
                 "--c", str(tmp_path / "c"), "--quantize", "q15"]) == 2
    err = capsys.readouterr().err
    assert "has none" in err and err.count("\n") == 1 and not (tmp_path / "c").exists()
    with pytest.raises(UserError, match="unknown quantization"):
        generate_c(onnx.load(RIG), quantize="int8")


# ---------------------------------------------------------------- int16: the whole MLP
DISTILLED = Path(__file__).parent / "data" / "pendulum-rig-distilled-3-4-4-1.onnx"


def mlp_graph(rng, nobs: int, widths: list) -> onnx.ModelProto:
    """(obs - mean) * inv_std -> Gemm, Relu, ... -> Gemm (one output, no tanh):
    the integer network's output is then the float the C returns."""
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, nobs).astype(np.float32), "mean"),
             numpy_helper.from_array(rng.uniform(0.1, 3, nobs).astype(np.float32), "inv_std")]
    nodes = [helper.make_node("Sub", ["obs", "mean"], ["z0"]),
             helper.make_node("Mul", ["z0", "inv_std"], ["h0"])]
    k, x = nobs, "h0"
    for i, n in enumerate(widths + [1]):
        inits += [numpy_helper.from_array(rng.normal(0, 1.5, (n, k)).astype(np.float32), f"W{i}"),
                  numpy_helper.from_array(rng.normal(0, 1, n).astype(np.float32), f"b{i}")]
        out = "action" if i == len(widths) else f"y{i}"
        nodes.append(helper.make_node("Gemm", [x, f"W{i}", f"b{i}"], [out], transB=1))
        if i < len(widths):
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"]))
            x = f"r{i}"
        k = n
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", nobs])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 1])], inits)
    return onnx_version.make_model(graph)


@needs_cc
def test_int16_c_computes_the_stated_integers_bit_for_bit(tmp_path):
    """A 3-5-4-1 MLP with normalisation: the C's output is int16.emulate's
    bit for bit (the last sum, converted and scaled), for observations inside
    the calibrated range, far beyond it (every input saturated at +-32767,
    the hidden units at 32767) and at the sign patterns that drive the first
    layer's sums to their extremes; every sum stays within its bound, the
    bound within int32; and within the quantisation's error of onnxruntime."""
    from grpo_ctrl.export import int16

    rng = np.random.default_rng(11)
    model = mlp_graph(rng, 3, [5, 4])
    calibration = rng.uniform(-2, 2, (2000, 3)).astype(np.float32)
    src = generate_c(model, quantize="int16", calibration=calibration)
    net = src.net
    assert src.size.int16_macs == src.size.macs == 3 * 5 + 5 * 4 + 4 and "int16_t" in src.c
    assert all(0 < layer.bound <= 2 ** 31 - 1 for layer in net.layers)
    assert all(np.abs(layer.wq).max() <= 32767 for layer in net.layers)
    inside = rng.uniform(-2, 2, (400, 3)).astype(np.float32)
    signs = np.array([[a, b, c] for a in (-1, 1) for b in (-1, 1) for c in (-1, 1)], np.float32)
    beyond = np.concatenate([signs * 1e6, signs * 2.6, np.zeros((1, 3))]).astype(np.float32)
    obs = np.concatenate([inside, beyond])
    got = build(src, tmp_path / "c", 3).batch(obs)
    want = int16.emulate(net, obs)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    sums = int16.emulate_sum(net, obs)
    assert np.array_equal(want, sums.astype(np.float32) * np.float32(net.layers[-1].out_scale))
    # the first layer at its extremes: all inputs saturated, each row's largest |sum|
    q = np.where(signs > 0, 32767, -32767)
    first = q @ net.layers[0].wq.T + np.array(net.layers[0].init)
    assert np.all(np.abs(first) <= net.layers[0].bound)
    err = check_c(src, model, inside)
    assert err < 2e-3 * np.abs(want[:400]).max()


@needs_cc
def test_the_distilled_rig_policy_in_int16_is_within_its_tolerance(tmp_path, monkeypatch):
    """The rig policy distilled into 3-4-4-1 (normalisation, two Relu layers,
    tanh, scale, clip) in int16: within int16.TOLERANCE (2e-2) of u_max of
    onnxruntime on other observations of the operating range, stated in the
    header; the C is int16.emulate's within the last bits of tanhf; refused
    in one line where the tolerance is not met."""
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    from grpo_ctrl.export import int16
    from grpo_ctrl.export.verify import operating_observations

    model = onnx.load(DISTILLED)
    src = quantized_c(model, quantize="int16")
    assert src.size.int16_macs == 32 and "int16 (every layer in 16-bit integers" in src.h
    obs = operating_observations("pendulum", "rig", 4000, seed=9)
    err = check_c(src, model, obs)
    assert 1e-6 < err <= int16.TOLERANCE * 0.15
    got = build(src, tmp_path / "c", 3).batch(obs)
    assert np.max(np.abs(got - int16.emulate(src.net, obs))) <= 1e-6
    monkeypatch.setattr(int16, "TOLERANCE", 1e-4)
    with pytest.raises(UserError, match="the int16 C differs from onnxruntime"):
        quantized_c(model, quantize="int16")


def test_int16_bad_requests_are_refused_with_one_line(tmp_path, capsys):
    """int16 takes an MLP controller: the swing-up LQR's graph is refused in
    one line (exit 2) and nothing is written."""
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    assert main(["export", "--controller", "swingup-lqr", "--system", "pendulum", "--preset",
                 "rig", "--c", str(tmp_path / "c"), "--quantize", "int16"]) == 2
    err = capsys.readouterr().err
    assert "int16 takes an MLP" in err and err.count("\n") == 1 and not (tmp_path / "c").exists()
