"""Float32 building blocks that torch, onnxruntime and the generated C
evaluate bit for bit alike.

A controller with large gains turns the last bit of an intermediate value
into a visible difference in its command: an LQR with 86 N/rad on the pole
angle magnifies one unit in the last place of an angle near pi (2.4e-7 rad)
to 2e-5 N. ``torch.atan2`` exports to ONNX as ``Atan(y / x)`` plus quadrant
fixes, and onnxruntime's ``Atan`` differs from torch's by up to 2 units in
the last place in 4 of 10 arguments; ``x @ K`` is summed in a different
order by torch, onnxruntime's MatMul and the C loop. Built only from IEEE
basic operations (+, -, *, /, comparisons, min, max, abs, where), whose
float32 results are exactly rounded, the functions here give the same bits
everywhere, so such a controller exports within the 1e-5 the export checks
(exactly, in fact). Use them inside controllers in place of ``torch.atan2``,
``x @ K`` and ``x' P x``.

(The C generator's output must be compiled without contracting a * b + c
into a fused multiply-add: -std=c99 does that on GCC and Clang, as does
-ffp-contract=off.)
"""
from __future__ import annotations

import math

import torch

# Cephes' single-precision arctangent on [0, tan(pi/8)], after Moshier
_ATAN_POLY = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)
_TAN_PI_8 = 0.4142135623730950


def atan2(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The angle of (x, y) in [-pi, pi], within 2 units in the last place of
    float32 (atan2(0, 0) = 0). Same convention as ``torch.atan2``."""
    ax, ay = torch.abs(x), torch.abs(y)
    hi, lo = torch.maximum(ax, ay), torch.minimum(ax, ay)
    safe_hi = torch.where(hi > 0.0, hi, torch.ones_like(hi))
    t = lo / safe_hi                                   # in [0, 1]
    # reduce to [0, tan(pi/8)]: atan(t) = pi/4 + atan((t - 1) / (t + 1))
    big = t > _TAN_PI_8
    r = torch.where(big, (t - 1.0) / (t + 1.0), t)
    z = r * r
    p = _ATAN_POLY[0]
    p = p * z + _ATAN_POLY[1]
    p = p * z + _ATAN_POLY[2]
    p = p * z + _ATAN_POLY[3]
    a = p * z * r + r
    a = torch.where(big, a + math.pi / 4, a)           # atan(lo / hi) in [0, pi/4]
    a = torch.where(ay > ax, math.pi / 2 - a, a)       # first octant -> first quadrant
    a = torch.where(x < 0.0, math.pi - a, a)           # -> upper half plane
    a = torch.where(y < 0.0, -a, a)
    return torch.where(hi > 0.0, a, torch.zeros_like(a))


def dot(x: torch.Tensor, w) -> torch.Tensor:
    """``x @ w`` for ``x (N, n)`` and a constant vector ``w (n,)``, as
    ``((x0 w0 + x1 w1) + x2 w2) + ...``, shape ``(N, 1)``: one summation
    order for torch, onnxruntime and C."""
    w = torch.as_tensor(w, dtype=torch.float32).reshape(-1)
    if x.shape[-1] != w.numel():
        raise ValueError(f"dot: x has {x.shape[-1]} columns, w {w.numel()} entries")
    acc = x[:, 0:1] * float(w[0])
    for k in range(1, w.numel()):
        acc = acc + x[:, k:k + 1] * float(w[k])
    return acc


def quadratic_form(x: torch.Tensor, P) -> torch.Tensor:
    """``x' P x`` per row of ``x (N, n)``, shape ``(N, 1)``, in a fixed order."""
    P = torch.as_tensor(P, dtype=torch.float32)
    if P.shape != (x.shape[-1], x.shape[-1]):
        raise ValueError(f"quadratic_form: P is {tuple(P.shape)}, x has {x.shape[-1]} columns")
    px = torch.cat([dot(x, P[i]) for i in range(P.shape[0])], dim=1)
    return dot_rows(x, px)


def dot_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise ``sum_k a[:, k] * b[:, k]``, shape ``(N, 1)``, in a fixed order."""
    acc = a[:, 0:1] * b[:, 0:1]
    for k in range(1, a.shape[-1]):
        acc = acc + a[:, k:k + 1] * b[:, k:k + 1]
    return acc
