"""The ONNX IR version and opset the installed onnxruntime reads, and the
models the project builds itself stamped to match.

onnx's ``helper.make_model`` stamps the IR version of the installed onnx
(IR 14 for onnx 1.23), and onnxruntime refuses a model whose IR version is
above the newest it knows ("Unsupported model IR version"): onnxruntime
1.23, the newest built for Python 3.10, reads IR 11. Its Python API names
neither limit, so both are found once per process by loading a one-node model
(a few sessions, milliseconds).

    model = make_model(graph)          # instead of onnx.helper.make_model
    note = newer_than_runtime(model)   # None, or one line saying what is too new
"""
from __future__ import annotations

import functools

OPSET = 17      # what the project's own graphs import (onnxruntime >= 1.14 reads it)
_TOP = 64       # above any IR version or opset in sight: the probes' upper end


def _loads(ir_version: int, opset: int) -> bool:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [value("x", TensorProto.FLOAT, [1])],
                              [value("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime's Fail / InvalidGraph / InvalidArgument
        return False
    return True


def _highest(works, low: int, high: int) -> int:
    """The largest v in [low, high] with works(v), given works(low) and that
    works is true up to some point and false after it."""
    while low < high:
        mid = (low + high + 1) // 2
        if works(mid):
            low = mid
        else:
            high = mid - 1
    return low


@functools.lru_cache(maxsize=None)
def runtime_limits() -> tuple[int, int]:
    """``(ir_version, opset)``: the newest of each the installed onnxruntime
    reads (the default ONNX domain)."""
    ir_version = _highest(lambda v: _loads(v, 7), 3, _TOP)
    opset = _highest(lambda v: _loads(min(ir_version, 8), v), 7, _TOP)
    return ir_version, opset


def make_model(graph, opset: int = OPSET, **kwargs):
    """``onnx.helper.make_model`` with the default domain at ``opset`` and the
    IR version the installed onnxruntime reads: the installed onnx's,
    lowered to the runtime's newest where it is above that."""
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kwargs)
    model.ir_version = min(onnx.IR_VERSION, runtime_limits()[0])
    return model


def fit_to_runtime(model) -> None:
    """Lower ``model``'s IR version to the newest the runtime reads, in place
    (for a model this project wrote: it uses nothing of a newer IR)."""
    model.ir_version = min(model.ir_version, runtime_limits()[0])


def newer_than_runtime(model) -> str | None:
    """One line if ``model`` declares an IR version or a default-domain opset
    above what the installed onnxruntime reads, else None."""
    import onnxruntime as ort

    ir_version, opset = runtime_limits()
    too_new = []
    if model.ir_version > ir_version:
        too_new.append(f"IR version {model.ir_version} (it reads up to {ir_version})")
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version > opset:
            too_new.append(f"opset {o.version} (it reads up to {opset})")
    if not too_new:
        return None
    return (f"this model is newer than the installed onnxruntime {ort.__version__} reads: "
            f"{' and '.join(too_new)}; upgrade onnxruntime, or export the model again with "
            "this installation")


def newer_than_runtime_file(path) -> str | None:
    """``newer_than_runtime`` of the model at ``path``, for a caller that only
    has onnxruntime's refusal to load it (None without onnx, or if the file
    does not parse)."""
    try:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # no onnx installed, or not a model: say nothing more
        return None
    return newer_than_runtime(model)
