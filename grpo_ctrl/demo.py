"""``grpo-ctrl demo``: the whole chain in one command.

Train (or, with ``--quick``, take the swing-up-plus-LQR baseline), export to a
verified ONNX file, serve the HIL pendulum on a pseudo-terminal, run the
controller closed-loop through the real serial path, then print the loop's
summary and write the plots. Everything lands in one folder.
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from grpo_ctrl.errors import UserError
from grpo_ctrl.option_types import positive_int, positive_seconds, seconds, seed

DEFAULT_SYSTEM, DEFAULT_PRESET = "pendulum", "gym"
DEFAULT_ITERATIONS = 250  # 150 with gamma 0.99 / unscaled advantages: not upright on the HIL (seed 0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="skip training: use the swing-up-plus-LQR baseline")
    p.add_argument("--system", default=DEFAULT_SYSTEM, help="plant (default: %(default)s)")
    p.add_argument("--preset", default=DEFAULT_PRESET, help="preset (default: %(default)s)")
    p.add_argument("--iterations", type=positive_int(10**9), default=DEFAULT_ITERATIONS,
                   help="GRPO iterations to train: the same policy on a quiet or a busy machine "
                        "(default: %(default)s)")
    p.add_argument("--budget", type=seconds("no limit"), default=0.0,
                   help="also stop training after this many seconds (default: no limit)")
    p.add_argument("--duration", type=positive_seconds, default=8.0,
                   help="seconds of closed-loop control on the HIL pendulum (default: %(default)s)")
    p.add_argument("--out", default=None,
                   help="output folder (default: runs/demo-<system>-<preset>-<time>)")
    p.add_argument("--seed", type=seed, default=0, help="training seed (default: %(default)s)")


def _controller(args, out: Path):
    from grpo_ctrl.controller import load_controller
    if args.quick:
        print(f"[1/4] controller: swing-up-plus-LQR baseline for {args.system}/{args.preset}")
        return load_controller("swingup-lqr", args.system, args.preset)
    from grpo_ctrl.grpo_config import default_config
    from grpo_ctrl.train import train
    cfg = default_config(args.system, args.preset)
    # an iteration budget, not seconds: on a busy machine a time budget trains
    # less, and the demo's policy then fails to swing up
    cfg.iterations, cfg.time_budget, cfg.seed = args.iterations, args.budget, args.seed
    if (args.system, args.preset) == ("pendulum", "gym"):
        # the raw observation and the larger step: Fourier features pay off over thousands
        # of iterations (docs/research.md §10); in the demo's 250 the plain network
        # gets further, and with them the HIL pendulum was not upright after 4 s at 250, 400
        # and 800 iterations on 3, 2 and 1 seeds of 3
        cfg.features, cfg.lr = 0, 2e-3
    run_dir = out / "run"
    print(f"[1/4] training {args.system}/{args.preset} with GRPO for {args.iterations} iterations"
          + (f" (at most {args.budget:g} s)" if args.budget else "") + f" into {run_dir}")
    # train's progress bar counts seconds and needs a time budget
    summary = train(args.system, args.preset, cfg, run_dir, progress=args.budget > 0)
    print(f"      best evaluation return {summary['best_return']:.1f} after "
          f"{summary['iterations']} iterations")
    return load_controller(str(run_dir))


def run(args) -> int:
    from grpo_ctrl.export.onnx_export import export_onnx
    from grpo_ctrl.firmware_bridge.hil import serve_hil
    from grpo_ctrl.firmware_bridge.host import run_loop
    from grpo_ctrl.firmware_bridge.loop import format_summary

    from grpo_ctrl.plant import resolve_plant
    resolve_plant(args.system, args.preset)
    out = Path(args.out or f"runs/demo-{args.system}-{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the output folder {str(out)!r}: {e.strerror}") from None

    controller = _controller(args, out)
    onnx_path = out / "policy.onnx"
    name = "swingup-lqr" if args.quick else str(out / "run")
    _, check = export_onnx(controller, onnx_path, source=name)
    print(f"[2/4] exported {onnx_path} (onnxruntime vs torch on {check.samples} observations: "
          f"max abs error {check.max_abs_error:.2g})")

    # start hanging at rest, so the controller has to swing the pendulum up
    with serve_hil(system=args.system, preset=args.preset, angle0=math.pi,
                   hold_until_armed=True) as hil:
        print(f"[3/4] HIL {args.system}/{args.preset} pendulum serving on {hil.port}")
        print(f"[4/4] running the controller over serial for {args.duration:g} s")
        summary = run_loop(hil.port, onnx_path, args.duration, log=out / "telemetry.csv",
                           plot=out / "loop.png")
        trace = hil.trace()
    angle = _final_angle(args.system, trace)
    print("\n" + format_summary(summary))
    if angle is not None:
        print(f"pendulum at the end: {angle:+.3f} rad from upright "
              f"({'upright' if abs(angle) < 0.2 else 'NOT upright'})")
    print(f"policy: {onnx_path}")
    return 0 if summary["ended"] == "completed" else 1


def _final_angle(system: str, trace: dict) -> float | None:
    """The pendulum's angle from upright at the last tick the controller held
    it (armed): after the disarm the HIL plant keeps running, and falls."""
    from grpo_ctrl.firmware_bridge.protocol import MODE_ARMED
    from grpo_ctrl.plant import plant_spec

    x = trace["x"][trace["mode"] == MODE_ARMED]
    if len(x) == 0:
        return None
    a = float(x[-1, plant_spec(system).pole_angle])
    return math.remainder(a, 2 * math.pi)
