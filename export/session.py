"""An exported controller, ready for the control loop.

``PolicySession`` opens an ONNX controller tuned for one observation at a
time (one intra-op thread, no inter-op pool, no spinning, all graph
optimisations) and checks that it is the controller the caller means to run:
a grpo-ctrl export for the expected plant, observation size and limits.

    policy = PolicySession("policy.onnx", system="pendulum", nobs=3, u_max=0.15)
    u = policy(obs)          # obs: (3,) float32 -> float, in N m
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from grpo_ctrl.export import metadata
from grpo_ctrl.errors import UserError

_REQUIRED = ("system", "preset", "obs_names", "u_max", "dt")


def tuned_options():
    """onnxruntime options for single-observation latency."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so


class PolicySession:
    """``__call__(obs (nobs,) float32) -> float`` command in physical units.

    ``system``, ``nobs``, ``u_max`` and ``preset``, when given, must match the
    model's metadata; a mismatch, a file that is not a grpo-ctrl controller,
    or wrong input/output shapes raise ``UserError`` naming both values.
    ``metadata`` holds the model's keys without the ``grpo_ctrl.`` prefix,
    parsed (``obs_names`` a list, ``u_max`` and ``dt`` floats)."""

    def __init__(self, path: str | Path, *, system: str | None = None, nobs: int | None = None,
                 u_max: float | None = None, preset: str | None = None):
        import onnxruntime as ort

        path = Path(path)
        if not path.is_file():
            raise UserError(f"no ONNX controller at {str(path)!r}; export one with "
                            "`grpo-ctrl export RUN --onnx FILE`")
        try:
            self._session = ort.InferenceSession(str(path), tuned_options(),
                                                 providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's own exception types
            raise UserError(f"{str(path)!r} is not a loadable ONNX model: {e}") from None
        self.path = path
        raw = metadata.raw(self._session.get_modelmeta().custom_metadata_map)
        missing = [k for k in _REQUIRED if k not in raw]
        if missing:
            raise UserError(f"{str(path)!r} is not a grpo-ctrl controller: its metadata lacks "
                            f"{', '.join('grpo_ctrl.' + k for k in missing)}; export it with "
                            "`grpo-ctrl export`")
        try:
            self.metadata = metadata.parse(raw)
        except ValueError as e:
            raise UserError(f"{str(path)!r} has unreadable grpo-ctrl metadata: {e}") from None
        self._check_shapes(path)
        self.check_expected(system=system, nobs=nobs, u_max=u_max, preset=preset)
        self.nobs = len(self.metadata["obs_names"])
        self.u_max = self.metadata["u_max"]
        self.dt = self.metadata["dt"]
        # I/O bound once to these two arrays (onnxruntime reads and writes
        # them in place): a call skips building feeds and output lists
        self._obs = np.zeros((1, self.nobs), np.float32)
        self._command = np.zeros((1, 1), np.float32)
        self._binding = self._session.io_binding()
        self._binding.bind_ortvalue_input(self._session.get_inputs()[0].name,
                                          ort.OrtValue.ortvalue_from_numpy(self._obs))
        self._binding.bind_ortvalue_output(self._session.get_outputs()[0].name,
                                           ort.OrtValue.ortvalue_from_numpy(self._command))

    def _check_shapes(self, path: Path) -> None:
        inputs, outputs = self._session.get_inputs(), self._session.get_outputs()
        nobs = len(self.metadata["obs_names"])
        if len(inputs) != 1 or len(outputs) != 1:
            raise UserError(f"{str(path)!r} has {len(inputs)} inputs and {len(outputs)} outputs; "
                            "a controller has one of each")
        for what, arg, width in (("input", inputs[0], nobs), ("output", outputs[0], 1)):
            shape = arg.shape
            ok = (arg.type == "tensor(float)" and len(shape) == 2 and shape[1] == width
                  and (not isinstance(shape[0], int) or shape[0] == 1))
            if not ok:
                raise UserError(f"{str(path)!r}: the {what} is {arg.type} {shape}; a controller "
                                f"for {nobs} observations needs float (batch, {width})")

    def check_expected(self, **expected) -> None:
        """A refusal unless the controller is for these (system, preset, nobs,
        u_max; None: any)."""
        m, path = self.metadata, self.path
        have = {"system": m["system"], "preset": m["preset"], "nobs": len(m["obs_names"]),
                "u_max": m["u_max"]}
        for key, want in expected.items():
            if want is None:
                continue
            got = have[key]
            same = (math.isclose(float(want), got, rel_tol=1e-6) if key == "u_max"
                    else want == got)
            if not same:
                raise UserError(f"{str(path)!r} is a controller for {key} = {got!r}, but "
                                f"{key} = {want!r} was expected; export a controller for this "
                                "plant or fix the settings")

    def __call__(self, obs) -> float:
        """The command for one observation ``(nobs,)``."""
        self._obs[0] = obs
        self._session.run_with_iobinding(self._binding)
        return float(self._command[0, 0])
