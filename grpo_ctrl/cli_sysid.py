"""``grpo-ctrl sysid LOG... --system S --preset P --out fitted.toml``: fit a
plant's physical parameters, delay and encoder offset to run/excite logs
(``grpo_ctrl.sysid``), print them with their uncertainty, and write the
TOML that ``grpo-ctrl hil --plant`` and ``grpo-ctrl train --plant`` read,
with a plot of measured against simulated angle on held-out data."""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from grpo_ctrl.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from grpo_ctrl.option_types import number
    from grpo_ctrl.sim import MAX_DELAY

    p.add_argument("logs", nargs="+", metavar="LOG",
                   help="telemetry files from `grpo-ctrl run --log` or `grpo-ctrl excite --log`")
    p.add_argument("--system", default="pendulum", help="the plant the logs come from")
    p.add_argument("--preset", default=None,
                   help="its preset: the nominal plant, control rate and actuator limit "
                        "(default: the system's first)")
    p.add_argument("--out", required=True, metavar="FILE.toml",
                   help="the fitted plant: parameters, delay, offset, standard errors")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="measured vs simulated on held-out data (default: --out with .png; "
                        "needs matplotlib, the train extra)")
    p.add_argument("--max-delay", type=number(int, 0, MAX_DELAY, unit=" (steps)"), default=4, metavar="STEPS",
                   help="largest actuation delay tried (default 4)")
    p.add_argument("--no-refine", action="store_true",
                   help="least squares only: skip the simulation-error refinement")
    p.add_argument("--known", action="append", default=[], metavar="NAME=VALUE",
                   help="a measured parameter the data cannot give (g; for furuta also mp, "
                        "weighed, and rm, an ohmmeter's reading); repeat for several "
                        "(default: the preset's)")


def run(args) -> int:
    from grpo_ctrl.files import check_writable, write_toml
    from grpo_ctrl.plant import plant_spec
    from grpo_ctrl.plant_file import parse_param
    from grpo_ctrl.sysid import identify, model_for, plot_held_out, read_log

    try:
        spec = plant_spec(args.system, args.preset)
    except ValueError as e:
        raise UserError(str(e)) from None
    known = dict(parse_param(text, "--known") for text in args.known)
    model = model_for(spec, known)  # a bad --known is refused before the logs are read
    out = check_writable(args.out)
    plot = check_writable(args.plot or out.with_suffix(".png"))
    if importlib.util.find_spec("matplotlib") is None:  # the plot is the train extra's
        if args.plot:
            raise UserError(f"--plot {str(args.plot)!r} needs matplotlib: pip install "
                            "'grpo-ctrl[train]' (or leave --plot out)")
        plot = None
    logs = [read_log(path, spec) for path in args.logs]
    fit, held, nominal = identify(logs, spec, max_delay=args.max_delay,
                                  refine_fit=not args.no_refine, known=known)
    units = dict(zip(spec.param_names, spec.param_units))
    print(f"sysid {spec.system}/{spec.preset} from {len(logs)} log(s), "
          f"{sum(log.t[-1] - log.t[0] for log in logs):.1f} s")
    print(f"{'parameter':>10} {'preset':>10} {'least sq.':>10} {'fitted':>10} {'+- std':>9}")
    for name in spec.param_names:
        how = "" if name in fit.fitted else "  (not fitted: " + (
            "known)" if name in known else "the preset's)")
        print(f"{name:>10} {fit.nominal[name]:>10.4g} {fit.ls_params[name]:>10.4g} "
              f"{fit.params[name]:>10.4g} {fit.std[name]:>9.2g} {units[name]}{how}")
    print(f"{'delay':>10} {0:>10} {'':>10} {fit.delay:>10} steps  (least-squares residual by "
          f"delay: {', '.join(f'{r:.3g}' for r in fit.ls_residuals_by_delay)} "
          f"{model.residual_unit})")
    print(f"{'offset':>10} {0:>10} {'':>10} {fit.offset:>10.4g} {fit.std['offset']:>9.2g} rad")
    print(f"{'motor_k':>10} {1:>10} {'':>10} {fit.motor_k:>10.4g} {'':>9}  (response per step, "
          "1: instant)")
    print(f"held-out rms angle error: {fit.sim_error:.3g} rad fitted, {fit.sim_error_ls:.3g} rad "
          f"least squares; regressor condition number {fit.condition:.3g}")
    for w in fit.warnings:
        print(f"warning: {w}")
    write_toml(out, fit.table())
    if plot is None:
        print(f"wrote {out}; no plot: matplotlib is not installed (pip install "
              "'grpo-ctrl[train]')")
        return 0
    plot_held_out(plot, fit, held, nominal)
    print(f"wrote {out} and {plot}")
    return 0

