"""Whether a controller fits a board: its generated C as the board links it
(``controller_c``), the image measured without and with it (``measure``),
the refusal with the largest network that fits (``check_fit``), and the
Uno's on-device tick estimated from simavr measurements."""
from __future__ import annotations

import hashlib
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grpo_ctrl.errors import UserError
from grpo_ctrl.firmware_bridge.board_build import build_image, project_files, stage
from grpo_ctrl.firmware_bridge.board_registry import Board, Sizes, size_of


def controller_c(b: Board, model, quantize: str | None = None):
    """The generated C of ``model`` (ONNX) as board ``b`` links it: on the
    Uno the hidden-to-hidden weights packed (3.5 B a float, lossless); on the
    Cortex-M4F sixteen outputs per pass: sixteen accumulators, eight weights
    a VLDM and the input fill its 32 FPU registers without a spill.
    ``quantize="q15"``: the hidden layers in fixed point; ``"int16"``: the
    whole MLP in integers, for the Uno (``c_build.quantized_c``: calibrated,
    its error measured on the host)."""
    from grpo_ctrl.export.c_build import quantized_c
    from grpo_ctrl.export.c_codegen import generate_c

    if quantize:
        return quantized_c(model, "policy", pack=b.pack_weights, block=b.block, quantize=quantize)
    return generate_c(model, "policy", pack=b.pack_weights, block=b.block)


def widened(model, h: int, seed: int | None = None):
    """A copy of ``model``, a nobs-H-H-1 MLP like the rig policy (weights named
    net.0/2/4), with random h-wide hidden layers: for sizes and timing."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    rng = np.random.default_rng(h if seed is None else seed)
    nobs = next(numpy_helper.to_array(t).shape[1] for t in model.graph.initializer
                if t.name == "net.0.weight")
    shapes = {"net.0.weight": (h, nobs), "net.0.bias": (h,), "net.2.weight": (h, h),
              "net.2.bias": (h,), "net.4.weight": (1, h)}
    for t in model.graph.initializer:
        if t.name in shapes:
            t.CopyFrom(numpy_helper.from_array(
                (rng.standard_normal(shapes[t.name]) * 0.1).astype(np.float32), t.name))
    return model


def largest_mlp(nobs: int, weight_bytes: int, packed: bool = False) -> int:
    """Widest hidden layer H of an nobs-H-H-1 float network (with input
    normalisation) whose constants take at most ``weight_bytes`` (``packed``:
    the H x H weights at 3.5 B each, plus their 16-byte table)."""
    if weight_bytes <= 0:
        return 0
    # 4 (nobs H + H + H + H + 2 nobs) + w H^2 <= bytes, w = 4 or 3.5 (+ 16 packed);
    # the output bias is a literal in the code
    w = 3.5 if packed else 4.0
    a, b_, c = w / 4, nobs + 3.0, 2 * nobs - (weight_bytes - (16 if packed else 0)) / 4
    h = int((-b_ + math.sqrt(b_ * b_ - 4 * a * c)) / (2 * a)) if b_ * b_ - 4 * a * c >= 0 else 0
    return max(h, 0)


@dataclass
class Fit:
    firmware: Sizes         # the image without a controller
    total: Sizes            # with the controller linked in (the same as firmware without one)
    const_bytes: int        # the controller's weights and tables
    scratch: int            # the controller's stack scratch


_BARE_SIZES: dict = {}  # (board, digest of the project's files) -> Sizes


def _bare_size(b: Board, tmp: Path) -> Sizes:
    """The image without a controller, built once per board and per content
    of its sources (a process that measures several controllers builds it once)."""
    digest = hashlib.sha256()
    for name, src in sorted(project_files(b).items()):
        digest.update(name.encode() + b"\0" + src.read_bytes())
    key = (b, digest.hexdigest())
    if key not in _BARE_SIZES:
        _BARE_SIZES[key] = size_of(b, build_image(b, stage(b, tmp / "bare"), tmp / "build",
                                                  unbounded=True))
    return _BARE_SIZES[key]


def measure(b: Board, policy_src=None) -> Fit:
    """Build the board's image in a temporary folder, without and with the
    controller (which the back-end links in as the on-device controller
    where the project has a policy.h), and measure both."""
    with tempfile.TemporaryDirectory(prefix="grpo_ctrl_fw_") as tmp:
        firmware = total = _bare_size(b, Path(tmp))
        if policy_src is not None:
            project = stage(b, Path(tmp) / "with_controller", policy_src)
            total = size_of(b, build_image(b, project, Path(tmp) / "build_c", unbounded=True))
    return Fit(firmware, total, policy_src.size.const_bytes if policy_src else 0,
               policy_src.size.ram_bytes if policy_src else 0)


def check_fit(b: Board, fit: Fit, nobs: int) -> None:
    """UserError with the sizes and the largest network that fits, if it does not."""
    ram_need = fit.total.ram + fit.scratch + b.stack_reserve
    if fit.total.flash <= b.flash and ram_need <= b.ram:
        return
    room = b.flash - (fit.total.flash - fit.const_bytes)
    h = largest_mlp(nobs, room, b.pack_weights)
    raise UserError(
        f"the controller does not fit the {b.name}: flash {fit.total.flash} B with the controller "
        f"linked in ({fit.firmware.flash} B without it; {fit.const_bytes} B of weights) of "
        f"{b.flash} B; RAM {fit.total.ram} B static + {fit.scratch} B scratch + "
        f"{b.stack_reserve} B stack = {ram_need} B of {b.ram} B. The largest "
        f"{nobs}-H-H-1 network that fits has H = {h}" +
        ("" if h else " (none does)") + "; train a smaller one (grpo-ctrl train --hidden ...)")


# ---------------------------------------------------------------- time on the Uno
# The Uno's on-device tick (fw_tick with the core calling the policy: the
# observation, the policy, the clamp, the STATE frame), in CPU cycles:
# UNO_TICK_FIXED + UNO_MAC a multiply-add (UNO_PACKED_MAC where the weight is
# read packed). Measured on simavr (cycle-accurate) for the rig policy's graph
# with 3-H-H-1 weights, H = 1 to 64 (python benchmarks/bench_boards.py
# --uno-widths 1,2,3,4,8,12,16,24,64): within about 10 % of each (software
# floating point takes data-dependent time). An estimate for a controller
# like that graph (normalisation, Relu layers, tanh, clip).
UNO_TICK_FIXED, UNO_MAC, UNO_PACKED_MAC = 15400, 300, 315
# --quantize q15 (its plain-C integers on AVR): a multiply-add and, per input
# quantised or output converted back, the soft-float work around the
# integers; fitted to the q15 rig graph at H = 2, 4, 8 and 64 on simavr
# (within 2.2 % of each)
UNO_Q15_MAC, UNO_Q15_IO = 138, 423
# --quantize int16 (the whole MLP in integers, export/int16.py): the tick with no
# multiply-adds (the core, the observation, the input's quantisation, the output's
# conversion, tanhf and clip) and one integer multiply-add, set as an upper bound on
# simavr's counts with every unit active (fit.random_onnx) at 3-1-1, 3-2-1, 3-4-1, 3-8-1,
# 3-12-1, 3-13-1, 3-16-1, 3-24-1, 3-H-H-1 for H = 1, 2, 3, 4, 5, 6, 8, 12 and 3-4-4-4-1,
# 3-8-8-8-1: at or above each (by at most 6.1 %; 3-5-5-1: 20,285 against 20,176), so
# that a width it calls within is within. A hidden unit costs more than its
# multiply-adds (the ReLU, shift and clamp): at 45 multiply-adds 3-5-5-1 takes 20,176
# cycles, at 48 3-12-1 19,804, so no line in multiply-adds alone is both conservative
# and exact; --fit measures where simavr is present.
UNO_INT16_FIXED, UNO_INT16_MAC = 17810, 55
UNO_ON_DEVICE_SHARE = 0.25  # of the period: the goal for the on-device tick


def uno_tick_estimate(macs: int, packed_macs: int = 0, q15_macs: int = 0,
                      q15_io: int = 0, int16_macs: int = 0) -> float:
    """Estimated cycles of the Uno's on-device tick for a controller with
    ``macs`` multiply-adds (``packed_macs`` of them on packed weights,
    ``q15_macs`` in q15 with ``q15_io`` inputs and outputs; ``int16_macs``:
    the whole network in int16)."""
    if int16_macs:
        return UNO_INT16_FIXED + UNO_INT16_MAC * int16_macs
    floats = macs - packed_macs - q15_macs
    return (UNO_TICK_FIXED + UNO_MAC * floats + UNO_PACKED_MAC * packed_macs +
            UNO_Q15_MAC * q15_macs + UNO_Q15_IO * q15_io)


def uno_widest_in_time(nobs: int, cycles: float) -> int:
    """Widest H of an nobs-H-H-1 network whose estimated on-device tick
    takes at most ``cycles`` (0: none)."""
    h = 0
    while True:
        w = h + 1
        square = w * w  # packed where generate_c(pack=True) would pack it (_packed)
        packed = square if square >= 256 else 0
        if uno_tick_estimate(nobs * w + square + w, packed) > cycles:
            return h
        h = w


def uno_widest_int16(nobs: int, cycles: float) -> int:
    """Widest H of an nobs-H-H-1 network in int16 whose estimated on-device
    tick takes at most ``cycles`` (0: none)."""
    h = 0
    while uno_tick_estimate(0, int16_macs=nobs * (h + 1) + (h + 1) ** 2 + h + 1) <= cycles:
        h += 1
    return h


def on_device_timing(b: Board, policy_src, nobs: int, dt: float) -> str | None:
    """A line on whether the Uno can run the controller on the chip at the
    period dt (None on other boards)."""
    if not b.timed_on_device:
        return None
    size = policy_src.size
    est = uno_tick_estimate(size.macs, size.packed_macs, size.q15_macs, size.q15_io,
                            getattr(size, "int16_macs", 0))
    budget = b.clock_hz * dt
    share = est / budget
    h = uno_widest_in_time(nobs, UNO_ON_DEVICE_SHARE * budget)
    verdict = ("within" if share <= UNO_ON_DEVICE_SHARE else "over") + \
        f" the {100 * UNO_ON_DEVICE_SHARE:.0f} % goal"
    return (f"on-device control, estimated from simavr measurements: about {est:,.0f} cycles a "
            f"tick ({size.macs} multiply-adds) = {1e3 * est / b.clock_hz:.1f} ms, "
            f"{100 * share:.0f} % of the {1 / dt:.0f} Hz period, {verdict}" +
            ("" if share <= 1 else "; the chip cannot run it at this rate (every tick late)") +
            f". The widest {nobs}-H-H-1 network within {100 * UNO_ON_DEVICE_SHARE:.0f} % has "
            f"H = {h} in float, H = {uno_widest_int16(nobs, UNO_ON_DEVICE_SHARE * budget)} in "
            "int16 (--quantize int16); grpo-ctrl train --fit uno counts on simavr with every "
            "unit active; "
            "host-computed control is unaffected")


# ---------------------------------------------------------------- any board's tick
def tick_estimate(b: Board, size) -> float:
    """Estimated cycles of board ``b``'s on-device tick (fw_tick with the core
    calling the policy) for a controller of ``size`` (``c_codegen.SizeReport``),
    by the board's ``tick_model``: on the Uno fitted to simavr's counts, on the
    Cortex-M4F to the TRM model on QEMU's trace; a controller in int16 on
    the Uno by ``UNO_INT16_FIXED`` and ``UNO_INT16_MAC``."""
    if getattr(size, "int16_macs", 0) and b.timed_on_device:
        return uno_tick_estimate(size.macs, int16_macs=size.int16_macs)
    fixed, mac, packed, q15, io = b.tick_model
    floats = size.macs - size.packed_macs - size.q15_macs
    return fixed + mac * floats + packed * size.packed_macs + q15 * size.q15_macs + io * size.q15_io


def measured_tick(b: Board, policy_src, obs) -> float:
    """Board ``b``'s on-device tick with the controller, in cycles, as
    ``grpo-ctrl bench boards`` counts it: simavr's cycles on the Uno, the
    Cortex-M4 TRM model on QEMU's instruction trace on the Cortex-M4F."""
    from grpo_ctrl.firmware_bridge.board_emulate import target_check

    r = target_check(b, policy_src, obs, cycles=b.family == "arm")
    return r["cycles"]["ondevice"]["cycles"] if b.family == "arm" else r["ondevice"]
