"""``grpo-ctrl inspect policy.onnx``: what an exported controller is."""
from __future__ import annotations

import json
import sys
from collections import Counter

import numpy as np

from grpo_ctrl.export import metadata, onnx_version
from grpo_ctrl.export.onnx_export import load_onnx
from grpo_ctrl.errors import UserError


def add_arguments(p) -> None:
    p.add_argument("onnx", metavar="FILE", help="an ONNX controller from `grpo-ctrl export`")
    p.add_argument("--json", action="store_true", help="print the metadata as JSON")


def describe(model) -> dict:
    """Parsed grpo-ctrl metadata of ``model``; ``UserError`` if there is none."""
    raw = metadata.raw(model)
    if not raw:
        raise UserError("this ONNX file carries no grpo_ctrl.* metadata: it is not a grpo-ctrl "
                        "controller; export one with `grpo-ctrl export`")
    try:
        return metadata.parse(raw)
    except ValueError as e:
        raise UserError(f"the grpo_ctrl.* metadata is unreadable: {e}") from None


def _shape(value) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
            for d in value.type.tensor_type.shape.dim]


def run(args) -> int:
    model = load_onnx(args.onnx)
    meta = describe(model)
    too_new = onnx_version.newer_than_runtime(model)
    if too_new:  # one line, on stderr: the metadata still prints
        print(f"note: {too_new}", file=sys.stderr)
    if args.json:
        print(json.dumps(meta, indent=2))
        return 0
    width = max(len(k) for k in metadata.KEYS)
    for key in metadata.KEYS:
        if key in meta:
            value = meta[key]
            print(f"{key:<{width}}  {', '.join(value) if isinstance(value, list) else value}")
    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), "?")
    ops = Counter(n.op_type for n in g.node)
    weights = sum(int(np.prod(t.dims)) for t in g.initializer)
    print(f"{'graph':<{width}}  {g.input[0].name} {_shape(g.input[0])} -> {g.output[0].name} "
          f"{_shape(g.output[0])}, opset {opset}, {len(g.node)} nodes, {weights} weights")
    print(f"{'ops':<{width}}  {', '.join(f'{op} x{n}' for op, n in sorted(ops.items()))}")
    return 0
