"""``grpo-ctrl export``: a controller to a verified ONNX file and/or C source.

    grpo-ctrl export runs/pendulum-rig --onnx policy.onnx --c firmware/
    grpo-ctrl export --controller swingup-lqr --system pendulum --preset rig --onnx lqr.onnx

Nothing is written unless the ONNX graph matches the controller (and the C,
when a host compiler is there to build it, matches the ONNX graph).
"""
from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

from grpo_ctrl.export.c_codegen import (QUANTIZE, QUANTIZE_MODULES, check_c_name, generate_c,
                                        write_c_source)
from grpo_ctrl.files import atomic_write, check_folder, check_writable
from grpo_ctrl.export.onnx_export import export_onnx, source_of
from grpo_ctrl.export.verify import operating_observations
from grpo_ctrl.baselines import BASELINES
from grpo_ctrl.controller import load_controller
from grpo_ctrl.errors import UserError

# what torch.load and friends raise for a damaged checkpoint
_LOAD_ERRORS = (RuntimeError, EOFError, KeyError, OSError, pickle.UnpicklingError,
                zipfile.BadZipFile, ValueError, TypeError)


def add_source_arguments(p) -> None:
    """RUN or --controller/--system/--preset: the controller to export or check."""
    p.add_argument("run", nargs="?", metavar="RUN",
                   help="a training run folder or a checkpoint file")
    p.add_argument("--controller", choices=BASELINES,
                   help="a baseline controller instead of a trained run")
    p.add_argument("--system", help="plant of the baseline: pendulum, cartpole or furuta")
    p.add_argument("--preset", help="parameter preset of the plant (default: its first)")


def controller_from_args(args, system: str | None = None, preset: str | None = None):
    """``(controller, name)`` for RUN or --controller; ``system``/``preset`` fill
    in what the command line leaves out."""
    if (args.run is None) == (args.controller is None):
        raise UserError("name exactly one controller: a RUN folder/checkpoint, or "
                        f"--controller {'|'.join(BASELINES)} with --system")
    if args.run is not None:
        if args.system or args.preset:
            raise UserError("--system and --preset go with --controller; a trained RUN knows "
                            "its plant")
        name = args.run
    else:
        name = args.controller
    try:
        controller = load_controller(name, args.system or system, args.preset or preset)
    except UserError:
        raise
    except _LOAD_ERRORS as e:
        raise UserError(f"cannot load a controller from {name!r} ({type(e).__name__}: {e}); "
                        "is it a complete run folder or checkpoint?") from None
    return controller, name


def add_arguments(p) -> None:
    add_source_arguments(p)
    p.add_argument("--onnx", metavar="FILE", help="write the ONNX controller here")
    p.add_argument("--c", metavar="OUTDIR", help="write NAME.c and NAME.h into this folder")
    p.add_argument("--c-name", default="policy",
                   help="C file and function prefix: NAME_step() (default: policy)")
    tol = {name: module.TOLERANCE for name, module in QUANTIZE_MODULES.items()}
    p.add_argument("--quantize", choices=QUANTIZE,
                   help="q15: the hidden layers fed by a Relu in 16-bit fixed point (SMLALD on "
                        "a Cortex-M4; calibrated on the plant's operating range; refused beyond "
                        f"{tol['q15']:g} of u_max from onnxruntime); int16: the whole MLP in "
                        "16-bit integers with 32-bit sums, for chips without an FPU (the Uno; "
                        f"refused beyond {tol['int16']:g} of u_max). Default: float, as ONNX")


def run(args) -> int:
    if args.onnx is None and args.c is None:
        raise UserError("say where to write: --onnx FILE and/or --c OUTDIR")
    if args.onnx is not None:  # fail before the work, not after it
        check_writable(args.onnx)
    if args.c is not None:
        check_folder(args.c)
    elif args.quantize:
        raise UserError("--quantize applies to the C (--c OUTDIR); the ONNX graph stays float")
    check_c_name(args.c_name)
    controller, name = controller_from_args(args)
    source, sha = source_of(controller, name)
    model, result = export_onnx(controller, None, source, sha)
    spec = controller.spec
    print(f"{spec.system}/{spec.preset} controller from {source}")
    print(f"ONNX vs torch: {result.summary()}")
    c_src = None
    if args.c is not None:
        from grpo_ctrl.export.c_build import check_c, host_cc, quantized_c

        c_src = (quantized_c(model, args.c_name, quantize=args.quantize) if args.quantize
                 else generate_c(model, args.c_name))
        if args.quantize:
            print(f"C ({args.quantize}) vs onnxruntime: {c_src.error}")
        elif host_cc():
            obs = operating_observations(spec.system, spec.preset)
            err = check_c(c_src, model, obs)
            if not err <= result.tolerance:  # the ONNX check's: the same float32 arithmetic
                raise UserError(f"the generated C differs from onnxruntime by {err:.3g} "
                                f"(> {result.tolerance:.3g}); nothing was written")
            print(f"C vs onnxruntime: max |difference| = {err:.3g} over {len(obs)} observations")
        else:
            print("C vs onnxruntime: not checked (no host C compiler)")
    if args.onnx is not None:
        atomic_write(args.onnx, model.SerializeToString())
        print(f"wrote {args.onnx}")
    if c_src is not None:
        write_c_source(c_src, args.c, args.c_name)  # the C just checked, not a second generation
        print(f"wrote {Path(args.c) / (args.c_name + '.c')} and "
              f"{Path(args.c) / (args.c_name + '.h')}: {c_src.size.summary()}")
    return 0
