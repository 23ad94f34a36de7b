"""Does an exported ONNX controller compute what its torch original computes?

``verify`` runs ``onnx.checker`` with full checks, then onnxruntime against
the torch controller on observations drawn across the plant's operating
range (``operating_observations``), and reports the largest absolute
difference of the commands. The tolerance is ``TOLERANCE``, or twice the
controller's own float32 rounding where that is larger: two float32
computations of one function, each within that rounding of its exact value,
differ by up to twice it (a network fed 34 rad/s sums terms whose last bits
move its command by 1e-5; the LQR's catch on a steep cost-to-go by 1e-3), up
to ``ROUNDING_CAP`` of u_max.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import onnx
import torch

from grpo_ctrl.export.session import tuned_options
from grpo_ctrl.errors import UserError, one_line
from grpo_ctrl.plant import plant_spec
from grpo_ctrl.sim import BatchSim

TOLERANCE = 1e-5
ROUNDING_CAP = 1e-3  # of u_max: the most rounding may widen it (the q15 C's own tolerance)
SAMPLES = 10_000

_NEAR_UPRIGHT = 0.5  # rad: half of the samples lie this close to upright, slow


def operating_states(system: str, preset: str, n: int, seed: int = 0) -> np.ndarray:
    """``n`` states ``(n, nx)`` spread over the plant's operating range.

    Half are drawn uniformly over the whole range: angles uniform on the
    circle, velocities over their range, the cart over its track. The other
    half lie near upright (angles within 0.5 rad, velocities within a fifth
    of their range), where a balancing controller is not saturated, so its
    unclipped arithmetic is exercised too."""
    spec = plant_spec(system, preset)
    rng = np.random.default_rng(seed)
    wide = np.empty((n, spec.nx))
    near = np.empty_like(wide)
    for k in range(spec.nx):
        if spec.angles[k]:
            wide[:, k] = rng.uniform(-math.pi, math.pi, n)
            near[:, k] = rng.uniform(-_NEAR_UPRIGHT, _NEAR_UPRIGHT, n)
            continue
        # the simulator's own clip or termination limit where it has one
        if spec.angular_velocities[k] and spec.v_max > 0:
            bound = spec.v_max
        else:
            bound = spec.term_limit[k] or spec.operating_range[k]
        wide[:, k] = rng.uniform(-bound, bound, n)
        near[:, k] = rng.uniform(-bound / 5, bound / 5, n)
    states = np.where((np.arange(n) % 2 == 0)[:, None], wide, near)
    return states


def operating_observations(system: str, preset: str, n: int = SAMPLES,
                           seed: int = 0) -> np.ndarray:
    """Float32 observations ``(n, nobs)`` of ``operating_states``, made by
    the simulator's own observation function (noise and quantisation off)."""
    states = operating_states(system, preset, n, seed)
    nx = states.shape[1]
    sim = BatchSim(system, n, preset, noise_std=[0.0] * nx, enc_counts=[0.0] * nx)
    sim.set_state({"x": states})
    return sim.observe().copy()


@torch.no_grad()
def float32_rounding(controller, obs: np.ndarray, commands: np.ndarray) -> float:
    """The largest |float32 - float64| of ``controller``'s ``commands`` (float32, for ``obs``)
    against the same module computed in float64: how far float32 alone moves its command.
    0 where the module does not run in float64 (the strict ``TOLERANCE`` then applies)."""
    try:
        exact = copy.deepcopy(controller).double()(torch.from_numpy(obs).double()).numpy()
    except Exception:  # float32 constants made in forward and the like: no reference
        return 0.0
    if exact.shape != commands.shape:
        return 0.0
    rounding = float(np.max(np.abs(commands.astype(np.float64) - exact)))
    return rounding if np.isfinite(rounding) else 0.0


@dataclass(frozen=True)
class Verification:
    max_abs_error: float
    samples: int
    batch1_max_abs_error: float  # one observation per call, as the bridge runs it
    tolerance: float
    rounding: float = 0.0        # the controller's own float32 rounding (float32_rounding)

    @property
    def worst(self) -> float:
        return max(self.max_abs_error, self.batch1_max_abs_error)

    @property
    def ok(self) -> bool:
        return self.worst <= self.tolerance

    def summary(self) -> str:
        verdict = "PASS" if self.ok else "FAIL"
        return (f"{verdict}: max |onnxruntime - torch| = {self.max_abs_error:.3g} over "
                f"{self.samples} observations ({self.batch1_max_abs_error:.3g} one at a time); "
                f"tolerance {self.tolerance:.3g}"
                + (" (twice the controller's own float32 rounding)"
                   if 0 < self.tolerance == 2.0 * self.rounding else ""))


def check_graph(model: onnx.ModelProto) -> None:
    """``onnx.checker`` with full checks (shape inference included)."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise UserError(f"the ONNX graph fails onnx.checker: {e}") from None


@torch.no_grad()
def verify(model: onnx.ModelProto, controller, samples: int = SAMPLES, seed: int = 0,
           tolerance: float = TOLERANCE, batch1_samples: int = 200) -> Verification:
    """Check ``model`` against ``controller`` on ``samples`` operating-range
    observations. Raises ``UserError`` if the graph is invalid or its input
    does not fit the controller's plant; returns the measured error (check
    ``.ok``)."""
    import onnxruntime as ort

    from grpo_ctrl.export.onnx_version import newer_than_runtime

    too_new = newer_than_runtime(model)
    if too_new:
        raise UserError(too_new)
    check_graph(model)
    spec = controller.spec
    obs = operating_observations(spec.system, spec.preset, samples, seed)
    want = controller(torch.from_numpy(obs)).numpy().astype(np.float32)
    if want.shape != (samples, 1):
        raise UserError(f"the controller returns shape {want.shape} for {samples} observations; "
                        f"the controller contract asks for ({samples}, 1)")
    beyond = float(np.max(np.abs(want)))
    if not beyond <= spec.u_max * (1 + 1e-6):
        raise UserError(f"the controller commands up to {beyond:.6g} {spec.action_unit}, beyond "
                        f"u_max = {spec.u_max:g}; clip its output to [-u_max, u_max] (the "
                        "controller contract) before exporting")
    # the batch through default options; single observations through the
    # options the serial bridge's session uses
    batched = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    single = ort.InferenceSession(model.SerializeToString(), tuned_options(),
                                  providers=["CPUExecutionProvider"])
    inp, out = batched.get_inputs()[0].name, batched.get_outputs()[0].name
    try:
        got = batched.run([out], {inp: obs})[0]
        one = np.concatenate([single.run([out], {inp: obs[i:i + 1]})[0]
                              for i in range(min(batch1_samples, samples))])
    except Exception as e:  # onnxruntime raises its own exception types
        raise UserError(f"onnxruntime cannot run the model on {spec.nobs} observations of "
                        f"{spec.system}: {one_line(e)}") from None
    if got.shape != want.shape:
        raise UserError(f"the ONNX model returns shape {got.shape}, the controller {want.shape}")
    err = float(np.max(np.abs(got.astype(np.float64) - want)))
    err1 = float(np.max(np.abs(one.astype(np.float64) - want[:len(one)])))
    if not (np.isfinite(err) and np.isfinite(err1)):
        err = err1 = math.inf
    rounding = float32_rounding(controller, obs, want)
    widened = min(2.0 * rounding, ROUNDING_CAP * spec.u_max)
    return Verification(err, samples, err1, max(tolerance, widened), rounding)
