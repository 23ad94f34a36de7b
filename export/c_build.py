"""Compile generated C with the host compiler and call it from Python.

Used to check the generated C against onnxruntime (on export, in the tests)
and to time it (benchmarks). The microcontroller build is the user's own;
this is the same source built for the host.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from grpo_ctrl.errors import UserError

CFLAGS = ("-std=c99", "-Wall", "-Wextra", "-Werror", "-O2")


def host_cc() -> str | None:
    """The host C compiler (``$CC`` or ``cc``), or None if there is none."""
    return shutil.which(os.environ.get("CC", "cc"))


def compile_shared(c_file: str | Path, out: str | Path) -> Path:
    """Build ``c_file`` into the shared library ``out`` with warnings as errors."""
    cc = host_cc()
    if cc is None:
        raise UserError("no C compiler found (set $CC or install cc) to build the generated C")
    cmd = [cc, *CFLAGS, "-fPIC", "-shared", str(c_file), "-o", str(out), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise UserError(f"the generated C does not compile cleanly ({' '.join(cmd)}):\n"
                        f"{proc.stderr.strip()}")
    return Path(out)


class CPolicy:
    """A compiled ``<name>_step`` callable from Python through ctypes."""

    def __init__(self, library: str | Path, nobs: int, name: str = "policy"):
        self._lib = ctypes.CDLL(str(Path(library).resolve()))
        self._step = getattr(self._lib, f"{name}_step")
        self._step.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self._step.restype = ctypes.c_int
        self.nobs = nobs
        self._obs = np.zeros(nobs, np.float32)
        self._action = np.zeros(1, np.float32)
        self._obs_ptr, self._action_ptr = self._obs.ctypes.data, self._action.ctypes.data

    def step(self, obs) -> tuple[int, float]:
        """``(return code, command)`` for one observation ``(nobs,)``."""
        self._obs[:] = obs
        rc = self._step(self._obs_ptr, self._action_ptr)
        return rc, float(self._action[0])

    def __call__(self, obs) -> float:
        """The command for one observation ``(nobs,)``."""
        self._obs[:] = obs
        self._step(self._obs_ptr, self._action_ptr)
        return float(self._action[0])

    def batch(self, obs: np.ndarray) -> np.ndarray:
        """Commands ``(N,)`` float32 for observations ``(N, nobs)``, one call each."""
        obs = np.ascontiguousarray(obs, dtype=np.float32)
        if obs.ndim != 2 or obs.shape[1] != self.nobs:
            raise ValueError(f"observations must have shape (N, {self.nobs}), got {obs.shape}")
        out = np.empty(len(obs), np.float32)
        src, dst, row = obs.ctypes.data, out.ctypes.data, 4 * self.nobs
        for i in range(len(obs)):
            self._step(src + row * i, dst + 4 * i)
        return out


def check_c(src, model, obs: np.ndarray) -> float:
    """Largest |C - onnxruntime| over observations ``obs (N, nobs)``: builds
    ``src`` (a ``c_codegen.CSource``) in a temporary folder, runs every
    observation through ``<name>_step`` and the whole batch through
    onnxruntime."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {session.get_inputs()[0].name: obs})[0].reshape(-1)
    with tempfile.TemporaryDirectory(prefix="grpo_ctrl_c_") as tmp:
        (Path(tmp) / f"{src.name}.h").write_text(src.h)
        (Path(tmp) / f"{src.name}.c").write_text(src.c)
        lib = compile_shared(Path(tmp) / f"{src.name}.c", Path(tmp) / f"lib{src.name}.so")
        got = CPolicy(lib, obs.shape[1], src.name).batch(obs)
    err = float(np.max(np.abs(got.astype(np.float64) - want)))
    return err if np.isfinite(err) else float("inf")


def quantized_c(model, name: str = "policy", pack: bool = False, block: int = 1,
                quantize: str = "q15"):
    """``generate_c(quantize=quantize)`` (q15 or int16) calibrated on the plant's operating
    observations (the model's metadata names the plant), its error against
    onnxruntime measured on the host on other observations of that range
    and written into the header; ``UserError`` beyond its module's ``TOLERANCE``
    (``c_codegen.QUANTIZE_MODULES``) of u_max. Without a host compiler the header says
    it was not measured."""
    from grpo_ctrl.export import metadata, q15
    from grpo_ctrl.export.c_codegen import QUANTIZE_MODULES, generate_c
    from grpo_ctrl.export.verify import operating_observations

    meta = metadata.parse(metadata.raw(model))
    if "system" not in meta or "preset" not in meta:
        raise UserError(f"--quantize {quantize} calibrates on the plant's operating range; this ONNX "
                        "file does not name its plant (export it with grpo-ctrl export)")
    calibration = operating_observations(meta["system"], meta["preset"], seed=0)
    src = generate_c(model, name, pack=pack, block=block, quantize=quantize,
                     calibration=calibration)
    err, obs = None, operating_observations(meta["system"], meta["preset"], seed=1)
    tol = QUANTIZE_MODULES[quantize].TOLERANCE
    if host_cc() is not None:
        err = check_c(src, model, obs)
        q15.check_error(err, meta.get("u_max"), quantize, tol)
    src.error = q15.summary(err, meta.get("u_max"), len(obs), tol)
    src.h = q15.stamp(src.h, src.error, quantize)
    return src
