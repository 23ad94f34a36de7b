"""A whole MLP in 16-bit integers for chips without an FPU (AVR):
``generate_c(..., quantize="int16")``.

The deployed controller's graph (``(obs - mean) * inv_std``, Gemm + Relu
layers, a last Gemm, then optionally ``tanh``, a scale and a clip) is
computed as

* the observation: ``q_i = trunc(clamp(obs_i d_i, +-32767) + 32768.5) - 32768``,
  int16, ``d_i`` (a float32) maps the calibrated maximum |obs_i| times
  ``MARGIN`` to 32767 (beyond, it saturates); the normalisation is folded
  into the first layer's weights and biases;
* every layer: int16 weights times int16 activations into a 32-bit sum
  (avr-gcc: ``__mulhisi3``, 16 x 16 -> 32), starting from the bias (and the
  rounding term of the shift that follows). Each output has its own scale
  (folded into its row of weights, and its activation's into the next
  layer's column): the largest that keeps its weights within +-32767 and
  its sum, whatever the inputs, within +-(2^31 - 1), so no overflow is
  possible;
* a hidden output's Relu on the integer sum, then a right shift (rounded)
  that brings its calibrated maximum times ``MARGIN`` within 32767 (the
  scale no larger than that needs), clamped to 32767;
* the last sum converted to float once, times a float32 constant; the
  graph's ``tanh``, scale and clip in float.

The weights are immediate operands of fully unrolled code (no loads: on AVR
an ``LDI`` pair rather than an ``LPM`` each), which suits the small networks
an 8-bit chip runs. ``emulate`` is the Python statement of the integers the C
computes (``tests/test_q15.py`` holds the C to it bit for bit); the error
against onnxruntime is measured at export (``c_build.quantized_c``) and
refused beyond ``TOLERANCE`` of u_max.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from grpo_ctrl.errors import UserError

MARGIN = 1.25          # headroom over a calibrated maximum
TOLERANCE = 2e-2       # of u_max: the largest |int16 C - onnxruntime| an export accepts
#   (the rig policy in 3-4-4-1: max 1.6e-2, 99th percentile 2.5e-3; one encoder count
#   near upright moves its command by 0.9e-2 of u_max, median, up to 1.5e-2)
MAX_MACS = 1024        # unrolled code: beyond this the network is too large for the method
_I32 = (1 << 31) - 1


@dataclass
class Mlp:
    """The float network parsed from the graph."""
    mean: np.ndarray | None      # (nobs,) subtracted from obs, or None
    inv_std: np.ndarray | None   # (nobs,) multiplied after, or None
    layers: list                 # [(W (N, K) float64, b (N,) float64)], Relu after all but the last
    tanh: bool = False
    scale: float | None = None   # the Mul after tanh
    clip: tuple | None = None    # (lo, hi) of the final Clip

    def hidden(self, obs: np.ndarray) -> list:
        """Each hidden layer's Relu output (float64) for observations (B, nobs)."""
        x = np.asarray(obs, np.float64)
        if self.mean is not None:
            x = x - self.mean
        if self.inv_std is not None:
            x = x * self.inv_std
        outs = []
        for w, b in self.layers[:-1]:
            x = np.maximum(x @ w.T + b, 0.0)
            outs.append(x)
        return outs


@dataclass
class Layer:
    """One integer layer: ``acc_j = init[j] + sum_k wq[j, k] x_k`` (int32);
    hidden: ``min(32767, acc >> shift[j])`` where acc > 0, else 0."""
    wq: np.ndarray       # (N, K) int64, |wq| <= 32767
    init: list           # per output: the bias at the sum's scale plus the rounding term
    shift: list          # hidden: per output, to its activation's scale; last: 0
    out_scale: float     # last: the float output is acc * out_scale (a float32)
    bound: int           # largest |sum| over every input


@dataclass
class Net:
    """The integer network: what the C computes."""
    in_scale: list                   # per input: q = obs in_scale (float32; saturated to +-32767)
    layers: list = field(default_factory=list)
    mlp: Mlp | None = None

    @property
    def macs(self) -> int:
        return int(sum(layer.wq.size for layer in self.layers))


# ---------------------------------------------------------------- the graph
def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def parse(model: onnx.ModelProto) -> Mlp:
    """The MLP of a deployed controller's graph; UserError (one line) for any
    other graph."""
    consts = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(_attrs(n)["value"]).astype(np.float64)
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    refuse = UserError("--quantize int16 takes an MLP controller: (obs - mean) * inv_std, Gemm "
                       "layers with Relu between, then optionally tanh, a scale and a clip")

    def const(name):
        if name not in consts:
            raise refuse
        return consts[name]

    mlp = Mlp(None, None, [])
    cur = model.graph.input[0].name
    i = 0
    if i < len(nodes) and nodes[i].op_type == "Sub" and nodes[i].input[0] == cur:
        mlp.mean, cur, i = const(nodes[i].input[1]).reshape(-1), nodes[i].output[0], i + 1
    if i < len(nodes) and nodes[i].op_type in ("Mul", "Div") and nodes[i].input[0] == cur:
        v = const(nodes[i].input[1]).reshape(-1)
        mlp.inv_std = v if nodes[i].op_type == "Mul" else 1.0 / v
        cur, i = nodes[i].output[0], i + 1
    relu_pending = False
    while i < len(nodes) and nodes[i].op_type == "Gemm" and nodes[i].input[0] == cur:
        n, a = nodes[i], _attrs(nodes[i])
        if a.get("transA", 0) or float(a.get("alpha", 1.0)) != 1.0 or relu_pending:
            raise refuse
        w = const(n.input[1])
        w = w if a.get("transB", 0) else w.T
        b = np.zeros(w.shape[0])
        if len(n.input) > 2 and n.input[2]:
            b = np.broadcast_to(const(n.input[2]).reshape(-1), (w.shape[0],)) * float(a.get("beta", 1.0))
        mlp.layers.append((np.asarray(w, np.float64), np.asarray(b, np.float64)))
        cur, i = n.output[0], i + 1
        if i < len(nodes) and nodes[i].op_type == "Relu" and nodes[i].input[0] == cur:
            cur, i = nodes[i].output[0], i + 1
        else:
            relu_pending = True  # a Gemm without a Relu must be the last
    if not mlp.layers or not relu_pending or mlp.layers[-1][0].shape[0] != 1:
        raise refuse
    if i < len(nodes) and nodes[i].op_type == "Tanh" and nodes[i].input[0] == cur:
        mlp.tanh, cur, i = True, nodes[i].output[0], i + 1
    if i < len(nodes) and nodes[i].op_type == "Mul" and nodes[i].input[0] == cur:
        mlp.scale, cur, i = float(const(nodes[i].input[1]).reshape(-1)[0]), nodes[i].output[0], i + 1
    if i < len(nodes) and nodes[i].op_type == "Clip" and nodes[i].input[0] == cur:
        lo, hi = (float(const(x).reshape(-1)[0]) for x in nodes[i].input[1:3])
        mlp.clip, cur, i = (lo, hi), nodes[i].output[0], i + 1
    if i != len(nodes) or cur != model.graph.output[0].name:
        raise refuse
    return mlp


# ---------------------------------------------------------------- the quantisation
def _row(w: np.ndarray, b: float, d: np.ndarray, in_max: np.ndarray, hmax: float | None):
    """One output's integers: the largest scale ``c`` (sum units per unit
    of the output) with every ``round(w c / d)`` within +-32767 and the sum
    within int32 for inputs up to ``in_max``; for a hidden output (``hmax``
    its calibrated maximum) the right shift that brings MARGIN hmax within
    32767, and ``c`` no larger than that needs. (wq, init, shift, c, bound)."""
    per = np.abs(w) / d
    lim = 32767.0 / float(np.max(per)) if np.max(per) > 0 else 2.0 ** 30
    lim = min(lim, (_I32 - 2.0 ** 16) / (float(np.sum(per * in_max)) + abs(b) + 1e-30))
    shift = 0
    if hmax is not None and hmax > 0:
        shift = max(0, math.ceil(math.log2(MARGIN * hmax * lim / 32767.0)))
        lim = min(lim, 32767.0 * 2.0 ** shift / (MARGIN * hmax))
    c = lim
    while True:
        wq = np.round(w * c / d).astype(np.int64)
        init = int(round(b * c)) + ((1 << (shift - 1)) if shift else 0)
        bound = int(np.sum(np.abs(wq) * in_max)) + abs(init)
        if np.max(np.abs(wq)) <= 32767 and bound <= _I32:
            return wq, init, shift, c, bound
        c *= 0.999


def quantize(mlp: Mlp, calibration: np.ndarray) -> Net:
    """The integer network for observations like ``calibration`` (N, nobs)."""
    obs = np.asarray(calibration, np.float64)
    nobs = obs.shape[1]
    amax = np.max(np.abs(obs), axis=0)
    in_scale = [float(np.float32(32767.0 / (MARGIN * a))) if a > 0 else 1.0 for a in amax]
    # the normalisation folded into the first layer
    w0, b0 = mlp.layers[0]
    mean = np.zeros(nobs) if mlp.mean is None else np.broadcast_to(mlp.mean, (nobs,))
    inv = np.ones(nobs) if mlp.inv_std is None else np.broadcast_to(mlp.inv_std, (nobs,))
    folded = [(w0 * inv, b0 - (w0 * inv) @ mean)] + list(mlp.layers[1:])
    hmax = [np.max(h, axis=0) for h in mlp.hidden(obs)]
    net = Net(in_scale, [], mlp)
    d, in_max = np.array(in_scale, np.float64), np.full(nobs, 32767)
    for li, (w, b) in enumerate(folded):
        last = li == len(folded) - 1
        rows = [_row(w[j], float(b[j]), d, in_max, None if last else float(hmax[li][j]))
                for j in range(w.shape[0])]
        wq = np.stack([r[0] for r in rows])
        layer = Layer(wq, [r[1] for r in rows], [r[2] for r in rows],
                      float(np.float32(1.0 / rows[0][3])) if last else 0.0,
                      max(r[4] for r in rows))
        net.layers.append(layer)
        d = np.array([r[3] / 2.0 ** r[2] for r in rows])
        in_max = np.full(w.shape[0], 32767)
    if net.macs > MAX_MACS:
        raise UserError(f"--quantize int16 unrolls the network ({net.macs} multiply-adds, at most "
                        f"{MAX_MACS}): a network for a chip without an FPU; use q15 for this one")
    return net


def emulate_sum(net: Net, obs: np.ndarray) -> np.ndarray:
    """The last layer's int32 sums (B,) for observations (B, nobs) float32,
    as the C computes them: the Python statement of the integers."""
    x = np.asarray(obs, np.float32)
    v = x * np.array(net.in_scale, np.float32)
    v = np.minimum(np.maximum(v, np.float32(-32767.0)), np.float32(32767.0))
    q = np.trunc(v + np.float32(32768.5)).astype(np.int64) - 32768
    for layer in net.layers:
        acc = q @ layer.wq.T + np.array(layer.init, np.int64)
        assert np.all(np.abs(acc) <= _I32)
        if layer is net.layers[-1]:
            return acc[:, 0]
        q = np.minimum(np.maximum(acc, 0) >> np.array(layer.shift, np.int64), 32767)
    raise AssertionError("no layers")


def emulate(net: Net, obs: np.ndarray) -> np.ndarray:
    """The C's command (B,) float32: ``emulate_sum`` to float, then the tail
    in float32 (``tanh`` by numpy, which may differ from the target's libm in
    the last bit)."""
    y = emulate_sum(net, obs).astype(np.float32) * np.float32(net.layers[-1].out_scale)
    m = net.mlp
    if m is not None and m.tanh:
        y = np.tanh(y).astype(np.float32)
    if m is not None and m.scale is not None:
        y = y * np.float32(m.scale)
    if m is not None and m.clip is not None:
        y = np.minimum(np.maximum(y, np.float32(m.clip[0])), np.float32(m.clip[1]))
    return y


# ---------------------------------------------------------------- the C
def _lit(v: float) -> str:
    """A float literal that reads back as float32(v)."""
    r = repr(float(np.float32(v)))
    r = r if ("." in r or "e" in r or "inf" in r or "nan" in r) else r + ".0"
    return r + "f"


def _i32(v: int) -> str:
    return f"INT32_C({v})"


def body(net: Net) -> list:
    """The C lines of ``<name>_step``'s work after the finiteness check:
    ``obs`` in, ``action[0]`` out."""
    nobs = len(net.in_scale)
    out = ["  /* int16 (grpo-ctrl export --quantize int16): the observation scaled, rounded and"
           " clamped to +-32767, the normalisation folded into the first layer */",
           f"  int16_t x0[{nobs}];"]
    for i, e in enumerate(net.in_scale):
        out.append(f"  {{ float v = obs[{i}] * {_lit(e)}; "
                   f"if (v > 32767.0f) v = 32767.0f; else if (v < -32767.0f) v = -32767.0f; "
                   f"x0[{i}] = (int16_t)((int32_t)(uint16_t)(v + 32768.5f) - INT32_C(32768)); }}")
    src = "x0"
    for li, layer in enumerate(net.layers):
        n, k = layer.wq.shape
        last = li == len(net.layers) - 1
        dst = f"x{li + 1}"
        out.append(f"  /* layer {li + 1}: {k} -> {n}, sums within +-{layer.bound}"
                   + ("" if last else ", Relu, shifted to each output's scale") + " */")
        if not last:
            out.append(f"  int16_t {dst}[{n}];")
        for j in range(n):
            terms = [f"(int32_t)(int16_t){int(layer.wq[j, kk])} * {src}[{kk}]"
                     for kk in range(k) if layer.wq[j, kk] != 0]
            acc = " + ".join([_i32(layer.init[j])] + terms)
            if last:
                out.append(f"  const int32_t acc = {acc};")
                continue
            sh = layer.shift[j]
            hi = (32768 << sh) - 1
            clamp = f"acc > {_i32(hi)} ? 32767 : " if hi <= _I32 else ""
            out.append(f"  {{ const int32_t acc = {acc};\n"
                       f"    {dst}[{j}] = acc <= 0 ? 0 : {clamp}(int16_t)((uint32_t)acc >> {sh}); }}")
        src = dst
    y = f"(float)acc * {_lit(net.layers[-1].out_scale)}"
    m = net.mlp
    out.append(f"  float y = {y};")
    if m is not None and m.tanh:
        out.append("  y = tanhf(y);")
    if m is not None and m.scale is not None:
        out.append(f"  y = y * {_lit(m.scale)};")
    if m is not None and m.clip is not None:
        out.append(f"  y = y < {_lit(m.clip[0])} ? {_lit(m.clip[0])} : "
                   f"(y > {_lit(m.clip[1])} ? {_lit(m.clip[1])} : y);")
    out.append("  action[0] = y;")
    return out


def c_file(name: str, net: Net, summary: str, nobs: int) -> str:
    lines = "\n".join(body(net))
    return f"""/* Generated by grpo-ctrl export from a verified ONNX graph; do not edit.
 * {summary}
 */
#include <math.h>
#include <stdint.h>

#include "{name}.h"

int {name}_step(const float *obs, float *action) {{
  for (int i = 0; i < {nobs}; ++i) {{
    if (!isfinite(obs[i])) {{
      action[0] = 0.0f;
      return 1;
    }}
  }}
{lines}
  return 0;
}}
"""


# ---------------------------------------------------------------- the integers as a controller
def controller(onnx_path: str, calibration: np.ndarray | None = None):
    """The exported controller ``onnx_path`` as its int16 C computes it
    (``emulate``, the integers bit for bit, numpy's tanh), as a controller
    (``grpo_ctrl.controller``'s contract) for ``heldout.run`` and
    ``robustness.benchmark``: the quantised policy's quality measured on the
    same episodes as the float one. ``calibration``: default the plant's
    operating observations (seed 0), as ``c_build.quantized_c`` calibrates."""
    import torch

    from grpo_ctrl.export import metadata
    from grpo_ctrl.export.verify import operating_observations
    from grpo_ctrl.plant import plant_spec

    model = onnx.load(onnx_path)
    meta = metadata.parse(metadata.raw(model))
    if calibration is None:
        calibration = operating_observations(meta["system"], meta["preset"], seed=0)
    net = quantize(parse(model), calibration)

    class Int16Controller(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.spec = plant_spec(meta["system"], meta["preset"])
            self.net = net

        def forward(self, obs):
            u = emulate(net, np.asarray(obs.detach().cpu().numpy(), np.float32))
            return torch.as_tensor(u, dtype=torch.float32).reshape(-1, 1)

    return Int16Controller()


def onnx_controller(onnx_path: str):
    """The exported float controller, run by onnxruntime, as a controller
    (the same contract): the other side of ``controller``'s comparison."""
    import onnxruntime as ort
    import torch

    from grpo_ctrl.export import metadata
    from grpo_ctrl.plant import plant_spec

    model = onnx.load(onnx_path)
    meta = metadata.parse(metadata.raw(model))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    class OnnxController(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.spec = plant_spec(meta["system"], meta["preset"])

        def forward(self, obs):
            x = np.asarray(obs.detach().cpu().numpy(), np.float32).reshape(-1, self.spec.nobs)
            return torch.as_tensor(session.run(None, {name: x})[0]).reshape(-1, 1)

    return OnnxController()
