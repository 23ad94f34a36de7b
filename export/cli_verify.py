"""``grpo-ctrl verify policy.onnx RUN``: does an exported file still compute
what its source controller computes?

    grpo-ctrl verify policy.onnx runs/pendulum-rig
    grpo-ctrl verify lqr.onnx --controller swingup-lqr    # plant from the file

Exit status 0 when it matches within verification's tolerance (1e-5, or twice the
controller's own float32 rounding where larger, at most 1e-3 of u_max: export/verify.py),
1 when it does not, 2 for bad input.
"""
from __future__ import annotations

import math

from grpo_ctrl.export.cli_export import add_source_arguments, controller_from_args
from grpo_ctrl.export import onnx_version
from grpo_ctrl.export.cli_inspect import describe
from grpo_ctrl.export.onnx_export import load_onnx, source_of
from grpo_ctrl.export.verify import verify
from grpo_ctrl.errors import UserError


def add_arguments(p) -> None:
    p.add_argument("onnx", metavar="FILE", help="an ONNX controller from `grpo-ctrl export`")
    add_source_arguments(p)


def check_plant(meta: dict, spec) -> None:
    """``UserError`` if the file was exported for another plant than ``spec``'s."""
    pairs = {"system": (meta.get("system"), spec.system), "preset": (meta.get("preset"), spec.preset),
             "obs_names": (meta.get("obs_names"), list(spec.obs_names)),
             "u_max": (meta.get("u_max"), spec.u_max)}
    for key, (in_file, in_controller) in pairs.items():
        same = (math.isclose(in_file, in_controller, rel_tol=1e-6)
                if key == "u_max" and in_file is not None else in_file == in_controller)
        if not same:
            raise UserError(f"the file is a controller for {key} = {in_file!r}, the source "
                            f"controller for {key} = {in_controller!r}; compare like with like")


def run(args) -> int:
    model = load_onnx(args.onnx)
    meta = describe(model)
    too_new = onnx_version.newer_than_runtime(model)
    if too_new:
        raise UserError(too_new)
    # a baseline named without --system is taken for the file's own plant
    controller, name = controller_from_args(args, meta.get("system"), meta.get("preset"))
    check_plant(meta, controller.spec)
    source, sha = source_of(controller, name)
    if sha is not None and meta.get("source_sha256") not in (None, sha):
        print(f"note: the file records source SHA-256 {meta['source_sha256'][:12]}..., "
              f"{source} has {sha[:12]}...: not the checkpoint it was exported from")
    result = verify(model, controller)
    print(f"{args.onnx} vs {source}: {result.summary()}")
    return 0 if result.ok else 1
