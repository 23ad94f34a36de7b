"""The IR version and opset of the ONNX graphs the project builds itself
(export/onnx_version.py), checked against onnxruntime itself, without torch:
the fast tests that run on every Python the package claims. onnx 1.23 stamps
IR 14 and onnxruntime 1.23 (the newest for Python 3.10) reads at most IR 11."""
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from grpo_ctrl.export import metadata, onnx_version
from grpo_ctrl.export.session import PolicySession
from grpo_ctrl.errors import UserError


def reduce_sum(width_in=3):
    value = helper.make_tensor_value_info
    return helper.make_graph(
        [helper.make_node("ReduceSum", ["obs"], ["action"], keepdims=1)], "g",
        [value("obs", TensorProto.FLOAT, ["batch", width_in])],
        [value("action", TensorProto.FLOAT, ["batch", 1])])


def loads(model) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's own exception types
        loads.error = str(e)
        return False
    return True


def test_the_limits_are_the_runtimes_own():
    """The newest IR version and opset onnxruntime reads: the limit loads,
    one above is refused by onnxruntime with its own message."""
    ir_version, opset = onnx_version.runtime_limits()
    assert ir_version >= 8 and opset >= 17                # onnxruntime >= 1.17 (pyproject)
    model = helper.make_model(reduce_sum(), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    assert loads(model)
    model.ir_version = ir_version + 1
    assert not loads(model) and "IR version" in loads.error
    model = helper.make_model(reduce_sum(), opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    assert loads(model)
    model.opset_import[0].version = opset + 1
    assert not loads(model)


def test_make_model_stamps_what_the_runtime_reads():
    model = onnx_version.make_model(reduce_sum())
    assert model.ir_version == min(onnx.IR_VERSION, onnx_version.runtime_limits()[0])
    assert [(o.domain, o.version) for o in model.opset_import] == [("", onnx_version.OPSET)]
    onnx.checker.check_model(model, full_check=True)
    assert loads(model)
    assert onnx_version.newer_than_runtime(model) is None
    # helper.make_model's own stamp, for comparison: newer than the runtime
    # wherever onnx is newer than onnxruntime (onnx 1.23 with onnxruntime 1.23)
    plain = helper.make_model(reduce_sum(), opset_imports=[helper.make_opsetid("", 17)])
    assert loads(plain) == (plain.ir_version <= onnx_version.runtime_limits()[0])


def test_a_hand_made_model_reaches_the_sessions_own_checks(tmp_path):
    """The test the onnx/onnxruntime mismatch broke on Python 3.10: a foreign
    graph (no metadata) and a misshapen one are refused for what they are,
    not for their IR version."""
    foreign = tmp_path / "foreign.onnx"
    onnx.save(onnx_version.make_model(reduce_sum()), str(foreign))
    with pytest.raises(UserError, match="not a grpo-ctrl controller"):
        PolicySession(foreign)
    wide = onnx_version.make_model(reduce_sum(width_in=4))
    metadata.write(wide, {"system": "pendulum", "preset": "gym", "obs_names": "cos,sin,thd",
                          "u_max": "2.0", "dt": "0.05"})
    onnx.save(wide, str(tmp_path / "wide.onnx"))
    with pytest.raises(UserError, match="needs float \\(batch, 3\\)"):
        PolicySession(tmp_path / "wide.onnx", system="pendulum", nobs=3)


def test_one_line_names_what_is_too_new(tmp_path):
    ir_version, opset = onnx_version.runtime_limits()
    model = onnx_version.make_model(reduce_sum())
    model.ir_version = ir_version + 2
    model.opset_import[0].version = opset + 1
    note = onnx_version.newer_than_runtime(model)
    assert "\n" not in note and ort.__version__ in note
    assert f"IR version {ir_version + 2} (it reads up to {ir_version})" in note
    assert f"opset {opset + 1} (it reads up to {opset})" in note
    path = tmp_path / "newer.onnx"
    onnx.save(model, str(path))
    assert onnx_version.newer_than_runtime_file(path) == note
    assert onnx_version.newer_than_runtime_file(tmp_path / "missing.onnx") is None
