"""``grpo-ctrl bench NAME [ARGS...]``: run ``benchmarks/bench_NAME.py``.

The benchmarks live in the source tree next to the package (they are not
installed), so this works from a clone installed with ``pip install -e .``.
Arguments after NAME go to the benchmark unchanged
(``grpo-ctrl bench sim --quick --json out.json``).
"""
from __future__ import annotations

import argparse
import platform
import runpy
import sys
from pathlib import Path

import grpo_ctrl
from grpo_ctrl.errors import UserError

BENCHMARKS_DIR = Path(grpo_ctrl.__file__).resolve().parent.parent / "benchmarks"


def cpu_info() -> dict:
    """/proc/cpuinfo's fields as the first processor gives them (empty where there is none)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_model() -> str:
    """The CPU's model name with its family and model (x86) or implementer and part (ARM),
    the machine, the widest SIMD path the policy's C kernels take on it and the one they
    take by default (csrc/policy_simd.h): what every timing the benchmarks print is to be
    read with."""
    info = cpu_info()
    name = info.get("model name") or info.get("Hardware") or platform.processor() or "unknown CPU"
    if "cpu family" in info:
        name += f" (family {info['cpu family']} model {info.get('model', '?')})"
    elif "CPU implementer" in info:
        name += f" (implementer {info['CPU implementer']} part {info.get('CPU part', '?')})"
    from grpo_ctrl._pendsim import ffi, lib
    widest = ffi.string(lib.pr_simd_paths()).decode().split()[0]
    default = ffi.string(lib.pr_simd_default()).decode()
    return (f"{name}, {platform.machine()}, widest SIMD path {widest}"
            + (f" (default {default})" if default != widest else ""))


def available() -> list[str]:
    """Names of the benchmarks found in the source tree (bench_NAME.py -> NAME)."""
    if not BENCHMARKS_DIR.is_dir():
        return []
    return sorted(p.stem.removeprefix("bench_") for p in BENCHMARKS_DIR.glob("bench_*.py"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = available()
    parser.epilog = ("available: " + ", ".join(names)) if names else (
        f"no benchmarks found in {BENCHMARKS_DIR}")
    parser.add_argument("name", help="which benchmark: runs benchmarks/bench_NAME.py")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="arguments for the benchmark (see grpo-ctrl bench NAME --help)")


def run(args: argparse.Namespace) -> int:
    if not BENCHMARKS_DIR.is_dir():
        raise UserError(f"no benchmarks folder at {BENCHMARKS_DIR}: the benchmarks ship with the "
                        "source tree, not the installed package; run from a clone installed "
                        "with pip install -e .")
    names = available()
    if args.name not in names:
        raise UserError(f"unknown benchmark {args.name!r}; available: {', '.join(names) or 'none'}")
    script = BENCHMARKS_DIR / f"bench_{args.name}.py"
    saved_argv = sys.argv
    sys.argv = [str(script), *args.args]  # the script parses its own arguments
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:  # scripts end with sys.exit(main()); argparse exits too
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved_argv
    return 0
