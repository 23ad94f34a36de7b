"""Controller -> ONNX: export, attach metadata, verify, write.

The graph takes the raw float32 observation ``obs (batch, nobs)`` and returns
``action (batch, 1)``, the command in physical units, already clipped:
whatever the controller does between the two (normalisation, the
deterministic mean action, squashing, scaling, clipping) is inside.

Exporter: torch's TorchScript exporter (``dynamo=False``). The newer
``torch.export``-based one needs ``onnxscript``, which is not a dependency of
this project; the TorchScript exporter handles these small straight-line
graphs, dynamic batch included (see docs/export.md).
"""
from __future__ import annotations

import hashlib
import io
import warnings
from pathlib import Path

import onnx
import torch

from grpo_ctrl.export import metadata, onnx_version
from grpo_ctrl.files import atomic_write
from grpo_ctrl.export.verify import Verification, verify
from grpo_ctrl.errors import UserError

OPSET = 17
INPUT, OUTPUT = "obs", "action"


def to_onnx(controller, opset: int = OPSET) -> onnx.ModelProto:
    """The controller's graph, without metadata (dynamic batch dimension)."""
    spec = controller.spec
    example = torch.zeros(1, spec.nobs, dtype=torch.float32)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # the TorchScript exporter announces its own deprecation on every call
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(controller.eval(), (example,), buf, dynamo=False,
                          opset_version=opset, input_names=[INPUT], output_names=[OUTPUT],
                          dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}},
                          do_constant_folding=True)
    model = onnx.load_from_string(buf.getvalue())
    onnx_version.fit_to_runtime(model)  # an IR version the installed onnxruntime reads
    model.doc_string = (f"grpo-ctrl controller for {spec.system}/{spec.preset}: "
                        f"obs ({', '.join(spec.obs_names)}) -> {spec.action_name} "
                        f"[{spec.action_unit}] in [-{spec.u_max:g}, {spec.u_max:g}]")
    return model


def source_of(controller, name: str) -> tuple[str, str | None]:
    """``(source, sha256)`` for the metadata: a trained policy names its run
    and checkpoint hash (``.source_info``); a baseline its name, with no hash
    (``export_onnx`` then hashes the graph)."""
    info = getattr(controller, "source_info", None)
    if info:
        where = str(info.get("checkpoint") or info.get("run") or name)
        return where, info.get("sha256")
    return name, None


def export_onnx(controller, path: str | Path | None, source: str,
                source_sha256: str | None = None,
                opset: int = OPSET) -> tuple[onnx.ModelProto, Verification]:
    """Export, verify and (if ``path``) write ``controller``.

    Raises ``UserError`` if verification fails; nothing is written then."""
    model = to_onnx(controller, opset)
    if source_sha256 is None:
        source_sha256 = hashlib.sha256(model.graph.SerializeToString()).hexdigest()
    metadata.write(model, metadata.for_controller(controller, source, source_sha256))
    result = verify(model, controller)
    if not result.ok:
        raise UserError(f"the exported graph does not match the controller: {result.summary()}; "
                        "nothing was written")
    metadata.write(model, {"verified_max_abs_error": f"{result.worst:.3g}",
                           "verified_samples": str(result.samples),
                           "verified_tolerance": f"{result.tolerance:.3g}"})
    if path is not None:
        atomic_write(path, model.SerializeToString())
    return model, result


def load_onnx(path: str | Path) -> onnx.ModelProto:
    """Read an ONNX file, with a clean error if it is missing or not ONNX."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{str(path)!r} does not exist or is not a file; give the path of an "
                        "exported .onnx controller")
    try:
        model = onnx.load(str(path))
    except Exception as e:  # protobuf's DecodeError and friends
        raise UserError(f"{str(path)!r} is not a readable ONNX file ({type(e).__name__}: {e})") from None
    if not model.graph.node and not model.graph.output:
        raise UserError(f"{str(path)!r} is not a readable ONNX file (empty graph)")
    return model
